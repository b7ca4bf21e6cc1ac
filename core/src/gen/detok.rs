//! Incremental detokenisation: turns a stream of token ids into text pieces that
//! never split a UTF-8 character and that concatenate to exactly the text the
//! model produced after the prompt.
//!
//! Decoding one token at a time is wrong for most tokenizers (leading-space
//! markers, byte-fallback tokens that are parts of one character). So each step
//! decodes a short window of ids twice, with and without the newest ones, and
//! releases the difference once it no longer ends in an incomplete character.

use crate::engine::TokenId;
use crate::text::TextCodec;

/// How many prompt tokens the first window reaches back, so that the first
/// generated token decodes with the spacing it has after the prompt.
const PROMPT_CONTEXT: usize = 6;

/// Streaming decoder state for one generation.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    ids: Vec<TokenId>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder for text that follows `prompt`.
    pub fn new(prompt: &[TokenId]) -> Self {
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        IncrementalDecoder {
            ids: tail.to_vec(),
            prefix_offset: 0,
            read_offset: tail.len(),
        }
    }

    /// Adds one generated token; returns the text it completes (may be empty).
    pub fn push(&mut self, codec: &dyn TextCodec, id: TokenId) -> String {
        self.ids.push(id);
        self.release(codec, false)
    }

    /// Releases whatever is still held (an incomplete character at the very end
    /// decodes as U+FFFD, exactly as a full decode would).
    pub fn finish(&mut self, codec: &dyn TextCodec) -> String {
        self.release(codec, true)
    }

    fn release(&mut self, codec: &dyn TextCodec, force: bool) -> String {
        if self.read_offset >= self.ids.len() {
            return String::new();
        }
        let prefix = codec.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = codec.decode(&self.ids[self.prefix_offset..]);
        let complete = !full.ends_with('\u{FFFD}');
        if (complete || force) && full.len() >= prefix.len() && full.starts_with(&prefix) {
            let piece = full[prefix.len()..].to_string();
            if piece.is_empty() && !force {
                // Tokens that decode to nothing yet (e.g. a lone byte of a
                // character split oddly) stay in the window.
                return piece;
            }
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            // Keep the window short: old ids no longer matter for spacing.
            if self.prefix_offset > 64 {
                self.ids.drain(..self.prefix_offset);
                self.read_offset -= self.prefix_offset;
                self.prefix_offset = 0;
            }
            return piece;
        }
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ByteCodec;

    #[test]
    fn multibyte_characters_are_never_split_and_pieces_concatenate() {
        let codec = ByteCodec;
        let prompt = codec.encode("say: ", true).expect("encode");
        let text = "héllo 🦙 日本";
        let ids = codec.encode(text, false).expect("encode");
        let mut d = IncrementalDecoder::new(&prompt);
        let mut out = String::new();
        for id in &ids {
            let piece = d.push(&codec, *id);
            assert!(!piece.contains('\u{FFFD}'), "split character in {piece:?}");
            out.push_str(&piece);
        }
        out.push_str(&d.finish(&codec));
        assert_eq!(out, text);
    }

    #[test]
    fn each_character_is_released_by_the_token_that_completes_it() {
        let codec = ByteCodec;
        let mut d = IncrementalDecoder::new(&codec.encode("say: ", true).expect("encode"));
        for c in ['h', 'i', ' '] {
            assert_eq!(d.push(&codec, c as u32 + 3), c.to_string());
        }
        let bytes = "é".as_bytes();
        assert_eq!(d.push(&codec, bytes[0] as u32 + 3), "", "half a character");
        assert_eq!(d.push(&codec, bytes[1] as u32 + 3), "é");
        assert_eq!(d.finish(&codec), "", "nothing was held");
    }

    /// SentencePiece-style decoding: the byte codec, less one leading space
    /// of the whole text (as Llama's `Strip` decoder does).
    struct StripCodec;

    impl TextCodec for StripCodec {
        fn encode(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, String> {
            ByteCodec.encode(text, add_special)
        }
        fn decode(&self, ids: &[TokenId]) -> String {
            let text = ByteCodec.decode(ids);
            text.strip_prefix(' ').map(str::to_string).unwrap_or(text)
        }
    }

    #[test]
    fn a_token_that_decodes_to_nothing_keeps_the_context_that_follows_it() {
        let codec = StripCodec;
        let mut d = IncrementalDecoder::new(&codec.encode("hi", true).expect("encode"));
        // A special token adds nothing; the window must keep "hi" before it,
        // or the space after it becomes a leading space and is stripped.
        assert_eq!(d.push(&codec, crate::testing::BYTE_BOS), "");
        assert_eq!(d.push(&codec, b' ' as u32 + 3), " ");
        assert_eq!(d.push(&codec, b'x' as u32 + 3), "x");
    }

    #[test]
    fn an_unfinished_character_at_the_end_is_flushed_as_a_full_decode_would() {
        let codec = ByteCodec;
        let mut d = IncrementalDecoder::new(&[]);
        let bytes = "🦙".as_bytes();
        assert_eq!(d.push(&codec, bytes[0] as u32 + 3), "");
        assert_eq!(d.push(&codec, bytes[1] as u32 + 3), "");
        let tail = d.finish(&codec);
        assert_eq!(
            tail,
            codec.decode(&[bytes[0] as u32 + 3, bytes[1] as u32 + 3])
        );
    }
}
