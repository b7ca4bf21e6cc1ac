//! AVX2, AVX-VNNI and AVX-512 VNNI dot products for x86_64.
//!
//! Every kernel here is an `unsafe fn` with `#[target_feature]`, reached only
//! through the safe wrappers in [`kernels`], which is only called for an
//! [`Isa`] that `is_x86_feature_detected!` confirmed on this CPU: that check
//! is what makes calling them sound. Inside, every pointer load reads whole
//! blocks at offsets below `n_blocks * block_bytes`, where `n_blocks` is the
//! smaller of the weight bytes' and the activations' block counts, so no load
//! leaves its slice; the unaligned load intrinsics need no alignment.
//!
//! Weight rows come in [`RowLayout::Lanes8`] ([`super::lanes`]): a row's
//! whole eights of blocks interleaved, so a group's scales and each block's
//! words load straight into their lanes, and the activations' [`Q8Group`]s
//! cover those eights (the matrix products quantize them from the same
//! columns); the blocks after the last eight are read as the file has them.
//!
//! The three tiers share every 32-block kernel but Q8_0's and IQ4_NL's,
//! whose signed weights AVX2 multiplies through the sign trick where the
//! VNNI tiers offset a group's to `u8`: otherwise they differ only in the
//! instruction that adds four byte products into an i32 lane ([`Lanes`]) and
//! in how many vector registers a tile may hold. Their integer sums are
//! exact, so all three give the same bits. The 256-block kernels are one
//! AVX2 function for every tier.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::acts::{Q8Block, Q8Group, Q8KBlock, Q8Row};
use super::blocks::{
    iq4xs_scales, IQ4NL_VALUES, IQ4_NL_BYTES, IQ4_XS_BYTES, IQ4_XS_QS, Q2_K_BYTES, Q2_K_D, Q2_K_QS,
    Q3_K_BYTES, Q3_K_D, Q3_K_QS, Q3_K_SCALES, Q4_0_BYTES, Q4_1_BYTES, Q4_K_BYTES, Q5_0_BYTES,
    Q5_1_BYTES, Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES,
};
use super::{Isa, Kernels, RowLayout};

/// AVX2, FMA and F16C, which every AVX2 kernel here uses.
pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX-VNNI: the VEX-encoded 256-bit `vpdpbusd` (Intel Alder Lake and
/// later, AMD Zen 5), without AVX-512.
pub(super) fn has_avx_vnni() -> bool {
    has_avx2() && is_x86_feature_detected!("avxvnni")
}

/// The 256-bit forms of AVX-512 VNNI's `vpdpbusd`, and AVX-512F's 512-bit
/// registers (the f16 tile).
pub(super) fn has_avx512_vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vl")
}

/// The kernels of `isa` (which the caller checked this CPU has).
pub(super) fn kernels(isa: Isa, scalar: Kernels) -> Kernels {
    // SAFETY (all closures below): `isa` was confirmed on this CPU by
    // `Isa::available`, which is the only precondition of these functions.
    let avx2 = Kernels {
        isa: Isa::Avx2,
        layout: RowLayout::Lanes8,
        q8_0: |w, a| unsafe { one_avx2::<Q8_0Signed>(w, a) },
        q4_0: |w, a| unsafe { one_avx2::<Q4_0<Avx2Lanes>>(w, a) },
        q4_1: |w, a| unsafe { one_avx2::<Q4_1<Avx2Lanes>>(w, a) },
        q8_0_tile: |w, a| unsafe { tile_avx2::<Q8_0Signed>(w, a) },
        q4_0_tile: |w, a| unsafe { tile_avx2::<Q4_0<Avx2Lanes>>(w, a) },
        q4_1_tile: |w, a| unsafe { tile_avx2::<Q4_1<Avx2Lanes>>(w, a) },
        q5_0: |w, a| unsafe { one_avx2::<Q5_0<Avx2Lanes>>(w, a) },
        q5_1: |w, a| unsafe { one_avx2::<Q5_1<Avx2Lanes>>(w, a) },
        q5_0_tile: |w, a| unsafe { tile_avx2::<Q5_0<Avx2Lanes>>(w, a) },
        q5_1_tile: |w, a| unsafe { tile_avx2::<Q5_1<Avx2Lanes>>(w, a) },
        iq4_nl: |w, a| unsafe { one_avx2::<Iq4NlSigned>(w, a) },
        iq4_nl_tile: |w, a| unsafe { tile_avx2::<Iq4NlSigned>(w, a) },
        q4_k: |w, a| unsafe { dot_q4_k_avx2::<true>(w, a) },
        q5_k: |w, a| unsafe { dot_q5_k_avx2::<true>(w, a) },
        q6_k: |w, a| unsafe { dot_q6_k_avx2::<true>(w, a) },
        q2_k: |w, a| unsafe { dot_q2_k_avx2::<true>(w, a) },
        q2_k_tile: |w, a| unsafe { tile_q2_k_avx2(w, a) },
        q3_k: |w, a| unsafe { dot_q3_k_avx2::<true>(w, a) },
        q3_k_tile: |w, a| unsafe { tile_q3_k_avx2(w, a) },
        q4_k_tile: |w, a| unsafe { tile_q4_k_avx2(w, a) },
        q5_k_tile: |w, a| unsafe { tile_q5_k_avx2(w, a) },
        q6_k_tile: |w, a| unsafe { tile_q6_k_avx2(w, a) },
        iq4_xs: |w, a| unsafe { dot_iq4_xs_avx2::<true>(w, a) },
        iq4_xs_tile: |w, a| unsafe { tile_iq4_xs_avx2(w, a) },
        f16: |w, x| unsafe { dot_f16_avx2::<true>(w, x) },
        f16_tile: |w, x| w.map(|r| unsafe { dot_f16_x4_avx2(r, x) }),
        bf16: |w, x| unsafe { dot_bf16_avx2::<true>(w, x) },
        f32: |a, b| unsafe { dot_f32_avx2(a, b) },
        attend: |t, s, o| unsafe { attend_avx2(t, s, o) },
        quantize_q8: |x, out| unsafe { quantize_q8_avx2(x, out) },
    };
    match isa {
        Isa::Scalar | Isa::Neon => scalar,
        Isa::Avx2 => avx2,
        Isa::AvxVnni => Kernels {
            isa: Isa::AvxVnni,
            q8_0: |w, a| unsafe { one_avx_vnni::<Q8_0Offset<AvxVnniLanes>>(w, a) },
            q4_0: |w, a| unsafe { one_avx_vnni::<Q4_0<AvxVnniLanes>>(w, a) },
            q4_1: |w, a| unsafe { one_avx_vnni::<Q4_1<AvxVnniLanes>>(w, a) },
            q8_0_tile: |w, a| unsafe { tile_avx_vnni::<Q8_0Offset<AvxVnniLanes>>(w, a) },
            q4_0_tile: |w, a| unsafe { tile_avx_vnni::<Q4_0<AvxVnniLanes>>(w, a) },
            q4_1_tile: |w, a| unsafe { tile_avx_vnni::<Q4_1<AvxVnniLanes>>(w, a) },
            q5_0: |w, a| unsafe { one_avx_vnni::<Q5_0<AvxVnniLanes>>(w, a) },
            q5_1: |w, a| unsafe { one_avx_vnni::<Q5_1<AvxVnniLanes>>(w, a) },
            q5_0_tile: |w, a| unsafe { tile_avx_vnni::<Q5_0<AvxVnniLanes>>(w, a) },
            q5_1_tile: |w, a| unsafe { tile_avx_vnni::<Q5_1<AvxVnniLanes>>(w, a) },
            iq4_nl: |w, a| unsafe { one_avx_vnni::<Iq4NlOffset<AvxVnniLanes>>(w, a) },
            iq4_nl_tile: |w, a| unsafe { tile_avx_vnni::<Iq4NlOffset<AvxVnniLanes>>(w, a) },
            q4_k: |w, a| unsafe { dot_q4_k_avx2::<false>(w, a) },
            q5_k: |w, a| unsafe { dot_q5_k_avx2::<false>(w, a) },
            q6_k: |w, a| unsafe { dot_q6_k_avx2::<false>(w, a) },
            q2_k: |w, a| unsafe { dot_q2_k_avx2::<false>(w, a) },
            q3_k: |w, a| unsafe { dot_q3_k_avx2::<false>(w, a) },
            iq4_xs: |w, a| unsafe { dot_iq4_xs_avx2::<false>(w, a) },
            f16: |w, x| unsafe { dot_f16_avx2::<false>(w, x) },
            bf16: |w, x| unsafe { dot_bf16_avx2::<false>(w, x) },
            ..avx2
        },
        Isa::Avx512Vnni => Kernels {
            isa: Isa::Avx512Vnni,
            q8_0: |w, a| unsafe { one_vnni::<Q8_0Offset<Avx512Lanes>>(w, a) },
            q4_0: |w, a| unsafe { one_vnni::<Q4_0<Avx512Lanes>>(w, a) },
            q4_1: |w, a| unsafe { one_vnni::<Q4_1<Avx512Lanes>>(w, a) },
            q8_0_tile: |w, a| unsafe { tile_vnni::<Q8_0Offset<Avx512Lanes>>(w, a) },
            q4_0_tile: |w, a| unsafe { tile_vnni::<Q4_0<Avx512Lanes>>(w, a) },
            q4_1_tile: |w, a| unsafe { tile_vnni::<Q4_1<Avx512Lanes>>(w, a) },
            q5_0: |w, a| unsafe { one_vnni::<Q5_0<Avx512Lanes>>(w, a) },
            q5_1: |w, a| unsafe { one_vnni::<Q5_1<Avx512Lanes>>(w, a) },
            q5_0_tile: |w, a| unsafe { tile_vnni::<Q5_0<Avx512Lanes>>(w, a) },
            q5_1_tile: |w, a| unsafe { tile_vnni::<Q5_1<Avx512Lanes>>(w, a) },
            iq4_nl: |w, a| unsafe { one_vnni::<Iq4NlOffset<Avx512Lanes>>(w, a) },
            iq4_nl_tile: |w, a| unsafe { tile_vnni::<Iq4NlOffset<Avx512Lanes>>(w, a) },
            q4_k: |w, a| unsafe { dot_q4_k_avx2::<false>(w, a) },
            q5_k: |w, a| unsafe { dot_q5_k_avx2::<false>(w, a) },
            q6_k: |w, a| unsafe { dot_q6_k_avx2::<false>(w, a) },
            q2_k: |w, a| unsafe { dot_q2_k_avx2::<false>(w, a) },
            q3_k: |w, a| unsafe { dot_q3_k_avx2::<false>(w, a) },
            iq4_xs: |w, a| unsafe { dot_iq4_xs_avx2::<false>(w, a) },
            f16: |w, x| unsafe { dot_f16_avx2::<false>(w, x) },
            bf16: |w, x| unsafe { dot_bf16_avx2::<false>(w, x) },
            f16_tile: |w, x| unsafe { dot_f16_tile_avx512(w, x) },
            attend: |t, s, o| unsafe { attend_avx512(t, s, o) },
            ..avx2
        },
    }
}

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The little-endian f16 at `p`, widened by F16C into all eight lanes.
///
/// The load is a broadcast on purpose: inserting the 16 bits into lane 0
/// (`vpinsrw`, what LLVM makes of a scalar conversion) merges with whatever
/// register it picks, often the loop's accumulator, which chains every
/// block's scale to the previous block's FMA and halved Q8_0's speed.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16x8_at(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
}

