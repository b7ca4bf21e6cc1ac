//! The CPU backend: the llama forward pass on weights in their file's dtype
//! (f32, f16, bf16, or ggml's quantized blocks), all of a step's tokens pushed
//! through each weight matrix together (`matmul`), output rows split across
//! the backend's own persistent thread pool (`pool`), the dot products in
//! the SIMD kernels chosen for this CPU at start ([`crate::quant::Kernels`]).
//! The backend keeps its own copy of the 32-block matrices in the row
//! layout those kernels read ([`crate::quant::lanes`]) when it is not the
//! file's. It samples the step's rows itself, across the same pool, with
//! the shared sampler's rule, and returns the rows too
//! ([`Backend::forward_select`]).

mod matmul;
mod pool;

use std::sync::{Arc, Mutex};
use tokenwire_core::{BlockId, EngineFaultKind};

use super::{Backend, ForwardOutput, Sampled, SeqBatch};
use crate::kv::{KvCache, KvGeometry};
use crate::model::Model;
use crate::quant::attn::{AttendFn, AttnTask};
use crate::quant::reference::dot_f32;
use crate::quant::{Kernels, RowLayout};
use crate::rope;
use crate::sampler::Sampler;
use crate::weights::Linear;
pub use matmul::ActivationPrecision;
use matmul::{matmul, Input, MatScratch};
use pool::Pool;

/// Multiply-adds below which splitting attention across threads costs more
/// in hand-off than it saves.
const PAR_MIN_WORK: usize = 1 << 17;

/// Where one token of the step sits: its sequence (index in the batch) and position.
#[derive(Debug, Clone, Copy)]
struct Row {
    seq: usize,
    pos: usize,
}

/// Buffers reused from step to step so the hot loop does not allocate.
#[derive(Debug, Default)]
struct Scratch {
    rows: Vec<Row>,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    scores: Vec<f32>,
    mat: MatScratch,
}

/// Gate values from which SiLU is split across the pool (below, the
/// hand-off costs more than it saves).
const SILU_PAR_MIN: usize = 1 << 14;

/// Runs a [`Model`] on the host with a [`KvCache`] pool.
#[derive(Debug)]
pub struct CpuBackend {
    model: Arc<Model>,
    kv: KvCache,
    inv_freq: Vec<f64>,
    scratch: Scratch,
    kernels: Kernels,
    precision: ActivationPrecision,
    pool: Pool,
    /// One sampler's scratch per pool thread ([`Backend::forward_select`]).
    samplers: Vec<Mutex<Sampler>>,
}

impl CpuBackend {
    /// A backend for `model` with a pool of `num_blocks` blocks of
    /// `block_size` slots, quantized activations, and the best kernels for
    /// this CPU.
    pub fn new(model: Arc<Model>, block_size: usize, num_blocks: usize) -> Result<Self, String> {
        CpuBackend::with(
            model,
            block_size,
            num_blocks,
            Kernels::detect(),
            ActivationPrecision::default(),
        )
    }

    /// [`CpuBackend::new`] with the kernels and activation precision chosen.
    pub fn with(
        model: Arc<Model>,
        block_size: usize,
        num_blocks: usize,
        kernels: Kernels,
        precision: ActivationPrecision,
    ) -> Result<Self, String> {
        let c = model.config().clone();
        let geo = KvGeometry {
            layers: c.num_layers,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size,
            num_blocks,
        };
        if block_size == 0 || num_blocks == 0 {
            return Err("block_size and num_blocks must be positive".into());
        }
        let kv = KvCache::new(geo)?;
        // The lane-per-block kernels read each whole eight blocks
        // interleaved; under f32 activations every row is widened instead
        // and the file's layout saves the copy.
        let layout = match precision {
            ActivationPrecision::Int8 => kernels.layout,
            ActivationPrecision::F32 => RowLayout::File,
        };
        let model = if model.weights().matrices().any(|m| !m.reads_as(layout)) {
            Arc::new(model.laid_out(layout))
        } else {
            model
        };
        let inv_freq = rope::inv_freq(c.head_dim, c.rope_theta, &c.rope_scaling);
        Ok(CpuBackend {
            model,
            kv,
            inv_freq,
            scratch: Scratch::default(),
            kernels,
            precision,
            // Sized like rayon's pool (RAYON_NUM_THREADS, else one per core).
            pool: Pool::new(rayon::current_num_threads()),
            samplers: (0..rayon::current_num_threads().max(1))
                .map(|_| Mutex::new(Sampler::new()))
                .collect(),
        })
    }

