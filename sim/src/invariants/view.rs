//! The shared view the checkers judge against: every live connection, the
//! engine's outstanding step and whose sequences it computes, text jobs, job
//! checks and held frames, rebuilt from the Host's inputs and outputs alone.
//!
//! This file keeps what every dialect shares (deadlines, text jobs, job
//! checks, held frames, the shutdown and the crashes) and routes each input
//! and output to the dialect whose connection it concerns. Each dialect's own
//! part lives beside its checkers: `generate`'s requests in
//! [`generate`](super::generate::view), and each `session`, `responses`,
//! `cai` or `batch` connection's view in [`session`], [`responses`],
//! [`cai`], [`batch`]; the `batch` continue-generation cache is the Host's,
//! so the view keeps it ([`batch::BatchCache`]).
//!
//! Engine sequences are tied to connections by the `<c{conn}>` tag every
//! simulated prompt starts with, read from the tokens a step feeds at
//! position 0.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::Value;
use tokenwire_core::config::CacheScope;
use tokenwire_core::keys::KeyRing;
use tokenwire_core::testing::{BYTE_BOS, BYTE_OFFSET};
use tokenwire_core::{
    ConnId, Dialect, HostConfig, Input, Instant, JobCheckId, ModelInfo, Output, SeqId, StepPlan,
    TextJobId, TokenId, Transport,
};

use super::batch::view as batch;
use super::cai::view as cai;
use super::chat;
use super::generate::view::{self as generate, Pending, ReqView};
use super::responses::view as responses;
use super::session::view as session;
use super::Frame;

/// A client frame as the checkers keep it until it is answered.
#[derive(Debug, Clone, PartialEq)]
pub struct SentFrame {
    /// The parsed JSON (`Null` for a binary frame or text that is not JSON).
    pub v: Value,
    /// A binary frame.
    pub binary: bool,
    /// The connection's first text frame.
    pub first: bool,
    /// Its length in bytes.
    pub len: usize,
}

/// A frame not yet answered: what it means for requests, and the frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// What it does to the connection's requests.
    pub kind: Pending,
    /// The frame itself.
    pub frame: SentFrame,
}

/// One live connection.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnView {
    /// Its dialect.
    pub dialect: Dialect,
    /// How it is carried.
    pub transport: Transport,
    /// When it opened.
    pub opened_at: Instant,
    /// The server closed it (`Output::Close`).
    pub closed: bool,
    /// Last frame received or request ended (the idle deadline's start).
    pub last_activity: Instant,
    /// The request in flight.
    pub current: Option<String>,
    /// Last ping sent, or the opening.
    pub last_ping: Instant,
    /// First ping not yet answered by a pong.
    pub unanswered_ping: Option<Instant>,
    /// Since when its outbound queue is full.
    pub blocked_since: Option<Instant>,
    /// The Host asked the shell to stop reading it (`PauseReading`, until
    /// `ResumeReading`): since when.
    pub reading_paused_since: Option<Instant>,
    /// When reading it last resumed.
    pub reading_resumed_at: Option<Instant>,
    /// Frames not yet handled (more than one only while the model loads or
    /// a text job of the connection is outstanding).
    pub pending: VecDeque<Held>,
    /// Text frames received so far (the first one must be a `config`).
    pub texts_in: u64,
    /// The last request started on it (for feedback acks).
    pub last_request: Option<String>,
    /// Its feedback rate limit, as the acks tell it.
    pub feedback: super::generate::model::FeedbackMeter,
    /// Its text jobs not yet answered: its frames are held meanwhile.
    pub text_jobs: BTreeSet<TextJobId>,
    /// Its job checks not yet answered: its frames are held meanwhile.
    pub job_checks: BTreeSet<JobCheckId>,
    /// A `session` connection's messages and sessions (WebSocket only).
    pub session: Option<session::SessionConnView>,
    /// A `session` HTTP request's one-turn session.
    pub inference: Option<session::InferenceView>,
    /// A `responses` connection's frames and responses.
    pub responses: Option<responses::ResponsesConnView>,
    /// A `cai` connection's credentials, messages and requests.
    pub cai: Option<cai::CaiConnView>,
    /// A `batch` connection's payloads and prompts.
    pub batch: Option<batch::BatchConnView>,
    /// A `chat` (or `anthropic`: the same machine) request's frame and
    /// answer.
    pub chat: Option<chat::view::ChatConnView>,
}

impl ConnView {
    /// `session` turns, `responses` responses, `cai` requests, `batch`
    /// prompts and `chat` (or `anthropic`) requests started on it.
    pub fn started(&self) -> u64 {
        self.chat.as_ref().map_or(0, |h| u64::from(h.sent))
            + self.session.as_ref().map_or(0, |s| s.turns_started)
            + self.inference.as_ref().map_or(0, |i| u64::from(i.started))
            + self.responses.as_ref().map_or(0, |r| r.created)
            + self.cai.as_ref().map_or(0, |c| c.accepted)
            + self.batch.as_ref().map_or(0, |b| b.prompts.len() as u64)
    }

