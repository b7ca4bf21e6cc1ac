//! `engine-bench`: prefill and decode tokens/s of the CPU and wgpu backends
//! for a model shape given on the command line, with seeded random weights.
//!
//! ```text
//! cargo run --release -p tokenwire-benches --bin engine-bench -- \
//!     --shape tinyllama-1.1b --layers 2 --backend cpu,wgpu --batch 1,8,32 \
//!     --prompt 64 --steps 8
//! ```
//!
//! For each batch size B, each backend runs (in the same process, one after
//! the other) one prefill step of B sequences of `--prompt` tokens, then
//! `--steps` decode steps of B sequences of one token, each step sampling
//! every sequence's next token as the engine does: greedy by default, or
//! with `--sample T,P[,K[,F]]` at temperature T, top-p P (top-k K, and
//! OpenAI's frequency penalty F over the generated tokens). The CPU
//! backend returns logits rows and the shared sampler picks the tokens; the
//! wgpu backend samples on the device and reads back only token ids. Both
//! are inside the timed steps. Prints the configuration, then one line per
//! backend and batch: prefill tokens/s, decode tokens/s, decode step time,
//! and the weight bytes a decode step reads divided by its time.
//!
//! `--profile` then runs each wgpu case again with every dispatch timed
//! (device timestamp queries where the adapter has them, else the host's
//! clock around one submission per dispatch) and prints, for the prefill
//! step and for the decode steps, the time per step of each kernel. The
//! profiled run is slower than the timed one (one compute pass, or one
//! submission, per dispatch); its tables say where the time goes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenwire_core::rng::Rng;
use tokenwire_core::SamplingParams;
use tokenwire_kernels::backend::wgpu::{HostTimes, Profile, ProfileClock};
use tokenwire_kernels::gguf::GgmlType;
use tokenwire_kernels::tensor::encode_floats;
use tokenwire_kernels::{
    Backend, CpuBackend, ForwardOutput, LayerWeights, Linear, Model, ModelConfig, QkNorm,
    RopeLayout, RopeScaling, SampleSpec, Sampler, SeqBatch, WeightMatrix, Weights, WgpuBackend,
    WgpuOptions,
};

const USAGE: &str = "engine-bench [--shape tinyllama-1.1b|llama-3.2-1b|qwen3-0.6b|stories260k|custom:dim,layers,heads,kv_heads,ffn,vocab]
             [--layers N] [--backend cpu,wgpu] [--batch 1,8,32] [--prompt N] [--steps N]
             [--dtype f32|f16|bf16] [--adapter NAME] [--block-size N] [--seed N]
             [--sample greedy|T,P[,K[,F]]] (temperature T, top-p P, top-k K, frequency penalty F)
             [--host-sample] (every row read back and sampled on the host)
             [--logprobs N] (every row also reports the logprobs of its token and
             of the N best; the device computes up to 32)
             [--gguf FILE] (a real model instead of --shape/--dtype; its weights as stored)
             [--profile] (then time every wgpu kernel of the prefill and decode steps)
             [--mat-vec-rows N] (wgpu on a GPU: passes of up to N token rows, at most 64,
             use mat-vec; more, the tiled matmul) [--no-fused-glu] (wgpu: SiLU-times-up
             as its own kernel) [--no-fused-norm] (wgpu: the layers' RMSNorms as their
             own kernels) [--no-fused-rope] (wgpu: RoPE and the K/V write as their own
             kernel, not in the q|k|v mat-vec) [--no-subgroups] (wgpu: mat-vec reductions through workgroup
             memory only) [--decode-workgroups N] (wgpu: split decode attention's contexts
             for about N workgroups) [--decode-min-split N] (wgpu: at least N positions
             per split) [--no-fold-merge] (wgpu: merge the splits in a dispatch of their
             own, not in the last split's workgroup) [--decode-k-chunk N] (wgpu: vectors
             of a K row decode attention loads together, 1-16; default 16 on GPUs)
             [--mat-vec-unroll 1|2|4] (wgpu: weight loads a mat-vec invocation
             issues together) [--no-coop] (wgpu: no cooperative matrices; by default,
             where the adapter has them, passes of at least 16 token rows multiply on
             them; --coop is accepted and changes nothing) [--coop-rows N] (coop from N
             rows) [--coop-slab 32|64] (the k values the coop matmul loads between
             barriers) [--coop-split N] (split the k of coop products of fewer tiles
             than N over workgroups; 0: never; default 512 on GPUs) [--coop-wide-rows N]
             (coop passes of N or more rows on the wide tile, eight subgroups over
             128 x 128 at side 16, instead of four over 64 x 64; default 128)
             [--no-coop-tall] (coop passes of up to 32 rows at side 16 on the default
             tile, not the tall one, four subgroups over 128 rows by 32 tokens)
             [--coop-fold] (split coop products summed by the split that finishes
             last, not by a dispatch of their own; --no-coop-fold is accepted and
             changes nothing)
             [--no-shader-f16] (wgpu: f16 weights unpacked from u32 pairs, not read
             as vec4<f16> with the device's shader-f16) [--max-rows-per-pass N] (wgpu:
             token rows per pass, default 2048 on GPUs and 512 on CPU adapters; a bigger
             step runs in several passes, each reading every weight)
             [--loop-bounding] (wgpu: shaders with wgpu's counter in every loop, its own
             default) [--first-submit N] (wgpu: a step's first N dispatches submitted
             on their own, then doubling runs; 0: one submission a step; default 8 on
             GPUs, 0 on CPU adapters),
             to compare kernel choices on a card
