//! `y = x Wᵀ (+ b)` for a step's `t` token rows against one weight matrix
//! in its own dtype: the activations are prepared once (quantized to 8-bit
//! blocks for quantized weights, unless f32 math was asked for, and kept for
//! the next product when the caller says it reads the same input, as k and v
//! read q's and up reads gate's: [`Input::Same`]), then the
//! matrix's rows are split across the thread pool and each row is read once
//! for all `t` tokens of the step.
//!
//! One token (decode) runs the one-row kernels row by row; several tokens
//! (prefill, batches) run 4-row x 4-token tiles, which keep their
//! accumulators in registers and read each weight and activation block once
//! per tile. Every output element is computed with the one-row kernel's
//! operations in its order, whatever `t`, the tiling and the thread split,
//! so a token's result does not depend on what else is in the batch, to the
//! bit (`tests/smollm2_gguf.rs` checks it end to end).

use tokenwire_gguf::GgmlType;

use super::pool::Pool;
use crate::quant::{
    act_format, group_q8, quantize_q8k_into, ActFormat, Kernels, Q8Block, Q8Group, Q8KBlock, Q8Row,
    RowLayout,
};
use crate::tensor::WeightMatrix;

/// Multiply-adds below which splitting a product across threads costs more in
/// hand-off than it saves.
const PAR_MIN_WORK: usize = 1 << 15;

/// Why a matrix given 32-block activations has kernels for them:
/// [`act_format`] gives those only to the formats [`Kernels::for_q8`] covers
/// (tested in the quant module).
const Q8_ONLY: &str = "act_format gives 32-block activations only to formats with Q8 kernels";
/// The same for 256-block activations and [`Kernels::for_q8k`].
const Q8K_ONLY: &str = "act_format gives 256-block activations only to formats with Q8K kernels";
/// Tasks per thread of a product: one long contiguous stretch of rows each
/// for a decode step (hardware prefetchers follow long streams, and fewer
/// hand-offs), a few for prefill so uneven threads even out.
const TASKS_PER_THREAD_DECODE: usize = 1;
const TASKS_PER_THREAD_PREFILL: usize = 4;

/// Activation bytes one pass of the tiles keeps in cache: a task runs a pass
/// of tokens through all its rows before the next pass. Every token through
/// every four rows streamed a long prompt's (or a batch of prompts')
/// activations from L3 or memory once per four rows: 8 prompts of 512
/// tokens prefilled a quarter slower per token than one (2-core Zen 1, 512
/// KiB of L2 a core). 128 KiB fits the L2 of every x86 core we run on with
/// room for the rows' weights; 64 to 512 measured alike.
const PASS_ACT_BYTES: usize = 128 * 1024;

/// Tokens a pass takes, at `bytes_per_token` of activations: a whole number
/// of four-token tiles, at least one.
fn pass_tokens(bytes_per_token: usize) -> usize {
    (PASS_ACT_BYTES / bytes_per_token.max(1)).max(4) / 4 * 4
}

/// How a quantized matrix meets its activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationPrecision {
    /// Activations quantized to 8 bits per block, integer dot products (how
    /// llama.cpp computes; fast, and within the tolerance the goldens state).
    #[default]
    Int8,
    /// Weights widened to f32 row by row, f32 dot products: the arithmetic
    /// of a dequantized f32 model (`transformers` on a GGUF file), slower.
    F32,
}

/// Whether a product's activations are the previous product's again (the
/// same values, with the same scratch), so their quantized blocks can be
/// reused: q, k and v read one input, and so do gate and up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    /// Activations not seen by the previous product.
    New,
    /// Exactly the previous product's activations.
    Same,
}

/// Buffers of one product, reused from call to call.
#[derive(Debug, Default)]
pub(crate) struct MatScratch {
    q8: Vec<Q8Block>,
    /// `q8` regrouped eight blocks at a time, for the x86 kernels.
    q8g: Vec<Q8Group>,
    q8k: Vec<Q8KBlock>,
    /// The `(t, n_in)` of the activations `q8` and `q8g` hold, if current.
    q8_for: Option<(usize, usize)>,
    /// The same for `q8k`.
    q8k_for: Option<(usize, usize)>,
}

