//! Table-driven decoding for the two decoder pipelines that llama-family
//! tokenizers use, giving exactly the text `Tokenizer::decode(ids, true)`
//! gives.
//!
//! Streaming decodes a short window of ids twice per generated token
//! (`IncrementalDecoder`), on the thread that serves every connection. The
//! `tokenizers` crate does that through a chain of string-rewriting decoders
//! (a regex replace among them) and fresh `String`s per piece; here each id's
//! contribution is computed once at load, so decoding a window is lookups and
//! one UTF-8 check. Any other decoder keeps the crate's own path.

use std::collections::HashSet;

use tokenizers::Tokenizer;

/// SentencePiece's word-boundary marker, which decoders turn into a space.
pub(crate) const SP_SPACE: char = '\u{2581}';

/// What one id adds to decoded text.
#[derive(Debug, Clone)]
enum Piece {
    /// Nothing: a special token (skipped) or an id with no token.
    Skip,
    /// These bytes.
    Bytes(Box<[u8]>),
    /// One byte-fallback byte (`<0xAB>`), valid only as part of a run of them.
    Byte(u8),
}

/// The decoder pipelines this table reproduces.
#[derive(Debug, Clone, Copy)]
enum Pipeline {
    /// `Replace("▁", " ")`, `ByteFallback`, `Fuse`, then optionally
    /// `Strip(content, start, 0)` (Llama 1/2, Mistral, TinyLlama).
    SentencePiece { strip: Option<(char, usize)> },
    /// `ByteLevel` (GPT-2, Llama 3, SmolLM): every character of a token stands
    /// for one byte, and the bytes of the whole text are read as UTF-8 lossily.
    ByteLevel,
}

/// Per-id pieces for one recognized decoder pipeline.
#[derive(Debug, Clone)]
pub(crate) struct DecodeTable {
    pipeline: Pipeline,
    pieces: Vec<Piece>,
}

impl DecodeTable {
    /// The table for `tokenizer`, or `None` when its decoder is not one this
    /// module reproduces exactly. The special tokens in `kept` decode as
    /// any other added token does, into their text.
    pub(crate) fn build(tokenizer: &Tokenizer, kept: &HashSet<u32>) -> Option<DecodeTable> {
        let json: serde_json::Value =
            serde_json::from_str(&tokenizer.to_string(false).ok()?).ok()?;
        let pipeline = recognize(&json["decoder"])?;
        let ids = tokenizer.get_vocab(true).values().copied().max()? as usize + 1;
        let added = tokenizer.get_added_vocabulary();
        let pieces = (0..ids as u32)
            .map(|id| match tokenizer.id_to_token(id) {
                None => Piece::Skip,
                Some(token) if added.is_special_token(&token) && !kept.contains(&id) => Piece::Skip,
                Some(token) => piece(pipeline, &token),
            })
            .collect();
        Some(DecodeTable { pipeline, pieces })
    }

