//! The CPU backend's attention: one query token's group of query heads over
//! one KV head's cached positions, compiled once per instruction set like
//! the dot products (the x86 wrappers enable AVX2 or AVX-512 around the
//! same body, so every instruction set gives the same bits).
//!
//! Layout (the CPU pool's, [`crate::kv`]): within a block, one KV head's K
//! is stored transposed, `[head_dim][block_size]`, and its V as rows,
//! `[block_size][head_dim]`. A query's scores for a whole block are then a
//! sum of `head_dim` broadcasts times a row of `block_size` keys: no
//! horizontal sums, one vector per 16 slots, and each K row is read once for
//! every query head of the group. The weighted sum of V rows accumulates a
//! head's output in registers across the block.
//!
//! Summation order is fixed by the position (never by the batch, the chunk
//! or the instruction set), so a token's attention is the same bits whether
//! its prompt was computed in one step, in chunks, or on top of cached
//! blocks.

/// One attention task: a query token's `group` query heads over the first
/// `positions` cached positions of one sequence, for one KV head.
#[derive(Debug, Clone, Copy)]
pub struct AttnTask<'a> {
    /// The group's query heads, `group * head_dim` values, RoPE applied.
    pub q: &'a [f32],
    /// The layer's K pool (block-transposed, see the module docs).
    pub k: &'a [f32],
    /// The layer's V pool.
    pub v: &'a [f32],
    /// The sequence's block table.
    pub table: &'a [u32],
    /// Positions to attend to (the token's own included).
    pub positions: usize,
    /// Which KV head.
    pub kv_head: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// Query heads per KV head.
    pub group: usize,
}

