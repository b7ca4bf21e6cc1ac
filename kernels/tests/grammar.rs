//! Structured output's grammar engine on the real tokenizers: llguidance's
//! masks over stories260K's and SmolLM2's vocabularies, walked by the
//! shared sampler over random logits (the worst a model can do), 100
//! seeded walks per case, every output parsed and checked against its
//! schema; and a JSON grammar behind the reasoning gate on a tokenizer
//! whose reasoning tags are added tokens, as Qwen3's are.

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

/// A byte-level BPE tokenizer (GPT-2's 256 byte characters, no merges)
/// with Qwen3's reasoning tags as added tokens (not special: decoding
/// keeps them) and an end-of-sequence token; the ids of `<think>`,
/// `</think>` and the end.
fn thinking_codec() -> (HfCodec, [TokenId; 3]) {
    // GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
    // others for 256 + their rank among them.
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut vocab = serde_json::Map::new();
    let mut others = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            others += 1;
            255 + others
        };
        vocab.insert(char::from_u32(c).expect("char").to_string(), json!(b));
    }
    let added = |id: u32, content: &str, special: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": special})
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": false, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(256, "<think>", false), added(257, "</think>", false),
                         added(258, "<|im_end|>", true)],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "vocab": vocab, "merges": [], "dropout": null,
                  "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false}
    });
    let tokenizer =
        tokenizers::Tokenizer::from_bytes(tokenizer.to_string().as_bytes()).expect("tokenizer");
    let mut codec = HfCodec::new(tokenizer, None);
    codec.enable_grammar(259, &[258]);
    (codec, [256, 257, 258])
}

#[test]
fn a_json_grammar_behind_the_reasoning_gate_holds_only_after_the_close_tag() {
    // vLLM's structured output for reasoning models, on a real tokenizer
    // (tags as Qwen3's added tokens) and llguidance's JSON grammar.
    use tokenwire_core::constraint::Constraint;
    use tokenwire_core::reasoning::ReasoningTags;
    use tokenwire_core::reasoning_gate::{ReasoningGate, TagTokens};
    use tokenwire_core::TokenConstraint;
    let (codec, [open, close, eos]) = thinking_codec();
    ReasoningTags::THINK.check(&codec).expect("the tags decode");
    let tags = TagTokens::of(ReasoningTags::THINK, &codec).expect("one token each");
    assert_eq!((tags.open, tags.close), (Some(open), close));
    let vocab = eos + 1;
    let grammar = Constraint::new(codec.constrain(&Grammar::JsonObject).expect("compiles"));
    let mut gate = ReasoningGate::new(Some(grammar), tags, false);
    let ids = |text: &str| codec.encode(text, false).expect("encodes");
    let mask = |g: &mut ReasoningGate| {
        let mut m = TokenMask::none(vocab);
        g.fill_mask(&mut m).expect("mask");
        m
    };
    // First token: the open tag, or the JSON's first.
    let m = mask(&mut gate);
    assert!(m.allows(open) && m.allows(ids("{")[0]));
    assert!(!m.allows(ids("x")[0]) && !m.allows(close));
    gate.advance(open).expect("thinks");
    // Inside the reasoning: anything, JSON-breaking text included.
    for t in ids("\nno { json } here\n") {
        assert_eq!(mask(&mut gate).count(), vocab);
        gate.advance(t).expect("free text");
    }
    gate.advance(close).expect("closes");
    // After it, llguidance's JSON object from its first byte (compact:
    // no whitespace before it).
    let m = mask(&mut gate);
    assert!(m.allows(ids("{")[0]), "an object may open");
    assert!(!m.allows(ids("x")[0]) && !m.allows(open) && !m.allows(close) && !m.allows(eos));
    for t in ids("{\"a\":1}") {
        assert!(mask(&mut gate).allows(t), "token {t}");
        gate.advance(t).expect("the grammar takes it");
    }
    assert!(mask(&mut gate).allows(eos), "the object may end the answer");
}

