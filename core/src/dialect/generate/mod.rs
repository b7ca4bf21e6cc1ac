//! The `generate` dialect (seed 000) at `/generate`: `config` starts a
//! generation, `control` steers it, `feedback` rates it; the server answers with
//! `init`, `token`, `completion`, `error` and `status`.
//!
//! Connection states: awaiting config -> generating -> awaiting config -> ...
//! (many generations per connection, one at a time).

pub mod codec;
pub mod http;

use serde_json::{Map, Value};

use self::codec::{
    ClientMessage, CompletionTiming, ControlAction, ErrorCode, ErrorMessage, Logprob, Options,
    RecoveryAction, ServerMessage, Status, TokenTiming, Usage,
};
use super::{openai, Cx, DialectConn, Failure, FailureKind, GenRequest, StartError};
use crate::api::FeedbackRecord;
use crate::constraint::Constraint;
use crate::engine::{SeqId, TokenLogprobs};
use crate::gen::RequestPart;
use crate::gen::{FinishReason, TokenPiece};
use crate::params::{self, GenParams, ParamNames};
use crate::rate::TokenBucket;
use crate::text::{Encoded, TextJobId};
use crate::time::{millis_f64, Duration, Instant};

/// Close code when the first message is not a `config`.
const CLOSE_POLICY: u16 = 1008;

