//! The `cai` dialect's codec: every message of PROTOCOLS.md's `cai` section
//! as a Rust type, both ways (the server decodes [`ClientMessage`]s and
//! encodes [`ServerMessage`]s; tests and the simulator use the other two).
//! `decode(encode(m)) == m` for every message.
//!
//! Field names are camelCase as in the source. A COMPLETION's `options` stay
//! a JSON object here: [`crate::params::apply`] checks them against the
//! served model.

use serde_json::{json, Map, Value};

use crate::dialect::messages;
use crate::json::{self, FieldError, Fields};
use crate::text::ChatMessage;

/// A message from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// `COMPLETION`: start a request.
    Completion(Completion),
    /// `INTERRUPTED`: stop a request.
    Interrupted {
        /// The request.
        request_id: String,
    },
    /// `AWAIT_MORE`: chunks up to an index were received.
    AwaitMore {
        /// The request.
        request_id: String,
        /// The last chunk received (`None`: everything sent so far).
        last_received_index: Option<u64>,
    },
    /// `SENTENCE_COMPLETED`: a sentence was processed (spoken, shown).
    SentenceCompleted {
        /// The request.
        request_id: String,
        /// The sentence.
        sentence_index: u64,
    },
}

impl ClientMessage {
    /// The request the message names.
    pub fn request_id(&self) -> &str {
        match self {
            ClientMessage::Completion(c) => &c.request_id,
            ClientMessage::Interrupted { request_id }
            | ClientMessage::AwaitMore { request_id, .. }
            | ClientMessage::SentenceCompleted { request_id, .. } => request_id,
        }
    }
}

/// `COMPLETION`.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The client's id for the request.
    pub request_id: String,
    /// The user's message.
    pub prompt: String,
    /// The model asked for, if named.
    pub model: Option<String>,
    /// `payload.options` as sent (sampling, `stream`, windows).
    pub options: Map<String, Value>,
    /// The conversation to continue and keep, if any.
    pub conversation_id: Option<String>,
    /// Earlier messages given by the client (replacing a kept conversation).
    pub context: Option<Vec<ChatMessage>>,
}

/// Error codes of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Malformed message or unknown type.
    InvalidRequest,
    /// Missing or invalid payload fields.
    InvalidPayload,
    /// The model asked for is not served.
    ModelNotFound,
    /// Too many requests (in flight, or per minute).
    RateLimited,
    /// The context does not fit the model's window.
    ContextTooLong,
    /// The generation failed.
    GenerationFailed,
    /// Anything else (shutting down, ...).
    InternalError,
    /// The message matches the server's content filter (not in the
    /// source: the server's own, as PROTOCOLS.md's content filtering asks).
    ContentFiltered,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::InvalidRequest,
        ErrorCode::InvalidPayload,
        ErrorCode::ModelNotFound,
        ErrorCode::RateLimited,
        ErrorCode::ContextTooLong,
        ErrorCode::GenerationFailed,
        ErrorCode::InternalError,
        ErrorCode::ContentFiltered,
    ];

    /// The code on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::InvalidPayload => "INVALID_PAYLOAD",
            ErrorCode::ModelNotFound => "MODEL_NOT_FOUND",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::ContextTooLong => "CONTEXT_TOO_LONG",
            ErrorCode::GenerationFailed => "GENERATION_FAILED",
            ErrorCode::InternalError => "INTERNAL_ERROR",
            ErrorCode::ContentFiltered => "CONTENT_FILTERED",
        }
    }

    /// Parses a wire code.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
}

