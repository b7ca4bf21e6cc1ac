//! Beam search as Hugging Face `generate` defines it (transformers 5.x,
//! `_beam_search` with `do_sample=False`), as a pure machine: each step it is
//! given every running beam's best next tokens with their log-probabilities,
//! and it says which beam each new beam continues and with which token, and
//! keeps the finished hypotheses. Where its inputs are the same f32 numbers,
//! its choices are Hugging Face's, so its outputs match token for token.
//!
//! The rules, as `generate` has them:
//! - `beams_to_keep = max(2, 1 + number of EOS ids) * num_beams` candidates
//!   are taken each step over all beams by accumulated log-probability; at
//!   the first step only beam 0 is live (the others start at -1e9).
//! - A candidate that ends with an EOS id or reaches `max_new_tokens` is
//!   finished; among the best `num_beams` candidates those become hypotheses
//!   scored `sum_logprobs / generated_len ^ length_penalty`, and the best
//!   `num_beams` hypotheses are kept. The best unfinished `num_beams`
//!   candidates run on.
//! - `early_stopping`: `True` stops once `num_beams` hypotheses exist;
//!   `False` also stops when the best running beam, scored at its current
//!   length, cannot beat the worst kept hypothesis; `Never` scores it at the
//!   longest possible length when `length_penalty > 0`.
//!
//! The machine never sees the model; how the logits were computed, and how
//! the beams' KV cache is shared, is the caller's business.

use crate::engine::TokenId;

/// What Hugging Face adds to scores it rules out.
const RULED_OUT: f32 = -1.0e9;

/// `early_stopping` of `generate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyStopping {
    /// `True`: stop as soon as `num_beams` hypotheses are finished.
    Yes,
    /// `False`: stop when no running beam can do better (heuristic).
    No,
    /// `"never"`: the heuristic with the longest possible length.
    Never,
}

/// The settings of one search.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamConfig {
    /// Beams (at least 1).
    pub num_beams: usize,
    /// Exponent of the generated length that divides a hypothesis' score.
    pub length_penalty: f32,
    /// When to stop.
    pub early_stopping: EarlyStopping,
    /// Most tokens generated (the EOS token included).
    pub max_new_tokens: usize,
    /// Tokens that end a hypothesis.
    pub eos_ids: Vec<TokenId>,
}

impl BeamConfig {
    /// Candidates taken each step over all beams.
    pub fn beams_to_keep(&self) -> usize {
        (1 + self.eos_ids.len()).max(2) * self.num_beams
    }
}

/// One running beam: its generated tokens and accumulated log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Beam {
    /// Generated tokens.
    pub tokens: Vec<TokenId>,
    /// Sum of their log-probabilities (f32, as `generate` adds them).
    pub score: f32,
}

/// A finished hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Generated tokens (the EOS token included when one ended it).
    pub tokens: Vec<TokenId>,
    /// Its score with the length penalty (or `RULED_OUT`, -1e9, plus something
    /// for an empty slot).
    pub score: f32,
    /// False for a slot that holds no real hypothesis yet.
    pub finished: bool,
}

/// What one step decided: new beam `i` continues old beam `parents[i]` with
/// `tokens[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    /// For each new beam, the old beam it continues.
    pub parents: Vec<usize>,
    /// For each new beam, the token it appends.
    pub tokens: Vec<TokenId>,
}

/// One prompt's beam search.
#[derive(Debug, Clone)]
pub struct BeamSearch {
    cfg: BeamConfig,
    running: Vec<Beam>,
    finished: Vec<Hypothesis>,
    /// `is_early_stop_heuristic_unsatisfied`: false once no running beam can
    /// improve on the kept hypotheses.
    may_improve: bool,
    done: bool,
}