    /// A request in flight on it, any dialect: a `generate` request, a
    /// `session` turn, a `responses` response, a `cai` request whose prompt
    /// was tokenized, a `chat` (or `anthropic`) request not yet answered.
    pub fn in_flight(&self) -> Option<String> {
        if let Some(r) = &self.current {
            return Some(r.clone());
        }
        if let Some((sid, _)) = self
            .session
            .as_ref()
            .and_then(|s| s.live.iter().find(|(_, l)| l.turn.is_some()))
        {
            return Some(format!("the reply of session {sid:?}"));
        }
        if let Some(i) = self.inference.as_ref().filter(|i| i.started && !i.answered) {
            return Some(format!("an HTTP inference ({i:?})"));
        }
        if let Some(h) = self.chat.as_ref().filter(|h| h.sent && !h.answered) {
            return Some(format!("a chat request ({h:?})"));
        }
        // A `cai` request counts once its prompt is tokenized (it started,
        // or was refused), as other dialects' requests do from their start.
        if let Some((rid, _)) = self
            .cai
            .as_ref()
            .and_then(|c| c.requests.iter().find(|(_, r)| r.tokenized))
        {
            return Some(format!("cai request {rid:?}"));
        }
        if let Some(rid) = self.batch.as_ref().and_then(|b| b.live.keys().next()) {
            return Some(format!("batch prompt {rid:?}"));
        }
        self.responses
            .as_ref()
            .and_then(|r| r.current.as_ref())
            .map(|r| r.id.clone())
    }

    /// True while the Host must count it busy: a request in flight, or an
    /// answer (a text job, a job check) it waits for. The idle timeout does
    /// not apply meanwhile.
    pub fn busy(&self) -> bool {
        self.current.is_some()
            || !self.text_jobs.is_empty()
            || !self.job_checks.is_empty()
            || self.session.as_ref().is_some_and(|s| s.busy())
            || self.responses.as_ref().is_some_and(|r| r.busy())
            || self.cai.as_ref().is_some_and(|c| !c.requests.is_empty())
            || self.batch.as_ref().is_some_and(|b| b.busy())
    }
}

/// The step handed to the engine and not yet answered.
#[derive(Debug, Clone, PartialEq)]
pub struct StepView {
    /// Its id.
    pub id: u64,
    /// Its sequences.
    pub seqs: Vec<SeqId>,
    /// Distinct KV blocks in its tables and its copies' sources (held
    /// until the copies are done, even when their owner went).
    pub blocks: u32,
    /// Some sequence of it carried draft tokens.
    pub drafted: bool,
}

/// Everything the checkers know.
#[derive(Debug, Clone)]
pub struct View {
    /// Live connections (not yet reported closed, not lost in a crash).
    pub conns: BTreeMap<ConnId, ConnView>,
    /// Connections that are gone.
    pub dead: BTreeSet<ConnId>,
    /// Every request, by `request_id`.
    pub requests: BTreeMap<String, ReqView>,
    /// The outstanding step.
    pub step: Option<StepView>,
    /// Connection of each engine sequence (from its prompt tag).
    pub seq_owner: BTreeMap<SeqId, ConnId>,
    /// Request of each engine sequence (the owner's request in flight when
    /// the tag was read).
    pub seq_request: BTreeMap<SeqId, String>,
    /// Leading tokens of sequences whose tag is not complete yet.
    seq_prefix: BTreeMap<SeqId, Vec<TokenId>>,
    /// When graceful shutdown began.
    pub shutdown_at: Option<Instant>,
    /// `ShutdownComplete` was emitted.
    pub shutdown_complete: bool,
    /// The model is loaded.
    pub loaded: bool,
    /// Host crashes so far.
    pub crashes: u64,
    /// The frames held while the model loaded are being handled now: each
    /// one's first reply (`init`, `error`, `status`, or the final `token` of a
    /// `stop`) answers the oldest held frame.
    replaying_held: bool,
    /// The same for one connection whose text job just came back: its first
    /// reply answers the config that asked for the job, the next ones the
    /// frames held meanwhile.
    replaying_conn: Option<ConnId>,
    /// The connection of every text job not yet answered.
    pub text_owner: BTreeMap<TextJobId, ConnId>,
    /// The connection of every job check not yet answered.
    pub check_owner: BTreeMap<JobCheckId, ConnId>,
    /// The connection whose frames the input being handled hands over (its
    /// own frame, or its held frames after a text job or job check came
    /// back); every connection's while held frames are handled after loading.
    handling: Option<ConnId>,
    /// `session` turns, `responses` responses and `cai` requests started on
    /// connections that are gone.
    started_gone: u64,
    /// Engine steps that completed (or failed) so far.
    pub steps_done: u64,
    /// The `cai` keys file.
    keys: Option<KeyRing>,
    /// The Host's `batch` continue-generation cache, as the frames tell it.
    pub batch_cache: batch::BatchCache,
    /// The connection whose text job came back failed in this event, for a
    /// reason other than length (a tokenizer's or a template's error): what
    /// it waited for is refused as input that cannot be read.
    pub text_failure: Option<ConnId>,
    /// Responses HTTP requests stored in the host's store, by id (every
    /// simulated HTTP request is the anonymous principal's; the store may
    /// since have forgotten some).
    pub responses_stored: BTreeSet<String>,
    /// The same since the Host last started (a crash empties the store):
    /// while there are no more of them than the store holds, it has
    /// forgotten none.
    pub responses_kept: BTreeSet<String>,
    /// Whose batches a connection continues (`batch_cache_scope`).
    pub batch_scope: CacheScope,
    /// `batch`: the default `max_new_tokens` and the context length.
    batch_limits: (u64, u64, usize),
    /// How often each kind of thing happened (`completion:length`,
    /// `error:memory_pressure`, `close:idle timeout`, ...): coverage, not checks.
    pub tally: BTreeMap<String, u64>,
    /// The `max_tokens` of a `generate` config that names none.
    pub(crate) default_max_tokens: u32,
    max_frame_bytes: usize,
}

