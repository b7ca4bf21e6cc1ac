//! Constrained sequences in the scheduler: masks ride only on the steps
//! that sample, follow the tokens fed back, are copied by forks, and a
//! refused token fails the sequence instead of being returned.

use super::fork_tests::{done, sched};
use crate::constraint::Constraint;
use crate::engine::{SamplingParams, SeqId, StepPlan, TokenId};
use crate::testing::{DigitsCodec, BYTE_EOS, BYTE_OFFSET, BYTE_VOCAB};
use crate::text::TextCodec;
use crate::Grammar;

pub(super) fn digits(n: usize) -> Constraint {
    let c = DigitsCodec::new(n)
        .constrain(&Grammar::JsonObject)
        .expect("compiles");
    Constraint::new(c)
}

fn digit(d: u8) -> TokenId {
    (b'0' + d) as TokenId + BYTE_OFFSET
}

fn add(s: &mut super::Scheduler, id: u64, prompt_len: u32) {
    let sampling = SamplingParams {
        generated_from: prompt_len,
        ..SamplingParams::greedy()
    };
    s.add(
        SeqId(id),
        vec![100; prompt_len as usize],
        prompt_len + 8,
        sampling,
        None,
    )
    .expect("admits");
}

fn allowed_of(plan: &StepPlan, id: u64) -> Option<Vec<TokenId>> {
    let step = plan.seqs.iter().find(|s| s.seq == SeqId(id))?;
    let m = step.allowed.as_deref()?;
    Some((0..BYTE_VOCAB).filter(|&t| m.allows(t)).collect())
}

#[test]
fn only_the_sampling_chunk_carries_the_mask_and_it_follows_the_tokens() {
    let mut s = sched(64);
    add(&mut s, 1, 600);
    assert!(s.set_constraint(SeqId(1), digits(2), BYTE_VOCAB));
    // A 600-token prompt needs two chunks of 512: only the last samples.
    let first = s.schedule().expect("plan");
    assert!(!first.seqs[0].sample);
    assert_eq!(allowed_of(&first, 1), None);
    s.on_step_done(&done(&first, 0));
    let second = s.schedule().expect("plan");
    assert!(second.seqs[0].sample);
    let ten: Vec<TokenId> = (0..10).map(digit).collect();
    assert_eq!(allowed_of(&second, 1), Some(ten.clone()));
    let out = s.on_step_done(&done(&second, digit(7)));
    assert_eq!(out.len(), 1);
    let third = s.schedule().expect("plan");
    assert_eq!(allowed_of(&third, 1), Some(ten));
    s.on_step_done(&done(&third, digit(1)));
    let fourth = s.schedule().expect("plan");
    assert_eq!(allowed_of(&fourth, 1), Some(vec![BYTE_EOS]));
    assert!(s.take_constraint_failures().is_empty());
}

#[test]
fn a_refused_token_is_reported_not_returned() {
    let mut s = sched(16);
    add(&mut s, 1, 4);
    add(&mut s, 2, 4);
    s.set_constraint(SeqId(1), digits(2), BYTE_VOCAB);
    let plan = s.schedule().expect("plan");
    // Seq 2 is unconstrained: no mask, and any token is taken.
    assert_eq!(allowed_of(&plan, 2), None);
    let letter = b'x' as TokenId + BYTE_OFFSET;
    let out = s.on_step_done(&done(&plan, letter));
    assert_eq!(out.iter().map(|r| r.seq).collect::<Vec<_>>(), [SeqId(2)]);
    let failures = s.take_constraint_failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, SeqId(1));
    assert!(failures[0].1.contains(&letter.to_string()), "{failures:?}");
    assert!(s.take_constraint_failures().is_empty(), "drained");
}

#[test]
fn a_fork_continues_from_its_parents_grammar_state() {
    let mut s = sched(16);
    add(&mut s, 1, 4);
    s.set_constraint(SeqId(1), digits(2), BYTE_VOCAB);
    let plan = s.schedule().expect("plan");
    s.on_step_done(&done(&plan, digit(3)));
    assert!(s.fork(SeqId(1), SeqId(2)));
    let plan = s.schedule().expect("plan");
    s.on_step_done(&done(&plan, digit(4)));
    let plan = s.schedule().expect("plan");
    // Both took two digits: the end is all either may pick.
    assert_eq!(allowed_of(&plan, 1), Some(vec![BYTE_EOS]));
    assert_eq!(allowed_of(&plan, 2), Some(vec![BYTE_EOS]));
}

#[test]
fn a_constraint_set_late_takes_the_tokens_already_generated() {
    let mut s = sched(16);
    // Generated tokens after the prompt's 3: one digit already there.
    let sampling = SamplingParams {
        generated_from: 3,
        ..SamplingParams::greedy()
    };
    s.add(SeqId(1), vec![100, 100, 100, digit(5)], 12, sampling, None)
        .expect("admits");
    s.set_constraint(SeqId(1), digits(1), BYTE_VOCAB);
    let plan = s.schedule().expect("plan");
    assert_eq!(allowed_of(&plan, 1), Some(vec![BYTE_EOS]));
}

#[test]
fn a_grammar_held_back_while_the_model_reasons_sends_no_mask_until_the_close_tag() {
    use crate::reasoning_gate::{ReasoningGate, TagTokens};
    // Bytes 1 and 2 stand for the tags (as `DigitsCodec::thinking` has them).
    let (open, close) = (1 + BYTE_OFFSET, 2 + BYTE_OFFSET);
    let tags = TagTokens {
        open: Some(open),
        close,
    };
    let mut s = sched(16);
    add(&mut s, 1, 4);
    s.set_constraint(
        SeqId(1),
        Constraint::new(Box::new(ReasoningGate::new(Some(digits(1)), tags, false))),
        BYTE_VOCAB,
    );
    // The first token: the open tag or the grammar's first.
    let plan = s.schedule().expect("plan");
    let mut first: Vec<TokenId> = (0..10).map(digit).collect();
    first.insert(0, open);
    assert_eq!(allowed_of(&plan, 1), Some(first));
    s.on_step_done(&done(&plan, open));
    // Thinking: no mask at all, so an engine samples as it would without
    // a grammar (the wgpu engine on the device).
    let letter = b'x' as TokenId + BYTE_OFFSET;
    for token in [letter, letter, close] {
        let plan = s.schedule().expect("plan");
        assert_eq!(allowed_of(&plan, 1), None);
        s.on_step_done(&done(&plan, token));
    }
    let plan = s.schedule().expect("plan");
    assert_eq!(allowed_of(&plan, 1), Some((0..10).map(digit).collect()));
    assert!(s.take_constraint_failures().is_empty());
}
