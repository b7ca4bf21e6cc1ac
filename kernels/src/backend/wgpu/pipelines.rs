//! The WGSL kernels (one file per operation under `shaders/`), their bind
//! group layouts and compute pipelines, and how a weight product is cut
//! into dispatches.

use std::collections::HashMap;

use tokenwire_gguf::GgmlType;

use super::attn::{merge_consts, AttnShape};
use super::context::{grid, Gpu};
use super::coop::{CoopConfig, CoopTile, CoopTiles};
use super::params::{Call, MatMulParams, MatVecParams, MAT_VEC_ACCUMULATE, PARAM_BYTES};

/// How one weight tensor is stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    /// 4 bytes per value.
    F32,
    /// f16 pairs packed in u32, widened with `unpack2x16float`.
    F16,
    /// f16 read as `array<vec4<f16>>` (devices with `shader-f16`).
    F16Native,
    /// bf16 pairs packed in u32, widened by a shift.
    Bf16,
    /// GGUF Q8_0 blocks, each padded from 34 to 36 bytes.
    Q8_0,
    /// GGUF Q4_0 blocks, each padded from 18 to 20 bytes.
    Q4_0,
    /// GGUF Q4_1 blocks (20 bytes, as in the file).
    Q4_1,
    /// GGUF Q5_0 blocks, each padded from 22 to 24 bytes.
    Q5_0,
    /// GGUF Q5_1 blocks (24 bytes, as in the file).
    Q5_1,
    /// GGUF Q2_K super-blocks (84 bytes, as in the file).
    Q2K,
    /// GGUF Q3_K super-blocks, each padded from 110 to 112 bytes.
    Q3K,
    /// GGUF Q4_K super-blocks (144 bytes, as in the file).
    Q4K,
    /// GGUF Q5_K super-blocks (176 bytes, as in the file).
    Q5K,
    /// GGUF Q6_K super-blocks, each padded from 210 to 212 bytes.
    Q6K,
    /// GGUF IQ4_NL blocks, each padded from 18 to 20 bytes (as Q4_0).
    Iq4Nl,
    /// GGUF IQ4_XS super-blocks (136 bytes, as in the file).
    Iq4Xs,
}

impl WeightDtype {
    /// The device type that keeps a tensor of file type `t` as it is
    /// (`f16_native`: the device reads f16 natively).
    pub(crate) fn of_file(t: GgmlType, f16_native: bool) -> WeightDtype {
        match t {
            GgmlType::F32 => WeightDtype::F32,
            GgmlType::F16 if f16_native => WeightDtype::F16Native,
            GgmlType::F16 => WeightDtype::F16,
            GgmlType::BF16 => WeightDtype::Bf16,
            GgmlType::Q8_0 => WeightDtype::Q8_0,
            GgmlType::Q4_0 => WeightDtype::Q4_0,
            GgmlType::Q4_1 => WeightDtype::Q4_1,
            GgmlType::Q5_0 => WeightDtype::Q5_0,
            GgmlType::Q5_1 => WeightDtype::Q5_1,
            GgmlType::Q2_K => WeightDtype::Q2K,
            GgmlType::Q3_K => WeightDtype::Q3K,
            GgmlType::Q4_K => WeightDtype::Q4K,
            GgmlType::Q5_K => WeightDtype::Q5K,
            GgmlType::Q6_K => WeightDtype::Q6K,
            GgmlType::IQ4_NL => WeightDtype::Iq4Nl,
            GgmlType::IQ4_XS => WeightDtype::Iq4Xs,
        }
    }

    /// The file type whose values this type holds as they are.
    pub(crate) fn file_type(self) -> GgmlType {
        match self {
            WeightDtype::F32 => GgmlType::F32,
            WeightDtype::F16 | WeightDtype::F16Native => GgmlType::F16,
            WeightDtype::Bf16 => GgmlType::BF16,
            WeightDtype::Q8_0 => GgmlType::Q8_0,
            WeightDtype::Q4_0 => GgmlType::Q4_0,
            WeightDtype::Q4_1 => GgmlType::Q4_1,
            WeightDtype::Q5_0 => GgmlType::Q5_0,
            WeightDtype::Q5_1 => GgmlType::Q5_1,
            WeightDtype::Q2K => GgmlType::Q2_K,
            WeightDtype::Q3K => GgmlType::Q3_K,
            WeightDtype::Q4K => GgmlType::Q4_K,
            WeightDtype::Q5K => GgmlType::Q5_K,
            WeightDtype::Q6K => GgmlType::Q6_K,
            WeightDtype::Iq4Nl => GgmlType::IQ4_NL,
            WeightDtype::Iq4Xs => GgmlType::IQ4_XS,
        }
    }

    /// Zero bytes the device adds to each file block so fields start on a
    /// word (see [`WeightDtype::pad_blocks`]).
    fn block_padding(self) -> usize {
        match self {
            WeightDtype::Q8_0
            | WeightDtype::Q4_0
            | WeightDtype::Q5_0
            | WeightDtype::Iq4Nl
            | WeightDtype::Q3K
            | WeightDtype::Q6K => 2,
            _ => 0,
        }
    }

    /// Whether values come in GGUF blocks (uploaded as raw block bytes).
    pub fn is_quantized(self) -> bool {
        self.file_type().block_len() > 1
    }

    /// Whether two values share a u32 word (f16 and bf16), so a chunk of an
    /// odd-width matrix must hold an even number of rows.
    pub(crate) fn packs_pairs(self) -> bool {
        matches!(self.file_type(), GgmlType::F16 | GgmlType::BF16)
    }

    /// Bytes a row of `k` values (whole blocks) takes on the device (for the
    /// 2-byte types, `k` may be odd: the row then shares a word with the
    /// next one).
    pub fn row_bytes(self, k: usize) -> usize {
        let t = self.file_type();
        k / t.block_len() * (t.block_bytes() + self.block_padding())
    }

