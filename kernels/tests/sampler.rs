//! The sampler: greedy, top-k, top-p, repetition penalty, seeding and logprobs.

use proptest::prelude::*;
use tokenwire_core::rng::Rng;
use tokenwire_core::SamplingParams;
use tokenwire_kernels::{log_softmax, sample};

fn random_logits(seed: u64, n: usize, spread: f32) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n)
        .map(|_| (r.next_f64() as f32 * 2.0 - 1.0) * spread)
        .collect()
}

fn argmax(x: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[b] {
            b = i;
        }
    }
    b as u32
}

fn params(temperature: f32, top_k: u32, top_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p,
        top_k,
        repetition_penalty: 1.0,
        seed,
        ..SamplingParams::default()
    }
}

#[test]
fn a_subnormal_temperature_is_greedy() {
    // x / 1e-40 overflows every logit; the limit of a tiny temperature is
    // the argmax, and every backend must agree on it.
    for seed in 0..20 {
        let l = random_logits(seed, 300, 4.0);
        for t in [1e-40f32, f32::MIN_POSITIVE / 2.0] {
            let (tok, _) = sample(&l, &params(t, 0, 0.9, seed), 5, &[], None);
            assert_eq!(tok, argmax(&l), "temperature {t:e}");
        }
    }
    assert!(tokenwire_kernels::sampler::is_greedy(1e-40));
    assert!(!tokenwire_kernels::sampler::is_greedy(f32::MIN_POSITIVE));
}

#[test]
fn temperature_zero_is_greedy_with_ties_to_lowest_id() {
    for seed in 0..20 {
        let l = random_logits(seed, 300, 4.0);
        let (t, _) = sample(&l, &SamplingParams::greedy(), 5, &[], None);
        assert_eq!(t, argmax(&l));
    }
    let (t, _) = sample(
        &[1.0, 3.0, 3.0, 0.0],
        &SamplingParams::greedy(),
        0,
        &[],
        None,
    );
    assert_eq!(t, 1);
    let (t, _) = sample(
        &[f32::NAN, 0.5, 0.2],
        &SamplingParams::greedy(),
        0,
        &[],
        None,
    );
    assert_eq!(t, 1, "NaN never wins");
}

#[test]
fn top_k_one_is_argmax() {
    for seed in 0..50 {
        let l = random_logits(seed, 100, 1.0);
        let (t, _) = sample(&l, &params(1.5, 1, 1.0, seed), seed as u32, &[], None);
        assert_eq!(t, argmax(&l));
    }
}

#[test]
fn tiny_top_p_is_argmax() {
    for seed in 0..50 {
        let l = random_logits(seed + 100, 100, 1.0);
        let (t, _) = sample(&l, &params(1.0, 0, 1e-6, seed), 3, &[], None);
        assert_eq!(t, argmax(&l));
    }
}

#[test]
fn same_seed_and_position_same_token_and_seeds_differ() {
    let l = random_logits(7, 64, 0.5);
    let p = params(1.0, 0, 1.0, 1234);
    let first = sample(&l, &p, 17, &[], None).0;
    for _ in 0..10 {
        assert_eq!(sample(&l, &p, 17, &[], None).0, first);
    }
    let by_seed: std::collections::HashSet<u32> = (0..64)
        .map(|s| sample(&l, &params(1.0, 0, 1.0, s), 17, &[], None).0)
        .collect();
    assert!(by_seed.len() > 5, "seeds should spread: {by_seed:?}");
    let by_pos: std::collections::HashSet<u32> = (0..64)
        .map(|pos| sample(&l, &p, pos, &[], None).0)
        .collect();
    assert!(by_pos.len() > 5, "positions should spread: {by_pos:?}");
}

