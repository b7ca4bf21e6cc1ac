//! A `cai` connection as the checkers see it.
//!
//! The connection acts for the (key, organisation) its query string names,
//! or must be refused at once: [`reference_auth`] says which from the query
//! and the run's keys file alone (a reference of its own, not the core's).
//!
//! The dialect handles a connection's messages one at a time, in order; while
//! a prompt is tokenized (or the model loads) the Host holds the frames behind
//! it and hands them over, in order, when the tokens come back, until one of
//! them asks for a text job again. Unlike other dialects, not every message
//! is answered (an acknowledgement may release chunks, or nothing), so the
//! view follows the Host's handling message by message: the message being
//! handled has an [`Expect`]ation of what it sends, and a held message is
//! taken up (its effect on the windows applied) just before the first frame
//! the message before it cannot have sent, or at the end of the event. An
//! acknowledgement is thus counted as of the moment the Host handled it, and
//! `AWAIT_MORE` without an index acknowledges the chunks sent by then. A
//! frame the expectations cannot place is recorded as a desynchronisation
//! ([`CaiConnView::desync`]): the Host answered a message in a way the
//! contract does not allow, or not at all.
//!
//! Requests live from the prompt's text job (the COMPLETION was accepted)
//! to their terminal frame: `STREAM_COMPLETE`, `INTERRUPTED_ACK`, or an
//! `ERROR` that is not the answer to another message (the prompt's refusal
//! once tokenized, a failed or timed-out generation). Chunk and sentence
//! counts and windows are kept per request as the wire shows them.

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tokenwire_core::dialect::cai::codec::{self, ClientMessage};
use tokenwire_core::keys::KeyRing;
use tokenwire_core::{Instant, TextJobId};

use crate::invariants::Frame;

/// The chunk window a request gets with its first `AWAIT_MORE` when it set
/// none (PROTOCOLS.md).
pub const DEFAULT_WINDOW: u64 = 32;

/// How many ended request ids the Host remembers per connection (late
/// acknowledgements for them are accepted quietly).
pub const RECENT_REQUESTS: usize = 64;

/// Who an accepted connection acts as.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Creds {
    /// The key's index in the keys file.
    pub key: usize,
    /// The organisation.
    pub org: String,
}

/// Decodes a query string component (`+` is a space, `%XX` a byte).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(x) => {
                        out.push(x);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The reference for authentication at the opening (PROTOCOLS.md `cai`):
/// who the connection acts as, or the code it must be closed with. No keys
/// file: 1008. No key (`authorization` missing, or `Bearer ` with nothing
/// after it) or one whose SHA-256 is not in the file: 4001. No `orgId`:
/// 4002. An organisation the key may not act for: 4003. The first value of
/// a repeated parameter counts; `Bearer` is matched in any case.
pub fn reference_auth(ring: Option<&KeyRing>, query: &str) -> Result<Creds, u16> {
    let Some(ring) = ring else {
        return Err(1008);
    };
    let mut auth = None;
    let mut org = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match unescape(k).as_str() {
            "authorization" if auth.is_none() => auth = Some(unescape(v)),
            "orgId" if org.is_none() => org = Some(unescape(v)),
            _ => {}
        }
    }
    let auth = auth.unwrap_or_default();
    let auth = auth.trim();
    let token = match auth.get(..7) {
        Some(p) if p.eq_ignore_ascii_case("bearer ") => auth[7..].trim(),
        _ => auth,
    };
    if token.is_empty() {
        return Err(4001);
    }
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let Some(key) = (0..ring.len()).find(|&i| ring.key(i).is_some_and(|k| k.sha256 == digest))
    else {
        return Err(4001);
    };
    let org = org.unwrap_or_default();
    if org.is_empty() {
        return Err(4002);
    }
    if !ring.key(key).is_some_and(|k| k.orgs.contains(&org)) {
        return Err(4003);
    }
    Ok(Creds { key, org })
}