    /// The weight prelude of every weight kernel: `w_at` and `w_load8` for
    /// this type (see the module docs of `shaders/dtype_*.wgsl`).
    fn prelude(self) -> String {
        let body = match self {
            WeightDtype::F32 => include_str!("shaders/dtype_f32.wgsl"),
            WeightDtype::F16 => include_str!("shaders/dtype_f16.wgsl"),
            WeightDtype::F16Native => include_str!("shaders/dtype_f16_native.wgsl"),
            WeightDtype::Bf16 => include_str!("shaders/dtype_bf16.wgsl"),
            WeightDtype::Q8_0 => include_str!("shaders/dtype_q8_0.wgsl"),
            WeightDtype::Q4_0 => include_str!("shaders/dtype_q4_0.wgsl"),
            WeightDtype::Q4_1 => include_str!("shaders/dtype_q4_1.wgsl"),
            WeightDtype::Q5_0 => include_str!("shaders/dtype_q5_0.wgsl"),
            WeightDtype::Q5_1 => include_str!("shaders/dtype_q5_1.wgsl"),
            WeightDtype::Q2K => include_str!("shaders/dtype_q2_k.wgsl"),
            WeightDtype::Q3K => include_str!("shaders/dtype_q3_k.wgsl"),
            WeightDtype::Q4K => include_str!("shaders/dtype_q4_k.wgsl"),
            WeightDtype::Q5K => include_str!("shaders/dtype_q5_k.wgsl"),
            WeightDtype::Q6K => include_str!("shaders/dtype_q6_k.wgsl"),
            WeightDtype::Iq4Nl => include_str!("shaders/dtype_iq4_nl.wgsl"),
            WeightDtype::Iq4Xs => include_str!("shaders/dtype_iq4_xs.wgsl"),
        };
        let blocks = if self.is_quantized() {
            include_str!("shaders/dtype_blocks.wgsl")
        } else {
            ""
        };
        // What two block formats read alike.
        let shared = match self {
            WeightDtype::Q4K | WeightDtype::Q5K => include_str!("shaders/dtype_k_scales.wgsl"),
            WeightDtype::Q5_0 | WeightDtype::Q5_1 => include_str!("shaders/dtype_q5_bits.wgsl"),
            WeightDtype::Iq4Nl | WeightDtype::Iq4Xs => include_str!("shaders/dtype_iq4_table.wgsl"),
            _ => "",
        };
        // The f16-native prelude's `enable` must open the module.
        format!(
            "{body}\n{blocks}\n{shared}\n{}",
            include_str!("shaders/weights.wgsl")
        )
    }

    /// Values (f32 in memory) as the device stores them, little-endian, for
    /// the float types. For the 2-byte types the values came from a matrix
    /// of that type, so they round-trip exactly. Quantized types are not
    /// encoded from values: their rows go up as block bytes
    /// ([`WeightDtype::pad_blocks`]).
    pub(crate) fn encode(self, vals: &[f32], out: &mut Vec<u8>) {
        match self {
            WeightDtype::F32 => out.extend_from_slice(bytemuck::cast_slice(vals)),
            WeightDtype::F16 | WeightDtype::F16Native => {
                out.extend(
                    vals.iter()
                        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes()),
                );
            }
            WeightDtype::Bf16 => {
                out.extend(
                    vals.iter()
                        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()),
                );
            }
            q => unreachable!("{q:?} rows are uploaded as blocks, not values"),
        }
    }

    /// Appends a row of file blocks (`row`, whole blocks of this quantized
    /// type) as the device lays them out: Q8_0, Q4_0, Q5_0 and IQ4_NL get 2 zero bytes
    /// after their f16 scale so the values start on a word; Q3_K and Q6_K
    /// get 2 at the end so the next block does.
    pub(crate) fn pad_blocks(self, row: &[u8], out: &mut Vec<u8>) {
        for b in row.chunks_exact(self.file_type().block_bytes()) {
            match self {
                WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Q5_0 | WeightDtype::Iq4Nl => {
                    out.extend_from_slice(&b[..2]);
                    out.extend_from_slice(&[0, 0]);
                    out.extend_from_slice(&b[2..]);
                }
                WeightDtype::Q3K | WeightDtype::Q6K => {
                    out.extend_from_slice(b);
                    out.extend_from_slice(&[0, 0]);
                }
                _ => out.extend_from_slice(b),
            }
        }
    }
}

/// Mat-vec handles at most this many columns (tokens) per dispatch: a
/// decode step of up to 64 sequences reads each weight once.
pub(crate) const MAT_VEC_COLS: usize = 64;
/// The most columns per mat-vec dispatch with one invocation per row (CPU
/// adapters): each SIMD lane then holds every column's accumulator, and
/// past 8 they spill (lavapipe, TinyLlama's shape at batch 32: 3.9 s a
/// step in one dispatch of 32 columns against 3.5 s in four of 8).
const MAT_VEC_COLS_PER_ROW: usize = 8;

/// The most columns one mat-vec dispatch takes; `pair`: a variant whose
/// units sum two weight rows (the fused SwiGLU or RoPE), which holds two
/// accumulators per column and so stops at 32.
fn mat_vec_max_cols(split_k: bool, pair: bool) -> usize {
    match (split_k, pair) {
        (false, _) => MAT_VEC_COLS_PER_ROW,
        (true, false) => MAT_VEC_COLS,
        (true, true) => MAT_VEC_COLS / 2,
    }
}
/// Whether a paired variant (the fused SwiGLU or RoPE) takes `cols` columns
/// in no more dispatches than the plain mat-vec: each dispatch reads the
/// whole weight, so past that the fusion would read it again to save one
/// small dispatch (split rows: past 32 columns).
pub(crate) fn pair_fits_plain_groups(split_k: bool, cols: u32) -> bool {
    let groups = |pair| cols.div_ceil(mat_vec_max_cols(split_k, pair) as u32);
    groups(true) <= groups(false)
}

