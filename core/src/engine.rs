//! The engine boundary: what the core asks the model engine to compute, and what
//! comes back.
//!
//! The scheduler in the core decides everything about memory (which sequences
//! run, which KV blocks they use); the engine only computes. At most one step is
//! outstanding at a time: the Host emits [`crate::Output::RunStep`] and waits for
//! [`crate::Input::StepDone`] or [`crate::Input::EngineFault`].

/// Identifies one sequence (one generation) for the engine and the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

/// Index of one block of the paged KV cache (block size tokens per block).
pub type BlockId = u32;

/// Token id in the model's vocabulary.
pub type TokenId = u32;

/// OpenAI's `logit_bias` of one request: `(token, bias)` pairs (the chat
/// codec makes the ids distinct; of an id named twice the samplers take
/// the first pair). Cheap to clone (shared).
pub type LogitBias = std::sync::Arc<[(TokenId, f32)]>;

/// How the next token is picked from the logits. One validated set per sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 = off.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: u32,
    /// Min-p: after temperature, keep only the tokens whose probability is
    /// at least `min_p` times the most likely one's (before top-k and
    /// top-p, as vLLM); 0 = off, at most 1.
    pub min_p: f32,
    /// Hugging Face (CTRL) repetition penalty; 1 = off.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty: subtracted once from the logit of every
    /// token generated so far; 0 = off.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted from a token's logit once for
    /// every time it was generated so far; 0 = off.
    pub frequency_penalty: f32,
    /// Where the generated tokens start in the sequence's history (its
    /// prompt's length): the presence and frequency penalties count only
    /// what comes after.
    pub generated_from: u32,
    /// OpenAI `logit_bias`: `(token, bias)` pairs, each finite bias added
    /// to its token's logit before any penalty (as vLLM and
    /// llama.cpp apply it). Shared, so cloning the parameters for every
    /// step copies no list. Empty = off.
    pub logit_bias: LogitBias,
    /// vLLM's `min_tokens`: while fewer tokens than this have been
    /// generated (the history past `generated_from`), the ids of
    /// `stop_ids` are not sampled, as if their logits were -inf (after a
    /// structured-output mask, before everything else). 0 = off.
    pub min_tokens: u32,
    /// The ids `min_tokens` holds back: the model's end-of-sequence tokens.
    pub stop_ids: std::sync::Arc<[TokenId]>,
    /// Seed of this sequence's sampler; the draw at each position is a pure
    /// function of (seed, position, logits).
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            generated_from: 0,
            logit_bias: LogitBias::default(),
            min_tokens: 0,
            stop_ids: Default::default(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// How an embedding sequence's final hidden states (after the model's last
/// norm) become its one vector ([`SeqStep::embed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// The hidden state of the last token (decoder embedding models:
    /// Qwen3-Embedding, e5-mistral, gte-Qwen2).
    Last,
    /// The mean of every token's hidden state.
    Mean,
}

impl Pooling {
    /// Its name in flags and docs (`last`, `mean`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Last => "last",
            Pooling::Mean => "mean",
        }
    }
}

/// One sequence's share of a step: feed `tokens` at positions
/// `start_pos..start_pos + tokens.len()`, writing their K/V into the blocks of
/// `block_table`; if `sample` is set, sample the next token from the logits of
/// the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqStep {
    /// The sequence.
    pub seq: SeqId,
    /// Tokens to feed (a prefill chunk, or the one newest token when decoding).
    pub tokens: Vec<TokenId>,
    /// Position of `tokens[0]` in the sequence.
    pub start_pos: u32,
    /// The sequence's KV blocks, in order; covers at least `start_pos + tokens.len()` positions.
    pub block_table: Vec<BlockId>,
    /// Sampling parameters for the token sampled after this chunk.
    pub sampling: SamplingParams,
    /// True when this chunk reaches the end of the known tokens, so a next token
    /// is sampled and a [`SeqResult`] comes back. False for a middle prefill chunk.
    pub sample: bool,
    /// Number of top alternatives to report with logprobs; `None` = no logprobs.
    pub logprobs: Option<u8>,
    /// The tokens before `start_pos` when the engine may not hold them for
    /// this sequence: set on its first plan after it was admitted onto KV
    /// blocks computed for earlier sequences (prefix caching). Their K/V is
    /// in `block_table`'s blocks already; the engine takes them as the
    /// sequence's token history (the sampler's penalties read it). Empty
    /// otherwise.
    pub cached_prefix: Vec<TokenId>,
    /// With `sample` set on a constrained sequence (structured output): the
    /// only tokens the sampler may pick. The engine applies it before
    /// anything else (penalties, temperature, top-k/top-p, logprobs), as if
    /// every other token's logit were -inf. `None`: any token.
    pub allowed: Option<std::sync::Arc<crate::constraint::TokenMask>>,
    /// With `sample` set: tokens guessed to follow `tokens` (speculative
    /// decoding by prompt lookup, [`crate::DraftConfig`]), fed after them at the
    /// next positions in the same step. The engine samples after `tokens`
    /// and after each draft token (each draw as if the tokens before it were
    /// the sequence's history) and returns those tokens in order, through
    /// the first that differs from the draft token at its position: between
    /// one (the first draft token refused) and `draft.len() + 1` (all of them
    /// kept, then the next). K/V written for refused draft tokens is never
    /// read before their positions are written again. An engine may ignore
    /// the draft (one result, as without it). Empty: no draft. Never set on
    /// a constrained sequence (`allowed`).
    pub draft: Vec<TokenId>,
    /// An embedding sequence: nothing is sampled; the step whose chunk
    /// reaches the prompt's end (`sample` set) returns its pooled vector
    /// ([`SeqResult::embedding`]). Its chunks come in position order from
    /// position 0 (never a cached prefix, never a draft), so an engine
    /// that pools by [`Pooling::Mean`] sums every chunk's hidden states; a
    /// chunk fed again (after a failed step, or from 0 after a preemption)
    /// replaces what was pooled from its position on.
    pub embed: Option<Pooling>,
    /// Prompt logprobs (Completions' `echo` with `logprobs`): with
    /// `Some(k)`, the engine scores this chunk's tokens, each by its
    /// log-probability given the tokens before it, with the `k` most
    /// likely tokens at its position, as the model computed them (no
    /// penalty, bias, mask or temperature). Its chunks come in position
    /// order from position 0 (never a cached prefix, a draft or an
    /// embedding); a chunk fed again (after a failed step, or from 0 after
    /// a preemption) replaces what was scored from its position on. The
    /// step whose chunk reaches the prompt's end (`sample` set) returns
    /// them all in [`SeqResult::prompt_logprobs`]. `None`: no scoring.
    pub prompt_logprobs: Option<u8>,
}

