//! A `llama` (SentencePiece) vocabulary from GGUF metadata: stories260K's
//! `tok512.model` as llama.cpp stores it (pieces, scores, types; fixture by
//! `scripts/make-spm-fixture.py`), built into a tokenizer whose ids and
//! text agree with the model directory's own `tokenizer.json`.

mod common;

use tokenwire_core::TextCodec;
use tokenwire_kernels::gguf::GgufFile;
use tokenwire_kernels::gguf_tokenizer::codec_from_gguf;
use tokenwire_kernels::HfCodec;

#[test]
fn a_sentencepiece_vocabulary_tokenizes_as_its_tokenizer_json_does() {
    let dir = common::stories_dir();
    let path = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/stories260k_tokenizer.gguf"
    ));
    let bytes = std::fs::read(path).expect("fixture");
    let file = GgufFile::parse(&bytes).expect("parses");
    let ours = codec_from_gguf(path, &file).expect("builds");
    let theirs = HfCodec::load(&dir).expect("tokenizer.json");
    let texts = [
        "Once upon a time, there was a little girl named Lily.",
        "  two leading spaces and\ttabs\nand newlines",
        "Numbers 12345, symbols #@!, and unicode: café, 東京, 🚀.",
        "",
        "x",
    ];
    for text in texts {
        for special in [true, false] {
            let a = ours.encode(text, special).expect("ours");
            let b = theirs.encode(text, special).expect("theirs");
            assert_eq!(a, b, "{text:?} (add_special {special})");
            assert_eq!(ours.decode(&a), theirs.decode(&b), "{text:?}");
        }
    }
    // BOS is added, as the file says.
    assert_eq!(ours.encode("hi", true).expect("ids")[0], 1);
}

#[test]
fn add_eos_token_ends_every_text_encoded_with_special_tokens() {
    // As an embedding model's file says (Qwen3-Embedding's GGUF): its
    // end-of-text token after each input, as llama.cpp adds it.
    use tokenwire_kernels::gguf::MetaValue;
    let path = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/stories260k_tokenizer.gguf"
    ));
    let bytes = std::fs::read(path).expect("fixture");
    let plain = codec_from_gguf(path, &GgufFile::parse(&bytes).expect("parses")).expect("builds");
    let text = "Once upon a time";
    let ids = plain.encode(text, true).expect("ids");
    let eos = 2;
    assert_ne!(ids.last(), Some(&eos), "no EOS unless the file says so");
    for add_bos in [true, false] {
        let mut file = GgufFile::parse(&bytes).expect("parses");
        file.metadata
            .insert("tokenizer.ggml.add_eos_token".into(), MetaValue::Bool(true));
        file.metadata.insert(
            "tokenizer.ggml.add_bos_token".into(),
            MetaValue::Bool(add_bos),
        );
        let codec = codec_from_gguf(path, &file).expect("builds");
        let mut want = if add_bos {
            ids.clone()
        } else {
            ids[1..].to_vec()
        };
        want.push(eos);
        assert_eq!(
            codec.encode(text, true).expect("ids"),
            want,
            "add_bos {add_bos}"
        );
        // Without special tokens, neither.
        assert_eq!(
            codec.encode(text, false).expect("ids"),
            plain.encode(text, false).expect("ids")
        );
        // The EOS is skipped in text, as every special token is.
        assert_eq!(codec.decode(&want), plain.decode(&ids));
    }
}
