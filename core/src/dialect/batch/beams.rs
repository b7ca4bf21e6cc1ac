//! Beam search in `batch`: the dialect's side of [`crate::gen::beam`]. Each
//! round waits for every running beam's candidates, steps the search, forks
//! the beams it keeps from their parents (sharing KV blocks) and ends the
//! old ones, until the best hypothesis is the prompt's COMPLETE.

use super::{BatchConn, Finished, MAX_BEAM_CANDIDATES};
use crate::dialect::Cx;
use crate::engine::{SeqId, TokenId};
use crate::gen::beam::BeamConfig;
use crate::gen::{FinishReason, TokenPiece};
use crate::params::GenParams;

impl BatchConn {
    /// A beam reported its candidates: once every running beam of the
    /// prompt has, the search takes a step, forks the beams it keeps from
    /// their parents (sharing KV blocks) and ends the old ones, or finishes.
    pub(super) fn on_beam_token(
        &mut self,
        cx: &mut Cx<'_>,
        ji: usize,
        pi: usize,
        seq: SeqId,
        piece: &TokenPiece,
    ) {
        if piece.finish.is_some() {
            // A running beam ended from outside (the end of a shutdown's
            // grace; no deadline ends one, as beams are never paused): the
            // search cannot go on without it. Beams the search replaced are
            // no longer found here.
            if let Some(run) = self.jobs[ji].prompts[pi].beam.as_mut() {
                run.beams.retain(|&b| b != seq);
            }
            let why = "the beam search was stopped before it finished";
            // What this step gathered goes first, so events stay in order.
            self.flush_events(cx);
            return self.fail_prompt(cx, ji, pi, why.to_string());
        }
        let Some(top) = piece.logprobs.as_ref().map(|l| l.top.clone()) else {
            let why = "the engine gave no log-probabilities for a beam".to_string();
            return self.fail_prompt(cx, ji, pi, why);
        };
        // No more compute for this beam until the round is decided.
        cx.hold_for_siblings(seq);
        let first_round = {
            let Some(run) = self.jobs[ji].prompts[pi].beam.as_mut() else {
                return;
            };
            run.reported.insert(seq, top);
            if run.reported.len() < run.beams.len() {
                return;
            }
            // No step taken yet: every running beam is still empty.
            run.search
                .running()
                .first()
                .is_some_and(|b| b.tokens.is_empty())
        };
        if first_round {
            self.jobs[ji].events.initialized.push(pi);
        }
        let Some(run) = self.jobs[ji].prompts[pi].beam.as_mut() else {
            return;
        };
        // Before the first step every beam is the prompt: the same candidates.
        let candidates: Vec<Vec<(TokenId, f32)>> = if first_round {
            let c = run.reported.get(&run.beams[0]).cloned().unwrap_or_default();
            vec![c; run.search.running().len()]
        } else {
            run.beams
                .iter()
                .map(|b| run.reported.get(b).cloned().unwrap_or_default())
                .collect()
        };
        run.reported.clear();
        let old = std::mem::take(&mut run.beams);
        let Some(advance) = run.search.step(&candidates) else {
            for s in old {
                cx.end(s, FinishReason::Cancelled);
            }
            return self.finish_beams(cx, ji, pi);
        };
        let mut new = Vec::with_capacity(advance.parents.len());
        for (&parent, &token) in advance.parents.iter().zip(&advance.tokens) {
            let src = if first_round { old[0] } else { old[parent] };
            let Some(child) = cx.fork(src) else {
                for s in new.into_iter().chain(old) {
                    cx.end(s, FinishReason::Cancelled);
                }
                let why = "beam search could not continue a beam".to_string();
                return self.fail_prompt(cx, ji, pi, why);
            };
            cx.set_last_token(child, token);
            cx.release_for_siblings(child);
            self.owners.insert(child, (self.jobs[ji].serial, pi));
            new.push(child);
        }
        for s in old {
            cx.end(s, FinishReason::Cancelled);
        }
        if let Some(run) = self.jobs[ji].prompts[pi].beam.as_mut() {
            run.beams = new;
        }
    }

