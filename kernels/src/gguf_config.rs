//! A [`ModelConfig`] from a GGUF file's metadata: llama.cpp's keys
//! (`{arch}.embedding_length`, `{arch}.attention.head_count`, ...) mapped to
//! the fields `config.json` gives, checked the same way, and the facts GGUF
//! keeps in its tensor table (a tied LM head, attention biases, Llama 3.1's
//! RoPE factors) read from there.

use std::path::Path;
use std::sync::Arc;

use tokenwire_core::TokenId;

use crate::config::{check_heads, check_limits, ModelConfig};
use crate::error::LoadError;
use crate::gguf::{GgmlType, GgufFile};
use crate::rope::RopeScaling;

/// The tensor in which llama.cpp's converter stores Llama 3.1's RoPE
/// scaling: one f32 divisor per rotary pair.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Architectures whose GGUF tensors and keys this engine maps (the llama
/// family it runs from Hugging Face directories).
const ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "phi3"];

/// Phi-3's LongRoPE factors, as llama.cpp's converter writes them (F32,
/// one per rotary pair).
const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
/// The short list beside [`ROPE_FACTORS_LONG`].
const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

impl ModelConfig {
    /// The configuration the GGUF file at `path` (parsed as `file` from its
    /// whole contents, `bytes`) describes.
    pub fn from_gguf(path: &Path, file: &GgufFile, bytes: &[u8]) -> Result<ModelConfig, LoadError> {
        let err = |msg: String| LoadError::Gguf {
            path: path.to_path_buf(),
            msg,
        };
        let arch = file
            .str("general.architecture")
            .map_err(err)?
            .ok_or_else(|| err("no `general.architecture` in the metadata".into()))?;
        if !ARCHITECTURES.contains(&arch) {
            return Err(LoadError::Unsupported {
                path: path.to_path_buf(),
                msg: format!(
                    "architecture `{arch}` (this engine runs {})",
                    ARCHITECTURES.join(", ")
                ),
            });
        }
        let key = |k: &str| format!("{arch}.{k}");
        let uint = |k: &str| -> Result<Option<usize>, LoadError> {
            let v = file.uint(&key(k)).map_err(err)?;
            v.map(|v| usize::try_from(v).map_err(|_| err(format!("`{}` is too large", key(k)))))
                .transpose()
        };
        let need = |k: &str| -> Result<usize, LoadError> {
            uint(k)?.ok_or_else(|| err(format!("no `{}` in the metadata", key(k))))
        };
        let hidden_size = need("embedding_length")?;
        let num_heads = need("attention.head_count")?;
        let (num_kv_heads, head_dim) = check_heads(
            hidden_size,
            num_heads,
            uint("attention.head_count_kv")?,
            uint("attention.key_length")?,
        )
        .map_err(err)?;
        let max_position_embeddings = need("context_length")?;
        let rms_norm_eps = file
            .float(&key("attention.layer_norm_rms_epsilon"))
            .map_err(err)?
            .unwrap_or(1e-6);
        check_limits(max_position_embeddings, rms_norm_eps).map_err(err)?;
        let rope_theta = file
            .float(&key("rope.freq_base"))
            .map_err(err)?
            .unwrap_or(10_000.0);
        // llama.cpp rotates the first `rope.dimension_count` values of each
        // head (Phi-4-mini: three quarters); this engine the whole head.
        if let Some(n) = uint("rope.dimension_count")? {
            if n != head_dim {
                return Err(LoadError::Unsupported {
                    path: path.to_path_buf(),
                    msg: format!(
                        "`{}` = {n}, not the head width {head_dim} (RoPE over part of each head)",
                        key("rope.dimension_count")
                    ),
                });
            }
        }
        let longrope = match (
            factors(file, bytes, ROPE_FACTORS_SHORT, head_dim).map_err(err)?,
            factors(file, bytes, ROPE_FACTORS_LONG, head_dim).map_err(err)?,
        ) {
            (None, None) => None,
            (Some(short), Some(long)) => {
                let original_context = match uint("rope.scaling.original_context_length")? {
                    Some(n) if n > 0 => n,
                    _ => {
                        return Err(err(format!(
                            "LongRoPE factors without a positive `{}`",
                            key("rope.scaling.original_context_length")
                        )))
                    }
                };
                let mscale = match file.float(&key("rope.scaling.attn_factor")).map_err(err)? {
                    Some(a) if a > 0.0 && a.is_finite() => a,
                    Some(a) => {
                        return Err(err(format!(
                            "`{}` is {a}, not a positive number",
                            key("rope.scaling.attn_factor")
                        )))
                    }
                    // llama.cpp leaves the rotations unscaled without it
                    // (its converter always writes it).
                    None => 1.0,
                };
                Some(RopeScaling::LongRope {
                    short,
                    long,
                    original_context,
                    use_long: max_position_embeddings > original_context,
                    mscale,
                })
            }
            _ => {
                return Err(err(format!(
                    "one of `{ROPE_FACTORS_SHORT}` and `{ROPE_FACTORS_LONG}` without the other"
                )))
            }
        };
        let divisors = factors(file, bytes, ROPE_FREQS, head_dim).map_err(err)?;
        let rope_scaling = match (longrope, divisors) {
            (Some(_), Some(_)) => {
                return Err(err(format!(
                    "both `{ROPE_FREQS}` and LongRoPE factors: one RoPE scaling or the other"
                )))
            }
            (Some(longrope), None) => longrope,
            (None, None) => rope_scaling(file, arch).map_err(err)?,
            (None, Some(_))
                if file
                    .str(&key("rope.scaling.type"))
                    .map_err(err)?
                    .is_some_and(|t| t != "none") =>
            {
                return Err(err(format!(
                    "both `{ROPE_FREQS}` and `{}`: one RoPE scaling or the other",
                    key("rope.scaling.type")
                )))
            }
            (None, Some(divisors)) => RopeScaling::PerPair { divisors },
        };
        let tokens = file.array("tokenizer.ggml.tokens").map_err(err)?;
        let vocab_size = match (uint("vocab_size")?, tokens) {
            (Some(n), _) => n,
            (None, Some(t)) => t.len(),
            (None, None) => {
                return Err(err(
                    "no vocabulary size and no `tokenizer.ggml.tokens`".into()
                ))
            }
        };
        let token = |k: &str| -> Result<Option<TokenId>, LoadError> {
            let v = file.uint(k).map_err(err)?;
            v.map(|v| TokenId::try_from(v).map_err(|_| err(format!("`{k}` is too large"))))
                .transpose()
        };
        Ok(ModelConfig {
            hidden_size,
            intermediate_size: need("feed_forward_length")?,
            num_layers: need("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            max_position_embeddings,
            rms_norm_eps: rms_norm_eps as f32,
            rope_theta,
            rope_scaling,
            // GGUF writers leave the LM head out when it is the embedding.
            tie_word_embeddings: file.tensor("output.weight").is_none(),
            attention_bias: file.tensor("blk.0.attn_q.bias").is_some(),
            // Qwen3 files must carry the norms (a missing one is then a
            // missing tensor, not a llama computed in their place).
            qk_norm: arch == "qwen3" || file.tensor("blk.0.attn_q_norm.weight").is_some(),
            // Phi-3 files hold q|k|v and gate|up stacked ([`Weights::from_gguf`]
            // splits them).
            fused_projections: arch == "phi3",
            bos_token_id: token("tokenizer.ggml.bos_token_id")?,
            eos_token_ids: token("tokenizer.ggml.eos_token_id")?.into_iter().collect(),
            name_or_path: file.str("general.name").map_err(err)?.map(str::to_owned),
        })
    }
}

/// The per-pair divisors of the tensor `name` (`rope_freqs.weight`,
/// Phi-3's `rope_factors_*.weight`), if the file has it: F32,
/// `head_dim / 2` of them, each positive and finite (llama.cpp divides each
/// pair's frequency by its factor).
fn factors(
    file: &GgufFile,
    bytes: &[u8],
    name: &str,
    head_dim: usize,
) -> Result<Option<Arc<[f64]>>, String> {
    let Some(t) = file.tensor(name) else {
        return Ok(None);
    };
    let pairs = head_dim / 2;
    if t.dtype != GgmlType::F32 || t.dims != [pairs as u64] {
        return Err(format!(
            "`{name}` is {} {:?}; RoPE factors are F32 [{pairs}] (head_dim / 2)",
            t.dtype.name(),
            t.dims
        ));
    }
    // The parser checked that every tensor lies inside the file.
    let data = usize::try_from(t.offset)
        .ok()
        .and_then(|start| bytes.get(start..start.checked_add(pairs * 4)?))
        .ok_or_else(|| format!("`{name}` lies outside the file"))?;
    data.chunks_exact(4)
        .enumerate()
        .map(|(i, b)| {
            let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if x.is_finite() && x > 0.0 {
                Ok(f64::from(x))
            } else {
                Err(format!(
                    "`{name}`[{i}] is {x}; RoPE factors are positive and finite"
                ))
            }
        })
        .collect::<Result<Arc<[f64]>, String>>()
        .map(Some)
}

/// `{arch}.rope.scaling.type` and `.factor`: none or linear.
fn rope_scaling(file: &GgufFile, arch: &str) -> Result<RopeScaling, String> {
    let kind = file.str(&format!("{arch}.rope.scaling.type"))?;
    let factor = file.float(&format!("{arch}.rope.scaling.factor"))?;
    match (kind, factor) {
        (None | Some("none"), _) => Ok(RopeScaling::None),
        (Some("linear"), Some(f)) if f > 0.0 => Ok(RopeScaling::Linear { factor: f }),
        (Some("linear"), f) => Err(format!(
            "`{arch}.rope.scaling.type` is linear but `{arch}.rope.scaling.factor` is {f:?}, not a positive number"
        )),
        (Some(other), _) => Err(format!(
            "RoPE scaling `{other}` is not supported (none and linear are)"
        )),
    }
}
