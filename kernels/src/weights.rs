//! Weights of a llama-family checkpoint: `model.safetensors` or a sharded
//! `model.safetensors.index.json` (f32/f16/bf16), memory-mapped and kept in
//! the file's dtype; GGUF files load through [`crate::gguf_weights`] into the
//! same [`Weights`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use tokenwire_gguf::GgmlType;

use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::model_dir::ModelDir;
use crate::quant::RowLayout;
use crate::rope::RopeLayout;
use crate::tensor::{SharedMap, WeightMatrix};

/// A linear layer `y = W x (+ b)`, `W` row-major `[out_dim, in_dim]` as in HF files.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    /// Weight matrix `[out_dim, in_dim]`, in its file's dtype.
    pub w: WeightMatrix,
    /// Optional bias, `out_dim` values.
    pub b: Option<Vec<f32>>,
}

impl Linear {
    /// A layer without bias.
    pub fn new(w: WeightMatrix) -> Linear {
        Linear { w, b: None }
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.w.rows()
    }

    /// Input features.
    pub fn in_dim(&self) -> usize {
        self.w.cols()
    }
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// RMSNorm before attention.
    pub input_norm: Vec<f32>,
    /// Query projection `[heads * head_dim, hidden]`.
    pub q: Linear,
    /// Key projection `[kv_heads * head_dim, hidden]`.
    pub k: Linear,
    /// Value projection `[kv_heads * head_dim, hidden]`.
    pub v: Linear,
    /// Output projection `[hidden, heads * head_dim]`.
    pub o: Linear,
    /// RMSNorm before the MLP.
    pub post_norm: Vec<f32>,
    /// SwiGLU gate `[intermediate, hidden]`.
    pub gate: Linear,
    /// SwiGLU up `[intermediate, hidden]`.
    pub up: Linear,
    /// SwiGLU down `[hidden, intermediate]`.
    pub down: Linear,
    /// Per-head RMSNorm weights of the queries and keys, applied before
    /// RoPE (Qwen3); `None` for architectures without them.
    pub qk_norm: Option<QkNorm>,
}

/// The weights of Qwen3's per-head query and key RMSNorms, `head_dim` each,
/// in the rows' layout of the file (a GGUF llama's interleaved order where
/// its q and k rows are).
#[derive(Debug, Clone, PartialEq)]
pub struct QkNorm {
    /// Every query head's norm weights.
    pub q: Vec<f32>,
    /// Every key head's norm weights.
    pub k: Vec<f32>,
}

/// All weights of the model: matrices in their file's dtypes, norms in f32.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// Token embedding `[vocab, hidden]`.
    pub embed: WeightMatrix,
    /// Decoder layers.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm.
    pub norm: Vec<f32>,
    /// LM head `[vocab, hidden]`; `None` when tied to the embedding.
    pub lm_head: Option<Linear>,
    /// Dtype of the file's weights (`f32`, `f16`, `bf16`, `q4_1`, ...), as
    /// reported to clients.
    pub dtype: String,
    /// How the rows of the q and k projections pair up for RoPE.
    pub rope: RopeLayout,
}

impl Weights {
    /// Every matrix a forward pass reads: the embedding, each layer's seven
    /// projections, and the untied LM head if there is one.
    pub fn matrices(&self) -> impl Iterator<Item = &WeightMatrix> {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down].map(|lin| &lin.w));
        std::iter::once(&self.embed)
            .chain(layers)
            .chain(self.lm_head.as_ref().map(|l| &l.w))
    }

    /// These weights with every matrix's rows in `layout`
    /// ([`WeightMatrix::laid_out`]): for a backend whose kernels read
    /// another layout than the file's.
    pub fn laid_out(&self, layout: RowLayout) -> Weights {
        let lin = |l: &Linear| Linear {
            w: l.w.laid_out(layout),
            b: l.b.clone(),
        };
        Weights {
            embed: self.embed.laid_out(layout),
            layers: self
                .layers
                .iter()
                .map(|l| LayerWeights {
                    input_norm: l.input_norm.clone(),
                    q: lin(&l.q),
                    k: lin(&l.k),
                    v: lin(&l.v),
                    o: lin(&l.o),
                    post_norm: l.post_norm.clone(),
                    gate: lin(&l.gate),
                    up: lin(&l.up),
                    down: lin(&l.down),
                    qk_norm: l.qk_norm.clone(),
                })
                .collect(),
            norm: self.norm.clone(),
            lm_head: self.lm_head.as_ref().map(lin),
            dtype: self.dtype.clone(),
            rope: self.rope,
        }
    }
}

