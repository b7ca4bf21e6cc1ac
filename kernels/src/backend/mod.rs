//! The compute seam: a [`Backend`] runs one batched forward pass over its
//! paged KV cache. Two backends: the CPU reference ([`CpuBackend`]) and
//! hand-written WGSL kernels on wgpu ([`WgpuBackend`]).

pub mod cpu;
pub mod wgpu;

use tokenwire_core::{
    BlockId, EngineFaultKind, Pooling, SamplingParams, TokenId, TokenLogprobs, TokenMask,
};

use crate::kv::KvGeometry;
use crate::sampler::Sampler;

pub use self::wgpu::{WgpuBackend, WgpuOptions};
pub use cpu::{ActivationPrecision, CpuBackend};

/// Which backend an engine computes with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// Multi-threaded f32 on the host.
    #[default]
    Cpu,
    /// WGSL compute kernels on a GPU through wgpu. The graphics API comes from
    /// `WGPU_BACKEND` (e.g. `vulkan`, `metal`, `dx12`; all when unset).
    Wgpu {
        /// Use the first adapter whose name contains this (case-insensitive);
        /// `None` = the best one (discrete, then integrated, then virtual,
        /// then software).
        adapter: Option<String>,
        /// Multiply passes of many token rows (prefill, wide decode batches)
        /// on the GPU's matrix units where the adapter offers cooperative
        /// matrices the coop matmul can use
        /// ([`WgpuOptions::cooperative_matrix`]): f16-rounded inputs, f32
        /// sums. `false`: f32 kernels everywhere.
        cooperative_matrix: bool,
    },
}

/// How the engine picks a sequence's next token, handed to the backend so a
/// backend can pick it itself (see [`Backend::forward_select`]).
#[derive(Debug, Clone, Copy)]
pub struct SampleSpec<'a> {
    /// The sequence's sampling parameters.
    pub params: &'a SamplingParams,
    /// Position the sampled token will take (it seeds the draw).
    pub position: u32,
    /// Every token the sequence holds through this entry's tokens (the
    /// repetition penalty applies to its distinct ids, the OpenAI penalties
    /// to those from `params.generated_from` on); a drafted sequence's
    /// entries each end at their own token.
    pub history: &'a [TokenId],
    /// Logprobs of the chosen token and of this many best ones.
    pub logprobs: Option<u8>,
    /// The only tokens that may be picked (structured output); `None`: any.
    pub allowed: Option<&'a TokenMask>,
}

impl SampleSpec<'_> {
    /// Picks the token from `row` (this sequence's logits) by this spec,
    /// with `sampler`'s scratch: the one rule every backend follows.
    pub fn sample(&self, sampler: &mut Sampler, row: &[f32]) -> (TokenId, Option<TokenLogprobs>) {
        sampler.sample_masked(
            row,
            self.params,
            self.position,
            self.history,
            self.logprobs,
            self.allowed,
        )
    }
}

/// One sequence's share of a forward pass, or one row of a drafted
/// sequence's (the engine feeds each draft token as an entry of its own,
/// at the next position over the same block table, so several entries may
/// share a table and read the K/V that entries before them write in the
/// same pass). The engine has validated it: tokens are in the vocabulary,
/// positions within the context, and `block_table` covers
/// `start_pos + tokens.len()` positions with blocks of the pool.
#[derive(Debug, Clone, Copy)]
pub struct SeqBatch<'a> {
    /// Tokens to feed, at positions `start_pos..`.
    pub tokens: &'a [TokenId],
    /// Position of `tokens[0]`.
    pub start_pos: u32,
    /// The sequence's KV blocks, in position order.
    pub block_table: &'a [BlockId],
    /// Return the logits of the last token.
    pub want_logits: bool,
    /// With `want_logits`: how the next token is picked. A backend that
    /// samples itself (wgpu on its device, the CPU backend across its pool)
    /// returns the token (and logprobs; see [`Backend::forward_select`]);
    /// `None` = return the row.
    pub sample: Option<SampleSpec<'a>>,
    /// With `sample`: return the row as well (for inspection; see
    /// `Engine::set_full_logits`), as the backend computed it, before any
    /// penalty.
    pub keep_row: bool,
    /// An embedding's chunk: return one hidden-size row in
    /// [`ForwardOutput::hidden`] made from its tokens' hidden states after
    /// the model's final norm ([`pool_rows`]): the last token's
    /// ([`Pooling::Last`]) or the sum of all of them ([`Pooling::Mean`];
    /// the engine divides once every chunk is in). Without `want_logits`.
    pub hidden: Option<Pooling>,
}

/// A token a backend sampled, with its logprobs when they were asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen token.
    pub token: TokenId,
    /// Present when the [`SampleSpec`] asked for logprobs.
    pub logprobs: Option<TokenLogprobs>,
}

/// What [`Backend::forward_select`] hands back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardOutput {
    /// One entry per sequence with `want_logits`, in batch order: `Some`
    /// when the backend picked the token itself (by the rule of
    /// [`crate::sampler::Sampler::sample`]), `None` when the caller must
    /// sample the row it finds in `logits`.
    pub sampled: Vec<Option<Sampled>>,
    /// One entry per sequence with `want_logits`, in batch order: whether its
    /// row is in `logits` (always for `None` in `sampled`; for `Some` with
    /// [`SeqBatch::keep_row`], and always from a host backend, whose rows
    /// are in memory anyway).
    pub has_row: Vec<bool>,
    /// The `vocab_size`-wide rows of the entries with `has_row`, in order.
    pub logits: Vec<f32>,
    /// One hidden-size row per entry with [`SeqBatch::hidden`], in batch
    /// order.
    pub hidden: Vec<f32>,
}