    /// The kernels in use.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// The KV pool's shape.
    pub fn kv_geometry(&self) -> KvGeometry {
        self.kv.geometry()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn kv_blocks(&self) -> usize {
        self.kv.geometry().num_blocks
    }

    fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<(), EngineFaultKind> {
        let n = self.kv.geometry().num_blocks;
        for &(src, dst) in pairs {
            if src as usize >= n || dst as usize >= n {
                return Err(EngineFaultKind::Internal(format!(
                    "copy_blocks ({src}, {dst}) outside the pool of {n} blocks"
                )));
            }
            self.kv.copy_block(src, dst);
        }
        Ok(())
    }

    fn forward(
        &mut self,
        batch: &[SeqBatch<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineFaultKind> {
        let mut hidden = Vec::new();
        self.run(batch, logits, &mut hidden)
    }

    /// The forward pass, then every row with a spec sampled here across
    /// the pool (the shared sampler's rule, so the tokens are the same
    /// bits): on one thread, a 32-sequence step's sampling left the other
    /// idle. The rows come back too: they are in memory already.
    fn forward_select(
        &mut self,
        batch: &[SeqBatch<'_>],
        out: &mut ForwardOutput,
    ) -> Result<(), EngineFaultKind> {
        self.run(batch, &mut out.logits, &mut out.hidden)?;
        super::every_row_unsampled(batch, out);
        self.sample_rows(batch, out);
        Ok(())
    }
}

impl CpuBackend {
    /// [`Backend::forward`], with the pooled hidden row of every entry
    /// that asks for one ([`SeqBatch::hidden`]) in `hidden`.
    fn run(
        &mut self,
        batch: &[SeqBatch<'_>],
        logits: &mut Vec<f32>,
        hidden: &mut Vec<f32>,
    ) -> Result<(), EngineFaultKind> {
        let CpuBackend {
            model,
            kv,
            inv_freq,
            scratch: s,
            kernels: k,
            precision,
            pool,
            samplers: _,
        } = self;
        let pool = &*pool;
        let (k, precision) = (&*k, *precision);
        let cfg = model.config();
        let w = model.weights();
        let geo = kv.geometry();
        super::check_batch(batch, geo, cfg.vocab_size, cfg.max_position_embeddings)?;

        let h = cfg.hidden_size;
        let (nh, hd) = (cfg.num_heads, cfg.head_dim);
        let half = hd / 2;
        let (q_out, kv_out) = (nh * hd, cfg.num_kv_heads * hd);

        s.rows.clear();
        for (i, b) in batch.iter().enumerate() {
            let p0 = b.start_pos as usize;
            s.rows.extend((0..b.tokens.len()).map(|j| Row {
                seq: i,
                pos: p0 + j,
            }));
        }
        let t = s.rows.len();
        logits.clear();
        hidden.clear();
        if t == 0 {
            return Ok(());
        }

        s.x.clear();
        s.x.resize(t * h, 0.0);
        for (xr, &tok) in
            s.x.chunks_exact_mut(h)
                .zip(batch.iter().flat_map(|b| b.tokens))
        {
            w.embed.dequantize_row(tok as usize, xr);
        }
        s.cos.resize(t * half, 0.0);
        s.sin.resize(t * half, 0.0);
        for (r, row) in s.rows.iter().enumerate() {
            let span = r * half..(r + 1) * half;
            rope::angles(
                inv_freq,
                cfg.rope_scaling.mscale(),
                row.pos as u32,
                &mut s.cos[span.clone()],
                &mut s.sin[span],
            );
        }

        for (l, lw) in w.layers.iter().enumerate() {
            let lin = |x: &[f32], l: &Linear, y: &mut Vec<f32>, m: &mut MatScratch, i| {
                matmul(pool, k, precision, x, t, &l.w, l.b.as_deref(), y, m, i)
            };
            rms_norm(&s.x, &lw.input_norm, cfg.rms_norm_eps, &mut s.xn);
            // q, k and v read the same activations, quantized once.
            lin(&s.xn, &lw.q, &mut s.q, &mut s.mat, Input::New);
            lin(&s.xn, &lw.k, &mut s.k, &mut s.mat, Input::Same);
            lin(&s.xn, &lw.v, &mut s.v, &mut s.mat, Input::Same);
            if let Some(qk) = &lw.qk_norm {
                rms_norm_in_place(&mut s.q, &qk.q, cfg.rms_norm_eps);
                rms_norm_in_place(&mut s.k, &qk.k, cfg.rms_norm_eps);
            }
            for r in 0..t {
                let (c, sn) = (
                    &s.cos[r * half..(r + 1) * half],
                    &s.sin[r * half..(r + 1) * half],
                );
                for head in s.q[r * q_out..(r + 1) * q_out].chunks_exact_mut(hd) {
                    rope::rotate_as(w.rope, head, c, sn);
                }
                for head in s.k[r * kv_out..(r + 1) * kv_out].chunks_exact_mut(hd) {
                    rope::rotate_as(w.rope, head, c, sn);
                }
            }

            let (kc, vc) = kv.layer_mut(l);
            for (r, row) in s.rows.iter().enumerate() {
                let table = batch[row.seq].block_table;
                let block = table[row.pos / geo.block_size] as usize;
                let off = row.pos % geo.block_size;
                for g in 0..cfg.num_kv_heads {
                    let src = r * kv_out + g * hd;
                    // K transposed within the block ([head_dim][slot]), V as
                    // rows ([slot][head_dim]): the attention kernel's layout.
                    let kt = geo.offset(block, g, 0);
                    for (d, &x) in s.k[src..src + hd].iter().enumerate() {
                        kc[kt + d * geo.block_size + off] = x;
                    }
                    let dst = geo.offset(block, g, off);
                    vc[dst..dst + hd].copy_from_slice(&s.v[src..src + hd]);
                }
            }

            let (kc, vc) = kv.layer(l);
            s.att.resize(t * q_out, 0.0);
            attention(
                &AttnCtx {
                    q: &s.q,
                    kc,
                    vc,
                    rows: &s.rows,
                    batch,
                    geo,
                    heads: nh,
                    group: cfg.group_size(),
                    attend: k.attend,
                },
                &mut s.att,
                &mut s.scores,
                pool,
            );
            lin(&s.att, &lw.o, &mut s.proj, &mut s.mat, Input::New);
            add_in_place(&mut s.x, &s.proj);

            rms_norm(&s.x, &lw.post_norm, cfg.rms_norm_eps, &mut s.xn);
            lin(&s.xn, &lw.gate, &mut s.gate, &mut s.mat, Input::New);
            lin(&s.xn, &lw.up, &mut s.up, &mut s.mat, Input::Same);
            // SiLU(gate) * up across the pool for batches (on one thread it
            // was a few percent of a 32-sequence step, the other idle).
            let up = &s.up;
            let chunk = if s.gate.len() >= SILU_PAR_MIN {
                s.gate.len().div_ceil(pool.threads())
            } else {
                s.gate.len()
            };
            pool.for_each_chunk(&mut s.gate, chunk, |ci, g| {
                for (g, u) in g.iter_mut().zip(&up[ci * chunk..]) {
                    *g = *g / (1.0 + (-*g).exp()) * u;
                }
            });
            lin(&s.gate, &lw.down, &mut s.proj, &mut s.mat, Input::New);
            add_in_place(&mut s.x, &s.proj);
        }

        // An embedding's chunk: its tokens' rows after the final norm, pooled.
        let mut end = 0;
        for b in batch {
            let start = end;
            end += b.tokens.len();
            if let Some(pooling) = b.hidden {
                rms_norm(
                    &s.x[start * h..end * h],
                    &w.norm,
                    cfg.rms_norm_eps,
                    &mut s.xn,
                );
                super::pool_rows(&s.xn, h, pooling, hidden);
            }
        }

        // Only the last token of sampling sequences needs the final norm and head.
        s.up.clear();
        let mut end = 0;
        for b in batch {
            end += b.tokens.len();
            if b.want_logits {
                s.up.extend_from_slice(&s.x[(end - 1) * h..end * h]);
            }
        }
        let n_out = s.up.len() / h;
        if n_out == 0 {
            return Ok(());
        }
        rms_norm(&s.up, &w.norm, cfg.rms_norm_eps, &mut s.xn);
        let (head_w, head_b) = match &w.lm_head {
            Some(lin) => (&lin.w, lin.b.as_deref()),
            None => (&w.embed, None),
        };
        matmul(
            pool,
            k,
            precision,
            &s.xn,
            n_out,
            head_w,
            head_b,
            logits,
            &mut s.mat,
            Input::New,
        );
        Ok(())
    }

    /// Samples every row of `out.logits` (one per sequence of `batch` with
    /// `want_logits`) that has a [`super::SampleSpec`] into `out.sampled`,
    /// split across the pool, each task with its own sampler's scratch.
    fn sample_rows(&self, batch: &[SeqBatch<'_>], out: &mut ForwardOutput) {
        let specs: Vec<Option<&super::SampleSpec<'_>>> = batch
            .iter()
            .filter(|b| b.want_logits)
            .map(|b| b.sample.as_ref())
            .collect();
        let vocab = self.model.config().vocab_size;
        let logits = &out.logits;
        let chunk = specs.len().div_ceil(self.samplers.len()).max(1);
        self.pool
            .for_each_chunk(&mut out.sampled, chunk, |ci, dst| {
                // One task a chunk index: the lock is never contended.
                let mut sampler = self.samplers[ci].lock().unwrap_or_else(|e| e.into_inner());
                for (j, d) in dst.iter_mut().enumerate() {
                    let i = ci * chunk + j;
                    *d = specs[i].map(|spec| {
                        let (token, logprobs) =
                            spec.sample(&mut sampler, &logits[i * vocab..(i + 1) * vocab]);
                        Sampled { token, logprobs }
                    });
                }
            });
    }
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// RMSNorm of each `w.len()`-wide row of `x` into `out` (HF order: normalise, then scale).
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    let h = w.len();
    out.resize(x.len(), 0.0);
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let ms = dot_f32(xr, xr) / h as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, &xi), &wi) in or.iter_mut().zip(xr).zip(w) {
            *o = wi * (xi * r);
        }
    }
}

/// [`rms_norm`] of every `w.len()`-wide run of `x`, in place: Qwen3's
/// per-head norm of queries and keys.
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let h = w.len();
    for xr in x.chunks_exact_mut(h) {
        let ms = dot_f32(xr, xr) / h as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for (xi, &wi) in xr.iter_mut().zip(w) {
            *xi = wi * (*xi * r);
        }
    }
}

/// What every attention task reads.
struct AttnCtx<'a> {
    q: &'a [f32],
    kc: &'a [f32],
    vc: &'a [f32],
    rows: &'a [Row],
    batch: &'a [SeqBatch<'a>],
    geo: KvGeometry,
    heads: usize,
    group: usize,
    /// The attention kernel of the instruction set in use.
    attend: AttendFn,
}

