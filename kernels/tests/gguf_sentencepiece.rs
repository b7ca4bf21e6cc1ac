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