/// Whether all of `text` matches `pattern` (as vLLM's `regex` means it).
fn matches_whole(pattern: &str, text: &str) -> bool {
    let re = regex_automata::meta::Regex::new(&format!("^(?:{pattern})$")).expect("a valid regex");
    re.is_match(text)
}

#[test]
fn random_walks_follow_a_regular_expression_whole() {
    let (codec, vocab, eos) = stories_codec();
    for pattern in [
        r"[0-9]{3}-[a-z]{2,4}",
        r"(cat|dog|bird) #[1-9][0-9]?",
        r"[A-Z][a-z ]{0,20}\.",
    ] {
        let grammar = Grammar::Regex(pattern.into());
        for seed in 0..50 {
            let (text, ended) = walk(&codec, vocab, &eos, &grammar, seed, 60);
            assert!(ended, "{pattern} seed {seed}: no end: {text:?}");
            assert!(
                matches_whole(pattern, &text),
                "{pattern} seed {seed}: {text:?}"
            );
        }
    }
}

#[test]
fn random_walks_pick_exactly_one_choice() {
    let (codec, vocab, eos) = stories_codec();
    // Prefixes of each other, quotes, a backslash, a newline and a
    // character outside ASCII: each is written exactly.
    let choices = ["yes", "yes, but", "no \"way\"", "a\\b\nc", "été"];
    let grammar = Grammar::Choice(choices.iter().map(|c| c.to_string()).collect());
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..100 {
        let (text, ended) = walk(&codec, vocab, &eos, &grammar, seed, 40);
        assert!(ended, "seed {seed}: no end: {text:?}");
        assert!(choices.contains(&text.as_str()), "seed {seed}: {text:?}");
        seen.insert(text);
    }
    assert!(
        seen.len() >= 3,
        "random logits reach several choices: {seen:?}"
    );
}

#[test]
fn any_character_a_choice_holds_is_written_exactly() {
    let (codec, vocab, eos) = stories_codec();
    // DEL, a tab, a C1 control and a character past the BMP.
    let choices = ["a\u{7f}b", "tab\there", "c\u{85}", "emoji 😀"];
    let grammar = Grammar::Choice(choices.iter().map(|c| c.to_string()).collect());
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..60 {
        let (text, ended) = walk(&codec, vocab, &eos, &grammar, seed, 40);
        assert!(ended, "seed {seed}: no end: {text:?}");
        assert!(choices.contains(&text.as_str()), "seed {seed}: {text:?}");
        seen.insert(text);
    }
    assert!(seen.len() >= 2, "{seen:?}");
}

#[test]
fn a_client_s_lark_grammar_is_followed() {
    let (codec, vocab, eos) = stories_codec();
    let lark = r#"start: greeting " " name "!"
greeting: "hi" | "hello"
name: /[a-z]{1,8}/"#;
    let grammar = Grammar::Lark(lark.into());
    for seed in 0..50 {
        let (text, ended) = walk(&codec, vocab, &eos, &grammar, seed, 40);
        assert!(ended, "seed {seed}: no end: {text:?}");
        assert!(
            matches_whole(r"(hi|hello) [a-z]{1,8}!", &text),
            "seed {seed}: {text:?}"
        );
    }
}

#[test]
fn bad_regexes_and_grammars_are_refused_naming_what() {
    let (codec, _, _) = stories_codec();
    for (grammar, what) in [
        (Grammar::Regex("[a-z".into()), "the regular expression"),
        (Grammar::Regex("(a".into()), "the regular expression"),
        (Grammar::Lark("start: undefined_rule".into()), "the grammar"),
        (Grammar::Lark("root ::= \"a\"".into()), "the grammar"),
    ] {
        let e = codec.constrain(&grammar).err().expect("refused");
        assert!(
            e.starts_with(what) && e.contains("cannot be enforced"),
            "{grammar:?}: {e}"
        );
    }
}