Threads: RAYON_NUM_THREADS (default: one per core). CPU kernels: TOKENWIRE_CPU_KERNELS.";

/// What to run.
#[derive(Debug, Clone)]
struct Args {
    shape: String,
    layers: Option<usize>,
    backends: Vec<String>,
    batches: Vec<usize>,
    prompt: usize,
    steps: usize,
    dtype: String,
    adapter: Option<String>,
    block_size: usize,
    seed: u64,
    sampling: SamplingParams,
    /// Every row comes back and the shared sampler picks on the host, as
    /// for rows a device sampler does not take.
    host_sample: bool,
    /// Logprobs of the chosen token and of this many best ones, every row.
    logprobs: Option<u8>,
    gguf: Option<std::path::PathBuf>,
    profile: bool,
    mat_vec_rows: Option<usize>,
    decode_workgroups: Option<u32>,
    decode_min_split: Option<u32>,
    mat_vec_unroll: Option<u32>,
    fused_glu: bool,
    fused_norm: bool,
    fused_rope: bool,
    fold_merge: bool,
    decode_k_chunk: Option<u32>,
    first_submit: Option<usize>,
    subgroups: bool,
    coop: bool,
    coop_rows: Option<usize>,
    coop_slab: Option<u32>,
    coop_split: Option<u32>,
    coop_wide_rows: Option<usize>,
    coop_tall: bool,
    coop_fold: bool,
    max_rows_per_pass: Option<usize>,
    shader_f16: bool,
    loop_bounding: bool,
}

/// `greedy`, or `T,P[,K[,F]]`: temperature, top-p, top-k and OpenAI's
/// frequency penalty (over the generated tokens).
fn parse_sampling(v: &str) -> Result<SamplingParams, String> {
    if v == "greedy" {
        return Ok(SamplingParams::greedy());
    }
    let parts: Vec<&str> = v.split(',').map(str::trim).collect();
    let num = |x: &str| {
        x.parse::<f32>()
            .map_err(|_| format!("--sample: bad number `{x}`"))
    };
    let top_k = |k: &str| k.parse().map_err(|_| format!("--sample: bad top-k `{k}`"));
    let (t, p, k, f) = match parts[..] {
        [t, p] => (num(t)?, num(p)?, 0, 0.0),
        [t, p, k] => (num(t)?, num(p)?, top_k(k)?, 0.0),
        [t, p, k, f] => (num(t)?, num(p)?, top_k(k)?, num(f)?),
        _ => return Err(format!("--sample wants greedy or T,P[,K[,F]]\n{USAGE}")),
    };
    Ok(SamplingParams {
        temperature: t,
        top_p: p,
        top_k: k,
        frequency_penalty: f,
        ..SamplingParams::default()
    })
}

