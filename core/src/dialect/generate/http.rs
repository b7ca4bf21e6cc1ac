//! `POST /v1/generate`: the `generate` dialect over HTTP. The flat body
//! (`prompt`, the sampling parameters, the options and `stream`) becomes one
//! `config` frame; the reply is the `completion` as one JSON object, or every
//! frame as a server-sent event when `stream` is true. Errors keep the
//! dialect's error shape, with the HTTP status its code calls for.

use serde_json::{Map, Value};

use super::codec::{self, ErrorCode, ErrorMessage, RecoveryAction, ServerMessage};
use crate::http::{
    closed_early, describe, HttpCall, HttpExchange, HttpFailure, HttpReply, HttpRoute, HttpSpec,
    HttpStep, PathMatch, SseEvent,
};
use crate::json::{self, Fields};

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

/// `generate`'s HTTP side: `POST /v1/generate`.
pub(crate) static SPEC: HttpSpec = HttpSpec {
    routes: &[HttpRoute {
        method: "POST",
        path: PathMatch::Exact("/v1/generate"),
    }],
    call: |req| call(req.body),
    failure,
};

/// Maps a request body to its `config` frame.
pub(crate) fn call(body: &[u8]) -> Result<HttpCall, HttpReply> {
    let invalid = |message: String| {
        reply(
            400,
            error_message(ErrorCode::InvalidRequest, message, RecoveryAction::None),
        )
    };
    let text = std::str::from_utf8(body)
        .map_err(|e| invalid(format!("the request body is not UTF-8: {e}")))?;
    // The WebSocket frames' parser: the same nesting limit and messages.
    let obj = match json::parse(text).map_err(invalid)? {
        Value::Object(m) => m,
        other => {
            return Err(invalid(format!(
                "the request body must be a JSON object, got {}",
                json::type_name(&other)
            )))
        }
    };
    let stream = Fields::new(&obj, "")
        .bool("stream")
        .map_err(|e| invalid(e.to_string()))?
        .unwrap_or(false);
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
    Ok(HttpCall {
        frames: vec![Value::Object(config).to_string()],
        stream,
        exchange: Box::new(Exchange {
            stream,
            request_id: None,
            model: Value::Null,
        }),
    })
}

/// The reply for a failure met before the Host saw the request.
pub(crate) fn failure(f: &HttpFailure) -> HttpReply {
    let (status, message, retry_after) = describe(f);
    let (code, action) = match f {
        HttpFailure::BodyTooLarge { .. } => (ErrorCode::InvalidRequest, RecoveryAction::None),
        HttpFailure::BodyUnreadable => (ErrorCode::InvalidRequest, RecoveryAction::Retry),
        HttpFailure::BodyEncoding { .. } => (ErrorCode::InvalidRequest, RecoveryAction::None),
        HttpFailure::BodyTimeout => (ErrorCode::Timeout, RecoveryAction::Retry),
        HttpFailure::Busy { .. } => (ErrorCode::RateLimited, RecoveryAction::Retry),
        HttpFailure::ShuttingDown { .. } => (ErrorCode::InternalError, RecoveryAction::Retry),
        HttpFailure::Unauthorized { .. } => (ErrorCode::InvalidRequest, RecoveryAction::None),
    };
    HttpReply {
        retry_after,
        ..reply(status, error_message(code, message, action))
    }
}

fn error_message(code: ErrorCode, message: String, action: RecoveryAction) -> ErrorMessage {
    ErrorMessage {
        error: code,
        message,
        recoverable: true,
        recovery_action: action,
        request_id: None,
        generated_text: None,
    }
}

fn reply(status: u16, e: ErrorMessage) -> HttpReply {
    HttpReply::new(status, codec::encode_server(&ServerMessage::Error(e)))
}

