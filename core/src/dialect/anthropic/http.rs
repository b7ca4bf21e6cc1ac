//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: the body goes
//! to the `chat` machine as one frame, `{"route": "messages" |
//! "count_tokens", "body"}`; what the machine sends back becomes
//! Anthropic's `message`, its events (`event: NAME` lines, as Anthropic's
//! stream names them), or `{"input_tokens"}`. An error before anything
//! streamed is an HTTP error with its status; after, a last `error` event.

use serde_json::{json, Value};

use super::{chat_error_message, error_body, error_event, message, MessageStream};
use crate::http::json_object;
use crate::http::{
    closed_early, describe, HttpCall, HttpExchange, HttpFailure, HttpReply, HttpRequest, HttpRoute,
    HttpSpec, HttpStep, PathMatch, RETRY_AFTER_S,
};

/// The Messages routes.
pub(crate) static SPEC: HttpSpec = HttpSpec {
    routes: &[
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact(MESSAGES_PATH),
        },
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact(COUNT_TOKENS_PATH),
        },
    ],
    call,
    failure,
};

const MESSAGES_PATH: &str = "/v1/messages";
const COUNT_TOKENS_PATH: &str = "/v1/messages/count_tokens";

/// An error reply in Anthropic's shape, with `Retry-After` on a 429 or 503.
fn error_reply(status: u16, message: &str) -> HttpReply {
    HttpReply {
        retry_after: matches!(status, 429 | 503).then_some(RETRY_AFTER_S),
        ..HttpReply::new(status, error_body(status, message).to_string())
    }
}

/// The reply for a failure met before the Host saw the request.
fn failure(f: &HttpFailure) -> HttpReply {
    let (status, message, retry_after) = describe(f);
    HttpReply {
        retry_after,
        ..error_reply(status, &message)
    }
}

/// Maps a request body to its frame.
fn call(req: &HttpRequest<'_>) -> Result<HttpCall, HttpReply> {
    let counting = req.path == COUNT_TOKENS_PATH;
    let body = json_object(req.body).map_err(|m| error_reply(400, &m))?;
    // A bad `stream` is the machine's to refuse, as a JSON error.
    let stream = !counting && body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let route = if counting { "count_tokens" } else { "messages" };
    Ok(HttpCall {
        frames: vec![json!({"route": route, "body": body}).to_string()],
        stream,
        exchange: Box::new(Exchange {
            stream,
            counting,
            streamed: false,
            events: MessageStream::default(),
            request_id: None,
        }),
    })
}

/// One request's response.
struct Exchange {
    stream: bool,
    /// `count_tokens`: the machine's reply is already Anthropic's.
    counting: bool,
    /// An event was already sent (errors then go on the stream).
    streamed: bool,
    events: MessageStream,
    request_id: Option<String>,
}

impl Exchange {
    /// An error: an HTTP reply before anything streamed, else the stream's
    /// last event.
    fn error(&self, status: u16, message: &str) -> HttpStep {
        if self.streamed {
            HttpStep::LastEvent(error_event(status, message))
        } else {
            HttpStep::Reply(error_reply(status, message))
        }
    }
}

impl HttpExchange for Exchange {
    fn on_frame(&mut self, text: &str) -> HttpStep {
        let Ok(Value::Object(frame)) = serde_json::from_str::<Value>(text) else {
            return HttpStep::Wait;
        };
        let data = frame.get("data").cloned().unwrap_or(Value::Null);
        if let Some(id) = data.get("id").and_then(Value::as_str) {
            self.request_id.get_or_insert_with(|| id.to_string());
        }
        match frame.get("kind").and_then(Value::as_str) {
            Some("chunk") if self.stream => {
                let events = self.events.on_chunk(&data);
                if events.is_empty() {
                    return HttpStep::Wait;
                }
                self.streamed = true;
                HttpStep::Events {
                    events,
                    last: false,
                }
            }
            Some("done") => HttpStep::Events {
                events: self.events.on_done(),
                last: true,
            },
            Some("reply") if self.counting => {
                HttpStep::Reply(HttpReply::new(200, data.to_string()))
            }
            Some("reply") => HttpStep::Reply(HttpReply::new(200, message(&data).to_string())),
            Some("error") => {
                let status = frame.get("status").and_then(Value::as_u64).unwrap_or(500);
                let status = u16::try_from(status).unwrap_or(500);
                self.error(status, &chat_error_message(&data))
            }
            _ => HttpStep::Wait,
        }
    }

