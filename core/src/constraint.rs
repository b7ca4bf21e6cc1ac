//! Constrained decoding: a grammar a generation's text must follow
//! (structured output), as the core sees it.
//!
//! The core does not parse grammars. A client's [`Grammar`] is compiled by the
//! served model's [`crate::TextCodec::constrain`] (the server's is llguidance
//! over the model's vocabulary) into a [`TokenConstraint`]: a state machine
//! over token ids. The scheduler keeps one per constrained sequence and, for
//! every step that samples it, asks it for the [`TokenMask`] of tokens that
//! may come next; the mask travels in the plan ([`crate::SeqStep::allowed`])
//! to the engine's sampler, which never picks a token outside it (a step at
//! which the constraint allows any token sends none). Each sampled token is
//! then fed back to the constraint.
//!
//! Rules:
//! 1. A constraint's state depends only on the tokens fed to it, so a
//!    sequence that is evicted and recomputed, or a plan sent again after a
//!    failed step, gets the same mask.
//! 2. The tokens fed are exactly the sequence's generated ones (those after
//!    [`crate::SamplingParams::generated_from`]), in order.
//! 3. Once the grammar is complete, the mask allows only end-of-sequence
//!    tokens, so the generation ends with finish reason `stop`.
//! 4. A token the constraint refuses (an engine that ignored the mask) fails
//!    the generation rather than streaming text that breaks the format.

use std::fmt;

use crate::engine::TokenId;

/// What a generation's output must be, as a client asked for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON that validates against a JSON Schema (OpenAI's `json_schema`).
    JsonSchema {
        /// The schema.
        schema: serde_json::Value,
        /// Refuse schema keywords the engine cannot enforce (OpenAI's
        /// `strict: true`) rather than ignoring them.
        strict: bool,
    },
    /// A grammar in llguidance's Lark dialect (the server's own tool-call
    /// grammars, and a client's `structured_outputs.grammar`).
    Lark(String),
    /// Text that matches a regular expression whole (Rust `regex` syntax;
    /// vLLM's `structured_outputs.regex`).
    Regex(String),
    /// Exactly one of these strings (vLLM's `structured_outputs.choice`).
    Choice(Vec<String>),
}

/// The set of token ids that may be sampled next: one bit per vocabulary id.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: u32,
}

impl fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenMask")
            .field("len", &self.len)
            .field("allowed", &self.count())
            .finish()
    }
}

impl TokenMask {
    /// A mask over `len` ids allowing none.
    pub fn none(len: u32) -> TokenMask {
        TokenMask {
            words: vec![0; (len as usize).div_ceil(32)],
            len,
        }
    }

    /// Ids the mask covers (the vocabulary size).
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True when it covers no ids.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allows `id` (ids outside the mask are ignored).
    pub fn allow(&mut self, id: TokenId) {
        if id < self.len {
            self.words[(id / 32) as usize] |= 1 << (id % 32);
        }
    }

    /// Forbids `id` (ids outside the mask are ignored).
    pub fn forbid(&mut self, id: TokenId) {
        if id < self.len {
            self.words[(id / 32) as usize] &= !(1 << (id % 32));
        }
    }

    /// Forbids every id.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Whether `id` may be sampled (false outside the mask).
    pub fn allows(&self, id: TokenId) -> bool {
        id < self.len && self.words[(id / 32) as usize] & (1 << (id % 32)) != 0
    }

    /// Number of ids allowed.
    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// The bits, read-only (as [`TokenMask::words_mut`] lays them out).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The bits, id `i` at bit `i % 32` of word `i / 32` (the layout of
    /// llguidance's and most grammar engines' masks); bits past `len` must
    /// stay zero.
    pub fn words_mut(&mut self) -> &mut [u32] {
        &mut self.words
    }

    /// Clears any bits past `len` (after a bulk write through [`TokenMask::words_mut`]).
    pub fn trim(&mut self) {
        let tail = self.len % 32;
        if tail != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u32 << tail) - 1;
            }
        }
    }
}

/// One generation's grammar state: which tokens may come next.
///
/// Implementations are deterministic functions of the tokens fed (rule 1 of
/// the module docs).
pub trait TokenConstraint: Send {
    /// Writes the tokens allowed next into `mask` (all bits are overwritten).
    /// An error is a message for operators (the grammar engine failed).
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String>;

    /// Feeds the token sampled. An error means the grammar does not allow it.
    fn advance(&mut self, token: TokenId) -> Result<(), String>;

    /// Whether any token may come next (a mask would allow every id): the
    /// scheduler then sends no mask, and the engine samples as for an
    /// unconstrained sequence (on the device, where it can). A grammar held
    /// back while a model reasons is ([`crate::reasoning_gate`]).
    fn unconstrained(&self) -> bool {
        false
    }

    /// How many next tokens may each be any id, whatever the ones before
    /// them are: a speculative draft of one fewer keeps every sample of its
    /// step free, so the step carries no mask and every token it confirms
    /// is allowed (0: the next token is constrained). More than 0 implies
    /// [`TokenConstraint::unconstrained`]; by default the next token alone
    /// is counted, which lets no draft through.
    fn free_tokens(&self) -> u32 {
        u32::from(self.unconstrained())
    }

    /// A copy in the same state (a sequence forked from this one).
    fn boxed_clone(&self) -> Box<dyn TokenConstraint>;
}

/// A compiled constraint, owned by one sequence: [`TokenConstraint`] made
/// `Clone` and `Debug` so the structures that carry it can be.
pub struct Constraint(Box<dyn TokenConstraint>);

impl Constraint {
    /// Wraps a compiled constraint.
    pub fn new(inner: Box<dyn TokenConstraint>) -> Constraint {
        Constraint(inner)
    }

    /// The constraint's state machine, read-only.
    pub fn get(&self) -> &dyn TokenConstraint {
        self.0.as_ref()
    }

    /// The constraint's state machine.
    pub fn get_mut(&mut self) -> &mut dyn TokenConstraint {
        self.0.as_mut()
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint(self.0.boxed_clone())
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_sets_and_reads_single_bits_and_ignores_ids_outside() {
        let mut m = TokenMask::none(70);
        assert_eq!(m.count(), 0);
        for id in [0, 31, 32, 69, 70, 1000] {
            m.allow(id);
        }
        assert!(m.allows(0) && m.allows(31) && m.allows(32) && m.allows(69));
        assert!(!m.allows(1) && !m.allows(70) && !m.allows(1000));
        assert_eq!(m.count(), 4);
        m.clear();
        assert_eq!(m.count(), 0);
    }

    #[test]
    fn trim_clears_bits_past_the_vocabulary() {
        let mut m = TokenMask::none(33);
        m.words_mut().fill(u32::MAX);
        m.trim();
        assert_eq!(m.count(), 33);
        assert!(m.allows(32) && !m.allows(33));
    }
}