/// A client message, as the checkers need it.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// `COMPLETION`.
    Completion {
        /// Its `requestId`.
        rid: String,
        /// `options.stream` (default true).
        stream: bool,
        /// `options.window`.
        window: Option<u64>,
        /// `options.sentenceWindow`.
        sentence_window: Option<u64>,
        /// `conversationId`.
        conversation: Option<String>,
        /// It continues the kept conversation: a `conversationId` and no
        /// `context`.
        continues: bool,
        /// `model`, if it names one.
        model: Option<String>,
    },
    /// `INTERRUPTED`.
    Interrupt {
        /// The request.
        rid: String,
    },
    /// `AWAIT_MORE`.
    AwaitMore {
        /// The request.
        rid: String,
        /// `payload.lastReceivedIndex`.
        last: Option<u64>,
    },
    /// `SENTENCE_COMPLETED`.
    SentenceDone {
        /// The request.
        rid: String,
        /// `payload.sentenceIndex`.
        index: u64,
    },
    /// A message that does not decode, or a binary frame: one `ERROR`
    /// naming the `requestId` it could read (null if none).
    Bad {
        /// The `requestId` the error names.
        rid: Option<String>,
        /// The code the error must have.
        code: &'static str,
    },
}

impl Msg {
    /// Reads a text frame the way the dialect does.
    pub fn of_text(text: &str) -> Msg {
        match codec::decode_client(text) {
            Err(e) => Msg::Bad {
                rid: e.request_id,
                code: e.code.as_str(),
            },
            Ok(ClientMessage::Completion(c)) => {
                let window = |k: &str| {
                    c.options
                        .get(k)
                        .and_then(Value::as_u64)
                        .filter(|n| (1..=u64::from(u32::MAX)).contains(n))
                };
                Msg::Completion {
                    stream: c.options.get("stream").and_then(Value::as_bool) != Some(false),
                    window: window("window"),
                    sentence_window: window("sentenceWindow"),
                    continues: c.conversation_id.is_some() && c.context.is_none(),
                    conversation: c.conversation_id,
                    rid: c.request_id,
                    model: c.model,
                }
            }
            Ok(ClientMessage::Interrupted { request_id }) => Msg::Interrupt { rid: request_id },
            Ok(ClientMessage::AwaitMore {
                request_id,
                last_received_index,
            }) => Msg::AwaitMore {
                rid: request_id,
                last: last_received_index,
            },
            Ok(ClientMessage::SentenceCompleted {
                request_id,
                sentence_index,
            }) => Msg::SentenceDone {
                rid: request_id,
                index: sentence_index,
            },
        }
    }

    fn describe(&self) -> String {
        match self {
            Msg::Completion { rid, .. } => format!("COMPLETION {rid:?}"),
            Msg::Interrupt { rid } => format!("INTERRUPTED {rid:?}"),
            Msg::AwaitMore { rid, last } => format!("AWAIT_MORE {rid:?} ({last:?})"),
            Msg::SentenceDone { rid, index } => format!("SENTENCE_COMPLETED {rid:?} ({index})"),
            Msg::Bad { rid, .. } => format!("an invalid message (requestId {rid:?})"),
        }
    }
}

/// What the message being handled sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// The prompt of `rid` came back tokenized: `STREAM_START` or an
    /// `ERROR` (a request that does not stream gets nothing when it starts).
    TextDone {
        /// The request.
        rid: String,
        /// It streams.
        stream: bool,
        /// Its frame came.
        done: bool,
    },
    /// A `COMPLETION`: its `ERROR`, or its prompt's text job.
    Completion {
        /// The message.
        msg: Msg,
        /// Its answer came.
        done: bool,
    },
    /// Exactly one frame of `kind` naming `rid`.
    One {
        /// `ERROR` or `INTERRUPTED_ACK`.
        kind: &'static str,
        /// The code an `ERROR` must have.
        code: &'static str,
        /// The `requestId` it names.
        rid: Option<String>,
        /// It came.
        done: bool,
        /// What it answers.
        what: String,
    },
    /// What the request's windows now let out: chunks, sentence boundaries
    /// and maybe `STREAM_COMPLETE` of `rid` (maybe nothing).
    Flush {
        /// The request.
        rid: String,
    },
    /// Nothing (a late acknowledgement of a request that ended).
    Silent,
}

impl Expect {
    fn finished(&self) -> bool {
        match self {
            Expect::TextDone { stream, done, .. } => *done || !stream,
            Expect::Completion { done, .. } | Expect::One { done, .. } => *done,
            Expect::Flush { .. } | Expect::Silent => true,
        }
    }

