//! Prompt logprobs on the CPU engine ([`tokenwire_core::SeqStep::prompt_logprobs`]):
//! each prompt token's score is its log-probability under the logits the
//! model computes for the prefix before it, whatever the chunking; a prompt
//! computed again from 0 scores once; a scored sequence shares a step with
//! others; chunks out of order, cached prefixes and drafts are refused.

mod common;

use common::*;
use tokenwire_core::{EngineFaultKind, SeqId, TokenId, TokenLogprobs};
use tokenwire_kernels::sampler::log_softmax;
use tokenwire_kernels::Engine;

/// The scores from each prefix's own logits, computed alone.
fn reference(e: &mut Engine, p: &[TokenId], top: usize) -> Vec<TokenLogprobs> {
    (1..p.len())
        .map(|k| {
            let lp = log_softmax(&logits_alone(e, &p[..k]));
            let mut order: Vec<usize> = (0..lp.len()).collect();
            order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
            TokenLogprobs {
                logprob: lp[p[k] as usize],
                top: order[..top].iter().map(|&t| (t as u32, lp[t])).collect(),
            }
        })
        .collect()
}

fn assert_close(got: &[TokenLogprobs], want: &[TokenLogprobs], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: entries");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g.logprob - w.logprob).abs() < 1e-4,
            "{what}: position {}: {} vs {}",
            i + 1,
            g.logprob,
            w.logprob
        );
        let ids = |t: &TokenLogprobs| t.top.iter().map(|x| x.0).collect::<Vec<_>>();
        assert_eq!(ids(g), ids(w), "{what}: position {}'s alternatives", i + 1);
        for (a, b) in g.top.iter().zip(&w.top) {
            assert!((a.1 - b.1).abs() < 1e-4, "{what}: position {}", i + 1);
        }
    }
}

#[test]
fn each_token_is_scored_by_the_logits_of_the_prefix_before_it() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    assert!(p.len() > 10, "a prompt of several chunks");
    let want = reference(&mut e, &p, 3);
    let argmax = {
        let row = logits_alone(&mut e, &p);
        (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
    };
    for chunk in [p.len(), 1, 3, 7] {
        let (got, token) = score_alone(&mut e, &p, 3, chunk);
        assert_close(&got, &want, &format!("chunks of {chunk}"));
        // The token after the prompt is sampled as without scoring.
        assert_eq!(Some(token as usize), argmax, "chunks of {chunk}");
    }
    // Alternatives are best first, and the best scores at least the token.
    let (got, _) = score_alone(&mut e, &p, 5, p.len());
    for g in &got {
        assert!(g.top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(g.top[0].1 >= g.logprob);
    }
    // A one-token prompt has nothing to score.
    let (none, _) = score_alone(&mut e, &p[..1], 2, 1);
    assert!(none.is_empty());
}

#[test]
fn a_prompt_computed_again_from_0_scores_once() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let (whole, _) = score_alone(&mut e, &p, 2, p.len());
    let table: Vec<u32> = (0..8).collect();
    let chunk = |id, seq, from: usize, to: usize| {
        let mut s = seq_step(seq, &p[from..to], from as u32, &table, to == p.len());
        s.prompt_logprobs = Some(2);
        plan(id, vec![s])
    };
    // Half the prompt, then (a preemption) the whole prompt from position 0.
    e.step(&chunk(1, 5, 0, 6)).expect("first half");
    let done = e.step(&chunk(2, 5, 0, p.len())).expect("again");
    assert_close(
        done.results[0].prompt_logprobs.as_deref().expect("scores"),
        &whole,
        "recomputed",
    );
    // In chunks on another sequence: each carries its last row on.
    e.step(&chunk(3, 6, 0, 4)).expect("0..4");
    e.step(&chunk(4, 6, 4, 8)).expect("4..8");
    let done = e.step(&chunk(5, 6, 8, p.len())).expect("the rest");
    assert_close(
        done.results[0].prompt_logprobs.as_deref().expect("scores"),
        &whole,
        "chunked",
    );
}

#[test]
fn a_scored_prompt_shares_a_step_with_a_sampled_sequence() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let (alone, token) = score_alone(&mut e, &p, 2, p.len());
    let a: Vec<u32> = (0..8).collect();
    let b: Vec<u32> = (8..16).collect();
    let plain = seq_step(1, &p, 0, &a, true);
    let mut scored = seq_step(2, &p, 0, &b, true);
    scored.prompt_logprobs = Some(2);
    let done = e.step(&plan(1, vec![plain, scored])).expect("step");
    assert_eq!(done.results.len(), 2, "one result each, in plan order");
    assert!(done.results[0].prompt_logprobs.is_none());
    assert_eq!(done.results[0].token, token);
    assert_eq!(done.results[1].token, token);
    assert_close(
        done.results[1].prompt_logprobs.as_deref().expect("scores"),
        &alone,
        "beside another",
    );
}

#[test]
fn scoring_out_of_order_from_a_cached_prefix_or_with_a_draft_is_refused() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let table: Vec<u32> = (0..8).collect();
    let mut first = seq_step(3, &p[..4], 0, &table, false);
    first.prompt_logprobs = Some(1);
    e.step(&plan(1, vec![first])).expect("first chunk");
    let mut skip = seq_step(3, &p[6..], 6, &table, true);
    skip.prompt_logprobs = Some(1);
    let err = e.step(&plan(2, vec![skip])).expect_err("a gap");
    assert!(
        matches!(&err.kind, EngineFaultKind::Internal(m) if m.contains("scores end at 4")),
        "{err:?}"
    );
    let mut cached = seq_step(4, &p[4..], 4, &table, true);
    cached.cached_prefix = p[..4].to_vec();
    cached.prompt_logprobs = Some(1);
    assert!(e.step(&plan(3, vec![cached])).is_err());
    let mut drafted = seq_step(5, &p, 0, &table, true);
    drafted.prompt_logprobs = Some(1);
    drafted.draft = vec![p[0]];
    assert!(e.step(&plan(4, vec![drafted])).is_err());
    // After a free, the sequence starts over at 0 only.
    e.step(&tokenwire_core::StepPlan {
        step_id: 5,
        free: vec![SeqId(3)],
        ..Default::default()
    })
    .expect("free");
    let mut late = seq_step(3, &p[4..], 4, &table, true);
    late.prompt_logprobs = Some(1);
    assert!(e.step(&plan(6, vec![late])).is_err());
}
