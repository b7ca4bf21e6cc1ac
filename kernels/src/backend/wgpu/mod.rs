//! The wgpu backend: the whole llama forward pass as hand-written WGSL
//! compute kernels, one file per operation under `shaders/` (in the manner
//! of llama.cpp's ggml-webgpu).
//!
//! * Weights are uploaded once, in the file's dtype: f32; f16 and bf16 kept
//!   packed two to a u32 and widened in the shader, or read as `f16` where
//!   the device has `shader-f16`; GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS
//!   blocks padded to whole words and unpacked in the shader. One weight
//!   prelude per dtype (`shaders/dtype_*.wgsl`) gives every weight kernel
//!   `w_at(i)` and the 8-wide `w_load8(i)`; accumulation is f32 everywhere.
//!   q/k/v and gate/up are stacked into one matrix each, so each is one
//!   product (or one per dtype, when a file mixes them). A matrix larger
//!   than the largest storage binding is split by rows into chunks, one
//!   dispatch per chunk.
//! * A step is recorded in order and, on GPUs, submitted in growing runs
//!   of dispatches ([`WgpuOptions::first_submit`]: the device starts on
//!   the first layers while the host records the rest; CPU adapters take
//!   one submission; [`HostTimes`] says where the host's time goes):
//!   embedding gather into the residual stream x, then per layer RMSNorm,
//!   q|k|v product, RoPE and (in the same dispatch) K/V written into the
//!   paged cache through the step's slot mapping, paged attention (for decode rows, flash-decoding: each
//!   row's context split over as many workgroups as fill the device
//!   ([`WgpuOptions::decode_workgroups`]), the splits merged by their
//!   log-sum-exp in the workgroup of whichever split finishes last, which
//!   a per-row counter tells ([`WgpuOptions::fold_merge`]; else by a
//!   dispatch of their own); a tiled causal kernel for prefill runs),
//!   output product added into x, RMSNorm, gate|up product, SiLU-times-up,
//!   down product added into x; finally the norm and LM head on only the
//!   rows that need logits, and the sampling kernel over them (in a second
//!   compute pass, after any rows to read back are copied out).
//! * Fusions, on passes that take the mat-vec kernel: each layer's two
//!   RMSNorms go into the q|k|v and gate|up products, which read x and
//!   normalise it on the fly (for matrices without a bias; split-row
//!   mat-vec only, since it needs a workgroup barrier, and on CPU adapters
//!   any barrier slows the whole kernel), and
//!   SiLU-times-up into the gate|up product (`WeightKernel::Glu`, for a
//!   stack in one chunk), and RoPE with the K/V write into the q|k|v
//!   product (`WeightKernel::Rope`, for a stack in one chunk: each of its
//!   invocations computes a rotation pair's two rows, rotates them, and
//!   writes them to q|k|v and the cache, `shaders/qkv_rope.wgsl`). A
//!   decode layer is then five dispatches: q|k|v with RoPE and the K/V
//!   write, attention (its splits merged in it; with
//!   [`WgpuOptions::fold_merge`] off, another dispatch merges them), o,
//!   gate|up, down. Passes on the tiled matmul run the norms, RoPE with
//!   the K/V write, and SiLU as their own kernels (and so do split-row
//!   mat-vec passes of more than 32 rows RoPE and SiLU, whose fused
//!   variants stop at 32 columns a dispatch)
//!   ([`WgpuOptions::fuse_norm`], [`WgpuOptions::fuse_rope`],
//!   [`WgpuOptions::fuse_glu`]).
//! * Products for up to 64 tokens (a decode step of up to 64 sequences, a
//!   short prompt) use the mat-vec kernel, which reads each weight once for
//!   all of them, with one workgroup per few rows so that every memory
//!   channel is busy; more tokens use the tiled matmul. On CPU adapters
//!   (lavapipe), where each workgroup barrier is expensive, the defaults
//!   switch to one mat-vec invocation per row, whose SIMD lanes hold the
//!   accumulators of at most 8 columns, and to mat-vec groups of 8 columns
//!   instead of the tiled matmul ([`WgpuOptions::split_k`],
//!   [`WgpuOptions::tiled_matmul`]); the tests run both variants.
//! * With [`WgpuOptions::cooperative_matrix`] (on by default), where the
//!   adapter offers cooperative matrices that the coop matmul can use (f16 x
//!   f16 -> f32 fragments of side 8 or 16: an NVIDIA GPU, Mesa 26's
//!   lavapipe), passes of at least [`WgpuOptions::coop_min_rows`] token
//!   rows multiply on them instead (`shaders/coop_mat_mul.wgsl`:
//!   weights and x rounded to f16 into workgroup tiles, f32 sums; the
//!   norms and SiLU as their own kernels, as on the tiled matmul). The
//!   workgroup tile is 64 x 64 at side 16, 128 x 128 for passes of
//!   [`WgpuOptions::coop_wide_rows`] or more, and 128 weight rows by 32
//!   tokens for decode batches that fit it ([`WgpuOptions::coop_tall`]). A
//!   product of too few tiles to fill the GPU (a decode batch through a
//!   2,048-row matrix) splits k over workgroups, each writing partial sums
//!   to a scratch binding; the workgroup of the split that finishes last
//!   (a counter per output tile) then adds them, with the bias and the
//!   residual, in a fixed order, with [`WgpuOptions::coop_fold_splits`]
//!   on and `@coherent` storage buffers; by default (and without
//!   `@coherent`) `shaders/split_sum.wgsl` does so in a dispatch of its
//!   own ([`WgpuOptions::coop_split_workgroups`]).
//! * Subgroup operations are optional: where the adapter has them, the
//!   split-row mat-vec sums each row's partials with shuffles (any
//!   power-of-two subgroup size: lavapipe's 8, 32, 64), and a row no wider
//!   than a subgroup needs no workgroup memory or barrier
//!   ([`WgpuOptions::subgroups`]); every other reduction, and every
//!   reduction without subgroups, goes through workgroup memory.
//! * [`WgpuBackend::set_profiling`] times every dispatch of the following
//!   steps (timestamp queries, or the host's clock where the adapter has
//!   none) and [`WgpuBackend::take_profile`] sums them per kernel: what
//!   `engine-bench --profile` prints.
//! * Pipelines and bind groups are built once; bind groups that name
//!   per-step buffers are rebuilt only when one of those buffers grows.
//!   Each step's dispatches are planned on the host, a layer planned like
//!   an earlier one (the same inputs, chunks, storage types and biases)
//!   copying that layer's dispatches onto its own bind groups.
//!
//! Sampling happens on the device as well (`shaders/sample.wgsl`, one
//! workgroup per row), by the rule of the one shared [`crate::sampler`]:
//! repetition penalty over the distinct history ids, OpenAI's presence and
//! frequency penalties over the generated ones (the host sends each id with
//! the amount to subtract), then greedy argmax, or
//! temperature, top-k, top-p and a draw whose uniform the host computes
//! exactly as the CPU sampler does. A step reads back a token id per
//! sequence, plus its logprobs when asked, never a logits row (4 bytes
//! instead of 512 KiB for a 128K vocabulary). Rows come back only for
//! `Engine::set_full_logits`, for constrained sequences (structured output:
//! the grammar's mask is made and applied on the host), for a sequence
//! asking for more than 32 logprobs, or for OpenAI penalties of which one
//! is not finite; the shared sampler finishes those on the host.
//!
//! Nothing is sorted: the k-th best, the top-p cut and the draw are each
//! the first element of the sampler's order whose prefix reaches a target,
//! found by radix select: a pass sums the count and mass of the remaining
//! candidates into 256 workgroup buckets by the next byte of their
//! order-preserving keys (then of their ids, for ties), and a scan of the
//! buckets picks the one where the target falls; a bucket of one element
//! ends the search (at most 4 passes for the key, then the ids' bytes when
//! the target falls in a run of equal keys). Counts and comparisons are exact,
//! so greedy and top-k pick what the CPU picks. Masses are exact 64-bit
//! integer sums of each weight exp(s - max) rounded to 2^-31, and the
//! top-p and draw targets are exact products with 32-bit fractions, so a
//! device mass differs from the CPU sampler's f64 sum only by the f32
//! rounding of each exp (a few ulp, of either sign) and by at most 2^-32 of
//! the largest weight per element (the fixed point's rounding). So the
//! device can choose another token only when the draw or the top-p target
//! lands within that rounding of a cumulative boundary. (Where a device
//! divides x / t less exactly than correctly rounded, as WGSL allows up to
//! 2.5 ulp, the same holds within that rounding too; lavapipe divides
//! exactly.) The tests skip such rows and compare all others; in practice
//! none of several hundred drawn rows differed even at a relative 1e-12.
//! On CPU adapters the sampling workgroup is small
//! ([`WgpuOptions::sample_workgroup`]), sized to stay under llvmpipe's cap
//! on the loop iterations of an invocation.

