//! `token_delivery`: what a client reads is exactly what the engine sampled
//! for its request, in order, nothing lost, doubled or misrouted, across
//! pauses, preemption, recompute and lost devices. A `token_id` streamed is
//! the next sampled token; at the `completion`, `usage.completion_tokens` is
//! at most the tokens sampled, and the streamed text is the decoding of
//! that many sampled tokens (a stop cuts it short, never changes it; any
//! other end leaves nothing held back). Text is not held longer than it must
//! be: once the sampled tokens decode to whole characters, the frame of the
//! last of them has carried all of it (unless stop strings, or the content
//! filter's stop rules, may hold a tail; a content-filter stop cuts the text
//! short as a stop string does).

use tokenwire_core::testing::ByteCodec;
use tokenwire_core::{Output, TextCodec};

use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct TokenDelivery;

impl Checker for TokenDelivery {
    fn name(&self) -> &'static str {
        "token_delivery"
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
                let Some(id) = f.v.get("token_id").and_then(|v| v.as_u64()) else {
                    return Ok(());
                };
                let i = r.ids_streamed as usize;
                match r.sampled.get(i) {
                    Some(&t) if u64::from(t) == id => {}
                    other => {
                        return Err(format!(
                            "token {} of the request on {conn:?} has token_id {id}, but the engine sampled {other:?} there",
                            i + 1
                        ))
                    }
                }
                let text = ByteCodec.decode(&r.sampled[..=i]);
                let now = format!("{}{}", r.streamed, f.str("token").unwrap_or(""));
                // A content filter's stop rules hold text back as stop
                // strings do.
                let may_hold = r.had_stops || filter_holds(cx);
                if !may_hold && !text.ends_with('\u{FFFD}') && now != text {
                    return Err(format!(
                        "after token {} on {conn:?} the client has {:?}, but the tokens sampled so far are the whole text {:?}",
                        i + 1,
                        clip(&now),
                        clip(&text)
                    ));
                }
                Ok(())
            }
            "completion" => {
                let Some(k) = f.v["usage"]["completion_tokens"].as_u64() else {
                    return Ok(());
                };
                let k = k as usize;
                if k > r.sampled.len() {
                    return Err(format!(
                        "completion on {conn:?} reports {k} tokens, the engine sampled {} for it",
                        r.sampled.len()
                    ));
                }
                let text = ByteCodec.decode(&r.sampled[..k]);
                if !text.starts_with(r.streamed.as_str()) {
                    return Err(format!(
                        "streamed text {:?} on {conn:?} is not what the engine sampled ({:?})",
                        clip(&r.streamed),
                        clip(&text)
                    ));
                }
                // Only a stop (string or end of sequence) may end the text
                // early; any other end releases everything held back, a
                // half-written character included. (Held text is matched
                // against the stop strings of the moment, so a request that
                // had some may lose its tail to one at any end.)
                // A content filter's stop rule may cut the held tail at any
                // end, as a stop string may.
                let cut_by_stop = matches!(f.str("finish_reason"), Some("stop" | "content_filter"))
                    || r.had_stops
                    || filter_holds(cx);
                if !cut_by_stop && r.streamed != text {
                    return Err(format!(
                        "request on {conn:?} ended ({}) having streamed {:?} of {:?}",
                        f.str("finish_reason").unwrap_or("?"),
                        clip(&r.streamed),
                        clip(&text)
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Whether the Host's content filter has rules that hold text back.
fn filter_holds(cx: &Cx<'_>) -> bool {
    cx.config
        .content_filter
        .as_ref()
        .is_some_and(|f| f.has_stop_rules())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn text_the_engine_never_sampled_is_caught() {
        let mut k = kit(Box::new(TokenDelivery));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step");
        k.end().expect("end");
        // The engine samples `a`; the client is told `b`.
        k.step_done(1, 1).expect("done");
        k.send(
            1,
            json!({"type": "token", "token": "b", "token_id": 101, "finished": false}),
        )
        .expect_err("wrong token id");
        let mut k = kit(Box::new(TokenDelivery));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step");
        k.end().expect("end");
        k.step_done(1, 1).expect("done");
        k.token(1, "b").expect("no id to check yet");
        let err = k
            .send(
                1,
                json!({"type": "completion", "request_id": "gen_a", "generated_text": "b",
                "finish_reason": "length", "usage": {"completion_tokens": 1}}),
            )
            .expect_err("streamed text differs");
        assert_eq!(err.invariant, "token_delivery");
        let err = {
            let mut k = kit(Box::new(TokenDelivery));
            k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
            k.send(
                1,
                json!({"type": "completion", "request_id": "gen_a", "generated_text": "",
                "finish_reason": "length", "usage": {"completion_tokens": 2}}),
            )
            .expect_err("more tokens than sampled")
        };
        assert!(err.detail.contains("sampled 0"));
    }

    #[test]
    fn complete_text_held_back_mid_stream_is_caught() {
        let mut k = kit(Box::new(TokenDelivery));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step");
        k.end().expect("end");
        k.step_done(1, 1).expect("done");
        // The engine sampled `a`, a whole character: its frame must carry it.
        let err = k
            .send(
                1,
                json!({"type": "token", "token": "", "token_id": 100, "finished": false}),
            )
            .expect_err("held");
        assert!(err.detail.contains("whole text"), "{}", err.detail);
        let mut k = kit(Box::new(TokenDelivery));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step");
        k.end().expect("end");
        k.step_done(1, 1).expect("done");
        k.send(
            1,
            json!({"type": "token", "token": "a", "token_id": 100, "finished": false}),
        )
        .expect("released at once");
    }

    #[test]
    fn text_held_back_at_the_end_is_caught() {
        let mut k = kit(Box::new(TokenDelivery));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step");
        k.end().expect("end");
        k.step_done(1, 1).expect("done");
        // The engine sampled `a`, but the request ends at its length with
        // nothing streamed.
        k.token(1, "").expect("held");
        let err = k
            .send(
                1,
                json!({"type": "completion", "request_id": "gen_a", "generated_text": "",
                "finish_reason": "length", "usage": {"completion_tokens": 1}}),
            )
            .expect_err("the held text never came");
        assert!(err.detail.contains("ended (length)"), "{}", err.detail);
    }
}
