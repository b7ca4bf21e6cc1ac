//! The GGUF parser on a real file: SmolLM2-135M-Instruct, Q4_1, as llama.cpp
//! wrote it (its metadata, every tensor in range and of a loaded type), and
//! every prefix of its header refused with an error rather than a panic.

mod common;

use tokenwire_kernels::gguf::{GgmlType, GgufFile};

#[test]
fn smollm2_q4_1_parses_with_its_architecture_tokenizer_and_tensors() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let bytes = std::fs::read(&path).expect("readable");
    let f = GgufFile::parse(&bytes).expect("a valid GGUF file");
    assert_eq!(f.str("general.architecture"), Ok(Some("llama")));
    assert_eq!(f.uint("llama.block_count"), Ok(Some(30)));
    assert_eq!(f.uint("llama.embedding_length"), Ok(Some(576)));
    assert_eq!(f.uint("llama.attention.head_count"), Ok(Some(9)));
    assert_eq!(f.uint("llama.attention.head_count_kv"), Ok(Some(3)));
    assert_eq!(f.str("tokenizer.ggml.model"), Ok(Some("gpt2")));
    let tokens = f
        .array("tokenizer.ggml.tokens")
        .expect("an array")
        .expect("present");
    assert_eq!(tokens.len(), 49152);
    assert!(f
        .str("tokenizer.chat_template")
        .expect("a string")
        .is_some());
    // 30 layers of 9 tensors, the embedding and the final norm (the LM
    // head is tied to the embedding).
    assert_eq!(
        f.tensors.len(),
        30 * 9 + 2,
        "{:?}",
        f.tensors.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    let q = f.tensor("blk.0.attn_q.weight").expect("q");
    assert_eq!(q.dims, vec![576, 576]);
    assert_eq!(q.dtype, GgmlType::Q4_1);
    let norm = f.tensor("blk.0.attn_norm.weight").expect("norm");
    assert_eq!(norm.dtype, GgmlType::F32);
    let end = f
        .tensors
        .iter()
        .map(|t| t.offset + t.len)
        .max()
        .unwrap_or(0);
    assert_eq!(end, bytes.len() as u64, "the last tensor ends the file");
    let header = f.data_offset as usize;
    for len in (0..header).step_by(header / 64 + 1) {
        assert!(GgufFile::parse(&bytes[..len]).is_err(), "{len}-byte prefix");
    }
}

#[test]
fn smollm2_metadata_gives_its_config_and_bad_metadata_names_the_key() {
    use tokenwire_kernels::gguf::MetaValue;
    use tokenwire_kernels::{ModelConfig, RopeScaling};
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let bytes = std::fs::read(&path).expect("readable");
    let f = GgufFile::parse(&bytes).expect("valid");
    let c = ModelConfig::from_gguf(&path, &f, &bytes).expect("a config");
    // As SmolLM2-135M-Instruct's config.json has them.
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_layers),
        (576, 1536, 30)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (9, 3, 64));
    assert_eq!((c.vocab_size, c.max_position_embeddings), (49152, 8192));
    assert_eq!(c.rope_theta, 100_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert!((c.rms_norm_eps - 1e-5).abs() < 1e-12);
    assert!(c.tie_word_embeddings && !c.attention_bias);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );

    let broken = |edit: &dyn Fn(&mut GgufFile)| {
        let mut g = f.clone();
        edit(&mut g);
        ModelConfig::from_gguf(&path, &g, &bytes)
            .expect_err("bad metadata accepted")
            .to_string()
    };
    let e = broken(&|g| {
        g.metadata.remove("llama.embedding_length");
    });
    assert!(
        e.contains("llama.embedding_length") && e.contains("gguf"),
        "{e}"
    );
    let e = broken(&|g| {
        g.metadata
            .insert("llama.attention.head_count_kv".into(), MetaValue::U32(4));
    });
    assert!(e.contains("not a multiple"), "{e}");
    let e = broken(&|g| {
        g.metadata.insert(
            "general.architecture".into(),
            MetaValue::Str("mamba".into()),
        );
    });
    assert!(e.contains("architecture `mamba`"), "{e}");
    let e = broken(&|g| {
        g.metadata
            .insert("llama.context_length".into(), MetaValue::Str("long".into()));
    });
    assert!(e.contains("not a non-negative integer"), "{e}");
    let e = broken(&|g| {
        g.metadata.insert(
            "llama.rope.scaling.type".into(),
            MetaValue::Str("yarn".into()),
        );
    });
    assert!(e.contains("yarn"), "{e}");
}

