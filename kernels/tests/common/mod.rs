//! Helpers shared by the integration tests: the stories260K directory, temp
//! directories, toy checkpoints written on the fly, and an independent naive
//! forward pass to check the engine against.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use tokenwire_core::rng::Rng;
use tokenwire_core::{Pooling, SamplingParams, SeqId, SeqStep, StepPlan, TokenId, TokenLogprobs};
use tokenwire_kernels::{Engine, Model};

pub mod gguf_out;

/// The stories260K directory kept in the repository (`models/stories260K`,
/// the model `tokenwire serve` has built in).
pub fn stories_dir() -> PathBuf {
    tokenwire_kernels::builtin::stories260k_source_dir()
}

/// SmolLM2-135M-Instruct as a Q4_1 GGUF file (`scripts/fetch-smollm2-gguf.sh`
/// puts it in `target/models`; `TOKENWIRE_SMOLLM2_GGUF` names another
/// place), or `None` with the reason printed when it is absent outside CI.
/// In CI (`CI=true`) a missing file fails the test.
pub fn smollm2_gguf() -> Option<PathBuf> {
    let path = std::env::var_os("TOKENWIRE_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/models/SmolLM2-135M-Instruct.Q4_1.gguf"
            ))
        });
    if path.exists() {
        return Some(path);
    }
    let msg = format!(
        "{} not found (scripts/fetch-smollm2-gguf.sh fetches it)",
        path.display()
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg} (required when CI=true)");
    }
    eprintln!("skipping: {msg}");
    None
}

/// REFERENCE.json of stories260K.
pub fn reference(dir: &Path) -> Value {
    let bytes = std::fs::read(dir.join("REFERENCE.json")).expect("REFERENCE.json readable");
    serde_json::from_slice(&bytes).expect("REFERENCE.json is JSON")
}

/// A JSON array of ids as token ids.
pub fn ids(v: &Value) -> Vec<TokenId> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as TokenId)
        .collect()
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "tokenwire-kernels-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, data: impl AsRef<[u8]>) {
        std::fs::write(self.0.join(name), data).expect("write temp file");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A word-level tokenizer.json over `vocab` ids ("w0", "w1", ...; 0 = `<unk>`).
pub fn toy_tokenizer_json(vocab: usize) -> String {
    let mut words = serde_json::Map::new();
    words.insert("<unk>".into(), json!(0));
    for i in 1..vocab {
        words.insert(format!("w{i}"), json!(i));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"}
    })
    .to_string()
}

/// How to write a toy checkpoint.
#[derive(Clone, Copy)]
pub struct Toy {
    pub qwen: bool,
    pub dtype: Dtype,
    pub shards: usize,
    pub seed: u64,
}

impl Default for Toy {
    fn default() -> Self {
        Toy {
            qwen: false,
            dtype: Dtype::F32,
            shards: 0,
            seed: 1,
        }
    }
}

pub const TOY_VOCAB: usize = 40;
const H: usize = 16;
const INTER: usize = 24;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV: usize = 2;
const HD: usize = 4;

/// Names and shapes of the toy's tensors.
pub fn toy_shapes(qwen: bool) -> Vec<(String, Vec<usize>)> {
    let mut v = vec![("model.embed_tokens.weight".to_string(), vec![TOY_VOCAB, H])];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![H]));
        v.push((format!("{p}.post_attention_layernorm.weight"), vec![H]));
        v.push((format!("{p}.self_attn.q_proj.weight"), vec![HEADS * HD, H]));
        v.push((format!("{p}.self_attn.k_proj.weight"), vec![KV * HD, H]));
        v.push((format!("{p}.self_attn.v_proj.weight"), vec![KV * HD, H]));
        v.push((format!("{p}.self_attn.o_proj.weight"), vec![H, HEADS * HD]));
        if qwen {
            v.push((format!("{p}.self_attn.q_proj.bias"), vec![HEADS * HD]));
            v.push((format!("{p}.self_attn.k_proj.bias"), vec![KV * HD]));
            v.push((format!("{p}.self_attn.v_proj.bias"), vec![KV * HD]));
        }
        v.push((format!("{p}.mlp.gate_proj.weight"), vec![INTER, H]));
        v.push((format!("{p}.mlp.up_proj.weight"), vec![INTER, H]));
        v.push((format!("{p}.mlp.down_proj.weight"), vec![H, INTER]));
    }
    v.push(("model.norm.weight".into(), vec![H]));
    if !qwen {
        v.push(("lm_head.weight".into(), vec![TOY_VOCAB, H]));
    }
    v
}

