//! The compute seam: a [`Backend`] runs one batched forward pass over its
//! paged KV cache. Two backends: the CPU reference ([`CpuBackend`]) and
//! hand-written WGSL kernels on wgpu ([`WgpuBackend`]).

pub mod cpu;
pub mod wgpu;

use tokenwire_core::{BlockId, EngineFaultKind, TokenId};

pub use self::wgpu::{WgpuBackend, WgpuOptions};
pub use cpu::CpuBackend;

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
    },
}

/// One sequence's share of a forward pass. The engine has validated it: tokens
/// are in the vocabulary, positions within the context, and `block_table`
/// covers `start_pos + tokens.len()` positions with blocks of the pool.
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
    /// With `want_logits`: the caller needs only the row's argmax (greedy
    /// decoding without penalties or logprobs), so a backend may return the
    /// id instead of the row (see [`Backend::forward_select`]).
    pub argmax_only: bool,
}

/// What [`Backend::forward_select`] hands back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardOutput {
    /// One entry per sequence with `want_logits`, in batch order: `Some(id)`
    /// when the backend reduced the row to its argmax (ties to the lowest id,
    /// NaN as -inf: the sampler's greedy rule), `None` when the row is in
    /// `logits`.
    pub argmax: Vec<Option<TokenId>>,
    /// The `vocab_size`-wide rows of the entries that are `None`, in order.
    pub logits: Vec<f32>,
}

/// A compute backend: owns the device-side weights and the KV pool.
pub trait Backend: Send {
    /// Short name for logs (`cpu`, ...).
    fn name(&self) -> &'static str;

    /// Copies whole KV blocks `(src, dst)` in every layer, in order.
    /// Ids are below the pool's block count (the engine checks).
    fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<(), EngineFaultKind>;

    /// Runs one forward pass over `batch`: writes each token's K/V into slot
    /// `block_table[pos / block_size] * block_size + pos % block_size` of every
    /// layer, attends causally over positions `0..=pos` of its own sequence,
    /// and fills `logits` with one `vocab_size` row per sequence with
    /// `want_logits`, in batch order.
    fn forward(
        &mut self,
        batch: &[SeqBatch<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineFaultKind>;

    /// [`Backend::forward`], except that a sequence with `argmax_only` may
    /// come back as its argmax id rather than its logits row, so a device
    /// backend reads back one id instead of a vocabulary row. The default
    /// returns every row.
    fn forward_select(
        &mut self,
        batch: &[SeqBatch<'_>],
        out: &mut ForwardOutput,
    ) -> Result<(), EngineFaultKind> {
        self.forward(batch, &mut out.logits)?;
        out.argmax.clear();
        out.argmax
            .extend(batch.iter().filter(|b| b.want_logits).map(|_| None));
        Ok(())
    }
}
