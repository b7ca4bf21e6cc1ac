//! `replies`: every client frame of a `generate` connection gets the first
//! reply the dialect promises for it (PROTOCOLS.md), judged by an
//! independent model of the dialect ([`super::model`]): an error
//! with the right code, `recoverable` and a message that names the bad
//! field; an `init` (or the refusal the request's length, the pool or the
//! shutdown calls for); an acknowledgement of the right operation for the
//! request in flight, a `modified` one carrying exactly the new effective
//! parameters; a stop's final `token`. Frames held while the connection
//! waited are answered in arrival order when it goes on.

use std::collections::BTreeSet;

use tokenwire_core::{ConnId, Input, Output};

use super::model::{expect, judge, Expect, State};
use super::view::Pending;
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cur, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Replies {
    /// Connections whose frame of this event was answered already.
    answered: BTreeSet<ConnId>,
    /// This event's first reply went out (while held frames are handled,
    /// the first answers the config whose prompt came back tokenized).
    replied: bool,
}

/// True for a frame that answers a client frame (not a stream's token, a
/// queue position, loading progress or a failure).
fn is_reply(f: &Frame) -> bool {
    match f.kind() {
        "init" | "token" => true,
        "error" => !f.is_failure(),
        "status" => !matches!(f.str("operation"), Some("queued" | "model_loading")),
        _ => false,
    }
}

