//! Reasoning split from the answer (`--reasoning-parser`): models such as
//! Qwen3, DeepSeek-R1 and Magistral think aloud between two tags before
//! they answer. A [`ReasoningSplitter`] takes a choice's text as it streams
//! and parts it into the reasoning (Chat Completions' `reasoning_content`)
//! and the answer (`content`), tags dropped, so a client shows the answer
//! alone and may show the thinking apart.
//!
//! The rules, the same for every tag pair ([`ReasoningTags`]):
//!
//! - An answer is reasoning from its start when the prompt ends with the
//!   open tag (DeepSeek-R1's and Qwen3-Thinking's templates write it; see
//!   [`ReasoningTags::opened_by`]), or when the answer's own text begins
//!   with it (Qwen3 writes it itself).
//! - Reasoning ends at the first close tag; all after it is the answer,
//!   never parsed again (an answer may quote the tags).
//! - An answer that begins with anything else has no reasoning: a template
//!   that closed the tags already (Qwen3 with `enable_thinking: false`)
//!   leaves nothing to split.
//! - Whitespace around the reasoning, and at the answer's start after the
//!   close tag, is dropped (the models write `\n` and `\n\n` there).
//! - An answer that ends inside the reasoning (its length ran out) is all
//!   reasoning: its answer is empty.
//!
//! Text is released as soon as it cannot be part of a tag: only what may
//! still become one (a tag's start at the text's end) and the whitespace
//! before it is held, so the pieces out are the same whichever way the
//! text was cut into pieces in.
//!
//! Under a grammar that waits for the reasoning
//! ([`crate::reasoning_gate`]), the splitter follows the gate, which reads
//! the tags by token ([`ReasoningSplitter::gated`], fed through
//! [`ReasoningSplitter::push_token`]): the answer opens the reasoning only
//! when its first token is the open tag's, and the reasoning ends only at
//! the close tag's token (the tag's text from that token on; close-tag
//! text the model spelled in other tokens before it stays reasoning), so
//! the answer is the text the grammar holds (less leading whitespace, as
//! every answer) and the reasoning's tokens are those through the close
//! tag's. One case can still cut at the wrong tag: text held back upstream
//! (a stop string's or content filter's prefix) that releases close-tag
//! text the model spelled together with the close tag's own, since the
//! splitter finds the tag in text, not by the token's byte offset.

/// How many of a prompt's last tokens a dialect decodes to see whether the
/// template opened the reasoning ([`ReasoningTags::opened_by`]): a tag is
/// one token in the models that use it, a few bytes in any other.
pub const PROMPT_TAIL_TOKENS: usize = 32;

use crate::engine::TokenId;
use crate::reasoning_gate::TagTokens;

/// The markup that encloses a model's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningTags {
    /// Opens the reasoning (`<think>`).
    pub open: &'static str,
    /// Closes it (`</think>`).
    pub close: &'static str,
}

impl ReasoningTags {
    /// `<think>` and `</think>`: Qwen3, QwQ, DeepSeek-R1 and its distills
    /// (vLLM's `qwen3` and `deepseek_r1` parsers).
    pub const THINK: ReasoningTags = ReasoningTags {
        open: "<think>",
        close: "</think>",
    };

    /// `[THINK]` and `[/THINK]`: Mistral's Magistral (vLLM's `mistral`).
    pub const MISTRAL: ReasoningTags = ReasoningTags {
        open: "[THINK]",
        close: "[/THINK]",
    };

    /// Every parser's tags. A tokenizer that makes one of them a special
    /// token (Magistral's since 2507) still decodes it into text, so that
    /// the reasoning it encloses can be found.
    pub const ALL: [ReasoningTags; 2] = [ReasoningTags::THINK, ReasoningTags::MISTRAL];

    /// Whether `codec` keeps both tags in the text it decodes: a codec
    /// that drops them (special tokens it skips) leaves nothing to split.
    /// The error says which tag and why.
    pub fn check(&self, codec: &dyn crate::TextCodec) -> Result<(), String> {
        for tag in [self.open, self.close] {
            let ids = codec
                .encode(tag, false)
                .map_err(|e| format!("cannot tokenize the reasoning tag `{tag}`: {e}"))?;
            if codec.decode(&ids).trim() != tag {
                return Err(format!(
                    "this model's tokenizer drops `{tag}` from the text it decodes (it is a \
                     special token), so --reasoning-parser cannot find the reasoning it encloses"
                ));
            }
        }
        Ok(())
    }

