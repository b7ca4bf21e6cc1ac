//! `POST /v1/responses` and `GET /v1/responses/{id}`: the `responses`
//! dialect over HTTP. A create body becomes one `response.create` frame on a
//! virtual connection; the reply is the final Response object, or with
//! `"stream": true` every event as server-sent events (`event: <type>` and
//! `data: <json>`). An error before anything streamed is an HTTP error
//! (`{"error": {...}}` with the event's status), as the SDKs expect. A `GET`
//! becomes a `response.retrieve` frame answered from the host's store.

use serde_json::{json, Value};

use super::codec;
use crate::http::{
    closed_early, HttpCall, HttpExchange, HttpReply, HttpRoute, HttpSpec, HttpStep, PathMatch,
    SseEvent,
};
use crate::json;

use crate::dialect::openai::{error_reply, failure};

/// `responses`' HTTP side: `POST /v1/responses` creates,
/// `GET /v1/responses/{id}` retrieves a stored response.
pub(crate) static SPEC: HttpSpec = HttpSpec {
    routes: &[
        HttpRoute {
            method: "POST",
            path: PathMatch::Exact("/v1/responses"),
        },
        HttpRoute {
            method: "GET",
            path: PathMatch::Id(RETRIEVE_PREFIX),
        },
    ],
    call: |req| match req.path.strip_prefix(RETRIEVE_PREFIX) {
        Some(id) => Ok(retrieve(id)),
        None => create(req.body),
    },
    failure,
};

/// The path of a stored response, before its id.
const RETRIEVE_PREFIX: &str = "/v1/responses/";

/// Maps `POST /v1/responses` with `body` to its frame.
pub(crate) fn create(body: &[u8]) -> Result<HttpCall, HttpReply> {
    let invalid = |m: String, p: Option<&str>| error_reply(400, "invalid_request", &m, p);
    let text = std::str::from_utf8(body)
        .map_err(|e| invalid(format!("the request body is not UTF-8: {e}"), None))?;
    let mut obj = match json::parse(text) {
        Ok(Value::Object(m)) => m,
        Ok(other) => {
            return Err(invalid(
                format!(
                    "the request body must be a JSON object, got {}",
                    json::type_name(&other)
                ),
                None,
            ))
        }
        Err(m) => return Err(error_reply(400, "invalid_json", &m, None)),
    };
    obj.insert("type".into(), Value::from("response.create"));
    let event = Value::Object(obj);
    let stream = match codec::decode_value(&event) {
        Ok(codec::ClientEvent::Create(req)) => req.stream,
        Ok(_) => false,
        Err(e) => return Err(invalid(e.message, e.param.as_deref())),
    };
    Ok(HttpCall {
        frames: vec![event.to_string()],
        stream,
        exchange: Box::new(Exchange {
            stream,
            streamed: false,
            request_id: None,
        }),
    })
}

/// Maps `GET /v1/responses/{id}` to its frame.
pub(crate) fn retrieve(id: &str) -> HttpCall {
    HttpCall {
        frames: vec![json!({"type": "response.retrieve", "response_id": id}).to_string()],
        stream: false,
        exchange: Box::new(Exchange {
            stream: false,
            streamed: false,
            request_id: Some(id.to_string()),
        }),
    }
}

/// One request's response.
struct Exchange {
    stream: bool,
    /// An event was already sent (errors then go on the stream).
    streamed: bool,
    request_id: Option<String>,
}

impl HttpExchange for Exchange {
    fn on_frame(&mut self, text: &str) -> HttpStep {
        let Ok(Value::Object(event)) = serde_json::from_str::<Value>(text) else {
            return HttpStep::Wait;
        };
        let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
        if let Some(id) = event
            .get("response")
            .and_then(|r| r.get("id"))
            .and_then(Value::as_str)
        {
            self.request_id = Some(id.to_string());
        }
        if kind == "error" && !self.streamed {
            let status = event.get("status").and_then(Value::as_u64).unwrap_or(500);
            let status = u16::try_from(status).unwrap_or(500);
            let body = json!({"error": event.get("error").cloned().unwrap_or(Value::Null)});
            return HttpStep::Reply(HttpReply {
                retry_after: matches!(status, 429 | 503).then_some(1),
                ..HttpReply::new(status, body.to_string())
            });
        }
        if kind == "response.retrieved" {
            let body = event.get("response").cloned().unwrap_or(Value::Null);
            return HttpStep::Reply(HttpReply::new(200, body.to_string()));
        }
        let terminal = codec::is_terminal(kind) || kind == "error";
        if self.stream {
            self.streamed = true;
            let e = SseEvent {
                event: Some(kind.to_string()),
                data: text.to_string(),
            };
            return if terminal {
                HttpStep::LastEvent(e)
            } else {
                HttpStep::Event(e)
            };
        }
        if terminal {
            let body = event.get("response").cloned().unwrap_or(Value::Null);
            return HttpStep::Reply(HttpReply::new(200, body.to_string()));
        }
        HttpStep::Wait
    }

    fn on_close(&mut self, code: u16, _reason: &str) -> HttpStep {
        let (status, retry_after, message) = closed_early(code);
        let r = HttpReply {
            retry_after,
            ..error_reply(status, "server_error", message, None)
        };
        if self.streamed {
            HttpStep::LastEvent(SseEvent {
                event: Some("error".into()),
                data: codec::error_event(status, "server_error", message, None).to_string(),
            })
        } else {
            HttpStep::Reply(r)
        }
    }

    fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_before_the_stream_are_http_errors_and_after_it_events() {
        let mut x = create(br#"{"input":"hi","stream":true}"#)
            .expect("valid")
            .exchange;
        let err = codec::error_event(
            404,
            "previous_response_not_found",
            "m",
            Some("previous_response_id"),
        )
        .to_string();
        let HttpStep::Reply(r) = x.on_frame(&err) else {
            panic!("a reply")
        };
        assert_eq!(r.status, 404);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["error"]["code"], "previous_response_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");

        let mut x = create(br#"{"input":"hi","stream":true}"#)
            .expect("valid")
            .exchange;
        let created =
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1"}}"#;
        assert!(
            matches!(x.on_frame(created), HttpStep::Event(e) if e.event.as_deref() == Some("response.created"))
        );
        assert_eq!(x.request_id(), Some("resp_1"));
        let done =
            r#"{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1"}}"#;
        assert!(matches!(x.on_frame(done), HttpStep::LastEvent(_)));

        let mut j = create(br#"{"input":"hi"}"#).expect("valid").exchange;
        assert_eq!(j.on_frame(created), HttpStep::Wait);
        let HttpStep::Reply(r) = j.on_frame(done) else {
            panic!("a reply")
        };
        assert_eq!(r.body, r#"{"id":"resp_1"}"#);
    }

    #[test]
    fn bad_bodies_are_answered_before_a_connection_opens() {
        for (body, status, code) in [
            (&b"{"[..], 400, "invalid_json"),
            (b"[]", 400, "invalid_request"),
            (br#"{"input":5}"#, 400, "invalid_request"),
            (br#"{"input":"x","stream":"yes"}"#, 400, "invalid_request"),
        ] {
            let r = create(body).expect_err("invalid");
            assert_eq!(r.status, status);
            let v: Value = serde_json::from_str(&r.body).expect("json");
            assert_eq!(v["error"]["code"], code, "{v}");
        }
    }
}
