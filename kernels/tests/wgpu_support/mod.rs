//! Shared by the wgpu tests: opening a device, or explaining why not.

#![allow(dead_code)]

use tokenwire_kernels::backend::wgpu::lab::KernelLab;
use tokenwire_kernels::{BackendKind, EngineOptions, LoadError, WgpuOptions};

/// Whether a missing adapter must fail the test (CI installs lavapipe).
pub fn required() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Skips (prints why, returns `None`) when no adapter exists outside CI;
/// panics under `CI=true`.
pub fn skip_or_fail<T>(what: &str, err: impl std::fmt::Display) -> Option<T> {
    let msg = format!("{what}: {err}");
    if required() {
        panic!("{msg} (a wgpu adapter is required when CI=true)");
    }
    eprintln!("skipping: {msg}");
    None
}

/// The backend's default options with every product in f32: for tests that
/// hold the wgpu backend to the CPU's logits at f32 tolerances, which the
/// default's cooperative-matrix products (f16 inputs) would not meet on an
/// adapter that has them.
pub fn f32_options() -> WgpuOptions {
    WgpuOptions {
        cooperative_matrix: false,
        ..WgpuOptions::default()
    }
}

/// A kernel lab on the default adapter.
pub fn lab() -> Option<KernelLab> {
    lab_with(&WgpuOptions::default())
}

/// A kernel lab with `opts`.
pub fn lab_with(opts: &WgpuOptions) -> Option<KernelLab> {
    match KernelLab::new(opts) {
        Ok(l) => {
            eprintln!("adapter: {}", l.adapter());
            Some(l)
        }
        Err(e) => skip_or_fail("no wgpu adapter", e),
    }
}

/// Whether a missing cooperative-matrix configuration must fail the test:
/// `TOKENWIRE_REQUIRE_COOP=1`, as CI sets it where it runs the tests on a
/// lavapipe that has them (Mesa 26), so that run cannot pass by skipping.
pub fn coop_required() -> bool {
    std::env::var("TOKENWIRE_REQUIRE_COOP").as_deref() == Ok("1")
}

/// A kernel lab with cooperative matrices asked for (and `opts`), or `None`
/// (printing why) on an adapter without a usable configuration, such as
/// Mesa 22's lavapipe; panics under [`coop_required`].
pub fn coop_lab(opts: &WgpuOptions) -> Option<KernelLab> {
    let opts = WgpuOptions {
        cooperative_matrix: true,
        ..opts.clone()
    };
    let lab = match KernelLab::new(&opts) {
        Ok(l) => l,
        Err(e) if coop_required() => panic!("no wgpu adapter: {e} (TOKENWIRE_REQUIRE_COOP=1)"),
        Err(e) => return skip_or_fail("no wgpu adapter", e),
    };
    match lab.coop() {
        Some(c) => {
            eprintln!("adapter: {}, cooperative matrices {c:?}", lab.adapter());
            Some(lab)
        }
        None if coop_required() => panic!(
            "{}: no usable cooperative-matrix configuration (TOKENWIRE_REQUIRE_COOP=1)",
            lab.adapter()
        ),
        None => {
            eprintln!(
                "skipping: {} has no usable cooperative-matrix configuration",
                lab.adapter()
            );
            None
        }
    }
}

/// Engine options for the wgpu backend.
pub fn wgpu_options() -> EngineOptions {
    EngineOptions {
        backend: BackendKind::Wgpu {
            adapter: None,
            cooperative_matrix: false,
        },
        ..EngineOptions::default()
    }
}

/// `Ok(v)`, or a skip/failure when the error is a missing backend.
pub fn or_skip<T>(r: Result<T, LoadError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e @ LoadError::Backend(_)) => skip_or_fail("wgpu backend unavailable", e),
        Err(e) => panic!("load failed: {e}"),
    }
}

/// Normalised mean squared error: sum (a - b)^2 / sum b^2.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// A small llama-family shape for random models.
#[derive(Debug, Clone)]
pub struct Shape {
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub tied: bool,
    /// q/k/v biases (Qwen2) and an o bias.
    pub bias: bool,
    /// "f32", "f16" or "bf16": weights rounded to it, reported as the file
    /// dtype. "quant": every matrix in a GGUF block type, cycling through
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, IQ4_NL, IQ4_XS and Q2_K
    /// (so stacks like q|k|v mix them), of
    /// seeded random blocks; dimensions must be multiples of 256.
    pub dtype: &'static str,
    pub scaling: tokenwire_kernels::RopeScaling,
    /// Qwen3's per-head query and key norms (random weights around 1).
    pub qk_norm: bool,
}

/// The GGUF block types the wgpu kernels read.
pub const QUANT_TYPES: [tokenwire_kernels::gguf::GgmlType; 12] = {
    use tokenwire_kernels::gguf::GgmlType as G;
    [
        G::Q8_0,
        G::Q4_0,
        G::Q4_1,
        G::Q5_0,
        G::Q5_1,
        G::Q4_K,
        G::Q5_K,
        G::Q6_K,
        G::Q3_K,
        G::IQ4_NL,
        G::IQ4_XS,
        G::Q2_K,
    ]
};

