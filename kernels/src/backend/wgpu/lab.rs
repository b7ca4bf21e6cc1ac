//! One kernel at a time: [`KernelLab`] runs each WGSL kernel of the wgpu
//! backend on inputs given as host slices and returns its output, so tests
//! can check every kernel against a CPU reference on arbitrary shapes (and
//! benchmarks can time one kernel). It builds the same pipelines, parameter
//! blocks and `plan` words as the backend, through the same planners.
//! Behind the `lab` feature: only tests and benchmarks run it.

use super::attn::{self, AttnModel, AttnShape};
use super::choice::KernelChoice;
use super::context::Gpu;
use super::coop::CoopConfig;
use super::params::{self, Call, ParamArena};
use super::pipelines::{Kernel, Pair, Pipelines, Product, WeightKernel};
use super::plan::{self, PlanLimits};
use super::tensors::{upload_matrix, Chunk, Part};
use super::{SplitPolicy, WeightDtype, WgpuOptions};
use crate::backend::{SampleSpec, SeqBatch};
use crate::tensor::WeightMatrix;
use tokenwire_core::{SamplingParams, TokenId, TokenLogprobs};

/// One sequence's share of an attention, RoPE or KV-write case.
#[derive(Debug, Clone)]
pub struct LabSeq {
    /// Position of the sequence's first row.
    pub start_pos: u32,
    /// Rows (tokens) of the sequence in this step.
    pub rows: usize,
    /// Its KV blocks, in position order.
    pub block_table: Vec<u32>,
}

/// Which attention kernel a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernel {
    /// attn_decode.wgsl per row, each context split as the backend splits
    /// it under this policy (attn_merge.wgsl combines the splits, or the
    /// last split's workgroup where the policy folds them; then the lab
    /// also checks that every split counter is back to zero).
    Decode(SplitPolicy),
    /// attn_prefill.wgsl on tiles of consecutive rows.
    Prefill,
}

/// Which kernel a [`KernelLab::linear`] case multiplies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabProduct {
    /// Mat-vec groups, as decode passes take them.
    MatVec,
    /// The tiled matmul on f32 arithmetic.
    Tiled,
    /// The tiled matmul on cooperative matrices (an error where the adapter
    /// has no usable configuration: see [`KernelLab::coop`]).
    Coop,
}

/// The shape of the model side of an attention, RoPE or KV-write case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    /// Query heads.
    pub q_heads: usize,
    /// KV heads (divides `q_heads`).
    pub kv_heads: usize,
    /// Head width (even).
    pub head_dim: usize,
    /// Slots per KV block.
    pub block_size: usize,
}