/// The name and shape of one tensor the model reads.
struct Spec {
    name: String,
    shape: Vec<usize>,
    required: bool,
}

fn specs(cfg: &ModelConfig) -> Vec<Spec> {
    let h = cfg.hidden_size;
    let q_out = cfg.num_heads * cfg.head_dim;
    let kv_out = cfg.num_kv_heads * cfg.head_dim;
    let i = cfg.intermediate_size;
    let mut out = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, required: bool| {
        out.push(Spec {
            name,
            shape,
            required,
        })
    };
    add(
        "model.embed_tokens.weight".into(),
        vec![cfg.vocab_size, h],
        true,
    );
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        add(format!("{p}.input_layernorm.weight"), vec![h], true);
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            true,
        );
        let attn: &[(&str, usize, usize)] = if cfg.fused_projections {
            &[("qkv_proj", q_out + 2 * kv_out, h), ("o_proj", h, q_out)]
        } else {
            &[
                ("q_proj", q_out, h),
                ("k_proj", kv_out, h),
                ("v_proj", kv_out, h),
                ("o_proj", h, q_out),
            ]
        };
        for &(proj, out_dim, in_dim) in attn {
            add(
                format!("{p}.self_attn.{proj}.weight"),
                vec![out_dim, in_dim],
                true,
            );
            let bias_required = cfg.attention_bias && proj != "o_proj";
            add(
                format!("{p}.self_attn.{proj}.bias"),
                vec![out_dim],
                bias_required,
            );
        }
        if cfg.fused_projections {
            add(format!("{p}.mlp.gate_up_proj.weight"), vec![2 * i, h], true);
        } else {
            add(format!("{p}.mlp.gate_proj.weight"), vec![i, h], true);
            add(format!("{p}.mlp.up_proj.weight"), vec![i, h], true);
        }
        add(format!("{p}.mlp.down_proj.weight"), vec![h, i], true);
        if cfg.qk_norm {
            add(
                format!("{p}.self_attn.q_norm.weight"),
                vec![cfg.head_dim],
                true,
            );
            add(
                format!("{p}.self_attn.k_norm.weight"),
                vec![cfg.head_dim],
                true,
            );
        }
    }
    add("model.norm.weight".into(), vec![h], true);
    // Tied heads use the embedding, as HF does, even if a file also has lm_head.
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), vec![cfg.vocab_size, h], true);
    }
    out
}

/// Tensors read from the files, by name, plus the embedding's dtype.
struct Loaded {
    tensors: HashMap<String, WeightMatrix>,
    dtype: Option<&'static str>,
}

impl Weights {
    /// Loads the weights `cfg` describes from `dir`.
    pub fn load(dir: &Path, cfg: &ModelConfig) -> Result<Weights, LoadError> {
        Weights::load_from(&ModelDir::new(dir), cfg)
    }