/// The factors llama.cpp's converter (`convert_hf_to_gguf.py`, Llama 3.1's
/// `rope_scaling`) writes into `rope_freqs.weight`, computed as it does.
fn converter_rope_factors(head_dim: usize, theta: f64) -> Vec<f32> {
    let (factor, low, high, old_ctx) = (8.0f64, 1.0, 4.0, 1024.0);
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

#[test]
fn llama3_rope_factors_in_rope_freqs_divide_each_pairs_frequency() {
    use tokenwire_kernels::gguf::{MetaValue, TensorInfo};
    use tokenwire_kernels::{rope, ModelConfig, RopeScaling};
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let bytes = std::fs::read(&path).expect("readable");
    let f = GgufFile::parse(&bytes).expect("valid");
    // SmolLM2's own file with a `rope_freqs.weight` appended, as a Llama
    // 3.1 or 3.2 file carries one (head_dim 64: 32 factors).
    let with_factors = |dtype: GgmlType, dims: Vec<u64>, vals: &[f32]| {
        let mut b = bytes.clone();
        b.resize(b.len().next_multiple_of(32), 0);
        let offset = b.len() as u64;
        let data: Vec<u8> = match dtype {
            GgmlType::F16 => vals
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            _ => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        b.extend_from_slice(&data);
        let mut g = f.clone();
        g.tensors.push(TensorInfo {
            name: "rope_freqs.weight".into(),
            dims,
            dtype,
            offset,
            len: data.len() as u64,
        });
        (g, b)
    };
    let factors = converter_rope_factors(64, 100_000.0);
    assert!(
        factors.contains(&8.0) && factors.iter().any(|&x| x > 1.0 && x < 8.0),
        "the case reaches both the scaled and the smoothed pairs: {factors:?}"
    );
    let (g, b) = with_factors(GgmlType::F32, vec![32], &factors);
    let c = ModelConfig::from_gguf(&path, &g, &b).expect("a config");
    assert!(matches!(c.rope_scaling, RopeScaling::PerPair { .. }));
    let ours = rope::inv_freq(c.head_dim, c.rope_theta, &c.rope_scaling);
    let hf = rope::inv_freq(
        64,
        100_000.0,
        &RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 1024.0,
        },
    );
    let plain = rope::inv_freq(64, 100_000.0, &RopeScaling::None);
    for i in 0..32 {
        // Equal to transformers' Llama 3 frequencies up to the factors' f32
        // rounding.
        assert!(
            (ours[i] - hf[i]).abs() <= 1e-7 * hf[i],
            "pair {i}: {} against {}",
            ours[i],
            hf[i]
        );
    }
    assert!(
        ours[31] < plain[31] / 7.9,
        "the low frequencies are divided"
    );

    let err = |dtype, dims: Vec<u64>, vals: &[f32]| {
        let (g, b) = with_factors(dtype, dims, vals);
        ModelConfig::from_gguf(&path, &g, &b)
            .expect_err("bad RoPE factors accepted")
            .to_string()
    };
    let e = err(GgmlType::F32, vec![16], &factors[..16]);
    assert!(e.contains("rope_freqs.weight") && e.contains("[32]"), "{e}");
    let e = err(GgmlType::F16, vec![32], &factors);
    assert!(e.contains("F16"), "{e}");
    let mut bad = factors.clone();
    bad[5] = -1.0;
    let e = err(GgmlType::F32, vec![32], &bad);
    assert!(e.contains("rope_freqs.weight`[5] is -1"), "{e}");
    bad[5] = f32::NAN;
    assert!(err(GgmlType::F32, vec![32], &bad).contains("[5] is NaN"));
    bad[5] = 0.0;
    assert!(err(GgmlType::F32, vec![32], &bad).contains("[5] is 0"));
    let (mut g, b) = with_factors(GgmlType::F32, vec![32], &factors);
    g.metadata.insert(
        "llama.rope.scaling.type".into(),
        MetaValue::Str("linear".into()),
    );
    let e = ModelConfig::from_gguf(&path, &g, &b)
        .expect_err("two scalings accepted")
        .to_string();
    assert!(e.contains("both `rope_freqs.weight`"), "{e}");
}

#[test]
fn a_llama3_style_file_loads_with_its_rope_factors_and_turn_end_ids() {
    use tokenwire_core::text::byte::ByteCodec;
    use tokenwire_kernels::gguf::MetaValue;
    use tokenwire_kernels::{Engine, EngineOptions, Model, ModelIdentity, RopeScaling};
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let bytes = std::fs::read(&path).expect("readable");
    let mut f = GgufFile::parse(&bytes).expect("valid");
    // What a Llama 3.1 or 3.2 file carries beyond SmolLM2's: its RoPE
    // factors, and the ids that end a turn and a tool-calling message.
    f.metadata
        .insert("tokenizer.ggml.eot_token_id".into(), MetaValue::U32(7));
    f.metadata
        .insert("tokenizer.ggml.eom_token_id".into(), MetaValue::U32(8));
    let factors: Vec<u8> = converter_rope_factors(64, 100_000.0)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let out = common::gguf_out::write(
        &f,
        &bytes,
        &[("rope_freqs.weight", GgmlType::F32, vec![32], factors)],
    );
    let dir = common::TempDir::new("llama3-gguf");
    dir.write("llama3-style.gguf", &out);
    // f32 activations: with 8-bit ones, a difference in a frequency's last
    // bit can move a rounding step and the logits with it.
    let opts = EngineOptions {
        num_blocks: Some(16),
        cpu_activations: tokenwire_kernels::ActivationPrecision::F32,
        ..EngineOptions::default()
    };
    let mut engine =
        Engine::load_gguf(&dir.path().join("llama3-style.gguf"), &opts).expect("loads");
    assert_eq!(engine.model_info().eos_ids, vec![2, 7, 8]);

    // The same weights under transformers' Llama 3 frequencies, and under
    // none.
    let (model, _) = Model::load_gguf(&path).expect("SmolLM2 loads");
    let with = |scaling: RopeScaling| {
        let mut config = model.config().clone();
        config.rope_scaling = scaling;
        let m = Model::new(config, model.weights().clone()).expect("a model");
        let id = ModelIdentity {
            name: "ref".into(),
            version: "1".into(),
            eos_ids: vec![2],
        };
        Engine::from_model(m, ByteCodec::shared(), id, &opts).expect("an engine")
    };
    let mut llama3 = with(RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 1024.0,
    });
    let mut plain = with(RopeScaling::None);
    let prompt: Vec<u32> = (0..48).map(|i| 100 + 37 * i).collect();
    let ours = common::logits_alone(&mut engine, &prompt);
    let hf = common::logits_alone(&mut llama3, &prompt);
    let unscaled = common::logits_alone(&mut plain, &prompt);
    let (d_hf, d_plain) = (
        common::max_abs_diff(&ours, &hf),
        common::max_abs_diff(&ours, &unscaled),
    );
    assert!(
        d_hf < 1e-3 && d_plain > 100.0 * d_hf.max(1e-4),
        "against Llama 3 frequencies {d_hf}, against none {d_plain}"
    );
}

