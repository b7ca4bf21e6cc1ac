//! The `session` dialect's codec: every message of PROTOCOLS.md's `session`
//! section as a Rust type, decoded and encoded both ways (the server decodes
//! [`ClientMessage`]s and encodes [`ServerMessage`]s; the end-to-end tests and
//! the simulator use the other two). `decode(encode(m)) == m` for every message.
//!
//! A frame holds one message or a JSON array of them; a message is flat, or
//! in the `WSMessage` envelope (`type`, `session_id`, `timestamp`,
//! `payload`), whose `payload` fields are read as if flat. Each message of an
//! array decodes on its own, so one bad message gets its error and the others
//! still run. Sampling fields of a `prompt` stay a JSON object here: their
//! meaning depends on the served model, so [`crate::params::apply`] checks them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::dialect::messages;
use crate::json::{self, FieldError, Fields};
use crate::text::ChatMessage;

/// Keys of a `prompt` (and an HTTP inference body) read as sampling parameters.
pub const SAMPLING_KEYS: [&str; 7] = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "stop",
    "seed",
];

/// A message from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// `session_init`: start a conversation on this host.
    SessionInit(SessionStart),
    /// `session_resume`: rebuild a conversation (after another host crashed).
    SessionResume(SessionStart),
    /// `prompt`: the next user message.
    Prompt(Prompt),
    /// `session_end`: forget the conversation.
    SessionEnd {
        /// The session.
        session_id: String,
    },
    /// `inference`: one stateless request (`POST /v1/inference` only).
    Inference(Inference),
}

impl ClientMessage {
    /// The message's `type` on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientMessage::SessionInit(_) => "session_init",
            ClientMessage::SessionResume(_) => "session_resume",
            ClientMessage::Prompt(_) => "prompt",
            ClientMessage::SessionEnd { .. } => "session_end",
            ClientMessage::Inference(_) => "inference",
        }
    }

    /// The session the message names.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            ClientMessage::SessionInit(s) | ClientMessage::SessionResume(s) => Some(&s.session_id),
            ClientMessage::Prompt(p) => Some(&p.session_id),
            ClientMessage::SessionEnd { session_id } => Some(session_id),
            ClientMessage::Inference(i) => i.session_id.as_deref(),
        }
    }
}

/// `session_init` and `session_resume`.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionStart {
    /// The client's id for the session.
    pub session_id: String,
    /// The job paying for it (a string, or a number kept as its decimal text).
    pub job_id: String,
    /// The conversation so far, oldest first.
    pub conversation_context: Vec<ChatMessage>,
    /// The model asked for, if named.
    pub model: Option<String>,
    /// `session_resume`'s `last_message_index` (None for `session_init`).
    pub last_message_index: Option<u64>,
    /// Signed prompts: the secp256k1 key (SEC1 hex) every `prompt` of the
    /// session must be signed with.
    pub public_key: Option<String>,
}

/// `prompt`.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The session.
    pub session_id: String,
    /// The user's message.
    pub content: String,
    /// Its index in the conversation (user and assistant messages from 0).
    pub message_index: u64,
    /// Stream `stream_chunk`s before the `response` (default true).
    pub stream: bool,
    /// The sampling fields the message carried.
    pub sampling: Map<String, Value>,
    /// Its ECDSA signature (hex of `r || s`), for a session with a key.
    pub signature: Option<String>,
}

/// The body of `POST /v1/inference`, as the frame the HTTP route sends.
#[derive(Debug, Clone, PartialEq)]
pub struct Inference {
    /// The user's message.
    pub prompt: String,
    /// Earlier messages, oldest first.
    pub conversation_context: Vec<ChatMessage>,
    /// Echoed in the reply (tracking only: no session is kept).
    pub session_id: Option<String>,
    /// The model asked for, if named.
    pub model: Option<String>,
    /// Stream `stream_chunk`s before the `response`.
    pub stream: bool,
    /// The sampling fields the body carried.
    pub sampling: Map<String, Value>,
}

/// Why a client message is not valid; answered with `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The session the message named, when it could be read.
    pub session_id: Option<String>,
    /// What was wrong, naming the field.
    pub message: String,
}