/// The little-endian f16 at `p`, widened by F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm256_cvtss_f32(f16x8_at(p))
}

/// 16 bytes of nibbles at `p` as 32 bytes: low nibbles (values 0..16) in the
/// low lane, high nibbles (values 16..32) in the high lane.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let qs = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(qs, 4), qs);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Sums of `u8 * i8` products in eight i32 lanes (pairs through i16, which
/// cannot saturate for its callers: nibbles give at most 15 * 127 * 2, and
/// the sign trick's magnitudes 128 * 127 * 2 = 32512, below 32767, since
/// activations never quantize to -128).
#[inline]
#[target_feature(enable = "avx2")]
fn udot(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k_avx2<const PF: bool>(w: &[u8], a: &[Q8KBlock]) -> f32 {
    q4_k_tokens::<1, PF, false>(w, [a])[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k_avx2<const PF: bool>(w: &[u8], a: &[Q8KBlock]) -> f32 {
    q4_k_tokens::<1, PF, true>(w, [a])[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k_avx2<const PF: bool>(w: &[u8], a: &[Q8KBlock]) -> f32 {
    sixteens_tokens::<1, PF, Q6K>(w, [a])[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q2_k_avx2<const PF: bool>(w: &[u8], a: &[Q8KBlock]) -> f32 {
    sixteens_tokens::<1, PF, Q2K>(w, [a])[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q3_k_avx2<const PF: bool>(w: &[u8], a: &[Q8KBlock]) -> f32 {
    sixteens_tokens::<1, PF, Q3K>(w, [a])[0]
}

/// Q4_K, four rows by four tokens: a row at a time, each block's scales
/// and nibbles unpacked once for the four tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q4_k_avx2(w: &[&[u8]; 4], a: &[&[Q8KBlock]; 4]) -> [[f32; 4]; 4] {
    [
        q4_k_tokens::<4, false, false>(w[0], *a),
        q4_k_tokens::<4, false, false>(w[1], *a),
        q4_k_tokens::<4, false, false>(w[2], *a),
        q4_k_tokens::<4, false, false>(w[3], *a),
    ]
}

/// Q5_K, four rows by four tokens, as [`tile_q4_k_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q5_k_avx2(w: &[&[u8]; 4], a: &[&[Q8KBlock]; 4]) -> [[f32; 4]; 4] {
    [
        q4_k_tokens::<4, false, true>(w[0], *a),
        q4_k_tokens::<4, false, true>(w[1], *a),
        q4_k_tokens::<4, false, true>(w[2], *a),
        q4_k_tokens::<4, false, true>(w[3], *a),
    ]
}

/// Q6_K, four rows by four tokens, as [`tile_q4_k_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q6_k_avx2(w: &[&[u8]; 4], a: &[&[Q8KBlock]; 4]) -> [[f32; 4]; 4] {
    [
        sixteens_tokens::<4, false, Q6K>(w[0], *a),
        sixteens_tokens::<4, false, Q6K>(w[1], *a),
        sixteens_tokens::<4, false, Q6K>(w[2], *a),
        sixteens_tokens::<4, false, Q6K>(w[3], *a),
    ]
}

/// Q2_K, four rows by four tokens, as [`tile_q4_k_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q2_k_avx2(w: &[&[u8]; 4], a: &[&[Q8KBlock]; 4]) -> [[f32; 4]; 4] {
    [
        sixteens_tokens::<4, false, Q2K>(w[0], *a),
        sixteens_tokens::<4, false, Q2K>(w[1], *a),
        sixteens_tokens::<4, false, Q2K>(w[2], *a),
        sixteens_tokens::<4, false, Q2K>(w[3], *a),
    ]
}

/// Q3_K, four rows by four tokens, as [`tile_q4_k_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q3_k_avx2(w: &[&[u8]; 4], a: &[&[Q8KBlock]; 4]) -> [[f32; 4]; 4] {
    [
        sixteens_tokens::<4, false, Q3K>(w[0], *a),
        sixteens_tokens::<4, false, Q3K>(w[1], *a),
        sixteens_tokens::<4, false, Q3K>(w[2], *a),
        sixteens_tokens::<4, false, Q3K>(w[3], *a),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_xs_avx2<const PF: bool>(w: &[u8], a: &[Q8KBlock]) -> f32 {
    iq4_xs_tokens::<1, PF>(w, [a])[0]
}

/// IQ4_XS, four rows by four tokens, as [`tile_q4_k_avx2`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_iq4_xs_avx2(w: &[&[u8]; 4], a: &[&[Q8KBlock]; 4]) -> [[f32; 4]; 4] {
    [
        iq4_xs_tokens::<4, false>(w[0], *a),
        iq4_xs_tokens::<4, false>(w[1], *a),
        iq4_xs_tokens::<4, false>(w[2], *a),
        iq4_xs_tokens::<4, false>(w[3], *a),
    ]
}

/// The blocks a K-quant row of `bytes`-byte blocks shares with all of `a`.
#[inline(always)]
fn k_blocks<const T: usize>(w: &[u8], bytes: usize, a: &[&[Q8KBlock]; T]) -> usize {
    a.iter().map(|x| x.len()).fold(w.len() / bytes, usize::min)
}

/// A Q4_K block's eight 6-bit scales and eight 6-bit minimums from its 12
/// scale bytes, a byte each in sub-block order. The packing is
/// [`super::blocks::q4k_scale_min`]'s, undone four bytes at a time.
#[inline(always)]
pub(super) fn q4k_scales_mins(bytes: &[u8; 12]) -> (u64, u64) {
    // Plain indexing, no closure or array `map`: see [`vectors`].
    let w0 = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let w1 = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let w2 = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let (six, four, two) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x0303_0303);
    let scales = (w0 & six) as u64 | (((w2 & four) | (((w0 >> 6) & two) << 4)) as u64) << 32;
    let mins = (w1 & six) as u64 | ((((w2 >> 4) & four) | (((w1 >> 6) & two) << 4)) as u64) << 32;
    (scales, mins)
}

/// Eight bytes, each twice as i16 (`m0, m0, m1, m1, ..`): `vpmaddwd` of a
/// Q4_K block's minimums so laid against a token's sixteen 16-value sums
/// gives each sub-block's minimum times its sum.
#[inline(always)]
unsafe fn paired_i16(bytes: u64) -> __m256i {
    let m = _mm_cvtsi64_si128(bytes as i64);
    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m))
}

/// The sum of eight i32 lanes (exact: the callers' sums fit an i32).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
}

/// Four vectors transposed as 4 x 4 four-byte words within each 128-bit
/// half: word lane `l` of result `r` is word `r` (`l < 4`) or `4 + r` of
/// `v[l % 4]`, the order [`Q8KBlock::q_lanes`] holds a token's bytes in.
#[inline(always)]
unsafe fn words_4x4(v: [__m256i; 4]) -> [__m256i; 4] {
    let (t0, t1) = (
        _mm256_unpacklo_epi32(v[0], v[1]),
        _mm256_unpackhi_epi32(v[0], v[1]),
    );
    let (t2, t3) = (
        _mm256_unpacklo_epi32(v[2], v[3]),
        _mm256_unpackhi_epi32(v[2], v[3]),
    );
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// One Q4_K row (or, with `FIVE`, Q5_K) against `T` tokens: the row kernel
/// (`T` = 1) and the tile's step are this one function, so each token's
/// float steps are the same ones in the same order whatever `T` is (the
/// same bits).
///
/// A block's four 32-byte chunks of nibbles (chunk `c`: sub-blocks `2 c`
/// low, `2 c + 1` high) are transposed as 4 x 4 words in each 128-bit half,
/// so each word lane holds one chunk; against the token's
/// [`Q8KBlock::q_lanes`], laid out to match, the four low-nibble products
/// sum in i16 (4 x 3810 fits) and take their four sub-blocks' scales in one
/// `vpmaddwd`, the high ones likewise: 8 `vpmaddubsw` and 3 `vpmaddwd` a
/// block (the minimums the third), where a `vpmaddwd` per sub-block made
/// 8 and 9. Zen 1 runs all of them on one pipe.
///
/// Q5_K is Q4_K with 32 bytes of fifth bits before the nibbles: value `l`
/// of a chunk (`l < 32`) takes bit `2 c` of byte `l` (low nibbles) or bit
/// `2 c + 1` (high). Transposed vector `r` holds bytes `4 r..4 r + 4` of
/// every chunk in its low half and bytes `16 + 4 r..` in its high half, so
/// one `vpshufd` of the 32 bit bytes puts the right four under each word
/// lane, whose chunk picks the bit. Products of 5-bit values still sum in
/// i16 four at a time (4 x 7874 fits).
#[inline(always)]
unsafe fn q4_k_tokens<const T: usize, const PF: bool, const FIVE: bool>(
    w: &[u8],
    a: [&[Q8KBlock]; T],
) -> [f32; T] {
    let bytes = if FIVE { Q5_K_BYTES } else { Q4_K_BYTES };
    let n = k_blocks(w, bytes, &a);
    // Word lane l's chunk is l % 4: its low nibbles' fifth bit is bit 2 (l %
    // 4) of each byte, its high nibbles' the next.
    let bit_lo = _mm256_setr_epi32(1, 4, 16, 64, 1, 4, 16, 64);
    let bit_lo = _mm256_mullo_epi32(bit_lo, _mm256_set1_epi32(0x0101_0101));
    let bit_hi = _mm256_add_epi8(bit_lo, bit_lo);
    let sixteen = _mm256_set1_epi8(0x10);
    let mask = _mm256_set1_epi8(0x0F);
    // Word lane `l` of a transposed vector is chunk `l % 4`: its low nibbles
    // sub-block `2 (l % 4)`, its high ones `2 (l % 4) + 1`; each scale twice
    // (both i16 of the lane).
    let pick_lo = _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6);
    let pick_hi = _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 1, 1, 3, 3, 5, 5, 7, 7);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut mins_f = [0.0f32; T];
    for i in 0..n {
        let blk = &w[i * bytes..(i + 1) * bytes];
        let b = blk.as_ptr();
        prefetch_ahead::<PF>(b, bytes);
        let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
        let (scales, mins) = q4k_scales_mins(&*(b.add(4) as *const [u8; 12]));
        let mins = paired_i16(mins);
        let sc = _mm_cvtsi64_si128(scales as i64);
        let s_lo = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sc, pick_lo));
        let s_hi = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sc, pick_hi));
        let words = words_4x4(vectors::<4>(b.add(if FIVE { 48 } else { 16 })));
        let mut lo = [_mm256_setzero_si256(); 4];
        let mut hi = [_mm256_setzero_si256(); 4];
        for r in 0..4 {
            lo[r] = _mm256_and_si256(words[r], mask);
            hi[r] = _mm256_and_si256(_mm256_srli_epi16(words[r], 4), mask);
        }
        if FIVE {
            let qh = _mm256_loadu_si256(b.add(16) as *const __m256i);
            let under = [
                _mm256_shuffle_epi32::<0x00>(qh),
                _mm256_shuffle_epi32::<0x55>(qh),
                _mm256_shuffle_epi32::<0xAA>(qh),
                _mm256_shuffle_epi32::<0xFF>(qh),
            ];
            for r in 0..4 {
                let set_lo = _mm256_cmpeq_epi8(_mm256_and_si256(under[r], bit_lo), bit_lo);
                let set_hi = _mm256_cmpeq_epi8(_mm256_and_si256(under[r], bit_hi), bit_hi);
                lo[r] = _mm256_or_si256(lo[r], _mm256_and_si256(set_lo, sixteen));
                hi[r] = _mm256_or_si256(hi[r], _mm256_and_si256(set_hi, sixteen));
            }
        }
        for t in 0..T {
            let x = &a[t][i];
            let xq = x.q_lanes.as_ptr() as *const __m256i;
            let mut p_lo = _mm256_setzero_si256();
            let mut p_hi = _mm256_setzero_si256();
            for r in 0..4 {
                let (x_lo, x_hi) = (
                    _mm256_loadu_si256(xq.add(2 * r)),
                    _mm256_loadu_si256(xq.add(2 * r + 1)),
                );
                p_lo = _mm256_add_epi16(p_lo, _mm256_maddubs_epi16(lo[r], x_lo));
                p_hi = _mm256_add_epi16(p_hi, _mm256_maddubs_epi16(hi[r], x_hi));
            }
            let dots =
                _mm256_add_epi32(_mm256_madd_epi16(p_lo, s_lo), _mm256_madd_epi16(p_hi, s_hi));
            // Sub-block s's minimum times its 32 values' sum, in lane s: the
            // same integers the scalar sum took eight multiply-adds for.
            let bsums = _mm256_loadu_si256(x.bsums.as_ptr() as *const __m256i);
            let msum = hsum_i32(_mm256_madd_epi16(bsums, mins));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), _mm256_cvtepi32_ps(dots), acc[t]);
            mins_f[t] += dmin * x.d * msum as f32;
        }
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        out[t] = hsum(acc[t]) - mins_f[t];
    }
    out
}

