//! The `generate` dialect (seed 000) at `/generate`: `config` starts a
//! generation, `control` steers it, `feedback` rates it; the server answers with
//! `init`, `token`, `completion`, `error` and `status`.
//!
//! Connection states: awaiting config -> generating -> awaiting config -> ...
//! (many generations per connection, one at a time).

use serde_json::{json, Map, Value};

use super::{Cx, DialectConn, Failure, FailureKind, GenRequest, StartError};
use crate::api::FeedbackRecord;
use crate::engine::{SeqId, TokenLogprobs};
use crate::gen::{FinishReason, Generation, TokenPiece};
use crate::json::{self, FieldError, Fields};
use crate::params::{self, GenParams, ParamNames};
use crate::time::{millis_f64, Duration, Instant};

/// Longest feedback text in bytes.
const MAX_FEEDBACK_TEXT: usize = 4096;
/// Close code when the first message is not a `config`.
const CLOSE_POLICY: u16 = 1008;

/// Per-message output switches from `config.options`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Options {
    echo_prompt: bool,
    include_token_ids: bool,
    include_logprobs: bool,
    include_timing: bool,
    include_generated_text: bool,
}

/// A validated `config`, kept for `regenerate`.
#[derive(Debug, Clone)]
struct Config {
    prompt: String,
    params: GenParams,
    options: Options,
}

/// The generation in progress.
#[derive(Debug, Clone)]
struct Running {
    id: SeqId,
    request_id: String,
    config: Config,
    paused: bool,
    started_at: Instant,
    last_token_at: Option<Instant>,
    first_token_at: Option<Instant>,
    /// Text streamed so far, kept only when `include_generated_text` asks for it.
    cumulative: String,
}

/// One `/generate` connection.
#[derive(Debug, Default)]
pub struct GenerateConn {
    seen_first: bool,
    running: Option<Running>,
    last_request_id: Option<String>,
}

/// An error frame to send.
struct ErrorFrame<'a> {
    code: &'static str,
    message: String,
    recoverable: bool,
    action: &'static str,
    request_id: Option<&'a str>,
    generated_text: Option<&'a str>,
}

fn send_error(cx: &mut Cx<'_>, e: ErrorFrame<'_>) {
    let mut v = json!({
        "type": "error",
        "error": e.code,
        "message": e.message,
        "recoverable": e.recoverable,
        "recovery_action": e.action,
    });
    if let Some(id) = e.request_id {
        v["request_id"] = json!(id);
    }
    if let Some(t) = e.generated_text {
        v["generated_text"] = json!(t);
    }
    cx.count_error(e.code);
    cx.send(v);
}

fn invalid(cx: &mut Cx<'_>, message: impl Into<String>, request_id: Option<&str>) {
    send_error(
        cx,
        ErrorFrame {
            code: "invalid_request",
            message: message.into(),
            recoverable: true,
            action: "none",
            request_id,
            generated_text: None,
        },
    );
}

fn parse_options(obj: Option<&Map<String, Value>>) -> Result<Options, FieldError> {
    let Some(obj) = obj else {
        return Ok(Options::default());
    };
    let f = Fields::new(obj, "options.");
    // `stream` is accepted for compatibility: the socket always streams.
    f.bool("stream")?;
    Ok(Options {
        echo_prompt: f.bool("echo_prompt")?.unwrap_or(false),
        include_token_ids: f.bool("include_token_ids")?.unwrap_or(false),
        include_logprobs: f.bool("include_logprobs")?.unwrap_or(false),
        include_timing: f.bool("include_timing")?.unwrap_or(false),
        include_generated_text: f.bool("include_generated_text")?.unwrap_or(false),
    })
}