fn describe(p: &SamplingParams) -> String {
    if !(p.temperature > 0.0 && p.temperature.is_finite()) {
        return "greedy".into();
    }
    format!(
        "temperature {}, top-p {}, top-k {}, frequency penalty {}",
        p.temperature, p.top_p, p.top_k, p.frequency_penalty
    )
}

fn parse_list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|x| x.trim().parse().map_err(|_| format!("bad number `{x}`")))
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        shape: "stories260k".into(),
        layers: None,
        backends: vec!["cpu".into(), "wgpu".into()],
        batches: vec![1, 8, 32],
        prompt: 64,
        steps: 16,
        dtype: "f32".into(),
        adapter: None,
        block_size: 16,
        seed: 1,
        sampling: SamplingParams::greedy(),
        host_sample: false,
        logprobs: None,
        gguf: None,
        profile: false,
        mat_vec_rows: None,
        decode_workgroups: None,
        decode_min_split: None,
        mat_vec_unroll: None,
        fused_glu: true,
        fused_norm: true,
        fused_rope: true,
        fold_merge: true,
        decode_k_chunk: None,
        first_submit: None,
        subgroups: true,
        coop: true,
        coop_rows: None,
        coop_slab: None,
        coop_split: None,
        coop_wide_rows: None,
        coop_tall: true,
        coop_fold: false,
        max_rows_per_pass: None,
        shader_f16: true,
        loop_bounding: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        // Switches, which take no value.
        let switch = match flag.as_str() {
            "--profile" => Some((&mut a.profile, true)),
            "--host-sample" => Some((&mut a.host_sample, true)),
            "--no-fused-glu" => Some((&mut a.fused_glu, false)),
            "--no-fused-norm" => Some((&mut a.fused_norm, false)),
            "--no-fused-rope" => Some((&mut a.fused_rope, false)),
            "--no-fold-merge" => Some((&mut a.fold_merge, false)),
            "--no-subgroups" => Some((&mut a.subgroups, false)),
            "--coop" => Some((&mut a.coop, true)),
            "--no-coop" => Some((&mut a.coop, false)),
            "--no-coop-tall" => Some((&mut a.coop_tall, false)),
            "--coop-fold" => Some((&mut a.coop_fold, true)),
            "--no-coop-fold" => Some((&mut a.coop_fold, false)),
            "--loop-bounding" => Some((&mut a.loop_bounding, true)),
            "--no-shader-f16" => Some((&mut a.shader_f16, false)),
            _ => None,
        };
        if let Some((field, value)) = switch {
            *field = value;
            continue;
        }
        let val = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: bad number `{v}`"))
        };
        match flag.as_str() {
            "--shape" => a.shape = val,
            "--layers" => a.layers = Some(num(&val)?),
            "--backend" => a.backends = val.split(',').map(|s| s.trim().to_string()).collect(),
            "--batch" => a.batches = parse_list(&val)?,
            "--prompt" => a.prompt = num(&val)?.max(1),
            "--steps" => a.steps = num(&val)?.max(1),
            "--dtype" => a.dtype = val,
            "--adapter" => a.adapter = Some(val),
            "--block-size" => a.block_size = num(&val)?.max(1),
            "--seed" => a.seed = num(&val)? as u64,
            "--sample" => a.sampling = parse_sampling(&val)?,
            "--logprobs" => a.logprobs = Some(num(&val)?.min(u8::MAX as usize) as u8),
            "--gguf" => a.gguf = Some(val.into()),
            "--mat-vec-rows" => a.mat_vec_rows = Some(num(&val)?.max(1)),
            "--decode-workgroups" => a.decode_workgroups = Some(num(&val)?.max(1) as u32),
            "--decode-min-split" => a.decode_min_split = Some(num(&val)?.max(1) as u32),
            "--decode-k-chunk" => a.decode_k_chunk = Some(num(&val)?.clamp(1, 16) as u32),
            "--first-submit" => a.first_submit = Some(num(&val)?),
            "--mat-vec-unroll" => a.mat_vec_unroll = Some(num(&val)?.clamp(1, 4) as u32),
            "--coop-rows" => {
                a.coop = true;
                a.coop_rows = Some(num(&val)?.max(1));
            }
            "--coop-split" => a.coop_split = Some(num(&val)? as u32),
            "--coop-wide-rows" => a.coop_wide_rows = Some(num(&val)?.max(1)),
            "--max-rows-per-pass" => a.max_rows_per_pass = Some(num(&val)?.max(1)),
            "--coop-slab" => {
                a.coop = true;
                a.coop_slab = Some(num(&val)? as u32);
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    if !["f32", "f16", "bf16"].contains(&a.dtype.as_str()) {
        return Err(format!("--dtype must be f32, f16 or bf16\n{USAGE}"));
    }
    Ok(a)
}

/// The shape of a named model (or a custom one).
fn config(shape: &str, layers: Option<usize>) -> Result<ModelConfig, String> {
    let base = |h, l, nh, nkv, ffn, vocab, ctx, theta, tied, scaling| ModelConfig {
        hidden_size: h,
        intermediate_size: ffn,
        num_layers: l,
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: h / nh,
        vocab_size: vocab,
        max_position_embeddings: ctx,
        rms_norm_eps: 1e-5,
        rope_theta: theta,
        rope_scaling: scaling,
        tie_word_embeddings: tied,
        attention_bias: false,
        qk_norm: false,
        fused_projections: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        name_or_path: Some(shape.to_string()),
    };
    let mut c = match shape {
        "tinyllama-1.1b" => base(
            2048,
            22,
            32,
            4,
            5632,
            32000,
            2048,
            10000.0,
            false,
            RopeScaling::None,
        ),
        "llama-3.2-1b" => base(
            2048,
            16,
            32,
            8,
            8192,
            128256,
            131072,
            500000.0,
            true,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
        ),
        "stories260k" => base(64, 5, 8, 4, 172, 512, 512, 10000.0, true, RopeScaling::None),
        // Qwen3-0.6B: heads of 128 over a 1,024-wide stream, each query and
        // key head normalised before RoPE.
        "qwen3-0.6b" => ModelConfig {
            head_dim: 128,
            qk_norm: true,
            rms_norm_eps: 1e-6,
            ..base(
                1024,
                28,
                16,
                8,
                3072,
                151936,
                40960,
                1_000_000.0,
                true,
                RopeScaling::None,
            )
        },
        custom => {
            let dims = custom
                .strip_prefix("custom:")
                .ok_or_else(|| format!("unknown shape `{custom}`\n{USAGE}"))?;
            let v = parse_list(dims)?;
            let [h, l, nh, nkv, ffn, vocab] = v[..] else {
                return Err("custom:dim,layers,heads,kv_heads,ffn,vocab".into());
            };
            if nh == 0 || nkv == 0 || h % nh != 0 || nh % nkv != 0 || (h / nh) % 2 != 0 {
                return Err("custom shape: heads must divide dim (even head width), kv_heads must divide heads".into());
            }
            base(
                h,
                l,
                nh,
                nkv,
                ffn,
                vocab,
                4096,
                10000.0,
                false,
                RopeScaling::None,
            )
        }
    };
    if let Some(l) = layers {
        c.num_layers = l.max(1);
    }
    Ok(c)
}

/// Seeded uniform weights with variance 1 / fan-in, stored as `dtype`.
fn random_model(c: &ModelConfig, dtype: &str, seed: u64) -> Result<Model, String> {
    let ty = match dtype {
        "f16" => GgmlType::F16,
        "bf16" => GgmlType::BF16,
        _ => GgmlType::F32,
    };
    let mut rng = Rng::new(seed);
    let mut matrix = |rows: usize, cols: usize| -> Result<WeightMatrix, String> {
        let scale = (3.0 / cols as f32).sqrt();
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
            .collect();
        WeightMatrix::from_bytes(ty, rows, cols, encode_floats(ty, &v)?)
    };
    let (h, q, kv) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
    );
    let mut layers = Vec::with_capacity(c.num_layers);
    for _ in 0..c.num_layers {
        layers.push(LayerWeights {
            input_norm: vec![1.0; h],
            q: Linear::new(matrix(q, h)?),
            k: Linear::new(matrix(kv, h)?),
            v: Linear::new(matrix(kv, h)?),
            o: Linear::new(matrix(h, q)?),
            post_norm: vec![1.0; h],
            gate: Linear::new(matrix(c.intermediate_size, h)?),
            up: Linear::new(matrix(c.intermediate_size, h)?),
            down: Linear::new(matrix(h, c.intermediate_size)?),
            qk_norm: c.qk_norm.then(|| QkNorm {
                q: vec![1.0; c.head_dim],
                k: vec![1.0; c.head_dim],
            }),
        });
    }
    let lm_head = match c.tie_word_embeddings {
        true => None,
        false => Some(Linear::new(matrix(c.vocab_size, h)?)),
    };
    let embed = matrix(c.vocab_size, h)?;
    let weights = Weights {
        embed,
        layers,
        norm: vec![1.0; h],
        lm_head,
        dtype: dtype.into(),
        rope: RopeLayout::HalfSplit,
    };
    Model::new(c.clone(), weights)
}

