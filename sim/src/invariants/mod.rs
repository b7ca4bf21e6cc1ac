//! Invariant checkers, one file each, run after every event, laid out like
//! the core's dialects: the checkers every dialect must pass in [`common`],
//! and each dialect's own checkers beside its part of the view in a
//! directory of its own ([`generate`], [`session`], [`responses`], [`cai`],
//! [`batch`], [`chat`], [`anthropic`]).
//!
//! Checkers judge only what crosses the Host's boundary: the inputs it was
//! given, the outputs it produced, and its gauges after each event. They never
//! trust the simulated clients, so they work the same on a live run and on a
//! `--replay`, and a test can feed them a fabricated sequence of outputs.
//!
//! A [`Monitor`] keeps the shared [`View`] (what each connection has seen,
//! request by request: the parts every dialect shares in [`view`], each
//! dialect's own in its directory's `view` module: `generate`'s requests,
//! `session`'s messages and sessions, `responses`' responses, `cai`'s
//! requests and `batch`'s payloads and continue-generation cache) and runs
//! every checker on each observation, *before* the view takes it in: a
//! checker sees the state as it was before the frame it is judging (a `cai`
//! connection having taken up the held messages the Host handled before that
//! frame).
//!
//! - [`common`]: closes and what may follow them, the idle, keepalive,
//!   slow-client and shutdown deadlines, KV blocks, the scheduler, step
//!   budgets, flow control, metrics, isolation and liveness.
//! - [`generate`]: wire format, replies (against a reference model of the
//!   dialect), queue positions, sampling, engine faults, terminal events,
//!   streamed text, stop strings, `max_tokens`, token delivery, pause and its
//!   timeout, and that the engine never idles while a request waits.
//! - [`session`], [`responses`], [`cai`], [`batch`]: each dialect's wire
//!   format, replies, terminal frames and bounds (see each directory).
//! - [`chat`]: the OpenAI HTTP routes' answers, judged whole: one per
//!   request, shaped and counted as the API says, prompt scores and
//!   embeddings recomputed from the prompt, the tokenizer routes.
//! - [`anthropic`]: the Messages routes' replies and event streams as
//!   Anthropic's API orders them.
//!
//! A checker's name (what a violation prints, what `--skip` takes, what a
//! trace records among the checkers it skipped) is the one its module doc
//! starts with: the common and `generate` checkers' names carry no prefix,
//! the other dialects' carry the dialect's (`session_wire`, `batch_order`).
//! The names predate this layout and are kept as they were, so that skip
//! lists in recorded traces keep meaning what they meant.

pub mod anthropic;
pub mod batch;
pub mod cai;
pub mod chat;
pub mod common;
pub mod generate;
pub mod http;
pub mod responses;
pub mod session;
pub mod view;

use std::fmt;

use serde_json::Value;
use tokenwire_core::host::HostStats;
use tokenwire_core::{ConnId, Dialect, Duration, HostConfig, Input, Instant, ModelInfo, Output};

pub use view::View;

/// What a checker returns: the violation's description on failure.
pub type Check = Result<(), String>;

/// The input being handled, in short (for "was this frame a reply?" questions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cur {
    /// No input (a crash, the end of the run).
    None,
    /// A connection opened.
    Open(ConnId),
    /// A text frame from this connection.
    Text(ConnId),
    /// A binary frame from this connection.
    Binary(ConnId),
    /// The step with this id finished.
    StepDone(u64),
    /// Model loading progress (broadcast to every connection).
    Loading,
    /// The model finished loading (frames held while loading are handled now).
    Loaded,
    /// A text job of this connection came back (its request starts or fails,
    /// and the frames it held are handled now).
    Tokenized(ConnId),
    /// A job check of this connection came back (its session starts or is
    /// refused, and the frames it held are handled now).
    Verified(ConnId),
    /// A frame over the size limit arrived on this connection.
    TooLarge(ConnId),
    /// Anything else.
    Other,
}

