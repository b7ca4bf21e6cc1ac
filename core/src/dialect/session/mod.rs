//! The `session` dialect (seed 001) at `/ws/session`: client-held
//! conversations on stateless hosts. `session_init` (or `session_resume`,
//! after another host crashed) hands the host the conversation; each `prompt`
//! adds a user message, streams `stream_chunk`s and ends with the whole
//! `response`; `session_end` or a disconnect forgets everything.
//!
//! A connection may hold several sessions. Per session: at most one reply in
//! flight; a `prompt`'s `message_index` must be the count of user and
//! assistant messages held. A session starts only once the shell's job
//! verifier has accepted its `job_id` ([`Cx::verify_job`]); the job's token
//! budget caps every reply. The prompt is the newest messages that fit the
//! window (system messages always kept), rendered with the chat template off
//! the Host's thread ([`Cx::encode_chat`]).

pub mod codec;
pub mod http;
pub mod signature;
pub mod state;

use self::signature::PromptKey;
use std::collections::{BTreeMap, VecDeque};

use self::codec::{
    ClientMessage, DecodeError, ErrorCode, ErrorMessage, Inference, Prompt, ServerMessage,
    SessionEnded, SessionReady, SessionStart,
};
use self::state::ClaimError;
use self::state::SessionState;
use super::{Cx, DialectConn};
use crate::api::{JobCheckId, JobGrant, Transport};
use crate::engine::SeqId;
use crate::gen::{Failure, FailureKind, GenRequest, RequestPart, StartError, TokenPiece};
use crate::params::{self, GenParams, ParamNames};
use crate::text::{ChatMessage, Encoded, Role, TextJobId, CONTEXT_TOO_LONG};

/// One conversation held by this connection.
#[derive(Debug)]
struct Session {
    /// The paying job (none for a stateless HTTP request).
    job_id: Option<String>,
    /// The whole conversation, oldest first.
    messages: Vec<ChatMessage>,
    /// The reply in flight.
    turn: Option<Turn>,
    /// Signed prompts: the key each prompt must be signed with.
    key: Option<PromptKey>,
}

impl Session {
    /// User and assistant messages: the next `message_index`.
    fn count(&self) -> u64 {
        self.messages
            .iter()
            .filter(|m| m.role != Role::System)
            .count() as u64
    }
}

/// A reply in flight.
#[derive(Debug, Clone, Copy)]
struct Turn {
    seq: SeqId,
    /// The reply's index (the prompt's plus one).
    message_index: u64,
    stream: bool,
    /// Tokens of the session's job held for this reply (its prompt and the
    /// most it may generate), released when it ends.
    reserved: u64,
}

/// What the connection waits for before its next message.
#[derive(Debug)]
enum Waiting {
    /// The job verifier's verdict on a `session_init` / `session_resume`.
    Verdict {
        check: JobCheckId,
        start: SessionStart,
    },
    /// The token count of a new session's context, for `session_ready`.
    Context { job: TextJobId, session_id: String },
    /// A prompt's tokens.
    Prompt {
        job: TextJobId,
        session_id: String,
        params: GenParams,
        stream: bool,
    },
}

/// One `/ws/session` connection (or one `POST /v1/inference`).
#[derive(Debug, Default)]
pub struct SessionConn {
    sessions: BTreeMap<String, Session>,
    /// Messages of earlier frames (or later ones of an array) waiting behind
    /// `waiting`, in order.
    backlog: VecDeque<Result<ClientMessage, DecodeError>>,
    waiting: Option<Waiting>,
}

/// The session id a stateless HTTP request runs under (never registered).
const HTTP_SESSION: &str = "";

fn send(cx: &mut Cx<'_>, msg: ServerMessage) {
    if let ServerMessage::Error(e) = &msg {
        cx.count_error(e.code.as_str());
    }
    cx.send_text(codec::encode_server(&msg));
}

fn error(cx: &mut Cx<'_>, session_id: Option<&str>, code: ErrorCode, message: impl Into<String>) {
    error_with(cx, session_id, code, message.into(), None);
}