    fn describe(&self) -> String {
        match self {
            Expect::TextDone { rid, .. } => format!("the tokenized prompt of {rid:?}"),
            Expect::Completion { msg, .. } => msg.describe(),
            Expect::One { what, .. } => what.clone(),
            Expect::Flush { rid } => format!("an acknowledgement for {rid:?}"),
            Expect::Silent => "a late acknowledgement".into(),
        }
    }
}

/// A request in flight (accepted, no terminal frame yet).
#[derive(Debug, Clone, PartialEq)]
pub struct Req {
    /// It asked for a stream.
    pub stream: bool,
    /// `options.window`.
    pub window: Option<u64>,
    /// `options.sentenceWindow`.
    pub sentence_window: Option<u64>,
    /// An `AWAIT_MORE` for it was handled (the chunk window is on).
    pub awaited: bool,
    /// Its prompt came back tokenized.
    pub tokenized: bool,
    /// `STREAM_START` was sent.
    pub started: bool,
    /// `CONTENT_CHUNK`s sent.
    pub chunks: u64,
    /// Their text.
    pub text: String,
    /// `SENTENCE_BOUNDARY`s sent.
    pub sentences: u64,
    /// Their sentences, concatenated.
    pub sentence_text: String,
    /// Chunks acknowledged (the last received index plus one), as handled.
    pub acked: u64,
    /// Sentences completed (the last completed index plus one), as handled.
    pub completed: u64,
    /// When its COMPLETION was accepted.
    pub accepted_at: Instant,
}

impl Req {
    /// The chunk window in force: `options.window`, or the default once an
    /// `AWAIT_MORE` was handled; `None` while it streams freely.
    pub fn chunk_window(&self) -> Option<u64> {
        self.window
            .or_else(|| self.awaited.then_some(DEFAULT_WINDOW))
    }

    /// The next chunk may be sent.
    pub fn chunk_fits(&self) -> bool {
        self.chunk_window()
            .is_none_or(|w| self.chunks < self.acked + w)
    }

    /// The next sentence boundary may be sent.
    pub fn sentence_fits(&self) -> bool {
        self.sentence_window
            .is_none_or(|w| self.sentences < self.completed + w)
    }

    /// A window is full: the generation must get no compute.
    pub fn window_full(&self) -> bool {
        !self.chunk_fits() || !self.sentence_fits()
    }

    /// Its windows as the wire shows them, for a checker's message.
    pub fn windows(&self) -> String {
        format!(
            "{} chunks, {} acked, window {:?}, {} sentences, {} completed, sentence window {:?}",
            self.chunks,
            self.acked,
            self.chunk_window(),
            self.sentences,
            self.completed,
            self.sentence_window
        )
    }
}

/// How the current event hands the connection's messages to the dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// No message: frames come from generations (tokens, failures, deadlines).
    #[default]
    Async,
    /// The one message that arrived.
    Handling,
    /// The held messages, after a text job came back or the model loaded.
    Releasing,
}

/// One `cai` connection.
#[derive(Debug, Clone, PartialEq)]
pub struct CaiConnView {
    /// Its query string.
    pub query: String,
    /// Who it acts as, or the close code its opening calls for.
    pub auth: Result<Creds, u16>,
    /// Messages the Host holds, oldest first.
    pub held: VecDeque<Msg>,
    /// The message being handled.
    pub cur: Option<Expect>,
    /// How this event hands messages over.
    pub mode: Mode,
    /// A held message asked for a text job in this event: the rest wait.
    pub stopped: bool,
    /// Requests in flight, by `requestId`.
    pub requests: BTreeMap<String, Req>,
    /// The request whose prompt is being tokenized.
    pub tokenizing: Option<(TextJobId, String)>,
    /// Ended request ids the Host remembers (oldest first).
    pub recent: VecDeque<String>,
    /// Requests accepted on it.
    pub accepted: u64,
    /// Every request in flight streams, has started and has a full window,
    /// since this many engine steps had completed.
    pub paused_since: Option<u64>,
    /// The first frame that did not fit what the messages call for.
    pub desync: Option<String>,
    /// Held messages taken up, and times every request became window-paused,
    /// since the view last collected them (coverage).
    pub counts: (u64, u64),
}