/// `n` values of type `t` as random blocks (any bytes are valid blocks)
/// whose f16 scales are set so values stay within about `scale`.
pub fn random_blocks(
    rng: &mut tokenwire_core::rng::Rng,
    t: tokenwire_kernels::gguf::GgmlType,
    n: usize,
    scale: f32,
) -> Vec<u8> {
    use tokenwire_kernels::gguf::GgmlType as G;
    let (per, bytes) = (t.block_len(), t.block_bytes());
    assert!(per > 1, "{t} is not a block type");
    assert_eq!(n % per, 0, "{n} values are not whole {t} blocks");
    let mut out = Vec::with_capacity(n / per * bytes);
    for _ in 0..n / per {
        let mut b: Vec<u8> = (0..bytes).map(|_| rng.below(256) as u8).collect();
        let mut f16 = |at: usize, v: f32| {
            let jitter = 0.5 + rng.next_f64() as f32;
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v * jitter).to_le_bytes());
        };
        match t {
            G::Q8_0 => f16(0, scale / 128.0),
            G::Q4_0 => f16(0, scale / 8.0),
            G::Q4_1 => {
                f16(0, scale / 8.0);
                f16(2, -scale);
            }
            G::Q5_0 => f16(0, scale / 16.0),
            G::Q5_1 => {
                f16(0, scale / 16.0);
                f16(2, -scale);
            }
            G::Q4_K => {
                f16(0, scale / 480.0);
                f16(2, scale / 60.0);
            }
            G::Q5_K => {
                f16(0, scale / 960.0);
                f16(2, scale / 60.0);
            }
            G::Q3_K => f16(108, scale / 128.0),
            G::Q6_K => f16(208, scale / 2048.0),
            G::IQ4_NL => f16(0, scale / 127.0),
            G::IQ4_XS => f16(0, scale / (127.0 * 32.0)),
            G::Q2_K => {
                f16(80, scale / 45.0);
                f16(82, scale / 15.0);
            }
            _ => unreachable!("{t} is not in QUANT_TYPES"),
        }
        out.extend_from_slice(&b);
    }
    out
}

/// A model of `shape` with seeded uniform weights (variance 1 / fan-in).
pub fn random_model(s: &Shape, seed: u64) -> tokenwire_kernels::Model {
    use tokenwire_kernels::gguf::GgmlType;
    use tokenwire_kernels::tensor::encode_floats;
    use tokenwire_kernels::{
        LayerWeights, Linear, Model, ModelConfig, QkNorm, WeightMatrix, Weights,
    };
    let mut rng = tokenwire_core::rng::Rng::new(seed);
    let dtype = s.dtype;
    let mut uniform = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                let x = (rng.next_f64() as f32 * 2.0 - 1.0) * scale;
                match dtype {
                    "f16" => half::f16::from_f32(x).to_f32(),
                    "bf16" => half::bf16::from_f32(x).to_f32(),
                    _ => x,
                }
            })
            .collect()
    };
    let ty = match dtype {
        "f16" => GgmlType::F16,
        "bf16" => GgmlType::BF16,
        _ => GgmlType::F32,
    };
    let mut next_quant = 0usize;
    let mut block_rng = tokenwire_core::rng::Rng::new(seed ^ 0xb10c);
    let mut matrix = move |rows: usize, cols: usize, v: Vec<f32>| {
        if dtype == "quant" {
            let t = QUANT_TYPES[next_quant % QUANT_TYPES.len()];
            next_quant += 1;
            let scale = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let bytes = random_blocks(&mut block_rng, t, rows * cols, scale);
            return WeightMatrix::from_bytes(t, rows, cols, bytes).expect("whole blocks");
        }
        let bytes = encode_floats(ty, &v).expect("float dtype");
        WeightMatrix::from_bytes(ty, rows, cols, bytes).expect("rows * cols values")
    };
    let mut lin = |out_dim: usize, in_dim: usize, bias: bool| Linear {
        w: matrix(
            out_dim,
            in_dim,
            uniform(out_dim * in_dim, (3.0 / in_dim as f32).sqrt()),
        ),
        b: bias.then(|| uniform(out_dim, 0.5)),
    };
    let (h, q, kv) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut norm_rng = tokenwire_core::rng::Rng::new(seed ^ 0x9c4);
    let mut head_norm =
        |n: usize| -> Vec<f32> { (0..n).map(|_| 0.5 + norm_rng.next_f64() as f32).collect() };
    let layers = (0..s.layers)
        .map(|_| LayerWeights {
            qk_norm: s.qk_norm.then(|| QkNorm {
                q: head_norm(s.head_dim),
                k: head_norm(s.head_dim),
            }),
            input_norm: vec![1.0; h],
            q: lin(q, h, s.bias),
            k: lin(kv, h, s.bias),
            v: lin(kv, h, s.bias),
            o: lin(h, q, s.bias),
            post_norm: vec![1.0; h],
            gate: lin(s.inter, h, false),
            up: lin(s.inter, h, false),
            down: lin(h, s.inter, false),
        })
        .collect();
    let lm_head = (!s.tied).then(|| lin(s.vocab, h, false));
    let uniform2 = |n: usize| -> Vec<f32> {
        let mut r = tokenwire_core::rng::Rng::new(seed ^ 0x5eed);
        (0..n)
            .map(|_| {
                let x = r.next_f64() as f32 * 2.0 - 1.0;
                match dtype {
                    "f16" => half::f16::from_f32(x).to_f32(),
                    "bf16" => half::bf16::from_f32(x).to_f32(),
                    _ => x,
                }
            })
            .collect()
    };
    let embed = matrix(s.vocab, h, uniform2(s.vocab * h));
    let config = ModelConfig {
        hidden_size: h,
        intermediate_size: s.inter,
        num_layers: s.layers,
        num_heads: s.heads,
        num_kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        vocab_size: s.vocab,
        max_position_embeddings: 4096,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: s.scaling.clone(),
        tie_word_embeddings: s.tied,
        attention_bias: s.bias,
        qk_norm: s.qk_norm,
        fused_projections: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        name_or_path: None,
    };
    let weights = Weights {
        embed,
        layers,
        norm: vec![1.0; h],
        lm_head,
        dtype: dtype.into(),
        rope: tokenwire_kernels::RopeLayout::HalfSplit,
    };
    Model::new(config, weights).expect("consistent random model")
}
