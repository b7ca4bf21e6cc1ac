//! `cai_window`: the flow windows hold. A request never gets more chunks
//! than its client acknowledged plus its window (`options.window`, or 32
//! once an `AWAIT_MORE` for it was handled; acknowledged: the last received
//! index plus one, or every chunk sent at the time the Host handled an
//! `AWAIT_MORE` without one), nor more sentence boundaries than the
//! sentences completed plus `options.sentenceWindow`. Acknowledgements
//! count from the moment the Host handles them (a frame that waited behind
//! a prompt being tokenized counts once it is handed over), as the view
//! follows them.
//!
//! And a window-paused generation gets no compute: once every request in
//! flight on a connection streams, has had its `STREAM_START` and has a full
//! window (as the wire shows it), no engine step planned after the next
//! step completed computes a sequence of that connection (sequences are
//! told apart by the connection tag of their prompt), until the client
//! acknowledges again. Where one of the connection's requests is not
//! window-full (or does not stream, or has not started) the connection's
//! sequences may run, and since sequences are known by connection only,
//! not by request, nothing is checked then: the strongest version the tags
//! allow.

use tokenwire_core::Output;

use super::view::rid_of;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiWindow;

impl Checker for CaiWindow {
    fn name(&self) -> &'static str {
        "cai_window"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::Send { conn, .. }, Some(f)) => {
                let Some(a) = cx.view.cai(conn) else {
                    return Ok(());
                };
                let rid = rid_of(f).unwrap_or("");
                let Some(r) = a.requests.get(rid) else {
                    return Ok(());
                };
                match f.kind() {
                    "CONTENT_CHUNK" if !r.chunk_fits() => Err(format!(
                        "chunk {} of {rid:?} on {conn:?} with {} acknowledged and a window of {:?}",
                        r.chunks,
                        r.acked,
                        r.chunk_window()
                    )),
                    "SENTENCE_BOUNDARY" if !r.sentence_fits() => Err(format!(
                        "sentence {} of {rid:?} on {conn:?} with {} completed and a sentence window of {:?}",
                        r.sentences, r.completed, r.sentence_window
                    )),
                    _ => Ok(()),
                }
            }
            (Output::RunStep(plan), _) => {
                for s in &plan.seqs {
                    let Some(conn) = cx.view.owner(s.seq) else {
                        continue;
                    };
                    let Some(since) = cx.view.cai(&conn).and_then(|a| a.paused_since) else {
                        continue;
                    };
                    if cx.view.steps_done > since {
                        return Err(format!(
                            "step {} computes {:?} of {conn:?}, every request of which has had a full window since {since} steps were done ({} now)",
                            plan.step_id, s.seq, cx.view.steps_done
                        ));
                    }
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
    use crate::invariants::testkit::{cai_kit, Kit};
    use serde_json::{json, Value};
    use tokenwire_core::Input;

    fn chunk(i: u64) -> Value {
        json!({"type": "CONTENT_CHUNK", "requestId": "r1", "payload": {"content": "a", "index": i}})
    }

    fn streaming(options: Value) -> Kit {
        let mut k = cai_kit(Box::new(CaiWindow));
        k.open_cai(1);
        k.completion(1, "r1", options).expect("accepted");
        k.tokenized(1).expect("tokenized");
        k.send(
            1,
            json!({"type": "STREAM_START", "requestId": "r1", "timestamp": "t"}),
        )
        .expect("start");
        k.end().expect("end");
        k
    }

    #[test]
    fn chunks_past_the_window_are_caught() {
        let mut k = streaming(json!({"window": 2}));
        k.input(Input::Timeout).expect("input");
        k.send(1, chunk(0)).expect("in the window");
        k.send(1, chunk(1)).expect("in the window");
        let e = k.send(1, chunk(2)).expect_err("past the window");
        assert_eq!(e.invariant, "cai_window");
        let mut k = streaming(json!({"window": 2}));
        k.input(Input::Timeout).expect("input");
        k.send(1, chunk(0)).expect("in the window");
        k.send(1, chunk(1)).expect("in the window");
        k.end().expect("end");
        k.text(
            1,
            json!({"type": "AWAIT_MORE", "requestId": "r1",
                         "payload": {"lastReceivedIndex": 0}}),
        )
        .expect("ack");
        k.send(1, chunk(2)).expect("one more");
        let e = k.send(1, chunk(3)).expect_err("past the window again");
        assert!(e.detail.contains("1 acknowledged"), "{}", e.detail);
    }

    #[test]
    fn acknowledgements_held_behind_a_prompt_count_when_handed_over() {
        let mut k = streaming(json!({"window": 2}));
        k.input(Input::Timeout).expect("input");
        k.send(1, chunk(0)).expect("in the window");
        k.send(1, chunk(1)).expect("in the window");
        k.end().expect("end");
        k.completion(1, "r2", json!({})).expect("accepted");
        // Both wait while r2's prompt is tokenized; each, when handed over,
        // acknowledges every chunk sent by then.
        for _ in 0..2 {
            k.text(1, json!({"type": "AWAIT_MORE", "requestId": "r1"}))
                .expect("held");
            k.end().expect("end");
        }
        k.tokenized(1).expect("tokenized");
        k.send(
            1,
            json!({"type": "STREAM_START", "requestId": "r2", "timestamp": "t"}),
        )
        .expect("start");
        for i in 2..6 {
            k.send(1, chunk(i))
                .expect("released by the acknowledgements");
        }
        let e = k.send(1, chunk(6)).expect_err("past both");
        assert!(e.detail.contains("4 acknowledged"), "{}", e.detail);
    }

    #[test]
    fn sentences_past_the_sentence_window_are_caught() {
        let mut k = streaming(json!({"sentenceWindow": 1}));
        k.input(Input::Timeout).expect("input");
        k.send(
            1,
            json!({"type": "CONTENT_CHUNK", "requestId": "r1",
                         "payload": {"content": "A. B. ", "index": 0}}),
        )
        .expect("chunk");
        let s = |i: u64, t: &str| {
            json!({"type": "SENTENCE_BOUNDARY", "requestId": "r1",
                                         "payload": {"sentence": t, "sentenceIndex": i}})
        };
        k.send(1, s(0, "A.")).expect("in the window");
        let e = k.send(1, s(1, " B.")).expect_err("past it");
        assert!(e.detail.contains("sentence window"), "{}", e.detail);
    }

    #[test]
    fn compute_for_a_paused_connection_is_caught() {
        let mut k = streaming(json!({"window": 1}));
        k.input(Input::Timeout).expect("input");
        k.send(1, chunk(0)).expect("fills the window");
        // The step planned at once may still run; so may its result.
        k.step(1, 1, 1).expect("planned at once");
        k.end().expect("end");
        k.step_done(1, 1).expect("done");
        let e = k.step(2, 1, 1).expect_err("paused");
        assert!(e.detail.contains("full window"), "{}", e.detail);
        k.end().expect("end");
        k.text(1, json!({"type": "AWAIT_MORE", "requestId": "r1"}))
            .expect("ack");
        k.end().expect("end");
        k.step_done(2, 1).expect("done");
        k.step(3, 1, 1).expect("acknowledged: it runs");
    }
}
