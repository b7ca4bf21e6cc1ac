//! The `cai` dialect (seed 004) at `/`: a voice or chat client's completion
//! stream. Authentication happens when the connection opens (the query
//! string's key and organisation against the keys file, [`auth`]); then each
//! `COMPLETION` streams `STREAM_START`, `CONTENT_CHUNK`s with a
//! `SENTENCE_BOUNDARY` after each sentence, and `STREAM_COMPLETE`.
//!
//! Several requests may be in flight per connection. A request may continue a
//! conversation kept per (organisation, `conversationId`) ([`state`]), and
//! each organisation's requests and tokens per minute are metered by token
//! buckets on the core's clock. `AWAIT_MORE` and `SENTENCE_COMPLETED` drive
//! per-request windows ([`flow`]); while a window is full the generation is
//! held ([`Cx::close_window`]): the engine computes nothing for it until the
//! client catches up.

pub mod auth;
pub mod codec;
pub mod flow;
pub mod state;

use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Map, Value};

use self::auth::Credentials;
use self::codec::{ClientMessage, Completion, ErrorCode, ServerMessage, Usage};
use self::flow::{Outbox, Release};
use self::state::CaiState;
use super::{Cx, DialectConn, Refusal};
use crate::engine::SeqId;
use crate::gen::{
    Failure, FailureKind, FinishReason, GenRequest, RequestPart, StartError, TokenPiece,
};
use crate::json::Fields;
use crate::params::{self, GenParams, ParamNames};
use crate::text::{ChatMessage, Encoded, Role, TextJobId, CONTEXT_TOO_LONG};
use crate::time::{Duration, Instant};

/// The connection's one timer: stalled replies past the pause timeout.
const STALL_TIMER: u8 = 0;

/// The names of `payload.options`' sampling fields.
pub const OPTION_NAMES: ParamNames = ParamNames {
    max_tokens: "maxTokens",
    temperature: "temperature",
    top_p: "topP",
    top_k: "topK",
    repetition_penalty: "repetitionPenalty",
    stop: "stop",
    seed: "seed",
    top_logprobs: "topLogprobs",
};

/// The source's default temperature.
pub const DEFAULT_TEMPERATURE: f32 = 0.7;

/// How many finished request ids a connection remembers, so that late
/// acknowledgements for them (a speaking client completes its last sentences
/// after `STREAM_COMPLETE`) are accepted quietly instead of being errors.
const RECENT_REQUESTS: usize = 64;

