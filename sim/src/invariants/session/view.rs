//! A `session` connection as the checkers see it.
//!
//! The dialect answers a connection's messages one at a time, in order: a
//! frame may hold several, and while one waits for its job check or its text
//! job the Host holds the frames behind it. So the view keeps the messages not
//! yet answered, oldest first, and each reply (`session_ready`,
//! `session_ended`, an `error`) answers the oldest. A prompt whose tokens came
//! back and that got no error in that event has started its turn, silently:
//! the turn's first frame may come much later. Turn frames (`stream_chunk`,
//! `response`, and the `error` of a failed turn) belong to the session's reply
//! in flight. A live session keeps its conversation as the Host must hold it:
//! the context its start handed over, then each turn's user message and reply.

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;
use tokenwire_core::dialect::session::codec::{self, ClientMessage};
use tokenwire_core::{ChatMessage, Instant, JobCheckId, Role, TextDone, TextJobId};

use crate::invariants::Frame;

/// Codes a prompt may get once its tokens are back, before a turn starts.
const LATE_PROMPT_ERRORS: [&str; 4] = [
    "context_length_exceeded",
    "token_budget_exhausted",
    "rate_limited",
    "internal_error",
];

/// Codes of a turn that failed after it started.
pub const FAILURE_CODES: [&str; 2] = ["rate_limited", "internal_error"];

/// An HTTP request's one-turn session (`POST /v1/inference`), which no
/// other session checker judges (`session_http` judges what its client
/// gets): whether its frame arrived, its turn started (`RequestStarted`)
/// and it was answered (a `response` or an `error`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InferenceView {
    /// Its `inference` frame arrived.
    pub sent: bool,
    /// Its turn started.
    pub started: bool,
    /// It got its `response` or `error`.
    pub answered: bool,
}

impl InferenceView {
    /// What is outstanding on it: the request, once sent until answered.
    pub fn outstanding(&self) -> Option<String> {
        (self.sent && !self.answered).then(|| "an HTTP inference unanswered".to_string())
    }

    /// True when `f` is the `error` of a turn that started (a failure,
    /// rather than a refusal).
    pub fn is_turn_failure(&self, f: &Frame) -> bool {
        f.kind() == "error" && self.started
    }

    /// A frame the Host sent to it.
    pub fn on_frame(&mut self, f: &Frame) {
        if matches!(f.kind(), "response" | "error") {
            self.answered = true;
        }
    }
}

/// What a client message asks.
#[derive(Debug, Clone, PartialEq)]
pub enum MsgKind {
    /// `session_init` or `session_resume`, with the conversation it hands over.
    Start {
        /// The session.
        sid: String,
        /// `session_resume`.
        resume: bool,
        /// `conversation_context`, oldest first.
        context: Vec<ChatMessage>,
        /// `session_resume`'s `last_message_index`.
        last_index: Option<u64>,
        /// The model it named.
        model: Option<String>,
        /// Its `public_key`, as sent: the session's prompts must be signed.
        public_key: Option<String>,
        /// Its `job_id`.
        job: String,
    },
    /// `prompt`.
    Prompt {
        /// The session.
        sid: String,
        /// Its `message_index`.
        index: u64,
        /// Whether it asked for `stream_chunk`s.
        stream: bool,
        /// The user's message.
        content: String,
        /// Its `max_tokens`, when it gave a whole number.
        max_tokens: Option<u64>,
        /// Its `signature`, as sent.
        signature: Option<String>,
    },
    /// `session_end`.
    End {
        /// The session.
        sid: String,
    },
    /// Anything else (a message that does not decode, a binary frame, text
    /// that is not JSON): answered with an `error` naming `sid`, if readable.
    Other {
        /// The session the message named.
        sid: Option<String>,
    },
}