/// A message from the server.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerMessage {
    /// `STREAM_START`.
    StreamStart {
        /// The request.
        request_id: String,
        /// ISO 8601 UTC with milliseconds.
        timestamp: String,
    },
    /// `CONTENT_CHUNK`.
    ContentChunk {
        /// The request.
        request_id: String,
        /// The text.
        content: String,
        /// Its index, from 0 per request.
        index: u64,
    },
    /// `SENTENCE_BOUNDARY`.
    SentenceBoundary {
        /// The request.
        request_id: String,
        /// The sentence that ended.
        sentence: String,
        /// Its index, from 0 per request.
        sentence_index: u64,
    },
    /// `STREAM_COMPLETE`.
    StreamComplete {
        /// The request.
        request_id: String,
        /// The whole reply.
        full_content: String,
        /// Token counts.
        usage: Usage,
        /// The served model.
        model: String,
        /// `stop`, `length` or `interrupted`.
        finish_reason: String,
    },
    /// `INTERRUPTED_ACK`.
    InterruptedAck {
        /// The request.
        request_id: String,
        /// The text sent before the interruption.
        partial_content: String,
        /// Tokens generated.
        tokens_generated: u32,
    },
    /// `ERROR`.
    Error {
        /// The request, when the message named one.
        request_id: Option<String>,
        /// What kind of error.
        code: ErrorCode,
        /// What was wrong.
        message: String,
        /// More (`retryAfterMs`, `limit`, ...); an object.
        details: Map<String, Value>,
    },
}

/// Why a client message is not valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The request the message named, when it could be read.
    pub request_id: Option<String>,
    /// `INVALID_REQUEST` (the message) or `INVALID_PAYLOAD` (its payload).
    pub code: ErrorCode,
    /// What was wrong, naming the field.
    pub message: String,
}

/// The message types a client may send, for errors.
const CLIENT_TYPES: &str = "COMPLETION, INTERRUPTED, AWAIT_MORE or SENTENCE_COMPLETED";

/// Decodes one client frame.
pub fn decode_client(text: &str) -> Result<ClientMessage, DecodeError> {
    let invalid = |request_id: Option<&str>, code, message: String| DecodeError {
        request_id: request_id.map(str::to_string),
        code,
        message,
    };
    let v = json::parse(text).map_err(|e| invalid(None, ErrorCode::InvalidRequest, e))?;
    let Value::Object(msg) = &v else {
        return Err(invalid(
            None,
            ErrorCode::InvalidRequest,
            format!(
                "a message must be a JSON object, got {}",
                json::type_name(&v)
            ),
        ));
    };
    let f = Fields::new(msg, "");
    let rid = msg.get("requestId").and_then(Value::as_str);
    let bad = |code| move |e: FieldError| invalid(rid, code, e.to_string());
    let kind = f.req_str("type").map_err(bad(ErrorCode::InvalidRequest))?;
    if !matches!(
        kind,
        "COMPLETION" | "INTERRUPTED" | "AWAIT_MORE" | "SENTENCE_COMPLETED"
    ) {
        return Err(invalid(
            rid,
            ErrorCode::InvalidRequest,
            format!("unknown message type `{kind}`; expected {CLIENT_TYPES}"),
        ));
    }
    let request_id = f
        .req_str("requestId")
        .map_err(bad(ErrorCode::InvalidRequest))?;
    if request_id.is_empty() {
        return Err(invalid(
            None,
            ErrorCode::InvalidRequest,
            "`requestId` must not be empty".into(),
        ));
    }
    let request_id = request_id.to_string();
    let payload = f.obj("payload").map_err(bad(ErrorCode::InvalidPayload))?;
    let empty = Map::new();
    let p = Fields::new(payload.unwrap_or(&empty), "payload.");
    let pe = bad(ErrorCode::InvalidPayload);
    Ok(match kind {
        "COMPLETION" => {
            if payload.is_none() {
                return Err(invalid(
                    rid,
                    ErrorCode::InvalidPayload,
                    "`payload` is required".into(),
                ));
            }
            ClientMessage::Completion(Completion {
                request_id,
                prompt: p.req_str("prompt").map_err(pe)?.to_string(),
                model: p.str("model").map_err(pe)?.map(str::to_string),
                options: p.obj("options").map_err(pe)?.cloned().unwrap_or_default(),
                conversation_id: match p.str("conversationId").map_err(pe)? {
                    Some("") => {
                        return Err(invalid(
                            rid,
                            ErrorCode::InvalidPayload,
                            "`payload.conversationId` must not be empty".into(),
                        ))
                    }
                    other => other.map(str::to_string),
                },
                context: if p.has("context") {
                    Some(messages::decode(&p, "context").map_err(pe)?)
                } else {
                    None
                },
            })
        }
        "INTERRUPTED" => ClientMessage::Interrupted { request_id },
        "AWAIT_MORE" => ClientMessage::AwaitMore {
            request_id,
            last_received_index: p.u64("lastReceivedIndex").map_err(pe)?,
        },
        _ => ClientMessage::SentenceCompleted {
            request_id,
            sentence_index: p
                .u64("sentenceIndex")
                .map_err(pe)?
                .ok_or_else(|| pe(FieldError::new("payload.sentenceIndex", "is required")))?,
        },
    })
}

