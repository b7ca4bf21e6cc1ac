//! `step_budget`: every engine step the Host plans respects its limits and is
//! well formed: at least one sequence, at most `max_running_seqs` of them,
//! at most `max_step_tokens` tokens fed in all, none empty or twice; every
//! block table long enough for the positions it is fed, its blocks inside
//! the pool, and the blocks it writes in no other sequence's table of the
//! step (full blocks of a shared prefix are only read, so several tables
//! may hold them); nothing both freed
//! and computed; step ids going up by one; decodes before prompt chunks (a
//! sequence's one sampled next token never waits behind another's slice of
//! prompt in the same step, so a long prompt cannot eat the budget of
//! streams already running).

use std::collections::{BTreeMap, BTreeSet};

use tokenwire_core::{Output, SeqId};

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct StepBudget {
    last_step: Option<u64>,
}

impl Checker for StepBudget {
    fn name(&self) -> &'static str {
        "step_budget"
    }

    fn on_crash(&mut self) {
        self.last_step = None;
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Output::RunStep(plan) = out else {
            return Ok(());
        };
        let id = plan.step_id;
        if let Some(last) = self.last_step {
            if id != last + 1 {
                return Err(format!("step {id} follows step {last}"));
            }
        }
        self.last_step = Some(id);
        if plan.seqs.is_empty() {
            return Err(format!("step {id} computes nothing"));
        }
        if plan.seqs.len() > cx.config.max_running_seqs as usize {
            return Err(format!(
                "step {id} has {} sequences, the limit is {}",
                plan.seqs.len(),
                cx.config.max_running_seqs
            ));
        }
        let fed: usize = plan.seqs.iter().map(|s| s.tokens.len()).sum();
        if fed > cx.config.max_step_tokens as usize {
            return Err(format!(
                "step {id} feeds {fed} tokens, the budget is {}",
                cx.config.max_step_tokens
            ));
        }
        let bs = cx.model.block_size as usize;
        let mut seqs = BTreeSet::new();
        let mut written: BTreeMap<u32, SeqId> = BTreeMap::new();
        let mut read: BTreeMap<u32, SeqId> = BTreeMap::new();
        for s in &plan.seqs {
            if !seqs.insert(s.seq) {
                return Err(format!("step {id} computes {:?} twice", s.seq));
            }
            if s.tokens.is_empty() {
                return Err(format!("step {id} feeds {:?} no token", s.seq));
            }
            let end = s.start_pos as usize + s.tokens.len();
            if s.block_table.len() * bs < end {
                return Err(format!(
                    "step {id}: {:?} is fed up to position {end} with {} blocks of {bs}",
                    s.seq,
                    s.block_table.len()
                ));
            }
            let start = s.start_pos as usize;
            for (i, &b) in s.block_table.iter().enumerate() {
                if b >= cx.model.num_blocks {
                    return Err(format!("step {id}: block {b} is outside the pool"));
                }
                let writes = (i + 1) * bs > start && i * bs < end;
                let clash = if writes {
                    written.insert(b, s.seq).or_else(|| read.get(&b).copied())
                } else {
                    read.insert(b, s.seq);
                    written.get(&b).copied()
                };
                if let Some(other) = clash.filter(|o| *o != s.seq) {
                    return Err(format!(
                        "step {id}: block {b} is in the tables of {other:?} and {:?}, and one of them writes it",
                        s.seq
                    ));
                }
            }
            if plan.free.contains(&s.seq) {
                return Err(format!("step {id} frees {:?} and computes it", s.seq));
            }
        }
        let mut chunk = None;
        for s in &plan.seqs {
            // A sequence just admitted onto cached blocks may have one
            // prompt token left: its first slice, not a stream's decode.
            let decode =
                s.tokens.len() == 1 && s.sample && s.start_pos > 0 && s.cached_prefix.is_empty();
            match chunk {
                Some(c) if decode => {
                    return Err(format!(
                        "step {id} decodes {:?} after the prompt chunk of {c:?}",
                        s.seq
                    ))
                }
                None if s.tokens.len() > 1 => chunk = Some(s.seq),
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use tokenwire_core::{SamplingParams, SeqId, SeqStep, StepPlan};

    fn seq(id: u64, tokens: usize, table: Vec<u32>) -> SeqStep {
        SeqStep {
            seq: SeqId(id),
            tokens: vec![5; tokens],
            start_pos: 0,
            block_table: table,
            sampling: SamplingParams::greedy(),
            sample: true,
            logprobs: None,
            cached_prefix: Vec::new(),
            allowed: None,
            draft: Vec::new(),
            embed: None,
            prompt_logprobs: None,
        }
    }

    fn plan(step_id: u64, seqs: Vec<SeqStep>) -> Output {
        Output::RunStep(StepPlan {
            step_id,
            seqs,
            free: vec![],
            copy_blocks: vec![],
            forks: vec![],
        })
    }

    #[test]
    fn plans_over_budget_or_malformed_are_caught() {
        let mut k = kit(Box::new(StepBudget::default()));
        k.input(tokenwire_core::Input::Timeout).expect("input");
        k.out(plan(1, vec![seq(1, 16, vec![0])])).expect("fits");
        // The kit's Host allows 512 tokens a step; blocks are 16 tokens.
        let cases = [
            plan(3, vec![seq(1, 1, vec![0])]),
            plan(2, vec![seq(1, 600, (0..38).collect())]),
            plan(2, vec![seq(1, 17, vec![0])]),
            plan(2, vec![seq(1, 1, vec![0]), seq(2, 1, vec![0])]),
            plan(2, vec![seq(1, 1, vec![0]), seq(1, 1, vec![1])]),
            plan(2, vec![seq(1, 1, vec![64])]),
            plan(2, vec![]),
        ];
        for bad in cases {
            let mut k = kit(Box::new(StepBudget::default()));
            k.input(tokenwire_core::Input::Timeout).expect("input");
            k.out(plan(1, vec![seq(1, 1, vec![0])])).expect("first");
            let err = k.out(bad.clone()).expect_err("caught");
            assert_eq!(err.invariant, "step_budget", "{bad:?}");
        }
    }

    #[test]
    fn a_decode_behind_a_prompt_chunk_is_caught() {
        let decode = |id| SeqStep {
            start_pos: 5,
            ..seq(id, 1, vec![id as u32])
        };
        let chunk = |id| SeqStep {
            sample: false,
            ..seq(id, 8, vec![id as u32])
        };
        let mut k = kit(Box::new(StepBudget::default()));
        k.input(tokenwire_core::Input::Timeout).expect("input");
        k.out(plan(1, vec![decode(1), chunk(2), decode(3)]))
            .expect_err("decode after a chunk");
        let mut k = kit(Box::new(StepBudget::default()));
        k.input(tokenwire_core::Input::Timeout).expect("input");
        k.out(plan(1, vec![decode(1), decode(3), chunk(2)]))
            .expect("decodes first");
        // A one-token slice of a prompt that samples nothing may come last.
        let last_slice = SeqStep {
            sample: false,
            ..decode(4)
        };
        k.out(plan(2, vec![decode(1), chunk(2), last_slice]))
            .expect("not a decode");
    }
}
