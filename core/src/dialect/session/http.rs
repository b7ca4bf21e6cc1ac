//! `POST /v1/inference`: the `session` dialect over HTTP, stateless. The
//! body (`prompt`, `conversation_context`?, `session_id`?, `model`?,
//! sampling fields, `stream`?) becomes one `inference` frame on a virtual
//! connection, which runs it as a one-turn session that is never registered
//! and ends with the request. The reply is `{model, content, tokens_used,
//! finish_reason, session_id}`, or with `stream: true` the `stream_chunk`s
//! and the `response` as server-sent events. Errors keep the dialect's error
//! object, with the HTTP status its code calls for.

use serde_json::{Map, Value};

use super::codec::{self, ErrorCode, ErrorMessage, ServerMessage};
use crate::http::{
    closed_early, describe, HttpCall, HttpExchange, HttpFailure, HttpReply, HttpRoute, HttpSpec,
    HttpStep, PathMatch, SseEvent,
};
use crate::json::{self, Fields};

use crate::http::RETRY_AFTER_S;

fn error_reply(code: ErrorCode, message: String) -> HttpReply {
    let e = ErrorMessage {
        session_id: None,
        code,
        message,
        expected: None,
        recoverable: true,
        timestamp: 0,
    };
    reply_for(code, codec::encode_server(&ServerMessage::Error(e)))
}

fn reply_for(code: ErrorCode, body: String) -> HttpReply {
    let status = code.http_status();
    HttpReply {
        retry_after: matches!(status, 429 | 503).then_some(RETRY_AFTER_S),
        ..HttpReply::new(status, body)
    }
}

/// `session`'s HTTP side: `POST /v1/inference`, stateless.
pub(crate) static SPEC: HttpSpec = HttpSpec {
    routes: &[HttpRoute {
        method: "POST",
        path: PathMatch::Exact("/v1/inference"),
    }],
    call: |req| call(req.body, req.model),
    failure,
};

/// Maps a request body to its `inference` frame; `model` is the served model.
pub(crate) fn call(body: &[u8], model: &str) -> Result<HttpCall, HttpReply> {
    let invalid = |m: String| error_reply(ErrorCode::InvalidRequest, m);
    let text = std::str::from_utf8(body)
        .map_err(|e| invalid(format!("the request body is not UTF-8: {e}")))?;
    let mut obj = match json::parse(text).map_err(invalid)? {
        Value::Object(m) => m,
        other => {
            return Err(invalid(format!(
                "the request body must be a JSON object, got {}",
                json::type_name(&other)
            )))
        }
    };
    let f = Fields::new(&obj, "");
    let stream = f
        .bool("stream")
        .map_err(|e| invalid(e.to_string()))?
        .unwrap_or(false);
    let session_id = f
        .str("session_id")
        .map_err(|e| invalid(e.to_string()))?
        .map(str::to_string);
    obj.insert("type".into(), Value::from("inference"));
    // Decoded here too, so a malformed body is answered before a connection opens.
    codec::decode_value(&Value::Object(obj.clone())).map_err(|e| invalid(e.message))?;
    Ok(HttpCall {
        frames: vec![Value::Object(obj).to_string()],
        stream,
        exchange: Box::new(Exchange {
            stream,
            model: model.to_string(),
            session_id,
        }),
    })
}

/// The reply for a failure met before the Host saw the request.
pub(crate) fn failure(f: &HttpFailure) -> HttpReply {
    let (status, message, retry_after) = describe(f);
    let code = match f {
        HttpFailure::Busy { .. } => ErrorCode::RateLimited,
        HttpFailure::ShuttingDown { .. } => ErrorCode::InternalError,
        _ => ErrorCode::InvalidRequest,
    };
    HttpReply {
        status,
        retry_after,
        ..error_reply(code, message)
    }
}

/// One `/v1/inference` request's response.
struct Exchange {
    stream: bool,
    model: String,
    /// The client's tracking id, echoed.
    session_id: Option<String>,
}

impl HttpExchange for Exchange {
    fn on_frame(&mut self, text: &str) -> HttpStep {
        let Ok(msg) = codec::decode_server(text) else {
            return HttpStep::Wait;
        };
        let event = || SseEvent {
            event: None,
            data: text.to_string(),
        };
        match msg {
            ServerMessage::StreamChunk(_) if self.stream => HttpStep::Event(event()),
            ServerMessage::Response(_) | ServerMessage::Error(_) if self.stream => {
                HttpStep::LastEvent(event())
            }
            ServerMessage::Response(r) => {
                let mut out = Map::new();
                out.insert("model".into(), Value::from(self.model.clone()));
                out.insert("content".into(), Value::from(r.content));
                out.insert("tokens_used".into(), Value::from(r.tokens_used));
                out.insert("finish_reason".into(), Value::from(r.finish_reason));
                out.insert(
                    "session_id".into(),
                    self.session_id.clone().map_or(Value::Null, Value::from),
                );
                HttpStep::Reply(HttpReply::new(200, Value::Object(out).to_string()))
            }
            ServerMessage::Error(e) => HttpStep::Reply(reply_for(e.code, text.to_string())),
            _ => HttpStep::Wait,
        }
    }

