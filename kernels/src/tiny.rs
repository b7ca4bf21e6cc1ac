//! The built-in tiny model: seeded random weights over the byte-level
//! [`ByteCodec`](tokenwire_core::text::byte::ByteCodec) vocabulary. It writes
//! noise, but it runs the real forward pass, so tests and demos need no files.

use tokenwire_core::rng::Rng;
use tokenwire_core::text::byte::{BYTE_BOS, BYTE_EOS, BYTE_VOCAB};

use crate::config::ModelConfig;
use crate::model::Model;
use crate::rope::{RopeLayout, RopeScaling};
use crate::tensor::WeightMatrix;
use crate::weights::{LayerWeights, Linear, Weights};

/// Shape of the tiny model: hidden 64, 2 layers, 4 heads over 2 KV heads of
/// width 16, MLP 128, the 259-token byte vocabulary, context 1024, untied head.
pub fn tiny_config() -> ModelConfig {
    ModelConfig {
        hidden_size: 64,
        intermediate_size: 128,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        vocab_size: BYTE_VOCAB as usize,
        max_position_embeddings: 1024,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: false,
        attention_bias: false,
        qk_norm: false,
        fused_projections: false,
        bos_token_id: Some(BYTE_BOS),
        eos_token_ids: vec![BYTE_EOS],
        name_or_path: None,
    }
}

/// The tiny model with weights drawn from `seed` (same seed, same weights).
pub fn tiny_model(seed: u64) -> Model {
    let c = tiny_config();
    let mut rng = Rng::new(seed);
    let mut uniform = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
            .collect()
    };
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let q_out = c.num_heads * c.head_dim;
    let kv_out = c.num_kv_heads * c.head_dim;
    // Uniform(-a, a) with a = sqrt(3 / fan_in) has variance 1 / fan_in, which
    // keeps activations O(1) through the layers.
    let mut matrix = |rows: usize, cols: usize, scale: f32| match WeightMatrix::from_f32(
        rows,
        cols,
        uniform(rows * cols, scale),
    ) {
        Ok(m) => m,
        Err(e) => unreachable!("rows * cols values: {e}"),
    };
    let mut lin = |out_dim: usize, in_dim: usize| {
        Linear::new(matrix(out_dim, in_dim, (3.0 / in_dim as f32).sqrt()))
    };
    let mut layers = Vec::with_capacity(c.num_layers);
    for _ in 0..c.num_layers {
        layers.push(LayerWeights {
            input_norm: vec![1.0; h],
            q: lin(q_out, h),
            k: lin(kv_out, h),
            v: lin(kv_out, h),
            o: lin(h, q_out),
            post_norm: vec![1.0; h],
            gate: lin(i, h),
            up: lin(i, h),
            down: lin(h, i),
            qk_norm: None,
        });
    }
    let lm_head = Some(lin(c.vocab_size, h));
    let embed = matrix(c.vocab_size, h, 1.0);
    let weights = Weights {
        embed,
        layers,
        norm: vec![1.0; h],
        lm_head,
        dtype: "f32".into(),
        rope: RopeLayout::HalfSplit,
    };
    match Model::new(c, weights) {
        Ok(m) => m,
        // The shapes above are built from the same config they are checked against.
        Err(e) => unreachable!("tiny model is inconsistent: {e}"),
    }
}
