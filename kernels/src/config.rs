//! `config.json` and `generation_config.json`: the model's shape, read from
//! untrusted JSON into a validated [`ModelConfig`].

use std::path::Path;

use serde_json::{Map, Value};
use tokenwire_core::TokenId;

use crate::error::LoadError;
use crate::model_dir::ModelDir;
use crate::rope::RopeScaling;

/// Upper bound on any single dimension. Far above real models, low enough that
/// products of a few dimensions cannot overflow `usize` before we check them.
const MAX_DIM: usize = 1 << 24;

/// Architectures whose forward pass this engine computes exactly.
const ARCHITECTURES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Phi3ForCausalLM",
];
/// `model_type` values of those architectures.
const MODEL_TYPES: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "phi3"];

/// The shape and hyper-parameters of a llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention); divides `num_heads`.
    pub num_kv_heads: usize,
    /// Width of one head (even).
    pub head_dim: usize,
    /// Rows of the embedding and LM head.
    pub vocab_size: usize,
    /// Context window in tokens.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency rescaling.
    pub rope_scaling: RopeScaling,
    /// LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Config promises q/k/v/o biases (they are used whenever present in the file).
    pub attention_bias: bool,
    /// Each query and key head is RMS-normalised (its own `head_dim`
    /// weights, the model's epsilon) before RoPE: Qwen3's `q_norm` and
    /// `k_norm`.
    pub qk_norm: bool,
    /// The checkpoint stores q|k|v as one matrix and gate|up as another
    /// (Phi-3's `qkv_proj` and `gate_up_proj`), split at load into the
    /// projections the backends read.
    pub fused_projections: bool,
    /// Beginning-of-sequence id, if the config names one.
    pub bos_token_id: Option<TokenId>,
    /// End-of-sequence ids from `config.json` (generation config overrides these).
    pub eos_token_ids: Vec<TokenId>,
    /// `_name_or_path`, if present.
    pub name_or_path: Option<String>,
}

/// Typed access to the fields of one JSON object, with errors naming the file and field.
struct Fields<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn new(path: &'a Path, v: &'a Value) -> Result<Self, LoadError> {
        match v.as_object() {
            Some(obj) => Ok(Fields { path, obj }),
            None => Err(LoadError::json(path, "top level is not a JSON object")),
        }
    }

    fn err(&self, msg: String) -> LoadError {
        LoadError::json(self.path, msg)
    }

    /// The field, treating JSON `null` as absent.
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, name: &str) -> Result<Option<usize>, LoadError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        match v.as_u64() {
            Some(n) if (n as u128) <= MAX_DIM as u128 => Ok(Some(n as usize)),
            Some(n) => Err(self.err(format!("field `{name}` = {n} is too large"))),
            None => Err(self.err(format!(
                "field `{name}` must be a non-negative integer, got {v}"
            ))),
        }
    }

    fn usize(&self, name: &str) -> Result<usize, LoadError> {
        match self.opt_usize(name)? {
            Some(n) if n > 0 => Ok(n),
            Some(_) => Err(self.err(format!("field `{name}` must be positive"))),
            None => Err(self.err(format!("missing field `{name}`"))),
        }
    }

    fn opt_f64(&self, name: &str) -> Result<Option<f64>, LoadError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(self.err(format!("field `{name}` must be a finite number, got {v}"))),
        }
    }

    fn positive_f64(&self, name: &str) -> Result<f64, LoadError> {
        match self.opt_f64(name)? {
            Some(x) if x > 0.0 => Ok(x),
            Some(x) => Err(self.err(format!("field `{name}` must be positive, got {x}"))),
            None => Err(self.err(format!("missing field `{name}`"))),
        }
    }

    fn opt_bool(&self, name: &str) -> Result<Option<bool>, LoadError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(format!("field `{name}` must be true or false, got {v}"))),
        }
    }

    fn opt_str(&self, name: &str) -> Result<Option<&'a str>, LoadError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!("field `{name}` must be a string, got {v}"))),
        }
    }

    fn opt_token(&self, name: &str) -> Result<Option<TokenId>, LoadError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => self.token(name, v).map(Some),
        }
    }

    fn token(&self, name: &str, v: &Value) -> Result<TokenId, LoadError> {
        v.as_u64()
            .and_then(|n| TokenId::try_from(n).ok())
            .ok_or_else(|| self.err(format!("field `{name}` must hold token ids, got {v}")))
    }

    /// A token id or a list of them (Llama 3 style `eos_token_id`).
    fn token_list(&self, name: &str) -> Result<Option<Vec<TokenId>>, LoadError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| self.token(name, v))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Ok(Some(vec![self.token(name, v)?])),
        }
    }
}