impl View {
    /// The `session` view of live connection `conn`, if it speaks `session`.
    pub fn session(&self, conn: &ConnId) -> Option<&session::SessionConnView> {
        self.conns.get(conn).and_then(|c| c.session.as_ref())
    }

    /// The `responses` view of live connection `conn`, if it speaks `responses`.
    pub fn responses(&self, conn: &ConnId) -> Option<&responses::ResponsesConnView> {
        self.conns.get(conn).and_then(|c| c.responses.as_ref())
    }

    /// The `batch` view of live connection `conn`, if it speaks `batch`.
    pub fn batch(&self, conn: &ConnId) -> Option<&batch::BatchConnView> {
        self.conns.get(conn).and_then(|c| c.batch.as_ref())
    }

    /// The `cai` view of live connection `conn`, if it speaks `cai`.
    pub fn cai(&self, conn: &ConnId) -> Option<&cai::CaiConnView> {
        self.conns.get(conn).and_then(|c| c.cai.as_ref())
    }

    /// An empty view for a Host with `config` serving `model`.
    pub fn new(config: &HostConfig, model: &ModelInfo) -> View {
        View {
            conns: BTreeMap::new(),
            dead: BTreeSet::new(),
            requests: BTreeMap::new(),
            step: None,
            seq_owner: BTreeMap::new(),
            seq_request: BTreeMap::new(),
            seq_prefix: BTreeMap::new(),
            shutdown_at: None,
            shutdown_complete: false,
            loaded: true,
            crashes: 0,
            tally: BTreeMap::new(),
            replaying_held: false,
            replaying_conn: None,
            text_owner: BTreeMap::new(),
            check_owner: BTreeMap::new(),
            handling: None,
            text_failure: None,
            started_gone: 0,
            steps_done: 0,
            keys: config.keys.clone(),
            responses_stored: BTreeSet::new(),
            responses_kept: BTreeSet::new(),
            batch_cache: batch::BatchCache::new(config.batch_cache_entries).with_filter_stops(
                config
                    .content_filter
                    .as_ref()
                    .is_some_and(|f| f.has_stop_rules()),
            ),
            batch_scope: config.batch_cache_scope,
            batch_limits: (
                u64::from(config.batch_defaults.max_new_tokens),
                u64::from(model.context_len),
                config.batch_max_prompts,
            ),
            default_max_tokens: config.default_max_tokens.min(model.context_len),
            max_frame_bytes: config.max_frame_bytes,
        }
    }

    /// True while frames held for `conn` are being handled (after the model
    /// loaded, or after one of its text jobs came back): each first reply
    /// answers the oldest of them.
    pub fn replaying(&self, conn: ConnId) -> bool {
        self.replaying_held || self.replaying_conn == Some(conn)
    }

    /// The request in flight on `conn`.
    pub fn current(&self, conn: ConnId) -> Option<&ReqView> {
        let id = self.conns.get(&conn)?.current.as_ref()?;
        self.requests.get(id)
    }

    /// The connection that owns engine sequence `seq`, if its tag was read.
    pub fn owner(&self, seq: SeqId) -> Option<ConnId> {
        self.seq_owner.get(&seq).copied()
    }

    /// Sequences the engine has been handed whose request is not known yet
    /// (their first chunks were too short to carry the connection tag).
    pub fn unidentified_seqs(&self) -> usize {
        self.seq_prefix.len()
    }

