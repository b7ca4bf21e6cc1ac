//! The `generate` dialect's codec: every message of PROTOCOLS.md's `generate`
//! section as a Rust type, with a decoder and an encoder for each direction.
//!
//! The server decodes [`ClientMessage`]s with [`decode_client`] and encodes
//! [`ServerMessage`]s with [`encode_server`]; a client (the end-to-end tests,
//! the simulator, a custom transport's test harness) uses the other two,
//! [`encode_client`] and [`decode_server`]. Each pair round-trips:
//! `decode(encode(m)) == m` for every message `m`.
//!
//! Decoding checks shape and types (an error names the field), and the few
//! rules that need no server state: the control action is one of the five,
//! the feedback rating is in -1..=1 and its text at most 4 KiB. Sampling
//! `parameters` stay a JSON object here: their meaning depends on the served
//! model (the context length), so [`crate::params::apply`] validates them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::json::{self, FieldError, Fields};

/// Longest feedback text in bytes.
pub const MAX_FEEDBACK_TEXT: usize = 4096;

/// A message from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// `config`: start a generation.
    Config(Config),
    /// `control`: steer the running generation.
    Control(Control),
    /// `feedback`: rate the generation.
    Feedback(Feedback),
}

impl ClientMessage {
    /// The message's `type` on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientMessage::Config(_) => "config",
            ClientMessage::Control(_) => "control",
            ClientMessage::Feedback(_) => "feedback",
        }
    }
}

/// The `config` message.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// The raw prompt, used exactly as given.
    pub prompt: String,
    /// The model the client asks for, if it names one.
    pub model: Option<String>,
    /// Sampling parameters, validated by [`crate::params::apply`].
    pub parameters: Option<Map<String, Value>>,
    /// Per-message output switches.
    pub options: Options,
}

/// `config.options`: what each streamed message carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `completion.generated_text` starts with the prompt.
    pub echo_prompt: bool,
    /// `token.token_id` is sent.
    pub include_token_ids: bool,
    /// `token.logprobs` is sent.
    pub include_logprobs: bool,
    /// `token.timing` and `completion.timing` are sent.
    pub include_timing: bool,
    /// `token.generated_text` (cumulative) is sent.
    pub include_generated_text: bool,
}

/// What a `control` message asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlAction {
    /// End the generation; its `completion` follows.
    Stop,
    /// Stop scheduling it.
    Pause,
    /// Schedule it again.
    Resume,
    /// Cancel it and start again from the same config.
    Regenerate,
    /// Change its sampling parameters from the next token on.
    Modify,
}

impl ControlAction {
    /// Every action, in PROTOCOLS.md's order.
    pub const ALL: [ControlAction; 5] = [
        ControlAction::Stop,
        ControlAction::Pause,
        ControlAction::Resume,
        ControlAction::Regenerate,
        ControlAction::Modify,
    ];

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ControlAction::Stop => "stop",
            ControlAction::Pause => "pause",
            ControlAction::Resume => "resume",
            ControlAction::Regenerate => "regenerate",
            ControlAction::Modify => "modify",
        }
    }

    fn parse(s: &str) -> Option<ControlAction> {
        ControlAction::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// The `control` message.
#[derive(Debug, Clone, PartialEq)]
pub struct Control {
    /// What to do.
    pub action: ControlAction,
    /// The new parameters (`modify` needs them; the others ignore them).
    pub parameters: Option<Map<String, Value>>,
}

/// The `feedback` message.
#[derive(Debug, Clone, PartialEq)]
pub struct Feedback {
    /// -1 (bad) ..= 1 (good).
    pub rating: f64,
    /// Free text, at most [`MAX_FEEDBACK_TEXT`] bytes.
    pub text: Option<String>,
    /// A position in the generated sequence the rating refers to.
    pub position: Option<u64>,
}

/// Why a client frame is not a valid message. The dialect answers it with
/// `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The message's `type` when it was one of the dialect's (so a first
    /// frame that is a malformed `config` is told apart from one that is not
    /// a `config` at all).
    pub kind: Option<&'static str>,
    /// What was wrong, naming the field; sent to the client.
    pub message: String,
}

impl DecodeError {
    fn new(kind: Option<&'static str>, message: impl Into<String>) -> DecodeError {
        DecodeError {
            kind,
            message: message.into(),
        }
    }

