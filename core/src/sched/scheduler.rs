//! Continuous batching: which sequences go into each engine step.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

mod checks;

use super::blocks::BlockAllocator;
use super::constrained::SeqConstraint;
use super::draft::{self, DraftConfig};
use super::seq::{Seq, SeqState};
use crate::constraint::Constraint;
use crate::engine::{
    BlockId, EngineFaultKind, Fork, Pooling, SamplingParams, SeqId, SeqResult, SeqStep, StepDone,
    StepPlan, TokenId,
};

/// Successful steps in a row after which the adaptive seqs-per-step cap, lowered
/// by an out-of-memory step, grows back by one. Small enough to recover within
/// a few hundred steps from the largest batches, large enough that a step size
/// that keeps failing is retried rarely.
const CAP_RESTORE_STEPS: u32 = 4;

/// Sizes and limits of a [`Scheduler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedConfig {
    /// Tokens per KV block (16 for every engine so far).
    pub block_size: u32,
    /// KV blocks in the pool at start; [`Scheduler::set_capacity`] changes it later.
    pub num_blocks: u32,
    /// Most tokens fed in one step (prefill chunks plus one per decode).
    pub max_step_tokens: u32,
    /// Most sequences in one step.
    pub max_running_seqs: u32,
    /// Reuse the KV blocks of prompt prefixes already computed (and keep
    /// full blocks no sequence holds, cached, until the pool needs them).
    pub prefix_cache: bool,
    /// Speculative decoding by prompt lookup for the sequences that allow it
    /// ([`Scheduler::allow_draft`]); [`DraftConfig::OFF`]: none.
    pub draft: DraftConfig,
    /// Most prompt tokens scored in one step
    /// ([`crate::engine::SeqStep::prompt_logprobs`]): each is a
    /// vocabulary-wide row of logits the engine holds for the step, so this
    /// bounds a step's memory where the token budget would not
    /// ([`scored_rows_per_step`]).
    pub max_scored_rows: u32,
}

/// Bytes of scored logits rows one step may hold.
pub const SCORED_LOGITS_BYTES: u64 = 64 << 20;

/// [`SchedConfig::max_scored_rows`] for a vocabulary of `vocab` tokens: as
/// many f32 rows as [`SCORED_LOGITS_BYTES`] holds, at least one.
pub fn scored_rows_per_step(vocab: u32) -> u32 {
    u32::try_from(SCORED_LOGITS_BYTES / (4 * u64::from(vocab.max(1))))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Why [`Scheduler::add`] refused a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitError {
    /// Its longest possible length needs more KV blocks than the whole pool
    /// (or its prompt is empty, so there is nothing to compute from:
    /// `needed_blocks` is 0 then).
    NeverFits {
        /// Blocks its `max_len` needs.
        needed_blocks: u32,
        /// Blocks in the pool.
        total_blocks: u32,
    },
    /// A sequence with this id is already known.
    Duplicate,
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmitError::NeverFits {
                needed_blocks: 0, ..
            } => write!(f, "empty prompt"),
            AdmitError::NeverFits {
                needed_blocks,
                total_blocks,
            } => write!(
                f,
                "needs {needed_blocks} KV blocks but the pool has {total_blocks}"
            ),
            AdmitError::Duplicate => write!(f, "duplicate sequence id"),
        }
    }
}

impl std::error::Error for AdmitError {}

/// Gauges of a [`Scheduler`]. `waiting + running + paused + parked` is the
/// number of live sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchedStats {
    /// Runnable sequences waiting for admission (new, or preempted for recompute).
    pub waiting: u32,
    /// Runnable sequences holding blocks.
    pub running: u32,
    /// Non-runnable sequences (holding blocks or not).
    pub paused: u32,
    /// Finished sequences whose KV blocks are kept for a continuation
    /// ([`Scheduler::park`]); not counted in `paused`.
    pub parked: u32,
    /// KV blocks only parked sequences hold: the first freed under memory
    /// pressure.
    pub blocks_parked: u32,
    /// KV blocks held (by live sequences, and by removed ones still in the
    /// outstanding step).
    pub blocks_used: u32,
    /// KV blocks in the pool now.
    pub blocks_total: u32,
    /// KV blocks no sequence holds, kept for their content (prefix
    /// caching); available to any allocation, not counted in `blocks_used`.
    pub blocks_cached: u32,
}

/// One sequence's share of the outstanding step, kept to apply its result.
#[derive(Debug, Clone)]
struct Planned {
    seq: SeqId,
    /// Its known tokens fed (not counting `draft`).
    fed: u32,
    sample: bool,
    /// The plan carried its cached prefix (sent again if the step fails).
    sent_prefix: bool,
    /// A running sequence's decode (one known token left to feed), which
    /// may carry a draft.
    decode: bool,
    /// Draft tokens fed after them ([`SeqStep::draft`]).
    draft: Vec<TokenId>,
}

#[derive(Debug, Clone)]
struct Outstanding {
    step_id: u64,
    entries: Vec<Planned>,
    /// The plan's `free` list, sent again if the step fails (the engine may
    /// not have applied it).
    free: Vec<SeqId>,
    /// The plan's block copies, sent again if the step fails.
    copies: Vec<(BlockId, BlockId)>,
    /// The plan's forks, sent again if the step fails.
    forks: Vec<Fork>,
    /// Copy sources kept from reuse until the copies are done.
    holds: Vec<BlockId>,
}

/// The continuous-batching scheduler and owner of the KV block pool.
///
/// Sequences wait in a FIFO queue, are admitted when blocks for all their
/// tokens are free, and from then on are in every step (one token per decode,
/// prompt chunks within the token budget) until removed. When blocks run out
/// the newest admitted sequence is preempted: it loses its blocks and goes back
/// to the front of the queue to be recomputed from its tokens, which the client
/// never notices. Non-runnable sequences are never planned and are the first
/// to lose their blocks.
///
/// At most one step is outstanding; blocks of sequences in it are never
/// touched until it completes ([`Scheduler::on_step_done`]) or fails
/// ([`Scheduler::on_step_failed`]). A plan's `free` list names sequences whose
/// engine state can go; the engine applies it before computing the plan's
/// `seqs`. Everything is deterministic: ordered maps and queues only.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedConfig,
    alloc: BlockAllocator,
    seqs: BTreeMap<SeqId, Seq>,
    /// Front is admitted first.
    waiting: VecDeque<SeqId>,
    /// In admission order: the last is the newest, the first victim.
    running: Vec<SeqId>,
    pending_free: Vec<SeqId>,
    /// Block copies for the next plan (copy-on-write of forked sequences).
    pending_copies: Vec<(BlockId, BlockId)>,
    /// Forks for the next plan (the engine copies the parent's history).
    pending_forks: Vec<Fork>,
    /// One extra reference on each pending copy's source block, so that the
    /// block is not handed out again before the engine has copied it.
    copy_holds: Vec<BlockId>,
    next_step_id: u64,
    outstanding: Option<Outstanding>,
    /// Adaptive seqs-per-step cap, lowered by out-of-memory steps.
    seq_cap: u32,
    ok_streak: u32,
    /// Constrained sequences whose sampled token their grammar refused, with
    /// why; drained by [`Scheduler::take_constraint_failures`].
    constraint_failures: Vec<(SeqId, String)>,
    /// Draft tokens fed and confirmed since the last
    /// [`Scheduler::take_draft_tally`].
    draft_tally: DraftTally,
}

