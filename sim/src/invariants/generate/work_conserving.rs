//! `work_conserving`: the engine never sits idle while a request waits to
//! run. After every event of a loaded Host that is not shutting down, if no
//! step is outstanding and no sequence is running, no request that was told a
//! `queued` position, is not paused, and was never handed to the engine is
//! still waiting: paused generations give up their blocks to it, so an idle
//! engine always has room for it. (While the KV pool is shrunk below one
//! context, a long request may wait for it to grow back.)

use crate::invariants::{Check, Checker, Cx, EndState};

/// See the module docs.
#[derive(Debug, Default)]
pub struct WorkConserving;

impl Checker for WorkConserving {
    fn name(&self) -> &'static str {
        "work_conserving"
    }

    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        let v = cx.view;
        let pool_tokens = u64::from(end.stats.kv_blocks_total) * u64::from(cx.model.block_size);
        if !end.stats.loaded
            || v.shutdown_at.is_some()
            || v.step.is_some()
            || end.stats.running > 0
            || pool_tokens < u64::from(cx.model.context_len)
        {
            return Ok(());
        }
        let waiting = v.outstanding().into_iter().find(|(rid, conn)| {
            // A full outbound queue holds a request back like a pause.
            v.conns[conn].blocked_since.is_none()
                && v.requests.get(rid).is_some_and(|r| {
                    r.told_queued && !r.planned && r.paused_at.is_none() && r.terminals == 0
                })
        });
        match waiting {
            Some((rid, conn)) => Err(format!(
                "the engine is idle while {rid} on {conn:?} waits to run ({} of {} KV blocks in use)",
                end.stats.kv_blocks_used, end.stats.kv_blocks_total
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{idle_end, kit};
    use serde_json::json;
    use tokenwire_core::Input;

    #[test]
    fn an_idle_engine_with_a_request_waiting_is_caught() {
        let mut k = kit(Box::new(WorkConserving));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.input(Input::Timeout).expect("input");
        k.send(
            1,
            json!({"type": "status", "operation": "queued", "position": 1, "request_id": "gen_a"}),
        )
        .expect("told");
        let err = k.m.end(&idle_end()).expect_err("idle");
        assert_eq!(err.invariant, "work_conserving");
        // With a sequence running, waiting is fine.
        let mut busy = idle_end();
        busy.stats.running = 1;
        k.input(Input::Timeout).expect("input");
        k.m.end(&busy).expect("busy");
        // Paused, it need not run.
        k.input(Input::Timeout).expect("input");
        k.send(
            1,
            json!({"type": "status", "operation": "paused", "request_id": "gen_a"}),
        )
        .expect("paused");
        k.m.end(&idle_end()).expect("paused");
    }
}