/// One request in flight.
#[derive(Debug)]
struct Request {
    /// Its generation, once started.
    seq: Option<SeqId>,
    stream: bool,
    outbox: Outbox,
    /// Whether its generation is held for a full window.
    held: bool,
    /// The conversation it continues and extends, if any.
    conversation: Option<String>,
    /// The messages its prompt was built from (the user's last).
    messages: Vec<ChatMessage>,
    prompt_tokens: u32,
    /// Set when the generation is over: what `STREAM_COMPLETE` reports once
    /// the outbox has sent everything before it.
    done: Option<Done>,
    /// When its generation ended with text still waiting for a window (the
    /// pause timeout then runs from here, as it did for the generation).
    stalled_at: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Done {
    full_content: String,
    completion_tokens: u32,
    finish_reason: &'static str,
}

/// A prompt being rendered and tokenized.
#[derive(Debug)]
struct Pending {
    job: TextJobId,
    request_id: String,
    params: GenParams,
}

/// One `cai` connection.
#[derive(Debug, Default)]
pub struct CaiConn {
    /// Who the connection acts as (set when it opens).
    creds: Option<Credentials>,
    requests: BTreeMap<String, Request>,
    recent: VecDeque<String>,
    pending: Option<Pending>,
}

fn send(cx: &mut Cx<'_>, msg: &ServerMessage) {
    if let ServerMessage::Error { code, .. } = msg {
        cx.count_error(code.as_str());
    }
    cx.send_text(codec::encode_server(msg));
}

fn error(cx: &mut Cx<'_>, request_id: Option<&str>, code: ErrorCode, message: impl Into<String>) {
    error_with(cx, request_id, code, message, Map::new());
}

fn error_with(
    cx: &mut Cx<'_>,
    request_id: Option<&str>,
    code: ErrorCode,
    message: impl Into<String>,
    details: Map<String, Value>,
) {
    let msg = ServerMessage::Error {
        request_id: request_id.map(str::to_string),
        code,
        message: message.into(),
        details,
    };
    send(cx, &msg);
}

fn details(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// ISO 8601 UTC with milliseconds, from the core's clock.
fn timestamp(cx: &Cx<'_>) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(cx.unix_ms());
    humantime::format_rfc3339_millis(at).to_string()
}

/// The error for a generation that could not start.
fn start_error(e: &StartError) -> (ErrorCode, String) {
    let code = match e {
        StartError::ContextLength { .. }
        | StartError::PromptTooLong { .. }
        | StartError::NeverFits { .. } => ErrorCode::ContextTooLong,
        StartError::QueueFull
        | StartError::ConnQueueFull { .. }
        | StartError::RateLimited { .. } => ErrorCode::RateLimited,
        StartError::TokenOutOfVocab { .. } => ErrorCode::InvalidPayload,
        StartError::ContentFiltered { .. } => ErrorCode::ContentFiltered,
        StartError::ShuttingDown | StartError::NotLoaded => ErrorCode::InternalError,
    };
    (code, e.message("maxTokens"))
}

/// Options that are not sampling parameters.
struct StreamOptions {
    stream: bool,
    window: Option<u32>,
    sentence_window: Option<u32>,
}

fn stream_options(options: &Map<String, Value>) -> Result<StreamOptions, String> {
    let f = Fields::new(options, "payload.options.");
    let positive = |field: &str| -> Result<Option<u32>, String> {
        match f.u64(field).map_err(|e| e.to_string())? {
            None => Ok(None),
            Some(n @ 1..=0xFFFF_FFFF) => Ok(Some(n as u32)),
            Some(n) => Err(format!(
                "invalid `payload.options.{field}`: must be from 1 to 4294967295, got {n}"
            )),
        }
    };
    Ok(StreamOptions {
        stream: f.bool("stream").map_err(|e| e.to_string())?.unwrap_or(true),
        window: positive("window")?,
        sentence_window: positive("sentenceWindow")?,
    })
}

impl CaiConn {
    fn org(&self) -> &str {
        self.creds.as_ref().map_or("", |c| c.org.as_str())
    }

    /// The connection's key from the keys file (a copy: the Host is borrowed
    /// again to meter it).
    /// The organisation this connection acts for, and its rate limits.
    fn limits(&self, cx: &Cx<'_>) -> Option<(String, crate::keys::OrgLimits)> {
        let org = self.creds.as_ref()?.org.clone();
        let limits = cx.config().keys.as_ref()?.org_limits(&org);
        Some((org, limits))
    }

    fn on_completion(&mut self, cx: &mut Cx<'_>, c: Completion) {
        let rid = c.request_id.clone();
        if self.requests.contains_key(&rid) {
            return error(
                cx,
                Some(&rid),
                ErrorCode::InvalidRequest,
                "a request with this requestId is already in flight on this connection",
            );
        }
        let max_inflight = cx.config().cai_max_inflight;
        if self.requests.len() >= max_inflight as usize {
            return error_with(
                cx,
                Some(&rid),
                ErrorCode::RateLimited,
                format!("{max_inflight} requests are already in flight on this connection; wait for one to finish"),
                details(json!({"maxInflight": max_inflight})),
            );
        }
        let served = cx.model().name.clone();
        if let Some(m) = c.model.as_deref().filter(|m| *m != served) {
            return error_with(
                cx,
                Some(&rid),
                ErrorCode::ModelNotFound,
                format!("model `{m}` is not available; this server serves `{served}`"),
                details(json!({"model": m, "available": [served]})),
            );
        }
        let opts = match stream_options(&c.options) {
            Ok(o) => o,
            Err(e) => return error(cx, Some(&rid), ErrorCode::InvalidPayload, e),
        };
        let context_len = cx.model().context_len;
        let mut defaults = GenParams::defaults(cx.config().default_max_tokens.min(context_len));
        defaults.temperature = DEFAULT_TEMPERATURE;
        let params = match params::apply(
            &c.options,
            "payload.options.",
            &OPTION_NAMES,
            &defaults,
            context_len,
        ) {
            Ok(p) => p,
            Err(e) => return error(cx, Some(&rid), ErrorCode::InvalidPayload, e.to_string()),
        };
        if let Some((org, limits)) = self.limits(cx) {
            let now = cx.now;
            if let Err(wait) = cx.rate_limits().admit(now, &org, limits) {
                let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
                return error_with(
                    cx,
                    Some(&rid),
                    ErrorCode::RateLimited,
                    format!("the organisation's rate limit is reached; retry in {ms} ms"),
                    details(json!({"retryAfterMs": ms})),
                );
            }
        }
        let mut messages = match (&c.context, &c.conversation_id) {
            (Some(ctx), _) => ctx.clone(),
            (None, Some(id)) => {
                let (now, org) = (cx.now, self.org().to_string());
                cx.state::<CaiState>()
                    .conversations
                    .get(now, &org, id)
                    .unwrap_or_default()
            }
            (None, None) => Vec::new(),
        };
        messages.push(ChatMessage::new(Role::User, c.prompt));
        let budget = context_len.saturating_sub(params.max_tokens);
        let job = match cx.encode_chat(messages.clone(), usize::MAX, budget) {
            Ok(job) => job,
            Err(e) => {
                let (code, message) = start_error(&e);
                return error(cx, Some(&rid), code, message);
            }
        };
        self.pending = Some(Pending {
            job,
            request_id: rid.clone(),
            params,
        });
        self.requests.insert(
            rid,
            Request {
                seq: None,
                stream: opts.stream,
                outbox: Outbox::new(opts.window, opts.sentence_window),
                held: false,
                conversation: c.conversation_id,
                messages,
                prompt_tokens: 0,
                done: None,
                stalled_at: None,
            },
        );
    }

    fn on_prompt_tokens(
        &mut self,
        cx: &mut Cx<'_>,
        rid: String,
        params: GenParams,
        result: Result<Encoded, String>,
    ) {
        let encoded = match result {
            Ok(e) => e,
            Err(e) => {
                self.requests.remove(&rid);
                let max_tokens = params.max_tokens;
                let (code, message) = match e.strip_prefix(CONTEXT_TOO_LONG) {
                    Some(rest) => (
                        ErrorCode::ContextTooLong,
                        format!(
                            "the prompt with the system messages is{rest}, more than the {} tokens the context leaves beside maxTokens ({max_tokens})",
                            cx.model().context_len.saturating_sub(max_tokens),
                        ),
                    ),
                    None => (
                        ErrorCode::InvalidPayload,
                        format!("the prompt could not be tokenized: {e}"),
                    ),
                };
                return error(cx, Some(&rid), code, message);
            }
        };
        let prompt_tokens = encoded.ids.len() as u32;
        if let Some((org, limits)) = self.limits(cx) {
            let now = cx.now;
            cx.rate_limits()
                .charge_tokens(now, &org, limits, u64::from(prompt_tokens));
        }
        let req = GenRequest {
            prompt_ids: encoded.ids,
            params,
            logprobs: None,
            raw: false,
            reuse_kv: None,
            constraint: None,
            embed: None,
            prompt_logprobs: None,
            part: RequestPart::First,
        };
        match cx.start(req) {
            Ok(seq) => {
                let Some(r) = self.requests.get_mut(&rid) else {
                    return;
                };
                r.seq = Some(seq);
                r.prompt_tokens = prompt_tokens;
                if r.stream {
                    let msg = ServerMessage::StreamStart {
                        request_id: rid.clone(),
                        timestamp: timestamp(cx),
                    };
                    send(cx, &msg);
                }
            }
            Err(e) => {
                self.requests.remove(&rid);
                let (code, message) = start_error(&e);
                error(cx, Some(&rid), code, message);
            }
        }
    }

    /// Sends what the request's windows allow, finishes it when its end was
    /// reached, and holds or releases its generation as its windows say.
    fn flush(&mut self, cx: &mut Cx<'_>, rid: &str) {
        let Some(r) = self.requests.get_mut(rid) else {
            return;
        };
        let mut ended = false;
        for item in r.outbox.release() {
            let msg = match item {
                Release::Chunk { index, content } => ServerMessage::ContentChunk {
                    request_id: rid.to_string(),
                    content,
                    index,
                },
                Release::Boundary { index, sentence } => ServerMessage::SentenceBoundary {
                    request_id: rid.to_string(),
                    sentence,
                    sentence_index: index,
                },
                Release::End => {
                    ended = true;
                    continue;
                }
            };
            send(cx, &msg);
        }
        if ended {
            self.complete(cx, rid);
            return self.arm_stall_timer(cx);
        }
        let blocked = r.outbox.blocked();
        if r.done.is_some() && r.stalled_at.is_none() {
            r.stalled_at = Some(cx.now);
            self.arm_stall_timer(cx);
            return;
        }
        if let Some(seq) = r.seq.filter(|_| r.done.is_none() && blocked != r.held) {
            r.held = blocked;
            if blocked {
                cx.close_window(seq);
            } else {
                cx.open_window(seq);
            }
        }
    }

    /// Sets the stall timer for the earliest stalled reply (or cancels it).
    fn arm_stall_timer(&mut self, cx: &mut Cx<'_>) {
        let timeout = cx.config().pause_timeout;
        match self.requests.values().filter_map(|r| r.stalled_at).min() {
            Some(at) => cx.set_timer(STALL_TIMER, at + timeout),
            None => cx.cancel_timer(STALL_TIMER),
        }
    }

    /// The error for a request its client left waiting on a full window.
    fn end_stalled(&mut self, cx: &mut Cx<'_>, rid: &str) {
        self.requests.remove(rid);
        self.remember(rid);
        let secs = cx.config().pause_timeout.as_secs();
        error(
            cx,
            Some(rid),
            ErrorCode::GenerationFailed,
            format!("the request's flow window stayed full for {secs} s, so it was ended; acknowledge chunks (AWAIT_MORE) or sentences (SENTENCE_COMPLETED) sooner"),
        );
    }

    /// Sends `STREAM_COMPLETE`, keeps the conversation and forgets the request.
    fn complete(&mut self, cx: &mut Cx<'_>, rid: &str) {
        let Some(r) = self.requests.remove(rid) else {
            return;
        };
        let Some(done) = r.done else {
            return;
        };
        self.remember(rid);
        self.keep_conversation(cx, &r.conversation, r.messages, &done.full_content);
        let msg = ServerMessage::StreamComplete {
            request_id: rid.to_string(),
            full_content: done.full_content,
            usage: Usage {
                prompt_tokens: r.prompt_tokens,
                completion_tokens: done.completion_tokens,
            },
            model: cx.model().name.clone(),
            finish_reason: done.finish_reason.to_string(),
        };
        send(cx, &msg);
    }

    fn keep_conversation(
        &self,
        cx: &mut Cx<'_>,
        conversation: &Option<String>,
        mut messages: Vec<ChatMessage>,
        reply: &str,
    ) {
        let Some(id) = conversation else {
            return;
        };
        messages.push(ChatMessage::new(Role::Assistant, reply.to_string()));
        let (now, org) = (cx.now, self.org().to_string());
        cx.state::<CaiState>()
            .conversations
            .put(now, &org, id, messages);
    }

    fn remember(&mut self, rid: &str) {
        if self.recent.len() >= RECENT_REQUESTS {
            self.recent.pop_front();
        }
        self.recent.push_back(rid.to_string());
    }

    fn charge_generated(&self, cx: &mut Cx<'_>, tokens: u32) {
        if let Some((org, limits)) = self.limits(cx) {
            let now = cx.now;
            cx.rate_limits()
                .charge_tokens(now, &org, limits, u64::from(tokens));
        }
    }

    fn on_interrupt(&mut self, cx: &mut Cx<'_>, rid: &str) {
        let Some(r) = self.requests.remove(rid) else {
            return error(
                cx,
                Some(rid),
                ErrorCode::InvalidRequest,
                "no request with this requestId is in flight on this connection",
            );
        };
        let (partial, tokens) = match (&r.done, r.seq.and_then(|s| cx.gen(s))) {
            (Some(d), _) => (d.full_content.clone(), d.completion_tokens),
            (None, Some(g)) => (g.text.clone(), g.completion_tokens()),
            (None, None) => (String::new(), 0),
        };
        if let (None, Some(seq)) = (&r.done, r.seq) {
            cx.end(seq, FinishReason::Cancelled);
            self.charge_generated(cx, tokens);
        }
        self.remember(rid);
        self.keep_conversation(cx, &r.conversation, r.messages, &partial);
        let msg = ServerMessage::InterruptedAck {
            request_id: rid.to_string(),
            partial_content: partial,
            tokens_generated: tokens,
        };
        send(cx, &msg);
    }

    fn on_ack(&mut self, cx: &mut Cx<'_>, msg: ClientMessage) {
        let rid = msg.request_id().to_string();
        let Some(r) = self.requests.get_mut(&rid) else {
            if self.recent.contains(&rid) {
                return; // a late acknowledgement of a finished request
            }
            return error(
                cx,
                Some(&rid),
                ErrorCode::InvalidRequest,
                "no request with this requestId is in flight on this connection",
            );
        };
        let result = match msg {
            ClientMessage::AwaitMore {
                last_received_index,
                ..
            } => r.outbox.ack_chunks(last_received_index),
            ClientMessage::SentenceCompleted { sentence_index, .. } => {
                r.outbox.complete_sentence(sentence_index)
            }
            _ => Ok(()),
        };
        if let Err(e) = result {
            return error(cx, Some(&rid), ErrorCode::InvalidPayload, e.0);
        }
        self.flush(cx, &rid);
    }

    /// The request whose generation is `seq`.
    fn request_of(&self, seq: SeqId) -> Option<String> {
        self.requests
            .iter()
            .find(|(_, r)| r.seq == Some(seq))
            .map(|(id, _)| id.clone())
    }
}

impl DialectConn for CaiConn {
    fn on_open(&mut self, cx: &mut Cx<'_>, query: &str, _peer: &str) -> Result<(), Refusal> {
        let creds = auth::authenticate(cx.config().keys.as_ref(), query)?;
        self.creds = Some(creds);
        Ok(())
    }

    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        match codec::decode_client(text) {
            Ok(ClientMessage::Completion(c)) => self.on_completion(cx, c),
            Ok(ClientMessage::Interrupted { request_id }) => self.on_interrupt(cx, &request_id),
            Ok(ack) => self.on_ack(cx, ack),
            Err(e) => error(cx, e.request_id.as_deref(), e.code, e.message),
        }
    }

    fn on_binary(&mut self, cx: &mut Cx<'_>, len: usize) {
        error(
            cx,
            None,
            ErrorCode::InvalidRequest,
            format!(
                "binary frames are not supported ({len} bytes received); send JSON text frames"
            ),
        );
    }

    fn on_token(&mut self, cx: &mut Cx<'_>, id: SeqId, piece: &TokenPiece) {
        let Some(rid) = self.request_of(id) else {
            return;
        };
        let Some(r) = self.requests.get_mut(&rid) else {
            return;
        };
        if r.stream {
            r.outbox.push(&piece.text);
        }
        if let Some(reason) = piece.finish {
            let Some((full_content, completion_tokens)) =
                cx.gen(id).map(|g| (g.text.clone(), g.completion_tokens()))
            else {
                return;
            };
            let finish_reason = match reason {
                FinishReason::Length => "length",
                FinishReason::Stop => "stop",
                FinishReason::Cancelled => "interrupted",
                FinishReason::ContentFilter => "content_filter",
                FinishReason::Timeout => {
                    self.charge_generated(cx, completion_tokens);
                    return self.end_stalled(cx, &rid);
                }
            };
            self.charge_generated(cx, completion_tokens);
            if let Some(r) = self.requests.get_mut(&rid) {
                r.done = Some(Done {
                    full_content,
                    completion_tokens,
                    finish_reason,
                });
                r.outbox.finish();
            }
        }
        self.flush(cx, &rid);
    }

    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure) {
        let Some(rid) = self.request_of(id) else {
            return;
        };
        self.requests.remove(&rid);
        self.remember(&rid);
        let tokens = cx.gen(id).map_or(0, |g| g.completion_tokens());
        self.charge_generated(cx, tokens);
        let (code, extra) = match failure.kind {
            FailureKind::ShuttingDown => (ErrorCode::InternalError, json!({"recoverable": true})),
            FailureKind::MemoryPressure | FailureKind::Internal => {
                (ErrorCode::GenerationFailed, json!({}))
            }
        };
        error_with(
            cx,
            Some(&rid),
            code,
            failure.message.clone(),
            details(extra),
        );
    }