/// A K-quant of 16 sub-blocks of 16 small values, each sub-block with a
/// signed 8-bit scale (Q3_K, Q6_K; Q2_K's 4-bit ones, with a 4-bit
/// minimum each): one trait gives [`sixteens_tokens`] a format's
/// unpacking, so the row kernel and the tile of all three are one
/// function.
trait Sixteens {
    /// Bytes of a super-block.
    const BYTES: usize;
    /// What the unsigned values are offset by (`x = d sc (u - OFFSET)`).
    const OFFSET: i32;
    /// The super-block's f16 scale.
    unsafe fn d(b: *const u8) -> f32;
    /// The sixteen signed scales, a byte each in sub-block order.
    unsafe fn scales(b: *const u8) -> __m128i;
    /// The 256 unsigned values in order, 32 a vector.
    unsafe fn values(b: *const u8) -> [__m256i; 8];
    /// The minimums' factor `dmin` and the sixteen minimums, a byte each
    /// in sub-block order (`x = d sc u - dmin m`); none for the formats
    /// without minimums.
    #[inline(always)]
    unsafe fn mins(_b: *const u8) -> Option<(f32, __m128i)> {
        None
    }
}

/// Q2_K: values 0..4, no offset, a 4-bit scale (low nibble) and minimum
/// (high nibble) per sub-block.
struct Q2K;

impl Sixteens for Q2K {
    const BYTES: usize = Q2_K_BYTES;
    const OFFSET: i32 = 0;

    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b.add(Q2_K_D))
    }

    #[inline(always)]
    unsafe fn scales(b: *const u8) -> __m128i {
        _mm_and_si128(_mm_loadu_si128(b as *const __m128i), _mm_set1_epi8(0x0F))
    }

    #[inline(always)]
    unsafe fn values(b: *const u8) -> [__m256i; 8] {
        let m2 = _mm256_set1_epi8(3);
        // Value 128 h + 32 j + k: bits 2 j of byte 32 h + k (Q3_K's pairs).
        let mut v = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let qs = _mm256_loadu_si256(b.add(Q2_K_QS + 32 * h) as *const __m256i);
            for j in 0..4 {
                v[4 * h + j] =
                    _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * j as i32)), m2);
            }
        }
        v
    }

    #[inline(always)]
    unsafe fn mins(b: *const u8) -> Option<(f32, __m128i)> {
        let bytes = _mm_loadu_si128(b as *const __m128i);
        let mins = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
        Some((f16_at(b.add(Q2_K_D + 2)), mins))
    }
}

/// Q6_K: values 0..64, offset 32.
struct Q6K;

impl Sixteens for Q6K {
    const BYTES: usize = Q6_K_BYTES;
    const OFFSET: i32 = 32;

    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b.add(208))
    }

    #[inline(always)]
    unsafe fn scales(b: *const u8) -> __m128i {
        _mm_loadu_si128(b.add(192) as *const __m128i)
    }

    #[inline(always)]
    unsafe fn values(b: *const u8) -> [__m256i; 8] {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(3);
        // The block's 256 values in order, 32 a vector: `v[4 half + k]`.
        let mut v = [_mm256_setzero_si256(); 8];
        for half in 0..2 {
            let ql0 = _mm256_loadu_si256(b.add(64 * half) as *const __m256i);
            let ql1 = _mm256_loadu_si256(b.add(64 * half + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(128 + 32 * half) as *const __m256i);
            // Values 0..64 (the -32 comes off through the block sums).
            v[4 * half] = _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
            );
            v[4 * half + 1] = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
            );
            v[4 * half + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
            );
            v[4 * half + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
            );
        }
        v
    }
}

/// Q3_K: values 0..8 (a 2-bit pair and a third bit from `hmask`), offset 4.
struct Q3K;

impl Sixteens for Q3K {
    const BYTES: usize = Q3_K_BYTES;
    const OFFSET: i32 = 4;

    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b.add(Q3_K_D))
    }

    /// [`q3k_scales`]'s unpacking four scales at a time: word `q` holds
    /// sub-blocks `4 q..4 q + 4`, their low nibbles from bytes 0..8 and
    /// top bits from bytes 8..12 at bits `2 q`.
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> __m128i {
        let p = b.add(Q3_K_SCALES);
        let word = |at: usize| (p.add(at) as *const u32).read_unaligned();
        let (lo, hi, top) = (word(0), word(4), word(8));
        let (nib, two) = (0x0F0F_0F0F, 0x0303_0303);
        let words = _mm_setr_epi32(
            ((lo & nib) | ((top & two) << 4)) as i32,
            ((hi & nib) | (((top >> 2) & two) << 4)) as i32,
            (((lo >> 4) & nib) | (((top >> 4) & two) << 4)) as i32,
            (((hi >> 4) & nib) | (((top >> 6) & two) << 4)) as i32,
        );
        _mm_sub_epi8(words, _mm_set1_epi8(32))
    }

    #[inline(always)]
    unsafe fn values(b: *const u8) -> [__m256i; 8] {
        let (m2, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
        let hm = _mm256_loadu_si256(b as *const __m256i);
        // Value 128 h + 32 j + k: bits 2 j of pair byte 32 h + k, third
        // bit 4 h + j of hmask byte k. Shifting 16-bit lanes moves no bit
        // across a byte once masked to one or two bits per byte.
        let mut v = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let qs = _mm256_loadu_si256(b.add(Q3_K_QS + 32 * h) as *const __m256i);
            for j in 0..4 {
                let pair =
                    _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * j as i32)), m2);
                let third = _mm256_and_si256(
                    _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + j) as i32)),
                    one,
                );
                v[4 * h + j] = _mm256_or_si256(pair, _mm256_slli_epi16(third, 2));
            }
        }
        v
    }
}

/// One Q6_K, Q3_K or Q2_K row against `T` tokens, as [`q4_k_tokens`]: the
/// values unsigned, their offset taken off through the tokens' 16-value
/// sums.
#[inline(always)]
unsafe fn sixteens_tokens<const T: usize, const PF: bool, F: Sixteens>(
    w: &[u8],
    a: [&[Q8KBlock]; T],
) -> [f32; T] {
    let n = k_blocks(w, F::BYTES, &a);
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..n {
        let blk = &w[i * F::BYTES..(i + 1) * F::BYTES];
        let b = blk.as_ptr();
        prefetch_ahead::<PF>(b, F::BYTES);
        let d = F::d(b);
        let v = F::values(b);
        // In the tokens' `q_lanes` order: `lanes[h][r]`'s word lane `l`
        // holds values of 16-value sub-block `4 (l % 4) + 2 h + l / 4`
        // whatever `r` is, so two products (2 x 16002 fits an i16) share one
        // `vpmaddwd` by the sub-blocks' scales.
        let lanes = [
            words_4x4([v[0], v[2], v[4], v[6]]),
            words_4x4([v[1], v[3], v[5], v[7]]),
        ];
        let sc16 = F::scales(b);
        let pick = [
            _mm_setr_epi8(0, 0, 4, 4, 8, 8, 12, 12, 1, 1, 5, 5, 9, 9, 13, 13),
            _mm_setr_epi8(2, 2, 6, 6, 10, 10, 14, 14, 3, 3, 7, 7, 11, 11, 15, 15),
        ];
        let s_h = [
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc16, pick[0])),
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc16, pick[1])),
        ];
        let mut dots = [_mm256_setzero_si256(); T];
        for t in 0..T {
            let xq = a[t][i].q_lanes.as_ptr() as *const __m256i;
            for h in 0..2 {
                for r in [0, 2] {
                    let p0 =
                        _mm256_maddubs_epi16(lanes[h][r], _mm256_loadu_si256(xq.add(2 * r + h)));
                    let p1 = _mm256_maddubs_epi16(
                        lanes[h][r + 1],
                        _mm256_loadu_si256(xq.add(2 * r + 2 + h)),
                    );
                    let p = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), s_h[h]);
                    dots[t] = _mm256_add_epi32(dots[t], p);
                }
            }
        }
        // The sixteen signed scales as i16, against each token's 16-value
        // sums: the offset's integer in one `vpmaddwd` and a lane sum; so
        // are Q2_K's minimums, whose float factor is their own.
        let scales = _mm256_cvtepi8_epi16(sc16);
        let mins = F::mins(b);
        for t in 0..T {
            let x = &a[t][i];
            let bsums = _mm256_loadu_si256(x.bsums.as_ptr() as *const __m256i);
            let total = if F::OFFSET != 0 {
                let offset = hsum_i32(_mm256_madd_epi16(bsums, scales));
                _mm256_sub_epi32(dots[t], lane0_i32(F::OFFSET * offset))
            } else {
                dots[t]
            };
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), _mm256_cvtepi32_ps(total), acc[t]);
            if let Some((dmin, m)) = mins {
                let m = _mm256_cvtepu8_epi16(m);
                let taken = hsum_i32(_mm256_madd_epi16(bsums, m)) as f32;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * x.d), lane0_f32(taken), acc[t]);
            }
        }
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        out[t] = hsum(acc[t]);
    }
    out
}