impl GenerateConn {
    fn parse_config(&self, cx: &Cx<'_>, msg: &Map<String, Value>) -> Result<Config, String> {
        let f = Fields::new(msg, "");
        let prompt = f.req_str("prompt").map_err(|e| e.to_string())?;
        if let Some(model) = f.str("model").map_err(|e| e.to_string())? {
            let served = &cx.model().name;
            if model != served {
                return Err(format!(
                    "unknown model `{model}`; this server serves `{served}`"
                ));
            }
        }
        let defaults =
            GenParams::defaults(cx.config().default_max_tokens.min(cx.model().context_len));
        let params = match f.obj("parameters").map_err(|e| e.to_string())? {
            Some(p) => params::apply(
                p,
                "parameters.",
                &ParamNames::STANDARD,
                &defaults,
                cx.model().context_len,
            )
            .map_err(|e| e.to_string())?,
            None => defaults,
        };
        let options = parse_options(f.obj("options").map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        Ok(Config {
            prompt: prompt.to_string(),
            params,
            options,
        })
    }

    /// Tokenizes and starts `config`; sends `init` or the error.
    fn start(&mut self, cx: &mut Cx<'_>, config: Config) {
        let prompt_ids = match cx.codec().encode(&config.prompt, true) {
            Ok(ids) => ids,
            Err(e) => return invalid(cx, format!("prompt could not be tokenized: {e}"), None),
        };
        if prompt_ids.is_empty() {
            return invalid(
                cx,
                "invalid `prompt`: it encodes to no tokens and this model's tokenizer adds no BOS",
                None,
            );
        }
        let logprobs = config
            .options
            .include_logprobs
            .then_some(config.params.top_logprobs);
        let req = GenRequest {
            prompt_ids,
            params: config.params.clone(),
            logprobs,
        };
        let id = match cx.start(req) {
            Ok(id) => id,
            Err(e) => return start_error(cx, e),
        };
        let request_id = cx.new_id("gen_");
        let model = cx.model();
        let init = json!({
            "type": "init",
            "request_id": request_id,
            "model": model.name,
            "model_info": {
                "version": model.version,
                "max_tokens": model.context_len,
                "quantization": model.dtype,
            },
        });
        cx.send(init);
        self.last_request_id = Some(request_id.clone());
        self.running = Some(Running {
            id,
            request_id,
            config,
            paused: false,
            started_at: cx.now,
            last_token_at: None,
            first_token_at: None,
            cumulative: String::new(),
        });
    }

    fn on_config(&mut self, cx: &mut Cx<'_>, msg: &Map<String, Value>) {
        if let Some(r) = &self.running {
            let rid = r.request_id.clone();
            return invalid(
                cx,
                "a generation is already running on this connection; send control stop first",
                Some(&rid),
            );
        }
        match self.parse_config(cx, msg) {
            Ok(config) => self.start(cx, config),
            Err(message) => invalid(cx, message, None),
        }
    }

    fn on_control(&mut self, cx: &mut Cx<'_>, msg: &Map<String, Value>) {
        let f = Fields::new(msg, "");
        let action = match f.req_str("action") {
            Ok(a) => a,
            Err(e) => return invalid(cx, e.to_string(), None),
        };
        if !matches!(
            action,
            "stop" | "pause" | "resume" | "regenerate" | "modify"
        ) {
            return invalid(
                cx,
                format!("unknown control action `{action}`; expected stop, pause, resume, regenerate or modify"),
                None,
            );
        }
        let Some(running) = self.running.as_mut() else {
            return invalid(
                cx,
                format!("control `{action}` needs a running generation; none is running"),
                None,
            );
        };
        let id = running.id;
        let rid = running.request_id.clone();
        match action {
            "stop" => {
                if let Some((piece, gen)) = cx.end(id, FinishReason::Cancelled) {
                    self.on_token_inner(cx, &piece, Some(&gen));
                }
            }
            "pause" => {
                running.paused = true;
                cx.pause(id);
                cx.send(json!({"type": "status", "operation": "paused", "request_id": rid}));
            }
            "resume" => {
                if !running.paused {
                    return invalid(cx, "the generation is not paused", Some(&rid));
                }
                running.paused = false;
                cx.resume(id);
                cx.send(json!({"type": "status", "operation": "resumed", "request_id": rid}));
            }
            "regenerate" => {
                let config = running.config.clone();
                self.running = None;
                cx.end(id, FinishReason::Cancelled);
                self.start(cx, config);
            }
            _ => {
                let Some(p) = (match f.obj("parameters") {
                    Ok(p) => p,
                    Err(e) => return invalid(cx, e.to_string(), Some(&rid)),
                }) else {
                    return invalid(cx, "`parameters` is required for modify", Some(&rid));
                };
                let Some(gen) = cx.gen(id) else { return };
                let produced = gen.completion_tokens();
                let mut current = gen.params.clone();
                current.seed = Some(gen.seed);
                let context_len = cx.model().context_len;
                match params::apply(p, "parameters.", &ParamNames::STANDARD, &current, context_len) {
                    Ok(new) if new.max_tokens <= produced => invalid(
                        cx,
                        format!(
                            "invalid `parameters.max_tokens`: {} tokens were already generated",
                            produced
                        ),
                        Some(&rid),
                    ),
                    Ok(new) if gen.prompt_tokens() + new.max_tokens > context_len => invalid(
                        cx,
                        format!(
                            "invalid `parameters.max_tokens`: prompt ({}) plus max_tokens ({}) exceed the context length {context_len}",
                            gen.prompt_tokens(),
                            new.max_tokens
                        ),
                        Some(&rid),
                    ),
                    Ok(new) => {
                        let effective = new.to_json();
                        running.config.params = new.clone();
                        cx.modify(id, new);
                        cx.send(json!({
                            "type": "status",
                            "operation": "modified",
                            "request_id": rid,
                            "parameters": effective,
                        }));
                    }
                    Err(e) => invalid(cx, e.to_string(), Some(&rid)),
                }
            }
        }
    }

    fn on_feedback(&mut self, cx: &mut Cx<'_>, msg: &Map<String, Value>) {
        let f = Fields::new(msg, "");
        let parsed = (|| -> Result<FeedbackRecord, FieldError> {
            let rating = f
                .f64("rating")?
                .ok_or_else(|| FieldError::new("rating", "is required"))?;
            if !(-1.0..=1.0).contains(&rating) {
                return Err(FieldError::new(
                    "rating",
                    format!("must be between -1 and 1, got {rating}"),
                ));
            }
            let text = f.str("text")?;
            if let Some(t) = text {
                if t.len() > MAX_FEEDBACK_TEXT {
                    return Err(FieldError::new(
                        "text",
                        format!("must be at most {MAX_FEEDBACK_TEXT} bytes, got {}", t.len()),
                    ));
                }
            }
            let position = f.u64("position")?;
            Ok(FeedbackRecord {
                request_id: None,
                rating,
                position,
                text: text.map(str::to_string),
            })
        })();
        match parsed {
            Ok(mut record) => {
                let rid = self
                    .running
                    .as_ref()
                    .map(|r| r.request_id.clone())
                    .or_else(|| self.last_request_id.clone());
                record.request_id = rid.clone();
                cx.feedback(record);
                let mut ack = json!({"type": "status", "operation": "feedback_received"});
                if let Some(rid) = rid {
                    ack["request_id"] = json!(rid);
                }
                cx.send(ack);
            }
            Err(e) => invalid(cx, e.to_string(), None),
        }
    }

    fn token_frame(&self, cx: &Cx<'_>, running: &Running, piece: &TokenPiece) -> Value {
        let mut v = json!({
            "type": "token",
            "token": piece.text,
            "finish_reason": piece.finish.map(FinishReason::as_str),
            "finished": piece.finish.is_some(),
        });
        let o = running.config.options;
        if o.include_token_ids {
            if let Some(id) = piece.token_id {
                v["token_id"] = json!(id);
            }
        }
        if o.include_logprobs {
            if let (Some(lp), Some(id)) = (&piece.logprobs, piece.token_id) {
                v["logprobs"] = logprobs_json(cx, id, lp, o.include_token_ids);
            }
        }
        if o.include_timing {
            let since = running.last_token_at.unwrap_or(running.started_at);
            v["timing"] = json!({
                "token_ms": millis_f64(cx.now - since),
                "total_ms": millis_f64(cx.now - running.started_at),
            });
        }
        if o.include_generated_text {
            v["generated_text"] = json!(running.cumulative);
        }
        v
    }

    /// Streams a piece; on the final one, sends `completion` and returns to awaiting config.
    /// `retired` is the generation when it was already removed from the Host.
    fn on_token_inner(
        &mut self,
        cx: &mut Cx<'_>,
        piece: &TokenPiece,
        retired: Option<&Generation>,
    ) {
        let Some(mut running) = self.running.take() else {
            return;
        };
        if running.config.options.include_generated_text {
            running.cumulative.push_str(&piece.text);
        }
        if piece.token_id.is_some() && running.first_token_at.is_none() {
            running.first_token_at = Some(cx.now);
        }
        let frame = self.token_frame(cx, &running, piece);
        cx.send(frame);
        if piece.token_id.is_some() {
            running.last_token_at = Some(cx.now);
        }
        let Some(reason) = piece.finish else {
            self.running = Some(running);
            return;
        };
        let usage = retired
            .or_else(|| cx.gen(running.id))
            .map(|g| (g.text.clone(), g.prompt_tokens(), g.completion_tokens()));
        if let Some((text, prompt_tokens, completion_tokens)) = usage {
            self.complete(cx, &running, reason, text, prompt_tokens, completion_tokens);
        }
    }

    fn complete(
        &mut self,
        cx: &mut Cx<'_>,
        running: &Running,
        reason: FinishReason,
        text: String,
        prompt_tokens: u32,
        completion_tokens: u32,
    ) {
        let generated_text = if running.config.options.echo_prompt {
            format!("{}{}", running.config.prompt, text)
        } else {
            text
        };
        let mut v = json!({
            "type": "completion",
            "request_id": running.request_id,
            "generated_text": generated_text,
            "finish_reason": reason.as_str(),
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        });
        if running.config.options.include_timing {
            v["timing"] = json!({
                "first_token_ms": running.first_token_at.map(|t| millis_f64(t - running.started_at)),
                "total_ms": millis_f64(cx.now - running.started_at),
            });
        }
        cx.send(v);
    }
}

fn logprobs_json(cx: &Cx<'_>, id: u32, lp: &TokenLogprobs, with_ids: bool) -> Value {
    let entry = |tok: u32, logprob: f32| {
        let mut e = json!({"token": cx.codec().token_text(tok), "logprob": logprob});
        if with_ids {
            e["token_id"] = json!(tok);
        }
        e
    };
    let mut list = vec![entry(id, lp.logprob)];
    list.extend(lp.top.iter().map(|&(t, l)| entry(t, l)));
    Value::Array(list)
}

fn start_error(cx: &mut Cx<'_>, e: StartError) {
    let (code, message, recoverable, action) = match e {
        StartError::ContextLength {
            prompt_tokens,
            max_tokens,
            context_len,
        } => (
            "context_length_exceeded",
            format!(
                "prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceed the context length of {context_len} tokens"
            ),
            true,
            if prompt_tokens >= context_len {
                "shorten_prompt"
            } else {
                "reduce_max_tokens"
            },
        ),
        StartError::NeverFits {
            needed_blocks,
            total_blocks,
        } => (
            "memory_pressure",
            format!(
                "the request needs {needed_blocks} KV cache blocks but the cache holds {total_blocks}"
            ),
            true,
            "reduce_max_tokens",
        ),
        StartError::QueueFull => (
            "memory_pressure",
            "the request queue is full".to_string(),
            true,
            "retry",
        ),
        StartError::ShuttingDown => (
            "internal_error",
            "the server is shutting down; retry on another server".to_string(),
            true,
            "retry",
        ),
        StartError::NotLoaded => (
            "model_loading_error",
            "the model is not loaded".to_string(),
            true,
            "retry",
        ),
    };
    send_error(
        cx,
        ErrorFrame {
            code,
            message,
            recoverable,
            action,
            request_id: None,
            generated_text: None,
        },
    );
}

impl DialectConn for GenerateConn {
    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        let first = !self.seen_first;
        self.seen_first = true;
        let parsed = json::parse(text).and_then(|v| match v {
            Value::Object(m) => Ok(m),
            other => Err(format!(
                "a message must be a JSON object, got {}",
                json::type_name(&other)
            )),
        });
        let msg = match parsed {
            Ok(m) => m,
            Err(e) if first => return self.reject_first(cx, e),
            Err(e) => return invalid(cx, e, None),
        };
        let kind = match Fields::new(&msg, "").req_str("type") {
            Ok(t) => t.to_string(),
            Err(e) if first => return self.reject_first(cx, e.to_string()),
            Err(e) => return invalid(cx, e.to_string(), None),
        };
        if first && kind != "config" {
            return self.reject_first(
                cx,
                format!("the first message must be a config message, got `{kind}`"),
            );
        }
        match kind.as_str() {
            "config" => self.on_config(cx, &msg),
            "control" => self.on_control(cx, &msg),
            "feedback" => self.on_feedback(cx, &msg),
            other => invalid(
                cx,
                format!("unknown message type `{other}`; expected config, control or feedback"),
                None,
            ),
        }
    }

