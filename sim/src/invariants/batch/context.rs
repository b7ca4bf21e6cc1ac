//! `batch_context`: a prompt runs exactly when its tokens and its
//! `max_new_tokens` fit the context (PROTOCOLS.md, `batch`): one whose
//! tokenized prompt plus `max_new_tokens` is at most `context_len` is never
//! refused for the context, and one past it never starts and ends with an
//! ERROR. A prompt is tokenized as its text with BOS (the simulated model's
//! byte tokenizer: one token per byte); a continued batch's prompts start
//! from the cached text, which the view does not count, so they are not
//! judged.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::testing::ByteCodec;
use tokenwire_core::{Output, TextCodec};

use super::view::{batch_send, BatchConnView};
use crate::invariants::{Check, Checker, Cx, Frame};

/// What the Host's refusal for the context says.
const CONTEXT_REFUSAL: &str = "exceed the context length";

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchContext;

/// (prompt tokens, `max_new_tokens`) of live prompt `rid`, when judged.
fn sizes(b: &BatchConnView, rid: &str) -> Option<(u64, u64)> {
    let prompt = b.prompts.get(*b.live.get(rid)?)?;
    let pay = b.payloads.get(prompt.payload)?;
    if pay.continued || pay.uncertain {
        return None;
    }
    let text = pay.prompts.get(prompt.named_pos)?;
    let n = ByteCodec.encode(text, true).ok()?.len() as u64;
    Some((n, pay.max_new))
}

impl Checker for BatchContext {
    fn name(&self) -> &'static str {
        "batch_context"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, Ok(events))) = batch_send(cx.view, out) else {
            return Ok(());
        };
        if b.ambiguous {
            return Ok(());
        }
        let context = u64::from(cx.model.context_len);
        for e in &events {
            let Some(rid) = e.request_id.as_deref() else {
                continue;
            };
            let Some((n, max_new)) = sizes(b, rid) else {
                continue;
            };
            let fits = n + max_new <= context;
            match &e.kind {
                EventKind::Error { error } if error.contains(CONTEXT_REFUSAL) && fits => {
                    return Err(format!(
                        "prompt {rid:?} on {conn:?} refused for the context with {n} tokens and max_new_tokens {max_new} (context {context})"
                    ))
                }
                EventKind::Started | EventKind::Complete { .. } if !fits => {
                    return Err(format!(
                        "prompt {rid:?} on {conn:?} ran with {n} tokens and max_new_tokens {max_new} (context {context})"
                    ))
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

    /// The tiny model's context is 512 tokens: a prompt of 499 bytes (500
    /// tokens with BOS) and 12 new tokens fits, 13 do not.
    fn payload(max_new: u64) -> serde_json::Value {
        json!({"prompts": [{"request_id": "r", "prompt": "a".repeat(499)}],
               "stream_response": false,
               "generation_config": {"max_new_tokens": max_new}})
    }

    #[test]
    fn a_prompt_that_fits_refused_or_one_that_does_not_run_is_caught() {
        let mut k = kit(Box::new(BatchContext));
        k.open_as(1, Dialect::Batch);
        k.text(1, payload(12)).expect("payload");
        k.send(1, json!([{"request_id": "r", "type": "ACCEPTED"}]))
            .expect("accepted");
        k.end().expect("end");
        let refused = json!([{"request_id": "r", "type": "ERROR",
            "error": "the prompt (500 tokens) plus max_new_tokens (12) exceed the context length of 512 tokens"}]);
        let e = k.send(1, refused).expect_err("it fits");
        assert_eq!(e.invariant, "batch_context");

        let mut k = kit(Box::new(BatchContext));
        k.open_as(1, Dialect::Batch);
        k.text(1, payload(13)).expect("payload");
        k.send(1, json!([{"request_id": "r", "type": "ACCEPTED"}]))
            .expect("accepted");
        k.end().expect("end");
        let e = k
            .send(1, json!([{"request_id": "r", "type": "STARTED"}]))
            .expect_err("one token over");
        assert!(e.detail.contains("ran with 500 tokens"), "{}", e.detail);
    }
}