    /// The search is over: the best hypothesis is the prompt's COMPLETE.
    fn finish_beams(&mut self, cx: &mut Cx<'_>, ji: usize, pi: usize) {
        let eos = cx.model().eos_ids.clone();
        let now = cx.now;
        let Some(run) = self.jobs[ji].prompts[pi].beam.take() else {
            return;
        };
        let best = run.search.best().to_vec();
        // The text as `generate` users decode it: special tokens left out.
        let shown: Vec<TokenId> = best.iter().copied().filter(|t| !eos.contains(t)).collect();
        // Beams decode no text as they go, so the content filter's `stop`
        // rules judge the whole text here: it ends before a match.
        let (generated, filtered) = cx.filter_whole(cx.codec().decode(&shown));
        let is_eos = filtered.is_none() && best.last().is_some_and(|t| eos.contains(t));
        let mut ids = run.prompt_ids;
        ids.extend_from_slice(&best);
        // The best hypothesis's sequence may be gone (beams that hit their
        // end are ended at once): a continuation recomputes it.
        self.complete(
            now,
            ji,
            pi,
            Finished {
                ids,
                generated,
                new_tokens: best.len() as u32,
                is_eos,
                started: now,
                kv: None,
            },
        );
    }
}

/// What beam search here cannot do, said before anything runs.
pub(super) fn beam_limits(cfg: &BeamConfig, params: &GenParams) -> Result<(), String> {
    if cfg.beams_to_keep() > MAX_BEAM_CANDIDATES {
        let per = cfg.beams_to_keep() / cfg.num_beams;
        return Err(format!(
            "invalid `generation_config.num_beams`: at most {} with this model ({per} candidates per beam, {MAX_BEAM_CANDIDATES} at most), got {}",
            MAX_BEAM_CANDIDATES / per,
            cfg.num_beams
        ));
    }
    if params.temperature != 0.0 {
        return Err("beam sampling (`do_sample` true with `num_beams` > 1) is not available; set do_sample to false".into());
    }
    if params.repetition_penalty != 1.0 {
        return Err("`repetition_penalty` with beam search is not available (Hugging Face applies it to log-probabilities, this engine to logits); leave it at 1".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::beam::EarlyStopping;

    fn config(num_beams: usize, eos_ids: Vec<TokenId>) -> BeamConfig {
        BeamConfig {
            num_beams,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::No,
            max_new_tokens: 8,
            eos_ids,
        }
    }

    #[test]
    fn too_many_beams_are_refused_naming_how_many_fit() {
        let greedy = GenParams {
            temperature: 0.0,
            ..GenParams::defaults(8)
        };
        // One EOS id: two candidates per beam, so 10 beams fill the 20.
        assert_eq!(beam_limits(&config(10, vec![2]), &greedy), Ok(()));
        let e = beam_limits(&config(11, vec![2]), &greedy).expect_err("22 candidates");
        assert!(
            e.contains("at most 10 with this model (2 candidates per beam, 20 at most), got 11"),
            "{e}"
        );
        // Three EOS ids: four per beam, 5 beams at most.
        let e = beam_limits(&config(6, vec![2, 3, 4]), &greedy).expect_err("24 candidates");
        assert!(e.contains("at most 5 with this model (4 candidates"), "{e}");
        let sampled = GenParams::defaults(8);
        let e = beam_limits(&config(2, vec![2]), &sampled).expect_err("sampling");
        assert!(e.contains("do_sample"), "{e}");
        let penalised = GenParams {
            repetition_penalty: 1.2,
            ..greedy
        };
        let e = beam_limits(&config(2, vec![2]), &penalised).expect_err("penalty");
        assert!(e.contains("repetition_penalty"), "{e}");
    }
}
