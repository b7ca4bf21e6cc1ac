//! Speculative decoding in the scheduler: which decodes carry a draft and
//! how long, what a drafted step's results do to tokens, computed counts
//! and blocks, and how a generation that ends inside them is cut back.

use super::fork_tests::ok;
use super::scheduler::DraftTally;
use super::*;
use crate::engine::{SamplingParams, SeqId, SeqResult, StepDone, StepPlan, TokenId};
use crate::testing::{ScriptEngine, BYTE_VOCAB};

const BS: u32 = 4;

fn drafting(num_blocks: u32, max_tokens: u32, max_seqs: u32) -> Scheduler {
    Scheduler::new(SchedConfig {
        block_size: BS,
        num_blocks,
        max_step_tokens: 64,
        max_running_seqs: 8,
        prefix_cache: true,
        draft: DraftConfig {
            max_tokens,
            ngram_min: 1,
            ngram_max: 3,
            max_seqs,
        },
        max_scored_rows: u32::MAX,
    })
}

/// Adds `seq` with `prompt`, allowed to be drafted for.
fn add(s: &mut Scheduler, seq: u64, prompt: &[TokenId], max_len: u32) -> SeqId {
    let id = SeqId(seq);
    let sampling = SamplingParams {
        generated_from: prompt.len() as u32,
        ..SamplingParams::greedy()
    };
    s.add(id, prompt.to_vec(), max_len, sampling, None)
        .expect("admitted");
    s.allow_draft(id);
    id
}

/// The step's results: for each sampled sequence, `answer[i]` after its
/// `i`-th fed position, through the first that differs from its draft (the
/// engine's rule), as a real engine whose samples are `answer` would give.
fn answer(plan: &StepPlan, answer: &[TokenId]) -> StepDone {
    let mut results = Vec::new();
    for s in plan.seqs.iter().filter(|s| s.sample) {
        for (i, &t) in answer.iter().enumerate() {
            results.push(SeqResult {
                seq: s.seq,
                token: t,
                logprobs: None,
                embedding: None,
                prompt_logprobs: None,
            });
            if s.draft.get(i) != Some(&t) {
                break;
            }
        }
    }
    StepDone {
        step_id: plan.step_id,
        results,
    }
}

/// A prompt that, with a first sampled token of 12, ends in "10 11 12",
/// which began it, followed by 13 14 20 10 11 12.
const PROMPT: [TokenId; 8] = [10, 11, 12, 13, 14, 20, 10, 11];

/// Adds and prefills `PROMPT` for `seq`, sampling 12: 9 tokens, 8 computed.
fn prefilled(s: &mut Scheduler, seq: u64, max_len: u32) -> SeqId {
    let id = add(s, seq, &PROMPT, max_len);
    let plan = s.schedule().expect("prefill");
    assert!(
        plan.seqs.iter().all(|q| q.draft.is_empty()),
        "no draft in prefill"
    );
    s.on_step_done(&answer(&plan, &[12]));
    ok(s);
    id
}

fn blocks(s: &Scheduler, id: SeqId) -> usize {
    s.block_table(id).map_or(0, <[_]>::len)
}

#[test]
fn a_decode_whose_last_tokens_occurred_before_carries_what_followed_them() {
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    assert_eq!(blocks(&s, a), 3);
    let plan = s.schedule().expect("decode");
    ok(&s);
    let step = &plan.seqs[0];
    assert_eq!((step.tokens.as_slice(), step.start_pos), (&[12][..], 8));
    assert_eq!(step.draft, vec![13, 14, 20, 10]);
    // Positions 8..=12: a fourth block for the draft's last position.
    assert_eq!(step.block_table.len(), 4);
    assert_eq!(blocks(&s, a), 4);
}

#[test]
fn confirmed_draft_tokens_count_as_computed_and_the_step_yields_one_more() {
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    let plan = s.schedule().expect("decode");
    let out = s.on_step_done(&answer(&plan, &[13, 14, 20, 10, 99]));
    ok(&s);
    let got: Vec<TokenId> = out.iter().map(|r| r.token).collect();
    assert_eq!(got, vec![13, 14, 20, 10, 99]);
    assert_eq!(s.tokens(a).map(<[_]>::len), Some(14));
    assert_eq!(
        s.take_draft_tally(),
        DraftTally {
            drafted: 4,
            confirmed: 4
        }
    );
    assert_eq!(s.take_draft_tally(), DraftTally::default(), "taken once");
    let next = s.schedule().expect("decode");
    assert_eq!(
        (next.seqs[0].tokens.as_slice(), next.seqs[0].start_pos),
        (&[99][..], 13)
    );
}

