//! Prefix caching: full blocks registered by content, taken by later
//! prompts that start with the same tokens, cached while no one holds them
//! and evicted least recently released first. The KV model of `fork_tests`
//! checks that every sequence reads exactly its own tokens' K/V, cached
//! blocks included.

use super::fork_tests::{done, ok, Kv, BS};
use super::*;
use crate::engine::{SamplingParams, SeqId, TokenId};

fn sched(num_blocks: u32) -> Scheduler {
    Scheduler::new(SchedConfig {
        block_size: BS,
        num_blocks,
        max_step_tokens: 512,
        max_running_seqs: 8,
        prefix_cache: true,
        draft: crate::DraftConfig::OFF,
        max_scored_rows: u32::MAX,
    })
}

fn prompt(n: u32, salt: TokenId) -> Vec<TokenId> {
    (0..n).map(|t| 100 + t + salt).collect()
}

/// Adds `seq` with `tokens` and runs steps until it has sampled `gen`
/// tokens; returns the plans' first start position.
fn run(s: &mut Scheduler, kv: &mut Kv, seq: SeqId, tokens: Vec<TokenId>, gen: usize) -> u32 {
    let len = tokens.len() as u32;
    s.add(
        seq,
        tokens,
        len + gen as u32 + 1,
        SamplingParams::greedy(),
        None,
    )
    .expect("admitted");
    let mut first = None;
    let mut sampled = 0;
    while sampled < gen {
        let plan = s.schedule().expect("a step");
        if let Some(step) = plan.seqs.iter().find(|p| p.seq == seq) {
            first.get_or_insert(step.start_pos);
        }
        kv.run(s, &plan);
        let d = done(&plan, 7 + sampled as TokenId);
        sampled += d.results.iter().filter(|r| r.seq == seq).count();
        s.on_step_done(&d);
        ok(s);
    }
    first.unwrap_or(0)
}

#[test]
fn a_second_prompt_with_the_same_prefix_starts_from_its_blocks() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let p = prompt(40, 0);
    assert_eq!(run(&mut s, &mut kv, SeqId(1), p.clone(), 3), 0);
    let a_table = s.block_table(SeqId(1)).expect("a").to_vec();
    s.remove(SeqId(1));
    ok(&s);
    let st = s.stats();
    assert_eq!(st.blocks_used, 0, "nothing held once it went");
    assert_eq!(st.blocks_cached, 2, "its two full blocks stay cached");
    // The same prompt again: two blocks from the cache, eight tokens computed.
    s.add(SeqId(2), p.clone(), 50, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("a step");
    let step = &plan.seqs[0];
    assert_eq!(step.start_pos, 2 * BS);
    assert_eq!(step.tokens, p[32..].to_vec());
    assert_eq!(step.cached_prefix, p[..32].to_vec());
    assert_eq!(&step.block_table[..2], &a_table[..2]);
    assert_eq!(s.cached_tokens(SeqId(2)), Some(32));
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 7));
    ok(&s);
    let next = s.schedule().expect("a decode");
    assert!(
        next.seqs[0].cached_prefix.is_empty(),
        "only the first plan carries it"
    );
}

#[test]
fn the_last_token_is_always_computed_and_a_different_token_ends_the_hit() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let p = prompt(32, 0);
    run(&mut s, &mut kv, SeqId(1), p.clone(), 1);
    s.remove(SeqId(1));
    // Two full blocks: the second holds the last token, which must be fed.
    assert_eq!(run(&mut s, &mut kv, SeqId(2), p.clone(), 1), BS);
    s.remove(SeqId(2));
    // A token changed in the second block: only the first one is reused.
    let mut q = p.clone();
    q[20] = 5;
    q.extend(prompt(10, 50));
    assert_eq!(run(&mut s, &mut kv, SeqId(3), q, 1), BS);
    // A token changed in the first: nothing is.
    let mut r = p.clone();
    r[0] = 6;
    assert_eq!(run(&mut s, &mut kv, SeqId(4), r, 1), 0);
    ok(&s);
}

#[test]
fn generated_tokens_fill_blocks_that_the_next_turn_reuses() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    // A turn: a 10-token prompt and 30 generated tokens (40: two full blocks).
    run(&mut s, &mut kv, SeqId(1), prompt(10, 0), 30);
    let mut next = s.tokens(SeqId(1)).expect("a").to_vec();
    s.remove(SeqId(1));
    next.extend(prompt(5, 90));
    // The next turn's prompt is the whole conversation so far and more.
    assert_eq!(run(&mut s, &mut kv, SeqId(2), next, 1), 2 * BS);
    ok(&s);
}