#[test]
fn a_turn_end_token_ends_a_generation_even_where_the_file_does_not_name_it() {
    use tokenwire_kernels::gguf::MetaValue;
    use tokenwire_kernels::{Engine, EngineOptions};
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let bytes = std::fs::read(&path).expect("readable");
    let mut f = GgufFile::parse(&bytes).expect("valid");
    // SmolLM2's special tokens 5 and 6 renamed as Phi-3's end of turn and
    // Llama 3's, in a file whose metadata names neither (as llama.cpp's
    // converter wrote Phi-3 files): llama.cpp ends at them by name.
    let Some(MetaValue::Array(tokens)) = f.metadata.get_mut("tokenizer.ggml.tokens") else {
        panic!("a token list");
    };
    tokens[5] = MetaValue::Str("<|end|>".into());
    tokens[6] = MetaValue::Str("<|eot_id|>".into());
    assert!(!f.metadata.contains_key("tokenizer.ggml.eot_token_id"));
    let out = common::gguf_out::write(&f, &bytes, &[]);
    let dir = common::TempDir::new("turn-end-gguf");
    dir.write("renamed.gguf", &out);
    let opts = EngineOptions {
        num_blocks: Some(16),
        ..EngineOptions::default()
    };
    let engine = Engine::load_gguf(&dir.path().join("renamed.gguf"), &opts).expect("loads");
    assert_eq!(engine.model_info().eos_ids, vec![2, 5, 6]);
    // SmolLM2 itself: its EOS alone (its `<|endoftext|>` is not an end).
    let engine = Engine::load_gguf(&path, &opts).expect("loads");
    assert_eq!(engine.model_info().eos_ids, vec![2]);
}

