//! The wgpu backend end to end: stories260K's golden greedy ids and logits,
//! and parity with the CPU backend (the reference) on random models in
//! several storage types, on batched, chunked steps over shuffled block
//! tables, with big-model code paths forced on small models (weights split
//! into chunks, steps split into passes, contexts split in decode attention).

mod common;
mod wgpu_support;

use std::sync::Arc;

use common::*;
use tokenwire_core::rng::Rng;
use tokenwire_core::testing::ByteCodec;
use tokenwire_core::{Pooling, SamplingParams, SeqId, StepPlan, TokenId};
use tokenwire_kernels::{
    ActivationPrecision, Backend, CpuBackend, Engine, ForwardOutput, LoadError, ModelIdentity,
    RopeScaling, SampleSpec, SeqBatch, WgpuBackend, WgpuOptions,
};
use wgpu_support::*;

/// Greedy parameters that outlive a test's `SampleSpec`s.
fn greedy() -> &'static SamplingParams {
    static GREEDY: std::sync::OnceLock<SamplingParams> = std::sync::OnceLock::new();
    GREEDY.get_or_init(SamplingParams::greedy)
}

fn stories() -> Option<(Engine, serde_json::Value)> {
    let dir = stories_dir();
    let engine = or_skip(Engine::load(&dir, &wgpu_options()))?;
    Some((engine, reference(&dir)))
}

#[test]
fn wgpu_stories_greedy_64_tokens_match_reference() {
    let Some((mut engine, r)) = stories() else {
        return;
    };
    assert_eq!(engine.backend_name(), "wgpu");
    let prompt = ids(&r["prompt_ids"]);
    let want = ids(&r["greedy_ids"]);
    let t = std::time::Instant::now();
    let got = engine.generate_greedy(&prompt, 64, &[]).expect("generate");
    eprintln!("64 greedy tokens through wgpu in {:?}", t.elapsed());
    assert_eq!(got, want);
    assert_eq!(
        engine.codec().decode(&got),
        r["greedy_text"].as_str().expect("text")
    );
    // Greedy steps read back ids only.
    assert_eq!(engine.last_logits().count(), 0);
}

#[test]
fn wgpu_stories_first_logits_and_batched_parity() {
    let Some((mut engine, r)) = stories() else {
        return;
    };
    engine.set_full_logits(true);
    let prompt = ids(&r["prompt_ids"]);
    let table: Vec<u32> = (0..5).collect();
    engine
        .step(&plan(1, vec![seq_step(7, &prompt, 0, &table, true)]))
        .expect("prefill");
    let logits = engine.last_logits().next().expect("row").to_vec();
    for top in r["first_step_top5"].as_array().expect("top5") {
        let id = top["id"].as_u64().expect("id") as usize;
        let want = top["logit"].as_f64().expect("logit") as f32;
        assert!(
            (logits[id] - want).abs() < 1e-3,
            "logit[{id}] = {}, reference {want}",
            logits[id]
        );
    }
    engine
        .step(&StepPlan {
            step_id: 2,
            free: vec![SeqId(7)],
            ..Default::default()
        })
        .expect("free");
    let dir = stories_dir();
    let mut alone = or_skip(Engine::load(&dir, &wgpu_options())).expect("second engine");
    alone.set_full_logits(true);
    let codec = engine.codec();
    let toks: Vec<Vec<TokenId>> = [
        "Once upon a time, there was a little girl named Lily. She loved to play.",
        "The cat sat on the mat and looked at the big red ball in the garden all day long.",
        "Tom had a dog.",
        "One day, a bird flew over the tree and sang a happy song.",
    ]
    .iter()
    .map(|t| codec.encode(t, true).expect("encode"))
    .collect();
    batched_parity(&mut engine, &mut alone, &toks, 1e-4);
}

fn wgpu_tiny_engine(seed: u64) -> Option<Engine> {
    let identity = ModelIdentity {
        name: "tokenwire-tiny".into(),
        version: "1".into(),
        eos_ids: vec![2],
    };
    or_skip(Engine::from_model(
        tokenwire_kernels::tiny::tiny_model(seed),
        ByteCodec::shared(),
        identity,
        &wgpu_options(),
    ))
}

#[test]
fn wgpu_engine_samples_like_the_cpu_engine() {
    // Greedy, temperature + top-p, repetition penalty, logprobs, all of them
    // at once, and more logprobs than the device computes: the wgpu engine
    // samples every row on the device (reading back only tokens and
    // logprobs), except the last, whose row comes back for the shared
    // sampler. The same tokens as the CPU engine, step after step; the same
    // again with the rows read back too (`set_full_logits`), which come back
    // as the model computed them, before the penalty.
    let Some(mut gpu) = wgpu_tiny_engine(31) else {
        return;
    };
    let Some(mut full) = wgpu_tiny_engine(31) else {
        return;
    };
    full.set_full_logits(true);
    let mut cpu = Engine::tiny(31);
    let params = [
        (SamplingParams::greedy(), None),
        (
            SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                seed: 5,
                ..SamplingParams::default()
            },
            None,
        ),
        (
            SamplingParams {
                repetition_penalty: 1.3,
                ..SamplingParams::greedy()
            },
            None,
        ),
        (SamplingParams::greedy(), Some(3u8)),
        (
            SamplingParams {
                temperature: 1.1,
                top_k: 20,
                top_p: 0.95,
                repetition_penalty: 1.2,
                seed: 9,
                ..SamplingParams::default()
            },
            Some(5),
        ),
        (
            SamplingParams {
                temperature: 0.7,
                seed: 11,
                ..SamplingParams::default()
            },
            Some(40),
        ),
    ];
    let prompts: Vec<Vec<TokenId>> = (0..params.len())
        .map(|i| {
            (0..5 + 3 * i as u32)
                .map(|t| 3 + (t * 11 + i as u32) % 250)
                .collect()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..params.len() as u32)
        .map(|i| (0..4).map(|b| 60 - 4 * i - b).collect())
        .collect();
    let mut feeds = prompts.clone();
    let mut pos = vec![0u32; params.len()];
    for step in 0..12u64 {
        let seqs = (0..params.len())
            .map(|i| {
                let mut s = seq_step(i as u64, &feeds[i], pos[i], &tables[i], true);
                s.sampling = params[i].0.clone();
                s.logprobs = params[i].1;
                s
            })
            .collect();
        let p = plan(step, seqs);
        let a = cpu.step(&p).expect("cpu step");
        let b = gpu.step(&p).expect("wgpu step");
        let c = full.step(&p).expect("wgpu step, rows kept");
        assert_eq!(b, c, "step {step}: keeping the rows changed the results");
        for (x, y) in a.results.iter().zip(&b.results) {
            assert_eq!(x.token, y.token, "step {step} seq {:?}", x.seq);
            match (&x.logprobs, &y.logprobs) {
                (Some(lx), Some(ly)) => {
                    assert!((lx.logprob - ly.logprob).abs() < 1e-3);
                    assert_eq!(lx.top.len(), ly.top.len());
                    for (tx, ty) in lx.top.iter().zip(&ly.top) {
                        assert_eq!(tx.0, ty.0, "step {step} seq {:?}", x.seq);
                        assert!((tx.1 - ty.1).abs() < 1e-3);
                    }
                }
                (None, None) => {}
                other => panic!("logprobs differ: {other:?}"),
            }
        }
        // Only the 40-logprob row came back; with full logits, every row,
        // unpenalised (the CPU engine's rows are the model's, before the
        // sampler).
        assert_eq!(gpu.last_logits().count(), 1, "step {step}");
        let rows: Vec<&[f32]> = full.last_logits().collect();
        let want: Vec<&[f32]> = cpu.last_logits().collect();
        assert_eq!(rows.len(), params.len());
        assert_eq!(want.len(), params.len(), "the CPU engine's rows");
        for (r, w) in rows.iter().zip(&want) {
            assert!(max_abs_diff(r, w) < 1e-3, "step {step}: rows differ");
        }
        for i in 0..params.len() {
            pos[i] += feeds[i].len() as u32;
            feeds[i] = vec![b.results[i].token];
        }
    }
}

