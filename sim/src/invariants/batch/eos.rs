//! `batch_eos`: a sampled prompt's COMPLETE says `is_eos` exactly when its
//! run ended with the end-of-sequence token. The simulated engine writes
//! one token per byte of text and ends a multi-byte character before it
//! ever writes EOS, and the EOS token has no text. So a run that ended
//! with EOS counted one token more than its generated text has bytes; and
//! a run that ended short of both `max_new_tokens` and the context, with
//! no shutdown to cut it, can only have ended with EOS.
//!
//! Beam searches are `batch_beams`' (their `is_eos` is the best
//! hypothesis'), and not judged here: continued batches (their prompt is
//! cached text whose tokens the view does not count), uncertain ones, and
//! runs on a Host with content-filter stop rules (a stop ends a run early,
//! without EOS).

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::testing::ByteCodec;
use tokenwire_core::{Output, TextCodec};

use super::view::prompt_events;
use crate::invariants::generate::wire::filters;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchEos;

impl Checker for BatchEos {
    fn name(&self) -> &'static str {
        "batch_eos"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        if filters(cx) || cx.view.shutdown_at.is_some() {
            return Ok(());
        }
        let Some((conn, b, events)) = prompt_events(cx.view, out) else {
            return Ok(());
        };
        for (e, i) in events {
            let (
                EventKind::Complete {
                    text,
                    is_eos,
                    new_tokens_count,
                    ..
                },
                Some(i),
            ) = (&e.kind, i)
            else {
                continue;
            };
            let pr = &b.prompts[i];
            let pay = &b.payloads[pr.payload];
            if pay.beams > 1 || pay.continued || pay.uncertain {
                continue;
            }
            let prompt = pay.prompts.get(pr.named_pos).map_or("", String::as_str);
            let generated = if pay.only_new {
                text.as_str()
            } else {
                text.strip_prefix(prompt).unwrap_or(text)
            };
            let (n, bytes) = (u64::from(*new_tokens_count), generated.len() as u64);
            if *is_eos && (n != bytes + 1 || generated.contains('\u{FFFD}')) {
                return Err(format!(
                    "COMPLETE of {:?} on {conn:?} says is_eos, but its {n} tokens wrote {bytes} bytes (an EOS writes none, every other token one)",
                    pr.rid
                ));
            }
            let prompt_tokens = ByteCodec.encode(prompt, true).map_or(0, |ids| ids.len()) as u64;
            let short = n < pay.max_new && prompt_tokens + n < u64::from(cx.model.context_len);
            if !*is_eos && short {
                return Err(format!(
                    "COMPLETE of {:?} on {conn:?} ended after {n} tokens, short of max_new_tokens {} and the context, yet says no EOS",
                    pr.rid, pay.max_new
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
    use serde_json::{json, Value};
    use tokenwire_core::Dialect;

    /// A payload of one sampled prompt `p` (`max_new_tokens` 5), accepted
    /// and started, then `complete` for it.
    fn completed(only_new: bool, complete: Value) -> Check {
        let mut k = kit(Box::new(BatchEos));
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "a", "prompt": "p"}],
                   "only_new_tokens": only_new,
                   "generation_config": {"max_new_tokens": 5}}),
        )
        .map_err(|v| v.detail)?;
        k.send(1, json!([{"request_id": "a", "type": "ACCEPTED"}]))
            .map_err(|v| v.detail)?;
        k.send(1, json!([{"request_id": "a", "type": "STARTED"}]))
            .map_err(|v| v.detail)?;
        k.send(1, json!([complete])).map_err(|v| v.detail)
    }

    fn complete(text: &str, is_eos: bool, n: u32) -> Value {
        json!({"request_id": "a", "type": "COMPLETE", "text": text, "is_eos": is_eos,
               "new_tokens_count": n, "execution_time": 0.0})
    }

    /// Fabricated violations: `is_eos` said of a run that did not end with
    /// EOS, and not said of one that must have.
    #[test]
    fn a_wrong_is_eos_is_caught() {
        completed(true, complete("ab", true, 3)).expect("two bytes and EOS");
        completed(true, complete("abcde", false, 5)).expect("max_new_tokens");
        completed(false, complete("pab", true, 3)).expect("after the prompt");
        let e = completed(true, complete("abc", true, 3)).expect_err("no EOS token");
        assert!(e.contains("says is_eos"), "{e}");
        let e = completed(true, complete("ab", false, 3)).expect_err("must have been EOS");
        assert!(e.contains("yet says no EOS"), "{e}");
    }
}