    /// [`Weights::load`] from a directory or a built-in model.
    pub fn load_from(dir: &ModelDir, cfg: &ModelConfig) -> Result<Weights, LoadError> {
        let specs = specs(cfg);
        let single = dir.path("model.safetensors");
        let index = dir.path("model.safetensors.index.json");
        let (mut loaded, missing_in) = if dir.exists("model.safetensors") {
            (load_single(dir, "model.safetensors", &specs)?, single)
        } else if dir.exists("model.safetensors.index.json") {
            (load_sharded(dir, &specs)?, index)
        } else {
            return Err(LoadError::Io {
                path: single,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "neither model.safetensors nor model.safetensors.index.json exists",
                ),
            });
        };
        let mut take = |name: String| -> Result<WeightMatrix, LoadError> {
            loaded
                .tensors
                .remove(&name)
                .ok_or_else(|| LoadError::MissingTensor {
                    path: missing_in.clone(),
                    name,
                })
        };
        let embed = take("model.embed_tokens.weight".into())?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let input_norm = take(format!("{p}.input_layernorm.weight"))?.to_f32_vec();
            let post_norm = take(format!("{p}.post_attention_layernorm.weight"))?.to_f32_vec();
            let qk_norm = if cfg.qk_norm {
                Some(QkNorm {
                    q: take(format!("{p}.self_attn.q_norm.weight"))?.to_f32_vec(),
                    k: take(format!("{p}.self_attn.k_norm.weight"))?.to_f32_vec(),
                })
            } else {
                None
            };
            let mut lin =
                |name: &str| Ok::<_, LoadError>(Linear::new(take(format!("{p}.{name}.weight"))?));
            let (q, k, v, gate, up) = if cfg.fused_projections {
                let (q_out, kv_out) = (
                    cfg.num_heads * cfg.head_dim,
                    cfg.num_kv_heads * cfg.head_dim,
                );
                let i = cfg.intermediate_size;
                let qkv = lin("self_attn.qkv_proj")?.w;
                let gate_up = lin("mlp.gate_up_proj")?.w;
                // (The shapes were checked against the specs, so every range
                // lies inside its matrix.)
                let part = |m: &WeightMatrix, at: usize, rows: usize, name: &str| {
                    m.row_range(at, rows).map(Linear::new).map_err(|msg| {
                        LoadError::bad_tensor(&missing_in, format!("{p}.{name}"), msg)
                    })
                };
                (
                    part(&qkv, 0, q_out, "self_attn.qkv_proj")?,
                    part(&qkv, q_out, kv_out, "self_attn.qkv_proj")?,
                    part(&qkv, q_out + kv_out, kv_out, "self_attn.qkv_proj")?,
                    part(&gate_up, 0, i, "mlp.gate_up_proj")?,
                    part(&gate_up, i, i, "mlp.gate_up_proj")?,
                )
            } else {
                (
                    lin("self_attn.q_proj")?,
                    lin("self_attn.k_proj")?,
                    lin("self_attn.v_proj")?,
                    lin("mlp.gate_proj")?,
                    lin("mlp.up_proj")?,
                )
            };
            layers.push(LayerWeights {
                input_norm,
                q,
                k,
                v,
                o: lin("self_attn.o_proj")?,
                post_norm,
                gate,
                up,
                down: lin("mlp.down_proj")?,
                qk_norm,
            });
        }
        let norm = take("model.norm.weight".into())?.to_f32_vec();
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(Linear::new(take("lm_head.weight".into())?))
        };
        // Biases are optional (a missing required one failed in extract), so
        // whatever the files held is attached now.
        let mut biases = std::mem::take(&mut loaded.tensors);
        let mut bias = |name: String| biases.remove(&name).map(|m| m.to_f32_vec());
        for (l, layer) in layers.iter_mut().enumerate() {
            let p = format!("model.layers.{l}.self_attn");
            if let Some(qkv) = bias(format!("{p}.qkv_proj.bias")) {
                // A stacked bias splits as its matrix's rows do.
                let (q, kv) = (layer.q.out_dim(), layer.k.out_dim());
                layer.q.b = Some(qkv[..q].to_vec());
                layer.k.b = Some(qkv[q..q + kv].to_vec());
                layer.v.b = Some(qkv[q + kv..].to_vec());
            } else {
                layer.q.b = bias(format!("{p}.q_proj.bias"));
                layer.k.b = bias(format!("{p}.k_proj.bias"));
                layer.v.b = bias(format!("{p}.v_proj.bias"));
            }
            layer.o.b = bias(format!("{p}.o_proj.bias"));
        }
        Ok(Weights {
            embed,
            layers,
            norm,
            lm_head,
            dtype: loaded.dtype.unwrap_or("f32").to_string(),
            rope: RopeLayout::HalfSplit,
        })
    }
}

fn load_sharded(dir: &ModelDir, specs: &[Spec]) -> Result<Loaded, LoadError> {
    let index = &dir.path("model.safetensors.index.json");
    let v = dir.read_json("model.safetensors.index.json")?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| LoadError::json(index, "missing object field `weight_map`"))?;
    // Group the tensors we need by shard so each shard is read once, and only
    // one shard's bytes are in memory at a time.
    let mut by_file: BTreeMap<String, Vec<&Spec>> = BTreeMap::new();
    for spec in specs {
        match map.get(&spec.name) {
            Some(serde_json::Value::String(file)) => {
                by_file.entry(file.clone()).or_default().push(spec)
            }
            Some(other) => {
                return Err(LoadError::json(
                    index,
                    format!(
                        "weight_map[`{}`] must be a file name, got {other}",
                        spec.name
                    ),
                ))
            }
            None if spec.required => {
                return Err(LoadError::MissingTensor {
                    path: index.to_path_buf(),
                    name: spec.name.clone(),
                })
            }
            None => {}
        }
    }
    let mut loaded = Loaded {
        tensors: HashMap::new(),
        dtype: None,
    };
    for (file, wanted) in by_file {
        if !is_plain_file_name(&file) {
            return Err(LoadError::json(
                index,
                format!("weight_map names `{file}`, which is not a file in the model directory"),
            ));
        }
        let path = dir.path(&file);
        let map = dir.map(&file)?;
        let st = parse_safetensors(&path, &map)?;
        extract(&path, &map, &st, wanted.into_iter(), true, &mut loaded)?;
    }
    Ok(loaded)
}