impl ModelConfig {
    /// Reads and validates `path` (a `config.json`).
    pub fn load(path: &Path) -> Result<ModelConfig, LoadError> {
        let v = crate::error::read_json(path)?;
        ModelConfig::from_json(path, &v)
    }

    /// Validates an already-parsed `config.json`; `path` is only for error messages.
    pub fn from_json(path: &Path, v: &Value) -> Result<ModelConfig, LoadError> {
        let f = Fields::new(path, v)?;
        let arch = check_architecture(&f)?;

        let hidden_size = f.usize("hidden_size")?;
        let num_heads = f.usize("num_attention_heads")?;
        let (num_kv_heads, head_dim) = check_heads(
            hidden_size,
            num_heads,
            f.opt_usize("num_key_value_heads")?,
            f.opt_usize("head_dim")?,
        )
        .map_err(|m| f.err(m))?;
        let trained_context = f.usize("max_position_embeddings")?;
        let rms_norm_eps = f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        check_limits(trained_context, rms_norm_eps).map_err(|m| f.err(m))?;
        let (rope_theta, rope_scaling) = rope(&f, trained_context, head_dim)?;
        // Mistral's (v0.1: 4,096 of a 32,768 context) and Phi-3's (2,047 of
        // 4,096 for mini-4k) sliding windows limit attention to the last
        // window's tokens, which this engine does not compute; a context
        // the window holds whole changes nothing, so that is the context
        // served. (Qwen's `sliding_window` is off unless
        // `use_sliding_window`, refused above.)
        let window = if arch.windowed {
            f.opt_usize("sliding_window")?.filter(|&w| w > 0)
        } else {
            None
        };
        let max_position_embeddings = window.map_or(trained_context, |w| w.min(trained_context));

        Ok(ModelConfig {
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_layers: f.usize("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: f.usize("vocab_size")?,
            max_position_embeddings,
            rms_norm_eps: rms_norm_eps as f32,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: f.opt_bool("attention_bias")?.unwrap_or(false),
            qk_norm: arch.qk_norm,
            fused_projections: arch.fused_projections,
            bos_token_id: f.opt_token("bos_token_id")?,
            eos_token_ids: f.token_list("eos_token_id")?.unwrap_or_default(),
            name_or_path: f.opt_str("_name_or_path")?.map(str::to_owned),
        })
    }

    /// Query heads sharing one KV head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// What differs from a llama in the architecture a `config.json` names.
#[derive(Debug, Clone, Copy, Default)]
struct ArchTraits {
    /// Qwen3's per-head q/k norms.
    qk_norm: bool,
    /// Phi-3's fused q|k|v and gate|up matrices.
    fused_projections: bool,
    /// Its `sliding_window` field is a window attention keeps to (Mistral,
    /// Phi-3).
    windowed: bool,
}

impl ArchTraits {
    /// The traits of an architecture named `name` (a class name or a
    /// `model_type`).
    fn of(name: &str) -> ArchTraits {
        let is = |class: &str, model_type: &str| name == class || name == model_type;
        let phi3 = is("Phi3ForCausalLM", "phi3");
        ArchTraits {
            qk_norm: is("Qwen3ForCausalLM", "qwen3"),
            fused_projections: phi3,
            windowed: phi3 || is("MistralForCausalLM", "mistral"),
        }
    }
}

/// Refuses what the engine does not compute; says what differs from a
/// llama in the architecture it names.
fn check_architecture(f: &Fields<'_>) -> Result<ArchTraits, LoadError> {
    let unsupported = |msg: String| LoadError::Unsupported {
        path: f.path.to_path_buf(),
        msg,
    };
    let mut traits = ArchTraits::default();
    if let Some(arch) = f.get("architectures") {
        let names: Vec<&str> = arch
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(known) = names.iter().find(|n| ARCHITECTURES.contains(n)) else {
            return Err(unsupported(format!(
                "architectures {arch} (supported: {})",
                ARCHITECTURES.join(", ")
            )));
        };
        traits = ArchTraits::of(known);
        // A Mistral checkpoint may say so in `model_type` only.
        if let Some(t) = f.opt_str("model_type")? {
            traits.windowed |= ArchTraits::of(t).windowed;
        }
    } else if let Some(t) = f.opt_str("model_type")? {
        if !MODEL_TYPES.contains(&t) {
            return Err(unsupported(format!("model_type `{t}`")));
        }
        traits = ArchTraits::of(t);
    }
    if let Some(act) = f.opt_str("hidden_act")? {
        if act != "silu" {
            return Err(unsupported(format!("hidden_act `{act}` (only silu)")));
        }
    }
    if f.opt_bool("use_sliding_window")? == Some(true) {
        return Err(unsupported("use_sliding_window: true".into()));
    }
    if f.opt_bool("mlp_bias")? == Some(true) {
        return Err(unsupported("mlp_bias: true".into()));
    }
    // Phi-4-mini rotates only part of each head.
    let partial = match f.get("rope_parameters") {
        Some(p) => Fields::new(f.path, p)?.opt_f64("partial_rotary_factor")?,
        None => None,
    };
    if let Some(p) = partial.or(f.opt_f64("partial_rotary_factor")?) {
        if p != 1.0 {
            return Err(unsupported(format!(
                "partial_rotary_factor {p} (RoPE over part of each head)"
            )));
        }
    }
    Ok(traits)
}

/// `rope_theta` and `rope_scaling`, from the top level or from transformers 5's
/// `rope_parameters` object.
/// The KV head count (query heads when absent) and head width (hidden size
/// over query heads when absent), checked: GQA groups whole, heads even.
/// Messages use `config.json`'s field names, which GGUF keys map to.
pub(crate) fn check_heads(
    hidden_size: usize,
    num_heads: usize,
    num_kv_heads: Option<usize>,
    head_dim: Option<usize>,
) -> Result<(usize, usize), String> {
    if num_heads == 0 {
        return Err("num_attention_heads must be positive".into());
    }
    let num_kv_heads = match num_kv_heads {
        Some(0) => return Err("field `num_key_value_heads` must be positive".into()),
        Some(n) => n,
        None => num_heads,
    };
    if !num_heads.is_multiple_of(num_kv_heads) {
        return Err(format!(
            "num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
        ));
    }
    let head_dim = match head_dim {
        Some(d) => d,
        None => {
            if !hidden_size.is_multiple_of(num_heads) {
                return Err(format!(
                    "no `head_dim` and hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_heads})"
                ));
            }
            hidden_size / num_heads
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(format!(
            "head_dim must be even and positive, got {head_dim}"
        ));
    }
    Ok((num_kv_heads, head_dim))
}

/// The context length fits positions in 32 bits; the norm epsilon is not negative.
pub(crate) fn check_limits(
    max_position_embeddings: usize,
    rms_norm_eps: f64,
) -> Result<(), String> {
    if u32::try_from(max_position_embeddings).is_err() {
        return Err("max_position_embeddings does not fit in 32 bits".into());
    }
    if rms_norm_eps < 0.0 || rms_norm_eps.is_nan() {
        return Err(format!(
            "rms_norm_eps must not be negative, got {rms_norm_eps}"
        ));
    }
    Ok(())
}

/// `rope_theta` and the scaling, for a model pre-trained (or stretched) to
/// `trained_context` tokens with heads of `head_dim`.
fn rope(
    f: &Fields<'_>,
    trained_context: usize,
    head_dim: usize,
) -> Result<(f64, RopeScaling), LoadError> {
    let nested =
        match f.get("rope_parameters") {
            Some(v) => Some(Fields::new(f.path, v).map_err(|_| {
                LoadError::json(f.path, "field `rope_parameters` must be an object")
            })?),
            None => None,
        };
    let theta = match nested
        .as_ref()
        .map(|n| n.opt_f64("rope_theta"))
        .transpose()?
    {
        Some(Some(t)) => t,
        _ => f.opt_f64("rope_theta")?.unwrap_or(10000.0),
    };
    if theta <= 0.0 {
        return Err(f.err(format!("rope_theta must be positive, got {theta}")));
    }
    let scaling_fields = match (nested, f.get("rope_scaling")) {
        (_, Some(v)) => Some(Fields::new(f.path, v).map_err(|_| {
            LoadError::json(f.path, "field `rope_scaling` must be an object or null")
        })?),
        (Some(n), None) => Some(n),
        (None, None) => None,
    };
    let Some(s) = scaling_fields else {
        return Ok((theta, RopeScaling::None));
    };
    let kind = match s.opt_str("rope_type")? {
        Some(k) => Some(k),
        None => s.opt_str("type")?,
    };
    let scaling = match kind.unwrap_or("default") {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: s.positive_f64("factor")?,
        },
        "llama3" => {
            let low = s.positive_f64("low_freq_factor")?;
            let high = s.positive_f64("high_freq_factor")?;
            if high <= low {
                return Err(f.err(format!(
                    "rope_scaling: high_freq_factor ({high}) must exceed low_freq_factor ({low})"
                )));
            }
            RopeScaling::Llama3 {
                factor: s.positive_f64("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: s
                    .positive_f64("original_max_position_embeddings")?,
            }
        }
        "longrope" | "su" => longrope(f, &s, trained_context, head_dim)?,
        other => {
            return Err(LoadError::Unsupported {
                path: f.path.to_path_buf(),
                msg: format!(
                    "rope_scaling type `{other}` (supported: default, linear, llama3, longrope)"
                ),
            })
        }
    };
    Ok((theta, scaling))
}

/// Phi-3's LongRoPE, read as Hugging Face's `_compute_longrope_parameters`
/// reads it: `short_factor` and `long_factor` (one per rotary pair); the
/// pre-trained context from the top level's (Phi-3's) or the scaling's
/// `original_max_position_embeddings`, the stretch then the context over it
/// (else the scaling's `factor`); the scaling's `attention_factor`, else
/// [`crate::rope::longrope_mscale`] of the stretch.
fn longrope(
    f: &Fields<'_>,
    s: &Fields<'_>,
    trained_context: usize,
    head_dim: usize,
) -> Result<RopeScaling, LoadError> {
    let list = |name: &str| -> Result<std::sync::Arc<[f64]>, LoadError> {
        let items = s
            .get(name)
            .and_then(Value::as_array)
            .ok_or_else(|| f.err(format!("rope_scaling: missing array `{name}`")))?;
        if items.len() != head_dim / 2 {
            return Err(f.err(format!(
                "rope_scaling: `{name}` has {} factors for {} rotary pairs",
                items.len(),
                head_dim / 2
            )));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(x),
                _ => Err(f.err(format!(
                    "rope_scaling: `{name}[{i}]` must be a positive number, got {v}"
                ))),
            })
            .collect()
    };
    let (short, long) = (list("short_factor")?, list("long_factor")?);
    let original = match f.opt_usize("original_max_position_embeddings")? {
        Some(n) => Some(n),
        None => s.opt_usize("original_max_position_embeddings")?,
    };
    let (original_context, factor) = match original {
        Some(0) => return Err(f.err("original_max_position_embeddings must be positive".into())),
        Some(n) => (n, trained_context as f64 / n as f64),
        None => (trained_context, s.opt_f64("factor")?.unwrap_or(1.0)),
    };
    let mscale = match s.opt_f64("attention_factor")? {
        Some(a) if a > 0.0 => a,
        Some(a) => {
            return Err(f.err(format!(
                "rope_scaling: attention_factor must be positive, got {a}"
            )))
        }
        None => crate::rope::longrope_mscale(factor, original_context),
    };
    Ok(RopeScaling::LongRope {
        short,
        long,
        original_context,
        use_long: trained_context > original_context,
        mscale,
    })
}

/// What `generation_config.json` says about special tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Tokens that end a generation.
    pub eos_token_ids: Option<Vec<TokenId>>,
    /// Beginning-of-sequence token.
    pub bos_token_id: Option<TokenId>,
}

impl GenerationConfig {
    /// Reads `path` if it exists; a missing file is an empty config, a broken one an error.
    pub fn load_optional(path: &Path) -> Result<GenerationConfig, LoadError> {
        match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
            (Some(dir), Some(name)) => GenerationConfig::load_from(&ModelDir::new(dir), name),
            _ => Ok(GenerationConfig::default()),
        }
    }