/// IQ4_NL's 16 values in both 128-bit halves, for `vpshufb` to look up
/// nibbles in.
#[inline(always)]
unsafe fn iq4_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i))
}

/// The same values offset by 128 to `u8` (1..=241), for the VNNI tiers'
/// `u8 · i8` product.
#[inline(always)]
unsafe fn iq4_table_u8() -> __m256i {
    _mm256_xor_si256(iq4_table(), _mm256_set1_epi8(-128))
}

/// One IQ4_XS row against `T` tokens: the row kernel (`T` = 1) and the
/// tile's step are this one function (the same bits, as
/// [`q4_k_tokens`]).
///
/// A sub-block's 16 bytes of nibbles are its 32 values in the activations'
/// own order (low nibbles first), so each is one load, one `vpshufb` into
/// the table and its magnitude, taken once for the `T` tokens. The table's
/// values are signed, so the sign trick moves their signs onto the
/// activations (offset to `u8`, as the VNNI 32-blocks take it, a pair of
/// products would overflow `vpmaddubsw`'s i16), and one `vpmaddwd` by the
/// sub-block's scale widens the pairs (2 x 127 x 127 fits an i16; times a
/// scale of at most 32 fits an i32 many times over).
#[inline(always)]
unsafe fn iq4_xs_tokens<const T: usize, const PF: bool>(w: &[u8], a: [&[Q8KBlock]; T]) -> [f32; T] {
    let n = k_blocks(w, IQ4_XS_BYTES, &a);
    let table = iq4_table();
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..n {
        let blk = &w[i * IQ4_XS_BYTES..(i + 1) * IQ4_XS_BYTES];
        let b = blk.as_ptr();
        prefetch_ahead::<PF>(b, IQ4_XS_BYTES);
        let sc = iq4xs_scales(blk);
        let mut dots = [_mm256_setzero_si256(); T];
        for (j, &scale) in sc.iter().enumerate() {
            let v = _mm256_shuffle_epi8(table, nibbles(b.add(IQ4_XS_QS + 16 * j)));
            let mag = _mm256_sign_epi8(v, v);
            let scale = _mm256_set1_epi16(scale as i16);
            for t in 0..T {
                let xq = _mm256_loadu_si256(a[t][i].q.as_ptr().add(32 * j) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xq, v));
                dots[t] = _mm256_add_epi32(dots[t], _mm256_madd_epi16(pairs, scale));
            }
        }
        let d = f16_at(b);
        for t in 0..T {
            let dx = _mm256_set1_ps(d * a[t][i].d);
            acc[t] = _mm256_fmadd_ps(dx, _mm256_cvtepi32_ps(dots[t]), acc[t]);
        }
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        out[t] = hsum(acc[t]);
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2<const PF: bool>(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(w.len() / 2);
    let full = n / 16 * 16;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut j = 0;
    while j < full {
        prefetch_line::<PF>(wp.wrapping_add(2 * j + PREFETCH_AHEAD));
        for (k, a) in acc.iter_mut().enumerate() {
            let at = j + 8 * k;
            let wv = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * at) as *const __m128i));
            *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(at)), *a);
        }
        j += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    for (k, &xv) in x[full..n].iter().enumerate() {
        s += super::blocks::f16_at(w, 2 * (full + k)) * xv;
    }
    s
}

/// f16 weights against four tokens: each 8 weights widened once and used
/// four times. Two accumulators per token, so one token alone (above) and
/// four together sum in the same order: the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_x4_avx2(w: &[u8], xs: &[&[f32]; 4]) -> [f32; 4] {
    let n = xs
        .iter()
        .map(|x| x.len())
        .min()
        .unwrap_or(0)
        .min(w.len() / 2);
    let full = n / 16 * 16;
    let wp = w.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut j = 0;
    while j < full {
        for k in 0..2 {
            let at = j + 8 * k;
            let wv = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * at) as *const __m128i));
            for (a, x) in acc.iter_mut().zip(xs) {
                a[k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(at)), a[k]);
            }
        }
        j += 16;
    }
    let mut out = [0.0f32; 4];
    for ((o, a), x) in out.iter_mut().zip(&acc).zip(xs) {
        let mut s = hsum(_mm256_add_ps(a[0], a[1]));
        for (k, &xv) in x[full..n].iter().enumerate() {
            s += super::blocks::f16_at(w, 2 * (full + k)) * xv;
        }
        *o = s;
    }
    out
}

/// f16 weights, four rows by four tokens, for prefill and batches: a
/// register-blocked product whose sixteen accumulators each hold one
/// (row, token)'s sixteen partial sums in a 512-bit register. Those are the
/// one-token kernel's two 256-bit accumulators side by side, summed in the
/// same order and reduced the same way, so every result has its bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn dot_f16_tile_avx512(w: &[&[u8]; 4], xs: &[&[f32]; 4]) -> [[f32; 4]; 4] {
    let n = xs
        .iter()
        .map(|x| x.len())
        .chain(w.iter().map(|r| r.len() / 2))
        .min()
        .unwrap_or(0);
    let full = n / 16 * 16;
    // Sixteen accumulators, four widened rows and a token's values: 21 of
    // the 32 registers. Without `avx512vl` LLVM used 18 and spilled.
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let mut j = 0;
    while j < full {
        let wv =
            w.map(|r| _mm512_cvtph_ps(_mm256_loadu_si256(r.as_ptr().add(2 * j) as *const __m256i)));
        for t in 0..4 {
            let xv = _mm512_loadu_ps(xs[t].as_ptr().add(j));
            for r in 0..4 {
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
        j += 16;
    }
    let mut out = [[0.0f32; 4]; 4];
    for r in 0..4 {
        for t in 0..4 {
            let a = acc[r][t];
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
            let mut s = hsum(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
            for (k, &xv) in xs[t][full..n].iter().enumerate() {
                s += super::blocks::f16_at(w[r], 2 * (full + k)) * xv;
            }
            out[r][t] = s;
        }
    }
    out
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_bf16_avx2<const PF: bool>(w: &[u8], x: &[f32]) -> f32 {
    // Summed as the f16 and f32 kernels sum (two accumulators over 16).
    let n = x.len().min(w.len() / 2);
    let full = n / 16 * 16;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut j = 0;
    while j < full {
        prefetch_line::<PF>(wp.wrapping_add(2 * j + PREFETCH_AHEAD));
        for (k, a) in acc.iter_mut().enumerate() {
            let at = j + 8 * k;
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(wp.add(2 * at) as *const __m128i));
            let wv = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
            *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp.add(at)), *a);
        }
        j += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    for (k, &xv) in x[full..n].iter().enumerate() {
        s += super::blocks::bf16_at(w, 2 * (full + k)) * xv;
    }
    s
}

/// [`super::attn::attend`] with AVX2 vectors (the same bits as every other
/// instruction set: no fused multiply-adds are formed from its sums).
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(t: &super::attn::AttnTask<'_>, s: &mut Vec<f32>, o: &mut [f32]) {
    super::attn::attend(t, s, o)
}

/// [`super::attn::attend`] with AVX-512 vectors.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn attend_avx512(t: &super::attn::AttnTask<'_>, s: &mut Vec<f32>, o: &mut [f32]) {
    super::attn::attend(t, s, o)
}

/// [`super::acts::quantize_q8_into`] in AVX2 vectors, written out: the
/// compiler left the portable body's maximum and rounding scalar (5% of a
/// batched decode). The same bits for every input: the maximum skips NaN
/// as the body's comparison does, and the rounding clamps in floats before
/// truncating (NaN first to 0), which is what the body's saturating casts
/// give, infinities and overflowing products included.
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8_avx2(x: &[f32], out: &mut [Q8Block]) {
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        let mut v = [_mm256_setzero_ps(); 4];
        let mut m = _mm256_setzero_ps();
        for (k, v) in v.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(xs.as_ptr().add(8 * k));
            // maxps gives its second operand when the first is NaN.
            m = _mm256_max_ps(_mm256_andnot_ps(sign, *v), m);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.into_iter().fold(0.0f32, f32::max);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let mut q = [_mm256_setzero_si256(); 4];
        for (q, v) in q.iter_mut().zip(&v) {
            let y = _mm256_mul_ps(*v, id);
            let t = _mm256_add_ps(y, _mm256_or_ps(half, _mm256_and_ps(y, sign)));
            let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
            *q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
        }
        // packs works within 128-bit halves; the permute puts the 4-value
        // runs back in order.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(b.q.as_mut_ptr() as *mut __m256i, bytes);
        let s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(s8),
            _mm256_extracti128_si256::<1>(s8),
        );
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
        b.d = d;
        b.s = d * sum as f32;
        b.neg128_sum = -128 * sum;
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    // Two accumulators over 16 values, as the f16 kernels sum: a matrix
    // stored as f16 and the same values stored as f32 give the same bits.
    let n = a.len().min(b.len());
    let full = n / 16 * 16;
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut j = 0;
    while j < full {
        for (k, s) in acc.iter_mut().enumerate() {
            let at = j + 8 * k;
            *s = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(at)), _mm256_loadu_ps(bp.add(at)), *s);
        }
        j += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    for (x, y) in a[full..n].iter().zip(&b[full..n]) {
        s += x * y;
    }
    s
}

