//! Embeddings on the CPU engine ([`tokenwire_core::SeqStep::embed`]): the
//! last-token vector is the hidden state the LM head reads (stories260K ties
//! its head to its embedding, so the vector against each embedding row gives
//! the logits), a mean is the average of its prefixes' last-token vectors,
//! chunking changes nothing, and chunks out of order are refused.

mod common;

use common::*;
use tokenwire_core::{EngineFaultKind, Pooling, SeqId, StepPlan};

#[test]
fn last_token_vector_is_what_the_head_reads() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let v = embed_alone(&mut e, &p, Pooling::Last, p.len());
    let h = e.model().config().hidden_size;
    assert_eq!(v.len(), h);
    let logits = logits_alone(&mut e, &p);
    let w = e.model().weights();
    assert!(w.lm_head.is_none(), "stories260K ties its head");
    let mut row = vec![0.0; h];
    let mut worst = 0.0f32;
    for (t, &want) in logits.iter().enumerate() {
        w.embed.dequantize_row(t, &mut row);
        let got: f32 = row.iter().zip(&v).map(|(a, b)| a * b).sum();
        worst = worst.max((got - want).abs());
    }
    assert!(
        worst < 1e-3,
        "vector . embedding differs from the logits by {worst}"
    );
}

#[test]
fn mean_is_the_average_of_each_prefix_s_last_token() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let h = e.model().config().hidden_size;
    let mut want = vec![0.0f32; h];
    for k in 1..=p.len() {
        let last = embed_alone(&mut e, &p[..k], Pooling::Last, k);
        for (w, x) in want.iter_mut().zip(&last) {
            *w += x / p.len() as f32;
        }
    }
    let whole = embed_alone(&mut e, &p, Pooling::Mean, p.len());
    assert!(
        max_diff(&whole, &want) < 1e-4,
        "{}",
        max_diff(&whole, &want)
    );
    // In chunks of 1, 3 and 5 tokens: the same vector.
    for chunk in [1, 3, 5] {
        let chunked = embed_alone(&mut e, &p, Pooling::Mean, chunk);
        assert!(max_diff(&chunked, &whole) < 1e-5, "chunks of {chunk}");
        let last = embed_alone(&mut e, &p, Pooling::Last, chunk);
        let one = embed_alone(&mut e, &p, Pooling::Last, p.len());
        assert!(max_diff(&last, &one) < 1e-5, "last, chunks of {chunk}");
    }
}

#[test]
fn a_prompt_or_chunk_computed_again_pools_once() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let table: Vec<u32> = (0..8).collect();
    let whole = embed_alone(&mut e, &p, Pooling::Mean, p.len());
    // Half the prompt, then (a preemption) the whole prompt from position 0.
    let mut half = seq_step(5, &p[..4], 0, &table, false);
    half.embed = Some(Pooling::Mean);
    e.step(&plan(1, vec![half])).expect("first half");
    let mut again = seq_step(5, &p, 0, &table, true);
    again.embed = Some(Pooling::Mean);
    let done = e.step(&plan(2, vec![again])).expect("again");
    let v = done.results[0].embedding.clone().expect("vector");
    assert!(max_diff(&v, &whole) < 1e-5);
    assert_eq!(done.results[0].seq, SeqId(5));

    // A chunk fed twice (its first step failed after the engine saw it)
    // counts once.
    let chunk = |id, from: usize, to: usize, last| {
        let mut s = seq_step(6, &p[from..to], from as u32, &table, last);
        s.embed = Some(Pooling::Mean);
        plan(id, vec![s])
    };
    e.step(&chunk(3, 0, 4, false)).expect("0..4");
    e.step(&chunk(4, 4, 8, false)).expect("4..8");
    e.step(&chunk(5, 4, 8, false)).expect("4..8 again");
    let done = e.step(&chunk(6, 8, p.len(), true)).expect("the rest");
    let v = done.results[0].embedding.clone().expect("vector");
    assert!(max_diff(&v, &whole) < 1e-5, "{}", max_diff(&v, &whole));
}

#[test]
fn embeddings_and_sampled_sequences_share_a_step() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let alone = embed_alone(&mut e, &p, Pooling::Mean, p.len());
    let logits = logits_alone(&mut e, &p);
    let a: Vec<u32> = (0..8).collect();
    let b: Vec<u32> = (8..16).collect();
    let mut emb = seq_step(1, &p, 0, &a, true);
    emb.embed = Some(Pooling::Mean);
    let text = seq_step(2, &p, 0, &b, true);
    let done = e.step(&plan(1, vec![emb, text])).expect("step");
    assert_eq!(done.results.len(), 2, "one result each, in plan order");
    assert_eq!(done.results[0].seq, SeqId(1));
    let v = done.results[0].embedding.as_ref().expect("vector");
    assert!(max_diff(v, &alone) < 1e-5);
    assert!(done.results[1].embedding.is_none());
    let argmax = logits
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map(|(i, _)| i as u32);
    assert_eq!(Some(done.results[1].token), argmax);
}

#[test]
fn mean_chunks_out_of_order_are_refused() {
    let mut e = stories_cpu_engine();
    let p = cat_prompt(&e);
    let table: Vec<u32> = (0..8).collect();
    let mut first = seq_step(3, &p[..4], 0, &table, false);
    first.embed = Some(Pooling::Mean);
    e.step(&plan(1, vec![first])).expect("first chunk");
    // Position 6, though 4 tokens were pooled.
    let mut skip = seq_step(3, &p[6..], 6, &table, true);
    skip.embed = Some(Pooling::Mean);
    let err = e.step(&plan(2, vec![skip])).expect_err("a gap");
    assert!(
        matches!(&err.kind, EngineFaultKind::Internal(m) if m.contains("mean-pooled")),
        "{err:?}"
    );
    // A draft on an embedding is refused too.
    let mut drafted = seq_step(4, &p, 0, &table, true);
    drafted.embed = Some(Pooling::Last);
    drafted.draft = vec![p[0]];
    assert!(e.step(&plan(3, vec![drafted])).is_err());
    e.step(&StepPlan {
        step_id: 4,
        free: vec![SeqId(3)],
        ..Default::default()
    })
    .expect("free");
}
