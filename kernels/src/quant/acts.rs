//! Activations quantized to 8 bits per block: one scale per block, each
//! value rounded to the nearest of -127..=127 steps. A row is quantized once
//! per matrix product and then read by every output row's dot product.

use super::blocks::{QK, QK_K};

/// 32 activations as `d * q`, with `s = d * sum(q)` for the formats whose
/// weights carry an offset (Q4_0's 8, Q4_1's minimum).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(16))]
pub struct Q8Block {
    /// Scale.
    pub d: f32,
    /// `d` times the sum of `q`.
    pub s: f32,
    /// Quantized values.
    pub q: [i8; QK],
    /// `-128 * sum(q)`: what `(w + 128) · q` over-counts when signed
    /// weights are offset to unsigned ones for VNNI's `u8 · i8` product.
    pub neg128_sum: i32,
}

/// Eight consecutive [`Q8Block`]s laid out for kernels whose vector lanes
/// each hold one block: `q[k]` holds values `4k..4k + 4` of all eight
/// blocks, block `b`'s at bytes `4b..4b + 4`, so one 32-byte integer dot
/// product adds four values of each block into its own lane, and a block's
/// scale and sums sit in the same lane of `d`, `s` and `neg128_sum`. Weights
/// read into the same layout need one float multiply-add per eight blocks
/// instead of one per block.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(32))]
pub struct Q8Group {
    /// `q[k][4 b + i]` is value `4 k + i` of block `b`.
    pub q: [[i8; 32]; 8],
    /// Each block's scale.
    pub d: [f32; 8],
    /// Each block's `s`.
    pub s: [f32; 8],
    /// Each block's `neg128_sum`.
    pub neg128_sum: [i32; 8],
}

impl Default for Q8Group {
    fn default() -> Self {
        Q8Group {
            q: [[0; 32]; 8],
            d: [0.0; 8],
            s: [0.0; 8],
            neg128_sum: [0; 8],
        }
    }
}

/// One token's activations for the 32-block formats: its blocks, and the
/// first `groups.len() * 8` of them again as [`Q8Group`]s (what
/// [`group_q8`] makes of them; kernels without vector lanes per block read
/// only `blocks`).
#[derive(Debug, Clone, Copy)]
pub struct Q8Row<'a> {
    /// The blocks, in order.
    pub blocks: &'a [Q8Block],
    /// `groups[g]` is `blocks[8 g..8 g + 8]` regrouped.
    pub groups: &'a [Q8Group],
}

/// 256 activations as `d * q`, with the sums of each 16 values (the K-quant
/// minimums and Q6_K's offset of 32 multiply them).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(32))]
pub struct Q8KBlock {
    /// Scale.
    pub d: f32,
    /// Quantized values.
    pub q: [i8; QK_K],
    /// Sums of `q[16 i .. 16 i + 16]`.
    pub bsums: [i16; QK_K / 16],
    /// `q` in the order the x86 Q4_K and Q6_K kernels read it
    /// ([`q4k_lane_source`]).
    pub q_lanes: [i8; QK_K],
}

/// Which value of a block byte `i` of [`Q8KBlock::q_lanes`] holds. Each 32
/// bytes `v = 2 r + h` are eight four-byte words whose word `l` is values
/// `4 r..4 r + 4` of sub-block `2 (l % 4) + h` (of its second half where
/// `l >= 4`): the order a Q4_K block's nibbles take when its four 32-byte
/// chunks are transposed as 4 x 4 words within each 128-bit half, so that
/// every vector's i16 lanes `2 l` and `2 l + 1` belong to one sub-block and
/// the products of a block's four vectors sum in i16 before one scale
/// multiply.
pub fn q4k_lane_source(i: usize) -> usize {
    let (v, l, b) = (i / 32, i % 32 / 4, i % 4);
    let (r, h) = (v / 2, v % 2);
    64 * (l % 4) + 32 * h + 16 * (l / 4) + 4 * r + b
}

