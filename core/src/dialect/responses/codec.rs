//! The `responses` dialect's codec: the client events of the OpenAI Responses
//! API WebSocket mode (`response.create`, the `response.cancel` extension,
//! and `response.retrieve` for `GET /v1/responses/{id}`) decoded into typed
//! requests, and the server's events and Response objects encoded in the
//! shapes of the official SDKs' types (PROTOCOLS.md's `responses` section).
//!
//! Values the client sent are echoed as sent: the request keeps the raw JSON
//! of `temperature`, `top_p`, `max_output_tokens` and `metadata` next to the
//! validated parameters.

use serde_json::{json, Map, Value};

use crate::constraint::Grammar;
use crate::dialect::openai::{self, FormatShape};
use crate::json::{self, FieldError, Fields};
use crate::text::{ChatMessage, HistoryCall, Role};
use crate::tools::Tools;

/// Longest `metadata` map the API allows.
pub const MAX_METADATA_KEYS: usize = 16;

/// A client event.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    /// `response.create`: the Responses create body.
    Create(Box<CreateRequest>),
    /// `response.cancel`: cancel the in-flight response (`response_id`, if
    /// given, must name it).
    Cancel {
        /// The response to cancel.
        response_id: Option<String>,
    },
    /// `response.retrieve` (the HTTP route `GET /v1/responses/{id}` only).
    Retrieve {
        /// The stored response's id.
        response_id: String,
    },
}

/// A `response.create` body.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CreateRequest {
    /// The model asked for.
    pub model: Option<String>,
    /// The new input as chat messages (tool outputs as tool messages).
    pub input: Vec<ChatMessage>,
    /// System instructions for this response only (not carried over).
    pub instructions: Option<String>,
    /// The sampling fields, validated by [`crate::params::apply`].
    pub sampling: Map<String, Value>,
    /// Raw values to echo in the Response object.
    pub echo: Echo,
    /// Continue from this response.
    pub previous_response_id: Option<String>,
    /// `false`: cache the input as a response without running the model.
    pub generate: bool,
    /// Keep the response for `GET` and HTTP continuations (default true).
    pub store: bool,
    /// HTTP: answer with server-sent events (ignored on the socket).
    pub stream: bool,
    /// Echoed on every event of this response.
    pub stream_id: Option<Value>,
    /// `text.format`'s grammar (structured output); `None` for free text.
    pub format: Option<Grammar>,
    /// `tools`, `tool_choice`, `parallel_tool_calls`.
    pub tools: Tools,
    /// Each output text token's log-probability with this many alternatives
    /// (`include: ["message.output_text.logprobs"]`, `top_logprobs`);
    /// `None`: none.
    pub logprobs: Option<u8>,
}

/// The `include` value that asks for the output text's logprobs.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// What the client sent, echoed as sent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Echo {
    /// `temperature` as sent.
    pub temperature: Option<Value>,
    /// `top_p` as sent.
    pub top_p: Option<Value>,
    /// `max_output_tokens` as sent.
    pub max_output_tokens: Option<Value>,
    /// `metadata` as sent.
    pub metadata: Option<Value>,
    /// `text` as sent (its `format`).
    pub text: Option<Value>,
    /// `top_logprobs` as sent.
    pub top_logprobs: Option<Value>,
}

/// Why a client event is not valid: the error event's code, status and
/// the parameter at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// `invalid_json`, `invalid_request` or `unknown_event_type`.
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
    /// The field at fault, dotted.
    pub param: Option<String>,
}

impl DecodeError {
    fn invalid(e: FieldError) -> DecodeError {
        DecodeError {
            code: "invalid_request",
            message: e.to_string(),
            param: Some(e.field),
        }
    }
}

/// Keys of a create body read as sampling parameters.
const SAMPLING_KEYS: [&str; 7] = [
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "stop",
    "seed",
];

/// Decodes one client frame.
pub fn decode_client(text: &str) -> Result<ClientEvent, DecodeError> {
    let v = json::parse(text).map_err(|m| DecodeError {
        code: "invalid_json",
        message: m,
        param: None,
    })?;
    decode_value(&v)
}