/// Draft tokens the engine was fed and those its samples confirmed (see
/// [`SeqStep::draft`]), over the steps since they were last taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DraftTally {
    /// Draft tokens fed.
    pub drafted: u32,
    /// Of them, those kept (each one a token the step yielded beyond one).
    pub confirmed: u32,
}

impl Scheduler {
    /// An idle scheduler over a pool of `cfg.num_blocks` free blocks. Zero
    /// sizes and limits are raised to 1 so the arithmetic stays sound.
    pub fn new(cfg: SchedConfig) -> Self {
        let cfg = SchedConfig {
            block_size: cfg.block_size.max(1),
            num_blocks: cfg.num_blocks,
            max_step_tokens: cfg.max_step_tokens.max(1),
            max_running_seqs: cfg.max_running_seqs.max(1),
            prefix_cache: cfg.prefix_cache,
            draft: cfg.draft,
            max_scored_rows: cfg.max_scored_rows.max(1),
        };
        Scheduler {
            alloc: BlockAllocator::new(cfg.num_blocks),
            seqs: BTreeMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pending_free: Vec::new(),
            pending_copies: Vec::new(),
            pending_forks: Vec::new(),
            copy_holds: Vec::new(),
            next_step_id: 1,
            outstanding: None,
            seq_cap: cfg.max_running_seqs,
            ok_streak: 0,
            constraint_failures: Vec::new(),
            draft_tally: DraftTally::default(),
            cfg,
        }
    }

    /// The configuration (after zero limits were raised to 1).
    #[cfg(test)]
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Queues a new sequence at the back of the waiting queue. `max_len` is
    /// `prompt.len() + max_tokens`; a sequence whose `max_len` needs more
    /// blocks than the pool has (the configured size, or the current one if
    /// larger) could never finish and is refused.
    pub fn add(
        &mut self,
        seq: SeqId,
        prompt: Vec<TokenId>,
        max_len: u32,
        sampling: SamplingParams,
        logprobs: Option<u8>,
    ) -> Result<(), AdmitError> {
        if self.seqs.contains_key(&seq) {
            return Err(AdmitError::Duplicate);
        }
        // A transient shrink must not fail requests that fit the real pool.
        let total_blocks = self.cfg.num_blocks.max(self.alloc.capacity());
        if prompt.is_empty() {
            return Err(AdmitError::NeverFits {
                needed_blocks: 0,
                total_blocks,
            });
        }
        let len = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        let needed_blocks = self.blocks_for(max_len.max(len));
        if needed_blocks > total_blocks {
            return Err(AdmitError::NeverFits {
                needed_blocks,
                total_blocks,
            });
        }
        self.seqs
            .insert(seq, Seq::new(prompt, max_len.max(len), sampling, logprobs));
        self.waiting.push_back(seq);
        Ok(())
    }

    /// Removes a sequence (finished, cancelled, disconnected). Its blocks go
    /// back to the pool now, or when the outstanding step ends if it is in
    /// that step; if the engine has seen it, it is named in a later plan's
    /// `free` list. Unknown sequences are ignored.
    pub fn remove(&mut self, seq: SeqId) {
        let in_step = self.in_outstanding(seq);
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        match s.state {
            SeqState::Removed => return,
            SeqState::Waiting => self.waiting.retain(|&w| w != seq),
            SeqState::Running => self.running.retain(|&r| r != seq),
        }
        if in_step {
            // The engine is writing its blocks right now.
            s.state = SeqState::Removed;
            return;
        }
        self.forget(seq);
    }

    /// Starts `dst` as a copy of live `src` (a beam that continues another):
    /// the same tokens, parameters and runnability. A running `src` outside
    /// the outstanding step shares its full KV blocks with `dst`
    /// (reference-counted, never written again) and its last, partial block
    /// is copied into a fresh one by the next plan's `copy_blocks`, so both
    /// then write only blocks of their own (copy-on-write). Otherwise, or when
    /// no block is free for the copy, `dst` waits at the front of the queue
    /// and is recomputed from its tokens. False (nothing changes) when `src`
    /// is unknown or `dst` exists.
    pub fn fork(&mut self, src: SeqId, dst: SeqId) -> bool {
        if self.seqs.contains_key(&dst) {
            return false;
        }
        let in_step = self.in_outstanding(src);
        let Some(s) = self.live(src) else {
            return false;
        };
        let mut child = Seq::new(s.tokens.clone(), s.max_len, s.sampling.clone(), s.logprobs);
        child.constraint = s.constraint.clone();
        child.runnable = s.runnable;
        child.started = true;
        let bs = self.cfg.block_size;
        let full = (s.num_computed / bs) as usize;
        let partial = (s.num_computed % bs != 0)
            .then(|| s.blocks.get(full).copied())
            .flatten();
        // Blocks past the computed positions (admission reserves one for
        // the next token) hold nothing the child needs.
        let covered = s.num_computed % bs == 0 || partial.is_some();
        let shareable = s.state == SeqState::Running && !in_step && covered;
        let shared: Vec<BlockId> = s.blocks[..full.min(s.blocks.len())].to_vec();
        let computed = s.num_computed;
        let target = match (shareable, partial) {
            (true, Some(_)) => self.alloc.allocate(),
            _ => None,
        };
        if shareable && (partial.is_none() || target.is_some()) {
            for &b in &shared {
                self.alloc.retain(b);
            }
            child.blocks = shared;
            if let (Some(src_block), Some(t)) = (partial, target) {
                child.blocks.push(t);
                self.pending_copies.push((src_block, t));
                self.alloc.retain(src_block);
                self.copy_holds.push(src_block);
            }
            child.num_computed = computed;
            child.state = SeqState::Running;
            self.pending_forks.push(Fork {
                src,
                dst,
                len: computed,
            });
            self.running.push(dst);
        } else {
            self.waiting.push_front(dst);
        }
        self.seqs.insert(dst, child);
        true
    }

    /// Replaces the last token of live `seq` when it is not computed yet (a
    /// beam continuing with another token than the one sampled). False
    /// otherwise, and while `seq` is in the outstanding step: the engine is
    /// computing that token now.
    pub fn set_last_token(&mut self, seq: SeqId, token: TokenId) -> bool {
        if self.in_outstanding(seq) {
            return false;
        }
        let Some(s) = self.live_mut(seq) else {
            return false;
        };
        if s.num_computed >= s.len() {
            return false;
        }
        match s.tokens.last_mut() {
            Some(t) => {
                *t = token;
                true
            }
            None => false,
        }
    }

