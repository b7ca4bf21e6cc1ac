//! A grammar that starts where the model's reasoning ends, and a budget
//! for the reasoning: structured output (`response_format`, forced tool
//! calls) from a reasoning model that thinks first, as vLLM applies it, and
//! thinking cut at a client's budget (vLLM's `thinking_token_budget`,
//! Anthropic's `budget_tokens`).
//!
//! [`ReasoningGate`] wraps an optional compiled [`Constraint`] and an
//! optional budget. While the answer is inside the reasoning every token
//! may come (the model thinks freely) until the budget is spent; then the
//! close tag alone may come, so the model answers. From the token after
//! the close tag on, the grammar's mask holds and the grammar is fed (any
//! token may come without one). Where the reasoning starts follows
//! [`crate::reasoning`]'s rules, by token instead of by text:
//!
//! 1. The prompt ends with the open tag (the template opened the
//!    reasoning): the answer starts inside it.
//! 2. Otherwise the first token may be the open tag besides what the
//!    grammar allows; if the model takes it, the reasoning starts there,
//!    and any other first token is the grammar's first.
//! 3. The first close tag ends the reasoning; after it the gate is the
//!    grammar alone, whatever the text holds.
//! 4. The budget counts the tokens inside the reasoning, neither tag
//!    included: after that many, the close tag is the only token allowed.
//!
//! The gate reads the tags by token id, so it needs each tag to be one
//! token of the model's vocabulary ([`TagTokens::of`]), as `<think>` and
//! `</think>` are for Qwen3, QwQ and DeepSeek-R1 and its distills. Where
//! the close tag is not one token there is no gate: the grammar starts at
//! the first token and its text is all answer, and no budget is enforced.
//! Where only the open tag is not one token, rule 2 cannot offer it, so
//! only a template that opens the reasoning (rule 1) leaves room to think.
//!
//! The gate's state depends only on the tokens fed ([`crate::constraint`]'s
//! rule 1): a recomputed or forked sequence gets the same masks.

use crate::constraint::{Constraint, TokenConstraint, TokenMask};
use crate::engine::TokenId;
use crate::reasoning::{ReasoningSplitter, ReasoningTags};
use crate::text::TextCodec;

/// A reasoning parser's tags as token ids of the served model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagTokens {
    /// The open tag's token, when it is one token.
    pub open: Option<TokenId>,
    /// The close tag's token.
    pub close: TokenId,
}

impl TagTokens {
    /// The ids of `tags` in `codec`'s vocabulary: `None` when the close tag
    /// is not exactly one token (no gate can be built; see the module
    /// docs).
    pub fn of(tags: ReasoningTags, codec: &dyn TextCodec) -> Option<TagTokens> {
        let single = |tag: &str| match codec.encode(tag, false).ok()?.as_slice() {
            [id] if codec.decode(&[*id]) == tag => Some(*id),
            _ => None,
        };
        Some(TagTokens {
            open: single(tags.open),
            close: single(tags.close)?,
        })
    }
}

/// How a dialect reads an answer with a reasoning parser: split by `tags`
/// and, under a grammar or a budget, with the reasoning gated by `gate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningPlan {
    /// The parser's tags, which split the text.
    pub tags: ReasoningTags,
    /// The tags' tokens, for a grammar to wait on or a budget to force
    /// (`None` without either, or where the close tag is not one token).
    pub gate: Option<TagTokens>,
    /// Most tokens the reasoning may take ([`ReasoningGate`]'s rule 4),
    /// where the request set one.
    pub budget: Option<u32>,
    /// Under a grammar (the gate then holds from the first token).
    pub constrained: bool,
}

impl ReasoningPlan {
    /// The plan for an answer read with `tags`, under a grammar or not
    /// (`constrained`), with a reasoning `budget` or not, for a model of
    /// `vocab_size` logits (a tag token past them cannot be sampled, so it
    /// counts as no token). `None` where a grammar cannot be gated (the
    /// close tag is not one token): the grammar's text is then all answer.
    /// A budget without a gate is not enforced (the plan still splits the
    /// text).
    pub fn new(
        tags: ReasoningTags,
        codec: &dyn TextCodec,
        constrained: bool,
        budget: Option<u32>,
        vocab_size: u32,
    ) -> Option<Self> {
        let tokens = match constrained || budget.is_some() {
            true => TagTokens::of(tags, codec)
                .filter(|t| t.close < vocab_size)
                .map(|t| TagTokens {
                    open: t.open.filter(|&o| o < vocab_size),
                    ..t
                }),
            false => None,
        };
        if constrained && tokens.is_none() {
            return None;
        }
        Some(ReasoningPlan {
            tags,
            gate: tokens,
            budget: budget.filter(|_| tokens.is_some()),
            constrained,
        })
    }

