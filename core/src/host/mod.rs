//! The Host: one deterministic state machine for the whole server. It routes
//! inputs to per-connection dialect machines, feeds the scheduler, turns engine
//! results into tokens, and runs every deadline.
//!
//! It is two parts so that a dialect's hook can hold its connection's
//! machine and the shared state at once: [`Host`] keeps the connections,
//! and `shared::Shared` everything else (the model, the generations and
//! their scheduler, the timers, the dialects' state, the outputs). `Shared`
//! implements the dialects' [`HostPort`] and keeps its fields to itself; the
//! Host steers it through methods that each say their effect.

pub(crate) mod shared;

use std::collections::{BTreeMap, VecDeque};

use crate::api::{close_reason, ConnId, Dialect, Event, Input, Outcome, Output, Transport};
use crate::config::HostConfig;
use crate::dialect::{machine_for, registry, Cx, DialectConn, HostPort};

/// Makes the per-connection machine for a dialect (`None`: not served).
pub type MachineFactory = fn(Dialect) -> Option<Box<dyn DialectConn>>;
use crate::engine::{EngineFault, EngineFaultKind, ModelInfo, SeqId, SeqResult, StepDone};
use crate::gen::{Failure, FailureKind, FinishReason, TokenPiece};
use crate::principal::{Presented, Principal};
use crate::rng::Seed;
use crate::text::{SharedCodec, TextDone};
use crate::time::{Duration, Instant};

use shared::{outcome_of, ConnTimer, Shared, TimerKey};

/// Frames held for a waiting connection (the model loads, or a prompt of its
/// own is being tokenized) at which the Host asks the shell to stop reading
/// its socket; they are handled, in order, once it can go on.
const PAUSE_READING_AT: usize = 16;
/// Frames held beyond which a connection is closed (1008): the shell did not
/// stop reading, or the peer ignores it. Frames already on their way when
/// reading paused fit well below this.
const MAX_HELD_FRAMES: usize = 4096;

/// Close code for a keepalive that went unanswered and for idle connections.
const CLOSE_NORMAL: u16 = 1000;
/// Close code on shutdown.
const CLOSE_GOING_AWAY: u16 = 1001;
/// Close code for policy violations (slow reader).
const CLOSE_POLICY: u16 = 1008;
/// Close code for a frame over the size limit.
const CLOSE_TOO_BIG: u16 = 1009;

/// A client frame that arrived while its connection was waiting.
enum Held {
    Text(String),
    Binary(usize),
}

impl Held {
    fn len(&self) -> usize {
        match self {
            Held::Text(t) => t.len(),
            Held::Binary(_) => 0,
        }
    }
}

struct Conn {
    dialect: Dialect,
    transport: Transport,
    /// Who owns what this connection keeps ([`Principal::of`] at open).
    principal: Principal,
    machine: Box<dyn DialectConn>,
    /// Outbound queue full: its generations are held.
    blocked: bool,
    /// Frames that arrived while the model loaded or a text job of this
    /// connection was outstanding, in arrival order.
    held: VecDeque<Held>,
    /// Bytes of text in `held`.
    held_bytes: usize,
    /// The shell was asked to stop reading this connection.
    reading_paused: bool,
}

/// Model loading progress, for `status` messages and `/health`.
#[derive(Debug, Clone, PartialEq)]
struct LoadProgress {
    progress: f32,
    message: String,
    eta: Option<Duration>,
}

/// The whole server state as a deterministic state machine.
///
/// Feed inputs with [`Host::handle`], then drain [`Host::poll_output`]; when
/// [`Host::poll_timeout`] passes, handle [`Input::Timeout`].
pub struct Host {
    conns: BTreeMap<ConnId, Conn>,
    sh: Shared,
    load: LoadProgress,
    /// Sequences of the outstanding step, to fail them on an internal fault.
    in_step: Vec<SeqId>,
    shutdown_done: bool,
    last_gauges: Option<Event>,
    machines: MachineFactory,
}

/// A snapshot of the Host's state for health checks and gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct HostStats {
    /// True once the model is loaded.
    pub loaded: bool,
    /// Loading progress 0..=100 (100 once loaded).
    pub load_progress: f32,
    /// Open connections.
    pub connections: u32,
    /// Requests waiting for admission.
    pub queued: u32,
    /// Sequences running.
    pub running: u32,
    /// KV blocks in use.
    pub kv_blocks_used: u32,
    /// Of those, blocks only kept for continuations (freed first).
    pub kv_blocks_kept: u32,
    /// KV blocks in the pool.
    pub kv_blocks_total: u32,
    /// KV blocks kept only for their content (prefix caching), not used.
    pub kv_blocks_cached: u32,
    /// Live generations.
    pub generations: u32,
    /// Live `session` sessions on this host.
    pub sessions: u32,
}

