//! `stream_text`: the `token` texts of a request concatenate to its
//! `completion.generated_text` (after the prompt when `echo_prompt` is set),
//! to the partial `generated_text` of a failure `error`, and to the cumulative
//! `generated_text` of each token frame that carries one.

use tokenwire_core::Output;

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct StreamText;

impl Checker for StreamText {
    fn name(&self) -> &'static str {
        "stream_text"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(r) = cx.view.current(*conn) else {
            return Ok(());
        };
        match f.kind() {
            "token" => {
                if let Some(cumulative) = f.str("generated_text") {
                    let expected = format!("{}{}", r.streamed, f.str("token").unwrap_or(""));
                    if cumulative != expected {
                        return Err(format!(
                            "token frame's generated_text {:?} is not the streamed text {:?} on {conn:?}",
                            clip(cumulative),
                            clip(&expected)
                        ));
                    }
                }
                Ok(())
            }
            "completion" if f.request_id() == cx.view.conns[conn].current.as_deref() => {
                let got = f.str("generated_text").unwrap_or("");
                let expected = if r.config.echo {
                    format!("{}{}", r.config.prompt, r.streamed)
                } else {
                    r.streamed.clone()
                };
                if r.config.known && got != expected {
                    return Err(format!(
                        "completion.generated_text {:?} differs from the streamed tokens {:?} (echo_prompt: {}) on {conn:?}",
                        clip(got),
                        clip(&expected),
                        r.config.echo
                    ));
                }
                Ok(())
            }
            "error"
                if f.is_failure() && f.request_id() == cx.view.conns[conn].current.as_deref() =>
            {
                let got = f.str("generated_text").unwrap_or("");
                if got != r.streamed {
                    return Err(format!(
                        "error.generated_text {:?} differs from the streamed tokens {:?} on {conn:?}",
                        clip(got),
                        clip(&r.streamed)
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
    fn a_completion_that_differs_from_the_stream_is_caught() {
        let mut k = kit(Box::new(StreamText));
        k.start(
            1,
            "gen_a",
            json!({"type": "config", "prompt": "hi", "options": {"echo_prompt": true}}),
        );
        k.token(1, "ab").expect("token");
        k.token(1, "c").expect("token");
        let good = json!({"type": "completion", "request_id": "gen_a", "generated_text": "hiabc"});
        let bad = json!({"type": "completion", "request_id": "gen_a", "generated_text": "abc"});
        let err = k.send(1, bad).expect_err("echo missing");
        assert_eq!(err.invariant, "stream_text");
        k.send(1, good).expect("matches");
    }

    #[test]
    fn a_wrong_cumulative_text_is_caught() {
        let mut k = kit(Box::new(StreamText));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.token(1, "ab").expect("token");
        let err = k
            .send(
                1,
                json!({"type": "token", "token": "c", "finished": false, "generated_text": "ac"}),
            )
            .expect_err("cumulative");
        assert!(err.detail.contains("generated_text"));
    }
}
