//! State shared by every connection: the model, the generations, the scheduler,
//! the timers, the dialects' host-wide state and the output queue. Dialects
//! reach it through [`crate::dialect::Cx`], over the [`HostPort`] it implements.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::api::{ConnId, Dialect, Event, JobCheck, JobCheckId, Outcome, Output, Transport};
use crate::config::HostConfig;
use crate::dialect::state::DialectState;
use crate::dialect::{registry, HostPort};
use crate::engine::{ModelInfo, SeqId, SeqResult, TokenId};
use crate::filter::{FilterAction, FilterGuard};
use crate::gen::{
    FinishReason, GenRequest, GenState, Generation, HoldReason, Holds, KeptKv, RequestPart,
    StartError, TokenPiece,
};
use crate::keys::OrgLimits;
use crate::params::GenParams;
use crate::principal::Principal;
use crate::rng::{HostRng, Seed};
use crate::sched::{AdmitError, SchedConfig, Scheduler};
use crate::text::{SharedCodec, TextCodec, TextJob, TextJobId, TextWork};
use crate::time::Instant;
use crate::timer::TimerTable;

/// What a deadline belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum TimerKey {
    /// A paused generation ends with `timeout`.
    PauseTimeout(SeqId),
    /// Graceful shutdown's grace period ends.
    ShutdownGrace,
    /// One of a connection's deadlines. A connection's keys are one range
    /// ([`TimerKey::of_conn`]), so all of them go when it does, whatever
    /// kinds are added later.
    Conn(ConnId, ConnTimer),
}

/// The deadlines a connection may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ConnTimer {
    /// A connection whose queue stays full is closed.
    SlowClient,
    /// An idle connection is closed.
    Idle,
    /// Time to ping.
    Ping,
    /// An unanswered ping closes the connection.
    PongDeadline,
    /// A dialect's own timer ([`crate::dialect::Cx::set_timer`]), by tag.
    Dialect(u8),
}

impl TimerKey {
    /// Every key `conn` can have, as one range (the first and last kinds in
    /// [`ConnTimer`]'s order).
    pub fn of_conn(conn: ConnId) -> std::ops::RangeInclusive<TimerKey> {
        TimerKey::Conn(conn, ConnTimer::SlowClient)
            ..=TimerKey::Conn(conn, ConnTimer::Dialect(u8::MAX))
    }
}

/// The loaded model.
pub(crate) struct Model {
    pub info: ModelInfo,
    pub codec: SharedCodec,
}

/// Everything but the connections: the model, the generations and their
/// scheduler, the timers, the dialects' host-wide state and the output
/// queue. Its fields are its own: the Host reads and steers them through
/// the methods below, which keep what belongs together together (a
/// generation and its scheduler entry, a connection and its outstanding
/// answers, the open-connection counts).
pub(crate) struct Shared {
    config: HostConfig,
    rng: HostRng,
    model: Option<Model>,
    sched: Option<Scheduler>,
    gens: BTreeMap<SeqId, Generation>,
    timers: TimerTable<TimerKey>,
    outputs: VecDeque<Output>,
    /// Results held during a pause, to apply now that it resumed.
    replay: VecDeque<SeqResult>,
    /// Connections a dialect asked to close: (conn, code, reason).
    closing: Vec<(ConnId, u16, String)>,
    shutting_down: bool,
    /// Outstanding text jobs and the connection each belongs to.
    text_jobs: BTreeMap<TextJobId, ConnId>,
    next_job: u64,
    /// Outstanding job checks and the connection each belongs to.
    job_checks: BTreeMap<JobCheckId, ConnId>,
    next_check: u64,
    /// Generations ended by their dialect ([`HostPort::end`]) whose last
    /// piece is still to be delivered, in order.
    ended: VecDeque<(SeqId, TokenPiece)>,
    /// The dialects' host-wide state.
    dialects: DialectState,
    /// Open connections per dialect and transport.
    open_by_dialect: BTreeMap<(Dialect, Transport), u32>,
    /// Connections whose outbound queue is full: their generations, including
    /// ones started later, are held.
    blocked_conns: BTreeSet<ConnId>,
    /// Each open connection's client address (its IP, without the port):
    /// what a client without a key is rate-limited by.
    addresses: BTreeMap<ConnId, String>,
    next_seq: u64,
}

