//! Fill in the middle: the prompt a code model is trained to complete the
//! text between a prefix and a suffix from (Completions' `suffix`).
//!
//! A model that was trained for it has three marker tokens (or two): the
//! prompt is the markers around the two texts, and the model writes the
//! middle after the last one. [`FimMarkers::detect`] knows the families'
//! spellings; a codec reports its model's with
//! [`crate::TextCodec::fim_markers`].

/// How one family writes a fill-in-the-middle prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FimMarkers {
    /// The token before the prefix.
    pub prefix: String,
    /// The token before the suffix.
    pub suffix: String,
    /// The token after which the middle comes, for a prefix-suffix-middle
    /// prompt; `None` for a suffix-first one (Codestral's
    /// `[SUFFIX]{suffix}[PREFIX]{prefix}`, the middle straight after the
    /// prefix).
    pub middle: Option<String>,
}

/// Known spellings, as (prefix, suffix, middle), most specific first.
const FAMILIES: &[(&str, &str, Option<&str>)] = &[
    // Qwen2.5-Coder, Qwen3-Coder.
    ("<|fim_prefix|>", "<|fim_suffix|>", Some("<|fim_middle|>")),
    // StarCoder, StarCoder2, SantaCoder, Granite Code, Refact.
    ("<fim_prefix>", "<fim_suffix>", Some("<fim_middle>")),
    // DeepSeek-Coder (begin, hole, end).
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", Some("<｜fim▁end｜>")),
    // CodeLlama (SentencePiece pieces with their space).
    ("▁<PRE>", "▁<SUF>", Some("▁<MID>")),
    // CodeGemma.
    ("<|fim_begin|>", "<|fim_hole|>", Some("<|fim_end|>")),
    // Codestral and other Mistral code models: suffix first.
    ("[PREFIX]", "[SUFFIX]", None),
];

impl FimMarkers {
    /// The markers of the first known family whose tokens `is_token` says
    /// the model has (each a token of its own); `None` when no family's
    /// are all there.
    pub fn detect(is_token: impl Fn(&str) -> bool) -> Option<FimMarkers> {
        FAMILIES
            .iter()
            .find(|(p, s, m)| is_token(p) && is_token(s) && m.is_none_or(&is_token))
            .map(|&(p, s, m)| FimMarkers {
                prefix: p.to_string(),
                suffix: s.to_string(),
                middle: m.map(str::to_string),
            })
    }

    /// The prompt whose continuation is the text between `prefix` and
    /// `suffix`.
    pub fn prompt(&self, prefix: &str, suffix: &str) -> String {
        match &self.middle {
            Some(middle) => format!("{}{prefix}{}{suffix}{middle}", self.prefix, self.suffix),
            None => format!("{}{suffix}{}{prefix}", self.suffix, self.prefix),
        }
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
        let cases: [(&[&str], &str); 6] = [
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
            (
                &["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"],
                "▁<PRE>def f(▁<SUF>)\n▁<MID>",
            ),
            (
                &["<|fim_begin|>", "<|fim_hole|>", "<|fim_end|>"],
                "<|fim_begin|>def f(<|fim_hole|>)\n<|fim_end|>",
            ),
            (
                &["[PREFIX]", "[SUFFIX]", "[INST]"],
                "[SUFFIX])\n[PREFIX]def f(",
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
        assert_eq!(detect(&["[PREFIX]"]), None);
    }
}
