//! # tokenwire-kernels
//!
//! The model engine behind tokenwire's engine boundary: loading llama-family
//! models from Hugging Face directories (Llama, Mistral, Qwen2-style biases
//! and tied embeddings, Qwen3's per-head q/k norms, Llama 3 RoPE scaling;
//! f32/f16/bf16, single or sharded
//! safetensors; every file read through [`model_dir::ModelDir`], which is
//! also how the default model built into the binary, stories260K, loads:
//! [`Engine::builtin`], [`builtin`]) and from GGUF files ([`Model::load_gguf`]: configuration
//! ([`gguf_config`]), weights ([`gguf_weights`]), tokenizer and chat template
//! ([`gguf_tokenizer`]) from the file), every matrix kept in its file's dtype
//! and memory-mapped ([`tensor::WeightMatrix`]; on x86 the CPU backend keeps
//! an owned copy of the Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 matrices with each eight blocks
//! interleaved for its kernels, [`quant::lanes`]), ggml's quantized block
//! formats and their 8-bit-activation dot products in scalar, AVX2, AVX-VNNI,
//! AVX-512 VNNI and NEON code chosen at run time ([`quant`]), the tokenizer and chat
//! template ([`HfCodec`]; SentencePiece and byte-level decoders decode from a
//! per-id table built at load), a paged KV cache, two [`Backend`]s (CPU, on
//! a persistent worker pool; and WGSL kernels on wgpu: [`WgpuBackend`]),
//! embeddings (a sequence's final-normed hidden states pooled by the last
//! token or the mean, [`tokenwire_core::SeqStep::embed`]; the pooling a
//! model declares, [`pooling`]), prompt scoring (each prompt token's
//! logprob from the logits of the prefix before it, one row per token, a
//! chunk's last row carried to the next: `scoring`,
//! [`tokenwire_core::SeqStep::prompt_logprobs`]), and the deterministic
//! [`sample`] function.
//!
//! ```
//! use tokenwire_kernels::Engine;
//! let mut engine = Engine::tiny(7);
//! let prompt = engine.codec().encode("hi", true).expect("byte codec");
//! let ids = engine.generate_greedy(&prompt, 4, &[]).expect("valid plan");
//! assert_eq!(ids.len(), 4);
//! ```

pub mod backend;
pub mod builtin;
pub mod chat;
pub mod config;
pub mod engine;
pub mod error;
pub mod gguf_config;
pub mod gguf_tokenizer;
pub mod gguf_weights;
pub mod grammar;
pub mod kv;
pub mod model;
pub mod model_dir;
pub mod pooling;
pub mod progress;
pub mod quant;
pub mod rope;
pub mod sampler;
mod scoring;
pub mod tensor;
pub mod tiny;
pub mod tokenizer;
pub mod weights;

pub use backend::{
    ActivationPrecision, Backend, BackendKind, CpuBackend, ForwardOutput, SampleSpec, Sampled,
    SeqBatch, WgpuBackend, WgpuOptions,
};
pub use chat::ChatTemplate;
pub use config::{GenerationConfig, ModelConfig};
pub use engine::{default_kv_budget, Engine, EngineOptions, ModelIdentity};
pub use error::LoadError;
pub use grammar::GrammarEngine;
pub use model::Model;
pub use progress::LoadProgress;
pub use rope::{RopeLayout, RopeScaling};
pub use sampler::{draw_uniform, log_softmax, sample, Sampler};
pub use tensor::WeightMatrix;
pub use tokenizer::HfCodec;
pub use tokenwire_gguf as gguf;
pub use weights::{LayerWeights, Linear, QkNorm, Weights};