impl Cur {
    /// The short form of `input`.
    pub fn of(input: &Input) -> Cur {
        match input {
            Input::Open { conn, .. } => Cur::Open(*conn),
            Input::Text { conn, .. } => Cur::Text(*conn),
            Input::Binary { conn, .. } => Cur::Binary(*conn),
            Input::FrameTooLarge { conn } => Cur::TooLarge(*conn),
            Input::StepDone(d) => Cur::StepDone(d.step_id),
            Input::ModelLoading { .. } => Cur::Loading,
            Input::ModelLoaded { .. } => Cur::Loaded,
            _ => Cur::Other,
        }
    }

    /// True when a frame to `conn` can be a reply to this input.
    pub fn is_reply_to(self, conn: ConnId) -> bool {
        match self {
            Cur::Open(c) | Cur::Text(c) | Cur::Binary(c) | Cur::Tokenized(c) | Cur::Verified(c) => {
                c == conn
            }
            Cur::Loading | Cur::Loaded => true,
            _ => false,
        }
    }
}

/// A frame sent to a client, parsed once for every checker.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The parsed JSON (`Null` when the text is not JSON).
    pub v: Value,
}

impl Frame {
    /// Parses a frame's text.
    pub fn parse(text: &str) -> Frame {
        Frame {
            v: serde_json::from_str(text).unwrap_or(Value::Null),
        }
    }

    /// Its `type` field ("" when absent).
    pub fn kind(&self) -> &str {
        self.v["type"].as_str().unwrap_or("")
    }

    /// A string field.
    pub fn str(&self, field: &str) -> Option<&str> {
        self.v.get(field).and_then(Value::as_str)
    }

    /// Its `request_id`, if any.
    pub fn request_id(&self) -> Option<&str> {
        self.str("request_id")
    }

    /// True for an `error` that ends a generation (it carries the partial text).
    pub fn is_failure(&self) -> bool {
        self.kind() == "error" && self.v.get("generated_text").is_some()
    }

    /// True for a `completion` or a failure `error`: the request's terminal event.
    pub fn is_terminal(&self) -> bool {
        self.kind() == "completion" || self.is_failure()
    }
}

/// The start of a frame, for violation messages (at most 160 bytes).
pub fn clip(text: &str) -> String {
    if text.len() <= 160 {
        return text.to_string();
    }
    let mut end = 160;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// What every checker can see.
pub struct Cx<'a> {
    /// The Host's time for this event.
    pub now: Instant,
    /// The time the event was meant to happen (before a clock jump delayed
    /// it); late-deadline checks use it, since the Host cannot act before it
    /// is given the chance.
    pub nominal: Instant,
    /// Events handled so far in this run (this one included).
    pub event: u64,
    /// The input being handled.
    pub input: Cur,
    /// Shared view of connections and requests.
    pub view: &'a View,
    /// The Host's settings.
    pub config: &'a HostConfig,
    /// The served model.
    pub model: &'a ModelInfo,
    /// Slack on every deadline (one engine step and a millisecond).
    pub slack: Duration,
}

impl<'a> Cx<'a> {
    /// When `out` closes a known connection with `reason`: that connection
    /// and its view as it was before the close. The deadline checkers judge
    /// only their own closes.
    pub fn closed_with(&self, out: &Output, reason: &str) -> Option<(ConnId, &'a view::ConnView)> {
        let Output::Close {
            conn, reason: r, ..
        } = out
        else {
            return None;
        };
        if r != reason {
            return None;
        }
        self.view.conns.get(conn).map(|c| (*conn, c))
    }
}

/// The Host's state after an event.
#[derive(Debug, Clone, PartialEq)]
pub struct EndState {
    /// `host.stats()`.
    pub stats: HostStats,
    /// `host.check_invariants()`.
    pub sched: Result<(), String>,
}

