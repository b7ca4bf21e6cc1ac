//! A reference model of how the `generate` dialect answers one client frame,
//! written from PROTOCOLS.md alone (it shares no code with the core), for the
//! [`super::replies`] checker: given the frame and what the connection has
//! in flight, what the first reply must be.

use serde_json::{Map, Value};

use super::view::{ReqView, Sampling};
use crate::invariants::view::SentFrame;

/// Deepest JSON nesting accepted.
const MAX_DEPTH: usize = 64;
/// Longest feedback text in bytes.
const MAX_FEEDBACK_TEXT: usize = 4096;

/// What the first reply to a frame must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// An `error` with this code and `recoverable`, whose message names one
    /// of `fields` (any message when empty).
    Error {
        /// The error code.
        code: &'static str,
        /// Its `recoverable`.
        recoverable: bool,
        /// Field names the message must mention one of.
        fields: Vec<String>,
    },
    /// A new request (`init`), or one of these refusals.
    Start {
        /// Error codes that may come instead of the `init` (with the
        /// recovery action they must carry, if it is known).
        refusals: Vec<(&'static str, Option<&'static str>)>,
    },
    /// One of these refusals, never an `init`.
    Refused {
        /// Error codes and recovery actions that may come.
        refusals: Vec<(&'static str, Option<&'static str>)>,
    },
    /// A `status` with this operation for the request in flight; a
    /// `modified` ack's `parameters` must equal `params`.
    Status {
        /// The operation.
        op: &'static str,
        /// The request it names (`None`: no `request_id` field).
        request_id: Option<String>,
        /// Expected effective parameters of a `modified` ack.
        params: Option<Map<String, Value>>,
    },
    /// The stopped request's last `token` (`finished`, `cancelled`).
    Stopped,
}

/// The Host's feedback bucket of one connection, as the acks tell it:
/// [`tokenwire_core::dialect::generate::FEEDBACK_PER_MINUTE`] units, full at
/// first, refilled continuously at that many a minute.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FeedbackMeter {
    /// Units held, scaled by a minute in nanoseconds; `None` before the first.
    scaled: Option<(i128, tokenwire_core::Instant)>,
}

const MINUTE_NS: i128 = 60_000_000_000;

impl FeedbackMeter {
    fn per_minute() -> i128 {
        i128::from(tokenwire_core::dialect::generate::FEEDBACK_PER_MINUTE)
    }

    fn refilled(&self, now: tokenwire_core::Instant) -> i128 {
        let cap = Self::per_minute() * MINUTE_NS;
        match self.scaled {
            None => cap,
            Some((units, at)) => {
                let elapsed = i128::from((now - at).as_nanos() as u64);
                (units + elapsed * Self::per_minute()).min(cap)
            }
        }
    }

    /// True when a feedback at `now` finds a unit.
    pub fn allows(&self, now: tokenwire_core::Instant) -> bool {
        self.refilled(now) >= MINUTE_NS
    }

    /// A feedback was acknowledged at `now`.
    pub fn take(&mut self, now: tokenwire_core::Instant) {
        self.scaled = Some((self.refilled(now) - MINUTE_NS, now));
    }
}

/// What the model needs to know about the connection and the server.
pub struct State<'a> {
    /// The request in flight, and its id.
    pub current: Option<(&'a str, &'a ReqView)>,
    /// The last request started on the connection.
    pub last_request: Option<&'a str>,
    /// The served model's name.
    pub model: &'a str,
    /// Its context length.
    pub context_len: u64,
    /// `max_tokens` when a config gives none.
    pub default_max_tokens: u64,
    /// Tokens per KV block and blocks in the pool.
    pub block_size: u64,
    /// Blocks in the pool.
    pub num_blocks: u64,
    /// Shutdown has begun.
    pub shutting_down: bool,
    /// The queue may be full (as many requests in flight as it holds).
    pub queue_may_be_full: bool,
    /// The connection's feedback bucket holds a unit.
    pub feedback_allowed: bool,
    /// The config's prompt came back from the tokenizer failed in this
    /// event, for a reason other than length.
    pub text_failed: bool,
}

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn err(code: &'static str, recoverable: bool, fields: &[&str]) -> Expect {
    Expect::Error {
        code,
        recoverable,
        fields: fields.iter().map(|f| f.to_string()).collect(),
    }
}