    /// The text of `ids`, special tokens skipped (but the kept ones).
    pub(crate) fn decode(&self, ids: &[u32]) -> String {
        let mut bytes: Vec<u8> = Vec::with_capacity(ids.len() * 8);
        match self.pipeline {
            Pipeline::ByteLevel => {
                for &id in ids {
                    if let Some(Piece::Bytes(b)) = self.pieces.get(id as usize) {
                        bytes.extend_from_slice(b);
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Pipeline::SentencePiece { strip } => {
                let mut text = String::with_capacity(ids.len() * 8);
                for &id in ids {
                    match self.pieces.get(id as usize) {
                        None | Some(Piece::Skip) => {}
                        Some(Piece::Byte(b)) => bytes.push(*b),
                        Some(Piece::Bytes(b)) => {
                            flush_byte_run(&mut text, &mut bytes);
                            // Built from a `&str`, so always valid.
                            text.push_str(std::str::from_utf8(b).unwrap_or_default());
                        }
                    }
                }
                flush_byte_run(&mut text, &mut bytes);
                match strip {
                    Some((c, start)) => {
                        let cut: usize = text
                            .chars()
                            .take(start)
                            .take_while(|&x| x == c)
                            .map(char::len_utf8)
                            .sum();
                        text.split_off(cut)
                    }
                    None => text,
                }
            }
        }
    }
}

/// A run of fallback bytes becomes its text when it is valid UTF-8, and one
/// U+FFFD per byte when it is not (as `ByteFallback` does).
fn flush_byte_run(text: &mut String, run: &mut Vec<u8>) {
    if run.is_empty() {
        return;
    }
    match std::str::from_utf8(run) {
        Ok(s) => text.push_str(s),
        Err(_) => text.extend(std::iter::repeat_n('\u{FFFD}', run.len())),
    }
    run.clear();
}

/// The pipeline a `tokenizer.json` decoder describes, if it is one of ours.
fn recognize(decoder: &serde_json::Value) -> Option<Pipeline> {
    match decoder["type"].as_str()? {
        "ByteLevel" => Some(Pipeline::ByteLevel),
        "Sequence" => {
            let steps = decoder["decoders"].as_array()?;
            let types: Vec<&str> = steps
                .iter()
                .map(|s| s["type"].as_str().unwrap_or(""))
                .collect();
            let replace = &steps.first()?;
            let replaces_marker = replace["pattern"]["String"].as_str()
                == Some(&SP_SPACE.to_string())
                && replace["content"].as_str() == Some(" ");
            if !replaces_marker {
                return None;
            }
            match types.as_slice() {
                ["Replace", "ByteFallback", "Fuse"] => {
                    Some(Pipeline::SentencePiece { strip: None })
                }
                ["Replace", "ByteFallback", "Fuse", "Strip"] => {
                    let s = &steps[3];
                    let mut content = s["content"].as_str()?.chars();
                    let c = content.next()?;
                    let start = usize::try_from(s["start"].as_u64()?).ok()?;
                    let only_start = content.next().is_none() && s["stop"].as_u64()? == 0;
                    only_start.then_some(Pipeline::SentencePiece {
                        strip: Some((c, start)),
                    })
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// What `token` contributes under `pipeline`, computed the way each decoder
/// step treats a single token.
fn piece(pipeline: Pipeline, token: &str) -> Piece {
    match pipeline {
        Pipeline::ByteLevel => {
            // A token with any character outside the byte map stands for its
            // own UTF-8 (as the ByteLevel decoder treats it).
            let mapped: Option<Vec<u8>> = token.chars().map(char_byte).collect();
            Piece::Bytes(mapped.unwrap_or_else(|| token.as_bytes().to_vec()).into())
        }
        Pipeline::SentencePiece { .. } => {
            let text = token.replace(SP_SPACE, " ");
            // ByteFallback's test: six bytes, `<0x`, two radix-16 digits, `>`.
            let byte = (text.len() == 6 && text.starts_with("<0x") && text.ends_with('>'))
                .then(|| u8::from_str_radix(&text[3..5], 16).ok())
                .flatten();
            match byte {
                Some(b) => Piece::Byte(b),
                None => Piece::Bytes(text.into_bytes().into()),
            }
        }
    }
}

/// True for the bytes GPT-2's byte-level map spells as themselves.
fn printable(b: u8) -> bool {
    (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE
}

/// GPT-2's byte-to-character map: printable bytes are themselves, the others
/// take the characters from U+0100 on, in byte order.
pub fn byte_level_char(b: u8) -> char {
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('\u{FFFD}')
}

/// The byte a byte-level character stands for, if it is one.
fn char_byte(c: char) -> Option<u8> {
    let n = c as u32;
    if n < 256 && printable(n as u8) {
        return Some(n as u8);
    }
    let rank = n.checked_sub(256)? as usize;
    (0..=255u8).filter(|&b| !printable(b)).nth(rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_map_is_a_bijection_over_all_bytes() {
        for b in 0..=255u8 {
            assert_eq!(char_byte(byte_level_char(b)), Some(b), "byte {b}");
        }
        assert_eq!(byte_level_char(b' '), 'Ġ');
        assert_eq!(byte_level_char(b'\n'), 'Ċ');
        assert_eq!(char_byte('x'), Some(b'x'));
        assert_eq!(char_byte('中'), None);
    }

    #[test]
    fn a_byte_run_that_is_not_utf8_becomes_one_replacement_per_byte() {
        let mut text = String::new();
        flush_byte_run(&mut text, &mut vec![0xE4, 0xB8]);
        assert_eq!(text, "\u{FFFD}\u{FFFD}");
        flush_byte_run(&mut text, &mut vec![0xE4, 0xB8, 0xAD]);
        assert_eq!(text, "\u{FFFD}\u{FFFD}中");
    }

    #[test]
    fn unknown_pipelines_are_left_to_the_tokenizer() {
        let wordpiece = serde_json::json!({"type": "WordPiece", "prefix": "##", "cleanup": true});
        assert!(recognize(&wordpiece).is_none());
        let reordered = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "Fuse"}]});
        assert!(recognize(&reordered).is_none());
        let strips_the_end = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 1}]});
        assert!(recognize(&strips_the_end).is_none());
    }
}