/// An invariant checker.
pub trait Checker {
    /// The invariant's name (as printed on failure).
    fn name(&self) -> &'static str;
    /// An input is about to be handled.
    fn on_input(&mut self, _cx: &Cx<'_>, _input: &Input) -> Check {
        Ok(())
    }
    /// The Host produced an output (`frame` is the parsed text of a `Send`).
    fn on_output(&mut self, _cx: &Cx<'_>, _out: &Output, _frame: Option<&Frame>) -> Check {
        Ok(())
    }
    /// The event is over and every output drained.
    fn on_end(&mut self, _cx: &Cx<'_>, _end: &EndState) -> Check {
        Ok(())
    }
    /// The Host crashed: every connection is gone.
    fn on_crash(&mut self) {}
    /// The run is over (the liveness phase ended).
    fn on_finish(&mut self, _cx: &Cx<'_>) -> Check {
        Ok(())
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: String,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant `{}` violated: {}",
            self.invariant, self.detail
        )
    }
}

/// Every checker of the dialects the core serves today.
pub fn all_checkers() -> Vec<Box<dyn Checker>> {
    let mut v = common::checkers();
    v.extend(generate::checkers());
    v.extend(session::checkers());
    v.extend(responses::checkers());
    v.extend(cai::checkers());
    v.extend(batch::checkers());
    v.extend(chat::checkers());
    v.extend(anthropic::checkers());
    v
}

/// A checker that judges one dialect's connections only: outputs aimed at a
/// connection of another dialect (as the [`View`] knows it) are not shown
/// to it. Inputs, outputs tied to no connection (steps, metrics), the end of
/// each event and the end of the run are.
pub struct ForDialect {
    dialect: Dialect,
    inner: Box<dyn Checker>,
}

impl ForDialect {
    /// `inner`, judging only `dialect`'s connections.
    pub fn wrap(dialect: Dialect, inner: Box<dyn Checker>) -> Box<dyn Checker> {
        Box::new(ForDialect { dialect, inner })
    }
}

/// The connection an output concerns, if any.
pub fn conn_of(out: &Output) -> Option<ConnId> {
    match out {
        Output::Send { conn, .. }
        | Output::Ping { conn }
        | Output::Close { conn, .. }
        | Output::PauseReading { conn }
        | Output::ResumeReading { conn } => Some(*conn),
        Output::Tokenize(job) => Some(job.conn),
        Output::VerifyJob(check) => Some(check.conn),
        _ => None,
    }
}

impl Checker for ForDialect {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        self.inner.on_input(cx, input)
    }
    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let other = conn_of(out)
            .and_then(|c| cx.view.dialect_of(c))
            .is_some_and(|d| d != self.dialect);
        if other {
            return Ok(());
        }
        self.inner.on_output(cx, out, frame)
    }
    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        self.inner.on_end(cx, end)
    }
    fn on_crash(&mut self) {
        self.inner.on_crash()
    }
    fn on_finish(&mut self, cx: &Cx<'_>) -> Check {
        self.inner.on_finish(cx)
    }
}

/// Every checker except those named in `skip` (triage of a known bug).
pub fn checkers_except(skip: &[String]) -> Vec<Box<dyn Checker>> {
    all_checkers()
        .into_iter()
        .filter(|c| !skip.iter().any(|s| s == c.name()))
        .collect()
}

/// Runs checkers over the Host's inputs and outputs and keeps the [`View`].
pub struct Monitor {
    view: View,
    checkers: Vec<Box<dyn Checker>>,
    config: HostConfig,
    model: ModelInfo,
    slack: Duration,
    now: Instant,
    nominal: Instant,
    event: u64,
    input: Cur,
}

impl Monitor {
    /// A monitor running `checkers` for a Host with `config` serving `model`.
    pub fn new(
        config: HostConfig,
        model: ModelInfo,
        slack: Duration,
        checkers: Vec<Box<dyn Checker>>,
    ) -> Monitor {
        let view = View::new(&config, &model);
        Monitor {
            view,
            checkers,
            config,
            model,
            slack,
            now: Instant::ZERO,
            nominal: Instant::ZERO,
            event: 0,
            input: Cur::None,
        }
    }