impl Shared {
    pub fn new(config: HostConfig, seed: Seed) -> Self {
        Shared {
            dialects: crate::dialect::registry::dialect_state(&config),
            config,
            rng: HostRng::new(seed),
            model: None,
            sched: None,
            gens: BTreeMap::new(),
            timers: TimerTable::default(),
            outputs: VecDeque::new(),
            replay: VecDeque::new(),
            closing: Vec::new(),
            shutting_down: false,
            text_jobs: BTreeMap::new(),
            next_job: 1,
            job_checks: BTreeMap::new(),
            next_check: 1,
            ended: VecDeque::new(),
            open_by_dialect: BTreeMap::new(),
            blocked_conns: BTreeSet::new(),
            addresses: BTreeMap::new(),
            next_seq: 1,
        }
    }

    pub fn set_model(&mut self, info: ModelInfo, codec: SharedCodec) {
        let sched = Scheduler::new(SchedConfig {
            block_size: info.block_size,
            num_blocks: info.num_blocks,
            max_step_tokens: self.config.max_step_tokens,
            max_running_seqs: self.config.max_running_seqs,
            prefix_cache: self.config.prefix_cache,
            draft: self.config.draft,
            max_scored_rows: crate::sched::scored_rows_per_step(info.vocab_size),
        });
        self.sched = Some(sched);
        self.model = Some(Model { info, codec });
    }

    /// True while a text job or a job check of `conn` is outstanding: its
    /// frames wait.
    pub fn awaits_answer(&self, conn: ConnId) -> bool {
        self.text_jobs.values().any(|&c| c == conn) || self.job_checks.values().any(|&c| c == conn)
    }

    /// Removes a generation from the scheduler (parking its KV blocks when
    /// it completed and its dialect asked to keep them) and the registry,
    /// and counts it.
    pub fn retire(&mut self, now: Instant, id: SeqId, outcome: Outcome) -> Option<Generation> {
        let keep = outcome == Outcome::Completed && self.gens.get(&id).is_some_and(|g| g.keep_kv);
        if let Some(s) = self.sched.as_mut() {
            if keep {
                // A drafted step may have given the sequence tokens past the
                // one its generation ended at: a continuation must find
                // exactly the tokens delivered.
                if let Some(g) = self.gens.get(&id) {
                    s.truncate(id, g.prompt_tokens() + g.completion_tokens());
                }
                s.park(id);
            } else {
                s.remove(id);
            }
        }
        self.timers.cancel(TimerKey::PauseTimeout(id));
        let gen = self.gens.remove(&id)?;
        let dialect = gen.dialect;
        if let Some((payer, limits)) = &gen.charged_org {
            let tokens = u64::from(gen.completion_tokens().saturating_sub(gen.inherited_tokens));
            self.dialects
                .limits
                .charge_tokens(now, payer, *limits, tokens);
        }
        if gen.raw {
            // A beam, not a request: its dialect reports the request.
            return Some(gen);
        }
        if let Some(rule) = &gen.filtered_by {
            self.outputs
                .push_back(Output::Event(Event::ContentFiltered {
                    dialect,
                    rule: rule.clone(),
                    action: FilterAction::Stop,
                }));
        }
        self.outputs
            .push_back(Output::Event(Event::RequestFinished {
                dialect,
                request: id.0,
                outcome,
                prompt_tokens: gen.prompt_tokens(),
                completion_tokens: gen.completion_tokens(),
                elapsed: now - gen.created_at,
            }));
        Some(gen)
    }

    /// Marks every generation of `conn` blocked or not by flow control.
    pub fn set_conn_blocked(&mut self, conn: ConnId, blocked: bool) {
        if blocked {
            self.blocked_conns.insert(conn);
        } else {
            self.blocked_conns.remove(&conn);
        }
        let ids: Vec<SeqId> = self
            .gens
            .values()
            .filter(|g| g.owner == conn)
            .map(|g| g.id)
            .collect();
        for id in ids {
            if let Some(g) = self.gens.get_mut(&id) {
                if blocked {
                    g.holds.insert(HoldReason::OutboundFull);
                } else {
                    g.holds.remove(HoldReason::OutboundFull);
                }
            }
            self.sync_runnable(id);
        }
    }