/// The `requestId` of a frame.
pub fn rid_of(f: &Frame) -> Option<&str> {
    f.str("requestId")
}

/// The `error.code` of an `ERROR` frame.
pub fn code(f: &Frame) -> &str {
    f.v["error"]["code"].as_str().unwrap_or("")
}

impl CaiConnView {
    /// A connection opened with `query` on a Host with keys file `ring`.
    pub fn opened(ring: Option<&KeyRing>, query: &str) -> CaiConnView {
        CaiConnView {
            query: query.to_string(),
            auth: reference_auth(ring, query),
            held: VecDeque::new(),
            cur: None,
            mode: Mode::Async,
            stopped: false,
            requests: BTreeMap::new(),
            tokenizing: None,
            recent: VecDeque::new(),
            accepted: 0,
            paused_since: None,
            desync: None,
            counts: (0, 0),
        }
    }

    fn remember(&mut self, rid: &str) {
        if self.recent.len() >= RECENT_REQUESTS {
            self.recent.pop_front();
        }
        self.recent.push_back(rid.to_string());
    }

    fn mismatch(&mut self, what: String) {
        if self.desync.is_none() {
            self.desync = Some(what);
        }
    }

    /// A message arrived (`loaded`: the model is loaded). Held while the
    /// model loads, a prompt is tokenized, or older messages wait; handled
    /// at once otherwise.
    pub fn on_message(&mut self, msg: Msg, loaded: bool) {
        if !loaded || self.tokenizing.is_some() || !self.held.is_empty() {
            self.held.push_back(msg);
            return;
        }
        self.mode = Mode::Handling;
        self.cur = Some(self.take_up(msg));
    }

    /// The Host takes `msg` up: what it changes at once and what it sends.
    fn take_up(&mut self, msg: Msg) -> Expect {
        let error = |rid: &str, what: String| Expect::One {
            kind: "ERROR",
            code: "INVALID_PAYLOAD",
            rid: Some(rid.to_string()),
            done: false,
            what,
        };
        let what = msg.describe();
        match msg {
            Msg::Completion { .. } => Expect::Completion { msg, done: false },
            Msg::Bad { rid, code } => Expect::One {
                kind: "ERROR",
                code,
                rid,
                done: false,
                what,
            },
            Msg::Interrupt { rid } => {
                let kind = if self.requests.contains_key(&rid) {
                    "INTERRUPTED_ACK"
                } else {
                    "ERROR"
                };
                Expect::One {
                    kind,
                    code: "INVALID_REQUEST",
                    rid: Some(rid),
                    done: false,
                    what,
                }
            }
            Msg::AwaitMore { rid, last } => {
                let Some(r) = self.requests.get_mut(&rid) else {
                    return self.unknown(rid, what);
                };
                let acked = match last {
                    None => r.chunks,
                    Some(i) if i < r.chunks => i + 1,
                    Some(_) => return error(&rid, what),
                };
                r.acked = r.acked.max(acked);
                r.awaited = true;
                Expect::Flush { rid }
            }
            Msg::SentenceDone { rid, index } => {
                let Some(r) = self.requests.get_mut(&rid) else {
                    return self.unknown(rid, what);
                };
                if index >= r.sentences {
                    return error(&rid, what);
                }
                r.completed = r.completed.max(index + 1);
                Expect::Flush { rid }
            }
        }
    }

    /// An acknowledgement for a request not in flight.
    fn unknown(&self, rid: String, what: String) -> Expect {
        if self.recent.contains(&rid) {
            Expect::Silent
        } else {
            Expect::One {
                kind: "ERROR",
                code: "INVALID_REQUEST",
                rid: Some(rid),
                done: false,
                what,
            }
        }
    }

    /// A binary frame arrived.
    pub fn on_binary(&mut self, loaded: bool) {
        let msg = Msg::Bad {
            rid: None,
            code: "INVALID_REQUEST",
        };
        self.on_message(msg, loaded);
    }

