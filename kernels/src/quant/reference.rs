//! Scalar dot products of one weight row (its raw block bytes) with one
//! token's activations: the portable kernels, and the reference the SIMD
//! ones are tested against. Integer sums per block are exact; only the f32
//! accumulation across blocks can differ in order from a SIMD kernel.

use super::acts::{Q8Block, Q8KBlock};
use super::blocks::{
    bf16_at, f16_at, iq4_values, iq4xs_scales, k_values, q2k_value, q3k_scales, q3k_value,
    q4k_scale_min, q5_values, q6k_quad, IQ4_NL_BYTES, IQ4_XS_BYTES, IQ4_XS_QS, Q2_K_BYTES, Q2_K_D,
    Q3_K_BYTES, Q3_K_D, Q3_K_SCALES, Q4_0_BYTES, Q4_1_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_1_BYTES,
    Q5_K_BYTES, Q6_K_BYTES, Q8_0_BYTES,
};

/// Q8_0 weights · 8-bit activations.
pub fn dot_q8_0(w: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q8_0_BYTES).zip(a) {
        let s: i32 = b[2..]
            .iter()
            .zip(&x.q)
            .map(|(&q, &v)| (q as i8) as i32 * v as i32)
            .sum();
        acc += f16_at(b, 0) * x.d * s as f32;
    }
    acc
}

/// Sum over a 32-block of `nibble(j) * x.q[j]`, nibbles in ggml's order.
#[inline]
fn nibble_dot(qs: &[u8], x: &Q8Block) -> i32 {
    let mut s = 0i32;
    for (j, &q) in qs.iter().enumerate() {
        s += (q & 0x0F) as i32 * x.q[j] as i32 + (q >> 4) as i32 * x.q[j + 16] as i32;
    }
    s
}

/// Q4_0 weights · 8-bit activations: `d (q - 8) · x` = `d (q · x) - 8 d sum(x)`.
pub fn dot_q4_0(w: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q4_0_BYTES).zip(a) {
        let d = f16_at(b, 0);
        acc += d * (x.d * nibble_dot(&b[2..], x) as f32 - 8.0 * x.s);
    }
    acc
}

/// Q4_1 weights · 8-bit activations: `(d q + m) · x` = `d (q · x) + m sum(x)`.
pub fn dot_q4_1(w: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q4_1_BYTES).zip(a) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        acc += d * x.d * nibble_dot(&b[4..], x) as f32 + m * x.s;
    }
    acc
}

/// Sum over a 32-block of `q[j] * x.q[j]`.
#[inline]
fn byte_dot(q: &[u8; 32], x: &Q8Block) -> i32 {
    q.iter().zip(&x.q).map(|(&q, &v)| q as i32 * v as i32).sum()
}

/// Q5_0 weights · 8-bit activations: `d (q - 16) · x` = `d (q · x) - 16 d sum(x)`.
pub fn dot_q5_0(w: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q5_0_BYTES).zip(a) {
        let d = f16_at(b, 0);
        acc += d * (x.d * byte_dot(&q5_values(&b[2..6], &b[6..]), x) as f32 - 16.0 * x.s);
    }
    acc
}

/// Q5_1 weights · 8-bit activations: `(d q + m) · x` = `d (q · x) + m sum(x)`.
pub fn dot_q5_1(w: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q5_1_BYTES).zip(a) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        acc += d * x.d * byte_dot(&q5_values(&b[4..8], &b[8..]), x) as f32 + m * x.s;
    }
    acc
}

/// Sum over 32 values of the table values `v` times the activations `x`.
#[inline]
fn table_dot(v: &[i8; 32], x: &[i8]) -> i32 {
    v.iter().zip(x).map(|(&w, &x)| w as i32 * x as i32).sum()
}

/// IQ4_NL weights · 8-bit activations: `d (T[q] · x)`.
pub fn dot_iq4_nl(w: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(IQ4_NL_BYTES).zip(a) {
        acc += f16_at(b, 0) * x.d * table_dot(&iq4_values(&b[2..]), &x.q) as f32;
    }
    acc
}

/// IQ4_XS weights · 256-blocks: per sub-block of 32, `d (sc - 32) (T[q] · x)`.
pub fn dot_iq4_xs(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(IQ4_XS_BYTES).zip(a) {
        let sc = iq4xs_scales(b);
        let mut dots = 0i32;
        for (j, &scale) in sc.iter().enumerate() {
            let qs = &b[IQ4_XS_QS + 16 * j..];
            dots += scale as i32 * table_dot(&iq4_values(qs), &x.q[32 * j..32 * j + 32]);
        }
        acc += f16_at(b, 0) * x.d * dots as f32;
    }
    acc
}

/// Q4_K weights · 256-blocks: per sub-block of 32, `d sc (q · x) - dmin mn sum(x)`.
pub fn dot_q4_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    dot_k(w, a, false)
}

/// Q5_K weights · 256-blocks: Q4_K's sums with 5-bit values.
pub fn dot_q5_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    dot_k(w, a, true)
}