#[test]
fn wgpu_copy_blocks_copies_kv_before_the_step() {
    let Some(mut e) = wgpu_tiny_engine(8) else {
        return;
    };
    e.set_full_logits(true);
    let toks: Vec<TokenId> = (0..20).map(|i| 3 + i * 5).collect();
    e.step(&plan(1, vec![seq_step(1, &toks[..16], 0, &[0], false)]))
        .expect("prefill");
    let p = StepPlan {
        step_id: 2,
        seqs: vec![seq_step(2, &toks[..16], 0, &[7], false)],
        copy_blocks: vec![(0, 5)],
        forks: vec![],
        free: vec![SeqId(1)],
    };
    e.step(&p).expect("copy");
    e.step(&plan(3, vec![seq_step(2, &toks[16..], 16, &[5, 6], true)]))
        .expect("continue");
    let got = e.last_logits().next().expect("row").to_vec();
    let want = logits_alone(&mut Engine::tiny(8), &toks);
    let diff = max_abs_diff(&got, &want);
    assert!(diff <= 1e-3, "wgpu after copy vs cpu: {diff}");
}

#[test]
fn wgpu_missing_adapter_is_an_error_value() {
    let model = Arc::new(tokenwire_kernels::tiny::tiny_model(1));
    let opts = WgpuOptions {
        adapter: Some("no-such-adapter-named-this".into()),
        ..f32_options()
    };
    match WgpuBackend::new(model, 16, 64, &opts) {
        Err(LoadError::Backend(msg)) => {
            assert!(
                msg.contains("no-such-adapter-named-this") || msg.contains("no GPU adapter"),
                "{msg}"
            );
            eprintln!("as expected: {msg}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an adapter matched a made-up name"),
    }
}

#[test]
fn wgpu_default_pool_takes_what_one_binding_holds() {
    // The tiny model's layer K pool is 2 heads x 16 slots x 16 values of
    // f32 a block: 2 KiB, so a 64 KiB binding holds 32 blocks.
    let model = Arc::new(tokenwire_kernels::tiny::tiny_model(1));
    let small = WgpuOptions {
        max_binding: Some(65536),
        ..f32_options()
    };
    let fitted = WgpuOptions {
        fit_kv_pool: true,
        ..small.clone()
    };
    let Some(gpu) = or_skip(WgpuBackend::new(model.clone(), 16, 1000, &fitted)) else {
        return;
    };
    assert_eq!(gpu.kv_blocks(), 32);
    let gpu = WgpuBackend::new(model.clone(), 16, 20, &fitted).expect("fits");
    assert_eq!(gpu.kv_blocks(), 20, "a pool that fits is kept");
    match WgpuBackend::new(model, 16, 1000, &small) {
        Err(LoadError::Backend(msg)) => assert!(msg.contains("largest storage binding"), "{msg}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an explicit pool above the binding was cut silently"),
    }
}

/// One step's worth of sequences for [`forward_both`].
struct Seq {
    tokens: Vec<TokenId>,
    table: Vec<u32>,
    fed: usize,
}

/// How far the wgpu backend's logits may be from the CPU backend's.
#[derive(Debug, Clone, Copy)]
struct Tol {
    /// NMSE of a logits row.
    nmse: f64,
    /// How far below the CPU's best a token picked on the device may score
    /// (a near-tie may flip).
    gap: f32,
}

/// f32 products throughout: only the order of the sums differs.
const F32_TOL: Tol = Tol {
    nmse: 1e-9,
    gap: 1e-4,
};

/// Cooperative-matrix products, whose weights and x are rounded to f16
/// (each product about 3e-8 away from the f32 one in the kernel tests).
const COOP_TOL: Tol = Tol {
    nmse: 1e-5,
    gap: 1e-2,
};

/// Runs the same steps through both backends: each step feeds every live
/// sequence a random chunk (prefill pieces of 1..=max_chunk tokens, later
/// single tokens), asks logits of random ones, and compares rows and argmax
/// ids. Returns the worst NMSE seen.
#[allow(clippy::too_many_arguments)]
fn forward_both(
    cpu: &mut CpuBackend,
    gpu: &mut WgpuBackend,
    rng: &mut Rng,
    seqs: &mut [Seq],
    steps: usize,
    max_chunk: usize,
    what: &str,
    tol: Tol,
) -> f64 {
    let mut worst = 0.0f64;
    for step in 0..steps {
        let mut chunks = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            if s.fed == s.tokens.len() {
                continue;
            }
            let left = s.tokens.len() - s.fed;
            let n = if step < 2 {
                1 + rng.below(max_chunk.min(left) as u64) as usize
            } else {
                1
            };
            let want = rng.below(3) != 0;
            chunks.push((i, s.fed, n, want, rng.below(2) == 0));
        }
        if chunks.is_empty() {
            break;
        }
        let batch: Vec<SeqBatch<'_>> = chunks
            .iter()
            .map(|&(i, fed, n, want, on_device)| SeqBatch {
                tokens: &seqs[i].tokens[fed..fed + n],
                start_pos: fed as u32,
                block_table: &seqs[i].table,
                want_logits: want,
                // Greedy on the device (the token comes back), or the row.
                sample: on_device.then(|| SampleSpec {
                    params: greedy(),
                    position: (fed + n) as u32,
                    history: &seqs[i].tokens[..fed + n],
                    logprobs: None,
                    allowed: None,
                }),
                keep_row: false,
                hidden: None,
            })
            .collect();
        let mut want = Vec::new();
        cpu.forward(&batch, &mut want).expect("cpu forward");
        let mut out = ForwardOutput::default();
        gpu.forward_select(&batch, &mut out).expect("wgpu forward");
        let vocab = gpu.model().config().vocab_size;
        let mut rows = out.logits.chunks_exact(vocab);
        assert_eq!(out.sampled.len(), want.len() / vocab);
        for (j, ((w, done), &has_row)) in want
            .chunks_exact(vocab)
            .zip(&out.sampled)
            .zip(&out.has_row)
            .enumerate()
        {
            assert_eq!(has_row, done.is_none(), "{what} step {step} row {j}");
            match done.as_ref().map(|d| d.token) {
                Some(id) => {
                    let a = argmax(w) as TokenId;
                    // A near-tie may legitimately flip.
                    let gap = w[a as usize] - w[id as usize];
                    assert!(
                        id == a || gap < tol.gap,
                        "{what} step {step} row {j}: argmax {id} vs cpu {a} (gap {gap})"
                    );
                }
                None => {
                    let got = rows.next().expect("row");
                    let e = nmse(got, w);
                    worst = worst.max(e);
                    assert!(e < tol.nmse, "{what} step {step} row {j}: nmse {e:e}");
                }
            }
        }
        assert!(rows.next().is_none());
        for &(i, _, n, _, _) in &chunks {
            seqs[i].fed += n;
        }
    }
    worst
}

