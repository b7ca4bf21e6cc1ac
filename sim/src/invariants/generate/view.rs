//! The `generate` side of the view: each request, from its `init` to its
//! terminal event, with what it asked for and what it was sent.
//!
//! A request starts at its `init` (its config is the config frame that was
//! being handled, or the running request's config for a `regenerate`), streams
//! `token` frames, and ends with its terminal event: `completion`, or an
//! `error` carrying `generated_text` (a failure). A `regenerate` supersedes the
//! running request, which then never gets a terminal event (the protocol says
//! its completion is not sent). Requests live in [`View::requests`], the one
//! in flight on a connection in its [`ConnView`](crate::invariants::view::ConnView)'s
//! `current`.

use serde_json::Value;
use tokenwire_core::{ConnId, Instant, TokenId};

use crate::invariants::view::View;
use crate::invariants::Frame;

/// What a request asked for (as far as the checkers need it).
#[derive(Debug, Clone, PartialEq)]
pub struct ReqConfig {
    /// False when no config frame could be matched to its `init` (the exact
    /// checks are then skipped).
    pub known: bool,
    /// The prompt as sent.
    pub prompt: String,
    /// Effective `max_tokens`.
    pub max_tokens: u32,
    /// Effective stop strings.
    pub stops: Vec<String>,
    /// `options.echo_prompt`.
    pub echo: bool,
    /// `options.include_logprobs`.
    pub logprobs: bool,
    /// Effective sampling values (from the config, then `modified` acks):
    /// temperature, top_p, top_k, repetition_penalty, top_logprobs.
    pub sampling: Sampling,
    /// The seed, when the client gave one (a drawn seed is not known).
    pub seed: Option<u64>,
}

/// Sampling values as the client set them (f32, as the server keeps them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Temperature.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k (0 = off).
    pub top_k: u64,
    /// Repetition penalty.
    pub repetition_penalty: f32,
    /// Alternatives with logprobs.
    pub top_logprobs: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            repetition_penalty: 1.0,
            top_logprobs: 5,
        }
    }
}

impl Sampling {
    /// These values with the fields present in `p` (a valid parameters object).
    pub fn with(mut self, p: &Value) -> Sampling {
        let f = |k: &str| p.get(k).and_then(Value::as_f64);
        if let Some(x) = f("temperature") {
            self.temperature = x as f32;
        }
        if let Some(x) = f("top_p") {
            self.top_p = x as f32;
        }
        if let Some(x) = p.get("top_k").and_then(Value::as_u64) {
            self.top_k = x.min(u64::from(u32::MAX));
        }
        if let Some(x) = f("repetition_penalty") {
            self.repetition_penalty = x as f32;
        }
        if let Some(x) = p.get("top_logprobs").and_then(Value::as_u64) {
            self.top_logprobs = x;
        }
        self
    }
}

impl ReqConfig {
    /// The config of a request whose config frame is unknown.
    pub fn unknown() -> ReqConfig {
        ReqConfig {
            known: false,
            prompt: String::new(),
            max_tokens: u32::MAX,
            stops: Vec::new(),
            echo: false,
            logprobs: false,
            sampling: Sampling::default(),
            seed: None,
        }
    }

    /// Reads a `config` frame (already accepted by the Host, so well formed).
    pub fn from_config(v: &Value, default_max_tokens: u32) -> ReqConfig {
        let p = &v["parameters"];
        ReqConfig {
            known: true,
            prompt: v["prompt"].as_str().unwrap_or("").to_string(),
            max_tokens: p["max_tokens"]
                .as_u64()
                .map_or(default_max_tokens, |m| m.min(u64::from(u32::MAX)) as u32),
            stops: stops_of(&p["stop"]),
            echo: v["options"]["echo_prompt"].as_bool().unwrap_or(false),
            logprobs: v["options"]["include_logprobs"].as_bool().unwrap_or(false),
            sampling: Sampling::default().with(p),
            seed: p["seed"].as_u64(),
        }
    }
}