    /// The gate one answer follows (`opened`: the prompt opened the
    /// reasoning). A grammar always waits behind it; a budget alone only
    /// where the gate can see the reasoning start (the prompt opened it, or
    /// the open tag is one token): elsewhere it could never count, and the
    /// text is split as without one.
    fn gate_for(&self, opened: bool) -> Option<TagTokens> {
        self.gate
            .filter(|g| self.constrained || opened || g.open.is_some())
    }

    /// The splitter for one answer (`opened`: the prompt opened the
    /// reasoning), following the gate where there is one.
    pub fn splitter(&self, opened: bool) -> ReasoningSplitter {
        ReasoningSplitter::new(self.tags, opened).gated(self.gate_for(opened))
    }

    /// The answer's constraint: `grammar` and the budget behind a
    /// [`ReasoningGate`] where the plan has one (`opened`: the prompt
    /// opened the reasoning); `grammar` as it is where there is neither.
    pub fn constrain(&self, grammar: Option<Constraint>, opened: bool) -> Option<Constraint> {
        match self.gate_for(opened) {
            Some(tags) if grammar.is_some() || self.budget.is_some() => Some(Constraint::new(
                Box::new(ReasoningGate::new(grammar, tags, opened).with_budget(self.budget)),
            )),
            _ => grammar,
        }
    }
}

/// Where the gated answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Before the first token: the open tag or the grammar's first token.
    Start,
    /// Inside the reasoning: anything goes, until the close tag.
    Reasoning,
    /// After the reasoning (or in an answer without one): the grammar.
    Grammar,
}

/// A grammar held back until the reasoning ends, and the reasoning's
/// budget (the module docs give the rules).
#[derive(Debug, Clone)]
pub struct ReasoningGate {
    /// The answer's grammar; `None`: any answer.
    grammar: Option<Constraint>,
    tags: TagTokens,
    part: Part,
    /// Most tokens the reasoning may take (rule 4); `None`: no limit.
    budget: Option<u32>,
    /// Tokens taken inside the reasoning so far, neither tag counted.
    thought: u32,
}

impl ReasoningGate {
    /// `grammar` (or any answer, without one) gated by `tags`; `opened`:
    /// the prompt ends with the open tag, so the answer starts inside the
    /// reasoning (rule 1). No budget until [`ReasoningGate::with_budget`].
    pub fn new(grammar: Option<Constraint>, tags: TagTokens, opened: bool) -> ReasoningGate {
        ReasoningGate {
            grammar,
            tags,
            part: if opened { Part::Reasoning } else { Part::Start },
            budget: None,
            thought: 0,
        }
    }

    /// The same gate with the reasoning limited to `budget` tokens (rule 4).
    pub fn with_budget(self, budget: Option<u32>) -> ReasoningGate {
        ReasoningGate { budget, ..self }
    }

    /// True once the reasoning has taken its whole budget: only the close
    /// tag may come.
    fn spent(&self) -> bool {
        self.budget.is_some_and(|b| self.thought >= b)
    }
}

/// Allows every id of `mask`'s vocabulary.
fn allow_all(mask: &mut TokenMask) {
    mask.words_mut().fill(u32::MAX);
    mask.trim();
}