impl Host {
    /// A Host whose model is still loading: clients that connect get
    /// `model_loading` status until [`Input::ModelLoaded`]. `seed` keys the
    /// Host's ChaCha20 ([`crate::rng::HostRng`]): a `u64` for reproducible
    /// runs, 32 bytes from the OS for a server whose ids must not be guessed.
    pub fn new(config: HostConfig, seed: impl Into<Seed>) -> Host {
        Host {
            conns: BTreeMap::new(),
            sh: Shared::new(config, seed.into()),
            load: LoadProgress {
                progress: 0.0,
                message: "loading model".into(),
                eta: None,
            },
            in_step: Vec::new(),
            shutdown_done: false,
            last_gauges: None,
            machines: machine_for,
        }
    }

    /// Serves connections with the machines `factory` makes instead of the
    /// built-in dialects ([`crate::dialect::machine_for`]): a dialect of your
    /// own on the same Host, scheduler and deadlines. Affects connections
    /// opened from now on.
    pub fn set_machines(&mut self, factory: MachineFactory) {
        self.machines = factory;
    }

    /// A Host serving an already loaded model.
    pub fn with_model(
        config: HostConfig,
        info: ModelInfo,
        codec: SharedCodec,
        seed: impl Into<Seed>,
    ) -> Host {
        let mut h = Host::new(config, seed);
        h.sh.set_model(info, codec);
        h.load.progress = 100.0;
        h
    }

