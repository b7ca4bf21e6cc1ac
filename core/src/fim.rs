//! Fill in the middle: the prompt a code model is trained to complete the
//! text between a prefix and a suffix from (Completions' `suffix`).
//!
//! A model that was trained for it has three marker tokens: the prompt is
//! the markers around the two texts, and the model writes the middle after
//! the last one. [`FimMarkers::detect`] knows the families' spellings; a
//! codec reports its model's with [`crate::TextCodec::fim_markers`].

/// How one family writes a fill-in-the-middle prompt:
/// `{prefix marker}{prefix}{suffix marker}{suffix}{middle marker}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FimMarkers {
    /// The token before the prefix.
    pub prefix: String,
    /// The token before the suffix.
    pub suffix: String,
    /// The token after which the middle comes.
    pub middle: String,
}

/// Known spellings, as (prefix, suffix, middle). Only families whose
/// reference prompt is this text tokenized whole, as byte-level BPE
/// vocabularies tokenize it. CodeLlama's and Codestral's SentencePiece
/// references encode the suffix without the leading `▁` every
/// SentencePiece piece gets, which a text prompt cannot say, so they are
/// not listed: their markers would give a prompt a token off the one they
/// were trained on.
const FAMILIES: [(&str, &str, &str); 3] = [
    // Qwen2.5-Coder (and every model with Qwen2.5's vocabulary).
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    // StarCoder's markers, as Granite Code has them.
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    // DeepSeek-Coder (begin, hole, end).
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
];

impl FimMarkers {
    /// The markers of the first known family whose tokens `is_token` says
    /// the model has (each a token of its own); `None` when no family's
    /// are all there.
    pub fn detect(is_token: impl Fn(&str) -> bool) -> Option<FimMarkers> {
        FAMILIES
            .iter()
            .find(|(p, s, m)| is_token(p) && is_token(s) && is_token(m))
            .map(|&(p, s, m)| FimMarkers {
                prefix: p.to_string(),
                suffix: s.to_string(),
                middle: m.to_string(),
            })
    }

    /// The prompt whose continuation is the text between `prefix` and
    /// `suffix`.
    pub fn prompt(&self, prefix: &str, suffix: &str) -> String {
        format!(
            "{}{prefix}{}{suffix}{}",
            self.prefix, self.suffix, self.middle
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect(tokens: &[&str]) -> Option<FimMarkers> {
        FimMarkers::detect(|t| tokens.contains(&t))
    }

    #[test]
    fn each_family_is_known_by_its_tokens_and_writes_its_prompt() {
        let cases: [(&[&str], &str); 3] = [
            (
                &[
                    "<|fim_prefix|>",
                    "<|fim_suffix|>",
                    "<|fim_middle|>",
                    "<|fim_pad|>",
                ],
                "<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|>",
            ),
            (
                &["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
                "<fim_prefix>def f(<fim_suffix>)\n<fim_middle>",
            ),
            (
                &["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"],
                "<｜fim▁begin｜>def f(<｜fim▁hole｜>)\n<｜fim▁end｜>",
            ),
        ];
        for (tokens, prompt) in cases {
            let m = detect(tokens).unwrap_or_else(|| panic!("{tokens:?}"));
            assert_eq!(m.prompt("def f(", ")\n"), prompt);
        }
    }

    #[test]
    fn a_model_without_every_marker_has_none() {
        assert_eq!(detect(&[]), None);
        assert_eq!(detect(&["<|fim_prefix|>", "<|fim_suffix|>"]), None);
        assert_eq!(detect(&["<fim_prefix>", "<fim_middle>"]), None);
        // SentencePiece families are not taken (see `FAMILIES`).
        assert_eq!(detect(&["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]), None);
        assert_eq!(detect(&["[PREFIX]", "[SUFFIX]"]), None);
    }
}