    /// Keeps finished `seq`'s KV blocks for a later continuation instead of
    /// freeing them: it stays, never runnable, until [`Scheduler::unpark`]
    /// continues it, [`Scheduler::remove`] drops it, or memory runs short, when
    /// parked sequences are the first to go (least recently parked first) and
    /// are forgotten rather than queued for recompute. False (and `seq` is
    /// removed) when it holds no reusable blocks: it is waiting, or in the
    /// outstanding step.
    pub fn park(&mut self, seq: SeqId) -> bool {
        let in_step = self.in_outstanding(seq);
        let keep = self
            .live(seq)
            .is_some_and(|s| s.state == SeqState::Running && !in_step && s.num_computed > 0);
        if !keep {
            self.remove(seq);
            return false;
        }
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.parked = true;
            s.runnable = false;
        }
        // Running order is eviction order among parked sequences.
        self.running.retain(|&r| r != seq);
        self.running.push(seq);
        true
    }

    /// Continues parked `src` as new sequence `dst` with its own limits and
    /// sampling: `dst` shares `src`'s full KV blocks, copies its partial one
    /// (as [`Scheduler::fork`] does, other parked sequences freed first if no
    /// block is free for the copy) and is running at once, with only the last
    /// token left to feed; `src` is dropped. False (nothing changes) when
    /// `src` is not parked or was evicted, `dst` exists, or `max_len` could
    /// never fit; the caller then adds `dst` to be computed from its tokens.
    pub fn unpark(
        &mut self,
        src: SeqId,
        dst: SeqId,
        max_len: u32,
        sampling: SamplingParams,
        logprobs: Option<u8>,
    ) -> bool {
        let total_blocks = self.cfg.num_blocks.max(self.alloc.capacity());
        let fits = |s: &Seq| self.blocks_for(max_len.max(s.len())) <= total_blocks;
        if !self.live(src).is_some_and(|s| s.parked && fits(s)) || self.seqs.contains_key(&dst) {
            return false;
        }
        // The partial block's copy needs a free block: other kept sequences
        // make room before this one falls back to recomputing.
        let bs = self.cfg.block_size;
        if self.live(src).is_some_and(|s| s.num_computed % bs != 0) {
            while self.alloc.available() == 0 {
                let other_parked =
                    |id: &SeqId| *id != src && self.seqs.get(id).is_some_and(|s| s.parked);
                match self.idle_victim(other_parked) {
                    Some(v) => self.preempt(v),
                    None => break,
                }
            }
        }
        if !self.fork(src, dst) {
            return false;
        }
        let Some(child) = self.seqs.get_mut(&dst) else {
            return false;
        };
        child.max_len = max_len.max(child.len());
        child.sampling = sampling;
        child.logprobs = logprobs;
        // A continuation is a new generation: its grammar, if any, is set anew.
        child.constraint = None;
        child.runnable = true;
        if child.state == SeqState::Waiting {
            // No block for the copy: it waits its turn like any new request
            // and is recomputed from its tokens.
            child.started = false;
            self.waiting.retain(|&w| w != dst);
            self.waiting.push_back(dst);
        }
        self.remove(src);
        true
    }

    /// Drops parked `seq` and frees its blocks (its cache entry went). False,
    /// changing nothing, when `seq` is not parked.
    pub fn drop_parked(&mut self, seq: SeqId) -> bool {
        if !self.live(seq).is_some_and(|s| s.parked) {
            return false;
        }
        self.remove(seq);
        true
    }

    /// True when `seq` is parked with its KV blocks.
    #[cfg(test)]
    pub fn is_parked(&self, seq: SeqId) -> bool {
        self.live(seq).is_some_and(|s| s.parked)
    }

    /// Marks a sequence runnable or not (paused, slow reader, flow-control
    /// window closed). A non-runnable sequence is never planned; it keeps its
    /// blocks until memory is short, when it is the first to lose them (it is
    /// then recomputed from its tokens once runnable again).
    pub fn set_runnable(&mut self, seq: SeqId, runnable: bool) {
        if let Some(s) = self.live_mut(seq).filter(|s| !s.parked) {
            s.runnable = runnable;
        }
    }

    /// Changes a sequence's longest length (a `modify` of `max_tokens`); refused,
    /// changing nothing, when that length could never fit the pool.
    pub fn set_max_len(&mut self, seq: SeqId, max_len: u32) -> Result<(), AdmitError> {
        let total_blocks = self.cfg.num_blocks.max(self.alloc.capacity());
        let Some(len) = self.live(seq).map(Seq::len) else {
            return Ok(());
        };
        let needed_blocks = self.blocks_for(max_len.max(len));
        if needed_blocks > total_blocks {
            return Err(AdmitError::NeverFits {
                needed_blocks,
                total_blocks,
            });
        }
        if let Some(s) = self.live_mut(seq) {
            s.max_len = max_len.max(len);
        }
        Ok(())
    }

    /// Constrains `seq`'s output from its next sample on: every plan that
    /// samples it carries `machine`'s mask over a vocabulary of `vocab` ids,
    /// but where `machine` allows any token
    /// ([`crate::constraint::TokenConstraint::unconstrained`]).
    /// The tokens it already generated (after `generated_from`) are fed to
    /// `machine` first. False (nothing changes) when `seq` is unknown.
    pub fn set_constraint(&mut self, seq: SeqId, machine: Constraint, vocab: u32) -> bool {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return false;
        };
        let mut c = SeqConstraint::new(machine, vocab);
        c.catch_up(s.generated());
        s.constraint = Some(c);
        true
    }

    /// Makes `seq` an embedding sequence ([`crate::engine::SeqStep::embed`]):
    /// its plans carry `pooling`, it never starts from cached blocks nor
    /// carries a draft, and its result is a vector, after which it has
    /// nothing left to feed: the caller removes it then. False (nothing
    /// changes) when `seq` is unknown.
    pub fn set_embed(&mut self, seq: SeqId, pooling: Pooling) -> bool {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return false;
        };
        s.embed = Some(pooling);
        true
    }

    /// Makes `seq` score its prompt
    /// ([`crate::engine::SeqStep::prompt_logprobs`], with `top`
    /// alternatives): its plans ask for the scores until its first token,
    /// and it never starts from cached blocks. Set before it is first
    /// planned. False (nothing changes) when `seq` is unknown.
    pub fn set_prompt_logprobs(&mut self, seq: SeqId, top: u8) -> bool {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return false;
        };
        s.prompt_logprobs = Some(top);
        true
    }

    /// Constrained sequences whose grammar refused a sampled token (or whose
    /// grammar engine failed) since the last call, with a message naming the
    /// token; their tokens were not returned by [`Scheduler::on_step_done`].
    /// The caller fails and removes them.
    pub fn take_constraint_failures(&mut self) -> Vec<(SeqId, String)> {
        std::mem::take(&mut self.constraint_failures)
    }

    /// Changes a sequence's sampling parameters from the next planned step on.
    pub fn set_sampling(&mut self, seq: SeqId, sampling: SamplingParams) {
        if let Some(s) = self.live_mut(seq) {
            s.sampling = sampling;
        }
    }

    /// Changes how many top logprobs a sequence reports, from the next planned step on.
    #[cfg(test)]
    pub fn set_logprobs(&mut self, seq: SeqId, logprobs: Option<u8>) {
        if let Some(s) = self.live_mut(seq) {
            s.logprobs = logprobs;
        }
    }

    /// Lets live `seq` be drafted for ([`SchedConfig::draft`]) while it is
    /// not constrained. Off for every sequence until this is called: the
    /// Host allows it for generations that take their tokens as they come
    /// (not a beam, which picks among each step's alternatives).
    pub fn allow_draft(&mut self, seq: SeqId) {
        if let Some(s) = self.live_mut(seq) {
            s.draft_ok = true;
        }
    }

    /// Drops the tokens of live `seq` past its first `len` (at least one):
    /// its generation ended at a token before the last one a drafted step
    /// gave it, and a continuation must find exactly the tokens it
    /// delivered. Whatever was computed past them is forgotten, with the
    /// blocks that only they needed. No change while `seq` is in the
    /// outstanding step, or when it holds no more than `len` tokens.
    pub fn truncate(&mut self, seq: SeqId, len: u32) {
        if self.in_outstanding(seq) || len == 0 {
            return;
        }
        let bs = self.cfg.block_size;
        let Some(s) = self.live_mut(seq) else {
            return;
        };
        if len >= s.len() {
            return;
        }
        s.tokens.truncate(len as usize);
        s.num_computed = s.num_computed.min(len - 1);
        s.keys.truncate((len / bs) as usize);
        // Blocks are offered to the prefix cache only up to what a drafted
        // step computed before its draft, which a generation that delivered
        // its tokens never ends before. Should one be registered past what
        // stays computed, its K/V is still its key's (computed from those
        // tokens): it is only no longer counted as this sequence's.
        s.registered = s.registered.min((s.num_computed / bs) as usize);
        if s.state == SeqState::Running {
            let keep = self.blocks_for(len + 1);
            self.trim_table(seq, keep);
        }
    }

    /// Draft tokens fed and confirmed since the last call.
    pub fn take_draft_tally(&mut self) -> DraftTally {
        std::mem::take(&mut self.draft_tally)
    }

    /// Builds the next step: a decode for every runnable, fully prefilled
    /// running sequence, then the next chunk of any partly prefilled one, then
    /// newly admitted sequences in FIFO order, within the token budget and the
    /// seqs-per-step limit. `None` while a step is outstanding or when nothing
    /// can run (pending `free` entries then wait for the next plan).
    pub fn schedule(&mut self) -> Option<StepPlan> {
        if self.outstanding.is_some() {
            return None;
        }
        self.enforce_capacity();
        let limit = self.step_seq_limit();
        let mut budget = self.cfg.max_step_tokens;
        let mut scored = self.cfg.max_scored_rows;
        let mut planned: Vec<Planned> = Vec::new();
        let mut in_plan: BTreeSet<SeqId> = BTreeSet::new();
        let drafting = self.cfg.draft.enabled() && self.decoders() <= self.cfg.draft.max_seqs;

        // Decodes before prefill chunks: a decode is one token of latency the
        // client is waiting on, a chunk is one slice of a long prompt.
        for decode_phase in [true, false] {
            let order = self.running.clone();
            for id in order {
                if planned.len() as u32 >= limit || budget == 0 {
                    break;
                }
                let Some(s) = self.seqs.get(&id) else {
                    continue;
                };
                // It may have been preempted by an earlier seq of this plan.
                if s.state != SeqState::Running || !s.runnable || in_plan.contains(&id) {
                    continue;
                }
                let remaining = s.remaining();
                if remaining == 0 || (remaining == 1) != decode_phase {
                    continue;
                }
                let fed = remaining.min(budget).min(scored_cap(s, remaining, scored));
                if fed == 0 {
                    continue;
                }
                let rows = scored_rows(s, fed, remaining);
                let positions = s.num_computed + fed;
                if !self.grow_table(id, positions, &in_plan) {
                    continue;
                }
                scored -= rows;
                planned.push(Planned {
                    seq: id,
                    fed,
                    sample: fed == remaining,
                    sent_prefix: false,
                    decode: decode_phase,
                    draft: Vec::new(),
                });
                in_plan.insert(id);
                budget -= fed;
            }
        }

        self.admit(&mut planned, &mut in_plan, &mut budget, &mut scored, limit);

        if drafting {
            // Guesses take only what the step left over once every decode,
            // chunk and admission had its share: the rest of the token
            // budget, split evenly among the decodes, and blocks no one
            // holds.
            let decodes: Vec<usize> = (0..planned.len()).filter(|&i| planned[i].decode).collect();
            for (k, &i) in decodes.iter().enumerate() {
                let share = budget / (decodes.len() - k) as u32;
                let draft = self.take_draft(planned[i].seq, share);
                budget -= draft.len() as u32;
                planned[i].draft = draft;
            }
        }

        if planned.is_empty() {
            return None;
        }
        let step_id = self.next_step_id;
        self.next_step_id += 1;
        let mut seqs = Vec::with_capacity(planned.len());
        for p in planned.iter_mut() {
            let Some(s) = self.seqs.get_mut(&p.seq) else {
                continue;
            };
            s.seen_by_engine = true;
            let start = s.num_computed as usize;
            let cached_prefix = if s.send_prefix {
                s.send_prefix = false;
                p.sent_prefix = true;
                s.tokens[..start].to_vec()
            } else {
                Vec::new()
            };
            let allowed = match (&mut s.constraint, p.sample) {
                (Some(c), true) => {
                    let from = (s.sampling.generated_from as usize).min(s.tokens.len());
                    c.mask(&s.tokens[from..])
                }
                _ => None,
            };
            seqs.push(SeqStep {
                seq: p.seq,
                tokens: s.tokens[start..start + p.fed as usize].to_vec(),
                start_pos: s.num_computed,
                block_table: s.blocks.clone(),
                sampling: s.sampling.clone(),
                sample: p.sample,
                logprobs: s.logprobs,
                cached_prefix,
                allowed,
                draft: p.draft.clone(),
                embed: s.embed,
                // Scored until it has a token: a recompute after a
                // preemption past the prompt scores nothing again.
                prompt_logprobs: s.prompt_logprobs.filter(|_| s.scores_prompt()),
            });
        }
        let free = std::mem::take(&mut self.pending_free);
        let copies = std::mem::take(&mut self.pending_copies);
        let forks = std::mem::take(&mut self.pending_forks);
        for f in &forks {
            // The engine holds state for it from this plan on.
            if let Some(s) = self.seqs.get_mut(&f.dst) {
                s.seen_by_engine = true;
            }
        }
        let holds = std::mem::take(&mut self.copy_holds);
        self.outstanding = Some(Outstanding {
            step_id,
            entries: planned,
            free: free.clone(),
            copies: copies.clone(),
            forks: forks.clone(),
            holds,
        });
        Some(StepPlan {
            step_id,
            seqs,
            free,
            copy_blocks: copies,
            forks,
        })
    }

    /// Applies the outstanding step's results: every sequence in the step has
    /// its fed tokens counted as computed, and each sampled token of a live
    /// sequence is appended to it and returned (in plan order). A drafted
    /// sequence takes its results in order through the first that differs
    /// from its draft (see [`SeqStep::draft`]); the draft tokens they
    /// confirm count as computed, and the blocks taken for the rest go back.
    /// Results of removed sequences are dropped and their blocks freed. A
    /// `step_id` that is not the outstanding step's changes nothing and
    /// returns nothing.
    pub fn on_step_done(&mut self, done: &StepDone) -> Vec<SeqResult> {
        let Some(Outstanding { entries, holds, .. }) = self.take_outstanding(done.step_id) else {
            return Vec::new();
        };
        self.forget_removed(&entries);
        // The copies are done: their sources may be handed out again.
        for b in holds {
            self.alloc.release(b);
        }
        let mut out = Vec::new();
        for p in entries {
            let Some(s) = self.seqs.get_mut(&p.seq) else {
                continue;
            };
            s.num_computed += p.fed;
            if self.cfg.prefix_cache {
                register_full_blocks(s, &mut self.alloc, self.cfg.block_size);
            }
            if !p.sample {
                continue;
            }
            if !p.draft.is_empty() {
                let results = done.results.iter().filter(|r| r.seq == p.seq);
                let (taken, confirmed) = take_drafted(s, &p.draft, results, &mut out);
                let drafted = p.draft.len() as u32;
                s.draft_cap = if confirmed == drafted {
                    s.draft_cap
                        .max(drafted)
                        .saturating_mul(2)
                        .min(self.cfg.draft.max_tokens)
                } else {
                    confirmed + 1
                };
                if taken == 0 {
                    // As below: the last token is fed again.
                    s.num_computed -= 1;
                }
                let len = s.len();
                self.draft_tally.drafted += p.draft.len() as u32;
                self.draft_tally.confirmed += confirmed;
                // A constrained sequence is drafted for only while every
                // sample is free, so its tokens pass; should one not, none
                // of the step's tokens reach the client.
                if let Some(c) = &mut s.constraint {
                    let from = (s.sampling.generated_from as usize).min(s.tokens.len());
                    c.catch_up(&s.tokens[from..]);
                    if let Some(why) = c.failure() {
                        out.retain(|r: &SeqResult| r.seq != p.seq);
                        self.constraint_failures.push((p.seq, why.to_string()));
                    }
                }
                let keep = self.blocks_for(len + 1);
                self.trim_table(p.seq, keep);
                continue;
            }
            match done.results.iter().find(|r| r.seq == p.seq) {
                // A vector ends an embedding: no token joins the sequence.
                Some(r) if s.embed.is_some() && r.embedding.is_some() => out.push(r.clone()),
                Some(r) => {
                    s.tokens.push(r.token);
                    if let Some(c) = &mut s.constraint {
                        let from = (s.sampling.generated_from as usize).min(s.tokens.len());
                        c.catch_up(&s.tokens[from..]);
                        if let Some(why) = c.failure() {
                            self.constraint_failures.push((p.seq, why.to_string()));
                            continue;
                        }
                    }
                    out.push(r.clone());
                }
                // No token came back: feed the last token again next step so
                // the sequence is not left with nothing to compute.
                None => s.num_computed -= 1,
            }
        }
        self.ok_streak += 1;
        if self.ok_streak >= CAP_RESTORE_STEPS && self.seq_cap < self.cfg.max_running_seqs {
            self.seq_cap += 1;
            self.ok_streak = 0;
        }
        self.enforce_capacity();
        out
    }

    /// The outstanding step failed; nothing it computed counts.
    ///
    /// - `OutOfMemory`: the newest sequence of the step is preempted and the
    ///   seqs-per-step cap drops to half the step's size (growing back by one
    ///   every few successful steps). If the step had a single sequence, it
    ///   cannot run even alone: it is preempted, returned so the Host can
    ///   fail (and remove) it, and the cap is left as it was; unless that
    ///   sequence carried a draft, which it then never carries again, and
    ///   is planned again as it was.
    /// - `DeviceLost`: every block's contents are gone. All sequences holding
    ///   blocks go back to the front of the queue (oldest first) to be
    ///   recomputed, and the pool is reset.
    /// - `Internal`: the step is forgotten; the next plan retries its work.
    ///
    /// A `step_id` that is not the outstanding step's changes nothing.
    pub fn on_step_failed(&mut self, step_id: u64, kind: &EngineFaultKind) -> Vec<SeqId> {
        let Some(Outstanding {
            entries,
            free,
            copies,
            forks,
            holds,
            ..
        }) = self.take_outstanding(step_id)
        else {
            return Vec::new();
        };
        let later = std::mem::replace(&mut self.pending_forks, forks);
        self.pending_forks.extend(later);
        // Copies may not have been applied: they go first in the next plan,
        // their sources still held.
        let later = std::mem::replace(&mut self.pending_copies, copies);
        self.pending_copies.extend(later);
        let later = std::mem::replace(&mut self.copy_holds, holds);
        self.copy_holds.extend(later);
        self.ok_streak = 0;
        // Frees are idempotent; sending them again beats leaking engine state.
        let since = std::mem::replace(&mut self.pending_free, free);
        for id in since {
            if !self.pending_free.contains(&id) {
                self.pending_free.push(id);
            }
        }
        // Nothing was confirmed: the blocks taken for drafts go back.
        for p in entries.iter().filter(|p| !p.draft.is_empty()) {
            if let Some(len) = self.live(p.seq).map(Seq::len) {
                let keep = self.blocks_for(len + 1);
                self.trim_table(p.seq, keep);
            }
        }
        // The engine may not have taken the prefixes this plan carried.
        for p in entries.iter().filter(|p| p.sent_prefix) {
            if let Some(s) = self.seqs.get_mut(&p.seq) {
                s.send_prefix = s.num_computed > 0;
            }
        }
        // Only now: forgetting a sequence removed during the step drops the
        // copies into its blocks and the forks into it that were just put
        // back, with the holds on their sources.
        self.forget_removed(&entries);
        // A sequence outside the step may have gone while it was out, with
        // the blocks and the engine state that its copies and fork were to
        // fill: those are moot too.
        self.drop_orphaned_work();
        let mut failed = Vec::new();
        match kind {
            // A lone drafted sequence: its guesses' rows may be what did not
            // fit. It is not drafted for again, and runs again as it would
            // have without them.
            EngineFaultKind::OutOfMemory if entries.len() == 1 && !entries[0].draft.is_empty() => {
                if let Some(s) = self.seqs.get_mut(&entries[0].seq) {
                    s.draft_ok = false;
                }
            }
            EngineFaultKind::OutOfMemory => {
                let step_size = entries.len() as u32;
                // Removed seqs are already gone; the newest is last in `running`.
                let newest = self
                    .running
                    .iter()
                    .rev()
                    .copied()
                    .find(|id| entries.iter().any(|p| p.seq == *id));
                if let Some(victim) = newest {
                    self.preempt(victim);
                    if step_size == 1 {
                        failed.push(victim);
                    }
                }
                // A lone seq that does not fit says nothing about batch size.
                if step_size > 1 {
                    self.seq_cap = self.seq_cap.min(step_size / 2);
                }
            }
            EngineFaultKind::DeviceLost => {
                // Every block's contents are gone, so nothing is left to copy.
                self.pending_copies.clear();
                self.pending_forks.clear();
                self.copy_holds.clear();
                let lost = std::mem::take(&mut self.running);
                for &id in lost.iter().rev() {
                    if self.seqs.get(&id).is_some_and(|s| s.parked) {
                        self.forget(id);
                        continue;
                    }
                    if let Some(s) = self.seqs.get_mut(&id) {
                        s.blocks.clear();
                        s.num_computed = 0;
                        s.registered = 0;
                        s.send_prefix = false;
                        s.state = SeqState::Waiting;
                        self.waiting.push_front(id);
                    }
                }
                self.alloc.reset();
            }
            EngineFaultKind::Internal(_) => {}
        }
        self.enforce_capacity();
        failed
    }

    /// Changes the pool size (memory pressure, or its end). When the pool is
    /// over-full, non-runnable sequences lose their blocks first, then the
    /// newest running ones, until use fits; sequences in the outstanding step
    /// are left alone until it ends, so use can exceed the capacity until
    /// then. Block ids at or above the capacity are not handed out while it
    /// stays below them.
    pub fn set_capacity(&mut self, num_blocks: u32) {
        self.alloc.set_capacity(num_blocks);
        self.enforce_capacity();
    }

    /// Queue positions (1-based) of waiting sequences that have never been
    /// admitted, front first. A position counts the runnable sequences ahead
    /// (including preempted ones waiting to resume) plus one.
    pub fn waiting_positions(&self) -> Vec<(SeqId, u32)> {
        let mut ahead = 0;
        let mut out = Vec::new();
        for id in &self.waiting {
            let Some(s) = self.seqs.get(id) else {
                continue;
            };
            if !s.started {
                out.push((*id, ahead + 1));
            }
            if s.runnable {
                ahead += 1;
            }
        }
        out
    }

    /// True when `seq` is in the waiting queue (new, or preempted for recompute).
    #[cfg(test)]
    pub fn is_waiting(&self, seq: SeqId) -> bool {
        self.live(seq).is_some_and(|s| s.state == SeqState::Waiting)
    }

    /// True when `seq` has been admitted at least once.
    #[cfg(test)]
    pub fn has_started(&self, seq: SeqId) -> bool {
        self.live(seq).is_some_and(|s| s.started)
    }

    /// Prompt tokens whose K/V `seq` took from the prefix cache when it was
    /// first admitted (`None` while it has not been).
    pub fn cached_tokens(&self, seq: SeqId) -> Option<u32> {
        self.seqs.get(&seq).and_then(|s| s.first_cached)
    }

    /// The sequence's tokens: prompt, then every token generated so far.
    pub fn tokens(&self, seq: SeqId) -> Option<&[TokenId]> {
        self.live(seq).map(|s| s.tokens.as_slice())
    }

    /// The sequence's KV blocks (empty while waiting).
    #[cfg(test)]
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.live(seq).map(|s| s.blocks.as_slice())
    }

    /// True for a sequence added and not removed.
    #[cfg(test)]
    pub fn contains(&self, seq: SeqId) -> bool {
        self.live(seq).is_some()
    }

    /// Sequences in the admission queue (paused ones included): an O(1)
    /// upper bound of [`SchedStats::waiting`] for checks on every request.
    pub fn queue_len(&self) -> u32 {
        u32::try_from(self.waiting.len()).unwrap_or(u32::MAX)
    }

    /// True while a planned step awaits its result.
    pub fn step_outstanding(&self) -> bool {
        self.outstanding.is_some()
    }

    /// True when `step_id` is the step awaiting its result: results and
    /// faults for any other id change nothing.
    pub fn is_outstanding(&self, step_id: u64) -> bool {
        self.outstanding
            .as_ref()
            .is_some_and(|o| o.step_id == step_id)
    }

    /// Current adaptive limit on sequences per step (lowered by out-of-memory
    /// steps, at most `max_running_seqs`).
    #[cfg(test)]
    pub fn seq_cap(&self) -> u32 {
        self.seq_cap
    }

    /// Current gauges.
    pub fn stats(&self) -> SchedStats {
        let mut st = SchedStats {
            blocks_used: self.alloc.used(),
            blocks_total: self.alloc.capacity(),
            blocks_cached: self.alloc.cached(),
            ..SchedStats::default()
        };
        // Blocks whose every holder is a parked sequence (shared prefixes
        // included): what memory pressure frees first.
        let mut parked_holds: BTreeMap<BlockId, u32> = BTreeMap::new();
        for s in self.seqs.values() {
            if s.parked && s.state != SeqState::Removed {
                st.parked += 1;
                for &b in &s.blocks {
                    *parked_holds.entry(b).or_default() += 1;
                }
                continue;
            }
            match (s.state, s.runnable) {
                (SeqState::Removed, _) => {}
                (_, false) => st.paused += 1,
                (SeqState::Waiting, true) => st.waiting += 1,
                (SeqState::Running, true) => st.running += 1,
            }
        }
        st.blocks_parked = parked_holds
            .iter()
            .filter(|&(&b, &n)| self.alloc.refcount(b) == n)
            .count() as u32;
        st
    }

    fn blocks_for(&self, positions: u32) -> u32 {
        positions.div_ceil(self.cfg.block_size)
    }

    fn step_seq_limit(&self) -> u32 {
        // Decodes alone must never use the whole token budget.
        self.seq_cap
            .min(self.cfg.max_running_seqs)
            .min(self.cfg.max_step_tokens)
    }

    fn live(&self, seq: SeqId) -> Option<&Seq> {
        self.seqs.get(&seq).filter(|s| s.state != SeqState::Removed)
    }

    fn live_mut(&mut self, seq: SeqId) -> Option<&mut Seq> {
        self.seqs
            .get_mut(&seq)
            .filter(|s| s.state != SeqState::Removed)
    }

    fn in_outstanding(&self, seq: SeqId) -> bool {
        self.outstanding
            .as_ref()
            .is_some_and(|o| o.entries.iter().any(|p| p.seq == seq))
    }

    /// Ends the outstanding step if `step_id` is its id and returns it
    /// (entries of sequences removed during it included, so callers know the
    /// step's size). Sequences removed during it are still held: the caller
    /// lets them go with [`Scheduler::forget_removed`] once whatever the step
    /// planned for them (copies into their blocks, forks into them) is back
    /// in the pending lists, so that forgetting them drops it too.
    fn take_outstanding(&mut self, step_id: u64) -> Option<Outstanding> {
        if !self.is_outstanding(step_id) {
            return None;
        }
        self.outstanding.take()
    }

    /// Forgets the sequences of `entries` that were removed while their
    /// step was outstanding.
    fn forget_removed(&mut self, entries: &[Planned]) {
        for p in entries {
            if self
                .seqs
                .get(&p.seq)
                .is_some_and(|s| s.state == SeqState::Removed)
            {
                self.forget(p.seq);
            }
        }
    }

    /// Drops a sequence that is in no queue: its blocks go back to the pool
    /// and the engine is told to forget it.
    fn forget(&mut self, seq: SeqId) {
        let Some(mut s) = self.seqs.remove(&seq) else {
            return;
        };
        // Draft tokens a step confirmed are registered when the sequence is
        // next planned: one that ends first offers them now.
        if self.cfg.prefix_cache && s.state != SeqState::Waiting {
            register_full_blocks(&mut s, &mut self.alloc, self.cfg.block_size);
        }
        // A fork not yet sent to the engine is moot now.
        self.pending_forks.retain(|f| f.dst != seq);
        self.drop_copies_into(&s.blocks);
        for &b in &s.blocks {
            self.alloc.release(b);
        }
        if s.seen_by_engine && !self.pending_free.contains(&seq) {
            self.pending_free.push(seq);
        }
    }

    /// Drops pending copies into `blocks` (their sequence lost them) and lets
    /// go of the holds on their sources.
    fn drop_copies_into(&mut self, blocks: &[BlockId]) {
        let (moot, keep): (Vec<_>, Vec<_>) = self
            .pending_copies
            .iter()
            .partition(|(_, dst)| blocks.contains(dst));
        self.pending_copies = keep;
        for (src, _) in moot {
            if let Some(i) = self.copy_holds.iter().position(|&h| h == src) {
                self.copy_holds.swap_remove(i);
                self.alloc.release(src);
            }
        }
    }

    /// Drops pending copies into blocks no live sequence holds, releasing
    /// the holds on their sources, and pending forks into sequences that are
    /// gone.
    fn drop_orphaned_work(&mut self) {
        let held: BTreeSet<BlockId> = self
            .seqs
            .values()
            .flat_map(|s| s.blocks.iter().copied())
            .collect();
        let orphans: Vec<BlockId> = self
            .pending_copies
            .iter()
            .map(|&(_, dst)| dst)
            .filter(|dst| !held.contains(dst))
            .collect();
        self.drop_copies_into(&orphans);
        let seqs = &self.seqs;
        self.pending_forks.retain(|f| seqs.contains_key(&f.dst));
    }

    /// Takes a running sequence's blocks and puts it at the front of the
    /// queue, to be recomputed from its tokens when admitted again.
    fn preempt(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        if s.state != SeqState::Running {
            return;
        }
        if s.parked {
            // A kept cache entry: its owner recomputes from token ids.
            self.running.retain(|&r| r != seq);
            self.forget(seq);
            return;
        }
        if self.cfg.prefix_cache {
            // As in `forget`: what confirmed drafts computed stays cached.
            register_full_blocks(s, &mut self.alloc, self.cfg.block_size);
        }
        let blocks = std::mem::take(&mut s.blocks);
        s.num_computed = 0;
        s.registered = 0;
        s.send_prefix = false;
        s.state = SeqState::Waiting;
        // It is recomputed from its tokens: a copy into its blocks is moot.
        self.drop_copies_into(&blocks);
        for &b in &blocks {
            self.alloc.release(b);
        }
        self.running.retain(|&r| r != seq);
        self.waiting.push_front(seq);
    }

    /// The first non-runnable sequence to lose its blocks among those `spare`
    /// allows: a parked one (least recently parked first), else the newest
    /// non-runnable one.
    fn idle_victim(&self, spare: impl Fn(&SeqId) -> bool) -> Option<SeqId> {
        let is = |id: &SeqId, parked: bool| {
            spare(id)
                && self
                    .seqs
                    .get(id)
                    .is_some_and(|s| !s.runnable && s.parked == parked)
        };
        let parked = self.running.iter().find(|id| is(id, true));
        parked
            .or_else(|| self.running.iter().rev().find(|id| is(id, false)))
            .copied()
    }

    /// Preempts until use fits the capacity, sparing the outstanding step.
    fn enforce_capacity(&mut self) {
        while self.alloc.used() > self.alloc.capacity() {
            let spare = |s: &Self, id: &SeqId| !s.in_outstanding(*id);
            let paused = self.idle_victim(|id| spare(self, id));
            let victim = paused.or_else(|| {
                self.running
                    .iter()
                    .rev()
                    .find(|id| spare(self, id))
                    .copied()
            });
            match victim {
                Some(v) => self.preempt(v),
                // Everything left is in the outstanding step: finish after it.
                None => break,
            }
        }
    }

    /// Running, runnable sequences with one token left to feed: the next
    /// step's decodes.
    fn decoders(&self) -> u32 {
        self.running
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|s| s.state == SeqState::Running && s.runnable && s.remaining() == 1)
            .count() as u32
    }

    /// The draft for decoding `seq` this step (see [`draft::lookup`]), at
    /// most `budget` tokens, none past its longest length, and only as many
    /// as the blocks it holds and the free ones cover: a guess never takes a
    /// block from another sequence or from the prefix cache. The blocks it
    /// needs are added to its table.
    fn take_draft(&mut self, seq: SeqId, budget: u32) -> Vec<TokenId> {
        let bs = self.cfg.block_size;
        let free = self.alloc.available().saturating_sub(self.alloc.cached());
        // A constraint lets a draft through only as far as every sample of
        // the step may be any token (a reasoning budget not yet spent): the
        // step then carries no mask, and what it confirms is allowed.
        let free_run = match self.seqs.get_mut(&seq) {
            Some(s) => match &mut s.constraint {
                Some(c) => {
                    let from = (s.sampling.generated_from as usize).min(s.tokens.len());
                    c.free_tokens(&s.tokens[from..])
                }
                None => u32::MAX,
            },
            None => return Vec::new(),
        };
        let Some(s) = self.seqs.get(&seq) else {
            return Vec::new();
        };
        if !s.draft_ok || s.embed.is_some() || s.scores_prompt() {
            return Vec::new();
        }
        let covered = (s.blocks.len() as u32 + free).saturating_mul(bs);
        // The step yields up to one token more than it confirms.
        let room = s
            .max_len
            .saturating_sub(s.len() + 1)
            .min(covered.saturating_sub(s.num_computed + 1))
            .min(budget)
            .min(match s.draft_cap {
                0 => self.cfg.draft.max_tokens,
                cap => cap.min(self.cfg.draft.max_tokens),
            })
            .min(free_run.saturating_sub(1));
        let mut draft = draft::lookup(&s.tokens, &self.cfg.draft, room as usize).to_vec();
        let computed = s.num_computed;
        let need = self.blocks_for(computed + 1 + draft.len() as u32);
        let have = s.blocks.len() as u32;
        for _ in have..need {
            // Counted above; should no block come, the draft ends where
            // the table does.
            let Some(b) = self.alloc.allocate() else {
                break;
            };
            if let Some(s) = self.seqs.get_mut(&seq) {
                s.blocks.push(b);
            }
        }
        let held = self.seqs.get(&seq).map_or(0, |s| s.blocks.len() as u32);
        draft.truncate((held * self.cfg.block_size).saturating_sub(computed + 1) as usize);
        draft
    }

    /// Lets go of the blocks of `seq`'s table past its first `keep`.
    fn trim_table(&mut self, seq: SeqId, keep: u32) {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        if s.blocks.len() as u32 <= keep {
            return;
        }
        let extra = s.blocks.split_off(keep as usize);
        self.drop_copies_into(&extra);
        for b in extra {
            self.alloc.release(b);
        }
    }

    /// Makes the table of running `seq` cover `positions` positions, taking
    /// blocks from others if needed. False when `seq` itself had to be
    /// preempted (it is then waiting).
    fn grow_table(&mut self, seq: SeqId, positions: u32, in_plan: &BTreeSet<SeqId>) -> bool {
        let need = self.blocks_for(positions);
        let have = self.seqs.get(&seq).map_or(0, |s| s.blocks.len() as u32);
        if need <= have {
            return true;
        }
        if need > self.alloc.capacity() {
            // Not even the whole pool would do: don't preempt others for it.
            self.preempt(seq);
            return false;
        }
        if !self.make_room(seq, need - have, in_plan) {
            return false;
        }
        for _ in have..need {
            let Some(b) = self.alloc.allocate() else {
                self.preempt(seq);
                return false;
            };
            if let Some(s) = self.seqs.get_mut(&seq) {
                s.blocks.push(b);
            }
        }
        true
    }

    /// Frees blocks until `n` are available: non-runnable sequences first,
    /// then the newest running sequence not yet in this plan, which may be
    /// `seq` itself (then false).
    fn make_room(&mut self, seq: SeqId, n: u32, in_plan: &BTreeSet<SeqId>) -> bool {
        while self.alloc.available() < n {
            let paused = self.idle_victim(|_| true);
            let victim = paused.or_else(|| {
                self.running
                    .iter()
                    .rev()
                    .find(|id| !in_plan.contains(id))
                    .copied()
            });
            let Some(victim) = victim else {
                return false;
            };
            self.preempt(victim);
            if victim == seq {
                return false;
            }
        }
        true
    }

    /// Evicts non-runnable sequences until waiting `id` has the `reserve`
    /// blocks it is admitted with; false, evicting no one, if even all of
    /// them would not do (the queue then waits). A cached block it starts
    /// from, taken back, uses an available block as a fresh one does;
    /// sharing a held one does not. Evicting the only holders of a block it
    /// starts from turns that block from shared into cached, so what it
    /// needs is counted again after each eviction (counting once, before,
    /// left it a block short), and whether all of them would do counts such
    /// blocks as taken back.
    fn make_room_to_admit(&mut self, id: SeqId, reserve: u32) -> bool {
        let idle_only = self.blocks_only_idle_seqs_hold();
        let hits = self.prefix_hits(id);
        let taken_back = hits
            .iter()
            .filter(|&b| self.alloc.is_cached(*b) || idle_only.contains(b))
            .count() as u32;
        let most = reserve - hits.len() as u32 + taken_back;
        if self.alloc.available() + (idle_only.len() as u32) < most {
            return false;
        }
        loop {
            let hits = self.prefix_hits(id);
            let revived = hits.iter().filter(|&&b| self.alloc.is_cached(b)).count() as u32;
            let need = reserve - hits.len() as u32 + revived;
            if self.alloc.available() >= need {
                return true;
            }
            match self.idle_victim(|_| true) {
                Some(v) => self.preempt(v),
                None => return false,
            }
        }
    }

    /// Blocks that come free once every non-runnable sequence is evicted:
    /// those whose every holder is one (or a pending copy into one's
    /// block), shared among them or not (a fork's or a continuation's shared
    /// prefix counted only one holder's, and the head of the queue then
    /// waited for blocks it could have had, with the engine idle).
    fn blocks_only_idle_seqs_hold(&self) -> BTreeSet<BlockId> {
        let mut idle_holders: BTreeMap<BlockId, u32> = BTreeMap::new();
        let mut idle_blocks: BTreeSet<BlockId> = BTreeSet::new();
        for s in self.running.iter().filter_map(|id| self.seqs.get(id)) {
            if !s.runnable {
                for &b in &s.blocks {
                    *idle_holders.entry(b).or_default() += 1;
                    idle_blocks.insert(b);
                }
            }
        }
        // A pending copy into an idle sequence's block holds its source
        // until the next plan; evicting that sequence drops the copy and
        // the hold (counting only the sequences' own blocks left a fork's
        // copy source held, and the head of the queue waited for it with
        // the engine idle).
        for &(src, dst) in &self.pending_copies {
            if idle_blocks.contains(&dst) {
                *idle_holders.entry(src).or_default() += 1;
            }
        }
        idle_holders
            .into_iter()
            .filter(|&(b, n)| self.alloc.refcount(b) == n)
            .map(|(b, _)| b)
            .collect()
    }

    /// The cached blocks its prompt can start from: the longest run of its
    /// leading full blocks whose content is registered, leaving at least
    /// its last token to compute (a step must feed something to sample).
    fn prefix_hits(&mut self, id: SeqId) -> Vec<BlockId> {
        if !self.cfg.prefix_cache {
            return Vec::new();
        }
        let bs = self.cfg.block_size as usize;
        let Some(s) = self.seqs.get_mut(&id) else {
            return Vec::new();
        };
        if s.embed.is_some() || s.prompt_logprobs.is_some() {
            // Mean pooling needs every token's hidden state, and scoring
            // every token's logits: the engine sees them from position 0.
            return Vec::new();
        }
        let most = (s.tokens.len().saturating_sub(1)) / bs;
        let mut hits = Vec::new();
        for i in 0..most {
            let Some(key) = s.key(i, bs) else { break };
            match self.alloc.lookup(&key) {
                Some(b) => hits.push(b),
                None => break,
            }
        }
        hits
    }

    /// Admits waiting sequences in FIFO order while the step has room.
    fn admit(
        &mut self,
        planned: &mut Vec<Planned>,
        in_plan: &mut BTreeSet<SeqId>,
        budget: &mut u32,
        scored: &mut u32,
        limit: u32,
    ) {
        let mut idx = 0;
        while idx < self.waiting.len() {
            if planned.len() as u32 >= limit || *budget == 0 {
                break;
            }
            let id = self.waiting[idx];
            let Some(s) = self.seqs.get(&id) else {
                idx += 1;
                continue;
            };
            if !s.runnable {
                idx += 1;
                continue;
            }
            if scored_cap(s, s.remaining(), *scored) == 0 {
                // A scored prompt waits for a step with rows to spare, in
                // its turn.
                break;
            }
            // Room for every known token and the next one's position.
            let reserve = self.blocks_for((s.len() + 1).min(s.max_len.max(s.len())));
            if reserve > self.alloc.capacity() {
                // Cannot fit until the pool grows back; holding the queue
                // behind it would stall everyone for that long.
                idx += 1;
                continue;
            }
            if !self.make_room_to_admit(id, reserve) {
                // FIFO: nobody overtakes the head for lack of blocks.
                break;
            }
            // Evicted sequences were pushed to the front: find ours again.
            let Some(pos) = self.waiting.iter().position(|&w| w == id) else {
                break;
            };
            self.waiting.remove(pos);
            idx = pos;
            // Taken before anything is allocated, so no allocation evicts them.
            let hits = self.prefix_hits(id);
            for &b in &hits {
                self.alloc.acquire(b);
            }
            let mut blocks = hits.clone();
            for _ in hits.len() as u32..reserve {
                match self.alloc.allocate() {
                    Some(b) => blocks.push(b),
                    None => break,
                }
            }
            let Some(s) = self.seqs.get_mut(&id) else {
                continue;
            };
            if blocks.len() as u32 != reserve {
                // Cannot happen (room was made above); undo rather than panic.
                for b in blocks {
                    self.alloc.release(b);
                }
                self.waiting.insert(pos, id);
                break;
            }
            let cached = hits.len() as u32 * self.cfg.block_size;
            s.blocks = blocks;
            s.num_computed = cached;
            s.registered = hits.len();
            s.send_prefix = cached > 0;
            s.first_cached.get_or_insert(cached);
            s.state = SeqState::Running;
            s.started = true;
            self.running.push(id);
            let remaining = s.remaining();
            let fed = remaining
                .min(*budget)
                .min(scored_cap(s, remaining, *scored));
            *scored -= scored_rows(s, fed, remaining);
            planned.push(Planned {
                seq: id,
                fed,
                sample: fed == remaining,
                sent_prefix: false,
                decode: false,
                draft: Vec::new(),
            });
            in_plan.insert(id);
            *budget -= fed;
        }
    }
}