mod attn;
mod choice;
mod context;
mod coop;
#[cfg(feature = "lab")]
pub mod lab;
mod ops;
mod params;
mod pipelines;
mod plan;
mod profile;
mod sample;
mod tensors;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenwire_core::{BlockId, EngineFaultKind, Pooling};

use super::{Backend, ForwardOutput, SampleSpec, SeqBatch};
use crate::error::LoadError;
use crate::kv::KvGeometry;
use crate::model::Model;
use crate::rope;
pub use attn::SplitPolicy;
use attn::{AttnModel, AttnShape};
use choice::KernelChoice;
pub use context::adapters;
use context::{Gpu, GpuError};
pub use coop::{CoopConfig, CoopTile};
use ops::{Bind, LayerCalls, Op, PassOps, Pipe, Segment};
use params::ParamArena;
pub use pipelines::WeightDtype;
use pipelines::{Pipelines, WeightKernel, MAT_VEC_COLS};
use plan::{HostPlan, Pass, PlanLimits};
pub use profile::{HostTimes, KernelTime, Profile, ProfileClock};
use profile::{Profiler, Recorder, SubmitSchedule};
use sample::SampleRows;
use tensors::{LayerGpu, Matrix, ModelGpu};

/// How to set up the wgpu backend. Only `adapter` matters in production; the
/// rest exist so tests can reach the code paths big models take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Use the first adapter whose name contains this (case-insensitive);
    /// `None` = the best (discrete, integrated, virtual, then software).
    /// `WGPU_BACKEND` picks the graphics APIs searched.
    pub adapter: Option<String>,
    /// Told how far the upload got, layer by layer.
    pub progress: Option<crate::LoadProgress>,
    /// Cap on the storage binding size, below the device's own limit (to
    /// exercise the splitting of big tensors on small models).
    pub max_binding: Option<u64>,
    /// Use `shader-f16` when the device has it (f16 weights are then read
    /// natively instead of unpacked from u32 pairs).
    pub shader_f16: bool,
    /// Token rows per pass; a bigger step is computed in several passes,
    /// recorded in the same submission, each reading every weight. `None`:
    /// [`GPU_ROWS_PER_PASS`] on GPUs, [`CPU_ROWS_PER_PASS`] on CPU
    /// adapters. Either way at most what the device's largest binding
    /// holds of the widest activation row.
    pub max_rows_per_pass: Option<usize>,
    /// Decode attention splits each row's context so that a dispatch has
    /// about this many workgroups ([`SplitPolicy::workgroups`]). `None`:
    /// 512 (enough for the largest GPUs), except on CPU adapters, where
    /// a few workgroups per core keep every thread busy and more only add
    /// partials to merge.
    pub decode_workgroups: Option<u32>,
    /// Fewest context positions per decode-attention split
    /// ([`SplitPolicy::min_len`]).
    pub decode_min_split: u32,
    /// Merge decode attention's splits in the workgroup of the split that
    /// finishes last ([`SplitPolicy::fold`]) rather than in a dispatch of
    /// their own, where the device has `@coherent` storage buffers (every
    /// Vulkan adapter). On by default; off only to compare.
    pub fold_merge: bool,
    /// Vectors of a K row decode attention loads before their dot products
    /// (1 to 16). `None`: 16 on GPUs, 1 on CPU adapters (what lavapipe
    /// measured faster).
    pub decode_k_chunk: Option<u32>,
    /// A sequence's run of at least this many rows in a pass uses the tiled
    /// prefill attention; shorter runs use the decode kernel.
    pub prefill_min_rows: usize,
    /// Multiply more than [`WgpuOptions::mat_vec_max_rows`] tokens with the
    /// tiled matmul (`Some(true)`) or with mat-vec groups (`Some(false)`).
    /// `None`: tiled,
    /// except on CPU adapters (software Vulkan such as lavapipe), where
    /// workgroup barriers are so slow that mat-vec groups win.
    pub tiled_matmul: Option<bool>,
    /// With the tiled matmul on, passes of up to this many token rows (at
    /// most 64, the default) still use the mat-vec kernel, which reads each
    /// weight once for all of them with many more workgroups in flight than
    /// the matmul's 64-row tiles give.
    pub mat_vec_max_rows: usize,
    /// Fuse SiLU-times-up into the gate|up mat-vec (one dispatch, no gate|up
    /// activations written) where the stacked matrix is one chunk without
    /// bias; passes that take the tiled matmul keep the separate kernel.
    /// Off only to compare against the unfused pair.
    pub fuse_glu: bool,
    /// Fuse RoPE and the K/V cache write into the q|k|v mat-vec (one
    /// dispatch a layer fewer: on an H200 the separate `rope_kv` took about
    /// 6.5 us a layer at batch 1, launch cost for a few hundred values)
    /// where the stacked matrix is one chunk; passes that take the tiled
    /// matmul keep the separate kernel, and so do mat-vec passes of more
    /// than 32 rows with rows split over invocations (the fused variant holds
    /// two sums per column and stops at 32, so it would read the weights
    /// twice to save one small dispatch; the fused SwiGLU likewise). A
    /// model with per-head q/k norms (Qwen3) never fuses: the fused variant
    /// has no norm, rope_kv.wgsl does. Not yet measured on a GPU
    /// (`engine-bench --no-fused-rope` compares); off only to compare.
    pub fuse_rope: bool,
    /// Fuse each layer's two RMSNorms into the products that read them (the
    /// q|k|v and gate|up mat-vecs normalise x on the fly, for matrices
    /// without bias); passes that take the tiled matmul keep the norm
    /// kernel. Off only to compare against the separate kernels.
    pub fuse_norm: bool,
    /// Mat-vec with each row split over several invocations and reduced in
    /// workgroup memory (`Some(true)`), or one invocation per row
    /// (`Some(false)`). `None`: split, except on CPU adapters.
    pub split_k: Option<bool>,
    /// The 8-weight steps whose loads a mat-vec invocation issues together
    /// (1, 2 or 4), in variants of up to 8 columns; the sums are the same
    /// bits for any. `None`: 1 with rows split over invocations (GPUs: on
    /// an H200 it decoded 1.7x faster than 4 at batch 1); with one
    /// invocation per row, what measured best on lavapipe (2 for one
    /// column, 1 for more).
    pub mat_vec_unroll: Option<u32>,
    /// Reduce split-row mat-vec partials with subgroup shuffles where the
    /// adapter has subgroup operations (`true`, the default), else through
    /// workgroup memory alone. The shuffles assume that a subgroup is a run
    /// of consecutive local invocation indices of the reported subgroup
    /// size: what Vulkan drivers do in practice for one-dimensional
    /// workgroups (NVIDIA, AMD, Mesa), though no specification promises it;
    /// `false` rules it out (and compares the two).
    pub subgroups: bool,
    /// Invocations per workgroup of the sampling kernel (a power of two from
    /// 8 to 256; one workgroup per row). `None`: 256, except on CPU adapters,
    /// where a row's dozens of barrier-separated reductions cost far more
    /// than its arithmetic: there the smallest size that keeps a row under
    /// llvmpipe's cap on loop iterations (8 for a 512-token vocabulary, 16
    /// for 32K, 64 for 128K). On CPU adapters a smaller `Some` is raised to
    /// that size.
    pub sample_workgroup: Option<u32>,
    /// Ask for cooperative matrices (wgpu's experimental feature) where the
    /// adapter offers a configuration the coop matmul can use
    /// ([`CoopConfig`]); passes of at least [`WgpuOptions::coop_min_rows`]
    /// token rows then multiply on them (f16-rounded weights and x, f32
    /// sums). On by default: on an H200 a 512-token prefill of TinyLlama
    /// (bf16) ran at 7,265 tokens/s on them against 2,173 on the f32 tiled
    /// matmul, and a 32-sequence decode step took 19.6 ms against 21.1
    /// (BENCHMARKS.md). `false` keeps every product in f32, which is what
    /// tests holding the backend to the CPU's logits at f32 tolerances
    /// (1e-9 NMSE) ask for; `tokenwire serve --wgpu-matrix-units off`.
    pub cooperative_matrix: bool,
    /// With [`WgpuOptions::cooperative_matrix`], passes of at least this
    /// many token rows use cooperative matrices (before mat-vec or the tiled
    /// matmul); 16 by default, a guess made before any GPU ran it: a decode
    /// batch past the one-column mat-vec's sweet spot, where mat-vec's cost
    /// grows with the columns (on an H200: 3.5 ms a step at batch 1, 7.0 at
    /// 8, 29.6 at 32, most of it in the products) while the matrix units'
    /// should not.
    pub coop_min_rows: usize,
    /// The coop matmul's k slab (64 or 32 values loaded between two
    /// barriers). `None`: 64 where the adapter gives a workgroup the memory
    /// (22 KiB), else 32 ([`CoopConfig`]).
    pub coop_k_slab: Option<u32>,
    /// Split the k of a cooperative-matrix product that has fewer tiles
    /// than this over workgroups (partial sums in a scratch buffer, then
    /// added in a fixed order by the split that finishes last or by
    /// split_sum.wgsl: [`WgpuOptions::coop_fold_splits`]), to have about this many
    /// workgroups: a decode batch of 32 through a 2,048-row matrix is 32
    /// tiles, a few hundredths of what a large GPU keeps busy. `None`: 512
    /// on GPUs, never on CPU adapters (which run workgroups one per
    /// thread); `Some(0)`: never.
    pub coop_split_workgroups: Option<u32>,
    /// Coop passes of at least this many token rows use the wide tile
    /// ([`CoopTile::Wide8`]: eight subgroups over 128 x 128 at side 16,
    /// half the loads and workgroup-memory stores per multiply-add of the
    /// default four over 64 x 64, for a fourth of the workgroups), where the
    /// adapter gives a workgroup its 44 KiB. 128 by default: on an H200 it
    /// prefilled TinyLlama (bf16, passes of 512 rows) at 18,124 tokens/s
    /// against 12,561 (batch 8) and 17,190 against 12,896 (batch 32), but
    /// decoded a batch of 32 at 3,602 against 4,282 (BENCHMARKS.md);
    /// `usize::MAX`: never.
    pub coop_wide_rows: usize,
    /// Coop passes of at most two fragment sides of tokens (32 at side
    /// 16: decode batches) use the tall tile ([`CoopTile::Tall4`]: four
    /// subgroups over 128 weight rows by 32 tokens at side 16), where the
    /// adapter gives a workgroup its 26.5 KiB, instead of the default 64 x
    /// 64, half of whose multiply-adds a batch of 32 spends on tokens past
    /// it. On by default; not yet measured on a GPU (BENCHMARKS.md);
    /// `false`: the default tile.
    pub coop_tall: bool,
    /// A split-k coop product's splits are summed by the workgroup of
    /// whichever split finishes last (a counter per output tile), in the
    /// product's own dispatch, where the device has `@coherent` storage
    /// buffers (every Vulkan adapter): one dispatch fewer per split
    /// product (on an H200 a 32-sequence decode step spent 0.6 ms of 7.8
    /// in the four split sums of its layers, about 7 us each). Off by
    /// default: that one workgroup then reads the whole tile's partials
    /// (`down` at batch 32: 22 splits of 128 x 32 values, 704 dependent
    /// loads per invocation where the compiler does not unroll them) with
    /// no other workgroup to hide their latency, by estimate 20-100 us a
    /// product against the dispatch's 7; lavapipe measured it slower too.
    /// Not yet measured on a GPU (`engine-bench --coop-fold`).
    pub coop_fold_splits: bool,
    /// Keep the counter wgpu adds to every shader loop so that none can run
    /// forever (wgpu's own default). Off by default: every loop of these
    /// kernels ends by construction, bounds checks stay, and without the
    /// counters drivers can unroll the loops over per-invocation arrays; on
    /// lavapipe (2-layer TinyLlama bf16) a decode step took 117-119 ms
    /// instead of 134-143 at batch 1 and 486 instead of 560-562 at batch 8,
    /// the same logits within 1e-12. Not yet measured on a GPU.
    pub loop_bounding: bool,
    /// Submit a step's first this many dispatches on their own, then runs
    /// of twice as many as the run before, so that the device starts on a
    /// step while the host still records the rest of it (recording and
    /// submitting a TinyLlama decode step took the host 0.6-0.8 ms on a
    /// 2-core Xeon VM, more than a quarter of the 2.1 ms step an H200
    /// runs). `None`: [`FIRST_SUBMIT`] on GPUs (not yet measured on one);
    /// one submission on CPU adapters, where the device is the host's own
    /// cores and lavapipe ran 8-sequence decode steps of 4-layer TinyLlama
    /// in 1.3-1.4 s submitted early against 0.8-1.0 s whole. `Some(0)`: one
    /// submission a step. Steps profiled on the device's clock take one;
    /// on the host's, one per dispatch.
    pub first_submit: Option<usize>,
    /// Take as many KV blocks as one layer's K (or V) binding holds when
    /// the pool asked for is bigger than the device's largest storage
    /// binding, instead of failing: what the engine's default pool asks
    /// for (an explicit pool size fails with the reason).
    pub fit_kv_pool: bool,
}

