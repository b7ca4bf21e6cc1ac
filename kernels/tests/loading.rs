//! Loading checkpoints written on the fly: errors name the problem, and the
//! supported variants (Qwen2 biases + tied head, shards, f16, bf16) compute
//! what an independent naive forward pass computes.

mod common;

use common::*;
use safetensors::Dtype;
use tokenwire_core::TokenId;
use tokenwire_kernels::{Engine, EngineOptions, LoadError};

const PROMPT: &[TokenId] = &[1, 5, 9, 13, 2, 30, 7, 7, 39];

fn load(dir: &TempDir) -> Result<Engine, LoadError> {
    Engine::load(dir.path(), &EngineOptions::default())
}

fn load_err(dir: &TempDir) -> String {
    match load(dir) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected a load error"),
    }
}

/// Writes the toy's tensors with one of them changed by `edit`.
fn write_edited(dir: &TempDir, toy: &Toy, edit: impl Fn(&mut Vec<(String, Vec<usize>, Vec<u8>)>)) {
    dir.write("config.json", toy_config(toy.qwen).to_string());
    dir.write("tokenizer.json", toy_tokenizer_json(TOY_VOCAB));
    let mut tensors: Vec<_> = toy_values(toy)
        .into_iter()
        .map(|(n, s, v)| (n, s, encode(toy.dtype, &v)))
        .collect();
    edit(&mut tensors);
    write_weights(dir, toy.dtype, toy.shards, &tensors);
}

fn check_against_naive(engine: &mut Engine) {
    let got = logits_alone(engine, PROMPT);
    let want = naive_logits(engine.model(), PROMPT);
    let diff = max_abs_diff(&got, &want);
    assert!(diff < 1e-4, "engine vs naive forward: {diff}");
}

#[test]
fn llama_toy_loads_and_matches_naive_forward() {
    let dir = TempDir::new("llama");
    write_toy(&dir, &Toy::default());
    let mut e = load(&dir).expect("loads");
    let info = e.model_info();
    assert_eq!(info.version, "toy-llama");
    assert_eq!(info.eos_ids, vec![2]);
    assert_eq!(info.context_len, 128);
    assert_eq!(
        info.num_blocks, 64,
        "4 * 128 / 16 = 32, raised to the minimum 64"
    );
    assert_eq!(
        info.name,
        dir.path().file_name().expect("name").to_string_lossy()
    );
    assert!(e.model().weights().lm_head.is_some());
    check_against_naive(&mut e);
}

#[test]
fn qwen2_toy_with_biases_and_tied_embeddings() {
    let dir = TempDir::new("qwen");
    let toy = Toy {
        qwen: true,
        ..Toy::default()
    };
    write_toy(&dir, &toy);
    // generation_config's eos list overrides config.json's single id.
    dir.write(
        "generation_config.json",
        r#"{"bos_token_id": 1, "eos_token_id": [2, 3]}"#,
    );
    let mut e = load(&dir).expect("loads");
    assert_eq!(e.model_info().eos_ids, vec![2, 3]);
    assert_eq!(e.model_info().version, "1");
    let w = e.model().weights();
    assert!(w.lm_head.is_none(), "tied");
    assert!(w.layers[0].q.b.is_some() && w.layers[1].v.b.is_some());
    assert!(w.layers[0].o.b.is_none());
    assert_eq!(e.model().config().head_dim, 4, "hidden / heads");
    check_against_naive(&mut e);
    // The biases matter: zeroing them changes the logits.
    let with = logits_alone(&mut e, PROMPT);
    let dir2 = TempDir::new("qwen-nobias");
    write_edited(&dir2, &toy, |ts| {
        for (n, _, b) in ts.iter_mut() {
            if n.ends_with(".bias") {
                b.iter_mut().for_each(|x| *x = 0);
            }
        }
    });
    let mut e2 = load(&dir2).expect("loads");
    assert!(max_abs_diff(&with, &logits_alone(&mut e2, PROMPT)) > 1e-3);
    // attention_bias promises biases: then a missing one is an error.
    let dir3 = TempDir::new("qwen-missing-bias");
    write_edited(&dir3, &toy, |ts| {
        ts.retain(|t| t.0 != "model.layers.1.self_attn.k_proj.bias")
    });
    let mut cfg = toy_config(true);
    cfg["attention_bias"] = serde_json::json!(true);
    dir3.write("config.json", cfg.to_string());
    let err = load_err(&dir3);
    assert!(
        err.contains("model.layers.1.self_attn.k_proj.bias"),
        "{err}"
    );
}

