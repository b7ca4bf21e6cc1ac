//! `pause_timeout`: a generation paused longer than the pause timeout ends
//! with `finish_reason: timeout` no later than the timeout plus one step after
//! its `paused` ack, and never ends with `timeout` before that (or unpaused).

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct PauseTimeout;

impl Checker for PauseTimeout {
    fn name(&self) -> &'static str {
        "pause_timeout"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if f.kind() != "completion" || f.str("finish_reason") != Some("timeout") {
            return Ok(());
        }
        let Some(r) = cx.view.current(*conn) else {
            return Ok(());
        };
        match r.paused_at {
            None => Err(format!(
                "request on {conn:?} ended with timeout but was not paused"
            )),
            Some(at) if cx.now < at + cx.config.pause_timeout => Err(format!(
                "request on {conn:?} paused at {at:?} timed out at {:?}, before the pause timeout of {:?}",
                cx.now, cx.config.pause_timeout
            )),
            Some(_) => Ok(()),
        }
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        for (conn, c) in &cx.view.conns {
            if c.closed {
                continue;
            }
            let Some(r) = cx.view.current(*conn) else {
                continue;
            };
            if let Some(at) = r.paused_at {
                let due = at + cx.config.pause_timeout + cx.slack;
                if cx.nominal > due {
                    return Err(format!(
                        "generation on {conn:?} paused at {at:?} still paused at {:?}, past the pause timeout ({:?}) plus one step",
                        cx.nominal, cx.config.pause_timeout
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn a_pause_that_never_times_out_is_caught() {
        let mut k = kit(Box::new(PauseTimeout));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.text(1, json!({"type": "control", "action": "pause"}))
            .expect("pause");
        k.send(
            1,
            json!({"type": "status", "operation": "paused", "request_id": "gen_a"}),
        )
        .expect("ack");
        k.end().expect("end");
        k.at(299_000);
        k.input(tokenwire_core::Input::Timeout).expect("input");
        k.end().expect("not yet due");
        k.at(301_000);
        k.input(tokenwire_core::Input::Timeout).expect("input");
        let err = k.end().expect_err("overdue");
        assert_eq!(err.invariant, "pause_timeout");
    }

    #[test]
    fn an_early_timeout_is_caught() {
        let mut k = kit(Box::new(PauseTimeout));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.text(1, json!({"type": "control", "action": "pause"}))
            .expect("pause");
        k.send(
            1,
            json!({"type": "status", "operation": "paused", "request_id": "gen_a"}),
        )
        .expect("ack");
        k.end().expect("end");
        k.at(1_000);
        k.input(tokenwire_core::Input::Timeout).expect("input");
        let err = k
            .send(
                1,
                json!({"type": "completion", "request_id": "gen_a", "finish_reason": "timeout"}),
            )
            .expect_err("early");
        assert!(err.detail.contains("before the pause timeout"));
    }
}
