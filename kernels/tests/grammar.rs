//! Structured output's grammar engine on the real tokenizers: llguidance's
//! masks over stories260K's and SmolLM2's vocabularies, walked by the
//! shared sampler over random logits (the worst a model can do), 100
//! seeded walks per case, every output parsed and checked against its
//! schema.

mod common;

use serde_json::{json, Value};
use tokenwire_core::rng::Rng;
use tokenwire_core::{Grammar, SamplingParams, TextCodec, TokenId, TokenMask};
use tokenwire_kernels::{Engine, EngineOptions, HfCodec, Sampler};

/// A schema every walk can finish: bounded strings and numbers, an enum,
/// a boolean, a short array.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "mood": {"enum": ["happy", "sad", "calm"]},
            "pet": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}
        },
        "required": ["name", "age", "mood", "pet", "tags"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`person_schema`], naming the first violation.
fn check_person(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    if keys != ["name", "age", "mood", "pet", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name")?;
    if !(1..=12).contains(&name.chars().count()) {
        return Err(format!("name length {}", name.chars().count()));
    }
    let age = o["age"].as_i64().ok_or("age")?;
    if !(0..=120).contains(&age) {
        return Err(format!("age {age}"));
    }
    if !["happy", "sad", "calm"].contains(&o["mood"].as_str().ok_or("mood")?) {
        return Err("mood".into());
    }
    o["pet"].as_bool().ok_or("pet")?;
    let tags = o["tags"].as_array().ok_or("tags")?;
    if tags.len() > 3
        || tags
            .iter()
            .any(|t| t.as_str().is_none_or(|s| s.chars().count() > 6))
    {
        return Err(format!("tags {tags:?}"));
    }
    Ok(())
}

/// Walks `grammar` with the sampler over random logits until an
/// end-of-sequence token (or `limit` tokens), returning the text and
/// whether it ended.
fn walk(
    codec: &dyn TextCodec,
    vocab: u32,
    eos: &[TokenId],
    grammar: &Grammar,
    seed: u64,
    limit: usize,
) -> (String, bool) {
    let mut c = codec.constrain(grammar).expect("compiles");
    let mut mask = TokenMask::none(vocab);
    let mut rng = Rng::new(seed);
    let mut sampler = Sampler::new();
    let params = SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    };
    let mut out = Vec::new();
    for pos in 0..limit {
        c.fill_mask(&mut mask).expect("mask");
        let logits: Vec<f32> = (0..vocab).map(|_| rng.next_f64() as f32 * 8.0).collect();
        let (t, _) = sampler.sample_masked(&logits, &params, pos as u32, &out, None, Some(&mask));
        assert!(mask.allows(t), "sampled {t} outside the mask");
        c.advance(t)
            .expect("the grammar takes what its mask allowed");
        if eos.contains(&t) {
            return (codec.decode(&out), true);
        }
        out.push(t);
    }
    (codec.decode(&out), false)
}

fn stories_codec() -> (HfCodec, u32, Vec<TokenId>) {
    let mut codec = HfCodec::load(&common::stories_dir()).expect("tokenizer");
    codec.enable_grammar(512, &[2]);
    (codec, 512, vec![2])
}

fn check_walks(codec: &dyn TextCodec, vocab: u32, eos: &[TokenId]) {
    let schema = Grammar::JsonSchema {
        schema: person_schema(),
        strict: true,
    };
    for seed in 0..100 {
        let (text, ended) = walk(codec, vocab, eos, &schema, seed, 400);
        assert!(ended, "seed {seed}: no end after 400 tokens: {text:?}");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
        check_person(&v).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
    }
    for seed in 0..20 {
        let (text, ended) = walk(codec, vocab, eos, &Grammar::JsonObject, seed, 60);
        // A free object need not end in 60 random tokens; if it did, it parses.
        if ended {
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
            assert!(v.is_object(), "{text}");
        } else {
            assert!(text.starts_with('{'), "{text}");
        }
    }
}

#[test]
fn random_walks_over_stories260k_give_json_that_matches_the_schema() {
    let (codec, vocab, eos) = stories_codec();
    check_walks(&codec, vocab, &eos);
}

#[test]
fn random_walks_over_smollm2_give_json_that_matches_the_schema() {
    let Some(path) = common::smollm2_gguf() else {
        return;
    };
    let engine = Engine::load(&path, &EngineOptions::default()).expect("loads");
    let info = engine.model_info();
    // The engine's codec has the grammar enabled with the model's ends.
    let codec = engine.codec();
    let mut c = codec.0.constrain(&Grammar::JsonObject).expect("compiles");
    let mut m = TokenMask::none(info.vocab_size);
    c.fill_mask(&mut m).expect("mask");
    assert!(m.count() > 0);
    for t in (0..info.vocab_size).filter(|&t| m.allows(t)) {
        assert!(codec.0.decode(&[t]).starts_with('{'), "token {t}");
    }
    check_walks(&*codec.0, info.vocab_size, &info.eos_ids);
}

#[test]
fn bad_schemas_are_refused_with_a_reason() {
    let (codec, _, _) = stories_codec();
    let e = codec
        .constrain(&Grammar::JsonSchema {
            schema: json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}),
            strict: true,
        })
        .err()
        .expect("refused");
    assert!(e.contains("cannot be enforced"), "{e}");
    let e = codec
        .constrain(&Grammar::JsonSchema {
            schema: json!({"type": "integer", "minimum": 5, "maximum": 1}),
            strict: true,
        })
        .err()
        .expect("refused");
    assert!(!e.is_empty());
    // Without the grammar engine (never enabled), the reason says so.
    let plain = HfCodec::load(&common::stories_dir()).expect("tokenizer");
    let e = plain
        .constrain(&Grammar::JsonObject)
        .err()
        .expect("refused");
    assert!(e.contains("not enabled"), "{e}");
}

#[test]
fn pydantic_style_refs_and_defs_compile() {
    let (codec, vocab, eos) = stories_codec();
    let schema = json!({
        "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"], "additionalProperties": false}},
        "type": "object",
        "properties": {"pet": {"$ref": "#/$defs/Pet"}},
        "required": ["pet"],
        "additionalProperties": false
    });
    let g = Grammar::JsonSchema {
        schema,
        strict: true,
    };
    for seed in 0..10 {
        let (text, ended) = walk(&codec, vocab, &eos, &g, seed, 100);
        assert!(ended, "{text}");
        let v: Value = serde_json::from_str(&text).expect("parses");
        assert!(
            ["cat", "dog"].contains(&v["pet"]["kind"].as_str().unwrap_or("")),
            "{text}"
        );
    }
}
