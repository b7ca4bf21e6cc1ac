//! A pass's dispatches as the backend records them: which pipeline and
//! bind group each uses, its parameter block's offset in the step's arena,
//! and the order of a layer's kernels with the fusions that apply (layers
//! planned alike share one plan: [`PassOps::layers`]). The
//! blocks come from the planners ([`super::params`], [`super::attn`],
//! [`Product::calls`]); nothing here spells a kernel's words.

use super::attn::DecodeCalls;
use super::choice::KernelChoice;
use super::coop::CoopTile;
use super::params::{self, Call, ParamArena};
use super::pipelines::{
    pair_fits_plain_groups, Kernel, Pair, Product, RopeFuse, WeightDtype, WeightKernel,
};
use super::plan::Pass;
use super::tensors::{LayerGpu, Matrix};
use super::{glu_fusable, norm_fusable, rope_fusable, Dims};

/// Which pipeline a recorded dispatch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pipe {
    Weight(WeightKernel, WeightDtype),
    Norm,
    RopeKv,
    Decode,
    Prefill,
    Merge,
    Silu,
    Sample,
}

/// Which bind group a recorded dispatch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bind {
    Embed(usize),
    NormIn(usize),
    NormPost(usize),
    NormFinal,
    Qkv(usize, usize),
    O(usize, usize),
    GateUp(usize, usize),
    Glu(usize),
    QkvNormed(usize, usize),
    /// q|k|v with RoPE and the KV write fused in, from x normalised by the
    /// norm kernel or on the fly.
    QkvRope(usize),
    QkvRopeNormed(usize),
    GateUpNormed(usize, usize),
    GluNormed(usize),
    Down(usize, usize),
    Head(usize),
    RopeKv(usize),
    Decode(usize),
    Prefill(usize),
    Merge,
    Silu,
    Sample,
}

/// One dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Op {
    pub(super) pipe: Pipe,
    pub(super) bind: Bind,
    /// Offset of its parameter block in the step's arena.
    pub(super) param: u32,
    pub(super) groups: [u32; 2],
}

impl Bind {
    /// The same bind group of layer `l` (unchanged for those outside the
    /// layers).
    fn at_layer(self, l: usize) -> Bind {
        match self {
            Bind::NormIn(_) => Bind::NormIn(l),
            Bind::NormPost(_) => Bind::NormPost(l),
            Bind::Qkv(_, c) => Bind::Qkv(l, c),
            Bind::O(_, c) => Bind::O(l, c),
            Bind::GateUp(_, c) => Bind::GateUp(l, c),
            Bind::Glu(_) => Bind::Glu(l),
            Bind::QkvNormed(_, c) => Bind::QkvNormed(l, c),
            Bind::QkvRope(_) => Bind::QkvRope(l),
            Bind::QkvRopeNormed(_) => Bind::QkvRopeNormed(l),
            Bind::GateUpNormed(_, c) => Bind::GateUpNormed(l, c),
            Bind::GluNormed(_) => Bind::GluNormed(l),
            Bind::Down(_, c) => Bind::Down(l, c),
            Bind::RopeKv(_) => Bind::RopeKv(l),
            Bind::Decode(_) => Bind::Decode(l),
            Bind::Prefill(_) => Bind::Prefill(l),
            Bind::Embed(_)
            | Bind::NormFinal
            | Bind::Head(_)
            | Bind::Merge
            | Bind::Silu
            | Bind::Sample => self,
        }
    }
}

