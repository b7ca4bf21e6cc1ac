//! Draft tokens by prompt lookup: speculative decoding without a draft model.
//!
//! When a sequence's last few tokens (an n-gram) occurred earlier in its own
//! tokens (prompt and output), the tokens that followed them then are a
//! guess at what follows now. Code edits, quoting, extraction, summaries and
//! retrieval-augmented answers repeat long runs of their prompt, and the
//! guesses are often right. The engine feeds the guesses with the sequence's
//! last token in one step, samples after each position and keeps them up to
//! the first one its own sample disagrees with (see
//! [`crate::SeqStep::draft`]): a step can then yield several tokens for the
//! cost of one batched pass, and the output is exactly the output without
//! guesses, since every kept token is the engine's own sample at its
//! position (for any sampling parameters: a guessed token is kept with the
//! probability the sampler gives it, which is what the sampler would have
//! drawn).
//!
//! vLLM calls this `ngram` speculation (`prompt_lookup_max`,
//! `prompt_lookup_min`), llama.cpp `lookup` decoding. Here the most recent
//! earlier occurrence of the longest n-gram wins.

use crate::engine::TokenId;

/// How the scheduler guesses draft tokens (`--draft-tokens` and friends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftConfig {
    /// Most draft tokens per sequence and step; 0 turns drafting off.
    pub max_tokens: u32,
    /// Shortest run of trailing tokens matched against earlier ones.
    pub ngram_min: u32,
    /// Longest run of trailing tokens tried first.
    pub ngram_max: u32,
    /// Draft only while at most this many sequences decode in a step: a
    /// large batch already keeps the engine's products busy, and rejected
    /// guesses would cost it throughput.
    pub max_seqs: u32,
}

impl DraftConfig {
    /// No drafting; its other fields are `tokenwire serve`'s defaults, so
    /// that `DraftConfig { max_tokens: 8, ..DraftConfig::OFF }` drafts as
    /// `--draft-tokens 8` does.
    pub const OFF: DraftConfig = DraftConfig {
        max_tokens: 0,
        ngram_min: 2,
        ngram_max: 4,
        max_seqs: 4,
    };

    /// True when the scheduler drafts at all.
    pub fn enabled(&self) -> bool {
        self.max_tokens > 0 && self.max_seqs > 0 && self.ngram_min <= self.ngram_max
    }
}

impl Default for DraftConfig {
    fn default() -> Self {
        DraftConfig::OFF
    }
}

/// The draft for a sequence holding `tokens`: the up to `limit` tokens that
/// followed the most recent earlier occurrence of its last `n` tokens, for
/// the largest `n` from `cfg.ngram_max` down to `cfg.ngram_min` that occurs
/// earlier; empty when none does.
pub fn lookup<'t>(tokens: &'t [TokenId], cfg: &DraftConfig, limit: usize) -> &'t [TokenId] {
    if limit == 0 {
        return &[];
    }
    let len = tokens.len();
    let longest = (cfg.ngram_max as usize).min(len.saturating_sub(1));
    let shortest = (cfg.ngram_min as usize).max(1);
    for n in (shortest..=longest).rev() {
        let tail = &tokens[len - n..];
        // Starts of earlier occurrences, newest first; one that ends where
        // the tail begins or later still leaves a token after it.
        if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == tail) {
            let from = start + n;
            return &tokens[from..(from + limit).min(len)];
        }
    }
    &[]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(min: u32, max: u32) -> DraftConfig {
        DraftConfig {
            max_tokens: 8,
            ngram_min: min,
            ngram_max: max,
            max_seqs: 4,
        }
    }

    #[test]
    fn the_tokens_after_an_earlier_occurrence_of_the_tail() {
        // ... 5 6 7 8 9 ... 5 6 | 7 8 9 follows the earlier "5 6".
        let t = [1, 5, 6, 7, 8, 9, 2, 5, 6];
        assert_eq!(lookup(&t, &cfg(1, 3), 3), &[7, 8, 9]);
        assert_eq!(lookup(&t, &cfg(1, 3), 2), &[7, 8]);
        // The draft stops at the end of what is known.
        assert_eq!(lookup(&t, &cfg(1, 3), 10), &[7, 8, 9, 2, 5, 6]);
    }

    #[test]
    fn the_longest_ngram_wins_then_the_most_recent_occurrence() {
        // "6" alone last occurred before 4; "5 6" before 7.
        let t = [5, 6, 7, 0, 6, 4, 9, 5, 6];
        assert_eq!(lookup(&t, &cfg(1, 2), 1), &[7]);
        assert_eq!(lookup(&t, &cfg(1, 1), 1), &[4]);
        // Two earlier "5 6": the newer one's continuation.
        let t = [5, 6, 1, 5, 6, 2, 5, 6];
        assert_eq!(lookup(&t, &cfg(2, 2), 1), &[2]);
    }

    #[test]
    fn nothing_without_an_earlier_match_or_room() {
        assert!(lookup(&[1, 2, 3, 4], &cfg(1, 3), 4).is_empty());
        assert!(lookup(&[7], &cfg(1, 3), 4).is_empty());
        assert!(lookup(&[], &cfg(1, 3), 4).is_empty());
        assert!(lookup(&[1, 2, 1, 2], &cfg(1, 3), 0).is_empty());
        // Shorter n-grams than the minimum do not count.
        assert!(lookup(&[1, 2, 9, 2], &cfg(2, 3), 4).is_empty());
        assert_eq!(lookup(&[1, 2, 9, 2], &cfg(1, 3), 4), &[9, 2]);
    }

    #[test]
    fn a_repeating_run_drafts_its_own_continuation() {
        // The occurrence overlapping the tail itself counts: "3 3 3" after "3 3".
        let t = [3, 3, 3, 3];
        assert_eq!(lookup(&t, &cfg(2, 2), 4), &[3]);
        let t = [1, 2, 1, 2, 1, 2];
        assert_eq!(lookup(&t, &cfg(2, 4), 4), &[1, 2]);
    }

    proptest! {
        /// Against a brute-force reference: every (n, start) pair checked.
        #[test]
        fn matches_a_brute_force_search(
            tokens in proptest::collection::vec(0u32..4, 0..40),
            min in 1u32..4,
            extra in 0u32..3,
            limit in 0usize..6,
        ) {
            let c = cfg(min, min + extra);
            let got = lookup(&tokens, &c, limit);
            let mut want: &[TokenId] = &[];
            if limit > 0 {
                'n: for n in (min as usize..=(min + extra) as usize).rev() {
                    if n >= tokens.len() {
                        continue;
                    }
                    let len = tokens.len();
                    for s in (0..len - n).rev() {
                        if tokens[s..s + n] == tokens[len - n..] {
                            want = &tokens[s + n..(s + n + limit).min(len)];
                            break 'n;
                        }
                    }
                }
            }
            prop_assert_eq!(got, want);
        }
    }
}
