//! One simulation: a swarm of clients, a network, an engine and faults around
//! one Host (rebuilt after each crash), event by event in virtual time.
//!
//! The run has three phases:
//!
//! 1. **Safety**: `events` Host inputs with every fault the seed enables;
//!    every checker runs after every event.
//! 2. **Liveness**: faults healed: no new faults, KV capacity restored, slow
//!    readers catch up, clients start no new work and either resume their
//!    paused generations or let them time out; a planned graceful shutdown
//!    begins. Every request must reach its terminal event within the bound
//!    stated when the phase starts (simulated time and engine steps).
//! 3. **Hang-up**: every client disconnects; the Host must end with no
//!    connection, no generation and no KV block in use.
//!
//! Events come off one queue ordered by (time, sequence number); the Host's
//! own deadline (`poll_timeout`) competes with the queue head. A clock jump
//! moves the clock ahead: events meant for the skipped span then happen at
//! once, in their order, as after a frozen process wakes up.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;

use tokenwire_core::rng::{mix64, Rng};
use tokenwire_core::testing::ByteCodec;
use tokenwire_core::{
    ConnId, Duration, EngineFault, Host, Input, Instant, JobCheckId, JobGrant, Output, StepPlan,
    TextDone, Transport,
};

use crate::client::{new_client, ClientCx, ClientOp, SimClient};
use crate::driver::Driver;
use crate::engine::SimEngine;
use crate::faults::{roll_step, Fault, FaultCounts, FaultPlan};
use crate::invariants::common::liveness::describe_outstanding;
use crate::invariants::{checkers_except, Monitor, Violation};
use crate::net::{Net, Reader};
use crate::report::{Failure, RunReport};
use crate::swarm::{
    between, Swarm, STREAM_CLIENT, STREAM_ENGINE, STREAM_FAULTS, STREAM_JOBS, STREAM_NET,
    STREAM_TEXT,
};
use crate::trace::{End, Header, Line};

/// Safety-phase events per seed when none is given: sized so that a sweep of
/// 1,000 seeds takes about a minute and a half in `--release` on two cores.
pub const DEFAULT_EVENTS: u64 = 3_000;

/// Simulator iterations without a Host input after which the safety phase
/// ends early (the traffic stalled).
const MAX_QUIET_ITERATIONS: u64 = 100_000;

/// Most events the liveness and hang-up phases may take, whatever the bound.
const MAX_TAIL_EVENTS: u64 = 2_000_000;

/// What travels from a client to the Host.
#[derive(Debug, Clone)]
enum Wire {
    /// A connection opens, with its query string (credentials, for `cai`).
    Open(Transport, String),
    Text(String),
    Binary(usize),
    TooLarge,
    Pong,
    Closed,
}

#[derive(Debug)]
enum Ev {
    /// A client's wake-up (stale when `token` is not the client's latest).
    Act { client: usize, token: u64 },
    /// Something from a client reaches the Host.
    Deliver { conn: ConnId, gen: u64, what: Wire },
    /// A slow reader reads.
    Read { conn: ConnId },
    /// The engine answers (`StepDone` or `EngineFault`).
    Engine { gen: u64, input: Input },
    /// A text job (tokenizing a prompt) comes back.
    Text { gen: u64, done: TextDone },
    /// The job verifier's verdict comes back.
    Verdict {
        gen: u64,
        check: JobCheckId,
        verdict: Result<JobGrant, String>,
    },
    /// Model loading progress, then the loaded model.
    Loading { gen: u64, done: bool, progress: f32 },
    /// Memory pressure is over: the KV pool grows back.
    Regrow { gen: u64 },
    /// The clock leaps forward by this much.
    Jump(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Safety,
    Liveness { until: Instant, max_steps: u64 },
    HangUp,
}

/// How to run a seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Safety-phase events.
    pub events: u64,
    /// Checkers to switch off by name: only to look past a known, reported
    /// bug while it is being fixed.
    pub skip: Vec<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            events: DEFAULT_EVENTS,
            skip: Vec::new(),
        }
    }
}

/// Runs one seed: `events` safety-phase events, then the liveness phase and
/// the hang-up, with every checker. Writes a trace to `trace` when given.
pub fn run_seed(
    seed: u64,
    events: u64,
    trace: Option<&mut dyn Write>,
) -> Result<RunReport, Failure> {
    let opts = RunOptions {
        events,
        ..RunOptions::default()
    };
    run_seed_with(seed, &opts, trace)
}

