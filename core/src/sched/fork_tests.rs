//! Forked sequences (beams): full KV blocks shared by reference count, the
//! partial last block copied by the next plan, the copy's source kept until
//! the copy is done, and every sequence reading back its own tokens' K/V
//! through a model of the cache that applies the plan's copies first.

use std::collections::BTreeMap;

use super::*;
use crate::engine::{
    BlockId, EngineFaultKind, SamplingParams, SeqId, SeqResult, StepDone, StepPlan, TokenId,
};

/// Tokens per block in these tests (shared with `park_tests`).
pub(super) const BS: u32 = 16;

pub(super) fn sched(num_blocks: u32) -> Scheduler {
    Scheduler::new(SchedConfig {
        block_size: BS,
        num_blocks,
        max_step_tokens: 512,
        max_running_seqs: 8,
        prefix_cache: false,
        draft: crate::DraftConfig::OFF,
        max_scored_rows: u32::MAX,
    })
}

/// The KV cache as the engine would hold it: (block, slot) -> (position, token).
#[derive(Default)]
pub(super) struct Kv(BTreeMap<(BlockId, u32), (u32, TokenId)>);

impl Kv {
    /// Applies `plan` as the engine does (copies, then writes), after
    /// checking that every planned sequence finds its earlier tokens' K/V
    /// (`tokens` gives each one's full token list).
    pub(super) fn run(&mut self, s: &Scheduler, plan: &StepPlan) {
        for &(src, dst) in &plan.copy_blocks {
            for slot in 0..BS {
                match self.0.get(&(src, slot)).copied() {
                    Some(v) => self.0.insert((dst, slot), v),
                    None => self.0.remove(&(dst, slot)),
                };
            }
        }
        for step in &plan.seqs {
            let tokens = s.tokens(step.seq).expect("live");
            if !step.cached_prefix.is_empty() {
                assert_eq!(
                    step.cached_prefix.as_slice(),
                    &tokens[..step.start_pos as usize],
                    "{:?}: a cached prefix is exactly the tokens before its start",
                    step.seq
                );
            }
            for p in 0..step.start_pos {
                let slot = (step.block_table[(p / BS) as usize], p % BS);
                assert_eq!(
                    self.0.get(&slot),
                    Some(&(p, tokens[p as usize])),
                    "{:?} reads position {p}",
                    step.seq
                );
            }
        }
        for step in &plan.seqs {
            for (i, &t) in step.tokens.iter().enumerate() {
                let p = step.start_pos + i as u32;
                self.0
                    .insert((step.block_table[(p / BS) as usize], p % BS), (p, t));
            }
        }
    }
}

pub(super) fn done(plan: &StepPlan, token: TokenId) -> StepDone {
    StepDone {
        step_id: plan.step_id,
        results: plan
            .seqs
            .iter()
            .filter(|s| s.sample)
            .map(|s| SeqResult {
                seq: s.seq,
                token,
                logprobs: None,
                embedding: None,
                prompt_logprobs: None,
            })
            .collect(),
    }
}

pub(super) fn ok(s: &Scheduler) {
    if let Err(e) = s.check_invariants() {
        panic!("invariant broken: {e}");
    }
}

/// A sequence of `prompt` tokens, prefilled and one token sampled.
fn prefilled(s: &mut Scheduler, kv: &mut Kv, prompt: usize) -> SeqId {
    prefilled_to(s, kv, prompt, 200)
}