/// Mat-vec variants of up to this many columns issue several weight loads
/// together ([`mat_vec_unroll`]); wider ones have a column's worth of
/// arithmetic per load to hide its latency, and registers to save.
const MAT_VEC_UNROLL_COLS: u32 = 8;

/// The 8-wide steps whose weight loads a mat-vec variant of `cols` columns
/// issues together: `chosen` (1, 2 or 4) up to [`MAT_VEC_UNROLL_COLS`]
/// columns, else 1. Unchosen: 1 with rows split over invocations (GPUs):
/// on an NVIDIA H200 (TinyLlama's shape in bf16, 128-token prompts) unroll
/// 1 decoded 298-314 tok/s at batch 1 and 1,109 at batch 8, against 188 /
/// 936 at 2 and 174-177 / 870 at 4, the earlier default; the split rows
/// already keep enough loads in flight, and the unrolled loop's registers
/// cost the occupancy that hides their latency. With one invocation per
/// row (CPU adapters) 2 for one column and 1 for more, as measured on
/// lavapipe: there wider unrolls slow the many-column variants (2-layer
/// TinyLlama at batch 8: 570 ms a step at 1, 680 at 2, 790 at 4), while
/// the one-column variant at 1 hits a slow llvmpipe case on stories260K's
/// shape (35 ms a step against 0.9 at 2; the loop before unrolling had it
/// in the SwiGLU variant, 7.7 ms).
fn mat_vec_unroll(split_k: bool, cols: u32, chosen: Option<u32>) -> u32 {
    if cols > MAT_VEC_UNROLL_COLS {
        return 1;
    }
    match chosen {
        Some(u) => u.clamp(1, 4).next_power_of_two(),
        None if split_k => 1,
        None if cols == 1 => 2,
        None => 1,
    }
}
/// Columns the split-K mat-vec reduces per round through workgroup memory.
const MAT_VEC_REDUCE_COLS: u32 = 8;
/// Invocations per output row of the mat-vec kernel for rows of `k` values
/// (its workgroups have 256 invocations, so 256 / tpr rows each); 1 when
/// the kernel computes whole rows per invocation (`split_k` off).
fn mat_vec_tpr(k: usize, split_k: bool) -> u32 {
    if !split_k {
        return 1;
    }
    match k {
        0..=64 => 8,
        65..=256 => 16,
        257..=1024 => 32,
        _ => 64,
    }
}
/// Entries each of the first `wg / fan` invocations sums in the sampling
/// kernel's two-level reductions (`wg` a power of two).
fn sample_fan(wg: u32) -> u32 {
    1 << wg.trailing_zeros().div_ceil(2)
}

/// Row elements the sampling kernel's loops visit per iteration (UNROLL).
const SAMPLE_UNROLL: u64 = 8;

/// Most logprob alternatives sample.wgsl computes; rows that
/// ask for more come back as logits rows for the CPU sampler.
pub(crate) const MAX_DEVICE_LOGPROBS: u32 = 32;
/// Logprobs of at least this many best tokens are found on the device by
/// one count search and a gathering pass; fewer by rounds of masked
/// argmax. On lavapipe a search with its gathering pass cost about ten
/// rounds (greedy rows: 5 best 1.8 ms by rounds against 3.3 by the search,
/// 20 best 5.0 against 3.4); a GPU's break-even is unmeasured. Prepended
/// to sample.wgsl.
pub(crate) const SAMPLE_NTH_SEARCH_FROM: u32 = 12;
// The gathered ones fill at most the 256 radix buckets' words.
const _: () = assert!(MAX_DEVICE_LOGPROBS <= 256 && SAMPLE_NTH_SEARCH_FROM >= 1);

/// llvmpipe (lavapipe) ends the loops of an invocation after this many
/// iterations in all, silently; the bound below stays under it.
const LLVMPIPE_LOOP_LIMIT: u64 = 65_535;

/// An upper bound on the loop iterations one invocation of sample.wgsl runs
/// on a row of `vocab` with workgroups of `wg` (every loop of the kernel,
/// the worst path: top-k, top-p and the draw, then the most logprobs).
pub(crate) fn sample_loop_bound(vocab: u32, wg: u32) -> u64 {
    let v = vocab.max(1) as u64;
    let wg = wg as u64;
    let fan = sample_fan(wg as u32) as u64;
    let row = v.div_ceil(wg * SAMPLE_UNROLL);
    // A whole-row sum or argmax: the row, then the two-level reduction.
    let per_pass = row + fan + wg / fan;
    // Logprobs: the sum behind the log-softmax, its argmax, and the n
    // best by rounds of argmax (fewer than the search takes) or one
    // gathering pass.
    let passes = 8 + (SAMPLE_NTH_SEARCH_FROM as u64 - 1) + 1;
    // A radix pass: clearing 256 buckets, the row, the 16 group sums of 16
    // buckets, the scans over groups and buckets, and the search's own loop.
    let per_radix = 256u64.div_ceil(wg) + row + 16u64.div_ceil(wg) * 17 + 16 + 16 + 1;
    // Four searches (top-k, top-p, the draw, the logprobs' n-th) of 4 key
    // bytes and the ids' bytes.
    let id_bytes = (64 - (v - 1).max(1).leading_zeros() as u64).div_ceil(8);
    let radix_passes = 4 * (4 + id_bytes);
    // The gathered ones' ranks: a loop over the n of them for each.
    let ranks = (MAX_DEVICE_LOGPROBS as u64).div_ceil(wg) * (MAX_DEVICE_LOGPROBS as u64 + 1);
    passes * per_pass + radix_passes * per_radix + ranks + 64
}

/// The sampling workgroup for a vocabulary on a CPU adapter: the smallest
/// (every barrier is expensive there) whose worst row stays under
/// llvmpipe's loop limit.
pub(crate) fn cpu_sample_wg(vocab: u32) -> u32 {
    let mut wg = 8;
    while wg < 256 && sample_loop_bound(vocab, wg) > LLVMPIPE_LOOP_LIMIT - 4096 {
        wg *= 2;
    }
    wg
}