/// The activations of one product in the form the kernel takes.
#[derive(Clone, Copy)]
enum Acts<'a> {
    F32(&'a [f32]),
    Q8(Q8Acts<'a>),
    Q8K(&'a [Q8KBlock]),
}

/// Computes `y[tt, o] = W[o] · x[tt] + b[o]` for the `t` rows of `x`
/// (`[t, in]`); `y` becomes `[t, out]`. With [`Input::Same`] the caller
/// promises `x` is what the previous call with `s` was given, and its
/// quantized blocks are reused when that call made the ones this one needs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    pool: &Pool,
    k: &Kernels,
    precision: ActivationPrecision,
    x: &[f32],
    t: usize,
    w: &WeightMatrix,
    b: Option<&[f32]>,
    y: &mut Vec<f32>,
    s: &mut MatScratch,
    input: Input,
) {
    if input == Input::New {
        s.q8_for = None;
        s.q8k_for = None;
    }
    let (n_out, n_in) = (w.rows(), w.cols());
    y.resize(t * n_out, 0.0);
    if t == 0 || n_out == 0 {
        return;
    }
    let widen = precision == ActivationPrecision::F32 && act_format(w.dtype()) != ActFormat::F32;
    let parallel = n_out * n_in * t >= PAR_MIN_WORK && pool.threads() > 1;
    // A long prompt's activations are quantized across the pool too: done
    // on one thread, they were a tenth of a two-thread prefill.
    let token_chunk = if parallel {
        t.div_ceil(pool.threads())
    } else {
        t
    };
    let acts = if widen {
        Acts::F32(x)
    } else {
        match act_format(w.dtype()) {
            ActFormat::F32 => Acts::F32(x),
            ActFormat::Q8 => {
                // The backend lays its weights out for its kernels; a
                // matrix in another layout would give wrong sums silently.
                assert!(
                    w.reads_as(k.layout),
                    "a {:?} matrix for {:?} kernels",
                    w.layout(),
                    k.layout
                );
                let per = n_in / 32;
                // Only kernels with a lane per block read groups; the rest
                // skip the copy.
                let per_g = if k.layout == RowLayout::Lanes8 {
                    per / 8
                } else {
                    0
                };
                let held = s.q8_for == Some((t, n_in));
                s.q8_for = Some((t, n_in));
                if !held {
                    s.q8.resize(t * per, Q8Block::default());
                    pool.for_each_chunk(&mut s.q8, token_chunk * per, |ci, out| {
                        (k.quantize_q8)(&x[ci * token_chunk * n_in..], out)
                    });
                    s.q8g.resize(t * per_g, Q8Group::default());
                }
                if per_g > 0 && !held {
                    let blocks = &s.q8;
                    pool.for_each_chunk(&mut s.q8g, token_chunk * per_g, |ci, out| {
                        let first = ci * token_chunk;
                        for (tl, groups) in out.chunks_exact_mut(per_g).enumerate() {
                            let tt = first + tl;
                            group_q8(&blocks[tt * per..(tt + 1) * per], groups);
                        }
                    });
                }
                Acts::Q8(Q8Acts {
                    blocks: &s.q8,
                    groups: &s.q8g,
                    per,
                    per_g,
                })
            }
            ActFormat::Q8K => {
                let per = n_in / 256;
                if s.q8k_for != Some((t, n_in)) {
                    s.q8k.resize(t * per, Q8KBlock::default());
                    pool.for_each_chunk(&mut s.q8k, token_chunk * per, |ci, out| {
                        quantize_q8k_into(&x[ci * token_chunk * n_in..], out)
                    });
                    s.q8k_for = Some((t, n_in));
                }
                Acts::Q8K(&s.q8k)
            }
        }
    };
    let per_thread = if t == 1 {
        TASKS_PER_THREAD_DECODE
    } else {
        TASKS_PER_THREAD_PREFILL
    };
    let tasks = if parallel {
        pool.threads() * per_thread
    } else {
        1
    };
    // Whole 4-row tiles per task.
    let rows_per_task = n_out.div_ceil(tasks).next_multiple_of(4);
    // `outs[tt]` is the task's rows of token `tt`'s output.
    let fill = |ci: usize, outs: &mut [&mut [f32]], row_buf: &mut Vec<f32>| {
        let o0 = ci * rows_per_task;
        if t > 1 && !widen {
            match (acts, w.dtype()) {
                (Acts::Q8(a), dtype) => {
                    let (_, tile) = k.for_q8(dtype).expect(Q8_ONLY);
                    // A token's groups: a byte per value, and a scale and
                    // a sum per 32.
                    let per_pass = pass_tokens(n_in + n_in / 4);
                    by_tiles(w, o0, outs, b, per_pass, |ws, [j0, j1, j2, j3]| {
                        tile(ws, &[a.row(j0), a.row(j1), a.row(j2), a.row(j3)])
                    });
                    return;
                }
                (Acts::Q8K(a), dtype) => {
                    let (_, tile) = k.for_q8k(dtype).expect(Q8K_ONLY);
                    let per = n_in / 256;
                    let token = |j: usize| &a[j * per..(j + 1) * per];
                    let per_pass = pass_tokens(per * std::mem::size_of::<Q8KBlock>());
                    by_tiles(w, o0, outs, b, per_pass, |ws, js| tile(ws, &js.map(token)));
                    return;
                }
                (Acts::F32(x), GgmlType::F16) => {
                    let token = |j: usize| &x[j * n_in..(j + 1) * n_in];
                    let per_pass = pass_tokens(n_in * 4);
                    by_tiles(w, o0, outs, b, per_pass, |ws, js| {
                        (k.f16_tile)(ws, &js.map(token))
                    });
                    return;
                }
                _ => {}
            }
        }
        // One row at a time, its `t` results scattered to the tokens.
        let rows = outs[0].len();
        let mut vals = vec![0.0f32; t];
        for r in 0..rows {
            let o = o0 + r;
            let bias = b.map_or(0.0, |b| b[o]);
            if widen {
                row_buf.resize(n_in, 0.0);
                w.dequantize_row(o, row_buf);
                for (tt, v) in vals.iter_mut().enumerate() {
                    *v = (k.f32)(row_buf, &x[tt * n_in..(tt + 1) * n_in]) + bias;
                }
            } else {
                row_dots(k, w, o, acts, n_in, &mut vals, bias);
            }
            for (out, &v) in outs.iter_mut().zip(&vals) {
                out[r] = v;
            }
        }
    };
    // Each task's rows of every token's output, `[task][token]`: slices of
    // `y` itself, so results are written in place. (A `[t, rows]` buffer
    // per task copied into `y` after, then a quarter of a batched decode's
    // non-kernel time, went: the LM head's logits are megabytes.)
    let mut parts: Vec<Vec<&mut [f32]>> = (0..n_out.div_ceil(rows_per_task))
        .map(|_| Vec::with_capacity(t))
        .collect();
    for y_row in y.chunks_exact_mut(n_out) {
        for (part, cols) in parts.iter_mut().zip(y_row.chunks_mut(rows_per_task)) {
            part.push(cols);
        }
    }
    if parallel {
        pool.for_each_chunk(&mut parts, 1, |ci, p| fill(ci, &mut p[0], &mut Vec::new()));
    } else {
        let mut buf = Vec::new();
        for (ci, p) in parts.iter_mut().enumerate() {
            fill(ci, p, &mut buf);
        }
    }
}

/// Rows `o0..` of `w` against every token (`outs[tt]` holds token `tt`'s
/// results for those rows), through `tile(rows, tokens)`, which gives four
/// rows by four tokens, in passes of `per_pass` tokens (a multiple of four)
/// through all the rows. A short last group repeats its last row or token,
/// whose duplicate result is dropped; every result is the one-row,
/// one-token kernel's bits, so a token's result does not depend on its batch.
fn by_tiles<'w>(
    w: &'w WeightMatrix,
    o0: usize,
    outs: &mut [&mut [f32]],
    b: Option<&[f32]>,
    per_pass: usize,
    tile: impl Fn(&[&'w [u8]; 4], [usize; 4]) -> [[f32; 4]; 4],
) {
    let (t, rows) = (outs.len(), outs[0].len());
    for pass in (0..t).step_by(per_pass) {
        for r0 in (0..rows).step_by(4) {
            let row = |i: usize| w.row(o0 + (r0 + i).min(rows - 1));
            let ws = [row(0), row(1), row(2), row(3)];
            // The tile's rows that exist, and their biases (0 past them).
            let n = (rows - r0).min(4);
            let mut bias = [0.0f32; 4];
            if let Some(b) = b {
                bias[..n].copy_from_slice(&b[o0 + r0..o0 + r0 + n]);
            }
            for t0 in (pass..t.min(pass + per_pass)).step_by(4) {
                // Spelled out: `array::map` here was not inlined (2% of a
                // batched decode).
                let last = t - 1;
                let js = [
                    t0,
                    (t0 + 1).min(last),
                    (t0 + 2).min(last),
                    (t0 + 3).min(last),
                ];
                let d = tile(&ws, js);
                // A token's four results side by side, one copy each:
                // sixteen scattered stores, each through its token's
                // slice, were 5% of a batched decode.
                for (j, out) in outs[t0..].iter_mut().take(4).enumerate() {
                    let v = [
                        d[0][j] + bias[0],
                        d[1][j] + bias[1],
                        d[2][j] + bias[2],
                        d[3][j] + bias[3],
                    ];
                    out[r0..r0 + n].copy_from_slice(&v[..n]);
                }
            }
        }
    }
}

/// Every token's blocks and groups of them, `per` blocks and `per_g`
/// groups a token.
#[derive(Clone, Copy)]
struct Q8Acts<'a> {
    blocks: &'a [Q8Block],
    groups: &'a [Q8Group],
    per: usize,
    per_g: usize,
}

impl<'a> Q8Acts<'a> {
    /// Token `j`'s blocks and groups.
    fn row(self, j: usize) -> Q8Row<'a> {
        Q8Row {
            blocks: &self.blocks[j * self.per..(j + 1) * self.per],
            groups: &self.groups[j * self.per_g..(j + 1) * self.per_g],
        }
    }
}

