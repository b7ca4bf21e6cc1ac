//! `session_start_fields`: `last_message_index` is what a `session_resume`
//! must carry and a `session_init` need not (PROTOCOLS.md): an init is
//! never refused for it. The message's type is read from the frame, not
//! through the dialect's decoder, which is what this judges.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionStartFields;

impl Checker for SessionStartFields {
    fn name(&self) -> &'static str {
        "session_start_fields"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let message = f.v["message"].as_str().unwrap_or("");
        if f.kind() != "error" || !message.contains("last_message_index") {
            return Ok(());
        }
        let init = cx
            .view
            .session(conn)
            .and_then(|s| s.head())
            .is_some_and(|m| m.raw_type.as_deref() == Some("session_init"));
        if init {
            return Err(format!(
                "a session_init on {conn:?} was refused for last_message_index: {message}"
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
    use tokenwire_core::Dialect;

    fn refused() -> serde_json::Value {
        json!({"type": "error", "code": "invalid_request",
               "message": "invalid `last_message_index`: is required",
               "recoverable": true, "timestamp": 1})
    }

    #[test]
    fn an_init_refused_for_last_message_index_is_caught() {
        let mut k = kit(Box::new(SessionStartFields));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("init");
        let e = k.send(1, refused()).expect_err("an init needs no index");
        assert_eq!(e.invariant, "session_start_fields");
        // A resume without it is refused as it must be.
        let mut k = kit(Box::new(SessionStartFields));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_resume", "session_id": "s", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("resume");
        k.send(1, refused()).expect("a resume needs one");
    }
}
