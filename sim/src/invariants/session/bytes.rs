//! `session_bytes`: a session keeps at most `session_max_context_bytes` of
//! message text. A prompt whose text, added to what its session keeps (the
//! history as the wire built it), would pass the bound is refused with
//! `invalid_request` before anything is generated; one that fits is never
//! refused for the bound. The same holds for a start's
//! `conversation_context` on its own.

use tokenwire_core::{ChatMessage, Output};

use super::view::{Msg, MsgKind, SessionConnView};
use crate::invariants::{Check, Checker, Cx, Frame};

/// What the Host's refusals for the bound say.
const BYTES_REFUSAL: &str = "a session may keep";

fn text_bytes(messages: &[ChatMessage]) -> usize {
    messages.iter().map(|m| m.content.len()).sum()
}

/// The bytes message `m` would make its session keep, and what it is.
fn would_keep(s: &SessionConnView, m: Option<&Msg>) -> Option<(usize, String)> {
    match &m?.kind {
        MsgKind::Prompt { sid, content, .. } => {
            let kept = s.live.get(sid).map_or(0, |l| text_bytes(&l.history));
            Some((kept + content.len(), format!("a prompt of session {sid:?}")))
        }
        MsgKind::Start { sid, context, .. } => {
            Some((text_bytes(context), format!("the start of session {sid:?}")))
        }
        _ => None,
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionBytes;

impl Checker for SessionBytes {
    fn name(&self) -> &'static str {
        "session_bytes"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let max = cx.config.session_max_context_bytes;
        match (out, frame) {
            (Output::Tokenize(job), _) => {
                let Some(s) = cx.view.session(&job.conn) else {
                    return Ok(());
                };
                match would_keep(s, s.next_handled()) {
                    Some((bytes, what)) if bytes > max => Err(format!(
                        "{what} on {:?} went on to be tokenized with {bytes} bytes of messages (the bound is {max})",
                        job.conn
                    )),
                    _ => Ok(()),
                }
            }
            (Output::Send { conn, .. }, Some(f))
                if f.kind() == "error"
                    && f.str("message").is_some_and(|m| m.contains(BYTES_REFUSAL)) =>
            {
                let Some(s) = cx.view.session(conn) else {
                    return Ok(());
                };
                match would_keep(s, s.answered_by(f)) {
                    Some((bytes, what)) if bytes <= max => Err(format!(
                        "{what} on {conn:?} refused for the bound with {bytes} bytes of messages (the bound is {max}): {}",
                        f.str("message").unwrap_or("")
                    )),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit_with;
    use serde_json::json;
    use tokenwire_core::{Dialect, HostConfig};

    #[test]
    fn a_refusal_under_the_bound_is_caught() {
        let cfg = HostConfig {
            session_max_context_bytes: 10,
            ..HostConfig::default()
        };
        let mut k = kit_with(Box::new(SessionBytes), cfg);
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "a", "job_id": "j",
                   "conversation_context": [{"role": "user", "content": "four"}]}),
        )
        .expect("init");
        let e = k
            .send(
                1,
                json!({"type": "error", "session_id": "a", "code": "invalid_request",
                       "message": "invalid `conversation_context`: 4 bytes of messages, more than the 10 a session may keep",
                       "timestamp": 1}),
            )
            .expect_err("4 bytes fit in 10");
        assert_eq!(e.invariant, "session_bytes");
    }

    #[test]
    fn a_prompt_over_the_bound_that_goes_on_is_caught() {
        let cfg = HostConfig {
            session_max_context_bytes: 10,
            ..HostConfig::default()
        };
        let mut k = kit_with(Box::new(SessionBytes), cfg);
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "a", "job_id": "j",
                   "conversation_context": [{"role": "system", "content": "<c1>"}]}),
        )
        .expect("init");
        k.send(
            1,
            json!({"type": "session_ready", "session_id": "a", "model": "tiny", "timestamp": 1}),
        )
        .expect("ready");
        k.end().expect("end");
        k.text(
            1,
            json!({"type": "prompt", "session_id": "a", "message_index": 0,
                   "content": "seven b"}),
        )
        .expect("prompt");
        let e = k
            .out(Output::Tokenize(tokenwire_core::TextJob {
                id: tokenwire_core::TextJobId(1),
                conn: tokenwire_core::ConnId(1),
                codec: tokenwire_core::testing::ByteCodec::shared(),
                work: tokenwire_core::TextWork::Encode {
                    text: "x".into(),
                    add_special: true,
                },
            }))
            .expect_err("4 + 7 bytes pass 10");
        assert!(e.detail.contains("11 bytes"), "{}", e.detail);
    }
}