    /// The text job `job` came back: its request's start, then the held
    /// messages.
    pub fn on_tokenized(&mut self, job: TextJobId) {
        let Some((j, rid)) = self.tokenizing.clone() else {
            return;
        };
        if j != job {
            return;
        }
        self.tokenizing = None;
        let stream = match self.requests.get_mut(&rid) {
            Some(r) => {
                r.tokenized = true;
                r.stream
            }
            None => false,
        };
        self.mode = Mode::Releasing;
        self.stopped = false;
        self.cur = Some(Expect::TextDone {
            rid,
            stream,
            done: false,
        });
    }

    /// The model loaded: the held messages are handed over.
    pub fn on_loaded(&mut self) {
        self.mode = Mode::Releasing;
        self.stopped = false;
        self.cur = None;
    }

    fn can_absorb(&self, f: Option<&Frame>, tokenize: bool) -> bool {
        let Some(cur) = &self.cur else {
            return false;
        };
        if tokenize {
            return matches!(cur, Expect::Completion { done: false, .. });
        }
        let Some(f) = f else {
            return false;
        };
        let (kind, rid) = (f.kind(), rid_of(f));
        match cur {
            Expect::TextDone { rid: r, done, .. } => {
                !done
                    && rid == Some(r.as_str())
                    && (kind == "STREAM_START" || (kind == "ERROR" && refuses_tokenized_prompt(f)))
            }
            Expect::Completion {
                msg: Msg::Completion { rid: r, .. },
                done,
            } => !done && kind == "ERROR" && rid == Some(r.as_str()),
            Expect::Completion { .. } | Expect::Silent => false,
            Expect::One {
                kind: k,
                rid: r,
                done,
                ..
            } => !done && kind == *k && rid == r.as_deref(),
            Expect::Flush { rid: r } => {
                if rid != Some(r.as_str()) {
                    return false;
                }
                let Some(req) = self.requests.get(r) else {
                    return false;
                };
                match kind {
                    "CONTENT_CHUNK" => req.chunk_fits(),
                    "SENTENCE_BOUNDARY" => req.sentence_fits(),
                    "STREAM_COMPLETE" => true,
                    _ => false,
                }
            }
        }
    }

    /// Before `f` (or a text job, `tokenize`) goes out: the held messages
    /// the Host must have taken up before it are taken up.
    pub fn prepare(&mut self, f: Option<&Frame>, tokenize: bool) {
        if self.mode == Mode::Async {
            return;
        }
        while !self.can_absorb(f, tokenize) && self.cur.as_ref().is_none_or(Expect::finished) {
            if !self.advance() {
                break;
            }
        }
    }

    /// Takes up the next held message; false when there is none to take.
    fn advance(&mut self) -> bool {
        if self.mode != Mode::Releasing || self.stopped {
            return false;
        }
        let Some(msg) = self.held.pop_front() else {
            return false;
        };
        self.counts.0 += 1;
        self.cur = Some(self.take_up(msg));
        true
    }

    /// A text job for this connection went out (the COMPLETION being
    /// handled was accepted).
    pub fn on_tokenize(&mut self, now: Instant, job: TextJobId) {
        let cur = self.cur.take();
        let Some(Expect::Completion {
            msg:
                Msg::Completion {
                    rid,
                    stream,
                    window,
                    sentence_window,
                    conversation,
                    continues,
                    model,
                },
            done: false,
        }) = cur
        else {
            self.cur = cur;
            self.mismatch(
                "a prompt was sent to be tokenized with no COMPLETION being handled".into(),
            );
            return;
        };
        self.accepted += 1;
        self.tokenizing = Some((job, rid.clone()));
        self.requests.insert(
            rid.clone(),
            Req {
                stream,
                window,
                sentence_window,
                awaited: false,
                tokenized: false,
                started: false,
                chunks: 0,
                text: String::new(),
                sentences: 0,
                sentence_text: String::new(),
                acked: 0,
                completed: 0,
                accepted_at: now,
            },
        );
        if self.mode == Mode::Releasing {
            self.stopped = true;
        }
        self.cur = Some(Expect::Completion {
            msg: Msg::Completion {
                rid,
                stream,
                window,
                sentence_window,
                conversation,
                continues,
                model,
            },
            done: true,
        });
    }

