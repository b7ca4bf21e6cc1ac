//! Weights on the device: uploaded once, in the file's dtype, each matrix
//! split by rows into chunks that fit one storage binding.

use super::context::Gpu;
use super::pipelines::WeightDtype;
use crate::kv::KvGeometry;
use crate::model::Model;
use crate::weights::Linear;

/// Rows `row0 .. row0 + rows` of a matrix, in one buffer.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) buf: ::wgpu::Buffer,
    pub(crate) row0: u32,
    pub(crate) rows: u32,
}

/// A row-major `[out_dim, in_dim]` matrix (plus optional bias) on the device.
#[derive(Debug)]
pub(crate) struct Matrix {
    pub(crate) chunks: Vec<Chunk>,
    pub(crate) dtype: WeightDtype,
    pub(crate) in_dim: usize,
    pub(crate) out_dim: usize,
    pub(crate) bias: Option<::wgpu::Buffer>,
}

/// The storage type for weights of a file with `file_dtype`.
pub(crate) fn device_dtype(gpu: &Gpu, file_dtype: &str) -> WeightDtype {
    match file_dtype {
        "f16" if gpu.f16_native => WeightDtype::F16Native,
        "f16" => WeightDtype::F16,
        "bf16" => WeightDtype::Bf16,
        _ => WeightDtype::F32,
    }
}

/// Rows per chunk so one chunk fits `max_binding` bytes (for the 2-byte
/// types also an even number of values, so packed pairs never straddle).
pub(crate) fn rows_per_chunk(
    max_binding: u64,
    in_dim: usize,
    dtype: WeightDtype,
) -> Result<usize, String> {
    let row_bytes = (in_dim * dtype.bytes()) as u64;
    let mut rows = (max_binding / row_bytes.max(1)) as usize;
    if dtype.bytes() == 2 && in_dim % 2 == 1 && rows % 2 == 1 {
        rows -= 1;
    }
    if rows == 0 {
        return Err(format!(
            "a weight row of {in_dim} values ({row_bytes} bytes) exceeds the largest storage binding ({max_binding} bytes)"
        ));
    }
    Ok(rows)
}

/// Uploads the matrix made of `parts` stacked by rows (each row-major with
/// `in_dim` columns), stored as `want` where every value survives that
/// (else f32), in chunks of at most `max_binding` bytes.
pub(crate) fn upload_matrix(
    gpu: &Gpu,
    label: &str,
    parts: &[&[f32]],
    in_dim: usize,
    want: WeightDtype,
    bias: Option<Vec<f32>>,
) -> Result<Matrix, String> {
    let out_dim: usize = parts.iter().map(|p| p.len() / in_dim).sum();
    let dtype = if parts.iter().all(|p| want.exact(p)) {
        want
    } else {
        WeightDtype::F32
    };
    let per = rows_per_chunk(gpu.max_binding, in_dim, dtype)?;
    let row = |r: usize| -> &[f32] {
        let mut r = r;
        for p in parts {
            let n = p.len() / in_dim;
            if r < n {
                return &p[r * in_dim..(r + 1) * in_dim];
            }
            r -= n;
        }
        &[]
    };
    let mut chunks = Vec::new();
    let mut bytes = Vec::new();
    let mut r0 = 0;
    while r0 < out_dim {
        let r1 = (r0 + per).min(out_dim);
        bytes.clear();
        for r in r0..r1 {
            dtype.encode(row(r), &mut bytes);
        }
        chunks.push(Chunk {
            buf: gpu.buffer_init(&format!("{label}[{r0}..{r1}]"), &bytes),
            row0: r0 as u32,
            rows: (r1 - r0) as u32,
        });
        r0 = r1;
    }
    let bias = bias.map(|b| gpu.buffer_init(&format!("{label}.bias"), bytemuck::cast_slice(&b)));
    Ok(Matrix {
        chunks,
        dtype,
        in_dim,
        out_dim,
        bias,
    })
}

fn upload_linear(gpu: &Gpu, label: &str, l: &Linear, want: WeightDtype) -> Result<Matrix, String> {
    upload_matrix(gpu, label, &[&l.w], l.in_dim, want, l.b.clone())
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

impl ModelGpu {
    /// Uploads `model` and allocates a zeroed KV pool of shape `geo`.
    pub(crate) fn upload(gpu: &Gpu, model: &Model, geo: KvGeometry) -> Result<ModelGpu, String> {
        let c = model.config();
        let w = model.weights();
        let want = device_dtype(gpu, &w.dtype);
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
        let embed = upload_matrix(gpu, "embed", &[&w.embed], c.hidden_size, want, None)?;
        let head = match &w.lm_head {
            Some(l) => Some(upload_linear(gpu, "lm_head", l, want)?),
            None => None,
        };
        let f32_buf = |label: &str, v: &[f32]| gpu.buffer_init(label, bytemuck::cast_slice(v));
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            let bias = if l.q.b.is_some() || l.k.b.is_some() || l.v.b.is_some() {
                let mut b = Vec::with_capacity(l.q.out_dim + l.k.out_dim + l.v.out_dim);
                for lin in [&l.q, &l.k, &l.v] {
                    match &lin.b {
                        Some(v) => b.extend_from_slice(v),
                        None => b.resize(b.len() + lin.out_dim, 0.0),
                    }
                }
                Some(b)
            } else {
                None
            };
            let qkv = upload_matrix(
                gpu,
                &format!("layer{i}.qkv"),
                &[&l.q.w, &l.k.w, &l.v.w],
                c.hidden_size,
                want,
                bias,
            )?;
            let gate_up = upload_matrix(
                gpu,
                &format!("layer{i}.gate_up"),
                &[&l.gate.w, &l.up.w],
                c.hidden_size,
                want,
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
                o: upload_linear(gpu, &format!("layer{i}.o"), &l.o, want)?,
                gate_up,
                down: upload_linear(gpu, &format!("layer{i}.down"), &l.down, want)?,
                k: kv("k"),
                v: kv("v"),
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
        let mut v = vec![self.embed.dtype];
        let mut add = |d: WeightDtype| {
            if !v.contains(&d) {
                v.push(d);
            }
        };
        if let Some(h) = &self.head {
            add(h.dtype);
        }
        for l in &self.layers {
            for m in [&l.qkv, &l.o, &l.gate_up, &l.down] {
                add(m.dtype);
            }
        }
        v
    }

    /// Bytes of weights a forward pass reads once (every matrix; the
    /// embedding counts only when it is also the head).
    pub(crate) fn weight_bytes(&self) -> u64 {
        let m = |m: &Matrix| (m.in_dim * m.out_dim * m.dtype.bytes()) as u64;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| m(&l.qkv) + m(&l.o) + m(&l.gate_up) + m(&l.down))
            .sum();
        layers + m(self.lm_head())
    }
}