#[test]
fn top_k_and_top_p_restrict_the_draw() {
    let l = [5.0, 4.9, 4.8, 0.0, -1.0, -2.0];
    for seed in 0..200 {
        let (t, _) = sample(&l, &params(1.0, 2, 1.0, seed), 0, &[], None);
        assert!(t < 2, "top_k 2 drew {t}");
        // Masses about 0.36, 0.33, 0.30, ...: top_p 0.5 keeps the first two.
        let (t, _) = sample(&l, &params(1.0, 0, 0.5, seed), 0, &[], None);
        assert!(t < 2, "top_p 0.5 drew {t}");
    }
    let seen: std::collections::HashSet<u32> = (0..200)
        .map(|s| sample(&l, &params(1.0, 3, 1.0, s), 0, &[], None).0)
        .collect();
    assert_eq!(seen.len(), 3);
}

#[test]
fn repetition_penalty_changes_the_choice() {
    let l = [2.0, 1.9, -1.0, -1.2];
    let mut p = SamplingParams::greedy();
    assert_eq!(sample(&l, &p, 0, &[0, 0, 3], None).0, 0);
    p.repetition_penalty = 1.5;
    // 2.0 / 1.5 = 1.33 < 1.9: token 1 now wins; a repeated id counts once.
    assert_eq!(sample(&l, &p, 0, &[0, 0, 0], None).0, 1);
    // Negative logits are multiplied: -1.0 * 2 = -2.0 < -1.2.
    let l2 = [-1.0, -1.2];
    p.repetition_penalty = 2.0;
    assert_eq!(sample(&l2, &p, 0, &[0], None).0, 1);
    // Out-of-vocabulary history ids are ignored.
    assert_eq!(sample(&l2, &p, 0, &[7, 9], None).0, 0);
}

