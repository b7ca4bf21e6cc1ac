//! The `batch` dialect's codec: the queue-generation payload and the event
//! arrays of PROTOCOLS.md's `batch` section as Rust types, both ways (the
//! server decodes [`Payload`]s and encodes [`Event`] arrays; tests and the
//! simulator use the other two). `decode(encode(x)) == x` for both.
//!
//! `generation_config` stays a JSON object here: its meaning depends on the
//! server's defaults and the served model, so the dialect checks it.

use serde_json::{json, Map, Value};

use crate::json::{self, Fields};

/// Keys of `generation_config` the server reads.
pub const CONFIG_KEYS: [&str; 9] = [
    "early_stopping",
    "num_beams",
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "repetition_penalty",
    "length_penalty",
];

/// One prompt of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptEntry {
    /// The client's id for it (also its part of the continue-generation key).
    pub request_id: String,
    /// The raw prompt (ignored when the batch continues a cached one).
    pub prompt: String,
}

/// A queue-generation payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    /// The prompts, in order.
    pub prompts: Vec<PromptEntry>,
    /// Return only the new text (default true), or the prompt and the text.
    pub only_new_tokens: bool,
    /// Stream PROGRESS events (default true).
    pub stream_response: bool,
    /// `generation_config` as sent.
    pub generation_config: Map<String, Value>,
}

/// Why a payload cannot be queued; every prompt it names gets the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadError {
    /// The request ids the payload names, in order (empty: none readable).
    pub request_ids: Vec<String>,
    /// What was wrong, naming the field.
    pub message: String,
}

/// What an event says.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// Validated and queued.
    Accepted,
    /// Picked up by the scheduler.
    Started,
    /// Prefill done; `text` is "" or the prompt, as `only_new_tokens` says.
    Initialized {
        /// "" or the prompt.
        text: String,
    },
    /// A new token's text.
    Progress {
        /// Its text.
        text: String,
    },
    /// Generation done.
    Complete {
        /// The generated text (with the prompt first unless `only_new_tokens`).
        text: String,
        /// Whether an end-of-sequence token ended it.
        is_eos: bool,
        /// Tokens generated.
        new_tokens_count: u32,
        /// Seconds from start to end.
        execution_time: f64,
    },
    /// Something went wrong for this prompt.
    Error {
        /// What.
        error: String,
    },
}

impl EventKind {
    /// The event's `type` on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::Accepted => "ACCEPTED",
            EventKind::Started => "STARTED",
            EventKind::Initialized { .. } => "INITIALIZED",
            EventKind::Progress { .. } => "PROGRESS",
            EventKind::Complete { .. } => "COMPLETE",
            EventKind::Error { .. } => "ERROR",
        }
    }
}

/// One element of a server frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The prompt it concerns (`None` only for an ERROR of a payload that
    /// names no prompt).
    pub request_id: Option<String>,
    /// What it says.
    pub kind: EventKind,
}