/// An attention kernel: writes the task's `group * head_dim` outputs to
/// `out`, using `scores` as scratch.
pub type AttendFn = fn(&AttnTask<'_>, &mut Vec<f32>, &mut [f32]);

/// Most query heads one pass keeps accumulators for (more are done in passes).
const MAX_GROUP: usize = 8;

/// Where block `b`'s K (or V) for `kv_head` starts in a layer's pool.
#[inline(always)]
fn block_base(t: &AttnTask<'_>, b: u32) -> usize {
    (b as usize * t.kv_heads + t.kv_head) * t.block_size * t.head_dim
}

/// The kernel's body, inlined into each instruction set's wrapper.
#[inline(always)]
pub fn attend(t: &AttnTask<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (hd, bs, n) = (t.head_dim, t.block_size, t.positions);
    let blocks = n.div_ceil(bs);
    let scale = 1.0 / (hd as f32).sqrt();
    // Scores padded to whole blocks, one row per query head.
    let row = blocks * bs;
    scores.clear();
    scores.resize(t.group * row, 0.0);
    let mut h0 = 0;
    while h0 < t.group {
        let g = (t.group - h0).min(MAX_GROUP);
        let q = &t.q[h0 * hd..(h0 + g) * hd];
        let s = &mut scores[h0 * row..(h0 + g) * row];
        match (g, bs) {
            (1, 16) => scores_pass::<1, 16>(t, q, s, row),
            (2, 16) => scores_pass::<2, 16>(t, q, s, row),
            (3, 16) => scores_pass::<3, 16>(t, q, s, row),
            (4, 16) => scores_pass::<4, 16>(t, q, s, row),
            (5, 16) => scores_pass::<5, 16>(t, q, s, row),
            (6, 16) => scores_pass::<6, 16>(t, q, s, row),
            (7, 16) => scores_pass::<7, 16>(t, q, s, row),
            (8, 16) => scores_pass::<8, 16>(t, q, s, row),
            _ => scores_any(t, q, g, s, row),
        }
        h0 += g;
    }
    for sh in scores.chunks_exact_mut(row) {
        softmax(&mut sh[..n], scale);
    }
    for (h, oh) in out.chunks_exact_mut(hd).enumerate().take(t.group) {
        let p = &scores[h * row..h * row + n];
        if hd == 64 {
            weighted_sum::<64>(t, p, oh);
        } else {
            weighted_sum_any(t, p, oh);
        }
    }
}

/// Scores of `G` query heads over every block, `BS` slots a block: for each
/// K row (one `d`), one broadcast multiply-add per head into `BS` lanes.
#[inline(always)]
fn scores_pass<const G: usize, const BS: usize>(
    t: &AttnTask<'_>,
    q: &[f32],
    s: &mut [f32],
    row: usize,
) {
    let hd = t.head_dim;
    let blocks = t.positions.div_ceil(BS);
    for (bi, &b) in t.table.iter().take(blocks).enumerate() {
        let base = block_base(t, b);
        let kt = &t.k[base..base + hd * BS];
        let mut acc = [[0.0f32; BS]; G];
        for (d, krow) in kt.chunks_exact(BS).enumerate() {
            for (h, a) in acc.iter_mut().enumerate() {
                let qd = q[h * hd + d];
                for (x, &k) in a.iter_mut().zip(krow) {
                    *x += qd * k;
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            s[h * row + bi * BS..h * row + (bi + 1) * BS].copy_from_slice(a);
        }
    }
}

/// [`scores_pass`] for any group width and block size (the same sums).
fn scores_any(t: &AttnTask<'_>, q: &[f32], g: usize, s: &mut [f32], row: usize) {
    let (hd, bs) = (t.head_dim, t.block_size);
    let blocks = t.positions.div_ceil(bs);
    for (bi, &b) in t.table.iter().take(blocks).enumerate() {
        let base = block_base(t, b);
        let kt = &t.k[base..base + hd * bs];
        for h in 0..g {
            let a = &mut s[h * row + bi * bs..h * row + (bi + 1) * bs];
            for (d, krow) in kt.chunks_exact(bs).enumerate() {
                let qd = q[h * hd + d];
                for (x, &k) in a.iter_mut().zip(krow) {
                    *x += qd * k;
                }
            }
        }
    }
}

/// Softmax of `scale * s` in place.
#[inline(always)]
fn softmax(s: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for x in s.iter_mut() {
        *x *= scale;
        max = max.max(*x);
    }
    for x in s.iter_mut() {
        *x -= max;
    }
    super::exp::exp_in_place(s);
    let sum: f32 = s.iter().sum();
    let inv = 1.0 / sum;
    for x in s.iter_mut() {
        *x *= inv;
    }
}

/// `out = sum_j p[j] * V[j]` over the task's positions, `HD` wide, the
/// output kept in registers.
#[inline(always)]
fn weighted_sum<const HD: usize>(t: &AttnTask<'_>, p: &[f32], out: &mut [f32]) {
    let bs = t.block_size;
    let mut acc = [0.0f32; HD];
    for (bi, &b) in t.table.iter().take(p.len().div_ceil(bs)).enumerate() {
        let base = block_base(t, b);
        let live = bs.min(p.len() - bi * bs);
        let vs = &t.v[base..base + live * HD];
        for (&pj, vrow) in p[bi * bs..bi * bs + live].iter().zip(vs.chunks_exact(HD)) {
            for (a, &x) in acc.iter_mut().zip(vrow) {
                *a += pj * x;
            }
        }
    }
    out.copy_from_slice(&acc);
}

/// [`weighted_sum`] for any head width (the same sums).
fn weighted_sum_any(t: &AttnTask<'_>, p: &[f32], out: &mut [f32]) {
    let (hd, bs) = (t.head_dim, t.block_size);
    out.fill(0.0);
    for (bi, &b) in t.table.iter().take(p.len().div_ceil(bs)).enumerate() {
        let base = block_base(t, b);
        let live = bs.min(p.len() - bi * bs);
        let vs = &t.v[base..base + live * hd];
        for (&pj, vrow) in p[bi * bs..bi * bs + live].iter().zip(vs.chunks_exact(hd)) {
            for (a, &x) in out.iter_mut().zip(vrow) {
                *a += pj * x;
            }
        }
    }
}

/// The kernel compiled for the baseline instruction set.
pub fn attend_baseline(t: &AttnTask<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend(t, scores, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook computation, in f64, on the same layout.
    fn reference(t: &AttnTask<'_>) -> Vec<f64> {
        let (hd, bs) = (t.head_dim, t.block_size);
        let key = |j: usize, d: usize| {
            let base = block_base(t, t.table[j / bs]);
            t.k[base + d * bs + j % bs] as f64
        };
        let val = |j: usize, d: usize| {
            let base = block_base(t, t.table[j / bs]);
            t.v[base + (j % bs) * hd + d] as f64
        };
        let mut out = Vec::new();
        for h in 0..t.group {
            let s: Vec<f64> = (0..t.positions)
                .map(|j| {
                    (0..hd)
                        .map(|d| t.q[h * hd + d] as f64 * key(j, d))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                out.push((0..t.positions).map(|j| e[j] / sum * val(j, d)).sum());
            }
        }
        out
    }

    fn filled(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_the_textbook_sums_for_every_shape() {
        for &(hd, bs, group, kv_heads, positions) in &[
            (64usize, 16usize, 3usize, 3usize, 1usize),
            (64, 16, 3, 3, 37),
            (64, 16, 8, 4, 100),
            (64, 16, 10, 1, 16),
            (8, 16, 2, 4, 33),
            (64, 5, 4, 2, 23),
            (12, 7, 1, 1, 50),
        ] {
            let num_blocks = positions.div_ceil(bs) + 3;
            let pool = num_blocks * kv_heads * bs * hd;
            let (k, v) = (filled(pool, 1), filled(pool, 2));
            // Blocks out of order, as a block table has them.
            let table: Vec<u32> = (0..positions.div_ceil(bs) as u32)
                .map(|i| (i * 7 + 2) % num_blocks as u32)
                .collect();
            let mut seen = table.clone();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), table.len(), "distinct blocks");
            let q = filled(group * hd, 3);
            for kv_head in [0, kv_heads - 1] {
                let t = AttnTask {
                    q: &q,
                    k: &k,
                    v: &v,
                    table: &table,
                    positions,
                    kv_head,
                    kv_heads,
                    head_dim: hd,
                    block_size: bs,
                    group,
                };
                let mut out = vec![f32::NAN; group * hd];
                attend_baseline(&t, &mut Vec::new(), &mut out);
                let want = reference(&t);
                for (i, (&got, &w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - w).abs() < 1e-5,
                        "hd {hd} bs {bs} group {group} n {positions}: out[{i}] {got} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let (hd, bs, group, kv_heads, positions) = (64, 16, 3, 3, 75);
        let pool = 8 * kv_heads * bs * hd;
        let (k, v, q) = (filled(pool, 4), filled(pool, 5), filled(group * hd, 6));
        let table = [3u32, 0, 7, 1, 5];
        let t = AttnTask {
            q: &q,
            k: &k,
            v: &v,
            table: &table,
            positions,
            kv_head: 1,
            kv_heads,
            head_dim: hd,
            block_size: bs,
            group,
        };
        let mut base = vec![0.0; group * hd];
        attend_baseline(&t, &mut Vec::new(), &mut base);
        for isa in super::super::Isa::available() {
            let kernels = super::super::Kernels::for_isa(isa);
            let mut out = vec![0.0; group * hd];
            (kernels.attend)(&t, &mut Vec::new(), &mut out);
            assert_eq!(out, base, "{}", isa.name());
        }
    }
}