    /// The server sent `f` on this connection (after [`Self::prepare`]).
    pub fn on_frame(&mut self, f: &Frame) {
        let placed = self.mode == Mode::Async || self.can_absorb(Some(f), false);
        if !placed {
            let while_ = self
                .cur
                .as_ref()
                .map_or("no message".to_string(), Expect::describe);
            self.mismatch(format!(
                "{} for {:?} while handling {while_}",
                f.kind(),
                rid_of(f)
            ));
        }
        let kind = f.kind();
        let rid = rid_of(f).unwrap_or("").to_string();
        if placed {
            match self.cur.as_mut() {
                Some(Expect::TextDone { done, .. })
                | Some(Expect::Completion { done, .. })
                | Some(Expect::One { done, .. })
                    if self.mode != Mode::Async =>
                {
                    *done = true;
                }
                _ => {}
            }
        }
        let answer = self.mode != Mode::Async && placed;
        let text_done = answer && matches!(self.cur, Some(Expect::TextDone { .. }));
        match kind {
            "STREAM_START" => {
                if let Some(r) = self.requests.get_mut(&rid) {
                    r.started = true;
                }
            }
            "CONTENT_CHUNK" => {
                if let Some(r) = self.requests.get_mut(&rid) {
                    r.chunks += 1;
                    r.text
                        .push_str(f.v["payload"]["content"].as_str().unwrap_or(""));
                }
            }
            "SENTENCE_BOUNDARY" => {
                if let Some(r) = self.requests.get_mut(&rid) {
                    r.sentences += 1;
                    r.sentence_text
                        .push_str(f.v["payload"]["sentence"].as_str().unwrap_or(""));
                }
            }
            "ERROR" if text_done => {
                // A prompt refused once tokenized is not remembered.
                self.requests.remove(&rid);
            }
            "STREAM_COMPLETE" | "INTERRUPTED_ACK" | "ERROR" => {
                // An `ERROR` that answers a message ends nothing.
                let ends = kind != "ERROR" || !answer;
                if ends && self.requests.remove(&rid).is_some() {
                    self.remember(&rid);
                }
            }
            _ => {}
        }
    }

    /// True when `f` is an `INTERRUPTED_ACK` whose `partialContent` holds
    /// more than the chunks sent (text that waited for the window).
    pub fn partial_beyond_chunks(&self, f: &Frame) -> bool {
        f.kind() == "INTERRUPTED_ACK"
            && rid_of(f)
                .and_then(|rid| self.requests.get(rid))
                .is_some_and(|r| {
                    f.v["payload"]["partialContent"]
                        .as_str()
                        .is_some_and(|p| p.len() > r.text.len())
                })
    }

    /// True when `f` is the `ERROR` of a request whose prompt cannot start.
    pub fn is_start_refusal(&self, f: &Frame) -> bool {
        matches!(&self.cur, Some(Expect::TextDone { rid, done: false, .. })
            if rid_of(f) == Some(rid.as_str()))
            && f.kind() == "ERROR"
            && refuses_tokenized_prompt(f)
    }

    /// True when `f`, about to be sent, ends a request in flight: its
    /// `STREAM_COMPLETE`, `INTERRUPTED_ACK`, or an `ERROR` that answers no
    /// message (call after [`Self::prepare`]).
    pub fn is_terminal(&self, f: &Frame) -> bool {
        let Some(rid) = rid_of(f) else {
            return false;
        };
        if !self.requests.contains_key(rid) {
            return false;
        }
        match f.kind() {
            "STREAM_COMPLETE" | "INTERRUPTED_ACK" => true,
            "ERROR" => self.mode == Mode::Async || self.is_start_refusal(f),
            _ => false,
        }
    }

    /// The event is over: the messages the Host must have taken up without
    /// a word are taken up; what expected a frame and got none is a
    /// desynchronisation.
    pub fn on_end(&mut self) {
        if self.mode != Mode::Async {
            loop {
                if let Some(cur) = &self.cur {
                    if !cur.finished() {
                        let what = cur.describe();
                        self.mismatch(format!("{what} got no answer"));
                        break;
                    }
                }
                // A COMPLETION always gets an answer at once: one held and
                // not taken up means the release stopped.
                if matches!(self.held.front(), Some(Msg::Completion { .. })) && !self.stopped {
                    if self.mode == Mode::Releasing {
                        let m = self.held.front().map(Msg::describe).unwrap_or_default();
                        self.mismatch(format!("{m}, held, was not handled when the hold ended"));
                    }
                    break;
                }
                if !self.advance() {
                    break;
                }
            }
        }
        self.mode = Mode::Async;
        self.cur = None;
        self.stopped = false;
    }