/// Dispatches in a step's first submission by default on GPUs
/// ([`WgpuOptions::first_submit`]): a TinyLlama layer and a half at batch
/// 1, so the device starts within a few tens of microseconds of recording.
pub const FIRST_SUBMIT: usize = 8;

impl WgpuOptions {
    /// The sampling kernel's workgroup size for `vocab` on an adapter of this kind.
    pub(crate) fn sample_wg(&self, cpu_adapter: bool, vocab: u32) -> u32 {
        let wg = self
            .sample_workgroup
            .unwrap_or(if cpu_adapter { 8 } else { 256 })
            .clamp(8, 256)
            .next_power_of_two();
        if cpu_adapter {
            wg.max(pipelines::cpu_sample_wg(vocab))
        } else {
            wg
        }
    }
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            adapter: None,
            progress: None,
            max_binding: None,
            shader_f16: true,
            max_rows_per_pass: None,
            decode_workgroups: None,
            decode_min_split: 32,
            fold_merge: true,
            decode_k_chunk: None,
            prefill_min_rows: 4,
            tiled_matmul: None,
            mat_vec_max_rows: MAT_VEC_COLS,
            fuse_glu: true,
            fuse_rope: true,
            fuse_norm: true,
            split_k: None,
            mat_vec_unroll: None,
            subgroups: true,
            sample_workgroup: None,
            cooperative_matrix: true,
            coop_min_rows: 16,
            coop_k_slab: None,
            coop_split_workgroups: None,
            coop_wide_rows: 128,
            coop_tall: true,
            coop_fold_splits: false,
            loop_bounding: false,
            first_submit: None,
            fit_kv_pool: false,
        }
    }
}

/// Whether a layer's stacked gate|up matrix `m` takes the fused SwiGLU
/// mat-vec: one chunk (so each gate row's up row is in the same binding)
/// and no bias.
fn glu_fusable(enabled: bool, m: &Matrix) -> bool {
    enabled && m.chunks.len() == 1 && m.bias.is_none()
}

/// Whether a layer's stacked q|k|v matrix `m` takes the RoPE variant of
/// mat-vec: one chunk, so every head's rows (and every row's pair) are in
/// the same binding.
fn rope_fusable(enabled: bool, m: &Matrix) -> bool {
    enabled && m.chunks.len() == 1
}

/// Whether the RMSNorm before `m` can be fused into its mat-vec: the norm
/// weight takes the bias slot, so only for a matrix without one. `enabled`:
/// the option, and mat-vec split over invocations (the fused norm's
/// variants exist only there).
fn norm_fusable(enabled: bool, m: &Matrix) -> bool {
    enabled && m.bias.is_none()
}

/// Token rows per pass on GPUs. On an H200 (TinyLlama's shape, bf16,
/// 2026-11-27) passes of 2,048 rows prefilled 32 x 128 tokens at 22,748 to
/// 22,830 tokens/s against 18,961 to 19,100 in passes of 512 and 20,978 to
/// 21,279 in passes of 1,024, and 4,096 gained nothing more: bigger passes
/// read the weights fewer times and give the narrow products (o, down)
/// more tiles than the card has cores.
pub const GPU_ROWS_PER_PASS: usize = 2048;
/// Token rows per pass on CPU adapters (lavapipe): its activations stay
/// small, and a pass there is already bound by arithmetic.
pub const CPU_ROWS_PER_PASS: usize = 512;

/// Decode-attention workgroups aimed at on GPUs: a few per core of the
/// largest (132 SMs on an H100 or H200).
const GPU_DECODE_WORKGROUPS: u32 = 512;
/// Decode-attention workgroups aimed at on CPU adapters (lavapipe runs a
/// workgroup per thread at a time).
const CPU_DECODE_WORKGROUPS: u32 = 16;