/// Output tile of the tiled matmul.
const MAT_MUL_TILE: u32 = 64;

/// Bind group layouts: one per binding shape, shared by the kernels that
/// have it (mat-vec and matmul of every dtype share `mat`).
#[derive(Debug)]
pub(crate) struct Layouts {
    pub(crate) params: ::wgpu::BindGroupLayout,
    pub(crate) mat: ::wgpu::BindGroupLayout,
    /// The q|k|v mat-vec with RoPE and the KV write: `mat`'s first four,
    /// then plan, K and V (qkv_rope.wgsl).
    pub(crate) mat_rope: ::wgpu::BindGroupLayout,
    pub(crate) embed: ::wgpu::BindGroupLayout,
    pub(crate) norm: ::wgpu::BindGroupLayout,
    pub(crate) rope_kv: ::wgpu::BindGroupLayout,
    pub(crate) decode: ::wgpu::BindGroupLayout,
    pub(crate) merge: ::wgpu::BindGroupLayout,
    pub(crate) prefill: ::wgpu::BindGroupLayout,
    pub(crate) silu: ::wgpu::BindGroupLayout,
    pub(crate) sample: ::wgpu::BindGroupLayout,
}

fn storage_layout(gpu: &Gpu, label: &str, rw: &[(u32, bool)]) -> ::wgpu::BindGroupLayout {
    let entries: Vec<::wgpu::BindGroupLayoutEntry> = rw
        .iter()
        .map(|&(binding, read_only)| ::wgpu::BindGroupLayoutEntry {
            binding,
            visibility: ::wgpu::ShaderStages::COMPUTE,
            ty: ::wgpu::BindingType::Buffer {
                ty: ::wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    gpu.device
        .create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
            label: Some(label),
            entries: &entries,
        })
}

impl Layouts {
    fn new(gpu: &Gpu) -> Layouts {
        const R: bool = true;
        const W: bool = false;
        let params = gpu
            .device
            .create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
                label: Some("params"),
                entries: &[::wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: ::wgpu::ShaderStages::COMPUTE,
                    ty: ::wgpu::BindingType::Buffer {
                        ty: ::wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: ::wgpu::BufferSize::new(PARAM_BYTES),
                    },
                    count: None,
                }],
            });
        Layouts {
            params,
            mat: storage_layout(
                gpu,
                "mat",
                &[(0, R), (1, R), (2, R), (3, W), (4, W), (5, W)],
            ),
            mat_rope: storage_layout(
                gpu,
                "mat_rope",
                &[(0, R), (1, R), (2, R), (3, W), (6, R), (7, W), (8, W)],
            ),
            embed: storage_layout(gpu, "embed", &[(0, R), (1, R), (2, W)]),
            norm: storage_layout(gpu, "norm", &[(0, R), (1, R), (2, R), (3, W)]),
            rope_kv: storage_layout(gpu, "rope_kv", &[(0, R), (1, W), (2, W), (3, W), (4, R)]),
            decode: storage_layout(
                gpu,
                "attn_decode",
                &[(0, R), (1, R), (2, R), (3, R), (4, W), (5, W), (6, W)],
            ),
            merge: storage_layout(gpu, "attn_merge", &[(0, R), (1, R), (2, W)]),
            prefill: storage_layout(
                gpu,
                "attn_prefill",
                &[(0, R), (1, R), (2, R), (3, R), (4, W)],
            ),
            silu: storage_layout(gpu, "silu_mul", &[(0, R), (1, W)]),
            sample: storage_layout(gpu, "sample", &[(0, W), (1, R), (2, W)]),
        }
    }
}

/// Kernels whose weights come in several storage types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum WeightKernel {
    Embed,
    /// The mat-vec variant for up to this many columns (a power of two);
    /// with `true`, the RMSNorm of x fused in (split-row mat-vec only).
    MatVec(u32, bool),
    /// The fused SwiGLU mat-vec (gate and up rows of a stacked matrix, then
    /// silu(gate) * up) for up to this many columns, with or without the
    /// norm fused in.
    Glu(u32, bool),
    /// The q|k|v mat-vec with RoPE and the KV cache write fused in (pairs
    /// of rows of each head, rotated, then written to y and the cache) for
    /// up to this many columns, with or without the norm fused in.
    Rope(u32, bool),
    MatMul,
    /// The tiled matmul on cooperative matrices (coop_mat_mul.wgsl), with
    /// this tile.
    Coop(CoopTile),
    /// The sum of a split-k coop product's partials into y
    /// (split_sum.wgsl; built per weight type only to share the products'
    /// bind groups and keys, it reads no weights).
    SplitSum,
}

/// Which kernel multiplies a product's token columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Mat-vec groups (each weight read once per group of columns).
    MatVec,
    /// The tiled matmul on f32 arithmetic.
    Tiled,
    /// The tiled matmul on cooperative matrices of this configuration.
    Coop(CoopConfig),
}

/// The mat-vec variant for `cols` columns (at most [`mat_vec_max_cols`]).
fn mat_vec_variant(cols: usize) -> u32 {
    (cols.clamp(1, MAT_VEC_COLS) as u32).next_power_of_two()
}

/// Where the RoPE variant of the q|k|v mat-vec ([`Pair::Rope`]) finds its
/// rows' angles and KV slots in `plan`, and which heads it rotates and
/// caches: what rope_kv.wgsl takes besides q|k|v.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RopeFuse {
    /// Half a head's width.
    pub(crate) half: u32,
    /// Query heads (the key heads follow them, then the value heads).
    pub(crate) q_heads: u32,
    pub(crate) kv_heads: u32,
    /// Word offsets in `plan` of the pass's cos and sin (`[rows][half]`,
    /// f32 bits) and of its rows' KV slots.
    pub(crate) cs_off: u32,
    pub(crate) sn_off: u32,
    pub(crate) slot_off: u32,
    /// KV block size.
    pub(crate) bs: u32,
}

