//! [`Weights`] from a memory-mapped GGUF file: every matrix a view of the
//! file's bytes in its own dtype (llama.cpp's tensor names and `[in, out]`
//! dimension order mapped to the `[out, in]` rows the backends read), the
//! small norm vectors widened to f32.

use std::path::Path;

use tokenwire_gguf::{GgmlType, GgufFile};

use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::rope::RopeLayout;
use crate::tensor::{SharedMap, WeightMatrix};
use crate::weights::{LayerWeights, Linear, QkNorm, Weights};

impl Weights {
    /// The weights `cfg` describes, from the GGUF file at `path` (parsed as
    /// `file` from the mapped bytes `map`) whose architecture is `arch`.
    pub fn from_gguf(
        path: &Path,
        map: &SharedMap,
        file: &GgufFile,
        cfg: &ModelConfig,
        arch: &str,
    ) -> Result<Weights, LoadError> {
        let h = cfg.hidden_size;
        let q_out = cfg.num_heads * cfg.head_dim;
        let kv_out = cfg.num_kv_heads * cfg.head_dim;
        let i = cfg.intermediate_size;
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<WeightMatrix, LoadError> {
            let t = file.tensor(name).ok_or_else(|| LoadError::MissingTensor {
                path: path.to_path_buf(),
                name: name.to_owned(),
            })?;
            // ggml lists the fastest-varying dimension first: [in, out].
            let want = [cols as u64, rows as u64];
            let dims_ok = t.dims == want || (rows == 1 && t.dims == [cols as u64]);
            if !dims_ok {
                return Err(LoadError::bad_tensor(
                    path,
                    name,
                    format!(
                        "shape {:?} (ggml order), the architecture needs {want:?}",
                        t.dims
                    ),
                ));
            }
            let start = usize::try_from(t.offset)
                .map_err(|_| LoadError::bad_tensor(path, name, "offset beyond memory"))?;
            WeightMatrix::mapped(t.dtype, rows, cols, map, start)
                .map_err(|msg| LoadError::bad_tensor(path, name, msg))
        };
        let vector = |name: &str, n: usize| -> Result<Vec<f32>, LoadError> {
            let m = matrix(name, 1, n)?;
            if m.dtype().block_len() != 1 {
                return Err(LoadError::bad_tensor(
                    path,
                    name,
                    format!(
                        "a {} vector (norms and biases are F32, F16 or BF16)",
                        m.dtype()
                    ),
                ));
            }
            Ok(m.to_f32_vec())
        };
        let optional_vector = |name: &str, n: usize| -> Result<Option<Vec<f32>>, LoadError> {
            match file.tensor(name) {
                Some(_) => vector(name, n).map(Some),
                None => Ok(None),
            }
        };
        let embed = matrix("token_embd.weight", cfg.vocab_size, h)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("blk.{l}");
            let lin = |name: &str, rows: usize, cols: usize| -> Result<Linear, LoadError> {
                Ok(Linear {
                    w: matrix(&format!("{p}.{name}.weight"), rows, cols)?,
                    b: optional_vector(&format!("{p}.{name}.bias"), rows)?,
                })
            };
            // A stacked matrix (Phi-3's `attn_qkv`, and its `ffn_up` holding
            // gate then up) split into parts of `parts` rows each.
            let split = |name: &str, parts: &[usize]| -> Result<Vec<Linear>, LoadError> {
                let whole = lin(name, parts.iter().sum(), h)?;
                let full = format!("{p}.{name}.weight");
                let mut at = 0;
                let mut out = Vec::with_capacity(parts.len());
                for &rows in parts {
                    out.push(Linear {
                        w: whole
                            .w
                            .row_range(at, rows)
                            .map_err(|m| LoadError::bad_tensor(path, &full, m))?,
                        b: whole.b.as_ref().map(|b| b[at..at + rows].to_vec()),
                    });
                    at += rows;
                }
                Ok(out)
            };
            let (q, k, v) = if file.tensor(&format!("{p}.attn_qkv.weight")).is_some() {
                let mut qkv = split("attn_qkv", &[q_out, kv_out, kv_out])?.into_iter();
                let mut next = || qkv.next().expect("three parts");
                (next(), next(), next())
            } else {
                (
                    lin("attn_q", q_out, h)?,
                    lin("attn_k", kv_out, h)?,
                    lin("attn_v", kv_out, h)?,
                )
            };
            let (gate, up) = if cfg.fused_projections
                && file.tensor(&format!("{p}.ffn_gate.weight")).is_none()
            {
                let mut gate_up = split("ffn_up", &[i, i])?.into_iter();
                let mut next = || gate_up.next().expect("two parts");
                (next(), next())
            } else {
                (lin("ffn_gate", i, h)?, lin("ffn_up", i, h)?)
            };
            layers.push(LayerWeights {
                input_norm: vector(&format!("{p}.attn_norm.weight"), h)?,
                q,
                k,
                v,
                o: lin("attn_output", h, q_out)?,
                post_norm: vector(&format!("{p}.ffn_norm.weight"), h)?,
                gate,
                up,
                down: lin("ffn_down", h, i)?,
                qk_norm: if cfg.qk_norm {
                    Some(QkNorm {
                        q: vector(&format!("{p}.attn_q_norm.weight"), cfg.head_dim)?,
                        k: vector(&format!("{p}.attn_k_norm.weight"), cfg.head_dim)?,
                    })
                } else {
                    None
                },
            });
        }
        let lm_head = match file.tensor("output.weight") {
            Some(_) => Some(Linear::new(matrix("output.weight", cfg.vocab_size, h)?)),
            None => None,
        };
        let dtype = dtype_name(file, &layers);
        Ok(Weights {
            embed,
            layers,
            norm: vector("output_norm.weight", h)?,
            lm_head,
            dtype,
            // llama.cpp's converter permutes a llama's q and k rows for its
            // interleaved RoPE; Qwen and Phi-3 files keep Hugging Face's
            // order.
            rope: if arch == "llama" {
                RopeLayout::Interleaved
            } else {
                RopeLayout::HalfSplit
            },
        })
    }
}

/// The file's quantization as clients see it (`quantization` of PROTOCOLS.md):
/// `general.file_type`'s name, else the first FFN matrix's dtype.
fn dtype_name(file: &GgufFile, layers: &[LayerWeights]) -> String {
    let named = match file.uint("general.file_type").ok().flatten() {
        Some(0) => Some("f32"),
        Some(1) => Some("f16"),
        Some(2) => Some("q4_0"),
        Some(3) => Some("q4_1"),
        Some(7) => Some("q8_0"),
        Some(8) => Some("q5_0"),
        Some(9) => Some("q5_1"),
        Some(10) => Some("q2_k"),
        Some(11) => Some("q3_k_s"),
        Some(12) => Some("q3_k_m"),
        Some(13) => Some("q3_k_l"),
        Some(14) => Some("q4_k_s"),
        Some(15) => Some("q4_k_m"),
        Some(16) => Some("q5_k_s"),
        Some(17) => Some("q5_k_m"),
        Some(18) => Some("q6_k"),
        Some(21) => Some("q2_k_s"),
        Some(25) => Some("iq4_nl"),
        Some(30) => Some("iq4_xs"),
        Some(32) => Some("bf16"),
        _ => None,
    };
    match (named, layers.first()) {
        (Some(n), _) => n.to_owned(),
        (None, Some(l)) => l.gate.w.dtype().name().to_lowercase(),
        (None, None) => GgmlType::F32.name().to_lowercase(),
    }
}