    /// The shared view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The shared view, to fabricate a state in a checker's test.
    #[cfg(test)]
    pub(crate) fn view_mut(&mut self) -> &mut View {
        &mut self.view
    }

    /// Events seen so far.
    pub fn events(&self) -> u64 {
        self.event
    }

    /// Sets whether the model starts loaded (`Host::with_model`) or loading.
    pub fn set_loaded(&mut self, loaded: bool) {
        self.view.loaded = loaded;
    }

    fn run(
        &mut self,
        mut f: impl FnMut(&mut dyn Checker, &Cx<'_>) -> Check,
    ) -> Result<(), Violation> {
        let cx = Cx {
            now: self.now,
            nominal: self.nominal,
            event: self.event,
            input: self.input,
            view: &self.view,
            config: &self.config,
            model: &self.model,
            slack: self.slack,
        };
        for c in self.checkers.iter_mut() {
            if let Err(detail) = f(&mut **c, &cx) {
                return Err(Violation {
                    invariant: c.name().to_string(),
                    detail,
                });
            }
        }
        Ok(())
    }

    /// An input is about to be handled at `now` (meant for `nominal`).
    pub fn input(
        &mut self,
        now: Instant,
        nominal: Instant,
        input: &Input,
    ) -> Result<(), Violation> {
        self.event += 1;
        self.now = now;
        self.nominal = nominal;
        self.input = match input {
            Input::Tokenized(done) => self
                .view
                .text_owner
                .get(&done.id)
                .map_or(Cur::Other, |&c| Cur::Tokenized(c)),
            Input::JobVerified { check, .. } => self
                .view
                .check_owner
                .get(check)
                .map_or(Cur::Other, |&c| Cur::Verified(c)),
            _ => Cur::of(input),
        };
        let r = self.run(|c, cx| c.on_input(cx, input));
        self.view.on_input(now, input);
        r
    }

    /// The Host produced `out`.
    pub fn output(&mut self, out: &Output) -> Result<(), Violation> {
        let frame = match out {
            Output::Send { text, .. } => Some(Frame::parse(text)),
            _ => None,
        };
        self.view.prepare(out, frame.as_ref());
        let r = self.run(|c, cx| c.on_output(cx, out, frame.as_ref()));
        self.view.on_output(self.now, out, frame.as_ref());
        r
    }

    /// The event is over; `end` is the Host's state now.
    pub fn end(&mut self, end: &EndState) -> Result<(), Violation> {
        self.view.on_end(self.now);
        self.run(|c, cx| c.on_end(cx, end))
    }

    /// The Host crashed at `now` and was rebuilt from nothing.
    pub fn crash(&mut self, now: Instant) {
        self.now = now;
        self.input = Cur::None;
        self.view.on_crash();
        for c in self.checkers.iter_mut() {
            c.on_crash();
        }
    }

    /// The run is over at `now`.
    pub fn finish(&mut self, now: Instant) -> Result<(), Violation> {
        self.now = now;
        self.nominal = now;
        self.input = Cur::None;
        self.run(|c, cx| c.on_finish(cx))
    }
}

/// Helpers for the checkers' tests: a Host-free way to feed fabricated events.
#[cfg(test)]
pub(crate) mod testkit {
    use super::*;
    use serde_json::json;
    use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
    use tokenwire_core::testing::{tiny_model_info, ByteCodec, BYTE_OFFSET};
    use tokenwire_core::{
        Dialect, Encoded, JobCheck, JobCheckId, JobGrant, SamplingParams, SeqId, SeqStep, StepDone,
        StepPlan, TextCodec, TextDone, TextJob, TextJobId, TextWork, Transport,
    };

    /// A monitor with one checker, time in milliseconds.
    pub struct Kit {
        pub m: Monitor,
        pub t: u64,
        /// Text jobs handed out so far.
        pub jobs: u64,
    }

    pub fn kit(checker: Box<dyn Checker>) -> Kit {
        kit_with(checker, HostConfig::default())
    }