/// `model`'s weights written as llama.cpp's converter names them in an
/// `arch` GGUF file, all F32 (rows in Hugging Face's order: the converter
/// permutes only llamas'); with `stacked`, each layer's q|k|v in one
/// `attn_qkv` and gate|up in one `ffn_up`, as in a `phi3` file. Returns
/// the header and the data it points into.
fn gguf_of(model: &tokenwire_kernels::Model, arch: &str, stacked: bool) -> (GgufFile, Vec<u8>) {
    use tokenwire_kernels::gguf::{MetaValue, TensorInfo};
    use tokenwire_kernels::WeightMatrix;
    let (c, w) = (model.config(), model.weights());
    let mut source = Vec::new();
    let mut tensors = Vec::new();
    let mut put = |name: String, parts: &[&WeightMatrix]| {
        let vals: Vec<f32> = parts.iter().flat_map(|m| m.to_f32_vec()).collect();
        let (rows, cols) = (
            parts.iter().map(|m| m.rows()).sum::<usize>(),
            parts[0].cols(),
        );
        let offset = source.len() as u64;
        source.extend(vals.iter().flat_map(|x| x.to_le_bytes()));
        source.resize(source.len().next_multiple_of(32), 0);
        let dims = if rows == 1 {
            vec![cols as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        tensors.push(TensorInfo {
            name,
            dims,
            dtype: GgmlType::F32,
            offset,
            len: vals.len() as u64 * 4,
        });
    };
    let vector = |v: &[f32]| {
        WeightMatrix::from_bytes(
            GgmlType::F32,
            1,
            v.len(),
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
        .expect("a vector")
    };
    put("token_embd.weight".into(), &[&w.embed]);
    for (l, lw) in w.layers.iter().enumerate() {
        put(
            format!("blk.{l}.attn_norm.weight"),
            &[&vector(&lw.input_norm)],
        );
        if stacked {
            put(
                format!("blk.{l}.attn_qkv.weight"),
                &[&lw.q.w, &lw.k.w, &lw.v.w],
            );
        } else {
            put(format!("blk.{l}.attn_q.weight"), &[&lw.q.w]);
            put(format!("blk.{l}.attn_k.weight"), &[&lw.k.w]);
            put(format!("blk.{l}.attn_v.weight"), &[&lw.v.w]);
        }
        put(format!("blk.{l}.attn_output.weight"), &[&lw.o.w]);
        if let Some(qk) = &lw.qk_norm {
            put(format!("blk.{l}.attn_q_norm.weight"), &[&vector(&qk.q)]);
            put(format!("blk.{l}.attn_k_norm.weight"), &[&vector(&qk.k)]);
        }
        put(
            format!("blk.{l}.ffn_norm.weight"),
            &[&vector(&lw.post_norm)],
        );
        if stacked {
            put(format!("blk.{l}.ffn_up.weight"), &[&lw.gate.w, &lw.up.w]);
        } else {
            put(format!("blk.{l}.ffn_gate.weight"), &[&lw.gate.w]);
            put(format!("blk.{l}.ffn_up.weight"), &[&lw.up.w]);
        }
        put(format!("blk.{l}.ffn_down.weight"), &[&lw.down.w]);
    }
    put("output_norm.weight".into(), &[&vector(&w.norm)]);
    put(
        "output.weight".into(),
        &[&w.lm_head.as_ref().expect("the toy's head is untied").w],
    );
    let u = |n: usize| MetaValue::U32(n as u32);
    let metadata: std::collections::BTreeMap<String, MetaValue> = [
        (
            "general.architecture".to_string(),
            MetaValue::Str(arch.into()),
        ),
        (format!("{arch}.embedding_length"), u(c.hidden_size)),
        (format!("{arch}.block_count"), u(c.num_layers)),
        (
            format!("{arch}.feed_forward_length"),
            u(c.intermediate_size),
        ),
        (format!("{arch}.attention.head_count"), u(c.num_heads)),
        (format!("{arch}.attention.head_count_kv"), u(c.num_kv_heads)),
        (format!("{arch}.attention.key_length"), u(c.head_dim)),
        (
            format!("{arch}.context_length"),
            u(c.max_position_embeddings),
        ),
        (format!("{arch}.vocab_size"), u(c.vocab_size)),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(c.rms_norm_eps),
        ),
        (
            format!("{arch}.rope.freq_base"),
            MetaValue::F32(c.rope_theta as f32),
        ),
    ]
    .into_iter()
    .collect();
    let file = GgufFile {
        version: 3,
        metadata,
        tensors,
        data_offset: 0,
        alignment: 32,
    };
    (file, source)
}

/// An engine over `model` (a small pool, the byte codec).
fn toy_engine(
    model: tokenwire_kernels::Model,
    max_context: Option<u32>,
) -> tokenwire_kernels::Engine {
    let opts = tokenwire_kernels::EngineOptions {
        num_blocks: Some(16),
        max_context,
        ..tokenwire_kernels::EngineOptions::default()
    };
    let id = tokenwire_kernels::ModelIdentity {
        name: "toy".into(),
        version: "1".into(),
        eos_ids: vec![2],
    };
    let codec = tokenwire_core::text::byte::ByteCodec::shared();
    tokenwire_kernels::Engine::from_model(model, codec, id, &opts).expect("engine")
}

const TOY_PROMPT: [u32; 9] = [1, 5, 9, 13, 2, 30, 7, 7, 39];

#[test]
fn a_qwen3_gguf_file_computes_what_its_hugging_face_checkpoint_does() {
    use tokenwire_kernels::Model;
    let dir = common::TempDir::new("qwen3-hf");
    common::write_qwen3_toy(&dir, &common::Toy::default());
    let hf = Model::load(dir.path()).expect("the toy loads");
    let (file, source) = gguf_of(&hf, "qwen3", false);
    dir.write(
        "toy-qwen3.gguf",
        common::gguf_out::write(&file, &source, &[]),
    );
    // A qwen3 file without its norms is refused, not run as a llama.
    let mut bare = file.clone();
    bare.tensors.retain(|t| {
        !t.name.ends_with("attn_q_norm.weight") && !t.name.ends_with("attn_k_norm.weight")
    });
    dir.write("bare.gguf", common::gguf_out::write(&bare, &source, &[]));
    let e = Model::load_gguf(&dir.path().join("bare.gguf"))
        .expect_err("norms missing")
        .to_string();
    assert!(e.contains("blk.0.attn_q_norm.weight"), "{e}");
    let (gguf, _) = Model::load_gguf(&dir.path().join("toy-qwen3.gguf")).expect("loads");
    assert!(gguf.config().qk_norm);
    assert_eq!(gguf.config().head_dim, hf.config().head_dim);
    let a = common::logits_alone(&mut toy_engine(gguf, None), &TOY_PROMPT);
    let b = common::logits_alone(&mut toy_engine(hf, None), &TOY_PROMPT);
    assert_eq!(a, b, "the same weights, the same arithmetic");
}

#[test]
fn a_phi3_gguf_file_computes_what_its_hugging_face_checkpoint_does() {
    use tokenwire_kernels::gguf::{MetaValue, TensorInfo};
    use tokenwire_kernels::{Model, RopeScaling};
    // The Phi-3 toy with LongRoPE, written as llama.cpp's converter writes
    // a phi3 file: q|k|v and gate|up stacked, the factor lists as tensors,
    // the pre-trained context and the attention factor in the metadata.
    let dir = common::TempDir::new("phi3-hf");
    let scaling = serde_json::json!({
        "type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [3.0, 9.0],
    });
    common::write_phi3_toy(&dir, &common::Toy::default(), scaling);
    let hf = Model::load(dir.path()).expect("the toy loads");
    let mscale = hf.config().rope_scaling.mscale();
    let (mut file, mut source) = gguf_of(&hf, "phi3", true);
    for (name, factors) in [
        ("rope_factors_short.weight", [1.0f32, 1.5]),
        ("rope_factors_long.weight", [3.0, 9.0]),
    ] {
        let offset = source.len() as u64;
        source.extend(factors.iter().flat_map(|x| x.to_le_bytes()));
        source.resize(source.len().next_multiple_of(32), 0);
        file.tensors.push(TensorInfo {
            name: name.into(),
            dims: vec![2],
            dtype: GgmlType::F32,
            offset,
            len: 8,
        });
    }
    let meta = |file: &mut GgufFile, k: &str, v: MetaValue| {
        file.metadata.insert(k.to_string(), v);
    };
    meta(
        &mut file,
        "phi3.rope.scaling.original_context_length",
        MetaValue::U32(32),
    );
    meta(
        &mut file,
        "phi3.rope.scaling.attn_factor",
        MetaValue::F32(mscale as f32),
    );
    meta(
        &mut file,
        "phi3.rope.dimension_count",
        MetaValue::U32(hf.config().head_dim as u32),
    );
    meta(
        &mut file,
        "phi3.attention.sliding_window",
        MetaValue::U32(64),
    );
    let path = dir.path().join("toy-phi3.gguf");
    dir.write(
        "toy-phi3.gguf",
        common::gguf_out::write(&file, &source, &[]),
    );
    for context in [None, Some(32)] {
        let (gguf, _) = Model::load_gguf(&path).expect("loads");
        assert!(gguf.config().fused_projections);
        // As llama.cpp runs a phi3 file: attention over the whole context.
        assert_eq!(gguf.config().max_position_embeddings, 128);
        let hf = Model::load(dir.path()).expect("the toy loads");
        let (mut a, mut b) = (toy_engine(gguf, context), toy_engine(hf, context));
        assert!(matches!(
            a.model().config().rope_scaling,
            RopeScaling::LongRope { use_long, .. } if use_long == context.is_none()
        ));
        let (x, y) = (
            common::logits_alone(&mut a, &TOY_PROMPT),
            common::logits_alone(&mut b, &TOY_PROMPT),
        );
        // (The attention factor is stored as an f32.)
        assert!(common::max_abs_diff(&x, &y) < 1e-5, "{context:?}");
    }
    // Phi-4-mini's partial rotation is refused; so is half a pair of lists.
    let mut partial = file.clone();
    meta(&mut partial, "phi3.rope.dimension_count", MetaValue::U32(2));
    dir.write(
        "partial.gguf",
        common::gguf_out::write(&partial, &source, &[]),
    );
    let e = Model::load_gguf(&dir.path().join("partial.gguf"))
        .expect_err("partial RoPE")
        .to_string();
    assert!(
        e.contains("`phi3.rope.dimension_count` = 2, not the head width 4"),
        "{e}"
    );
    let mut half = file.clone();
    half.tensors
        .retain(|t| t.name != "rope_factors_long.weight");
    dir.write("half.gguf", common::gguf_out::write(&half, &source, &[]));
    let e = Model::load_gguf(&dir.path().join("half.gguf"))
        .expect_err("one list")
        .to_string();
    assert!(e.contains("without the other"), "{e}");
}

/// Values of one block quantized as llama.cpp's reference quantizers do:
/// Q5_0 scales by the value of largest magnitude over -16, Q5_1 spans the
/// block's minimum to its maximum in 31 steps.
fn quantize_q5(dtype: GgmlType, x: &[f32]) -> Vec<u8> {
    let (d, m, q): (f32, Option<f32>, Vec<u8>) = if dtype == GgmlType::Q5_0 {
        let max = x
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = x
            .iter()
            .map(|&v| ((v * id + 16.5) as i32).clamp(0, 31) as u8);
        (d, None, q.collect())
    } else {
        let (lo, hi) = x
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let d = (hi - lo) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = x
            .iter()
            .map(|&v| (((v - lo) * id + 0.5) as i32).clamp(0, 31) as u8);
        (d, Some(lo), q.collect())
    };
    let mut out = half::f16::from_f32(d).to_le_bytes().to_vec();
    if let Some(m) = m {
        out.extend(half::f16::from_f32(m).to_le_bytes());
    }
    let qh = (0..32).fold(0u32, |h, j| h | (u32::from(q[j] >> 4) << j));
    out.extend(qh.to_le_bytes());
    out.extend((0..16).map(|j| (q[j] & 15) | ((q[j + 16] & 15) << 4)));
    out
}

#[test]
fn smollm2_requantized_to_q5_runs_as_its_dequantized_weights_do() {
    // Every Q4_1 matrix requantized from its values, Q5_0 and Q5_1 by
    // turns: a file as llama.cpp's fallbacks leave one.
    requantized_smollm2_runs_as_its_dequantized_weights_do(
        "q5",
        |i, _| Some([GgmlType::Q5_0, GgmlType::Q5_1][i % 2]),
        &[GgmlType::Q5_0, GgmlType::Q5_1],
        8,
        "q5_0",
    );
}

#[test]
fn smollm2_requantized_to_q3_k_runs_as_its_dequantized_weights_do() {
    // A Q3_K_M file as llama-quantize writes one for SmolLM2: the matrices
    // whose rows are whole 256-blocks (the MLP's down projections: 1,536
    // wide) in Q3_K, the others (576 wide) in its fallback IQ4_NL.
    requantized_smollm2_runs_as_its_dequantized_weights_do(
        "q3_k",
        |_, row| Some(whole_256_or_iq4_nl(row, GgmlType::Q3_K)),
        &[GgmlType::Q3_K, GgmlType::IQ4_NL],
        12,
        "q3_k_m",
    );
}

#[test]
fn smollm2_requantized_to_iq4_xs_runs_as_its_dequantized_weights_do() {
    // An IQ4_XS file likewise: IQ4_XS where rows are whole 256-blocks,
    // IQ4_NL elsewhere.
    requantized_smollm2_runs_as_its_dequantized_weights_do(
        "iq4_xs",
        |_, row| Some(whole_256_or_iq4_nl(row, GgmlType::IQ4_XS)),
        &[GgmlType::IQ4_XS, GgmlType::IQ4_NL],
        30,
        "iq4_xs",
    );
}

#[test]
fn smollm2_requantized_to_q2_k_runs_as_its_dequantized_weights_do() {
    // The down projections (1,536 wide) in Q2_K. Plainly quantized to 2
    // bits, every matrix of the model leaves its top logits too close to
    // call between the two paths; these alone leave a clear pick.
    requantized_smollm2_runs_as_its_dequantized_weights_do(
        "q2_k",
        |_, row| row.is_multiple_of(256).then_some(GgmlType::Q2_K),
        &[GgmlType::Q2_K],
        10,
        "q2_k",
    );
}

/// One Q2_K super-block, quantized plainly (llama.cpp searches for better
/// scales and minimums): each 16-value sub-block spans its minimum (or 0)
/// to its maximum in 3 steps, those steps and minimums in 4 bits of `d`
/// and `dmin`.
fn quantize_q2_k(x: &[f32]) -> Vec<u8> {
    let (steps, mins): (Vec<f32>, Vec<f32>) = x
        .chunks_exact(16)
        .map(|c| {
            let lo = c.iter().fold(0.0f32, |m, &v| m.min(v));
            let hi = c.iter().fold(f32::MIN, |m, &v| m.max(v));
            ((hi - lo).max(0.0) / 3.0, -lo)
        })
        .unzip();
    let top = |v: &[f32]| v.iter().fold(0.0f32, |m, &a| m.max(a));
    let (d, dmin) = (
        half::f16::from_f32(top(&steps) / 15.0),
        half::f16::from_f32(top(&mins) / 15.0),
    );
    let level = |v: f32, unit: f32| {
        if unit > 0.0 {
            ((v / unit).round() as i32).clamp(0, 15) as u8
        } else {
            0
        }
    };
    let mut b = vec![0u8; 84];
    for g in 0..16 {
        let (sc, m) = (level(steps[g], d.to_f32()), level(mins[g], dmin.to_f32()));
        b[g] = sc | (m << 4);
        let (step, low) = (d.to_f32() * sc as f32, dmin.to_f32() * m as f32);
        for (p, &v) in x.iter().enumerate().skip(16 * g).take(16) {
            let q = if step > 0.0 {
                (((v + low) / step).round() as i32).clamp(0, 3) as u8
            } else {
                0
            };
            let (h, j, k) = (p / 128, (p % 128) / 32, p % 32);
            b[16 + 32 * h + k] |= q << (2 * j);
        }
    }
    b[80..82].copy_from_slice(&d.to_le_bytes());
    b[82..84].copy_from_slice(&dmin.to_le_bytes());
    b
}

/// `k_quant` for rows of whole 256-blocks, else IQ4_NL: llama-quantize's
/// fallback for Q2_K, Q3_K and IQ4_XS.
fn whole_256_or_iq4_nl(row: usize, k_quant: GgmlType) -> GgmlType {
    if row.is_multiple_of(256) {
        k_quant
    } else {
        GgmlType::IQ4_NL
    }
}

/// The value of largest magnitude, with its sign.
fn largest(v: &[f32]) -> f32 {
    v.iter()
        .fold(0.0f32, |m, &a| if a.abs() > m.abs() { a } else { m })
}

/// 32 values as IQ4_NL indices (nibbles as Q4_0 packs them) for the step
/// `step`: each the nearest of the table's values.
fn iq4_nibbles(x: &[f32], step: f32) -> Vec<u8> {
    use tokenwire_kernels::quant::blocks::IQ4NL_VALUES;
    let index = |v: f32| {
        let t = if step != 0.0 { v / step } else { 0.0 };
        (0..16u8)
            .min_by(|&a, &b| {
                let da = (IQ4NL_VALUES[a as usize] as f32 - t).abs();
                let db = (IQ4NL_VALUES[b as usize] as f32 - t).abs();
                da.total_cmp(&db)
            })
            .unwrap_or(0)
    };
    (0..16)
        .map(|j| index(x[j]) | (index(x[j + 16]) << 4))
        .collect()
}

/// One IQ4_NL block, quantized plainly (llama.cpp also searches for a
/// better scale): the value of largest magnitude maps to the table's -127.
fn quantize_iq4_nl(x: &[f32]) -> Vec<u8> {
    let d = half::f16::from_f32(largest(x) / -127.0);
    let mut b = d.to_le_bytes().to_vec();
    b.extend(iq4_nibbles(x, d.to_f32()));
    b
}

/// One IQ4_XS super-block, quantized plainly: each sub-block of 32 scaled
/// as IQ4_NL would scale it, those scales in 6 bits (-32..32) of `d`.
fn quantize_iq4_xs(x: &[f32]) -> Vec<u8> {
    let sub: Vec<f32> = x.chunks_exact(32).map(|c| largest(c) / -127.0).collect();
    let d = half::f16::from_f32(largest(&sub) / -32.0);
    let id = if d.to_f32() != 0.0 {
        1.0 / d.to_f32()
    } else {
        0.0
    };
    let l: Vec<i32> = sub
        .iter()
        .map(|&s| ((s * id).round() as i32).clamp(-32, 31))
        .collect();
    let mut b = vec![0u8; 8];
    b[..2].copy_from_slice(&d.to_le_bytes());
    let mut high = 0u16;
    for (j, &ls) in l.iter().enumerate() {
        let stored = (ls + 32) as u8;
        b[4 + j / 2] |= (stored & 15) << (4 * (j % 2));
        high |= u16::from(stored >> 4) << (2 * j);
    }
    b[2..4].copy_from_slice(&high.to_le_bytes());
    for (j, c) in x.chunks_exact(32).enumerate() {
        b.extend(iq4_nibbles(c, d.to_f32() * l[j] as f32));
    }
    b
}

/// Values of one 256-block in Q3_K, quantized plainly (llama.cpp searches
/// for better scales; the layout is what is tested): each 16-value
/// sub-block's value of largest magnitude maps to -4, the sub-block scale
/// of largest magnitude to -32.
fn quantize_q3_k(x: &[f32]) -> Vec<u8> {
    let sub: Vec<f32> = x.chunks_exact(16).map(|c| largest(c) / -4.0).collect();
    let d = largest(&sub) / -32.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let l: Vec<i32> = sub
        .iter()
        .map(|&s| ((s * id).round() as i32).clamp(-32, 31))
        .collect();
    let d16 = half::f16::from_f32(d);
    let mut b = vec![0u8; 110];
    for (p, &v) in x.iter().enumerate() {
        let step = d16.to_f32() * l[p / 16] as f32;
        let q = if step != 0.0 {
            ((v / step).round() as i32).clamp(-4, 3)
        } else {
            0
        };
        let u = (q + 4) as u8;
        let (h, j, k) = (p / 128, (p % 128) / 32, p % 32);
        b[32 + 32 * h + k] |= (u & 3) << (2 * j);
        b[k] |= (u >> 2) << (4 * h + j);
    }
    for (s, &ls) in l.iter().enumerate() {
        let stored = (ls + 32) as u8;
        b[96 + s % 8] |= (stored & 15) << (4 * (s / 8));
        b[96 + 8 + s % 4] |= (stored >> 4) << (2 * (s / 4));
    }
    b[108..110].copy_from_slice(&d16.to_le_bytes());
    b
}

/// SmolLM2 with its Q4_1 matrices that `pick` (by index and row length)
/// requantized from their values to the type it names (`kinds`, in the
/// order the file first holds them), written as a GGUF file of `file_type`
/// and loaded: with 8-bit activations it gives the
/// logits it gives with its weights widened to f32 (which the kernel
/// tests cannot show: the file's types, the layouts, every matrix's
/// dispatch), and names itself `dtype`.
fn requantized_smollm2_runs_as_its_dequantized_weights_do(
    name: &str,
    pick: fn(usize, usize) -> Option<GgmlType>,
    kinds: &[GgmlType],
    file_type: u32,
    dtype: &str,
) {
    use tokenwire_kernels::quant::blocks::dequantize_row;
    use tokenwire_kernels::{ActivationPrecision, Engine, EngineOptions};
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let bytes = std::fs::read(&path).expect("readable");
    let f = GgufFile::parse(&bytes).expect("valid");
    let mut out = f.clone();
    let mut source = Vec::new();
    let mut requantized = 0;
    let mut used = Vec::new();
    for (i, t) in out.tensors.iter_mut().enumerate() {
        let data = &bytes[t.offset as usize..(t.offset + t.len) as usize];
        let row = t.dims[0] as usize;
        let new = match pick(i, row).filter(|_| t.dtype == GgmlType::Q4_1) {
            Some(to) => {
                let mut vals = vec![0.0f32; t.elements() as usize];
                let row_bytes = data.len() / (vals.len() / row);
                for (r, out) in vals.chunks_exact_mut(row).enumerate() {
                    let at = r * row_bytes;
                    dequantize_row(GgmlType::Q4_1, &data[at..at + row_bytes], out);
                }
                t.dtype = to;
                requantized += 1;
                if !used.contains(&to) {
                    used.push(to);
                }
                match to {
                    GgmlType::Q3_K => vals.chunks_exact(256).flat_map(quantize_q3_k).collect(),
                    GgmlType::Q2_K => vals.chunks_exact(256).flat_map(quantize_q2_k).collect(),
                    GgmlType::IQ4_XS => vals.chunks_exact(256).flat_map(quantize_iq4_xs).collect(),
                    GgmlType::IQ4_NL => vals.chunks_exact(32).flat_map(quantize_iq4_nl).collect(),
                    _ => vals
                        .chunks_exact(32)
                        .flat_map(|x| quantize_q5(to, x))
                        .collect(),
                }
            }
            None => data.to_vec(),
        };
        t.offset = source.len() as u64;
        t.len = new.len() as u64;
        source.extend(new);
        source.resize(source.len().next_multiple_of(32), 0);
    }
    assert!(requantized >= 30, "{requantized} matrices requantized");
    assert_eq!(used, kinds, "{name}: the types the file was to hold");
    out.metadata.insert(
        "general.file_type".into(),
        tokenwire_kernels::gguf::MetaValue::U32(file_type),
    );
    let dir = common::TempDir::new(&format!("smollm2-{name}"));
    let file = format!("SmolLM2-{name}.gguf");
    let written = dir.path().join(&file);
    dir.write(&file, common::gguf_out::write(&out, &source, &[]));
    let engine = |precision| {
        let opts = EngineOptions {
            num_blocks: Some(16),
            cpu_activations: precision,
            ..EngineOptions::default()
        };
        Engine::load_gguf(&written, &opts).expect("the requantized file loads")
    };
    let mut fast = engine(ActivationPrecision::Int8);
    assert_eq!(fast.model_info().dtype, dtype);
    let mut wide = engine(ActivationPrecision::F32);
    let prompt: Vec<u32> = vec![1, 9690, 2115, 253, 655, 28, 665, 3345, 253];
    let a = common::logits_alone(&mut fast, &prompt);
    let b = common::logits_alone(&mut wide, &prompt);
    // The 8-bit activations' error (5e-4 with Q5; a Q5_1 kernel that
    // dropped its minimums gave 1.02). The kernel tests hold each product
    // to the reference's bits; this holds the path.
    let nmse = {
        let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2) as f64).sum();
        num / b.iter().map(|y| (y * y) as f64).sum::<f64>()
    };
    assert!(
        nmse < 5e-3,
        "{name}: int8 against f32 activations: nmse {nmse}"
    );
    assert_eq!(common::argmax(&a), common::argmax(&b));
}

