//! `responses_http`: what a client of `POST /v1/responses` and
//! `GET /v1/responses/{id}` gets (PROTOCOLS.md, `responses`), replayed
//! through the shell's exchange ([`Replays`]) over the frames the Host sent.
//!
//! An `error` before anything streamed is an HTTP error with the event's
//! `status` and body `{"error": <the event's error>}`, with `Retry-After`
//! exactly on 429 and 503; `response.retrieved` is a 200 whose body is the
//! stored Response. Without `stream`, every other event waits except a
//! terminal one (`response.completed`, `response.incomplete`,
//! `response.failed`), which is a 200 whose body is its Response. With
//! `stream`, every event is a server-sent event named by its type and
//! carrying the frame, the terminal one (or an `error` after the stream
//! began) the last. A close before the last step is a 503 with
//! `Retry-After` when the server is going away (1001) and a 500 otherwise,
//! or, once the stream began, a last `error` event with that status.

use serde_json::{json, Value};
use tokenwire_core::http::{HttpReply, HttpStep};
use tokenwire_core::{ConnId, Dialect, Input, Output};

use std::collections::BTreeSet;

use crate::invariants::http::{Replays, Step};
use crate::invariants::{clip, Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug)]
pub struct ResponsesHttp {
    replays: Replays,
    /// Streaming requests whose stream began (an event was sent).
    streamed: BTreeSet<ConnId>,
}

impl Default for ResponsesHttp {
    fn default() -> ResponsesHttp {
        ResponsesHttp {
            replays: Replays::new(Dialect::Responses),
            streamed: BTreeSet::new(),
        }
    }
}

fn terminal(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    )
}

/// `reply` is `status` with `body`, and `Retry-After` exactly on 429 and 503.
fn expect_reply(reply: &HttpReply, status: u16, body: &Value) -> Check {
    let got: Value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
    if reply.status != status || &got != body {
        return Err(format!(
            "replied {} {} (want {status} {})",
            reply.status,
            clip(&reply.body),
            clip(&body.to_string())
        ));
    }
    if reply.retry_after.is_some() != matches!(status, 429 | 503) {
        return Err(format!(
            "a {status} reply {} Retry-After",
            if reply.retry_after.is_some() {
                "carries"
            } else {
                "lacks"
            }
        ));
    }
    Ok(())
}

/// What `frame` must give a request `req` whose stream had begun or not.
fn judge_frame(req: &Value, streamed: bool, frame: &Frame, text: &str, step: &HttpStep) -> Check {
    let kind = frame.kind();
    let stream = req["stream"] == true && req["type"] != "response.retrieve";
    match step {
        HttpStep::Reply(r) if kind == "error" && !streamed => {
            let status = frame.v["status"].as_u64().unwrap_or(0);
            let status = u16::try_from(status).unwrap_or(0);
            expect_reply(r, status, &json!({"error": frame.v["error"]}))
        }
        HttpStep::Reply(r) if kind == "response.retrieved" => {
            expect_reply(r, 200, &frame.v["response"])
        }
        HttpStep::Reply(r) if !stream && terminal(kind) => {
            expect_reply(r, 200, &frame.v["response"])
        }
        HttpStep::Wait if !stream && !terminal(kind) && kind != "error" => Ok(()),
        HttpStep::Event(e) | HttpStep::LastEvent(e) if stream && (kind != "error" || streamed) => {
            let last = terminal(kind) || kind == "error";
            if matches!(step, HttpStep::LastEvent(_)) != last {
                return Err(format!(
                    "{kind:?} was {} event",
                    if last { "not the last" } else { "the last" }
                ));
            }
            if e.event.as_deref() != Some(kind) || e.data != text {
                return Err(format!(
                    "the {kind:?} event is not named by its type or does not carry the frame"
                ));
            }
            Ok(())
        }
        _ => Err(format!(
            "a {kind:?} frame to a request with stream={stream} (began: {streamed}) gave {step:?}"
        )),
    }
}

/// What a close with `code` before the last step must give.
fn judge_close(streamed: bool, code: u16, step: &HttpStep) -> Check {
    let status = if code == 1001 { 503 } else { 500 };
    match step {
        HttpStep::LastEvent(e) if streamed => {
            let v: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
            if e.event.as_deref() != Some("error") || v["status"] != status {
                return Err(format!(
                    "a close {code} ended the stream with {:?} {} (want an error event, status {status})",
                    e.event,
                    clip(&e.data)
                ));
            }
            Ok(())
        }
        HttpStep::Reply(r) if !streamed => {
            let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
            if r.status != status || v["error"]["code"] != "server_error" {
                return Err(format!(
                    "a close {code} became {} {} (want {status}, server_error)",
                    r.status,
                    clip(&r.body)
                ));
            }
            if r.retry_after.is_some() != (status == 503) {
                return Err(format!(
                    "a close {code}'s {status} reply has the wrong Retry-After"
                ));
            }
            Ok(())
        }
        _ => Err(format!(
            "a close {code} (stream began: {streamed}) gave {step:?}"
        )),
    }
}