    /// Session ids the Host holds, with their connections: live on an open
    /// connection, or claimed by a start that waits for its verdict or its
    /// context.
    pub fn sessions_held(&self) -> Vec<(&str, ConnId)> {
        self.conns
            .iter()
            .filter(|(_, c)| !c.closed)
            .filter_map(|(id, c)| c.session.as_ref().map(|s| (id, s)))
            .flat_map(|(id, s)| s.held().into_iter().map(move |sid| (sid, *id)))
            .collect()
    }

    /// The dialect of a live connection.
    pub fn dialect_of(&self, conn: ConnId) -> Option<Dialect> {
        self.conns.get(&conn).map(|c| c.dialect)
    }

    /// Requests in flight on live connections, every dialect: `(what,
    /// conn)`, where `what` is a `generate` request id, a `session` turn or
    /// unanswered message, or a `responses` response or unanswered frame.
    pub fn outstanding(&self) -> Vec<(String, ConnId)> {
        let mut v = Vec::new();
        for (id, c) in self.conns.iter().filter(|(_, c)| !c.closed) {
            if let Some(r) = &c.current {
                v.push((r.clone(), *id));
            }
            if let Some(s) = &c.session {
                v.extend(s.outstanding().into_iter().map(|w| (w, *id)));
            }
            if let Some(w) = c.inference.as_ref().and_then(|i| i.outstanding()) {
                v.push((w, *id));
            }
            if let Some(r) = &c.responses {
                v.extend(r.outstanding().into_iter().map(|w| (w, *id)));
            }
            if let Some(r) = &c.cai {
                v.extend(r.outstanding().into_iter().map(|w| (w, *id)));
            }
            if let Some(b) = &c.batch {
                v.extend(b.outstanding().into_iter().map(|w| (w, *id)));
            }
            if let Some(h) = &c.chat {
                v.extend(h.outstanding(id.0).into_iter().map(|w| (w, *id)));
            }
        }
        v
    }