/// [`dot_q4_k`], or with `five` [`dot_q5_k`] (the fifth bits in 32 bytes
/// before the nibbles).
fn dot_k(w: &[u8], a: &[Q8KBlock], five: bool) -> f32 {
    let bytes = if five { Q5_K_BYTES } else { Q4_K_BYTES };
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(bytes).zip(a) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        let (qh, qs) = if five {
            (Some(&b[16..48]), &b[48..])
        } else {
            (None, &b[16..])
        };
        let (mut dots, mut mins) = (0i32, 0i32);
        for g in 0..4 {
            let (sc1, m1) = q4k_scale_min(scales, 2 * g);
            let (sc2, m2) = q4k_scale_min(scales, 2 * g + 1);
            let (mut s1, mut s2) = (0i32, 0i32);
            for l in 0..32 {
                let (lo, hi) = k_values(qs[32 * g + l], qh.map(|h| h[l]), g);
                s1 += lo as i32 * x.q[64 * g + l] as i32;
                s2 += hi as i32 * x.q[64 * g + 32 + l] as i32;
            }
            dots += sc1 as i32 * s1 + sc2 as i32 * s2;
            let sum = |sub: usize| (x.bsums[2 * sub] + x.bsums[2 * sub + 1]) as i32;
            mins += m1 as i32 * sum(2 * g) + m2 as i32 * sum(2 * g + 1);
        }
        acc += x.d * (d * dots as f32 - dmin * mins as f32);
    }
    acc
}

/// Q2_K weights · 256-blocks: per 16 values, `d sc (q · x) - dmin m sum(x)`.
pub fn dot_q2_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q2_K_BYTES).zip(a) {
        let (d, dmin) = (f16_at(b, Q2_K_D), f16_at(b, Q2_K_D + 2));
        let (mut dots, mut mins) = (0i32, 0i32);
        for g in 0..16 {
            let mut s = 0i32;
            for p in 16 * g..16 * g + 16 {
                s += q2k_value(b, p) as i32 * x.q[p] as i32;
            }
            dots += (b[g] & 0x0F) as i32 * s;
            mins += (b[g] >> 4) as i32 * x.bsums[g] as i32;
        }
        acc += x.d * (d * dots as f32 - dmin * mins as f32);
    }
    acc
}

/// Q3_K weights · 256-blocks: per 16 values, `d (sc - 32) (u · x - 4 sum(x))`
/// with `u` the unsigned values (0..8).
pub fn dot_q3_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q3_K_BYTES).zip(a) {
        let d = f16_at(b, Q3_K_D);
        let sc = q3k_scales(&b[Q3_K_SCALES..Q3_K_D]);
        let mut dots = 0i32;
        for (g, &scale) in sc.iter().enumerate() {
            let mut s = 0i32;
            for p in 16 * g..16 * g + 16 {
                s += q3k_value(b, p) as i32 * x.q[p] as i32;
            }
            dots += scale as i32 * (s - 4 * x.bsums[g] as i32);
        }
        acc += d * x.d * dots as f32;
    }
    acc
}

/// Q6_K weights · 256-blocks: per 16 values, `d sc (q · x)` with `q` in -32..32.
pub fn dot_q6_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0.0f32;
    for (b, x) in w.chunks_exact(Q6_K_BYTES).zip(a) {
        let d = f16_at(b, 208);
        let mut sums = [0i32; 16];
        for half in 0..2 {
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..128 + 32 * half + 32];
            let xq = &x.q[128 * half..128 * half + 128];
            for l in 0..32 {
                let q = q6k_quad(ql, qh, l);
                for (k, &qv) in q.iter().enumerate() {
                    // Position 32 k + l of this half is in group (32 k + l) / 16.
                    sums[8 * half + 2 * k + l / 16] += qv * xq[32 * k + l] as i32;
                }
            }
        }
        let mut dots = 0i32;
        for (g, &s) in sums.iter().enumerate() {
            dots += (b[192 + g] as i8) as i32 * s;
        }
        acc += d * x.d * dots as f32;
    }
    acc
}

/// Eight-lane f32 dot product: fixed lanes, so the compiler vectorises it
/// without reordering any one lane's sum.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// f16 weights · f32 activations, f32 accumulation.
pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wc, xc) in w.chunks_exact(16).zip(x.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += f16_at(wc, 2 * l) * xc[l];
        }
    }
    let full = x.len() / 8 * 8;
    let mut s = acc.iter().sum::<f32>();
    for (j, &xv) in x.iter().enumerate().skip(full) {
        s += f16_at(w, 2 * j) * xv;
    }
    s
}

/// bf16 weights · f32 activations, f32 accumulation.
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wc, xc) in w.chunks_exact(16).zip(x.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += bf16_at(wc, 2 * l) * xc[l];
        }
    }
    let full = x.len() / 8 * 8;
    let mut s = acc.iter().sum::<f32>();
    for (j, &xv) in x.iter().enumerate().skip(full) {
        s += bf16_at(w, 2 * j) * xv;
    }
    s
}