    /// Every request in flight streams, has started and has a full window.
    pub fn all_paused(&self) -> bool {
        !self.requests.is_empty()
            && self
                .requests
                .values()
                .all(|r| r.stream && r.started && r.window_full())
    }

    /// Notes when the connection's generations all became window-paused,
    /// `steps` engine steps having completed.
    pub fn refresh(&mut self, steps: u64) {
        if !self.all_paused() {
            self.paused_since = None;
        } else if self.paused_since.is_none() {
            self.paused_since = Some(steps);
            self.counts.1 += 1;
        }
    }

    /// Requests in flight, described.
    pub fn outstanding(&self) -> Vec<String> {
        self.requests
            .iter()
            .map(|(rid, r)| {
                format!(
                    "cai request {rid:?} (accepted {:?}, stream {}, started {}, {})",
                    r.accepted_at,
                    r.stream,
                    r.started,
                    r.windows()
                )
            })
            .collect()
    }
}

/// True for the `ERROR` a request gets when its tokenized prompt cannot
/// start (too long, the queue full, shutting down, not tokenizable).
pub fn refuses_tokenized_prompt(f: &Frame) -> bool {
    match code(f) {
        "CONTEXT_TOO_LONG" | "RATE_LIMITED" | "INTERNAL_ERROR" => true,
        "INVALID_PAYLOAD" => f.v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("the prompt could not be tokenized")),
        _ => false,
    }
}

/// Coverage key of a server frame.
pub fn tally_key(f: &Frame) -> Option<String> {
    Some(match f.kind() {
        "ERROR" => {
            let d = &f.v["error"]["details"];
            let why = if d.get("maxInflight").is_some() {
                ":in_flight"
            } else if d.get("retryAfterMs").is_some() {
                ":meter"
            } else {
                ""
            };
            format!("cai:error:{}{why}", code(f))
        }
        "STREAM_COMPLETE" => format!(
            "cai:complete:{}",
            f.v["payload"]["finishReason"].as_str().unwrap_or("?")
        ),
        "INTERRUPTED_ACK" => "cai:interrupted".into(),
        "STREAM_START" => "cai:start".into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwire_core::keys::{hash_key, ApiKey};

    #[test]
    fn the_reference_follows_the_contract() {
        let ring = KeyRing::new(vec![
            ApiKey {
                name: "a".into(),
                sha256: hash_key("key-a"),
                orgs: vec!["org_1".into(), "org 2".into()],
                requests_per_minute: None,
                tokens_per_minute: None,
            },
            ApiKey {
                name: "b".into(),
                sha256: hash_key("key-b"),
                orgs: vec!["org_3".into()],
                requests_per_minute: None,
                tokens_per_minute: None,
            },
        ])
        .expect("ring");
        let code = |q: &str| reference_auth(Some(&ring), q).map(|c| (c.key, c.org));
        assert_eq!(
            reference_auth(None, "authorization=key-a&orgId=org_1"),
            Err(1008)
        );
        assert_eq!(code(""), Err(4001));
        assert_eq!(code("orgId=org_1"), Err(4001));
        assert_eq!(code("authorization=Bearer%20&orgId=org_1"), Err(4001));
        assert_eq!(code("authorization=key-x&orgId=org_1"), Err(4001));
        assert_eq!(code("authorization=key-a"), Err(4002));
        assert_eq!(code("authorization=key-a&orgId="), Err(4002));
        assert_eq!(code("authorization=key-a&orgId=org_3"), Err(4003));
        assert_eq!(
            code("authorization=Bearer%20key-a&orgId=org_1"),
            Ok((0, "org_1".into()))
        );
        assert_eq!(
            code("orgId=org%202&authorization=bearer+key-a&x=1"),
            Ok((0, "org 2".into()))
        );
        assert_eq!(
            code("authorization=key-b&orgId=org_3&orgId=org_1"),
            Ok((1, "org_3".into()))
        );
        assert_eq!(unescape("a%2"), "a%2");
        assert_eq!(unescape("%zz+%41"), "%zz A");
    }
}
