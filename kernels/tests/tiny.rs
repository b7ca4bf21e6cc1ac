//! The built-in tiny model: batched parity, plan validation and engine state.

mod common;

use common::*;
use tokenwire_core::{EngineFaultKind, SeqId, StepPlan, TokenId};
use tokenwire_kernels::Engine;

#[test]
fn tiny_info() {
    let e = Engine::tiny(3);
    let info = e.model_info();
    assert_eq!(info.name, "tokenwire-tiny");
    assert_eq!(info.vocab_size, 259);
    assert_eq!(info.context_len, 1024);
    assert_eq!(info.eos_ids, vec![2]);
    assert_eq!(info.num_blocks, 256);
    assert_eq!(info.dtype, "f32");
    assert_eq!(e.codec().encode("A", true).expect("encode"), vec![1, 68]);
}

#[test]
fn tiny_is_deterministic_per_seed() {
    let p: Vec<TokenId> = vec![1, 70, 80, 90];
    let a = Engine::tiny(5).generate_greedy(&p, 16, &[]).expect("gen");
    let b = Engine::tiny(5).generate_greedy(&p, 16, &[]).expect("gen");
    let c = Engine::tiny(6).generate_greedy(&p, 16, &[]).expect("gen");
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn tiny_matches_naive_forward() {
    let mut e = Engine::tiny(11);
    let toks = e
        .codec()
        .encode("The naive reference and the engine agree.", true)
        .expect("encode");
    let got = logits_alone(&mut e, &toks);
    let want = naive_logits(e.model(), &toks);
    let diff = max_abs_diff(&got, &want);
    assert!(diff < 1e-3, "tiny vs naive: {diff}");
}

#[test]
fn tiny_batched_chunked_and_shuffled_parity() {
    let mut e = Engine::tiny(21);
    let mut alone = Engine::tiny(21);
    let codec = e.codec();
    let toks: Vec<Vec<TokenId>> = [
        "first sequence, a long-ish prompt",
        "second one: this prompt needs to be longer than twenty-six bytes",
        "third",
        "fourth sequence here",
    ]
    .iter()
    .map(|t| codec.encode(t, true).expect("encode"))
    .collect();
    batched_parity(&mut e, &mut alone, &toks, 1e-4);
}

#[test]
fn long_sequence_crosses_many_blocks_in_parallel_paths() {
    // 600 tokens: attention and matmuls take the multi-threaded paths.
    let mut e = Engine::tiny(4);
    let toks: Vec<TokenId> = (0..600).map(|i| 3 + (i * 7 % 256) as TokenId).collect();
    let got = logits_alone(&mut e, &toks);
    let mut chunked = Engine::tiny(4);
    let table: Vec<u32> = (0..(600u32).div_ceil(16)).rev().collect();
    for (n, chunk) in toks.chunks(200).enumerate() {
        chunked
            .step(&plan(
                n as u64,
                vec![seq_step(1, chunk, n as u32 * 200, &table, true)],
            ))
            .expect("chunk");
    }
    let last = chunked.last_logits().next().expect("row").to_vec();
    assert!(max_abs_diff(&got, &last) <= 1e-4);
    assert!(got.iter().all(|x| x.is_finite()));
}

fn internal(r: Result<tokenwire_core::StepDone, tokenwire_core::EngineFault>) -> String {
    match r {
        Err(f) => match f.kind {
            EngineFaultKind::Internal(m) => m,
            other => panic!("expected Internal, got {other:?}"),
        },
        Ok(d) => panic!("expected a fault, got {d:?}"),
    }
}

#[test]
fn bad_plans_are_internal_faults() {
    let mut e = Engine::tiny(1);
    let t: Vec<u32> = vec![0, 1];
    let m = internal(e.step(&plan(1, vec![seq_step(1, &[1, 300], 0, &t, true)])));
    assert!(m.contains("token 300"), "{m}");
    let m = internal(e.step(&plan(1, vec![seq_step(1, &[1, 5], 0, &[999], true)])));
    assert!(m.contains("block 999"), "{m}");
    let m = internal(e.step(&plan(1, vec![seq_step(1, &[5; 20], 0, &[0], true)])));
    assert!(m.contains("block table"), "{m}");
    let m = internal(e.step(&plan(1, vec![seq_step(1, &[5], 1024, &[0; 65], true)])));
    assert!(m.contains("context"), "{m}");
    let m = internal(e.step(&plan(1, vec![seq_step(1, &[], 0, &t, true)])));
    assert!(m.contains("no tokens"), "{m}");
    let m = internal(e.step(&plan(1, vec![seq_step(1, &[5], 3, &t, true)])));
    assert!(m.contains("holds 0 tokens"), "{m}");
    let m = internal(e.step(&plan(
        1,
        vec![
            seq_step(1, &[5], 0, &t, true),
            seq_step(1, &[6], 0, &[2], true),
        ],
    )));
    assert!(m.contains("twice"), "{m}");
    let m = internal(e.step(&StepPlan {
        step_id: 9,
        copy_blocks: vec![(0, 256)],
        ..Default::default()
    }));
    assert!(m.contains("copy_blocks"), "{m}");
    // The fault echoes the step id and changed nothing: a good plan still runs.
    let f = e
        .step(&StepPlan {
            step_id: 42,
            copy_blocks: vec![(9999, 0)],
            ..Default::default()
        })
        .expect_err("must fail");
    assert_eq!(f.step_id, 42);
    assert!(e.history(SeqId(1)).is_none());
    let done = e
        .step(&plan(2, vec![seq_step(1, &[1, 5], 0, &t, true)]))
        .expect("good plan");
    assert_eq!(done.step_id, 2);
    assert_eq!(done.results.len(), 1);
}

#[test]
fn history_truncates_and_free_drops_it() {
    let mut e = Engine::tiny(2);
    let t: Vec<u32> = vec![3, 4];
    e.step(&plan(1, vec![seq_step(1, &[1, 10, 11, 12], 0, &t, false)]))
        .expect("prefill");
    assert_eq!(e.history(SeqId(1)), Some(&[1, 10, 11, 12][..]));
    // Recompute from position 2 (e.g. after a rollback): history cut there.
    e.step(&plan(2, vec![seq_step(1, &[20], 2, &t, true)]))
        .expect("rewrite");
    assert_eq!(e.history(SeqId(1)), Some(&[1, 10, 20][..]));
    e.step(&StepPlan {
        step_id: 3,
        free: vec![SeqId(1)],
        ..Default::default()
    })
    .expect("free");
    assert!(e.history(SeqId(1)).is_none());
    let m = internal(e.step(&plan(4, vec![seq_step(1, &[5], 3, &t, true)])));
    assert!(m.contains("holds 0"), "{m}");
    // Freed and restarted in the same plan is fine.
    e.step(&plan(5, vec![seq_step(1, &[1, 2], 0, &t, true)]))
        .expect("restart");
    let p = StepPlan {
        step_id: 6,
        seqs: vec![seq_step(1, &[1], 0, &t, true)],
        free: vec![SeqId(1)],
        copy_blocks: vec![],
        forks: vec![],
    };
    e.step(&p).expect("free then start");
    assert_eq!(e.history(SeqId(1)), Some(&[1][..]));
}

#[test]
fn copy_blocks_copies_kv_before_the_step() {
    // Seq 1 fills block 0 with 16 tokens. Seq 2 feeds the same 16 tokens (into
    // a scratch block, so the engine holds its history) while the plan copies
    // block 0 to block 5; seq 2 then continues on table [5, 6]. Block 5 was
    // never written otherwise, so the logits are right only if the copy happened.
    let mut e = Engine::tiny(8);
    let toks: Vec<TokenId> = (0..20).map(|i| 3 + i * 5).collect();
    e.step(&plan(1, vec![seq_step(1, &toks[..16], 0, &[0], false)]))
        .expect("prefill");
    let p = StepPlan {
        step_id: 2,
        seqs: vec![seq_step(2, &toks[..16], 0, &[7], false)],
        copy_blocks: vec![(0, 5)],
        forks: vec![],
        free: vec![SeqId(1)],
    };
    e.step(&p).expect("copy");
    e.step(&plan(3, vec![seq_step(2, &toks[16..], 16, &[5, 6], true)]))
        .expect("continue");
    let got = e.last_logits().next().expect("row").to_vec();
    let want = logits_alone(&mut Engine::tiny(8), &toks);
    assert!(max_abs_diff(&got, &want) <= 1e-4);
    // Without the copy, block 9 is zeros and the answer differs.
    e.step(&plan(4, vec![seq_step(3, &toks[..16], 0, &[8], false)]))
        .expect("history");
    e.step(&plan(5, vec![seq_step(3, &toks[16..], 16, &[9, 10], true)]))
        .expect("continue");
    let wrong = e.last_logits().next().expect("row").to_vec();
    assert!(max_abs_diff(&wrong, &want) > 1e-3);
}

#[test]
fn drafted_steps_yield_what_plain_steps_yield() {
    // Greedy, then sampled (seeded by position) with logprobs: the CPU
    // backend's products give the same bits for any number of rows, so the
    // tokens and logprobs are exactly those of one-token steps.
    drafts_greedy_and_sampled(|| Some(Engine::tiny(9)), 0.0);
}
