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

/// Magistral's reasoning tags (special tokens since 2507) and Mistral's
/// tool-call markers, in the order [`with_special_tokens`] adds them.
const MISTRAL_SPECIALS: [&str; 5] = ["[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"];

/// `tokenizer` with [`MISTRAL_SPECIALS`] added as special tokens, as
/// Mistral's tokenizers have them, at the ids after the last.
fn with_special_tokens(tokenizer: &Tokenizer) -> (Tokenizer, Vec<u32>) {
    let mut tj: serde_json::Value =
        serde_json::from_str(&tokenizer.to_string(false).expect("json")).expect("json");
    let next = tokenizer.get_vocab_size(true) as u32;
    let ids: Vec<u32> = (next..).take(MISTRAL_SPECIALS.len()).collect();
    for (id, tag) in ids.iter().zip(MISTRAL_SPECIALS) {
        if let Some(vocab) = tj["model"]["vocab"].as_object_mut() {
            vocab.insert(tag.into(), serde_json::json!(id));
        }
        tj["added_tokens"]
            .as_array_mut()
            .expect("added tokens")
            .push(
                serde_json::json!({"id": id, "content": tag, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
            );
    }
    let tokenizer = Tokenizer::from_bytes(tj.to_string().as_bytes()).expect("tokenizer");
    (tokenizer, ids)
}

/// What the tokenizer gives for `ids` with the `kept` specials kept: every
/// other special token dropped, then decoded without skipping.
fn decoded_keeping(tokenizer: &Tokenizer, kept: &[u32], ids: &[u32]) -> String {
    let added = tokenizer.get_added_tokens_decoder();
    let shown: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|id| kept.contains(id) || !added.get(id).is_some_and(|t| t.special))
        .collect();
    tokenizer.decode(&shown, false).expect("decode")
}

#[test]
fn reasoning_tags_and_tool_markers_that_are_special_tokens_still_decode_into_text() {
    use tokenwire_core::reasoning::ReasoningTags;
    use tokenwire_core::reasoning_gate::TagTokens;
    let sentencepiece = HfCodec::load(&stories_dir()).expect("codec");
    let wordlevel = Tokenizer::from_bytes(toy_tokenizer_json(10).as_bytes()).expect("tokenizer");
    for (base, byte_ids, table) in [
        (sentencepiece.tokenizer().clone(), 3..259, true),
        (byte_level_bpe().tokenizer().clone(), 0x80..0x100, true),
        (wordlevel, 1..10, false),
    ] {
        let (tokenizer, kept) = with_special_tokens(&base);
        let (open, close) = (kept[0], kept[1]);
        let codec = HfCodec::new(tokenizer.clone(), None);
        assert_eq!(codec.decodes_by_table(), table);
        // Encoded as one token each, decoded back to their text: the
        // Mistral parser can find them, and a gate or a budget can use them.
        assert_eq!(ReasoningTags::MISTRAL.check(&codec), Ok(()));
        let tags = TagTokens::of(ReasoningTags::MISTRAL, &codec).expect("one token each");
        assert_eq!((tags.open, tags.close), (Some(open), close));
        // So are the tool-call markers, which the parser finds in the text.
        for (&id, text) in kept.iter().zip(MISTRAL_SPECIALS) {
            assert_eq!(codec.encode(text, false), Ok(vec![id]));
            assert_eq!(codec.decode(&[id]), text);
        }
        // Every other special token is still skipped.
        let skipped: Vec<u32> = tokenizer
            .get_added_tokens_decoder()
            .iter()
            .filter(|(id, t)| t.special && !kept.contains(id))
            .map(|(&id, _)| id)
            .collect();
        assert!(!skipped.is_empty());
        for &id in &skipped {
            assert_eq!(codec.decode(&[id]), "", "special {id}");
        }
        let vocab = tokenizer.get_vocab_size(true) as u32;
        let byte_ids = byte_ids.clone();
        proptest!(ProptestConfig::with_cases(500), |(mut ids in ids(vocab, byte_ids.clone()), at in 0..24usize, which in 0..MISTRAL_SPECIALS.len())| {
            ids.insert(at.min(ids.len()), kept[which]);
            prop_assert_eq!(codec.decode(&ids), decoded_keeping(&tokenizer, &kept, &ids));
        });
    }
}