    pub(crate) fn on_input(&mut self, now: Instant, input: &Input) {
        self.text_failure = match input {
            Input::Tokenized(done) => done
                .result
                .as_ref()
                .err()
                .filter(|e| !e.starts_with(tokenwire_core::CONTEXT_TOO_LONG))
                .and_then(|_| self.text_owner.get(&done.id).copied()),
            _ => None,
        };
        match input {
            Input::Open {
                conn,
                transport,
                dialect,
                query,
                ..
            } => {
                if self.conns.contains_key(conn) || self.dead.contains(conn) {
                    return;
                }
                self.conns.insert(
                    *conn,
                    ConnView {
                        dialect: *dialect,
                        transport: *transport,
                        opened_at: now,
                        closed: false,
                        last_activity: now,
                        current: None,
                        last_ping: now,
                        unanswered_ping: None,
                        blocked_since: None,
                        reading_paused_since: None,
                        reading_resumed_at: None,
                        pending: VecDeque::new(),
                        texts_in: 0,
                        last_request: None,
                        feedback: Default::default(),
                        text_jobs: BTreeSet::new(),
                        job_checks: BTreeSet::new(),
                        // An HTTP request's one-turn session is judged by
                        // `session_http`, not as a WebSocket session.
                        session: (*dialect == Dialect::Session
                            && *transport == Transport::WebSocket)
                            .then(session::SessionConnView::default),
                        inference: (*dialect == Dialect::Session && *transport == Transport::Http)
                            .then(session::InferenceView::default),
                        responses: (*dialect == Dialect::Responses).then(|| {
                            responses::ResponsesConnView::opened(*transport == Transport::WebSocket)
                        }),
                        cai: (*dialect == Dialect::Cai)
                            .then(|| cai::CaiConnView::opened(self.keys.as_ref(), query)),
                        batch: (*dialect == Dialect::Batch).then(batch::BatchConnView::default),
                        chat: matches!(dialect, Dialect::Chat | Dialect::Anthropic)
                            .then(chat::view::ChatConnView::default),
                    },
                );
            }
            Input::Text { conn, text } => {
                self.handling = Some(*conn);
                let max_frame = self.max_frame_bytes;
                if let Some(c) = self.conns.get_mut(conn) {
                    if let Some(s) = c.session.as_mut() {
                        s.on_text(text, max_frame);
                    }
                    if let Some(i) = c.inference.as_mut() {
                        i.sent = true;
                    }
                    if let Some(h) = c.chat.as_mut() {
                        h.on_text(text);
                    }
                    if let Some(r) = c.responses.as_mut() {
                        r.on_text(text, max_frame);
                    }
                    if let Some(b) = c.batch.as_mut().filter(|_| text.len() <= max_frame) {
                        b.on_text(text, self.batch_limits);
                    }
                    if let Some(a) = c.cai.as_mut().filter(|_| text.len() <= max_frame) {
                        a.on_message(cai::Msg::of_text(text), self.loaded);
                        a.refresh(self.steps_done);
                    }
                }
                let generate = self.dialect_of(*conn) == Some(Dialect::Generate);
                let kind = if generate {
                    self.classify_generate(*conn, text)
                } else {
                    Pending::Other
                };
                let v = if text.len() <= 1 << 16 {
                    serde_json::from_str(text).unwrap_or(Value::Null)
                } else {
                    Value::Null
                };
                if let Some(c) = self.conns.get_mut(conn) {
                    c.last_activity = now;
                    let frame = SentFrame {
                        v,
                        binary: false,
                        first: c.texts_in == 0,
                        len: text.len(),
                    };
                    c.texts_in += 1;
                    c.pending.push_back(Held { kind, frame });
                }
            }
            Input::Binary { conn, len } => {
                self.handling = Some(*conn);
                // Held like text while the connection waits.
                if let Some(c) = self.conns.get_mut(conn) {
                    if let Some(s) = c.session.as_mut() {
                        s.on_binary();
                    }
                    if let Some(r) = c.responses.as_mut() {
                        r.on_binary();
                    }
                    if let Some(a) = c.cai.as_mut() {
                        a.on_binary(self.loaded);
                    }
                    if let Some(b) = c.batch.as_mut() {
                        b.on_binary();
                    }
                    c.last_activity = now;
                    let frame = SentFrame {
                        v: Value::Null,
                        binary: true,
                        first: false,
                        len: *len,
                    };
                    c.pending.push_back(Held {
                        kind: Pending::Other,
                        frame,
                    });
                }
            }
            Input::Pong { conn } => {
                if let Some(c) = self.conns.get_mut(conn) {
                    c.unanswered_ping = None;
                }
            }
            Input::Closed { conn } => {
                if let Some(c) = self.conns.remove(conn) {
                    self.started_gone += c.started();
                    self.dead.insert(*conn);
                }
                self.batch_cache.remove_owner(*conn);
            }
            Input::QueueFull { conn } => {
                if let Some(c) = self.conns.get_mut(conn) {
                    c.blocked_since.get_or_insert(now);
                }
            }
            Input::QueueDrained { conn } => {
                if let Some(c) = self.conns.get_mut(conn) {
                    c.blocked_since = None;
                }
            }
            Input::StepDone(done) => {
                self.step = None;
                self.steps_done += 1;
                for r in &done.results {
                    let Some(rid) = self.seq_request.get(&r.seq) else {
                        continue;
                    };
                    if let Some(req) = self.requests.get_mut(rid) {
                        req.sampled.push(r.token);
                    }
                }
            }
            Input::EngineFault(_) => {
                self.step = None;
                self.steps_done += 1;
            }
            Input::Tokenized(done) => {
                if let Some(conn) = self.text_owner.remove(&done.id) {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.text_jobs.remove(&done.id);
                        c.last_activity = now;
                        if let Some(s) = c.session.as_mut() {
                            s.on_tokenized(done);
                        }
                        if let Some(r) = c.responses.as_mut() {
                            r.on_tokenized(done.id);
                        }
                        if let Some(a) = c.cai.as_mut() {
                            a.on_tokenized(done.id);
                        }
                    }
                    self.replaying_conn = Some(conn);
                    self.handling = Some(conn);
                }
            }
            Input::JobVerified { check, verdict } => {
                if let Some(conn) = self.check_owner.remove(check) {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.job_checks.remove(check);
                        c.last_activity = now;
                        if let Some(s) = c.session.as_mut() {
                            s.on_verified(*check, verdict.is_ok());
                        }
                    }
                    self.handling = Some(conn);
                }
            }
            Input::ModelLoaded { .. } => {
                self.loaded = true;
                self.replaying_held = true;
                for a in self.conns.values_mut().filter_map(|c| c.cai.as_mut()) {
                    a.on_loaded();
                }
            }
            Input::Shutdown => {
                self.shutdown_at.get_or_insert(now);
            }
            _ => {}
        }
    }

    fn count(&mut self, key: String) {
        *self.tally.entry(key).or_default() += 1;
    }

    pub(crate) fn on_output(&mut self, now: Instant, out: &Output, frame: Option<&Frame>) {
        let dialect = match out {
            Output::Send { conn, .. } => self.dialect_of(*conn),
            _ => None,
        };
        if let Output::Event(tokenwire_core::Event::PrefixCacheLookup { hit, .. }) = out {
            let key = if *hit > 0 {
                "prefix:hit"
            } else {
                "prefix:miss"
            };
            self.count(key.into());
        }
        match (out, frame) {
            (Output::Send { conn, .. }, Some(f)) if dialect == Some(Dialect::Session) => {
                let resumed = f.kind() == "session_ready"
                    && self
                        .conns
                        .get(conn)
                        .and_then(|c| c.session.as_ref())
                        .and_then(|s| s.answered_by(f))
                        .is_some_and(|m| {
                            matches!(m.kind, session::MsgKind::Start { resume: true, .. })
                        });
                if resumed {
                    let key = if self.crashes > 0 {
                        "session:resumed_after_crash"
                    } else {
                        "session:resumed"
                    };
                    self.count(key.into());
                }
                if let Some(key) = session::tally_key(f) {
                    self.count(key);
                }
            }
            (Output::Send { .. }, Some(f)) if dialect == Some(Dialect::Responses) => {
                if let Some(key) = responses::tally_key(f) {
                    self.count(key);
                }
            }
            (Output::Send { conn, text }, _) if dialect == Some(Dialect::Batch) => {
                let events = tokenwire_core::dialect::batch::codec::decode_events(text);
                if let (Ok(events), Some(c)) = (events, self.conns.get_mut(conn)) {
                    let ended = events.iter().any(|e| {
                        matches!(
                            e.kind,
                            tokenwire_core::dialect::batch::codec::EventKind::Complete { .. }
                                | tokenwire_core::dialect::batch::codec::EventKind::Error { .. }
                        )
                    });
                    if ended {
                        c.last_activity = now;
                    }
                    if let Some(b) = c.batch.as_mut() {
                        let reading = b.read(&events);
                        let key = batch::tally_key(&events, &reading);
                        let owner = match self.batch_scope {
                            CacheScope::Principal => Some(*conn),
                            CacheScope::Host => None,
                        };
                        b.on_events(now, &events, owner, &mut self.batch_cache);
                        let continued = matches!(reading, batch::Reading::Accepted(p)
                            if b.payloads[p].continued);
                        if let Some(key) = key {
                            self.count(key);
                        }
                        if continued {
                            self.count("batch:continued".into());
                        }
                    }
                }
                return;
            }
            (Output::Send { conn, .. }, Some(f))
                if matches!(dialect, Some(Dialect::Chat | Dialect::Anthropic)) =>
            {
                let key = self
                    .conns
                    .get(conn)
                    .and_then(|c| c.chat.as_ref())
                    .filter(|h| !h.answered)
                    .and_then(|h| h.tally_key(f));
                if let Some(key) = key {
                    self.count(key);
                }
            }
            (Output::Send { .. }, Some(f)) if dialect == Some(Dialect::Cai) => {
                if let Some(key) = cai::tally_key(f) {
                    self.count(key);
                }
            }
            (Output::Send { .. }, Some(f)) => {
                if let Some(key) = generate::tally_key(f) {
                    self.count(key);
                }
            }
            (Output::Close { code, reason, .. }, _) => self.count(format!("close:{code}:{reason}")),
            (Output::ShutdownComplete, _) => self.count("shutdown_complete".into()),
            _ => {}
        }
        match out {
            Output::Send { conn, .. } => {
                let handling = self.handles(*conn);
                let shutting_down = self.shutdown_at.is_some();
                let c = self.conns.get_mut(conn);
                match (c, frame) {
                    (Some(c), Some(f)) if c.session.is_some() => {
                        if let Some(s) = c.session.as_mut() {
                            s.on_frame(now, shutting_down, f);
                        }
                        if f.kind() == "response" || f.kind() == "error" {
                            c.last_activity = now;
                        }
                    }
                    (Some(c), Some(f)) if c.chat.is_some() => {
                        if let Some(h) = c.chat.as_mut() {
                            h.on_frame(f);
                            if h.answered {
                                c.last_activity = now;
                            }
                        }
                    }
                    (Some(c), Some(f)) if c.inference.is_some() => {
                        if let Some(i) = c.inference.as_mut() {
                            i.on_frame(f);
                        }
                        if f.kind() == "response" || f.kind() == "error" {
                            c.last_activity = now;
                        }
                    }
                    (Some(c), Some(f)) if c.responses.is_some() => {
                        if let Some(r) = c.responses.as_mut() {
                            r.on_frame(now, f, handling);
                            let http = c.transport == Transport::Http;
                            if http && r.store && responses::is_terminal(f) {
                                if let Some(id) = &r.latest {
                                    self.responses_stored.insert(id.clone());
                                    self.responses_kept.insert(id.clone());
                                }
                            }
                        }
                        if responses::is_terminal(f) {
                            c.last_activity = now;
                        }
                    }
                    (Some(c), Some(f)) if c.cai.is_some() => {
                        let steps = self.steps_done;
                        let mut unsent = false;
                        if let Some(a) = c.cai.as_mut() {
                            if a.is_terminal(f) {
                                c.last_activity = now;
                            }
                            unsent = a.partial_beyond_chunks(f);
                            a.on_frame(f);
                            a.refresh(steps);
                        }
                        if unsent {
                            self.count("cai:interrupted:partial_beyond_chunks".into());
                        }
                    }
                    (_, Some(f)) => self.on_generate_frame(now, *conn, f),
                    _ => {}
                }
            }
            Output::Event(tokenwire_core::Event::RequestStarted { conn, .. }) => {
                if let Some(i) = self.conns.get_mut(conn).and_then(|c| c.inference.as_mut()) {
                    i.started = true;
                }
            }
            Output::Ping { conn } => {
                if let Some(c) = self.conns.get_mut(conn) {
                    c.last_ping = now;
                    c.unanswered_ping.get_or_insert(now);
                }
            }
            Output::Close { conn, .. } => {
                if let Some(c) = self.conns.get_mut(conn) {
                    c.closed = true;
                }
                // The Host forgets the connection at once, its own batches too.
                self.batch_cache.remove_owner(*conn);
            }
            Output::PauseReading { conn } => {
                if let Some(c) = self.conns.get_mut(conn) {
                    c.reading_paused_since.get_or_insert(now);
                }
            }
            Output::ResumeReading { conn } => {
                if let Some(c) = self.conns.get_mut(conn) {
                    if c.reading_paused_since.take().is_some() {
                        c.reading_resumed_at = Some(now);
                    }
                }
            }
            Output::RunStep(plan) => self.on_plan(plan),
            Output::Tokenize(job) => {
                let shutting_down = self.shutdown_at.is_some();
                if let Some(c) = self.conns.get_mut(&job.conn) {
                    if let Some(a) = c.cai.as_mut() {
                        a.on_tokenize(now, job.id);
                    }
                    c.text_jobs.insert(job.id);
                    self.text_owner.insert(job.id, job.conn);
                    if let Some(s) = c.session.as_mut() {
                        s.on_tokenize(now, shutting_down, job.id);
                    }
                    if let Some(r) = c.responses.as_mut() {
                        r.on_tokenize(job.id);
                    }
                }
            }
            Output::VerifyJob(check) => {
                let shutting_down = self.shutdown_at.is_some();
                if let Some(c) = self.conns.get_mut(&check.conn) {
                    c.job_checks.insert(check.id);
                    self.check_owner.insert(check.id, check.conn);
                    if let Some(s) = c.session.as_mut() {
                        s.on_verify(now, shutting_down, check.id);
                    }
                }
            }
            Output::ShutdownComplete => self.shutdown_complete = true,
            _ => {}
        }
    }

    fn on_plan(&mut self, plan: &StepPlan) {
        let mut blocks: BTreeSet<u32> = plan.copy_blocks.iter().map(|c| c.0).collect();
        for s in &plan.seqs {
            blocks.extend(s.block_table.iter().copied());
            if self.seq_owner.contains_key(&s.seq) {
                continue;
            }
            let prefix = self.seq_prefix.entry(s.seq).or_default();
            if !s.cached_prefix.is_empty() {
                // Admitted onto cached blocks: the plan says what is before.
                prefix.clone_from(&s.cached_prefix);
            }
            if s.start_pos as usize > prefix.len() {
                // Not contiguous from position 0 (recompute restarts at 0).
                prefix.clear();
                if s.start_pos != 0 {
                    continue;
                }
            }
            // A failed step's chunk is fed again (the engine checks that the
            // tokens are the same).
            prefix.truncate(s.start_pos as usize);
            prefix.extend_from_slice(&s.tokens);
            match parse_tag(prefix) {
                Tag::Conn(c) => {
                    self.seq_owner.insert(s.seq, c);
                    self.seq_prefix.remove(&s.seq);
                    if let Some(rid) = self.conns.get(&c).and_then(|c| c.current.clone()) {
                        if let Some(r) = self.requests.get_mut(&rid) {
                            r.planned = true;
                        }
                        self.seq_request.insert(s.seq, rid);
                    }
                }
                Tag::Never => {
                    self.seq_prefix.remove(&s.seq);
                    self.seq_owner.insert(s.seq, ConnId(u64::MAX));
                }
                Tag::NotYet => {}
            }
        }
        self.step = Some(StepView {
            id: plan.step_id,
            seqs: plan.seqs.iter().map(|s| s.seq).collect(),
            blocks: blocks.len() as u32,
            drafted: plan.seqs.iter().any(|s| !s.draft.is_empty()),
        });
    }

    /// Before checkers judge `out`: a `cai` connection takes up the held
    /// messages the Host must have handled before it (every one still due,
    /// before a step is planned: steps are planned once the input's frames
    /// were handled).
    pub(crate) fn prepare(&mut self, out: &Output, frame: Option<&Frame>) {
        let steps = self.steps_done;
        match out {
            Output::Send { conn, .. } => {
                if let Some(a) = self.conns.get_mut(conn).and_then(|c| c.cai.as_mut()) {
                    a.prepare(frame, false);
                    a.refresh(steps);
                }
            }
            Output::Tokenize(job) => {
                if let Some(a) = self.conns.get_mut(&job.conn).and_then(|c| c.cai.as_mut()) {
                    a.prepare(None, true);
                }
            }
            Output::RunStep(_) => {
                for a in self.conns.values_mut().filter_map(|c| c.cai.as_mut()) {
                    a.on_end();
                    a.refresh(steps);
                }
            }
            _ => {}
        }
    }

    /// The event is over: frames were handled (unless the model still loads).
    pub(crate) fn on_end(&mut self, now: Instant) {
        let steps = self.steps_done;
        let (mut held, mut paused) = (0, 0);
        for a in self.conns.values_mut().filter_map(|c| c.cai.as_mut()) {
            a.on_end();
            a.refresh(steps);
            held += std::mem::take(&mut a.counts.0);
            paused += std::mem::take(&mut a.counts.1);
        }
        if held > 0 {
            *self
                .tally
                .entry("cai:held_message_handled".into())
                .or_default() += held;
        }
        if paused > 0 {
            *self
                .tally
                .entry("cai:all_window_paused".into())
                .or_default() += paused;
        }
        self.replaying_held = false;
        self.replaying_conn = None;
        self.handling = None;
        let shutting_down = self.shutdown_at.is_some();
        for c in self.conns.values_mut() {
            if let Some(s) = c.session.as_mut() {
                s.on_end(now, shutting_down);
            }
        }
        if self.loaded {
            for c in self.conns.values_mut() {
                // Frames wait while a text job or job check of the connection is
                // out. Read now, they count as activity now, as the Host counts
                // a held frame (for one that waited, later than its arrival).
                if c.text_jobs.is_empty() && c.job_checks.is_empty() {
                    if !c.pending.is_empty() {
                        c.last_activity = c.last_activity.max(now);
                    }
                    c.pending.clear();
                }
            }
        }
    }

    /// True when the input being handled hands `conn`'s frames over (so a
    /// frame to it can be a reply).
    pub fn handles(&self, conn: ConnId) -> bool {
        self.replaying_held || self.handling == Some(conn)
    }

    /// Requests started so far, every dialect: `generate` `init`s,
    /// `session` turns, `responses` responses.
    pub fn started(&self) -> u64 {
        self.requests.len() as u64
            + self.started_gone
            + self.conns.values().map(ConnView::started).sum::<u64>()
    }

    pub(crate) fn on_crash(&mut self) {
        self.started_gone += self.conns.values().map(ConnView::started).sum::<u64>();
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        self.dead.extend(ids);
        self.conns.clear();
        self.text_owner.clear();
        self.check_owner.clear();
        self.handling = None;
        self.replaying_conn = None;
        self.step = None;
        self.seq_owner.clear();
        self.seq_request.clear();
        self.seq_prefix.clear();
        self.shutdown_at = None;
        self.shutdown_complete = false;
        self.loaded = true;
        self.batch_cache.clear();
        self.responses_kept.clear();
        self.crashes += 1;
    }
}