/// [`prefilled`] for a sequence that may grow to `max_len` tokens.
fn prefilled_to(s: &mut Scheduler, kv: &mut Kv, prompt: usize, max_len: u32) -> SeqId {
    let id = SeqId(1);
    let tokens: Vec<TokenId> = (0..prompt as u32).map(|t| 100 + t).collect();
    s.add(id, tokens, max_len, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("prefill");
    kv.run(s, &plan);
    s.on_step_done(&done(&plan, 7));
    ok(s);
    id
}

#[test]
fn a_fork_shares_full_blocks_and_copies_the_partial_one() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let a = prefilled(&mut s, &mut kv, 20);
    let b = SeqId(2);
    assert!(s.fork(a, b));
    assert!(!s.fork(a, b), "a second fork into the same id is refused");
    ok(&s);
    let ta = s.block_table(a).expect("a").to_vec();
    let tb = s.block_table(b).expect("b").to_vec();
    assert_eq!(ta[0], tb[0], "the full block is shared");
    assert_ne!(ta[1], tb[1], "the partial one is the child's own");
    assert!(s.set_last_token(b, 9), "b continues with another token");
    assert_eq!(s.tokens(b).and_then(|t| t.last()), Some(&9));
    assert_eq!(s.tokens(a).and_then(|t| t.last()), Some(&7));
    // The parent goes (as a beam nobody continues does); its partial block
    // must survive until the copy is done.
    s.remove(a);
    ok(&s);
    let plan = s.schedule().expect("decode");
    assert_eq!(plan.copy_blocks, vec![(ta[1], tb[1])]);
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 8));
    ok(&s);
    // b goes on through its own blocks, reading the shared and copied K/V.
    for _ in 0..20 {
        let plan = s.schedule().expect("decode");
        assert!(plan.copy_blocks.is_empty());
        kv.run(&s, &plan);
        s.on_step_done(&done(&plan, 8));
        ok(&s);
    }
    s.remove(b);
    ok(&s);
    assert_eq!(s.stats().blocks_used, 0, "every block came back");
}

#[test]
fn beams_forked_from_one_parent_write_only_their_own_blocks() {
    let mut s = sched(32);
    let mut kv = Kv::default();
    let a = prefilled(&mut s, &mut kv, 5);
    for (i, beam) in [SeqId(2), SeqId(3), SeqId(4)].into_iter().enumerate() {
        assert!(s.fork(a, beam));
        assert!(s.set_last_token(beam, 50 + i as TokenId));
    }
    s.remove(a);
    for round in 0..40 {
        let plan = s.schedule().expect("a step");
        kv.run(&s, &plan);
        s.on_step_done(&done(&plan, 60 + round));
        ok(&s);
        // Every few steps the beams are reshuffled: beam 4 is dropped and
        // replaced by a fork of beam 2 (as a search keeps the best).
        if round % 5 == 4 {
            let new = SeqId(100 + u64::from(round));
            let parent = SeqId(2);
            assert!(s.fork(parent, new));
            assert!(s.set_last_token(new, 77));
            let gone = s
                .block_table(SeqId(4))
                .map(<[BlockId]>::to_vec)
                .unwrap_or_default();
            s.remove(SeqId(4));
            ok(&s);
            let plan = s.schedule().expect("a step");
            kv.run(&s, &plan);
            s.on_step_done(&done(&plan, 1));
            ok(&s);
            let _ = gone;
            // Keep the numbering simple: the new beam takes 4's place.
            assert!(s.fork(new, SeqId(4)));
            s.remove(new);
            ok(&s);
        }
    }
}

#[test]
fn a_failed_step_sends_its_copies_again() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let a = prefilled(&mut s, &mut kv, 20);
    assert!(s.fork(a, SeqId(2)));
    s.remove(a);
    let plan = s.schedule().expect("decode");
    assert_eq!(plan.copy_blocks.len(), 1);
    s.on_step_failed(plan.step_id, &EngineFaultKind::Internal("x".into()));
    ok(&s);
    let again = s.schedule().expect("retry");
    assert_eq!(
        again.copy_blocks, plan.copy_blocks,
        "sent again, source still held"
    );
    kv.run(&s, &again);
    s.on_step_done(&done(&again, 3));
    ok(&s);
}