#[test]
fn a_gguf_file_declares_its_pooling_in_its_metadata() {
    use tokenwire_core::Pooling;
    use tokenwire_kernels::gguf::MetaValue;
    use tokenwire_kernels::pooling::DeclaredPooling;
    use tokenwire_kernels::{Engine, EngineOptions};
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let opts = EngineOptions {
        num_blocks: Some(16),
        ..EngineOptions::default()
    };
    let plain = Engine::load_gguf(&path, &opts).expect("loads");
    assert_eq!(plain.declared_pooling(), &DeclaredPooling::None);
    assert_eq!(plain.model_info().pooling, None);
    let bytes = std::fs::read(&path).expect("readable");
    let dir = common::TempDir::new("pooling-gguf");
    for (n, want) in [
        (3, DeclaredPooling::Supported(Pooling::Last)),
        (1, DeclaredPooling::Supported(Pooling::Mean)),
        (
            2,
            DeclaredPooling::Unsupported("`cls` (llama.pooling_type = 2)".into()),
        ),
    ] {
        let mut f = GgufFile::parse(&bytes).expect("valid");
        f.metadata
            .insert("llama.pooling_type".into(), MetaValue::U32(n));
        dir.write("pooled.gguf", common::gguf_out::write(&f, &bytes, &[]));
        let e = Engine::load_gguf(&dir.path().join("pooled.gguf"), &opts).expect("loads");
        assert_eq!(e.declared_pooling(), &want, "pooling_type {n}");
        assert_eq!(e.model_info().pooling, want.supported());
    }
}