/// Decodes one client event from JSON ([`decode_client`]'s format).
pub fn decode_value(v: &Value) -> Result<ClientEvent, DecodeError> {
    let Value::Object(obj) = v else {
        return Err(DecodeError {
            code: "invalid_request",
            message: format!("an event must be a JSON object, got {}", json::type_name(v)),
            param: None,
        });
    };
    let f = Fields::new(obj, "");
    let kind = f.req_str("type").map_err(DecodeError::invalid)?;
    match kind {
        "response.create" => decode_create(obj).map(|r| ClientEvent::Create(Box::new(r))),
        "response.cancel" => Ok(ClientEvent::Cancel {
            response_id: f
                .str("response_id")
                .map_err(DecodeError::invalid)?
                .map(str::to_string),
        }),
        "response.retrieve" => Ok(ClientEvent::Retrieve {
            response_id: f
                .req_str("response_id")
                .map_err(DecodeError::invalid)?
                .to_string(),
        }),
        other => Err(DecodeError {
            code: "unknown_event_type",
            message: format!(
                "unknown event type `{other}`; this server accepts response.create and response.cancel"
            ),
            param: Some("type".into()),
        }),
    }
}

fn decode_create(obj: &Map<String, Value>) -> Result<CreateRequest, DecodeError> {
    // The SDKs may nest the body under `response`; flat fields win.
    let merged;
    let obj = match obj.get("response") {
        Some(Value::Object(inner)) => {
            let mut m = inner.clone();
            for (k, v) in obj {
                if k != "response" {
                    m.insert(k.clone(), v.clone());
                }
            }
            merged = m;
            &merged
        }
        _ => obj,
    };
    let f = Fields::new(obj, "");
    let e = DecodeError::invalid;
    let input = match f.raw("input") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![ChatMessage::new(Role::User, s.clone())],
        Some(Value::Array(items)) => {
            let mut messages: Vec<ChatMessage> = Vec::with_capacity(items.len());
            let mut after_call = false;
            for (i, item) in items.iter().enumerate() {
                let Some((m, is_call)) = input_item(i, item).map_err(e)? else {
                    continue;
                };
                // Calls of one turn (and the text before them) make one
                // assistant message, as the model wrote them.
                match messages.last_mut() {
                    Some(prev)
                        if prev.role == Role::Assistant
                            && (is_call || after_call && m.role == Role::Assistant) =>
                    {
                        // Text after a call goes on a line of its own.
                        if !prev.content.is_empty() && !m.content.is_empty() {
                            prev.content.push('\n');
                        }
                        prev.content.push_str(&m.content);
                        prev.tool_calls.extend(m.tool_calls);
                    }
                    _ => messages.push(m),
                }
                after_call = is_call;
            }
            messages
        }
        Some(other) => {
            return Err(e(FieldError::new(
                "input",
                format!(
                    "must be a string or an array of items, got {}",
                    json::type_name(other)
                ),
            )))
        }
    };
    let metadata = f.raw("metadata").cloned();
    if let Some(m) = &metadata {
        check_metadata(m).map_err(e)?;
    }
    let stream_id = f.raw("stream_id").cloned();
    let text = f.obj("text").map_err(e)?;
    let format = match text.map(|t| Fields::new(t, "text.")) {
        Some(t) => match t.obj("format").map_err(e)? {
            Some(fmt) => {
                openai::output_format(fmt, "text.format.", FormatShape::Flat).map_err(e)?
            }
            None => None,
        },
        None => None,
    };
    let tools = openai::tools(&f, FormatShape::Flat).map_err(e)?;
    let logprobs = logprobs(&f).map_err(e)?;
    if tools.forced() && format.is_some() {
        return Err(e(FieldError::new(
            "tool_choice",
            "a forced tool call cannot be combined with `text.format`; use one or the other",
        )));
    }
    Ok(CreateRequest {
        model: f.str("model").map_err(e)?.map(str::to_string),
        input,
        instructions: f.str("instructions").map_err(e)?.map(str::to_string),
        sampling: SAMPLING_KEYS
            .iter()
            .filter_map(|k| obj.get(*k).map(|v| ((*k).to_string(), v.clone())))
            .collect(),
        echo: Echo {
            temperature: f.raw("temperature").cloned(),
            top_p: f.raw("top_p").cloned(),
            max_output_tokens: f.raw("max_output_tokens").cloned(),
            metadata,
            text: text.map(|t| Value::Object(t.clone())),
            top_logprobs: f.raw("top_logprobs").cloned(),
        },
        previous_response_id: f
            .str("previous_response_id")
            .map_err(e)?
            .map(str::to_string),
        generate: f.bool("generate").map_err(e)?.unwrap_or(true),
        store: f.bool("store").map_err(e)?.unwrap_or(true),
        stream: f.bool("stream").map_err(e)?.unwrap_or(false),
        stream_id,
        format,
        tools,
        logprobs,
    })
}

