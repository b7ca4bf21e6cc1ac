//! `session_wire`: every frame to a `session` connection is a message of
//! the dialect that its own codec decodes strictly (no unknown field, none
//! missing), stamped with the Host's time (`timestamp` in unix ms); an
//! `error` has a message, is `recoverable` unless the job's tokens are
//! exhausted, and names an `expected` index only for a mismatch.

use tokenwire_core::dialect::session::codec::{self, ErrorCode, ServerMessage};
use tokenwire_core::{Dialect, Output};

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionWire;

fn timestamp(m: &ServerMessage) -> u64 {
    match m {
        ServerMessage::SessionReady(r) => r.timestamp,
        ServerMessage::StreamChunk(c) => c.timestamp,
        ServerMessage::Response(r) => r.timestamp,
        ServerMessage::SessionEnded(e) => e.timestamp,
        ServerMessage::Error(e) => e.timestamp,
    }
}

fn check(cx: &Cx<'_>, text: &str) -> Result<(), String> {
    let m = codec::decode_server(text).map_err(|e| format!("the session codec rejects it: {e}"))?;
    let now = cx.config.epoch_unix_ms + cx.now.as_millis();
    if timestamp(&m) != now {
        return Err(format!(
            "timestamp {} but the Host's time is {now}",
            timestamp(&m)
        ));
    }
    if let ServerMessage::Error(e) = &m {
        if e.message.is_empty() {
            return Err("error without a message".into());
        }
        let budget = e.code == ErrorCode::TokenBudgetExhausted;
        if e.recoverable == budget {
            return Err(format!(
                "{} with recoverable {}",
                e.code.as_str(),
                e.recoverable
            ));
        }
        if e.expected.is_some() && e.code != ErrorCode::MessageIndexMismatch {
            return Err(format!("{} names an expected index", e.code.as_str()));
        }
    }
    Ok(())
}

impl Checker for SessionWire {
    fn name(&self) -> &'static str {
        "session_wire"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Output::Send { conn, text } = out else {
            return Ok(());
        };
        if cx.view.dialect_of(*conn) != Some(Dialect::Session) {
            return Ok(());
        }
        check(cx, text).map_err(|e| format!("{e} in frame to {conn:?}: {}", clip(text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Input;

    #[test]
    fn malformed_session_frames_are_caught() {
        let mut k = kit(Box::new(SessionWire));
        k.open_as(1, Dialect::Session);
        k.input(Input::Timeout).expect("input");
        let ready = json!({"type": "session_ready", "session_id": "s", "message_count": 0,
                           "context_tokens": 0, "truncated_messages": 0, "timestamp": 0});
        k.send(1, ready.clone()).expect("well formed");
        for bad in [
            json!({"type": "session_ready", "session_id": "s", "message_count": 0, "timestamp": 0}),
            json!({"type": "session_ready", "session_id": "s", "message_count": 0,
                   "context_tokens": 0, "truncated_messages": 0, "timestamp": 5}),
            json!({"type": "error", "session_id": null, "code": "rate_limited", "message": "m",
                   "recoverable": false, "timestamp": 0}),
            json!({"type": "error", "session_id": null, "code": "unknown_session", "message": "m",
                   "expected": 3, "recoverable": true, "timestamp": 0}),
            json!({"type": "bogus", "timestamp": 0}),
        ] {
            let err = k.send(1, bad.clone()).expect_err("malformed");
            assert_eq!(err.invariant, "session_wire", "{bad}");
        }
        // Frames to other dialects are not its business.
        k.open(2);
        k.send(2, json!({"type": "bogus"})).expect("generate frame");
    }
}