/// Times of one backend at one batch size, and with profiling, the kernel
/// profiles of the prefill step and of the decode steps.
struct Run {
    prefill: Duration,
    decode: Duration,
    profiles: Option<(Profile, Profile)>,
    /// Where the host's time of the timed decode steps went (wgpu).
    host: Option<HostTimes>,
}

/// A backend under test.
enum Bench {
    Cpu(Box<CpuBackend>),
    Wgpu(Box<WgpuBackend>),
}

impl Bench {
    fn backend(&mut self) -> &mut dyn Backend {
        match self {
            Bench::Cpu(c) => c.as_mut(),
            Bench::Wgpu(w) => w.as_mut(),
        }
    }

    /// Switches kernel profiling on or off (wgpu only), returning what was
    /// gathered when switched off.
    fn profiling(&mut self, on: bool) -> Option<Profile> {
        let Bench::Wgpu(w) = self else { return None };
        w.set_profiling(on.then_some(ProfileClock::Device));
        // Taken while off, the profile goes: the next switch-on starts afresh.
        if on {
            None
        } else {
            w.take_profile()
        }
    }

    /// The host's phases of the steps since the last call (wgpu only).
    fn host_times(&mut self) -> Option<HostTimes> {
        let Bench::Wgpu(w) = self else { return None };
        Some(w.take_host_times())
    }
}