/// The toy's config.json: Llama (untied head, no biases) or Qwen2 (biases, tied, no head_dim).
pub fn toy_config(qwen: bool) -> Value {
    let mut c = json!({
        "hidden_size": H, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": TOY_VOCAB,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2,
    });
    if qwen {
        c["architectures"] = json!(["Qwen2ForCausalLM"]);
        c["model_type"] = json!("qwen2");
        c["rope_theta"] = json!(1000000.0);
        c["tie_word_embeddings"] = json!(true);
        c["use_sliding_window"] = json!(false);
    } else {
        c["architectures"] = json!(["LlamaForCausalLM"]);
        c["head_dim"] = json!(HD);
        c["rope_theta"] = json!(10000);
        c["tie_word_embeddings"] = json!(false);
        c["_name_or_path"] = json!("toy-llama");
    }
    c
}

/// Seeded values for the toy's tensors, already rounded to what `dtype` can hold.
pub fn toy_values(toy: &Toy) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = Rng::new(toy.seed);
    toy_shapes(toy.qwen)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let norm = name.ends_with("layernorm.weight") || name == "model.norm.weight";
            let vals: Vec<f32> = (0..n)
                .map(|_| {
                    let u = rng.next_f64() as f32 * 2.0 - 1.0;
                    let x = if norm { 1.0 + 0.2 * u } else { 0.5 * u };
                    round_to(toy.dtype, x)
                })
                .collect();
            (name, shape, vals)
        })
        .collect()
}

pub fn round_to(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::F16 => half::f16::from_f32(x).to_f32(),
        Dtype::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

pub fn encode(dtype: Dtype, vals: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F16 => vals
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::BF16 => vals
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        _ => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Serialises `tensors` (name, shape, bytes) with the safetensors crate.
pub fn safetensors_bytes(dtype: Dtype, tensors: &[(String, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(dtype, s.clone(), b).expect("consistent tensor"),
            )
        })
        .collect();
    safetensors::serialize(views, None).expect("serialize")
}

/// Head width of the Qwen3 toy: twice the stream's width over the heads,
/// as Qwen3's heads of 128 over a 1,024-wide stream are.
pub const QWEN3_HD: usize = 2 * HD;

/// The llama toy as a Qwen3 checkpoint: `Qwen3ForCausalLM` with heads of
/// [`QWEN3_HD`] (its q, k, v and o drawn anew at that width) and a per-head
/// `q_norm` and `k_norm` in every layer (seeded weights around 1).
pub fn write_qwen3_toy(dir: &TempDir, toy: &Toy) {
    dir.write("config.json", qwen3_toy_config().to_string());
    dir.write("tokenizer.json", toy_tokenizer_json(TOY_VOCAB));
    write_weights(dir, toy.dtype, toy.shards, &qwen3_toy_tensors(toy));
}

/// The Qwen3 toy's config.json.
pub fn qwen3_toy_config() -> Value {
    let mut cfg = toy_config(false);
    cfg["architectures"] = json!(["Qwen3ForCausalLM"]);
    cfg["model_type"] = json!("qwen3");
    cfg["_name_or_path"] = json!("toy-qwen3");
    cfg["head_dim"] = json!(QWEN3_HD);
    cfg
}

/// The Qwen3 toy's tensors (name, shape, bytes in `toy.dtype`).
pub fn qwen3_toy_tensors(toy: &Toy) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let mut rng = Rng::new(toy.seed ^ 0x9e37);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = toy_values(toy)
        .into_iter()
        .map(|(n, s, v)| {
            let wide = match n.rsplit('.').nth(1) {
                Some("q_proj") => Some(vec![HEADS * QWEN3_HD, H]),
                Some("k_proj" | "v_proj") => Some(vec![KV * QWEN3_HD, H]),
                Some("o_proj") => Some(vec![H, HEADS * QWEN3_HD]),
                _ => None,
            };
            match wide {
                Some(shape) => {
                    let vals: Vec<f32> = (0..shape.iter().product())
                        .map(|_| round_to(toy.dtype, 0.5 * (rng.next_f64() as f32 * 2.0 - 1.0)))
                        .collect();
                    (n, shape, encode(toy.dtype, &vals))
                }
                None => (n, s, encode(toy.dtype, &v)),
            }
        })
        .collect();
    for l in 0..LAYERS {
        for which in ["q_norm", "k_norm"] {
            let vals: Vec<f32> = (0..QWEN3_HD)
                .map(|_| round_to(toy.dtype, 1.0 + 0.6 * (rng.next_f64() as f32 - 0.5)))
                .collect();
            tensors.push((
                format!("model.layers.{l}.self_attn.{which}.weight"),
                vec![QWEN3_HD],
                encode(toy.dtype, &vals),
            ));
        }
    }
    tensors
}