#[test]
fn live_sequences_share_cached_blocks_and_memory_pressure_evicts_the_oldest_first() {
    let mut s = sched(8);
    let mut kv = Kv::default();
    let p = prompt(33, 0);
    run(&mut s, &mut kv, SeqId(1), p.clone(), 1);
    // A second request with the same prompt while the first still runs:
    // the two full blocks are shared (held twice, used once).
    let used_by_one = s.stats().blocks_used;
    assert_eq!(run(&mut s, &mut kv, SeqId(2), p.clone(), 1), 2 * BS);
    assert_eq!(
        s.stats().blocks_used,
        used_by_one + 1,
        "one block of its own"
    );
    s.remove(SeqId(1));
    s.remove(SeqId(2));
    ok(&s);
    assert_eq!(s.stats().blocks_used, 0);
    assert_eq!(s.stats().blocks_cached, 2);
    // Another prompt fills the pool: its blocks come from the free ones
    // first, then from the cached ones, least recently released first.
    run(&mut s, &mut kv, SeqId(3), prompt(16 * 6 + 1, 7), 1);
    ok(&s);
    assert!(s.stats().blocks_cached < 2, "a cached block was evicted");
    s.remove(SeqId(3));
    // The evicted prefix is computed again, the same tokens from scratch.
    assert_eq!(run(&mut s, &mut kv, SeqId(4), p, 1), 0);
    ok(&s);
}

#[test]
fn a_failed_step_carries_the_cached_prefix_again() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let p = prompt(20, 0);
    run(&mut s, &mut kv, SeqId(1), p.clone(), 1);
    s.remove(SeqId(1));
    s.add(SeqId(2), p.clone(), 30, SamplingParams::greedy(), None)
        .expect("admitted");
    let plan = s.schedule().expect("a step");
    assert_eq!(plan.seqs[0].cached_prefix.len(), BS as usize);
    s.on_step_failed(
        plan.step_id,
        &crate::engine::EngineFaultKind::Internal("x".into()),
    );
    let again = s.schedule().expect("the retry");
    assert_eq!(again.seqs[0].cached_prefix, p[..BS as usize].to_vec());
    ok(&s);
}

#[test]
fn with_the_cache_off_nothing_is_kept_or_reused() {
    let mut s = Scheduler::new(SchedConfig {
        block_size: BS,
        num_blocks: 16,
        max_step_tokens: 512,
        max_running_seqs: 8,
        prefix_cache: false,
        draft: crate::DraftConfig::OFF,
        max_scored_rows: u32::MAX,
    });
    let mut kv = Kv::default();
    let p = prompt(40, 0);
    run(&mut s, &mut kv, SeqId(1), p.clone(), 1);
    s.remove(SeqId(1));
    assert_eq!(s.stats().blocks_cached, 0);
    assert_eq!(run(&mut s, &mut kv, SeqId(2), p, 1), 0);
}

/// The blocks a prompt takes from the cache may be held, when it is
/// admitted, only by idle sequences that give way to it: evicting them
/// turns its hits from shared blocks into cached ones, which it must take
/// back out of the available blocks. Making room for the count before the
/// eviction left it one block short, and the engine idle.
#[test]
fn a_hit_held_only_by_an_evicted_seq_is_counted_as_taken_back() {
    let mut s = sched(12);
    let mut kv = Kv::default();
    // Three idle sequences, oldest first: 2, 2 and 6 blocks (10 of 12).
    let a = prompt(BS, 0);
    for (seq, tokens) in [
        (SeqId(1), prompt(20, 1000)),
        (SeqId(2), a.clone()),
        (SeqId(3), prompt(90, 2000)),
    ] {
        run(&mut s, &mut kv, seq, tokens, 1);
        s.set_runnable(seq, false);
    }
    assert_eq!(s.stats().blocks_used, 10);
    // 11 blocks, the first of them seq 2's: evicting seq 3 then seq 2
    // leaves 10 available, one of them that hit, so seq 1 must go too.
    let c = add_eleven_blocks_after(&mut s, a);
    let plan = s.schedule().expect("the new seq is admitted");
    assert_eq!(plan.seqs.len(), 1);
    assert_eq!(plan.seqs[0].seq, SeqId(4));
    assert_eq!(plan.seqs[0].cached_prefix, c[..BS as usize].to_vec());
    assert_eq!(plan.seqs[0].block_table.len(), 11);
    for idle in [SeqId(1), SeqId(2), SeqId(3)] {
        assert!(s.is_waiting(idle), "{idle:?} gave way");
    }
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 7));
    ok(&s);
}

/// Adds seq 4: `first` (one block, a hit) then 149 fresh tokens, 11
/// blocks in all with its next token. Returns its prompt.
fn add_eleven_blocks_after(s: &mut Scheduler, first: Vec<u32>) -> Vec<u32> {
    let mut c = first;
    c.extend(prompt(149, 3000));
    let max_len = c.len() as u32 + 1;
    s.add(SeqId(4), c.clone(), max_len, SamplingParams::greedy(), None)
        .expect("fits the pool");
    c
}