impl Checker for ResponsesHttp {
    fn name(&self) -> &'static str {
        "responses_http"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        if let Input::Open { conn, .. } = input {
            self.streamed.remove(conn);
        }
        self.replays.on_input(input, &cx.model.name);
        Ok(())
    }

    fn on_output(&mut self, _cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let Some(Step {
            conn,
            request,
            step,
        }) = self.replays.on_output(out)
        else {
            return Ok(());
        };
        let streamed = self.streamed.contains(&conn);
        let r = match (out, frame) {
            (Output::Send { text, .. }, Some(f)) => judge_frame(request, streamed, f, text, &step),
            (Output::Close { code, .. }, _) => judge_close(streamed, *code, &step),
            _ => Ok(()),
        };
        if matches!(step, HttpStep::Event(_) | HttpStep::LastEvent(_)) {
            self.streamed.insert(conn);
        }
        r.map_err(|e| format!("HTTP request on {conn:?}: {e}"))
    }

    fn on_crash(&mut self) {
        self.replays.clear();
        self.streamed.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;

    fn created() -> Value {
        json!({"type": "response.created", "sequence_number": 0,
               "response": {"id": "resp_1", "status": "in_progress", "output": []}})
    }

    fn completed() -> Value {
        json!({"type": "response.completed", "sequence_number": 7,
               "response": {"id": "resp_1", "status": "completed", "output": []}})
    }

    fn not_found() -> Value {
        json!({"type": "error", "status": 404,
               "error": {"type": "invalid_request_error", "code": "model_not_found",
                         "message": "m", "param": "model"}})
    }

    #[test]
    fn replies_as_the_contract_says_pass() {
        for stream in [false, true] {
            let mut k = kit(Box::new(ResponsesHttp::default()));
            k.open_http(1, Dialect::Responses);
            k.text(
                1,
                json!({"type": "response.create", "input": "<c1>hi", "stream": stream}),
            )
            .expect("create");
            k.send(1, created()).expect("created");
            k.send(1, completed()).expect("completed");
        }
        let mut k = kit(Box::new(ResponsesHttp::default()));
        k.open_http(1, Dialect::Responses);
        k.text(
            1,
            json!({"type": "response.create", "input": "<c1>hi", "model": "x"}),
        )
        .expect("create");
        k.send(1, not_found()).expect("a 404");
        let mut k = kit(Box::new(ResponsesHttp::default()));
        k.open_http(1, Dialect::Responses);
        k.text(
            1,
            json!({"type": "response.retrieve", "response_id": "resp_1"}),
        )
        .expect("retrieve");
        k.out(Output::Close {
            conn: ConnId(1),
            code: 1001,
            reason: "shutting down".into(),
        })
        .expect("a 503");
    }

    /// Fabricated violations: steps an exchange must not give.
    #[test]
    fn a_reply_against_the_contract_is_caught() {
        let plain = json!({"type": "response.create", "input": "x"});
        let stream = json!({"type": "response.create", "input": "x", "stream": true});
        let judge = |req: &Value, streamed: bool, v: Value, step: HttpStep| {
            let f = Frame::parse(&v.to_string());
            judge_frame(req, streamed, &f, &v.to_string(), &step)
        };
        // An error answered as a 200.
        let e = judge(
            &plain,
            false,
            not_found(),
            HttpStep::Reply(HttpReply::new(200, "null".into())),
        )
        .expect_err("an error as a 200");
        assert!(e.contains("want 404"), "{e}");
        // The first event answered as if it were the last.
        let body = created()["response"].to_string();
        let e = judge(
            &plain,
            false,
            created(),
            HttpStep::Reply(HttpReply::new(200, body)),
        )
        .expect_err("created as the reply");
        assert!(e.contains("response.created"), "{e}");
        // A streamed terminal event that is not the last.
        let ev = tokenwire_core::http::SseEvent {
            event: Some("response.completed".into()),
            data: completed().to_string(),
        };
        let e = judge(&stream, true, completed(), HttpStep::Event(ev)).expect_err("not the last");
        assert!(e.contains("not the last"), "{e}");
        // A 503 close without Retry-After.
        let r = HttpReply::new(503, json!({"error": {"code": "server_error"}}).to_string());
        let e = judge_close(false, 1001, &HttpStep::Reply(r)).expect_err("no Retry-After");
        assert!(e.contains("Retry-After"), "{e}");
    }
}