/// The output text's logprobs: asked for by `include` holding
/// [`INCLUDE_LOGPROBS`] (other `include` values name items this server
/// does not produce, and are ignored) or by a `top_logprobs` above 0, with
/// `top_logprobs` (0 to 20) alternatives each.
fn logprobs(f: &Fields<'_>) -> Result<Option<u8>, FieldError> {
    let top = match f.u64("top_logprobs")? {
        Some(k) if k > crate::params::MAX_TOP_LOGPROBS => {
            return Err(FieldError::new(
                "top_logprobs",
                format!(
                    "must be between 0 and {}, got {k}",
                    crate::params::MAX_TOP_LOGPROBS
                ),
            ))
        }
        k => k.map(|k| k as u8),
    };
    let mut included = false;
    if let Some(items) = f.array("include")? {
        for (i, item) in items.iter().enumerate() {
            match item.as_str() {
                Some(s) => included |= s == INCLUDE_LOGPROBS,
                None => {
                    return Err(FieldError::new(
                        format!("include[{i}]"),
                        format!("must be a string, got {}", json::type_name(item)),
                    ))
                }
            }
        }
    }
    Ok(match top {
        Some(k) if included || k > 0 => Some(k),
        None if included => Some(0),
        _ => None,
    })
}

fn check_metadata(m: &Value) -> Result<(), FieldError> {
    let Value::Object(map) = m else {
        return Err(FieldError::new(
            "metadata",
            format!("must be an object of strings, got {}", json::type_name(m)),
        ));
    };
    if map.len() > MAX_METADATA_KEYS {
        return Err(FieldError::new(
            "metadata",
            format!(
                "must have at most {MAX_METADATA_KEYS} keys, got {}",
                map.len()
            ),
        ));
    }
    for (k, v) in map {
        if !v.is_string() {
            return Err(FieldError::new(
                format!("metadata.{k}"),
                format!("must be a string, got {}", json::type_name(v)),
            ));
        }
    }
    Ok(())
}

/// One `input` item as a chat message, and whether it is a call the model
/// made (a `function_call` item, written as `format` writes calls); `None`
/// for a `reasoning` item, which clients send back with a turn's output and
/// which the prompt leaves out (as reasoning models' templates leave out
/// earlier turns' thinking).
fn input_item(i: usize, item: &Value) -> Result<Option<(ChatMessage, bool)>, FieldError> {
    let name = format!("input[{i}]");
    let Value::Object(m) = item else {
        return Err(FieldError::new(
            name,
            format!("must be an object, got {}", json::type_name(item)),
        ));
    };
    let prefix = format!("{name}.");
    let f = Fields::new(m, &prefix);
    match f.str("type")?.unwrap_or("message") {
        "message" => {
            let role = match f.req_str("role")? {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "system" | "developer" => Role::System,
                other => {
                    return Err(FieldError::new(
                        format!("{name}.role"),
                        format!("must be user, assistant, system or developer, got `{other}`"),
                    ))
                }
            };
            let content = match f.raw("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts_text(&name, parts)?,
                Some(other) => {
                    return Err(FieldError::new(
                        format!("{name}.content"),
                        format!(
                            "must be a string or an array of parts, got {}",
                            json::type_name(other)
                        ),
                    ))
                }
                None => return Err(FieldError::new(format!("{name}.content"), "is required")),
            };
            Ok(Some((ChatMessage::new(role, content), false)))
        }
        "reasoning" => Ok(None),
        "function_call" => {
            let call = HistoryCall {
                id: f.str("call_id")?.unwrap_or_default().to_string(),
                name: f.req_str("name")?.to_string(),
                arguments: f.req_str("arguments")?.to_string(),
            };
            Ok(Some((
                ChatMessage {
                    tool_calls: vec![call],
                    ..ChatMessage::new(Role::Assistant, "")
                },
                true,
            )))
        }
        "function_call_output" => {
            let output = match f.raw("output") {
                Some(Value::String(s)) => s.clone(),
                // Output given as content parts: their text.
                Some(Value::Array(parts)) => parts_text(&name, parts)?,
                _ => return Err(FieldError::new(format!("{name}.output"), "must be a string")),
            };
            Ok(Some((
                ChatMessage {
                    tool_call_id: f.str("call_id")?.map(str::to_string),
                    ..ChatMessage::new(Role::Tool, output)
                },
                false,
            )))
        }
        other => Err(FieldError::new(
            format!("{name}.type"),
            format!("`{other}` items are not supported; send messages, function_call, function_call_output or reasoning"),
        )),
    }
}

