//! `cai_terminal`: a request's frames come between its acceptance and its
//! one terminal frame. Every COMPLETION the server accepted (it asked for
//! the prompt to be tokenized) ends with exactly one of `STREAM_COMPLETE`,
//! an `ERROR` naming it, or `INTERRUPTED_ACK`, unless its connection closed
//! first ([`crate::invariants::common::liveness`] says that it does end; here: never twice, and
//! nothing of it after). `STREAM_START` comes once, when its prompt comes
//! back tokenized, and only for a request that streams; `CONTENT_CHUNK`
//! and `SENTENCE_BOUNDARY` only between `STREAM_START` and the end of a
//! request that streams (so a `stream: false` request gets none of the
//! three); `INTERRUPTED_ACK` only in answer to an `INTERRUPTED` for a
//! request in flight; an `ERROR` sent while no message is being handled
//! ends a request in flight with `GENERATION_FAILED` or `INTERNAL_ERROR`.

use tokenwire_core::Output;

use super::view::{code, rid_of, Expect, Mode};
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiTerminal;

impl Checker for CaiTerminal {
    fn name(&self) -> &'static str {
        "cai_terminal"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, text }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(a) = cx.view.cai(conn) else {
            return Ok(());
        };
        let kind = f.kind();
        let rid = rid_of(f).unwrap_or("");
        let r = a.requests.get(rid);
        let gone = || {
            Err(format!(
                "{kind} on {conn:?} for {rid:?}, which is not in flight (ended, or never accepted): {}",
                clip(text)
            ))
        };
        match kind {
            "STREAM_START" => {
                let Some(r) = r else { return gone() };
                let due = matches!(&a.cur, Some(Expect::TextDone { rid: p, done: false, .. }) if p == rid);
                if !r.stream || r.started || !due {
                    return Err(format!(
                        "STREAM_START on {conn:?} for {rid:?} (streams: {}, started before: {}, its prompt just tokenized: {due})",
                        r.stream, r.started
                    ));
                }
            }
            "CONTENT_CHUNK" | "SENTENCE_BOUNDARY" => {
                let Some(r) = r else { return gone() };
                if !r.stream || !r.started {
                    return Err(format!(
                        "{kind} on {conn:?} for {rid:?} (streams: {}, started: {})",
                        r.stream, r.started
                    ));
                }
            }
            "STREAM_COMPLETE" => {
                let Some(r) = r else { return gone() };
                if r.stream && !r.started {
                    return Err(format!(
                        "STREAM_COMPLETE on {conn:?} for {rid:?}, which streams, before its STREAM_START"
                    ));
                }
            }
            "INTERRUPTED_ACK" => {
                if r.is_none() {
                    return gone();
                }
                let answers = matches!(&a.cur, Some(Expect::One { kind: "INTERRUPTED_ACK", rid: Some(p), done: false, .. }) if p == rid);
                if !answers {
                    return Err(format!(
                        "INTERRUPTED_ACK on {conn:?} for {rid:?} answers no INTERRUPTED"
                    ));
                }
            }
            "ERROR" if a.mode == Mode::Async => {
                if r.is_none() {
                    return gone();
                }
                if !matches!(code(f), "GENERATION_FAILED" | "INTERNAL_ERROR") {
                    return Err(format!(
                        "{rid:?} on {conn:?} ended by an ERROR {} while no message was handled",
                        code(f)
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::cai_kit;
    use serde_json::json;
    use tokenwire_core::Input;

    fn start(k: &mut crate::invariants::testkit::Kit, options: serde_json::Value) {
        k.open_cai(1);
        k.completion(1, "r1", options).expect("accepted");
        k.tokenized(1).expect("tokenized");
    }

    #[test]
    fn frames_after_the_end_or_a_second_end_are_caught() {
        let mut k = cai_kit(Box::new(CaiTerminal));
        start(&mut k, json!({}));
        k.send(
            1,
            json!({"type": "STREAM_START", "requestId": "r1", "timestamp": "t"}),
        )
        .expect("start");
        k.end().expect("end");
        k.input(Input::Timeout).expect("input");
        k.send(
            1,
            json!({"type": "CONTENT_CHUNK", "requestId": "r1",
                         "payload": {"content": "a", "index": 0}}),
        )
        .expect("chunk");
        k.send(
            1,
            json!({"type": "STREAM_COMPLETE", "requestId": "r1",
                         "payload": {"fullContent": "a"}}),
        )
        .expect("end");
        let e = k
            .send(
                1,
                json!({"type": "CONTENT_CHUNK", "requestId": "r1",
                            "payload": {"content": "b", "index": 1}}),
            )
            .expect_err("after the end");
        assert_eq!(e.invariant, "cai_terminal");
        let e = k
            .send(
                1,
                json!({"type": "ERROR", "requestId": "r1",
                            "error": {"code": "GENERATION_FAILED", "message": "m", "details": {}}}),
            )
            .expect_err("a second end");
        assert!(e.detail.contains("not in flight"), "{}", e.detail);
    }

    #[test]
    fn stream_frames_of_a_request_that_does_not_stream_are_caught() {
        let mut k = cai_kit(Box::new(CaiTerminal));
        start(&mut k, json!({"stream": false}));
        let e = k
            .send(
                1,
                json!({"type": "STREAM_START", "requestId": "r1", "timestamp": "t"}),
            )
            .expect_err("no stream");
        assert!(e.detail.contains("streams: false"), "{}", e.detail);
        k.end().expect("end");
        k.input(Input::Timeout).expect("input");
        let e = k
            .send(
                1,
                json!({"type": "CONTENT_CHUNK", "requestId": "r1",
                            "payload": {"content": "a", "index": 0}}),
            )
            .expect_err("no stream");
        assert_eq!(e.invariant, "cai_terminal");
    }
}
