//! `max_tokens`: a request never streams more tokens than its `max_tokens`
//! (one more frame is allowed: the final piece of a generation ended from
//! outside), its `usage.completion_tokens` is at most `max_tokens` and equals
//! it when `finish_reason` is `length`, `usage.prompt_tokens` is the prompt's
//! real token count under the byte tokenizer, and `total_tokens` is their sum.

use tokenwire_core::testing::ByteCodec;
use tokenwire_core::{Output, TextCodec};

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct MaxTokens;

impl Checker for MaxTokens {
    fn name(&self) -> &'static str {
        "max_tokens"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(r) = cx.view.current(*conn) else {
            return Ok(());
        };
        let max = r.config.max_tokens;
        match f.kind() {
            "token" => {
                if u64::from(r.token_frames) + 1 > u64::from(max) + 1 {
                    return Err(format!(
                        "token frame {} on {conn:?} exceeds max_tokens {max}",
                        r.token_frames + 1
                    ));
                }
                Ok(())
            }
            "completion" => {
                let u = &f.v["usage"];
                let (Some(p), Some(c), Some(t)) = (
                    u["prompt_tokens"].as_u64(),
                    u["completion_tokens"].as_u64(),
                    u["total_tokens"].as_u64(),
                ) else {
                    return Err(format!("completion on {conn:?} without usage counts"));
                };
                if c > u64::from(max) {
                    return Err(format!(
                        "completion_tokens {c} > max_tokens {max} on {conn:?}"
                    ));
                }
                if f.str("finish_reason") == Some("length") && r.config.known && c != u64::from(max)
                {
                    return Err(format!(
                        "finish_reason length with {c} tokens but max_tokens {max} on {conn:?}"
                    ));
                }
                if t != p + c {
                    return Err(format!("total_tokens {t} != {p} + {c} on {conn:?}"));
                }
                if r.config.known {
                    let want = ByteCodec
                        .encode(&r.config.prompt, true)
                        .map(|v| v.len() as u64)
                        .unwrap_or(0);
                    if p != want {
                        return Err(format!(
                            "prompt_tokens {p}, but the prompt is {want} tokens, on {conn:?}"
                        ));
                    }
                }
                if u64::from(r.token_frames) > c + 1 {
                    return Err(format!(
                        "{} token frames but completion_tokens {c} on {conn:?}",
                        r.token_frames
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
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn too_many_tokens_and_wrong_usage_are_caught() {
        let mut k = kit(Box::new(MaxTokens));
        k.start(
            1,
            "gen_a",
            json!({"type": "config", "prompt": "hi", "parameters": {"max_tokens": 2}}),
        );
        k.token(1, "a").expect("1");
        k.token(1, "b").expect("2");
        k.token(1, "").expect("the final piece may come on top");
        let err = k.token(1, "c").expect_err("4th frame");
        assert_eq!(err.invariant, "max_tokens");

        let mut k = kit(Box::new(MaxTokens));
        k.start(
            1,
            "gen_a",
            json!({"type": "config", "prompt": "hi", "parameters": {"max_tokens": 2}}),
        );
        let err = k
            .send(
                1,
                json!({"type": "completion", "request_id": "gen_a", "finish_reason": "length",
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}),
            )
            .expect_err("3 > 2");
        assert!(err.detail.contains("max_tokens"));
    }
}