/// The llama toy as a Phi-3 checkpoint: `Phi3ForCausalLM` with each
/// layer's q, k and v rows stacked in `qkv_proj` and its gate and up rows
/// in `gate_up_proj`, as Phi-3 stores them; the same values as
/// [`write_toy`]'s, so it computes what the llama toy does. `rope_scaling`
/// goes into the config as given (with `original_max_position_embeddings`
/// 32 at the top level, as Phi-3's config has it).
pub fn write_phi3_toy(dir: &TempDir, toy: &Toy, rope_scaling: Value) {
    dir.write("config.json", phi3_toy_config(rope_scaling).to_string());
    dir.write("tokenizer.json", toy_tokenizer_json(TOY_VOCAB));
    write_weights(dir, toy.dtype, toy.shards, &phi3_toy_tensors(toy));
}

/// The Phi-3 toy's config.json.
pub fn phi3_toy_config(rope_scaling: Value) -> Value {
    let mut cfg = toy_config(false);
    cfg["architectures"] = json!(["Phi3ForCausalLM"]);
    cfg["model_type"] = json!("phi3");
    cfg["_name_or_path"] = json!("toy-phi3");
    cfg["original_max_position_embeddings"] = json!(32);
    cfg["rope_scaling"] = rope_scaling;
    cfg
}

/// The Phi-3 toy's tensors: the llama toy's, stacked.
pub fn phi3_toy_tensors(toy: &Toy) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let values: std::collections::HashMap<String, Vec<f32>> = toy_values(toy)
        .into_iter()
        .map(|(n, _, v)| (n, v))
        .collect();
    let mut out = Vec::new();
    for (name, shape) in toy_shapes(false) {
        let stacked = |parts: &[&str]| -> Vec<f32> {
            parts
                .iter()
                .flat_map(|p| values[&name.replace("q_proj", p).replace("gate_proj", p)].clone())
                .collect()
        };
        let (name, shape, vals) = if name.ends_with("q_proj.weight") {
            let vals = stacked(&["q_proj", "k_proj", "v_proj"]);
            let rows = vals.len() / H;
            (name.replace("q_proj", "qkv_proj"), vec![rows, H], vals)
        } else if name.ends_with("gate_proj.weight") {
            let vals = stacked(&["gate_proj", "up_proj"]);
            (
                name.replace("gate_proj", "gate_up_proj"),
                vec![2 * INTER, H],
                vals,
            )
        } else if name.ends_with("k_proj.weight")
            || name.ends_with("v_proj.weight")
            || name.ends_with("up_proj.weight")
        {
            continue;
        } else {
            let vals = values[&name].clone();
            (name, shape, vals)
        };
        out.push((name, shape, encode(toy.dtype, &vals)));
    }
    out
}

