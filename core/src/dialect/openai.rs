//! What the two OpenAI dialects (`responses`, `chat`) share: the API's
//! error object, the error reply of an HTTP request, the reply for a
//! failure the shell met, and the status and code of a generation that
//! could not start.

use serde_json::{json, Value};

use crate::gen::StartError;
use crate::http::{describe, HttpFailure, HttpReply, RETRY_AFTER_S};

/// The `error` object: `{type, code, message, param}`.
pub fn error_object(status: u16, code: &str, message: &str, param: Option<&str>) -> Value {
    json!({
        "type": if status >= 500 { "server_error" } else { "invalid_request_error" },
        "code": code,
        "message": message,
        "param": param,
    })
}

/// An HTTP error reply, `{"error": {...}}`, with `Retry-After` on a 429 or
/// 503.
pub fn error_reply(status: u16, code: &str, message: &str, param: Option<&str>) -> HttpReply {
    let body = json!({"error": error_object(status, code, message, param)}).to_string();
    HttpReply {
        retry_after: matches!(status, 429 | 503).then_some(RETRY_AFTER_S),
        ..HttpReply::new(status, body)
    }
}

/// The reply for a failure met before the Host saw the request.
pub fn failure(f: &HttpFailure) -> HttpReply {
    let (status, message, retry_after) = describe(f);
    let code = match f {
        HttpFailure::Unauthorized { .. } => "invalid_api_key",
        _ if status >= 500 => "server_error",
        _ => "invalid_request",
    };
    HttpReply {
        retry_after,
        ..error_reply(status, code, &message, None)
    }
}

/// Status, code and message of a generation that could not start;
/// `max_tokens` is the dialect's name for the length field.
pub fn start_error(e: &StartError, max_tokens: &str) -> (u16, &'static str, String) {
    let (status, code) = match e {
        StartError::ContextLength { .. }
        | StartError::PromptTooLong { .. }
        | StartError::NeverFits { .. } => (400, "context_length_exceeded"),
        StartError::QueueFull
        | StartError::ConnQueueFull { .. }
        | StartError::RateLimited { .. } => (429, "rate_limit_exceeded"),
        StartError::TokenOutOfVocab { .. } => (400, "invalid_request"),
        StartError::ShuttingDown | StartError::NotLoaded => (503, "server_error"),
    };
    (status, code, e.message(max_tokens))
}