/// The request ids a payload names, or none when it holds more than
/// `max_prompts` prompts: an ERROR per id is then no longer an answer but
/// an amplifier, and one ERROR with a null id says it all.
fn named_ids(v: &Value, max_prompts: usize) -> Vec<String> {
    v.get("prompts")
        .and_then(Value::as_array)
        .filter(|items| items.len() <= max_prompts)
        .map(|items| {
            items
                .iter()
                .filter_map(|p| p.get("request_id").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Decodes a client frame into a payload of at most `max_prompts` prompts.
pub fn decode_payload(text: &str, max_prompts: usize) -> Result<Payload, PayloadError> {
    let v = json::parse(text).map_err(|message| PayloadError {
        request_ids: Vec::new(),
        message,
    })?;
    let fail = |message: String| PayloadError {
        request_ids: named_ids(&v, max_prompts),
        message,
    };
    let Value::Object(obj) = &v else {
        return Err(fail(format!(
            "a payload must be a JSON object, got {}",
            json::type_name(&v)
        )));
    };
    let f = Fields::new(obj, "");
    let items = f
        .array("prompts")
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail("invalid `prompts`: is required".into()))?;
    if items.is_empty() {
        return Err(fail("invalid `prompts`: must not be empty".into()));
    }
    if items.len() > max_prompts {
        return Err(fail(format!(
            "invalid `prompts`: {} prompts, more than the {max_prompts} one payload may hold; split them over several payloads",
            items.len()
        )));
    }
    let mut prompts = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(p) = item else {
            return Err(fail(format!(
                "invalid `prompts[{i}]`: must be an object, got {}",
                json::type_name(item)
            )));
        };
        let prefix = format!("prompts[{i}].");
        let pf = Fields::new(p, &prefix);
        let request_id = pf.req_str("request_id").map_err(|e| fail(e.to_string()))?;
        if request_id.is_empty() {
            return Err(fail(format!(
                "invalid `prompts[{i}].request_id`: must not be empty"
            )));
        }
        let prompt = pf.req_str("prompt").map_err(|e| fail(e.to_string()))?;
        prompts.push(PromptEntry {
            request_id: request_id.to_string(),
            prompt: prompt.to_string(),
        });
    }
    Ok(Payload {
        prompts,
        only_new_tokens: f
            .bool("only_new_tokens")
            .map_err(|e| fail(e.to_string()))?
            .unwrap_or(true),
        stream_response: f
            .bool("stream_response")
            .map_err(|e| fail(e.to_string()))?
            .unwrap_or(true),
        generation_config: f
            .obj("generation_config")
            .map_err(|e| fail(e.to_string()))?
            .cloned()
            .unwrap_or_default(),
    })
}

/// Encodes a payload.
pub fn encode_payload(p: &Payload) -> String {
    let prompts: Vec<Value> = p
        .prompts
        .iter()
        .map(|e| json!({"request_id": e.request_id, "prompt": e.prompt}))
        .collect();
    json!({
        "prompts": prompts,
        "only_new_tokens": p.only_new_tokens,
        "stream_response": p.stream_response,
        "generation_config": p.generation_config,
    })
    .to_string()
}

fn event_json(e: &Event) -> Value {
    let mut m = Map::new();
    m.insert("request_id".into(), json!(e.request_id));
    m.insert("type".into(), json!(e.kind.as_str()));
    match &e.kind {
        EventKind::Accepted | EventKind::Started => {}
        EventKind::Initialized { text } | EventKind::Progress { text } => {
            m.insert("text".into(), json!(text));
        }
        EventKind::Complete {
            text,
            is_eos,
            new_tokens_count,
            execution_time,
        } => {
            m.insert("text".into(), json!(text));
            m.insert("is_eos".into(), json!(is_eos));
            m.insert("new_tokens_count".into(), json!(new_tokens_count));
            m.insert("execution_time".into(), json!(execution_time));
        }
        EventKind::Error { error } => {
            m.insert("error".into(), json!(error));
        }
    }
    Value::Object(m)
}

/// Encodes a server frame: the events as a JSON array.
pub fn encode_events(events: &[Event]) -> String {
    Value::Array(events.iter().map(event_json).collect()).to_string()
}

/// Decodes a server frame (for clients, tests and the simulator); the error
/// says what does not match the contract.
pub fn decode_events(text: &str) -> Result<Vec<Event>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let items = v.as_array().ok_or("a server frame must be a JSON array")?;
    if items.is_empty() {
        return Err("a server frame must not be an empty array".into());
    }
    items
        .iter()
        .map(|item| {
            let o = item.as_object().ok_or("an event must be an object")?;
            let request_id = match o.get("request_id") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Null) => None,
                _ => return Err("`request_id` must be a string or null".to_string()),
            };
            let s = |k: &str| -> Result<String, String> {
                o.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("`{k}` missing or not a string"))
            };
            let kind = match s("type")?.as_str() {
                "ACCEPTED" => EventKind::Accepted,
                "STARTED" => EventKind::Started,
                "INITIALIZED" => EventKind::Initialized { text: s("text")? },
                "PROGRESS" => EventKind::Progress { text: s("text")? },
                "COMPLETE" => EventKind::Complete {
                    text: s("text")?,
                    is_eos: o
                        .get("is_eos")
                        .and_then(Value::as_bool)
                        .ok_or("`is_eos` missing")?,
                    new_tokens_count: o
                        .get("new_tokens_count")
                        .and_then(Value::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or("`new_tokens_count` missing")?,
                    execution_time: o
                        .get("execution_time")
                        .and_then(Value::as_f64)
                        .ok_or("`execution_time` missing")?,
                },
                "ERROR" => EventKind::Error { error: s("error")? },
                other => return Err(format!("unknown event type `{other}`")),
            };
            if request_id.is_none() && !matches!(kind, EventKind::Error { .. }) {
                return Err("only an ERROR may have a null request_id".into());
            }
            Ok(Event { request_id, kind })
        })
        .collect()
}
