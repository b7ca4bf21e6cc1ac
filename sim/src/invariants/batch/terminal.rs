//! `batch_terminal`: each payload (and binary frame) on a `batch`
//! connection is answered in arrival order, either with one ACCEPTED frame
//! naming its prompts in payload order (duplicates left out; their ERROR
//! frame follows at once), or refused as a whole with one ERROR per prompt
//! it names (one with a null id if it names none) and no ACCEPTED. Every
//! accepted prompt then gets exactly one COMPLETE or ERROR (unless its
//! connection closes first or the Host crashes: the liveness checker
//! reports those still due at the end), nothing after it, and STARTED and
//! INITIALIZED at most once each, STARTED never after INITIALIZED and
//! neither after its first PROGRESS, and both before a COMPLETE. A frame that is none of these (an
//! event for a prompt not in flight, an answer nobody waits for) is caught.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::Output;

use super::view::{batch_send, Reading};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchTerminal;

impl Checker for BatchTerminal {
    fn name(&self) -> &'static str {
        "batch_terminal"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, Ok(events))) = batch_send(cx.view, out) else {
            return Ok(());
        };
        if b.ambiguous {
            return Ok(());
        }
        match b.read(&events) {
            Reading::Accepted(p) => {
                let pay = &b.payloads[p];
                let got: Vec<Option<String>> =
                    events.iter().map(|e| e.request_id.clone()).collect();
                let want: Vec<Option<String>> = pay.unique().into_iter().map(Some).collect();
                if pay.binary || got != want {
                    return Err(format!(
                        "ACCEPTED {got:?} on {conn:?} answers payload #{p}, which names {:?}",
                        pay.named
                    ));
                }
                Ok(())
            }
            Reading::Refused(_) | Reading::Dups | Reading::AllDups(_) => Ok(()),
            Reading::Bad(e) => Err(format!("on {conn:?}: {e}")),
            Reading::Prompts(idx) => {
                for (e, i) in events.iter().zip(idx) {
                    let Some(i) = i else {
                        return Err(format!(
                            "{} for {:?} on {conn:?}, which is no prompt in flight there \
                             (nor the refusal of payload {:?})",
                            e.kind.as_str(),
                            e.request_id,
                            b.unanswered.front().map(|&p| &b.payloads[p].named)
                        ));
                    };
                    let pr = &b.prompts[i];
                    let bad = match e.kind {
                        EventKind::Accepted => true,
                        EventKind::Started => {
                            pr.started > 0 || pr.initialized > 0 || pr.progress > 0
                        }
                        EventKind::Initialized { .. } => pr.initialized > 0 || pr.progress > 0,
                        // A prompt completes only after it was picked up
                        // and its prefill was done: beam searches too.
                        EventKind::Complete { .. } => pr.started == 0 || pr.initialized == 0,
                        _ => false,
                    };
                    if bad {
                        return Err(format!(
                            "{} for {:?} on {conn:?} after {} STARTED, {} INITIALIZED, {} PROGRESS",
                            e.kind.as_str(),
                            pr.rid,
                            pr.started,
                            pr.initialized,
                            pr.progress
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Dialect;

    fn payload(ids: &[&str]) -> serde_json::Value {
        let prompts: Vec<_> = ids
            .iter()
            .map(|i| json!({"request_id": i, "prompt": "<c1>x"}))
            .collect();
        json!({"prompts": prompts})
    }

    #[test]
    fn a_second_complete_and_a_refusal_answered_with_accepted_are_caught() {
        let mut k = kit(Box::new(BatchTerminal));
        k.open_as(1, Dialect::Batch);
        k.text(1, payload(&["a", "b"])).expect("payload");
        k.send(
            1,
            json!([{"request_id": "a", "type": "ACCEPTED"},
                         {"request_id": "b", "type": "ACCEPTED"}]),
        )
        .expect("accepted");
        k.end().expect("end");
        let done = |id: &str| {
            json!([{"request_id": id, "type": "COMPLETE", "text": "x", "is_eos": false,
                    "new_tokens_count": 1, "execution_time": 0.1}])
        };
        k.send(1, json!([{"request_id": "a", "type": "STARTED"}]))
            .expect("started");
        k.send(
            1,
            json!([{"request_id": "a", "type": "INITIALIZED", "text": ""}]),
        )
        .expect("initialized");
        k.send(1, done("a")).expect("complete");
        let err = k.send(1, done("a")).expect_err("twice");
        assert_eq!(err.invariant, "batch_terminal");
        // A duplicate STARTED.
        k.send(
            1,
            json!([{"request_id": "b", "type": "PROGRESS", "text": "x"}]),
        )
        .expect("progress");
        assert!(k
            .send(
                1,
                json!([{"request_id": "b", "type": "INITIALIZED", "text": ""}])
            )
            .is_err());
        // A payload refused as a whole must not be ACCEPTED in part.
        k.text(1, payload(&["c", "d"])).expect("payload");
        assert!(k
            .send(1, json!([{"request_id": "c", "type": "ACCEPTED"}]))
            .is_err());
        k.send(
            1,
            json!([{"request_id": "c", "type": "ERROR", "error": "bad"},
                         {"request_id": "d", "type": "ERROR", "error": "bad"}]),
        )
        .expect("refused as a whole");
    }

    /// A fabricated violation: a COMPLETE with no INITIALIZED before it
    /// (a beam search that never said its prefill was done).
    #[test]
    fn a_complete_before_initialized_is_caught() {
        let mut k = kit(Box::new(BatchTerminal));
        k.open_as(1, Dialect::Batch);
        k.text(1, payload(&["a"])).expect("payload");
        k.send(1, json!([{"request_id": "a", "type": "ACCEPTED"}]))
            .expect("accepted");
        k.send(1, json!([{"request_id": "a", "type": "STARTED"}]))
            .expect("started");
        let err = k
            .send(
                1,
                json!([{"request_id": "a", "type": "COMPLETE", "text": "x", "is_eos": false,
                        "new_tokens_count": 1, "execution_time": 0.1}]),
            )
            .expect_err("no INITIALIZED");
        assert!(err.detail.contains("0 INITIALIZED"), "{}", err.detail);
    }
}