impl DecodeError {
    fn new(session_id: Option<&str>, message: impl Into<String>) -> DecodeError {
        DecodeError {
            session_id: session_id.map(str::to_string),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Decodes one client frame: a message or an array of messages, each decoded
/// on its own. The outer error is for a frame that is not JSON at all.
pub fn decode_frame(text: &str) -> Result<Vec<Result<ClientMessage, DecodeError>>, DecodeError> {
    match json::parse(text).map_err(|e| DecodeError::new(None, e))? {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(DecodeError::new(
                    None,
                    "an array of messages must not be empty",
                ));
            }
            Ok(items.iter().map(decode_value).collect())
        }
        v => Ok(vec![decode_value(&v)]),
    }
}

/// Decodes one message (flat, or in the envelope form).
pub fn decode_value(v: &Value) -> Result<ClientMessage, DecodeError> {
    let Value::Object(outer) = v else {
        return Err(DecodeError::new(
            None,
            format!(
                "a message must be a JSON object, got {}",
                json::type_name(v)
            ),
        ));
    };
    // The envelope: payload's fields read as if flat, over the envelope's own.
    let merged;
    let msg = match outer.get("payload") {
        Some(Value::Object(payload)) => {
            let mut m = outer.clone();
            m.remove("payload");
            for (k, v) in payload {
                m.insert(k.clone(), v.clone());
            }
            merged = m;
            &merged
        }
        Some(Value::Null) | None => outer,
        Some(other) => {
            let sid = outer.get("session_id").and_then(Value::as_str);
            return Err(DecodeError::new(
                sid,
                format!(
                    "invalid `payload`: must be an object, got {}",
                    json::type_name(other)
                ),
            ));
        }
    };
    let f = Fields::new(msg, "");
    let sid = msg.get("session_id").and_then(Value::as_str);
    let e = |e: FieldError| DecodeError::new(sid, e.to_string());
    let kind = f.req_str("type").map_err(e)?;
    match kind {
        "session_init" | "session_resume" => {
            let start = SessionStart {
                session_id: req_id(&f, "session_id").map_err(e)?,
                job_id: job_id(&f).map_err(e)?,
                conversation_context: context(&f).map_err(e)?,
                model: f.str("model").map_err(e)?.map(str::to_string),
                last_message_index: if kind == "session_resume" {
                    Some(
                        f.u64("last_message_index")
                            .map_err(e)?
                            .ok_or_else(|| e(FieldError::new("last_message_index", "is required")))?,
                    )
                } else {
                    None
                },
                public_key: f.str("public_key").map_err(e)?.map(str::to_string),
            };
            Ok(if kind == "session_init" {
                ClientMessage::SessionInit(start)
            } else {
                ClientMessage::SessionResume(start)
            })
        }
        "prompt" => Ok(ClientMessage::Prompt(Prompt {
            session_id: req_id(&f, "session_id").map_err(e)?,
            content: f.req_str("content").map_err(e)?.to_string(),
            message_index: f
                .u64("message_index")
                .map_err(e)?
                .ok_or_else(|| e(FieldError::new("message_index", "is required")))?,
            stream: f.bool("stream").map_err(e)?.unwrap_or(true),
            sampling: sampling(msg),
            signature: f.str("signature").map_err(e)?.map(str::to_string),
        })),
        "session_end" => Ok(ClientMessage::SessionEnd {
            session_id: req_id(&f, "session_id").map_err(e)?,
        }),
        "inference" => Ok(ClientMessage::Inference(Inference {
            prompt: f.req_str("prompt").map_err(e)?.to_string(),
            conversation_context: context(&f).map_err(e)?,
            session_id: f.str("session_id").map_err(e)?.map(str::to_string),
            model: f.str("model").map_err(e)?.map(str::to_string),
            stream: f.bool("stream").map_err(e)?.unwrap_or(false),
            sampling: sampling(msg),
        })),
        other => Err(DecodeError::new(
            sid,
            format!(
                "unknown message type `{other}`; expected session_init, session_resume, prompt or session_end"
            ),
        )),
    }
}

/// A non-empty id field.
fn req_id(f: &Fields<'_>, field: &str) -> Result<String, FieldError> {
    let id = f.req_str(field)?;
    if id.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    Ok(id.to_string())
}

/// `job_id`: a non-empty string, or a number (kept as its decimal text).
fn job_id(f: &Fields<'_>) -> Result<String, FieldError> {
    match f.raw("job_id") {
        None => Err(FieldError::new("job_id", "is required")),
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::Number(n)) if n.is_u64() || n.is_i64() => Ok(n.to_string()),
        Some(v) => Err(FieldError::new(
            "job_id",
            format!(
                "must be a non-empty string or an integer, got {}",
                json::type_name(v)
            ),
        )),
    }
}

/// `conversation_context`: `[{role, content}]`, roles user, assistant, system.
fn context(f: &Fields<'_>) -> Result<Vec<ChatMessage>, FieldError> {
    messages::decode(f, "conversation_context")
}

fn sampling(msg: &Map<String, Value>) -> Map<String, Value> {
    SAMPLING_KEYS
        .iter()
        .filter_map(|k| msg.get(*k).map(|v| ((*k).to_string(), v.clone())))
        .collect()
}

/// Encodes a client message (flat form).
pub fn encode_client(msg: &ClientMessage) -> String {
    encode_client_value(msg).to_string()
}