/// How many of `s`'s `remaining` tokens one step may feed with `scored`
/// scoring rows left: all of them for a sequence not scoring its prompt;
/// else as many rows as are left, and one more (the prompt's last token,
/// whose row is the sample's) when that ends the prompt.
fn scored_cap(s: &Seq, remaining: u32, scored: u32) -> u32 {
    if !s.scores_prompt() || remaining <= scored.saturating_add(1) {
        remaining
    } else {
        scored
    }
}

/// The scoring rows feeding `fed` of `s`'s `remaining` tokens takes.
fn scored_rows(s: &Seq, fed: u32, remaining: u32) -> u32 {
    match (s.scores_prompt(), fed == remaining) {
        (false, _) => 0,
        (true, true) => fed.saturating_sub(1),
        (true, false) => fed,
    }
}

/// Appends the results of drafted `s` (see [`SeqStep::draft`]) to its
/// tokens and to `out`, in order: each result after the first confirms the
/// draft token before it, and is taken only if the result before it was that
/// token (so an engine that ignored the draft, returning one result, is
/// taken as having confirmed none). Returns how many it took and how many
/// draft tokens they confirmed, which now count as computed (the step fed
/// them).
fn take_drafted<'r>(
    s: &mut Seq,
    draft: &[TokenId],
    results: impl Iterator<Item = &'r SeqResult>,
    out: &mut Vec<SeqResult>,
) -> (u32, u32) {
    let mut taken = 0u32;
    let mut last: Option<TokenId> = None;
    for r in results {
        if let Some(prev) = last {
            if draft.get(taken as usize - 1) != Some(&prev) {
                break;
            }
        }
        s.tokens.push(r.token);
        out.push(r.clone());
        taken += 1;
        last = Some(r.token);
    }
    let confirmed = taken.saturating_sub(1);
    s.num_computed += confirmed;
    (taken, confirmed)
}

/// Offers `s`'s newly computed full blocks to the prefix cache (a block
/// whose content another block holds already stays unregistered).
fn register_full_blocks(s: &mut Seq, alloc: &mut BlockAllocator, block_size: u32) {
    let bs = block_size as usize;
    let full = (s.num_computed / block_size) as usize;
    while s.registered < full.min(s.blocks.len()) {
        let i = s.registered;
        let Some(key) = s.key(i, bs) else { break };
        alloc.register(s.blocks[i], key);
        s.registered += 1;
    }
}