impl Op {
    /// The kernel and what it computes, as profiles name it.
    pub(super) fn name(&self) -> String {
        let role = match self.bind {
            Bind::Qkv(..) | Bind::QkvNormed(..) | Bind::QkvRope(_) | Bind::QkvRopeNormed(_) => {
                "qkv "
            }
            Bind::O(..) => "o ",
            Bind::GateUp(..) | Bind::Glu(_) | Bind::GateUpNormed(..) | Bind::GluNormed(_) => {
                "gate_up "
            }
            Bind::Down(..) => "down ",
            Bind::Head(_) => "lm_head ",
            Bind::NormFinal => "final ",
            _ => "",
        };
        let kernel = match self.pipe {
            Pipe::Weight(WeightKernel::Embed, d) => format!("embed {d:?}"),
            Pipe::Weight(WeightKernel::MatVec(c, _), d) => format!("mat_vec x{c} {d:?}"),
            Pipe::Weight(WeightKernel::Glu(c, _), d) => format!("glu x{c} {d:?}"),
            Pipe::Weight(WeightKernel::Rope(c, _), d) => format!("mat_vec+rope x{c} {d:?}"),
            Pipe::Weight(WeightKernel::MatMul, d) => format!("mat_mul {d:?}"),
            Pipe::Weight(WeightKernel::Coop(CoopTile::Square4), d) => format!("coop_mat_mul {d:?}"),
            Pipe::Weight(WeightKernel::Coop(CoopTile::Wide8), d) => {
                format!("coop_mat_mul wide {d:?}")
            }
            Pipe::Weight(WeightKernel::Coop(CoopTile::Tall4), d) => {
                format!("coop_mat_mul tall {d:?}")
            }
            Pipe::Weight(WeightKernel::SplitSum, _) => "split_sum".into(),
            Pipe::Norm => "rms_norm".into(),
            Pipe::RopeKv => "rope_kv".into(),
            Pipe::Decode => "attn_decode".into(),
            Pipe::Prefill => "attn_prefill".into(),
            Pipe::Merge => "attn_merge".into(),
            Pipe::Silu => "silu_mul".into(),
            Pipe::Sample => "sample".into(),
        };
        let normed = matches!(
            self.bind,
            Bind::QkvNormed(..)
                | Bind::QkvRopeNormed(_)
                | Bind::GateUpNormed(..)
                | Bind::GluNormed(_)
        );
        format!("{role}{kernel}{}", if normed { " +norm" } else { "" })
    }
}

/// One compute pass, then copies of logits rows into the staging buffer
/// (source offset, destination offset, bytes), then (in a second compute
/// pass, so the copies see the rows before the repetition penalty changes
/// them) the sampling of the pass's logits rows.
#[derive(Debug, Default)]
pub(super) struct Segment {
    pub(super) ops: Vec<Op>,
    /// Logits rows that come back whole: (source, staging, bytes).
    pub(super) copies: Vec<(u64, u64, u64)>,
    /// Embedding rows of the residual stream `x` (before the final norm,
    /// which the host applies): (source, staging, bytes).
    pub(super) hidden_copies: Vec<(u64, u64, u64)>,
    pub(super) sample: Option<Op>,
}

impl Segment {
    /// Dispatches in the segment.
    pub(super) fn dispatches(&self) -> usize {
        self.ops.len() + usize::from(self.sample.is_some())
    }
}

/// How a product's neighbours are fused into it (mat_vec.wgsl's flags).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Fuse {
    /// Normalise x on the fly with this epsilon (mat-vec only).
    norm_eps: Option<f32>,
    /// Add the product to y: a residual add.
    accumulate: bool,
}

impl Fuse {
    const RESIDUAL: Fuse = Fuse {
        norm_eps: None,
        accumulate: true,
    };
}

/// The dispatches every layer of a pass repeats with the same parameters,
/// planned once per pass.
#[derive(Debug)]
pub(super) struct LayerCalls {
    /// The norms before q|k|v and gate|up, where they run on their own.
    pub(super) norm: Call,
    pub(super) rope_kv: Call,
    /// The same work done by the q|k|v mat-vec, where it is fused.
    pub(super) rope: RopeFuse,
    /// Decode attention, where the pass has decode rows.
    pub(super) decode: Option<DecodeCalls>,
    /// Prefill attention, where the pass has prefill tiles.
    pub(super) prefill: Option<Call>,
    /// SiLU-times-up, where it is not fused into the gate|up product.
    pub(super) silu: Call,
}

/// The dispatches of one pass as they are planned, their parameter blocks
/// going into the step's arena.
pub(super) struct PassOps<'a> {
    pub(super) params: &'a mut ParamArena,
    pub(super) ops: Vec<Op>,
    /// Token rows of the pass.
    pub(super) rows: u32,
    pub(super) dims: Dims,
    pub(super) kernels: KernelChoice,
    /// Mat-vec rows split over invocations.
    pub(super) split_k: bool,
    /// The norms may go into the products that read them
    /// ([`super::WgpuOptions::fuse_norm`], split-row mat-vec only).
    pub(super) fuse_norm: bool,
    /// SiLU-times-up may go into the gate|up product
    /// ([`super::WgpuOptions::fuse_glu`]).
    pub(super) fuse_glu: bool,
    /// RoPE and the KV write may go into the q|k|v product
    /// ([`super::WgpuOptions::fuse_rope`]).
    pub(super) fuse_rope: bool,
    /// Most bytes of split-k partials any product of the pass writes.
    pub(super) split_bytes: u64,
    /// Most bytes of split counters any product of the pass uses.
    pub(super) count_bytes: u64,
}