/// When even every idle sequence's blocks would not make room (counting
/// its hits they hold as taken back), none of them is evicted for nothing.
#[test]
fn idle_seqs_are_not_evicted_when_all_of_them_would_not_make_room() {
    let mut s = sched(12);
    let mut kv = Kv::default();
    let a = prompt(BS, 0);
    // A runnable sequence (2 blocks), then two idle ones: 2 and 6 blocks.
    run(&mut s, &mut kv, SeqId(1), prompt(20, 1000), 1);
    for (seq, tokens) in [(SeqId(2), a.clone()), (SeqId(3), prompt(90, 2000))] {
        run(&mut s, &mut kv, seq, tokens, 1);
        s.set_runnable(seq, false);
    }
    assert_eq!(s.stats().blocks_used, 10);
    // 11 blocks, the first of them seq 2's: all of seq 2's and seq 3's
    // blocks and the 2 free ones make 10, one of them that hit.
    add_eleven_blocks_after(&mut s, a);
    let plan = s.schedule().expect("seq 1 decodes");
    assert!(plan.seqs.iter().all(|p| p.seq != SeqId(4)), "no room yet");
    for idle in [SeqId(2), SeqId(3)] {
        assert!(!s.is_waiting(idle), "{idle:?} kept its blocks");
    }
    kv.run(&s, &plan);
    s.on_step_done(&done(&plan, 7));
    ok(&s);
}

#[test]
fn an_embedding_computes_its_prompt_from_the_start_and_ends_with_its_vector() {
    let mut s = sched(16);
    let mut kv = Kv::default();
    let p = prompt(40, 0);
    run(&mut s, &mut kv, SeqId(1), p.clone(), 3);
    s.remove(SeqId(1));
    // The same prompt as an embedding: the cached blocks are there, but it
    // feeds every token from position 0, each plan naming its pooling.
    s.add(SeqId(2), p.clone(), 41, SamplingParams::greedy(), None)
        .expect("admitted");
    assert!(s.set_embed(SeqId(2), crate::engine::Pooling::Mean));
    let plan = s.schedule().expect("a step");
    let step = &plan.seqs[0];
    assert_eq!((step.start_pos, step.tokens.len()), (0, 40));
    assert!(step.cached_prefix.is_empty());
    assert_eq!(step.embed, Some(crate::engine::Pooling::Mean));
    assert!(step.sample);
    kv.run(&s, &plan);
    let mut d = done(&plan, 7);
    d.results[0].embedding = Some(vec![0.5; 4]);
    let out = s.on_step_done(&d);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].embedding.as_deref(), Some(&[0.5; 4][..]));
    assert_eq!(
        s.tokens(SeqId(2)).map(<[TokenId]>::len),
        Some(40),
        "a vector adds no token"
    );
    // Done: its owner removes it (the Host does, as the vector is delivered).
    s.remove(SeqId(2));
    ok(&s);
    assert!(!s.set_embed(SeqId(99), crate::engine::Pooling::Last));
}

#[test]
fn a_scored_prompt_starts_from_0_in_chunks_of_the_scored_rows_a_step_has() {
    let mut s = Scheduler::new(SchedConfig {
        max_scored_rows: 5,
        ..*sched(16).config()
    });
    let mut kv = Kv::default();
    let p = prompt(40, 0);
    run(&mut s, &mut kv, SeqId(1), p[..21].to_vec(), 2);
    s.remove(SeqId(1));
    // Scored: its first 16 tokens are cached, but it feeds from position 0,
    // five rows a step, beside a plain prompt fed whole; its last chunk
    // takes one token more (the last token's row is the sample's).
    // Generated tokens start after the prompt, as the Host sets it.
    let sampling = SamplingParams {
        generated_from: 21,
        ..SamplingParams::greedy()
    };
    s.add(SeqId(2), p[..21].to_vec(), 30, sampling, None)
        .expect("admitted");
    assert!(s.set_prompt_logprobs(SeqId(2), 1));
    s.add(
        SeqId(3),
        prompt(12, 500),
        20,
        SamplingParams::greedy(),
        None,
    )
    .expect("admitted");
    let mut fed = Vec::new();
    for id in 0..6 {
        let plan = s.schedule().expect("a step");
        kv.run(&s, &plan);
        for step in &plan.seqs {
            if step.seq == SeqId(2) {
                assert!(step.cached_prefix.is_empty() && step.draft.is_empty());
                assert_eq!(step.prompt_logprobs.is_some(), step.start_pos < 21);
                fed.push((step.start_pos, step.tokens.len()));
            } else if step.start_pos == 0 {
                assert_eq!(step.tokens.len(), 12, "a plain prompt is fed whole");
                assert_eq!(step.prompt_logprobs, None);
            }
        }
        s.on_step_done(&done(&plan, 7 + id));
    }
    assert_eq!(fed[..5], [(0, 5), (5, 5), (10, 5), (15, 6), (21, 1)]);
    ok(&s);
    assert!(!s.set_prompt_logprobs(SeqId(99), 1));
}