fn case(shape: &Shape, opts: &WgpuOptions, bs: usize, nb: usize, seed: u64, what: &str) {
    let model = Arc::new(random_model(shape, seed));
    let Some(mut gpu) = or_skip(WgpuBackend::new(model.clone(), bs, nb, opts)) else {
        return;
    };
    against_cpu(&mut gpu, model, bs, nb, seed, what, F32_TOL);
}

/// [`forward_both`] on 1..=9 random sequences of up to 70 tokens over a
/// shuffled pool of `nb` blocks of `bs` slots, `gpu` against the CPU
/// backend on the same model; prints the worst logits NMSE and returns it.
fn against_cpu(
    gpu: &mut WgpuBackend,
    model: Arc<tokenwire_kernels::Model>,
    bs: usize,
    nb: usize,
    seed: u64,
    what: &str,
    tol: Tol,
) -> f64 {
    let vocab = model.config().vocab_size;
    // Quantized weights: the CPU reference widens them to f32 too.
    let mut cpu = CpuBackend::with(
        model,
        bs,
        nb,
        tokenwire_kernels::quant::Kernels::detect(),
        ActivationPrecision::F32,
    )
    .expect("cpu backend");
    let mut rng = Rng::new(seed);
    // 1..=9 sequences over a shuffled pool, each with a block at least.
    let n = 1 + rng.below(9.min(nb) as u64) as usize;
    let mut pool: Vec<u32> = (0..nb as u32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let per = nb / n;
    let mut seqs: Vec<Seq> = (0..n)
        .map(|i| {
            let len = 1 + rng.below((per * bs).min(70) as u64) as usize;
            Seq {
                tokens: (0..len)
                    .map(|_| rng.below(vocab as u64) as TokenId)
                    .collect(),
                table: pool[i * per..(i + 1) * per].to_vec(),
                fed: 0,
            }
        })
        .collect();
    let worst = forward_both(&mut cpu, gpu, &mut rng, &mut seqs, 6, 40, what, tol);
    eprintln!(
        "{what}: {n} seqs, {} weight chunks at most, dtypes {:?}, worst logits nmse {worst:e}",
        gpu.max_chunks(),
        gpu.weight_dtypes()
    );
    worst
}

const LLAMA: Shape = Shape {
    hidden: 48,
    inter: 100,
    layers: 2,
    heads: 6,
    kv_heads: 3,
    head_dim: 16,
    vocab: 301,
    tied: false,
    bias: false,
    dtype: "f32",
    scaling: RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64.0,
    },
    qk_norm: false,
};

const QWEN: Shape = Shape {
    hidden: 40,
    inter: 72,
    layers: 2,
    heads: 8,
    kv_heads: 2,
    head_dim: 8,
    vocab: 257,
    tied: true,
    bias: true,
    dtype: "bf16",
    scaling: RopeScaling::None,
    qk_norm: false,
};

const QUANT: Shape = Shape {
    hidden: 256,
    inter: 512,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    vocab: 301,
    tied: false,
    bias: false,
    dtype: "quant",
    scaling: RopeScaling::None,
    qk_norm: false,
};

const F16_MHA: Shape = Shape {
    hidden: 33,
    inter: 45,
    layers: 1,
    heads: 2,
    kv_heads: 2,
    head_dim: 32,
    vocab: 99,
    tied: false,
    bias: false,
    dtype: "f16",
    scaling: RopeScaling::Linear { factor: 2.0 },
    qk_norm: false,
};

/// Qwen3: every query and key head RMS-normalised before RoPE. Head
/// widths 32 (16 pairs: a workgroup of rope_kv takes 16 whole heads) and 24
/// (12 pairs: 21 heads, the last 4 invocations idle).
const QWEN3: Shape = Shape {
    hidden: 64,
    inter: 96,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    vocab: 211,
    tied: true,
    bias: false,
    dtype: "f32",
    scaling: RopeScaling::None,
    qk_norm: true,
};