    fn field(kind: &'static str, e: FieldError) -> DecodeError {
        DecodeError::new(Some(kind), e.to_string())
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one client text frame.
pub fn decode_client(text: &str) -> Result<ClientMessage, DecodeError> {
    let msg = match json::parse(text).map_err(|e| DecodeError::new(None, e))? {
        Value::Object(m) => m,
        other => {
            return Err(DecodeError::new(
                None,
                format!(
                    "a message must be a JSON object, got {}",
                    json::type_name(&other)
                ),
            ))
        }
    };
    let f = Fields::new(&msg, "");
    let kind = f
        .req_str("type")
        .map_err(|e| DecodeError::new(None, e.to_string()))?;
    match kind {
        "config" => decode_config(&f).map(ClientMessage::Config),
        "control" => decode_control(&f).map(ClientMessage::Control),
        "feedback" => decode_feedback(&f).map(ClientMessage::Feedback),
        other => Err(DecodeError::new(
            None,
            format!("unknown message type `{other}`; expected config, control or feedback"),
        )),
    }
}

fn decode_config(f: &Fields<'_>) -> Result<Config, DecodeError> {
    let e = |e| DecodeError::field("config", e);
    Ok(Config {
        prompt: f.req_str("prompt").map_err(e)?.to_string(),
        model: f.str("model").map_err(e)?.map(str::to_string),
        parameters: f.obj("parameters").map_err(e)?.cloned(),
        options: decode_options(f.obj("options").map_err(e)?).map_err(e)?,
    })
}

fn decode_options(obj: Option<&Map<String, Value>>) -> Result<Options, FieldError> {
    let Some(obj) = obj else {
        return Ok(Options::default());
    };
    let f = Fields::new(obj, "options.");
    // `stream` is accepted for compatibility (the socket always streams), but
    // must still be a boolean.
    f.bool("stream")?;
    Ok(Options {
        echo_prompt: f.bool("echo_prompt")?.unwrap_or(false),
        include_token_ids: f.bool("include_token_ids")?.unwrap_or(false),
        include_logprobs: f.bool("include_logprobs")?.unwrap_or(false),
        include_timing: f.bool("include_timing")?.unwrap_or(false),
        include_generated_text: f.bool("include_generated_text")?.unwrap_or(false),
    })
}

fn decode_control(f: &Fields<'_>) -> Result<Control, DecodeError> {
    let e = |e| DecodeError::field("control", e);
    let action = f.req_str("action").map_err(e)?;
    let Some(action) = ControlAction::parse(action) else {
        return Err(DecodeError::new(
            Some("control"),
            format!("unknown control action `{action}`; expected stop, pause, resume, regenerate or modify"),
        ));
    };
    Ok(Control {
        action,
        parameters: f.obj("parameters").map_err(e)?.cloned(),
    })
}

fn decode_feedback(f: &Fields<'_>) -> Result<Feedback, DecodeError> {
    let e = |e| DecodeError::field("feedback", e);
    let rating = f
        .f64("rating")
        .map_err(e)?
        .ok_or_else(|| e(FieldError::new("rating", "is required")))?;
    if !(-1.0..=1.0).contains(&rating) {
        return Err(e(FieldError::new(
            "rating",
            format!("must be between -1 and 1, got {rating}"),
        )));
    }
    let text = f.str("text").map_err(e)?;
    if let Some(t) = text {
        if t.len() > MAX_FEEDBACK_TEXT {
            return Err(e(FieldError::new(
                "text",
                format!("must be at most {MAX_FEEDBACK_TEXT} bytes, got {}", t.len()),
            )));
        }
    }
    Ok(Feedback {
        rating,
        text: text.map(str::to_string),
        position: f.u64("position").map_err(e)?,
    })
}

/// Encodes a client message (what a client sends).
pub fn encode_client(msg: &ClientMessage) -> String {
    let mut v = Map::new();
    v.insert("type".into(), msg.kind().into());
    match msg {
        ClientMessage::Config(c) => {
            v.insert("prompt".into(), c.prompt.clone().into());
            if let Some(m) = &c.model {
                v.insert("model".into(), m.clone().into());
            }
            if let Some(p) = &c.parameters {
                v.insert("parameters".into(), Value::Object(p.clone()));
            }
            let o = c.options;
            let switches = [
                ("echo_prompt", o.echo_prompt),
                ("include_token_ids", o.include_token_ids),
                ("include_logprobs", o.include_logprobs),
                ("include_timing", o.include_timing),
                ("include_generated_text", o.include_generated_text),
            ];
            let on: Map<String, Value> = switches
                .into_iter()
                .filter(|&(_, b)| b)
                .map(|(k, b)| (k.to_string(), Value::Bool(b)))
                .collect();
            if !on.is_empty() {
                v.insert("options".into(), Value::Object(on));
            }
        }
        ClientMessage::Control(c) => {
            v.insert("action".into(), c.action.as_str().into());
            if let Some(p) = &c.parameters {
                v.insert("parameters".into(), Value::Object(p.clone()));
            }
        }
        ClientMessage::Feedback(fb) => {
            v.insert("rating".into(), fb.rating.into());
            if let Some(t) = &fb.text {
                v.insert("text".into(), t.clone().into());
            }
            if let Some(p) = fb.position {
                v.insert("position".into(), p.into());
            }
        }
    }
    Value::Object(v).to_string()
}

/// A message from the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// A generation started.
    Init(Init),
    /// One streamed piece of text.
    Token(Token),
    /// The generation ended.
    Completion(Completion),
    /// Something went wrong.
    Error(ErrorMessage),
    /// An acknowledgement or a progress report.
    Status(Status),
}

/// `init`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Init {
    /// `gen_<uuid7>`.
    pub request_id: String,
    /// The served model's name.
    pub model: String,
    /// Facts about the model.
    pub model_info: ModelInfo,
}

