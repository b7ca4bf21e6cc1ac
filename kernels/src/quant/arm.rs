//! NEON dot products for aarch64 (NEON is part of the architecture). The
//! `dotprod` extension's `sdot` would halve the integer work, but its
//! intrinsic is not stable in Rust yet (rust-lang/rust#117224).
//!
//! The integer sum of each block is exact in any order, and the f32 steps
//! after it are the scalar reference's, in its order: these kernels give the
//! reference's bits. Every function here is an `unsafe fn` with
//! `#[target_feature]`, reached only through [`kernels`], which is only
//! called for an [`Isa`] `Isa::available` confirmed on this CPU. Loads read
//! 16 bytes at offsets inside whole blocks of the slices (`n` is the smaller
//! block count of weights and activations).
#![allow(unsafe_code)]

use std::arch::aarch64::*;

use super::acts::Q8Block;
use super::blocks::{f16_at, Q4_0_BYTES, Q4_1_BYTES, Q8_0_BYTES};
use super::{Isa, Kernels};

/// The kernels of `isa` (which the caller checked this CPU has).
pub(super) fn kernels(isa: Isa, scalar: Kernels) -> Kernels {
    // SAFETY (all closures below): `isa` was confirmed on this CPU by
    // `Isa::available`, which is the only precondition of these functions.
    match isa {
        Isa::Neon => Kernels {
            isa: Isa::Neon,
            q8_0: |w, a| unsafe { dot_q8_0_neon(w, a.blocks) },
            q4_0: |w, a| unsafe { dot_q4_0_neon(w, a.blocks) },
            q4_1: |w, a| unsafe { dot_q4_1_neon(w, a.blocks) },
            // A tile as sixteen one-row calls: the same bits.
            q8_0_tile: |w, a| w.map(|r| a.map(|x| unsafe { dot_q8_0_neon(r, x.blocks) })),
            q4_0_tile: |w, a| w.map(|r| a.map(|x| unsafe { dot_q4_0_neon(r, x.blocks) })),
            q4_1_tile: |w, a| w.map(|r| a.map(|x| unsafe { dot_q4_1_neon(r, x.blocks) })),
            ..scalar
        },
        _ => scalar,
    }
}

/// Sum of `a[i] * b[i]` over 16 signed bytes, widened through i16.
#[inline(always)]
unsafe fn dot16(a: int8x16_t, b: int8x16_t) -> i32 {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vaddvq_s32(vpadalq_s16(vpaddlq_s16(lo), hi))
}

/// 16 bytes of nibbles: low nibbles (values 0..16) and high nibbles
/// (values 16..32), as signed bytes 0..=15.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (int8x16_t, int8x16_t) {
    let v = vld1q_u8(p);
    (
        vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))),
        vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)),
    )
}

/// The block loop every kernel shares: `load` gives a block's 32 weights as
/// two halves, `dot` sums 16 products, `step` turns the block's exact
/// integer sum into its f32 term as the scalar reference does.
#[inline(always)]
unsafe fn blocks(
    w: &[u8],
    a: &[Q8Block],
    bytes: usize,
    load: impl Fn(*const u8) -> (int8x16_t, int8x16_t),
    dot: impl Fn(int8x16_t, int8x16_t) -> i32,
    step: impl Fn(&[u8], &Q8Block, i32) -> f32,
) -> f32 {
    let n = a.len().min(w.len() / bytes);
    let mut acc = 0.0f32;
    for (x, blk) in a[..n].iter().zip(w.chunks_exact(bytes)) {
        let (lo, hi) = load(blk.as_ptr());
        let x0 = vld1q_s8(x.q.as_ptr());
        let x1 = vld1q_s8(x.q.as_ptr().add(16));
        acc += step(blk, x, dot(lo, x0) + dot(hi, x1));
    }
    acc
}

unsafe fn q8_0_load(b: *const u8) -> (int8x16_t, int8x16_t) {
    (
        vld1q_s8(b.add(2) as *const i8),
        vld1q_s8(b.add(18) as *const i8),
    )
}

fn q8_0_step(b: &[u8], x: &Q8Block, s: i32) -> f32 {
    f16_at(b, 0) * x.d * s as f32
}

fn q4_0_step(b: &[u8], x: &Q8Block, s: i32) -> f32 {
    f16_at(b, 0) * (x.d * s as f32 - 8.0 * x.s)
}

fn q4_1_step(b: &[u8], x: &Q8Block, s: i32) -> f32 {
    f16_at(b, 0) * x.d * s as f32 + f16_at(b, 2) * x.s
}

#[target_feature(enable = "neon")]
unsafe fn dot_q8_0_neon(w: &[u8], a: &[Q8Block]) -> f32 {
    blocks(
        w,
        a,
        Q8_0_BYTES,
        |b| q8_0_load(b),
        |p, q| dot16(p, q),
        q8_0_step,
    )
}

#[target_feature(enable = "neon")]
unsafe fn dot_q4_0_neon(w: &[u8], a: &[Q8Block]) -> f32 {
    blocks(
        w,
        a,
        Q4_0_BYTES,
        |b| nibbles(b.add(2)),
        |p, q| dot16(p, q),
        q4_0_step,
    )
}

#[target_feature(enable = "neon")]
unsafe fn dot_q4_1_neon(w: &[u8], a: &[Q8Block]) -> f32 {
    blocks(
        w,
        a,
        Q4_1_BYTES,
        |b| nibbles(b.add(4)),
        |p, q| dot16(p, q),
        q4_1_step,
    )
}