#[test]
fn wgpu_normalises_qwen3_heads_as_the_cpu_backend_does() {
    let d = f32_options();
    case(&QWEN3, &d, 16, 64, 11, "qwen3, head_dim 32");
    let narrow = Shape {
        head_dim: 24,
        heads: 6,
        kv_heads: 3,
        ..QWEN3
    };
    case(&narrow, &d, 4, 200, 12, "qwen3, head_dim 24");
    // The q|k|v mat-vec's fused RoPE has no head norm: asked for, it is
    // left aside for such a model, and the logits are the same.
    let fused = WgpuOptions {
        fuse_rope: true,
        split_k: Some(true),
        ..d
    };
    case(&QWEN3, &fused, 16, 64, 13, "qwen3, fused RoPE asked for");
}

#[test]
fn wgpu_matches_cpu_backend_on_random_models() {
    let d = f32_options();
    case(&LLAMA, &d, 16, 64, 1, "llama f32, GQA 2, llama3 rope");
    case(&QWEN, &d, 5, 90, 2, "qwen bf16, biases, tied, GQA 4");
    case(&F16_MHA, &d, 3, 150, 3, "f16 MHA, odd hidden");
    let no_f16 = WgpuOptions {
        shader_f16: false,
        ..d.clone()
    };
    case(&F16_MHA, &no_f16, 3, 150, 4, "f16 packed (no shader-f16)");
}

#[test]
fn wgpu_applies_phi3_s_longrope_as_the_cpu_backend_does() {
    // Per-pair divisors and the attention factor on every cosine and sine,
    // through the separate RoPE pass and the q|k|v mat-vec's fused one.
    let factors = |base: f64| -> Arc<[f64]> { (0..8).map(|i| base + 0.7 * i as f64).collect() };
    let longrope = Shape {
        scaling: RopeScaling::LongRope {
            short: factors(1.0),
            long: factors(4.0),
            original_context: 32,
            use_long: true,
            mscale: 1.19,
        },
        ..LLAMA
    };
    let d = f32_options();
    case(&longrope, &d, 16, 64, 21, "llama, LongRoPE");
    let fused = WgpuOptions {
        fuse_rope: true,
        ..d
    };
    case(&longrope, &fused, 16, 64, 22, "llama, LongRoPE, fused RoPE");
}

#[test]
fn wgpu_runs_quantized_weights_as_blocks() {
    // Every matrix in a GGUF block type, q|k|v and gate|up stacks mixing
    // them: uploaded as blocks (no f32 copy) and unpacked by the kernels.
    let model = Arc::new(random_model(&QUANT, 8));
    let Some(gpu) = or_skip(WgpuBackend::new(model.clone(), 16, 8, &f32_options())) else {
        return;
    };
    let mut dts = gpu.weight_dtypes();
    dts.sort_by_key(|d| format!("{d:?}"));
    use tokenwire_kernels::backend::wgpu::WeightDtype as W;
    assert_eq!(
        dts,
        vec![
            W::Iq4Nl,
            W::Iq4Xs,
            W::Q2K,
            W::Q3K,
            W::Q4K,
            W::Q4_0,
            W::Q4_1,
            W::Q5K,
            W::Q5_0,
            W::Q5_1,
            W::Q6K,
            W::Q8_0
        ]
    );
    let file_bytes: u64 = {
        let w = model.weights();
        let mut n = w.lm_head.as_ref().map_or(0, |l| l.w.bytes().len());
        for l in &w.layers {
            for lin in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                n += lin.w.bytes().len();
            }
        }
        n as u64
    };
    // Only the padding of Q8_0, Q4_0, Q5_0, IQ4_NL, Q3_K and Q6_K blocks is added.
    let dev = gpu.weight_bytes();
    assert!(
        dev >= file_bytes && dev <= file_bytes + file_bytes / 16,
        "device {dev} bytes for {file_bytes} file bytes"
    );
    drop(gpu);
    let d = f32_options();
    case(&QUANT, &d, 16, 8, 8, "quantized, mixed stacks");
    let mat_vec_rows = WgpuOptions {
        split_k: Some(false),
        tiled_matmul: Some(false),
        ..d.clone()
    };
    case(
        &QUANT,
        &mat_vec_rows,
        16,
        8,
        9,
        "quantized, one invocation per row",
    );
    let tiled = WgpuOptions {
        split_k: Some(true),
        tiled_matmul: Some(true),
        mat_vec_max_rows: 2,
        max_binding: Some(65536),
        ..d
    };
    // Blocks of 4 slots, so a layer's K pool (32 x 2 KiB) fits the binding.
    case(
        &QUANT,
        &tiled,
        4,
        32,
        10,
        "quantized, tiled matmul, 64 KiB chunks",
    );
}

#[test]
fn wgpu_big_model_paths_on_small_models() {
    // Weights split into chunks of a 4 KiB binding, steps cut into passes of
    // at most 12 rows (and 3 logits rows per pass by the binding limit),
    // decode attention split every 8 positions, the tiled matmul for passes
    // of more than 8 rows, mat-vec rows split over invocations (the GPU
    // defaults, whatever this adapter is) and reduced through workgroup
    // memory alone (no subgroup shuffles).
    let small = WgpuOptions {
        max_binding: Some(4096),
        max_rows_per_pass: Some(12),
        decode_workgroups: Some(u32::MAX),
        decode_min_split: 8,
        tiled_matmul: Some(true),
        mat_vec_max_rows: 8,
        subgroups: false,
        split_k: Some(true),
        ..f32_options()
    };
    let shape = Shape {
        hidden: 32,
        inter: 40,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        ..QWEN
    };
    case(
        &shape,
        &small,
        4,
        16,
        5,
        "4 KiB bindings, 5-row passes, splits of 8",
    );
    // Only the decode kernel, then only the prefill kernel, for attention.
    // Mat-vec split over invocations for every pass, in groups of up to 64
    // columns (the first steps feed up to 9 x 40 rows).
    let decode_only = WgpuOptions {
        prefill_min_rows: usize::MAX,
        decode_workgroups: Some(u32::MAX),
        decode_min_split: 16,
        split_k: Some(true),
        tiled_matmul: Some(false),
        ..f32_options()
    };
    case(
        &LLAMA,
        &decode_only,
        16,
        64,
        6,
        "decode attention for every row",
    );
    // The same with the splits merged by attn_merge's dispatch rather than
    // folded into the last split's workgroup (the default).
    let merged = WgpuOptions {
        fold_merge: false,
        ..decode_only.clone()
    };
    case(
        &LLAMA,
        &merged,
        16,
        64,
        6,
        "decode attention for every row, splits merged by a dispatch",
    );
    let prefill_only = WgpuOptions {
        prefill_min_rows: 1,
        tiled_matmul: Some(true),
        mat_vec_max_rows: 4,
        ..f32_options()
    };
    case(
        &LLAMA,
        &prefill_only,
        16,
        64,
        7,
        "prefill attention for every row",
    );
}