/// One backend at one batch size, with `a`'s prompt, steps, block size,
/// seed and sampling; with `profile`, the prefill and decode steps are
/// profiled (and their times are not speed).
fn run(
    bench: &mut Bench,
    batch: usize,
    a: &Args,
    vocab: usize,
    profile: bool,
) -> Result<Run, String> {
    let (prompt, steps, bs, seed, host_sample, logprobs) = (
        a.prompt,
        a.steps,
        a.block_size,
        a.seed,
        a.host_sample,
        a.logprobs,
    );
    // The OpenAI penalties count what each sequence generated.
    let sampling = SamplingParams {
        generated_from: prompt as u32,
        ..a.sampling.clone()
    };
    let per = (prompt + steps + 1).max(10).div_ceil(bs);
    let mut rng = Rng::new(seed);
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|i| ((i * per) as u32..((i + 1) * per) as u32).collect())
        .collect();
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|_| {
            (0..prompt)
                .map(|_| rng.below(vocab as u64) as u32)
                .collect()
        })
        .collect();
    let mut out = ForwardOutput::default();
    let mut sampler = Sampler::new();
    // One step: feeds `toks[i]` at `pos` to sequence i (whose history grows
    // by them) and returns each sequence's next token, sampled as the engine
    // does: on the device where the backend can, else by the shared sampler
    // on the row it returned.
    let mut step = |be: &mut dyn Backend,
                    toks: &[Vec<u32>],
                    pos: usize,
                    hist: &mut [Vec<u32>]|
     -> Result<Vec<u32>, String> {
        for (h, t) in hist.iter_mut().zip(toks) {
            h.truncate(pos);
            h.extend_from_slice(t);
        }
        let position = |t: &Vec<u32>| (pos + t.len()) as u32;
        let b: Vec<SeqBatch<'_>> = toks
            .iter()
            .zip(&tables)
            .zip(hist.iter())
            .map(|((t, table), h)| SeqBatch {
                tokens: t,
                start_pos: pos as u32,
                block_table: table,
                want_logits: true,
                sample: (!host_sample).then_some(SampleSpec {
                    params: &sampling,
                    position: position(t),
                    history: h,
                    logprobs,
                    allowed: None,
                }),
                keep_row: false,
                hidden: None,
            })
            .collect();
        be.forward_select(&b, &mut out)
            .map_err(|e| format!("{e:?}"))?;
        let mut rows = out.logits.chunks_exact(vocab);
        let mut next = Vec::with_capacity(toks.len());
        for (i, (done, &has_row)) in out.sampled.iter().zip(&out.has_row).enumerate() {
            let row = if has_row { rows.next() } else { None };
            next.push(match (done, row) {
                (Some(d), _) => d.token,
                (None, Some(r)) => {
                    sampler
                        .sample(r, &sampling, position(&toks[i]), &hist[i], logprobs)
                        .0
                }
                _ => return Err("the backend returned neither a token nor a row".into()),
            });
        }
        Ok(next)
    };
    // Untimed warm-up on the first sequence's blocks (rewritten below): a
    // 9-token chunk and a 1-token step reach every kernel once, so one-time
    // costs (shader compilation in the driver) are not counted as speed.
    let warm: Vec<Vec<u32>> = vec![prompts[0].iter().copied().cycle().take(9).collect()];
    let mut warm_hist = vec![Vec::new()];
    step(bench.backend(), &warm, 0, &mut warm_hist)?;
    step(bench.backend(), &[vec![warm[0][0]]], 9, &mut warm_hist)?;
    let feed =
        |tokens: Vec<u32>| -> Vec<Vec<u32>> { tokens.into_iter().map(|t| vec![t]).collect() };
    if matches!(bench, Bench::Wgpu(_)) {
        // On a GPU, also the timed prefill itself (its passes' kernels, the
        // coop ones included, compiled on first use by some drivers), then
        // decode steps for half a second: a GPU idle while the weights were
        // built clocks down, and a 32-step decode of 2 ms steps is over
        // before it clocks up again (on an H200 the first batch of a run
        // decoded at a third to a half of the speed the same batch reached
        // later in the run). The positions wrap within the blocks.
        let mut warm_hist = vec![Vec::new(); batch];
        let mut toks = feed(step(bench.backend(), &prompts, 0, &mut warm_hist)?);
        let (t, mut pos) = (Instant::now(), prompt);
        while t.elapsed() < Duration::from_millis(500) {
            toks = feed(step(bench.backend(), &toks, pos, &mut warm_hist)?);
            pos = if pos + 1 < prompt + steps {
                pos + 1
            } else {
                prompt
            };
        }
    }
    let mut hist: Vec<Vec<u32>> = vec![Vec::new(); batch];
    if profile {
        bench.profiling(true);
    }
    let t = Instant::now();
    let first = step(bench.backend(), &prompts, 0, &mut hist)?;
    let prefill = t.elapsed();
    let prefill_profile = bench.profiling(false);
    // One untimed decode step: first-use costs (shader JIT) are not decode speed.
    let mut next = step(bench.backend(), &feed(first), prompt, &mut hist)?;
    if profile {
        bench.profiling(true);
    }
    bench.host_times();
    let t = Instant::now();
    for s in 0..steps {
        next = step(bench.backend(), &feed(next), prompt + 1 + s, &mut hist)?;
    }
    let decode = t.elapsed();
    let host = bench.host_times();
    let decode_profile = bench.profiling(false);
    Ok(Run {
        prefill,
        decode,
        profiles: prefill_profile.zip(decode_profile),
        host,
    })
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = bench(&args) {
        eprintln!("engine-bench: {e}");
        std::process::exit(1);
    }
}