#[test]
fn logprobs_are_log_softmax_before_temperature() {
    let l = random_logits(3, 200, 3.0);
    let full = log_softmax(&l);
    let total: f64 = full.iter().map(|&x| (x as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-5, "sum {total}");

    let (t, lp) = sample(&l, &params(0.7, 0, 1.0, 9), 4, &[], Some(5));
    let lp = lp.expect("asked for logprobs");
    assert!((lp.logprob - full[t as usize]).abs() < 1e-6);
    assert_eq!(lp.top.len(), 5);
    assert_eq!(lp.top[0].0, argmax(&l));
    for w in lp.top.windows(2) {
        assert!(w[0].1 >= w[1].1, "best first");
    }
    for &(id, v) in &lp.top {
        assert!((v - full[id as usize]).abs() < 1e-6);
    }
    let (_, lp2) = sample(&l, &params(2.5, 0, 1.0, 9), 4, &[], Some(5));
    assert_eq!(
        lp2.expect("logprobs").top,
        lp.top,
        "temperature does not change logprobs"
    );
    assert!(sample(&l, &params(0.7, 0, 1.0, 9), 4, &[], None)
        .1
        .is_none());

    // With a repetition penalty the logprobs follow the penalised logits.
    let mut p = SamplingParams::greedy();
    p.repetition_penalty = 3.0;
    let (t, lp) = sample(&[2.0, 1.0], &p, 0, &[0], Some(2));
    let pen = log_softmax(&[2.0 / 3.0, 1.0]);
    let lp = lp.expect("logprobs");
    assert_eq!(t, 1);
    assert!((lp.logprob - pen[1]).abs() < 1e-6);
    assert_eq!(lp.top[0].0, 1);
}

proptest! {
    #[test]
    fn draws_stay_in_range_and_within_top_k(
        seed in any::<u64>(),
        pos in 0u32..10_000,
        k in 0u32..8,
        top_p in 0.01f32..=1.0,
        temp in 0.0f32..3.0,
        lseed in 0u64..1000,
    ) {
        let l = random_logits(lseed, 50, 5.0);
        let p = SamplingParams { temperature: temp, top_p, top_k: k, repetition_penalty: 1.0, seed, ..SamplingParams::default() };
        let (t, lp) = sample(&l, &p, pos, &[1, 2, 3], Some(3));
        prop_assert!((t as usize) < l.len());
        if k > 0 {
            let mut sorted = l.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            prop_assert!(l[t as usize] >= sorted[k as usize - 1]);
        }
        let lp = lp.expect("logprobs");
        prop_assert!(lp.logprob <= 0.0);
        prop_assert_eq!(lp.top.len(), 3);
        prop_assert_eq!(sample(&l, &p, pos, &[1, 2, 3], None).0, t);
    }
}

#[test]
fn presence_and_frequency_penalties_count_only_generated_tokens() {
    let logits = [1.0f32, 0.9, 0.8, 0.1];
    // History: a prompt of three 0s, then generated 1, 1, 2.
    let history = [0u32, 0, 0, 1, 1, 2];
    let p = SamplingParams {
        temperature: 0.0,
        presence_penalty: 0.25,
        frequency_penalty: 0.3,
        generated_from: 3,
        ..SamplingParams::default()
    };
    let (t, lp) = sample(&logits, &p, 6, &history, Some(4));
    // 0 is the prompt's: untouched. 1: 0.9 - 0.25 - 2 * 0.3; 2: 0.8 - 0.25 - 0.3.
    let penalised = [1.0f32, 0.9 - 0.25 - 0.6, 0.8 - 0.25 - 0.3, 0.1];
    assert_eq!(t, 0);
    let want = log_softmax(&penalised);
    let lp = lp.expect("logprobs");
    for (tok, got) in lp.top {
        assert!(
            (got - want[tok as usize]).abs() < 1e-5,
            "token {tok}: {got} vs {}",
            want[tok as usize]
        );
    }
    // Counted from the start, 0 is penalised too (three times): 1.0 - 0.25
    // - 0.9 = -0.15, below 2's 0.25, which now wins.
    let all = SamplingParams {
        generated_from: 0,
        ..p
    };
    let (t, _) = sample(&logits, &all, 6, &history, None);
    assert_eq!(t, 2);
}

#[test]
fn zero_or_non_finite_openai_penalties_change_nothing() {
    let logits = random_logits(4, 40, 3.0);
    let history = [1u32, 2, 3, 3, 7];
    let base = SamplingParams {
        temperature: 0.8,
        seed: 11,
        ..SamplingParams::default()
    };
    let (t0, lp0) = sample(&logits, &base, 9, &history, Some(3));
    for (presence, frequency) in [(0.0, 0.0), (f32::NAN, 0.0), (0.0, f32::INFINITY)] {
        let p = SamplingParams {
            presence_penalty: presence,
            frequency_penalty: frequency,
            ..base.clone()
        };
        assert_eq!(sample(&logits, &p, 9, &history, Some(3)), (t0, lp0.clone()));
    }
}

#[test]
fn logit_bias_bans_forces_and_comes_before_the_penalties() {
    let logits = [5.0f32, 1.0, 0.0, -2.0];
    let with = |bias: &[(u32, f32)], temperature: f32, repetition: f32| SamplingParams {
        logit_bias: bias.into(),
        temperature,
        repetition_penalty: repetition,
        seed: 4,
        ..SamplingParams::default()
    };
    // Greedy: a ban, a raise; the fast argmax path must not skip them.
    assert_eq!(
        sample(&logits, &with(&[(0, -100.0)], 0.0, 1.0), 0, &[], None).0,
        1
    );
    assert_eq!(
        sample(&logits, &with(&[(3, 7.5)], 0.0, 1.0), 0, &[], None).0,
        3
    );
    // Only an id's first pair applies; ids past the vocabulary, zero and
    // non-finite biases change nothing.
    assert_eq!(
        sample(
            &logits,
            &with(&[(1, 1.0), (1, 9.0)], 0.0, 1.0),
            0,
            &[],
            None
        )
        .0,
        0
    );
    let inert = [(9, 50.0), (0, f32::NAN), (1, 0.0), (2, f32::INFINITY)];
    let base = with(&[], 0.9, 1.0);
    for pos in 0..20 {
        assert_eq!(
            sample(&logits, &with(&inert, 0.9, 1.0), pos, &[], Some(2)),
            sample(&logits, &base, pos, &[], Some(2))
        );
    }
    // Before the repetition penalty: (1.0 + 4.0) / 2 = 2.5 < 3.0; after it
    // would be 1.0 / 2 + 4.0 = 4.5.
    let order = [3.0f32, 1.0];
    assert_eq!(
        sample(&order, &with(&[(1, 4.0)], 0.0, 2.0), 0, &[1], None).0,
        0
    );
    // A draw never takes a banned token, and a forced one every time; the
    // logprobs are those of the biased row.
    for pos in 0..50 {
        let (t, lp) = sample(&logits, &with(&[(0, -100.0)], 1.5, 1.0), pos, &[], Some(1));
        assert_ne!(t, 0, "a banned token drawn at {pos}");
        let lp = lp.expect("logprobs");
        assert_eq!(lp.top[0].0, 1, "the ban moves the best");
        let (t, _) = sample(&logits, &with(&[(2, 100.0)], 1.5, 1.0), pos, &[], None);
        assert_eq!(t, 2);
    }
}

#[test]
fn min_tokens_holds_the_stop_ids_back_until_enough_were_generated() {
    // Id 0 (the stop id) is best, even +inf; id 3 is biased up but banned too.
    let logits = [f32::INFINITY, 1.0, 0.5, 0.0];
    let p = |min_tokens: u32, temperature: f32| SamplingParams {
        min_tokens,
        stop_ids: vec![0, 3, 99].into(),
        logit_bias: vec![(3, 50.0)].into(),
        generated_from: 2,
        temperature,
        seed: 1,
        ..SamplingParams::default()
    };
    // Two prompt tokens, then one generated: fewer than 2.
    let history = [5u32, 6, 1];
    assert_eq!(sample(&logits, &p(2, 0.0), 3, &history, None).0, 1);
    for pos in 0..30 {
        let (t, lp) = sample(&logits, &p(2, 1.0), pos, &history, Some(4));
        assert!(t == 1 || t == 2, "drew {t} at {pos}");
        let top: Vec<u32> = lp.expect("logprobs").top.iter().map(|x| x.0).collect();
        assert_eq!(
            &top[..2],
            &[1, 2],
            "held-back ids are -inf in the logprobs too"
        );
    }
    // Enough generated: the stop id is back (and the bias on id 3 applies).
    assert_eq!(sample(&logits, &p(1, 0.0), 3, &history, None).0, 0);
    assert_eq!(
        sample(&[0.0, 1.0, 0.5, 0.0], &p(1, 0.0), 3, &history, None).0,
        3
    );
    // No stop ids: min_tokens changes nothing.
    let none = SamplingParams {
        stop_ids: Default::default(),
        ..p(9, 0.0)
    };
    assert_eq!(sample(&logits, &none, 3, &history, None).0, 0);
}

#[test]
fn min_p_keeps_what_is_likely_enough_beside_the_best() {
    // Probabilities after temperature 1: ids 0 and 1 at e^0 and e^-1 of
    // the best; id 2 at e^-3.
    let logits = [5.0f32, 4.0, 2.0, f32::NEG_INFINITY];
    let p = |min_p: f32, top_p: f32| SamplingParams {
        min_p,
        top_p,
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let draws = |params: &SamplingParams| -> std::collections::BTreeSet<u32> {
        (0..400)
            .map(|pos| {
                let q = SamplingParams {
                    seed: pos as u64,
                    ..params.clone()
                };
                sample(&logits, &q, pos, &[], None).0
            })
            .collect()
    };
    assert_eq!(draws(&p(0.0, 1.0)), [0, 1, 2].into(), "off");
    // e^-1 = 0.37 >= 0.2 > e^-3 = 0.05: ids 0 and 1 only.
    assert_eq!(draws(&p(0.2, 1.0)), [0, 1].into());
    assert_eq!(draws(&p(0.5, 1.0)), [0].into());
    assert_eq!(draws(&p(1.0, 1.0)), [0].into(), "1: the best alone");
    // Min-p first, then top-p over what it kept: 0.9 of {0, 1} needs both;
    // 0.72 of {0, 1} (mass 1.37) is id 0 alone, where 0.72 of the whole
    // row (1.42) would have kept id 1 too.
    assert_eq!(draws(&p(0.2, 0.9)), [0, 1].into());
    assert_eq!(draws(&p(0.2, 0.72)), [0].into());
    assert_eq!(draws(&p(0.0, 0.72)), [0, 1].into());
    // The logprobs are the row's before temperature and min-p.
    let (_, lp) = sample(&logits, &p(0.5, 1.0), 0, &[], Some(3));
    assert!(lp.expect("logprobs").top[2].1.is_finite());
}

proptest! {
    /// A mask is absolute: greedy takes the best allowed token, a draw
    /// (any temperature, top-k, top-p) never leaves the allowed set, and
    /// logprobs are those of the allowed tokens alone, summing to one.
    #[test]
    fn a_mask_bounds_every_pick_and_the_logprobs(
        seed in 0u64..10_000,
        n in 2usize..300,
        temp in prop_oneof![Just(0.0f32), 0.1f32..2.0],
        top_k in 0u32..20,
        top_p in 0.05f32..1.0,
        density in 1u32..8,
    ) {
        let logits = random_logits(seed, n, 6.0);
        let mut mask = tokenwire_core::TokenMask::none(n as u32);
        let mut r = Rng::new(seed ^ 0x5eed);
        for t in 0..n as u32 {
            if r.next_u64().is_multiple_of(density as u64) {
                mask.allow(t);
            }
        }
        if mask.count() == 0 {
            mask.allow((seed % n as u64) as u32);
        }
        let p = params(temp, top_k, top_p, seed);
        let (t, lp) = tokenwire_kernels::Sampler::new().sample_masked(&logits, &p, 3, &[], Some(5), Some(&mask));
        prop_assert!(mask.allows(t), "picked {} outside the mask", t);
        if temp == 0.0 {
            let best = (0..n as u32).filter(|&i| mask.allows(i)).max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]).then(b.cmp(&a)));
            prop_assert_eq!(Some(t), best);
        }
        let lp = lp.expect("asked for logprobs");
        prop_assert!(lp.top.iter().all(|&(i, l)| mask.allows(i) && l.is_finite()));
        prop_assert_eq!(lp.top.len(), (mask.count() as usize).min(5));
        // The chosen token's logprob is its share of the allowed mass.
        let allowed: Vec<f32> = (0..n)
            .map(|j| if mask.allows(j as u32) { logits[j] } else { f32::NEG_INFINITY })
            .collect();
        let want = log_softmax(&allowed)[t as usize];
        prop_assert!((lp.logprob - want).abs() < 1e-4, "{} vs {}", lp.logprob, want);
    }
}

