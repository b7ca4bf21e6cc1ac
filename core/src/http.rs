//! The types of an HTTP exchange. A request body becomes a dialect's frames
//! on a virtual connection ([`crate::Transport::Http`]), and the frames the
//! Host sends back to it become one JSON response or a stream of server-sent
//! events. Each dialect owns its mapping (how a body reads, what its terminal
//! frame is, its error shape) and names it in its row of
//! [`crate::dialect::registry::DIALECTS`], so the shell's routes stay thin:
//! [`crate::dialect::registry::route`], read the body,
//! [`crate::dialect::registry::http_call`], send the frames, hand every frame
//! the Host sends back to the [`HttpExchange`], write what it says.
//!
//! A leaf module: the dialects' mappings and the registry import it, it
//! imports nothing of theirs.

use crate::conn::Dialect;

/// A complete HTTP response, written as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// Status code.
    pub status: u16,
    /// JSON body.
    pub body: String,
    /// Seconds for a `Retry-After` header (503s and 429s).
    pub retry_after: Option<u32>,
}

impl HttpReply {
    /// A reply with no `Retry-After`.
    pub fn new(status: u16, body: String) -> HttpReply {
        HttpReply {
            status,
            body,
            retry_after: None,
        }
    }
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` line, if any.
    pub event: Option<String>,
    /// The `data:` payload (one JSON frame).
    pub data: String,
}

impl SseEvent {
    /// The event's wire form: an optional `event:` line, one `data:` line per
    /// line of the payload, and a blank line.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(self.data.len() + 16);
        if let Some(e) = &self.event {
            out.push_str("event: ");
            out.push_str(e);
            out.push('\n');
        }
        for line in self.data.split('\n') {
            out.push_str("data: ");
            out.push_str(line.strip_suffix('\r').unwrap_or(line));
            out.push('\n');
        }
        out.push('\n');
        out
    }
}

/// What to do with one frame the Host sent to an HTTP request's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpStep {
    /// Nothing for the client yet.
    Wait,
    /// A streaming response goes on with this event.
    Event(SseEvent),
    /// A streaming response ends with this event.
    LastEvent(SseEvent),
    /// A streaming response goes on with these events, in order (one frame
    /// may become several: Anthropic's block starts and stops); with
    /// `last`, it ends with them.
    Events {
        /// The events, in order (at least one).
        events: Vec<SseEvent>,
        /// The response ends after them.
        last: bool,
    },
    /// A JSON response is complete.
    Reply(HttpReply),
}

/// One HTTP request on its way through the Host.
pub trait HttpExchange: Send + Sync {
    /// A text frame the Host sent to the request's connection.
    fn on_frame(&mut self, text: &str) -> HttpStep;
    /// The Host closed the connection (code, reason) before the response was
    /// complete: the last step (a reply, or a stream's last event).
    fn on_close(&mut self, code: u16, reason: &str) -> HttpStep;
    /// The request's id once known, for logs.
    fn request_id(&self) -> Option<&str>;
}

/// An HTTP request accepted by its dialect's mapping.
pub struct HttpCall {
    /// Frames the virtual connection sends, in order, once it is open.
    pub frames: Vec<String>,
    /// A `text/event-stream` response (otherwise one JSON response).
    pub stream: bool,
    /// Turns the Host's frames into the response.
    pub exchange: Box<dyn HttpExchange>,
}

impl std::fmt::Debug for HttpCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCall")
            .field("frames", &self.frames.len())
            .field("stream", &self.stream)
            .finish()
    }
}

/// What went wrong with a request before the Host saw it (the shell's side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpFailure {
    /// The body is larger than the frame limit.
    BodyTooLarge {
        /// The limit in bytes.
        max: usize,
    },
    /// The body did not arrive within its deadline.
    BodyTimeout,
    /// The body could not be read (the peer reset, bad chunking, a gzip
    /// body that does not inflate).
    BodyUnreadable,
    /// The body's `Content-Encoding` is one this server does not take
    /// (it takes `gzip` and `identity`).
    BodyEncoding {
        /// The encoding, as the request named it (clipped).
        encoding: String,
    },
    /// The server's connection limit is reached.
    Busy {
        /// Seconds after which a retry may succeed.
        retry_after: u32,
    },
    /// The server is shutting down.
    ShuttingDown {
        /// Seconds after which a retry (elsewhere) may succeed.
        retry_after: u32,
    },
    /// The route needs an API key and the request carried none, or one
    /// this server does not accept (`--auth all`).
    Unauthorized {
        /// What was wrong (never the key).
        message: &'static str,
    },
}

/// Where an HTTP request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A dialect's route: read the body and call
    /// [`crate::dialect::registry::http_call`].
    Dialect(Dialect),
    /// A dialect's path with another method; `Allow` lists this one.
    WrongMethod(&'static str),
    /// No dialect serves this path.
    NotFound,
}

/// One HTTP request on a dialect's route, as the shell read it.
#[derive(Debug, Clone, Copy)]
pub struct HttpRequest<'a> {
    /// The method.
    pub method: &'a str,
    /// The path (no query).
    pub path: &'a str,
    /// The body.
    pub body: &'a [u8],
    /// The served model's name (empty while it loads).
    pub model: &'a str,
}

/// A dialect's HTTP side: the paths it answers and how it maps them.
pub struct HttpSpec {
    /// The paths and methods it answers.
    pub routes: &'static [HttpRoute],
    /// Maps a request on one of [`HttpSpec::routes`] to its frames, or the
    /// error reply (in the dialect's error shape) when it is not valid.
    pub call: fn(&HttpRequest<'_>) -> Result<HttpCall, HttpReply>,
    /// The reply for a failure the shell met on its routes, in the
    /// dialect's error shape.
    pub failure: fn(&HttpFailure) -> HttpReply,
}

/// One HTTP path of a dialect, with the method it takes (`HEAD` goes with
/// `GET`).
pub struct HttpRoute {
    /// `POST` or `GET`.
    pub method: &'static str,
    /// The paths it answers.
    pub path: PathMatch,
}

/// Which paths an [`HttpRoute`] answers.
pub enum PathMatch {
    /// This path exactly.
    Exact(&'static str),
    /// This prefix followed by one non-empty segment (an id).
    Id(&'static str),
}

impl PathMatch {
    /// True when `path` is one of these paths.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(p) => path == *p,
            PathMatch::Id(prefix) => path
                .strip_prefix(prefix)
                .is_some_and(|id| !id.is_empty() && !id.contains('/')),
        }
    }
}

/// A request body that must be one JSON object (parsed as the WebSocket
/// frames are, with their nesting limit), or what is wrong with it.
pub(crate) fn json_object(
    body: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let text =
        std::str::from_utf8(body).map_err(|e| format!("the request body is not UTF-8: {e}"))?;
    match crate::json::parse(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(other) => Err(format!(
            "the request body must be a JSON object, got {}",
            crate::json::type_name(&other)
        )),
        Err(e) => Err(format!("the request body is not valid JSON: {e}")),
    }
}

/// Seconds a client is told to wait before retrying a 503 or 429.
pub(crate) const RETRY_AFTER_S: u32 = 1;

/// The one rule for an HTTP request whose virtual connection the Host closed
/// before its reply, for every dialect: a shutdown (1001) is the dialect's
/// 503 with `Retry-After` (retry on another server); any other close is a
/// 500. Returns the status, the retry delay and the message.
pub(crate) fn closed_early(code: u16) -> (u16, Option<u32>, &'static str) {
    if code == 1001 {
        (
            503,
            Some(RETRY_AFTER_S),
            "the server is shutting down; retry on another server",
        )
    } else {
        (
            500,
            None,
            "the server ended the request before it completed",
        )
    }
}

/// Status, message and retry delay of a failure (shared by the dialects).
pub(crate) fn describe(f: &HttpFailure) -> (u16, String, Option<u32>) {
    match f {
        HttpFailure::BodyTooLarge { max } => (
            413,
            format!("the request body is larger than {max} bytes"),
            None,
        ),
        HttpFailure::BodyTimeout => (408, "the request body did not arrive in time".into(), None),
        HttpFailure::BodyUnreadable => (400, "the request body could not be read".into(), None),
        HttpFailure::BodyEncoding { encoding } => (
            415,
            format!("the request body's Content-Encoding `{encoding}` is not supported; send gzip or no encoding"),
            None,
        ),
        HttpFailure::Busy { retry_after } => (
            503,
            "the server's connection limit is reached; retry later".into(),
            Some(*retry_after),
        ),
        HttpFailure::ShuttingDown { retry_after } => (
            503,
            "the server is shutting down; retry on another server".into(),
            Some(*retry_after),
        ),
        HttpFailure::Unauthorized { message } => (401, (*message).to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_data_lines_with_an_optional_name() {
        let e = SseEvent {
            event: None,
            data: r#"{"a":1}"#.into(),
        };
        assert_eq!(e.encode(), "data: {\"a\":1}\n\n");
        let e = SseEvent {
            event: Some("response.created".into()),
            data: "a\nb\r".into(),
        };
        assert_eq!(e.encode(), "event: response.created\ndata: a\ndata: b\n\n");
    }
}