    /// Tells the scheduler whether `id` may run.
    fn sync_runnable(&mut self, id: SeqId) {
        let runnable = self.gens.get(&id).is_some_and(|g| g.runnable());
        if let Some(s) = self.sched.as_mut() {
            s.set_runnable(id, runnable);
        }
    }

    /// Generations owned by `conn`, in id order.
    fn gens_of(&self, conn: ConnId) -> Vec<SeqId> {
        self.gens
            .values()
            .filter(|g| g.owner == conn)
            .map(|g| g.id)
            .collect()
    }
}

/// A step just planned: the generations in it, and those it admits with
/// their owners.
pub(crate) struct PlannedStep {
    pub in_step: Vec<SeqId>,
    pub admitted: Vec<(ConnId, SeqId)>,
}

/// What the Host reads and steers. Each method says its effect.
impl Shared {
    /// The next output, oldest first.
    pub fn pop_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The timer table (connection deadlines, pause timeouts, the grace).
    pub fn timers(&mut self) -> &mut TimerTable<TimerKey> {
        &mut self.timers
    }

    /// The earliest deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// The loaded model's description, if loaded.
    pub fn loaded_model(&self) -> Option<&ModelInfo> {
        self.model.as_ref().map(|m| &m.info)
    }

    /// True once the model is loaded.
    pub fn is_loaded(&self) -> bool {
        self.model.is_some()
    }

    /// The scheduler, once the model is loaded.
    pub fn sched(&self) -> Option<&Scheduler> {
        self.sched.as_ref()
    }

    /// Resizes the KV pool (the engine's measured capacity).
    pub fn set_kv_capacity(&mut self, num_blocks: u32) {
        if let Some(s) = self.sched.as_mut() {
            s.set_capacity(num_blocks);
        }
    }

    /// Live generations.
    pub fn gen_count(&self) -> usize {
        self.gens.len()
    }

    /// Every live generation's id, in order.
    pub fn gen_ids(&self) -> Vec<SeqId> {
        self.gens.keys().copied().collect()
    }

    /// The connection owning generation `id`.
    pub fn owner_of(&self, id: SeqId) -> Option<ConnId> {
        self.gens.get(&id).map(|g| g.owner)
    }

    /// Applies one engine result to its generation: the piece to deliver,
    /// with its first-token or inter-token timing counted; `None` when the
    /// generation is gone, or paused by its client (the result is kept and
    /// replayed on resume).
    pub fn apply_token(&mut self, now: Instant, r: SeqResult) -> Option<TokenPiece> {
        let codec = self.model.as_ref()?.codec.clone();
        let gen = self.gens.get_mut(&r.seq)?;
        if gen.client_paused() {
            gen.pending.push(r);
            return None;
        }
        let previous = gen.last_token_at;
        let created = gen.created_at;
        let vector = r.embedding.is_some();
        let piece = gen.on_token(&*codec, r, now);
        if vector {
            // Not a token: the token timings stay the text routes'.
            return Some(piece);
        }
        let timing = match previous {
            None => Event::FirstToken {
                ttft: now - created,
            },
            Some(prev) => Event::InterToken { gap: now - prev },
        };
        self.outputs.push_back(Output::Event(timing));
        Some(piece)
    }

    /// Ends generation `id` from the Host's side (a deadline): its last
    /// piece, to deliver.
    pub fn end_piece(&mut self, id: SeqId, reason: FinishReason) -> Option<TokenPiece> {
        let codec = self.model.as_ref()?.codec.clone();
        Some(self.gens.get_mut(&id)?.end(&*codec, reason))
    }

    /// Marks generation `id` finished (it failed, or its connection went)
    /// before it is retired.
    pub fn mark_finished(&mut self, id: SeqId) {
        if let Some(gen) = self.gens.get_mut(&id) {
            gen.state = GenState::Finished;
        }
    }