/// The scan greedy sampling is defined by: NaN read as -inf, the first
/// index whose value beats every earlier one, 0 when none beats -inf.
fn scan_argmax(x: &[f32]) -> u32 {
    let clean = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let mut b = 0;
    for (i, &v) in x.iter().enumerate() {
        if clean(v) > clean(x[b]) {
            b = i;
        }
    }
    b as u32
}

proptest! {
    /// Greedy picks what the scan picks, over rows full of ties, NaN,
    /// infinities and signed zeros, at lengths around the vector width.
    #[test]
    fn greedy_is_the_scan_argmax(
        row in prop::collection::vec(
            prop_oneof![
                (-3i8..3).prop_map(f32::from),
                Just(f32::NAN),
                Just(f32::INFINITY),
                Just(f32::NEG_INFINITY),
                Just(-0.0f32),
            ],
            1..80,
        )
    ) {
        let want = scan_argmax(&row);
        let (t, _) = sample(&row, &SamplingParams::greedy(), 0, &[], None);
        prop_assert_eq!(t, want, "{:?}", row);
        // With logprobs asked, through the cleaned copy: the same token.
        let (t, _) = sample(&row, &SamplingParams::greedy(), 0, &[], Some(1));
        prop_assert_eq!(t, want, "{:?} with logprobs", row);
    }
}

