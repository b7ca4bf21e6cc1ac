//! The compute seam: a [`Backend`] runs one batched forward pass over its
//! paged KV cache. The CPU backend is here; a GPU one slots in beside it.

pub mod cpu;

use tokenwire_core::{BlockId, EngineFaultKind, TokenId};

pub use cpu::CpuBackend;

/// Which backend an engine computes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// Multi-threaded f32 on the host.
    #[default]
    Cpu,
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
}