#[test]
fn wgpu_coop_products_match_cpu_backend() {
    // Passes of at least `coop_min_rows` token rows multiply on cooperative
    // matrices (f16 tiles, f32 sums), the rest on mat-vec: every pass (one
    // decode row, LM head included), passes of 4 rows and more (mixing
    // both in one model), prefill-sized passes; f32, bf16 with biases and a
    // tied head, and every GGUF block type in mixed stacks; weights split
    // into chunks; and products split over k (partial sums, then their
    // sum) wherever k has 8 slabs. Each case checks that coop dispatches
    // ran (its profile), split ones where asked, and that their logits stay
    // near the CPU's, f16 rounding and all.
    use tokenwire_kernels::backend::wgpu::ProfileClock;
    // Small enough for a 4 KiB binding to hold a layer's K pool.
    const SMALL_QWEN: Shape = Shape {
        hidden: 32,
        inter: 40,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        ..QWEN
    };
    // Coop passes on the wide tile from this many rows.
    const SQUARE: usize = usize::MAX;
    const WIDE: usize = 1;
    #[derive(Clone, Copy)]
    struct Case {
        shape: &'static Shape,
        /// Coop from this many rows.
        rows: usize,
        binding: Option<u64>,
        /// Split k wherever it has 8 slabs (of 32).
        split: bool,
        wide_rows: usize,
        /// Passes that fit the tall tile take it.
        tall: bool,
        bs: usize,
        blocks: usize,
        what: &'static str,
    }
    let case = |shape, rows, split, wide_rows, bs, blocks, what| Case {
        shape,
        rows,
        binding: None,
        split,
        wide_rows,
        tall: false,
        bs,
        blocks,
        what,
    };
    let cases = [
        case(
            &LLAMA,
            1,
            false,
            SQUARE,
            16,
            64,
            "llama f32, every pass on coop",
        ),
        case(
            &QWEN,
            4,
            false,
            SQUARE,
            5,
            90,
            "qwen bf16, biases, tied, 4+ rows",
        ),
        case(
            &QUANT,
            2,
            false,
            SQUARE,
            16,
            8,
            "quantized, 2+ rows on coop",
        ),
        Case {
            binding: Some(4096),
            ..case(
                &SMALL_QWEN,
                1,
                false,
                SQUARE,
                4,
                16,
                "qwen bf16, 4 KiB chunks",
            )
        },
        case(
            &QUANT,
            1,
            true,
            SQUARE,
            16,
            8,
            "quantized, all on coop, k split",
        ),
        case(
            &QWEN,
            4,
            false,
            WIDE,
            5,
            90,
            "qwen bf16, 4+ rows, wide tiles",
        ),
        case(
            &QUANT,
            1,
            true,
            WIDE,
            16,
            8,
            "quantized, wide tiles, k split",
        ),
        Case {
            tall: true,
            ..case(
                &LLAMA,
                1,
                false,
                SQUARE,
                16,
                64,
                "llama f32, tall tiles for decode",
            )
        },
        Case {
            tall: true,
            ..case(
                &QUANT,
                2,
                true,
                SQUARE,
                16,
                8,
                "quantized, tall tiles, k split",
            )
        },
    ];
    // Split products summed by split_sum.wgsl's dispatch, then (the same
    // products: same seed) by the split that finishes last. A folded run's
    // profile cannot show its splits; its unfolded twin's split_sum
    // dispatches show the same products split.
    let runs = cases.iter().enumerate().flat_map(|(i, c)| {
        let folds: &[bool] = if c.split { &[false, true] } else { &[true] };
        folds.iter().map(move |&fold| (40 + i as u64, c, fold))
    });
    for (seed, c, fold) in runs {
        let Case {
            shape,
            bs,
            what,
            split,
            tall,
            ..
        } = *c;
        let nb = c.blocks;
        let opts = WgpuOptions {
            cooperative_matrix: true,
            coop_min_rows: c.rows,
            max_binding: c.binding,
            coop_k_slab: split.then_some(32),
            coop_split_workgroups: Some(if split { 1 << 20 } else { 0 }),
            coop_wide_rows: c.wide_rows,
            coop_tall: tall,
            coop_fold_splits: fold,
            ..f32_options()
        };
        let model = Arc::new(random_model(shape, seed));
        let Some(mut gpu) = or_skip(WgpuBackend::new(model.clone(), bs, nb, &opts)) else {
            return;
        };
        match gpu.coop() {
            Some(c) => {
                eprintln!("{}: cooperative matrices {c:?}", gpu.adapter());
                assert_eq!(c.fold, fold, "{what}: split sums folded");
            }
            None if coop_required() => panic!(
                "{}: no usable cooperative-matrix configuration (TOKENWIRE_REQUIRE_COOP=1)",
                gpu.adapter()
            ),
            None => {
                eprintln!("skipping: {} has no cooperative matrices", gpu.adapter());
                return;
            }
        }
        gpu.set_profiling(Some(ProfileClock::Host));
        against_cpu(&mut gpu, model, bs, nb, seed, what, COOP_TOL);
        let p = gpu.take_profile().expect("a profile");
        let coop: u64 = p
            .kernels
            .iter()
            .filter(|k| k.name.contains("coop_mat_mul"))
            .map(|k| k.calls)
            .sum();
        assert!(coop > 0, "{what}: no coop dispatch in {p:?}");
        let sums = p.kernels.iter().any(|k| k.name.contains("split_sum"));
        assert_eq!(
            sums,
            split && !fold,
            "{what}, fold {fold}: split sums in {p:?}"
        );
        // Every case has passes of a few rows: the tall tile takes them
        // where asked, and only there.
        let talls = p
            .kernels
            .iter()
            .any(|k| k.name.contains("coop_mat_mul tall"));
        assert_eq!(talls, tall, "{what}: tall-tile products in {p:?}");
    }
}

