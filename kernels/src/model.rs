//! A model = validated config + weights that agree with it.

use std::path::Path;

use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::gguf::GgufFile;
use crate::model_dir::ModelDir;
use crate::quant::RowLayout;
use crate::tensor::{map_file, WeightMatrix};
use crate::weights::{Linear, Weights};

/// Config and weights of a llama-family decoder, checked to be consistent so
/// the backends can index without bounds surprises.
#[derive(Debug, Clone)]
pub struct Model {
    config: ModelConfig,
    weights: Weights,
}

impl Model {
    /// Loads `dir/config.json` and the safetensors weights of `dir`.
    pub fn load(dir: &Path) -> Result<Model, LoadError> {
        Model::load_from(&ModelDir::new(dir))
    }

    /// [`Model::load`] from a directory or a built-in model.
    pub fn load_from(dir: &ModelDir) -> Result<Model, LoadError> {
        let cfg_path = dir.path("config.json");
        let config = ModelConfig::from_json(&cfg_path, &dir.read_json("config.json")?)?;
        let weights = Weights::load_from(dir, &config)?;
        Model::new(config, weights).map_err(|msg| LoadError::json(cfg_path, msg))
    }

    /// Loads a GGUF file: its configuration, and its weights mapped from the
    /// file in their own dtypes. Returns the parsed header too (the
    /// tokenizer and generation settings are in its metadata).
    pub fn load_gguf(path: &Path) -> Result<(Model, GgufFile), LoadError> {
        let map = map_file(path).map_err(|source| LoadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let file = GgufFile::parse(&map).map_err(|e| LoadError::Gguf {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        let config = ModelConfig::from_gguf(path, &file, &map)?;
        let arch = file
            .str("general.architecture")
            .ok()
            .flatten()
            .unwrap_or_default()
            .to_owned();
        let weights = Weights::from_gguf(path, &map, &file, &config, &arch)?;
        let model = Model::new(config, weights).map_err(|msg| LoadError::Gguf {
            path: path.to_path_buf(),
            msg,
        })?;
        Ok((model, file))
    }

    /// Pairs `config` with `weights`, checking every tensor's size.
    pub fn new(config: ModelConfig, weights: Weights) -> Result<Model, String> {
        let c = &config;
        let h = c.hidden_size;
        let q_out = c.num_heads * c.head_dim;
        let kv_out = c.num_kv_heads * c.head_dim;
        let i = c.intermediate_size;
        let vec_len = |name: &str, v: &[f32], n: usize| {
            if v.len() == n {
                Ok(())
            } else {
                Err(format!("{name} has {} values, expected {n}", v.len()))
            }
        };
        let mat = |name: &str, m: &WeightMatrix, out_dim: usize, in_dim: usize| {
            if m.rows() != out_dim || m.cols() != in_dim {
                return Err(format!(
                    "{name} is [{}, {}], expected [{out_dim}, {in_dim}]",
                    m.rows(),
                    m.cols()
                ));
            }
            Ok(())
        };
        let lin = |name: &str, l: &Linear, out_dim: usize, in_dim: usize| {
            mat(name, &l.w, out_dim, in_dim)?;
            match &l.b {
                Some(b) => vec_len(name, b, out_dim),
                None => Ok(()),
            }
        };
        mat("embed_tokens", &weights.embed, c.vocab_size, h)?;
        if c.head_dim % 2 == 1 {
            return Err(format!("head_dim {} is odd; RoPE needs pairs", c.head_dim));
        }
        for divisors in c.rope_scaling.divisors() {
            if divisors.len() != c.head_dim / 2 {
                return Err(format!(
                    "{} RoPE divisors for {} rotary pairs",
                    divisors.len(),
                    c.head_dim / 2
                ));
            }
        }
        vec_len("norm", &weights.norm, h)?;
        if weights.layers.len() != c.num_layers {
            return Err(format!(
                "{} layers of weights, config says {}",
                weights.layers.len(),
                c.num_layers
            ));
        }
        for (n, l) in weights.layers.iter().enumerate() {
            vec_len(&format!("layer {n} input_layernorm"), &l.input_norm, h)?;
            vec_len(
                &format!("layer {n} post_attention_layernorm"),
                &l.post_norm,
                h,
            )?;
            lin(&format!("layer {n} q_proj"), &l.q, q_out, h)?;
            lin(&format!("layer {n} k_proj"), &l.k, kv_out, h)?;
            lin(&format!("layer {n} v_proj"), &l.v, kv_out, h)?;
            lin(&format!("layer {n} o_proj"), &l.o, h, q_out)?;
            lin(&format!("layer {n} gate_proj"), &l.gate, i, h)?;
            lin(&format!("layer {n} up_proj"), &l.up, i, h)?;
            lin(&format!("layer {n} down_proj"), &l.down, h, i)?;
            match (&l.qk_norm, c.qk_norm) {
                (Some(qk), true) => {
                    vec_len(&format!("layer {n} q_norm"), &qk.q, c.head_dim)?;
                    vec_len(&format!("layer {n} k_norm"), &qk.k, c.head_dim)?;
                }
                (None, false) => {}
                (Some(_), false) => {
                    return Err(format!(
                        "layer {n} has q/k norms the config does not ask for"
                    ))
                }
                (None, true) => return Err(format!("layer {n} has no q/k norms")),
            }
        }
        if let Some(head) = &weights.lm_head {
            lin("lm_head", head, c.vocab_size, h)?;
        }
        Ok(Model { config, weights })
    }

    /// This model as served with a context of `context` tokens: LongRoPE's
    /// factors are chosen by it ([`crate::rope::RopeScaling::for_context`]).
    pub fn for_context(mut self, context: usize) -> Model {
        self.config.rope_scaling = self.config.rope_scaling.for_context(context);
        self
    }

    /// The config.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The weights.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// This model with its matrices' rows in `layout` (see
    /// [`Weights::laid_out`]).
    pub fn laid_out(&self, layout: RowLayout) -> Model {
        Model {
            config: self.config.clone(),
            weights: self.weights.laid_out(layout),
        }
    }
}
