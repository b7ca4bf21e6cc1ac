//! `batch_text`: a `batch` COMPLETE's `new_tokens_count` is at most its
//! payload's `max_new_tokens` (or the run's default, capped at the context
//! length), and for a payload with `stream_response` true every new token
//! had its PROGRESS element (PROTOCOLS.md: one for each prompt that
//! produced a token in the step, whether or not the token adds text), and
//! the PROGRESS texts of a prompt add up to its COMPLETE text: exactly,
//! with `only_new_tokens` true; after the text its run started from (its
//! INITIALIZED text), with `only_new_tokens` false.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::Output;

use super::view::prompt_events;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchText;

impl Checker for BatchText {
    fn name(&self) -> &'static str {
        "batch_text"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, events)) = prompt_events(cx.view, out) else {
            return Ok(());
        };
        for (e, i) in events {
            let (
                Some(i),
                EventKind::Complete {
                    text,
                    new_tokens_count,
                    ..
                },
            ) = (i, &e.kind)
            else {
                continue;
            };
            let pr = &b.prompts[i];
            let pay = &b.payloads[pr.payload];
            if u64::from(*new_tokens_count) > pay.max_new {
                return Err(format!(
                    "COMPLETE for {:?} on {conn:?} counts {new_tokens_count} new tokens, \
                     max_new_tokens is {}",
                    pr.rid, pay.max_new
                ));
            }
            // Without a stream, or when the text it started from is not
            // known here (a continuation under a content filter's stop
            // rules, see `BatchCache`), only the count is checked.
            if !pay.stream || (pay.uncertain && !pay.only_new) {
                continue;
            }
            if pr.progress < *new_tokens_count {
                return Err(format!(
                    "COMPLETE for {:?} on {conn:?} counts {new_tokens_count} new tokens \
                     but {} PROGRESS elements came for it",
                    pr.rid, pr.progress
                ));
            }
            let want = if pay.only_new {
                pr.streamed.clone()
            } else {
                let before = pay.before.get(pr.pos).map_or("", String::as_str);
                format!("{before}{}", pr.streamed)
            };
            if *text != want {
                return Err(format!(
                    "COMPLETE text {text:?} for {:?} on {conn:?} is not what was streamed \
                     ({want:?}; only_new_tokens {})",
                    pr.rid, pay.only_new
                ));
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

    /// A kit with a streamed payload of prompts `a` and `b` (at most 2 new
    /// tokens), accepted, each with one PROGRESS element of text "h".
    fn one_token_streamed() -> crate::invariants::testkit::Kit {
        let mut k = kit(Box::new(BatchText));
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "a", "prompt": "<c1>x"},
                               {"request_id": "b", "prompt": "<c1>y"}],
                   "generation_config": {"max_new_tokens": 2}}),
        )
        .expect("payload");
        k.send(
            1,
            json!([{"request_id": "a", "type": "ACCEPTED"},
                   {"request_id": "b", "type": "ACCEPTED"}]),
        )
        .expect("accepted");
        k.end().expect("end");
        k.send(
            1,
            json!([{"request_id": "a", "type": "PROGRESS", "text": "h"},
                   {"request_id": "b", "type": "PROGRESS", "text": "h"}]),
        )
        .expect("progress");
        k
    }

    /// A COMPLETE for `id` with `text` and `n` new tokens.
    fn done(id: &str, text: &str, is_eos: bool, n: u32) -> serde_json::Value {
        json!([{"request_id": id, "type": "COMPLETE", "text": text, "is_eos": is_eos,
                "new_tokens_count": n, "execution_time": 0.1}])
    }

    #[test]
    fn a_complete_text_unlike_its_stream_or_too_long_is_caught() {
        let mut k = one_token_streamed();
        let err = k
            .send(1, done("a", "hi", false, 1))
            .expect_err("not streamed");
        assert_eq!(err.invariant, "batch_text");
        assert!(k.send(1, done("b", "h", false, 3)).is_err());
    }

    #[test]
    fn a_token_without_its_progress_element_is_caught() {
        // Two tokens, the second (an end of sequence) adding no text: it
        // must still have had its PROGRESS element.
        let mut k = one_token_streamed();
        let err = k
            .send(1, done("a", "h", true, 2))
            .expect_err("one PROGRESS for two");
        assert!(err.detail.contains("PROGRESS elements"), "{}", err.detail);
        k.send(1, done("b", "h", true, 1)).expect("one for one");
    }
}
