//! Building responses: bodies, JSON replies, the plain error object and
//! `Retry-After`.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

/// Response body type of every endpoint.
pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// A body holding `data`.
pub(crate) fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into()).boxed()
}

/// An empty body.
pub(crate) fn empty() -> Body {
    full(Bytes::new())
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    json_text_response(status, value.to_string())
}

/// A response whose body is already JSON text.
pub(crate) fn json_text_response(status: StatusCode, json: String) -> Response<Body> {
    let mut resp = Response::new(full(json));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `{"type": "error", "error": code, "message": message, "recoverable": true}`
/// with `status` (and `Retry-After` on a 503).
pub(crate) fn error_response(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let resp = json_response(
        status,
        &serde_json::json!({"type": "error", "error": code, "message": message, "recoverable": true}),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        with_retry_after(resp, 1)
    } else {
        resp
    }
}

/// Adds `Retry-After: seconds`.
pub(crate) fn with_retry_after(mut resp: Response<Body>, seconds: u32) -> Response<Body> {
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    resp
}