    /// The next thing the caller must do, or `None` when there is nothing.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.sh.pop_output()
    }

    /// The earliest time at which [`Input::Timeout`] must be handled.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.sh.next_deadline()
    }

    /// The served model, once loaded.
    pub fn model_info(&self) -> Option<&ModelInfo> {
        self.sh.loaded_model()
    }

    /// Current gauges.
    pub fn stats(&self) -> HostStats {
        let s = self.sh.sched().map(|s| s.stats());
        HostStats {
            loaded: self.sh.is_loaded(),
            load_progress: if self.sh.is_loaded() {
                100.0
            } else {
                self.load.progress
            },
            connections: self.conns.len() as u32,
            queued: s.as_ref().map_or(0, |s| s.waiting),
            running: s.as_ref().map_or(0, |s| s.running),
            kv_blocks_used: s.as_ref().map_or(0, |s| s.blocks_used),
            kv_blocks_kept: s.as_ref().map_or(0, |s| s.blocks_parked),
            kv_blocks_total: s.as_ref().map_or(0, |s| s.blocks_total),
            kv_blocks_cached: s.as_ref().map_or(0, |s| s.blocks_cached),
            generations: self.sh.gen_count() as u32,
            sessions: self.sh.live_sessions() as u32,
        }
    }

    /// Checks the scheduler's internal invariants (tests and the simulator).
    pub fn check_invariants(&self) -> Result<(), String> {
        match self.sh.sched() {
            Some(s) => s.check_invariants(),
            None => Ok(()),
        }
    }

    /// Feeds one input at time `now`. Drain [`Host::poll_output`] afterwards.
    pub fn handle(&mut self, now: Instant, input: Input) {
        match input {
            Input::Open {
                conn,
                dialect,
                transport,
                query,
                authorization,
                peer,
            } => {
                let presented = Presented {
                    header: authorization.as_deref(),
                    query: &query,
                };
                self.on_open(now, conn, dialect, transport, presented, &peer)
            }
            Input::Text { conn, text } => self.on_text(now, conn, text),
            Input::Binary { conn, len } => self.on_binary(now, conn, len),
            Input::Tokenized(done) => self.on_tokenized(now, done),
            Input::JobVerified { check, verdict } => self.on_job_verified(now, check, verdict),
            Input::FrameTooLarge { conn } => {
                if self.conns.contains_key(&conn) {
                    self.close_conn(now, conn, CLOSE_TOO_BIG, close_reason::FRAME_TOO_LARGE);
                }
            }
            Input::Pong { conn } => self
                .sh
                .timers()
                .cancel(TimerKey::Conn(conn, ConnTimer::PongDeadline)),
            Input::Closed { conn } => self.teardown(now, conn),
            Input::QueueFull { conn } => self.set_blocked(now, conn, true),
            Input::QueueDrained { conn } => self.set_blocked(now, conn, false),
            Input::Timeout => self.on_timeout(now),
            Input::StepDone(done) => self.on_step_done(now, done),
            Input::EngineFault(fault) => self.on_fault(now, fault),
            Input::ModelLoading {
                progress,
                message,
                eta,
            } => self.on_loading(now, progress, message, eta),
            Input::ModelLoaded { info, codec } => self.on_loaded(now, info, codec),
            Input::Shutdown => self.on_shutdown(now),
            Input::KvCapacity { num_blocks } => self.sh.set_kv_capacity(num_blocks),
        }
        self.settle(now);
    }

    fn with_conn(
        &mut self,
        now: Instant,
        conn: ConnId,
        f: impl FnOnce(&mut dyn DialectConn, &mut Cx<'_>),
    ) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let mut cx = Cx::new(
            now,
            conn,
            c.dialect,
            c.transport,
            &c.principal,
            &mut self.sh,
        );
        let was_busy = c.machine.busy();
        f(&mut *c.machine, &mut cx);
        let idle = was_busy && !c.machine.busy();
        self.deliver_ended(now);
        // The connection's last request just ended here (a `cai` reply its
        // window held past the pause timeout, a `batch` result sent in
        // payload order after its generation ended): the idle clock starts
        // now, not at the generation's end.
        if idle {
            self.touch(now, conn);
        }
    }

    /// Delivers the last pieces of generations their dialects ended, by the
    /// same route as any other ending.
    fn deliver_ended(&mut self, now: Instant) {
        while let Some((id, piece)) = self.sh.pop_ended() {
            self.deliver(now, id, piece);
        }
    }

    fn on_open(
        &mut self,
        now: Instant,
        conn: ConnId,
        dialect: Dialect,
        transport: Transport,
        presented: Presented<'_>,
        peer: &str,
    ) {
        if self.conns.contains_key(&conn) {
            return;
        }
        let query = presented.query;
        self.sh
            .push_output(Output::Event(Event::ConnectionOpened { dialect }));
        let Some(machine) = (self.machines)(dialect) else {
            self.sh.push_output(Output::Close {
                conn,
                code: CLOSE_POLICY,
                reason: format!("the {} dialect is not served by this build", dialect.name()),
            });
            self.sh
                .push_output(Output::Event(Event::ConnectionClosed { dialect }));
            return;
        };
        if self.sh.shutting_down() {
            self.sh.push_output(Output::Close {
                conn,
                code: CLOSE_GOING_AWAY,
                reason: close_reason::SHUTTING_DOWN.into(),
            });
            self.sh
                .push_output(Output::Event(Event::ConnectionClosed { dialect }));
            return;
        }
        let cfg = &self.sh.config();
        let principal = match Principal::of(cfg.keys.as_ref(), cfg.auth, conn, transport, presented)
        {
            Ok(p) => p,
            // A dialect that checks keys itself (`cai`) answers a bad key with its
            // own close codes.
            Err(_) if registry::spec(dialect).own_auth => Principal::Conn(conn),
            Err(e) => {
                self.sh.push_output(Output::Close {
                    conn,
                    code: CLOSE_POLICY,
                    reason: format!("unauthorized: {}", e.message()),
                });
                self.sh
                    .push_output(Output::Event(Event::ConnectionClosed { dialect }));
                return;
            }
        };
        let c = Conn {
            dialect,
            transport,
            principal,
            machine,
            blocked: false,
            held: VecDeque::new(),
            held_bytes: 0,
            reading_paused: false,
        };
        if transport == Transport::WebSocket {
            let idle = now + self.sh.config().idle_timeout;
            let ping = now + self.sh.config().keepalive_interval;
            self.sh
                .timers()
                .set(TimerKey::Conn(conn, ConnTimer::Idle), idle);
            self.sh
                .timers()
                .set(TimerKey::Conn(conn, ConnTimer::Ping), ping);
        }
        self.conns.insert(conn, c);
        self.sh.count_open(dialect, transport);
        self.sh.note_address(conn, peer);
        let mut refused = None;
        self.with_conn(now, conn, |m, cx| {
            refused = m.on_open(cx, query, peer).err()
        });
        if let Some(r) = refused {
            self.close_conn(now, conn, r.code, &r.reason);
            return;
        }
        if !self.sh.is_loaded() {
            let l = self.load.clone();
            self.with_conn(now, conn, |m, cx| {
                m.on_model_loading(cx, l.progress, &l.message, l.eta)
            });
        }
    }

    /// Restarts a WebSocket connection's idle deadline (a frame arrived or a request ended).
    fn touch(&mut self, now: Instant, conn: ConnId) {
        if self
            .conns
            .get(&conn)
            .is_some_and(|c| c.transport == Transport::WebSocket)
        {
            let idle = now + self.sh.config().idle_timeout;
            self.sh
                .timers()
                .set(TimerKey::Conn(conn, ConnTimer::Idle), idle);
        }
    }

    fn on_text(&mut self, now: Instant, conn: ConnId, text: String) {
        self.touch(now, conn);
        if !self.conns.contains_key(&conn) {
            return;
        }
        if text.len() > self.sh.config().max_frame_bytes {
            self.close_conn(now, conn, CLOSE_TOO_BIG, close_reason::FRAME_TOO_LARGE);
            return;
        }
        if self.must_hold(conn) {
            return self.hold(now, conn, Held::Text(text));
        }
        self.with_conn(now, conn, |m, cx| m.on_text(cx, &text));
    }

    fn on_binary(&mut self, now: Instant, conn: ConnId, len: usize) {
        self.touch(now, conn);
        if self.must_hold(conn) {
            return self.hold(now, conn, Held::Binary(len));
        }
        self.with_conn(now, conn, |m, cx| m.on_binary(cx, len));
    }

    /// True when `conn`'s frames must wait: the model is loading, a text job
    /// of the connection is outstanding, or earlier frames are still waiting.
    fn must_hold(&self, conn: ConnId) -> bool {
        !self.sh.is_loaded()
            || self.sh.awaits_answer(conn)
            || self.conns.get(&conn).is_some_and(|c| !c.held.is_empty())
    }

    /// Keeps a frame for later. From [`PAUSE_READING_AT`] frames (or a frame
    /// limit's worth of bytes) on, the shell is asked to stop reading the
    /// connection; one that piles up more than [`MAX_HELD_FRAMES`] frames or
    /// four frame limits' worth of bytes anyway is closed (1008).
    fn hold(&mut self, now: Instant, conn: ConnId, frame: Held) {
        let max_bytes = self.sh.config().max_frame_bytes;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let too_many = c.held.len() >= MAX_HELD_FRAMES
            || c.held_bytes + frame.len() > max_bytes.saturating_mul(4);
        if too_many {
            self.close_conn(now, conn, CLOSE_POLICY, close_reason::HELD_TOO_MANY);
            return;
        }
        c.held_bytes += frame.len();
        c.held.push_back(frame);
        if !c.reading_paused && (c.held.len() >= PAUSE_READING_AT || c.held_bytes >= max_bytes) {
            c.reading_paused = true;
            self.sh.push_output(Output::PauseReading { conn });
        }
    }

    /// Hands `conn` the frames it was holding, in order, until it has to wait again.
    fn release_held(&mut self, now: Instant, conn: ConnId) {
        while self.sh.is_loaded() && !self.sh.awaits_answer(conn) {
            let Some(c) = self.conns.get_mut(&conn) else {
                return;
            };
            let Some(frame) = c.held.pop_front() else {
                if c.reading_paused {
                    c.reading_paused = false;
                    self.sh.push_output(Output::ResumeReading { conn });
                }
                return;
            };
            c.held_bytes -= frame.len();
            // Read now: for the idle clock, it arrives now (its request
            // starts, or is answered, now).
            self.touch(now, conn);
            match frame {
                Held::Text(text) => self.with_conn(now, conn, |m, cx| m.on_text(cx, &text)),
                Held::Binary(len) => self.with_conn(now, conn, |m, cx| m.on_binary(cx, len)),
            }
            self.settle_closings(now);
        }
    }

    fn on_tokenized(&mut self, now: Instant, done: TextDone) {
        let Some(conn) = self.sh.take_text_job(done.id) else {
            // Its connection is gone, or the job is unknown.
            return;
        };
        // A request was in flight until now: the idle clock starts again.
        self.touch(now, conn);
        self.with_conn(now, conn, |m, cx| m.on_text_done(cx, done.id, done.result));
        self.settle_closings(now);
        self.release_held(now, conn);
    }

    fn on_job_verified(
        &mut self,
        now: Instant,
        check: crate::api::JobCheckId,
        verdict: Result<crate::api::JobGrant, String>,
    ) {
        let Some(conn) = self.sh.take_job_check(check) else {
            return;
        };
        self.touch(now, conn);
        self.with_conn(now, conn, |m, cx| m.on_job_verified(cx, check, verdict));
        self.settle_closings(now);
        self.release_held(now, conn);
    }

    fn set_blocked(&mut self, now: Instant, conn: ConnId, blocked: bool) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.blocked == blocked {
            return;
        }
        c.blocked = blocked;
        self.sh.set_conn_blocked(conn, blocked);
        if blocked {
            let due = now + self.sh.config().slow_client_timeout;
            self.sh
                .timers()
                .set(TimerKey::Conn(conn, ConnTimer::SlowClient), due);
        } else {
            self.sh
                .timers()
                .cancel(TimerKey::Conn(conn, ConnTimer::SlowClient));
        }
    }

    fn on_loading(&mut self, now: Instant, progress: f32, message: String, eta: Option<Duration>) {
        if self.sh.is_loaded() {
            return;
        }
        self.load = LoadProgress {
            progress: progress.clamp(0.0, 100.0),
            message,
            eta,
        };
        let l = self.load.clone();
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for conn in conns {
            self.with_conn(now, conn, |m, cx| {
                m.on_model_loading(cx, l.progress, &l.message, l.eta)
            });
        }
    }

    fn on_loaded(&mut self, now: Instant, info: ModelInfo, codec: SharedCodec) {
        if self.sh.is_loaded() {
            return;
        }
        self.sh.set_model(info, codec);
        self.load.progress = 100.0;
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for conn in conns {
            self.release_held(now, conn);
        }
    }

    fn on_shutdown(&mut self, now: Instant) {
        if self.sh.shutting_down() {
            return;
        }
        self.sh.begin_shutdown();
        let grace = now + self.sh.config().shutdown_grace;
        self.sh.timers().set(TimerKey::ShutdownGrace, grace);
    }

    fn finish_shutdown(&mut self, now: Instant) {
        let ids: Vec<SeqId> = self.sh.gen_ids();
        for id in ids {
            self.fail(
                now,
                id,
                Failure {
                    kind: FailureKind::ShuttingDown,
                    message: "the server is shutting down; retry on another server".into(),
                },
            );
        }
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for &conn in &conns {
            self.with_conn(now, conn, |m, cx| m.on_shutdown(cx));
        }
        for conn in conns {
            self.close_conn(now, conn, CLOSE_GOING_AWAY, close_reason::SHUTTING_DOWN);
        }
        self.sh.forget_all_answers();
        self.sh.timers().cancel(TimerKey::ShutdownGrace);
        self.shutdown_done = true;
        self.sh.push_output(Output::ShutdownComplete);
    }

    fn on_timeout(&mut self, now: Instant) {
        while let Some(key) = self.sh.timers().pop_expired(now) {
            match key {
                TimerKey::PauseTimeout(id) => self.end_gen(now, id, FinishReason::Timeout),
                TimerKey::Conn(conn, ConnTimer::SlowClient) => {
                    self.close_conn(now, conn, CLOSE_POLICY, close_reason::SLOW_CLIENT)
                }
                TimerKey::Conn(conn, ConnTimer::Idle) => {
                    // Frames held while the model loads are requests too.
                    let busy = self.sh.awaits_answer(conn)
                        || self
                            .conns
                            .get(&conn)
                            .is_some_and(|c| c.machine.busy() || !c.held.is_empty());
                    if busy {
                        let idle = now + self.sh.config().idle_timeout;
                        self.sh
                            .timers()
                            .set(TimerKey::Conn(conn, ConnTimer::Idle), idle);
                    } else if self.conns.contains_key(&conn) {
                        self.close_conn(now, conn, CLOSE_NORMAL, close_reason::IDLE);
                    }
                }
                TimerKey::Conn(conn, ConnTimer::Ping) => {
                    if self.conns.contains_key(&conn) {
                        self.sh.push_output(Output::Ping { conn });
                        let pong = now + self.sh.config().keepalive_timeout;
                        let ping = now + self.sh.config().keepalive_interval;
                        let key = TimerKey::Conn(conn, ConnTimer::PongDeadline);
                        if self.sh.timers().get(key).is_none() {
                            self.sh.timers().set(key, pong);
                        }
                        self.sh
                            .timers()
                            .set(TimerKey::Conn(conn, ConnTimer::Ping), ping);
                    }
                }
                TimerKey::Conn(conn, ConnTimer::PongDeadline) => {
                    // A connection we stopped reading cannot be seen answering.
                    let paused = self.conns.get(&conn).is_some_and(|c| c.reading_paused);
                    if paused {
                        let pong = now + self.sh.config().keepalive_timeout;
                        self.sh
                            .timers()
                            .set(TimerKey::Conn(conn, ConnTimer::PongDeadline), pong);
                    } else if self.conns.contains_key(&conn) {
                        self.close_conn(now, conn, CLOSE_NORMAL, close_reason::KEEPALIVE);
                    }
                }
                TimerKey::ShutdownGrace => {
                    if !self.shutdown_done {
                        self.finish_shutdown(now);
                    }
                }
                TimerKey::Conn(conn, ConnTimer::Dialect(tag)) => {
                    self.with_conn(now, conn, |m, cx| m.on_timer(cx, tag));
                }
            }
            self.settle_closings(now);
        }
    }

    fn on_step_done(&mut self, now: Instant, done: StepDone) {
        let Some(sched) = self.sh.sched_mut() else {
            return;
        };
        // A stale or unknown step id changes nothing, here as in the
        // scheduler: the outstanding step's owners still hear its end.
        if !sched.is_outstanding(done.step_id) {
            return;
        }
        let results = sched.on_step_done(&done);
        let refused = sched.take_constraint_failures();
        let stepped = std::mem::take(&mut self.in_step);
        let tally = sched.take_draft_tally();
        // An embedding's vector is not a generated token.
        let count = results.iter().filter(|r| r.embedding.is_none()).count() as u32;
        if count > 0 {
            self.sh
                .push_output(Output::Event(Event::TokensGenerated { count }));
        }
        if tally.drafted > 0 {
            self.sh.push_output(Output::Event(Event::DraftTokens {
                drafted: tally.drafted,
                confirmed: tally.confirmed,
            }));
        }
        // Owners are found before the results are applied: a generation that
        // ends in this step is gone afterwards, and its connection still
        // hears that the step ended.
        let mut owners: Vec<ConnId> = Vec::new();
        for id in stepped {
            if let Some(owner) = self.sh.owner_of(id) {
                if !owners.contains(&owner) {
                    owners.push(owner);
                }
            }
        }
        for r in results {
            self.apply_result(now, r);
        }
        // Their token was not delivered: text that breaks the format the
        // client asked for never reaches it.
        for (id, message) in refused {
            self.fail(
                now,
                id,
                Failure {
                    kind: FailureKind::Internal,
                    message,
                },
            );
        }
        for owner in owners {
            self.with_conn(now, owner, |m, cx| m.on_step_end(cx));
        }
    }

    fn apply_result(&mut self, now: Instant, r: SeqResult) {
        let id = r.seq;
        if let Some(piece) = self.sh.apply_token(now, r) {
            self.deliver(now, id, piece);
        }
    }

    /// Hands a piece to the owning dialect; retires the generation if it ended.
    fn deliver(&mut self, now: Instant, id: SeqId, piece: TokenPiece) {
        let Some(owner) = self.sh.owner_of(id) else {
            return;
        };
        self.with_conn(now, owner, |m, cx| m.on_token(cx, id, &piece));
        if let Some(reason) = piece.finish {
            self.sh.retire(now, id, outcome_of(reason));
            self.touch(now, owner);
        }
    }

    /// Ends a generation from the Host's side (deadline) and tells its dialect.
    fn end_gen(&mut self, now: Instant, id: SeqId, reason: FinishReason) {
        if let Some(piece) = self.sh.end_piece(id, reason) {
            self.deliver(now, id, piece);
        }
    }

    fn fail(&mut self, now: Instant, id: SeqId, failure: Failure) {
        let Some(owner) = self.sh.owner_of(id) else {
            return;
        };
        self.sh.mark_finished(id);
        self.with_conn(now, owner, |m, cx| m.on_failed(cx, id, &failure));
        self.sh.retire(now, id, Outcome::Failed);
        self.touch(now, owner);
    }

    fn on_fault(&mut self, now: Instant, fault: EngineFault) {
        let Some(sched) = self.sh.sched_mut() else {
            return;
        };
        // A fault for a step that is not outstanding fails nothing.
        if !sched.is_outstanding(fault.step_id) {
            return;
        }
        let doomed = sched.on_step_failed(fault.step_id, &fault.kind);
        let in_step = std::mem::take(&mut self.in_step);
        match &fault.kind {
            EngineFaultKind::OutOfMemory => {
                for id in doomed {
                    self.fail(
                        now,
                        id,
                        Failure {
                            kind: FailureKind::MemoryPressure,
                            message: "the engine ran out of memory for this request".into(),
                        },
                    );
                }
            }
            EngineFaultKind::DeviceLost => {
                for id in doomed {
                    self.fail(
                        now,
                        id,
                        Failure {
                            kind: FailureKind::Internal,
                            message: "the compute device was lost".into(),
                        },
                    );
                }
            }
            EngineFaultKind::Internal(_) => {
                for id in in_step {
                    self.fail(
                        now,
                        id,
                        Failure {
                            kind: FailureKind::Internal,
                            message: "the engine failed while computing this request".into(),
                        },
                    );
                }
            }
        }
    }

    /// Closes a connection from the server side.
    fn close_conn(&mut self, now: Instant, conn: ConnId, code: u16, reason: &str) {
        if !self.conns.contains_key(&conn) {
            return;
        }
        self.sh.push_output(Output::Close {
            conn,
            code,
            reason: reason.to_string(),
        });
        self.teardown(now, conn);
    }

    /// Forgets a connection: its generations are cancelled and their KV freed.
    fn teardown(&mut self, now: Instant, conn: ConnId) {
        let Some(mut c) = self.conns.remove(&conn) else {
            return;
        };
        let mut cx = Cx::new(
            now,
            conn,
            c.dialect,
            c.transport,
            &c.principal,
            &mut self.sh,
        );
        c.machine.on_closed(&mut cx);
        self.sh.forget_conn(now, conn, c.dialect, c.transport);
    }

    fn settle_closings(&mut self, now: Instant) {
        loop {
            let closing = self.sh.take_closing();
            if closing.is_empty() {
                break;
            }
            for (conn, code, reason) in closing {
                self.close_conn(now, conn, code, &reason);
            }
        }
    }

    /// Work that follows every input: held results, closes, the next step.
    fn settle(&mut self, now: Instant) {
        loop {
            self.settle_closings(now);
            let Some(r) = self.sh.pop_replay() else {
                break;
            };
            self.apply_result(now, r);
        }
        // Requests still being tokenized count as in flight: they get their
        // answer (an error, since no new work starts) within the grace. So
        // does what a dialect still holds for its client after a generation
        // ended (text waiting for a flow-control window).
        if self.sh.shutting_down()
            && !self.shutdown_done
            && self.sh.gen_count() == 0
            && !self.sh.answers_outstanding()
            && !self.conns.values().any(|c| c.machine.holds_output())
        {
            self.finish_shutdown(now);
        }
        self.schedule(now);
    }

    fn schedule(&mut self, now: Instant) {
        if let Some(step) = self.sh.plan_step() {
            self.in_step = step.in_step;
            for (owner, id) in step.admitted {
                self.with_conn(now, owner, |m, cx| m.on_admitted(cx, id));
            }
        }
        for (owner, id, position) in self.sh.new_queue_positions() {
            // An earlier callback may have ended it.
            if self.sh.owner_of(id).is_some() {
                self.with_conn(now, owner, |m, cx| m.on_queued(cx, id, position));
            }
        }
        // Read after the dialects heard their queue positions: delivering to
        // them may end generations and free blocks, and the gauges must show
        // the state this input leaves, as `stats()` does.
        let Some(stats) = self.sh.sched().map(|s| s.stats()) else {
            return;
        };
        let gauges = Event::Gauges {
            queued: stats.waiting,
            running: stats.running,
            kv_blocks_used: stats.blocks_used,
            kv_blocks_kept: stats.blocks_parked,
            kv_blocks_total: stats.blocks_total,
            kv_blocks_cached: stats.blocks_cached,
        };
        if self.last_gauges.as_ref() != Some(&gauges) {
            self.last_gauges = Some(gauges.clone());
            self.sh.push_output(Output::Event(gauges));
        }
    }
}
