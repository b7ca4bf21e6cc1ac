//! `HfCodec::max_token_bytes`: the bound that lets the Host refuse a prompt
//! that cannot fit by its byte length alone must never be wrong, since a wrong
//! bound refuses prompts that would fit.

mod common;

use common::*;
use proptest::prelude::*;
use tokenizers::Tokenizer;
use tokenwire_core::TextCodec;
use tokenwire_kernels::tokenizer::HfCodec;

/// Characters that stress every path: spaces (`▁`), newlines, multi-byte
/// characters, byte fallback, digits and punctuation.
fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just(" ".to_string()),
            Just("  ".to_string()),
            Just("\n".to_string()),
            "[a-z]{1,8}",
            "[A-Z0-9.,!?]{1,3}",
            Just("é".to_string()),
            Just("中文".to_string()),
            Just("🦀".to_string()),
            any::<char>().prop_map(|c| c.to_string()),
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

/// Tokens `codec` makes of `text`, without the BOS it adds.
fn tokens(codec: &HfCodec, text: &str) -> usize {
    let with = codec.encode(text, true).expect("encode").len();
    let without = codec.encode(text, false).expect("encode").len();
    with.min(without)
}

#[test]
fn stories260k_has_a_bound_and_never_breaks_it() {
    let dir = stories_dir();
    let codec = HfCodec::load(&dir).expect("codec");
    let bound = codec
        .max_token_bytes()
        .expect("a SentencePiece BPE with byte fallback");
    assert_eq!(bound, 9, "its longest piece");
    proptest!(ProptestConfig::with_cases(512), |(t in text())| {
        let n = tokens(&codec, &t);
        prop_assert!(n * bound >= t.len(), "{:?}: {} tokens for {} bytes", t, n, t.len());
    });
}

#[test]
fn a_byte_level_bpe_has_a_bound_and_never_breaks_it() {
    let codec = byte_level_bpe();
    let bound = codec.max_token_bytes().expect("byte-level BPE");
    assert_eq!(bound, "<|endoftext|>".len());
    proptest!(ProptestConfig::with_cases(512), |(t in text())| {
        let n = tokens(&codec, &t);
        prop_assert!(n * bound >= t.len(), "{:?}: {} tokens for {} bytes", t, n, t.len());
    });
    // Worst case for the merges: every token spans as much as it can.
    let t = " the and the and";
    assert!(tokens(&codec, t) * bound >= t.len());
}

#[test]
fn tokenizers_that_drop_text_have_no_bound() {
    // Whitespace pre-tokenization drops spaces: a megabyte of them is no token.
    let dir = TempDir::new("bound-wordlevel");
    dir.write("tokenizer.json", toy_tokenizer_json(10));
    let tokenizer = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("tokenizer");
    let codec = HfCodec::new(tokenizer, None);
    assert_eq!(codec.max_token_bytes(), None);
    assert_eq!(tokens(&codec, &" ".repeat(1000)), 0, "why it has none");
}