/// Writes a complete toy model directory (config, weights, tokenizer).
pub fn write_toy(dir: &TempDir, toy: &Toy) {
    dir.write("config.json", toy_config(toy.qwen).to_string());
    dir.write("tokenizer.json", toy_tokenizer_json(TOY_VOCAB));
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = toy_values(toy)
        .into_iter()
        .map(|(n, s, v)| (n, s, encode(toy.dtype, &v)))
        .collect();
    write_weights(dir, toy.dtype, toy.shards, &tensors);
}

/// Writes `tensors` as one `model.safetensors` (`shards == 0`) or as `shards`
/// files plus `model.safetensors.index.json`.
pub fn write_weights(
    dir: &TempDir,
    dtype: Dtype,
    shards: usize,
    tensors: &[(String, Vec<usize>, Vec<u8>)],
) {
    if shards == 0 {
        dir.write("model.safetensors", safetensors_bytes(dtype, tensors));
        return;
    }
    let mut map = serde_json::Map::new();
    for s in 0..shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let part: Vec<_> = tensors
            .iter()
            .enumerate()
            .filter(|(i, _)| i % shards == s)
            .map(|(_, t)| t.clone())
            .collect();
        for t in &part {
            map.insert(t.0.clone(), json!(file));
        }
        dir.write(&file, safetensors_bytes(dtype, &part));
    }
    dir.write(
        "model.safetensors.index.json",
        json!({"metadata": {"total_size": 0}, "weight_map": map}).to_string(),
    );
}

/// One sequence's chunk for a plan.
pub fn seq_step(
    seq: u64,
    tokens: &[TokenId],
    start_pos: u32,
    table: &[u32],
    sample: bool,
) -> SeqStep {
    SeqStep {
        seq: SeqId(seq),
        tokens: tokens.to_vec(),
        start_pos,
        block_table: table.to_vec(),
        sampling: SamplingParams::greedy(),
        sample,
        logprobs: None,
        cached_prefix: Vec::new(),
        allowed: None,
        draft: Vec::new(),
        embed: None,
        prompt_logprobs: None,
    }
}

pub fn plan(step_id: u64, seqs: Vec<SeqStep>) -> StepPlan {
    StepPlan {
        step_id,
        seqs,
        ..Default::default()
    }
}

/// The embedding of `tokens` pooled by `pooling`, fed from position 0 in
/// chunks of `chunk` tokens, one step each, on a fresh sequence (freed after).
pub fn embed_alone(
    engine: &mut Engine,
    tokens: &[TokenId],
    pooling: Pooling,
    chunk: usize,
) -> Vec<f32> {
    let bs = engine.model_info().block_size as usize;
    let table: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32 + 1).collect();
    let mut got = None;
    let mut start = 0;
    let mut step_id = 2_000_000;
    while start < tokens.len() {
        let end = (start + chunk).min(tokens.len());
        let mut s = seq_step(
            998,
            &tokens[start..end],
            start as u32,
            &table,
            end == tokens.len(),
        );
        s.embed = Some(pooling);
        let done = engine
            .step(&plan(step_id, vec![s]))
            .expect("embedding step");
        step_id += 1;
        if end < tokens.len() {
            assert!(done.results.is_empty(), "a middle chunk returns nothing");
        } else {
            assert_eq!(done.results.len(), 1, "the last chunk returns the vector");
            got = done.results[0].embedding.clone();
        }
        start = end;
    }
    engine
        .step(&StepPlan {
            step_id,
            free: vec![SeqId(998)],
            ..Default::default()
        })
        .expect("free");
    got.expect("an embedding")
}

/// stories260K on the CPU engine, with default options.
pub fn stories_cpu_engine() -> Engine {
    Engine::load(&stories_dir(), &tokenwire_kernels::EngineOptions::default())
        .expect("stories260K loads")
}

/// A prompt of a dozen words, as `engine` tokenizes it (BOS first).
pub fn cat_prompt(engine: &Engine) -> Vec<TokenId> {
    engine
        .codec()
        .encode(
            "The cat sat on the mat and looked at the big red ball.",
            true,
        )
        .expect("encode")
}

