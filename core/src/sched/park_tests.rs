//! Parked sequences (the `batch` continue-generation cache's KV blocks):
//! kept after they finish, continued without recomputing their tokens, the
//! first to go under memory pressure (and then forgotten, not queued), and
//! dropped only when they are parked.

use super::fork_tests::{done, ok, sched};
use super::*;
use crate::engine::{EngineFaultKind, SamplingParams, SeqId};

/// Runs steps until nothing is planned or `steps` ran.
fn run(s: &mut Scheduler, steps: usize) {
    for _ in 0..steps {
        let Some(plan) = s.schedule() else { return };
        s.on_step_done(&done(&plan, 5));
        ok(s);
    }
}

/// Sequence `id` with a `prompt`-token prompt, run for `decode` tokens and
/// parked.
fn finished_and_parked(s: &mut Scheduler, id: u64, prompt: u32, decode: usize) -> SeqId {
    let seq = SeqId(id);
    let tokens = (0..prompt).map(|t| 100 + t).collect();
    s.add(
        seq,
        tokens,
        prompt + decode as u32,
        SamplingParams::greedy(),
        None,
    )
    .expect("admitted");
    run(s, decode);
    assert!(s.park(seq), "a running sequence with computed tokens parks");
    ok(s);
    seq
}

#[test]
fn a_parked_sequence_keeps_its_blocks_and_continues_with_one_token_to_feed() {
    let mut s = sched(16);
    let a = finished_and_parked(&mut s, 1, 20, 3);
    let tokens = s.tokens(a).expect("kept").to_vec();
    assert_eq!(tokens.len(), 23);
    let blocks = s.block_table(a).expect("kept").to_vec();
    let st = s.stats();
    assert_eq!((st.parked, st.running, st.paused), (1, 0, 0));
    assert_eq!(st.blocks_parked, blocks.len() as u32);
    assert!(s.schedule().is_none(), "a parked sequence is never planned");

    let b = SeqId(2);
    let sampling = SamplingParams {
        temperature: 0.5,
        ..SamplingParams::greedy()
    };
    assert!(s.unpark(a, b, 23 + 10, sampling.clone(), Some(2)));
    ok(&s);
    assert!(
        !s.contains(a),
        "the parked sequence went into its continuation"
    );
    assert!(!s.is_parked(a));
    assert_eq!(s.tokens(b), Some(tokens.as_slice()));
    assert_eq!(
        s.block_table(b).map(|t| t[0]),
        Some(blocks[0]),
        "the full block is shared"
    );
    let plan = s.schedule().expect("the continuation runs");
    assert_eq!(plan.forks.len(), 1, "the engine copies the parent's state");
    assert_eq!(plan.free, vec![a], "then forgets the parent");
    assert_eq!(plan.copy_blocks.len(), 1, "the partial block is copied");
    let step = &plan.seqs[0];
    assert_eq!(
        (step.seq, step.start_pos),
        (b, 22),
        "only the last token is fed"
    );
    assert_eq!(step.sampling, sampling);
    assert_eq!(step.logprobs, Some(2));
    s.on_step_done(&done(&plan, 5));
    ok(&s);
    run(&mut s, 9);
    assert_eq!(s.tokens(b).map(<[u32]>::len), Some(33), "decodes on");
    s.remove(b);
    ok(&s);
    assert_eq!(s.stats().blocks_used, 0, "every block came back");
}