fn error_with(
    cx: &mut Cx<'_>,
    session_id: Option<&str>,
    code: ErrorCode,
    message: String,
    expected: Option<u64>,
) {
    let recoverable = !matches!(code, ErrorCode::TokenBudgetExhausted);
    let e = ErrorMessage {
        session_id: session_id.filter(|s| !s.is_empty()).map(str::to_string),
        code,
        message,
        expected,
        recoverable,
        timestamp: cx.unix_ms(),
    };
    send(cx, ServerMessage::Error(e));
}

/// The error code and message for a generation that could not start.
fn start_error(e: &StartError) -> (ErrorCode, String) {
    let code = match e {
        StartError::ContextLength { .. }
        | StartError::PromptTooLong { .. }
        | StartError::NeverFits { .. } => ErrorCode::ContextLengthExceeded,
        StartError::QueueFull
        | StartError::ConnQueueFull { .. }
        | StartError::RateLimited { .. } => ErrorCode::RateLimited,
        StartError::TokenOutOfVocab { .. } => ErrorCode::InvalidRequest,
        StartError::ContentFiltered { .. } => ErrorCode::ContentFilter,
        StartError::ShuttingDown | StartError::NotLoaded => ErrorCode::InternalError,
    };
    (code, e.message("max_tokens"))
}

impl SessionConn {
    /// Handles queued messages until one has to wait for an answer.
    fn pump(&mut self, cx: &mut Cx<'_>) {
        while self.waiting.is_none() {
            let Some(next) = self.backlog.pop_front() else {
                return;
            };
            match next {
                Ok(msg) => self.on_message(cx, msg),
                Err(e) => error(
                    cx,
                    e.session_id.as_deref(),
                    ErrorCode::InvalidRequest,
                    e.message,
                ),
            }
        }
    }

    fn on_message(&mut self, cx: &mut Cx<'_>, msg: ClientMessage) {
        match msg {
            ClientMessage::SessionInit(start) | ClientMessage::SessionResume(start) => {
                self.on_start(cx, start)
            }
            ClientMessage::Prompt(p) => self.on_prompt(cx, p),
            ClientMessage::SessionEnd { session_id } => self.on_end(cx, &session_id),
            ClientMessage::Inference(i) if cx.transport == Transport::Http => {
                self.on_inference(cx, i)
            }
            ClientMessage::Inference(_) => error(
                cx,
                None,
                ErrorCode::InvalidRequest,
                "unknown message type `inference`; expected session_init, session_resume, prompt or session_end",
            ),
        }
    }

    /// A model name that is not the served one.
    fn wrong_model(cx: &Cx<'_>, model: Option<&str>) -> Option<String> {
        let served = &cx.model().name;
        model
            .filter(|m| *m != served)
            .map(|m| format!("invalid `model`: unknown model `{m}`; this server serves `{served}`"))
    }

    fn on_start(&mut self, cx: &mut Cx<'_>, start: SessionStart) {
        let sid = start.session_id.clone();
        if let Some(message) = Self::wrong_model(cx, start.model.as_deref()) {
            return error(cx, Some(&sid), ErrorCode::InvalidRequest, message);
        }
        match start.public_key.as_deref().map(PromptKey::parse) {
            Some(Err(why)) => {
                return error(cx, Some(&sid), ErrorCode::InvalidRequest, format!("invalid {why}"))
            }
            None if cx.config().require_signatures => {
                return error(
                    cx,
                    Some(&sid),
                    ErrorCode::InvalidRequest,
                    "this server requires signed prompts (--require-signatures): send `public_key` with session_init or session_resume",
                )
            }
            _ => {}
        }
        if let Some(last) = start.last_message_index {
            let expected = (start.conversation_context.len() as u64).checked_sub(1);
            if expected != Some(last) {
                let message = match expected {
                    Some(e) => format!("`last_message_index` is {last} but `conversation_context` holds {} messages, so it must be {e}", e + 1),
                    None => format!("`last_message_index` is {last} but `conversation_context` is empty"),
                };
                return error_with(
                    cx,
                    Some(&sid),
                    ErrorCode::MessageIndexMismatch,
                    message,
                    expected,
                );
            }
        }
        let most = cx.config().max_sessions_per_conn;
        if self.sessions.len() >= most && !self.sessions.contains_key(&sid) {
            return error(
                cx,
                Some(&sid),
                ErrorCode::RateLimited,
                format!("this connection holds {most} sessions, the most one connection may; end one first"),
            );
        }
        let bytes = text_bytes(&start.conversation_context);
        let max_bytes = cx.config().session_max_context_bytes;
        if bytes > max_bytes {
            return error(
                cx,
                Some(&sid),
                ErrorCode::InvalidRequest,
                format!("invalid `conversation_context`: {bytes} bytes of messages, more than the {max_bytes} a session may keep"),
            );
        }
        match claim_session(cx, &sid) {
            Ok(()) => {}
            Err(ClaimError::Exists) => return error(
                cx,
                Some(&sid),
                ErrorCode::SessionExists,
                "this session is already live on this host; end it first or use another session_id",
            ),
            Err(ClaimError::Full) => {
                return error(
                    cx,
                    Some(&sid),
                    ErrorCode::RateLimited,
                    "this host holds as many sessions as it may; retry later or on another host",
                )
            }
        }
        let check = cx.verify_job(start.job_id.clone(), start.public_key.clone());
        self.waiting = Some(Waiting::Verdict { check, start });
    }