#[test]
fn qwen3_toy_normalises_query_and_key_heads() {
    let dir = TempDir::new("qwen3");
    write_qwen3_toy(&dir, &Toy::default());
    let mut e = load(&dir).expect("loads");
    assert!(e.model().config().qk_norm);
    assert!(e.model().weights().layers[1].qk_norm.is_some());
    assert_eq!(
        e.model().config().head_dim,
        QWEN3_HD,
        "heads wider than 16 / 4"
    );
    check_against_naive(&mut e);
    // The norms matter: the same checkpoint read as a llama (its norms
    // left unread) computes other logits.
    let with = logits_alone(&mut e, PROMPT);
    let mut cfg = qwen3_toy_config();
    cfg["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    cfg["model_type"] = serde_json::json!("llama");
    dir.write("config.json", cfg.to_string());
    let mut llama = load(&dir).expect("loads as a llama");
    assert!(!llama.model().config().qk_norm);
    assert!(max_abs_diff(&with, &logits_alone(&mut llama, PROMPT)) > 1e-2);
    // A missing norm is an error naming it.
    let dir2 = TempDir::new("qwen3-missing");
    write_qwen3_toy(&dir2, &Toy::default());
    let mut tensors = qwen3_toy_tensors(&Toy::default());
    tensors.retain(|t| t.0 != "model.layers.0.self_attn.q_norm.weight");
    write_weights(&dir2, Toy::default().dtype, 0, &tensors);
    let err = load_err(&dir2);
    assert!(
        err.contains("model.layers.0.self_attn.q_norm.weight"),
        "{err}"
    );
}

#[test]
fn a_sliding_window_shorter_than_the_context_is_the_context_served() {
    // Mistral is a llama with another name, and (v0.1) attention over a
    // sliding window, which the engine does not compute: a context the
    // window holds whole is computed exactly, so that is what is served.
    let dir = TempDir::new("mistral");
    write_toy(&dir, &Toy::default());
    let mut want = load(&dir).expect("the llama toy loads");
    let mut cfg = toy_config(false);
    cfg["architectures"] = serde_json::json!(["MistralForCausalLM"]);
    cfg["model_type"] = serde_json::json!("mistral");
    for window in [serde_json::Value::Null, serde_json::json!(128)] {
        cfg["sliding_window"] = window;
        dir.write("config.json", cfg.to_string());
        let mut e = load(&dir).expect("a window the context fits in");
        assert_eq!(e.model_info().context_len, 128);
        assert_eq!(
            logits_alone(&mut e, PROMPT),
            logits_alone(&mut want, PROMPT)
        );
    }
    cfg["sliding_window"] = serde_json::json!(64);
    dir.write("config.json", cfg.to_string());
    let mut e = load(&dir).expect("a window shorter than the context");
    assert_eq!(e.model_info().context_len, 64, "the window, not 128");
    assert_eq!(
        logits_alone(&mut e, PROMPT),
        logits_alone(&mut want, PROMPT)
    );
    // No longer context can be asked for.
    let err = match Engine::load(
        dir.path(),
        &EngineOptions {
            max_context: Some(100),
            ..EngineOptions::default()
        },
    ) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a context above the window"),
    };
    assert!(err.contains("above the model's context of 64"), "{err}");
    // Named by its architecture alone, it is still Mistral.
    cfg.as_object_mut().expect("object").remove("model_type");
    dir.write("config.json", cfg.to_string());
    assert_eq!(load(&dir).expect("loads").model_info().context_len, 64);
    // Another architecture's window is not read (Qwen2 keeps one that
    // `use_sliding_window: false` turns off).
    let mut llama = toy_config(false);
    llama["sliding_window"] = serde_json::json!(64);
    dir.write("config.json", llama.to_string());
    let e = load(&dir).expect("a llama's window field is not Mistral's");
    assert_eq!(e.model_info().context_len, 128);
}