/// [`run_seed`] with options.
pub fn run_seed_with(
    seed: u64,
    opts: &RunOptions,
    trace: Option<&mut dyn Write>,
) -> Result<RunReport, Failure> {
    let swarm = Swarm::from_seed(seed);
    let mut sim = Sim::new(swarm, opts, trace);
    let r = sim.run();
    sim.finish_trace(r.as_ref().err());
    r
}

struct Sim<'w> {
    sw: Swarm,
    budget: u64,
    clock: Instant,
    nominal: Instant,
    queue: BTreeMap<(Instant, u64), Ev>,
    next_ev: u64,
    d: Driver<'w>,
    gen: u64,
    eng_rng: Rng,
    text_rng: Rng,
    job_rng: Rng,
    /// Connections the Host asked not to be read, and what waits for them.
    unread: BTreeMap<ConnId, VecDeque<Wire>>,
    net: Net,
    clients: Vec<Box<dyn SimClient>>,
    acts: Vec<u64>,
    local: VecDeque<Input>,
    plan: FaultPlan,
    counts: FaultCounts,
    phase: Phase,
    events: u64,
    liveness_start: u64,
    liveness_steps: u64,
    shutdown_sent: bool,
    loaded: bool,
}

impl<'w> Sim<'w> {
    fn new(sw: Swarm, opts: &RunOptions, trace: Option<&'w mut dyn Write>) -> Sim<'w> {
        let budget = opts.events;
        let host = if sw.start_loading {
            Host::new(sw.host.clone(), sw.host_seed)
        } else {
            Host::with_model(
                sw.host.clone(),
                sw.model.clone(),
                ByteCodec::shared(),
                sw.host_seed,
            )
        };
        let mut monitor = Monitor::new(
            sw.host.clone(),
            sw.model.clone(),
            sw.slack(),
            checkers_except(&opts.skip),
        );
        monitor.set_loaded(!sw.start_loading);
        let mut d = Driver::new(
            host,
            sw.host.clone(),
            sw.model.clone(),
            sw.engine.clone(),
            monitor,
            trace,
        );
        d.write(&Line::Header(Box::new(Header {
            seed: sw.seed,
            host: sw.host.clone(),
            model: sw.model.clone(),
            engine: sw.engine.clone(),
            host_seed: sw.host_seed,
            start_loading: sw.start_loading,
            slack: sw.slack(),
            skip: opts.skip.clone(),
        })));
        let mut fault_rng = Rng::new(mix64(sw.seed, STREAM_FAULTS));
        let plan = FaultPlan::new(&sw, budget, &mut fault_rng);
        let clients = (0..sw.clients)
            .map(|i| new_client(i, &sw, Rng::new(mix64(sw.seed, STREAM_CLIENT + i as u64))))
            .collect();
        Sim {
            budget,
            clock: Instant::ZERO,
            nominal: Instant::ZERO,
            queue: BTreeMap::new(),
            next_ev: 0,
            d,
            gen: 0,
            eng_rng: Rng::new(mix64(sw.seed, STREAM_ENGINE)),
            text_rng: Rng::new(mix64(sw.seed, STREAM_TEXT ^ 1)),
            job_rng: Rng::new(mix64(sw.seed, STREAM_JOBS)),
            unread: BTreeMap::new(),
            net: Net::new(sw.net.clone(), Rng::new(mix64(sw.seed, STREAM_NET))),
            acts: vec![0; sw.clients],
            clients,
            local: VecDeque::new(),
            plan,
            counts: FaultCounts::default(),
            phase: Phase::Safety,
            events: 0,
            liveness_start: 0,
            liveness_steps: 0,
            shutdown_sent: false,
            loaded: !sw.start_loading,
            sw,
        }
    }

    fn at(&mut self, t: Instant, ev: Ev) {
        self.next_ev += 1;
        self.queue.insert((t, self.next_ev), ev);
    }

    fn fail(&self, v: Violation) -> Failure {
        Failure {
            seed: self.sw.seed,
            seed_text: String::new(),
            invariant: v.invariant,
            detail: v.detail,
            event: self.events,
            time: self.clock,
        }
    }

    fn finish_trace(&mut self, failure: Option<&Failure>) {
        if !self.d.tracing() {
            return;
        }
        let end = End {
            events: self.events,
            inputs: self.d.inputs.hex(),
            outputs: self.d.outputs.hex(),
            failure: failure.map(|f| (f.invariant.clone(), f.event)),
        };
        self.d.write(&Line::End(end));
    }

    fn run(&mut self) -> Result<RunReport, Failure> {
        self.start();
        let mut tail_events = 0u64;
        let (mut seen_events, mut quiet_iters) = (0u64, 0u64);
        loop {
            if self.events == seen_events {
                quiet_iters += 1;
            } else {
                (seen_events, quiet_iters) = (self.events, 0);
            }
            if self.phase == Phase::Safety {
                for f in self.plan.due(self.events) {
                    self.apply_fault(f)?;
                }
                // Traffic can stall (every client waiting on a generation
                // that waits on memory): then the safety phase is over.
                if self.events >= self.budget || quiet_iters > MAX_QUIET_ITERATIONS {
                    self.start_liveness()?;
                }
            } else {
                tail_events += 1;
                if tail_events > MAX_TAIL_EVENTS {
                    return Err(self.fail(Violation {
                        invariant: "liveness".into(),
                        detail: format!(
                            "more than {MAX_TAIL_EVENTS} events after the safety phase"
                        ),
                    }));
                }
            }
            if let Phase::Liveness { until, max_steps } = self.phase {
                if self.liveness_done() {
                    self.d
                        .monitor
                        .finish(self.clock)
                        .map_err(|v| self.fail(v))?;
                    self.hang_up()?;
                } else if self.nominal > until || self.liveness_steps > max_steps {
                    let left = describe_outstanding(self.d.monitor.view());
                    return Err(self.fail(Violation {
                        invariant: "liveness".into(),
                        detail: format!(
                            "bound passed ({:.1} s simulated, {} steps; bound {:.1} s, {} steps) with {} request(s) unfinished: {}",
                            self.nominal.as_nanos() as f64 / 1e9,
                            self.liveness_steps,
                            until.as_nanos() as f64 / 1e9,
                            max_steps,
                            left.len(),
                            left.join("; ")
                        ),
                    }));
                }
            }
            if self.phase == Phase::HangUp && self.quiet() {
                return self.final_check();
            }
            if let Some(input) = self.local.pop_front() {
                self.feed(input)?;
                continue;
            }
            let head = self.queue.first_key_value().map(|(k, _)| k.0);
            let timeout = self.d.host.poll_timeout();
            match (head, timeout) {
                (None, None) => match self.phase {
                    Phase::Safety => self.start_liveness()?,
                    Phase::Liveness { .. } => {
                        // Nothing can happen any more: whatever is unfinished stays so.
                        let left = describe_outstanding(self.d.monitor.view());
                        return Err(self.fail(Violation {
                            invariant: "liveness".into(),
                            detail: format!(
                                "nothing left to happen (no event, no deadline) with {} request(s) unfinished: {}",
                                left.len(),
                                left.join("; ")
                            ),
                        }));
                    }
                    Phase::HangUp => return self.final_check(),
                },
                (h, Some(t)) if h.is_none_or(|h| t <= h) => {
                    self.nominal = t;
                    self.clock = self.clock.max(t);
                    self.feed(Input::Timeout)?;
                }
                _ => {
                    let Some(((t, _), ev)) = self.queue.pop_first() else {
                        continue;
                    };
                    self.nominal = t;
                    self.clock = self.clock.max(t);
                    self.dispatch(ev)?;
                }
            }
        }
    }

    fn start(&mut self) {
        if self.sw.start_loading {
            let t = self.sw.load_time;
            for (k, p) in [(0u32, 10.0f32), (1, 60.0)] {
                let at = Instant::ZERO + t.mul_f64(f64::from(k) / 2.0);
                self.at(
                    at,
                    Ev::Loading {
                        gen: 0,
                        done: false,
                        progress: p,
                    },
                );
            }
            self.at(
                Instant::ZERO + t,
                Ev::Loading {
                    gen: 0,
                    done: true,
                    progress: 100.0,
                },
            );
        }
        let mut rng = Rng::new(mix64(self.sw.seed, 0x0053_5441_5254));
        for i in 0..self.clients.len() {
            let d = between(&mut rng, Duration::ZERO, self.sw.mix.think_max);
            self.wake(i, d);
        }
    }

    fn wake(&mut self, client: usize, after: Duration) {
        self.acts[client] += 1;
        let token = self.acts[client];
        self.at(self.clock + after, Ev::Act { client, token });
    }

    fn feed(&mut self, input: Input) -> Result<(), Failure> {
        self.events += 1;
        let outs = self
            .d
            .feed(self.clock, self.nominal, input)
            .map_err(|v| self.fail(v))?;
        for out in outs {
            self.route(out)?;
        }
        Ok(())
    }

    fn liveness(&self) -> bool {
        self.phase != Phase::Safety
    }

    fn dispatch(&mut self, ev: Ev) -> Result<(), Failure> {
        match ev {
            Ev::Act { client, token } => {
                if self.acts[client] != token {
                    return Ok(());
                }
                let cx = ClientCx {
                    now: self.clock,
                    swarm: &self.sw,
                    liveness: self.liveness(),
                };
                let ops = self.clients[client].act(&cx);
                self.apply_ops(client, ops);
            }
            Ev::Deliver { conn, gen, what } => {
                if gen != self.gen {
                    return Ok(());
                }
                if let Some(waiting) = self.unread.get_mut(&conn) {
                    // The Host asked the shell to stop reading this connection:
                    // whatever the client sends waits in the socket, in order.
                    waiting.push_back(what);
                    return Ok(());
                }
                let Some(c) = self.net.conns.get_mut(&conn) else {
                    return Ok(());
                };
                if c.closed_reported {
                    return Ok(());
                }
                let dialect = self.clients[c.client].dialect();
                let input = match what {
                    Wire::Open(transport, query) => Input::Open {
                        conn,
                        dialect,
                        transport,
                        query,
                        authorization: None,
                        peer: format!(
                            "10.0.{}.{}:{}",
                            c.client / 250,
                            c.client % 250,
                            40000 + conn.0 % 20000
                        ),
                    },
                    Wire::Text(text) => Input::Text { conn, text },
                    Wire::Binary(len) => Input::Binary { conn, len },
                    Wire::TooLarge => Input::FrameTooLarge { conn },
                    Wire::Pong => Input::Pong { conn },
                    Wire::Closed => {
                        c.closed_reported = true;
                        Input::Closed { conn }
                    }
                };
                self.feed(input)?;
            }
            Ev::Read { conn } => {
                let r = self.net.read(conn);
                self.hand_to_client(conn, r.frames);
                if r.drained && self.host_knows(conn) {
                    self.local.push_back(Input::QueueDrained { conn });
                }
                if let Some(d) = r.next_after {
                    self.at(self.clock + d, Ev::Read { conn });
                }
            }
            Ev::Engine { gen, input } => {
                if gen == self.gen {
                    self.feed(input)?;
                }
            }
            Ev::Text { gen, done } => {
                if gen == self.gen {
                    self.feed(Input::Tokenized(done))?;
                }
            }
            Ev::Verdict {
                gen,
                check,
                verdict,
            } => {
                if gen == self.gen {
                    self.feed(Input::JobVerified { check, verdict })?;
                }
            }
            Ev::Jump(d) => {
                self.counts.time_jump += 1;
                self.clock = self.clock + d;
            }
            Ev::Regrow { gen } => {
                if gen == self.gen && self.phase == Phase::Safety {
                    self.feed(Input::KvCapacity {
                        num_blocks: self.sw.model.num_blocks,
                    })?;
                }
            }
            Ev::Loading {
                gen,
                done,
                progress,
            } => {
                if gen != self.gen || self.loaded {
                    return Ok(());
                }
                let input = if done {
                    self.loaded = true;
                    Input::ModelLoaded {
                        info: self.sw.model.clone(),
                        codec: ByteCodec::shared(),
                    }
                } else {
                    Input::ModelLoading {
                        progress,
                        message: "loading weights".into(),
                        eta: Some(self.sw.load_time),
                    }
                };
                self.feed(input)?;
            }
        }
        Ok(())
    }

    /// True when the Host still has `conn` open (as far as the shell knows).
    fn host_knows(&self, conn: ConnId) -> bool {
        self.net
            .conns
            .get(&conn)
            .is_some_and(|c| c.host_gen == self.gen && !c.closed_reported)
    }

    fn hand_to_client(&mut self, conn: ConnId, frames: Vec<String>) {
        let Some(client) = self.net.conns.get(&conn).map(|c| c.client) else {
            return;
        };
        for text in frames {
            let cx = ClientCx {
                now: self.clock,
                swarm: &self.sw,
                liveness: self.liveness(),
            };
            let ops = self.clients[client].on_frame(&cx, conn, &text);
            self.apply_ops(client, ops);
        }
    }

    fn send_wire(&mut self, conn: ConnId, what: Wire) {
        let at = self.net.arrival(conn, self.clock);
        let gen = self.gen;
        self.at(at, Ev::Deliver { conn, gen, what });
    }

    fn apply_ops(&mut self, client: usize, ops: Vec<ClientOp>) {
        for op in ops {
            let conn = self.clients[client].conn();
            match op {
                ClientOp::Open(transport) => {
                    let (slow, stalls) = self.clients[client].reader();
                    let reader = if self.liveness() {
                        Reader::FAST
                    } else {
                        self.net.reader_for(slow, stalls)
                    };
                    let conn = self.net.open(client, self.gen, transport, reader);
                    let query = self.clients[client].query();
                    self.clients[client].bind(conn);
                    self.send_wire(conn, Wire::Open(transport, query));
                    let cx = ClientCx {
                        now: self.clock,
                        swarm: &self.sw,
                        liveness: self.liveness(),
                    };
                    let more = self.clients[client].on_open(&cx);
                    self.apply_ops(client, more);
                }
                ClientOp::Text(text) => {
                    if let Some(conn) = conn {
                        self.send_wire(conn, Wire::Text(text));
                    }
                }
                ClientOp::Binary(len) => {
                    if let Some(conn) = conn {
                        self.send_wire(conn, Wire::Binary(len));
                    }
                }
                ClientOp::TooLarge => {
                    if let Some(conn) = conn {
                        self.send_wire(conn, Wire::TooLarge);
                    }
                }
                ClientOp::Close(conn) => {
                    if let Some(c) = self.net.conns.get_mut(&conn) {
                        if !c.client_closed && !c.closed_reported {
                            c.client_closed = true;
                            c.queue.clear();
                            self.send_wire(conn, Wire::Closed);
                        }
                    }
                }
                ClientOp::Wake(d) => self.wake(client, d),
            }
        }
        self.sync_counts();
    }

    fn sync_counts(&mut self) {
        self.counts.hostile_frame = self.clients.iter().map(|c| c.counts().0).sum();
        self.counts.disconnect = self.clients.iter().map(|c| c.counts().1).sum();
    }

    fn route(&mut self, out: Output) -> Result<(), Failure> {
        match out {
            Output::Send { conn, text } => {
                let p = self.net.push(conn, text);
                if let Some(text) = p.deliver {
                    self.hand_to_client(conn, vec![text]);
                }
                if p.became_full && self.host_knows(conn) {
                    self.counts.queue_full += 1;
                    self.local.push_back(Input::QueueFull { conn });
                }
                if let Some(d) = p.read_after {
                    self.at(self.clock + d, Ev::Read { conn });
                }
            }
            Output::Ping { conn } => {
                let silent = self
                    .net
                    .conns
                    .get(&conn)
                    .is_none_or(|c| c.client_closed || self.clients[c.client].silent());
                if !silent && self.host_knows(conn) {
                    self.send_wire(conn, Wire::Pong);
                }
            }
            Output::Close { conn, code, .. } => {
                let Some(c) = self.net.conns.get_mut(&conn) else {
                    return Ok(());
                };
                if c.closed_reported {
                    return Ok(());
                }
                c.closed_reported = true;
                let client = c.client;
                let rest: Vec<String> = c.queue.drain(..).collect();
                let client_gone = c.client_closed;
                // The shell performed the close; it reports the connection gone.
                self.local.push_back(Input::Closed { conn });
                if !client_gone {
                    self.hand_to_client(conn, rest);
                    let cx = ClientCx {
                        now: self.clock,
                        swarm: &self.sw,
                        liveness: self.liveness(),
                    };
                    let ops = self.clients[client].on_closed(&cx, conn, Some(code));
                    self.apply_ops(client, ops);
                }
            }
            Output::RunStep(plan) => self.run_step(plan),
            Output::PauseReading { conn } => {
                self.counts.read_paused += 1;
                self.unread.entry(conn).or_default();
            }
            Output::ResumeReading { conn } => {
                // What waited is read now, in order, before anything newer.
                if let Some(waiting) = self.unread.remove(&conn) {
                    let gen = self.gen;
                    for what in waiting {
                        self.at(self.clock, Ev::Deliver { conn, gen, what });
                    }
                }
            }
            Output::Tokenize(job) => {
                let after = between(&mut self.text_rng, Duration::ZERO, self.sw.text_latency_max);
                let gen = self.gen;
                let mut done = job.run();
                if self.sw.text_fail_p > 0.0 && self.text_rng.next_f64() < self.sw.text_fail_p {
                    // Not a length: every dialect must tell it apart.
                    done.result = Err("the chat template could not be rendered (simulated)".into());
                    self.counts.text_failed += 1;
                }
                self.at(self.clock + after, Ev::Text { gen, done });
            }
            Output::VerifyJob(check) => {
                let j = &self.sw.jobs;
                let after = between(&mut self.job_rng, Duration::ZERO, j.latency_max);
                let verdict = if self.job_rng.next_f64() < j.refuse_p {
                    self.counts.job_refused += 1;
                    Err("the job is not known to the billing service".to_string())
                } else {
                    Ok(JobGrant {
                        token_budget: j.token_budget,
                    })
                };
                let gen = self.gen;
                let ev = Ev::Verdict {
                    gen,
                    check: check.id,
                    verdict,
                };
                self.at(self.clock + after, ev);
            }
            _ => {}
        }
        Ok(())
    }

    fn run_step(&mut self, plan: StepPlan) {
        if self.liveness() {
            self.liveness_steps += 1;
        }
        let e = &self.sw.engine;
        let fed: u32 = plan.seqs.iter().map(|s| s.tokens.len() as u32).sum();
        let latency =
            e.step_base + e.per_token * fed + between(&mut self.eng_rng, Duration::ZERO, e.jitter);
        let fault = if self.phase == Phase::Safety {
            roll_step(&self.sw.faults, &mut self.eng_rng)
        } else {
            None
        };
        let input = match fault {
            Some(kind) => {
                self.counts.count_engine(&kind);
                self.d.engine.fail(&plan, &kind);
                Input::EngineFault(EngineFault {
                    step_id: plan.step_id,
                    kind,
                })
            }
            None => Input::StepDone(self.d.engine.run(&plan)),
        };
        let gen = self.gen;
        self.at(self.clock + latency, Ev::Engine { gen, input });
    }

    fn apply_fault(&mut self, f: Fault) -> Result<(), Failure> {
        match f {
            Fault::Crash => {
                if self.shutdown_sent {
                    return Ok(());
                }
                self.counts.crash += 1;
                self.gen += 1;
                self.unread.clear();
                self.loaded = true;
                self.local.clear();
                let seed = mix64(self.sw.host_seed, self.gen);
                self.d.crash(self.clock, seed);
                let conns: Vec<ConnId> = self
                    .net
                    .conns
                    .iter()
                    .filter(|(_, c)| !c.closed_reported)
                    .map(|(id, _)| *id)
                    .collect();
                for conn in conns {
                    let Some(c) = self.net.conns.get_mut(&conn) else {
                        continue;
                    };
                    c.closed_reported = true;
                    c.queue.clear();
                    let (client, client_gone) = (c.client, c.client_closed);
                    if !client_gone {
                        let cx = ClientCx {
                            now: self.clock,
                            swarm: &self.sw,
                            liveness: false,
                        };
                        let ops = self.clients[client].on_closed(&cx, conn, None);
                        self.apply_ops(client, ops);
                    }
                }
            }
            Fault::KvShrink(n, len) => {
                self.counts.kv_shrink += 1;
                self.local.push_back(Input::KvCapacity { num_blocks: n });
                let gen = self.gen;
                self.at(self.clock + len, Ev::Regrow { gen });
            }
            Fault::TimeJump(d) => {
                self.counts.time_jump += 1;
                self.clock = self.clock + d;
            }
        }
        Ok(())
    }

    fn start_liveness(&mut self) -> Result<(), Failure> {
        self.liveness_start = self.events;
        // Heal: capacity back, readers keep up, clients quiet down.
        self.plan.at.clear();
        self.local.push_back(Input::KvCapacity {
            num_blocks: self.sw.model.num_blocks,
        });
        for conn in self.net.heal() {
            self.at(self.clock, Ev::Read { conn });
        }
        let placeholder = Phase::Liveness {
            until: Instant::ZERO,
            max_steps: 0,
        };
        self.phase = placeholder;
        for i in 0..self.clients.len() {
            let ops = self.clients[i].start_liveness();
            self.apply_ops(i, ops);
        }
        if self.sw.faults.shutdown && !self.shutdown_sent {
            self.shutdown_sent = true;
            self.counts.shutdown += 1;
            self.local.push_back(Input::Shutdown);
            if self.sw.faults.time_jumps > 0 {
                // A frozen process wakes up past the whole shutdown grace.
                let d = self.sw.host.shutdown_grace + Duration::from_secs(1);
                self.at(self.clock + Duration::from_millis(1), Ev::Jump(d));
            }
        }
        // The bound: every request that can still be in flight runs its whole
        // context, several times over (preemption recomputes), one step at a
        // time at the slowest step latency, after the longest pause timeout.
        let live = self.d.monitor.view().outstanding().len() as u64;
        let requests = live + self.clients.len() as u64 + 1;
        let ctx = u64::from(self.sw.model.context_len);
        let max_steps = 64 + 8 * requests * ctx;
        let cfg = &self.sw.host;
        let step = self.sw.engine.max_step_latency(cfg);
        let until = self.clock
            + cfg.pause_timeout
            + cfg.shutdown_grace
            + cfg.keepalive_timeout
            + cfg.slow_client_timeout
            + step * u32::try_from(max_steps).unwrap_or(u32::MAX)
            + self.sw.net.delay_max * 16
            + Duration::from_secs(1);
        self.phase = Phase::Liveness { until, max_steps };
        Ok(())
    }

    /// Every request has ended and nothing is on its way to the Host.
    fn liveness_done(&self) -> bool {
        self.local.is_empty()
            && self.d.monitor.view().outstanding().is_empty()
            && !self
                .queue
                .values()
                .any(|e| matches!(e, Ev::Deliver { gen, .. } if *gen == self.gen))
    }

    fn hang_up(&mut self) -> Result<(), Failure> {
        self.phase = Phase::HangUp;
        for i in 0..self.clients.len() {
            let Some(conn) = self.clients[i].conn() else {
                continue;
            };
            self.apply_ops(i, vec![ClientOp::Close(conn)]);
        }
        Ok(())
    }

    /// Nothing left that can reach the Host.
    fn quiet(&self) -> bool {
        self.local.is_empty()
            && !self.queue.values().any(|e| match e {
                Ev::Deliver { gen, .. }
                | Ev::Engine { gen, .. }
                | Ev::Text { gen, .. }
                | Ev::Verdict { gen, .. } => *gen == self.gen,
                _ => false,
            })
    }

    fn final_check(&mut self) -> Result<RunReport, Failure> {
        let s = self.d.host.stats();
        let open: Vec<ConnId> = self.net.live(self.gen).map(|(id, _)| *id).collect();
        // Blocks kept for `batch` continuations outlive their connections.
        let held = s.kv_blocks_used - s.kv_blocks_kept.min(s.kv_blocks_used);
        let left = s.connections != 0 || s.generations != 0 || held != 0;
        if left || s.sessions != 0 || !open.is_empty() {
            return Err(self.fail(Violation {
                invariant: "hang_up".into(),
                detail: format!(
                    "after every client hung up the Host holds {} connections, {} generations, {held} KV blocks not kept for continuations, {} sessions (open in the shell: {open:?})",
                    s.connections, s.generations, s.sessions
                ),
            }));
        }
        Ok(RunReport {
            seed: self.sw.seed,
            events: self.events,
            liveness_events: self.events - self.liveness_start,
            faults: self.counts,
            clients: self.clients.len() as u64,
            requests: self.d.monitor.view().started(),
            steps: self.d.steps,
            sim_time: self.clock,
            inputs_hash: self.d.inputs.hex(),
            outputs_hash: self.d.outputs.hex(),
            tally: self.d.monitor.view().tally.clone(),
        })
    }
}

/// The engine a run of `swarm` uses (for tests and tools).
pub fn engine_for(swarm: &Swarm) -> SimEngine {
    SimEngine::new(swarm.engine.clone(), swarm.model.clone())
}
