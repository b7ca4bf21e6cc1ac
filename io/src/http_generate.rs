//! `POST /v1/generate`: one generation over HTTP, as a virtual `generate`
//! connection on the Host (`Transport::Http`).
//!
//! The flat request body becomes one `config` frame; the frames the Host sends
//! back become either one JSON response (`stream: false`) or a `text/event-stream`
//! with one `data:` event per frame (`stream: true`). If the client goes away, the
//! virtual connection is reported `Closed`, which cancels its generation.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant as StdInstant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Frame, Incoming};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokenwire_core::{ConnId, Dialect, Input, Transport};

use crate::driver::{ConnQueue, DriverHandle, DriverMsg, OutFrame};
use crate::http::{error_response, json_response, json_text_response, AppState, Body};
use crate::sync::{ConnectionPermit, OutboundQueue};

/// Body keys copied into the config frame's `parameters`.
const PARAMETER_KEYS: [&str; 8] = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "stop",
    "seed",
    "top_logprobs",
];

/// Body keys copied into the config frame's `options`.
const OPTION_KEYS: [&str; 4] = [
    "echo_prompt",
    "include_token_ids",
    "include_logprobs",
    "include_timing",
];

/// Handles `POST /v1/generate`.
pub(crate) async fn handle(
    state: Arc<AppState>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let max = state.max_frame_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return too_large(max);
    }
    let body = match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(max),
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &format!("could not read the request body: {e}"),
            )
        }
    };
    let body_bytes = body.len();
    let request = match parse_body(&body) {
        Ok(r) => r,
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, "invalid_request", &message)
        }
    };

    let Some(permit) = state.limiter.try_acquire() else {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            "the server's connection limit is reached; retry later",
        );
    };
    let conn = state.next_conn_id();
    let queue: ConnQueue = Arc::new(OutboundQueue::new(state.max_queued_frames));
    let mut guard = VirtualConn {
        conn,
        driver: state.driver.clone(),
        open: false,
        started: StdInstant::now(),
        stream: request.stream,
        frames_out: 0,
        bytes_out: 0,
        request_id: None,
        _permit: permit,
    };
    let opened = state
        .driver
        .send(DriverMsg::Open {
            conn,
            dialect: Dialect::Generate,
            transport: Transport::Http,
            query: String::new(),
            peer,
            queue: queue.clone(),
        })
        .await;
    if opened.is_err() {
        return shutting_down();
    }
    guard.open = true;
    tracing::info!(conn = conn.0, %peer, stream = request.stream, body_bytes, "http generation opened");
    if state
        .driver
        .send(DriverMsg::Input(Input::Text {
            conn,
            text: request.config,
        }))
        .await
        .is_err()
    {
        return shutting_down();
    }

    if request.stream {
        let mut resp = Response::new(BodyExt::boxed(SseBody {
            queue,
            guard,
            done: false,
        }));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    } else {
        collect(&queue, &mut guard).await
    }
}

/// A parsed request body.
#[derive(Debug, Clone, PartialEq)]
struct GenerateRequest {
    /// The `config` frame for the Host.
    config: String,
    /// `stream: true`.
    stream: bool,
}

/// Checks the body and builds the `config` frame from it.
fn parse_body(body: &[u8]) -> Result<GenerateRequest, String> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the request body is not valid JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err("the request body must be a JSON object".into());
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("field `stream` must be a boolean".into()),
    };
    let mut config = Map::new();
    config.insert("type".into(), Value::from("config"));
    for key in ["prompt", "model"] {
        if let Some(v) = obj.get(key) {
            config.insert(key.into(), v.clone());
        }
    }
    let pick = |keys: &[&str]| -> Map<String, Value> {
        keys.iter()
            .filter_map(|k| obj.get(*k).map(|v| ((*k).to_owned(), v.clone())))
            .collect()
    };
    let parameters = pick(&PARAMETER_KEYS);
    if !parameters.is_empty() {
        config.insert("parameters".into(), Value::Object(parameters));
    }
    let options = pick(&OPTION_KEYS);
    if !options.is_empty() {
        config.insert("options".into(), Value::Object(options));
    }
    Ok(GenerateRequest {
        config: Value::Object(config).to_string(),
        stream,
    })
}

/// The parts of a Host frame the HTTP side looks at.
#[derive(Debug, Default, Deserialize)]
struct FrameHead {
    #[serde(rename = "type")]
    kind: Option<String>,
    request_id: Option<String>,
}

fn head(text: &str) -> FrameHead {
    serde_json::from_str(text).unwrap_or_default()
}

/// Waits for the generation's `completion` or `error` and answers with it.
async fn collect(queue: &ConnQueue, guard: &mut VirtualConn) -> Response<Body> {
    let mut model = Value::Null;
    while let Some(popped) = queue.pop().await {
        if popped.drained {
            let _ = guard.driver.send(DriverMsg::Drained(guard.conn)).await;
        }
        let text = match popped.item {
            OutFrame::Text(text) => text,
            OutFrame::Ping => continue,
            OutFrame::Close { code, reason } => return closed_early(code, &reason),
        };
        guard.count(&text);
        let Ok(frame) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        match frame.get("type").and_then(Value::as_str) {
            Some("init") => {
                if let Some(id) = frame.get("request_id").and_then(Value::as_str) {
                    guard.request_id = Some(id.to_owned());
                }
                model = frame.get("model").cloned().unwrap_or(Value::Null);
            }
            Some("completion") => {
                let mut out = Map::new();
                out.insert(
                    "id".into(),
                    guard.request_id.clone().map_or(Value::Null, Value::from),
                );
                out.insert("model".into(), model);
                for key in ["generated_text", "finish_reason", "usage", "timing"] {
                    if let Some(v) = frame.get(key) {
                        out.insert(key.into(), v.clone());
                    }
                }
                return json_response(StatusCode::OK, &Value::Object(out));
            }
            Some("error") => {
                let code = frame.get("error").and_then(Value::as_str).unwrap_or("");
                let recoverable = frame
                    .get("recoverable")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                return json_text_response(error_status(code, recoverable), text);
            }
            _ => {}
        }
    }
    shutting_down()
}

