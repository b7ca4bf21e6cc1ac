//! One sequence's grammar constraint as the scheduler keeps it: the
//! constraint, how many generated tokens it has taken, and the mask for the
//! state they reached (see [`crate::constraint`] for the rules).

use std::sync::Arc;

use crate::constraint::{Constraint, TokenMask};
use crate::engine::TokenId;

/// A constrained sequence's grammar state.
///
/// Invariant: `fed` generated tokens have been fed; `mask`, when set, is the
/// mask of the state after exactly those tokens; once `failed` is set no
/// further token is fed and every mask is empty.
#[derive(Debug, Clone)]
pub(crate) struct SeqConstraint {
    machine: Constraint,
    vocab: u32,
    fed: usize,
    mask: Option<Arc<TokenMask>>,
    failed: Option<String>,
}

impl SeqConstraint {
    /// A constraint that has taken no token, over a vocabulary of `vocab` ids.
    pub fn new(machine: Constraint, vocab: u32) -> SeqConstraint {
        SeqConstraint {
            machine,
            vocab,
            fed: 0,
            mask: None,
            failed: None,
        }
    }

    /// Feeds the generated tokens it has not taken yet (`generated` is every
    /// generated token, oldest first). The first refused token fails it.
    pub fn catch_up(&mut self, generated: &[TokenId]) {
        while self.failed.is_none() && self.fed < generated.len() {
            let token = generated[self.fed];
            match self.machine.get_mut().advance(token) {
                Ok(()) => {
                    self.fed += 1;
                    self.mask = None;
                }
                // The engine's message may quote generated text, which
                // must not reach logs: only the token id is kept.
                Err(_) => {
                    self.failed = Some(format!(
                        "the engine sampled token {token}, which the requested output format does not allow"
                    ));
                }
            }
        }
    }

    /// The tokens allowed after `generated`: computed once per state;
    /// `None` where any token may come
    /// ([`crate::constraint::TokenConstraint::unconstrained`]).
    /// A failed constraint allows nothing.
    pub fn mask(&mut self, generated: &[TokenId]) -> Option<Arc<TokenMask>> {
        self.catch_up(generated);
        if self.failed.is_some() {
            return Some(Arc::new(TokenMask::none(self.vocab)));
        }
        if self.machine.get_mut().unconstrained() {
            return None;
        }
        Some(self.state_mask())
    }

    /// The mask of the state reached (the constraint caught up, not failed).
    fn state_mask(&mut self) -> Arc<TokenMask> {
        if let Some(m) = &self.mask {
            return Arc::clone(m);
        }
        let mut m = TokenMask::none(self.vocab);
        match self.machine.get_mut().fill_mask(&mut m) {
            Ok(()) => {
                m.trim();
                let m = Arc::new(m);
                self.mask = Some(Arc::clone(&m));
                m
            }
            Err(_) => {
                self.failed =
                    Some("the grammar engine failed to compute the allowed tokens".to_string());
                Arc::new(TokenMask::none(self.vocab))
            }
        }
    }

    /// [`crate::constraint::TokenConstraint::free_tokens`] after
    /// `generated` (0 once failed).
    pub fn free_tokens(&mut self, generated: &[TokenId]) -> u32 {
        self.catch_up(generated);
        if self.failed.is_some() {
            return 0;
        }
        self.machine.get_mut().free_tokens()
    }

    /// Why it failed, if it did (a message for the client and operators;
    /// it names tokens, never text).
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }
}
