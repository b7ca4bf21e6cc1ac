//! `cai_replies`: every `cai` message gets the answer the contract gives it,
//! in order. The view follows the Host's handling message by message (see
//! [`super::view`]); a frame that no message being handled can have
//! sent, or a message that must be answered and is not, is a violation.
//! Beyond that: a message that does not decode gets `ERROR` with the code
//! its fault calls for; `INTERRUPTED`, `AWAIT_MORE` or `SENTENCE_COMPLETED`
//! for a request not in flight gets `INVALID_REQUEST` (an acknowledgement
//! of one of the last 64 that ended on the connection gets nothing); an
//! acknowledgement of a chunk or sentence not yet sent gets
//! `INVALID_PAYLOAD`; a COMPLETION whose `requestId` is in flight on the
//! connection gets `INVALID_REQUEST` and is never accepted, one past
//! the in-flight limit gets `RATE_LIMITED` and is never accepted, and
//! then one naming a model other than the served one gets
//! `MODEL_NOT_FOUND` and is never accepted (and one naming the served
//! model, or none, never gets it).

use tokenwire_core::Output;

use super::view::{code, Expect, Msg};
use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiReplies;

impl Checker for CaiReplies {
    fn name(&self) -> &'static str {
        "cai_replies"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (conn, f) = match (out, frame) {
            (Output::Send { conn, .. }, Some(f)) => (*conn, Some(f)),
            (Output::Tokenize(job), _) => (job.conn, None),
            _ => return Ok(()),
        };
        let Some(a) = cx.view.cai(&conn) else {
            return Ok(());
        };
        let max = cx.config.cai_max_inflight as usize;
        match (&a.cur, f) {
            (
                Some(Expect::Completion {
                    msg: Msg::Completion { rid, model, .. },
                    done: false,
                }),
                _,
            ) => {
                let dup = a.requests.contains_key(rid);
                let full = a.requests.len() >= max;
                let served = cx.model.name.as_str();
                let other_model = model.as_deref().is_some_and(|m| m != served);
                let got = f.map_or("its prompt tokenized", |f| {
                    if f.kind() == "ERROR" {
                        code(f)
                    } else {
                        f.kind()
                    }
                });
                let want = if dup {
                    "INVALID_REQUEST"
                } else if full {
                    "RATE_LIMITED"
                } else if other_model {
                    "MODEL_NOT_FOUND"
                } else if got == "MODEL_NOT_FOUND" {
                    return Err(format!(
                        "COMPLETION {rid:?} on {conn:?} naming model {model:?} got MODEL_NOT_FOUND (the server serves {served:?})"
                    ));
                } else {
                    return Ok(());
                };
                if got != want {
                    return Err(format!(
                        "COMPLETION {rid:?} on {conn:?} (in flight already: {dup}, {} of {max} in flight) got {got}, not {want}",
                        a.requests.len()
                    ));
                }
            }
            (
                Some(Expect::One {
                    kind: "ERROR",
                    code: want,
                    rid,
                    done: false,
                    what,
                }),
                Some(f),
            ) if f.kind() == "ERROR"
                && f.str("requestId") == rid.as_deref()
                && code(f) != *want =>
            {
                return Err(format!(
                    "{what} on {conn:?} got ERROR {}, not {want}",
                    code(f)
                ));
            }
            _ => {}
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        for (conn, c) in &cx.view.conns {
            if let Some(d) = c.cai.as_ref().and_then(|a| a.desync.as_ref()) {
                return Err(format!("{conn:?}: {d}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::cai_kit;
    use serde_json::json;

    fn error(rid: &str, code: &str) -> serde_json::Value {
        json!({"type": "ERROR", "requestId": rid,
               "error": {"code": code, "message": "m", "details": {}}})
    }

    #[test]
    fn unanswered_or_misplaced_answers_are_caught() {
        let mut k = cai_kit(Box::new(CaiReplies));
        k.open_cai(1);
        k.text(1, json!({"type": "INTERRUPTED", "requestId": "x"}))
            .expect("frame");
        let e = k.end().expect_err("no answer");
        assert_eq!(e.invariant, "cai_replies");
        assert!(e.detail.contains("got no answer"), "{}", e.detail);

        let mut k = cai_kit(Box::new(CaiReplies));
        k.open_cai(1);
        k.text(1, json!({"type": "INTERRUPTED", "requestId": "x"}))
            .expect("frame");
        k.send(1, error("y", "INVALID_REQUEST")).expect("sent");
        let e = k.end().expect_err("names another request");
        assert!(e.detail.contains("while handling"), "{}", e.detail);
    }

    #[test]
    fn wrong_codes_and_duplicates_accepted_are_caught() {
        let mut k = cai_kit(Box::new(CaiReplies));
        k.open_cai(1);
        k.text(1, json!({"type": "AWAIT_MORE", "requestId": "x"}))
            .expect("frame");
        let e = k
            .send(1, error("x", "INVALID_PAYLOAD"))
            .expect_err("unknown request");
        assert!(e.detail.contains("not INVALID_REQUEST"), "{}", e.detail);

        let mut k = cai_kit(Box::new(CaiReplies));
        k.open_cai(1);
        k.completion(1, "r1", json!({})).expect("accepted");
        k.tokenized(1).expect("tokenized");
        k.send(
            1,
            json!({"type": "STREAM_START", "requestId": "r1", "timestamp": "t"}),
        )
        .expect("start");
        k.end().expect("end");
        let e = k.completion(1, "r1", json!({})).expect_err("duplicate");
        assert!(e.detail.contains("not INVALID_REQUEST"), "{}", e.detail);
    }

    /// Fabricated violations: a COMPLETION naming another model accepted,
    /// and one naming the served model refused with MODEL_NOT_FOUND.
    #[test]
    fn model_not_found_for_the_served_model_or_none_for_another_is_caught() {
        let completion = |model: &str| {
            json!({"type": "COMPLETION", "requestId": "r",
                   "payload": {"prompt": "<c1>hi", "model": model}})
        };
        let mut k = cai_kit(Box::new(CaiReplies));
        k.open_cai(1);
        let served = tokenwire_core::testing::tiny_model_info().name;
        k.text(1, completion("not-served")).expect("frame");
        let e = k
            .send(
                1,
                json!({"type": "STREAM_START", "requestId": "r", "timestamp": "t"}),
            )
            .expect_err("another model accepted");
        assert!(e.detail.contains("not MODEL_NOT_FOUND"), "{}", e.detail);

        let mut k = cai_kit(Box::new(CaiReplies));
        k.open_cai(1);
        k.text(1, completion(&served)).expect("frame");
        let e = k
            .send(1, error("r", "MODEL_NOT_FOUND"))
            .expect_err("the served model refused");
        assert!(e.detail.contains("the server serves"), "{}", e.detail);

        let mut k = cai_kit(Box::new(CaiReplies));
        k.open_cai(1);
        k.text(1, completion("not-served")).expect("frame");
        k.send(1, error("r", "MODEL_NOT_FOUND"))
            .expect("another model refused");
    }
}