    /// Whether a prompt whose text ends with `tail` leaves its answer
    /// inside the reasoning: the open tag, then nothing but whitespace.
    pub fn opened_by(&self, tail: &str) -> bool {
        tail.trim_end().ends_with(self.open)
    }
}

/// Where the splitter is in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Nothing decided: the text so far may still become the open tag.
    Start,
    /// Inside the reasoning.
    Reasoning,
    /// The answer (after the close tag, or an answer without reasoning).
    Answer,
}

/// What one [`ReasoningSplitter::push`] releases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// More of the reasoning.
    pub reasoning: String,
    /// More of the answer.
    pub answer: String,
}

impl Split {
    /// Appends `other`'s text to this one's.
    pub fn extend(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.answer.push_str(&other.answer);
    }
}

/// Parts one choice's text into reasoning and answer as it streams (the
/// rules are in the [module docs](self)).
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    tags: ReasoningTags,
    part: Part,
    /// Text not released yet.
    held: String,
    /// Nothing of the current part released yet (its leading whitespace,
    /// and in the reasoning a repeated open tag, are dropped).
    fresh: bool,
    /// The reasoning began (it may have ended since).
    reasoned: bool,
    /// The last push began, went on in or ended the reasoning.
    last_in_reasoning: bool,
    /// Under a gated grammar: the tags' tokens, which alone move it.
    gate: Option<TagTokens>,
    /// Gated: how far the close tag's token has come (its text ends the
    /// reasoning).
    close: CloseToken,
}

/// Where a gated splitter is with the close tag's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloseToken {
    /// Not sampled yet: no close-tag text ends the reasoning.
    Ahead,
    /// Sampled in this push: its text is the last close tag of the text
    /// so far (or, held back upstream, the first to come).
    Now,
    /// Sampled before: the first close tag still to come is its text.
    Behind,
}

impl ReasoningSplitter {
    /// A splitter for an answer to a prompt that left it inside the
    /// reasoning (`opened`, from [`ReasoningTags::opened_by`]) or not.
    pub fn new(tags: ReasoningTags, opened: bool) -> ReasoningSplitter {
        ReasoningSplitter {
            tags,
            part: if opened { Part::Reasoning } else { Part::Start },
            held: String::new(),
            fresh: true,
            reasoned: opened,
            last_in_reasoning: false,
            gate: None,
            close: CloseToken::Ahead,
        }
    }

    /// The splitter for an answer under a grammar that `tags`' tokens gate
    /// (see the module docs); with `None`, unchanged.
    pub fn gated(mut self, tags: Option<TagTokens>) -> ReasoningSplitter {
        self.gate = tags;
        self
    }

    /// Whether the last [`ReasoningSplitter::push`]'s text belonged to the
    /// reasoning: it began, went on in or ended it (so a token whose text
    /// it was counts as a reasoning token, the open tag's and close tag's
    /// too, whatever number of tokens they take).
    pub fn last_in_reasoning(&self) -> bool {
        self.last_in_reasoning
    }

    /// Whether the answer had reasoning (the open tag seen or given), ended
    /// or not.
    pub fn reasoned(&self) -> bool {
        self.reasoned
    }

    /// Whether the text so far ends inside the reasoning (the open tag
    /// seen or given, the close tag not yet).
    pub fn in_reasoning(&self) -> bool {
        self.part == Part::Reasoning
    }

    /// Takes the next piece of the answer's text; returns what may be
    /// released now.
    pub fn push(&mut self, piece: &str) -> Split {
        self.push_token(piece, None)
    }

    /// [`ReasoningSplitter::push`] for the piece that `token` (the token
    /// sampled, if the piece comes from one) released: a gated splitter
    /// moves on the tags' tokens; any other ignores `token`.
    pub fn push_token(&mut self, piece: &str, token: Option<TokenId>) -> Split {
        let (was_in, had_reasoned) = (self.in_reasoning(), self.reasoned);
        // Gated, the tokens through the close tag's are the reasoning's,
        // wherever their text lands.
        let close_ahead = self.close == CloseToken::Ahead;
        if let Some(tags) = self.gate {
            if self.part == Part::Start {
                if token.is_some() && token == tags.open {
                    // The open tag's text (now or held back upstream) is
                    // dropped as a repeated one is.
                    self.enter(Part::Reasoning);
                } else {
                    self.part = Part::Answer;
                    self.fresh = false;
                }
            } else if self.part == Part::Reasoning && token == Some(tags.close) {
                self.close = CloseToken::Now;
            }
        }
        let out = self.split_next(piece);
        if self.close == CloseToken::Now {
            self.close = CloseToken::Behind;
        }
        let began = self.reasoned && !had_reasoned;
        self.last_in_reasoning = match self.gate {
            Some(_) => (was_in && close_ahead) || began,
            None => was_in || began || self.in_reasoning(),
        };
        out
    }