    pub fn kit_with(checker: Box<dyn Checker>, config: HostConfig) -> Kit {
        Kit {
            m: Monitor::new(
                config,
                tiny_model_info(),
                Duration::from_millis(10),
                vec![checker],
            ),
            t: 0,
            jobs: 0,
        }
    }

    /// The credentials [`cai_kit`] accepts.
    pub const CAI_QUERY: &str = "authorization=Bearer%20sk-test&orgId=org_a";

    /// A kit for `cai` checkers: a keys file with the one key `sk-test`,
    /// for `org_a` only, 2 requests a minute and no token limit; at most 2
    /// requests in flight per connection.
    pub fn cai_kit(checker: Box<dyn Checker>) -> Kit {
        cai_kit_limits(checker, Some(2), None)
    }

    /// [`cai_kit`] with the key's requests and tokens per minute as given.
    pub fn cai_kit_limits(
        checker: Box<dyn Checker>,
        requests_per_minute: Option<u64>,
        tokens_per_minute: Option<u64>,
    ) -> Kit {
        let ring = KeyRing::new(vec![ApiKey {
            name: "test".into(),
            sha256: hash_key("sk-test"),
            orgs: vec!["org_a".into()],
            requests_per_minute,
            tokens_per_minute,
        }])
        .expect("ring");
        let config = HostConfig {
            keys: Some(ring),
            cai_max_inflight: 2,
            ..HostConfig::default()
        };
        kit_with(checker, config)
    }

    pub fn idle_end() -> EndState {
        EndState {
            stats: HostStats {
                loaded: true,
                load_progress: 100.0,
                connections: 0,
                queued: 0,
                running: 0,
                kv_blocks_used: 0,
                kv_blocks_kept: 0,
                kv_blocks_total: 64,
                kv_blocks_cached: 0,
                generations: 0,
                sessions: 0,
            },
            sched: Ok(()),
        }
    }