fn load_single(dir: &ModelDir, name: &str, specs: &[Spec]) -> Result<Loaded, LoadError> {
    let mut loaded = Loaded {
        tensors: HashMap::new(),
        dtype: None,
    };
    let path = &dir.path(name);
    let map = dir.map(name)?;
    let st = parse_safetensors(path, &map)?;
    extract(path, &map, &st, specs.iter(), false, &mut loaded)?;
    Ok(loaded)
}

/// Converts the `wanted` tensors of one file into `loaded`. With `all_present`
/// (a shard the index points at) even optional tensors must be there.
fn extract<'s>(
    path: &Path,
    map: &SharedMap,
    st: &SafeTensors<'_>,
    wanted: impl Iterator<Item = &'s Spec>,
    all_present: bool,
    loaded: &mut Loaded,
) -> Result<(), LoadError> {
    for spec in wanted {
        match st.tensor(&spec.name) {
            Ok(view) => {
                let data = convert(path, map, spec, &view, &mut loaded.dtype)?;
                loaded.tensors.insert(spec.name.clone(), data);
            }
            Err(_) if !spec.required && !all_present => {}
            Err(_) => {
                return Err(LoadError::MissingTensor {
                    path: path.to_path_buf(),
                    name: spec.name.clone(),
                })
            }
        }
    }
    Ok(())
}

/// A shard name must stay inside the model directory.
fn is_plain_file_name(name: &str) -> bool {
    let p = Path::new(name);
    !name.is_empty()
        && p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
}

fn parse_safetensors<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, LoadError> {
    SafeTensors::deserialize(bytes).map_err(|e| LoadError::Safetensors {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// Checks shape and dtype and wraps the tensor's bytes where they lie in
/// the mapped file. The first tensor seen fixes the reported dtype (the
/// embedding comes first in the spec list).
fn convert(
    path: &Path,
    map: &SharedMap,
    spec: &Spec,
    view: &safetensors::tensor::TensorView<'_>,
    dtype: &mut Option<&'static str>,
) -> Result<WeightMatrix, LoadError> {
    if view.shape() != spec.shape.as_slice() {
        return Err(LoadError::bad_tensor(
            path,
            &spec.name,
            format!("shape {:?}, expected {:?}", view.shape(), spec.shape),
        ));
    }
    let (name, ty) = match view.dtype() {
        Dtype::F32 => ("f32", GgmlType::F32),
        Dtype::F16 => ("f16", GgmlType::F16),
        Dtype::BF16 => ("bf16", GgmlType::BF16),
        other => {
            return Err(LoadError::bad_tensor(
                path,
                &spec.name,
                format!("dtype {other:?} not supported (f32, f16, bf16)"),
            ))
        }
    };
    dtype.get_or_insert(name);
    // A vector is a one-row matrix.
    let (rows, cols) = match spec.shape[..] {
        [n] => (1, n),
        [r, c] => (r, c),
        _ => {
            return Err(LoadError::bad_tensor(
                path,
                &spec.name,
                "not a vector or matrix",
            ))
        }
    };
    let want = rows * cols * if ty == GgmlType::F32 { 4 } else { 2 };
    if view.data().len() != want {
        return Err(LoadError::bad_tensor(
            path,
            &spec.name,
            format!(
                "{} data bytes for {} {name} values",
                view.data().len(),
                rows * cols
            ),
        ));
    }
    // The view borrows the mapped bytes: its offset in the map is where the
    // tensor lies in the file.
    let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
    WeightMatrix::mapped(ty, rows, cols, map, start)
        .map_err(|msg| LoadError::bad_tensor(path, &spec.name, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_must_stay_in_the_directory() {
        assert!(is_plain_file_name("model-00001-of-00002.safetensors"));
        assert!(!is_plain_file_name("../secret.safetensors"));
        assert!(!is_plain_file_name("/etc/passwd"));
        assert!(!is_plain_file_name("sub/dir.safetensors"));
        assert!(!is_plain_file_name(".."));
        assert!(!is_plain_file_name(""));
    }
}
