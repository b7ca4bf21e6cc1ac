//! Per-request limits on which tokens may be sampled, beside any grammar:
//! vLLM's `allowed_token_ids` (only these) and `bad_words` (never these
//! words), as vLLM applies them to every token it samples.
//!
//! [`TokenRules`] holds a request's limits as token ids; [`TokenRules::wrap`]
//! puts them around the request's compiled grammar (or none) as one
//! [`TokenConstraint`], so they reach the engine's sampler as the same mask
//! a grammar sends, on every backend.
//!
//! Rules (vLLM's):
//! 1. With `allowed_token_ids`, nothing outside the list is sampled, the
//!    model's end-of-sequence tokens included unless listed.
//! 2. A bad word of one token is never sampled. A bad word of several
//!    tokens has its last token banned wherever the tokens generated so
//!    far end with the rest of it, so the word is never completed (the
//!    prompt does not count: vLLM matches the output alone).
//! 3. A grammar's mask is narrowed, never widened. Where the three leave no
//!    token at all, the end-of-sequence tokens are allowed, so the
//!    generation ends (`stop`) rather than failing.
//!
//! The state is the tokens fed ([`crate::constraint`]'s rule 1): a
//! recomputed or forked sequence gets the same masks.

use std::sync::Arc;

use crate::constraint::{Constraint, TokenConstraint, TokenMask};
use crate::engine::TokenId;

/// A request's token limits, as ids of the served model's vocabulary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenRules {
    /// The only ids that may be sampled (`allowed_token_ids`); `None`: any.
    pub allowed: Option<Vec<TokenId>>,
    /// Each bad word's token ids (`bad_words`, every way it tokenizes).
    pub bad_words: Vec<Vec<TokenId>>,
    /// The model's end-of-sequence ids (rule 3's way out).
    pub eos: Vec<TokenId>,
}

impl TokenRules {
    /// Whether the rules limit nothing (no list, no bad words).
    pub fn is_empty(&self) -> bool {
        self.allowed.is_none() && self.bad_words.iter().all(Vec::is_empty)
    }

    /// `grammar` with these rules around it (`grammar` itself when there are
    /// none).
    pub fn wrap(&self, grammar: Option<Constraint>, vocab_size: u32) -> Option<Constraint> {
        if self.is_empty() {
            return grammar;
        }
        let allowed = self.allowed.as_ref().map(|ids| {
            let mut mask = TokenMask::none(vocab_size);
            for &id in ids {
                mask.allow(id);
            }
            Arc::new(mask)
        });
        let mut bad_words: Vec<Vec<TokenId>> = self
            .bad_words
            .iter()
            .filter(|w| !w.is_empty())
            .cloned()
            .collect();
        bad_words.sort();
        bad_words.dedup();
        Some(Constraint::new(Box::new(Restricted {
            inner: grammar,
            allowed,
            bad_words: bad_words.into(),
            eos: self.eos.clone().into(),
            generated: Vec::new(),
            vocab_size,
        })))
    }
}

/// A grammar (or none) narrowed by [`TokenRules`].
struct Restricted {
    inner: Option<Constraint>,
    allowed: Option<Arc<TokenMask>>,
    bad_words: Arc<[Vec<TokenId>]>,
    eos: Arc<[TokenId]>,
    /// The tokens fed so far (bad words are matched against their end).
    generated: Vec<TokenId>,
    vocab_size: u32,
}

impl Restricted {
    /// The ids banned next: each bad word's last token where the tokens
    /// generated end with the rest of the word (rule 2).
    fn banned(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.bad_words.iter().filter_map(|w| {
            let (last, rest) = w.split_last()?;
            self.generated.ends_with(rest).then_some(*last)
        })
    }
}