    /// Where the close tag that ends the reasoning is in the held text.
    fn close_at(&self) -> Option<usize> {
        match (self.gate, self.close) {
            (None, _) | (Some(_), CloseToken::Behind) => self.held.find(self.tags.close),
            (Some(_), CloseToken::Now) => self.held.rfind(self.tags.close),
            (Some(_), CloseToken::Ahead) => None,
        }
    }

    fn split_next(&mut self, piece: &str) -> Split {
        self.held.push_str(piece);
        let mut out = Split::default();
        loop {
            match self.part {
                Part::Start => {
                    let text = self.held.trim_start();
                    if let Some(rest) = text.strip_prefix(self.tags.open) {
                        self.held = rest.to_string();
                        self.enter(Part::Reasoning);
                    } else if self.tags.open.starts_with(text) {
                        // Empty, or the open tag's beginning: wait.
                        return out;
                    } else {
                        self.part = Part::Answer;
                        self.fresh = false;
                    }
                }
                Part::Reasoning => {
                    if self.fresh {
                        let text = self.held.trim_start();
                        let text = text.strip_prefix(self.tags.open).unwrap_or(text);
                        if text.len() != self.held.len() {
                            self.held = text.to_string();
                            continue;
                        }
                        if text.is_empty() || self.tags.open.starts_with(text) {
                            return out;
                        }
                    }
                    if let Some(at) = self.close_at() {
                        out.reasoning.push_str(self.held[..at].trim_end());
                        self.held.drain(..at + self.tags.close.len());
                        self.enter(Part::Answer);
                        continue;
                    }
                    let cut = self.releasable();
                    if cut > 0 {
                        out.reasoning.push_str(&self.held[..cut]);
                        self.held.drain(..cut);
                        self.fresh = false;
                    }
                    return out;
                }
                Part::Answer => {
                    if self.fresh {
                        let text = self.held.trim_start();
                        if text.is_empty() {
                            self.held.clear();
                            return out;
                        }
                        self.held = text.to_string();
                        self.fresh = false;
                    }
                    out.answer.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// The answer ended: releases what was held (a tag's beginning that
    /// never completed is text; trailing whitespace of the reasoning is
    /// dropped).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        let mut out = Split::default();
        match self.part {
            Part::Start => out.answer = held,
            Part::Reasoning => {
                let text = if self.fresh { held.trim_start() } else { &held };
                out.reasoning = text.trim_end().to_string();
            }
            Part::Answer => out.answer = held,
        }
        out
    }

    fn enter(&mut self, part: Part) {
        self.part = part;
        self.fresh = true;
        self.reasoned |= part == Part::Reasoning;
    }

    /// How much of the held reasoning can go: all but a close tag's
    /// beginning at its end and the whitespace before that.
    fn releasable(&self) -> usize {
        let close = self.tags.close;
        let partial = (1..close.len())
            .rev()
            .filter(|&k| close.is_char_boundary(k))
            .find(|&k| self.held.ends_with(&close[..k]))
            .unwrap_or(0);
        let before = &self.held[..self.held.len() - partial];
        before.trim_end().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn whole(tags: ReasoningTags, opened: bool, text: &str) -> Split {
        let mut s = ReasoningSplitter::new(tags, opened);
        let mut out = s.push(text);
        out.extend(s.finish());
        out
    }

    fn split(reasoning: &str, answer: &str) -> Split {
        Split {
            reasoning: reasoning.into(),
            answer: answer.into(),
        }
    }

    #[test]
    fn qwen3_writes_its_tags_and_the_splitter_drops_them_with_their_whitespace() {
        let text = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!";
        assert_eq!(
            whole(ReasoningTags::THINK, false, text),
            split("The user greets me.\nI greet back.", "Hello!")
        );
    }

    #[test]
    fn a_prompt_that_opened_the_tag_starts_the_answer_inside_the_reasoning() {
        let text = "Two and two.\n</think>\n\nFour.";
        assert_eq!(
            whole(ReasoningTags::THINK, true, text),
            split("Two and two.", "Four.")
        );
        // Not opened, the same text is all answer: no open tag began it.
        assert_eq!(whole(ReasoningTags::THINK, false, text), split("", text));
        // Opened, and the model writes the tag again: it is not reasoning text.
        assert_eq!(
            whole(ReasoningTags::THINK, true, "\n<think>\nhm</think>ok"),
            split("hm", "ok")
        );
    }

    #[test]
    fn an_answer_without_the_open_tag_has_no_reasoning_and_is_never_parsed() {
        let text = "Use <think> and </think> to think.";
        assert_eq!(whole(ReasoningTags::THINK, false, text), split("", text));
        // What the Qwen3 template's `enable_thinking: false` leaves: the
        // answer alone, its leading whitespace kept as written.
        assert_eq!(whole(ReasoningTags::THINK, false, " Hi"), split("", " Hi"));
    }

    #[test]
    fn only_the_first_close_tag_ends_the_reasoning() {
        assert_eq!(
            whole(ReasoningTags::THINK, false, "<think>a</think>b</think>c"),
            split("a", "b</think>c")
        );
    }

    #[test]
    fn an_answer_cut_inside_the_reasoning_is_all_reasoning() {
        assert_eq!(
            whole(ReasoningTags::THINK, false, "<think>\nstill thinking </thi"),
            split("still thinking </thi", "")
        );
        let mut s = ReasoningSplitter::new(ReasoningTags::THINK, false);
        assert_eq!(s.push("<thi"), split("", ""));
        assert!(!s.in_reasoning());
        assert!(!s.reasoned() && !s.last_in_reasoning());
        assert_eq!(s.push("nk>"), split("", ""));
        assert!(s.in_reasoning() && s.reasoned() && s.last_in_reasoning());
        // A tag's beginning that never completes is the answer's text.
        let mut s = ReasoningSplitter::new(ReasoningTags::THINK, false);
        assert_eq!(s.push("<thi"), split("", ""));
        assert_eq!(s.finish(), split("", "<thi"));
    }

    #[test]
    fn reasoning_streams_as_it_comes_holding_only_a_possible_tag() {
        let mut s = ReasoningSplitter::new(ReasoningTags::THINK, false);
        assert_eq!(s.push("<think>\n"), split("", ""));
        assert_eq!(s.push("one"), split("one", ""));
        assert_eq!(s.push(" two \n</"), split(" two", ""));
        assert_eq!(s.push("think>\n"), split("", ""));
        assert!(!s.in_reasoning() && s.reasoned() && s.last_in_reasoning());
        assert_eq!(s.push("\nAnswer"), split("", "Answer"));
        assert!(!s.last_in_reasoning());
        assert_eq!(s.push(" more"), split("", " more"));
        assert_eq!(s.finish(), split("", ""));
    }

    #[test]
    fn magistral_tags() {
        assert_eq!(
            whole(ReasoningTags::MISTRAL, false, "[THINK]x[/THINK]y"),
            split("x", "y")
        );
        assert!(ReasoningTags::MISTRAL.opened_by("[INST]q[/INST][THINK]\n"));
    }

    #[test]
    fn tags_a_tokenizer_drops_from_its_text_are_refused() {
        use crate::testing::ByteCodec;
        assert_eq!(ReasoningTags::THINK.check(&ByteCodec), Ok(()));
        /// Decodes nothing: as a tokenizer decodes its special tokens.
        struct Drops;
        impl crate::TextCodec for Drops {
            fn encode(&self, _: &str, _: bool) -> Result<Vec<u32>, String> {
                Ok(vec![7])
            }
            fn decode(&self, _: &[u32]) -> String {
                String::new()
            }
        }
        let e = ReasoningTags::MISTRAL.check(&Drops).expect_err("dropped");
        assert!(e.contains("[THINK]") && e.contains("special token"), "{e}");
    }

    #[test]
    fn opened_by_needs_the_open_tag_last() {
        let t = ReasoningTags::THINK;
        assert!(t.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!t.opened_by("assistant\n<think>\n\n</think>\n\n"));
        assert!(!t.opened_by("user: what is <think>?\nassistant\n"));
        assert!(!t.opened_by(""));
    }

    /// The tags' tokens of a gated splitter's tests.
    const GATE: TagTokens = TagTokens {
        open: Some(1000),
        close: 1001,
    };

    /// Pieces `(text, token)` through a splitter gated by [`GATE`].
    fn gated(opened: bool, pieces: &[(&str, Option<TokenId>)]) -> Split {
        let mut s = ReasoningSplitter::new(ReasoningTags::THINK, opened).gated(Some(GATE));
        let mut out = Split::default();
        for (text, token) in pieces {
            out.extend(s.push_token(text, *token));
        }
        out.extend(s.finish());
        out
    }

    #[test]
    fn gated_the_reasoning_ends_at_the_close_tags_token_only() {
        // The model spells the close tag in ordinary tokens first: the gate
        // saw no close token, so that is still reasoning.
        let out = gated(
            true,
            &[
                ("plan </th", Some(7)),
                ("ink> more", Some(8)),
                ("\n</think>", Some(1001)),
                ("\n\n{}", Some(9)),
            ],
        );
        assert_eq!(out, split("plan </think> more", "{}"));
        // Without the gate the first spelled tag ends it.
        let mut s = ReasoningSplitter::new(ReasoningTags::THINK, true);
        let mut plain = s.push("plan </th");
        plain.extend(s.push("ink> more\n</think>\n\n{}"));
        plain.extend(s.finish());
        assert_eq!(plain, split("plan", "more\n</think>\n\n{}"));
    }

    #[test]
    fn gated_a_close_tag_held_back_upstream_ends_the_reasoning_when_it_comes() {
        // A stop string's prefix held the tag's text back: the close token's
        // piece is empty and its text comes with the next token's.
        let out = gated(
            true,
            &[
                ("plan", Some(7)),
                ("", Some(1001)),
                ("</think>{\"a\":\"</think>\"}", Some(9)),
            ],
        );
        assert_eq!(out, split("plan", "{\"a\":\"</think>\"}"));
        // The tokens through the close tag's are the reasoning's, though
        // the tag's text came with the next token.
        let mut s = ReasoningSplitter::new(ReasoningTags::THINK, true).gated(Some(GATE));
        let counted: Vec<bool> = [("plan", Some(7)), ("", Some(1001)), ("</think>{}", Some(9))]
            .iter()
            .map(|(text, token)| {
                s.push_token(text, *token);
                s.last_in_reasoning()
            })
            .collect();
        assert_eq!(counted, [true, true, false]);
        // Released with earlier text, the token's tag is the last one.
        let out = gated(
            true,
            &[
                ("x </think> y", Some(7)),
                ("</think>", Some(1001)),
                ("{}", Some(9)),
            ],
        );
        assert_eq!(out, split("x </think> y", "{}"));
    }

    #[test]
    fn gated_the_answer_opens_the_reasoning_only_by_its_first_token() {
        let out = gated(
            false,
            &[
                ("<think>", Some(1000)),
                ("hm", Some(7)),
                ("</think>", Some(1001)),
                ("1", Some(9)),
            ],
        );
        assert_eq!(out, split("hm", "1"));
        // Open-tag text from other tokens is the grammar's answer.
        let out = gated(false, &[("<thi", Some(7)), ("nk>1", Some(8))]);
        assert_eq!(out, split("", "<think>1"));
        // Not gated, the same text opens the reasoning.
        assert_eq!(
            whole(ReasoningTags::THINK, false, "<think>1"),
            split("1", "")
        );
    }

    proptest! {
        /// The pieces out do not depend on how the text was cut into pieces
        /// in (at character boundaries), for either tag pair.
        #[test]
        fn any_cut_of_the_text_splits_the_same(
            text in "[<>/a-z \n\u{a0}é]{0,12}(<think>)?[<>/a-z \n]{0,12}(</think>)?[<>/a-z \u{3000}]{0,12}",
            mistral in any::<bool>(),
            opened in any::<bool>(),
            cuts in proptest::collection::vec(0usize..40, 0..8),
        ) {
            let tags = if mistral { ReasoningTags::MISTRAL } else { ReasoningTags::THINK };
            let text = if mistral {
                text.replace("</think>", "[/THINK]").replace("<think>", "[THINK]")
            } else {
                text
            };
            let expected = whole(tags, opened, &text);
            let mut cuts: Vec<usize> = cuts
                .into_iter()
                .filter(|&c| c <= text.len() && text.is_char_boundary(c))
                .collect();
            cuts.sort_unstable();
            let mut s = ReasoningSplitter::new(tags, opened);
            let mut got = Split::default();
            let mut at = 0;
            for c in cuts.into_iter().chain([text.len()]) {
                got.extend(s.push(&text[at..c]));
                at = c;
            }
            got.extend(s.finish());
            prop_assert_eq!(got, expected);
        }
    }
}