fn invalid(fields: &[&str]) -> Expect {
    err("invalid_request", true, fields)
}

/// A field that is present and not `null`.
fn field<'v>(m: &'v Map<String, Value>, k: &str) -> Option<&'v Value> {
    m.get(k).filter(|v| !v.is_null())
}

/// The parameter fields of `p` that are invalid, by name (without prefix).
fn bad_params(p: &Map<String, Value>, context_len: u64) -> Vec<&'static str> {
    let mut bad = Vec::new();
    let num = |k: &str| field(p, k).map(|v| v.as_f64());
    let uint = |k: &str| field(p, k).map(|v| v.as_u64());
    match uint("max_tokens") {
        Some(Some(n)) if (1..=context_len).contains(&n) => {}
        None => {}
        _ => bad.push("max_tokens"),
    }
    match num("temperature") {
        Some(Some(t)) if (0.0..=2.0).contains(&(t as f32)) => {}
        None => {}
        _ => bad.push("temperature"),
    }
    match num("top_p") {
        Some(Some(t)) if t > 0.0 && t <= 1.0 && (t as f32).is_normal() => {}
        None => {}
        _ => bad.push("top_p"),
    }
    if let Some(None) = uint("top_k") {
        bad.push("top_k");
    }
    match num("repetition_penalty") {
        Some(Some(r)) if r > 0.0 && (r as f32).is_normal() => {}
        None => {}
        _ => bad.push("repetition_penalty"),
    }
    if let Some(stop) = field(p, "stop") {
        let items: Option<Vec<&Value>> = match stop {
            Value::String(_) => Some(vec![stop]),
            Value::Array(a) if a.len() <= 8 => Some(a.iter().collect()),
            _ => None,
        };
        let ok = items.is_some_and(|items| {
            items
                .iter()
                .all(|s| s.as_str().is_some_and(|s| !s.is_empty() && s.len() <= 256))
        });
        if !ok {
            bad.push("stop");
        }
    }
    if let Some(None) = uint("seed") {
        bad.push("seed");
    }
    match uint("top_logprobs") {
        Some(Some(n)) if n <= 20 => {}
        None => {}
        _ => bad.push("top_logprobs"),
    }
    bad
}

fn prefixed(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| format!("parameters.{n}")).collect()
}

/// The first reply `frame` must get, or `None` when the model cannot tell.
pub fn expect(frame: &SentFrame, st: &State<'_>) -> Option<Expect> {
    if frame.binary {
        return Some(invalid(&["binary"]));
    }
    let first = frame.first;
    // The first frame must be a config: anything else is refused for good.
    let reject_first = || Some(err("invalid_request", false, &[]));
    let m = match &frame.v {
        Value::Object(m) if depth(&frame.v) <= MAX_DEPTH => m,
        // Not JSON, too deep, or not an object (text the view did not parse
        // because it is huge is not judged).
        Value::Null if frame.len > 1 << 16 => return None,
        _ if first => return reject_first(),
        _ => return Some(invalid(&[])),
    };
    let kind = match field(m, "type") {
        Some(Value::String(k)) => k.as_str(),
        _ if first => return reject_first(),
        _ => return Some(invalid(&["type"])),
    };
    match kind {
        "config" => config(m, st),
        _ if first && matches!(kind, "control" | "feedback") => {
            // Decode errors of these come first, but the answer is refusal either way.
            reject_first()
        }
        "control" => control(m, st),
        "feedback" => feedback(m, st),
        _ if first => reject_first(),
        _ => Some(invalid(&["type"])),
    }
}