#[test]
fn wgpu_unbounded_loops_compute_the_same() {
    // Shaders compiled without wgpu's loop counters (the default: every
    // loop of them ends by construction) against shaders with them, on the
    // CPU adapters' and the GPUs' kernel variants: a prefill and decode
    // steps, logits rows and tokens sampled on the device.
    let model = Arc::new(random_model(&LLAMA, 13));
    for split_k in [false, true] {
        let opts = WgpuOptions {
            split_k: Some(split_k),
            ..f32_options()
        };
        let bounded_opts = WgpuOptions {
            loop_bounding: true,
            ..opts.clone()
        };
        let Some(mut bounded) = or_skip(WgpuBackend::new(model.clone(), 16, 8, &bounded_opts))
        else {
            return;
        };
        let mut free = WgpuBackend::new(model.clone(), 16, 8, &opts).expect("unbounded");
        let prompt: Vec<TokenId> = (0..20).map(|i| (i * 13 % 301) as TokenId).collect();
        let (table, table2) = ([2u32, 5], [3u32, 6]);
        let mut history = prompt.clone();
        for (step, start) in [(0usize, 0u32), (1, 20), (2, 21)] {
            let tokens = if step == 0 {
                prompt.clone()
            } else {
                vec![history[history.len() - 1]]
            };
            let mut outs = Vec::new();
            for b in [&mut bounded, &mut free] {
                let batch = row_and_sampled(&tokens, start, [&table, &table2], &history);
                let mut out = ForwardOutput::default();
                b.forward_select(&batch, &mut out).expect("step");
                outs.push(out);
            }
            let e = nmse(&outs[1].logits, &outs[0].logits);
            assert!(e < 1e-12, "split_k={split_k} step {step}: nmse {e:e}");
            let tok = |o: &ForwardOutput| {
                o.sampled
                    .iter()
                    .map(|s| s.as_ref().map(|d| d.token))
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                tok(&outs[1]),
                tok(&outs[0]),
                "split_k={split_k} step {step}"
            );
            if let Some(Some(d)) = outs[0].sampled.last() {
                history.push(d.token);
            }
        }
    }
}

#[test]
fn wgpu_early_submissions_compute_the_same() {
    // A step submitted in growing runs of dispatches (the default: the
    // device starts while the host records) against one submission a step,
    // on steps of several passes (a 20-token prompt in passes of 8 rows)
    // and decode steps, logits rows and tokens sampled on the device. The
    // kernels are the same, so the logits must be the same bits.
    let model = Arc::new(random_model(&LLAMA, 17));
    let backend = |first: usize| {
        let opts = WgpuOptions {
            first_submit: Some(first),
            max_rows_per_pass: Some(8),
            ..f32_options()
        };
        or_skip(WgpuBackend::new(model.clone(), 16, 8, &opts))
    };
    let Some(mut whole) = backend(0) else {
        return;
    };
    let mut runs: Vec<(usize, WgpuBackend)> = [1, 3, 8]
        .into_iter()
        .map(|f| (f, backend(f).expect("a second backend")))
        .collect();
    let prompt: Vec<TokenId> = (0..20).map(|i| (i * 7 % 301) as TokenId).collect();
    let (table, table2) = ([1u32, 4], [2u32, 7]);
    let mut history = prompt.clone();
    for (step, start) in [(0usize, 0u32), (1, 20), (2, 21), (3, 22)] {
        let tokens = if step == 0 {
            prompt.clone()
        } else {
            vec![history[history.len() - 1]]
        };
        let batch = row_and_sampled(&tokens, start, [&table, &table2], &history);
        let mut want = ForwardOutput::default();
        whole.forward_select(&batch, &mut want).expect("step");
        for (first, b) in &mut runs {
            let mut out = ForwardOutput::default();
            b.forward_select(&batch, &mut out).expect("step");
            assert!(
                out.logits == want.logits,
                "first submit {first}, step {step}: logits differ (nmse {:e})",
                nmse(&out.logits, &want.logits)
            );
            assert_eq!(
                out.sampled, want.sampled,
                "first submit {first}, step {step}"
            );
        }
        if let Some(Some(d)) = want.sampled.last() {
            history.push(d.token);
        }
    }
    let h = whole.take_host_times();
    assert_eq!((h.steps, h.submissions), (4, 4), "one submission a step");
    for (first, b) in &mut runs {
        let h = b.take_host_times();
        assert_eq!(h.steps, 4);
        assert!(
            h.submissions > h.steps,
            "first submit {first}: {} submissions in {} steps",
            h.submissions,
            h.steps
        );
    }
}

#[test]
fn wgpu_loading_reports_each_layer_uploaded() {
    use std::sync::Mutex;
    let seen: Arc<Mutex<Vec<(f32, String)>>> = Arc::default();
    let sink = seen.clone();
    let opts = tokenwire_kernels::EngineOptions {
        progress: Some(tokenwire_kernels::LoadProgress::new(move |f, what| {
            sink.lock().expect("lock").push((f, what.to_owned()))
        })),
        ..wgpu_options()
    };
    if or_skip(Engine::load(&stories_dir(), &opts)).is_none() {
        return;
    }
    let seen = seen.lock().expect("lock");
    let layers: Vec<&(f32, String)> = seen
        .iter()
        .filter(|(_, w)| w.starts_with("uploading layer"))
        .collect();
    // stories260K has 5 layers, uploaded between 30% and 100% of the load.
    assert_eq!(layers.len(), 5, "{seen:?}");
    assert_eq!(layers[4].1, "uploading layer 5 of 5 to the GPU");
    assert!(
        layers.iter().all(|(f, _)| (0.3..1.0).contains(f)),
        "{seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[0].0 <= w[1].0),
        "never backwards: {seen:?}"
    );
    assert_eq!(seen.last().expect("last"), &(1.0, "loaded".to_owned()));
}

/// `tokens` from `start` fed to two sequences on these block tables: the
/// first returns its logits row, the second is sampled greedily on the
/// device after `history`, with 3 logprobs.
fn row_and_sampled<'a>(
    tokens: &'a [TokenId],
    start: u32,
    [table, table2]: [&'a [u32]; 2],
    history: &'a [TokenId],
) -> [SeqBatch<'a>; 2] {
    [
        logits_step(tokens, start, table),
        SeqBatch {
            sample: Some(SampleSpec {
                params: greedy(),
                position: start + tokens.len() as u32,
                history,
                logprobs: Some(3),
                allowed: None,
            }),
            ..logits_step(tokens, start, table2)
        },
    ]
}