/// The prompt logprobs of `tokens` ([`SeqStep::prompt_logprobs`] with
/// `top` alternatives), fed from position 0 in chunks of `chunk` tokens,
/// one step each, on a fresh sequence (freed after), with the token sampled
/// after them.
pub fn score_alone(
    engine: &mut Engine,
    tokens: &[TokenId],
    top: u8,
    chunk: usize,
) -> (Vec<TokenLogprobs>, TokenId) {
    let bs = engine.model_info().block_size as usize;
    let table: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32 + 1).collect();
    let mut got = None;
    let mut start = 0;
    let mut step_id = 3_000_000;
    while start < tokens.len() {
        let end = (start + chunk).min(tokens.len());
        let mut s = seq_step(
            997,
            &tokens[start..end],
            start as u32,
            &table,
            end == tokens.len(),
        );
        s.prompt_logprobs = Some(top);
        let done = engine.step(&plan(step_id, vec![s])).expect("scoring step");
        step_id += 1;
        if end < tokens.len() {
            assert!(done.results.is_empty(), "a middle chunk returns nothing");
        } else {
            assert_eq!(done.results.len(), 1, "the last chunk returns a token");
            let r = &done.results[0];
            got = Some((r.prompt_logprobs.clone().expect("scores"), r.token));
        }
        start = end;
    }
    engine
        .step(&StepPlan {
            step_id,
            free: vec![SeqId(997)],
            ..Default::default()
        })
        .expect("free");
    got.expect("scores")
}

/// Largest absolute difference of two equally long vectors.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Logits after feeding `tokens` from position 0 as one chunk on a fresh sequence.
pub fn logits_alone(engine: &mut Engine, tokens: &[TokenId]) -> Vec<f32> {
    let bs = engine.model_info().block_size as usize;
    let table: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32).collect();
    let p = StepPlan {
        step_id: 1_000_000,
        seqs: vec![seq_step(999, tokens, 0, &table, true)],
        free: vec![SeqId(999)],
        copy_blocks: vec![],
        forks: vec![],
    };
    engine.step(&p).expect("step alone");
    let row = engine.last_logits().next().expect("one row").to_vec();
    engine
        .step(&StepPlan {
            step_id: 1_000_001,
            free: vec![SeqId(999)],
            ..Default::default()
        })
        .expect("free");
    row
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// A straightforward f64 forward pass (whole sequence, no cache, no batching):
/// an independent check of the engine's arithmetic. Logits of the last token.
pub fn naive_logits(model: &Model, tokens: &[TokenId]) -> Vec<f32> {
    let c = model.config();
    let w = model.weights();
    let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads);
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let lin = |l: &tokenwire_kernels::Linear, x: &[f64]| -> Vec<f64> {
        let mut row = vec![0.0f32; l.in_dim()];
        (0..l.out_dim())
            .map(|o| {
                l.w.dequantize_row(o, &mut row);
                let s: f64 = row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum();
                s + l.b.as_ref().map_or(0.0, |b| b[o] as f64)
            })
            .collect()
    };
    let norm = |x: &[f64], wt: &[f32]| -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + c.rms_norm_eps as f64).sqrt();
        x.iter().zip(wt).map(|(v, &g)| v * r * g as f64).collect()
    };
    // LongRoPE (Phi-3): each pair's frequency over its factor from the list
    // in use, every cosine and sine times the attention factor. Other
    // scalings are not computed here.
    let (divisors, mscale): (Vec<f64>, f64) = match &c.rope_scaling {
        tokenwire_kernels::RopeScaling::LongRope {
            short,
            long,
            use_long,
            mscale,
            ..
        } => (if *use_long { long } else { short }.to_vec(), *mscale),
        tokenwire_kernels::RopeScaling::None => (vec![1.0; hd / 2], 1.0),
        other => panic!("the naive forward does not compute {other:?}"),
    };
    let inv: Vec<f64> = (0..hd / 2)
        .map(|i| 1.0 / (divisors[i] * c.rope_theta.powf(2.0 * i as f64 / hd as f64)))
        .collect();
    // Which element pairs with element i of a head (GGUF llamas interleave).
    let partner = |i: usize| match w.rope {
        tokenwire_kernels::RopeLayout::HalfSplit => (i, i + hd / 2),
        tokenwire_kernels::RopeLayout::Interleaved => (2 * i, 2 * i + 1),
    };
    let rope = |v: &mut [f64], pos: usize| {
        for head in v.chunks_mut(hd) {
            for (i, f) in inv.iter().enumerate() {
                let a = pos as f64 * f;
                let (i0, i1) = partner(i);
                let (x0, x1) = (head[i0], head[i1]);
                let (cos, sin) = (a.cos() * mscale, a.sin() * mscale);
                head[i0] = x0 * cos - x1 * sin;
                head[i1] = x1 * cos + x0 * sin;
            }
        }
    };
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| {
            let mut row = vec![0.0f32; h];
            w.embed.dequantize_row(t as usize, &mut row);
            f(&row)
        })
        .collect();
    for l in &w.layers {
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        let mut qs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let xn = norm(x, &l.input_norm);
            let mut q = lin(&l.q, &xn);
            let mut k = lin(&l.k, &xn);
            if let Some(qk) = &l.qk_norm {
                // Qwen3: every head RMS-normalised with its own weights.
                for head in q.chunks_mut(hd) {
                    head.copy_from_slice(&norm(head, &qk.q));
                }
                for head in k.chunks_mut(hd) {
                    head.copy_from_slice(&norm(head, &qk.k));
                }
            }
            rope(&mut q, pos);
            rope(&mut k, pos);
            qs.push(q);
            ks.push(k);
            vs.push(lin(&l.v, &xn));
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let mut att = vec![0.0; nh * hd];
            for head in 0..nh {
                let g = head / (nh / nkv);
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let k = &ks[j][g * hd..(g + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for d in 0..hd {
                        att[head * hd + d] += p / z * vs[j][g * hd + d];
                    }
                }
            }
            let o = lin(&l.o, &att);
            for (a, b) in x.iter_mut().zip(o) {
                *a += b;
            }
            let xn = norm(x, &l.post_norm);
            let g = lin(&l.gate, &xn);
            let u = lin(&l.up, &xn);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = lin(&l.down, &act);
            for (a, b) in x.iter_mut().zip(d) {
                *a += b;
            }
        }
    }
    let last = norm(xs.last().expect("tokens"), &w.norm);
    let head = match &w.lm_head {
        Some(l) => lin(l, &last),
        None => (0..c.vocab_size)
            .map(|v| {
                let mut row = vec![0.0f32; h];
                w.embed.dequantize_row(v, &mut row);
                row.iter().zip(&last).map(|(&a, b)| a as f64 * b).sum()
            })
            .collect(),
    };
    head.into_iter().map(|x| x as f32).collect()
}