    impl Kit {
        pub fn at(&mut self, ms: u64) -> &mut Self {
            self.t = ms;
            self
        }
        pub fn now(&self) -> Instant {
            Instant::from_millis(self.t)
        }
        pub fn input(&mut self, i: Input) -> Result<(), Violation> {
            let now = self.now();
            self.m.input(now, now, &i)
        }
        pub fn out(&mut self, o: Output) -> Result<(), Violation> {
            self.m.output(&o)
        }
        pub fn send(&mut self, conn: u64, v: Value) -> Result<(), Violation> {
            self.out(Output::Send {
                conn: ConnId(conn),
                text: v.to_string(),
            })
        }
        pub fn end(&mut self) -> Result<(), Violation> {
            self.m.end(&idle_end())
        }
        pub fn open(&mut self, conn: u64) {
            self.open_as(conn, Dialect::Generate);
        }
        /// Opens a WebSocket connection of `dialect`.
        pub fn open_as(&mut self, conn: u64, dialect: Dialect) {
            self.input(Input::Open {
                conn: ConnId(conn),
                dialect,
                transport: Transport::WebSocket,
                query: String::new(),
                authorization: None,
                peer: String::new(),
            })
            .expect("open");
            self.end().expect("open end");
        }
        /// Opens an HTTP request's connection of `dialect`.
        pub fn open_http(&mut self, conn: u64, dialect: Dialect) {
            self.input(Input::Open {
                conn: ConnId(conn),
                dialect,
                transport: Transport::Http,
                query: String::new(),
                authorization: None,
                peer: String::new(),
            })
            .expect("open");
            self.end().expect("open end");
        }
        /// A `cai` connection opens with `query` (the event stays open).
        pub fn open_query(&mut self, conn: u64, query: &str) -> Result<(), Violation> {
            self.input(Input::Open {
                conn: ConnId(conn),
                dialect: Dialect::Cai,
                transport: Transport::WebSocket,
                query: query.into(),
                authorization: None,
                peer: String::new(),
            })
        }
        /// A `cai` connection opens with [`CAI_QUERY`].
        pub fn open_cai(&mut self, conn: u64) {
            self.open_query(conn, CAI_QUERY).expect("open");
            self.end().expect("open end");
        }
        /// A `COMPLETION` of `rid` on `conn`, handled at once and accepted:
        /// its prompt goes to be tokenized (the event ends).
        pub fn completion(
            &mut self,
            conn: u64,
            rid: &str,
            options: Value,
        ) -> Result<(), Violation> {
            self.text(
                conn,
                json!({"type": "COMPLETION", "requestId": rid,
                       "payload": {"prompt": format!("<c{conn}>hi"), "options": options}}),
            )?;
            self.jobs += 1;
            self.out(Output::Tokenize(TextJob {
                id: TextJobId(self.jobs),
                conn: ConnId(conn),
                codec: ByteCodec::shared(),
                work: TextWork::Encode {
                    text: "x".into(),
                    add_special: true,
                },
            }))?;
            self.end()
        }
        /// The last text job comes back (the event stays open).
        pub fn tokenized(&mut self, _conn: u64) -> Result<(), Violation> {
            self.input(Input::Tokenized(TextDone {
                id: TextJobId(self.jobs),
                result: Ok(Encoded {
                    ids: vec![],
                    dropped: 0,
                }),
            }))
        }
        /// The Host asks to verify job `job` of `conn`'s `session` start
        /// (check 1, the event ends), and the verifier grants it `grant`
        /// (the event stays open).
        pub fn job_verified(&mut self, conn: u64, job: &str, grant: JobGrant) {
            self.out(Output::VerifyJob(JobCheck {
                id: JobCheckId(1),
                conn: ConnId(conn),
                dialect: Dialect::Session,
                job_id: job.into(),
                public_key: None,
            }))
            .expect("check");
            self.end().expect("end");
            self.input(Input::JobVerified {
                check: JobCheckId(1),
                verdict: Ok(grant),
            })
            .expect("verdict");
        }
        pub fn text(&mut self, conn: u64, v: Value) -> Result<(), Violation> {
            self.input(Input::Text {
                conn: ConnId(conn),
                text: v.to_string(),
            })
        }
        /// Opens `conn`, sends a config and gets `init` with request id `rid`.
        pub fn start(&mut self, conn: u64, rid: &str, config: Value) {
            self.open(conn);
            self.text(conn, config).expect("config");
            self.send(
                conn,
                json!({"type": "init", "request_id": rid, "model": "tiny",
                "model_info": {"version": "t", "max_tokens": 512, "quantization": "f32"}}),
            )
            .expect("init");
            self.end().expect("init end");
        }
        pub fn token(&mut self, conn: u64, text: &str) -> Result<(), Violation> {
            self.send(
                conn,
                json!({"type": "token", "token": text, "finished": false, "finish_reason": null}),
            )
        }
        pub fn step(&mut self, id: u64, seq: u64, conn: u64) -> Result<(), Violation> {
            let tokens = ByteCodec
                .encode(&format!("<c{conn}>hello"), true)
                .expect("encode");
            let n = tokens.len() as u32;
            self.out(Output::RunStep(StepPlan {
                step_id: id,
                seqs: vec![SeqStep {
                    seq: SeqId(seq),
                    tokens,
                    start_pos: 0,
                    block_table: (0..n.div_ceil(16)).collect(),
                    sampling: SamplingParams::default(),
                    sample: true,
                    logprobs: None,
                    cached_prefix: Vec::new(),
                    allowed: None,
                    draft: Vec::new(),
                    embed: None,
                    prompt_logprobs: None,
                }],
                free: vec![],
                copy_blocks: vec![],
                forks: vec![],
            }))
        }
        pub fn step_done(&mut self, id: u64, seq: u64) -> Result<(), Violation> {
            self.input(Input::StepDone(StepDone {
                step_id: id,
                results: vec![tokenwire_core::SeqResult {
                    seq: SeqId(seq),
                    token: BYTE_OFFSET + b'a' as u32,
                    logprobs: None,
                    embedding: None,
                    prompt_logprobs: None,
                }],
            }))
        }
    }
}