/// How one instruction set adds byte products into i32 lanes: the only
/// difference between the three tiers' 32-block kernels.
trait Lanes {
    /// `acc` plus, in each i32 lane, the sum of that lane's four products of
    /// `u`'s bytes (unsigned) and `s`'s (signed). Exact on VNNI for any
    /// bytes; through AVX2's `vpmaddubsw` exact while each pair of products
    /// fits an i16, which every caller keeps to (weights at most 128, and
    /// activations within ±127).
    unsafe fn dot4(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `init` plus each lane's products of two weight vectors with two
    /// activation vectors (a pair of a row's last blocks, [`Format::unpack_pair`]).
    /// Through AVX2 the weights must be nibbles, as for [`Lanes::dot8`].
    #[inline(always)]
    unsafe fn dot2(init: __m256i, w: &[__m256i; 2], x: &[__m256i; 2]) -> __m256i {
        Self::dot4(Self::dot4(init, w[0], x[0]), w[1], x[1])
    }
    /// `init` plus each lane's products of eight weight vectors with a
    /// group's activations. Through AVX2 the weights must be nibbles (at
    /// most 15, see [`Avx2Lanes`]); the VNNI tiers take any bytes.
    #[inline(always)]
    unsafe fn dot8(init: __m256i, w: &[__m256i; 8], x: &Q8Group) -> __m256i {
        let mut p = init;
        for (w, xq) in w.iter().zip(&x.q) {
            p = Self::dot4(p, *w, _mm256_loadu_si256(xq.as_ptr() as *const __m256i));
        }
        p
    }
    /// [`Lanes::dot8`] for weights of up to 5 bits (Q5_0, Q5_1): the same
    /// on the VNNI tiers; through AVX2 summed in i16 four vectors at a time.
    #[inline(always)]
    unsafe fn dot8_wide(init: __m256i, w: &[__m256i; 8], x: &Q8Group) -> __m256i {
        Self::dot8(init, w, x)
    }
}

/// AVX2: `vpmaddubsw` into i16 pairs, `vpmaddwd` into i32 lanes.
struct Avx2Lanes;
impl Lanes for Avx2Lanes {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, udot(u, s))
    }
    /// The eight `vpmaddubsw` results summed in i16 before one `vpmaddwd`:
    /// a pair of nibble products is at most 2 * 15 * 127 = 3810, eight of
    /// them 30480, below i16's 32767.
    #[inline(always)]
    unsafe fn dot8(init: __m256i, w: &[__m256i; 8], x: &Q8Group) -> __m256i {
        let mut pairs = _mm256_setzero_si256();
        for (w, xq) in w.iter().zip(&x.q) {
            let xq = _mm256_loadu_si256(xq.as_ptr() as *const __m256i);
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(*w, xq));
        }
        _mm256_add_epi32(init, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
    /// Four `vpmaddubsw` results summed in i16 before each `vpmaddwd`: a
    /// pair of 5-bit products is at most 2 * 31 * 127 = 7,874, four of them
    /// 31,496, below i16's 32,767 (eight would not be).
    #[inline(always)]
    unsafe fn dot8_wide(init: __m256i, w: &[__m256i; 8], x: &Q8Group) -> __m256i {
        let mut p = init;
        for (w, x) in w.chunks_exact(4).zip(x.q.chunks_exact(4)) {
            let mut pairs = _mm256_setzero_si256();
            for (w, xq) in w.iter().zip(x) {
                let xq = _mm256_loadu_si256(xq.as_ptr() as *const __m256i);
                pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(*w, xq));
            }
            p = _mm256_add_epi32(p, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        }
        p
    }
    /// The two `vpmaddubsw` results summed in i16 (at most 7620; 15,748 for
    /// 5-bit weights) before one `vpmaddwd`.
    #[inline(always)]
    unsafe fn dot2(init: __m256i, w: &[__m256i; 2], x: &[__m256i; 2]) -> __m256i {
        let pairs = _mm256_add_epi16(
            _mm256_maddubs_epi16(w[0], x[0]),
            _mm256_maddubs_epi16(w[1], x[1]),
        );
        _mm256_add_epi32(init, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
}

/// AVX-VNNI: the VEX-encoded `vpdpbusd`.
struct AvxVnniLanes;
impl Lanes for AvxVnniLanes {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
}

/// AVX-512 VNNI: the EVEX-encoded 256-bit `vpdpbusd`.
struct Avx512Lanes;
impl Lanes for Avx512Lanes {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

/// One 32-block format's pieces, from which every shape of its dot product
/// is built (so they cannot drift apart):
///
/// * one weight row · one token (decode), eight blocks at a time
///   ([`Grouped`]) and the last few two at a time (an odd one alone),
///   prefetching ahead on
///   AVX2 ([`PREFETCH_AHEAD`]). One sequential stream per core is what the
///   hardware prefetchers follow best; interleaving four rows' streams
///   measured at less than half of it, so decode runs row by row;
/// * four rows · four tokens (prefill and batches), so each weight group is
///   unpacked once for four tokens: the activations of a long prompt live
///   in L2, and reading them once per row left the kernel waiting on L2.
///
/// Per (row, token) every shape runs the same float operations in the same
/// order: `acc = fma(d_w d_x, int_dot, acc)` per eight blocks (a block per
/// lane), per two of the blocks left after the last eight (a block per
/// 128-bit half) and for a last odd block (its partial sums across the
/// lanes), each followed, for formats with a float offset (Q4_1's
/// minimum), by `acc = fma(m, s_x, acc)`; and `hsum(acc)` at the end. The
/// pairs matter for rows like SmolLM2's 576-wide ones (two blocks after two
/// groups): a block at a time, those two blocks took a fifth of the tile's
/// time, a float multiply, conversion and fma per block and token. The
/// integer sums are exact on every tier, so every shape and tier gives the
/// same bits and a token's result does not depend on its neighbours in the
/// batch. Scales stay in vectors end to end, so no block waits on the
/// previous block's accumulator.
trait Format {
    /// Bytes of one block.
    const BYTES: usize;
    /// The block at `b`'s 32 weights as bytes, in the activations' order.
    unsafe fn unpack(b: *const u8) -> __m256i;
    /// Those weights times the activations `xq` of `x` as eight i32 sums,
    /// integer offsets (Q4_0's 8) taken out exactly.
    unsafe fn product(wv: __m256i, xq: __m256i, x: &Q8Block) -> __m256i;
    /// The float offset's two factors (Q4_1's minimum and `[s_x, 0, ..]`);
    /// none for formats whose offset, if any, is taken out in the integers.
    #[inline(always)]
    unsafe fn offset(_b: *const u8, _x: &Q8Block) -> Option<(__m256, __m256)> {
        None
    }
    /// The weights of blocks `b[0]` and `b[1]` as bytes, a block per 128-bit
    /// half: their values 0..16, then their values 16..32 (the order of
    /// [`pair_acts`]).
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2];
    /// Those weights times the activations `xq` of `x` ([`pair_acts`]) as
    /// i32 lanes, block `b[0]`'s in lanes 0..4 and `b[1]`'s in 4..8,
    /// integer offsets taken out exactly.
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], x: [&Q8Block; 2]) -> __m256i;
    /// The float offset's two factors for a pair: each block's minimum
    /// across its half, and its `s_x` in its half's first lane.
    #[inline(always)]
    unsafe fn offset_pair(_b: [*const u8; 2], _x: [&Q8Block; 2]) -> Option<(__m256, __m256)> {
        None
    }
}

/// A format taken eight blocks at a time, one block per lane (against a
/// [`Q8Group`]): eight four-byte dot products leave each block's whole
/// integer sum in its own lane, so one conversion, one scale multiply and
/// one fma serve eight blocks, where the block-at-a-time step needs one of
/// each per block. The per-block float work, not the integer products, was
/// what bound these kernels.
trait Grouped: Format {
    /// The group at `b`, stored as [`super::lanes`] lays it out: its
    /// weights as bytes with lane `l` holding block `l`'s values in the
    /// order of [`Q8Group::q`], their scales, and their float offsets (Q4_1's
    /// minimums). Straight loads, where the file's layout took a transpose.
    unsafe fn weights8(b: *const u8) -> Eight;
    /// Each lane's block's whole integer product with `x`, offsets included.
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i;
}

/// Eight weight blocks in lanes, as [`Grouped::weights8`] gives them.
struct Eight {
    w: [__m256i; 8],
    d: __m256,
    m: Option<__m256>,
    /// For Q8_0 on AVX2: the signed weights, whose signs move onto the
    /// activations (`w` then holds their magnitudes, taken once for all the
    /// tile's tokens).
    signs: Option<[__m256i; 8]>,
}

/// One block: the weights `wv` of the block at `b` against `x`, into `acc`.
#[inline(always)]
unsafe fn step<F: Format>(b: *const u8, x: &Q8Block, wv: __m256i, acc: &mut __m256) {
    let xq = _mm256_loadu_si256(x.q.as_ptr() as *const __m256i);
    let p = F::product(wv, xq, x);
    *acc = _mm256_fmadd_ps(
        _mm256_mul_ps(f16x8_at(b), _mm256_set1_ps(x.d)),
        _mm256_cvtepi32_ps(p),
        *acc,
    );
    if let Some((m, s)) = F::offset(b, x) {
        *acc = _mm256_fmadd_ps(m, s, *acc);
    }
}

/// Two blocks, a block per 128-bit half, against `x`, into `acc`: the same
/// form as [`step`], `dw` the blocks' scales ([`f16_halves`]), shared by a
/// tile's tokens.
#[inline(always)]
unsafe fn pair_step<F: Format>(
    b: [*const u8; 2],
    dw: __m256,
    wv: &[__m256i; 2],
    x: [&Q8Block; 2],
    acc: &mut __m256,
) {
    let p = F::product_pair(wv, &pair_acts(x), x);
    let dx = _mm256_set_m128(_mm_set1_ps(x[1].d), _mm_set1_ps(x[0].d));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(p), *acc);
    if let Some((m, s)) = F::offset_pair(b, x) {
        *acc = _mm256_fmadd_ps(m, s, *acc);
    }
}

/// Blocks `i` and `i + 1` of the row at `w`.
#[inline(always)]
unsafe fn block_pair<F: Format>(w: &[u8], i: usize) -> [*const u8; 2] {
    let b = w.as_ptr().add(i * F::BYTES);
    [b, b.add(F::BYTES)]
}

