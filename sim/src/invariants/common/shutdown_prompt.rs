//! `shutdown_prompt`: a shutdown waits for work, not for its grace. At the
//! end of any event after `Input::Shutdown`, when no generation is alive,
//! nothing is queued and no connection is busy as the wire shows it (no
//! request in flight, no text job or job check outstanding, no reply a
//! flow-control window still holds), `ShutdownComplete` must be out: the
//! grace is the bound for work in progress, and a Host that waits for it
//! with nothing to wait for keeps its clients and its replacement waiting.

use crate::invariants::{Check, Checker, Cx, EndState};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ShutdownPrompt;

impl Checker for ShutdownPrompt {
    fn name(&self) -> &'static str {
        "shutdown_prompt"
    }

    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        let Some(at) = cx.view.shutdown_at else {
            return Ok(());
        };
        if cx.view.shutdown_complete || !end.stats.loaded {
            return Ok(());
        }
        if end.stats.generations > 0 || end.stats.queued > 0 || end.stats.running > 0 {
            return Ok(());
        }
        if cx.view.conns.values().any(|c| c.busy()) {
            return Ok(());
        }
        Err(format!(
            "shutdown began at {at:?}; at {:?} no generation is alive and no connection is busy, yet it is not complete",
            cx.now
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::{Input, Output};

    #[test]
    fn a_shutdown_waiting_on_nothing_is_caught() {
        let mut k = kit(Box::new(ShutdownPrompt));
        k.open(1);
        k.input(Input::Shutdown).expect("shutdown");
        let e = k.end().expect_err("nothing to wait for");
        assert_eq!(e.invariant, "shutdown_prompt");

        let mut k = kit(Box::new(ShutdownPrompt));
        k.open(1);
        k.input(Input::Shutdown).expect("shutdown");
        k.out(Output::ShutdownComplete).expect("complete");
        k.end().expect("complete at once");
    }

    #[test]
    fn a_busy_connection_is_waited_for() {
        let mut k = kit(Box::new(ShutdownPrompt));
        k.open(1);
        k.text(1, json!({"type": "config", "prompt": "hi"}))
            .expect("config");
        k.send(1, json!({"type": "init", "request_id": "gen_x"}))
            .expect("init");
        k.end().expect("end");
        k.input(Input::Shutdown).expect("shutdown");
        k.end().expect("a request in flight");
    }
}