/// What each output unit of a mat-vec computes from two weight rows, where
/// it does (a fusion of the product with the kernel that follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pair {
    /// One row per output: a plain product.
    None,
    /// SwiGLU: gate row o and up row o + rows of a stacked matrix.
    Glu,
    /// RoPE and the KV write: rows a and a + half of each head of q|k|v.
    Rope(RopeFuse),
}

/// One product through one weight chunk, as the backend and the kernel lab
/// both dispatch it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Product {
    /// Input features.
    pub(crate) k: u32,
    /// Output rows of this chunk (with [`Pair::Glu`], the intermediate
    /// size: gate rows, each with its up row that many rows further on;
    /// with [`Pair::Rope`], the q|k|v width, taken as pairs).
    pub(crate) rows: u32,
    /// First output row of this chunk.
    pub(crate) row0: u32,
    /// Token columns.
    pub(crate) cols: u32,
    /// Strides between the columns of x and y.
    pub(crate) ldx: u32,
    pub(crate) ldy: u32,
    /// Add the chunk's bias (not with [`Pair::Glu`] or `norm_eps`).
    pub(crate) bias: bool,
    /// The kernel (the fused variants need [`Kernel::MatVec`]).
    pub(crate) kernel: Kernel,
    /// Mat-vec rows split over invocations.
    pub(crate) split_k: bool,
    /// A fused variant whose units sum two rows (mat-vec only).
    pub(crate) pair: Pair,
    /// The fused RMSNorm with this epsilon (mat-vec only).
    pub(crate) norm_eps: Option<f32>,
    /// Add the product into y.
    pub(crate) accumulate: bool,
}

/// One dispatch of a [`Product`]: its kernel, parameter block and grid.
#[derive(Debug, Clone)]
pub(crate) struct ProductCall {
    pub(crate) kind: WeightKernel,
    pub(crate) call: Call,
}

impl Product {
    /// The dispatches: one tiled matmul (on f32 arithmetic or cooperative
    /// matrices; on the latter split over k where it has too few tiles,
    /// then the sum of the splits), or mat-vec groups of at most
    /// [`mat_vec_max_cols`] columns.
    pub(crate) fn calls(&self) -> Vec<ProductCall> {
        let has_bias = u32::from(self.bias && self.pair != Pair::Glu && self.norm_eps.is_none());
        let [part_n, part_m] = match self.kernel {
            Kernel::Coop(c) => c.part_plane(self.rows, self.cols),
            _ => [0, 0],
        };
        let (kind, groups, (splits, k_len)) = match self.kernel {
            Kernel::MatVec => return self.mat_vec_calls(has_bias),
            Kernel::Tiled => (
                WeightKernel::MatMul,
                [
                    self.rows.div_ceil(MAT_MUL_TILE),
                    self.cols.div_ceil(MAT_MUL_TILE),
                ],
                (1, self.k),
            ),
            Kernel::Coop(c) => (
                WeightKernel::Coop(c.tile),
                c.groups(self.rows, self.cols),
                c.k_splits(self.rows, self.cols, self.k),
            ),
        };
        debug_assert!(
            self.pair == Pair::None && self.norm_eps.is_none(),
            "mat-vec only"
        );
        let params = MatMulParams {
            k: self.k,
            rows: self.rows,
            row0: self.row0,
            m: self.cols,
            ldx: self.ldx,
            ldy: self.ldy,
            has_bias,
            x_off: 0,
            y_off: 0,
            accumulate: u32::from(self.accumulate),
            splits,
            k_len,
            m_groups: groups[1],
            fold: u32::from(splits > 1 && self.folds()),
            part_n,
            part_m,
        };
        let mut calls = vec![ProductCall {
            kind,
            call: params.call([groups[0], groups[1] * splits]),
        }];
        if splits > 1 && !self.folds() {
            calls.push(ProductCall {
                kind: WeightKernel::SplitSum,
                call: params.call(grid((self.cols * self.rows).div_ceil(256))),
            });
        }
        calls
    }

    /// Whether a split of this product sums the splits itself (a coop
    /// configuration that folds).
    fn folds(&self) -> bool {
        matches!(self.kernel, Kernel::Coop(c) if c.fold)
    }

    /// Bytes of the split counters the product's folded split sum uses (0
    /// unsplit or not folded): one u32 per output tile.
    pub(crate) fn count_bytes(&self) -> u64 {
        match self.kernel {
            Kernel::Coop(c) if c.fold && c.k_splits(self.rows, self.cols, self.k).0 > 1 => {
                let [n, m] = c.groups(self.rows, self.cols);
                4 * n as u64 * m as u64
            }
            _ => 0,
        }
    }

    /// Bytes of partial sums the product's split-k coop dispatch writes
    /// (0 unsplit): the scratch binding must hold them.
    pub(crate) fn split_bytes(&self) -> u64 {
        match self.kernel {
            Kernel::Coop(c) => {
                let (splits, _) = c.k_splits(self.rows, self.cols, self.k);
                if splits > 1 {
                    let [n, m] = c.part_plane(self.rows, self.cols);
                    4 * splits as u64 * n as u64 * m as u64
                } else {
                    0
                }
            }
            _ => 0,
        }
    }