/// A validated `config`, kept for `regenerate`.
#[derive(Debug, Clone)]
struct Config {
    prompt: String,
    params: GenParams,
    options: Options,
    /// `parameters.response_format`'s compiled grammar (an extension).
    constraint: Option<Constraint>,
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

/// A `config` whose prompt is being tokenized.
#[derive(Debug, Clone)]
struct Pending {
    job: TextJobId,
    config: Config,
}

/// One `/generate` connection.
#[derive(Debug, Default)]
pub struct GenerateConn {
    seen_first: bool,
    pending: Option<Pending>,
    running: Option<Running>,
    last_request_id: Option<String>,
    /// Feedback this connection may still send ([`FEEDBACK_PER_MINUTE`]):
    /// it is the one client text that may reach a file.
    feedback_budget: Option<TokenBucket>,
}

/// Feedback messages one connection may send per minute; more get
/// `rate_limited` and nothing is written.
pub const FEEDBACK_PER_MINUTE: u64 = 30;

fn send(cx: &mut Cx<'_>, msg: ServerMessage) {
    if let ServerMessage::Error(e) = &msg {
        cx.count_error(e.error.as_str());
    }
    cx.send_text(codec::encode_server(&msg));
}

fn send_status(cx: &mut Cx<'_>, status: Status) {
    send(cx, ServerMessage::Status(status));
}

fn error(
    error: ErrorCode,
    message: String,
    recovery_action: RecoveryAction,
    request_id: Option<&str>,
) -> ErrorMessage {
    ErrorMessage {
        error,
        message,
        recoverable: true,
        recovery_action,
        request_id: request_id.map(str::to_string),
        generated_text: None,
    }
}

fn invalid(cx: &mut Cx<'_>, message: impl Into<String>, request_id: Option<&str>) {
    let e = error(
        ErrorCode::InvalidRequest,
        message.into(),
        RecoveryAction::None,
        request_id,
    );
    send(cx, ServerMessage::Error(e));
}

impl GenerateConn {
    fn parse_config(&self, cx: &Cx<'_>, msg: codec::Config) -> Result<Config, String> {
        if let Some(model) = &msg.model {
            let served = &cx.model().name;
            if model != served {
                return Err(format!(
                    "unknown model `{model}`; this server serves `{served}`"
                ));
            }
        }
        let defaults =
            GenParams::defaults(cx.config().default_max_tokens.min(cx.model().context_len));
        let constraint = match &msg.parameters {
            Some(p) => openai::compile_response_format(cx.codec(), p, "parameters.")?,
            None => None,
        };
        let params = match &msg.parameters {
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
        Ok(Config {
            prompt: msg.prompt,
            params,
            options: msg.options,
            constraint,
        })
    }

    /// Has `config`'s prompt tokenized; [`GenerateConn::on_text_done`] starts it.
    fn tokenize(&mut self, cx: &mut Cx<'_>, config: Config) {
        match cx.encode_prompt(config.prompt.clone(), config.params.max_tokens) {
            Ok(job) => self.pending = Some(Pending { job, config }),
            Err(e) => start_error(cx, e),
        }
    }

    /// Starts `config` with its prompt's ids; sends `init` or the error.
    fn start(&mut self, cx: &mut Cx<'_>, config: Config, prompt_ids: Vec<u32>) {
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
            raw: false,
            reuse_kv: None,
            constraint: config.constraint.clone(),
            embed: None,
            prompt_logprobs: None,
            part: RequestPart::First,
        };
        let id = match cx.start(req) {
            Ok(id) => id,
            Err(e) => return start_error(cx, e),
        };
        let request_id = cx.new_id("gen_");
        let model = cx.model();
        let init = codec::Init {
            request_id: request_id.clone(),
            model: model.name.clone(),
            model_info: codec::ModelInfo {
                version: model.version.clone(),
                max_tokens: model.context_len,
                quantization: model.dtype.clone(),
            },
        };
        send(cx, ServerMessage::Init(init));
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

    fn on_config(&mut self, cx: &mut Cx<'_>, msg: codec::Config) {
        // (A config cannot arrive while one is pending: the Host holds this
        // connection's frames until the prompt's tokens are back.)
        if let Some(r) = &self.running {
            let rid = r.request_id.clone();
            return invalid(
                cx,
                "a generation is already running on this connection; send control stop first",
                Some(&rid),
            );
        }
        match self.parse_config(cx, msg) {
            Ok(config) => self.tokenize(cx, config),
            Err(message) => invalid(cx, message, None),
        }
    }

    fn on_control(&mut self, cx: &mut Cx<'_>, msg: codec::Control) {
        let action = msg.action;
        let Some(running) = self.running.as_mut() else {
            return invalid(
                cx,
                format!(
                    "control `{}` needs a running generation; none is running",
                    action.as_str()
                ),
                None,
            );
        };
        let id = running.id;
        let rid = running.request_id.clone();
        match action {
            ControlAction::Stop => {
                // The last piece and the completion follow through on_token.
                cx.end(id, FinishReason::Cancelled);
            }
            ControlAction::Pause => {
                running.paused = true;
                cx.pause(id);
                send_status(cx, Status::Paused { request_id: rid });
            }
            ControlAction::Resume => {
                if !running.paused {
                    return invalid(cx, "the generation is not paused", Some(&rid));
                }
                running.paused = false;
                cx.resume(id);
                send_status(cx, Status::Resumed { request_id: rid });
            }
            ControlAction::Regenerate => {
                let config = running.config.clone();
                self.running = None;
                // Same prompt, same tokens: no need to tokenize it again. The
                // old generation's last piece finds no running request and
                // is dropped: a regenerated request gets no completion.
                if let Some(prompt_ids) = cx.gen(id).map(|g| g.prompt_ids.clone()) {
                    cx.end(id, FinishReason::Cancelled);
                    self.start(cx, config, prompt_ids);
                }
            }
            ControlAction::Modify => {
                let Some(p) = msg.parameters else {
                    return invalid(cx, "`parameters` is required for modify", Some(&rid));
                };
                self.modify(cx, id, &rid, &p);
            }
        }
    }

    fn modify(&mut self, cx: &mut Cx<'_>, id: SeqId, rid: &str, p: &Map<String, Value>) {
        let Some(gen) = cx.gen(id) else { return };
        let produced = gen.completion_tokens();
        let prompt_tokens = gen.prompt_tokens();
        let mut current = gen.params.clone();
        current.seed = Some(gen.seed);
        let context_len = cx.model().context_len;
        let new = match params::apply(
            p,
            "parameters.",
            &ParamNames::STANDARD,
            &current,
            context_len,
        ) {
            Ok(new) => new,
            Err(e) => return invalid(cx, e.to_string(), Some(rid)),
        };
        if new.max_tokens <= produced {
            return invalid(
                cx,
                format!(
                    "invalid `parameters.max_tokens`: {produced} tokens were already generated"
                ),
                Some(rid),
            );
        }
        if prompt_tokens + new.max_tokens > context_len {
            return invalid(
                cx,
                format!(
                    "invalid `parameters.max_tokens`: prompt ({prompt_tokens}) plus max_tokens ({}) exceed the context length {context_len}",
                    new.max_tokens
                ),
                Some(rid),
            );
        }
        let parameters = match new.to_json() {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        match cx.modify(id, new.clone()) {
            Ok(()) => {}
            Err(StartError::NeverFits {
                needed_blocks,
                total_blocks,
            }) => {
                return invalid(
                    cx,
                    format!(
                        "invalid `parameters.max_tokens`: {} tokens would need {needed_blocks} KV cache blocks but the cache holds {total_blocks}",
                        prompt_tokens + new.max_tokens
                    ),
                    Some(rid),
                )
            }
            Err(e) => return start_error(cx, e),
        }
        if let Some(running) = self.running.as_mut() {
            running.config.params = new;
        }
        send_status(
            cx,
            Status::Modified {
                request_id: rid.to_string(),
                parameters,
            },
        );
    }

    fn on_feedback(&mut self, cx: &mut Cx<'_>, msg: codec::Feedback) {
        let now = cx.now;
        let budget = self
            .feedback_budget
            .get_or_insert_with(|| TokenBucket::new(FEEDBACK_PER_MINUTE, now));
        if budget.check(now, 1).is_err() {
            let e = error(
                ErrorCode::RateLimited,
                format!("at most {FEEDBACK_PER_MINUTE} feedback messages a minute per connection"),
                RecoveryAction::Retry,
                None,
            );
            return send(cx, ServerMessage::Error(e));
        }
        budget.charge(now, 1);
        let rid = self
            .running
            .as_ref()
            .map(|r| r.request_id.clone())
            .or_else(|| self.last_request_id.clone());
        cx.feedback(FeedbackRecord {
            request_id: rid.clone(),
            rating: msg.rating,
            position: msg.position,
            text: msg.text,
        });
        send_status(cx, Status::FeedbackReceived { request_id: rid });
    }

    fn token_frame(&self, cx: &Cx<'_>, running: &Running, piece: &TokenPiece) -> codec::Token {
        let o = running.config.options;
        let token_id = piece.token_id.filter(|_| o.include_token_ids);
        let logprobs = match (&piece.logprobs, piece.token_id) {
            (Some(lp), Some(id)) if o.include_logprobs => {
                Some(logprobs_list(cx, id, lp, o.include_token_ids))
            }
            _ => None,
        };
        let timing = o.include_timing.then(|| {
            let since = running.last_token_at.unwrap_or(running.started_at);
            TokenTiming {
                token_ms: millis_f64(cx.now - since),
                total_ms: millis_f64(cx.now - running.started_at),
            }
        });
        codec::Token {
            token: piece.text.clone(),
            token_id,
            logprobs,
            timing,
            generated_text: o.include_generated_text.then(|| running.cumulative.clone()),
            finish_reason: piece.finish.map(Into::into),
            finished: piece.finish.is_some(),
        }
    }

    /// Streams a piece; on the final one, sends `completion` and returns to awaiting config.
    fn on_token_inner(&mut self, cx: &mut Cx<'_>, piece: &TokenPiece) {
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
        send(cx, ServerMessage::Token(frame));
        if piece.token_id.is_some() {
            running.last_token_at = Some(cx.now);
        }
        let Some(reason) = piece.finish else {
            self.running = Some(running);
            return;
        };
        let usage = cx.gen(running.id).map(|g| {
            (
                g.text.clone(),
                g.prompt_tokens(),
                g.completion_tokens(),
                g.cached_tokens,
            )
        });
        if let Some((text, prompt_tokens, completion_tokens, cached)) = usage {
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
            };
            self.complete(cx, &running, reason, text, usage, cached);
        }
    }

    fn complete(
        &mut self,
        cx: &mut Cx<'_>,
        running: &Running,
        reason: FinishReason,
        text: String,
        usage: Usage,
        cached_tokens: u32,
    ) {
        let generated_text = if running.config.options.echo_prompt {
            format!("{}{}", running.config.prompt, text)
        } else {
            text
        };
        let timing = running
            .config
            .options
            .include_timing
            .then(|| CompletionTiming {
                first_token_ms: running
                    .first_token_at
                    .map(|t| millis_f64(t - running.started_at)),
                total_ms: millis_f64(cx.now - running.started_at),
                cached_tokens,
            });
        let completion = codec::Completion {
            request_id: running.request_id.clone(),
            generated_text,
            finish_reason: reason.into(),
            usage,
            timing,
        };
        send(cx, ServerMessage::Completion(completion));
    }

    fn reject_first(&mut self, cx: &mut Cx<'_>, reason: &str) {
        let e = ErrorMessage {
            recoverable: false,
            ..error(
                ErrorCode::InvalidRequest,
                format!("first message must be a config message: {reason}"),
                RecoveryAction::None,
                None,
            )
        };
        send(cx, ServerMessage::Error(e));
        cx.close(CLOSE_POLICY, crate::api::close_reason::FIRST_FRAME);
    }
}

fn logprobs_list(cx: &Cx<'_>, id: u32, lp: &TokenLogprobs, with_ids: bool) -> Vec<Logprob> {
    let entry = |tok: u32, logprob: f32| Logprob {
        token: cx.codec().token_text(tok),
        logprob,
        token_id: with_ids.then_some(tok),
    };
    let mut list = vec![entry(id, lp.logprob)];
    list.extend(lp.top.iter().map(|&(t, l)| entry(t, l)));
    list
}

fn start_error(cx: &mut Cx<'_>, e: StartError) {
    let message = e.message("max_tokens");
    let (code, action) = match e {
        StartError::ContextLength {
            prompt_tokens: n,
            context_len,
            ..
        }
        | StartError::PromptTooLong {
            min_tokens: n,
            context_len,
            ..
        } => (
            ErrorCode::ContextLengthExceeded,
            if n >= context_len {
                RecoveryAction::ShortenPrompt
            } else {
                RecoveryAction::ReduceMaxTokens
            },
        ),
        StartError::NeverFits { .. } => {
            (ErrorCode::MemoryPressure, RecoveryAction::ReduceMaxTokens)
        }
        StartError::QueueFull => (ErrorCode::MemoryPressure, RecoveryAction::Retry),
        StartError::ConnQueueFull { .. } | StartError::RateLimited { .. } => {
            (ErrorCode::RateLimited, RecoveryAction::Retry)
        }
        StartError::TokenOutOfVocab { .. } => (ErrorCode::InvalidRequest, RecoveryAction::None),
        StartError::ContentFiltered { .. } => (ErrorCode::ContentFilter, RecoveryAction::None),
        StartError::ShuttingDown => (ErrorCode::InternalError, RecoveryAction::Retry),
        StartError::NotLoaded => (ErrorCode::ModelLoadingError, RecoveryAction::Retry),
    };
    send(cx, ServerMessage::Error(error(code, message, action, None)));
}

impl DialectConn for GenerateConn {
    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        let first = !self.seen_first;
        self.seen_first = true;
        let msg = match codec::decode_client(text) {
            Ok(msg) => msg,
            Err(e) if first && e.kind != Some("config") => {
                return self.reject_first(cx, &e.message)
            }
            Err(e) => return invalid(cx, e.message, None),
        };
        match msg {
            ClientMessage::Config(c) => self.on_config(cx, c),
            _ if first => self.reject_first(
                cx,
                &format!(
                    "the first message must be a config message, got `{}`",
                    msg.kind()
                ),
            ),
            ClientMessage::Control(c) => self.on_control(cx, c),
            ClientMessage::Feedback(f) => self.on_feedback(cx, f),
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
        self.on_token_inner(cx, piece);
    }

    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure) {
        if self.running.as_ref().map(|r| r.id) != Some(id) {
            return;
        }
        let Some(running) = self.running.take() else {
            return;
        };
        let partial = cx.gen(id).map(|g| g.text.clone()).unwrap_or_default();
        let code = match failure.kind {
            FailureKind::MemoryPressure => ErrorCode::MemoryPressure,
            FailureKind::Internal | FailureKind::ShuttingDown => ErrorCode::InternalError,
        };
        let e = ErrorMessage {
            generated_text: Some(partial),
            ..error(
                code,
                failure.message.clone(),
                RecoveryAction::Retry,
                Some(&running.request_id),
            )
        };
        send(cx, ServerMessage::Error(e));
    }

    fn on_text_done(&mut self, cx: &mut Cx<'_>, job: TextJobId, result: Result<Encoded, String>) {
        let Some(pending) = self.pending.take_if(|p| p.job == job) else {
            return;
        };
        match result {
            Ok(encoded) => self.start(cx, pending.config, encoded.ids),
            Err(e) => invalid(cx, format!("prompt could not be tokenized: {e}"), None),
        }
    }

    fn on_queued(&mut self, cx: &mut Cx<'_>, id: SeqId, position: u32) {
        if let Some(r) = self.running.as_ref().filter(|r| r.id == id) {
            let request_id = r.request_id.clone();
            send_status(
                cx,
                Status::Queued {
                    position,
                    request_id,
                },
            );
        }
    }

    fn on_model_loading(
        &mut self,
        cx: &mut Cx<'_>,
        progress: f32,
        message: &str,
        eta: Option<Duration>,
    ) {
        send_status(
            cx,
            Status::ModelLoading {
                progress,
                message: message.to_string(),
                eta_seconds: eta.map(|d| d.as_secs_f64()),
            },
        );
    }

    fn busy(&self) -> bool {
        self.running.is_some() || self.pending.is_some()
    }
}