/// The HTTP status for a `generate` error frame.
fn error_status(code: &str, recoverable: bool) -> StatusCode {
    match code {
        "invalid_request" | "context_length_exceeded" | "content_filter" => StatusCode::BAD_REQUEST,
        "rate_limited" => StatusCode::TOO_MANY_REQUESTS,
        "memory_pressure" | "model_loading_error" | "timeout" => StatusCode::SERVICE_UNAVAILABLE,
        _ if recoverable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn closed_early(code: u16, reason: &str) -> Response<Body> {
    if code == 1001 {
        return shutting_down();
    }
    error_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal_error",
        &format!("the request was closed before it completed ({code}: {reason})"),
    )
}

fn shutting_down() -> Response<Body> {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the server is shutting down; retry elsewhere",
    )
}

fn too_large(max: usize) -> Response<Body> {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request",
        &format!("the request body is larger than {max} bytes"),
    )
}

/// One Host frame as a server-sent event.
fn sse_event(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for line in text.split('\n') {
        out.push_str("data: ");
        out.push_str(line.strip_suffix('\r').unwrap_or(line));
        out.push('\n');
    }
    out.push('\n');
    out
}

/// The virtual connection's lifetime: reports `Closed` to the driver when
/// dropped (the response finished, or the client went away) and logs the
/// request's counts (never its text).
struct VirtualConn {
    conn: ConnId,
    driver: DriverHandle,
    open: bool,
    started: StdInstant,
    stream: bool,
    frames_out: u64,
    bytes_out: u64,
    request_id: Option<String>,
    _permit: ConnectionPermit,
}

impl VirtualConn {
    fn count(&mut self, text: &str) {
        self.frames_out += 1;
        self.bytes_out += text.len() as u64;
    }
}

impl Drop for VirtualConn {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        self.driver
            .send_now(DriverMsg::Input(Input::Closed { conn: self.conn }));
        tracing::info!(
            conn = self.conn.0,
            request_id = self.request_id.as_deref().unwrap_or(""),
            stream = self.stream,
            duration_ms = self.started.elapsed().as_millis() as u64,
            frames_out = self.frames_out,
            bytes_out = self.bytes_out,
            "http generation closed"
        );
    }
}

/// The `text/event-stream` body of a streaming generation.
struct SseBody {
    queue: ConnQueue,
    guard: VirtualConn,
    done: bool,
}

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let Some(popped) = std::task::ready!(this.queue.poll_pop(cx)) else {
                this.done = true;
                return Poll::Ready(None);
            };
            if popped.drained {
                this.guard
                    .driver
                    .send_now(DriverMsg::Drained(this.guard.conn));
            }
            match popped.item {
                OutFrame::Ping => continue,
                OutFrame::Close { .. } => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                OutFrame::Text(text) => {
                    this.guard.count(&text);
                    let h = head(&text);
                    match h.kind.as_deref() {
                        Some("init") => this.guard.request_id = h.request_id,
                        Some("completion" | "error") => this.done = true,
                        _ => {}
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(sse_event(&text))))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_body_becomes_a_config_frame() {
        let r = parse_body(
            br#"{"prompt":"hi","max_tokens":5,"temperature":0.5,"stop":["x"],"seed":3,
                 "stream":true,"model":"m","echo_prompt":true,"include_timing":false,"extra":1}"#,
        )
        .expect("valid");
        assert!(r.stream);
        let v: Value = serde_json::from_str(&r.config).expect("json");
        assert_eq!(v["type"], "config");
        assert_eq!(v["prompt"], "hi");
        assert_eq!(v["model"], "m");
        assert_eq!(v["parameters"]["max_tokens"], 5);
        assert_eq!(v["parameters"]["temperature"], 0.5);
        assert_eq!(v["parameters"]["stop"][0], "x");
        assert_eq!(v["parameters"]["seed"], 3);
        assert_eq!(v["options"]["echo_prompt"], true);
        assert_eq!(v["options"]["include_timing"], false);
        assert!(v.get("extra").is_none() && v["parameters"].get("extra").is_none());
        assert!(v.get("stream").is_none());
    }

    #[test]
    fn minimal_body_has_no_empty_sections() {
        let r = parse_body(br#"{"prompt":"hi"}"#).expect("valid");
        assert!(!r.stream);
        let v: Value = serde_json::from_str(&r.config).expect("json");
        assert!(v.get("parameters").is_none());
        assert!(v.get("options").is_none());
    }

    #[test]
    fn bad_bodies_are_named() {
        assert!(parse_body(b"[1,2]").unwrap_err().contains("JSON object"));
        assert!(parse_body(b"{").unwrap_err().contains("not valid JSON"));
        assert!(parse_body(br#"{"prompt":"x","stream":"yes"}"#)
            .unwrap_err()
            .contains("`stream`"));
    }

    #[test]
    fn error_codes_map_to_statuses() {
        assert_eq!(
            error_status("invalid_request", true),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            error_status("context_length_exceeded", true),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            error_status("rate_limited", true),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            error_status("memory_pressure", true),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            error_status("model_loading_error", false),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            error_status("internal_error", false),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn sse_events_are_data_lines() {
        assert_eq!(sse_event(r#"{"a":1}"#), "data: {\"a\":1}\n\n");
        assert_eq!(sse_event("a\nb"), "data: a\ndata: b\n\n");
    }
}