    fn on_verdict(
        &mut self,
        cx: &mut Cx<'_>,
        start: SessionStart,
        verdict: Result<JobGrant, String>,
    ) {
        let sid = start.session_id;
        let grant = match verdict {
            Ok(g) => g,
            Err(why) => {
                release_session(cx, &sid);
                return error(
                    cx,
                    Some(&sid),
                    ErrorCode::InvalidRequest,
                    format!("invalid `job_id`: the job was not accepted: {why}"),
                );
            }
        };
        cx.state::<SessionState>()
            .jobs
            .grant(&start.job_id, grant.token_budget);
        let messages = start.conversation_context;
        let key = start
            .public_key
            .as_deref()
            .and_then(|k| PromptKey::parse(k).ok());
        let session = Session {
            job_id: Some(start.job_id),
            messages: messages.clone(),
            turn: None,
            key,
        };
        self.sessions.insert(sid.clone(), session);
        if messages.is_empty() {
            return self.ready(cx, &sid, 0, 0);
        }
        let budget = self.default_prompt_budget(cx);
        let max_messages = cx.config().session_max_messages;
        let job = match cx.encode_chat(messages, max_messages, budget) {
            Ok(job) => job,
            Err(e) => {
                self.forget(cx, &sid);
                let (code, message) = start_error(&e);
                return error(cx, Some(&sid), code, message);
            }
        };
        self.waiting = Some(Waiting::Context {
            job,
            session_id: sid,
        });
    }

    /// Prompt tokens a context may use in `session_ready`'s count: the whole
    /// window but one token for the reply. Each prompt then fits the window
    /// beside its own `max_tokens`, dropping more old messages if it must.
    fn default_prompt_budget(&self, cx: &Cx<'_>) -> u32 {
        cx.model().context_len.saturating_sub(1)
    }

    fn ready(&mut self, cx: &mut Cx<'_>, sid: &str, context_tokens: u32, truncated: u32) {
        let message_count = self.sessions.get(sid).map_or(0, Session::count);
        let ready = SessionReady {
            session_id: sid.to_string(),
            message_count,
            context_tokens,
            truncated_messages: truncated,
            timestamp: cx.unix_ms(),
        };
        send(cx, ServerMessage::SessionReady(ready));
    }

    /// Forgets a session: its id, its conversation, its reply in flight
    /// (ended with no response).
    fn forget(&mut self, cx: &mut Cx<'_>, sid: &str) -> bool {
        let Some(session) = self.sessions.remove(sid) else {
            return false;
        };
        if let Some(turn) = session.turn {
            settle(cx, session.job_id.as_deref(), turn);
            cx.end(turn.seq, crate::gen::FinishReason::Cancelled);
        }
        release_session(cx, sid);
        true
    }