/// The text of an item's content parts, joined.
fn parts_text(item: &str, parts: &[Value]) -> Result<String, FieldError> {
    parts
        .iter()
        .enumerate()
        .map(|(j, p)| content_part(item, j, p))
        .collect::<Result<Vec<_>, _>>()
        .map(|t| t.concat())
}

fn content_part(item: &str, j: usize, p: &Value) -> Result<String, FieldError> {
    let name = format!("{item}.content[{j}]");
    let Value::Object(m) = p else {
        return Err(FieldError::new(
            name,
            format!("must be an object, got {}", json::type_name(p)),
        ));
    };
    let prefix = format!("{name}.");
    let f = Fields::new(m, &prefix);
    match f.req_str("type")? {
        "input_text" | "output_text" | "text" => Ok(f.req_str("text")?.to_string()),
        other => Err(FieldError::new(
            format!("{name}.type"),
            format!("`{other}` parts are not supported by this text model; send input_text"),
        )),
    }
}

/// The error event: `{type: "error", status, error: {type, code, message, param}}`.
pub fn error_event(status: u16, code: &str, message: &str, param: Option<&str>) -> Value {
    json!({
        "type": "error",
        "status": status,
        "error": error_object(status, code, message, param),
    })
}

/// The `error` object of an error event and of an HTTP error body (the
/// OpenAI dialects' one shape).
pub use crate::dialect::openai::error_object;

/// Token counts of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Of those, tokens whose K/V came from the prefix cache.
    pub cached_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Of those, tokens up to the end of the reasoning (with a reasoning
    /// parser).
    pub reasoning_tokens: u32,
}

impl Usage {
    /// The SDK's usage shape (`cache_write_tokens` is required by the
    /// official SDK's strict types, beyond PROTOCOLS.md's list).
    pub fn to_json(self) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        })
    }
}

/// A reasoning text part.
pub fn reasoning_part(text: &str) -> Value {
    json!({"type": "reasoning_text", "text": text})
}

/// A reasoning item: its text as one part (none while in progress).
pub fn reasoning_item(id: &str, status: &str, text: Option<&str>) -> Value {
    json!({
        "type": "reasoning",
        "id": id,
        "summary": [],
        "content": text.map(|t| vec![reasoning_part(t)]).unwrap_or_default(),
        "status": status,
    })
}

/// An output text part.
pub fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

/// Log-probability entries as the text events carry them
/// (`response.output_text.delta` and `.done`): without the `bytes` the
/// content part's entries have, at either level.
pub fn event_logprobs(entries: &[Value]) -> Vec<Value> {
    let strip = |e: &Value| {
        let mut e = e.clone();
        if let Some(o) = e.as_object_mut() {
            o.remove("bytes");
        }
        e
    };
    entries
        .iter()
        .map(|e| {
            let mut out = strip(e);
            if let Some(top) = e["top_logprobs"].as_array() {
                out["top_logprobs"] = top.iter().map(strip).collect();
            }
            out
        })
        .collect()
}

/// A Response object with its text parts' logprobs emptied: what the
/// store keeps, which is bounded by count, so that a response's size there
/// is its text's (up to 21 alternatives per token would be many times it).
pub fn without_logprobs(mut object: Value) -> Value {
    for item in object["output"].as_array_mut().into_iter().flatten() {
        for part in item["content"].as_array_mut().into_iter().flatten() {
            if part["type"] == "output_text" {
                part["logprobs"] = json!([]);
            }
        }
    }
    object
}

/// An assistant message item.
pub fn message_item(id: &str, status: &str, text: Option<(&str, &[Value])>) -> Value {
    json!({
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": status,
        "content": text.map_or_else(Vec::new, |(t, lp)| vec![text_part(t, lp)]),
    })
}

/// The terminal event type for a Response `status`.
pub fn terminal_event_type(status: &str) -> &'static str {
    match status {
        "completed" => "response.completed",
        "failed" => "response.failed",
        _ => "response.incomplete",
    }
}

/// True for the event types that end a response.
pub fn is_terminal(kind: &str) -> bool {
    matches!(
        kind,
        "response.completed" | "response.incomplete" | "response.failed"
    )
}