    /// The next piece a dialect's [`HostPort::end`] left to deliver.
    pub fn pop_ended(&mut self) -> Option<(SeqId, TokenPiece)> {
        self.ended.pop_front()
    }

    /// The next result held during a pause, to apply now that it resumed.
    pub fn pop_replay(&mut self) -> Option<SeqResult> {
        self.replay.pop_front()
    }

    /// The connections dialects asked to close since the last call.
    pub fn take_closing(&mut self) -> Vec<(ConnId, u16, String)> {
        std::mem::take(&mut self.closing)
    }

    /// True once a shutdown began.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Begins a shutdown: no new work starts.
    pub fn begin_shutdown(&mut self) {
        self.shutting_down = true;
    }

    /// The connection that asked for text job `id`, which is answered now.
    pub fn take_text_job(&mut self, id: TextJobId) -> Option<ConnId> {
        self.text_jobs.remove(&id)
    }

    /// The connection that asked for job check `id`, which is answered now.
    pub fn take_job_check(&mut self, id: JobCheckId) -> Option<ConnId> {
        self.job_checks.remove(&id)
    }

    /// Forgets every outstanding text job and job check (a shutdown's end:
    /// their answers would find no one).
    pub fn forget_all_answers(&mut self) {
        self.text_jobs.clear();
        self.job_checks.clear();
    }

    /// True while any text job or job check is outstanding.
    pub fn answers_outstanding(&self) -> bool {
        !self.text_jobs.is_empty() || !self.job_checks.is_empty()
    }

    /// Notes the client address (`ip:port`, the port dropped) of `conn`.
    pub fn note_address(&mut self, conn: ConnId, peer: &str) {
        self.addresses.insert(conn, address_of(peer).to_string());
    }

    /// Counts a connection opened on `dialect` over `transport`.
    pub fn count_open(&mut self, dialect: Dialect, transport: Transport) {
        *self
            .open_by_dialect
            .entry((dialect, transport))
            .or_insert(0) += 1;
    }

    /// Everything the Host keeps for `conn`, which is gone: its count, its
    /// flow-control block, its outstanding answers, its generations
    /// (cancelled), its timers; then `ConnectionClosed` is counted.
    pub fn forget_conn(
        &mut self,
        now: Instant,
        conn: ConnId,
        dialect: Dialect,
        transport: Transport,
    ) {
        if let Some(n) = self.open_by_dialect.get_mut(&(dialect, transport)) {
            *n = n.saturating_sub(1);
        }
        self.set_conn_blocked(conn, false);
        self.addresses.remove(&conn);
        self.text_jobs.retain(|_, owner| *owner != conn);
        self.job_checks.retain(|_, owner| *owner != conn);
        for id in self.gens_of(conn) {
            self.mark_finished(id);
            self.retire(now, id, Outcome::Cancelled);
        }
        self.timers.cancel_range(TimerKey::of_conn(conn));
        self.outputs
            .push_back(Output::Event(Event::ConnectionClosed { dialect }));
    }

    /// Live sessions across the dialects (the health report's).
    pub fn live_sessions(&self) -> usize {
        self.dialects.live_sessions()
    }

    /// Plans the next engine step if none is outstanding: the plan (queued
    /// as [`Output::RunStep`], with a prefix-cache lookup counted for each
    /// generation it admits) and the generations it admits, with their
    /// owners. Admitted generations are marked prefilling.
    pub fn plan_step(&mut self) -> Option<PlannedStep> {
        let sched = self.sched.as_mut()?;
        if sched.step_outstanding() {
            return None;
        }
        let plan = sched.schedule()?;
        let in_step = plan.seqs.iter().map(|s| s.seq).collect();
        let mut admitted = Vec::new();
        for s in &plan.seqs {
            let Some(g) = self.gens.get_mut(&s.seq) else {
                continue;
            };
            if g.state != GenState::Queued {
                continue;
            }
            g.state = GenState::Prefilling;
            admitted.push((g.owner, g.id));
            if self.config.prefix_cache && !g.raw {
                g.cached_tokens = sched.cached_tokens(s.seq).unwrap_or(0);
                self.outputs
                    .push_back(Output::Event(Event::PrefixCacheLookup {
                        queried: g.prompt_tokens(),
                        hit: g.cached_tokens,
                    }));
            }
        }
        self.outputs.push_back(Output::RunStep(plan));
        Some(PlannedStep { in_step, admitted })
    }