/// Top-p as a full sort of the row would draw it: the order (value
/// descending, then id), weights exp(s - max) in f64, the total summed in
/// id order, the shortest prefix reaching top_p of it, then the draw.
fn top_p_by_full_sort(logits: &[f32], temperature: f32, top_p: f32, u: f64) -> u32 {
    let s: Vec<f32> = logits
        .iter()
        .map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x } / temperature)
        .collect();
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = s.iter().map(|&x| ((x - m) as f64).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut order: Vec<u32> = (0..s.len() as u32).collect();
    order.sort_by(|&a, &b| s[b as usize].total_cmp(&s[a as usize]).then(a.cmp(&b)));
    let mut cum = 0.0;
    let mut kept = order.len();
    let mut kept_mass = total;
    for (i, &t) in order.iter().enumerate() {
        cum += w[t as usize];
        if cum >= top_p as f64 * total {
            kept = i + 1;
            kept_mass = cum;
            break;
        }
    }
    let u = u * kept_mass;
    let mut cum = 0.0;
    for &t in &order[..kept] {
        cum += w[t as usize];
        if u < cum {
            return t;
        }
    }
    *order[..kept]
        .iter()
        .rev()
        .find(|&&t| w[t as usize] > 0.0)
        .unwrap_or(&order[kept - 1])
}