#[test]
fn a_refused_draft_token_ends_the_results_and_its_blocks_go_back() {
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    let plan = s.schedule().expect("decode");
    assert_eq!(s.stats().blocks_used, 4);
    // 13 confirmed, then 77 where the draft said 14: two tokens.
    let out = s.on_step_done(&answer(&plan, &[13, 77, 5, 5]));
    ok(&s);
    assert_eq!(
        out.iter().map(|r| r.token).collect::<Vec<_>>(),
        vec![13, 77]
    );
    assert_eq!(s.tokens(a).map(<[_]>::len), Some(11));
    assert_eq!(s.take_draft_tally().confirmed, 1);
    // 11 tokens, the next at position 10: three blocks hold them.
    assert_eq!((blocks(&s, a), s.stats().blocks_used), (3, 3));
    let next = s.schedule().expect("decode");
    assert_eq!(
        (next.seqs[0].tokens.as_slice(), next.seqs[0].start_pos),
        (&[77][..], 10)
    );
}

#[test]
fn a_refused_guess_shortens_the_next_draft_and_a_confirmed_one_lengthens_it() {
    let mut s = drafting(16, 8, 4);
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2];
    let id = add(&mut s, 1, &prompt, 60);
    let plan = s.schedule().expect("prefill");
    s.on_step_done(&answer(&plan, &[3]));
    let plan = s.schedule().expect("decode");
    assert_eq!(plan.seqs[0].draft, vec![4, 5, 6, 7, 8, 1, 2, 3], "the most");
    // Two confirmed, then 1 where the draft said 6: three at most next.
    s.on_step_done(&answer(&plan, &[4, 5, 1]));
    let plan = s.schedule().expect("decode");
    assert_eq!(
        plan.seqs[0].draft,
        vec![2, 3, 4],
        "one past what was confirmed"
    );
    // All three confirmed: six at most, five known after the "3 4 5" before.
    s.on_step_done(&answer(&plan, &[2, 3, 4, 5]));
    let plan = s.schedule().expect("decode");
    assert_eq!(plan.seqs[0].draft, vec![1, 2, 3, 4, 5]);
    assert_eq!(s.tokens(id).map(<[_]>::len), Some(18));
}

#[test]
fn an_engine_that_ignores_the_draft_confirms_none_of_it() {
    // One result, equal to the first draft token: the engine did not feed
    // the draft, so that token is still to compute.
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    let plan = s.schedule().expect("decode");
    let one = StepDone {
        step_id: plan.step_id,
        results: vec![SeqResult {
            seq: a,
            token: 13,
            logprobs: None,
            embedding: None,
            prompt_logprobs: None,
        }],
    };
    assert_eq!(s.on_step_done(&one).len(), 1);
    ok(&s);
    assert_eq!(s.take_draft_tally().confirmed, 0);
    let next = s.schedule().expect("decode");
    assert_eq!(
        (next.seqs[0].tokens.as_slice(), next.seqs[0].start_pos),
        (&[13][..], 9)
    );
}

