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
    let c = ModelConfig::from_gguf(&path, &f).expect("a config");
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
        ModelConfig::from_gguf(&path, &g)
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