fn bench(a: &Args) -> Result<(), String> {
    let t = Instant::now();
    let (c, model) = match &a.gguf {
        Some(path) => {
            let (m, _) = Model::load_gguf(path).map_err(|e| e.to_string())?;
            (m.config().clone(), Arc::new(m))
        }
        None => {
            let c = config(&a.shape, a.layers)?;
            let m = random_model(&c, &a.dtype, a.seed)?;
            (c, Arc::new(m))
        }
    };
    let params: usize = model
        .weights()
        .matrices()
        .map(|m| m.rows() * m.cols())
        .sum();
    println!(
        "shape {} (hidden {}, layers {}, heads {}/{} kv, head_dim {}, ffn {}, vocab {}, tied {}), \
         {:.1} M params, weights: {}, built in {:.1?}",
        a.gguf
            .as_ref()
            .map_or(a.shape.clone(), |p| p.display().to_string()),
        c.hidden_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
        c.vocab_size,
        c.tie_word_embeddings,
        params as f64 / 1e6,
        match &a.gguf {
            Some(_) => format!("{} from the file", model.weights().dtype),
            None => format!("random in {} (seed {})", a.dtype, a.seed),
        },
        t.elapsed()
    );
    println!(
        "prompt {} tokens per sequence, {} timed decode steps, block size {}, threads {}, CPU kernels {}, sampling: {}{}",
        a.prompt,
        a.steps,
        a.block_size,
        rayon::current_num_threads(),
        tokenwire_kernels::quant::Kernels::detect().isa.name(),
        describe(&a.sampling),
        if a.host_sample { " (on the host)" } else { "" }
    );
    if let Some(n) = a.logprobs {
        println!("logprobs: the chosen token's and the {n} best, every row");
    }
    println!(
        "{:<6} {:>5} {:>14} {:>14} {:>14} {:>16}",
        "backend", "batch", "prefill tok/s", "decode tok/s", "decode step", "weights GB/s"
    );
    let per_seq = (a.prompt + a.steps + 1).max(10).div_ceil(a.block_size);
    for &b in &a.batches {
        let nb = (b * per_seq).max(1);
        for name in &a.backends {
            let (mut be, weight_bytes) = match name.as_str() {
                "cpu" => (
                    Bench::Cpu(Box::new(CpuBackend::new(model.clone(), a.block_size, nb)?)),
                    cpu_weight_bytes(&model),
                ),
                "wgpu" => {
                    let d = WgpuOptions::default();
                    let opts = WgpuOptions {
                        adapter: a.adapter.clone(),
                        mat_vec_max_rows: a.mat_vec_rows.unwrap_or(d.mat_vec_max_rows),
                        decode_workgroups: a.decode_workgroups,
                        decode_min_split: a.decode_min_split.unwrap_or(d.decode_min_split),
                        fold_merge: a.fold_merge,
                        decode_k_chunk: a.decode_k_chunk,
                        first_submit: a.first_submit,
                        mat_vec_unroll: a.mat_vec_unroll,
                        fuse_glu: a.fused_glu,
                        fuse_norm: a.fused_norm,
                        fuse_rope: a.fused_rope,
                        subgroups: a.subgroups,
                        cooperative_matrix: a.coop,
                        coop_min_rows: a.coop_rows.unwrap_or(d.coop_min_rows),
                        coop_k_slab: a.coop_slab,
                        coop_split_workgroups: a.coop_split,
                        coop_wide_rows: a.coop_wide_rows.unwrap_or(d.coop_wide_rows),
                        coop_tall: a.coop_tall,
                        coop_fold_splits: a.coop_fold,
                        max_rows_per_pass: a.max_rows_per_pass.or(d.max_rows_per_pass),
                        shader_f16: a.shader_f16,
                        loop_bounding: a.loop_bounding,
                        ..d
                    };
                    let w = WgpuBackend::new(model.clone(), a.block_size, nb, &opts)
                        .map_err(|e| e.to_string())?;
                    if b == a.batches[0] {
                        let coop = match w.coop() {
                            Some(c) => format!(
                                "cooperative matrices {}x{} (subgroups of {}, k slab {}, k split \
                                 below {} workgroups, summed by {}){}{}",
                                c.side,
                                c.side,
                                c.subgroup,
                                c.k_slab,
                                c.split_to,
                                if c.fold {
                                    "the last split"
                                } else {
                                    "split_sum"
                                },
                                match w.coop_wide() {
                                    Some(_) =>
                                        format!(", the wide tile from {} rows", opts.coop_wide_rows),
                                    None => String::new(),
                                },
                                match w.coop_tall() {
                                    Some(t) =>
                                        format!(", the tall tile up to {} rows", t.tile_tokens()),
                                    None => String::new(),
                                }
                            ),
                            None => "no cooperative matrices".into(),
                        };
                        println!(
                            "wgpu adapter: {}, weights as {:?}, {coop}",
                            w.adapter(),
                            w.weight_dtypes()
                        );
                    }
                    let bytes = w.weight_bytes();
                    (Bench::Wgpu(Box::new(w)), bytes)
                }
                other => return Err(format!("unknown backend `{other}` (cpu, wgpu)")),
            };
            let r = run(&mut be, b, a, c.vocab_size, false)?;
            let step = r.decode / a.steps as u32;
            println!(
                "{:<6} {:>5} {:>14.1} {:>14.2} {:>12.1?} {:>16.2}",
                name,
                b,
                (b * a.prompt) as f64 / r.prefill.as_secs_f64(),
                (b * a.steps) as f64 / r.decode.as_secs_f64(),
                step,
                weight_bytes as f64 / step.as_secs_f64() / 1e9
            );
            if let Some(h) = r.host.filter(|h| h.steps > 0) {
                print_host_times(&h);
            }
            if a.profile && matches!(be, Bench::Wgpu(_)) {
                let p = run(&mut be, b, a, c.vocab_size, true)?;
                if let Some((prefill, decode)) = p.profiles {
                    print_profile(
                        &format!("{name} batch {b}, prefill of {} tokens", b * a.prompt),
                        &prefill,
                    );
                    print_profile(&format!("{name} batch {b}, decode"), &decode);
                }
            }
        }
    }
    Ok(())
}