/// The HTTP status for a `generate` error frame.
pub fn error_status(code: ErrorCode, recoverable: bool) -> u16 {
    match code {
        ErrorCode::InvalidRequest | ErrorCode::ContextLengthExceeded | ErrorCode::ContentFilter => {
            400
        }
        ErrorCode::RateLimited => 429,
        ErrorCode::MemoryPressure | ErrorCode::ModelLoadingError | ErrorCode::Timeout => 503,
        ErrorCode::InternalError if recoverable => 503,
        ErrorCode::InternalError => 500,
    }
}

/// One `/v1/generate` request's response.
struct Exchange {
    stream: bool,
    request_id: Option<String>,
    model: Value,
}

impl HttpExchange for Exchange {
    fn on_frame(&mut self, text: &str) -> HttpStep {
        let msg = match codec::decode_server(text) {
            Ok(m) => m,
            // The Host only sends what the codec encodes; nothing to relay.
            Err(_) => return HttpStep::Wait,
        };
        let event = || SseEvent {
            event: None,
            data: text.to_string(),
        };
        match msg {
            ServerMessage::Init(init) => {
                self.request_id = Some(init.request_id);
                self.model = Value::from(init.model);
            }
            ServerMessage::Completion(c) if !self.stream => {
                let mut out = Map::new();
                out.insert(
                    "id".into(),
                    self.request_id.clone().map_or(Value::Null, Value::from),
                );
                out.insert("model".into(), self.model.clone());
                let c = serde_json::to_value(&c).unwrap_or(Value::Null);
                for key in ["generated_text", "finish_reason", "usage", "timing"] {
                    if let Some(v) = c.get(key) {
                        out.insert(key.into(), v.clone());
                    }
                }
                return HttpStep::Reply(HttpReply::new(200, Value::Object(out).to_string()));
            }
            ServerMessage::Error(e) if !self.stream => {
                let status = error_status(e.error, e.recoverable);
                return HttpStep::Reply(HttpReply {
                    retry_after: (status == 503).then_some(crate::http::RETRY_AFTER_S),
                    ..HttpReply::new(status, text.to_string())
                });
            }
            ServerMessage::Completion(_) | ServerMessage::Error(_) => {
                return HttpStep::LastEvent(event())
            }
            _ => {}
        }
        if self.stream {
            HttpStep::Event(event())
        } else {
            HttpStep::Wait
        }
    }