    /// Queue positions that changed since they were last reported, for
    /// generations still queued: (owner, generation, 1-based position).
    pub fn new_queue_positions(&mut self) -> Vec<(ConnId, SeqId, u32)> {
        let Some(sched) = self.sched.as_ref() else {
            return Vec::new();
        };
        let mut moved = Vec::new();
        for (id, position) in sched.waiting_positions() {
            let Some(g) = self.gens.get_mut(&id) else {
                continue;
            };
            if g.state != GenState::Queued || g.reported_position == Some(position) {
                continue;
            }
            g.reported_position = Some(position);
            moved.push((g.owner, id, position));
        }
        moved
    }

    /// The scheduler: the Host's step bookkeeping (results, faults) goes
    /// through it directly, since it keeps its own invariants.
    pub fn sched_mut(&mut self) -> Option<&mut Scheduler> {
        self.sched.as_mut()
    }
}

impl HostPort for Shared {
    fn push_output(&mut self, out: Output) {
        self.outputs.push_back(out);
    }

    fn request_close(&mut self, conn: ConnId, code: u16, reason: &str) {
        if !self.closing.iter().any(|(c, _, _)| *c == conn) {
            self.closing.push((conn, code, reason.to_string()));
        }
    }

    fn config(&self) -> &HostConfig {
        &self.config
    }

    /// # Panics
    /// Never in practice: dialect machines only run once the model is loaded.
    fn model_info(&self) -> &ModelInfo {
        match &self.model {
            Some(m) => &m.info,
            None => unreachable!("dialects run only after the model is loaded"),
        }
    }

    fn codec(&self) -> &dyn TextCodec {
        match &self.model {
            Some(m) => &*m.codec,
            None => unreachable!("dialects run only after the model is loaded"),
        }
    }

    fn rng(&mut self) -> &mut HostRng {
        &mut self.rng
    }

    /// Hands out a text job for `conn`; its frames wait until the answer.
    fn tokenize(&mut self, conn: ConnId, work: TextWork) -> TextJobId {
        let id = TextJobId(self.next_job);
        self.next_job += 1;
        self.text_jobs.insert(id, conn);
        if let Some(m) = &self.model {
            self.outputs.push_back(Output::Tokenize(TextJob {
                id,
                conn,
                codec: m.codec.clone(),
                work,
            }));
        }
        id
    }

    /// Hands out a job check for `conn`; its frames wait until the verdict.
    fn verify_job(
        &mut self,
        conn: ConnId,
        dialect: Dialect,
        job_id: String,
        public_key: Option<String>,
    ) -> JobCheckId {
        let id = JobCheckId(self.next_check);
        self.next_check += 1;
        self.job_checks.insert(id, conn);
        self.outputs.push_back(Output::VerifyJob(JobCheck {
            id,
            conn,
            dialect,
            job_id,
            public_key,
        }));
        id
    }