/// A device buffer that grows (never shrinks) to what a step needs.
#[derive(Debug)]
struct Grow {
    buf: ::wgpu::Buffer,
    bytes: u64,
    usage: ::wgpu::BufferUsages,
    label: &'static str,
}

impl Grow {
    fn new(gpu: &Gpu, label: &'static str, bytes: u64, usage: ::wgpu::BufferUsages) -> Grow {
        let bytes = bytes.max(16).div_ceil(16) * 16;
        Grow {
            buf: gpu.buffer(label, bytes, usage),
            bytes,
            usage,
            label,
        }
    }

    /// Makes room for `need` bytes (at most `cap`); true if it was reallocated.
    fn ensure(&mut self, gpu: &Gpu, need: u64, cap: u64) -> bool {
        if need <= self.bytes {
            return false;
        }
        let bytes = need.max(self.bytes * 2).min(cap.max(need)).div_ceil(16) * 16;
        self.buf = gpu.buffer(self.label, bytes, self.usage);
        self.bytes = bytes;
        true
    }
}

/// Per-step buffers.
#[derive(Debug)]
struct Bufs {
    plan: Grow,
    params: Grow,
    x: Grow,
    xn: Grow,
    qkv: Grow,
    att: Grow,
    gate_up: Grow,
    act: Grow,
    part: Grow,
    /// The split counters of decode attention's folded merge
    /// (attn_decode.wgsl's `counts`) and of the coop products' folded split
    /// sums (coop_mat_mul.wgsl's): zero when created, and set back to zero
    /// by the dispatch that counts them up, so one buffer serves both.
    counts: Grow,
    /// Partial sums of split-k coop products (their bind groups' binding 4).
    split: Grow,
    logits: Grow,
    /// sample.wgsl's input: per-row parameters and penalty histories.
    sample: Grow,
    /// sample.wgsl's output: one token per logits row, then logprob blocks.
    sampled: Grow,
    staging: Grow,
}

/// Bind groups of one layer.
#[derive(Debug)]
struct LayerBinds {
    norm_in: ::wgpu::BindGroup,
    norm_post: ::wgpu::BindGroup,
    qkv: Vec<::wgpu::BindGroup>,
    o: Vec<::wgpu::BindGroup>,
    gate_up: Vec<::wgpu::BindGroup>,
    /// The fused SwiGLU product into `act`, where the layer's gate|up
    /// matrix allows it.
    glu: Option<::wgpu::BindGroup>,
    /// q|k|v, gate|up and the fused SwiGLU reading the residual stream and
    /// normalising it on the fly (the norm weight in the bias slot).
    qkv_normed: Vec<::wgpu::BindGroup>,
    /// q|k|v with RoPE and the K/V write fused in (from xn, and reading x
    /// with the norm fused too), where the layer's q|k|v matrix allows it.
    qkv_rope: Option<::wgpu::BindGroup>,
    qkv_rope_normed: Option<::wgpu::BindGroup>,
    gate_up_normed: Vec<::wgpu::BindGroup>,
    glu_normed: Option<::wgpu::BindGroup>,
    down: Vec<::wgpu::BindGroup>,
    rope_kv: ::wgpu::BindGroup,
    decode: ::wgpu::BindGroup,
    prefill: ::wgpu::BindGroup,
}

/// Every bind group a step uses.
#[derive(Debug)]
struct Binds {
    params: ::wgpu::BindGroup,
    embed: Vec<::wgpu::BindGroup>,
    layers: Vec<LayerBinds>,
    merge: ::wgpu::BindGroup,
    silu: ::wgpu::BindGroup,
    norm_final: ::wgpu::BindGroup,
    head: Vec<::wgpu::BindGroup>,
    sample: ::wgpu::BindGroup,
}

/// What a step needs of the growable buffers, in bytes.
#[derive(Debug, Default, Clone, Copy)]
struct Needs {
    rows: u64,
    part: u64,
    counts: u64,
    split: u64,
    logit_rows: u64,
    sample: u64,
    sampled: u64,
    staging: u64,
}

/// One step as the host plans it, before anything is recorded.
#[derive(Debug)]
struct Step {
    plan: HostPlan,
    /// sample.wgsl's rows.
    sample: SampleRows,
    segments: Vec<Segment>,
    /// What the buffers must hold; the staging buffer's first
    /// `needs.sampled` bytes are the sampled words, the full rows follow,
    /// then the embedding rows ([`Step::hidden`]).
    needs: Needs,
    /// Per batch entry with [`SeqBatch::hidden`], in order: how it pools
    /// and the count of its rows that come back (all of them for the mean,
    /// the last for the last token); their residual rows start at
    /// `hidden_at` in the staging buffer.
    hidden: Vec<(Pooling, u64)>,
    hidden_at: u64,
}

/// Model shape numbers the kernels take.
#[derive(Debug, Clone, Copy)]
struct Dims {
    h: u32,
    nq: u32,
    nkv: u32,
    hd: u32,
    inter: u32,
    vocab: u32,
    qkv_w: u32,
    eps: f32,
}

