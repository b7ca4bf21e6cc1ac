//! Prompt logprobs ([`SeqStep::prompt_logprobs`]): each prompt token scored
//! by the logits row of the position before it, kept per sequence across
//! its prefill chunks until the chunk that ends the prompt.
//!
//! A chunk's rows score the tokens after them in the chunk; its last row
//! scores the next chunk's first token, which only that chunk brings, so
//! the row is carried until then. Invariant: a sequence's scores cover
//! positions `1..=carried position` (or nothing before its first chunk),
//! and a chunk is accepted only where they end (or at 0, which starts
//! over), so a chunk fed again after a failed step, or a prompt computed
//! again after a preemption, scores each position once.

use tokenwire_core::{SeqStep, TokenId, TokenLogprobs};

use crate::sampler::log_softmax;

/// One sequence's scores so far.
#[derive(Debug, Default)]
pub(crate) struct PromptScores {
    /// Positions `1..=entries.len()`, in order.
    entries: Vec<TokenLogprobs>,
    /// The last row computed, and its position: it scores the token at the
    /// next position.
    carry: Option<(u32, Vec<f32>)>,
}

impl PromptScores {
    /// Where the next chunk must start: 0 before any chunk, else one past
    /// the carried row.
    pub(crate) fn next_start(scores: Option<&PromptScores>) -> u32 {
        scores
            .and_then(|s| s.carry.as_ref())
            .map_or(0, |(pos, _)| pos + 1)
    }

    /// Starts scoring `s`'s chunk (already validated to start at 0 or at
    /// [`PromptScores::next_start`]): from 0 everything scored before is
    /// dropped; else the carried row scores the chunk's first token.
    pub(crate) fn begin(&mut self, s: &SeqStep, top: u8) {
        if s.start_pos == 0 {
            self.entries.clear();
            self.carry = None;
            return;
        }
        self.entries.truncate(s.start_pos as usize - 1);
        if let Some((_, row)) = self.carry.take() {
            self.entries.push(score(&row, s.tokens[0], top));
        }
    }

    /// Scores `token` by the row before it.
    pub(crate) fn push(&mut self, row: &[f32], token: TokenId, top: u8) {
        self.entries.push(score(row, token, top));
    }

    /// Keeps the chunk's last row (at `pos`) for the next chunk.
    pub(crate) fn carry(&mut self, pos: u32, row: &[f32]) {
        self.carry = Some((pos, row.to_vec()));
    }

    /// The prompt's scores, positions 1 onwards.
    pub(crate) fn finish(self) -> Vec<TokenLogprobs> {
        self.entries
    }
}

/// `token`'s log-probability under `row` (a logits row as the model
/// computed it), with the `top` most likely tokens, best first (the lower
/// id first among equals, as the sampler orders them).
pub(crate) fn score(row: &[f32], token: TokenId, top: u8) -> TokenLogprobs {
    let lp = log_softmax(row);
    let n = (top as usize).min(lp.len());
    let better = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    let mut order: Vec<u32> = (0..lp.len() as u32).collect();
    if n > 0 && n < order.len() {
        order.select_nth_unstable_by(n - 1, better);
    }
    order.truncate(n);
    order.sort_unstable_by(better);
    TokenLogprobs {
        logprob: lp.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY),
        top: order.into_iter().map(|t| (t, lp[t as usize])).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(start_pos: u32, tokens: &[TokenId]) -> SeqStep {
        SeqStep {
            seq: tokenwire_core::SeqId(1),
            tokens: tokens.to_vec(),
            start_pos,
            block_table: Vec::new(),
            sampling: tokenwire_core::SamplingParams::greedy(),
            sample: false,
            logprobs: None,
            cached_prefix: Vec::new(),
            allowed: None,
            draft: Vec::new(),
            embed: None,
            prompt_logprobs: Some(2),
        }
    }

    #[test]
    fn a_row_scores_its_token_against_the_whole_row_with_the_best_first() {
        let row = [0.0f32, 2.0, 1.0, 2.0];
        let s = score(&row, 2, 2);
        let z: f32 = row.iter().map(|x| x.exp()).sum();
        assert!((s.logprob - (1.0 - z.ln())).abs() < 1e-6);
        // Ids 1 and 3 tie: the lower id first.
        assert_eq!(s.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3]);
        assert!((s.top[0].1 - (2.0 - z.ln())).abs() < 1e-6);
        assert!(score(&row, 0, 0).top.is_empty());
    }

    #[test]
    fn the_carried_row_scores_the_next_chunk_and_a_chunk_fed_again_replaces_its_scores() {
        let rows = [[0.0f32, 1.0], [1.0, 0.0], [2.0, 0.0], [0.0, 3.0]];
        let mut p = PromptScores::default();
        assert_eq!(PromptScores::next_start(Some(&p)), 0);
        // Chunk [0, 2): row 0 scores token 1 (at position 1), row 1 carried.
        p.begin(&step(0, &[0, 1]), 1);
        p.push(&rows[0], 1, 1);
        p.carry(1, &rows[1]);
        assert_eq!(PromptScores::next_start(Some(&p)), 2);
        // Chunk [2, 4) from the same state twice (the engine changes
        // scores only once a step has computed, so a chunk fed again after
        // a failed step finds the state it found the first time).
        for _ in 0..2 {
            let mut q = PromptScores {
                entries: p.entries.clone(),
                carry: p.carry.clone(),
            };
            q.begin(&step(2, &[0, 1]), 1);
            q.push(&rows[2], 1, 1);
            let e = q.finish();
            assert_eq!(e.len(), 3, "positions 1, 2 and 3");
            assert_eq!(e[1].top[0].0, 0, "row 1 scores position 2");
            assert!((e[2].logprob - score(&rows[2], 1, 1).logprob).abs() < 1e-7);
        }
        // From 0 again (a preemption): everything scored before is gone.
        p.begin(&step(0, &[1]), 1);
        assert!(p.finish().is_empty());
    }
}
