//! `queue_position`: a `queued` status names the request in flight on its
//! connection, before the engine ever saw that request, at a position from 1
//! up to the number of requests in flight; no two requests that can run
//! are told the same position in one event. After every event, the Host's
//! `queued` count covers every request told a position that can run and the
//! engine has not been handed yet (less those that may be behind a sequence
//! whose first chunk was too short to tell whose it is).

use std::collections::BTreeSet;

use tokenwire_core::{Input, Output};

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct QueuePosition {
    told: BTreeSet<u64>,
}

impl Checker for QueuePosition {
    fn name(&self) -> &'static str {
        "queue_position"
    }

    fn on_input(&mut self, _cx: &Cx<'_>, _input: &Input) -> Check {
        self.told.clear();
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if f.kind() != "status" || f.str("operation") != Some("queued") {
            return Ok(());
        }
        let rid = f.request_id().unwrap_or("");
        let Some(c) = cx.view.conns.get(conn) else {
            return Ok(());
        };
        if c.current.as_deref() != Some(rid) {
            return Err(format!(
                "queued status for {rid} on {conn:?}, whose request in flight is {:?}",
                c.current
            ));
        }
        if cx.view.requests.get(rid).is_some_and(|r| r.planned) {
            return Err(format!(
                "queued status for {rid}, which the engine already computed"
            ));
        }
        let p = f.v["position"].as_u64().unwrap_or(0);
        let in_flight = cx.view.outstanding().len() as u64;
        if p == 0 || p > in_flight {
            return Err(format!(
                "queue position {p} for {rid} with {in_flight} requests in flight"
            ));
        }
        // A paused or held-back request does not count as ahead of anyone,
        // so it may share a position; two that can run may not.
        let can_run = c.blocked_since.is_none()
            && cx
                .view
                .requests
                .get(rid)
                .is_some_and(|r| r.paused_at.is_none());
        if can_run && !self.told.insert(p) {
            return Err(format!("queue position {p} told twice in one event"));
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        if !end.stats.loaded {
            return Ok(());
        }
        let waiting: Vec<String> = cx
            .view
            .outstanding()
            .into_iter()
            .filter(|(rid, conn)| {
                // A full outbound queue holds a request back like a pause.
                cx.view.conns[conn].blocked_since.is_none()
                    && cx.view.requests.get(rid).is_some_and(|r| {
                        r.told_queued && !r.planned && r.paused_at.is_none() && r.terminals == 0
                    })
            })
            .map(|(rid, _)| rid)
            .collect();
        let unknown = cx.view.unidentified_seqs() as u64;
        if waiting.len() as u64 > u64::from(end.stats.queued) + unknown {
            return Err(format!(
                "the Host counts {} queued, but {} requests told a position wait to run: {:?}",
                end.stats.queued,
                waiting.len(),
                waiting
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{idle_end, kit};
    use serde_json::json;

    #[test]
    fn impossible_positions_are_caught() {
        let mut k = kit(Box::new(QueuePosition::default()));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.input(Input::Timeout).expect("input");
        let q = |p: u64, rid: &str| json!({"type": "status", "operation": "queued", "position": p, "request_id": rid});
        k.send(1, q(1, "gen_a")).expect("first in line");
        let err = k.send(1, q(1, "gen_a")).expect_err("told twice");
        assert_eq!(err.invariant, "queue_position");
        k.input(Input::Timeout).expect("input");
        assert!(
            k.send(1, q(2, "gen_a")).is_err(),
            "only one request in flight"
        );
        assert!(k.send(1, q(0, "gen_a")).is_err(), "positions start at 1");
        assert!(
            k.send(1, q(1, "gen_b")).is_err(),
            "not the request in flight"
        );
    }

    #[test]
    fn a_queued_request_the_host_does_not_count_is_caught() {
        let mut k = kit(Box::new(QueuePosition::default()));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.input(Input::Timeout).expect("input");
        k.send(
            1,
            json!({"type": "status", "operation": "queued", "position": 1, "request_id": "gen_a"}),
        )
        .expect("told");
        let err = k.m.end(&idle_end()).expect_err("counted 0");
        assert!(err.detail.contains("counts 0 queued"), "{}", err.detail);
        let mut counted = idle_end();
        counted.stats.queued = 1;
        k.input(Input::Timeout).expect("input");
        k.m.end(&counted).expect("counted");
    }
}