    fn on_text_done(&mut self, cx: &mut Cx<'_>, job: TextJobId, result: Result<Encoded, String>) {
        match self.pending.take() {
            Some(p) if p.job == job => self.on_prompt_tokens(cx, p.request_id, p.params, result),
            other => self.pending = other,
        }
    }

    fn on_closed(&mut self, cx: &mut Cx<'_>) {
        // Tokens generated for requests cut off by the disconnect still count
        // against the organisation's limit.
        let running: Vec<SeqId> = self
            .requests
            .values()
            .filter(|r| r.done.is_none())
            .filter_map(|r| r.seq)
            .collect();
        for seq in running {
            let tokens = cx.gen(seq).map_or(0, |g| g.completion_tokens());
            self.charge_generated(cx, tokens);
        }
        self.requests.clear();
        self.pending = None;
    }

    fn on_timer(&mut self, cx: &mut Cx<'_>, _tag: u8) {
        let timeout = cx.config().pause_timeout;
        let now = cx.now;
        let due: Vec<String> = self
            .requests
            .iter()
            .filter(|(_, r)| r.stalled_at.is_some_and(|at| at + timeout <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for rid in due {
            self.end_stalled(cx, &rid);
        }
        self.arm_stall_timer(cx);
    }

    fn on_shutdown(&mut self, cx: &mut Cx<'_>) {
        for rid in std::mem::take(&mut self.requests).into_keys() {
            error_with(
                cx,
                Some(&rid),
                ErrorCode::InternalError,
                "the server is shutting down; retry on another host",
                details(json!({"recoverable": true})),
            );
        }
        self.pending = None;
    }

    fn busy(&self) -> bool {
        self.pending.is_some() || !self.requests.is_empty()
    }

    fn holds_output(&self) -> bool {
        self.requests.values().any(|r| r.done.is_some())
    }
}
