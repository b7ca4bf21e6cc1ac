//! `HfCodec::decode` builds text from a per-id table for SentencePiece and
//! byte-level decoders; it must give exactly what the `tokenizers` crate's
//! own decoder chain gives, for any ids (byte-fallback runs valid or not,
//! special and added tokens, ids past the vocabulary).

mod common;

use common::*;
use proptest::prelude::*;
use tokenizers::Tokenizer;
use tokenwire_core::TextCodec;
use tokenwire_kernels::tokenizer::HfCodec;

/// Ids below `vocab + 3` (three past the end), with byte tokens and the first
/// ids (specials) drawn often.
fn ids(vocab: u32, bytes: std::ops::Range<u32>) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(
        prop_oneof![
            3 => 0..vocab + 3,
            3 => bytes,
            1 => 0..4u32,
        ],
        0..24,
    )
}

/// Asserts the table and the decoder chain agree on `ids`.
fn agree(codec: &HfCodec, ids: &[u32]) -> Result<(), TestCaseError> {
    let want = codec.tokenizer().decode(ids, true).expect("decode");
    prop_assert_eq!(codec.decode(ids), want, "ids {:?}", ids);
    Ok(())
}

#[test]
fn stories260k_decodes_by_table_exactly_as_the_tokenizer_does() {
    let dir = stories_dir();
    let codec = HfCodec::load(&dir).expect("codec");
    assert!(codec.decodes_by_table(), "a SentencePiece decoder");
    let vocab = codec.tokenizer().get_vocab_size(true) as u32;
    // <0x00>..<0xFF> are ids 3..259 in a llama2.c tokenizer.
    proptest!(ProptestConfig::with_cases(2000), |(ids in ids(vocab, 3..259))| {
        agree(&codec, &ids)?;
    });
    // Runs that end mid-character, a character split by a piece, the
    // leading-space strip with and without a special token first.
    let byte = |b: u8| {
        codec
            .tokenizer()
            .token_to_id(&format!("<0x{b:02X}>"))
            .unwrap()
    };
    let once = codec.encode("Once", false).unwrap();
    for case in [
        vec![byte(0xE4), byte(0xB8)],
        vec![byte(0xE4), byte(0xB8), byte(0xAD)],
        vec![byte(0xE4), once[0], byte(0xAD)],
        vec![1, once[0]],
        vec![byte(b' '), byte(b' '), once[0]],
    ] {
        agree(&codec, &case).unwrap();
    }
}

#[test]
fn a_byte_level_bpe_decodes_by_table_exactly_as_the_tokenizer_does() {
    let codec = byte_level_bpe();
    assert!(codec.decodes_by_table(), "a ByteLevel decoder");
    let vocab = codec.tokenizer().get_vocab_size(true) as u32;
    // Bytes 0x80.. are the pieces that split characters.
    proptest!(ProptestConfig::with_cases(2000), |(ids in ids(vocab, 0x80..0x100))| {
        agree(&codec, &ids)?;
    });
    let text = "the 中文 and <tool> é🦀";
    let ids = codec.encode(text, false).unwrap();
    assert_eq!(codec.decode(&ids), text);
}

#[test]
fn other_decoders_keep_the_tokenizers_own_path() {
    let dir = TempDir::new("decode-wordlevel");
    dir.write("tokenizer.json", toy_tokenizer_json(10));
    let tokenizer = Tokenizer::from_file(dir.path().join("tokenizer.json")).expect("tokenizer");
    let codec = HfCodec::new(tokenizer, None);
    assert!(!codec.decodes_by_table());
    agree(&codec, &[4, 5, 6]).unwrap();
}