impl HeadShape {
    /// Width of a fused q|k|v row.
    pub fn qkv_width(&self) -> usize {
        (self.q_heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// One row of a [`KernelLab::sample`] case: what a [`SampleSpec`] holds.
#[derive(Debug, Clone)]
pub struct LabSample {
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Position of the sampled token (seeds the draw).
    pub position: u32,
    /// The sequence's tokens (the repetition penalty uses the distinct ones).
    pub history: Vec<TokenId>,
    /// Logprobs of the chosen token and of this many best ones.
    pub logprobs: Option<u8>,
}

/// What [`KernelLab::rope_kv`] leaves: the q|k|v rows, rotated, and the
/// two pools with the rows' K and V written.
#[derive(Debug, Clone)]
pub struct RopeKvOut {
    /// The rows, query and key heads rotated.
    pub qkv: Vec<f32>,
    /// The K pool.
    pub k: Vec<f32>,
    /// The V pool.
    pub v: Vec<f32>,
}

/// What RoPE and the K/V write take besides the q|k|v rows
/// ([`KernelLab::rope_kv`], [`KernelLab::qkv_rope`]): the heads, the
/// sequences (the rows' positions and slots), the inverse frequencies, and
/// the pools the write goes into copies of.
#[derive(Debug, Clone, Copy)]
pub struct RopeCase<'a> {
    /// The heads and the cache's block size.
    pub shape: &'a HeadShape,
    /// The sequences, their rows in order.
    pub seqs: &'a [LabSeq],
    /// RoPE's inverse frequencies (`head_dim / 2`).
    pub inv_freq: &'a [f64],
    /// The K pool before the write.
    pub k_pool: &'a [f32],
    /// The V pool before the write.
    pub v_pool: &'a [f32],
}

/// Runs single kernels of the wgpu backend.
pub struct KernelLab {
    gpu: Gpu,
    pipes: Pipelines,
    opts: WgpuOptions,
    cpu_adapter: bool,
}

impl std::fmt::Debug for KernelLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelLab")
            .field("gpu", &self.gpu)
            .finish_non_exhaustive()
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl KernelLab {
    /// Opens a device as the backend would (adapter, binding cap, `shader-f16`
    /// and the mat-vec variant from `opts`). Fails with a message when there
    /// is no adapter.
    pub fn new(opts: &WgpuOptions) -> Result<KernelLab, String> {
        let gpu = Gpu::new(opts)?;
        let cpu_adapter = gpu.info.device_type == ::wgpu::DeviceType::Cpu;
        let split_k = opts.split_k.unwrap_or(!cpu_adapter);
        let k_chunk = attn::decode_k_chunk(cpu_adapter, opts.decode_k_chunk);
        let pipes = Pipelines::new(&gpu, split_k, opts.mat_vec_unroll, k_chunk, opts.fuse_rope);
        Ok(KernelLab {
            gpu,
            pipes,
            opts: opts.clone(),
            cpu_adapter,
        })
    }

    /// The adapter: name, graphics API, type, and the subgroup sizes it reports.
    pub fn adapter(&self) -> String {
        let i = &self.gpu.info;
        format!(
            "{} ({:?}, {:?}, subgroup size {}..={})",
            i.name, i.backend, i.device_type, i.subgroup_min_size, i.subgroup_max_size
        )
    }

    /// The cooperative-matrix configuration enabled on this device, if any.
    pub fn coop(&self) -> Option<CoopConfig> {
        self.pipes.coop.square
    }

    /// The tall-tile configuration, where the device has it and the
    /// options ask for it: coop products of up to its tokens use it.
    pub fn coop_tall(&self) -> Option<CoopConfig> {
        self.pipes.coop.tall
    }

    /// Whether f16 weights are read natively (`shader-f16`).
    pub fn f16_native(&self) -> bool {
        self.gpu.f16_native
    }

    fn upload(&self, label: &str, bytes: &[u8]) -> ::wgpu::Buffer {
        self.gpu.buffer_init(label, bytes)
    }

    fn output(&self, label: &str, floats: usize) -> ::wgpu::Buffer {
        self.gpu.buffer(
            label,
            4 * floats as u64,
            ::wgpu::BufferUsages::STORAGE | ::wgpu::BufferUsages::COPY_SRC,
        )
    }

    fn bind(
        &self,
        layout: &::wgpu::BindGroupLayout,
        bufs: &[&::wgpu::Buffer],
    ) -> ::wgpu::BindGroup {
        self.gpu.storage_bind_group(layout, "lab", bufs)
    }

    /// Runs `dispatches` (pipeline, bind group, parameters and grid) in one
    /// compute pass, then reads back `read` (buffer, bytes).
    fn run(
        &self,
        dispatches: &[(&::wgpu::ComputePipeline, &::wgpu::BindGroup, Call)],
        read: (&::wgpu::Buffer, u64),
    ) -> Result<Vec<u8>, String> {
        let mut params = ParamArena::new(self.gpu.uniform_align);
        let offs: Vec<u32> = dispatches
            .iter()
            .map(|d| params.push(&d.2.params))
            .collect();
        let pbuf = self.gpu.buffer(
            "lab.params",
            (params.bytes().len() as u64).max(256),
            ::wgpu::BufferUsages::UNIFORM | ::wgpu::BufferUsages::COPY_DST,
        );
        self.gpu.queue.write_buffer(&pbuf, 0, params.bytes());
        let pbg = self.pipes.params_bind_group(&self.gpu, &pbuf);
        let bytes = read.1.max(4).div_ceil(4) * 4;
        let staging = self.gpu.buffer(
            "lab.staging",
            bytes,
            ::wgpu::BufferUsages::MAP_READ | ::wgpu::BufferUsages::COPY_DST,
        );
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&::wgpu::CommandEncoderDescriptor { label: Some("lab") });
        {
            let mut pass = enc.begin_compute_pass(&::wgpu::ComputePassDescriptor {
                label: Some("lab"),
                timestamp_writes: None,
            });
            for (d, off) in dispatches.iter().zip(&offs) {
                pass.set_pipeline(d.0);
                pass.set_bind_group(0, d.1, &[]);
                pass.set_bind_group(1, &pbg, &[*off]);
                pass.dispatch_workgroups(d.2.groups[0], d.2.groups[1], 1);
            }
        }
        enc.copy_buffer_to_buffer(read.0, 0, &staging, 0, bytes);
        self.gpu.queue.submit([enc.finish()]);
        self.gpu
            .read_mapped(&staging, read.1)
            .map_err(|e| e.message())
    }

    /// `product`'s dispatches through one chunk of `dtype` weights bound by
    /// `bg`, each with its pipeline, as [`KernelLab::run`] takes them.
    #[allow(clippy::type_complexity)]
    fn product_dispatches<'a>(
        &'a self,
        product: &Product,
        dtype: WeightDtype,
        bg: &'a ::wgpu::BindGroup,
    ) -> Result<Vec<(&'a ::wgpu::ComputePipeline, &'a ::wgpu::BindGroup, Call)>, String> {
        product
            .calls()
            .into_iter()
            .map(|call| {
                let pipe = self
                    .pipes
                    .weight(call.kind, dtype)
                    .ok_or("pipeline missing")?;
                Ok((pipe, bg, call.call))
            })
            .collect()
    }