    /// Mat-vec groups of at most [`mat_vec_max_cols`] columns.
    fn mat_vec_calls(&self, has_bias: u32) -> Vec<ProductCall> {
        let tpr = mat_vec_tpr(self.k as usize, self.split_k);
        let norm = self.norm_eps.is_some();
        let max = mat_vec_max_cols(self.split_k, self.pair != Pair::None) as u32;
        // RoPE units are the pairs of each head; none of its rows are
        // another chunk's, and it adds nothing into y.
        let units = match self.pair {
            Pair::Rope(_) => self.rows / 2,
            _ => self.rows,
        };
        let rope = match self.pair {
            Pair::Rope(r) => {
                // qkv_rope.wgsl finds a unit's head from its place in the
                // chunk and stores rather than adds.
                debug_assert!(self.row0 == 0 && !self.accumulate, "{self:?}");
                r
            }
            _ => RopeFuse::default(),
        };
        let mut calls = Vec::new();
        let mut c0 = 0;
        while c0 < self.cols {
            let ncols = (self.cols - c0).min(max);
            let variant = mat_vec_variant(ncols as usize);
            let params = MatVecParams {
                k: self.k,
                rows: units,
                row0: self.row0,
                ncols,
                ldx: self.ldx,
                ldy: self.ldy,
                has_bias,
                x_off: c0 * self.ldx,
                y_off: c0 * self.ldy,
                tpr,
                up_row: match self.pair {
                    Pair::None => 0,
                    Pair::Glu => self.rows,
                    Pair::Rope(r) => r.half,
                },
                flags: if self.accumulate {
                    MAT_VEC_ACCUMULATE
                } else {
                    0
                },
                eps: self.norm_eps.unwrap_or(0.0),
                col0: c0,
                cs_off: rope.cs_off,
                sn_off: rope.sn_off,
                slot_off: rope.slot_off,
                k_head0: rope.q_heads,
                kv_heads: rope.kv_heads,
                bs: rope.bs,
            };
            calls.push(ProductCall {
                kind: match self.pair {
                    Pair::None => WeightKernel::MatVec(variant, norm),
                    Pair::Glu => WeightKernel::Glu(variant, norm),
                    Pair::Rope(_) => WeightKernel::Rope(variant, norm),
                },
                call: params.call(grid(units.div_ceil(256 / tpr))),
            });
            c0 += ncols;
        }
        calls
    }
}

/// mat_vec.wgsl's `store_pair` in every variant but RoPE's (which appends
/// qkv_rope.wgsl, with the bindings it needs): never called.
const NO_STORE_PAIR: &str = "fn store_pair(a0: f32, b0: f32, unit: u32, row: u32, c: u32) {}\n";

/// What mat_vec.wgsl's split-row reduction calls for subgroup shuffles:
/// `sg_xor` and, without subgroups, a subgroup size of 1 (no shuffles).
fn subgroup_helpers(on: bool) -> &'static str {
    if on {
        "const SUBGROUPS: bool = true;\n\
         fn sg_xor(v: f32, mask: u32) -> f32 { return subgroupShuffleXor(v, mask); }\n"
    } else {
        "const SUBGROUPS: bool = false;\nconst sg_size: u32 = 1u;\n\
         fn sg_xor(v: f32, mask: u32) -> f32 { return v; }\n"
    }
}

/// Every pipeline a forward pass uses.
#[derive(Debug)]
pub(crate) struct Pipelines {
    pub(crate) layouts: Layouts,
    /// Mat-vec splits each row over several invocations (GPUs); false on CPU
    /// adapters, where one invocation per row avoids workgroup barriers.
    pub(crate) split_k: bool,
    /// The device has subgroup operations enabled.
    gpu_subgroups: bool,
    /// Weight loads a mat-vec invocation issues together, where chosen
    /// ([`mat_vec_unroll`]).
    unroll: Option<u32>,
    /// K row vectors decode attention loads together
    /// ([`super::attn::decode_k_chunk`]).
    k_chunk: u32,
    /// Compile the RoPE variants of mat-vec ([`WeightKernel::Rope`]):
    /// only where the fusion is on.
    rope: bool,
    /// The cooperative-matrix configurations, where the device has them:
    /// the coop matmul is then compiled for every weight type and tile.
    pub(crate) coop: CoopTiles,
    weight: HashMap<(WeightKernel, WeightDtype), ::wgpu::ComputePipeline>,
    pub(crate) rms_norm: ::wgpu::ComputePipeline,
    pub(crate) rope_kv: ::wgpu::ComputePipeline,
    pub(crate) silu_mul: ::wgpu::ComputePipeline,
    sample: HashMap<u32, ::wgpu::ComputePipeline>,
    pub(crate) attn_merge: ::wgpu::ComputePipeline,
    attn: HashMap<AttnShape, (::wgpu::ComputePipeline, ::wgpu::ComputePipeline)>,
}

fn compile(
    gpu: &Gpu,
    label: &str,
    source: String,
    layout: &::wgpu::BindGroupLayout,
    params: &::wgpu::BindGroupLayout,
) -> ::wgpu::ComputePipeline {
    let module = gpu.shader_module(label, source);
    let pl = gpu
        .device
        .create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
            label: Some(label),
            bind_group_layouts: &[Some(layout), Some(params)],
            immediate_size: 0,
        });
    gpu.device
        .create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: Some(&pl),
            module: &module,
            entry_point: Some("main"),
            compilation_options: ::wgpu::PipelineCompilationOptions::default(),
            cache: None,
        })
}

impl Pipelines {
    /// Compiles the dtype-independent kernels; weight kernels, attention
    /// shapes and sampling workgroup sizes are added with
    /// [`Pipelines::ensure_weights`], [`Pipelines::ensure_attn`] and
    /// [`Pipelines::ensure_sample`]. `split_k`: see [`Pipelines::split_k`];
    /// `unroll`: mat-vec's weight loads in flight, where chosen
    /// ([`mat_vec_unroll`]); `k_chunk`: decode attention's K loads in
    /// flight ([`super::attn::decode_k_chunk`]); `rope`: whether to
    /// compile mat-vec's RoPE variants.
    pub(crate) fn new(
        gpu: &Gpu,
        split_k: bool,
        unroll: Option<u32>,
        k_chunk: u32,
        rope: bool,
    ) -> Pipelines {
        let layouts = Layouts::new(gpu);
        let p = &layouts.params;
        let rms_norm = compile(
            gpu,
            "rms_norm",
            include_str!("shaders/rms_norm.wgsl").into(),
            &layouts.norm,
            p,
        );
        let rope_kv = compile(
            gpu,
            "rope_kv",
            include_str!("shaders/rope_kv.wgsl").into(),
            &layouts.rope_kv,
            p,
        );
        let silu_mul = compile(
            gpu,
            "silu_mul",
            include_str!("shaders/silu_mul.wgsl").into(),
            &layouts.silu,
            p,
        );
        let attn_merge = compile(
            gpu,
            "attn_merge",
            format!(
                "{}{}",
                merge_consts(),
                include_str!("shaders/attn_merge.wgsl")
            ),
            &layouts.merge,
            p,
        );
        Pipelines {
            layouts,
            split_k,
            gpu_subgroups: gpu.subgroups,
            unroll,
            k_chunk,
            rope,
            coop: gpu.coop,
            weight: HashMap::new(),
            rms_norm,
            rope_kv,
            silu_mul,
            sample: HashMap::new(),
            attn_merge,
            attn: HashMap::new(),
        }
    }

