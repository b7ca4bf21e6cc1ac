//! `y = x Wᵀ (+ b)` for a step's `t` token rows against one weight matrix
//! in its own dtype: the activations are prepared once (quantized to 8-bit
//! blocks for quantized weights, unless f32 math was asked for), then the
//! matrix's rows are split across the thread pool and each row is read once
//! for all `t` tokens of the step.
//!
//! Every output element is one kernel call on one weight row and one token's
//! activations, whatever `t` and the thread split, so a token's result does
//! not depend on what else is in the batch.

use tokenwire_gguf::GgmlType;

use super::pool::Pool;
use crate::quant::{act_format, quantize_q8, quantize_q8k, ActFormat, Kernels, Q8Block, Q8KBlock};
use crate::tensor::WeightMatrix;

/// Multiply-adds below which splitting a product across threads costs more in
/// hand-off than it saves.
const PAR_MIN_WORK: usize = 1 << 15;
/// Tasks per thread of a product: one long contiguous stretch of rows each
/// for a decode step (hardware prefetchers follow long streams, and fewer
/// hand-offs), a few for prefill so uneven threads even out.
const TASKS_PER_THREAD_DECODE: usize = 1;
const TASKS_PER_THREAD_PREFILL: usize = 4;

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

/// Buffers of one product, reused from call to call.
#[derive(Debug, Default)]
pub(crate) struct MatScratch {
    q8: Vec<Q8Block>,
    q8k: Vec<Q8KBlock>,
    /// Result as `[n_out, t]` before the transpose.
    cols: Vec<f32>,
}

/// The activations of one product in the form the kernel takes.
#[derive(Clone, Copy)]
enum Acts<'a> {
    F32(&'a [f32]),
    Q8(&'a [Q8Block]),
    Q8K(&'a [Q8KBlock]),
}

/// Computes `y[tt, o] = W[o] · x[tt] + b[o]` for the `t` rows of `x`
/// (`[t, in]`); `y` becomes `[t, out]`.
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
) {
    let (n_out, n_in) = (w.rows(), w.cols());
    y.resize(t * n_out, 0.0);
    if t == 0 || n_out == 0 {
        return;
    }
    let widen = precision == ActivationPrecision::F32 && act_format(w.dtype()) != ActFormat::F32;
    let acts = if widen {
        Acts::F32(x)
    } else {
        match act_format(w.dtype()) {
            ActFormat::F32 => Acts::F32(x),
            ActFormat::Q8 => {
                quantize_q8(x, &mut s.q8);
                Acts::Q8(&s.q8)
            }
            ActFormat::Q8K => {
                quantize_q8k(x, &mut s.q8k);
                Acts::Q8K(&s.q8k)
            }
        }
    };
    let parallel = n_out * n_in * t >= PAR_MIN_WORK && pool.threads() > 1;
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
    let rows_per_task = n_out.div_ceil(tasks).max(1);
    let fill = |ci: usize, chunk: &mut [f32], row_buf: &mut Vec<f32>| {
        let o0 = ci * rows_per_task;
        for (r, out) in chunk.chunks_exact_mut(t).enumerate() {
            let o = o0 + r;
            let bias = b.map_or(0.0, |b| b[o]);
            if widen {
                row_buf.resize(n_in, 0.0);
                w.dequantize_row(o, row_buf);
                for (tt, v) in out.iter_mut().enumerate() {
                    *v = (k.f32)(row_buf, &x[tt * n_in..(tt + 1) * n_in]) + bias;
                }
            } else {
                row_dots(k, w, o, acts, n_in, out, bias);
            }
        }
    };
    let run = |dst: &mut [f32]| {
        if parallel {
            pool.for_each_chunk(dst, rows_per_task * t, |ci, c| fill(ci, c, &mut Vec::new()));
        } else {
            let mut buf = Vec::new();
            for (ci, c) in dst.chunks_mut(rows_per_task * t).enumerate() {
                fill(ci, c, &mut buf);
            }
        }
    };
    if t == 1 {
        run(y);
    } else {
        s.cols.resize(t * n_out, 0.0);
        run(&mut s.cols);
        for (o, col) in s.cols.chunks_exact(t).enumerate() {
            for (tt, &v) in col.iter().enumerate() {
                y[tt * n_out + o] = v;
            }
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
                    // Four tokens at a time share each widened weight.
                    let mut groups = out.chunks_exact_mut(4);
                    let mut xs = xs;
                    for vs in &mut groups {
                        let (Some(a), Some(b), Some(c), Some(d)) =
                            (xs.next(), xs.next(), xs.next(), xs.next())
                        else {
                            return;
                        };
                        for (v, r) in vs.iter_mut().zip((k.f16_x4)(row, &[a, b, c, d])) {
                            *v = r + bias;
                        }
                    }
                    for (v, xr) in groups.into_remainder().iter_mut().zip(xs) {
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
            let (f, f4) = match w.dtype() {
                GgmlType::Q8_0 => (k.q8_0, k.q8_0_x4),
                GgmlType::Q4_0 => (k.q4_0, k.q4_0_x4),
                _ => (k.q4_1, k.q4_1_x4),
            };
            let per = n_in / 32;
            // Four tokens at a time share each block's unpacking; the rest
            // one by one. Both give the same bits for a token.
            let mut groups = out.chunks_exact_mut(4);
            let mut tokens = a.chunks_exact(per);
            for vs in &mut groups {
                let (Some(a0), Some(a1), Some(a2), Some(a3)) =
                    (tokens.next(), tokens.next(), tokens.next(), tokens.next())
                else {
                    return;
                };
                for (v, d) in vs.iter_mut().zip(f4(row, &[a0, a1, a2, a3])) {
                    *v = d + bias;
                }
            }
            for (v, ar) in groups.into_remainder().iter_mut().zip(tokens) {
                *v = f(row, ar) + bias;
            }
        }
        Acts::Q8K(a) => {
            let f = if w.dtype() == GgmlType::Q4_K {
                k.q4_k
            } else {
                k.q6_k
            };
            let per = n_in / 256;
            for (v, ar) in out.iter_mut().zip(a.chunks_exact(per)) {
                *v = f(row, ar) + bias;
            }
        }
    }
}