/// Encodes a client message.
pub fn encode_client(msg: &ClientMessage) -> String {
    let v = match msg {
        ClientMessage::Completion(c) => {
            let mut payload = Map::new();
            payload.insert("prompt".into(), json!(c.prompt));
            if let Some(m) = &c.model {
                payload.insert("model".into(), json!(m));
            }
            if !c.options.is_empty() {
                payload.insert("options".into(), Value::Object(c.options.clone()));
            }
            if let Some(id) = &c.conversation_id {
                payload.insert("conversationId".into(), json!(id));
            }
            if let Some(ctx) = &c.context {
                payload.insert("context".into(), messages::encode(ctx));
            }
            json!({"type": "COMPLETION", "requestId": c.request_id, "payload": payload})
        }
        ClientMessage::Interrupted { request_id } => {
            json!({"type": "INTERRUPTED", "requestId": request_id})
        }
        ClientMessage::AwaitMore {
            request_id,
            last_received_index,
        } => match last_received_index {
            Some(i) => json!({"type": "AWAIT_MORE", "requestId": request_id,
                              "payload": {"lastReceivedIndex": i}}),
            None => json!({"type": "AWAIT_MORE", "requestId": request_id}),
        },
        ClientMessage::SentenceCompleted {
            request_id,
            sentence_index,
        } => json!({"type": "SENTENCE_COMPLETED", "requestId": request_id,
                    "payload": {"sentenceIndex": sentence_index}}),
    };
    v.to_string()
}

/// Encodes a server message.
pub fn encode_server(msg: &ServerMessage) -> String {
    let v = match msg {
        ServerMessage::StreamStart {
            request_id,
            timestamp,
        } => json!({"type": "STREAM_START", "requestId": request_id, "timestamp": timestamp}),
        ServerMessage::ContentChunk {
            request_id,
            content,
            index,
        } => json!({"type": "CONTENT_CHUNK", "requestId": request_id,
                    "payload": {"content": content, "index": index}}),
        ServerMessage::SentenceBoundary {
            request_id,
            sentence,
            sentence_index,
        } => json!({"type": "SENTENCE_BOUNDARY", "requestId": request_id,
                    "payload": {"sentence": sentence, "sentenceIndex": sentence_index}}),
        ServerMessage::StreamComplete {
            request_id,
            full_content,
            usage,
            model,
            finish_reason,
        } => json!({"type": "STREAM_COMPLETE", "requestId": request_id, "payload": {
            "fullContent": full_content,
            "usage": {
                "promptTokens": usage.prompt_tokens,
                "completionTokens": usage.completion_tokens,
                "totalTokens": usage.prompt_tokens + usage.completion_tokens,
            },
            "model": model,
            "finishReason": finish_reason,
        }}),
        ServerMessage::InterruptedAck {
            request_id,
            partial_content,
            tokens_generated,
        } => json!({"type": "INTERRUPTED_ACK", "requestId": request_id, "payload": {
            "partialContent": partial_content,
            "tokensGenerated": tokens_generated,
        }}),
        ServerMessage::Error {
            request_id,
            code,
            message,
            details,
        } => json!({"type": "ERROR", "requestId": request_id, "error": {
            "code": code.as_str(), "message": message, "details": details,
        }}),
    };
    v.to_string()
}