#[test]
fn top_p_draws_what_sorting_the_whole_row_draws() {
    // The sampler sorts only as much of the order as the cut needs, in
    // growing slices (256, then 1024, 4096, ... entries): rows where the
    // cut falls in the first slice, in later ones, and at the very end
    // (flat rows with top-p near 1), with ties and -inf entries.
    let mut checked = 0;
    let mut past_first_slice = 0;
    for (case, &(n, spread, top_p)) in [
        (300usize, 8.0f32, 0.9f32),
        (5000, 6.0, 0.95),
        (5000, 0.5, 0.5),
        (32000, 0.2, 0.999),
        (32000, 4.0, 0.95),
        (49152, 1.0, 0.7),
        (7, 1.0, 0.99),
    ]
    .iter()
    .enumerate()
    {
        for r in 0..12u64 {
            let mut logits = random_logits(case as u64 * 100 + r, n, spread);
            if r % 3 == 1 {
                // Ties: values rounded to a coarse grid.
                for x in &mut logits {
                    *x = (*x * 4.0).round() / 4.0;
                }
            }
            if r % 4 == 2 {
                for x in logits.iter_mut().step_by(5) {
                    *x = f32::NEG_INFINITY;
                }
            }
            let temperature = [0.7f32, 1.0, 1.6][r as usize % 3];
            let p = params(temperature, 0, top_p, r * 7 + 1);
            let (t, _) = sample(&logits, &p, r as u32, &[], None);
            let u = tokenwire_kernels::draw_uniform(p.seed, r as u32);
            let want = top_p_by_full_sort(&logits, temperature, top_p, u);
            assert_eq!(t, want, "n {n} spread {spread} top_p {top_p} row {r}");
            checked += 1;
            // Whether this row's cut needed more than the first slice.
            let mut sorted = logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted.len() > 256 && logits[t as usize] < sorted[255] {
                past_first_slice += 1;
            }
        }
    }
    assert_eq!(checked, 84);
    assert!(past_first_slice >= 10, "{past_first_slice}");
}

#[test]
fn top_p_with_a_positive_infinity_takes_the_last_of_the_order() {
    // The +inf entry weighs NaN (inf - inf), the others 0 (-inf after
    // subtracting the maximum), so the total is NaN: no prefix reaches the
    // target, and the draw falls through to the last element with a
    // weight, of which there is none: the last of the order, the lowest
    // value.
    let mut logits = random_logits(5, 1000, 3.0);
    logits[17] = f32::INFINITY;
    logits[400] = -50.0;
    let (t, _) = sample(&logits, &params(1.0, 0, 0.9, 3), 0, &[], None);
    assert_eq!(t, 400);
}