/// Several sequences at different stages in one step (mid-prefill chunks,
/// last chunks, decodes), on shuffled non-contiguous block tables, must give
/// the logits each gets alone in one chunk (which also checks chunked prefill).
pub fn batched_parity(engine: &mut Engine, alone: &mut Engine, toks: &[Vec<TokenId>], tol: f32) {
    let (a, b, c, d) = (&toks[0], &toks[1], &toks[2], &toks[3]);
    assert!(
        a.len() > 12 && b.len() > 26 && d.len() > 8,
        "prompts long enough"
    );
    let bs = engine.model_info().block_size as usize;
    // Non-contiguous, interleaved block tables from a shuffled pool.
    let nb = engine.model_info().num_blocks;
    let mut pool: Vec<u32> = (0..nb).collect();
    let mut rng = tokenwire_core::rng::Rng::new(99);
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut next = pool.into_iter();
    let mut table = |len: usize| -> Vec<u32> { next.by_ref().take(len.div_ceil(bs)).collect() };
    let (ta, tb, tc, td) = (
        table(a.len()),
        table(b.len()),
        table(c.len()),
        table(d.len()),
    );

    let check = |engine: &Engine, alone: &mut Engine, which: &[&[TokenId]]| {
        let rows: Vec<Vec<f32>> = engine.last_logits().map(|r| r.to_vec()).collect();
        assert_eq!(rows.len(), which.len());
        for (row, t) in rows.iter().zip(which) {
            let want = logits_alone(alone, t);
            let diff = max_abs_diff(row, &want);
            assert!(
                diff <= tol,
                "batched vs alone differ by {diff} after {} tokens",
                t.len()
            );
        }
    };

    // Step 1: A and B mid-prefill (no sample), D's first chunk sampled.
    engine
        .step(&plan(
            1,
            vec![
                seq_step(1, &a[..10], 0, &ta, false),
                seq_step(2, &b[..10], 0, &tb, false),
                seq_step(4, &d[..7], 0, &td, true),
            ],
        ))
        .expect("step 1");
    check(engine, alone, &[&d[..7]]);
    // Step 2: A's second chunk up to its last token.
    let la = a.len();
    engine
        .step(&plan(2, vec![seq_step(1, &a[10..la - 1], 10, &ta, true)]))
        .expect("step 2");
    check(engine, alone, &[&a[..la - 1]]);
    // Step 3: A decodes, B mid-prefill, C whole prompt, D the rest of its prompt.
    let done = engine
        .step(&plan(
            3,
            vec![
                seq_step(1, &a[la - 1..], la as u32 - 1, &ta, true),
                seq_step(2, &b[10..25], 10, &tb, false),
                seq_step(3, c, 0, &tc, true),
                seq_step(4, &d[7..], 7, &td, true),
            ],
        ))
        .expect("step 3");
    assert_eq!(done.results.len(), 3);
    let seqs: Vec<u64> = done.results.iter().map(|r| r.seq.0).collect();
    assert_eq!(seqs, vec![1, 3, 4]);
    check(engine, alone, &[a, c, d]);
    // Step 4: B's last chunk: right only if step 3 wrote its middle chunk's KV correctly.
    engine
        .step(&plan(4, vec![seq_step(2, &b[25..], 25, &tb, true)]))
        .expect("step 4");
    check(engine, alone, &[b]);
}