    fn on_end(&mut self, cx: &mut Cx<'_>, sid: &str) {
        if !self.forget(cx, sid) {
            return error(
                cx,
                Some(sid),
                ErrorCode::UnknownSession,
                "no such session on this connection",
            );
        }
        let ended = SessionEnded {
            session_id: sid.to_string(),
            timestamp: cx.unix_ms(),
        };
        send(cx, ServerMessage::SessionEnded(ended));
    }

    fn on_prompt(&mut self, cx: &mut Cx<'_>, p: Prompt) {
        let sid = p.session_id.clone();
        let Some(session) = self.sessions.get(&sid) else {
            return error(
                cx,
                Some(&sid),
                ErrorCode::UnknownSession,
                "no such session on this connection; send session_init or session_resume first",
            );
        };
        if session.turn.is_some() {
            return error(
                cx,
                Some(&sid),
                ErrorCode::InvalidRequest,
                "a response is already streaming for this session; wait for it before the next prompt",
            );
        }
        let expected = session.count();
        if p.message_index != expected {
            return error_with(
                cx,
                Some(&sid),
                ErrorCode::MessageIndexMismatch,
                format!("`message_index` is {} but the session holds {expected} messages, so it must be {expected}", p.message_index),
                Some(expected),
            );
        }
        if let Some(key) = &session.key {
            if let Err(why) = key.verify(&sid, p.message_index, &p.content, p.signature.as_deref())
            {
                return error(cx, Some(&sid), ErrorCode::InvalidRequest, why);
            }
        }
        self.run(cx, sid, p.content, &p.sampling, p.stream);
    }

    /// Validates a turn's parameters, adds the user message and has the
    /// prompt built.
    fn run(
        &mut self,
        cx: &mut Cx<'_>,
        sid: String,
        content: String,
        sampling: &serde_json::Map<String, serde_json::Value>,
        stream: bool,
    ) {
        let context_len = cx.model().context_len;
        let defaults = GenParams::defaults(cx.config().default_max_tokens.min(context_len));
        let params =
            match params::apply(sampling, "", &ParamNames::STANDARD, &defaults, context_len) {
                Ok(p) => p,
                Err(e) => return error(cx, Some(&sid), ErrorCode::InvalidRequest, e.to_string()),
            };
        let job_id = self.sessions.get(&sid).and_then(|s| s.job_id.clone());
        if let Some(job) = &job_id {
            if cx.state::<SessionState>().jobs.remaining(job) == Some(0) {
                return error(
                    cx,
                    Some(&sid),
                    ErrorCode::TokenBudgetExhausted,
                    "the job has no tokens left on this host (used, or held by its replies in flight)",
                );
            }
        }
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        let kept = text_bytes(&session.messages);
        let max_bytes = cx.config().session_max_context_bytes;
        if kept + content.len() > max_bytes {
            return error(
                cx,
                Some(&sid),
                ErrorCode::InvalidRequest,
                format!(
                    "the session keeps {kept} bytes of messages and this prompt adds {}, more than the {max_bytes} a session may keep; end it and resume it with a shorter `conversation_context`",
                    content.len()
                ),
            );
        }
        session.messages.push(ChatMessage::new(Role::User, content));
        let messages = session.messages.clone();
        let max_messages = cx.config().session_max_messages;
        let budget = context_len.saturating_sub(params.max_tokens);
        let job = match cx.encode_chat(messages, max_messages, budget) {
            Ok(job) => job,
            Err(e) => {
                self.unprompt(&sid);
                let (code, message) = start_error(&e);
                return error(cx, Some(&sid), code, message);
            }
        };
        self.waiting = Some(Waiting::Prompt {
            job,
            session_id: sid,
            params,
            stream,
        });
    }

    /// Takes back a prompt's user message that got no reply.
    fn unprompt(&mut self, sid: &str) {
        if let Some(s) = self.sessions.get_mut(sid) {
            if s.messages.last().is_some_and(|m| m.role == Role::User) {
                s.messages.pop();
            }
        }
    }

