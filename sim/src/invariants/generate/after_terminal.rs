//! `after_terminal`: once a connection's request has ended, nothing of that
//! request reaches the connection: no `token`, no `queued` status, no frame
//! naming the finished request (except the `feedback_received` ack, which
//! names the last request). Frames sent while no request is in flight are
//! replies to what the client sent (this input's frame, or the frames held
//! while the model loaded), never spontaneous.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct AfterTerminal;

impl Checker for AfterTerminal {
    fn name(&self) -> &'static str {
        "after_terminal"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(c) = cx.view.conns.get(conn) else {
            return Ok(());
        };
        let kind = f.kind();
        if let Some(rid) = f.request_id() {
            let finished = cx
                .view
                .requests
                .get(rid)
                .is_some_and(|r| r.terminals > 0 || r.superseded);
            let ack = kind == "status" && f.str("operation") == Some("feedback_received");
            if finished && !ack {
                return Err(format!(
                    "{kind} frame names request {rid}, which already ended, on {conn:?}"
                ));
            }
        }
        if c.current.is_some() {
            return Ok(());
        }
        match kind {
            "token" => Err(format!(
                "token {:?} sent to {conn:?} with no request in flight",
                f.str("token").unwrap_or("")
            )),
            "completion" => Err(format!(
                "completion sent to {conn:?} with no request in flight"
            )),
            "status" if f.str("operation") == Some("queued") => Err(format!(
                "queued status sent to {conn:?} with no request in flight"
            )),
            _ if !cx.input.is_reply_to(*conn) => Err(format!(
                "{kind} frame sent to {conn:?} with no request in flight and no frame to answer"
            )),
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
    fn a_token_after_the_completion_is_caught() {
        let mut k = kit(Box::new(AfterTerminal));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.input(tokenwire_core::Input::Timeout).expect("input");
        k.token(1, "x").expect("token while running");
        k.send(
            1,
            json!({"type": "completion", "request_id": "gen_a", "generated_text": "x",
            "finish_reason": "length", "usage": {}}),
        )
        .expect("completion");
        let err = k.token(1, "y").expect_err("token after completion");
        assert_eq!(err.invariant, "after_terminal");
        let err = k
            .send(
                1,
                json!({"type": "status", "operation": "paused", "request_id": "gen_a"}),
            )
            .expect_err("status for the finished request");
        assert!(err.detail.contains("already ended"));
    }
}