impl MsgKind {
    /// The session the message names.
    pub fn sid(&self) -> Option<&str> {
        match self {
            MsgKind::Start { sid, .. } | MsgKind::Prompt { sid, .. } | MsgKind::End { sid } => {
                Some(sid)
            }
            MsgKind::Other { sid } => sid.as_deref(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            MsgKind::Start { resume: false, .. } => "session_init",
            MsgKind::Start { resume: true, .. } => "session_resume",
            MsgKind::Prompt { .. } => "prompt",
            MsgKind::End { .. } => "session_end",
            MsgKind::Other { .. } => "invalid message",
        }
    }
}

/// Where a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Not handled yet.
    Sent,
    /// A start's job id is being verified.
    Verifying(JobCheckId),
    /// The verdict came back in this event.
    Verified,
    /// A start's context or a prompt is being tokenized.
    Tokenizing(TextJobId),
    /// Its tokens came back in this event.
    Tokenized,
}

/// A message not yet answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    /// What it asks.
    pub kind: MsgKind,
    /// Where it is.
    pub stage: Stage,
    /// A start's context as the tokenizer fitted it: (tokens, messages left out).
    pub fitted: Option<(u32, u32)>,
    /// A start's verdict: accepted or not.
    pub accepted: Option<bool>,
    /// Its `type` as the frame holds it, read without the dialect's
    /// decoder (which the checkers judge: a message it refuses is `Other`).
    pub raw_type: Option<String>,
    /// Its `job_id` as the frame holds it (flat, or in the envelope's
    /// `payload`), read without the decoder.
    pub raw_job: Option<Value>,
}

/// A session's reply in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The prompt's `message_index`.
    pub prompt_index: u64,
    /// Messages the session held when the prompt was accepted.
    pub count_at_start: u64,
    /// The prompt asked for `stream_chunk`s.
    pub stream: bool,
    /// The user's message.
    pub prompt: String,
    /// The `stream_chunk` contents so far, in order.
    pub chunks: String,
    /// `stream_chunk` frames so far.
    pub chunk_frames: u32,
    /// When it started.
    pub started_at: Instant,
    /// It started after graceful shutdown began.
    pub after_shutdown: bool,
    /// Its prompt's tokens, as the Host counted them.
    pub prompt_tokens: u32,
}

/// A session live on the connection (`session_ready` seen, not ended).
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    /// The conversation as the Host must hold it.
    pub history: Vec<ChatMessage>,
    /// User and assistant messages in it: the next `message_index`.
    pub count: u64,
    /// The reply in flight.
    pub turn: Option<Turn>,
    /// The last `response`'s `message_index`.
    pub last_index: Option<u64>,
    /// The `public_key` its start gave: its prompts must carry signatures
    /// that verify for it.
    pub key: Option<String>,
    /// The job its start named, whose token budget its turns draw on.
    pub job: String,
}

impl Live {
    /// A session its start just made live: `context` as its history, no
    /// reply in flight yet.
    pub fn started(context: Vec<ChatMessage>, key: Option<String>, job: String) -> Live {
        Live {
            count: count_of(&context),
            history: context,
            turn: None,
            last_index: None,
            key,
            job,
        }
    }
}

/// User and assistant messages of a conversation.
pub fn count_of(messages: &[ChatMessage]) -> u64 {
    messages.iter().filter(|m| m.role != Role::System).count() as u64
}

/// One `session` connection.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionConnView {
    /// Messages sent and not yet answered, oldest first.
    pub queue: VecDeque<Msg>,
    /// Sessions live on this connection.
    pub live: BTreeMap<String, Live>,
    /// Turns started on this connection.
    pub turns_started: u64,
}

fn kind_of(m: ClientMessage) -> MsgKind {
    match m {
        ClientMessage::SessionInit(s) | ClientMessage::SessionResume(s) => MsgKind::Start {
            resume: s.last_message_index.is_some(),
            sid: s.session_id,
            context: s.conversation_context,
            last_index: s.last_message_index,
            model: s.model,
            public_key: s.public_key,
            job: s.job_id,
        },
        ClientMessage::Prompt(p) => MsgKind::Prompt {
            max_tokens: p.sampling.get("max_tokens").and_then(|v| v.as_u64()),
            sid: p.session_id,
            index: p.message_index,
            stream: p.stream,
            content: p.content,
            signature: p.signature,
        },
        ClientMessage::SessionEnd { session_id } => MsgKind::End { sid: session_id },
        ClientMessage::Inference(_) => MsgKind::Other { sid: None },
    }
}