/// One sequence's step from `start_pos`, its logits row coming back.
fn logits_step<'a>(tokens: &'a [TokenId], start_pos: u32, table: &'a [u32]) -> SeqBatch<'a> {
    SeqBatch {
        tokens,
        start_pos,
        block_table: table,
        want_logits: true,
        sample: None,
        keep_row: false,
        hidden: None,
    }
}

#[test]
fn wgpu_fused_kernels_match_the_separate_ones() {
    // SiLU-times-up fused into the gate|up mat-vec, the RMSNorms into the
    // q|k|v and gate|up mat-vecs, and RoPE with the K/V write into the
    // q|k|v mat-vec, each on and off; with a hidden size
    // that 8 divides (the 8-wide loads) and one it does not (single values).
    fused_against_separate(&LLAMA);
    fused_against_separate(&Shape {
        hidden: 36,
        ..LLAMA
    });
}

fn fused_against_separate(shape: &Shape) {
    use tokenwire_kernels::backend::wgpu::ProfileClock;
    let model = Arc::new(random_model(shape, 12));
    // (fuse_glu, fuse_norm, fuse_rope, subgroups): the last sums the
    // fused norm's squares through workgroup memory alone.
    let combos = [
        (true, true, true, true),
        (true, false, true, true),
        (false, true, true, true),
        (false, false, false, true),
        (true, true, false, true),
        (true, false, false, true),
        (true, true, true, false),
    ];
    let mut backends = Vec::new();
    for (fuse_glu, fuse_norm, fuse_rope, subgroups) in combos {
        // Split-row mat-vec (the GPU default), where the norm fuses.
        let opts = WgpuOptions {
            fuse_glu,
            fuse_norm,
            fuse_rope,
            subgroups,
            split_k: Some(true),
            ..f32_options()
        };
        let Some(mut b) = or_skip(WgpuBackend::new(model.clone(), 16, 8, &opts)) else {
            return;
        };
        b.set_profiling(Some(ProfileClock::Host));
        backends.push(b);
    }
    let prompt: Vec<TokenId> = (0..20).map(|i| (i * 11 % 301) as TokenId).collect();
    // A 40-row continuation: past the 32 columns of the paired variants,
    // where plain mat-vec still takes them in one dispatch, so SwiGLU and
    // RoPE run as their own kernels on that step (the norms stay fused).
    let more: Vec<TokenId> = (0..40).map(|i| (i * 13 % 301) as TokenId).collect();
    let table = [1u32, 6, 3, 4];
    for (tokens, pos) in [(&prompt[..], 0u32), (&[7][..], 20), (&more[..], 21)] {
        let batch = [logits_step(tokens, pos, &table)];
        let mut outs = Vec::new();
        for b in &mut backends {
            let mut o = Vec::new();
            b.forward(&batch, &mut o).expect("step");
            outs.push(o);
        }
        // The fused SwiGLU and RoPE make the same sums in the same order
        // (and the same rotation); the fused norm scales the weights
        // instead of x, a rounding apart. The decode step reads the K/V the
        // prompt's step wrote, so the cache writes are checked too.
        for (o, combo) in outs.iter().zip(combos).skip(1) {
            let e = nmse(o, &outs[0]);
            assert!(e < 1e-12, "at {pos}: {combo:?} vs all fused: nmse {e:e}");
        }
    }
    for (b, (fuse_glu, fuse_norm, fuse_rope, _)) in backends.iter_mut().zip(combos) {
        let p = b.take_profile().expect("a profile");
        let calls = |name: &str| -> u64 {
            p.kernels
                .iter()
                .filter(|k| k.name.ends_with(name))
                .map(|k| k.calls)
                .sum()
        };
        // Two layers, three steps, the last never with the paired fusions.
        let silu = if fuse_glu { 2 } else { 6 };
        let norms = if fuse_norm { 0 } else { 12 };
        let rope_kv = if fuse_rope { 2 } else { 6 };
        assert_eq!(calls("silu_mul"), silu, "{fuse_glu} {fuse_norm}: {p:?}");
        assert_eq!(calls("rope_kv"), rope_kv, "{fuse_rope}: {p:?}");
        let plain_norms: u64 = p
            .kernels
            .iter()
            .filter(|k| k.name == "rms_norm")
            .map(|k| k.calls)
            .sum();
        assert_eq!(plain_norms, norms, "{fuse_glu} {fuse_norm}: {p:?}");
    }
}

#[test]
fn wgpu_profiles_name_every_dispatch_without_changing_results() {
    use tokenwire_kernels::backend::wgpu::ProfileClock;
    let model = Arc::new(random_model(&LLAMA, 11));
    // The GPU defaults, whatever this adapter is: split-row mat-vec.
    let opts = WgpuOptions {
        split_k: Some(true),
        ..f32_options()
    };
    let Some(mut plain) = or_skip(WgpuBackend::new(model.clone(), 16, 8, &opts)) else {
        return;
    };
    let mut timed = WgpuBackend::new(model, 16, 8, &opts).expect("a second backend");
    assert!(timed.take_profile().is_none(), "never switched on");
    let prompt: Vec<TokenId> = (0..12).map(|i| (i * 7 % 301) as TokenId).collect();
    let table = [3u32, 5];
    for clock in [ProfileClock::Device, ProfileClock::Host] {
        timed.set_profiling(Some(clock));
        for (tokens, pos) in [(&prompt[..], 0u32), (&[5][..], 12)] {
            let batch = [logits_step(tokens, pos, &table)];
            let (mut a, mut b) = (Vec::new(), Vec::new());
            plain.forward(&batch, &mut a).expect("plain step");
            timed.forward(&batch, &mut b).expect("profiled step");
            assert_eq!(a, b, "{clock:?}: profiling changed the logits");
        }
        let p = timed.take_profile().expect("a profile");
        assert_eq!(p.steps, 2, "{clock:?}");
        if clock == ProfileClock::Host {
            assert_eq!(p.clock, ProfileClock::Host);
        }
        let calls = |name: &str| p.kernels.iter().find(|k| k.name == name).map(|k| k.calls);
        // The decode step's one-column products, once per layer: q|k|v
        // and gate|up with the norm before them fused in, q|k|v with RoPE
        // and the K/V write, gate|up with SiLU too; the prefill's 12 rows
        // go in mat-vec groups.
        for product in [
            "qkv mat_vec+rope x1 F32 +norm",
            "o mat_vec x1 F32",
            "gate_up glu x1 F32 +norm",
            "down mat_vec x1 F32",
        ] {
            assert_eq!(calls(product), Some(2), "{product}: {p:?}");
        }
        assert_eq!(calls("silu_mul"), None, "fused: {p:?}");
        assert_eq!(calls("rms_norm"), None, "fused: {p:?}");
        assert_eq!(calls("lm_head mat_vec x1 F32"), Some(2), "{p:?}");
        assert_eq!(calls("final rms_norm"), Some(2), "{p:?}");
        assert_eq!(calls("embed F32"), Some(2), "{p:?}");
        assert_eq!(calls("attn_prefill"), Some(2), "{p:?}");
        assert_eq!(calls("attn_decode"), Some(2), "{p:?}");
        assert_eq!(calls("sample"), None, "nothing was sampled: {p:?}");
        assert!(p.total_nanos() > 0, "{p:?}");
    }
    // Off: steps are no longer profiled.
    timed.set_profiling(None);
    let batch = [logits_step(&[6], 13, &table)];
    timed.forward(&batch, &mut Vec::new()).expect("step");
    assert_eq!(timed.take_profile().map(|p| p.steps), Some(0));
}