#[test]
fn memory_pressure_frees_parked_sequences_first_oldest_first_and_forgets_them() {
    let mut s = sched(12);
    let a = finished_and_parked(&mut s, 1, 30, 2); // 2 blocks
    let b = finished_and_parked(&mut s, 2, 30, 2); // 2 blocks
                                                   // A client-paused sequence also holds blocks.
    let p = SeqId(3);
    s.add(p, vec![1; 30], 40, SamplingParams::greedy(), None)
        .expect("admitted");
    run(&mut s, 1);
    s.set_runnable(p, false);
    assert_eq!(s.stats().blocks_used, 6);
    // A long prompt needs 7 of the 12 blocks: only `a` has to go.
    let big = SeqId(4);
    s.add(big, vec![2; 100], 110, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("admitted at once");
    assert!(plan.seqs.iter().any(|x| x.seq == big));
    ok(&s);
    assert!(!s.contains(a), "the oldest parked went, and is not queued");
    assert!(s.is_parked(b), "the newer parked stayed");
    assert!(
        s.block_table(p).is_some_and(|t| !t.is_empty()),
        "paused kept"
    );
    assert_eq!(plan.free, vec![a], "the engine forgets it");
    s.on_step_done(&done(&plan, 5));
    ok(&s);
    // Shrinking the pool takes the next parked one before the paused one.
    s.set_capacity(9);
    ok(&s);
    assert!(!s.contains(b));
    assert!(s.block_table(p).is_some_and(|t| !t.is_empty()));
    // A continuation of an evicted sequence is refused: the caller
    // recomputes it from its token ids.
    assert!(!s.unpark(b, SeqId(9), 60, SamplingParams::greedy(), None));
    assert!(!s.contains(SeqId(9)));
}

#[test]
fn only_parked_sequences_are_dropped_or_continued_as_such() {
    let mut s = sched(16);
    let live = SeqId(1);
    s.add(live, vec![1; 20], 40, SamplingParams::greedy(), None)
        .expect("admitted");
    run(&mut s, 1);
    assert!(
        !s.drop_parked(live),
        "a live generation is not a cache entry"
    );
    assert!(s.contains(live));
    assert!(!s.unpark(live, SeqId(2), 40, SamplingParams::greedy(), None));
    assert!(!s.contains(SeqId(2)));
    s.set_runnable(live, false);
    let parked = finished_and_parked(&mut s, 3, 20, 1);
    s.set_runnable(parked, true);
    assert!(s.schedule().is_none(), "parked stays unrunnable");
    assert!(
        !s.unpark(parked, live, 40, SamplingParams::greedy(), None),
        "into an id in use"
    );
    assert!(
        !s.unpark(parked, SeqId(4), 10_000, SamplingParams::greedy(), None),
        "a length the pool can never hold"
    );
    assert!(s.is_parked(parked));
    assert!(s.drop_parked(parked));
    ok(&s);
    assert!(!s.contains(parked));
    // A waiting sequence has nothing to keep: parking removes it.
    let waiting = SeqId(5);
    s.add(waiting, vec![1; 4], 10, SamplingParams::greedy(), None)
        .expect("queued");
    assert!(!s.park(waiting));
    assert!(!s.contains(waiting));
    ok(&s);
}

#[test]
fn a_continuation_without_a_block_for_its_copy_waits_its_turn_at_the_back() {
    // 3 blocks: `a` parks 2 (one partial), `q` waits, nothing is free.
    let mut s = sched(3);
    let a = finished_and_parked(&mut s, 1, 20, 2);
    let holder = SeqId(2);
    s.add(holder, vec![3; 4], 10, SamplingParams::greedy(), None)
        .expect("admitted");
    run(&mut s, 1);
    s.set_runnable(holder, false);
    let q = SeqId(3);
    s.add(q, vec![4; 4], 10, SamplingParams::greedy(), None)
        .expect("queued");
    s.set_runnable(q, false);
    assert_eq!(s.stats().blocks_used, 3);
    let c = SeqId(4);
    assert!(s.unpark(a, c, 40, SamplingParams::greedy(), None));
    ok(&s);
    assert!(s.is_waiting(c), "recomputed from its tokens");
    assert!(!s.has_started(c), "a new request in the queue");
    assert_eq!(
        s.waiting_positions().last().map(|(id, _)| *id),
        Some(c),
        "behind the request that was queued first"
    );
}

#[test]
fn a_lost_device_forgets_parked_sequences() {
    let mut s = sched(16);
    let a = finished_and_parked(&mut s, 1, 20, 2);
    let r = SeqId(2);
    s.add(r, vec![1; 4], 20, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("a step");
    s.on_step_failed(plan.step_id, &EngineFaultKind::DeviceLost);
    ok(&s);
    assert!(!s.contains(a), "its blocks' contents are gone");
    assert!(s.is_waiting(r), "a request is recomputed");
}

#[test]
fn a_continuation_frees_another_parked_sequence_for_its_copy() {
    // 4 blocks, all parked: `a` 2, `b` 2 (each with a partial block).
    let mut s = sched(4);
    let a = finished_and_parked(&mut s, 1, 20, 2);
    let b = finished_and_parked(&mut s, 2, 20, 2);
    assert_eq!(s.stats().blocks_used, 4);
    let c = SeqId(3);
    assert!(s.unpark(b, c, 30, SamplingParams::greedy(), None));
    ok(&s);
    assert!(!s.contains(a), "the other kept sequence made room");
    assert!(!s.is_waiting(c), "and the continuation kept its blocks");
    let plan = s.schedule().expect("decode");
    assert_eq!(plan.seqs[0].start_pos, 21);
    assert_eq!(plan.copy_blocks.len(), 1);
}