/// The host's phases of a decode step, per step: what the device waits
/// on between steps (planning, recording, submitting) and what the host
/// waits on the device.
fn print_host_times(h: &HostTimes) {
    let per = |n: u64| n as f64 / h.steps as f64 / 1e3;
    println!(
        "  host per decode step: plan {:.1} us, record {:.1} us, submit {:.1} us, \
         wait and read back {:.1} us; {:.1} submissions",
        per(h.plan_nanos),
        per(h.record_nanos),
        per(h.submit_nanos),
        per(h.wait_nanos),
        h.submissions as f64 / h.steps as f64
    );
}

/// One profile as a table: per kernel, dispatches and time per step, and
/// its share of the kernels' total.
fn print_profile(what: &str, p: &Profile) {
    let steps = p.steps.max(1) as f64;
    let total = p.total_nanos().max(1) as f64;
    let clock = match p.clock {
        ProfileClock::Device => "device timestamps",
        ProfileClock::Host => "host clock, one submission per dispatch (no timestamp queries)",
    };
    println!("profile: {what}, {} steps, {clock}", p.steps);
    println!(
        "  {:<34} {:>10} {:>12} {:>7}",
        "kernel", "calls/step", "us/step", "share"
    );
    let mut rows = p.kernels.clone();
    rows.sort_by_key(|k| std::cmp::Reverse(k.nanos));
    for k in &rows {
        println!(
            "  {:<34} {:>10.1} {:>12.1} {:>6.1}%",
            k.name,
            k.calls as f64 / steps,
            k.nanos as f64 / steps / 1e3,
            100.0 * k.nanos as f64 / total
        );
    }
    println!(
        "  {:<34} {:>10.1} {:>12.1}",
        "total",
        rows.iter().map(|k| k.calls).sum::<u64>() as f64 / steps,
        total / steps / 1e3
    );
}

/// Bytes of every matrix one decode step reads on the CPU, in their own
/// dtype: the embedding only where it is the tied LM head (an untied one
/// gives each token a single row).
fn cpu_weight_bytes(model: &Model) -> u64 {
    let w = model.weights();
    let untied_embed = usize::from(w.lm_head.is_some());
    w.matrices()
        .skip(untied_embed)
        .map(|m| m.bytes().len() as u64)
        .sum()
}