/// Stop strings of a `stop` value (a string or an array of strings).
pub fn stops_of(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// One `generate` request.
#[derive(Debug, Clone, PartialEq)]
pub struct ReqView {
    /// Its connection.
    pub conn: ConnId,
    /// What it asked for (updated by `modified` acks).
    pub config: ReqConfig,
    /// Concatenation of its `token` texts.
    pub streamed: String,
    /// Where the current stop strings started to apply in `streamed`.
    pub stops_from: usize,
    /// `token` frames received.
    pub token_frames: u32,
    /// When the `paused` ack came (until `resumed`).
    pub paused_at: Option<Instant>,
    /// The step outstanding when it was paused (its tokens may still come).
    pub pause_grace_step: Option<u64>,
    /// Terminal events seen.
    pub terminals: u32,
    /// Replaced by a `regenerate` (no terminal event is due).
    pub superseded: bool,
    /// When its `init` came.
    pub started_at: Instant,
    /// Tokens the engine sampled for its sequence, in order (from `StepDone`).
    pub sampled: Vec<TokenId>,
    /// `token` frames that carried a `token_id`.
    pub ids_streamed: u32,
    /// The engine has been handed its sequence.
    pub planned: bool,
    /// It was told a `queued` position (so it waits in the scheduler's
    /// queue until the engine is handed it).
    pub told_queued: bool,
    /// It had stop strings at some point (which may cut its text short at
    /// any end: text held back is matched against the current ones).
    pub had_stops: bool,
}

/// A frame received while the model loads, or the one being handled.
#[derive(Debug, Clone, PartialEq)]
pub enum Pending {
    /// A config (or a regenerate's copy of the running config).
    Config(ReqConfig),
    /// A regenerate that arrived while the connection's frames were held: it
    /// replaces whichever request is in flight when it is handled.
    Regenerate,
    /// Anything else.
    Other,
}

/// The tally key of a frame to a `generate` connection (coverage, not
/// checks): `completion:<finish_reason>`, `error:<code>` (`:failure` for a
/// failed generation), `status:<operation>`, `init`.
pub fn tally_key(f: &Frame) -> Option<String> {
    match f.kind() {
        "completion" => Some(format!(
            "completion:{}",
            f.str("finish_reason").unwrap_or("?")
        )),
        "error" => Some(format!(
            "error:{}{}",
            f.str("error").unwrap_or("?"),
            if f.is_failure() { ":failure" } else { "" }
        )),
        "status" => Some(format!("status:{}", f.str("operation").unwrap_or("?"))),
        "init" => Some("init".into()),
        _ => None,
    }
}

impl View {
    /// What a text frame from `generate` connection `conn` is; a
    /// `regenerate` supersedes the running request here.
    pub(crate) fn classify_generate(&mut self, conn: ConnId, text: &str) -> Pending {
        if !text.starts_with('{') || text.len() > 1 << 16 {
            return Pending::Other;
        }
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Pending::Other;
        };
        match (v["type"].as_str(), v["action"].as_str()) {
            (Some("config"), _) if v["prompt"].is_string() => {
                Pending::Config(ReqConfig::from_config(&v, self.default_max_tokens))
            }
            (Some("control"), Some("regenerate")) => {
                let loaded = self.loaded;
                let Some(c) = self.conns.get_mut(&conn) else {
                    return Pending::Other;
                };
                if !loaded || !c.text_jobs.is_empty() || !c.pending.is_empty() {
                    // Held: it acts on the request in flight when it is handled.
                    return Pending::Regenerate;
                }
                let Some(rid) = c.current.take() else {
                    return Pending::Other;
                };
                match self.requests.get_mut(&rid) {
                    Some(r) => {
                        r.superseded = true;
                        Pending::Config(r.config.clone())
                    }
                    None => Pending::Other,
                }
            }
            _ => Pending::Other,
        }
    }

    /// A frame to `generate` connection `conn`: requests start at `init`,
    /// stream `token`s, end at their terminal event, and take the `status`
    /// acks (queued, paused, resumed, modified) in.
    pub(crate) fn on_generate_frame(&mut self, now: Instant, conn: ConnId, f: &Frame) {
        let step = self.step.as_ref().map(|s| s.id);
        let replaying = self.replaying(conn);
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let first_reply = match f.kind() {
            "init" | "error" | "token" => true,
            "status" => !matches!(f.str("operation"), Some("queued" | "model_loading")),
            _ => false,
        };
        // While held frames are handled, each first reply answers one of them.
        let answered = if replaying && first_reply {
            c.pending.pop_front().map(|h| h.kind)
        } else {
            None
        };
        match f.kind() {
            "init" => {
                let Some(rid) = f.request_id() else { return };
                let mut config = ReqConfig::unknown();
                let answered = if replaying {
                    answered
                } else {
                    let mut found = None;
                    while let Some(p) = c.pending.pop_front() {
                        if matches!(p.kind, Pending::Config(_) | Pending::Regenerate) {
                            found = Some(p.kind);
                            break;
                        }
                    }
                    found
                };
                match answered {
                    Some(Pending::Config(cfg)) => config = cfg,
                    Some(Pending::Regenerate) => {
                        if let Some(r) = c.current.take().and_then(|id| self.requests.get_mut(&id))
                        {
                            r.superseded = true;
                            config = r.config.clone();
                        }
                    }
                    _ => {}
                }
                c.last_request = Some(rid.to_string());
                if let Some(old) = c.current.replace(rid.to_string()) {
                    // A second request while one was in flight: the old one is
                    // left without its terminal event (terminal_once says so).
                    let _ = old;
                }
                let had_stops = !config.stops.is_empty();
                self.requests.insert(
                    rid.to_string(),
                    ReqView {
                        conn,
                        config,
                        streamed: String::new(),
                        stops_from: 0,
                        token_frames: 0,
                        paused_at: None,
                        pause_grace_step: None,
                        terminals: 0,
                        superseded: false,
                        started_at: now,
                        sampled: Vec::new(),
                        ids_streamed: 0,
                        planned: false,
                        told_queued: false,
                        had_stops,
                    },
                );
            }
            "token" => {
                if let Some(r) = c.current.as_ref().and_then(|id| self.requests.get_mut(id)) {
                    r.streamed.push_str(f.str("token").unwrap_or(""));
                    r.token_frames += 1;
                    if f.v.get("token_id").is_some() {
                        r.ids_streamed += 1;
                    }
                }
            }
            "completion" | "error" if f.is_terminal() => {
                let Some(rid) = f.request_id() else { return };
                if let Some(r) = self.requests.get_mut(rid) {
                    r.terminals += 1;
                }
                if c.current.as_deref() == Some(rid) {
                    c.current = None;
                    c.last_activity = now;
                }
            }
            "status" => {
                if f.str("operation") == Some("feedback_received") {
                    c.feedback.take(now);
                }
                let Some(rid) = f.request_id() else { return };
                if c.current.as_deref() != Some(rid) {
                    return;
                }
                let Some(r) = self.requests.get_mut(rid) else {
                    return;
                };
                match f.str("operation") {
                    Some("queued") => r.told_queued = true,
                    Some("paused") if r.paused_at.is_none() => {
                        r.paused_at = Some(now);
                        r.pause_grace_step = step;
                    }
                    Some("resumed") => {
                        r.paused_at = None;
                        r.pause_grace_step = None;
                    }
                    Some("modified") => {
                        let p = &f.v["parameters"];
                        r.config.sampling = r.config.sampling.with(p);
                        if let Some(seed) = p["seed"].as_u64() {
                            r.config.seed = Some(seed);
                        }
                        if let Some(m) = p["max_tokens"].as_u64() {
                            r.config.max_tokens = m.min(u64::from(u32::MAX)) as u32;
                        }
                        if p.get("stop").is_some() {
                            r.config.stops = stops_of(&p["stop"]);
                            r.stops_from = r.streamed.len();
                            r.had_stops |= !r.config.stops.is_empty();
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
}