#[test]
fn drafts_stay_within_the_length_the_budget_and_the_free_blocks() {
    // The longest length: 9 tokens of at most 11 leave one draft token (the
    // step may yield two).
    let mut s = drafting(16, 4, 4);
    prefilled(&mut s, 1, 11);
    assert_eq!(s.schedule().expect("decode").seqs[0].draft, vec![13]);

    // The step's token budget: 3 tokens, one of them the decode's own.
    let mut s = Scheduler::new(SchedConfig {
        max_step_tokens: 3,
        ..*drafting(16, 4, 4).config()
    });
    let a = add(&mut s, 1, &PROMPT, 40);
    for _ in 0..3 {
        let plan = s.schedule().expect("prefill chunk");
        s.on_step_done(&answer(&plan, &[12]));
    }
    assert_eq!(s.tokens(a).map(<[_]>::len), Some(9));
    assert_eq!(s.schedule().expect("decode").seqs[0].draft, vec![13, 14]);

    // A pool of five blocks, three its own and two another's: positions
    // 8..=11 only, nothing taken from the other.
    let mut s = drafting(5, 4, 4);
    let a = add(&mut s, 1, &PROMPT, 20);
    s.add(SeqId(2), vec![3; 5], 8, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("prefill");
    s.on_step_done(&answer(&plan, &[12]));
    assert_eq!(s.stats().blocks_used, 5);
    let plan = s.schedule().expect("decode");
    let step = plan.seqs.iter().find(|q| q.seq == a).expect("planned");
    assert_eq!(step.draft, vec![13, 14, 20]);
    assert_eq!(s.stats().blocks_used, 5);
    ok(&s);
}

#[test]
fn no_draft_for_a_constrained_sequence() {
    // A prompt that holds the grammar's first token `t` after "1 2", so
    // that sampling `t` makes "1 2 t" recur: drafted for unless constrained.
    let first_allowed = {
        let mut s = drafting(16, 4, 4);
        let id = add(&mut s, 9, &[1], 40);
        s.set_constraint(id, super::constrained_tests::digits(3), BYTE_VOCAB);
        let plan = s.schedule().expect("prefill");
        let mask = plan.seqs[0].allowed.clone().expect("a mask");
        (0..BYTE_VOCAB)
            .find(|&t| mask.allows(t))
            .expect("some token")
    };
    let prompt = [1, 2, first_allowed, 30, 31, 1, 2];
    for constrained in [false, true] {
        let mut s = drafting(16, 4, 4);
        let id = add(&mut s, 1, &prompt, 40);
        if constrained {
            s.set_constraint(id, super::constrained_tests::digits(3), BYTE_VOCAB);
        }
        let plan = s.schedule().expect("prefill");
        s.on_step_done(&answer(&plan, &[first_allowed]));
        assert!(s.take_constraint_failures().is_empty());
        let plan = s.schedule().expect("decode");
        let want: &[TokenId] = if constrained { &[] } else { &[30, 31, 1, 2] };
        assert_eq!(plan.seqs[0].draft, want, "constrained: {constrained}");
    }
}

#[test]
fn a_reasoning_budget_lets_drafts_through_as_far_as_it_leaves_every_token_free() {
    use crate::constraint::Constraint;
    use crate::reasoning_gate::{ReasoningGate, TagTokens};
    // Tags no test token uses; the template opened the reasoning, so the
    // first sampled token (12) is the reasoning's first. Its draft is
    // 13 14 20 10 unconstrained.
    const CLOSE: TokenId = 201;
    let tags = TagTokens {
        open: Some(200),
        close: CLOSE,
    };
    let gated = |budget: Option<u32>, grammar: bool| {
        let grammar = grammar.then(|| super::constrained_tests::digits(3));
        let gate = ReasoningGate::new(grammar, tags, true).with_budget(budget);
        Constraint::new(Box::new(gate))
    };
    let cases: [(Option<u32>, bool, &[TokenId]); 5] = [
        (None, false, &[13, 14, 20, 10]),
        (Some(100), false, &[13, 14, 20, 10]),
        // One thought; two more are free, so one guess and the sample after it.
        (Some(3), false, &[13]),
        (Some(2), false, &[]),
        // Behind a grammar any token may hand over to it.
        (Some(100), true, &[]),
    ];
    for (budget, grammar, want) in cases {
        let mut s = drafting(16, 4, 4);
        let id = add(&mut s, 1, &PROMPT, 40);
        s.set_constraint(id, gated(budget, grammar), BYTE_VOCAB);
        let plan = s.schedule().expect("prefill");
        assert_eq!(plan.seqs[0].allowed, None, "thinking is free");
        s.on_step_done(&answer(&plan, &[12]));
        let plan = s.schedule().expect("decode");
        assert_eq!(
            plan.seqs[0].draft, want,
            "budget {budget:?}, grammar {grammar}"
        );
        assert_eq!(plan.seqs[0].allowed, None, "no mask while free");
        // The budget of 3, its guess confirmed and one token more: spent,
        // so the next step forces the close tag and guesses nothing.
        if budget == Some(3) {
            s.on_step_done(&answer(&plan, &[13, 14]));
            assert!(s.take_constraint_failures().is_empty());
            let plan = s.schedule().expect("decode");
            let mask = plan.seqs[0].allowed.clone().expect("the close tag alone");
            assert!(mask.allows(CLOSE) && mask.count() == 1);
            assert!(plan.seqs[0].draft.is_empty());
        }
    }
}

/// A constraint that says every token is free but refuses `refused`: a
/// `free_tokens` that over-reports.
#[derive(Clone)]
struct Overclaims {
    refused: TokenId,
}

impl crate::constraint::TokenConstraint for Overclaims {
    fn fill_mask(&mut self, mask: &mut crate::constraint::TokenMask) -> Result<(), String> {
        mask.words_mut().fill(u32::MAX);
        mask.trim();
        Ok(())
    }

    fn advance(&mut self, token: TokenId) -> Result<(), String> {
        match token == self.refused {
            true => Err("refused".into()),
            false => Ok(()),
        }
    }

    fn unconstrained(&self) -> bool {
        true
    }

    fn free_tokens(&self) -> u32 {
        u32::MAX
    }

    fn boxed_clone(&self) -> Box<dyn crate::constraint::TokenConstraint> {
        Box::new(self.clone())
    }
}

#[test]
fn a_drafted_token_the_constraint_refuses_fails_the_sequence_and_reaches_no_one() {
    use crate::constraint::Constraint;
    let mut s = drafting(16, 4, 4);
    let id = add(&mut s, 1, &PROMPT, 40);
    s.set_constraint(
        id,
        Constraint::new(Box::new(Overclaims { refused: 14 })),
        BYTE_VOCAB,
    );
    let plan = s.schedule().expect("prefill");
    s.on_step_done(&answer(&plan, &[12]));
    let plan = s.schedule().expect("decode");
    assert_eq!(plan.seqs[0].draft, vec![13, 14, 20, 10]);
    let results = s.on_step_done(&answer(&plan, &[13, 14, 20]));
    assert!(results.iter().all(|r| r.seq != id), "{results:?}");
    let failures = s.take_constraint_failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, id);
}