    fn on_close(&mut self, code: u16, _reason: &str) -> HttpStep {
        let (status, retry_after, message) = closed_early(code);
        let r = match retry_after {
            Some(retry_after) => failure(&HttpFailure::ShuttingDown { retry_after }),
            None => reply(
                status,
                error_message(
                    ErrorCode::InternalError,
                    message.into(),
                    RecoveryAction::Retry,
                ),
            ),
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
        self.request_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_of(call: &HttpCall) -> Value {
        serde_json::from_str(&call.frames[0]).expect("json")
    }

    #[test]
    fn a_flat_body_becomes_a_config_frame() {
        let c = call(
            br#"{"prompt":"hi","max_tokens":5,"temperature":0.5,"stop":["x"],"seed":3,
                 "stream":true,"model":"m","echo_prompt":true,"include_timing":false,"extra":1}"#,
        )
        .expect("valid");
        assert!(c.stream);
        let v = config_of(&c);
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
        let minimal = call(br#"{"prompt":"hi"}"#).expect("valid");
        assert!(!minimal.stream);
        let v = config_of(&minimal);
        assert!(v.get("parameters").is_none() && v.get("options").is_none());
    }

    #[test]
    fn bad_bodies_get_the_dialects_error_shape_and_a_400() {
        let deep = format!("{{\"prompt\":{}1{}}}", "[".repeat(65), "]".repeat(65));
        for (body, needle) in [
            (b"[1,2]".to_vec(), "JSON object"),
            (b"{".to_vec(), "invalid JSON"),
            (br#"{"prompt":"x","stream":"yes"}"#.to_vec(), "`stream`"),
            (deep.into_bytes(), "deeper than 64"),
            (
                br#"{"prompt":"x","temperature":1e400}"#.to_vec(),
                "`temperature`",
            ),
            (vec![b'{', 0xff, b'}'], "UTF-8"),
        ] {
            let r = call(&body).expect_err("refused");
            assert_eq!(r.status, 400);
            let v: Value = serde_json::from_str(&r.body).expect("json");
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"], "invalid_request");
            assert_eq!(v["recoverable"], true);
            assert_eq!(v["recovery_action"], "none");
            assert!(v["message"].as_str().unwrap_or("").contains(needle), "{v}");
        }
    }

    #[test]
    fn error_codes_map_to_statuses() {
        assert_eq!(error_status(ErrorCode::InvalidRequest, true), 400);
        assert_eq!(error_status(ErrorCode::ContextLengthExceeded, true), 400);
        assert_eq!(error_status(ErrorCode::RateLimited, true), 429);
        assert_eq!(error_status(ErrorCode::MemoryPressure, true), 503);
        assert_eq!(error_status(ErrorCode::ModelLoadingError, false), 503);
        assert_eq!(error_status(ErrorCode::InternalError, true), 503);
        assert_eq!(error_status(ErrorCode::InternalError, false), 500);
    }

    #[test]
    fn shell_failures_keep_the_shape_and_say_when_to_retry() {
        let r = failure(&HttpFailure::Busy { retry_after: 1 });
        assert_eq!((r.status, r.retry_after), (503, Some(1)));
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["type"], "error");
        assert_eq!(v["recovery_action"], "retry");
        let r = failure(&HttpFailure::BodyTooLarge { max: 10 });
        assert_eq!((r.status, r.retry_after), (413, None));
        let r = failure(&HttpFailure::BodyTimeout);
        assert_eq!(r.status, 408);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["error"], "timeout");
    }

    #[test]
    fn json_mode_answers_with_the_completion_and_stream_mode_relays_frames() {
        let init = r#"{"type":"init","request_id":"gen_1","model":"m","model_info":{"version":"v","max_tokens":9,"quantization":"f32"}}"#;
        let token = r#"{"type":"token","token":"a","finish_reason":null,"finished":false}"#;
        let done = r#"{"type":"completion","request_id":"gen_1","generated_text":"a","finish_reason":"length","usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
        let mut json_mode = call(br#"{"prompt":"x"}"#).expect("valid").exchange;
        assert_eq!(json_mode.on_frame(init), HttpStep::Wait);
        assert_eq!(json_mode.request_id(), Some("gen_1"));
        assert_eq!(json_mode.on_frame(token), HttpStep::Wait);
        let HttpStep::Reply(r) = json_mode.on_frame(done) else {
            panic!("a reply")
        };
        assert_eq!(r.status, 200);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["id"], "gen_1");
        assert_eq!(v["model"], "m");
        assert_eq!(v["generated_text"], "a");
        assert_eq!(v["usage"]["total_tokens"], 2);

        let mut sse = call(br#"{"prompt":"x","stream":true}"#)
            .expect("valid")
            .exchange;
        assert!(matches!(sse.on_frame(init), HttpStep::Event(_)));
        assert!(matches!(sse.on_frame(token), HttpStep::Event(_)));
        assert!(matches!(sse.on_frame(done), HttpStep::LastEvent(e) if e.data == done));

        let err = r#"{"type":"error","error":"memory_pressure","message":"m","recoverable":true,"recovery_action":"retry"}"#;
        let mut json_mode = call(br#"{"prompt":"x"}"#).expect("valid").exchange;
        let HttpStep::Reply(r) = json_mode.on_frame(err) else {
            panic!("a reply")
        };
        assert_eq!((r.status, r.retry_after), (503, Some(1)));
        let HttpStep::Reply(r) = json_mode.on_close(1001, "bye") else {
            panic!("a reply")
        };
        assert_eq!(r.status, 503);
    }
}