/// Eight blocks in lanes against `x`, into `acc`: the same form as [`step`]
/// with a block per lane.
#[inline(always)]
unsafe fn group_step<F: Grouped>(e: &Eight, x: &Q8Group, acc: &mut __m256) {
    let p = F::dot8(e, x);
    *acc = _mm256_fmadd_ps(
        _mm256_mul_ps(e.d, _mm256_loadu_ps(x.d.as_ptr())),
        _mm256_cvtepi32_ps(p),
        *acc,
    );
    if let Some(m) = e.m {
        *acc = _mm256_fmadd_ps(m, _mm256_loadu_ps(x.s.as_ptr()), *acc);
    }
}

/// Blocks `from..n` of one row against one token's blocks, into `acc`: two
/// at a time, then the last odd one.
#[inline(always)]
unsafe fn blocks_from<F: Format>(w: &[u8], a: &[Q8Block], from: usize, acc: &mut __m256) {
    let n = a.len().min(w.len() / F::BYTES);
    let mut i = from;
    while i + 2 <= n {
        let b = block_pair::<F>(w, i);
        let (dw, wv) = (f16_halves(b[0], b[1]), F::unpack_pair(b));
        pair_step::<F>(b, dw, &wv, [&a[i], &a[i + 1]], acc);
        i += 2;
    }
    if i < n {
        let b = w.as_ptr().add(i * F::BYTES);
        step::<F>(b, &a[i], F::unpack(b), acc);
    }
}

/// Blocks `from..n` of `R` rows against four tokens (`n` the fewest blocks
/// of any of them), each weight block unpacked once for the four tokens.
// One block index for the rows and the four tokens' slices.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_blocks_from<F: Format, const R: usize>(
    w: &[&[u8]; R],
    a: &[&[Q8Block]; 4],
    from: usize,
    acc: &mut [[__m256; 4]; R],
) {
    let n = blocks_in_tile::<R>(w, a, F::BYTES);
    // Cut to `n` so the indexing below needs no bounds checks.
    let a: [&[Q8Block]; 4] = a.map(|t| &t[..n]);
    let mut i = from;
    while i + 2 <= n {
        for r in 0..R {
            let b = block_pair::<F>(w[r], i);
            let (dw, wv) = (f16_halves(b[0], b[1]), F::unpack_pair(b));
            for j in 0..4 {
                pair_step::<F>(b, dw, &wv, [&a[j][i], &a[j][i + 1]], &mut acc[r][j]);
            }
        }
        i += 2;
    }
    if i < n {
        for r in 0..R {
            let b = w[r].as_ptr().add(i * F::BYTES);
            let wv = F::unpack(b);
            for j in 0..4 {
                step::<F>(b, &a[j][i], wv, &mut acc[r][j]);
            }
        }
    }
}

/// The fewest whole blocks of any row or token of a tile.
#[inline(always)]
fn blocks_in_tile<const R: usize>(w: &[&[u8]; R], a: &[&[Q8Block]; 4], bytes: usize) -> usize {
    a.iter()
        .map(|r| r.len())
        .chain(w.iter().map(|r| r.len() / bytes))
        .min()
        .unwrap_or(0)
}

/// Whole groups of eight blocks a row of `n` blocks takes from `groups`.
#[inline(always)]
fn whole_groups(n: usize, groups: usize) -> usize {
    (n / 8).min(groups)
}

/// How far ahead of the weights in hand the AVX2 row kernels (Q8_0, Q4_0,
/// Q4_1, Q4_K, Q6_K, f16, bf16) prefetch. On Zen 1 one core's stream of weights, left
/// to the hardware prefetcher, came in at 7.4-7.8 GB/s where a plain sum
/// reads 13: the fetches did not run far enough ahead to overlap with the
/// arithmetic (the Q8_0 kernel reads 14 GB/s of weights already in L2).
/// Every line 1 to 8 KiB ahead measured alike: decode 20-36% faster at one
/// thread. Prefetching two of a Q8_0 group's five lines, an earlier try,
/// halved it. The tiles (batches, prefill) reuse each group for several
/// tokens, are bound by arithmetic, and measured no faster with it.
const PREFETCH_AHEAD: usize = 4096;

/// Asks for the cache lines of the group `PREFETCH_AHEAD` bytes past `b`
/// (a group of `F` spans `8 * F::BYTES`). Only where `ON`: the VNNI tiers
/// keep to what their machine (Zen 4) measured, where an earlier prefetch
/// lost 5-20% (BENCHMARKS.md).
#[inline(always)]
unsafe fn prefetch_group<F: Format, const ON: bool>(b: *const u8) {
    prefetch_ahead::<ON>(b, 8 * F::BYTES);
}

/// Asks for the cache lines of the `len` bytes `PREFETCH_AHEAD` past `b`,
/// where `ON` (past the matrix's end too: a prefetch never faults).
#[inline(always)]
unsafe fn prefetch_ahead<const ON: bool>(b: *const u8, len: usize) {
    let mut at = PREFETCH_AHEAD;
    while at < PREFETCH_AHEAD + len {
        prefetch_line::<ON>(b.wrapping_add(at));
        at += 64;
    }
}

/// Asks for the cache line holding `p` where `ON` (any address: a prefetch
/// never faults).
#[inline(always)]
unsafe fn prefetch_line<const ON: bool>(p: *const u8) {
    if ON {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }
}