    fn start(
        &mut self,
        now: Instant,
        owner: ConnId,
        dialect: Dialect,
        principal: &Principal,
        req: GenRequest,
    ) -> Result<SeqId, StartError> {
        if self.shutting_down {
            return Err(StartError::ShuttingDown);
        }
        let Some(model) = &self.model else {
            return Err(StartError::NotLoaded);
        };
        let context_len = model.info.context_len;
        let eos_ids = model.info.eos_ids.clone();
        let prompt_tokens = req.prompt_ids.len() as u32;
        // The engine could not compute it, and would fail the whole step
        // (every other sequence in it) trying.
        let vocab = model.info.vocab_size;
        if let Some(&token) = req.prompt_ids.iter().find(|&&t| t >= vocab) {
            return Err(StartError::TokenOutOfVocab { token, vocab });
        }
        if prompt_tokens as u64 + req.params.max_tokens as u64 > context_len as u64 {
            return Err(StartError::ContextLength {
                prompt_tokens,
                max_tokens: req.params.max_tokens,
                context_len,
            });
        }
        let Some(sched) = self.sched.as_mut() else {
            return Err(StartError::NotLoaded);
        };
        // Counted without walking every sequence: this runs for every
        // prompt of a 256-prompt payload.
        let queued = sched.queue_len();
        if queued >= self.config.max_queued_requests
            && sched.stats().waiting >= self.config.max_queued_requests
        {
            return Err(StartError::QueueFull);
        }
        // Each connection's share of the queue, so that one client's burst
        // (a batch payload, a flood of requests) cannot fill it for all. Its
        // own count is only taken once the whole queue could be over it.
        let limit = self.config.max_queued_per_conn;
        if queued >= limit {
            let waiting_here = self
                .gens
                .values()
                .filter(|g| g.owner == owner && g.state == GenState::Queued && !g.raw)
                .count();
            if waiting_here >= limit as usize {
                return Err(StartError::ConnQueueFull { limit });
            }
        }
        // A key's organisation pays for what its requests compute, on every
        // dialect (one with `own_auth`, `cai`, admits and charges its own
        // requests). A client without a key pays by its address, when
        // anonymous limits are set (`--anon-requests-per-minute`, ...).
        // A beam search's first beam is its request; the beams forked from
        // it are charged the tokens they generate.
        let payer = match (principal, &self.config.keys) {
            _ if registry::spec(dialect).own_auth => None,
            (Principal::Key { org, .. }, Some(ring)) => Some((org.clone(), ring.org_limits(org))),
            (Principal::Key { .. }, None) => None,
            (Principal::Conn(_) | Principal::Anonymous, _) => self
                .addresses
                .get(&owner)
                .filter(|_| self.config.anon_limits != OrgLimits::default())
                .map(|addr| (format!("address {addr}"), self.config.anon_limits)),
        };
        if let Some((payer, limits)) = payer.as_ref().filter(|_| req.part == RequestPart::First) {
            if let Err(wait) = self.dialects.limits.admit(now, payer, *limits) {
                let retry_after_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
                return Err(StartError::RateLimited { retry_after_ms });
            }
        }
        if let Some((payer, limits)) = payer
            .as_ref()
            .filter(|_| req.part != RequestPart::SamePrompt)
        {
            self.dialects
                .limits
                .charge_tokens(now, payer, *limits, u64::from(prompt_tokens));
        }
        let charged_org = payer;
        let id = SeqId(self.next_seq);
        self.next_seq += 1;
        let seed = match req.params.seed {
            Some(s) => s,
            None => self.rng.next_u64(),
        };
        let max_len = prompt_tokens + req.params.max_tokens;
        let sampling = req.params.sampling(seed, prompt_tokens, &eos_ids);
        let reused = req.reuse_kv.is_some_and(|KeptKv(kept)| {
            // A scored prompt is computed from position 0: kept blocks
            // would skip it (reuse changes time, never tokens).
            let same = sched.tokens(kept) == Some(req.prompt_ids.as_slice())
                && req.prompt_logprobs.is_none();
            let reused = same && sched.unpark(kept, id, max_len, sampling.clone(), req.logprobs);
            if !reused {
                sched.drop_parked(kept);
            }
            reused
        });
        if reused {
            // Every prompt token but the last has its K/V in the kept blocks.
            self.outputs
                .push_back(Output::Event(Event::PromptTokensReused {
                    count: prompt_tokens.saturating_sub(1),
                }));
        } else {
            sched
                .add(id, req.prompt_ids.clone(), max_len, sampling, req.logprobs)
                .map_err(StartError::from)?;
        }
        if let Some(c) = req.constraint {
            sched.set_constraint(id, c, vocab);
        }
        if let Some(top) = req.prompt_logprobs.filter(|_| req.embed.is_none()) {
            sched.set_prompt_logprobs(id, top);
        }
        if let Some(pooling) = req.embed {
            sched.set_embed(id, pooling);
        }
        // A beam picks among each step's alternatives itself: drafts would
        // hand it several tokens of one path.
        if !req.raw {
            sched.allow_draft(id);
        }
        let mut gen = Generation::new(
            id,
            owner,
            dialect,
            req.prompt_ids,
            req.params,
            seed,
            req.logprobs,
            eos_ids,
            now,
        );
        gen.raw = req.raw;
        gen.charged_org = charged_org;
        // A beam's text is decided by its dialect, which starts no text of
        // its own: only text-producing generations are guarded.
        if let Some(f) = self
            .config
            .content_filter
            .as_ref()
            .filter(|f| f.has_stop_rules())
        {
            if !gen.raw {
                gen.set_filter(FilterGuard::new(Arc::clone(f)));
            }
        }
        if self.blocked_conns.contains(&owner) {
            gen.holds.insert(HoldReason::OutboundFull);
        }
        if !gen.raw {
            self.outputs.push_back(Output::Event(Event::RequestStarted {
                conn: owner,
                dialect,
                request: id.0,
                prompt_tokens,
                max_tokens: gen.params.max_tokens,
            }));
        }
        self.gens.insert(id, gen);
        self.sync_runnable(id);
        Ok(id)
    }