    /// Uploads a `[rows, in_dim]` matrix as `dtype` in chunks of at most
    /// `chunk_rows` rows (None: as big as a binding allows).
    fn chunks(
        &self,
        w: &[f32],
        in_dim: usize,
        dtype: WeightDtype,
        chunk_rows: Option<usize>,
    ) -> Result<Vec<Chunk>, String> {
        if dtype.is_quantized() {
            return Err(format!(
                "{dtype:?} weights come as blocks: use the *_matrix methods"
            ));
        }
        let rows = w.len() / in_dim.max(1);
        let per = super::tensors::rows_per_chunk(self.gpu.max_binding, in_dim, dtype, chunk_rows)?;
        let mut out = Vec::new();
        let mut r0 = 0;
        while r0 < rows {
            let r1 = (r0 + per).min(rows);
            let mut bytes = Vec::new();
            dtype.encode(&w[r0 * in_dim..r1 * in_dim], &mut bytes);
            out.push(Chunk {
                buf: self.upload("lab.w", &bytes),
                row0: r0 as u32,
                rows: (r1 - r0) as u32,
                dtype,
            });
            r0 = r1;
        }
        Ok(out)
    }

    /// Uploads `m` as the backend does (its file dtype kept, quantized
    /// blocks padded), in chunks of at most `chunk_rows` rows.
    fn matrix_chunks(
        &mut self,
        m: &WeightMatrix,
        chunk_rows: Option<usize>,
    ) -> Result<Vec<Chunk>, String> {
        let up = upload_matrix(
            &self.gpu,
            "lab.w",
            &[Part::plain(m)],
            m.cols(),
            None,
            chunk_rows,
        )?;
        for c in &up.chunks {
            self.pipes.ensure_weights(&self.gpu, c.dtype);
        }
        Ok(up.chunks)
    }