    fn on_binary(&mut self, cx: &mut Cx<'_>, len: usize) {
        invalid(
            cx,
            format!(
                "binary frames are not supported ({len} bytes received); send JSON text frames"
            ),
            None,
        );
    }

    fn on_token(&mut self, cx: &mut Cx<'_>, id: SeqId, piece: &TokenPiece) {
        if self.running.as_ref().map(|r| r.id) != Some(id) {
            return;
        }
        self.on_token_inner(cx, piece, None);
    }

    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure) {
        if self.running.as_ref().map(|r| r.id) != Some(id) {
            return;
        }
        let Some(running) = self.running.take() else {
            return;
        };
        let partial = cx.gen(id).map(|g| g.text.clone()).unwrap_or_default();
        let (code, action) = match failure.kind {
            FailureKind::MemoryPressure => ("memory_pressure", "retry"),
            FailureKind::Internal | FailureKind::ShuttingDown => ("internal_error", "retry"),
        };
        send_error(
            cx,
            ErrorFrame {
                code,
                message: failure.message.clone(),
                recoverable: true,
                action,
                request_id: Some(&running.request_id),
                generated_text: Some(&partial),
            },
        );
    }

    fn on_queued(&mut self, cx: &mut Cx<'_>, id: SeqId, position: u32) {
        if let Some(r) = self.running.as_ref().filter(|r| r.id == id) {
            let rid = r.request_id.clone();
            cx.send(json!({"type": "status", "operation": "queued", "position": position, "request_id": rid}));
        }
    }

    fn on_model_loading(
        &mut self,
        cx: &mut Cx<'_>,
        progress: f32,
        message: &str,
        eta: Option<Duration>,
    ) {
        cx.send(json!({
            "type": "status",
            "operation": "model_loading",
            "progress": progress,
            "message": message,
            "eta_seconds": eta.map(|d| d.as_secs_f64()),
        }));
    }

    fn busy(&self) -> bool {
        self.running.is_some()
    }
}

impl GenerateConn {
    fn reject_first(&mut self, cx: &mut Cx<'_>, reason: String) {
        send_error(
            cx,
            ErrorFrame {
                code: "invalid_request",
                message: format!("first message must be a config message: {reason}"),
                recoverable: false,
                action: "none",
                request_id: None,
                generated_text: None,
            },
        );
        cx.close(CLOSE_POLICY, "first message must be config");
    }
}
