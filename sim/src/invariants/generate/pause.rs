//! `pause`: a paused generation produces nothing. After its `paused` ack and
//! until `resumed`, no step computes its sequence, and no token reaches its
//! connection, except a token of the step that was already outstanding when
//! it paused, and the final piece of a generation ended while paused (`stop`,
//! pause timeout).

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cur, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Pause;

impl Checker for Pause {
    fn name(&self) -> &'static str {
        "pause"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::RunStep(plan), _) => {
                for s in &plan.seqs {
                    let Some(conn) = cx.view.owner(s.seq) else {
                        continue;
                    };
                    if let Some(r) = cx.view.current(conn) {
                        if let Some(at) = r.paused_at {
                            return Err(format!(
                                "step {} computes {:?} of {conn:?}, paused since {:?}",
                                plan.step_id, s.seq, at
                            ));
                        }
                    }
                }
                Ok(())
            }
            (Output::Send { conn, .. }, Some(f)) if f.kind() == "token" => {
                let Some(r) = cx.view.current(*conn) else {
                    return Ok(());
                };
                if r.paused_at.is_none() {
                    return Ok(());
                }
                if let Some(grace) = r.pause_grace_step {
                    if cx.input == Cur::StepDone(grace) {
                        return Ok(());
                    }
                }
                let ending = f.v["finished"] == true
                    && matches!(f.str("finish_reason"), Some("cancelled" | "timeout"));
                if ending {
                    return Ok(());
                }
                Err(format!(
                    "token {:?} (finish_reason {}) sent to {conn:?} while its generation is paused",
                    f.str("token").unwrap_or(""),
                    f.v["finish_reason"]
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn tokens_and_steps_while_paused_are_caught() {
        let mut k = kit(Box::new(Pause));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step before pause");
        k.end().expect("end");
        k.text(1, json!({"type": "control", "action": "pause"}))
            .expect("pause");
        k.send(
            1,
            json!({"type": "status", "operation": "paused", "request_id": "gen_a"}),
        )
        .expect("ack");
        k.end().expect("end");
        // The step outstanding at the pause may still deliver its token.
        k.step_done(1, 1).expect("done");
        k.token(1, "a").expect("grace token");
        let err = k.step(2, 1, 1).expect_err("step computes the paused seq");
        assert_eq!(err.invariant, "pause");
        k.end().expect("end");
        k.input(tokenwire_core::Input::Timeout).expect("input");
        let err = k.token(1, "b").expect_err("token while paused");
        assert!(err.detail.contains("paused"));
    }
}