    fn on_close(&mut self, code: u16, _reason: &str) -> HttpStep {
        let (status, retry_after, message) = closed_early(code);
        match self.error(status, message) {
            HttpStep::Reply(r) => HttpStep::Reply(HttpReply { retry_after, ..r }),
            step => step,
        }
    }

    fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &'static str, body: &'static [u8]) -> HttpRequest<'static> {
        HttpRequest {
            method: "POST",
            path,
            body,
            model: "m",
        }
    }

    fn error_type(body: &str) -> String {
        let v: Value = serde_json::from_str(body).expect("json");
        assert_eq!(v["type"], "error", "{v}");
        v["error"]["type"].as_str().unwrap_or_default().to_string()
    }

    #[test]
    fn bodies_that_are_not_json_objects_get_anthropic_errors() {
        for body in [&b"not json"[..], b"[1]", b"\xff"] {
            let e = call(&req(MESSAGES_PATH, body)).expect_err("refused");
            assert_eq!(e.status, 400);
            assert_eq!(error_type(&e.body), "invalid_request_error");
        }
        let r = failure(&HttpFailure::Unauthorized { message: "no key" });
        assert_eq!(
            (r.status, error_type(&r.body)),
            (401, "authentication_error".into())
        );
        let r = failure(&HttpFailure::Busy { retry_after: 3 });
        assert_eq!((r.status, r.retry_after), (503, Some(3)));
        assert_eq!(error_type(&r.body), "overloaded_error");
    }

    #[test]
    fn a_stream_becomes_named_events_and_errors_after_it_start_end_it() {
        let mut c = call(&req(MESSAGES_PATH, br#"{"stream":true}"#)).expect("accepted");
        assert!(c.stream);
        assert!(c.frames[0].contains(r#""route":"messages""#));
        let step = c.exchange.on_frame(
            r#"{"kind":"chunk","data":{"id":"msg_x","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}],"usage":{"prompt_tokens":2}}}"#,
        );
        let HttpStep::Events { events, last } = step else {
            panic!("events: {step:?}")
        };
        assert!(!last);
        let names: Vec<_> = events.iter().filter_map(|e| e.event.as_deref()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta"
            ]
        );
        assert_eq!(c.exchange.request_id(), Some("msg_x"));
        let step = c
            .exchange
            .on_frame(r#"{"kind":"error","status":503,"data":{"error":{"message":"gone"}}}"#);
        let HttpStep::LastEvent(e) = step else {
            panic!("a last event: {step:?}")
        };
        assert_eq!(e.event.as_deref(), Some("error"));
        assert_eq!(error_type(&e.data), "overloaded_error");
        assert!(e.data.contains("gone"));
    }

    #[test]
    fn replies_and_errors_before_a_stream_are_http_replies() {
        let mut c = call(&req(MESSAGES_PATH, b"{}")).expect("accepted");
        assert!(!c.stream);
        let step = c.exchange.on_frame(
            r#"{"kind":"reply","data":{"id":"msg_y","model":"m","choices":[{"finish_reason":"stop","stop_sequence":null,"message":{"content":"ok"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}}"#,
        );
        let HttpStep::Reply(r) = step else {
            panic!("a reply")
        };
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(
            (v["type"].as_str(), v["content"][0]["text"].as_str()),
            (Some("message"), Some("ok"))
        );
        let mut c = call(&req(COUNT_TOKENS_PATH, br#"{"stream":true}"#)).expect("accepted");
        assert!(!c.stream, "count_tokens never streams");
        assert!(c.frames[0].contains(r#""route":"count_tokens""#));
        let HttpStep::Reply(r) = c
            .exchange
            .on_frame(r#"{"kind":"reply","data":{"input_tokens":12}}"#)
        else {
            panic!("a reply")
        };
        assert_eq!(r.body, r#"{"input_tokens":12}"#);
        let HttpStep::Reply(r) = c
            .exchange
            .on_frame(r#"{"kind":"error","status":429,"data":{"error":{"message":"slow"}}}"#)
        else {
            panic!("a reply")
        };
        assert_eq!((r.status, r.retry_after), (429, Some(RETRY_AFTER_S)));
        assert_eq!(error_type(&r.body), "rate_limit_error");
        let HttpStep::Reply(r) = c.exchange.on_close(1001, "") else {
            panic!("a reply")
        };
        assert_eq!((r.status, r.retry_after), (503, Some(RETRY_AFTER_S)));
    }
}
