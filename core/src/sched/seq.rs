//! One sequence as the scheduler sees it.

use super::blocks::{block_key, BlockKey};
use super::constrained::SeqConstraint;
use crate::engine::{BlockId, Pooling, SamplingParams, TokenId};

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeqState {
    /// In the waiting queue, holding no blocks.
    Waiting,
    /// Admitted: holds blocks for its tokens (runnable or not).
    Running,
    /// Removed while in the outstanding step: its blocks stay with the engine
    /// until that step ends, then go back to the pool.
    Removed,
}

/// Tokens, cache progress and blocks of one sequence.
#[derive(Debug, Clone)]
pub(crate) struct Seq {
    /// Prompt then generated tokens.
    pub tokens: Vec<TokenId>,
    /// Longest the sequence may grow (prompt + max tokens).
    pub max_len: u32,
    /// Leading tokens whose K/V is in the cache.
    pub num_computed: u32,
    /// KV blocks, in position order.
    pub blocks: Vec<BlockId>,
    pub state: SeqState,
    pub runnable: bool,
    /// Admitted at least once.
    pub started: bool,
    /// Appeared in a plan, so the engine may hold state for it.
    pub seen_by_engine: bool,
    pub sampling: SamplingParams,
    pub logprobs: Option<u8>,
    /// Finished, its KV blocks kept for a continuation (never runnable; the
    /// first to go under memory pressure, and then forgotten, not queued).
    pub parked: bool,
    /// Content keys of its leading full blocks of tokens, as far as computed
    /// ([`Seq::key`]): they depend on tokens only, so they stay valid when it
    /// loses its blocks.
    pub keys: Vec<BlockKey>,
    /// Leading blocks of its table offered to the prefix cache.
    pub registered: usize,
    /// Its next plan must carry the tokens before its start (it was admitted
    /// onto cached blocks the engine never saw it feed).
    pub send_prefix: bool,
    /// Prompt tokens whose K/V came from the prefix cache at its first
    /// admission (`None` before it).
    pub first_cached: Option<u32>,
    /// Its grammar, when its output is constrained (structured output).
    pub constraint: Option<SeqConstraint>,
    /// It may be drafted for ([`super::Scheduler::allow_draft`]).
    pub draft_ok: bool,
    /// Most draft tokens its next draft may have: all its last draft's
    /// confirmed doubles it (up to the configured most), a refused token
    /// brings it to one past what was confirmed. A guess costs the engine a
    /// row whether or not it is kept, so text that does not repeat its
    /// prompt soon drafts one token at a time. 0: not drafted yet.
    pub draft_cap: u32,
    /// An embedding sequence: computed from position 0 (no cached prefix,
    /// no draft) and answered with its pooled vector, not a token.
    pub embed: Option<Pooling>,
    /// Score its prompt ([`crate::engine::SeqStep::prompt_logprobs`]): set
    /// on its plans until it has a generated token; computed from position
    /// 0 (no cached prefix).
    pub prompt_logprobs: Option<u8>,
}

impl Seq {
    pub fn new(
        tokens: Vec<TokenId>,
        max_len: u32,
        sampling: SamplingParams,
        logprobs: Option<u8>,
    ) -> Self {
        Seq {
            tokens,
            max_len,
            num_computed: 0,
            blocks: Vec::new(),
            state: SeqState::Waiting,
            runnable: true,
            started: false,
            seen_by_engine: false,
            embed: None,
            prompt_logprobs: None,
            sampling,
            logprobs,
            parked: false,
            keys: Vec::new(),
            registered: 0,
            send_prefix: false,
            first_cached: None,
            constraint: None,
            draft_ok: false,
            draft_cap: 0,
        }
    }

    /// The content key of its full block `i` (tokens `i*bs..(i+1)*bs`), or
    /// `None` when its tokens do not fill that block.
    pub fn key(&mut self, i: usize, bs: usize) -> Option<BlockKey> {
        while self.keys.len() <= i {
            let j = self.keys.len();
            let tokens = self.tokens.get(j * bs..(j + 1) * bs)?;
            let k = block_key(self.keys.last(), tokens);
            self.keys.push(k);
        }
        self.keys.get(i).copied()
    }

    pub fn len(&self) -> u32 {
        self.tokens.len() as u32
    }

    /// It scores its prompt now: asked to, and without a generated token.
    pub fn scores_prompt(&self) -> bool {
        self.prompt_logprobs.is_some() && self.generated().is_empty()
    }

    /// The tokens it generated (after `sampling.generated_from`).
    pub fn generated(&self) -> &[TokenId] {
        let from = (self.sampling.generated_from as usize).min(self.tokens.len());
        &self.tokens[from..]
    }

    /// Tokens still to feed before the next sample.
    pub fn remaining(&self) -> u32 {
        self.len().saturating_sub(self.num_computed)
    }
}