/// Runs a [`Model`] with WGSL kernels on a wgpu device, over a paged KV
/// cache that lives on the device.
pub struct WgpuBackend {
    model: Arc<Model>,
    gpu: Gpu,
    pipes: Pipelines,
    weights: ModelGpu,
    geo: KvGeometry,
    shape: AttnShape,
    dims: Dims,
    inv_freq: Vec<f64>,
    opts: WgpuOptions,
    limits: PlanLimits,
    /// How decode attention splits contexts.
    splits: SplitPolicy,
    /// The product kernel for each pass size.
    kernels: KernelChoice,
    sample_wg: u32,
    bufs: Bufs,
    binds: Option<Binds>,
    params: ParamArena,
    scratch: ::wgpu::Buffer,
    dummy: ::wgpu::Buffer,
    staged: Vec<u8>,
    /// Scratch of the sampling rows' encoding (cleared between steps).
    sample_scratch: sample::Scratch,
    /// Per-kernel timing, while switched on.
    profiler: Option<Profiler>,
    /// The host's phases of the steps run since last taken.
    host: HostTimes,
    /// Dispatches in a step's first submission (0: one submission).
    first_submit: usize,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuBackend")
            .field("gpu", &self.gpu)
            .field("geo", &self.geo)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl WgpuBackend {
    /// Opens a device (see [`WgpuOptions::adapter`]), uploads `model` and
    /// allocates a KV pool of `num_blocks` blocks of `block_size` slots.
    /// Fails with [`LoadError::Backend`] when no adapter exists or the model
    /// does not fit.
    pub fn new(
        model: Arc<Model>,
        block_size: usize,
        num_blocks: usize,
        opts: &WgpuOptions,
    ) -> Result<WgpuBackend, LoadError> {
        if block_size == 0 || num_blocks == 0 {
            return Err(LoadError::Options(
                "block_size and num_blocks must be positive".into(),
            ));
        }
        let c = model.config();
        if c.head_dim > 512 {
            // rope_kv.wgsl keeps a head's pairs in one workgroup of 256.
            return Err(LoadError::Backend(format!(
                "head_dim {} (the wgpu kernels take up to 512)",
                c.head_dim
            )));
        }
        // The RoPE fused into the q|k|v mat-vec has no per-head norm: a model
        // with one (Qwen3) takes rope_kv.wgsl, which does.
        let without_fused_rope;
        let opts = if c.qk_norm && opts.fuse_rope {
            without_fused_rope = WgpuOptions {
                fuse_rope: false,
                ..opts.clone()
            };
            &without_fused_rope
        } else {
            opts
        };
        let gpu = Gpu::new(opts).map_err(LoadError::Backend)?;
        let mut geo = KvGeometry {
            layers: c.num_layers,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size,
            num_blocks,
        };
        if opts.fit_kv_pool {
            // Each layer's K (and V) is one binding of f32s.
            let block_bytes = (geo.block_len() as u64 * 4).max(1);
            let fits = (gpu.max_binding / block_bytes).max(1);
            geo.num_blocks = num_blocks.min(usize::try_from(fits).unwrap_or(usize::MAX));
        }
        let weights =
            ModelGpu::upload(&gpu, &model, geo, &opts.progress).map_err(LoadError::Backend)?;
        let cpu_adapter = gpu.info.device_type == ::wgpu::DeviceType::Cpu;
        let split_k = opts.split_k.unwrap_or(!cpu_adapter);
        let k_chunk = attn::decode_k_chunk(cpu_adapter, opts.decode_k_chunk);
        let mut pipes = Pipelines::new(&gpu, split_k, opts.mat_vec_unroll, k_chunk, opts.fuse_rope);
        let sample_wg = opts.sample_wg(cpu_adapter, c.vocab_size as u32);
        pipes.ensure_sample(&gpu, sample_wg);
        for d in weights.dtypes() {
            pipes.ensure_weights(&gpu, d);
        }
        let shape = AttnShape {
            head_dim: c.head_dim as u32,
            group: c.group_size() as u32,
        };
        pipes.ensure_attn(&gpu, shape);
        if let Some(e) = gpu.take_error() {
            return Err(LoadError::Backend(format!(
                "setting up the model on {}: {}",
                gpu.info.name,
                e.message()
            )));
        }
        let dims = Dims {
            h: c.hidden_size as u32,
            nq: c.num_heads as u32,
            nkv: c.num_kv_heads as u32,
            hd: c.head_dim as u32,
            inter: c.intermediate_size as u32,
            vocab: c.vocab_size as u32,
            qkv_w: ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim) as u32,
            eps: c.rms_norm_eps,
        };
        let row_bytes = 4 * [dims.h, dims.qkv_w, dims.nq * dims.hd, 2 * dims.inter]
            .into_iter()
            .max()
            .unwrap_or(1) as u64;
        let decode_groups = (dims.nkv * (shape.group / shape.heads_per_wg())).max(1) as usize;
        let max_rows = opts
            .max_rows_per_pass
            .unwrap_or(if cpu_adapter {
                CPU_ROWS_PER_PASS
            } else {
                GPU_ROWS_PER_PASS
            })
            .min((gpu.max_binding / row_bytes) as usize)
            .min(65535 / decode_groups)
            .max(1);
        let max_logit_rows = ((gpu.max_binding / (4 * dims.vocab as u64)) as usize)
            .min(max_rows)
            .max(1);
        let limits = PlanLimits {
            max_rows,
            max_logit_rows,
            prefill_min: opts.prefill_min_rows.max(1),
            prefill_rows: shape.prefill_rows() as usize,
            block_size,
        };
        use ::wgpu::BufferUsages as U;
        let st = U::STORAGE | U::COPY_DST | U::COPY_SRC;
        let bufs = Bufs {
            plan: Grow::new(&gpu, "plan", 4096, st),
            params: Grow::new(&gpu, "params", 4096, U::UNIFORM | U::COPY_DST),
            x: Grow::new(&gpu, "x", row_bytes, st),
            xn: Grow::new(&gpu, "xn", row_bytes, st),
            qkv: Grow::new(&gpu, "qkv", row_bytes, st),
            att: Grow::new(&gpu, "att", row_bytes, st),
            gate_up: Grow::new(&gpu, "gate_up", row_bytes, st),
            act: Grow::new(&gpu, "act", row_bytes, st),
            part: Grow::new(&gpu, "part", 16, st),
            counts: Grow::new(&gpu, "counts", 16, st),
            split: Grow::new(&gpu, "split", 16, st),
            logits: Grow::new(&gpu, "logits", 4 * dims.vocab as u64, st),
            sample: Grow::new(&gpu, "sample", 4096, st),
            sampled: Grow::new(&gpu, "sampled", 256, st),
            staging: Grow::new(&gpu, "staging", 4096, U::MAP_READ | U::COPY_DST),
        };
        let scratch = gpu.buffer("kv_scratch", geo.block_len() as u64 * 4, st);
        let dummy = gpu.buffer("dummy", 16, st);
        let inv_freq = rope::inv_freq(c.head_dim, c.rope_theta, &c.rope_scaling);
        let tiled_above = opts
            .tiled_matmul
            .unwrap_or(!cpu_adapter)
            .then_some(opts.mat_vec_max_rows.clamp(1, MAT_VEC_COLS) as u32);
        let kernels = KernelChoice::new(
            pipes.coop,
            opts.coop_min_rows,
            opts.coop_wide_rows,
            tiled_above,
        );
        let params = ParamArena::new(gpu.uniform_align);
        let mut be = WgpuBackend {
            model,
            gpu,
            pipes,
            weights,
            geo,
            shape,
            dims,
            inv_freq,
            opts: opts.clone(),
            limits,
            splits: SplitPolicy {
                workgroups: opts.decode_workgroups.unwrap_or(if cpu_adapter {
                    CPU_DECODE_WORKGROUPS
                } else {
                    GPU_DECODE_WORKGROUPS
                }),
                min_len: opts.decode_min_split.max(1),
                fold: opts.fold_merge,
            },
            kernels,
            sample_wg,
            bufs,
            binds: None,
            params,
            scratch,
            dummy,
            staged: Vec::new(),
            sample_scratch: Default::default(),
            profiler: None,
            host: HostTimes::default(),
            first_submit: opts
                .first_submit
                .unwrap_or(if cpu_adapter { 0 } else { FIRST_SUBMIT }),
        };
        be.binds = Some(be.build_binds());
        if let Some(e) = be.gpu.take_error() {
            return Err(LoadError::Backend(e.message()));
        }
        Ok(be)
    }

    /// The adapter's name, graphics API and type, e.g.
    /// `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)`.
    pub fn adapter(&self) -> String {
        let i = &self.gpu.info;
        format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
    }

    /// The cooperative-matrix configuration products run on, where the
    /// device has one enabled (whether a pass uses it depends on its rows:
    /// [`WgpuOptions::coop_min_rows`]).
    pub fn coop(&self) -> Option<CoopConfig> {
        self.pipes.coop.square
    }

    /// The wide-tile configuration passes of
    /// [`WgpuOptions::coop_wide_rows`] or more use, where it fits.
    pub fn coop_wide(&self) -> Option<CoopConfig> {
        self.pipes.coop.wide
    }

    /// The tall-tile configuration decode batches of up to its
    /// [`CoopConfig::tile_tokens`] use, where it fits and
    /// [`WgpuOptions::coop_tall`] asks for it.
    pub fn coop_tall(&self) -> Option<CoopConfig> {
        self.pipes.coop.tall
    }

    /// The largest storage binding the backend uses, in bytes.
    pub fn max_binding(&self) -> u64 {
        self.gpu.max_binding
    }

    /// Storage types of the weights on the device: each matrix's file
    /// dtype, quantized blocks included.
    pub fn weight_dtypes(&self) -> Vec<WeightDtype> {
        self.weights.dtypes()
    }

    /// Most row chunks any one weight matrix was split into.
    pub fn max_chunks(&self) -> usize {
        let mut n = self.weights.embed.chunks.len();
        if let Some(h) = &self.weights.head {
            n = n.max(h.chunks.len());
        }
        for l in &self.weights.layers {
            for m in [&l.qkv, &l.o, &l.gate_up, &l.down] {
                n = n.max(m.chunks.len());
            }
        }
        n
    }