impl TokenConstraint for ReasoningGate {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
        let spent = self.spent();
        match (self.part, self.grammar.as_mut()) {
            (Part::Reasoning, _) if spent => {
                mask.clear();
                mask.allow(self.tags.close);
            }
            (Part::Reasoning, _) | (Part::Start | Part::Grammar, None) => allow_all(mask),
            (Part::Start, Some(grammar)) => {
                grammar.get_mut().fill_mask(mask)?;
                if let Some(open) = self.tags.open {
                    mask.allow(open);
                }
            }
            (Part::Grammar, Some(grammar)) => grammar.get_mut().fill_mask(mask)?,
        }
        Ok(())
    }

    fn advance(&mut self, token: TokenId) -> Result<(), String> {
        match self.part {
            Part::Reasoning if token == self.tags.close => {
                self.part = Part::Grammar;
                Ok(())
            }
            Part::Reasoning if self.spent() => Err(format!(
                "token {token} past the reasoning budget, where only the close tag may come"
            )),
            Part::Reasoning => {
                self.thought = self.thought.saturating_add(1);
                Ok(())
            }
            Part::Start if Some(token) == self.tags.open => {
                self.part = Part::Reasoning;
                Ok(())
            }
            Part::Start | Part::Grammar => {
                self.part = Part::Grammar;
                match self.grammar.as_mut() {
                    Some(grammar) => grammar.get_mut().advance(token),
                    None => Ok(()),
                }
            }
        }
    }

    fn unconstrained(&self) -> bool {
        match self.part {
            Part::Reasoning => !self.spent(),
            Part::Start | Part::Grammar => self.grammar.is_none(),
        }
    }

    fn free_tokens(&self) -> u32 {
        let left = |thought: u32| self.budget.map_or(u32::MAX, |b| b.saturating_sub(thought));
        match (self.part, &self.grammar) {
            // Any next token may be the close tag, after which the grammar
            // holds: only the next one is free.
            (_, Some(_)) => u32::from(self.unconstrained()),
            (Part::Grammar, None) => u32::MAX,
            (Part::Reasoning, None) => left(self.thought),
            // The open tag first, then the whole budget.
            (Part::Start, None) => left(0).saturating_add(1),
        }
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ByteCodec, DigitsCodec, BYTE_EOS, BYTE_OFFSET};

    const OPEN: TokenId = 1000;
    const CLOSE: TokenId = 1001;
    const VOCAB: u32 = 1100;
    const TAGS: TagTokens = TagTokens {
        open: Some(OPEN),
        close: CLOSE,
    };

    fn digit(d: u8) -> TokenId {
        (b'0' + d) as TokenId + BYTE_OFFSET
    }

    /// Two digits, then the end, behind the gate.
    fn gate(opened: bool, tags: TagTokens) -> ReasoningGate {
        let digits = DigitsCodec::thinking(2);
        let grammar = crate::TextCodec::constrain(&digits, &crate::constraint::Grammar::JsonObject)
            .expect("compiles");
        ReasoningGate::new(Some(Constraint::new(grammar)), tags, opened)
    }

    fn mask(g: &mut ReasoningGate) -> TokenMask {
        let mut m = TokenMask::none(VOCAB);
        g.fill_mask(&mut m).expect("mask");
        m
    }

    #[test]
    fn an_opened_answer_thinks_freely_until_the_close_tag() {
        let mut g = gate(true, TAGS);
        assert!(g.unconstrained(), "no mask need be sent");
        assert_eq!(mask(&mut g).count(), VOCAB, "everything, the tags too");
        for t in [b'h' as TokenId + BYTE_OFFSET, OPEN, digit(1)] {
            g.advance(t).expect("free text");
        }
        assert_eq!(mask(&mut g).count(), VOCAB);
        g.advance(CLOSE).expect("the close tag");
        assert!(!g.unconstrained());
        let m = mask(&mut g);
        assert_eq!(m.count(), 10, "the grammar's digits alone");
        assert!(m.allows(digit(0)) && !m.allows(CLOSE) && !m.allows(OPEN));
        g.advance(digit(4)).expect("a digit");
        g.advance(digit(2)).expect("a digit");
        let m = mask(&mut g);
        assert!(m.allows(BYTE_EOS) && m.count() == 1, "then the end");
        assert!(
            g.advance(CLOSE).is_err(),
            "a second close tag is the grammar's to refuse"
        );
    }

    #[test]
    fn the_first_token_is_the_open_tag_or_the_grammars_first() {
        let mut g = gate(false, TAGS);
        let m = mask(&mut g);
        assert_eq!(m.count(), 11);
        assert!(m.allows(OPEN) && m.allows(digit(7)) && !m.allows(CLOSE));
        let mut thinks = g.clone();
        thinks.advance(OPEN).expect("opens");
        assert_eq!(mask(&mut thinks).count(), VOCAB);

        g.advance(digit(7)).expect("the grammar's first token");
        let m = mask(&mut g);
        assert!(
            !m.allows(OPEN),
            "past the first token the open tag is text the grammar refuses"
        );
        assert!(g.advance(OPEN).is_err());
    }

    #[test]
    fn an_open_tag_of_several_tokens_leaves_the_grammar_from_the_start() {
        let tags = TagTokens {
            open: None,
            close: CLOSE,
        };
        let mut g = gate(false, tags);
        assert_eq!(mask(&mut g).count(), 10);
        assert!(g.advance(OPEN).is_err(), "not a digit");
        // A template that opens the reasoning still leaves room to think.
        let mut g = gate(true, tags);
        assert_eq!(mask(&mut g).count(), VOCAB);
    }

    #[test]
    fn a_fork_keeps_its_place() {
        let mut g = gate(true, TAGS);
        g.advance(CLOSE).expect("closes");
        let mut fork = g.boxed_clone();
        let mut m = TokenMask::none(VOCAB);
        fork.fill_mask(&mut m).expect("mask");
        assert_eq!(m.count(), 10, "the fork is in the grammar too");
    }

    #[test]
    fn a_plan_gates_a_grammar_only_where_the_close_tag_is_one_token() {
        let tags = ReasoningTags::THINK;
        let plan = ReasoningPlan::new(tags, &ByteCodec, false, None, VOCAB)
            .expect("splits without a grammar");
        assert_eq!(plan.gate, None);
        assert_eq!(
            ReasoningPlan::new(tags, &ByteCodec, true, None, VOCAB),
            None,
            "no gate, no split"
        );
        let codec = DigitsCodec::thinking(2);
        let plan = ReasoningPlan::new(tags, &codec, true, None, VOCAB).expect("gated");
        let grammar = crate::TextCodec::constrain(&codec, &crate::constraint::Grammar::JsonObject)
            .expect("compiles");
        let mut gated = plan
            .constrain(Some(Constraint::new(grammar)), true)
            .expect("a grammar");
        let mut m = TokenMask::none(VOCAB);
        gated.get_mut().fill_mask(&mut m).expect("mask");
        assert_eq!(m.count(), VOCAB, "opened: thinking first");
        assert!(plan.constrain(None, true).is_none());
    }

    /// A gate without a grammar, limited to `budget` tokens of reasoning.
    fn budgeted(opened: bool, budget: u32) -> ReasoningGate {
        ReasoningGate::new(None, TAGS, opened).with_budget(Some(budget))
    }

    fn only_close(g: &mut ReasoningGate) -> bool {
        let m = mask(g);
        m.count() == 1 && m.allows(CLOSE)
    }

    #[test]
    fn a_spent_budget_leaves_the_close_tag_alone_then_any_answer() {
        let mut g = budgeted(true, 3);
        for t in [b'a', b'b', b'c'] {
            assert!(g.unconstrained(), "thinking within the budget is free");
            g.advance(t as TokenId + BYTE_OFFSET).expect("free text");
        }
        assert!(!g.unconstrained(), "a mask must be sent now");
        assert!(only_close(&mut g));
        assert!(g.advance(digit(1)).is_err(), "nothing but the close tag");
        g.advance(CLOSE).expect("the close tag");
        assert!(g.unconstrained(), "no grammar: the answer is free");
        assert_eq!(mask(&mut g).count(), VOCAB);
        for t in [digit(1), OPEN, CLOSE, BYTE_EOS] {
            g.advance(t).expect("any answer");
        }
    }

    #[test]
    fn the_budget_counts_only_tokens_inside_the_reasoning() {
        // The model's own open tag is not counted; a close within the budget
        // ends the reasoning as it would without one.
        let mut g = budgeted(false, 2);
        assert!(
            g.unconstrained(),
            "the first token is free without a grammar"
        );
        g.advance(OPEN).expect("opens");
        g.advance(digit(1)).expect("one");
        assert!(g.unconstrained());
        g.advance(CLOSE).expect("closes within the budget");
        for t in [digit(2), digit(3), digit(4)] {
            g.advance(t).expect("the answer is not reasoning");
        }
        assert!(g.unconstrained());
        // An answer that never opens the reasoning is never cut.
        let mut g = budgeted(false, 0);
        g.advance(digit(5)).expect("no reasoning");
        g.advance(OPEN).expect("an open tag later is text");
        assert!(g.unconstrained(), "{g:?}");
        // A budget of nothing closes at once.
        let mut g = budgeted(true, 0);
        assert!(only_close(&mut g));
        let mut g = budgeted(false, 0);
        g.advance(OPEN).expect("opens");
        assert!(only_close(&mut g));
    }

    #[test]
    fn free_tokens_count_what_any_tokens_may_take_before_the_close_is_forced() {
        // Not opened: the open tag first, then the whole budget.
        let mut g = budgeted(false, 3);
        assert_eq!(g.free_tokens(), 4);
        g.advance(OPEN).expect("opens");
        assert_eq!(g.free_tokens(), 3);
        g.advance(digit(1)).expect("thinks");
        assert_eq!(g.free_tokens(), 2);
        g.advance(CLOSE).expect("closes");
        assert_eq!(g.free_tokens(), u32::MAX, "no grammar after it");
        let mut spent = budgeted(true, 1);
        spent.advance(digit(1)).expect("thinks");
        assert_eq!(spent.free_tokens(), 0, "the close tag is forced");
        let unlimited = ReasoningGate::new(None, TAGS, true);
        assert_eq!(unlimited.free_tokens(), u32::MAX);
        // Behind a grammar any token may hand over to it: the next alone.
        assert_eq!(gate(true, TAGS).free_tokens(), 1);
        assert_eq!(gate(false, TAGS).free_tokens(), 0);
    }

    #[test]
    fn a_grammar_follows_a_reasoning_its_budget_cut() {
        let mut g = gate(true, TAGS).with_budget(Some(2));
        g.advance(digit(1)).expect("thinks");
        g.advance(digit(2)).expect("thinks");
        assert!(only_close(&mut g));
        let mut fork = g.boxed_clone();
        let mut m = TokenMask::none(VOCAB);
        fork.fill_mask(&mut m).expect("mask");
        assert_eq!(m.count(), 1, "a fork keeps its count");
        g.advance(CLOSE).expect("closes");
        assert_eq!(mask(&mut g).count(), 10, "the grammar's digits alone");
    }

    #[test]
    fn a_plan_enforces_a_budget_only_where_the_close_tag_is_one_token() {
        let tags = ReasoningTags::THINK;
        let plan =
            ReasoningPlan::new(tags, &ByteCodec, false, Some(4), VOCAB).expect("still splits");
        assert_eq!((plan.gate, plan.budget), (None, None), "not enforced");
        assert!(plan.constrain(None, true).is_none());
        let codec = DigitsCodec::thinking(2);
        let close = TagTokens::of(tags, &codec).expect("one token each").close;
        let unreachable = ReasoningPlan::new(tags, &codec, false, Some(4), close).expect("splits");
        assert_eq!(unreachable.budget, None, "a close tag past the logits");
        let plan = ReasoningPlan::new(tags, &codec, false, Some(4), VOCAB).expect("gated");
        assert_eq!(plan.budget, Some(4));
        let mut gated = plan.constrain(None, true).expect("the budget's gate");
        let mut m = TokenMask::none(VOCAB);
        gated.get_mut().fill_mask(&mut m).expect("mask");
        assert_eq!(m.count(), VOCAB, "thinking first");
        assert!(gated.get_mut().unconstrained());
        let plain = ReasoningPlan::new(tags, &codec, false, None, VOCAB).expect("splits");
        assert!(plain.constrain(None, true).is_none(), "nothing to gate");
        // A budget alone where the open tag is several tokens: only a
        // prompt that opened the reasoning can be cut; elsewhere the text is
        // split as without a budget.
        let mut no_open = plan;
        no_open.gate = no_open.gate.map(|g| TagTokens { open: None, ..g });
        assert!(no_open.constrain(None, true).is_some());
        assert!(no_open.constrain(None, false).is_none());
        assert_eq!(no_open.gate_for(false), None);
    }

    #[test]
    fn tags_are_found_only_as_single_tokens() {
        // The byte codec spells each tag in several tokens: no gate.
        let tags = ReasoningTags::THINK;
        assert_eq!(TagTokens::of(tags, &ByteCodec), None);
        let codec = DigitsCodec::thinking(2);
        let t = TagTokens::of(tags, &codec).expect("one token each");
        assert_eq!(codec.decode(&[t.close]), "</think>");
        assert_eq!(codec.decode(&[t.open.expect("open")]), "<think>");
    }
}