/// A client message as a JSON value (flat form), for arrays and envelopes.
pub fn encode_client_value(msg: &ClientMessage) -> Value {
    let mut v = Map::new();
    v.insert("type".into(), msg.kind().into());
    match msg {
        ClientMessage::SessionInit(s) | ClientMessage::SessionResume(s) => {
            v.insert("session_id".into(), s.session_id.clone().into());
            v.insert("job_id".into(), s.job_id.clone().into());
            v.insert(
                "conversation_context".into(),
                messages::encode(&s.conversation_context),
            );
            if let Some(m) = &s.model {
                v.insert("model".into(), m.clone().into());
            }
            if let Some(i) = s.last_message_index {
                v.insert("last_message_index".into(), i.into());
            }
            if let Some(k) = &s.public_key {
                v.insert("public_key".into(), k.clone().into());
            }
        }
        ClientMessage::Prompt(p) => {
            v.insert("session_id".into(), p.session_id.clone().into());
            v.insert("content".into(), p.content.clone().into());
            v.insert("message_index".into(), p.message_index.into());
            v.insert("stream".into(), p.stream.into());
            for (k, x) in &p.sampling {
                v.insert(k.clone(), x.clone());
            }
            if let Some(s) = &p.signature {
                v.insert("signature".into(), s.clone().into());
            }
        }
        ClientMessage::SessionEnd { session_id } => {
            v.insert("session_id".into(), session_id.clone().into());
        }
        ClientMessage::Inference(i) => {
            v.insert("prompt".into(), i.prompt.clone().into());
            v.insert(
                "conversation_context".into(),
                messages::encode(&i.conversation_context),
            );
            if let Some(s) = &i.session_id {
                v.insert("session_id".into(), s.clone().into());
            }
            if let Some(m) = &i.model {
                v.insert("model".into(), m.clone().into());
            }
            v.insert("stream".into(), i.stream.into());
            for (k, x) in &i.sampling {
                v.insert(k.clone(), x.clone());
            }
        }
    }
    Value::Object(v)
}

/// The `session` dialect's error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A malformed message or a field out of range.
    InvalidRequest,
    /// The session is not open on this connection.
    UnknownSession,
    /// The session id is already live on this host.
    SessionExists,
    /// `message_index` / `last_message_index` is not the next one.
    MessageIndexMismatch,
    /// The prompt cannot fit the context window.
    ContextLengthExceeded,
    /// The job has used its tokens.
    TokenBudgetExhausted,
    /// The host is too busy; retry later.
    RateLimited,
    /// The host failed (or is shutting down); retry elsewhere.
    InternalError,
    /// A prompt or message matches the server's content filter.
    ContentFilter,
}

impl ErrorCode {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::UnknownSession => "unknown_session",
            ErrorCode::SessionExists => "session_exists",
            ErrorCode::MessageIndexMismatch => "message_index_mismatch",
            ErrorCode::ContextLengthExceeded => "context_length_exceeded",
            ErrorCode::TokenBudgetExhausted => "token_budget_exhausted",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::ContentFilter => "content_filter",
        }
    }

    /// The HTTP status of this error on `POST /v1/inference`.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest
            | ErrorCode::ContextLengthExceeded
            | ErrorCode::ContentFilter => 400,
            ErrorCode::UnknownSession => 404,
            ErrorCode::SessionExists | ErrorCode::MessageIndexMismatch => 409,
            ErrorCode::TokenBudgetExhausted => 402,
            ErrorCode::RateLimited => 429,
            ErrorCode::InternalError => 503,
        }
    }
}

/// A message from the server. Every one carries `timestamp` (unix ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// The session is built (`session_init` or `session_resume`).
    SessionReady(SessionReady),
    /// One streamed piece of the reply.
    StreamChunk(StreamChunk),
    /// The whole reply.
    Response(Response),
    /// The session is gone.
    SessionEnded(SessionEnded),
    /// Something went wrong.
    Error(ErrorMessage),
}

/// `session_ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionReady {
    /// The session.
    pub session_id: String,
    /// User and assistant messages the session holds.
    pub message_count: u64,
    /// Tokens of the newest messages that fit the window (less one token for
    /// a reply); each prompt drops more old messages if its `max_tokens` needs.
    pub context_tokens: u32,
    /// Messages left out of that count (the message cap, or the window).
    pub truncated_messages: u32,
    /// Unix ms.
    pub timestamp: u64,
}

/// `stream_chunk`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamChunk {
    /// The session.
    pub session_id: String,
    /// The next piece of text.
    pub content: String,
    /// The index the reply will have.
    pub message_index: u64,
    /// Unix ms.
    pub timestamp: u64,
}

/// `response`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    /// The session.
    pub session_id: String,
    /// The whole reply.
    pub content: String,
    /// Tokens the job was charged: prompt plus generated.
    pub tokens_used: u32,
    /// The reply's index: the prompt's plus one.
    pub message_index: u64,
    /// `stop`, `length`, `cancelled` or `timeout`.
    pub finish_reason: String,
    /// Unix ms.
    pub timestamp: u64,
}

/// `session_ended`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionEnded {
    /// The session.
    pub session_id: String,
    /// Unix ms.
    pub timestamp: u64,
}

/// `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorMessage {
    /// The session concerned, when known.
    pub session_id: Option<String>,
    /// What kind of error.
    pub code: ErrorCode,
    /// What was wrong, in words (never client text).
    pub message: String,
    /// `message_index_mismatch`: the index the host expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<u64>,
    /// True when retrying (here or elsewhere) may succeed.
    pub recoverable: bool,
    /// Unix ms.
    pub timestamp: u64,
}

/// Encodes a server message.
pub fn encode_server(msg: &ServerMessage) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}

/// Decodes a server message (strictly: unknown fields are errors).
pub fn decode_server(text: &str) -> Result<ServerMessage, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}