#[test]
fn without_a_free_block_the_child_is_recomputed_and_a_block_boundary_needs_no_copy() {
    // Two blocks: the parent holds both, none is left for the copy.
    let mut s = sched(2);
    let mut kv = Kv::default();
    let a = prefilled_to(&mut s, &mut kv, 20, 30);
    assert!(s.fork(a, SeqId(2)));
    ok(&s);
    assert!(s.block_table(SeqId(2)).is_some_and(<[BlockId]>::is_empty));
    s.remove(a);
    let plan = s.schedule().expect("recompute");
    let step = plan
        .seqs
        .iter()
        .find(|p| p.seq == SeqId(2))
        .expect("planned");
    assert_eq!(step.start_pos, 0, "recomputed from its tokens");
    assert!(plan.copy_blocks.is_empty());
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 3));
    ok(&s);

    let mut s = sched(8);
    let mut kv = Kv::default();
    let a = prefilled_to(&mut s, &mut kv, 16, 40);
    assert_eq!(
        s.block_table(a).map(<[BlockId]>::len),
        Some(2),
        "admission reserved a block for the next token"
    );
    assert!(s.fork(a, SeqId(2)));
    assert_eq!(
        s.block_table(SeqId(2)),
        s.block_table(a).map(|t| &t[..1]),
        "the child shares the one computed block and runs at once"
    );
    let plan = s.schedule().expect("decode");
    assert!(
        plan.copy_blocks.is_empty(),
        "a whole block is shared, not copied"
    );
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 3));
    ok(&s);
}

#[test]
fn a_child_removed_before_its_copy_leaves_no_copy_fork_or_hold_behind() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let a = prefilled(&mut s, &mut kv, 20);
    let before = s.stats().blocks_used;
    let b = SeqId(2);
    assert!(s.fork(a, b));
    assert_eq!(s.stats().blocks_used, before + 1, "the copy's target");
    s.remove(b);
    ok(&s);
    assert_eq!(
        s.stats().blocks_used,
        before,
        "target freed and the source's hold let go"
    );
    s.remove(a);
    ok(&s);
    assert_eq!(
        s.stats().blocks_used,
        0,
        "nothing held for a copy nobody needs"
    );
    s.add(SeqId(3), vec![1; 4], 10, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("a step");
    assert!(
        plan.copy_blocks.is_empty() && plan.forks.is_empty(),
        "{plan:?}"
    );
    assert_eq!(
        plan.free,
        vec![a],
        "only the parent was ever seen by the engine"
    );
}

#[test]
fn the_last_token_cannot_change_while_the_engine_computes_it() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let a = prefilled(&mut s, &mut kv, 5);
    let plan = s.schedule().expect("decode of the sampled token");
    assert!(plan.seqs.iter().any(|p| p.seq == a));
    assert!(
        !s.set_last_token(a, 9),
        "the token is in the outstanding step: changing it now would desync the cache"
    );
    assert_eq!(s.tokens(a).and_then(|t| t.last()), Some(&7));
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 8));
    assert!(s.set_last_token(a, 9), "the new token is not computed yet");
    ok(&s);
}

#[test]
fn a_failed_step_drops_the_copies_into_a_fork_removed_during_it() {
    for kind in [
        EngineFaultKind::Internal("x".into()),
        EngineFaultKind::OutOfMemory,
    ] {
        let mut s = sched(16);
        let mut kv = Kv::default();
        let a = prefilled(&mut s, &mut kv, 20);
        let used_by_a = s.stats().blocks_used;
        let b = SeqId(2);
        assert!(s.fork(a, b));
        let plan = s.schedule().expect("a step with the copy");
        assert_eq!(plan.copy_blocks.len(), 1);
        // The fork goes while its first step is outstanding, and the step fails.
        s.remove(b);
        s.on_step_failed(plan.step_id, &kind);
        ok(&s);
        s.remove(a);
        ok(&s);
        assert_eq!(
            s.stats().blocks_used,
            0,
            "{kind:?}: no copy source stays held for a fork that is gone (a had {used_by_a})"
        );
        assert!(
            s.schedule().is_none_or(|p| p.copy_blocks.is_empty()),
            "{kind:?}: no copy into freed blocks is sent"
        );
    }
}