/// A small byte-level BPE (GPT-2 style): every byte, a few merges, and three
/// odd tokens (one outside the byte map, one special, one added).
pub fn byte_level_bpe() -> tokenwire_kernels::HfCodec {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(
            tokenwire_kernels::tokenizer::byte_level_char(b).to_string(),
            json!(b as u32),
        );
    }
    let merges = [
        "Ġ t", "Ġt h", "Ġth e", "h e", "i n", "Ġ a", "a n", "an d", "Ġ and",
    ];
    let mut next = 256u32;
    for m in merges {
        vocab.insert(m.replace(' ', ""), json!(next));
        next += 1;
    }
    // A piece outside the byte map (decoded as its own UTF-8), a special
    // token and an added token that is not special.
    vocab.insert("中文".into(), json!(next));
    vocab.insert("<|endoftext|>".into(), json!(next + 1));
    vocab.insert("<tool>".into(), json!(next + 2));
    let tj = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": next + 1, "content": "<|endoftext|>", "single_word": false,
                          "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                         {"id": next + 2, "content": "<tool>", "single_word": false,
                          "lstrip": false, "rstrip": false, "normalized": false, "special": false}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    });
    let tokenizer =
        tokenizers::Tokenizer::from_bytes(tj.to_string().as_bytes()).expect("tokenizer");
    tokenwire_kernels::HfCodec::new(tokenizer, None)
}