    /// Compiles embed / mat-vec (every column variant) / matmul for `dtype`
    /// if not yet done.
    pub(crate) fn ensure_weights(&mut self, gpu: &Gpu, dtype: WeightDtype) {
        let mut kinds = vec![
            (
                WeightKernel::Embed,
                "embed",
                include_str!("shaders/embed.wgsl"),
            ),
            (
                WeightKernel::MatMul,
                "mat_mul",
                include_str!("shaders/mat_mul.wgsl"),
            ),
        ];
        // The fused norm needs a workgroup barrier, which one invocation per
        // row (CPU adapters) is built to avoid: only split-row variants.
        let norms: &[bool] = if self.split_k {
            &[false, true]
        } else {
            &[false]
        };
        let variants = if self.rope { 3 } else { 2 };
        for variant in 0..variants {
            let max_cols = mat_vec_max_cols(self.split_k, variant > 0) as u32;
            for &norm in norms {
                for cols in (0..=max_cols.ilog2()).map(|b| 1u32 << b) {
                    let (kind, label) = match variant {
                        0 => (WeightKernel::MatVec(cols, norm), "mat_vec"),
                        1 => (WeightKernel::Glu(cols, norm), "glu"),
                        _ => (WeightKernel::Rope(cols, norm), "qkv_rope"),
                    };
                    kinds.push((kind, label, include_str!("shaders/mat_vec.wgsl")));
                }
            }
        }
        for c in self.coop.all() {
            kinds.push((
                WeightKernel::Coop(c.tile),
                "coop_mat_mul",
                include_str!("shaders/coop_mat_mul.wgsl"),
            ));
        }
        if self.coop.square.is_some() {
            kinds.push((
                WeightKernel::SplitSum,
                "split_sum",
                include_str!("shaders/split_sum.wgsl"),
            ));
        }
        for (kind, label, body) in kinds {
            if self.weight.contains_key(&(kind, dtype)) {
                continue;
            }
            let layout = match kind {
                WeightKernel::Embed => &self.layouts.embed,
                WeightKernel::Rope(..) => &self.layouts.mat_rope,
                _ => &self.layouts.mat,
            };
            let consts = match kind {
                WeightKernel::MatVec(cols, norm)
                | WeightKernel::Glu(cols, norm)
                | WeightKernel::Rope(cols, norm) => {
                    let rc = cols.min(MAT_VEC_REDUCE_COLS);
                    let unroll = mat_vec_unroll(self.split_k, cols, self.unroll);
                    let glu = matches!(kind, WeightKernel::Glu(..));
                    let rope = matches!(kind, WeightKernel::Rope(..));
                    format!(
                        "const COLS: u32 = {cols}u;\nconst RC: u32 = {rc}u;\n\
                         const UNROLL: u32 = {unroll}u;\n\
                         const RED_LEN: u32 = {}u;\nconst SPLIT_K: bool = {};\n\
                         const GLU: bool = {glu};\nconst ROPE: bool = {rope};\n\
                         const PAIR: bool = {};\nconst NORM: bool = {norm};\n{}{}",
                        256 * rc,
                        self.split_k,
                        glu || rope,
                        subgroup_helpers(self.subgroups()),
                        if rope { "" } else { NO_STORE_PAIR },
                    )
                }
                // coop_mat_mul.wgsl: constants and fragment code below.
                _ => String::new(),
            };
            // The tiled products share their tile loads, and they and the
            // split sum their store into y.
            let loads = match kind {
                WeightKernel::MatMul | WeightKernel::Coop(_) => concat!(
                    include_str!("shaders/tile_loads.wgsl"),
                    include_str!("shaders/y_store.wgsl")
                ),
                WeightKernel::SplitSum => include_str!("shaders/y_store.wgsl"),
                WeightKernel::Rope(..) => include_str!("shaders/qkv_rope.wgsl"),
                _ => "",
            };
            let body = match kind {
                WeightKernel::Coop(tile) => self
                    .coop
                    .get(tile)
                    .map_or_else(String::new, |c| c.shader(body)),
                _ => body.to_string(),
            };
            let mut source = format!("{}\n{consts}{body}\n{loads}", dtype.prelude());
            if matches!(kind, WeightKernel::Coop(_)) {
                // The folded split sum reads other workgroups' partials.
                let decoration = if gpu.coherent { "@coherent" } else { "" };
                source = source.replace("PART_DECORATION", decoration);
                // Both `enable`s open the module; the f16-native prelude's
                // own goes.
                source = format!(
                    "enable f16;\nenable wgpu_cooperative_matrix;\n{}",
                    source.replacen("enable f16;", "", 1)
                );
            }
            if matches!(
                kind,
                WeightKernel::MatVec(..) | WeightKernel::Glu(..) | WeightKernel::Rope(..)
            ) {
                // naga takes subgroup operations as a device feature, with
                // no `enable subgroups` directive (it rejects that one).
                let param = if self.subgroups() {
                    "@builtin(subgroup_size) sg_size: u32,"
                } else {
                    ""
                };
                source = source.replace("SUBGROUP_SIZE_PARAM", param);
            }
            let pipe = compile(
                gpu,
                &format!("{label}_{dtype:?}"),
                source,
                layout,
                &self.layouts.params,
            );
            self.weight.insert((kind, dtype), pipe);
        }
    }