#[test]
fn a_failed_step_drops_the_copies_into_a_fork_that_went_outside_it() {
    let mut s = Scheduler::new(SchedConfig {
        block_size: BS,
        num_blocks: 16,
        max_step_tokens: 512,
        // One sequence per step: the fork is not in the step that carries
        // its copy.
        max_running_seqs: 1,
        prefix_cache: false,
        draft: crate::DraftConfig::OFF,
        max_scored_rows: u32::MAX,
    });
    let mut kv = Kv::default();
    let a = prefilled(&mut s, &mut kv, 20);
    let b = SeqId(2);
    assert!(s.fork(a, b));
    let plan = s.schedule().expect("a step with the copy");
    assert_eq!(plan.copy_blocks.len(), 1);
    assert!(plan.seqs.iter().all(|p| p.seq != b), "b waits its turn");
    s.remove(b);
    s.on_step_failed(plan.step_id, &EngineFaultKind::Internal("x".into()));
    ok(&s);
    s.remove(a);
    ok(&s);
    assert_eq!(s.stats().blocks_used, 0, "the copy's source is not held");
}

#[test]
fn idle_forks_sharing_blocks_give_them_all_up_to_the_head_of_the_queue() {
    // Two paused sequences share their full blocks. The head of the queue
    // needs more than the free blocks plus those either holds alone, but no
    // more than all they hold: evicting both must make room, or the engine
    // sits idle while it waits (the simulator's seed 961 found that).
    let mut s = sched(16);
    let mut kv = Kv::default();
    let a = prefilled(&mut s, &mut kv, 63);
    let b = SeqId(2);
    assert!(s.fork(a, b));
    let plan = s.schedule().expect("the fork's copy and both decodes");
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 9));
    ok(&s);
    s.set_runnable(a, false);
    s.set_runnable(b, false);
    let shared = s.block_table(a).expect("a")[..3].to_vec();
    assert_eq!(&s.block_table(b).expect("b")[..3], shared.as_slice());
    let c = SeqId(3);
    // One block more than the free ones and those held alone, and so
    // within the pool once the shared ones come free too (blocks for
    // every prompt token and the next one's position).
    let need = 16 - shared.len() as u32 + 1;
    let prompt: Vec<TokenId> = (0..need * BS - 1).map(|t| 500 + t).collect();
    s.add(c, prompt, need * BS, SamplingParams::greedy(), None)
        .expect("fits the pool");
    let plan = s
        .schedule()
        .expect("the head runs once the idle forks give way");
    assert!(plan.seqs.iter().any(|p| p.seq == c), "{plan:?}");
    ok(&s);
}

#[test]
fn idle_forks_give_up_the_source_their_pending_copies_hold() {
    // A parent's prompt fills part of one block; two forks each wait for
    // the next plan to copy it into a block of their own, and the copy's
    // source is held until then. The parent ends and both forks pause
    // before any step: only they, through their pending copies, keep the
    // source. The head of the queue needs the whole pool: evicting the
    // forks drops their copies and frees the source too, so it runs (the
    // simulator's seed 1061 found the engine idle there, forever while the
    // forks' slow client read nothing).
    let mut s = sched(4);
    let mut kv = Kv::default();
    let a = prefilled_to(&mut s, &mut kv, 13, 4 * BS);
    let (b, c) = (SeqId(2), SeqId(3));
    assert!(s.fork(a, b));
    assert!(s.fork(a, c));
    s.remove(a);
    s.set_runnable(b, false);
    s.set_runnable(c, false);
    ok(&s);
    let d = SeqId(4);
    let prompt: Vec<TokenId> = (0..4 * BS - 1).map(|t| 500 + t).collect();
    s.add(d, prompt, 4 * BS, SamplingParams::greedy(), None)
        .expect("fits the pool");
    let plan = s
        .schedule()
        .expect("the head runs once the idle forks give way");
    assert!(plan.seqs.iter().any(|p| p.seq == d), "{plan:?}");
    assert!(
        plan.copy_blocks.is_empty(),
        "the evicted forks' copies are dropped"
    );
    ok(&s);
}
