//! `session_http`: what a client of `POST /v1/inference` gets (PROTOCOLS.md,
//! `session`), replayed through the shell's exchange ([`Replays`]) over the
//! frames the Host sent.
//!
//! Without `stream`: a `response` is a 200 whose body is `{model, content,
//! tokens_used, finish_reason, session_id}` (the served model, the frame's
//! text and counts, the request's `session_id` or null); an `error` keeps
//! the dialect's error object with the status its code calls for, and
//! `Retry-After` exactly on 429 and 503; a close before either is a 503 with
//! `Retry-After` when the server is going away (1001), a 500 without
//! otherwise, both `internal_error`. With `stream`: each `stream_chunk` is
//! an event carrying the frame, the `response` or `error` the last one, and
//! a close before them a last event holding an `internal_error`. Nothing
//! else the Host sends becomes part of the response.

use serde_json::Value;
use tokenwire_core::http::{HttpReply, HttpStep};
use tokenwire_core::{Dialect, Input, Output};

use crate::invariants::http::{Replays, Step};
use crate::invariants::{clip, Check, Checker, Cx, Frame};

/// The HTTP status each error code calls for (the reference table).
fn status_of(code: &str) -> u16 {
    match code {
        "unknown_session" => 404,
        "session_exists" | "message_index_mismatch" => 409,
        "token_budget_exhausted" => 402,
        "rate_limited" => 429,
        "internal_error" => 503,
        _ => 400,
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct SessionHttp {
    replays: Replays,
}

impl Default for SessionHttp {
    fn default() -> SessionHttp {
        SessionHttp {
            replays: Replays::new(Dialect::Session),
        }
    }
}

/// `reply`'s `Retry-After` is present exactly for 429 and 503.
fn retry_rule(reply: &HttpReply) -> Check {
    let wants = matches!(reply.status, 429 | 503);
    if reply.retry_after.is_some() != wants {
        return Err(format!(
            "a {} reply {} Retry-After",
            reply.status,
            if wants { "lacks" } else { "carries" }
        ));
    }
    Ok(())
}

fn body(reply: &HttpReply) -> Value {
    serde_json::from_str(&reply.body).unwrap_or(Value::Null)
}

/// What `frame` (sent by the Host) must give a request `req`.
fn judge_frame(model: &str, req: &Value, frame: &Frame, text: &str, step: &HttpStep) -> Check {
    let stream = req["stream"] == true;
    let kind = frame.kind();
    match (kind, stream, step) {
        ("stream_chunk", true, HttpStep::Event(e))
        | ("response" | "error", true, HttpStep::LastEvent(e)) => {
            if e.data != text || e.event.is_some() {
                return Err(format!("the {kind} event does not carry the frame as sent"));
            }
            Ok(())
        }
        ("response", false, HttpStep::Reply(r)) => {
            let b = body(r);
            let want_sid = req.get("session_id").cloned().unwrap_or(Value::Null);
            if r.status != 200
                || r.retry_after.is_some()
                || b["model"] != model
                || b["content"] != frame.v["content"]
                || b["tokens_used"] != frame.v["tokens_used"]
                || b["finish_reason"] != frame.v["finish_reason"]
                || b["session_id"] != want_sid
            {
                return Err(format!(
                    "a response became {} {} (want 200 with its content, counts, the model and session_id {want_sid})",
                    r.status,
                    clip(&r.body)
                ));
            }
            Ok(())
        }
        ("error", false, HttpStep::Reply(r)) => {
            let code = frame.str("code").unwrap_or("");
            if r.status != status_of(code) || body(r)["code"] != code {
                return Err(format!(
                    "an error {code:?} became {} {} (want {} with the error object)",
                    r.status,
                    clip(&r.body),
                    status_of(code)
                ));
            }
            retry_rule(r)
        }
        ("stream_chunk", false, HttpStep::Wait) => Ok(()),
        (k, _, HttpStep::Wait) if !matches!(k, "stream_chunk" | "response" | "error") => Ok(()),
        _ => Err(format!(
            "a {kind:?} frame to a request with stream={stream} gave {step:?}"
        )),
    }
}

/// What a close with `code` before the last step must give `req`.
fn judge_close(req: &Value, code: u16, step: &HttpStep) -> Check {
    let want = if code == 1001 { 503 } else { 500 };
    match (req["stream"] == true, step) {
        (true, HttpStep::LastEvent(e)) => {
            let v: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
            if v["type"] != "error" || v["code"] != "internal_error" {
                return Err(format!(
                    "a close {code} ended the stream with {}",
                    clip(&e.data)
                ));
            }
            Ok(())
        }
        (false, HttpStep::Reply(r)) => {
            if r.status != want || body(r)["code"] != "internal_error" {
                return Err(format!(
                    "a close {code} became {} {} (want {want}, internal_error)",
                    r.status,
                    clip(&r.body)
                ));
            }
            retry_rule(r)
        }
        (stream, step) => Err(format!(
            "a close {code} of a request with stream={stream} gave {step:?}"
        )),
    }
}

impl Checker for SessionHttp {
    fn name(&self) -> &'static str {
        "session_http"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        self.replays.on_input(input, &cx.model.name);
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let Some(Step {
            conn,
            request,
            step,
        }) = self.replays.on_output(out)
        else {
            return Ok(());
        };
        let r = match (out, frame) {
            (Output::Send { text, .. }, Some(f)) => {
                judge_frame(&cx.model.name, request, f, text, &step)
            }
            (Output::Close { code, .. }, _) => judge_close(request, *code, &step),
            _ => Ok(()),
        };
        r.map_err(|e| format!("HTTP request on {conn:?}: {e}"))
    }

    fn on_crash(&mut self) {
        self.replays.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::ConnId;

    fn response() -> Value {
        json!({"type": "response", "session_id": "", "content": "ab", "tokens_used": 7,
               "message_index": 1, "finish_reason": "length", "timestamp": 6})
    }

    fn request(k: &mut crate::invariants::testkit::Kit, stream: bool) {
        k.open_http(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "inference", "prompt": "<c1>hi", "session_id": "mine", "stream": stream}),
        )
        .expect("request");
    }

    #[test]
    fn replies_as_the_contract_says_pass() {
        let mut k = kit(Box::new(SessionHttp::default()));
        request(&mut k, false);
        k.send(
            1,
            json!({"type": "stream_chunk", "session_id": "", "content": "a",
                         "message_index": 1, "timestamp": 5}),
        )
        .expect("a chunk waits");
        k.send(1, response()).expect("the reply");

        let mut k = kit(Box::new(SessionHttp::default()));
        request(&mut k, true);
        k.send(
            1,
            json!({"type": "error", "session_id": "", "code": "rate_limited",
                         "message": "m", "recoverable": true, "timestamp": 1}),
        )
        .expect("the last event");

        let mut k = kit(Box::new(SessionHttp::default()));
        request(&mut k, false);
        k.out(Output::Close {
            conn: ConnId(1),
            code: 1001,
            reason: "shutting down".into(),
        })
        .expect("a 503 with Retry-After");
    }

    /// Fabricated violations: steps an exchange must not give.
    #[test]
    fn a_reply_against_the_contract_is_caught() {
        let req = json!({"type": "inference", "prompt": "x", "stream": false});
        let judge =
            |f: &Frame, step: &HttpStep| judge_frame("tiny", &req, f, &f.v.to_string(), step);
        let f = Frame::parse(r#"{"type":"error","code":"rate_limited","message":"m"}"#);
        let no_retry = HttpStep::Reply(HttpReply::new(429, r#"{"code":"rate_limited"}"#.into()));
        let e = judge(&f, &no_retry).expect_err("no Retry-After");
        assert!(e.contains("Retry-After"), "{e}");
        let wrong_status = HttpStep::Reply(HttpReply {
            retry_after: Some(1),
            ..HttpReply::new(503, r#"{"code":"rate_limited"}"#.into())
        });
        let e = judge(&f, &wrong_status).expect_err("wrong status");
        assert!(e.contains("want 429"), "{e}");

        let chunk = Frame::parse(r#"{"type":"stream_chunk","content":"a"}"#);
        let e = judge(&chunk, &HttpStep::Reply(HttpReply::new(200, "{}".into())))
            .expect_err("a chunk that answers");
        assert!(e.contains("stream_chunk"), "{e}");

        let r = Frame::parse(&response().to_string());
        let other_model = json!({"model": "big", "content": "ab", "tokens_used": 7,
                                 "finish_reason": "length", "session_id": null})
        .to_string();
        let e = judge(&r, &HttpStep::Reply(HttpReply::new(200, other_model)))
            .expect_err("another model named");
        assert!(e.contains("response became"), "{e}");

        let close = HttpStep::Reply(HttpReply::new(503, r#"{"code":"internal_error"}"#.into()));
        let e = judge_close(&req, 1001, &close).expect_err("a 503 without Retry-After");
        assert!(e.contains("Retry-After"), "{e}");
        let e = judge_close(&req, 1011, &close).expect_err("a 1011 is a 500");
        assert!(e.contains("want 500"), "{e}");
    }
}