    fn on_close(&mut self, code: u16, _reason: &str) -> HttpStep {
        let (status, retry_after, message) = closed_early(code);
        let r = HttpReply {
            status,
            retry_after,
            ..error_reply(ErrorCode::InternalError, message.into())
        };
        if self.stream {
            HttpStep::LastEvent(SseEvent {
                event: None,
                data: r.body,
            })
        } else {
            HttpStep::Reply(r)
        }
    }

    fn request_id(&self) -> Option<&str> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_becomes_one_inference_frame_and_bad_bodies_are_answered_at_once() {
        let c = call(br#"{"prompt":"hi","max_tokens":3,"session_id":"s"}"#, "m").expect("valid");
        assert_eq!(c.frames.len(), 1);
        let v: Value = serde_json::from_str(&c.frames[0]).expect("json");
        assert_eq!(v["type"], "inference");
        assert_eq!(v["max_tokens"], 3);
        assert!(!c.stream);
        for (body, needle) in [
            (&br#"{"max_tokens":3}"#[..], "`prompt`"),
            (br#"[1]"#, "JSON object"),
            (br#"{"prompt":"x","stream":"yes"}"#, "`stream`"),
            (
                br#"{"prompt":"x","conversation_context":[{"role":"robot","content":"c"}]}"#,
                "conversation_context[0].role",
            ),
        ] {
            let r = call(body, "m").expect_err("invalid");
            assert_eq!(r.status, 400);
            let v: Value = serde_json::from_str(&r.body).expect("json");
            assert_eq!(v["code"], "invalid_request");
            assert!(v["message"].as_str().unwrap_or("").contains(needle), "{v}");
        }
    }

    #[test]
    fn json_mode_answers_with_the_reply_and_stream_mode_relays_frames() {
        let chunk = r#"{"type":"stream_chunk","session_id":"","content":"a","message_index":1,"timestamp":5}"#;
        let done = r#"{"type":"response","session_id":"","content":"ab","tokens_used":7,"message_index":1,"finish_reason":"length","timestamp":6}"#;
        let mut j = call(br#"{"prompt":"x","session_id":"mine"}"#, "m")
            .expect("ok")
            .exchange;
        assert_eq!(j.on_frame(chunk), HttpStep::Wait);
        let HttpStep::Reply(r) = j.on_frame(done) else {
            panic!("a reply")
        };
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"model":"m","content":"ab","tokens_used":7,"finish_reason":"length","session_id":"mine"})
        );
        let mut s = call(br#"{"prompt":"x","stream":true}"#, "m")
            .expect("ok")
            .exchange;
        assert!(matches!(s.on_frame(chunk), HttpStep::Event(e) if e.data == chunk));
        assert!(matches!(s.on_frame(done), HttpStep::LastEvent(e) if e.data == done));
        let err = r#"{"type":"error","session_id":null,"code":"rate_limited","message":"busy","recoverable":true,"timestamp":1}"#;
        let mut j = call(br#"{"prompt":"x"}"#, "m").expect("ok").exchange;
        // `/v1/inference` has no request id of its own for the logs (its
        // session id, when given, is the client's).
        assert_eq!(j.request_id(), None);
        let HttpStep::Reply(r) = j.on_frame(err) else {
            panic!("a reply")
        };
        assert_eq!((r.status, r.retry_after), (429, Some(1)));
    }

    #[test]
    fn a_busy_server_is_rate_limited_with_retry_after_and_shutdown_an_internal_error() {
        let r = failure(&HttpFailure::Busy { retry_after: 2 });
        assert_eq!((r.status, r.retry_after), (503, Some(2)));
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["code"], "rate_limited");
        let r = failure(&HttpFailure::ShuttingDown { retry_after: 4 });
        assert_eq!((r.status, r.retry_after), (503, Some(4)));
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["code"], "internal_error");
        let r = failure(&HttpFailure::BodyTimeout);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(
            (r.status, v["code"].as_str()),
            (408, Some("invalid_request"))
        );
    }

    #[test]
    fn a_close_for_shutdown_is_a_503_with_retry_after_and_any_other_a_500() {
        let mut j = call(br#"{"prompt":"x"}"#, "m").expect("ok").exchange;
        let HttpStep::Reply(r) = j.on_close(1001, "server shutting down") else {
            panic!("a reply")
        };
        assert_eq!((r.status, r.retry_after), (503, Some(1)));
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["code"], "internal_error");
        let HttpStep::Reply(r) = j.on_close(1008, "policy") else {
            panic!("a reply")
        };
        assert_eq!((r.status, r.retry_after), (500, None));
    }
}
