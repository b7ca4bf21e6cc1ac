//! `session_stream`: nothing of a reply is lost or duplicated. A turn whose
//! prompt asked to stream gets one non-empty `stream_chunk` per piece and
//! its `response` content is exactly their concatenation; one that did not
//! gets no `stream_chunk` at all. A reply ends with `stop` or `length`
//! (a session has no pause and no cancel that answers).

use tokenwire_core::{Dialect, Output};

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionStream;

impl Checker for SessionStream {
    fn name(&self) -> &'static str {
        "session_stream"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(c) = cx.view.conns.get(conn) else {
            return Ok(());
        };
        if c.dialect != Dialect::Session {
            return Ok(());
        }
        let Some(s) = c.session.as_ref() else {
            return Ok(());
        };
        let sid = f.str("session_id").unwrap_or("");
        let Some(t) = s.turn(sid) else {
            return Ok(());
        };
        match f.kind() {
            "stream_chunk" => {
                if !t.stream {
                    return Err(format!(
                        "stream_chunk for {sid:?} on {conn:?}, whose prompt asked not to stream"
                    ));
                }
                if f.str("content").is_none_or(str::is_empty) {
                    return Err(format!("empty stream_chunk for {sid:?} on {conn:?}"));
                }
                Ok(())
            }
            "response" => {
                let content = f.str("content").unwrap_or("");
                if t.stream && content != t.chunks {
                    return Err(format!(
                        "response for {sid:?} on {conn:?} is {:?}, its {} stream_chunks make {:?}",
                        clip(content),
                        t.chunk_frames,
                        clip(&t.chunks)
                    ));
                }
                let filtered = f.str("finish_reason") == Some("content_filter")
                    && crate::invariants::generate::wire::filters(cx);
                if !matches!(f.str("finish_reason"), Some("stop" | "length")) && !filtered {
                    return Err(format!(
                        "response for {sid:?} on {conn:?} ends with {:?}",
                        f.str("finish_reason")
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::session::view::{Live, Turn};
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::{ConnId, Input, Instant};

    fn with_turn(stream: bool) -> crate::invariants::testkit::Kit {
        let mut k = kit(Box::new(SessionStream));
        k.open_as(1, Dialect::Session);
        let c = k.m.view_mut().conns.get_mut(&ConnId(1)).expect("conn");
        c.session.as_mut().expect("session").live.insert(
            "s".into(),
            Live {
                turn: Some(Turn {
                    prompt_index: 0,
                    count_at_start: 0,
                    stream,
                    prompt: "x".into(),
                    chunks: String::new(),
                    chunk_frames: 0,
                    started_at: Instant::ZERO,
                    after_shutdown: false,
                    prompt_tokens: 1,
                }),
                ..Live::started(vec![], None, "j".into())
            },
        );
        k.input(Input::Timeout).expect("input");
        k
    }

    fn chunk(c: &str) -> serde_json::Value {
        json!({"type": "stream_chunk", "session_id": "s", "content": c, "message_index": 1, "timestamp": 0})
    }

    fn response(c: &str) -> serde_json::Value {
        json!({"type": "response", "session_id": "s", "content": c, "tokens_used": 3,
               "message_index": 1, "finish_reason": "length", "timestamp": 0})
    }

    #[test]
    fn a_response_that_is_not_its_chunks_is_caught() {
        let mut k = with_turn(true);
        k.send(1, chunk("ab")).expect("chunk");
        k.send(1, chunk("c")).expect("chunk");
        let e = k.send(1, response("abcc")).expect_err("a piece twice");
        assert_eq!(e.invariant, "session_stream");
        let mut k = with_turn(true);
        k.send(1, chunk("ab")).expect("chunk");
        k.send(1, response("ab")).expect("exactly the chunks");
    }

    #[test]
    fn chunks_of_a_turn_that_does_not_stream_are_caught() {
        let mut k = with_turn(false);
        let e = k.send(1, chunk("a")).expect_err("not streaming");
        assert_eq!(e.invariant, "session_stream");
    }
}