/// One row against one token: its whole groups of eight, then the rest two
/// blocks at a time (an odd one alone), prefetching ahead where `PF`.
#[inline(always)]
unsafe fn one_row<F: Grouped, const PF: bool>(w: &[u8], a: &Q8Row<'_>) -> f32 {
    let n = a.blocks.len().min(w.len() / F::BYTES);
    let groups = &a.groups[..whole_groups(n, a.groups.len())];
    let mut acc = _mm256_setzero_ps();
    for (g, x) in groups.iter().enumerate() {
        let b = w.as_ptr().add(g * 8 * F::BYTES);
        prefetch_group::<F, PF>(b);
        let e = F::weights8(b);
        group_step::<F>(&e, x, &mut acc);
    }
    blocks_from::<F>(w, a.blocks, groups.len() * 8, &mut acc);
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_avx2<F: Grouped>(w: &[u8], a: &Q8Row<'_>) -> f32 {
    one_row::<F, true>(w, a)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn one_avx_vnni<F: Grouped>(w: &[u8], a: &Q8Row<'_>) -> f32 {
    one_row::<F, false>(w, a)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
unsafe fn one_vnni<F: Grouped>(w: &[u8], a: &Q8Row<'_>) -> f32 {
    one_row::<F, false>(w, a)
}

/// One row's group `g` against four tokens' groups, into its accumulators.
#[inline(always)]
unsafe fn row_group<F: Grouped>(w: &[u8], g: usize, x: [&Q8Group; 4], acc: &mut [__m256; 4]) {
    let e = F::weights8(w.as_ptr().add(g * 8 * F::BYTES));
    group_step::<F>(&e, x[0], &mut acc[0]);
    group_step::<F>(&e, x[1], &mut acc[1]);
    group_step::<F>(&e, x[2], &mut acc[2]);
    group_step::<F>(&e, x[3], &mut acc[3]);
}

/// The whole groups every row and token of a tile has, and the tokens'
/// blocks.
#[inline(always)]
fn tile_extent<'a, F: Format>(
    w: &[&[u8]; 4],
    a: &[Q8Row<'a>; 4],
) -> (usize, [&'a [Q8Block]; 4], [&'a [Q8Group]; 4]) {
    let blocks = a.map(|t| t.blocks);
    let n = blocks_in_tile::<4>(w, &blocks, F::BYTES);
    let ng = a
        .iter()
        .map(|t| whole_groups(n, t.groups.len()))
        .min()
        .unwrap_or(0);
    (ng, blocks, a.map(|t| &t.groups[..ng]))
}

/// Four rows by four tokens, a row at a time: with sixteen vector registers
/// (AVX2, and AVX-VNNI's VEX encoding) a row's four accumulators and its
/// eight unpacked weight vectors are all they hold.
// One group index for the four tokens' slices.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_by_rows<F: Grouped>(w: &[&[u8]; 4], a: &[Q8Row<'_>; 4]) -> [[f32; 4]; 4] {
    let (ng, blocks, groups) = tile_extent::<F>(w, a);
    let mut out = [[0.0f32; 4]; 4];
    for r in 0..4 {
        let mut acc = [[_mm256_setzero_ps(); 4]];
        for g in 0..ng {
            let x = [&groups[0][g], &groups[1][g], &groups[2][g], &groups[3][g]];
            row_group::<F>(w[r], g, x, &mut acc[0]);
        }
        tile_blocks_from::<F, 1>(&[w[r]], &blocks, ng * 8, &mut acc);
        for t in 0..4 {
            out[r][t] = hsum(acc[0][t]);
        }
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<F: Grouped>(w: &[&[u8]; 4], a: &[Q8Row<'_>; 4]) -> [[f32; 4]; 4] {
    tile_by_rows::<F>(w, a)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tile_avx_vnni<F: Grouped>(w: &[&[u8]; 4], a: &[Q8Row<'_>; 4]) -> [[f32; 4]; 4] {
    tile_by_rows::<F>(w, a)
}

/// Four rows by four tokens at once: AVX-512's 32 registers hold all
/// sixteen accumulators beside a row's unpacked weights. The rows are
/// spelled out rather than looped over: as a loop LLVM kept the sixteen
/// accumulators on the stack, a load and a store around every fma.
// One group index for the four tokens' slices.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
unsafe fn tile_vnni<F: Grouped>(w: &[&[u8]; 4], a: &[Q8Row<'_>; 4]) -> [[f32; 4]; 4] {
    let (ng, blocks, groups) = tile_extent::<F>(w, a);
    let zero = [_mm256_setzero_ps(); 4];
    let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
    for g in 0..ng {
        let x = [&groups[0][g], &groups[1][g], &groups[2][g], &groups[3][g]];
        row_group::<F>(w[0], g, x, &mut a0);
        row_group::<F>(w[1], g, x, &mut a1);
        row_group::<F>(w[2], g, x, &mut a2);
        row_group::<F>(w[3], g, x, &mut a3);
    }
    let mut acc = [a0, a1, a2, a3];
    tile_blocks_from::<F, 4>(w, &blocks, ng * 8, &mut acc);
    let mut out = [[0.0f32; 4]; 4];
    for r in 0..4 {
        for t in 0..4 {
            out[r][t] = hsum(acc[r][t]);
        }
    }
    out
}

/// `v` in lane 0 of an otherwise zero vector: a per-block term that the
/// final sum of the lanes adds once.
#[inline(always)]
unsafe fn lane0_i32(v: i32) -> __m256i {
    _mm256_zextsi128_si256(_mm_cvtsi32_si128(v))
}

/// The same for a float.
#[inline(always)]
unsafe fn lane0_f32(v: f32) -> __m256 {
    _mm256_zextps128_ps256(_mm_set_ss(v))
}

/// Bytes 2.. of a Q8_0 block: its 32 signed weights.
#[inline(always)]
unsafe fn q8_weights(b: *const u8) -> __m256i {
    _mm256_loadu_si256(b.add(2) as *const __m256i)
}

/// i8 · i8 through maddubs: |w| as unsigned, the sign moved onto x.
#[inline(always)]
unsafe fn signed_udot(wv: __m256i, xq: __m256i) -> __m256i {
    udot(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xq, wv))
}

/// Eight f16s from `p`, widened: a group's scales or minimums.
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// The 16 bytes at `p0` in the low 128 bits and those at `p1` in the high.
#[inline(always)]
unsafe fn halves(p0: *const u8, p1: *const u8) -> __m256i {
    _mm256_loadu2_m128i(p1 as *const __m128i, p0 as *const __m128i)
}

/// The f16s at `p0` and `p1` widened, each across its 128-bit half: a
/// pair's scales or minimums. (Broadcast loads, as in [`f16x8_at`].)
#[inline(always)]
unsafe fn f16_halves(p0: *const u8, p1: *const u8) -> __m256 {
    let lo = _mm_set1_epi16((p0 as *const i16).read_unaligned());
    let hi = _mm_set1_epi16((p1 as *const i16).read_unaligned());
    _mm256_cvtph_ps(_mm_unpacklo_epi64(lo, hi))
}

/// Two blocks' activations in the order of [`Format::unpack_pair`]: values
/// 0..16 of each (a block per half), then values 16..32.
#[inline(always)]
unsafe fn pair_acts(x: [&Q8Block; 2]) -> [__m256i; 2] {
    let (p0, p1) = (x[0].q.as_ptr() as *const u8, x[1].q.as_ptr() as *const u8);
    [halves(p0, p1), halves(p0.add(16), p1.add(16))]
}

/// `a` and `b` in the first lanes of the low and high halves, the other
/// lanes zero: a per-block term for a pair.
#[inline(always)]
unsafe fn firsts_i32(a: i32, b: i32) -> __m256i {
    _mm256_set_m128i(_mm_cvtsi32_si128(b), _mm_cvtsi32_si128(a))
}

/// The same for floats.
#[inline(always)]
unsafe fn firsts_f32(a: f32, b: f32) -> __m256 {
    _mm256_set_m128(_mm_set_ss(b), _mm_set_ss(a))
}

/// The 16 bytes of nibbles at `p0` and at `p1` as a pair's values 0..16
/// (low nibbles) and 16..32 (high nibbles), a block per half.
#[inline(always)]
unsafe fn nibble_halves(p0: *const u8, p1: *const u8) -> [__m256i; 2] {
    let v = halves(p0, p1);
    let m = _mm256_set1_epi8(0x0F);
    [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16(v, 4), m),
    ]
}

/// A pair of Q8_0 blocks' signed weights, a block per half.
#[inline(always)]
unsafe fn q8_pair(b: [*const u8; 2]) -> [__m256i; 2] {
    [
        halves(b[0].add(2), b[1].add(2)),
        halves(b[0].add(18), b[1].add(18)),
    ]
}

/// The `N` 32-byte vectors from `p`: a group's quantized bytes, one block
/// per lane (no array `map` or closure here or in the other helpers the
/// kernels inline: a closure does not inherit the kernel's target features,
/// so the intrinsics inside it became calls and decode ran 8x slower).
#[inline(always)]
unsafe fn vectors<const N: usize>(p: *const u8) -> [__m256i; N] {
    let mut v = [_mm256_setzero_si256(); N];
    for (k, v) in v.iter_mut().enumerate() {
        *v = _mm256_loadu_si256(p.add(32 * k) as *const __m256i);
    }
    v
}

/// Four vectors of packed nibbles, a block per lane, as eight vectors of
/// values: low nibbles are a block's values 0..16, high nibbles 16..32, so
/// word `k` gives vectors `k` and `k + 4` of [`Q8Group::q`]'s order.
#[inline(always)]
unsafe fn nibbles8(p: [__m256i; 4]) -> [__m256i; 8] {
    let m = _mm256_set1_epi8(0x0F);
    let mut out = [_mm256_setzero_si256(); 8];
    for (k, v) in p.iter().enumerate() {
        out[k] = _mm256_and_si256(*v, m);
        out[k + 4] = _mm256_and_si256(_mm256_srli_epi16(*v, 4), m);
    }
    out
}

/// Q8_0 where only AVX2's `vpmaddubsw` multiplies bytes: the weights stay
/// signed and the sign trick moves their signs onto the activations
/// (offsetting them to u8, as VNNI does, would overflow its i16 pairs).
struct Q8_0Signed;
impl Format for Q8_0Signed {
    const BYTES: usize = Q8_0_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        q8_weights(b)
    }
    /// The signed products, four to a lane, as the VNNI tiers sum a row's
    /// last blocks ([`Q8_0Offset`]).
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, _x: &Q8Block) -> __m256i {
        signed_udot(wv, xq)
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        q8_pair(b)
    }
    /// A `vpmaddwd` per `vpmaddubsw`: pairs of signed byte products reach
    /// 32,512, so two cannot share an i16.
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], _x: [&Q8Block; 2]) -> __m256i {
        _mm256_add_epi32(signed_udot(wv[0], xq[0]), signed_udot(wv[1], xq[1]))
    }
}
impl Grouped for Q8_0Signed {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        signed_eight(vectors::<8>(b.add(16)), f16x8(b))
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        signed_dot8(e, x)
    }
}

/// Eight signed blocks in lanes (`signs`, the weights) with scales `d`, as
/// the sign trick holds them: their magnitudes taken once, for every token
/// of a tile.
#[inline(always)]
unsafe fn signed_eight(signs: [__m256i; 8], d: __m256) -> Eight {
    let mut w = signs;
    for v in &mut w {
        *v = _mm256_sign_epi8(*v, *v);
    }
    Eight {
        w,
        d,
        m: None,
        signs: Some(signs),
    }
}

/// Eight signed blocks in lanes as the sign trick holds them (magnitudes in
/// `e.w`, the signed weights in `e.signs`) against a group: a `vpmaddwd`
/// per `vpmaddubsw`, since pairs of signed byte products reach 32,512.
#[inline(always)]
unsafe fn signed_dot8(e: &Eight, x: &Q8Group) -> __m256i {
    // Always set by the signed formats' `weights8`.
    let signs = e.signs.unwrap_or(e.w);
    let mut p = _mm256_setzero_si256();
    for ((w, s), xq) in e.w.iter().zip(&signs).zip(&x.q) {
        let xq = _mm256_loadu_si256(xq.as_ptr() as *const __m256i);
        p = _mm256_add_epi32(p, udot(*w, _mm256_sign_epi8(xq, *s)));
    }
    p
}

/// A block's signed weights `wv` times activations `xq` in i32 lanes
/// through `L`'s `u8 · i8` product: the sign trick, for a row's last blocks
/// on the VNNI tiers (whose lanes hold partial sums, which an offset would
/// change).
#[inline(always)]
unsafe fn signed_dot4<L: Lanes>(wv: __m256i, xq: __m256i) -> __m256i {
    L::dot4(
        _mm256_setzero_si256(),
        _mm256_sign_epi8(wv, wv),
        _mm256_sign_epi8(xq, wv),
    )
}

/// Each byte of `v` (nibbles) replaced by its entry of `table`.
#[inline(always)]
unsafe fn look_up<const N: usize>(table: __m256i, mut v: [__m256i; N]) -> [__m256i; N] {
    for v in v.iter_mut() {
        *v = _mm256_shuffle_epi8(table, *v);
    }
    v
}

/// IQ4_NL where only AVX2's `vpmaddubsw` multiplies bytes: Q4_0's nibbles
/// looked up in the signed table, then Q8_0's sign trick (offsetting the
/// values to `u8` would overflow its i16 pairs).
struct Iq4NlSigned;
impl Format for Iq4NlSigned {
    const BYTES: usize = IQ4_NL_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        _mm256_shuffle_epi8(iq4_table(), nibbles(b.add(2)))
    }
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, _x: &Q8Block) -> __m256i {
        signed_udot(wv, xq)
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        look_up(iq4_table(), nibble_halves(b[0].add(2), b[1].add(2)))
    }
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], _x: [&Q8Block; 2]) -> __m256i {
        _mm256_add_epi32(signed_udot(wv[0], xq[0]), signed_udot(wv[1], xq[1]))
    }
}
impl Grouped for Iq4NlSigned {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        let signs = look_up(iq4_table(), nibbles8(vectors::<4>(b.add(16))));
        signed_eight(signs, f16x8(b))
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        signed_dot8(e, x)
    }
}

/// IQ4_NL with VNNI: a group's nibbles looked up in the table offset by
/// 128 (a `u8` per value, as [`Q8_0Offset`] makes its weights) and the
/// offset's `128 sum(x)` taken back out in the integers: exact, and no sign
/// trick per token. A row's last blocks take the sign trick as
/// [`Iq4NlSigned`] does: their lanes hold partial sums, which the offset
/// would change, and the tiers must give the same bits. Only for the VNNI
/// [`Lanes`]: AVX2's would overflow on values past 15.
struct Iq4NlOffset<L>(PhantomData<L>);
impl<L: Lanes> Format for Iq4NlOffset<L> {
    const BYTES: usize = IQ4_NL_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        Iq4NlSigned::unpack(b)
    }
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, _x: &Q8Block) -> __m256i {
        signed_dot4::<L>(wv, xq)
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        Iq4NlSigned::unpack_pair(b)
    }
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], x: [&Q8Block; 2]) -> __m256i {
        _mm256_add_epi32(
            Self::product(wv[0], xq[0], x[0]),
            Self::product(wv[1], xq[1], x[1]),
        )
    }
}
impl<L: Lanes> Grouped for Iq4NlOffset<L> {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        Eight {
            w: look_up(iq4_table_u8(), nibbles8(vectors::<4>(b.add(16)))),
            d: f16x8(b),
            m: None,
            signs: None,
        }
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        let init = _mm256_loadu_si256(x.neg128_sum.as_ptr() as *const __m256i);
        L::dot8(init, &e.w, x)
    }
}