    fn on_prompt_tokens(
        &mut self,
        cx: &mut Cx<'_>,
        sid: String,
        mut params: GenParams,
        stream: bool,
        result: Result<Encoded, String>,
    ) {
        let encoded = match result {
            Ok(e) => e,
            Err(e) => {
                self.unprompt(&sid);
                let (code, message) = match e.strip_prefix(CONTEXT_TOO_LONG) {
                    Some(rest) => (
                        ErrorCode::ContextLengthExceeded,
                        format!(
                            "the newest message with the system messages is{rest}, more than the {} the context leaves beside max_tokens ({})",
                            cx.model().context_len.saturating_sub(params.max_tokens),
                            params.max_tokens
                        ),
                    ),
                    None => (ErrorCode::InvalidRequest, format!("the prompt could not be tokenized: {e}")),
                };
                return error(cx, Some(&sid), code, message);
            }
        };
        let Some(session) = self.sessions.get(&sid) else {
            return;
        };
        let prompt_tokens = encoded.ids.len() as u64;
        if let Some(remaining) = session
            .job_id
            .as_ref()
            .and_then(|j| cx.state::<SessionState>().jobs.remaining(j))
        {
            if prompt_tokens >= remaining {
                self.unprompt(&sid);
                return error(
                    cx,
                    Some(&sid),
                    ErrorCode::TokenBudgetExhausted,
                    format!("the prompt needs {prompt_tokens} tokens but the job has {remaining} left on this host beyond what its replies in flight hold"),
                );
            }
            let room = u32::try_from(remaining - prompt_tokens).unwrap_or(u32::MAX);
            params.max_tokens = params.max_tokens.min(room);
        }
        let reserved = prompt_tokens + u64::from(params.max_tokens);
        let job = session.job_id.clone();
        let message_index = session.count();
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
                if let Some(job) = &job {
                    cx.state::<SessionState>().jobs.reserve(job, reserved);
                }
                if let Some(s) = self.sessions.get_mut(&sid) {
                    s.turn = Some(Turn {
                        seq,
                        message_index,
                        stream,
                        reserved,
                    });
                }
            }
            Err(e) => {
                self.unprompt(&sid);
                let (code, message) = start_error(&e);
                error(cx, Some(&sid), code, message);
            }
        }
    }

    fn on_inference(&mut self, cx: &mut Cx<'_>, i: Inference) {
        if let Some(message) = Self::wrong_model(cx, i.model.as_deref()) {
            return error(cx, None, ErrorCode::InvalidRequest, message);
        }
        self.sessions.insert(
            HTTP_SESSION.to_string(),
            Session {
                job_id: None,
                messages: i.conversation_context,
                turn: None,
                key: None,
            },
        );
        self.run(
            cx,
            HTTP_SESSION.to_string(),
            i.prompt,
            &i.sampling,
            i.stream,
        );
    }

    /// The session whose reply is generation `seq`.
    fn session_of(&self, seq: SeqId) -> Option<String> {
        self.sessions
            .iter()
            .find(|(_, s)| s.turn.is_some_and(|t| t.seq == seq))
            .map(|(id, _)| id.clone())
    }
}