    /// `y[c, o] = W[o, :] . x[c, :] (+ b[o])` for `cols` columns: x is
    /// `[cols, in_dim]`, W `[out_dim, in_dim]` stored as `dtype` (its values
    /// rounded to that type first), split into chunks of at most `chunk_rows`
    /// rows, by `kernel` (mat-vec in groups of up to 64 columns, or 8 with
    /// one invocation per row), as the backend dispatches it.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &mut self,
        x: &[f32],
        cols: usize,
        w: &[f32],
        in_dim: usize,
        bias: Option<&[f32]>,
        dtype: WeightDtype,
        kernel: LabProduct,
        chunk_rows: Option<usize>,
    ) -> Result<Vec<f32>, String> {
        self.pipes.ensure_weights(&self.gpu, dtype);
        let chunks = self.chunks(w, in_dim, dtype, chunk_rows)?;
        self.run_linear(x, cols, &chunks, in_dim, w.len() / in_dim, bias, kernel)
    }

    /// The fused SwiGLU: `act[c, i] = silu(G[i, :] . x[c, :]) * (U[i, :] .
    /// x[c, :])` for `cols` columns, where `w` is the stacked `[G; U]`
    /// (`[2 inter, in_dim]`, one chunk) stored as `dtype` (its values
    /// rounded first), in mat-vec groups as the backend dispatches it.
    pub fn glu(
        &mut self,
        x: &[f32],
        cols: usize,
        w: &[f32],
        in_dim: usize,
        dtype: WeightDtype,
    ) -> Result<Vec<f32>, String> {
        self.pipes.ensure_weights(&self.gpu, dtype);
        let chunks = self.chunks(w, in_dim, dtype, None)?;
        self.run_glu(x, cols, &chunks, in_dim, w.len() / in_dim)
    }

    /// [`KernelLab::glu`] with the stacked weights `m` in its own dtype (any
    /// GGUF type).
    pub fn glu_matrix(
        &mut self,
        x: &[f32],
        cols: usize,
        m: &WeightMatrix,
    ) -> Result<Vec<f32>, String> {
        let chunks = self.matrix_chunks(m, None)?;
        self.run_glu(x, cols, &chunks, m.cols(), m.rows())
    }

    fn run_glu(
        &mut self,
        x: &[f32],
        cols: usize,
        chunks: &[Chunk],
        in_dim: usize,
        out_dim: usize,
    ) -> Result<Vec<f32>, String> {
        let [c] = chunks else {
            return Err(format!(
                "{} chunks: the fused SwiGLU takes one",
                chunks.len()
            ));
        };
        let inter = (out_dim / 2) as u32;
        let xb = self.upload("lab.x", bytemuck::cast_slice(x));
        let bb = self.upload("lab.b", bytemuck::cast_slice(&[0.0f32]));
        let yb = self.output("lab.act", cols * inter as usize);
        let sb = self.output("lab.split", 4);
        let cb = self.output("lab.counts", 4);
        let bg = self.bind(&self.pipes.layouts.mat, &[&xb, &c.buf, &bb, &yb, &sb, &cb]);
        let product = Product {
            k: in_dim as u32,
            rows: inter,
            row0: 0,
            cols: cols as u32,
            ldx: in_dim as u32,
            ldy: inter,
            bias: false,
            kernel: Kernel::MatVec,
            split_k: self.pipes.split_k,
            pair: Pair::Glu,
            norm_eps: None,
            accumulate: false,
        };
        let dispatches = self.product_dispatches(&product, c.dtype, &bg)?;
        let out = self.run(&dispatches, (&yb, 4 * (cols as u64) * inter as u64))?;
        Ok(f32s(&out))
    }

    /// [`KernelLab::linear`] with the weights of `m` in its own dtype (any
    /// GGUF type; quantized blocks go up as blocks and are unpacked by the
    /// kernels), uploaded as the backend uploads a model's matrices.
    pub fn linear_matrix(
        &mut self,
        x: &[f32],
        cols: usize,
        m: &WeightMatrix,
        bias: Option<&[f32]>,
        kernel: LabProduct,
        chunk_rows: Option<usize>,
    ) -> Result<Vec<f32>, String> {
        let chunks = self.matrix_chunks(m, chunk_rows)?;
        self.run_linear(x, cols, &chunks, m.cols(), m.rows(), bias, kernel)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_linear(
        &mut self,
        x: &[f32],
        cols: usize,
        chunks: &[Chunk],
        in_dim: usize,
        out_dim: usize,
        bias: Option<&[f32]>,
        kernel: LabProduct,
    ) -> Result<Vec<f32>, String> {
        let kernel = match kernel {
            LabProduct::MatVec => Kernel::MatVec,
            LabProduct::Tiled => Kernel::Tiled,
            // Coop for any rows, its tile picked as the backend picks it.
            LabProduct::Coop => {
                let choice = KernelChoice::new(self.pipes.coop, 1, self.opts.coop_wide_rows, None);
                match choice.for_rows(cols as u32) {
                    k @ Kernel::Coop(_) => k,
                    _ => return Err("no cooperative-matrix configuration on this adapter".into()),
                }
            }
        };
        let xb = self.upload("lab.x", bytemuck::cast_slice(x));
        let bb = self.upload("lab.b", bytemuck::cast_slice(bias.unwrap_or(&[0.0])));
        let yb = self.output("lab.y", cols * out_dim);
        let products: Vec<Product> = chunks
            .iter()
            .map(|c| Product {
                k: in_dim as u32,
                rows: c.rows,
                row0: c.row0,
                cols: cols as u32,
                ldx: in_dim as u32,
                ldy: out_dim as u32,
                bias: bias.is_some(),
                kernel,
                split_k: self.pipes.split_k,
                pair: Pair::None,
                norm_eps: None,
                accumulate: false,
            })
            .collect();
        // One scratch for every chunk's split-k partials: the dispatches run
        // in order, each chunk's sum before the next chunk's products.
        let split = products.iter().map(Product::split_bytes).max().unwrap_or(0);
        let sb = self.output("lab.split", (split / 4).max(4) as usize);
        // Likewise one set of counters for the folded split sums.
        let count_bytes = products.iter().map(Product::count_bytes).max().unwrap_or(0);
        let cb = self.output("lab.counts", (count_bytes / 4).max(4) as usize);
        let bgs: Vec<::wgpu::BindGroup> = chunks
            .iter()
            .map(|c| self.bind(&self.pipes.layouts.mat, &[&xb, &c.buf, &bb, &yb, &sb, &cb]))
            .collect();
        let mut dispatches = Vec::new();
        for ((c, bg), product) in chunks.iter().zip(&bgs).zip(&products) {
            dispatches.extend(self.product_dispatches(product, c.dtype, bg)?);
        }
        let out = self.run(&dispatches, (&yb, 4 * (cols * out_dim) as u64))?;
        self.counters_back_to_zero(&cb, count_bytes, "split sum")?;
        Ok(f32s(&out))
    }

    /// An error naming the first of the `bytes / 4` counters in `counts`
    /// that a folded dispatch (`what`) left nonzero: the next dispatch
    /// counts from zero.
    fn counters_back_to_zero(
        &self,
        counts: &::wgpu::Buffer,
        bytes: u64,
        what: &str,
    ) -> Result<(), String> {
        if bytes == 0 {
            return Ok(());
        }
        let left = self.run(&[], (counts, bytes))?;
        let left: &[u32] = bytemuck::cast_slice(&left);
        match left.iter().position(|&n| n != 0) {
            Some(i) => Err(format!(
                "split counter {i} left at {} after the folded {what}",
                left[i]
            )),
            None => Ok(()),
        }
    }

    /// Gathers rows `tokens` of a `[vocab, hidden]` table stored as `dtype`,
    /// split into chunks of at most `chunk_rows` rows.
    pub fn embed(
        &mut self,
        table: &[f32],
        hidden: usize,
        dtype: WeightDtype,
        tokens: &[TokenId],
        chunk_rows: Option<usize>,
    ) -> Result<Vec<f32>, String> {
        self.pipes.ensure_weights(&self.gpu, dtype);
        let chunks = self.chunks(table, hidden, dtype, chunk_rows)?;
        self.run_embed(&chunks, hidden, tokens)
    }

    /// [`KernelLab::embed`] from a table in its own dtype (see
    /// [`KernelLab::linear_matrix`]).
    pub fn embed_matrix(
        &mut self,
        table: &WeightMatrix,
        tokens: &[TokenId],
        chunk_rows: Option<usize>,
    ) -> Result<Vec<f32>, String> {
        let chunks = self.matrix_chunks(table, chunk_rows)?;
        self.run_embed(&chunks, table.cols(), tokens)
    }

    fn run_embed(
        &mut self,
        chunks: &[Chunk],
        hidden: usize,
        tokens: &[TokenId],
    ) -> Result<Vec<f32>, String> {
        let plan = self.upload("lab.plan", bytemuck::cast_slice(tokens));
        let xb = self.output("lab.x", tokens.len() * hidden);
        let t = tokens.len() as u32;
        let mut bgs = Vec::new();
        for c in chunks {
            bgs.push(self.bind(&self.pipes.layouts.embed, &[&plan, &c.buf, &xb]));
        }
        let mut dispatches = Vec::new();
        for (c, bg) in chunks.iter().zip(&bgs) {
            let pipe = self
                .pipes
                .weight(WeightKernel::Embed, c.dtype)
                .ok_or("pipeline missing")?;
            // The tokens are the whole plan here.
            dispatches.push((pipe, bg, params::embed_call(hidden as u32, t, 0, c)));
        }
        let out = self.run(&dispatches, (&xb, 4 * (tokens.len() * hidden) as u64))?;
        Ok(f32s(&out))
    }

    /// RMSNorm of the rows of `x`; with `select`, only those rows,
    /// compactly.
    pub fn rms_norm(
        &mut self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        select: Option<&[u32]>,
    ) -> Result<Vec<f32>, String> {
        let h = weight.len();
        let rows = x.len() / h;
        let out_rows = select.map_or(rows, |s| s.len());
        let plan = self.upload("lab.plan", bytemuck::cast_slice(select.unwrap_or(&[0])));
        let xb = self.upload("lab.x", bytemuck::cast_slice(x));
        let wb = self.upload("lab.w", bytemuck::cast_slice(weight));
        let yb = self.output("lab.y", out_rows * h);
        let bg = self.bind(&self.pipes.layouts.norm, &[&plan, &xb, &wb, &yb]);
        // The selected rows are the whole plan here.
        let call = params::norm_call(h as u32, eps, select.map(|_| 0), out_rows as u32);
        let d = [(&self.pipes.rms_norm, &bg, call)];
        let y = self.run(&d, (&yb, 4 * (out_rows * h) as u64))?;
        Ok(f32s(&y))
    }

    fn read(&self, buf: &::wgpu::Buffer, floats: usize) -> Result<Vec<f32>, String> {
        let out = self.run(&[], (buf, 4 * floats as u64))?;
        Ok(f32s(&out))
    }

    /// The `plan` words of a step made of `seqs` (their rows in order).
    fn plan(
        &self,
        seqs: &[LabSeq],
        theta_inv_freq: &[f64],
        limits: PlanLimits,
    ) -> Result<(Vec<u32>, plan::Pass), String> {
        let zeros: Vec<Vec<TokenId>> = seqs.iter().map(|s| vec![0; s.rows]).collect();
        let batch: Vec<SeqBatch<'_>> = seqs
            .iter()
            .zip(&zeros)
            .map(|(s, t)| SeqBatch {
                tokens: t,
                start_pos: s.start_pos,
                block_table: &s.block_table,
                want_logits: false,
                sample: None,
                keep_row: false,
                hidden: None,
            })
            .collect();
        for (i, s) in seqs.iter().enumerate() {
            let end = s.start_pos as usize + s.rows;
            if s.rows == 0 || s.block_table.len() * limits.block_size < end {
                return Err(format!("sequence {i}: empty or block table too short"));
            }
        }
        let hp = plan::build(&batch, theta_inv_freq, 1.0, &limits, &[]);
        match hp.passes.as_slice() {
            [p] => Ok((hp.words, p.clone())),
            _ => Err("case too big for one pass".into()),
        }
    }

    fn limits(shape: &HeadShape, prefill_min: usize) -> PlanLimits {
        let s = AttnShape {
            head_dim: shape.head_dim as u32,
            group: (shape.q_heads / shape.kv_heads.max(1)) as u32,
        };
        PlanLimits {
            max_rows: usize::MAX,
            max_logit_rows: usize::MAX,
            prefill_min,
            prefill_rows: s.prefill_rows() as usize,
            block_size: shape.block_size,
        }
    }

    /// RoPE on the query and key heads of fused q|k|v rows (`[rows,
    /// qkv_width]`), positions from `case.seqs`, and the write of each
    /// row's rotated K and its V into copies of the case's pools through
    /// the slots of its sequences (rope_kv.wgsl).
    pub fn rope_kv(&mut self, qkv: &[f32], case: &RopeCase<'_>) -> Result<RopeKvOut, String> {
        let (p, [planb, kb, vb]) = self.rope_buffers(case)?;
        let qb = self.upload("lab.qkv", bytemuck::cast_slice(qkv));
        let none = self.upload("lab.no_norm", &[0u8; 4]);
        let bg = self.bind(&self.pipes.layouts.rope_kv, &[&planb, &qb, &kb, &vb, &none]);
        let call = attn::rope_kv_call(&Self::attn_model(case.shape), &p);
        let d = [(&self.pipes.rope_kv, &bg, call)];
        let q = self.run(&d, (&qb, 4 * qkv.len() as u64))?;
        self.rope_out(&q, &kb, &vb, case)
    }

    /// A RoPE case's pass and, on the device, its `plan` words and copies
    /// of its K and V pools.
    fn rope_buffers(
        &self,
        case: &RopeCase<'_>,
    ) -> Result<(plan::Pass, [::wgpu::Buffer; 3]), String> {
        let (words, p) = self.plan(case.seqs, case.inv_freq, Self::limits(case.shape, 1))?;
        Ok((
            p,
            [
                self.upload("lab.plan", bytemuck::cast_slice(&words)),
                self.upload("lab.k", bytemuck::cast_slice(case.k_pool)),
                self.upload("lab.v", bytemuck::cast_slice(case.v_pool)),
            ],
        ))
    }

    /// What a RoPE case leaves: the q|k|v rows read back (`qkv`), and the
    /// pools `kb` and `vb`.
    fn rope_out(
        &self,
        qkv: &[u8],
        kb: &::wgpu::Buffer,
        vb: &::wgpu::Buffer,
        case: &RopeCase<'_>,
    ) -> Result<RopeKvOut, String> {
        Ok(RopeKvOut {
            qkv: f32s(qkv),
            k: self.read(kb, case.k_pool.len())?,
            v: self.read(vb, case.v_pool.len())?,
        })
    }

    /// The q|k|v product with RoPE and the K/V write fused in (mat_vec.wgsl's
    /// RoPE variant, as decode passes take it): `y = W x (+ b)` for the rows
    /// of `seqs` (x is `[rows, in_dim]`, W the stacked `[qkv_width, in_dim]`
    /// stored as `dtype`, its values rounded first, one chunk), then what
    /// [`KernelLab::rope_kv`] does to y and copies of the pools.
    pub fn qkv_rope(
        &mut self,
        x: &[f32],
        w: &[f32],
        in_dim: usize,
        bias: Option<&[f32]>,
        dtype: WeightDtype,
        case: &RopeCase<'_>,
    ) -> Result<RopeKvOut, String> {
        self.pipes.ensure_weights(&self.gpu, dtype);
        let chunks = self.chunks(w, in_dim, dtype, None)?;
        let [c] = chunks.as_slice() else {
            return Err(format!(
                "{} chunks: the RoPE variant takes one",
                chunks.len()
            ));
        };
        let width = case.shape.qkv_width();
        if w.len() != width * in_dim {
            return Err(format!("W has {} values, not {width} x {in_dim}", w.len()));
        }
        let (p, [planb, kb, vb]) = self.rope_buffers(case)?;
        let rows = p.rows as usize;
        let xb = self.upload("lab.x", bytemuck::cast_slice(x));
        let bb = self.upload("lab.b", bytemuck::cast_slice(bias.unwrap_or(&[0.0])));
        let yb = self.output("lab.qkv", rows * width);
        let bg = self.gpu.storage_bind_group_at(
            &self.pipes.layouts.mat_rope,
            "lab",
            &[
                (0, &xb),
                (1, &c.buf),
                (2, &bb),
                (3, &yb),
                (6, &planb),
                (7, &kb),
                (8, &vb),
            ],
        );
        let product = Product {
            k: in_dim as u32,
            rows: width as u32,
            row0: 0,
            cols: p.rows,
            ldx: in_dim as u32,
            ldy: width as u32,
            bias: bias.is_some(),
            kernel: Kernel::MatVec,
            split_k: self.pipes.split_k,
            pair: Pair::Rope(attn::rope_fuse(&Self::attn_model(case.shape), &p)),
            norm_eps: None,
            accumulate: false,
        };
        let dispatches = self.product_dispatches(&product, c.dtype, &bg)?;
        let q = self.run(&dispatches, (&yb, 4 * (rows * width) as u64))?;
        self.rope_out(&q, &kb, &vb, case)
    }

    /// Whether decode attention folds its merge into the last split here
    /// when a policy asks: where the device has `@coherent` storage
    /// buffers (every Vulkan adapter).
    pub fn folds_splits(&self) -> bool {
        self.gpu.coherent
    }

    fn attn_model(shape: &HeadShape) -> AttnModel {
        AttnModel {
            shape: AttnShape {
                head_dim: shape.head_dim as u32,
                group: (shape.q_heads / shape.kv_heads.max(1)) as u32,
            },
            q_heads: shape.q_heads as u32,
            kv_heads: shape.kv_heads as u32,
            stride: shape.qkv_width() as u32,
            bs: shape.block_size as u32,
            qk_norm_eps: None,
        }
    }

    /// How [`KernelLab::attention`] with [`AttnKernel::Decode`] under
    /// `policy` splits the contexts of `seqs` (every row decoded): splits
    /// per row and positions per split.
    pub fn decode_splits(
        &self,
        shape: &HeadShape,
        seqs: &[LabSeq],
        policy: SplitPolicy,
    ) -> Result<(u32, u32), String> {
        let (_, p) = self.plan(seqs, &[], Self::limits(shape, usize::MAX))?;
        let model = Self::attn_model(shape);
        let c = attn::decode_calls(&model, &p, policy, self.gpu.max_binding, self.gpu.coherent);
        Ok((c.n_splits, c.split_len))
    }

    /// Causal attention of every row of `seqs` over its own sequence's cached
    /// positions `0..=pos`, reading the queries from fused q|k|v rows and K/V
    /// from the pools (`[block][kv_head][slot][head_dim]`). Returns
    /// `[rows, q_heads * head_dim]`.
    pub fn attention(
        &mut self,
        qkv: &[f32],
        shape: &HeadShape,
        seqs: &[LabSeq],
        k_pool: &[f32],
        v_pool: &[f32],
        kernel: AttnKernel,
    ) -> Result<Vec<f32>, String> {
        let model = Self::attn_model(shape);
        self.pipes.ensure_attn(&self.gpu, model.shape);
        let prefill_min = match kernel {
            AttnKernel::Prefill => 1,
            AttnKernel::Decode(_) => usize::MAX,
        };
        let (words, p) = self.plan(seqs, &[], Self::limits(shape, prefill_min))?;
        let planb = self.upload("lab.plan", bytemuck::cast_slice(&words));
        let qb = self.upload("lab.qkv", bytemuck::cast_slice(qkv));
        let kb = self.upload("lab.k", bytemuck::cast_slice(k_pool));
        let vb = self.upload("lab.v", bytemuck::cast_slice(v_pool));
        let width = shape.q_heads * shape.head_dim;
        let ab = self.output("lab.att", p.rows as usize * width);
        let (decode, prefill) = self.pipes.attn(model.shape).ok_or("pipeline missing")?;
        let bytes = 4 * (p.rows as usize * width) as u64;
        match kernel {
            AttnKernel::Prefill => {
                let bg = self.bind(&self.pipes.layouts.prefill, &[&planb, &qb, &kb, &vb, &ab]);
                let d = [(prefill, &bg, attn::prefill_call(&model, &p))];
                let out = self.run(&d, (&ab, bytes))?;
                Ok(f32s(&out))
            }
            AttnKernel::Decode(policy) => {
                let c =
                    attn::decode_calls(&model, &p, policy, self.gpu.max_binding, self.gpu.coherent);
                let part = self.output("lab.part", (c.part_bytes / 4) as usize);
                let counts = self.output("lab.counts", (c.count_bytes / 4) as usize);
                let bg = self.bind(
                    &self.pipes.layouts.decode,
                    &[&planb, &qb, &kb, &vb, &ab, &part, &counts],
                );
                let mbg = self.bind(&self.pipes.layouts.merge, &[&planb, &part, &ab]);
                let mut d = vec![(decode, &bg, c.decode)];
                if let Some(m) = c.merge {
                    d.push((&self.pipes.attn_merge, &mbg, m));
                }
                let out = self.run(&d, (&ab, bytes))?;
                self.counters_back_to_zero(&counts, c.count_bytes, "merge")?;
                Ok(f32s(&out))
            }
        }
    }

    /// SwiGLU: rows of `gu` are gate (`inter` values) then up; returns
    /// `[rows, inter]` of `silu(gate) * up`.
    pub fn silu_mul(&mut self, gu: &[f32], inter: usize) -> Result<Vec<f32>, String> {
        let rows = gu.len() / (2 * inter);
        let gb = self.upload("lab.gu", bytemuck::cast_slice(gu));
        let ab = self.output("lab.act", rows * inter);
        let bg = self.bind(&self.pipes.layouts.silu, &[&gb, &ab]);
        let d = [(
            &self.pipes.silu_mul,
            &bg,
            params::silu_call(rows as u32, inter as u32),
        )];
        let out = self.run(&d, (&ab, 4 * (rows * inter) as u64))?;
        Ok(f32s(&out))
    }

    /// Argmax of each `vocab`-wide row (ties to the lowest id, NaN as -inf):
    /// sample.wgsl with greedy parameters.
    pub fn argmax(&mut self, logits: &[f32], vocab: usize) -> Result<Vec<u32>, String> {
        let rows = logits.len() / vocab.max(1);
        let greedy = LabSample {
            params: SamplingParams::greedy(),
            position: 0,
            history: Vec::new(),
            logprobs: None,
        };
        let specs = vec![greedy; rows];
        Ok(self
            .sample(logits, vocab, &specs, rows.max(1))?
            .into_iter()
            .map(|s| s.0)
            .collect())
    }

    /// The sampling kernel's workgroup size for rows of `vocab` (what the
    /// backend would use with the lab's options).
    pub fn sample_workgroup(&self, vocab: usize) -> u32 {
        self.opts.sample_wg(self.cpu_adapter, vocab as u32)
    }

    /// sample.wgsl on `vocab`-wide rows, row i with `specs[i]`, dispatched
    /// `per_dispatch` rows at a time (as the backend's passes do, each with
    /// its own rows from offset 0 of its logits buffer), all in one
    /// submission: each row's token and, when asked, its logprobs. An error
    /// for a row the backend would not sample on the device (more logprobs
    /// than it computes there).
    pub fn sample(
        &mut self,
        logits: &[f32],
        vocab: usize,
        specs: &[LabSample],
        per_dispatch: usize,
    ) -> Result<Vec<(TokenId, Option<TokenLogprobs>)>, String> {
        if vocab == 0 || logits.len() != vocab * specs.len() {
            return Err("logits must hold one vocab-wide row per spec".into());
        }
        let specs_ref: Vec<Option<SampleSpec<'_>>> = specs
            .iter()
            .map(|l| {
                Some(SampleSpec {
                    params: &l.params,
                    position: l.position,
                    history: &l.history,
                    logprobs: l.logprobs,
                    allowed: None,
                })
            })
            .collect();
        let rows = super::sample::encode(&specs_ref, vocab as u32, &mut Default::default());
        if !rows.rows.iter().all(|r| r.0) {
            return Err("a row asks for more logprobs than the device computes".into());
        }
        let wg = self.sample_workgroup(vocab);
        self.pipes.ensure_sample(&self.gpu, wg);
        let pipe = self.pipes.sample(wg).ok_or("pipeline missing")?;
        let sb = self.upload("lab.sample", bytemuck::cast_slice(&rows.words));
        let ob = self.output("lab.sampled", rows.out_words as usize);
        let per = per_dispatch.max(1);
        let chunks: Vec<(usize, ::wgpu::BindGroup)> = logits
            .chunks(per * vocab)
            .enumerate()
            .map(|(d, c)| {
                let lb = self.upload("lab.logits", bytemuck::cast_slice(c));
                (
                    d * per,
                    self.bind(&self.pipes.layouts.sample, &[&lb, &sb, &ob]),
                )
            })
            .collect();
        let dispatches: Vec<_> = chunks
            .iter()
            .map(|(first, bg)| {
                let n = per.min(specs.len() - first) as u32;
                (
                    pipe,
                    bg,
                    params::sample_call(n, vocab as u32, *first as u32),
                )
            })
            .collect();
        let out = self.run(&dispatches, (&ob, 4 * rows.out_words as u64))?;
        let words: Vec<u32> = out
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(super::sample::decode(&words, &rows)
            .into_iter()
            .map(|s| s.map_or((0, None), |s| (s.token, s.logprobs)))
            .collect())
    }
}