fn other(sid: Option<String>) -> MsgKind {
    MsgKind::Other {
        sid: sid.filter(|s| !s.is_empty()),
    }
}

/// The `code` of an `error` frame.
pub fn code(f: &Frame) -> &str {
    f.str("code").unwrap_or("")
}

/// A message's fields as they stand in the frame, read without the
/// dialect's decoder (which the checkers judge).
#[derive(Debug, Clone, Default)]
struct Raw {
    /// Its `type`.
    kind: Option<String>,
    /// Its `job_id` (flat, or in the envelope's `payload`).
    job: Option<Value>,
    /// Its `conversation_context`, when every item is a message with a
    /// known role and string content.
    context: Option<Vec<ChatMessage>>,
}

/// A message's [`Raw`] fields.
fn raw_fields(v: &Value) -> Raw {
    let field = |k: &str| v.get(k).or_else(|| v.get("payload").and_then(|p| p.get(k)));
    let context = field("conversation_context")
        .and_then(Value::as_array)
        .and_then(|items| {
            items
                .iter()
                .map(|m| {
                    Some(ChatMessage::new(
                        Role::parse(m.get("role")?.as_str()?)?,
                        m.get("content")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        });
    Raw {
        kind: v.get("type").and_then(Value::as_str).map(str::to_string),
        job: field("job_id").cloned(),
        context,
    }
}

impl SessionConnView {
    fn push(&mut self, mut kind: MsgKind, raw: Raw) {
        // A start's context as the frame holds it: the history the checkers
        // hold the Host to does not come through the decoder they judge.
        if let (MsgKind::Start { context, .. }, Some(sent)) = (&mut kind, raw.context) {
            *context = sent;
        }
        self.queue.push_back(Msg {
            kind,
            stage: Stage::Sent,
            fitted: None,
            accepted: None,
            raw_type: raw.kind,
            raw_job: raw.job,
        });
    }

    /// A text frame arrived (one over `max_frame` closes the connection).
    pub fn on_text(&mut self, text: &str, max_frame: usize) {
        if text.len() > max_frame {
            return;
        }
        // Each message's raw fields, in the order the decoder lists them.
        let raw: Vec<Raw> = match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => items.iter().map(raw_fields).collect(),
            Ok(v) => vec![raw_fields(&v)],
            Err(_) => Vec::new(),
        };
        match codec::decode_frame(text) {
            Err(e) => self.push(other(e.session_id), Raw::default()),
            Ok(list) => {
                for (i, m) in list.into_iter().enumerate() {
                    let kind = match m {
                        Ok(m) => kind_of(m),
                        Err(e) => other(e.session_id),
                    };
                    self.push(kind, raw.get(i).cloned().unwrap_or_default());
                }
            }
        }
    }

    /// A binary frame arrived.
    pub fn on_binary(&mut self) {
        self.push(other(None), Raw::default());
    }

    /// The oldest message not yet answered.
    pub fn head(&self) -> Option<&Msg> {
        self.queue.front()
    }

    /// The message the Host handles next: the oldest, or the one behind it
    /// when the oldest is a prompt whose tokens came back (which has started
    /// its turn, unless its refusal comes first).
    pub fn next_handled(&self) -> Option<&Msg> {
        match self.queue.front() {
            Some(Msg {
                kind: MsgKind::Prompt { .. },
                stage: Stage::Tokenized,
                ..
            }) => self.queue.get(1),
            m => m,
        }
    }

    /// The Host asked to verify a job: the next message, a start, waits.
    pub fn on_verify(&mut self, now: Instant, shutting_down: bool, check: JobCheckId) {
        self.resolve(now, shutting_down, None);
        if let Some(m) = self.queue.front_mut() {
            if matches!(m.kind, MsgKind::Start { .. }) && m.stage == Stage::Sent {
                m.stage = Stage::Verifying(check);
            }
        }
    }

    /// The verdict on `check` came back (`accepted` or not).
    pub fn on_verified(&mut self, check: JobCheckId, accepted: bool) {
        if let Some(m) = self.queue.front_mut() {
            if m.stage == Stage::Verifying(check) {
                m.stage = Stage::Verified;
                m.accepted = Some(accepted);
            }
        }
    }

    /// The Host asked to tokenize: a verified start's context or a prompt.
    pub fn on_tokenize(&mut self, now: Instant, shutting_down: bool, job: TextJobId) {
        self.resolve(now, shutting_down, None);
        if let Some(m) = self.queue.front_mut() {
            let ok = match m.kind {
                MsgKind::Start { .. } => m.stage == Stage::Verified,
                MsgKind::Prompt { .. } => m.stage == Stage::Sent,
                _ => false,
            };
            if ok {
                m.stage = Stage::Tokenizing(job);
            }
        }
    }

    /// A text job came back.
    pub fn on_tokenized(&mut self, done: &TextDone) {
        if let Some(m) = self.queue.front_mut() {
            if m.stage == Stage::Tokenizing(done.id) {
                m.stage = Stage::Tokenized;
                m.fitted = done
                    .result
                    .as_ref()
                    .ok()
                    .map(|e| (e.ids.len() as u32, e.dropped));
            }
        }
    }

    /// The session `sid`'s reply in flight.
    pub fn turn(&self, sid: &str) -> Option<&Turn> {
        self.live.get(sid).and_then(|l| l.turn.as_ref())
    }

    /// True for the `error` that ends a session's turn.
    pub fn is_turn_failure(&self, f: &Frame) -> bool {
        f.kind() == "error"
            && FAILURE_CODES.contains(&code(f))
            && f.str("session_id").is_some_and(|s| self.turn(s).is_some())
    }

    /// True for frames that belong to a turn (not replies to a message).
    pub fn is_turn_frame(&self, f: &Frame) -> bool {
        matches!(f.kind(), "stream_chunk" | "response") || self.is_turn_failure(f)
    }

    /// True when `f` is the error a prompt whose tokens are back gets
    /// instead of its turn.
    pub fn refuses_tokenized_prompt(f: &Frame, sid: &str) -> bool {
        let c = code(f);
        f.kind() == "error"
            && f.str("session_id") == Some(sid)
            && (LATE_PROMPT_ERRORS.contains(&c)
                || (c == "invalid_request"
                    && f.str("message")
                        .is_some_and(|m| m.starts_with("the prompt could not be tokenized"))))
    }

    /// A prompt whose tokens came back starts its turn unless `reply`
    /// (this connection's next reply in the event, if any) refuses it.
    fn resolve(&mut self, now: Instant, shutting_down: bool, reply: Option<&Frame>) {
        let Some(m) = self.queue.front() else {
            return;
        };
        let MsgKind::Prompt {
            sid,
            index,
            stream,
            content,
            ..
        } = &m.kind
        else {
            return;
        };
        if m.stage != Stage::Tokenized
            || reply.is_some_and(|f| Self::refuses_tokenized_prompt(f, sid))
        {
            return;
        }
        let (sid, index, stream, content) = (sid.clone(), *index, *stream, content.clone());
        let prompt_tokens = m.fitted.map_or(0, |(n, _)| n);
        self.queue.pop_front();
        self.turns_started += 1;
        if let Some(l) = self.live.get_mut(&sid) {
            l.turn = Some(Turn {
                prompt_index: index,
                count_at_start: l.count,
                stream,
                prompt: content,
                chunks: String::new(),
                chunk_frames: 0,
                started_at: now,
                after_shutdown: shutting_down,
                prompt_tokens,
            });
        }
    }

    /// The prompt at the head would start its turn before `f` is handled.
    pub fn starts_before(&self, f: &Frame) -> bool {
        match self.queue.front() {
            Some(Msg {
                kind: MsgKind::Prompt { sid, .. },
                stage: Stage::Tokenized,
                ..
            }) => !self.is_turn_frame(f) && !Self::refuses_tokenized_prompt(f, sid),
            _ => false,
        }
    }

    /// The message `f` answers (None for turn frames): the head, or the one
    /// behind it when the head is a prompt that starts its turn first.
    pub fn answered_by(&self, f: &Frame) -> Option<&Msg> {
        if self.is_turn_frame(f) {
            return None;
        }
        let skip = usize::from(self.starts_before(f));
        self.queue.get(skip)
    }

    /// The server sent `f` on this connection (`shutting_down`: graceful
    /// shutdown has begun).
    pub fn on_frame(&mut self, now: Instant, shutting_down: bool, f: &Frame) {
        let sid = f.str("session_id").unwrap_or("").to_string();
        match f.kind() {
            "stream_chunk" => {
                if let Some(t) = self.live.get_mut(&sid).and_then(|l| l.turn.as_mut()) {
                    t.chunks.push_str(f.str("content").unwrap_or(""));
                    t.chunk_frames += 1;
                }
                return;
            }
            "response" => {
                if let Some(l) = self.live.get_mut(&sid) {
                    if let Some(t) = l.turn.take() {
                        l.history.push(ChatMessage::new(Role::User, t.prompt));
                        l.history.push(ChatMessage::new(
                            Role::Assistant,
                            f.str("content").unwrap_or("").to_string(),
                        ));
                        l.count += 2;
                    }
                    l.last_index = f.v["message_index"].as_u64();
                }
                return;
            }
            _ if self.is_turn_failure(f) => {
                if let Some(l) = self.live.get_mut(&sid) {
                    l.turn = None;
                }
                return;
            }
            _ => {}
        }
        self.resolve(now, shutting_down, Some(f));
        let Some(head) = self.queue.pop_front() else {
            return;
        };
        match (head.kind, f.kind()) {
            (
                MsgKind::Start {
                    sid,
                    context,
                    public_key,
                    job,
                    ..
                },
                "session_ready",
            ) => {
                self.live
                    .insert(sid, Live::started(context, public_key, job));
            }
            (MsgKind::End { sid }, "session_ended") => {
                self.live.remove(&sid);
            }
            _ => {}
        }
    }

    /// The event is over: a prompt whose tokens came back and got no error
    /// has started its turn.
    pub fn on_end(&mut self, now: Instant, shutting_down: bool) {
        self.resolve(now, shutting_down, None);
    }

    /// Session ids the Host holds for this connection: its live sessions,
    /// and a start's that waits for its verdict or its context.
    pub fn held(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.live.keys().map(String::as_str).collect();
        if let Some(Msg {
            kind: MsgKind::Start { sid, .. },
            stage,
            ..
        }) = self.queue.front()
        {
            if *stage != Stage::Sent && !self.live.contains_key(sid) {
                v.push(sid);
            }
        }
        v
    }

    /// True while the Host counts the connection busy: a message waits for
    /// an answer, or a turn is in flight.
    pub fn busy(&self) -> bool {
        self.queue.front().is_some_and(|m| m.stage != Stage::Sent)
            || self.live.values().any(|l| l.turn.is_some())
    }

    /// Messages without their reply, and turns without their end.
    pub fn outstanding(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .queue
            .iter()
            .map(|m| {
                format!(
                    "session {} for {:?} unanswered ({:?})",
                    m.kind.name(),
                    m.kind.sid().unwrap_or("?"),
                    m.stage
                )
            })
            .collect();
        for (sid, l) in &self.live {
            if let Some(t) = &l.turn {
                v.push(format!(
                    "session {sid:?} reply {} in flight since {:?} ({} chunks)",
                    t.prompt_index + 1,
                    t.started_at,
                    t.chunk_frames
                ));
            }
        }
        v
    }
}

/// Coverage key of a server frame.
pub fn tally_key(f: &Frame) -> Option<String> {
    Some(match f.kind() {
        "error" => format!("session:error:{}", code(f)),
        "response" => format!("session:response:{}", f.str("finish_reason").unwrap_or("?")),
        "session_ready" => "session:ready".into(),
        "session_ended" => "session:ended".into(),
        _ => return None,
    })
}