/// Decodes a server frame (for clients, tests and the simulator); the
/// error says what does not match the contract.
pub fn decode_server(text: &str) -> Result<ServerMessage, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let o = v.as_object().ok_or("not an object")?;
    let s = |m: &Map<String, Value>, k: &str| -> Result<String, String> {
        m.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("`{k}` missing or not a string"))
    };
    let u = |m: &Map<String, Value>, k: &str| -> Result<u64, String> {
        m.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("`{k}` missing or not an integer"))
    };
    let kind = s(o, "type")?;
    let empty = Map::new();
    let payload = o
        .get("payload")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let rid = || s(o, "requestId");
    Ok(match kind.as_str() {
        "STREAM_START" => ServerMessage::StreamStart {
            request_id: rid()?,
            timestamp: s(o, "timestamp")?,
        },
        "CONTENT_CHUNK" => ServerMessage::ContentChunk {
            request_id: rid()?,
            content: s(payload, "content")?,
            index: u(payload, "index")?,
        },
        "SENTENCE_BOUNDARY" => ServerMessage::SentenceBoundary {
            request_id: rid()?,
            sentence: s(payload, "sentence")?,
            sentence_index: u(payload, "sentenceIndex")?,
        },
        "STREAM_COMPLETE" => {
            let usage = payload
                .get("usage")
                .and_then(Value::as_object)
                .ok_or("`usage` missing")?;
            let prompt = u(usage, "promptTokens")?;
            let completion = u(usage, "completionTokens")?;
            if u(usage, "totalTokens")? != prompt + completion {
                return Err("`totalTokens` is not the sum".into());
            }
            ServerMessage::StreamComplete {
                request_id: rid()?,
                full_content: s(payload, "fullContent")?,
                usage: Usage {
                    prompt_tokens: u32::try_from(prompt).map_err(|e| e.to_string())?,
                    completion_tokens: u32::try_from(completion).map_err(|e| e.to_string())?,
                },
                model: s(payload, "model")?,
                finish_reason: s(payload, "finishReason")?,
            }
        }
        "INTERRUPTED_ACK" => ServerMessage::InterruptedAck {
            request_id: rid()?,
            partial_content: s(payload, "partialContent")?,
            tokens_generated: u32::try_from(u(payload, "tokensGenerated")?)
                .map_err(|e| e.to_string())?,
        },
        "ERROR" => {
            let e = o
                .get("error")
                .and_then(Value::as_object)
                .ok_or("`error` missing")?;
            let code = s(e, "code")?;
            ServerMessage::Error {
                request_id: match o.get("requestId") {
                    Some(Value::String(r)) => Some(r.clone()),
                    Some(Value::Null) => None,
                    _ => return Err("`requestId` must be a string or null".into()),
                },
                code: ErrorCode::parse(&code).ok_or(format!("unknown error code `{code}`"))?,
                message: s(e, "message")?,
                details: e
                    .get("details")
                    .and_then(Value::as_object)
                    .cloned()
                    .ok_or("`details` missing or not an object")?,
            }
        }
        other => return Err(format!("unknown server message type `{other}`")),
    })
}

impl ServerMessage {
    /// The request the message is about.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            ServerMessage::StreamStart { request_id, .. }
            | ServerMessage::ContentChunk { request_id, .. }
            | ServerMessage::SentenceBoundary { request_id, .. }
            | ServerMessage::StreamComplete { request_id, .. }
            | ServerMessage::InterruptedAck { request_id, .. } => Some(request_id),
            ServerMessage::Error { request_id, .. } => request_id.as_deref(),
        }
    }
}