impl TokenConstraint for Restricted {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
        match self.inner.as_mut() {
            Some(inner) if !inner.get().unconstrained() => inner.get_mut().fill_mask(mask)?,
            _ => {
                mask.words_mut().fill(u32::MAX);
                mask.trim();
            }
        }
        if let Some(allowed) = &self.allowed {
            for (w, a) in mask.words_mut().iter_mut().zip(allowed.words()) {
                *w &= a;
            }
        }
        let banned: Vec<TokenId> = self.banned().collect();
        for id in banned {
            mask.forbid(id);
        }
        if mask.count() == 0 {
            for &id in self.eos.iter() {
                mask.allow(id);
            }
        }
        Ok(())
    }

    fn advance(&mut self, token: TokenId) -> Result<(), String> {
        if let Some(inner) = self.inner.as_mut() {
            match inner.get_mut().advance(token) {
                // An end the grammar did not allow is rule 3's way out
                // (the only end the mask lets through that it did not).
                Err(_) if self.eos.contains(&token) => {}
                other => other?,
            }
        }
        self.generated.push(token);
        Ok(())
    }

    fn unconstrained(&self) -> bool {
        // Free at this step only where no list narrows it and no bad word
        // is one token from being completed.
        self.allowed.is_none()
            && self.banned().next().is_none()
            && self.inner.as_ref().is_none_or(|c| c.get().unconstrained())
    }

    fn free_tokens(&self) -> u32 {
        // A draft's later tokens could complete a bad word: only the next
        // token is ever known to be free.
        u32::from(self.unconstrained())
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(Restricted {
            inner: self.inner.clone(),
            allowed: self.allowed.clone(),
            bad_words: self.bad_words.clone(),
            eos: self.eos.clone(),
            generated: self.generated.clone(),
            vocab_size: self.vocab_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `tokens` and returns the mask after them.
    fn mask_after(c: &mut Constraint, tokens: &[TokenId], vocab: u32) -> TokenMask {
        for &t in tokens {
            c.get_mut().advance(t).expect("allowed");
        }
        let mut m = TokenMask::none(vocab);
        c.get_mut().fill_mask(&mut m).expect("mask");
        m
    }

    #[test]
    fn no_rules_leave_the_grammar_alone() {
        assert!(TokenRules::default().wrap(None, 10).is_none());
    }

    #[test]
    fn allowed_ids_are_the_only_ones_eos_included_only_if_listed() {
        let rules = TokenRules {
            allowed: Some(vec![3, 7, 64]),
            bad_words: Vec::new(),
            eos: vec![2],
        };
        let mut c = rules.wrap(None, 70).expect("a constraint");
        assert!(!c.get_mut().unconstrained());
        let m = mask_after(&mut c, &[], 70);
        assert_eq!(m.count(), 3);
        assert!(m.allows(3) && m.allows(7) && m.allows(64) && !m.allows(2));
    }

    #[test]
    fn a_bad_word_s_last_token_is_banned_only_after_the_rest_of_it() {
        let rules = TokenRules {
            allowed: None,
            bad_words: vec![vec![5], vec![8, 9, 10]],
            eos: vec![2],
        };
        let mut c = rules.wrap(None, 16).expect("a constraint");
        let m = mask_after(&mut c, &[], 16);
        assert_eq!(m.count(), 15, "the one-token word always");
        assert!(!m.allows(5) && m.allows(10));
        let m = mask_after(&mut c, &[8], 16);
        assert!(m.allows(10), "two tokens short");
        let m = mask_after(&mut c, &[9], 16);
        assert!(!m.allows(10) && !m.allows(5) && m.allows(9));
        assert!(!c.get_mut().unconstrained());
        // A fork keeps the history; another token moves past the word.
        let mut fork = c.clone();
        let m = mask_after(&mut fork, &[11], 16);
        assert!(m.allows(10));
    }

    /// A grammar that allows `ids` at every step.
    struct Only(Vec<TokenId>);
    impl TokenConstraint for Only {
        fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
            mask.clear();
            for &id in &self.0 {
                mask.allow(id);
            }
            Ok(())
        }
        fn advance(&mut self, token: TokenId) -> Result<(), String> {
            if self.0.contains(&token) {
                Ok(())
            } else {
                Err(format!("{token} refused"))
            }
        }
        fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
            Box::new(Only(self.0.clone()))
        }
    }

    #[test]
    fn a_grammar_is_narrowed_and_an_empty_mask_ends_the_answer() {
        let grammar = Constraint::new(Box::new(Only(vec![3, 4, 6])));
        let rules = TokenRules {
            allowed: Some(vec![4, 6, 9]),
            bad_words: vec![vec![6]],
            eos: vec![1, 2],
        };
        let mut c = rules.wrap(Some(grammar), 12).expect("a constraint");
        let m = mask_after(&mut c, &[], 12);
        assert_eq!((m.count(), m.allows(4)), (1, true));
        // The grammar still judges each token fed.
        assert!(c.get_mut().advance(9).is_err());
        let grammar = Constraint::new(Box::new(Only(vec![3])));
        let mut c = rules.wrap(Some(grammar), 12).expect("a constraint");
        let m = mask_after(&mut c, &[], 12);
        assert_eq!(m.count(), 2, "nothing left: the end of the answer");
        assert!(m.allows(1) && m.allows(2));
        // The grammar does not allow the end, but the rules' way out is
        // taken without failing the generation; another token still fails.
        assert!(c.clone().get_mut().advance(2).is_ok());
        assert!(c.get_mut().advance(5).is_err());
    }
}
