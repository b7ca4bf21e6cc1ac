//! `session_index`: message indexes are strictly ordered. A prompt is
//! accepted only for a live session with no reply in flight and only at the
//! session's count of user and assistant messages; one at another index is
//! `message_index_mismatch` naming that count as `expected`. Every
//! `stream_chunk` and the `response` of a turn carry the prompt's index plus
//! one, and a session's responses come at increasing indexes.

use tokenwire_core::{Dialect, Output};

use super::view::{code, Msg, MsgKind, Stage};
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionIndex;

impl Checker for SessionIndex {
    fn name(&self) -> &'static str {
        "session_index"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match out {
            Output::Tokenize(job) => {
                let Some(s) = cx.view.session(&job.conn) else {
                    return Ok(());
                };
                let Some(Msg {
                    kind: MsgKind::Prompt { sid, index, .. },
                    stage: Stage::Sent,
                    ..
                }) = s.next_handled()
                else {
                    return Ok(());
                };
                // A prompt of the same session whose tokens just came back
                // has started its turn.
                let starting = matches!(s.head(), Some(Msg {
                    kind: MsgKind::Prompt { sid: other, .. },
                    stage: Stage::Tokenized,
                    ..
                }) if other == sid);
                match s.live.get(sid) {
                    None => Err(format!(
                        "a prompt for {sid:?}, not live on {:?}, was accepted",
                        job.conn
                    )),
                    Some(l) if l.turn.is_some() || starting => Err(format!(
                        "a prompt for {sid:?} on {:?} was accepted while a reply streams",
                        job.conn
                    )),
                    Some(l) if l.count != *index => Err(format!(
                        "a prompt at message_index {index} for {sid:?} on {:?} was accepted, the session holds {} messages",
                        job.conn, l.count
                    )),
                    Some(_) => Ok(()),
                }
            }
            Output::Send { conn, text } => {
                let (Some(f), Some(c)) = (frame, cx.view.conns.get(conn)) else {
                    return Ok(());
                };
                if c.dialect != Dialect::Session {
                    return Ok(());
                }
                let Some(s) = c.session.as_ref() else {
                    return Ok(());
                };
                let sid = f.str("session_id").unwrap_or("");
                let idx = f.v["message_index"].as_u64();
                match f.kind() {
                    "stream_chunk" | "response" => {
                        let Some(l) = s.live.get(sid) else {
                            return Ok(());
                        };
                        let Some(t) = &l.turn else {
                            return Err(format!(
                                "{} for {sid:?} on {conn:?} with no prompt in flight: {}",
                                f.kind(),
                                clip(text)
                            ));
                        };
                        if t.prompt_index != t.count_at_start {
                            return Err(format!(
                                "the reply streaming for {sid:?} on {conn:?} answers a prompt at index {}, accepted when the session held {} messages",
                                t.prompt_index, t.count_at_start
                            ));
                        }
                        if idx != Some(t.prompt_index + 1) {
                            return Err(format!(
                                "{} for {sid:?} on {conn:?} has message_index {idx:?}, its prompt's is {}",
                                f.kind(),
                                t.prompt_index
                            ));
                        }
                        if f.kind() == "response" {
                            if let (Some(i), Some(last)) = (idx, l.last_index) {
                                if i <= last {
                                    return Err(format!(
                                        "response {i} for {sid:?} on {conn:?} after response {last}"
                                    ));
                                }
                            }
                        }
                        Ok(())
                    }
                    "error" if code(f) == "message_index_mismatch" => {
                        let Some(MsgKind::Prompt { sid, index, .. }) =
                            s.answered_by(f).map(|m| &m.kind)
                        else {
                            return Ok(());
                        };
                        let count = s.live.get(sid).map(|l| l.count);
                        let expected = f.v["expected"].as_u64();
                        if count == Some(*index) || expected != count {
                            return Err(format!(
                                "a prompt at index {index} for {sid:?} (holding {count:?}) got message_index_mismatch expecting {expected:?} on {conn:?}"
                            ));
                        }
                        Ok(())
                    }
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
    use crate::invariants::testkit::{kit, Kit};
    use serde_json::json;
    use tokenwire_core::testing::ByteCodec;
    use tokenwire_core::{ConnId, Input, JobGrant, TextDone, TextJob, TextJobId, TextWork};

    /// A live session `s` holding one user and one assistant message.
    fn live(k: &mut Kit) {
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j",
                         "conversation_context": [{"role": "user", "content": "a"},
                                                  {"role": "assistant", "content": "b"}]}),
        )
        .expect("frame");
        k.job_verified(1, "j", JobGrant::default());
        tokenize(k, 1).expect("context");
        k.end().expect("end");
        k.input(Input::Tokenized(TextDone {
            id: TextJobId(1),
            result: Ok(Default::default()),
        }))
        .expect("tokens");
        k.send(
            1,
            json!({"type": "session_ready", "session_id": "s", "message_count": 2,
                         "context_tokens": 0, "truncated_messages": 0, "timestamp": 0}),
        )
        .expect("ready");
        k.end().expect("end");
    }

    fn tokenize(k: &mut Kit, id: u64) -> Result<(), crate::invariants::Violation> {
        k.out(Output::Tokenize(TextJob {
            id: TextJobId(id),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Chat {
                messages: vec![],
                max_messages: 20,
                max_tokens: 100,
                tools: Vec::new(),
                template_kwargs: Default::default(),
            },
        }))
    }

    fn prompt(k: &mut Kit, index: u64) {
        k.text(
            1,
            json!({"type": "prompt", "session_id": "s", "content": "x", "message_index": index}),
        )
        .expect("frame");
    }

    #[test]
    fn a_prompt_accepted_at_the_wrong_index_is_caught() {
        let mut k = kit(Box::new(SessionIndex));
        live(&mut k);
        prompt(&mut k, 3);
        let e = tokenize(&mut k, 2).expect_err("index 3 of 2");
        assert_eq!(e.invariant, "session_index");
    }

    #[test]
    fn a_reply_at_the_wrong_index_is_caught() {
        let mut k = kit(Box::new(SessionIndex));
        live(&mut k);
        prompt(&mut k, 2);
        tokenize(&mut k, 2).expect("accepted");
        k.end().expect("end");
        k.input(Input::Tokenized(TextDone {
            id: TextJobId(2),
            result: Ok(Default::default()),
        }))
        .expect("tokens");
        k.end().expect("turn starts");
        k.input(Input::Timeout).expect("input");
        let chunk = |i: u64| {
            json!({"type": "stream_chunk", "session_id": "s", "content": "y",
                                    "message_index": i, "timestamp": 0})
        };
        k.send(1, chunk(3)).expect("prompt's index plus one");
        let e = k.send(1, chunk(2)).expect_err("the prompt's own index");
        assert_eq!(e.invariant, "session_index");
    }

    #[test]
    fn a_mismatch_naming_the_wrong_expected_index_is_caught() {
        let mut k = kit(Box::new(SessionIndex));
        live(&mut k);
        prompt(&mut k, 5);
        let e = k
            .send(
                1,
                json!({"type": "error", "session_id": "s", "code": "message_index_mismatch",
                            "message": "m", "expected": 4, "recoverable": true, "timestamp": 0}),
            )
            .expect_err("expected 2");
        assert_eq!(e.invariant, "session_index");
    }
}