impl DialectConn for SessionConn {
    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        match codec::decode_frame(text) {
            Ok(messages) => self.backlog.extend(messages),
            Err(e) => self.backlog.push_back(Err(e)),
        }
        self.pump(cx);
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
        let Some(sid) = self.session_of(id) else {
            return;
        };
        let Some(turn) = self.sessions.get(&sid).and_then(|s| s.turn) else {
            return;
        };
        if turn.stream && !piece.text.is_empty() {
            let chunk = codec::StreamChunk {
                session_id: sid.clone(),
                content: piece.text.clone(),
                message_index: turn.message_index,
                timestamp: cx.unix_ms(),
            };
            send(cx, ServerMessage::StreamChunk(chunk));
        }
        let Some(reason) = piece.finish else {
            return;
        };
        let Some(content) = cx.gen(id).map(|g| g.text.clone()) else {
            return;
        };
        let Some(session) = self.sessions.get_mut(&sid) else {
            return;
        };
        session.turn = None;
        session
            .messages
            .push(ChatMessage::new(Role::Assistant, content.clone()));
        let job = session.job_id.clone();
        let used = settle(cx, job.as_deref(), turn);
        let response = codec::Response {
            session_id: sid,
            content,
            tokens_used: used,
            message_index: turn.message_index,
            finish_reason: reason.as_str().to_string(),
            timestamp: cx.unix_ms(),
        };
        send(cx, ServerMessage::Response(response));
    }

    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure) {
        let Some(sid) = self.session_of(id) else {
            return;
        };
        if let Some(s) = self.sessions.get_mut(&sid) {
            if let Some(turn) = s.turn.take() {
                let job = s.job_id.clone();
                settle(cx, job.as_deref(), turn);
            }
        }
        self.unprompt(&sid);
        let code = match failure.kind {
            FailureKind::MemoryPressure => ErrorCode::RateLimited,
            FailureKind::Internal | FailureKind::ShuttingDown => ErrorCode::InternalError,
        };
        error(cx, Some(&sid), code, failure.message.clone());
    }

    fn on_text_done(&mut self, cx: &mut Cx<'_>, job: TextJobId, result: Result<Encoded, String>) {
        match self.waiting.take() {
            Some(Waiting::Context { job: j, session_id }) if j == job => match result {
                Ok(enc) => self.ready(cx, &session_id, enc.ids.len() as u32, enc.dropped),
                Err(e) => {
                    self.forget(cx, &session_id);
                    let code = if e.starts_with(CONTEXT_TOO_LONG) {
                        ErrorCode::ContextLengthExceeded
                    } else {
                        ErrorCode::InvalidRequest
                    };
                    error(
                        cx,
                        Some(&session_id),
                        code,
                        format!("the conversation cannot be used as a context: {e}"),
                    );
                }
            },
            Some(Waiting::Prompt {
                job: j,
                session_id,
                params,
                stream,
            }) if j == job => self.on_prompt_tokens(cx, session_id, params, stream, result),
            other => self.waiting = other,
        }
        self.pump(cx);
    }

    fn on_job_verified(
        &mut self,
        cx: &mut Cx<'_>,
        check: JobCheckId,
        verdict: Result<JobGrant, String>,
    ) {
        match self.waiting.take() {
            Some(Waiting::Verdict { check: c, start }) if c == check => {
                self.on_verdict(cx, start, verdict)
            }
            other => self.waiting = other,
        }
        self.pump(cx);
    }

    fn on_closed(&mut self, cx: &mut Cx<'_>) {
        // A session whose job is still being checked holds its id too.
        if let Some(Waiting::Verdict { start, .. }) = &self.waiting {
            release_session(cx, &start.session_id);
        }
        for (sid, session) in std::mem::take(&mut self.sessions) {
            if let Some(turn) = session.turn {
                settle(cx, session.job_id.as_deref(), turn);
            }
            release_session(cx, &sid);
        }
        self.backlog.clear();
        self.waiting = None;
    }

    fn busy(&self) -> bool {
        self.waiting.is_some() || self.sessions.values().any(|s| s.turn.is_some())
    }
}

/// A reply ended, however it ended (finished, failed, or cut short by its
/// session's end or its connection's close): what it used, its prompt and
/// the tokens it generated, is charged to its session's `job`, and the rest
/// of its hold released. Returns what it used.
fn settle(cx: &mut Cx<'_>, job: Option<&str>, turn: Turn) -> u32 {
    let used = cx
        .gen(turn.seq)
        .map_or(0, |g| g.prompt_tokens() + g.completion_tokens());
    if let Some(job) = job {
        cx.state::<SessionState>()
            .jobs
            .settle(job, turn.reserved, u64::from(used));
    }
    used
}

/// Takes session `sid` for this connection, within its principal.
fn claim_session(cx: &mut Cx<'_>, sid: &str) -> Result<(), ClaimError> {
    let (owner, conn) = (cx.principal.clone(), cx.conn);
    cx.state::<SessionState>().sessions.claim(&owner, sid, conn)
}

/// Gives session `sid` back, if this connection holds it.
fn release_session(cx: &mut Cx<'_>, sid: &str) {
    let (owner, conn) = (cx.principal.clone(), cx.conn);
    cx.state::<SessionState>()
        .sessions
        .release(&owner, sid, conn);
}

/// Bytes of message text in `messages` (what a session's bound counts).
fn text_bytes(messages: &[ChatMessage]) -> usize {
    messages.iter().map(|m| m.content.len()).sum()
}