/// `init.model_info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The model's version string.
    pub version: String,
    /// Its context length in tokens.
    pub max_tokens: u32,
    /// Its weight dtype (f32, f16, bf16, ...).
    pub quantization: String,
}

/// How a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// A stop string or an end-of-sequence token.
    Stop,
    /// Control stop (or the client went away).
    Cancelled,
    /// The pause timeout.
    Timeout,
    /// A content-filter rule matched the text it was about to send.
    ContentFilter,
}

impl From<crate::gen::FinishReason> for FinishReason {
    fn from(r: crate::gen::FinishReason) -> FinishReason {
        match r {
            crate::gen::FinishReason::Length => FinishReason::Length,
            crate::gen::FinishReason::Stop => FinishReason::Stop,
            crate::gen::FinishReason::Cancelled => FinishReason::Cancelled,
            crate::gen::FinishReason::Timeout => FinishReason::Timeout,
            crate::gen::FinishReason::ContentFilter => FinishReason::ContentFilter,
        }
    }
}

/// `token`. Optional fields are sent only when the config's options ask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Token {
    /// The text this token adds (may be empty while a character or a
    /// possible stop string is held back).
    pub token: String,
    /// The token's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<u32>,
    /// The chosen token first, then the best alternatives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
    /// Times since the previous token and since the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<TokenTiming>,
    /// All text streamed so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_text: Option<String>,
    /// Set on the last token only (`null` before).
    pub finish_reason: Option<FinishReason>,
    /// True on the last token.
    pub finished: bool,
}

/// One entry of `token.logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Logprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its id, when `include_token_ids` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<u32>,
}

/// `token.timing`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenTiming {
    /// Milliseconds since the previous token (or the start).
    pub token_ms: f64,
    /// Milliseconds since the start.
    pub total_ms: f64,
}

/// `completion`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The generation's id from `init`.
    pub request_id: String,
    /// The whole generated text (prefixed with the prompt when `echo_prompt`).
    pub generated_text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Token counts from the model's tokenizer.
    pub usage: Usage,
    /// Time to first token and in total, when `include_timing` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<CompletionTiming>,
}

/// `completion.usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Their sum.
    pub total_tokens: u32,
}

/// `completion.timing`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CompletionTiming {
    /// Milliseconds to the first token (`null` when none was generated).
    pub first_token_ms: Option<f64>,
    /// Milliseconds in total.
    pub total_ms: f64,
    /// Prompt tokens whose K/V came from the prefix cache (not computed).
    #[serde(default)]
    pub cached_tokens: u32,
}

/// The `error` types of the source. This server sends all but
/// `content_filter`, `timeout` and `rate_limited`, which a client may still
/// meet from another server of the dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame or a field of it is invalid.
    InvalidRequest,
    /// The prompt plus `max_tokens` exceed the context.
    ContextLengthExceeded,
    /// The request can never fit the KV cache, or the queue is full.
    MemoryPressure,
    /// A server-side failure (or shutdown).
    InternalError,
    /// The model is not loaded.
    ModelLoadingError,
    /// Content filtered by a safety system.
    ContentFilter,
    /// An operation timed out.
    Timeout,
    /// Too many requests.
    RateLimited,
}