#[test]
fn wgpu_drafted_steps_yield_what_plain_steps_yield() {
    // A drafted sequence is several one-token rows over one block table in
    // a step: each row reads the K/V the rows before it wrote, and samples
    // on the device with the history through its own draft token.
    drafts_greedy_and_sampled(|| wgpu_tiny_engine(9), 1e-4);
}

#[test]
fn wgpu_embeddings_match_the_cpu_backend() {
    // Embedding chunks beside a sampled sequence, in passes of at most 5
    // rows (so an embedding's rows span passes and share them with others),
    // then through the engine in chunks: the pooled rows the CPU backend
    // gives, within f32 tolerance.
    let model = Arc::new(random_model(&QWEN, 11));
    let opts = WgpuOptions {
        max_rows_per_pass: Some(5),
        ..f32_options()
    };
    let Some(mut gpu) = or_skip(WgpuBackend::new(model.clone(), 4, 16, &opts)) else {
        return;
    };
    let kernels = tokenwire_kernels::quant::Kernels::detect();
    let mut cpu = CpuBackend::with(model.clone(), 4, 16, kernels, ActivationPrecision::F32)
        .expect("cpu backend");
    let toks: Vec<TokenId> = (0..11).map(|i| (i * 7 + 3) % 64).collect();
    let (a, b, c): (Vec<u32>, Vec<u32>, Vec<u32>) =
        ((0..3).collect(), (3..6).collect(), (6..9).collect());
    let embed = |tokens, table, pooling| SeqBatch {
        hidden: Some(pooling),
        want_logits: false,
        ..logits_step(tokens, 0, table)
    };
    // Rows 0-2 sampled, 3-11 the mean (from the middle of the first pass),
    // 12-22 the last-token one.
    let batch = [
        logits_step(&toks[..3], 0, &b),
        embed(&toks[..9], &a, Pooling::Mean),
        embed(&toks, &c, Pooling::Last),
    ];
    let (mut want, mut got) = (ForwardOutput::default(), ForwardOutput::default());
    cpu.forward_select(&batch, &mut want).expect("cpu forward");
    gpu.forward_select(&batch, &mut got).expect("wgpu forward");
    let h = model.config().hidden_size;
    assert_eq!(want.hidden.len(), 2 * h);
    assert_eq!(got.hidden.len(), 2 * h);
    for (i, (g, w)) in got.hidden.chunks(h).zip(want.hidden.chunks(h)).enumerate() {
        let e = nmse(g, w);
        assert!(e < F32_TOL.nmse, "embedding {i}: nmse {e:e}");
    }
    let vocab = model.config().vocab_size;
    assert_eq!(got.logits.len(), vocab, "the sampled sequence's row alone");
    assert!(nmse(&got.logits, &want.logits[..vocab]) < F32_TOL.nmse);

    // Through the engines, in chunks of 4 (stories260K).
    let Some((mut engine, _)) = stories() else {
        return;
    };
    let (mut reference, prompt) = cpu_reference();
    for pooling in [Pooling::Mean, Pooling::Last] {
        let g = embed_alone(&mut engine, &prompt, pooling, 4);
        let w = embed_alone(&mut reference, &prompt, pooling, prompt.len());
        let e = nmse(&g, &w);
        assert!(e < 1e-8, "{pooling:?}: nmse {e:e}");
    }
}

#[test]
fn wgpu_prompt_logprobs_match_the_cpu_engine() {
    // A scored prompt is one logits row per token: on the wgpu engine in
    // chunks of 4 (each chunk's last row carried to the next), the scores
    // the CPU engine gives the whole prompt, within f32 tolerance.
    let Some((mut engine, _)) = stories() else {
        return;
    };
    let (mut reference, prompt) = cpu_reference();
    let (want, want_token) = score_alone(&mut reference, &prompt, 3, prompt.len());
    for chunk in [prompt.len(), 4] {
        let (got, token) = score_alone(&mut engine, &prompt, 3, chunk);
        assert_eq!(got.len(), prompt.len() - 1, "chunks of {chunk}");
        assert_eq!(token, want_token, "chunks of {chunk}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g.logprob - w.logprob).abs() < 2e-3 && (g.top[0].1 - w.top[0].1).abs() < 2e-3,
                "chunks of {chunk}, position {}: {g:?} vs {w:?}",
                i + 1
            );
        }
    }
}

/// The CPU engine on stories260K, the reference the wgpu engine's pooled
/// and scored rows are held to, and a prompt for both.
fn cpu_reference() -> (Engine, Vec<TokenId>) {
    let reference = Engine::load(&stories_dir(), &Default::default()).expect("cpu engine");
    let prompt = reference
        .codec()
        .encode(
            "One day, a bird flew over the tree and sang a happy song.",
            true,
        )
        .expect("encode");
    (reference, prompt)
}