    /// Bytes of weights one forward pass reads (each matrix once, the LM head
    /// included), for bandwidth estimates.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.weight_bytes()
    }

    /// Bytes of one layer's K pool (V is the same).
    pub fn kv_layer_bytes(&self) -> u64 {
        self.weights.kv_bytes
    }

    /// The model this backend runs.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Times every dispatch of the following steps (`Some`) or stops
    /// (`None`), keeping what was gathered. `Some(ProfileClock::Device)`
    /// uses timestamp queries where the adapter has them and the host's
    /// clock elsewhere; `Some(ProfileClock::Host)` always the host's (the
    /// clock in use shows in [`Profile::clock`]; switching clocks starts
    /// afresh). Profiled steps run one compute pass per dispatch, and on the
    /// host's clock one submission per dispatch, so they are slower than
    /// unprofiled ones: the times say where a step's time goes, not how long
    /// it takes. Results are the same either way.
    pub fn set_profiling(&mut self, clock: Option<ProfileClock>) {
        let Some(want) = clock else {
            if let Some(p) = &mut self.profiler {
                p.paused = true;
            }
            return;
        };
        let fresh = Profiler::new(&self.gpu, want);
        match &mut self.profiler {
            Some(p) if p.clock() == fresh.clock() => p.paused = false,
            _ => self.profiler = Some(fresh),
        }
    }

    /// What the profiled steps took per kernel, and starts afresh; `None`
    /// when profiling was never switched on.
    pub fn take_profile(&mut self) -> Option<Profile> {
        let p = self.profiler.take()?;
        if !p.paused {
            self.profiler = Some(Profiler::new(&self.gpu, p.clock()));
        }
        Some(p.profile)
    }

    /// Where the host's time went in the steps run since the last call
    /// (planning, recording, submitting, waiting), and starts afresh.
    pub fn take_host_times(&mut self) -> HostTimes {
        std::mem::take(&mut self.host)
    }

    fn mat_bgs(
        &self,
        label: &str,
        m: &Matrix,
        x: &::wgpu::Buffer,
        y: &::wgpu::Buffer,
    ) -> Vec<::wgpu::BindGroup> {
        self.chunk_bgs(label, m, x, m.bias.as_ref().unwrap_or(&self.dummy), y)
    }

    /// One bind group per chunk of `m`: x, the chunk, `third` (the bias, or
    /// the norm weight of a fused norm), y, the split-k partials and the
    /// split counters.
    fn chunk_bgs(
        &self,
        label: &str,
        m: &Matrix,
        x: &::wgpu::Buffer,
        third: &::wgpu::Buffer,
        y: &::wgpu::Buffer,
    ) -> Vec<::wgpu::BindGroup> {
        m.chunks
            .iter()
            .map(|c| {
                self.gpu.storage_bind_group(
                    &self.pipes.layouts.mat,
                    label,
                    &[
                        x,
                        &c.buf,
                        third,
                        y,
                        &self.bufs.split.buf,
                        &self.bufs.counts.buf,
                    ],
                )
            })
            .collect()
    }

    /// The bind group of layer `lw`'s q|k|v product with RoPE and the K/V
    /// write (its matrix in one chunk): x, the chunk, `third` (the bias or
    /// the norm weight), q|k|v, plan, the layer's K and V.
    fn rope_bg(
        &self,
        label: &str,
        lw: &LayerGpu,
        x: &::wgpu::Buffer,
        third: &::wgpu::Buffer,
    ) -> ::wgpu::BindGroup {
        let b = &self.bufs;
        self.gpu.storage_bind_group_at(
            &self.pipes.layouts.mat_rope,
            label,
            &[
                (0, x),
                (1, &lw.qkv.chunks[0].buf),
                (2, third),
                (3, &b.qkv.buf),
                (6, &b.plan.buf),
                (7, &lw.k),
                (8, &lw.v),
            ],
        )
    }

    /// Bind groups of `m` reading the residual stream `x` and normalising it
    /// with `norm_w` on the fly (in the bias slot); none for a matrix with a
    /// bias, or with the fusion off.
    fn normed_bgs(
        &self,
        label: &str,
        m: &Matrix,
        norm_w: &::wgpu::Buffer,
        y: &::wgpu::Buffer,
    ) -> Vec<::wgpu::BindGroup> {
        if !norm_fusable(self.opts.fuse_norm && self.pipes.split_k, m) {
            return Vec::new();
        }
        self.chunk_bgs(label, m, &self.bufs.x.buf, norm_w, y)
    }

    fn build_binds(&self) -> Binds {
        let l = &self.pipes.layouts;
        let b = &self.bufs;
        let w = &self.weights;
        let norm = |label: &str, nw: &::wgpu::Buffer| {
            self.gpu
                .storage_bind_group(&l.norm, label, &[&b.plan.buf, &b.x.buf, nw, &b.xn.buf])
        };
        let params = self.pipes.params_bind_group(&self.gpu, &b.params.buf);
        let layers = w
            .layers
            .iter()
            .map(|lw| LayerBinds {
                norm_in: norm("norm_in", &lw.input_norm),
                norm_post: norm("norm_post", &lw.post_norm),
                qkv: self.mat_bgs("qkv", &lw.qkv, &b.xn.buf, &b.qkv.buf),
                qkv_normed: self.normed_bgs("qkv+norm", &lw.qkv, &lw.input_norm, &b.qkv.buf),
                qkv_rope: rope_fusable(self.opts.fuse_rope, &lw.qkv).then(|| {
                    let third = lw.qkv.bias.as_ref().unwrap_or(&self.dummy);
                    self.rope_bg("qkv+rope", lw, &b.xn.buf, third)
                }),
                qkv_rope_normed: (rope_fusable(self.opts.fuse_rope, &lw.qkv)
                    && norm_fusable(self.opts.fuse_norm && self.pipes.split_k, &lw.qkv))
                .then(|| self.rope_bg("qkv+rope+norm", lw, &b.x.buf, &lw.input_norm)),
                gate_up_normed: self.normed_bgs(
                    "gate_up+norm",
                    &lw.gate_up,
                    &lw.post_norm,
                    &b.gate_up.buf,
                ),
                glu_normed: glu_fusable(self.opts.fuse_glu, &lw.gate_up)
                    .then(|| {
                        self.normed_bgs("glu+norm", &lw.gate_up, &lw.post_norm, &b.act.buf)
                            .into_iter()
                            .next()
                    })
                    .flatten(),
                o: self.mat_bgs("o", &lw.o, &b.att.buf, &b.x.buf),
                gate_up: self.mat_bgs("gate_up", &lw.gate_up, &b.xn.buf, &b.gate_up.buf),
                glu: glu_fusable(self.opts.fuse_glu, &lw.gate_up).then(|| {
                    self.mat_bgs("glu", &lw.gate_up, &b.xn.buf, &b.act.buf)
                        .remove(0)
                }),
                down: self.mat_bgs("down", &lw.down, &b.act.buf, &b.x.buf),
                rope_kv: self.gpu.storage_bind_group(
                    &l.rope_kv,
                    "rope_kv",
                    &[
                        &b.plan.buf,
                        &b.qkv.buf,
                        &lw.k,
                        &lw.v,
                        lw.qk_norm.as_ref().unwrap_or(&self.dummy),
                    ],
                ),
                decode: self.gpu.storage_bind_group(
                    &l.decode,
                    "attn_decode",
                    &[
                        &b.plan.buf,
                        &b.qkv.buf,
                        &lw.k,
                        &lw.v,
                        &b.att.buf,
                        &b.part.buf,
                        &b.counts.buf,
                    ],
                ),
                prefill: self.gpu.storage_bind_group(
                    &l.prefill,
                    "attn_prefill",
                    &[&b.plan.buf, &b.qkv.buf, &lw.k, &lw.v, &b.att.buf],
                ),
            })
            .collect();
        Binds {
            params,
            embed: w
                .embed
                .chunks
                .iter()
                .map(|c| {
                    self.gpu
                        .storage_bind_group(&l.embed, "embed", &[&b.plan.buf, &c.buf, &b.x.buf])
                })
                .collect(),
            layers,
            merge: self.gpu.storage_bind_group(
                &l.merge,
                "attn_merge",
                &[&b.plan.buf, &b.part.buf, &b.att.buf],
            ),
            silu: self
                .gpu
                .storage_bind_group(&l.silu, "silu_mul", &[&b.gate_up.buf, &b.act.buf]),
            norm_final: norm("norm_final", &w.final_norm),
            head: self.mat_bgs("lm_head", w.lm_head(), &b.xn.buf, &b.logits.buf),
            sample: self.gpu.storage_bind_group(
                &l.sample,
                "sample",
                &[&b.logits.buf, &b.sample.buf, &b.sampled.buf],
            ),
        }
    }

    /// The attention side of the model, as attention's planners take it.
    fn attn_model(&self) -> AttnModel {
        AttnModel {
            shape: self.shape,
            q_heads: self.dims.nq,
            kv_heads: self.dims.nkv,
            stride: self.dims.qkv_w,
            bs: self.geo.block_size as u32,
            qk_norm_eps: self.model.config().qk_norm.then_some(self.dims.eps),
        }
    }

    /// The dispatches each layer of pass `p` repeats.
    fn layer_calls(&self, p: &Pass) -> LayerCalls {
        let d = self.dims;
        let m = self.attn_model();
        LayerCalls {
            norm: params::norm_call(d.h, d.eps, None, p.rows),
            rope_kv: attn::rope_kv_call(&m, p),
            rope: attn::rope_fuse(&m, p),
            decode: (p.n_dec > 0).then(|| {
                attn::decode_calls(&m, p, self.splits, self.gpu.max_binding, self.gpu.coherent)
            }),
            prefill: (p.n_tiles > 0).then(|| attn::prefill_call(&m, p)),
            silu: params::silu_call(p.rows, d.inter),
        }
    }

    /// The dispatches of one pass. `on_device`: per logits row of the step,
    /// whether it is sampled on the device.
    fn pass_ops(
        &mut self,
        p: &Pass,
        staging_rows: &[(u32, u64)],
        on_device: &[bool],
        needs: &mut Needs,
    ) -> Segment {
        let calls = self.layer_calls(p);
        needs.rows = needs.rows.max(p.rows as u64);
        if let Some(c) = &calls.decode {
            needs.part = needs.part.max(c.part_bytes);
            needs.counts = needs.counts.max(c.count_bytes);
        }
        let d = self.dims;
        let w = &self.weights;
        let mut ops = PassOps {
            params: &mut self.params,
            ops: Vec::new(),
            rows: p.rows,
            dims: d,
            kernels: self.kernels,
            split_k: self.pipes.split_k,
            fuse_norm: self.opts.fuse_norm && self.pipes.split_k,
            fuse_glu: self.opts.fuse_glu,
            fuse_rope: self.opts.fuse_rope,
            split_bytes: 0,
            count_bytes: 0,
        };
        for (i, c) in w.embed.chunks.iter().enumerate() {
            let call = params::embed_call(d.h, p.rows, p.tok_off, c);
            ops.push(
                Pipe::Weight(WeightKernel::Embed, c.dtype),
                Bind::Embed(i),
                &call,
            );
        }
        ops.layers(&w.layers, &calls);
        let mut seg = Segment::default();
        if p.n_sel > 0 {
            seg.sample = ops.head(w.lm_head(), p, on_device);
            needs.logit_rows = needs.logit_rows.max(p.n_sel as u64);
            let row = 4 * d.vocab as u64;
            for &(out, dst) in staging_rows {
                if out >= p.out_base && out < p.out_base + p.n_sel {
                    seg.copies.push(((out - p.out_base) as u64 * row, dst, row));
                }
            }
        }
        needs.split = needs.split.max(ops.split_bytes);
        needs.counts = needs.counts.max(ops.count_bytes);
        seg.ops = ops.ops;
        seg
    }

    /// Grows the per-step buffers to `needs` and rebuilds the bind groups if
    /// any storage buffer changed.
    fn ensure(&mut self, needs: &Needs, plan_words: usize) -> Result<(), EngineFaultKind> {
        let d = self.dims;
        let g = &self.gpu;
        let b = &mut self.bufs;
        let mb = g.max_binding;
        let r = needs.rows;
        let mut grown = false;
        grown |= b.plan.ensure(g, 4 * plan_words as u64, mb);
        grown |= b
            .params
            .ensure(g, self.params.bytes().len() as u64, u64::MAX);
        grown |= b.x.ensure(g, r * 4 * d.h as u64, mb);
        grown |= b.xn.ensure(g, r * 4 * d.h as u64, mb);
        grown |= b.qkv.ensure(g, r * 4 * d.qkv_w as u64, mb);
        grown |= b.att.ensure(g, r * 4 * (d.nq * d.hd) as u64, mb);
        grown |= b.gate_up.ensure(g, r * 8 * d.inter as u64, mb);
        grown |= b.act.ensure(g, r * 4 * d.inter as u64, mb);
        grown |= b.part.ensure(g, needs.part, mb);
        grown |= b.counts.ensure(g, needs.counts, mb);
        grown |= b.split.ensure(g, needs.split, mb);
        grown |= b
            .logits
            .ensure(g, needs.logit_rows * 4 * d.vocab as u64, mb);
        grown |= b.sample.ensure(g, needs.sample, mb);
        grown |= b.sampled.ensure(g, needs.sampled, mb);
        b.staging.ensure(g, needs.staging, u64::MAX);
        if grown {
            self.binds = Some(self.build_binds());
        }
        if let Some(e) = self.gpu.take_error() {
            return Err(e.into_fault());
        }
        Ok(())
    }

    fn pipeline(&self, p: Pipe) -> Result<&::wgpu::ComputePipeline, EngineFaultKind> {
        let pp = &self.pipes;
        let missing = || EngineFaultKind::Internal(format!("wgpu: pipeline {p:?} not built"));
        Ok(match p {
            Pipe::Weight(k, d) => pp.weight(k, d).ok_or_else(missing)?,
            Pipe::Norm => &pp.rms_norm,
            Pipe::RopeKv => &pp.rope_kv,
            Pipe::Decode => &pp.attn(self.shape).ok_or_else(missing)?.0,
            Pipe::Prefill => &pp.attn(self.shape).ok_or_else(missing)?.1,
            Pipe::Merge => &pp.attn_merge,
            Pipe::Silu => &pp.silu_mul,
            Pipe::Sample => pp.sample(self.sample_wg).ok_or_else(missing)?,
        })
    }

    fn bind_group(b: &Binds, r: Bind) -> Option<&::wgpu::BindGroup> {
        Some(match r {
            Bind::Embed(c) => b.embed.get(c)?,
            Bind::NormIn(l) => &b.layers.get(l)?.norm_in,
            Bind::NormPost(l) => &b.layers.get(l)?.norm_post,
            Bind::NormFinal => &b.norm_final,
            Bind::Qkv(l, c) => b.layers.get(l)?.qkv.get(c)?,
            Bind::O(l, c) => b.layers.get(l)?.o.get(c)?,
            Bind::GateUp(l, c) => b.layers.get(l)?.gate_up.get(c)?,
            Bind::Glu(l) => b.layers.get(l)?.glu.as_ref()?,
            Bind::QkvNormed(l, c) => b.layers.get(l)?.qkv_normed.get(c)?,
            Bind::QkvRope(l) => b.layers.get(l)?.qkv_rope.as_ref()?,
            Bind::QkvRopeNormed(l) => b.layers.get(l)?.qkv_rope_normed.as_ref()?,
            Bind::GateUpNormed(l, c) => b.layers.get(l)?.gate_up_normed.get(c)?,
            Bind::GluNormed(l) => b.layers.get(l)?.glu_normed.as_ref()?,
            Bind::Down(l, c) => b.layers.get(l)?.down.get(c)?,
            Bind::Head(c) => b.head.get(c)?,
            Bind::RopeKv(l) => &b.layers.get(l)?.rope_kv,
            Bind::Decode(l) => &b.layers.get(l)?.decode,
            Bind::Prefill(l) => &b.layers.get(l)?.prefill,
            Bind::Merge => &b.merge,
            Bind::Silu => &b.silu,
            Bind::Sample => &b.sample,
        })
    }

    /// Sets each of `ops`' pipeline, bind groups and grid in `pass`.
    fn encode(
        &self,
        pass: &mut ::wgpu::ComputePass<'_>,
        binds: &Binds,
        ops: &[Op],
    ) -> Result<(), EngineFaultKind> {
        for op in ops {
            let bg = Self::bind_group(binds, op.bind).ok_or_else(|| {
                EngineFaultKind::Internal(format!("wgpu: no bind group {:?}", op.bind))
            })?;
            pass.set_pipeline(self.pipeline(op.pipe)?);
            pass.set_bind_group(0, bg, &[]);
            pass.set_bind_group(1, &binds.params, &[op.param]);
            pass.dispatch_workgroups(op.groups[0], op.groups[1], 1);
        }
        Ok(())
    }

    /// The forward pass. `sample_ok`: sequences with a sample spec are
    /// sampled on the device (their rows come back only with `keep_row`).
    fn run(
        &mut self,
        batch: &[SeqBatch<'_>],
        sample_ok: bool,
        out: &mut ForwardOutput,
    ) -> Result<(), EngineFaultKind> {
        let c = self.model.config();
        super::check_batch(batch, self.geo, c.vocab_size, c.max_position_embeddings)?;
        out.sampled.clear();
        out.has_row.clear();
        out.logits.clear();
        out.hidden.clear();
        if batch.is_empty() {
            return Ok(());
        }
        let t_plan = Instant::now();
        let step = self.plan_step(batch, sample_ok);
        self.ensure(&step.needs, step.plan.words.len())?;
        self.upload(&step);
        // Out of `self` while recording, which reads the rest of it.
        let mut profiler = self.profiler.take();
        let t_record = Instant::now();
        let mut t_submit = t_record;
        let submitted = self
            .record(&step, profiler.as_mut().filter(|p| !p.paused))
            .and_then(|rec| {
                t_submit = Instant::now();
                rec.finish()
            });
        self.profiler = profiler;
        let submissions = submitted?;
        let t_wait = Instant::now();
        let read = self.read_back(&step, out);
        let h = &mut self.host;
        h.steps += 1;
        h.submissions += submissions;
        h.plan_nanos += nanos(t_record - t_plan);
        h.record_nanos += nanos(t_submit - t_record);
        h.submit_nanos += nanos(t_wait - t_submit);
        h.wait_nanos += nanos(t_wait.elapsed());
        read
    }

    /// Plans a (validated, non-empty) step on the host: the sampling rows,
    /// the `plan` words, each pass's dispatches and parameter blocks, and
    /// what the buffers must hold.
    fn plan_step(&mut self, batch: &[SeqBatch<'_>], sample_ok: bool) -> Step {
        let specs: Vec<Option<SampleSpec<'_>>> = batch
            .iter()
            .filter(|b| b.want_logits)
            .map(|b| b.sample.filter(|_| sample_ok))
            .collect();
        let sample = sample::encode(&specs, self.dims.vocab, &mut self.sample_scratch);
        let on_device: Vec<bool> = sample.rows.iter().map(|r| r.0).collect();
        let plan = plan::build(
            batch,
            &self.inv_freq,
            self.model.config().rope_scaling.mscale(),
            &self.limits,
            &on_device,
        );
        let row_bytes = 4 * self.dims.vocab as u64;
        let out_bytes = 4 * sample.out_words as u64;
        // Staging: the sampled words, then the full rows in order.
        let mut staging_rows = Vec::new();
        let mut at = out_bytes;
        for (i, &f) in plan.full.iter().enumerate() {
            if f {
                staging_rows.push((i as u32, at));
                at += row_bytes;
            }
        }
        // Embeddings: each one's rows of the step, and where they go.
        let hidden_at = at;
        let row_h = 4 * self.dims.h as u64;
        let mut hidden = Vec::new();
        let mut hidden_rows = Vec::new();
        let mut first = 0u64;
        for b in batch {
            let n = b.tokens.len() as u64;
            if let Some(pooling) = b.hidden {
                // The last token's row alone, or every row for the mean.
                let rows = match pooling {
                    Pooling::Last => first + n - 1..first + n,
                    Pooling::Mean => first..first + n,
                };
                let count = rows.end - rows.start;
                hidden.push((pooling, count));
                hidden_rows.push((rows, at));
                at += count * row_h;
            }
            first += n;
        }
        let mut needs = Needs {
            sample: 4 * sample.words.len() as u64,
            sampled: out_bytes,
            staging: at,
            ..Needs::default()
        };
        self.params.clear();
        let mut pass_first = 0u64;
        let segments = plan
            .passes
            .iter()
            .map(|p| {
                let mut seg = self.pass_ops(p, &staging_rows, &on_device, &mut needs);
                let rows = pass_first..pass_first + p.rows as u64;
                for (range, dst) in &hidden_rows {
                    let (lo, hi) = (range.start.max(rows.start), range.end.min(rows.end));
                    if lo < hi {
                        let src = (lo - rows.start) * row_h;
                        let dst = dst + (lo - range.start) * row_h;
                        seg.hidden_copies.push((src, dst, (hi - lo) * row_h));
                    }
                }
                pass_first = rows.end;
                seg
            })
            .collect();
        Step {
            plan,
            sample,
            segments,
            needs,
            hidden,
            hidden_at,
        }
    }

    /// Writes the step's `plan` words, parameter blocks and sampling rows.
    fn upload(&self, step: &Step) {
        let q = &self.gpu.queue;
        q.write_buffer(
            &self.bufs.plan.buf,
            0,
            bytemuck::cast_slice(&step.plan.words),
        );
        q.write_buffer(&self.bufs.params.buf, 0, self.params.bytes());
        if step.sample.any() {
            q.write_buffer(
                &self.bufs.sample.buf,
                0,
                bytemuck::cast_slice(&step.sample.words),
            );
        }
    }

    /// Records the step (submitting its first runs of dispatches on the
    /// way, [`WgpuOptions::first_submit`]) for [`Recorder::finish`] to
    /// submit the rest: per pass its dispatches, the copies of its rows
    /// that come back whole and its sampling; then the copy of the sampled
    /// words. `profiler`, when on, times every dispatch.
    fn record<'a>(
        &'a self,
        step: &Step,
        profiler: Option<&'a mut Profiler>,
    ) -> Result<Recorder<'a>, EngineFaultKind> {
        let binds = self
            .binds
            .as_ref()
            .ok_or_else(|| EngineFaultKind::Internal("wgpu: bind groups missing".into()))?;
        let dispatches = step.segments.iter().map(Segment::dispatches).sum();
        let schedule = SubmitSchedule::new(self.first_submit);
        let mut rec = Recorder::new(&self.gpu, "step", profiler, dispatches, schedule);
        let encode = |pass: &mut ::wgpu::ComputePass<'_>, ops: &[Op]| self.encode(pass, binds, ops);
        let staging = &self.bufs.staging.buf;
        for seg in &step.segments {
            rec.pass("forward", &seg.ops, Op::name, encode)?;
            for &(src, dst, bytes) in &seg.copies {
                rec.encoder().copy_buffer_to_buffer(
                    &self.bufs.logits.buf,
                    src,
                    staging,
                    dst,
                    bytes,
                );
            }
            for &(src, dst, bytes) in &seg.hidden_copies {
                rec.encoder()
                    .copy_buffer_to_buffer(&self.bufs.x.buf, src, staging, dst, bytes);
            }
            if let Some(op) = &seg.sample {
                rec.pass("sample", std::slice::from_ref(op), Op::name, encode)?;
            }
        }
        if step.sample.any() {
            let bytes = step.needs.sampled;
            rec.encoder()
                .copy_buffer_to_buffer(&self.bufs.sampled.buf, 0, staging, 0, bytes);
        }
        Ok(rec)
    }

    /// Reads back what the step sampled and the rows that come back whole.
    fn read_back(&mut self, step: &Step, out: &mut ForwardOutput) -> Result<(), EngineFaultKind> {
        let g = &self.gpu;
        if step.plan.full.is_empty() && step.hidden.is_empty() {
            return match g.take_error() {
                Some(e) => Err(e.into_fault()),
                None => Ok(()),
            };
        }
        let (sampled, staged) = (step.needs.sampled as usize, step.needs.staging);
        self.staged = g
            .read_mapped(&self.bufs.staging.buf, staged)
            .map_err(GpuError::into_fault)?;
        let words: Vec<u32> = self.staged[..sampled]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.sampled = sample::decode(&words, &step.sample);
        out.has_row.extend_from_slice(&step.plan.full);
        let floats = |bytes: &[u8]| -> Vec<f32> {
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let hidden_at = step.hidden_at as usize;
        out.logits.extend(floats(&self.staged[sampled..hidden_at]));
        // The final norm of the embeddings' rows, here: a few rows a step,
        // against a norm and a copy per pass on the device.
        let (h, c) = (self.dims.h as usize, self.model.config());
        let norm = &self.model.weights().norm;
        let mut at = hidden_at;
        let mut normed = Vec::new();
        for &(pooling, n) in &step.hidden {
            let n = n as usize;
            let rows = floats(&self.staged[at..at + 4 * n * h]);
            at += 4 * n * h;
            super::rms_norm_rows(&rows, norm, c.rms_norm_eps, &mut normed);
            super::pool_rows(&normed, h, pooling, &mut out.hidden);
        }
        Ok(())
    }
}