    fn generation(&self, id: SeqId) -> Option<&Generation> {
        self.gens.get(&id)
    }

    /// Ends a generation for its dialect: the last piece (held text
    /// released) is queued for delivery through the same route as a natural
    /// ending, and the scheduler forgets it at once.
    fn end(&mut self, id: SeqId, reason: FinishReason) -> bool {
        let Some(model) = self.model.as_ref() else {
            return false;
        };
        if self.ended.iter().any(|(e, _)| *e == id) {
            return false;
        }
        let Some(gen) = self.gens.get_mut(&id) else {
            return false;
        };
        // Blocks the dialect asked to keep stay for a completed ending (as
        // `keep_kv` promises): the generation only stops running, and
        // `retire` parks it. Any other ending frees them now.
        let keeps = gen.keep_kv && outcome_of(reason) == Outcome::Completed;
        let piece = gen.end(&*model.codec, reason);
        if let Some(s) = self.sched.as_mut() {
            if keeps {
                s.set_runnable(id, false);
            } else {
                s.remove(id);
            }
        }
        self.timers.cancel(TimerKey::PauseTimeout(id));
        self.ended.push_back((id, piece));
        true
    }

    /// Adds `reason` to what holds `id`. A hold the client controls (its
    /// pause, its flow window) starts the pause timeout: a client that never
    /// resumes or acknowledges cannot keep a generation's memory forever.
    fn hold(&mut self, now: Instant, id: SeqId, reason: HoldReason) -> bool {
        let Some(gen) = self.gens.get_mut(&id) else {
            return false;
        };
        let was_timed = client_held(gen.holds);
        gen.holds.insert(reason);
        if !was_timed && client_held(gen.holds) {
            self.timers
                .set(TimerKey::PauseTimeout(id), now + self.config.pause_timeout);
        }
        self.sync_runnable(id);
        true
    }

    /// Starts a copy of live generation `src` (a beam continuing another):
    /// same owner, tokens and state, sharing `src`'s KV blocks copy-on-write.
    fn fork(&mut self, src: SeqId) -> Option<SeqId> {
        let gen = self.gens.get(&src)?.clone();
        let id = SeqId(self.next_seq);
        if !self.sched.as_mut()?.fork(src, id) {
            return None;
        }
        self.next_seq += 1;
        let mut child = gen;
        child.id = id;
        child.inherited_tokens = child.completion_tokens();
        self.gens.insert(id, child);
        self.sync_runnable(id);
        Some(id)
    }

    /// Replaces the last token of raw generation `id` before it is computed.
    fn set_last_token(&mut self, id: SeqId, token: TokenId) -> bool {
        let Some(gen) = self.gens.get_mut(&id) else {
            return false;
        };
        if !gen.set_last_token(token) {
            return false;
        }
        self.sched
            .as_mut()
            .is_some_and(|s| s.set_last_token(id, token))
    }