impl Checker for Replies {
    fn name(&self) -> &'static str {
        "replies"
    }

    fn on_input(&mut self, _cx: &Cx<'_>, _input: &Input) -> Check {
        self.answered.clear();
        self.replied = false;
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, text }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if !is_reply(f) {
            return Ok(());
        }
        let Some(c) = cx.view.conns.get(conn) else {
            return Ok(());
        };
        // Which frame this answers: while held frames are handled, the
        // oldest one; otherwise the frame this event brought, if it was not
        // held and is not answered yet.
        let held = if cx.view.replaying(*conn) {
            c.pending.front()
        } else {
            let this_frame = matches!(cx.input, Cur::Text(i) | Cur::Binary(i) if i == *conn);
            if !this_frame || c.pending.len() != 1 || self.answered.contains(conn) {
                return Ok(());
            }
            c.pending.back()
        };
        let Some(held) = held else {
            return Ok(());
        };
        // A token is an answer only to a stop; the stream's own tokens
        // (after a resume) are not.
        if f.kind() == "token" && f.v["finished"] != true {
            return Ok(());
        }
        self.answered.insert(*conn);
        let current = c
            .current
            .as_deref()
            .and_then(|rid| cx.view.requests.get(rid).map(|r| (rid, r)));
        let st = State {
            current,
            last_request: c.last_request.as_deref(),
            model: &cx.model.name,
            context_len: u64::from(cx.model.context_len),
            default_max_tokens: u64::from(cx.config.default_max_tokens.min(cx.model.context_len)),
            block_size: u64::from(cx.model.block_size),
            num_blocks: u64::from(cx.model.num_blocks),
            shutting_down: cx.view.shutdown_at.is_some(),
            queue_may_be_full: cx.view.outstanding().len() as u64
                >= u64::from(cx.config.max_queued_requests),
            feedback_allowed: c.feedback.allows(cx.now),
            text_failed: cx.view.text_failure == Some(*conn) && !self.replied,
        };
        self.replied = true;
        // A regenerate handled at once already replaced the request in the
        // view (it carries that request's config): it starts a new one.
        let regenerated = matches!(held.kind, Pending::Config(_))
            && held.frame.v["type"] == "control"
            && held.frame.v["action"] == "regenerate";
        let e = if regenerated {
            Expect::Start {
                refusals: vec![("memory_pressure", None), ("internal_error", None)],
            }
        } else {
            match expect(&held.frame, &st) {
                Some(e) => e,
                None => return Ok(()),
            }
        };
        judge(&e, &f.v).map_err(|why| {
            format!(
                "{conn:?} sent {} and got {}: {why}",
                clip(&held.frame.v.to_string()),
                clip(text)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn a_wrong_answer_to_each_kind_of_frame_is_caught() {
        let mut k = kit(Box::new(Replies::default()));
        k.open(1);
        // A first frame that is not a config must be refused for good.
        k.text(1, json!({"type": "feedback", "rating": 1}))
            .expect("frame");
        let err = k
            .send(
                1,
                json!({"type": "error", "error": "invalid_request", "message": "m",
                            "recoverable": true, "recovery_action": "none"}),
            )
            .expect_err("recoverable first-frame refusal");
        assert_eq!(err.invariant, "replies");
        k.end().expect("end");

        k.open(2);
        k.text(
            2,
            json!({"type": "config", "prompt": "hi", "parameters": {"temperature": 3}}),
        )
        .expect("frame");
        let err = k
            .send(
                2,
                json!({"type": "error", "error": "invalid_request", "message": "bad prompt",
                            "recoverable": true, "recovery_action": "none"}),
            )
            .expect_err("the message must name the field");
        assert!(
            err.detail.contains("parameters.temperature"),
            "{}",
            err.detail
        );
        k.end().expect("end");

        // A valid config: an init is right, a made-up refusal is not.
        k.text(2, json!({"type": "config", "prompt": "hi"}))
            .expect("frame");
        let err = k
            .send(
                2,
                json!({"type": "error", "error": "memory_pressure", "message": "m",
                            "recoverable": true, "recovery_action": "retry"}),
            )
            .expect_err("nothing full");
        assert_eq!(err.invariant, "replies");
    }

    /// A config held for its tokens, which come back as `result`, then
    /// answered with `reply`.
    fn tokenized_then(result: Result<Vec<u32>, String>, reply: serde_json::Value) -> Check {
        use tokenwire_core::text::byte::ByteCodec;
        use tokenwire_core::{Encoded, TextDone, TextJob, TextJobId, TextWork};
        let mut k = kit(Box::new(Replies::default()));
        k.open(1);
        k.text(1, json!({"type": "config", "prompt": "hi"}))
            .map_err(|v| v.detail)?;
        k.out(Output::Tokenize(TextJob {
            id: TextJobId(1),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Encode {
                text: "hi".into(),
                add_special: true,
            },
        }))
        .map_err(|v| v.detail)?;
        k.end().map_err(|v| v.detail)?;
        k.input(Input::Tokenized(TextDone {
            id: TextJobId(1),
            result: result.map(|ids| Encoded { ids, dropped: 0 }),
        }))
        .map_err(|v| v.detail)?;
        k.send(1, reply).map_err(|v| v.detail)
    }

    /// A fabricated violation: a prompt the tokenizer could not read,
    /// answered as if it were too long, or started.
    #[test]
    fn a_prompt_the_tokenizer_could_not_read_is_refused_as_invalid() {
        let failed = || Err("the chat template could not be rendered".to_string());
        let invalid = json!({"type": "error", "error": "invalid_request",
                             "message": "prompt could not be tokenized: x",
                             "recoverable": true, "recovery_action": "none"});
        tokenized_then(failed(), invalid).expect("the promised refusal");
        let too_long = json!({"type": "error", "error": "context_length_exceeded",
                              "message": "m", "recoverable": true,
                              "recovery_action": "shorten_prompt"});
        let e = tokenized_then(failed(), too_long).expect_err("not a length");
        assert!(e.contains("invalid_request"), "{e}");
        let init = json!({"type": "init", "request_id": "gen_a", "model": "tiny",
                          "model_info": {"version": "t", "max_tokens": 512, "quantization": "f32"}});
        tokenized_then(failed(), init.clone()).expect_err("nothing to start");
        tokenized_then(Ok(vec![1, 104, 105]), init).expect("read: it starts");
    }

    #[test]
    fn a_modify_ack_must_carry_the_new_effective_parameters() {
        let mut k = kit(Box::new(Replies::default()));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi",
                                   "parameters": {"max_tokens": 20, "temperature": 0.5, "seed": 4}}));
        k.text(
            1,
            json!({"type": "control", "action": "modify", "parameters": {"top_p": 0.9}}),
        )
        .expect("frame");
        let good = json!({"type": "status", "operation": "modified", "request_id": "gen_a",
            "parameters": {"max_tokens": 20, "temperature": 0.5, "top_p": 0.9, "top_k": 0,
                           "repetition_penalty": 1.0, "stop": [], "seed": 4, "top_logprobs": 5}});
        let mut wrong = good.clone();
        wrong["parameters"]["temperature"] = json!(0.699999988079071);
        let err = k.send(1, wrong).expect_err("temperature changed");
        assert_eq!(err.invariant, "replies");
        let mut k = kit(Box::new(Replies::default()));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi",
                                   "parameters": {"max_tokens": 20, "temperature": 0.5, "seed": 4}}));
        k.text(
            1,
            json!({"type": "control", "action": "modify", "parameters": {"top_p": 0.9}}),
        )
        .expect("frame");
        k.send(1, good).expect("exactly the effective values");
    }

    #[test]
    fn feedback_names_the_request_and_resume_needs_a_pause() {
        let mut k = kit(Box::new(Replies::default()));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.text(1, json!({"type": "control", "action": "resume"}))
            .expect("frame");
        let err = k
            .send(
                1,
                json!({"type": "status", "operation": "resumed", "request_id": "gen_a"}),
            )
            .expect_err("not paused");
        assert_eq!(err.invariant, "replies");
        k.end().expect("end");
        k.text(1, json!({"type": "feedback", "rating": 1}))
            .expect("frame");
        let err = k
            .send(
                1,
                json!({"type": "status", "operation": "feedback_received", "request_id": "gen_b"}),
            )
            .expect_err("wrong request");
        assert_eq!(err.invariant, "replies");
    }
}