/// Q8_0 with VNNI: a group's weights offset by 128 to u8 (once per group,
/// shared by the tile's tokens) and the offset's `128 sum(x)` taken back out
/// in the integers, which is exact and saves the sign trick's per-token
/// instruction. A row's last blocks take the sign trick as on AVX2: their
/// lanes hold partial sums, which the offset would change (a group's lanes
/// hold whole blocks, the same integers either way).
struct Q8_0Offset<L>(PhantomData<L>);
impl<L: Lanes> Format for Q8_0Offset<L> {
    const BYTES: usize = Q8_0_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        q8_weights(b)
    }
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, _x: &Q8Block) -> __m256i {
        signed_dot4::<L>(wv, xq)
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        q8_pair(b)
    }
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], x: [&Q8Block; 2]) -> __m256i {
        _mm256_add_epi32(
            Self::product(wv[0], xq[0], x[0]),
            Self::product(wv[1], xq[1], x[1]),
        )
    }
}
impl<L: Lanes> Grouped for Q8_0Offset<L> {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        let mut w = vectors::<8>(b.add(16));
        for v in &mut w {
            *v = _mm256_xor_si256(*v, _mm256_set1_epi8(-128));
        }
        Eight {
            w,
            d: f16x8(b),
            m: None,
            signs: None,
        }
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        let init = _mm256_loadu_si256(x.neg128_sum.as_ptr() as *const __m256i);
        L::dot8(init, &e.w, x)
    }
}

/// Q4_0: d (q - 8) · x = d (q · x - 8 sum(x)), the 8 sum(x) in the integers
/// (-128 sum / 16, exact). Nibbles are at most 15, so AVX2's i16 pairs
/// cannot overflow.
struct Q4_0<L>(PhantomData<L>);
impl<L: Lanes> Format for Q4_0<L> {
    const BYTES: usize = Q4_0_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        nibbles(b.add(2))
    }
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, x: &Q8Block) -> __m256i {
        L::dot4(lane0_i32(x.neg128_sum >> 4), wv, xq)
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        nibble_halves(b[0].add(2), b[1].add(2))
    }
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], x: [&Q8Block; 2]) -> __m256i {
        let init = firsts_i32(x[0].neg128_sum >> 4, x[1].neg128_sum >> 4);
        L::dot2(init, wv, xq)
    }
}
impl<L: Lanes> Grouped for Q4_0<L> {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        Eight {
            w: nibbles8(vectors::<4>(b.add(16))),
            d: f16x8(b),
            m: None,
            signs: None,
        }
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        let init =
            _mm256_srai_epi32::<4>(_mm256_loadu_si256(x.neg128_sum.as_ptr() as *const __m256i));
        L::dot8(init, &e.w, x)
    }
}

/// Q4_1: (d q + m) · x = d (q · x) + m sum(x), with s = d_x sum(q).
struct Q4_1<L>(PhantomData<L>);
impl<L: Lanes> Format for Q4_1<L> {
    const BYTES: usize = Q4_1_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        nibbles(b.add(4))
    }
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, _x: &Q8Block) -> __m256i {
        L::dot4(_mm256_setzero_si256(), wv, xq)
    }
    #[inline(always)]
    unsafe fn offset(b: *const u8, x: &Q8Block) -> Option<(__m256, __m256)> {
        Some((f16x8_at(b.add(2)), lane0_f32(x.s)))
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        nibble_halves(b[0].add(4), b[1].add(4))
    }
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], _x: [&Q8Block; 2]) -> __m256i {
        L::dot2(_mm256_setzero_si256(), wv, xq)
    }
    #[inline(always)]
    unsafe fn offset_pair(b: [*const u8; 2], x: [&Q8Block; 2]) -> Option<(__m256, __m256)> {
        Some((
            f16_halves(b[0].add(2), b[1].add(2)),
            firsts_f32(x[0].s, x[1].s),
        ))
    }
}
impl<L: Lanes> Grouped for Q4_1<L> {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        Eight {
            w: nibbles8(vectors::<4>(b.add(32))),
            d: f16x8(b),
            m: Some(f16x8(b.add(16))),
            signs: None,
        }
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        L::dot8(_mm256_setzero_si256(), &e.w, x)
    }
}

/// The fifth bits of two runs of 16 values as bytes, 0x10 where a bit is
/// set: bits 0..16 of `lo` for the low 128-bit half's bytes, bits 0..16 of
/// `hi` for the high half's (byte `k` of a half is bit `k`).
#[inline(always)]
unsafe fn fifth_bits(lo: u32, hi: u32) -> __m256i {
    let v = _mm256_setr_epi32(lo as i32, 0, 0, 0, hi as i32, 0, 0, 0);
    // Byte k of each half takes byte k / 8 of that half's bits...
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
    );
    let bytes = _mm256_shuffle_epi8(v, spread);
    // ...and keeps bit k % 8 of it.
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// A Q5 block's high-bit word at `p`.
#[inline(always)]
unsafe fn high_word(p: *const u8) -> u32 {
    u32::from_le((p as *const u32).read_unaligned())
}

/// A Q5 block's 32 values as bytes (values 0..16 in the low half, 16..32 in
/// the high): the nibbles at `qs` with the fifth bits of `qh`.
#[inline(always)]
unsafe fn q5_bytes(qh: *const u8, qs: *const u8) -> __m256i {
    let h = high_word(qh);
    _mm256_or_si256(nibbles(qs), fifth_bits(h & 0xFFFF, h >> 16))
}

/// Two Q5 blocks' values in [`Format::unpack_pair`]'s order, from their
/// high-bit words and nibbles.
#[inline(always)]
unsafe fn q5_pair(qh: [*const u8; 2], qs: [*const u8; 2]) -> [__m256i; 2] {
    let (h0, h1) = (high_word(qh[0]), high_word(qh[1]));
    let n = nibble_halves(qs[0], qs[1]);
    [
        _mm256_or_si256(n[0], fifth_bits(h0 & 0xFFFF, h1 & 0xFFFF)),
        _mm256_or_si256(n[1], fifth_bits(h0 >> 16, h1 >> 16)),
    ]
}

/// Q5_0: d (q - 16) · x = d (q · x - 16 sum(x)), the 16 sum(x) in the
/// integers (-128 sum / 8, exact). Values are at most 31, so AVX2's i16
/// pairs hold four vectors' products (4 * 2 * 31 * 127 = 31,496) but not
/// eight: the grouped form sums them through [`Lanes::dot8_wide`].
struct Q5_0<L>(PhantomData<L>);
impl<L: Lanes> Format for Q5_0<L> {
    const BYTES: usize = Q5_0_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        q5_bytes(b.add(2), b.add(6))
    }
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, x: &Q8Block) -> __m256i {
        L::dot4(lane0_i32(x.neg128_sum >> 3), wv, xq)
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        q5_pair([b[0].add(2), b[1].add(2)], [b[0].add(6), b[1].add(6)])
    }
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], x: [&Q8Block; 2]) -> __m256i {
        let init = firsts_i32(x[0].neg128_sum >> 3, x[1].neg128_sum >> 3);
        L::dot2(init, wv, xq)
    }
}

impl<L: Lanes> Grouped for Q5_0<L> {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        Eight {
            w: q5_group(b.add(16), b.add(48)),
            d: f16x8(b),
            m: None,
            signs: None,
        }
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        let init =
            _mm256_srai_epi32::<3>(_mm256_loadu_si256(x.neg128_sum.as_ptr() as *const __m256i));
        L::dot8_wide(init, &e.w, x)
    }
}

/// Q5_1: (d q + m) · x = d (q · x) + m sum(x), as Q4_1 with a fifth bit.
struct Q5_1<L>(PhantomData<L>);
impl<L: Lanes> Format for Q5_1<L> {
    const BYTES: usize = Q5_1_BYTES;
    #[inline(always)]
    unsafe fn unpack(b: *const u8) -> __m256i {
        q5_bytes(b.add(4), b.add(8))
    }
    #[inline(always)]
    unsafe fn product(wv: __m256i, xq: __m256i, _x: &Q8Block) -> __m256i {
        L::dot4(_mm256_setzero_si256(), wv, xq)
    }
    #[inline(always)]
    unsafe fn offset(b: *const u8, x: &Q8Block) -> Option<(__m256, __m256)> {
        Some((f16x8_at(b.add(2)), lane0_f32(x.s)))
    }
    #[inline(always)]
    unsafe fn unpack_pair(b: [*const u8; 2]) -> [__m256i; 2] {
        q5_pair([b[0].add(4), b[1].add(4)], [b[0].add(8), b[1].add(8)])
    }
    #[inline(always)]
    unsafe fn product_pair(wv: &[__m256i; 2], xq: &[__m256i; 2], _x: [&Q8Block; 2]) -> __m256i {
        L::dot2(_mm256_setzero_si256(), wv, xq)
    }
    #[inline(always)]
    unsafe fn offset_pair(b: [*const u8; 2], x: [&Q8Block; 2]) -> Option<(__m256, __m256)> {
        Some((
            f16_halves(b[0].add(2), b[1].add(2)),
            firsts_f32(x[0].s, x[1].s),
        ))
    }
}
impl<L: Lanes> Grouped for Q5_1<L> {
    #[inline(always)]
    unsafe fn weights8(b: *const u8) -> Eight {
        Eight {
            w: q5_group(b.add(32), b.add(64)),
            d: f16x8(b),
            m: Some(f16x8(b.add(16))),
            signs: None,
        }
    }
    #[inline(always)]
    unsafe fn dot8(e: &Eight, x: &Q8Group) -> __m256i {
        L::dot8_wide(_mm256_setzero_si256(), &e.w, x)
    }
}

/// A Q5 group's values, a block per lane in [`Q8Group::q`]'s order, from its
/// interleaved high-bit words (at `qh`: the eight low halves, then the
/// eight high halves, [`super::lanes`]) and nibbles (at `qs`). Vector `k`
/// holds values `4k..4k + 4`, whose fifth bits are bits `4k..4k + 4` of
/// each lane's word: each step spreads a lane's low four bits over its four
/// bytes, then shifts the next four down.
#[inline(always)]
unsafe fn q5_group(qh: *const u8, qs: *const u8) -> [__m256i; 8] {
    let lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(qh as *const __m128i));
    let hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(qh.add(16) as *const __m128i));
    let mut h = _mm256_or_si256(lo, _mm256_slli_epi32::<16>(hi));
    // Each lane's byte 0 into all four of its bytes...
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, //
        0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
    );
    // ...and byte i keeps bit i.
    let bit = _mm256_set1_epi32(0x0804_0201);
    let mut w = nibbles8(vectors::<4>(qs));
    for v in w.iter_mut() {
        let bytes = _mm256_shuffle_epi8(h, spread);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        *v = _mm256_or_si256(*v, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
        h = _mm256_srli_epi32::<4>(h);
    }
    w
}