    /// Whether mat-vec reductions use subgroup shuffles: split-row mat-vec
    /// on a device with subgroup operations.
    pub(crate) fn subgroups(&self) -> bool {
        self.split_k && self.gpu_subgroups
    }

    /// Compiles the sampling kernel for workgroups of `wg` invocations (a
    /// power of two from 8 to 256) if not yet done.
    pub(crate) fn ensure_sample(&mut self, gpu: &Gpu, wg: u32) {
        if self.sample.contains_key(&wg) {
            return;
        }
        let pipe = compile(
            gpu,
            "sample",
            format!(
                "const WG: u32 = {wg}u;\nconst FAN: u32 = {}u;\nconst NTH_SEARCH_FROM: u32 = {}u;\n{}",
                sample_fan(wg),
                SAMPLE_NTH_SEARCH_FROM,
                include_str!("shaders/sample.wgsl")
            ),
            &self.layouts.sample,
            &self.layouts.params,
        );
        self.sample.insert(wg, pipe);
    }

    /// The sampling kernel compiled by [`Pipelines::ensure_sample`].
    pub(crate) fn sample(&self, wg: u32) -> Option<&::wgpu::ComputePipeline> {
        self.sample.get(&wg)
    }

    /// Compiles the attention kernels for `shape` if not yet done.
    pub(crate) fn ensure_attn(&mut self, gpu: &Gpu, shape: AttnShape) {
        if self.attn.contains_key(&shape) {
            return;
        }
        let decode = compile(
            gpu,
            "attn_decode",
            format!(
                "{}\n{}",
                shape.decode_consts(self.k_chunk),
                include_str!("shaders/attn_decode.wgsl").replace(
                    "PART_DECORATION",
                    if gpu.coherent { "@coherent" } else { "" }
                )
            ),
            &self.layouts.decode,
            &self.layouts.params,
        );
        let prefill = compile(
            gpu,
            "attn_prefill",
            format!(
                "{}\n{}",
                shape.prefill_consts(),
                include_str!("shaders/attn_prefill.wgsl")
            ),
            &self.layouts.prefill,
            &self.layouts.params,
        );
        self.attn.insert(shape, (decode, prefill));
    }

    /// The bind group of the parameter blocks in `buf`, one block seen at
    /// a time (each dispatch gives its block's offset).
    pub(crate) fn params_bind_group(&self, gpu: &Gpu, buf: &::wgpu::Buffer) -> ::wgpu::BindGroup {
        gpu.device.create_bind_group(&::wgpu::BindGroupDescriptor {
            label: Some("params"),
            layout: &self.layouts.params,
            entries: &[::wgpu::BindGroupEntry {
                binding: 0,
                resource: ::wgpu::BindingResource::Buffer(::wgpu::BufferBinding {
                    buffer: buf,
                    offset: 0,
                    size: ::wgpu::BufferSize::new(PARAM_BYTES),
                }),
            }],
        })
    }

    /// A weight kernel compiled by [`Pipelines::ensure_weights`].
    pub(crate) fn weight(
        &self,
        kind: WeightKernel,
        dtype: WeightDtype,
    ) -> Option<&::wgpu::ComputePipeline> {
        self.weight.get(&(kind, dtype))
    }

    /// Decode and prefill attention compiled by [`Pipelines::ensure_attn`].
    pub(crate) fn attn(
        &self,
        shape: AttnShape,
    ) -> Option<&(::wgpu::ComputePipeline, ::wgpu::ComputePipeline)> {
        self.attn.get(&shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mat_vec_unroll_follows_the_kernel_and_the_columns() {
        assert_eq!(mat_vec_unroll(true, 1, None), 1);
        assert_eq!(mat_vec_unroll(true, 8, None), 1);
        assert_eq!(mat_vec_unroll(true, 8, Some(4)), 4);
        assert_eq!(mat_vec_unroll(true, 16, None), 1);
        assert_eq!(mat_vec_unroll(false, 1, None), 2);
        assert_eq!(mat_vec_unroll(false, 2, None), 1);
        assert_eq!(mat_vec_unroll(false, 8, Some(3)), 4);
        assert_eq!(mat_vec_unroll(true, 4, Some(0)), 1);
        assert_eq!(mat_vec_unroll(true, 64, Some(4)), 1);
    }

    #[test]
    fn paired_variants_only_where_they_take_no_more_dispatches() {
        // Split rows: plain mat-vec takes 64 columns a dispatch, the
        // paired variants 32.
        for cols in [1, 8, 31, 32] {
            assert!(pair_fits_plain_groups(true, cols), "{cols}");
        }
        for cols in [33, 48, 64, 65, 96, 128] {
            assert!(!pair_fits_plain_groups(true, cols), "{cols}");
        }
        // One invocation per row: 8 a dispatch either way.
        for cols in [1, 8, 9, 20, 64] {
            assert!(pair_fits_plain_groups(false, cols), "{cols}");
        }
    }

    #[test]
    fn sampling_workgroups_stay_under_the_llvmpipe_loop_limit() {
        assert_eq!(cpu_sample_wg(512), 8);
        assert_eq!(cpu_sample_wg(32000), 8);
        assert_eq!(cpu_sample_wg(128_256), 16);
        for vocab in [
            1, 2, 3, 257, 512, 4099, 32000, 50257, 128_256, 152_064, 256_000,
        ] {
            let wg = cpu_sample_wg(vocab);
            assert!(wg.is_power_of_two() && (8..=256).contains(&wg));
            assert!(
                sample_loop_bound(vocab, wg) < LLVMPIPE_LOOP_LIMIT,
                "vocab {vocab}"
            );
            if wg > 8 {
                assert!(sample_loop_bound(vocab, wg / 2) > LLVMPIPE_LOOP_LIMIT - 4096);
            }
        }
        for wg in [8, 16, 32, 64, 128, 256] {
            assert_eq!(wg % sample_fan(wg), 0);
            assert!(sample_fan(wg) * sample_fan(wg) >= wg);
        }
    }
}