#[test]
fn phi3_splits_its_stacked_projections_into_the_llama_s() {
    // The llama toy's values stacked as Phi-3 stores them compute what the
    // llama toy computes, bit for bit.
    let llama = TempDir::new("phi3-llama");
    write_toy(&llama, &Toy::default());
    let mut want = load(&llama).expect("the llama toy loads");
    let dir = TempDir::new("phi3");
    write_phi3_toy(&dir, &Toy::default(), serde_json::Value::Null);
    let mut e = load(&dir).expect("loads");
    assert!(e.model().config().fused_projections);
    assert_eq!(
        logits_alone(&mut e, PROMPT),
        logits_alone(&mut want, PROMPT)
    );
    check_against_naive(&mut e);
    // Sharded and in bf16, the split views the right rows too.
    let bf16 = Toy {
        dtype: Dtype::BF16,
        shards: 2,
        ..Toy::default()
    };
    let (a, b) = (TempDir::new("phi3-bf16"), TempDir::new("llama-bf16"));
    write_phi3_toy(&a, &bf16, serde_json::Value::Null);
    write_toy(&b, &bf16);
    assert_eq!(
        logits_alone(&mut load(&a).expect("loads"), PROMPT),
        logits_alone(&mut load(&b).expect("loads"), PROMPT)
    );
    // A stacked bias is split as its rows are.
    let mut tensors = phi3_toy_tensors(&Toy::default());
    let qkv_bias: Vec<f32> = (0..16 + 8 + 8).map(|i| i as f32 / 10.0).collect();
    for l in 0..2 {
        tensors.push((
            format!("model.layers.{l}.self_attn.qkv_proj.bias"),
            vec![qkv_bias.len()],
            encode(Dtype::F32, &qkv_bias),
        ));
    }
    let mut cfg = phi3_toy_config(serde_json::Value::Null);
    cfg["attention_bias"] = serde_json::json!(true);
    dir.write("config.json", cfg.to_string());
    write_weights(&dir, Dtype::F32, 0, &tensors);
    let biased = load(&dir).expect("loads");
    let layer = &biased.model().weights().layers[1];
    assert_eq!(layer.q.b.as_deref(), Some(&qkv_bias[..16]));
    assert_eq!(layer.k.b.as_deref(), Some(&qkv_bias[16..24]));
    assert_eq!(layer.v.b.as_deref(), Some(&qkv_bias[24..]));
    write_phi3_toy(&dir, &Toy::default(), serde_json::Value::Null);
    // A missing stacked matrix is named; a mis-shaped one too.
    let mut tensors = phi3_toy_tensors(&Toy::default());
    tensors.retain(|t| t.0 != "model.layers.1.mlp.gate_up_proj.weight");
    write_weights(&dir, Dtype::F32, 0, &tensors);
    let err = load_err(&dir);
    assert!(
        err.contains("model.layers.1.mlp.gate_up_proj.weight"),
        "{err}"
    );
    let mut tensors = phi3_toy_tensors(&Toy::default());
    for t in tensors.iter_mut() {
        if t.0 == "model.layers.0.self_attn.qkv_proj.weight" {
            t.1 = vec![t.1[0] - 1, t.1[1]];
            t.2.truncate(t.2.len() - 16 * 4);
        }
    }
    write_weights(&dir, Dtype::F32, 0, &tensors);
    let err = load_err(&dir);
    assert!(err.contains("qkv_proj"), "{err}");
    // Phi-4-mini's partial rotation is refused, not computed as a whole one.
    let mut cfg = phi3_toy_config(serde_json::Value::Null);
    cfg["partial_rotary_factor"] = serde_json::json!(0.75);
    write_phi3_toy(&dir, &Toy::default(), serde_json::Value::Null);
    dir.write("config.json", cfg.to_string());
    let err = load_err(&dir);
    assert!(err.contains("partial_rotary_factor 0.75"), "{err}");
}