/// Causal attention of every token over its own sequence's cached positions;
/// `att` is `[t, heads * head_dim]`. One task per (token, KV head) handles
/// that KV head's whole group of query heads, so each cached K/V row is read
/// once per group rather than once per query head ([`crate::quant::attn`]).
fn attention(ctx: &AttnCtx<'_>, att: &mut [f32], scores: &mut Vec<f32>, pool: &Pool) {
    let width = ctx.group * ctx.geo.head_dim;
    let work: usize =
        ctx.rows.iter().map(|r| r.pos + 1).sum::<usize>() * ctx.heads * ctx.geo.head_dim * 2;
    if work >= PAR_MIN_WORK && pool.threads() > 1 {
        // One task per (token, KV head).
        pool.for_each_chunk(att, width, |i, out| {
            attend_group(ctx, i, out, &mut Vec::new())
        });
    } else {
        for (i, out) in att.chunks_mut(width).enumerate() {
            attend_group(ctx, i, out, scores);
        }
    }
}

/// Attention output of task `i` (token `i / kv_heads`, KV head `i % kv_heads`)
/// for the query heads of that group.
fn attend_group(ctx: &AttnCtx<'_>, i: usize, out: &mut [f32], scores: &mut Vec<f32>) {
    let geo = ctx.geo;
    let kv_heads = ctx.heads / ctx.group;
    let row = ctx.rows[i / kv_heads];
    let width = ctx.group * geo.head_dim;
    let task = AttnTask {
        q: &ctx.q[i * width..(i + 1) * width],
        k: ctx.kc,
        v: ctx.vc,
        table: ctx.batch[row.seq].block_table,
        positions: row.pos + 1,
        kv_head: i % kv_heads,
        kv_heads,
        head_dim: geo.head_dim,
        block_size: geo.block_size,
        group: ctx.group,
    };
    (ctx.attend)(&task, scores, out);
}