/// RMSNorm of each `w.len()`-wide row of `x` into `out` (normalise, then
/// scale, as Hugging Face does): the final norm of the embedding rows a
/// device backend reads back.
pub(crate) fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    let h = w.len();
    out.clear();
    for row in x.chunks_exact(h) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let r = 1.0 / (ms + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(v, wi)| wi * (v * r)));
    }
}

/// Pools an embedding chunk's hidden states (`rows`, one `h`-wide row per
/// token, after the final norm) into one row appended to `out`: the last
/// row, or the sum of all of them. Both backends use it, so their vectors
/// are the same arithmetic.
pub(crate) fn pool_rows(rows: &[f32], h: usize, pooling: Pooling, out: &mut Vec<f32>) {
    match pooling {
        Pooling::Last => out.extend_from_slice(&rows[rows.len() - h..]),
        Pooling::Mean => {
            let at = out.len();
            out.resize(at + h, 0.0);
            for row in rows.chunks_exact(h) {
                for (o, x) in out[at..].iter_mut().zip(row) {
                    *o += x;
                }
            }
        }
    }
}

/// A compute backend: owns the device-side weights and the KV pool.
pub trait Backend: Send {
    /// Short name for logs (`cpu`, ...).
    fn name(&self) -> &'static str;

    /// Blocks in the KV pool it allocated (what the engine asked for, or
    /// fewer where it let the backend fit the pool to the device).
    fn kv_blocks(&self) -> usize;

    /// Copies whole KV blocks `(src, dst)` in every layer, in order.
    /// Ids are below the pool's block count (the engine checks).
    fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<(), EngineFaultKind>;

    /// Runs one forward pass over `batch`: writes each token's K/V into slot
    /// `block_table[pos / block_size] * block_size + pos % block_size` of every
    /// layer (every entry's, in each layer, before any entry attends: a
    /// drafted sequence's entries read each other's), attends causally over
    /// positions `0..=pos` of its own table,
    /// and fills `logits` with one `vocab_size` row per sequence with
    /// `want_logits`, in batch order.
    fn forward(
        &mut self,
        batch: &[SeqBatch<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineFaultKind>;

    /// [`Backend::forward`], except that a sequence with a [`SampleSpec`]
    /// may come back as its sampled token, so a device backend reads back a
    /// token id (and logprobs when asked) instead of a vocabulary row, and
    /// the CPU backend samples rows across its pool. The default returns
    /// every row, unsampled.
    fn forward_select(
        &mut self,
        batch: &[SeqBatch<'_>],
        out: &mut ForwardOutput,
    ) -> Result<(), EngineFaultKind> {
        out.hidden.clear();
        self.forward(batch, &mut out.logits)?;
        every_row_unsampled(batch, out);
        Ok(())
    }
}

/// Marks every row `forward` wrote into `out.logits` as there and not yet
/// sampled: one entry per sequence of `batch` with `want_logits`.
pub(crate) fn every_row_unsampled(batch: &[SeqBatch<'_>], out: &mut ForwardOutput) {
    let n = batch.iter().filter(|b| b.want_logits).count();
    out.sampled.clear();
    out.sampled.resize(n, None);
    out.has_row.clear();
    out.has_row.resize(n, true);
}

/// Re-checks what the engine promises of a batch (see [`SeqBatch`]), so a
/// direct caller gets a fault, not a panic; every backend calls it first.
pub(crate) fn check_batch(
    batch: &[SeqBatch<'_>],
    geo: KvGeometry,
    vocab: usize,
    context: usize,
) -> Result<(), EngineFaultKind> {
    let bad = |msg: String| Err(EngineFaultKind::Internal(msg));
    for (i, b) in batch.iter().enumerate() {
        if b.tokens.is_empty() {
            return bad(format!("batch entry {i} has no tokens"));
        }
        if b.hidden.is_some() && b.want_logits {
            return bad(format!(
                "batch entry {i} asks for both logits and hidden states"
            ));
        }
        if let Some(&tok) = b.tokens.iter().find(|&&tok| tok as usize >= vocab) {
            return bad(format!(
                "batch entry {i}: token {tok} outside vocabulary {vocab}"
            ));
        }
        let end = b.start_pos as usize + b.tokens.len();
        if end > context {
            return bad(format!(
                "batch entry {i}: positions up to {end} exceed context {context}"
            ));
        }
        let blocks = end.div_ceil(geo.block_size);
        if b.block_table.len() < blocks {
            return bad(format!(
                "batch entry {i}: block table has {} blocks, {blocks} needed",
                b.block_table.len()
            ));
        }
        if let Some(&blk) = b.block_table[..blocks]
            .iter()
            .find(|&&blk| blk as usize >= geo.num_blocks)
        {
            return bad(format!("batch entry {i}: block {blk} outside the pool"));
        }
    }
    Ok(())
}