/// Steps one sequence with drafts of every kind (the true continuation, one
/// wrong at its start or in its middle, from one to five tokens) and checks
/// that each step yields the confirmed draft tokens and one more, each the
/// token (and logprobs, within `tol`) that plain one-token steps of another
/// sequence yield at that position, and that the engine's history of the
/// drafted sequence holds exactly the tokens fed and confirmed.
pub fn drafts_yield_the_plain_tokens(
    engine: &mut Engine,
    sampling: &SamplingParams,
    logprobs: Option<u8>,
    tol: f32,
) {
    use tokenwire_core::SeqResult;
    let info = engine.model_info();
    let (bs, vocab) = (info.block_size as usize, info.vocab_size);
    let prompt: Vec<TokenId> = (0..9).map(|i| (i * 7 + 3) % vocab).collect();
    let n = 24;
    let blocks = (prompt.len() + n + 16).div_ceil(bs) as u32;
    assert!(2 * blocks <= info.num_blocks, "pool too small for the test");
    let tables = [
        (0..blocks).collect::<Vec<u32>>(),
        (blocks..2 * blocks).collect(),
    ];
    let step = |seq: u64, tokens: &[TokenId], start: usize, draft: Vec<TokenId>| SeqStep {
        sampling: sampling.clone(),
        logprobs,
        draft,
        ..seq_step(seq, tokens, start as u32, &tables[seq as usize - 1], true)
    };
    let mut id = 0;
    let mut run = |engine: &mut Engine, s: SeqStep| -> Vec<SeqResult> {
        id += 1;
        engine.step(&plan(id, vec![s])).expect("step").results
    };

    let mut plain = run(engine, step(1, &prompt, 0, vec![]));
    while plain.len() < n + 8 {
        let last = plain.last().expect("a token").token;
        let pos = prompt.len() + plain.len() - 1;
        let r = run(engine, step(1, &[last], pos, vec![]));
        assert_eq!(r.len(), 1, "one result without a draft");
        plain.extend(r);
    }

    let same = |a: &SeqResult, b: &SeqResult, at: usize| {
        assert_eq!(a.token, b.token, "token {at}");
        match (&a.logprobs, &b.logprobs) {
            (None, None) => {}
            (Some(x), Some(y)) => {
                assert!((x.logprob - y.logprob).abs() <= tol, "logprob {at}");
                assert_eq!(x.top.len(), y.top.len(), "alternatives {at}");
                for (p, q) in x.top.iter().zip(&y.top) {
                    assert!(p.0 == q.0 && (p.1 - q.1).abs() <= tol, "alternative {at}");
                }
            }
            _ => panic!("logprobs {at} on one side only"),
        }
    };
    let mut got = run(engine, step(2, &prompt, 0, vec![]));
    let mut kind = 0usize;
    let (mut drafted, mut confirmed_all) = (0, 0);
    while got.len() < n {
        let at = got.len();
        let len = 1 + kind % 5;
        let mut draft: Vec<TokenId> = plain[at..at + len].iter().map(|r| r.token).collect();
        match kind % 3 {
            0 => {}
            1 => draft[0] = (draft[0] + 1) % vocab,
            _ => draft[len / 2] = (draft[len / 2] + 1) % vocab,
        }
        kind += 1;
        let confirmed = draft
            .iter()
            .zip(&plain[at..])
            .take_while(|(d, p)| **d == p.token)
            .count();
        let last = got.last().expect("a token").token;
        let pos = prompt.len() + at - 1;
        let r = run(engine, step(2, &[last], pos, draft.clone()));
        assert_eq!(r.len(), confirmed + 1, "draft {draft:?} at {at}");
        for (i, x) in r.iter().enumerate() {
            same(x, &plain[at + i], at + i);
        }
        drafted += draft.len();
        confirmed_all += confirmed;
        got.extend(r);
        let mut fed = prompt.clone();
        fed.extend(got[..got.len() - 1].iter().map(|r| r.token));
        assert_eq!(engine.history(SeqId(2)), Some(&fed[..]), "history at {at}");
    }
    assert!(confirmed_all > 0 && confirmed_all < drafted);
}

/// [`drafts_yield_the_plain_tokens`] greedy, then sampled (temperature,
/// top-p, a repetition penalty, seeded) with logprobs, each on a fresh
/// engine from `engine` (`None`: no adapter, nothing to check).
pub fn drafts_greedy_and_sampled(engine: impl Fn() -> Option<Engine>, tol: f32) {
    let sampled = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        repetition_penalty: 1.1,
        seed: 77,
        ..SamplingParams::default()
    };
    for (params, logprobs) in [(SamplingParams::greedy(), None), (sampled, Some(3))] {
        let Some(mut e) = engine() else {
            return;
        };
        drafts_yield_the_plain_tokens(&mut e, &params, logprobs, tol);
    }
}