impl ErrorCode {
    /// Every error type, in declaration order.
    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::InvalidRequest,
        ErrorCode::ContextLengthExceeded,
        ErrorCode::MemoryPressure,
        ErrorCode::InternalError,
        ErrorCode::ModelLoadingError,
        ErrorCode::ContentFilter,
        ErrorCode::Timeout,
        ErrorCode::RateLimited,
    ];

    /// The wire spelling (also the metrics label; a test ties the two).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::ContextLengthExceeded => "context_length_exceeded",
            ErrorCode::MemoryPressure => "memory_pressure",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::ModelLoadingError => "model_loading_error",
            ErrorCode::ContentFilter => "content_filter",
            ErrorCode::Timeout => "timeout",
            ErrorCode::RateLimited => "rate_limited",
        }
    }
}

/// `error.recovery_action`: what the client should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    /// Try again (here or elsewhere).
    Retry,
    /// Ask for fewer tokens.
    ReduceMaxTokens,
    /// Send a shorter prompt.
    ShortenPrompt,
    /// Nothing will help as sent; fix the request.
    None,
}

/// `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMessage {
    /// The error type.
    pub error: ErrorCode,
    /// What was wrong, in words.
    pub message: String,
    /// False only when the server closes the connection after it.
    pub recoverable: bool,
    /// What the client should do.
    pub recovery_action: RecoveryAction,
    /// The generation it concerns, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The partial text when a generation was under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_text: Option<String>,
}

/// `status`, by its `operation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub enum Status {
    /// `control pause` took effect.
    Paused {
        /// The paused generation.
        request_id: String,
    },
    /// `control resume` took effect.
    Resumed {
        /// The resumed generation.
        request_id: String,
    },
    /// `control modify` took effect.
    Modified {
        /// The modified generation.
        request_id: String,
        /// The new effective parameters.
        parameters: Map<String, Value>,
    },
    /// A `feedback` message was recorded.
    FeedbackReceived {
        /// The generation it was attributed to, if any ran on this connection.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
    },
    /// The generation waits for room; `position` in the queue (0 = next).
    Queued {
        /// Place in the queue.
        position: u32,
        /// The waiting generation.
        request_id: String,
    },
    /// The model is still loading.
    ModelLoading {
        /// 0..=1.
        progress: f32,
        /// What the loader is doing.
        message: String,
        /// Estimated seconds left (`null` when unknown).
        eta_seconds: Option<f64>,
    },
}

/// Encodes a server message (what the server sends).
pub fn encode_server(msg: &ServerMessage) -> String {
    // Every field is a string, number, bool, map or sequence with string
    // keys, which serde_json always serialises; a float that is not finite
    // becomes `null`, as JSON has no spelling for it.
    serde_json::to_string(msg).unwrap_or_else(|_| {
        r#"{"type":"error","error":"internal_error","message":"a server message could not be encoded","recoverable":true,"recovery_action":"retry"}"#.to_string()
    })
}

/// Decodes a server text frame (what a client receives).
pub fn decode_server(text: &str) -> Result<ServerMessage, DecodeError> {
    let v = json::parse(text).map_err(|e| DecodeError::new(None, e))?;
    let msg: ServerMessage = serde_json::from_value(v)
        .map_err(|e| DecodeError::new(None, format!("invalid message: {e}")))?;
    match first_non_finite(&msg) {
        Some(field) => Err(DecodeError::new(
            None,
            format!("invalid message: `{field}` is out of range"),
        )),
        None => Ok(msg),
    }
}

/// The first float field of `msg` that is not finite: a JSON number too large
/// for an `f32` field would otherwise decode to infinity, which no JSON
/// encoder can write back.
fn first_non_finite(msg: &ServerMessage) -> Option<&'static str> {
    let bad32 = |x: f32| !x.is_finite();
    let bad64 = |x: f64| !x.is_finite();
    match msg {
        ServerMessage::Token(t) => {
            if t.logprobs.iter().flatten().any(|l| bad32(l.logprob)) {
                return Some("logprobs.logprob");
            }
            t.timing
                .filter(|x| bad64(x.token_ms) || bad64(x.total_ms))
                .map(|_| "timing")
        }
        ServerMessage::Completion(c) => c
            .timing
            .filter(|x| x.first_token_ms.is_some_and(bad64) || bad64(x.total_ms))
            .map(|_| "timing"),
        ServerMessage::Status(Status::ModelLoading {
            progress,
            eta_seconds,
            ..
        }) => (bad32(*progress) || eta_seconds.is_some_and(bad64)).then_some("progress"),
        _ => None,
    }
}