fn config(m: &Map<String, Value>, st: &State<'_>) -> Option<Expect> {
    let prompt = match field(m, "prompt") {
        Some(Value::String(p)) => p,
        _ => return Some(invalid(&["prompt"])),
    };
    let model = match field(m, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Some(invalid(&["model"])),
    };
    let params = match field(m, "parameters") {
        None => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => return Some(invalid(&["parameters"])),
    };
    if let Some(o) = field(m, "options") {
        let Value::Object(o) = o else {
            return Some(invalid(&["options"]));
        };
        let names = [
            "stream",
            "echo_prompt",
            "include_token_ids",
            "include_logprobs",
            "include_timing",
            "include_generated_text",
        ];
        let bad: Vec<String> = names
            .iter()
            .filter(|n| field(o, n).is_some_and(|v| !v.is_boolean()))
            .map(|n| format!("options.{n}"))
            .collect();
        if !bad.is_empty() {
            return Some(Expect::Error {
                code: "invalid_request",
                recoverable: true,
                fields: bad,
            });
        }
    }
    if st.current.is_some() {
        return Some(invalid(&[]));
    }
    if model.is_some_and(|name| name != st.model) {
        return Some(invalid(&["model"]));
    }
    let bad = bad_params(&params, st.context_len);
    if !bad.is_empty() {
        return Some(Expect::Error {
            code: "invalid_request",
            recoverable: true,
            fields: prefixed(&bad),
        });
    }
    if st.text_failed {
        // Tokenizing was the last step before the length checks.
        return Some(Expect::Error {
            code: "invalid_request",
            recoverable: true,
            fields: vec!["prompt".into()],
        });
    }
    let max_tokens = params
        .get("max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(st.default_max_tokens);
    // The byte tokenizer: one token per byte, after the BOS.
    let bytes = prompt.len() as u64;
    let prompt_tokens = bytes + 1;
    let mut refusals = Vec::new();
    if bytes + max_tokens > st.context_len {
        let action = if bytes >= st.context_len {
            "shorten_prompt"
        } else {
            "reduce_max_tokens"
        };
        return Some(Expect::Start {
            refusals: vec![("context_length_exceeded", Some(action))],
        });
    }
    // Then the start itself: shutdown, the exact length, the queue, the pool.
    if st.shutting_down {
        return Some(Expect::Start {
            refusals: vec![("internal_error", Some("retry"))],
        });
    }
    if prompt_tokens + max_tokens > st.context_len {
        let action = if prompt_tokens >= st.context_len {
            "shorten_prompt"
        } else {
            "reduce_max_tokens"
        };
        return Some(Expect::Start {
            refusals: vec![("context_length_exceeded", Some(action))],
        });
    }
    if st.queue_may_be_full {
        refusals.push(("memory_pressure", Some("retry")));
    }
    let needed = (prompt_tokens + max_tokens).div_ceil(st.block_size.max(1));
    if needed > st.num_blocks {
        refusals.push(("memory_pressure", Some("reduce_max_tokens")));
        return Some(Expect::Refused { refusals });
    }
    Some(Expect::Start { refusals })
}

fn control(m: &Map<String, Value>, st: &State<'_>) -> Option<Expect> {
    let action = match field(m, "action") {
        Some(Value::String(a)) => a.as_str(),
        _ => return Some(invalid(&["action"])),
    };
    if !["stop", "pause", "resume", "regenerate", "modify"].contains(&action) {
        return Some(invalid(&["action"]));
    }
    let params = match field(m, "parameters") {
        None => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return Some(invalid(&["parameters"])),
    };
    let Some((rid, r)) = st.current else {
        return Some(invalid(&[]));
    };
    let status = |op| {
        Some(Expect::Status {
            op,
            request_id: Some(rid.to_string()),
            params: None,
        })
    };
    match action {
        "stop" => Some(Expect::Stopped),
        "pause" => status("paused"),
        "resume" if r.paused_at.is_none() => Some(invalid(&[])),
        "resume" => status("resumed"),
        "regenerate" => Some(Expect::Start {
            refusals: vec![("memory_pressure", None), ("internal_error", None)],
        }),
        _ => modify(params, rid, r, st),
    }
}

fn modify(
    params: Option<&Map<String, Value>>,
    rid: &str,
    r: &ReqView,
    st: &State<'_>,
) -> Option<Expect> {
    let Some(p) = params else {
        return Some(invalid(&["parameters"]));
    };
    if !r.config.known {
        return None;
    }
    let bad = bad_params(p, st.context_len);
    if !bad.is_empty() {
        return Some(Expect::Error {
            code: "invalid_request",
            recoverable: true,
            fields: prefixed(&bad),
        });
    }
    let max_tokens = p
        .get("max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(u64::from(r.config.max_tokens));
    let produced = u64::from(r.token_frames);
    let prompt_tokens = r.config.prompt.len() as u64 + 1;
    let never_fits = (prompt_tokens + max_tokens).div_ceil(st.block_size.max(1)) > st.num_blocks;
    if max_tokens <= produced || prompt_tokens + max_tokens > st.context_len || never_fits {
        return Some(invalid(&["parameters.max_tokens"]));
    }
    let s: Sampling = r.config.sampling.with(&Value::Object(p.clone()));
    let stops: Vec<String> = match p.get("stop") {
        Some(v) if !v.is_null() => super::view::stops_of(v),
        _ => r.config.stops.clone(),
    };
    let mut want = Map::new();
    want.insert("max_tokens".into(), max_tokens.into());
    want.insert("temperature".into(), shortest(s.temperature));
    want.insert("top_p".into(), shortest(s.top_p));
    want.insert("top_k".into(), s.top_k.into());
    want.insert("repetition_penalty".into(), shortest(s.repetition_penalty));
    want.insert("stop".into(), stops.into());
    if let Some(seed) = p.get("seed").and_then(Value::as_u64).or(r.config.seed) {
        want.insert("seed".into(), seed.into());
    }
    want.insert("top_logprobs".into(), s.top_logprobs.into());
    Some(Expect::Status {
        op: "modified",
        request_id: Some(rid.to_string()),
        params: Some(want),
    })
}

/// An f32 as the shortest decimal that reads back to it, as a JSON number.
fn shortest(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn feedback(m: &Map<String, Value>, st: &State<'_>) -> Option<Expect> {
    let ok_rating = field(m, "rating")
        .and_then(Value::as_f64)
        .is_some_and(|r| (-1.0..=1.0).contains(&r));
    if !ok_rating {
        return Some(invalid(&["rating"]));
    }
    match field(m, "text") {
        None => {}
        Some(Value::String(t)) if t.len() <= MAX_FEEDBACK_TEXT => {}
        Some(_) => return Some(invalid(&["text"])),
    }
    if field(m, "position").is_some_and(|p| p.as_u64().is_none()) {
        return Some(invalid(&["position"]));
    }
    if !st.feedback_allowed {
        return Some(err("rate_limited", true, &[]));
    }
    let request_id = st
        .current
        .map(|(rid, _)| rid)
        .or(st.last_request)
        .map(str::to_string);
    Some(Expect::Status {
        op: "feedback_received",
        request_id,
        params: None,
    })
}

/// Checks reply `f` (a parsed frame) against `e`; the violation, if any.
pub fn judge(e: &Expect, f: &Value) -> Result<(), String> {
    let kind = f["type"].as_str().unwrap_or("");
    let error_ok = |code: &str, recoverable: Option<bool>, fields: &[String]| {
        kind == "error"
            && f["error"] == code
            && recoverable.is_none_or(|r| f["recoverable"] == r)
            && (fields.is_empty()
                || fields
                    .iter()
                    .any(|n| f["message"].as_str().unwrap_or("").contains(n.as_str())))
    };
    let ok = match e {
        Expect::Error {
            code,
            recoverable,
            fields,
        } => error_ok(code, Some(*recoverable), fields),
        Expect::Start { refusals } | Expect::Refused { refusals } => {
            (kind == "init" && matches!(e, Expect::Start { .. }))
                || refusals.iter().any(|(code, action)| {
                    error_ok(code, Some(true), &[])
                        && action.is_none_or(|a| f["recovery_action"] == a)
                })
        }
        Expect::Status {
            op,
            request_id,
            params,
        } => {
            kind == "status"
                && f["operation"] == *op
                && f.get("request_id").and_then(Value::as_str) == request_id.as_deref()
                && params.as_ref().is_none_or(|want| {
                    let got = &f["parameters"];
                    want.iter().all(|(k, v)| &got[k] == v)
                })
        }
        Expect::Stopped => {
            kind == "token" && f["finished"] == true && f["finish_reason"] == "cancelled"
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("expected {e:?}"))
    }
}