/// Row `o` of `w` against every token's activations, into `out[tt]`.
fn row_dots(
    k: &Kernels,
    w: &WeightMatrix,
    o: usize,
    acts: Acts<'_>,
    n_in: usize,
    out: &mut [f32],
    bias: f32,
) {
    let row = w.row(o);
    match acts {
        Acts::F32(x) => {
            let xs = x.chunks_exact(n_in);
            match w.dtype() {
                GgmlType::F16 => {
                    for (v, xr) in out.iter_mut().zip(xs) {
                        *v = (k.f16)(row, xr) + bias;
                    }
                }
                GgmlType::BF16 => {
                    for (v, xr) in out.iter_mut().zip(xs) {
                        *v = (k.bf16)(row, xr) + bias;
                    }
                }
                _ => {
                    // F32 matrices are 4-aligned (WeightMatrix guarantees it).
                    let wf = match w.as_f32() {
                        Some(all) => &all[o * n_in..(o + 1) * n_in],
                        None => return,
                    };
                    for (v, xr) in out.iter_mut().zip(xs) {
                        *v = (k.f32)(wf, xr) + bias;
                    }
                }
            }
        }
        Acts::Q8(a) => {
            let (f, _) = k.for_q8(w.dtype()).expect(Q8_ONLY);
            for (tt, v) in out.iter_mut().enumerate() {
                *v = f(row, &a.row(tt)) + bias;
            }
        }
        Acts::Q8K(a) => {
            let (f, _) = k.for_q8k(w.dtype()).expect(Q8K_ONLY);
            let per = n_in / 256;
            for (v, ar) in out.iter_mut().zip(a.chunks_exact(per)) {
                *v = f(row, ar) + bias;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matrix of random blocks whose f16 scales (and minimums) are small.
    fn matrix(dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> WeightMatrix {
        let len = rows * dtype.row_bytes(cols as u64).expect("whole blocks") as usize;
        let mut state = seed | 1;
        let mut bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let scale = half::f16::from_f32(0.01).to_le_bytes();
        for block in bytes.chunks_exact_mut(dtype.block_bytes()) {
            block[..2].copy_from_slice(&scale);
            // The second f16 (Q4_1's and Q5_1's minimum, the K-quants'
            // dmin); Q5_0's high-bit word and Q8_0's weights stay random.
            if !matches!(dtype, GgmlType::Q8_0 | GgmlType::Q5_0) {
                block[2..4].copy_from_slice(&scale);
            }
        }
        WeightMatrix::from_bytes(dtype, rows, cols, bytes).expect("matrix")
    }

    /// A prompt long enough to take several passes of the tiles (and a
    /// short last one) gives every token the bits it gets alone.
    #[test]
    fn tokens_past_a_pass_get_the_bits_they_get_alone() {
        let (pool, one_thread) = (Pool::new(2), Pool::new(1));
        let k = Kernels::detect();
        let (t, n_in) = (901, 256);
        assert!(t > 2 * pass_tokens(n_in + n_in / 4), "three passes");
        assert!(t > 2 * pass_tokens(size_of::<Q8KBlock>()), "three K passes");
        let x: Vec<f32> = (0..t * n_in).map(|i| (i as f32 * 0.37).sin()).collect();
        let formats = [
            (GgmlType::Q4_1, 4),
            (GgmlType::Q8_0, 5),
            (GgmlType::F16, 6),
            (GgmlType::Q4_K, 7),
            (GgmlType::Q6_K, 8),
            (GgmlType::Q5_0, 9),
            (GgmlType::Q5_1, 10),
            (GgmlType::Q5_K, 11),
            (GgmlType::Q3_K, 12),
            (GgmlType::IQ4_NL, 13),
            (GgmlType::IQ4_XS, 14),
            (GgmlType::Q2_K, 15),
        ];
        for (dtype, seed) in formats {
            let w = if dtype == GgmlType::F16 {
                let bytes = (0..10 * n_in)
                    .flat_map(|i| half::f16::from_f32((i as f32 * 0.013).cos()).to_le_bytes())
                    .collect();
                WeightMatrix::from_bytes(dtype, 10, n_in, bytes).expect("matrix")
            } else {
                matrix(dtype, 10, n_in, seed).laid_out(k.layout)
            };
            let product_on = |pool: &Pool, x: &[f32], t: usize, b: Option<&[f32]>| {
                let mut y = Vec::new();
                let mut s = MatScratch::default();
                let int8 = ActivationPrecision::Int8;
                matmul(pool, &k, int8, x, t, &w, b, &mut y, &mut s, Input::New);
                y
            };
            let product = |x: &[f32], t: usize, b| product_on(&pool, x, t, b);
            let all = product(&x, t, None);
            // Bits, not values: the random K-quant scales include NaN.
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for (tt, (got, x)) in all.chunks_exact(10).zip(x.chunks_exact(n_in)).enumerate() {
                assert_eq!(
                    bits(got),
                    bits(&product(x, 1, None)),
                    "{dtype:?} token {tt}"
                );
            }
            // A bias lands on its own row of every token (10 rows: the
            // last tile of four holds two). Two threads split the rows into
            // tasks of four; one thread runs them as one task, its tiles at
            // rows 0, 4 and 8 of it.
            let bias: Vec<f32> = (0..10).map(|r| 100.0 * (r + 1) as f32).collect();
            for (threads, pool) in [(2, &pool), (1, &one_thread)] {
                let biased = product_on(pool, &x, t, Some(&bias));
                for (tt, (got, plain)) in biased
                    .chunks_exact(10)
                    .zip(all.chunks_exact(10))
                    .enumerate()
                {
                    let want: Vec<f32> = plain.iter().zip(&bias).map(|(p, b)| p + b).collect();
                    let at = format!("{dtype:?} token {tt} with a bias, {threads} threads");
                    assert_eq!(bits(got), bits(&want), "{at}");
                }
            }
        }
    }

    #[test]
    fn reused_activations_give_a_fresh_products_bits_and_new_ones_are_requantized() {
        let pool = Pool::new(2);
        let k = Kernels::detect();
        let (t, n_in) = (5, 512);
        let x1: Vec<f32> = (0..t * n_in).map(|i| (i as f32 * 0.37).sin()).collect();
        let x2: Vec<f32> = (0..t * n_in).map(|i| (i as f32 * 0.11).cos()).collect();
        let q8 = matrix(GgmlType::Q8_0, 12, n_in, 1).laid_out(k.layout);
        let q4 = matrix(GgmlType::Q4_1, 12, n_in, 2).laid_out(k.layout);
        let q4k = matrix(GgmlType::Q4_K, 12, n_in, 3);
        let int8 = ActivationPrecision::Int8;
        let product = |x: &[f32], w: &WeightMatrix, s: &mut MatScratch, input| {
            let mut y = Vec::new();
            matmul(&pool, &k, int8, x, t, w, None, &mut y, s, input);
            y
        };
        let fresh =
            |x: &[f32], w: &WeightMatrix| product(x, w, &mut MatScratch::default(), Input::New);
        let mut s = MatScratch::default();
        // x1 into Q8_0, then the same x1 into Q4_1 and Q4_K (another block
        // format, which must be quantized anyway).
        assert_eq!(product(&x1, &q8, &mut s, Input::New), fresh(&x1, &q8));
        assert_eq!(product(&x1, &q4, &mut s, Input::Same), fresh(&x1, &q4));
        assert_eq!(product(&x1, &q4k, &mut s, Input::Same), fresh(&x1, &q4k));
        // New activations are quantized again, for both block formats.
        assert_eq!(product(&x2, &q4, &mut s, Input::New), fresh(&x2, &q4));
        assert_eq!(product(&x2, &q4k, &mut s, Input::Same), fresh(&x2, &q4k));
        assert_ne!(fresh(&x1, &q4), fresh(&x2, &q4));
    }
}