impl BeamSearch {
    /// A search at its start: `num_beams` empty beams, beam 0 live.
    pub fn new(cfg: BeamConfig) -> BeamSearch {
        let n = cfg.num_beams.max(1);
        let running = (0..n)
            .map(|i| Beam {
                tokens: Vec::new(),
                score: if i == 0 { 0.0 } else { RULED_OUT },
            })
            .collect();
        let finished = (0..n)
            .map(|_| Hypothesis {
                tokens: Vec::new(),
                score: RULED_OUT,
                finished: false,
            })
            .collect();
        BeamSearch {
            cfg: BeamConfig {
                num_beams: n,
                ..cfg
            },
            running,
            finished,
            may_improve: true,
            done: cfg.max_new_tokens == 0,
        }
    }

    /// The running beams.
    pub fn running(&self) -> &[Beam] {
        &self.running
    }

    /// How many best tokens per beam a step needs to see
    /// ([`BeamConfig::beams_to_keep`]).
    pub fn candidates_per_beam(&self) -> usize {
        self.cfg.beams_to_keep()
    }

    /// True when the search is over; [`BeamSearch::best`] is the answer.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The best finished hypothesis' tokens.
    pub fn best(&self) -> &[TokenId] {
        &self.finished[0].tokens
    }

    /// One step. `candidates[b]` are running beam `b`'s best next tokens
    /// with their log-probabilities (at least [`Self::candidates_per_beam`]
    /// of them when the vocabulary has that many; order does not matter).
    /// Returns how the beams continue, or `None` when the search ended
    /// with this step.
    pub fn step(&mut self, candidates: &[Vec<(TokenId, f32)>]) -> Option<Advance> {
        if self.done {
            return None;
        }
        let n = self.cfg.num_beams;
        let keep = self.cfg.beams_to_keep();
        // Accumulated scores over all beams, best first; ties go to the
        // lower flat index (beam-major, then token id), as `topk` on the
        // flattened scores tends to.
        let mut all: Vec<(f32, usize, TokenId)> = Vec::new();
        for (b, beam) in self.running.iter().enumerate() {
            for &(t, lp) in candidates.get(b).map(Vec::as_slice).unwrap_or(&[]) {
                all.push((lp + beam.score, b, t));
            }
        }
        all.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        all.truncate(keep);
        let generated = self.running[0].tokens.len() + 1;
        let hits: Vec<bool> = all
            .iter()
            .map(|&(_, _, t)| self.cfg.eos_ids.contains(&t) || generated >= self.cfg.max_new_tokens)
            .collect();

        // The next running beams: the best candidates that did not finish.
        let mut order: Vec<usize> = (0..all.len()).collect();
        let running_score = |i: usize| all[i].0 + if hits[i] { RULED_OUT } else { 0.0 };
        order.sort_by(|&a, &b| {
            running_score(b)
                .total_cmp(&running_score(a))
                .then(a.cmp(&b))
        });
        let next: Vec<usize> = order.into_iter().take(n).collect();

        // Finished candidates among the best `num_beams` join the hypotheses.
        let penalty = (generated as f64).powf(f64::from(self.cfg.length_penalty)) as f32;
        let full = self.finished.iter().all(|h| h.finished)
            && self.cfg.early_stopping == EarlyStopping::Yes;
        let mut merged = self.finished.clone();
        for (i, &(score, b, t)) in all.iter().enumerate() {
            let just_finished = hits[i] && i < n;
            let mut s = score / penalty;
            if full {
                s += RULED_OUT;
            }
            if !self.may_improve {
                s += RULED_OUT;
            }
            if !just_finished {
                s += RULED_OUT;
            }
            let mut tokens = self.running[b].tokens.clone();
            tokens.push(t);
            merged.push(Hypothesis {
                tokens,
                score: s,
                finished: just_finished,
            });
        }
        let mut idx: Vec<usize> = (0..merged.len()).collect();
        idx.sort_by(|&a, &b| merged[b].score.total_cmp(&merged[a].score).then(a.cmp(&b)));
        self.finished = idx.into_iter().take(n).map(|i| merged[i].clone()).collect();

        let advance = Advance {
            parents: next.iter().map(|&i| all[i].1).collect(),
            tokens: next.iter().map(|&i| all[i].2).collect(),
        };
        self.running = next
            .iter()
            .map(|&i| {
                let (_, b, t) = all[i];
                let mut tokens = self.running[b].tokens.clone();
                tokens.push(t);
                Beam {
                    tokens,
                    score: running_score(i),
                }
            })
            .collect();

        // The stopping conditions, after the step (`cur_len` grew by one).
        let all_finished = self.finished.iter().all(|h| h.finished);
        if self.may_improve {
            let best_len = if self.cfg.early_stopping == EarlyStopping::Never
                && self.cfg.length_penalty > 0.0
            {
                self.cfg.max_new_tokens
            } else {
                generated
            };
            let best_possible = self.running[0].score
                / (best_len as f64).powf(f64::from(self.cfg.length_penalty)) as f32;
            let worst = self
                .finished
                .iter()
                .map(|h| h.score)
                .fold(f32::INFINITY, f32::min);
            // Any slot without a hypothesis compares against -1e9.
            self.may_improve = self.finished.iter().any(|h| {
                let bar = if h.finished { worst } else { RULED_OUT };
                best_possible > bar
            });
        }
        let open_beam = !(all_finished && self.cfg.early_stopping == EarlyStopping::Yes);
        let continuations = !hits.iter().all(|&h| h);
        if !(self.may_improve && open_beam && continuations) {
            self.done = true;
            return None;
        }
        Some(advance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n: usize, lp: f32, es: EarlyStopping, max: usize) -> BeamConfig {
        BeamConfig {
            num_beams: n,
            length_penalty: lp,
            early_stopping: es,
            max_new_tokens: max,
            eos_ids: vec![0],
        }
    }

    /// A toy model: from any beam, token t has log-probability given by
    /// `table[last token][t]`.
    fn run(search: &mut BeamSearch, table: &[[f32; 4]; 4]) {
        while !search.is_done() {
            let cands: Vec<Vec<(TokenId, f32)>> = search
                .running()
                .iter()
                .map(|b| {
                    let last = b.tokens.last().copied().unwrap_or(3) as usize;
                    (0..4).map(|t| (t as TokenId, table[last][t])).collect()
                })
                .collect();
            search.step(&cands);
        }
    }

    #[test]
    fn beam_search_finds_a_sequence_greedy_misses() {
        // Greedy from 3 takes 1 (-0.5) then is stuck at -2.0 per token;
        // 2 (-0.9) leads to the EOS at -0.1.
        let ln = [
            [-9.0, -9.0, -9.0, -9.0],
            [-2.0, -2.0, -2.0, -2.0],
            [-0.1, -9.0, -9.0, -9.0],
            [-9.0, -0.5, -0.9, -9.0],
        ];
        let mut s = BeamSearch::new(cfg(2, 1.0, EarlyStopping::No, 5));
        run(&mut s, &ln);
        assert_eq!(s.best(), &[2, 0]);
    }

    #[test]
    fn a_strong_length_penalty_prefers_longer_hypotheses() {
        // EOS right away costs -1.0; going on costs -0.3 a token, EOS at the end.
        let ln = [
            [-9.0, -9.0, -9.0, -9.0],
            [-9.0, -0.3, -9.0, -9.0],
            [-9.0, -9.0, -9.0, -9.0],
            [-1.0, -0.3, -9.0, -9.0],
        ];
        let mut short = BeamSearch::new(cfg(2, -1.0, EarlyStopping::No, 6));
        run(&mut short, &ln);
        assert_eq!(
            short.best(),
            &[0],
            "a negative penalty favours the short one"
        );
        let mut long = BeamSearch::new(cfg(2, 2.0, EarlyStopping::Never, 6));
        run(&mut long, &ln);
        assert_eq!(
            long.best().len(),
            6,
            "a positive one the longest: {:?}",
            long.best()
        );
    }

    #[test]
    fn max_new_tokens_ends_every_beam() {
        let ln = [[-1.0; 4]; 4];
        let mut s = BeamSearch::new(BeamConfig {
            eos_ids: vec![],
            ..cfg(3, 1.0, EarlyStopping::Yes, 4)
        });
        run(&mut s, &ln);
        assert!(s.is_done());
        assert_eq!(s.best().len(), 4);
    }
}