impl Default for Q8Block {
    fn default() -> Self {
        Q8Block {
            d: 0.0,
            s: 0.0,
            q: [0; QK],
            neg128_sum: 0,
        }
    }
}

impl Default for Q8KBlock {
    fn default() -> Self {
        Q8KBlock {
            d: 0.0,
            q: [0; QK_K],
            bsums: [0; QK_K / 16],
            q_lanes: [0; QK_K],
        }
    }
}

/// Scale for values whose largest magnitude is `amax`, and its inverse (0
/// for an all-zero block, whose values all quantize to 0).
#[inline]
fn scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

/// `v` (within ±127.5) to the nearest integer, halves away from zero,
/// through Rust's saturating casts (NaN to 0, beyond i32 to its bounds),
/// then into -127..=127. Never -128, even where a subnormal block maximum
/// makes the inverse scale infinite: the x86 kernels' sign trick negates
/// activations, and -128 has no i8 negation (it would flip that product's
/// sign, and differ from VNNI's offset form). `f32::round` is a libm call
/// without SSE4.1 at compile time.
#[inline]
fn round(v: f32) -> i8 {
    ((v + 0.5f32.copysign(v)) as i32).clamp(-127, 127) as i8
}

/// The largest magnitude of 32 values, NaN ignored (as `f32::max` ignores
/// it); the order of a maximum does not change it.
#[inline]
fn amax32(xs: &[f32]) -> f32 {
    xs.iter()
        .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m })
}

/// Quantizes `x` (a multiple of 32 long) into `out`, one block per 32 values.
pub fn quantize_q8(x: &[f32], out: &mut Vec<Q8Block>) {
    out.resize(x.len() / QK, Q8Block::default());
    quantize_q8_into(x, out);
}

/// Quantizes `x` into the blocks `out` (as many as `x` has whole 32s): the
/// definition. [`super::Kernels::quantize_q8`] is this function or, on
/// x86, the same in AVX2 intrinsics, with the same bits (tested with NaN,
/// infinities, zero blocks, ties and overflowing scales).
pub fn quantize_q8_into(x: &[f32], out: &mut [Q8Block]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = amax32(xs);
        let (d, id) = scale(amax);
        let mut sum = 0i32;
        for (q, &v) in b.q.iter_mut().zip(xs) {
            *q = round(v * id);
            sum += *q as i32;
        }
        b.d = d;
        b.s = d * sum as f32;
        b.neg128_sum = -128 * sum;
    }
}

/// Regroups the whole eights of `blocks` into `out` (as many as both have).
pub fn group_q8(blocks: &[Q8Block], out: &mut [Q8Group]) {
    for (g, eight) in out.iter_mut().zip(blocks.chunks_exact(8)) {
        for (b, x) in eight.iter().enumerate() {
            for (k, q) in g.q.iter_mut().enumerate() {
                q[4 * b..4 * b + 4].copy_from_slice(&x.q[4 * k..4 * k + 4]);
            }
            g.d[b] = x.d;
            g.s[b] = x.s;
            g.neg128_sum[b] = x.neg128_sum;
        }
    }
}

/// Quantizes `x` (a multiple of 256 long) into `out`, one block per 256 values.
pub fn quantize_q8k(x: &[f32], out: &mut Vec<Q8KBlock>) {
    out.resize(x.len() / QK_K, Q8KBlock::default());
    quantize_q8k_into(x, out);
}

/// Quantizes `x` into the blocks `out` (as many as `x` has whole 256s).
pub fn quantize_q8k_into(x: &[f32], out: &mut [Q8KBlock]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, id) = scale(amax);
        b.d = d;
        for (q, &v) in b.q.iter_mut().zip(xs) {
            *q = round(v * id);
        }
        for (s, qs) in b.bsums.iter_mut().zip(b.q.chunks_exact(16)) {
            *s = qs.iter().map(|&q| q as i16).sum();
        }
        for (i, q) in b.q_lanes.iter_mut().enumerate() {
            *q = b.q[q4k_lane_source(i)];
        }
    }
}