#[test]
fn phi3_longrope_takes_its_long_factors_only_past_the_trained_context() {
    // Head width 4: two rotary pairs, so two factors in each list. The
    // toy's context (128) is four times its pre-trained one (32).
    let scaling = serde_json::json!({
        "type": "longrope",
        "short_factor": [1.0, 1.5],
        "long_factor": [3.0, 9.0],
    });
    let dir = TempDir::new("phi3-longrope");
    write_phi3_toy(&dir, &Toy::default(), scaling.clone());
    let mut long = load(&dir).expect("loads");
    let tokenwire_kernels::RopeScaling::LongRope {
        use_long, mscale, ..
    } = long.model().config().rope_scaling.clone()
    else {
        panic!("LongRoPE");
    };
    assert!(use_long, "a context of 128 past the 32 trained");
    // Hugging Face's default: sqrt(1 + ln(128 / 32) / ln(32)) = sqrt(1.4).
    assert!((mscale - 1.4f64.sqrt()).abs() < 1e-12, "{mscale}");
    check_against_naive(&mut long);
    // Served within the trained context, the short factors.
    let mut short = Engine::load(
        dir.path(),
        &EngineOptions {
            max_context: Some(32),
            ..EngineOptions::default()
        },
    )
    .expect("loads");
    assert!(matches!(
        short.model().config().rope_scaling,
        tokenwire_kernels::RopeScaling::LongRope {
            use_long: false,
            ..
        }
    ));
    check_against_naive(&mut short);
    // Each part matters: the lists, and the attention factor.
    let plain = {
        let d = TempDir::new("phi3-plain");
        write_phi3_toy(&d, &Toy::default(), serde_json::Value::Null);
        logits_alone(&mut load(&d).expect("loads"), PROMPT)
    };
    let (l, s) = (
        logits_alone(&mut long, PROMPT),
        logits_alone(&mut short, PROMPT),
    );
    assert!(max_abs_diff(&l, &s) > 1e-3 && max_abs_diff(&s, &plain) > 1e-3);
    let mut given = scaling.clone();
    given["attention_factor"] = serde_json::json!(1.0);
    write_phi3_toy(&dir, &Toy::default(), given);
    let mut unscaled = Engine::load(
        dir.path(),
        &EngineOptions {
            max_context: Some(32),
            ..EngineOptions::default()
        },
    )
    .expect("loads");
    let u = logits_alone(&mut unscaled, PROMPT);
    assert!(
        max_abs_diff(&u, &s) > 1e-3,
        "the attention factor is applied"
    );
    // A default pool that holds less than the pre-trained context serves
    // that much, with the short factors.
    let mut cfg = phi3_toy_config(scaling.clone());
    cfg["original_max_position_embeddings"] = serde_json::json!(100);
    write_phi3_toy(&dir, &Toy::default(), scaling.clone());
    dir.write("config.json", cfg.to_string());
    let small = Engine::load(
        dir.path(),
        &EngineOptions {
            block_size: 1,
            kv_budget: Some(1),
            ..EngineOptions::default()
        },
    )
    .expect("loads");
    assert_eq!(small.model_info().context_len, 64, "the smallest pool");
    assert!(matches!(
        small.model().config().rope_scaling,
        tokenwire_kernels::RopeScaling::LongRope {
            use_long: false,
            ..
        }
    ));
    // Bad lists are named.
    for (edit, needle) in [
        (
            serde_json::json!({"short_factor": [1.0]}),
            "`short_factor` has 1 factors for 2",
        ),
        (
            serde_json::json!({"long_factor": [1.0, -2.0]}),
            "`long_factor[1]`",
        ),
        (
            serde_json::json!({"short_factor": null}),
            "missing array `short_factor`",
        ),
    ] {
        let mut bad = scaling.clone();
        for (k, v) in edit.as_object().expect("object") {
            bad[k] = v.clone();
        }
        write_phi3_toy(&dir, &Toy::default(), bad);
        let err = load_err(&dir);
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let single = TempDir::new("single");
    write_toy(&single, &Toy::default());
    let sharded = TempDir::new("sharded");
    write_toy(
        &sharded,
        &Toy {
            shards: 3,
            ..Toy::default()
        },
    );
    assert!(!sharded.path().join("model.safetensors").exists());
    let a = logits_alone(&mut load(&single).expect("single"), PROMPT);
    let b = logits_alone(&mut load(&sharded).expect("sharded"), PROMPT);
    assert_eq!(a, b);
}

#[test]
fn f16_and_bf16_checkpoints() {
    for dtype in [Dtype::F16, Dtype::BF16] {
        let toy = Toy {
            dtype,
            seed: 5,
            ..Toy::default()
        };
        let dir = TempDir::new("half");
        write_toy(&dir, &toy);
        let mut e = load(&dir).expect("loads");
        let name = if dtype == Dtype::F16 { "f16" } else { "bf16" };
        assert_eq!(e.model_info().dtype, name);
        // The same (already rounded) values stored as f32 give the same logits.
        let f32dir = TempDir::new("half-as-f32");
        write_edited(
            &f32dir,
            &Toy {
                dtype: Dtype::F32,
                ..toy
            },
            |_| {},
        );
        let tensors: Vec<_> = toy_values(&toy)
            .into_iter()
            .map(|(n, s, v)| (n, s, encode(Dtype::F32, &v)))
            .collect();
        write_weights(&f32dir, Dtype::F32, 0, &tensors);
        let mut e32 = load(&f32dir).expect("loads");
        assert_eq!(e32.model_info().dtype, "f32");
        assert_eq!(logits_alone(&mut e, PROMPT), logits_alone(&mut e32, PROMPT));
        check_against_naive(&mut e);
    }
}

#[test]
fn broken_config_json() {
    let dir = TempDir::new("badjson");
    write_toy(&dir, &Toy::default());
    dir.write("config.json", "{\"hidden_size\": 16,");
    let err = load_err(&dir);
    assert!(
        err.contains("config.json") && err.contains("invalid JSON"),
        "{err}"
    );

    let mut cfg = toy_config(false);
    cfg.as_object_mut()
        .expect("object")
        .remove("num_hidden_layers");
    dir.write("config.json", cfg.to_string());
    let err = load_err(&dir);
    assert!(
        err.contains("config.json") && err.contains("num_hidden_layers"),
        "{err}"
    );

    let mut cfg = toy_config(false);
    cfg["rms_norm_eps"] = serde_json::json!("small");
    dir.write("config.json", cfg.to_string());
    let err = load_err(&dir);
    assert!(err.contains("rms_norm_eps"), "{err}");

    std::fs::remove_file(dir.path().join("config.json")).expect("rm");
    let err = load_err(&dir);
    assert!(
        err.contains("config.json") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let dir = TempDir::new("missing");
    write_edited(&dir, &Toy::default(), |ts| {
        ts.retain(|t| t.0 != "model.layers.1.mlp.up_proj.weight")
    });
    let err = load_err(&dir);
    assert!(err.contains("model.safetensors"), "{err}");
    assert!(
        err.contains("missing tensor `model.layers.1.mlp.up_proj.weight`"),
        "{err}"
    );

    // Untied config without lm_head.
    let dir = TempDir::new("nohead");
    write_edited(&dir, &Toy::default(), |ts| {
        ts.retain(|t| t.0 != "lm_head.weight")
    });
    assert!(load_err(&dir).contains("lm_head.weight"));

    // Sharded: not in the index, or the index points at a shard without it.
    let dir = TempDir::new("missing-sharded");
    write_edited(
        &dir,
        &Toy {
            shards: 2,
            ..Toy::default()
        },
        |ts| ts.retain(|t| t.0 != "model.norm.weight"),
    );
    let err = load_err(&dir);
    assert!(
        err.contains("index.json") && err.contains("model.norm.weight"),
        "{err}"
    );
}

#[test]
fn wrong_shape_and_dtype_are_named() {
    let dir = TempDir::new("shape");
    write_edited(&dir, &Toy::default(), |ts| {
        for t in ts.iter_mut() {
            if t.0 == "model.layers.0.self_attn.k_proj.weight" {
                t.1 = vec![t.1[1], t.1[0]];
            }
        }
    });
    let err = load_err(&dir);
    assert!(
        err.contains("model.layers.0.self_attn.k_proj.weight"),
        "{err}"
    );
    assert!(err.contains("shape [16, 8], expected [8, 16]"), "{err}");

    // An integer tensor where floats belong.
    let dir = TempDir::new("dtype");
    dir.write("config.json", toy_config(false).to_string());
    dir.write("tokenizer.json", toy_tokenizer_json(TOY_VOCAB));
    let mut ts: Vec<_> = toy_values(&Toy::default())
        .into_iter()
        .map(|(n, s, v)| (n, s, encode(Dtype::F32, &v)))
        .collect();
    let norm = ts
        .iter()
        .position(|t| t.0 == "model.norm.weight")
        .expect("norm");
    let bad = ts.remove(norm);
    // The odd tensor goes into its own file, which the index points at.
    write_weights(&dir, Dtype::F32, 1, &ts);
    dir.write(
        "odd.safetensors",
        safetensors_bytes(Dtype::I32, &[(bad.0.clone(), bad.1.clone(), bad.2.clone())]),
    );
    let idx =
        std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).expect("index");
    let mut idx: serde_json::Value = serde_json::from_str(&idx).expect("json");
    idx["weight_map"]["model.norm.weight"] = serde_json::json!("odd.safetensors");
    dir.write("model.safetensors.index.json", idx.to_string());
    let err = load_err(&dir);
    assert!(
        err.contains("odd.safetensors") && err.contains("dtype I32"),
        "{err}"
    );
}

#[test]
fn hostile_files_are_errors_not_panics() {
    let dir = TempDir::new("hostile");
    write_toy(&dir, &Toy::default());
    dir.write(
        "model.safetensors",
        b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage",
    );
    let err = load_err(&dir);
    assert!(
        err.contains("model.safetensors") && err.contains("safetensors"),
        "{err}"
    );

    // A shard path that escapes the directory.
    let dir = TempDir::new("escape");
    write_toy(
        &dir,
        &Toy {
            shards: 2,
            ..Toy::default()
        },
    );
    let idx =
        std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).expect("index");
    let mut idx: serde_json::Value = serde_json::from_str(&idx).expect("json");
    idx["weight_map"]["model.norm.weight"] = serde_json::json!("../x.safetensors");
    dir.write("model.safetensors.index.json", idx.to_string());
    let err = load_err(&dir);
    assert!(err.contains("../x.safetensors"), "{err}");

    // Bad tokenizer, bad generation config.
    let dir = TempDir::new("badtok");
    write_toy(&dir, &Toy::default());
    dir.write("tokenizer.json", "{}");
    let err = load_err(&dir);
    assert!(err.contains("tokenizer.json"), "{err}");
    write_toy(&dir, &Toy::default());
    dir.write("generation_config.json", r#"{"eos_token_id": "two"}"#);
    let err = load_err(&dir);
    assert!(
        err.contains("generation_config.json") && err.contains("eos_token_id"),
        "{err}"
    );
    std::fs::remove_file(dir.path().join("tokenizer.json")).expect("rm");
    dir.write("generation_config.json", "{}");
    let err = load_err(&dir);
    assert!(
        err.contains("tokenizer.json") && err.contains("cannot read"),
        "{err}"
    );

    // No weights at all.
    let dir = TempDir::new("noweights");
    dir.write("config.json", toy_config(false).to_string());
    let err = load_err(&dir);
    assert!(err.contains("model.safetensors.index.json"), "{err}");
}

#[test]
fn engine_options_set_the_pool() {
    let dir = TempDir::new("opts");
    write_toy(&dir, &Toy::default());
    let e = Engine::load(
        dir.path(),
        &EngineOptions {
            num_blocks: Some(10),
            block_size: 8,
            ..EngineOptions::default()
        },
    )
    .expect("loads");
    assert_eq!(e.model_info().num_blocks, 10);
    assert_eq!(e.model_info().block_size, 8);
    let err = Engine::load(
        dir.path(),
        &EngineOptions {
            block_size: 0,
            ..EngineOptions::default()
        },
    )
    .expect_err("must fail");
    assert!(err.to_string().contains("block_size"), "{err}");
}

#[test]
fn the_default_pool_fits_its_budget_and_the_context_fits_the_pool() {
    // The tiny model: 2 layers of 2 KV heads of 16, so a block of 8 slots
    // holds 2 x 2 x 2 x 16 x 8 f32s = 4 KiB of K and V; context 1024.
    let block = 4096u64;
    let info = |opts: EngineOptions| Engine::tiny_with(1, &opts).map(|e| e.model_info());
    let with = |budget: u64, max_context: Option<u32>| EngineOptions {
        block_size: 8,
        kv_budget: Some(budget),
        max_context,
        ..EngineOptions::default()
    };
    // Four contexts (512 blocks) when the budget holds them.
    let i = info(with(1 << 30, None)).expect("loads");
    assert_eq!((i.num_blocks, i.context_len), (512, 1024));
    // Fewer within a smaller budget, the context whole while a pool holds it.
    let i = info(with(200 * block, None)).expect("loads");
    assert_eq!((i.num_blocks, i.context_len), (200, 1024));
    // At least 64 blocks; a context they cannot hold is lowered to theirs.
    let i = info(with(10 * block, None)).expect("loads");
    assert_eq!((i.num_blocks, i.context_len), (64, 512));
    // A context asked for sizes the default pool.
    let i = info(with(1 << 30, Some(300))).expect("loads");
    assert_eq!((i.num_blocks, i.context_len), (150, 300));
    // An explicit pool is taken as it is, the context with it.
    let i = info(EngineOptions {
        num_blocks: Some(70),
        max_context: Some(1000),
        ..with(block, None)
    })
    .expect("loads");
    assert_eq!((i.num_blocks, i.context_len), (70, 1000));
    let e = info(with(1 << 30, Some(1025))).expect_err("above the model's");
    assert!(
        e.to_string()
            .contains("max_context 1025 is above the model's context of 1024"),
        "{e}"
    );
    let e = info(with(1 << 30, Some(0))).expect_err("zero");
    assert!(
        e.to_string().contains("max_context must be positive"),
        "{e}"
    );
    let engine = Engine::tiny_with(1, &with(10 * block, None)).expect("loads");
    assert_eq!(engine.model_context(), 1024);
    assert!(
        tokenwire_kernels::default_kv_budget() >= 1 << 20,
        "a budget at all"
    );
}

#[test]
fn llama3_rope_scaling_config_runs() {
    // Long-context scaling only changes the frequencies; check the config is
    // accepted and that the engine uses it (logits differ from unscaled).
    let dir = TempDir::new("llama3");
    write_toy(&dir, &Toy::default());
    let base = logits_alone(&mut load(&dir).expect("loads"), PROMPT);
    let mut cfg = toy_config(false);
    cfg["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16});
    dir.write("config.json", cfg.to_string());
    let scaled = logits_alone(&mut load(&dir).expect("loads"), PROMPT);
    assert!(max_abs_diff(&base, &scaled) > 1e-4);
}