impl PassOps<'_> {
    /// `call` as a dispatch of `pipe` on `bind`, its block in the arena.
    pub(super) fn op(&mut self, pipe: Pipe, bind: Bind, call: &Call) -> Op {
        Op {
            pipe,
            bind,
            param: self.params.push(&call.params),
            groups: call.groups,
        }
    }

    /// Appends `call` as a dispatch of `pipe` on `bind`.
    pub(super) fn push(&mut self, pipe: Pipe, bind: Bind, call: &Call) {
        let op = self.op(pipe, bind, call);
        self.ops.push(op);
    }

    /// Fusions apply only on mat-vec passes: the tiled kernels have no
    /// fused variants. (The paired ones, SwiGLU and RoPE, also only where
    /// they take no more dispatches than the plain product:
    /// [`pair_fits_plain_groups`].)
    fn mat_vec_pass(&self) -> bool {
        self.kernels.for_rows(self.rows) == Kernel::MatVec
    }

    /// Whether the norm before `m` goes into its product on this pass.
    fn norm_in(&self, m: &Matrix) -> bool {
        self.mat_vec_pass() && norm_fusable(self.fuse_norm, m)
    }

    fn normed(&self, norm_in: bool) -> Fuse {
        Fuse {
            norm_eps: norm_in.then_some(self.dims.eps),
            accumulate: false,
        }
    }

    /// A product through `m` for `cols` rows of x (which are `m.in_dim`
    /// apart, as mat_vec.wgsl's aligned vec4 reads need) into rows `ldy`
    /// apart, one dispatch per weight chunk (or mat-vec groups), by the
    /// kernel for that many rows.
    pub(super) fn product(
        &mut self,
        m: &Matrix,
        bind: impl Fn(usize) -> Bind,
        cols: u32,
        ldy: u32,
        fuse: Fuse,
    ) {
        for (i, c) in m.chunks.iter().enumerate() {
            let product = Product {
                k: m.in_dim as u32,
                rows: c.rows,
                row0: c.row0,
                cols,
                ldx: m.in_dim as u32,
                ldy,
                bias: m.bias.is_some(),
                kernel: self.kernels.for_rows(cols),
                split_k: self.split_k,
                pair: Pair::None,
                norm_eps: fuse.norm_eps,
                accumulate: fuse.accumulate,
            };
            self.push_product(&product, c.dtype, bind(i));
        }
    }

    /// A fused variant (`pair`) of the pass's rows through the one-chunk
    /// matrix `m` (`rows` output units) into rows `ldy` apart, in mat-vec
    /// groups.
    fn paired(&mut self, m: &Matrix, bind: Bind, fuse: Fuse, pair: Pair, rows: u32, ldy: u32) {
        let product = Product {
            k: m.in_dim as u32,
            rows,
            row0: 0,
            cols: self.rows,
            ldx: m.in_dim as u32,
            ldy,
            bias: m.bias.is_some(),
            kernel: Kernel::MatVec,
            split_k: self.split_k,
            pair,
            norm_eps: fuse.norm_eps,
            accumulate: false,
        };
        self.push_product(&product, m.chunks[0].dtype, bind);
    }

    fn push_product(&mut self, product: &Product, dtype: WeightDtype, bind: Bind) {
        self.split_bytes = self.split_bytes.max(product.split_bytes());
        self.count_bytes = self.count_bytes.max(product.count_bytes());
        for c in product.calls() {
            self.push(Pipe::Weight(c.kind, dtype), bind, &c.call);
        }
    }

    /// Every layer of `layers` in order, each planned as [`PassOps::layer`]
    /// plans it; but a layer whose matrices are planned like an earlier
    /// one's ([`LayerGpu::plans_like`]: every layer of most models) takes a
    /// copy of that layer's dispatches on its own bind groups, the same
    /// parameter blocks and grids, without planning them again. Debug
    /// builds plan it as well and check the copy.
    pub(super) fn layers(&mut self, layers: &[LayerGpu], c: &LayerCalls) {
        // (a layer planned in full, the range of its dispatches)
        let mut planned: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (l, lw) in layers.iter().enumerate() {
            let like = planned.iter().find(|(p, _)| layers[*p].plans_like(lw));
            if let Some((_, range)) = like {
                let start = self.ops.len();
                for i in range.clone() {
                    let op = self.ops[i];
                    self.ops.push(Op {
                        bind: op.bind.at_layer(l),
                        ..op
                    });
                }
                if cfg!(debug_assertions) {
                    let copied = self.ops.split_off(start);
                    self.layer(l, lw, c);
                    assert_eq!(self.ops[start..], copied[..], "layer {l}");
                }
            } else {
                let start = self.ops.len();
                self.layer(l, lw, c);
                planned.push((l, start..self.ops.len()));
            }
        }
    }

    /// Layer `l`: attention, then the MLP, each adding into the residual
    /// stream x, which the norms read.
    fn layer(&mut self, l: usize, lw: &LayerGpu, c: &LayerCalls) {
        let d = self.dims;
        let norm_in = self.norm_in(&lw.qkv);
        if !norm_in {
            self.push(Pipe::Norm, Bind::NormIn(l), &c.norm);
        }
        let rope_in = self.mat_vec_pass()
            && rope_fusable(self.fuse_rope, &lw.qkv)
            && pair_fits_plain_groups(self.split_k, self.rows);
        if rope_in {
            let bind = if norm_in {
                Bind::QkvRopeNormed(l)
            } else {
                Bind::QkvRope(l)
            };
            let pair = Pair::Rope(c.rope);
            self.paired(&lw.qkv, bind, self.normed(norm_in), pair, d.qkv_w, d.qkv_w);
        } else {
            let qkv = |i| {
                if norm_in {
                    Bind::QkvNormed(l, i)
                } else {
                    Bind::Qkv(l, i)
                }
            };
            self.product(&lw.qkv, qkv, self.rows, d.qkv_w, self.normed(norm_in));
            self.push(Pipe::RopeKv, Bind::RopeKv(l), &c.rope_kv);
        }
        self.attention(l, c);
        self.product(&lw.o, |i| Bind::O(l, i), self.rows, d.h, Fuse::RESIDUAL);
        self.mlp(l, lw, c);
    }

    /// Decode and prefill attention (RoPE and the K/V write done).
    fn attention(&mut self, l: usize, c: &LayerCalls) {
        if let Some(dc) = &c.decode {
            self.push(Pipe::Decode, Bind::Decode(l), &dc.decode);
            if let Some(m) = &dc.merge {
                self.push(Pipe::Merge, Bind::Merge, m);
            }
        }
        if let Some(pc) = &c.prefill {
            self.push(Pipe::Prefill, Bind::Prefill(l), pc);
        }
    }

    /// Norm, gate|up and SiLU-times-up (fused where they allow), down.
    fn mlp(&mut self, l: usize, lw: &LayerGpu, c: &LayerCalls) {
        let d = self.dims;
        let norm_in = self.norm_in(&lw.gate_up);
        if !norm_in {
            self.push(Pipe::Norm, Bind::NormPost(l), &c.norm);
        }
        let fuse = self.normed(norm_in);
        if self.mat_vec_pass()
            && glu_fusable(self.fuse_glu, &lw.gate_up)
            && pair_fits_plain_groups(self.split_k, self.rows)
        {
            let bind = if norm_in {
                Bind::GluNormed(l)
            } else {
                Bind::Glu(l)
            };
            let inter = d.inter;
            self.paired(&lw.gate_up, bind, fuse, Pair::Glu, inter, inter);
        } else {
            let gate_up = |i| {
                if norm_in {
                    Bind::GateUpNormed(l, i)
                } else {
                    Bind::GateUp(l, i)
                }
            };
            self.product(&lw.gate_up, gate_up, self.rows, 2 * d.inter, fuse);
            self.push(Pipe::Silu, Bind::Silu, &c.silu);
        }
        self.product(
            &lw.down,
            |i| Bind::Down(l, i),
            self.rows,
            d.h,
            Fuse::RESIDUAL,
        );
    }

    /// The final norm and LM head on the rows of `p` that need logits, and
    /// the sampling of those rows where any is sampled on the device (its
    /// own compute pass: see [`Segment`]).
    pub(super) fn head(&mut self, head: &Matrix, p: &Pass, on_device: &[bool]) -> Option<Op> {
        let d = self.dims;
        let norm = params::norm_call(d.h, d.eps, Some(p.sel_off), p.n_sel);
        self.push(Pipe::Norm, Bind::NormFinal, &norm);
        self.product(head, Bind::Head, p.n_sel, d.vocab, Fuse::default());
        let rows = p.out_base as usize..(p.out_base + p.n_sel) as usize;
        let sampled = on_device.get(rows).is_some_and(|r| r.iter().any(|&x| x));
        sampled.then(|| {
            let call = params::sample_call(p.n_sel, d.vocab, p.out_base);
            self.op(Pipe::Sample, Bind::Sample, &call)
        })
    }
}
