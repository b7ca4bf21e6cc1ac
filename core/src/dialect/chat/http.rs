//! `POST /v1/chat/completions`, `POST /v1/completions`, `POST
//! /v1/embeddings`, and vLLM's `POST /tokenize`, `POST /detokenize` and `GET
//! /tokenizer_info` (whose frame's body is empty): the body goes to
//! the `chat` machine as one frame, `{"route", "body"}`; what the machine
//! sends back (`{"kind": "chunk" | "done" | "reply" | "error", ...}`)
//! becomes one JSON reply, or `data: {chunk}` server-sent events ending
//! with `data: [DONE]`. An error before anything streamed is an HTTP error
//! with its status; after, a last `data: {"error": ...}` event.

use serde_json::{json, Value};

use super::codec::{error_body, Route};
use crate::dialect::openai::{error_reply, failure};
use crate::http::json_object;
use crate::http::{
    closed_early, HttpCall, HttpExchange, HttpReply, HttpRequest, HttpRoute, HttpSpec, HttpStep,
    PathMatch, SseEvent, RETRY_AFTER_S,
};

/// The chat routes.
pub(crate) static SPEC: HttpSpec = HttpSpec {
    routes: &[
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact(CHAT_PATH),
        },
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact("/v1/completions"),
        },
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact(EMBEDDINGS_PATH),
        },
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact(TOKENIZE_PATH),
        },
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact(DETOKENIZE_PATH),
        },
        HttpRoute {
            method: "GET",
            path: PathMatch::Exact(TOKENIZER_INFO_PATH),
        },
    ],
    call,
    failure,
};

const CHAT_PATH: &str = "/v1/chat/completions";
/// vLLM's tokenizer routes ([`super::tokenize`]).
const TOKENIZE_PATH: &str = "/tokenize";
const DETOKENIZE_PATH: &str = "/detokenize";
const TOKENIZER_INFO_PATH: &str = "/tokenizer_info";
/// The Embeddings route ([`super::embeddings`]).
const EMBEDDINGS_PATH: &str = "/v1/embeddings";

/// Maps a request body to its frame.
fn call(req: &HttpRequest<'_>) -> Result<HttpCall, HttpReply> {
    let route = match req.path {
        CHAT_PATH => Route::Chat.name(),
        TOKENIZE_PATH => "tokenize",
        DETOKENIZE_PATH => "detokenize",
        EMBEDDINGS_PATH => "embeddings",
        TOKENIZER_INFO_PATH => "tokenizer_info",
        _ => Route::Completions.name(),
    };
    let body = if req.path == TOKENIZER_INFO_PATH {
        // A GET: nothing to read.
        serde_json::Map::new()
    } else {
        json_object(req.body).map_err(|m| error_reply(400, "invalid_request", &m, None))?
    };
    // A bad `stream` is the machine's to refuse, as a JSON error. The
    // tokenizer and embeddings routes never stream.
    let generates = req.path == CHAT_PATH || req.path == "/v1/completions";
    let stream = generates && body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    Ok(HttpCall {
        frames: vec![json!({"route": route, "body": body}).to_string()],
        stream,
        exchange: Box::new(Exchange {
            stream,
            streamed: false,
            request_id: None,
        }),
    })
}

/// One request's response.
struct Exchange {
    stream: bool,
    /// A chunk was already sent (errors then go on the stream).
    streamed: bool,
    request_id: Option<String>,
}

impl Exchange {
    fn event(data: String) -> SseEvent {
        SseEvent { event: None, data }
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
                self.streamed = true;
                HttpStep::Event(Self::event(data.to_string()))
            }
            Some("done") => HttpStep::LastEvent(Self::event("[DONE]".into())),
            Some("reply") => HttpStep::Reply(HttpReply::new(200, data.to_string())),
            Some("error") if self.streamed => HttpStep::LastEvent(Self::event(data.to_string())),
            Some("error") => {
                let status = frame.get("status").and_then(Value::as_u64).unwrap_or(500);
                let status = u16::try_from(status).unwrap_or(500);
                HttpStep::Reply(HttpReply {
                    retry_after: matches!(status, 429 | 503).then_some(RETRY_AFTER_S),
                    ..HttpReply::new(status, data.to_string())
                })
            }
            _ => HttpStep::Wait,
        }
    }

    fn on_close(&mut self, code: u16, _reason: &str) -> HttpStep {
        let (status, retry_after, message) = closed_early(code);
        let code = if status >= 500 {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let body = error_body(status, code, message, None).to_string();
        if self.streamed {
            HttpStep::LastEvent(Self::event(body))
        } else {
            HttpStep::Reply(HttpReply {
                retry_after,
                ..HttpReply::new(status, body)
            })
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

    #[test]
    fn bodies_that_are_not_json_objects_get_openai_errors() {
        for body in [&b"not json"[..], b"[1]", b"\xff"] {
            let e = call(&req(CHAT_PATH, body)).expect_err("refused");
            assert_eq!(e.status, 400);
            let v: Value = serde_json::from_str(&e.body).expect("json");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        }
    }

    #[test]
    fn frames_become_a_reply_or_data_events_ending_with_done() {
        let mut c = call(&req(CHAT_PATH, br#"{"stream":true}"#)).expect("accepted");
        assert!(c.stream);
        assert!(c.frames[0].contains(r#""route":"chat""#));
        let step = c
            .exchange
            .on_frame(r#"{"kind":"chunk","data":{"id":"x","choices":[]}}"#);
        assert_eq!(
            step,
            HttpStep::Event(SseEvent {
                event: None,
                data: r#"{"id":"x","choices":[]}"#.into()
            })
        );
        assert_eq!(c.exchange.request_id(), Some("x"));
        let last = c
            .exchange
            .on_frame(r#"{"kind":"error","status":503,"data":{"error":{}}}"#);
        assert!(
            matches!(last, HttpStep::LastEvent(_)),
            "after a chunk, errors stream"
        );
        let done = c.exchange.on_frame(r#"{"kind":"done"}"#);
        assert_eq!(
            done,
            HttpStep::LastEvent(SseEvent {
                event: None,
                data: "[DONE]".into()
            })
        );
        let mut c = call(&req("/v1/completions", b"{}")).expect("accepted");
        assert!(c.frames[0].contains(r#""route":"completions""#));
        let e = c
            .exchange
            .on_frame(r#"{"kind":"error","status":429,"data":{"error":{}}}"#);
        let HttpStep::Reply(r) = e else {
            panic!("a reply")
        };
        assert_eq!((r.status, r.retry_after), (429, Some(RETRY_AFTER_S)));
    }
}
