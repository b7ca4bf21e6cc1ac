//! Weights on the device: uploaded once, in the file's dtype (f16 and
//! bf16 packed two to a word, GGUF blocks padded to whole words; see
//! [`WeightDtype::pad_blocks`]), each matrix split by rows into chunks that
//! fit one storage binding. No f32 copy of a matrix is made, on the host or
//! the device: rows go up one at a time. A stack of matrices of different
//! dtypes (a Q4_K_M file's q/k in Q4_K and v in Q6_K) becomes chunks of
//! each dtype, one dispatch each. A GGUF llama's q and k rows are put back
//! in Hugging Face's order on the way, for the half-split RoPE these
//! kernels apply.

use super::context::Gpu;
use super::pipelines::WeightDtype;
use crate::kv::KvGeometry;
use crate::model::Model;
use crate::rope::{interleaved_source_row, RopeLayout};
use crate::tensor::WeightMatrix;
use crate::weights::Linear;

/// Rows `row0 .. row0 + rows` of a matrix, in one buffer, stored as `dtype`.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) buf: ::wgpu::Buffer,
    pub(crate) row0: u32,
    pub(crate) rows: u32,
    pub(crate) dtype: WeightDtype,
}

/// A row-major `[out_dim, in_dim]` matrix (plus optional bias) on the device.
#[derive(Debug)]
pub(crate) struct Matrix {
    pub(crate) chunks: Vec<Chunk>,
    pub(crate) in_dim: usize,
    pub(crate) bias: Option<::wgpu::Buffer>,
}

impl Matrix {
    /// Whether a product through `other` is planned as one through this
    /// matrix: the same chunks (rows and storage types) over as many
    /// inputs, with a bias or without alike.
    pub(crate) fn plans_like(&self, other: &Matrix) -> bool {
        self.in_dim == other.in_dim
            && self.bias.is_some() == other.bias.is_some()
            && self.chunks.len() == other.chunks.len()
            && self
                .chunks
                .iter()
                .zip(&other.chunks)
                .all(|(a, b)| (a.row0, a.rows, a.dtype) == (b.row0, b.rows, b.dtype))
    }

    /// Bytes the matrix takes on the device (its bias aside).
    pub(crate) fn bytes(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| (c.rows as usize * c.dtype.row_bytes(self.in_dim)) as u64)
            .sum()
    }
}

/// One matrix of a stacked upload.
#[derive(Clone, Copy)]
pub(crate) struct Part<'a> {
    /// The matrix.
    pub(crate) m: &'a WeightMatrix,
    /// `Some(head_dim)`: rows are interleaved heads, uploaded in HF order.
    pub(crate) unpermute: Option<usize>,
}

impl<'a> Part<'a> {
    pub(crate) fn plain(m: &'a WeightMatrix) -> Self {
        Part { m, unpermute: None }
    }
}

/// Rows per chunk so one chunk fits `max_binding` bytes, and at most
/// `max_rows` when given (for the 2-byte types also an even number of rows
/// of an odd-width matrix, so packed pairs never straddle chunks).
pub(crate) fn rows_per_chunk(
    max_binding: u64,
    in_dim: usize,
    dtype: WeightDtype,
    max_rows: Option<usize>,
) -> Result<usize, String> {
    let row_bytes = dtype.row_bytes(in_dim) as u64;
    let mut rows = (max_binding / row_bytes.max(1)) as usize;
    if let Some(cap) = max_rows {
        rows = rows.min(cap.max(1));
    }
    if dtype.packs_pairs() && in_dim % 2 == 1 && rows % 2 == 1 && rows > 1 {
        rows -= 1;
    }
    if rows == 0 {
        return Err(format!(
            "a weight row of {in_dim} values ({row_bytes} bytes) exceeds the largest storage binding ({max_binding} bytes)"
        ));
    }
    Ok(rows)
}

