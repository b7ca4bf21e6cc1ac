//! `batch_continuation`: a `batch` run starts from the text the Host's
//! continue-generation cache says. The view models the cache from the
//! frames (see [`super::view`]): a payload accepted under the
//! ordered ids of a batch that completed cleanly earlier on this Host
//! incarnation (no crash since) and not evicted since (the LRU of the run's
//! `batch_cache_entries`, with a hit counting as a use) continues it, its
//! prompts ignored; otherwise its prompts are used (a first batch, another
//! order of the same ids, an evicted entry, a batch after a crash). Then,
//! with `only_new_tokens` false, INITIALIZED's text is exactly that text
//! (the earlier prompt plus everything generated, or the new prompt) and
//! COMPLETE's text starts with it; with `only_new_tokens` true INITIALIZED's
//! text is empty.
//!
//! Not checked: the continued tokens themselves (the view does not follow
//! token ids across runs, only texts), the KV blocks kept or recomputed
//! for an entry (eviction under memory pressure is invisible but in time),
//! and connections where the same request id was in flight twice at once
//! (frames cannot be told apart there). A generation whose COMPLETE is
//! neither `is_eos` nor at `max_new_tokens` is taken as ended from outside
//! (not cached), as the Host does.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::Output;

use super::view::prompt_events;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchContinuation;

impl Checker for BatchContinuation {
    fn name(&self) -> &'static str {
        "batch_continuation"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, events)) = prompt_events(cx.view, out) else {
            return Ok(());
        };
        for (e, i) in events {
            let Some(i) = i else { continue };
            let pr = &b.prompts[i];
            let pay = &b.payloads[pr.payload];
            if pay.uncertain {
                continue;
            }
            let before = pay.before.get(pr.pos).map_or("", String::as_str);
            let what = if pay.continued {
                "the continued batch's text"
            } else {
                "the prompt"
            };
            match &e.kind {
                EventKind::Initialized { text } => {
                    let want = if pay.only_new { "" } else { before };
                    if text != want {
                        return Err(format!(
                            "INITIALIZED text {text:?} for {:?} on {conn:?}, expected {want:?} \
                             ({what}; only_new_tokens {})",
                            pr.rid, pay.only_new
                        ));
                    }
                }
                EventKind::Complete { text, .. } if !pay.only_new && !text.starts_with(before) => {
                    return Err(format!(
                        "COMPLETE text {text:?} for {:?} on {conn:?} does not start with \
                         {what} {before:?}",
                        pr.rid
                    ));
                }
                _ => {}
            }
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

    fn payload(prompt: &str, only_new: bool) -> serde_json::Value {
        json!({"prompts": [{"request_id": "a", "prompt": prompt}],
               "only_new_tokens": only_new, "stream_response": false,
               "generation_config": {"max_new_tokens": 2}})
    }

    #[test]
    fn a_continuation_that_starts_over_is_caught() {
        let mut k = kit(Box::new(BatchContinuation));
        k.open_as(1, Dialect::Batch);
        k.text(1, payload("<c1>P", true)).expect("payload");
        k.send(1, json!([{"request_id": "a", "type": "ACCEPTED"}]))
            .expect("accepted");
        k.send(
            1,
            json!([{"request_id": "a", "type": "COMPLETE", "text": "gh",
                          "is_eos": false, "new_tokens_count": 2, "execution_time": 0.1}]),
        )
        .expect("complete");
        k.end().expect("end");
        // The same ids again: continues from "<c1>Pgh", prompt ignored.
        k.text(1, payload("<c1>Q", false)).expect("payload");
        k.send(1, json!([{"request_id": "a", "type": "ACCEPTED"}]))
            .expect("accepted");
        k.end().expect("end");
        let err = k
            .send(
                1,
                json!([{"request_id": "a", "type": "INITIALIZED", "text": "<c1>Q"}]),
            )
            .expect_err("started over");
        assert_eq!(err.invariant, "batch_continuation");
        k.send(
            1,
            json!([{"request_id": "a", "type": "COMPLETE", "text": "<c1>Pghij",
                          "is_eos": false, "new_tokens_count": 2, "execution_time": 0.1}]),
        )
        .expect("continued");
        // After a crash the cache is gone: the prompt is used.
        k.m.crash(k.now());
        k.open_as(2, Dialect::Batch);
        k.text(2, payload("<c2>R", false)).expect("payload");
        k.send(2, json!([{"request_id": "a", "type": "ACCEPTED"}]))
            .expect("accepted");
        k.send(
            2,
            json!([{"request_id": "a", "type": "INITIALIZED", "text": "<c2>R"}]),
        )
        .expect("prompt used");
        assert!(k
            .send(
                2,
                json!([{"request_id": "a", "type": "COMPLETE", "text": "<c1>Pghijkl",
                             "is_eos": false, "new_tokens_count": 2, "execution_time": 0.1}])
            )
            .is_err());
    }
}