#[test]
fn no_draft_for_an_unallowed_sequence_or_a_large_batch() {
    let mut s = drafting(16, 4, 4);
    let id = SeqId(1);
    s.add(id, PROMPT.to_vec(), 40, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("prefill");
    s.on_step_done(&answer(&plan, &[12]));
    assert!(
        s.schedule().expect("decode").seqs[0].draft.is_empty(),
        "not allowed"
    );

    // Two decoding sequences, drafting for at most one.
    let mut s = drafting(32, 4, 1);
    add(&mut s, 1, &PROMPT, 40);
    add(&mut s, 2, &PROMPT, 40);
    let plan = s.schedule().expect("prefill");
    s.on_step_done(&answer(&plan, &[12]));
    let plan = s.schedule().expect("decode");
    assert_eq!(plan.seqs.len(), 2);
    assert!(plan.seqs.iter().all(|q| q.draft.is_empty()));
}

#[test]
fn a_failed_step_gives_back_the_draft_blocks() {
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    let plan = s.schedule().expect("decode");
    assert_eq!(blocks(&s, a), 4);
    s.on_step_failed(plan.step_id, &crate::EngineFaultKind::Internal("x".into()));
    ok(&s);
    assert_eq!((blocks(&s, a), s.stats().blocks_used), (3, 3));
    assert_eq!(s.take_draft_tally(), DraftTally::default());
    let again = s.schedule().expect("retried");
    assert_eq!(again.seqs[0].draft, vec![13, 14, 20, 10]);
}

#[test]
fn a_generation_that_ends_inside_a_drafted_step_is_cut_back_and_parks_there() {
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    let plan = s.schedule().expect("decode");
    s.on_step_done(&answer(&plan, &[13, 14, 20, 10, 99]));
    // Its generation ended at 14 (a stop string, say): 11 tokens stay.
    s.truncate(a, 11);
    ok(&s);
    let kept: Vec<TokenId> = PROMPT.iter().copied().chain([12, 13, 14]).collect();
    assert_eq!(s.tokens(a), Some(&kept[..]));
    assert_eq!(blocks(&s, a), 3);
    // Never below one token, never longer.
    s.truncate(a, 0);
    s.truncate(a, 30);
    assert_eq!(s.tokens(a).map(<[_]>::len), Some(11));
    assert!(s.park(a));
    let b = SeqId(2);
    assert!(s.unpark(a, b, 30, SamplingParams::greedy(), None));
    ok(&s);
    let next = s.schedule().expect("continuation");
    let step = next.seqs.iter().find(|q| q.seq == b).expect("planned");
    assert_eq!((step.tokens.as_slice(), step.start_pos), (&[14][..], 10));
}

#[test]
fn blocks_a_confirmed_draft_filled_are_cached_when_the_sequence_ends() {
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    let plan = s.schedule().expect("decode");
    s.on_step_done(&answer(&plan, &[13, 14, 20, 10, 99]));
    // 13 computed: blocks 0..3 full, the last two filled by the draft.
    let tokens = s.tokens(a).expect("live").to_vec();
    s.remove(a);
    ok(&s);
    let b = SeqId(2);
    s.add(b, tokens, 40, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("admitted onto the cache");
    assert_eq!(plan.seqs[0].start_pos, 12, "three cached blocks");
    ok(&s);
}

#[test]
fn drafting_yields_the_same_tokens_in_fewer_steps() {
    // The script engine samples by position, so a generation is the same
    // with or without drafts; its output repeats the script, so prompt
    // lookup finds the continuation once the script came round.
    let run = |draft: u32| {
        let mut s = drafting(64, draft, 4);
        let mut engine = ScriptEngine::new("one two three, one two four; ");
        let id = add(&mut s, 1, &[5, 6, 7], 3 + 150);
        let mut steps = 0;
        while let Some(plan) = s.schedule() {
            steps += 1;
            let done = engine.step(&plan);
            s.on_step_done(&done);
            ok(&s);
            if s.tokens(id).map_or(0, <[_]>::len) >= 3 + 150 {
                break;
            }
        }
        (s.tokens(id).expect("live").to_vec(), steps)
    };
    let (plain, plain_steps) = run(0);
    let (drafted, drafted_steps) = run(6);
    assert_eq!(drafted[..153], plain[..153]);
    assert!(
        drafted_steps * 2 < plain_steps,
        "{drafted_steps} steps with drafts, {plain_steps} without"
    );
}

#[test]
fn guesses_take_only_what_decodes_chunks_and_admissions_leave() {
    // Four blocks: three the drafter's, one free, which the waiting
    // sequence's admission needs. Its guess gets the positions its own
    // blocks hold, not the free block.
    let mut s = drafting(4, 4, 4);
    let a = prefilled(&mut s, 1, 16);
    let c = SeqId(3);
    s.add(c, vec![3; 3], 4, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("decode and admission");
    ok(&s);
    let step = |id| plan.seqs.iter().find(|q| q.seq == id).expect("planned");
    assert_eq!(step(c).start_pos, 0, "admitted");
    assert_eq!(step(a).draft, vec![13, 14, 20], "positions 8..=11 only");

    // The token budget left over is shared evenly: 6 tokens, two decodes,
    // two guesses each.
    let mut s = Scheduler::new(SchedConfig {
        max_step_tokens: 6,
        ..*drafting(32, 4, 4).config()
    });
    let ids = [add(&mut s, 1, &PROMPT, 40), add(&mut s, 2, &PROMPT, 40)];
    let len = |s: &Scheduler, id| s.tokens(id).map_or(0, <[_]>::len);
    // Prefill both in chunks of the budget; a decode planned meanwhile gets
    // no result (it is fed again), so both end with 12 after the prompt.
    while ids.iter().any(|&id| len(&s, id) < 9) {
        let plan = s.schedule().expect("prefill");
        let results = plan
            .seqs
            .iter()
            .filter(|q| q.sample && len(&s, q.seq) < 9)
            .map(|q| SeqResult {
                seq: q.seq,
                token: 12,
                logprobs: None,
                embedding: None,
                prompt_logprobs: None,
            })
            .collect();
        s.on_step_done(&StepDone {
            step_id: plan.step_id,
            results,
        });
        ok(&s);
    }
    let plan = s.schedule().expect("two decodes");
    let drafts: Vec<Vec<TokenId>> = plan.seqs.iter().map(|q| q.draft.clone()).collect();
    assert_eq!(drafts, vec![vec![13, 14], vec![13, 14]]);
}

#[test]
fn a_lone_drafted_step_out_of_memory_runs_again_without_guesses() {
    let mut s = drafting(16, 4, 4);
    let a = prefilled(&mut s, 1, 40);
    let plan = s.schedule().expect("decode");
    assert!(!plan.seqs[0].draft.is_empty());
    let failed = s.on_step_failed(plan.step_id, &crate::EngineFaultKind::OutOfMemory);
    ok(&s);
    assert!(
        failed.is_empty(),
        "not failed: its guesses may be what did not fit"
    );
    let again = s.schedule().expect("retried");
    assert_eq!(again.seqs[0].seq, a);
    assert_eq!((again.seqs[0].start_pos, again.seqs[0].draft.len()), (8, 0));
    // Undrafted, the same failure is the sequence's own.
    let failed = s.on_step_failed(again.step_id, &crate::EngineFaultKind::OutOfMemory);
    assert_eq!(failed, vec![a]);
}
