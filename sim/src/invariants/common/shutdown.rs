//! `shutdown`: after `Input::Shutdown` no new request starts (no `generate`
//! `init`, no `responses` generation going `in_progress`, no `session` turn,
//! no `cai` `STREAM_START`),
//! and within the shutdown grace (plus one step) every generation has ended,
//! every connection is closed (none with a request in flight and no error
//! for it) and `ShutdownComplete` is out, exactly once and never without a
//! shutdown; after it, nothing more is sent.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Shutdown;

impl Checker for Shutdown {
    fn name(&self) -> &'static str {
        "shutdown"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        if matches!(out, Output::ShutdownComplete) {
            if cx.view.shutdown_at.is_none() {
                return Err("ShutdownComplete without a shutdown".into());
            }
            if cx.view.shutdown_complete {
                return Err("ShutdownComplete a second time".into());
            }
        }
        let Some(at) = cx.view.shutdown_at else {
            return Ok(());
        };
        if cx.view.shutdown_complete {
            return match out {
                Output::Send { conn, .. } | Output::Ping { conn } => {
                    Err(format!("output to {conn:?} after ShutdownComplete"))
                }
                Output::RunStep(p) => Err(format!("step {} after ShutdownComplete", p.step_id)),
                _ => Ok(()),
            };
        }
        if let Output::Close {
            conn, code: 1001, ..
        } = out
        {
            // The grace is over: every request still in flight gets the
            // dialect's error before its connection goes.
            if let Some(r) = cx.view.conns.get(conn).and_then(|c| c.in_flight()) {
                return Err(format!(
                    "{conn:?} closed for the shutdown with request {r} in flight and no error for it"
                ));
            }
        }
        if let (Output::Send { conn, .. }, Some(f)) = (out, frame) {
            if matches!(f.kind(), "init" | "response.in_progress" | "STREAM_START") {
                return Err(format!(
                    "request started on {conn:?} after shutdown began at {at:?}"
                ));
            }
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        let Some(at) = cx.view.shutdown_at else {
            return Ok(());
        };
        for (conn, c) in &cx.view.conns {
            let late = c.session.as_ref().and_then(|s| {
                s.live
                    .iter()
                    .find(|(_, l)| l.turn.as_ref().is_some_and(|t| t.after_shutdown))
            });
            if let Some((sid, _)) = late {
                return Err(format!(
                    "a reply of session {sid:?} started on {conn:?} after shutdown began at {at:?}"
                ));
            }
        }
        if cx.view.shutdown_complete {
            if let Some((conn, _)) = cx.view.conns.iter().find(|(_, c)| !c.closed) {
                return Err(format!("{conn:?} still open after ShutdownComplete"));
            }
            if end.stats.generations > 0 {
                return Err(format!(
                    "{} generations alive after ShutdownComplete",
                    end.stats.generations
                ));
            }
            return Ok(());
        }
        if cx.nominal > at + cx.config.shutdown_grace + cx.slack {
            return Err(format!(
                "shutdown began at {at:?} and is not complete at {:?} (grace {:?})",
                cx.nominal, cx.config.shutdown_grace
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Input;

    #[test]
    fn a_shutdown_that_never_completes_or_starts_work_is_caught() {
        let mut k = kit(Box::new(Shutdown));
        k.open(1);
        k.input(Input::Shutdown).expect("shutdown");
        k.end().expect("end");
        k.text(1, json!({"type": "config", "prompt": "hi"}))
            .expect("config");
        let err = k
            .send(1, json!({"type": "init", "request_id": "gen_x"}))
            .expect_err("init after shutdown");
        assert_eq!(err.invariant, "shutdown");
        k.at(10_011);
        k.input(Input::Timeout).expect("input");
        let err = k.end().expect_err("grace over");
        assert!(err.detail.contains("not complete"));
    }

    #[test]
    fn shutdown_complete_twice_or_unasked_is_caught() {
        let mut k = kit(Box::new(Shutdown));
        k.input(Input::Timeout).expect("input");
        let err = k.out(Output::ShutdownComplete).expect_err("unasked");
        assert!(err.detail.contains("without a shutdown"));
        let mut k = kit(Box::new(Shutdown));
        k.input(Input::Shutdown).expect("shutdown");
        k.out(Output::ShutdownComplete).expect("once");
        k.end().expect("end");
        k.input(Input::Timeout).expect("input");
        let err = k.out(Output::ShutdownComplete).expect_err("twice");
        assert!(err.detail.contains("second time"));
    }
}