/// A duration in whole nanoseconds (saturating: a step takes far less).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn kv_blocks(&self) -> usize {
        self.geo.num_blocks
    }

    fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<(), EngineFaultKind> {
        let n = self.geo.num_blocks;
        if pairs.is_empty() {
            return Ok(());
        }
        let len = self.geo.block_len() as u64 * 4;
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&::wgpu::CommandEncoderDescriptor {
                label: Some("copy_blocks"),
            });
        for &(src, dst) in pairs {
            if src as usize >= n || dst as usize >= n {
                return Err(EngineFaultKind::Internal(format!(
                    "copy_blocks ({src}, {dst}) outside the pool of {n} blocks"
                )));
            }
            if src == dst {
                continue;
            }
            // Through a scratch block: a buffer cannot be copied onto itself.
            for l in &self.weights.layers {
                for buf in [&l.k, &l.v] {
                    enc.copy_buffer_to_buffer(buf, src as u64 * len, &self.scratch, 0, len);
                    enc.copy_buffer_to_buffer(&self.scratch, 0, buf, dst as u64 * len, len);
                }
            }
        }
        self.gpu.queue.submit([enc.finish()]);
        match self.gpu.take_error() {
            Some(e) => Err(e.into_fault()),
            None => Ok(()),
        }
    }

    fn forward(
        &mut self,
        batch: &[SeqBatch<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineFaultKind> {
        let mut out = ForwardOutput {
            logits: std::mem::take(logits),
            ..ForwardOutput::default()
        };
        let r = self.run(batch, false, &mut out);
        *logits = out.logits;
        r
    }

    fn forward_select(
        &mut self,
        batch: &[SeqBatch<'_>],
        out: &mut ForwardOutput,
    ) -> Result<(), EngineFaultKind> {
        self.run(batch, true, out)
    }
}