/// A sequence started as a copy of another (a beam continuing another): the
/// engine gives `dst` the first `len` tokens `src` holds (its sampler
/// history), as if `dst` had been fed them; their K/V is in `dst`'s blocks
/// (shared, or copied by the plan's `copy_blocks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fork {
    /// The sequence copied.
    pub src: SeqId,
    /// The new sequence.
    pub dst: SeqId,
    /// Tokens of `src` that `dst` holds.
    pub len: u32,
}

/// One batched forward step for the engine.
///
/// The engine applies `forks` (a fork whose `dst` it already holds is a
/// no-op, since a failed step's forks are sent again), then `free`
/// (dropping any per-sequence state; an unknown sequence is a no-op, since a
/// failed step's frees are sent again) and then `copy_blocks`, before
/// computing `seqs`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepPlan {
    /// Increasing id, echoed in [`StepDone`] / [`EngineFault`].
    pub step_id: u64,
    /// Sequences computed in this step, all in one batch.
    pub seqs: Vec<SeqStep>,
    /// Sequences that are gone: the engine drops any per-sequence state it keeps.
    pub free: Vec<SeqId>,
    /// KV blocks to copy before computing, `(src, dst)` (copy-on-write).
    pub copy_blocks: Vec<(BlockId, BlockId)>,
    /// Sequences started as copies of others, applied first.
    pub forks: Vec<Fork>,
}

/// Log-probabilities of a sampled token and its top alternatives.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenLogprobs {
    /// Log-probability of the chosen token.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, best first.
    pub top: Vec<(TokenId, f32)>,
}

/// The token sampled for one sequence in a step.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqResult {
    /// The sequence.
    pub seq: SeqId,
    /// The sampled token.
    pub token: TokenId,
    /// Present when the step asked for logprobs.
    pub logprobs: Option<TokenLogprobs>,
    /// An embedding sequence's ([`SeqStep::embed`]) pooled vector, not
    /// normalized, one value per hidden dimension; `token` then means
    /// nothing (0) and is not added to the sequence.
    pub embedding: Option<Vec<f32>>,
    /// With [`SeqStep::prompt_logprobs`], on the result that ends the
    /// prompt: one entry per prompt token after the first (the first has
    /// nothing before it to be scored by), in position order.
    pub prompt_logprobs: Option<Vec<TokenLogprobs>>,
}

/// The engine's answer to a [`StepPlan`]: one result per [`SeqStep`] with
/// `sample` set, in plan order; a step with a [`SeqStep::draft`] has one or
/// more, consecutive, in position order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepDone {
    /// The plan's `step_id`.
    pub step_id: u64,
    /// Sampled tokens.
    pub results: Vec<SeqResult>,
}

/// Why a step failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineFaultKind {
    /// The step needed more device memory than there was.
    OutOfMemory,
    /// The device is gone; its KV cache with it.
    DeviceLost,
    /// Anything else; the text is for operators (never client content).
    Internal(String),
}

/// A step that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineFault {
    /// The plan's `step_id`.
    pub step_id: u64,
    /// What went wrong.
    pub kind: EngineFaultKind,
}

/// What the core needs to know about the served model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// Name clients use for it (`model` fields).
    pub name: String,
    /// Version string reported in `init.model_info.version`.
    pub version: String,
    /// Context window in tokens.
    pub context_len: u32,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// Token ids that end a generation (from `generation_config.json`).
    pub eos_ids: Vec<TokenId>,
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV blocks in the pool.
    pub num_blocks: u32,
    /// Weight dtype as reported to clients (`f32`, `f16`, `bf16`, ...).
    pub dtype: String,
    /// Values in an embedding ([`SeqStep::embed`]): the model's hidden size.
    pub embedding_size: u32,
    /// The pooling the model declares for its embeddings (a
    /// sentence-transformers Pooling module, a GGUF `pooling_type`), when
    /// it is one the engine computes; `None` otherwise.
    pub pooling: Option<Pooling>,
}