    /// Asks that live generation `id` keep its KV blocks when it completes.
    fn keep_kv(&mut self, id: SeqId) -> Option<KeptKv> {
        let gen = self.gens.get_mut(&id).filter(|g| !g.raw)?;
        gen.keep_kv = true;
        Some(KeptKv(id))
    }

    /// Frees KV blocks kept by [`HostPort::keep_kv`] (no-op when already gone).
    fn drop_kv(&mut self, kv: KeptKv) {
        if let Some(s) = self.sched.as_mut() {
            s.drop_parked(kv.0);
        }
    }

    /// Removes `reason` from what holds `id`; the end of a client pause
    /// replays the results it kept back.
    fn release(&mut self, id: SeqId, reason: HoldReason) -> bool {
        let Some(gen) = self.gens.get_mut(&id) else {
            return false;
        };
        if gen.holds.remove(reason) && reason == HoldReason::ClientPause {
            let held = std::mem::take(&mut gen.pending);
            self.replay.extend(held);
        }
        if !client_held(gen.holds) {
            self.timers.cancel(TimerKey::PauseTimeout(id));
        }
        self.sync_runnable(id);
        true
    }

    fn modify(&mut self, id: SeqId, params: GenParams) -> Result<(), StartError> {
        let Some(gen) = self.gens.get_mut(&id) else {
            return Ok(());
        };
        // A longer max_tokens must still fit the KV pool, or the sequence
        // could never finish.
        let max_len = gen.prompt_tokens() + params.max_tokens;
        if let Some(s) = self.sched.as_mut() {
            s.set_max_len(id, max_len).map_err(StartError::from)?;
        }
        let seed = params.seed.unwrap_or(gen.seed);
        gen.seed = seed;
        let eos_ids = self.model.as_ref().map_or(&[][..], |m| &m.info.eos_ids);
        let sampling = params.sampling(seed, gen.prompt_tokens(), eos_ids);
        gen.set_params(params);
        if let Some(s) = self.sched.as_mut() {
            s.set_sampling(id, sampling);
        }
        Ok(())
    }

    fn dialect_state(&mut self) -> &mut DialectState {
        &mut self.dialects
    }

    fn open_connections(&self, dialect: Dialect, transport: Transport) -> u32 {
        self.open_by_dialect
            .get(&(dialect, transport))
            .copied()
            .unwrap_or(0)
    }

    fn set_timer(&mut self, conn: ConnId, tag: u8, at: Instant) {
        self.timers
            .set(TimerKey::Conn(conn, ConnTimer::Dialect(tag)), at);
    }

    fn cancel_timer(&mut self, conn: ConnId, tag: u8) {
        self.timers
            .cancel(TimerKey::Conn(conn, ConnTimer::Dialect(tag)));
    }
}

/// The IP of a peer written `ip:port` or `[ipv6]:port` (the whole string
/// when it has no port).
fn address_of(peer: &str) -> &str {
    if let Some(rest) = peer.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match peer.rsplit_once(':') {
        // One colon: `ip:port`; more: a bare IPv6 address.
        Some((ip, _)) if !ip.contains(':') => ip,
        _ => peer,
    }
}

/// Outcome label of a finish reason.
pub(crate) fn outcome_of(reason: FinishReason) -> Outcome {
    match reason {
        FinishReason::Length | FinishReason::Stop | FinishReason::ContentFilter => {
            Outcome::Completed
        }
        FinishReason::Cancelled => Outcome::Cancelled,
        FinishReason::Timeout => Outcome::TimedOut,
    }
}

/// What the scheduler refused, as the dialects report it.
impl From<AdmitError> for StartError {
    fn from(e: AdmitError) -> StartError {
        match e {
            AdmitError::NeverFits {
                needed_blocks,
                total_blocks,
            } => StartError::NeverFits {
                needed_blocks,
                total_blocks,
            },
            // A sequence id already in use: never a client's doing; the
            // request is refused as if the queue were full.
            AdmitError::Duplicate => StartError::QueueFull,
        }
    }
}

/// True when a hold the client controls (and the pause timeout bounds) is set.
fn client_held(holds: Holds) -> bool {
    holds.contains(HoldReason::ClientPause) || holds.contains(HoldReason::FlowWindow)
}