enum Tag {
    Conn(ConnId),
    NotYet,
    Never,
}

/// Reads `<c{digits}>` after BOS.
fn parse_tag(tokens: &[TokenId]) -> Tag {
    let byte = |i: usize| -> Option<u8> {
        let t = *tokens.get(i)?;
        (BYTE_OFFSET..BYTE_OFFSET + 256)
            .contains(&t)
            .then(|| (t - BYTE_OFFSET) as u8)
    };
    if tokens.first().is_some_and(|&t| t != BYTE_BOS) {
        return Tag::Never;
    }
    let mut n: u64 = 0;
    for i in 1..32 {
        if i >= tokens.len() {
            return Tag::NotYet;
        }
        let Some(b) = byte(i) else {
            return Tag::Never;
        };
        match (i, b) {
            (1, b'<') | (2, b'c') => {}
            (i, b'>') if i > 3 => return Tag::Conn(ConnId(n)),
            (i, d) if i >= 3 && d.is_ascii_digit() => {
                n = n.saturating_mul(10).saturating_add(u64::from(d - b'0'));
            }
            _ => return Tag::Never,
        }
    }
    Tag::Never
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwire_core::testing::ByteCodec;
    use tokenwire_core::TextCodec;

    #[test]
    fn prompt_tags_name_the_connection_even_across_chunks() {
        let t = ByteCodec.encode("<c42>hello", true).expect("encode");
        assert!(matches!(parse_tag(&t), Tag::Conn(ConnId(42))));
        assert!(matches!(parse_tag(&t[..4]), Tag::NotYet));
        let u = ByteCodec.encode("plain", true).expect("encode");
        assert!(matches!(parse_tag(&u), Tag::Never));
    }
}