    /// File `name` of `dir` if it exists (as [`GenerationConfig::load_optional`]).
    pub fn load_from(dir: &ModelDir, name: &str) -> Result<GenerationConfig, LoadError> {
        if !dir.exists(name) {
            return Ok(GenerationConfig::default());
        }
        let v = dir.read_json(name)?;
        let path = dir.path(name);
        let f = Fields::new(&path, &v)?;
        Ok(GenerationConfig {
            eos_token_ids: f.token_list("eos_token_id")?,
            bos_token_id: f.opt_token("bos_token_id")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ModelConfig, LoadError> {
        let v: Value = serde_json::from_str(s).map_err(|e| LoadError::json("x", e.to_string()))?;
        ModelConfig::from_json(Path::new("config.json"), &v)
    }

    const BASE: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,
        "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256"#;

    #[test]
    fn defaults_fill_in() {
        let c = parse(&format!("{BASE}}}")).expect("valid");
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.num_kv_heads, 4);
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn phi3_longrope_as_transformers_4_and_5_write_it() {
        // Phi-3-mini-128k's shape: the pre-trained context at the top level
        // (transformers 4, type `su` in the first checkpoints) or inside
        // `rope_parameters` (transformers 5).
        let factors = |x: f64| serde_json::to_string(&vec![x; 8]).expect("json");
        let (short, long) = (factors(1.0), factors(2.5));
        let phi3 = r#"{"architectures":["Phi3ForCausalLM"],"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100"#;
        let v4 = parse(&format!(
            r#"{phi3},"max_position_embeddings":131072,"original_max_position_embeddings":4096,
            "sliding_window":262144,"rope_scaling":{{"type":"su","short_factor":{short},"long_factor":{long}}}}}"#
        ))
        .expect("valid");
        let v5 = parse(&format!(
            r#"{phi3},"max_position_embeddings":131072,"rope_parameters":{{"rope_type":"longrope",
            "rope_theta":10000.0,"original_max_position_embeddings":4096,"short_factor":{short},"long_factor":{long}}}}}"#
        ))
        .expect("valid");
        for c in [&v4, &v5] {
            assert!(c.fused_projections);
            assert_eq!(
                c.max_position_embeddings, 131072,
                "a window past the context"
            );
            let RopeScaling::LongRope {
                original_context,
                use_long,
                mscale,
                ..
            } = c.rope_scaling
            else {
                panic!("LongRoPE: {:?}", c.rope_scaling);
            };
            assert_eq!((original_context, use_long), (4096, true));
            // sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5/12), Phi-3's 1.1902.
            assert!((mscale - (17.0f64 / 12.0).sqrt()).abs() < 1e-12);
        }
        // Frequencies: the base ones over the list in use.
        let base = crate::rope::inv_freq(16, 10000.0, &RopeScaling::None);
        let long_freq = crate::rope::inv_freq(16, 10000.0, &v4.rope_scaling);
        let short = v4.rope_scaling.for_context(4096);
        let short_freq = crate::rope::inv_freq(16, 10000.0, &short);
        for i in 0..8 {
            assert_eq!(long_freq[i], base[i] / 2.5);
            assert_eq!(short_freq[i], base[i]);
        }
        assert_eq!(
            short.mscale(),
            v4.rope_scaling.mscale(),
            "applied to both lists"
        );
        // Phi-3-mini-4k: a window of 2,047 in a context of 4,096.
        let mini = parse(&format!(
            r#"{phi3},"max_position_embeddings":4096,"sliding_window":2047}}"#
        ))
        .expect("valid");
        assert_eq!(mini.max_position_embeddings, 2047);
    }

    #[test]
    fn llama3_rope_and_eos_list() {
        let c = parse(&format!(
            r#"{BASE},"rope_theta":500000,"eos_token_id":[1,2],"rope_scaling":{{"rope_type":"llama3",
            "factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}}}"#
        ))
        .expect("valid");
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(c.eos_token_ids, vec![1, 2]);
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0));
    }

    #[test]
    fn bad_fields_are_named() {
        let e = parse(&format!(r#"{BASE},"num_key_value_heads":3}}"#)).expect_err("must fail");
        assert!(e.to_string().contains("num_key_value_heads"), "{e}");
        let e = parse(r#"{"hidden_size":"big"}"#).expect_err("must fail");
        assert!(e.to_string().contains("hidden_size"), "{e}");
        let e = parse(&format!(
            r#"{BASE},"rope_scaling":{{"rope_type":"yarn","factor":2}}}}"#
        ))
        .expect_err("must fail");
        assert!(e.to_string().contains("yarn"), "{e}");
        let e = parse(r#"{"architectures":["GPT2LMHeadModel"]}"#).expect_err("must fail");
        assert!(e.to_string().contains("GPT2LMHeadModel"), "{e}");
        let e = parse("[1]").expect_err("must fail");
        assert!(e.to_string().contains("object"), "{e}");
    }
}