/// Uploads the matrix made of `parts` stacked by rows (each `[rows, in_dim]`),
/// each part in the device type of its file dtype, in chunks of at most
/// `max_binding` bytes (and `max_rows` rows, when given). Consecutive parts
/// of one dtype share chunks.
pub(crate) fn upload_matrix(
    gpu: &Gpu,
    label: &str,
    parts: &[Part<'_>],
    in_dim: usize,
    bias: Option<Vec<f32>>,
    max_rows: Option<usize>,
) -> Result<Matrix, String> {
    if let Some(p) = parts.iter().find(|p| p.m.cols() != in_dim) {
        return Err(format!(
            "{label}: a part has {} columns, not {in_dim}",
            p.m.cols()
        ));
    }
    let dtype_of = |p: &Part<'_>| WeightDtype::of_file(p.m.dtype(), gpu.f16_native);
    let mut chunks = Vec::new();
    let mut bytes = Vec::new();
    let mut vals = vec![0.0f32; in_dim];
    // Runs of consecutive parts with one device dtype.
    let mut first = 0;
    let mut run_row0 = 0;
    while first < parts.len() {
        let dtype = dtype_of(&parts[first]);
        let mut end = first + 1;
        while end < parts.len() && dtype_of(&parts[end]) == dtype {
            end += 1;
        }
        let run = &parts[first..end];
        let run_rows: usize = run.iter().map(|p| p.m.rows()).sum();
        let per = rows_per_chunk(gpu.max_binding, in_dim, dtype, max_rows)?;
        // Row `r` of the run: which part, and which of its rows.
        let locate = |r: usize| -> (Part<'_>, usize) {
            let mut r = r;
            for p in run {
                if r < p.m.rows() {
                    let src = p
                        .unpermute
                        .map_or(r, |hd| interleaved_source_row_inverse(r, hd));
                    return (*p, src);
                }
                r -= p.m.rows();
            }
            unreachable!("row below the run's height")
        };
        let mut r0 = 0;
        while r0 < run_rows {
            let r1 = (r0 + per).min(run_rows);
            bytes.clear();
            for r in r0..r1 {
                let (p, src) = locate(r);
                if dtype.is_quantized() {
                    dtype.pad_blocks(p.m.row(src), &mut bytes);
                } else {
                    p.m.dequantize_row(src, &mut vals);
                    dtype.encode(&vals, &mut bytes);
                }
            }
            let (a, b) = (run_row0 + r0, run_row0 + r1);
            chunks.push(Chunk {
                buf: gpu.buffer_init(&format!("{label}[{a}..{b}]"), &bytes),
                row0: a as u32,
                rows: (r1 - r0) as u32,
                dtype,
            });
            r0 = r1;
        }
        run_row0 += run_rows;
        first = end;
    }
    let bias = bias.map(|b| gpu.buffer_init(&format!("{label}.bias"), bytemuck::cast_slice(&b)));
    Ok(Matrix {
        chunks,
        in_dim,
        bias,
    })
}

/// The row of an interleaved matrix that holds HF row `r`: the inverse of
/// [`interleaved_source_row`].
fn interleaved_source_row_inverse(r: usize, head_dim: usize) -> usize {
    let (head, i) = (r / head_dim, r % head_dim);
    let half = head_dim / 2;
    let row = head * head_dim + 2 * (i % half) + i / half;
    debug_assert_eq!(interleaved_source_row(row, head_dim), r);
    row
}

fn upload_linear(gpu: &Gpu, label: &str, l: &Linear) -> Result<Matrix, String> {
    upload_matrix(
        gpu,
        label,
        &[Part::plain(&l.w)],
        l.in_dim(),
        l.b.clone(),
        None,
    )
}

/// One decoder layer on the device, with its share of the KV pool.
#[derive(Debug)]
pub(crate) struct LayerGpu {
    pub(crate) input_norm: ::wgpu::Buffer,
    pub(crate) post_norm: ::wgpu::Buffer,
    /// q, k and v projections stacked: `[(heads + 2 kv_heads) * head_dim, hidden]`.
    pub(crate) qkv: Matrix,
    pub(crate) o: Matrix,
    /// gate and up stacked: `[2 * intermediate, hidden]`.
    pub(crate) gate_up: Matrix,
    pub(crate) down: Matrix,
    /// This layer's K pool, `[block][kv_head][slot][head_dim]` f32.
    pub(crate) k: ::wgpu::Buffer,
    /// This layer's V pool.
    pub(crate) v: ::wgpu::Buffer,
    /// The per-head query norm's weights then the key norm's (`2 *
    /// head_dim` f32, Qwen3), in the half-split order of the uploaded rows.
    pub(crate) qk_norm: Option<::wgpu::Buffer>,
}

/// The whole model on the device.
#[derive(Debug)]
pub(crate) struct ModelGpu {
    /// Embedding `[vocab, hidden]`, also the LM head when tied.
    pub(crate) embed: Matrix,
    /// Untied LM head.
    pub(crate) head: Option<Matrix>,
    pub(crate) final_norm: ::wgpu::Buffer,
    pub(crate) layers: Vec<LayerGpu>,
    /// Bytes of one layer's K (or V) pool.
    pub(crate) kv_bytes: u64,
}

impl LayerGpu {
    /// Whether `other`'s dispatches are this layer's on other bind groups
    /// (its four matrices planned alike: [`Matrix::plans_like`]).
    pub(crate) fn plans_like(&self, other: &LayerGpu) -> bool {
        self.qkv.plans_like(&other.qkv)
            && self.o.plans_like(&other.o)
            && self.gate_up.plans_like(&other.gate_up)
            && self.down.plans_like(&other.down)
    }
}

impl ModelGpu {
    /// Uploads `model` and allocates a zeroed KV pool of shape `geo`.
    pub(crate) fn upload(
        gpu: &Gpu,
        model: &Model,
        geo: KvGeometry,
        progress: &Option<crate::LoadProgress>,
    ) -> Result<ModelGpu, String> {
        let c = model.config();
        let w = model.weights();
        let unpermute = (w.rope == RopeLayout::Interleaved).then_some(c.head_dim);
        let kv_bytes = (geo.block_len() as u64)
            .checked_mul(geo.num_blocks as u64)
            .and_then(|n| n.checked_mul(4))
            .ok_or("KV pool size overflows")?;
        if kv_bytes > gpu.max_binding {
            return Err(format!(
                "a KV pool of {} blocks needs {} MiB per layer for K (and as much for V), \
                 above the device's largest storage binding ({} MiB); use fewer KV blocks",
                geo.num_blocks,
                kv_bytes >> 20,
                gpu.max_binding >> 20
            ));
        }
        let embed = upload_matrix(
            gpu,
            "embed",
            &[Part::plain(&w.embed)],
            c.hidden_size,
            None,
            None,
        )?;
        let head = match &w.lm_head {
            Some(l) => Some(upload_linear(gpu, "lm_head", l)?),
            None => None,
        };
        let f32_buf = |label: &str, v: &[f32]| gpu.buffer_init(label, bytemuck::cast_slice(v));
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            crate::progress::report(
                progress,
                i as f32 / w.layers.len() as f32,
                &format!("uploading layer {} of {} to the GPU", i + 1, w.layers.len()),
            );
            let bias = if l.q.b.is_some() || l.k.b.is_some() || l.v.b.is_some() {
                let mut b = Vec::with_capacity(l.q.out_dim() + l.k.out_dim() + l.v.out_dim());
                for (lin, permuted) in [(&l.q, true), (&l.k, true), (&l.v, false)] {
                    match (&lin.b, unpermute) {
                        (Some(v), Some(hd)) if permuted => {
                            b.extend((0..v.len()).map(|r| v[interleaved_source_row_inverse(r, hd)]))
                        }
                        (Some(v), _) => b.extend_from_slice(v),
                        (None, _) => b.resize(b.len() + lin.out_dim(), 0.0),
                    }
                }
                Some(b)
            } else {
                None
            };
            let qkv = upload_matrix(
                gpu,
                &format!("layer{i}.qkv"),
                &[
                    Part {
                        m: &l.q.w,
                        unpermute,
                    },
                    Part {
                        m: &l.k.w,
                        unpermute,
                    },
                    Part::plain(&l.v.w),
                ],
                c.hidden_size,
                bias,
                None,
            )?;
            let gate_up = upload_matrix(
                gpu,
                &format!("layer{i}.gate_up"),
                &[Part::plain(&l.gate.w), Part::plain(&l.up.w)],
                c.hidden_size,
                None,
                None,
            )?;
            let kv = |name: &str| {
                gpu.buffer(
                    &format!("layer{i}.{name}"),
                    kv_bytes,
                    ::wgpu::BufferUsages::STORAGE
                        | ::wgpu::BufferUsages::COPY_SRC
                        | ::wgpu::BufferUsages::COPY_DST,
                )
            };
            layers.push(LayerGpu {
                input_norm: f32_buf(&format!("layer{i}.input_norm"), &l.input_norm),
                post_norm: f32_buf(&format!("layer{i}.post_norm"), &l.post_norm),
                qkv,
                o: upload_linear(gpu, &format!("layer{i}.o"), &l.o)?,
                gate_up,
                down: upload_linear(gpu, &format!("layer{i}.down"), &l.down)?,
                k: kv("k"),
                v: kv("v"),
                qk_norm: l.qk_norm.as_ref().map(|qk| {
                    let hd = c.head_dim;
                    // Each weight goes where its element of the head goes.
                    let order = |w: &[f32]| -> Vec<f32> {
                        match unpermute {
                            Some(_) => (0..hd)
                                .map(|r| w[interleaved_source_row_inverse(r, hd)])
                                .collect(),
                            None => w.to_vec(),
                        }
                    };
                    let mut both = order(&qk.q);
                    both.extend(order(&qk.k));
                    f32_buf(&format!("layer{i}.qk_norm"), &both)
                }),
            });
            // Let the queue's staging memory go as we go: big models would
            // otherwise hold a second copy of every weight until the end.
            gpu.queue.submit([]);
            let _ = gpu.device.poll(::wgpu::PollType::Poll);
        }
        Ok(ModelGpu {
            embed,
            head,
            final_norm: f32_buf("final_norm", &w.norm),
            layers,
            kv_bytes,
        })
    }

    /// The LM head: the untied head, or the embedding.
    pub(crate) fn lm_head(&self) -> &Matrix {
        self.head.as_ref().unwrap_or(&self.embed)
    }

    /// Every storage dtype the model's matrices use.
    pub(crate) fn dtypes(&self) -> Vec<WeightDtype> {
        let mut v = Vec::new();
        let mut mats = vec![&self.embed];
        mats.extend(&self.head);
        for l in &self.layers {
            mats.extend([&l.qkv, &l.o, &l.gate_up, &l.down]);
        }
        for m in mats {
            for c in &m.chunks {
                if !v.contains(&c.dtype) {
                    v.push(c.dtype);
                }
            }
        }
        v
    }

    /// Bytes of weights a forward pass reads once (every matrix; the
    /// embedding counts only when it is also the head).
    pub(crate) fn weight_bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes())
            .sum();
        layers + self.lm_head().bytes()
    }
}
