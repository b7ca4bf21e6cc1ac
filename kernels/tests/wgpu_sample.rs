//! sample.wgsl (sampling on the device) against the shared CPU sampler
//! (`tokenwire_kernels::sample`), on seeded random logits rows: greedy and
//! top-k = 1 exactly equal to the argmax; drawn tokens equal to the CPU's on
//! every row whose draw does not land within `EPS` of a cumulative boundary
//! (the CPU's f64 sums against the kernel's sums of f32 exps); repetition
//! penalty with repeated history ids, and OpenAI's presence and frequency
//! penalties over the generated part; NaN and -inf logits; top-p near 0 and
//! 1; logprobs; and the frequencies of many draws from one row.

mod wgpu_support;

use tokenwire_core::rng::Rng;
use tokenwire_core::{SamplingParams, TokenId, TokenLogprobs};
use tokenwire_kernels::backend::wgpu::lab::{KernelLab, LabSample};
use tokenwire_kernels::{draw_uniform, log_softmax, sample};
use wgpu_support::*;

/// Relative error allowed to the device's masses: they are sums of f32 exps
/// (a few ulp each) where the CPU sums f64 exps. A draw (or a top-p cut)
/// closer than this, relative to the masses compared, to a cumulative
/// boundary may legitimately fall on the other side on the device.
const EPS: f64 = 2e-6;
/// Absolute error the device's fixed-point masses may add per element (in
/// units of the largest weight, 1): half of their 2^-31 step.
const UNIT: f64 = 1.0 / 4_294_967_296.0;

fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The penalised row the CPU sampler works on.
fn penalised(logits: &[f32], p: &SamplingParams, history: &[TokenId]) -> Vec<f32> {
    let mut w: Vec<f32> = logits.iter().copied().map(clean).collect();
    // min_tokens holds the stop ids back while too few were generated.
    let generated = history.len().saturating_sub(p.generated_from as usize);
    let mut biased = vec![false; w.len()];
    if generated < p.min_tokens as usize {
        for &t in p.stop_ids.iter() {
            if let Some(x) = w.get_mut(t as usize) {
                *x = f32::NEG_INFINITY;
                biased[t as usize] = true;
            }
        }
    }
    // Then logit_bias: each other id's first pair, when finite and in range.
    for &(t, b) in p.logit_bias.iter() {
        let t = t as usize;
        if t < w.len() && !std::mem::replace(&mut biased[t], true) && b.is_finite() {
            w[t] += b;
        }
    }
    let r = p.repetition_penalty;
    if !(r == 1.0 || r.is_nan() || r <= 0.0 || r.is_infinite()) {
        let mut seen = vec![false; w.len()];
        for &t in history {
            let t = t as usize;
            if t < w.len() && !seen[t] {
                seen[t] = true;
                w[t] = if w[t] > 0.0 { w[t] / r } else { w[t] * r };
            }
        }
    }
    // OpenAI's presence and frequency penalties over the generated part.
    let on = |x: f32| x != 0.0 && x.is_finite();
    if on(p.presence_penalty) || on(p.frequency_penalty) {
        let from = (p.generated_from as usize).min(history.len());
        let mut count = vec![0u32; w.len()];
        for &t in &history[from..] {
            if let Some(c) = count.get_mut(t as usize) {
                *c += 1;
            }
        }
        for (x, &c) in w.iter_mut().zip(&count) {
            if c > 0 {
                *x -= p.presence_penalty + p.frequency_penalty * c as f32;
            }
        }
    }
    w
}

/// What the CPU sampler chooses, re-derived with its f64 arithmetic.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cpu {
    /// No draw (greedy, or no finite weight): the device must agree exactly.
    Exact,
    /// Every cut and draw the device can make within `EPS` gives this token.
    Clear(TokenId),
    /// A cut or the draw lies within `EPS` of a boundary.
    Near,
}

/// The same steps as `Sampler::draw`, then the same again for every top-p
/// cut the device could make within `EPS`.
fn cpu_choice(logits: &[f32], p: &SamplingParams, pos: u32, history: &[TokenId]) -> Cpu {
    let t = p.temperature;
    if !(t > 0.0 && t.is_finite()) {
        return Cpu::Exact;
    }
    let mut s: Vec<f32> = penalised(logits, p, history)
        .iter()
        .map(|&x| x / t)
        .collect();
    // Min-p against a finite maximum; a value near the floor may fall on
    // the other side on the device (its division is not correctly rounded).
    if p.min_p > 0.0 && p.min_p <= 1.0 {
        let floor = (p.min_p as f64).ln() as f32;
        let top = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if top.is_finite() {
            for x in &mut s {
                let d = *x - top;
                let near = ((d - floor).abs() as f64) < 1e-5 * (1.0 + top.abs() as f64);
                if *x != top && x.is_finite() && near {
                    return Cpu::Near;
                }
                if d < floor {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
    let n = s.len();
    let mut order: Vec<usize> = (0..n).collect();
    let k = p.top_k as usize;
    let use_top_p = p.top_p > 0.0 && p.top_p < 1.0;
    if (k > 0 && k < n) || use_top_p {
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
        if k > 0 && k < n {
            order.truncate(k);
        }
    }
    let m = order
        .iter()
        .map(|&i| s[i])
        .fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return Cpu::Exact;
    }
    let w: Vec<f64> = order.iter().map(|&i| ((s[i] - m) as f64).exp()).collect();
    let cum: Vec<f64> = w
        .iter()
        .scan(0.0, |c, x| {
            *c += x;
            Some(*c)
        })
        .collect();
    let tol = |a: f64, b: f64| EPS * a.max(b) + (n as f64 + 2.0) * UNIT;
    // Cuts (index of the last kept element) the device may make.
    let mut cuts = vec![w.len() - 1];
    if use_top_p {
        let x = p.top_p as f64 * cum[w.len() - 1];
        let i = cum.iter().position(|&c| c >= x).unwrap_or(w.len() - 1);
        cuts = vec![i];
        if i + 1 < w.len() && cum[i] - x < tol(cum[i], x) {
            cuts.push(i + 1);
        }
        if i > 0 && x - cum[i - 1] < tol(cum[i - 1], x) {
            cuts.push(i - 1);
        }
    }
    let u = draw_uniform(p.seed, pos);
    let mut token = None;
    for cut in cuts {
        let kept = cum[cut];
        let x = u * kept;
        let j = cum[..=cut].iter().position(|&c| x < c).unwrap_or(cut);
        let near_hi = cum[j] - x < tol(cum[j], x);
        let near_lo = j > 0 && x - cum[j - 1] < tol(cum[j - 1], x);
        if near_hi || near_lo || token.is_some_and(|t| t != order[j]) {
            return Cpu::Near;
        }
        token = Some(order[j]);
    }
    token.map_or(Cpu::Near, |t| Cpu::Clear(t as TokenId))
}

fn close(a: f32, b: f32, tol: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() < tol
}

/// Logprobs from the device against the CPU's for the same token.
fn check_logprobs(
    what: &str,
    got: &TokenLogprobs,
    want: &TokenLogprobs,
    row: &[f32],
    p: &SamplingParams,
    history: &[TokenId],
) {
    let work = penalised(row, p, history);
    assert!(
        close(got.logprob, want.logprob, 1e-3),
        "{what}: logprob {} vs cpu {}",
        got.logprob,
        want.logprob
    );
    assert_eq!(got.top.len(), want.top.len(), "{what}: top length");
    for (q, (g, w)) in got.top.iter().zip(&want.top).enumerate() {
        // A different id only at an exact tie of the penalised logits.
        assert!(
            g.0 == w.0 || work[g.0 as usize].to_bits() == work[w.0 as usize].to_bits(),
            "{what}: top[{q}] id {} vs cpu {}",
            g.0,
            w.0
        );
        assert!(
            close(g.1, w.1, 1e-3),
            "{what}: top[{q}] logprob {} vs cpu {}",
            g.1,
            w.1
        );
    }
}

/// Outcome of comparing a batch with the CPU sampler.
#[derive(Debug, Default)]
struct Tally {
    rows: usize,
    exact: usize,
    compared: usize,
    skipped: usize,
}

/// Runs `specs` on the device (`per` rows per dispatch) and on the CPU, and
/// checks every row: greedy rows exactly, drawn rows unless within `EPS` of
/// a boundary, logprobs when the tokens agree.
fn compare(
    lab: &mut KernelLab,
    what: &str,
    logits: &[f32],
    vocab: usize,
    specs: &[LabSample],
    per: usize,
    tally: &mut Tally,
) {
    let got = lab
        .sample(logits, vocab, specs, per)
        .expect("sample kernel");
    assert_eq!(got.len(), specs.len());
    for (r, (spec, (token, lp))) in specs.iter().zip(got).enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let what = format!(
            "{what} row {r} ({:?}, logprobs {:?})",
            spec.params, spec.logprobs
        );
        let (want, want_lp) = sample(
            row,
            &spec.params,
            spec.position,
            &spec.history,
            spec.logprobs,
        );
        assert!(
            (token as usize) < vocab,
            "{what}: token {token} out of range"
        );
        tally.rows += 1;
        match cpu_choice(row, &spec.params, spec.position, &spec.history) {
            Cpu::Exact => {
                tally.exact += 1;
                assert_eq!(token, want, "{what}: must equal the cpu exactly");
            }
            Cpu::Near => {
                tally.skipped += 1;
                eprintln!("{what}: within {EPS:e} of a boundary, not compared");
                continue;
            }
            Cpu::Clear(t) => {
                assert_eq!(
                    t, want,
                    "{what}: the test's f64 replay disagrees with the sampler"
                );
                tally.compared += 1;
                assert_eq!(token, want, "{what}: device {token}, cpu {want}");
            }
        }
        match (&lp, &want_lp) {
            (Some(g), Some(w)) => check_logprobs(&what, g, w, row, &spec.params, &spec.history),
            (None, None) => {}
            other => panic!("{what}: logprobs {other:?}"),
        }
    }
}

fn uniform_row(rng: &mut Rng, vocab: usize, spread: f32) -> Vec<f32> {
    (0..vocab)
        .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * spread)
        .collect()
}

fn pick<T: Copy>(rng: &mut Rng, xs: &[T]) -> T {
    xs[rng.below(xs.len() as u64) as usize]
}

/// Mixed parameters: greedy, temperature alone, top-k, top-p, both, with and
/// without logit biases, penalties and logprobs.
fn random_spec(rng: &mut Rng, vocab: usize) -> LabSample {
    let v = vocab as u32;
    let temperature = pick(rng, &[0.0, 0.0, 0.3, 0.7, 1.0, 1.0, 1.3, 2.0]);
    let top_k = pick(rng, &[0, 0, 0, 1, 5, 40, v.saturating_sub(1), v, v + 3]);
    let top_p = pick(rng, &[1.0, 1.0, 0.95, 0.9, 0.5, 0.999, 1e-4, 0.0]);
    let repetition_penalty = pick(rng, &[1.0, 1.0, 1.3, 0.8, 2.0]);
    let presence_penalty = pick(rng, &[0.0, 0.0, 0.0, 0.6, -0.4, 2.0]);
    let frequency_penalty = pick(rng, &[0.0, 0.0, 0.0, 0.3, 1.5, -2.0]);
    let hist_len = pick(rng, &[0usize, 3, 50, 600]);
    let generated_from = rng.below(hist_len as u64 + 2) as u32;
    // Duplicates on purpose (ids from a narrow range), and ids past the end.
    let span = (vocab as u64 / 3).max(1);
    let history = (0..hist_len)
        .map(|_| {
            if rng.below(40) == 0 {
                (vocab + 5) as TokenId
            } else {
                rng.below(span) as TokenId
            }
        })
        .collect();
    let logprobs = pick(rng, &[None, None, Some(0u8), Some(1), Some(5), Some(20)]);
    // logit_bias: none, a few ids (repeated ones and ids past the vocabulary
    // among them, which only the first pair of, or nothing, applies), or
    // many; biases from OpenAI's whole range, with a ban and a force.
    let pairs = pick(rng, &[0usize, 0, 0, 1, 4, 40]);
    let logit_bias: Vec<(TokenId, f32)> = (0..pairs)
        .map(|_| {
            let id = if rng.below(20) == 0 {
                v + rng.below(3) as u32
            } else {
                rng.below(span.max(pairs as u64)) as TokenId
            };
            let bias = pick(rng, &[-100.0f32, 100.0, 0.0, 0.5, -3.0, 7.25]);
            (id, bias)
        })
        .collect();
    LabSample {
        params: SamplingParams {
            temperature,
            top_p,
            top_k,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            generated_from,
            logit_bias: logit_bias.into(),
            min_p: pick(rng, &[0.0f32, 0.0, 0.0, 0.05, 0.3, 0.9, 1.0]),
            // Held back or not by the generated count, beside biases of
            // their own, and one id past the vocabulary.
            min_tokens: pick(rng, &[0u32, 0, 1, 2, 700]),
            stop_ids: [0, 2, v + 1, (v / 2).max(1) - 1][..pick(rng, &[1usize, 2, 4])].into(),
            seed: rng.next_u64(),
        },
        position: rng.below(5000) as u32,
        history,
        logprobs,
    }
}

/// One batch: name, rows, vocabulary, specs, rows per dispatch.
type Case = (String, Vec<f32>, usize, Vec<LabSample>, usize);

/// Seeded batches of 1 to 9 rows over vocabularies that are and are not
/// multiples of the workgroup size, with mixed parameters.
fn random_cases(seed: u64, count: usize) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let vocabs = [512usize, 1000, 32000, 257, 4099, 3, 1, 300, 2048, 5000];
    (0..count)
        .map(|case| {
            let vocab = vocabs[case % vocabs.len()];
            let rows = 1 + rng.below(9) as usize;
            let mut logits = Vec::with_capacity(rows * vocab);
            for _ in 0..rows {
                let spread = pick(&mut rng, &[1.0f32, 3.0, 6.0, 12.0]);
                logits.extend(uniform_row(&mut rng, vocab, spread));
            }
            let specs: Vec<LabSample> = (0..rows).map(|_| random_spec(&mut rng, vocab)).collect();
            let per = 1 + rng.below(rows as u64) as usize;
            (
                format!("case {case} vocab {vocab}"),
                logits,
                vocab,
                specs,
                per,
            )
        })
        .collect()
}

#[test]
fn wgpu_sample_matches_cpu_sampler_on_random_rows() {
    let Some(mut lab) = lab() else { return };
    let mut tally = Tally::default();
    for (what, logits, vocab, specs, per) in random_cases(2024, 60) {
        compare(&mut lab, &what, &logits, vocab, &specs, per, &mut tally);
    }
    eprintln!("{tally:?}");
    let drawn = tally.compared + tally.skipped;
    assert!(tally.exact > 50 && drawn > 150, "{tally:?}");
    // Near-boundary draws are rare: at least 95% of the drawn rows compared.
    assert!(
        tally.skipped * 20 <= drawn,
        "too many rows within {EPS:e} of a boundary: {tally:?}"
    );
}

#[test]
fn wgpu_sample_workgroup_sizes_give_identical_results() {
    // The masses are exact integer sums, so how a row is split over
    // invocations changes nothing, bit for bit: the GPU default (256), a
    // middle size and the CPU adapters' default against the default here.
    let Some(mut base) = lab() else { return };
    let cases = random_cases(77, 20);
    let want: Vec<_> = cases
        .iter()
        .map(|(_, l, v, s, per)| base.sample(l, *v, s, *per).expect("sample"))
        .collect();
    for wg in [256u32, 32, 8] {
        let opts = tokenwire_kernels::WgpuOptions {
            sample_workgroup: Some(wg),
            ..tokenwire_kernels::WgpuOptions::default()
        };
        let Some(mut lab) = lab_with(&opts) else {
            return;
        };
        let mut tally = Tally::default();
        for ((what, logits, vocab, specs, per), want) in cases.iter().zip(&want) {
            let got = lab.sample(logits, *vocab, specs, *per).expect("sample");
            for (r, (g, w)) in got.iter().zip(want).enumerate() {
                assert_eq!(g.0, w.0, "workgroup {wg}, {what} row {r}");
                let bits = |lp: &Option<TokenLogprobs>| {
                    lp.as_ref().map(|l| {
                        let top: Vec<(TokenId, u32)> =
                            l.top.iter().map(|t| (t.0, t.1.to_bits())).collect();
                        (l.logprob.to_bits(), top)
                    })
                };
                assert_eq!(bits(&g.1), bits(&w.1), "workgroup {wg}, {what} row {r}");
            }
            compare(&mut lab, what, logits, *vocab, specs, *per, &mut tally);
        }
        eprintln!("workgroup {wg}: {tally:?}");
    }
}

#[test]
fn wgpu_sample_greedy_and_top_k_one_are_the_argmax() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(11);
    for (case, vocab) in [512usize, 1000, 32000, 1, 77].into_iter().enumerate() {
        let rows = 1 + (case * 2) % 9;
        let mut logits = uniform_row(&mut rng, rows * vocab, 5.0);
        for r in 0..rows {
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            match r % 4 {
                // Ties at the top: the lowest id wins.
                0 if vocab > 2 => {
                    let m = row.iter().copied().fold(f32::MIN, f32::max) + 1.0;
                    let a = rng.below(vocab as u64) as usize;
                    let b = rng.below(vocab as u64) as usize;
                    row[a] = m;
                    row[b] = m;
                }
                1 => row[rng.below(vocab as u64) as usize] = f32::NAN,
                2 => row[..vocab / 2].fill(f32::NEG_INFINITY),
                _ => {}
            }
        }
        let argmax: Vec<TokenId> = logits
            .chunks(vocab)
            .map(|row| {
                let mut best = 0;
                for (i, &x) in row.iter().enumerate() {
                    if clean(x) > clean(row[best]) {
                        best = i;
                    }
                }
                best as TokenId
            })
            .collect();
        for top_k in [None, Some(1u32)] {
            let specs: Vec<LabSample> = (0..rows)
                .map(|_| LabSample {
                    params: match top_k {
                        None => SamplingParams::greedy(),
                        Some(k) => SamplingParams {
                            temperature: 0.9,
                            top_k: k,
                            seed: rng.next_u64(),
                            ..SamplingParams::default()
                        },
                    },
                    position: rng.below(100) as u32,
                    history: Vec::new(),
                    logprobs: None,
                })
                .collect();
            let got: Vec<TokenId> = lab
                .sample(&logits, vocab, &specs, rows)
                .expect("sample")
                .into_iter()
                .map(|g| g.0)
                .collect();
            assert_eq!(got, argmax, "vocab {vocab}, top_k {top_k:?}");
        }
    }
}

#[test]
fn wgpu_sample_same_seed_same_token_and_seeds_spread() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(5);
    let vocab = 1000;
    let row = uniform_row(&mut rng, vocab, 2.0);
    let params = SamplingParams {
        temperature: 1.0,
        top_p: 0.9,
        seed: 77,
        ..SamplingParams::default()
    };
    // The same (seed, position) eight times in one batch, and again later.
    let same: Vec<LabSample> = (0..8)
        .map(|_| LabSample {
            params: params.clone(),
            position: 41,
            history: Vec::new(),
            logprobs: None,
        })
        .collect();
    let logits = row.repeat(8);
    let a = lab.sample(&logits, vocab, &same, 3).expect("sample");
    let b = lab.sample(&logits, vocab, &same, 8).expect("sample");
    assert!(a.iter().all(|x| x.0 == a[0].0), "{a:?}");
    assert_eq!(a, b);
    // Different seeds and positions spread over many tokens.
    let spread: Vec<LabSample> = (0..8)
        .map(|i| LabSample {
            params: SamplingParams {
                seed: i as u64,
                ..params.clone()
            },
            position: 41 + i,
            history: Vec::new(),
            logprobs: None,
        })
        .collect();
    let c = lab.sample(&logits, vocab, &spread, 8).expect("sample");
    let distinct: std::collections::HashSet<TokenId> = c.iter().map(|x| x.0).collect();
    assert!(distinct.len() >= 5, "{c:?}");
}

#[test]
fn wgpu_sample_repetition_penalty_counts_each_id_once() {
    let Some(mut lab) = lab() else { return };
    let greedy = |penalty: f32, history: &[TokenId], logprobs| LabSample {
        params: SamplingParams {
            repetition_penalty: penalty,
            ..SamplingParams::greedy()
        },
        position: 0,
        history: history.to_vec(),
        logprobs,
    };
    // Penalised once: 2.0 / 1.2 = 1.67 > 1.5 keeps token 0; twice (1.39)
    // would not. Negative logits are multiplied: -1.0 * 1.2 = -1.2 > -1.3,
    // twice (-1.44) would lose.
    let cases: [(&[f32], &[TokenId], TokenId); 5] = [
        (&[2.0, 1.5], &[0, 0, 0, 0], 0),
        (&[-1.0, -1.3], &[0, 0, 0], 0),
        (&[2.0, 1.9, -1.0], &[0, 9, 0, 7], 1),
        (&[2.0, 1.9], &[5, 9], 0),
        (&[f32::NAN, 0.5, 0.45], &[1, 1], 2),
    ];
    for (row, hist, want) in cases {
        let specs = [greedy(1.2, hist, Some(2))];
        let got = lab.sample(row, row.len(), &specs, 1).expect("sample");
        let (cpu, cpu_lp) = sample(row, &specs[0].params, 0, hist, Some(2));
        assert_eq!(cpu, want, "cpu on {row:?} {hist:?}");
        assert_eq!(got[0].0, want, "{row:?} with history {hist:?}");
        let lp = got[0].1.as_ref().expect("logprobs");
        check_logprobs(
            "penalty",
            lp,
            &cpu_lp.expect("cpu logprobs"),
            row,
            &specs[0].params,
            hist,
        );
    }
    // Long histories full of repeats, every kind of row, against the CPU.
    let mut rng = Rng::new(8);
    let mut tally = Tally::default();
    for vocab in [512usize, 1000, 32000] {
        let rows = 6;
        let logits = uniform_row(&mut rng, rows * vocab, 4.0);
        let specs: Vec<LabSample> = (0..rows)
            .map(|r| {
                // The row's 8 best ids, each repeated: a penalty that counted
                // repeats would push them much further down.
                let row = &logits[r * vocab..(r + 1) * vocab];
                let mut ids: Vec<TokenId> = (0..vocab as TokenId).collect();
                ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
                let history: Vec<TokenId> = ids[..8].iter().cycle().take(100).copied().collect();
                LabSample {
                    params: SamplingParams {
                        temperature: [0.0, 0.8][r % 2],
                        top_k: [0, 20, 0][r % 3],
                        repetition_penalty: [1.5, 0.7][r % 2],
                        seed: r as u64,
                        ..SamplingParams::default()
                    },
                    position: 3 + r as u32,
                    history,
                    logprobs: Some(5),
                }
            })
            .collect();
        compare(
            &mut lab,
            &format!("penalty vocab {vocab}"),
            &logits,
            vocab,
            &specs,
            rows,
            &mut tally,
        );
    }
    assert_eq!(tally.rows, 18);
    assert!(tally.skipped <= 1, "{tally:?}");
}

#[test]
fn wgpu_sample_openai_penalties_count_generated_tokens() {
    let Some(mut lab) = lab() else { return };
    // History [prompt..., generated...], generated from index 2.
    let greedy = |presence: f32, frequency: f32, repetition: f32, history: &[TokenId]| LabSample {
        params: SamplingParams {
            presence_penalty: presence,
            frequency_penalty: frequency,
            repetition_penalty: repetition,
            generated_from: 2,
            ..SamplingParams::greedy()
        },
        position: 0,
        history: history.to_vec(),
        logprobs: Some(2),
    };
    let cases: [(&[f32], LabSample, TokenId); 6] = [
        // Presence once: 2.0 - 0.6 = 1.4 < 1.5.
        (&[2.0, 1.5], greedy(0.6, 0.0, 1.0, &[1, 1, 0]), 1),
        // The prompt's ids are not counted: token 0 only in the prompt.
        (&[2.0, 1.5], greedy(0.6, 0.0, 1.0, &[0, 0, 1]), 0),
        // Frequency by count: 2.0 - 3 * 0.2 = 1.4 loses; once (1.8) would not.
        (&[2.0, 1.5], greedy(0.0, 0.2, 1.0, &[1, 1, 0, 0, 0]), 1),
        (&[2.0, 1.5], greedy(0.0, 0.2, 1.0, &[1, 1, 0]), 0),
        // A negative presence raises: 1.5 + 0.6 = 2.1 > 2.0.
        (&[2.0, 1.5, 0.0], greedy(-0.6, 0.0, 1.0, &[2, 2, 1]), 1),
        // The repetition penalty first, then presence: 2.0 / 1.25 - 0.2 =
        // 1.4 < 1.42; the other order would give 1.8 / 1.25 = 1.44.
        (&[2.0, 1.42], greedy(0.2, 0.0, 1.25, &[0, 0, 0]), 1),
    ];
    for (row, spec, want) in cases {
        let hist = spec.history.clone();
        let got = lab
            .sample(row, row.len(), std::slice::from_ref(&spec), 1)
            .expect("sample");
        let (cpu, cpu_lp) = sample(row, &spec.params, 0, &hist, Some(2));
        assert_eq!(cpu, want, "cpu on {row:?} {:?}", spec.params);
        assert_eq!(got[0].0, want, "{row:?} with {:?} {hist:?}", spec.params);
        check_logprobs(
            "openai penalties",
            got[0].1.as_ref().expect("logprobs"),
            &cpu_lp.expect("cpu logprobs"),
            row,
            &spec.params,
            &hist,
        );
    }
}

#[test]
fn wgpu_sample_min_tokens_and_logit_bias_before_the_penalties() {
    let Some(mut lab) = lab() else { return };
    let row = |bias: &[(TokenId, f32)], repetition: f32, temperature: f32, history: &[TokenId]| {
        LabSample {
            params: SamplingParams {
                logit_bias: bias.into(),
                repetition_penalty: repetition,
                temperature,
                top_k: if temperature > 0.0 { 2 } else { 0 },
                seed: 9,
                ..SamplingParams::default()
            },
            position: 3,
            history: history.to_vec(),
            logprobs: Some(2),
        }
    };
    // min_tokens: stop ids 0 and 1 held back after one generated token (of
    // history [7, 9], generated from 1) when two are asked for, not when one.
    let held = |min_tokens: u32, temperature: f32| LabSample {
        params: SamplingParams {
            min_tokens,
            stop_ids: vec![0, 1].into(),
            logit_bias: vec![(1, 9.0), (2, 0.25)].into(),
            generated_from: 1,
            ..row(&[], 1.0, temperature, &[7, 9]).params
        },
        ..row(&[], 1.0, temperature, &[7, 9])
    };
    let cases: [(&[f32], LabSample, TokenId); 11] = [
        (&[f32::INFINITY, 2.0, 1.0, 0.0], held(2, 0.0), 2),
        (&[f32::INFINITY, 2.0, 1.0, 0.0], held(1, 0.0), 0),
        (&[3.0, 2.0, 1.0, 0.0], held(1, 0.0), 1),
        // Drawn with top-k 2 from what is not held back: ids 2 and 3.
        (&[3.0, 2.0, 1.0, 0.0], held(2, 1.0), 98),
        // A ban: 5.0 - 100 loses to 1.0.
        (&[5.0, 1.0, 0.0], row(&[(0, -100.0)], 1.0, 0.0, &[]), 1),
        // A raise: 0.0 + 4.5 beats 4.0.
        (&[4.0, 1.0, 0.0], row(&[(2, 4.5)], 1.0, 0.0, &[]), 2),
        // Only an id's first pair: the second (+10) for id 1 is ignored.
        (&[4.0, 1.0], row(&[(1, 2.0), (1, 10.0)], 1.0, 0.0, &[]), 0),
        // Ids past the vocabulary and biases that are not finite are ignored.
        (
            &[4.0, 1.0],
            row(&[(7, 9.0), (1, f32::NAN)], 1.0, 0.0, &[]),
            0,
        ),
        // The bias before the repetition penalty: (1.0 + 3.0) / 2 = 2.0 <
        // 2.1; the other order would give 1.0 / 2 + 3.0 = 3.5.
        (&[2.1, 1.0], row(&[(1, 3.0)], 2.0, 0.0, &[1]), 0),
        // A drawn row with top-k 2: the ban leaves ids 1 and 2 to draw from.
        (
            &[9.0, 1.0, 1.0, -50.0],
            row(&[(0, -100.0)], 1.0, 1.0, &[]),
            99,
        ),
        // A forced id wins every draw.
        (&[3.0, 2.0, 1.0], row(&[(2, 100.0)], 1.0, 0.7, &[]), 2),
    ];
    for (row, spec, want) in cases {
        let hist = spec.history.clone();
        let got = lab
            .sample(row, row.len(), std::slice::from_ref(&spec), 1)
            .expect("sample");
        let (cpu, cpu_lp) = sample(row, &spec.params, 3, &hist, Some(2));
        match want {
            99 => assert!(cpu == 1 || cpu == 2, "cpu drew {cpu} from a banned best"),
            98 => assert!(cpu == 2 || cpu == 3, "cpu drew {cpu}, held back"),
            _ => assert_eq!(cpu, want, "cpu on {row:?} {:?}", spec.params),
        }
        assert_eq!(got[0].0, cpu, "{row:?} with {:?} {hist:?}", spec.params);
        check_logprobs(
            "logit_bias",
            got[0].1.as_ref().expect("logprobs"),
            &cpu_lp.expect("cpu logprobs"),
            row,
            &spec.params,
            &hist,
        );
    }
}

#[test]
fn wgpu_sample_nan_and_neg_inf_logits() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(13);
    let mut tally = Tally::default();
    for vocab in [512usize, 1000, 7] {
        let rows = 8;
        let mut logits = uniform_row(&mut rng, rows * vocab, 3.0);
        for r in 0..rows {
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            match r {
                0 => row.fill(f32::NEG_INFINITY),
                1 => row.fill(f32::NAN),
                2 => {
                    // All but one masked.
                    let keep = rng.below(vocab as u64) as usize;
                    for (i, x) in row.iter_mut().enumerate() {
                        if i != keep {
                            *x = if i % 2 == 0 {
                                f32::NAN
                            } else {
                                f32::NEG_INFINITY
                            };
                        }
                    }
                }
                _ => {
                    for x in row.iter_mut() {
                        if rng.below(3) == 0 {
                            *x = if rng.below(2) == 0 {
                                f32::NAN
                            } else {
                                f32::NEG_INFINITY
                            };
                        }
                    }
                }
            }
        }
        let specs: Vec<LabSample> = (0..rows)
            .map(|r| LabSample {
                params: SamplingParams {
                    temperature: [1.0, 0.0, 0.6, 1.5][r % 4],
                    top_k: [0, 3, 0, 50][r % 4],
                    top_p: [1.0, 0.8, 0.9, 1.0][(r / 2) % 4],
                    repetition_penalty: 1.1,
                    seed: 100 + r as u64,
                    ..SamplingParams::default()
                },
                position: r as u32,
                history: vec![0, 1, 2, 3],
                logprobs: Some(4),
            })
            .collect();
        let got = lab.sample(&logits, vocab, &specs, 3).expect("sample");
        for (r, g) in got.iter().enumerate() {
            let row = &logits[r * vocab..(r + 1) * vocab];
            if row.iter().any(|x| x.is_finite()) {
                assert!(
                    row[g.0 as usize].is_finite(),
                    "vocab {vocab} row {r}: picked masked token {}",
                    g.0
                );
            } else {
                assert_eq!(g.0, 0, "vocab {vocab} row {r}: all masked -> id 0");
            }
        }
        compare(
            &mut lab,
            &format!("masked vocab {vocab}"),
            &logits,
            vocab,
            &specs,
            3,
            &mut tally,
        );
    }
    assert!(tally.skipped <= 1, "{tally:?}");
}

#[test]
fn wgpu_sample_top_p_near_zero_and_near_one() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(21);
    let mut tally = Tally::default();
    for vocab in [512usize, 1000, 32000] {
        let rows = 9;
        let logits = uniform_row(&mut rng, rows * vocab, 5.0);
        for top_p in [1e-6f32, 0.01, 0.9999, 0.99999] {
            let specs: Vec<LabSample> = (0..rows)
                .map(|r| LabSample {
                    params: SamplingParams {
                        temperature: [1.0, 0.5, 2.0][r % 3],
                        top_p,
                        top_k: [0, 0, 100][r % 3],
                        seed: rng.next_u64(),
                        ..SamplingParams::default()
                    },
                    position: r as u32,
                    history: Vec::new(),
                    logprobs: None,
                })
                .collect();
            if top_p < 1e-3 {
                // Only the best token is left.
                let got = lab.sample(&logits, vocab, &specs, rows).expect("sample");
                for (r, g) in got.iter().enumerate() {
                    let row = &logits[r * vocab..(r + 1) * vocab];
                    let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
                    assert_eq!(g.0 as usize, best, "top_p {top_p} vocab {vocab} row {r}");
                }
            }
            compare(
                &mut lab,
                &format!("top_p {top_p} vocab {vocab}"),
                &logits,
                vocab,
                &specs,
                4,
                &mut tally,
            );
        }
    }
    eprintln!("{tally:?}");
    assert!(tally.skipped * 20 <= tally.compared, "{tally:?}");
}

#[test]
fn wgpu_sample_ties_resolve_to_the_lower_id() {
    // Rows of a few distinct values, so top-k and top-p cuts and draws land
    // inside runs of equal scaled values: the kernel's search then resolves
    // the run by its ids' bytes (lower ids first, as the sampler's order),
    // over one, two and three id bytes.
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(77);
    let mut tally = Tally::default();
    let levels = [-1.0f32, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0, 2.0];
    for vocab in [200usize, 4099, 70_000] {
        let rows = 8;
        let logits: Vec<f32> = (0..rows * vocab)
            .map(|_| {
                // About 1 in 64 elements holds the top value.
                if rng.below(64) == 0 {
                    3.0
                } else {
                    pick(&mut rng, &levels)
                }
            })
            .collect();
        for (k, top_p, temperature) in [
            (0, 1.0, 1.0),
            (3, 1.0, 0.7),
            (40, 0.47, 1.0),
            (0, 0.3, 1.0),
            (0, 0.9, 2.0),
        ] {
            let specs: Vec<LabSample> = (0..rows)
                .map(|r| LabSample {
                    params: SamplingParams {
                        temperature,
                        top_p,
                        top_k: k,
                        seed: rng.next_u64(),
                        ..SamplingParams::default()
                    },
                    position: r as u32,
                    history: Vec::new(),
                    logprobs: None,
                })
                .collect();
            compare(
                &mut lab,
                &format!("ties: vocab {vocab} top_k {k} top_p {top_p} t {temperature}"),
                &logits,
                vocab,
                &specs,
                3,
                &mut tally,
            );
        }
    }
    eprintln!("{tally:?}");
    assert!(tally.compared >= 100, "{tally:?}");
    assert!(tally.skipped * 20 <= tally.compared, "{tally:?}");
}

#[test]
fn wgpu_sample_logprobs_of_tied_rows_list_the_lower_ids_first() {
    // The n best on rows of a few values: the n-th of the order falls
    // inside a run of equal logits, so which ids are listed, and in which
    // order, is decided by the ids alone; the device must list the CPU's
    // ids exactly, by rounds of argmax (n < 12) and by the search and the
    // gathering pass (n >= 12), greedy and drawn, over 1, 2 and 3 id bytes.
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(78);
    let levels = [-1.0f32, 0.0, 0.5, 1.0, 1.0, 2.0];
    for vocab in [40usize, 4099, 70_000] {
        let rows = 6;
        let logits: Vec<f32> = (0..rows * vocab)
            .map(|_| {
                if rng.below(500) == 0 {
                    3.0
                } else {
                    pick(&mut rng, &levels)
                }
            })
            .collect();
        for n in [4u8, 11, 12, 20, 32] {
            let specs: Vec<LabSample> = (0..rows)
                .map(|r| LabSample {
                    params: SamplingParams {
                        temperature: if r % 2 == 0 { 0.0 } else { 0.8 },
                        top_p: 0.9,
                        seed: rng.next_u64(),
                        ..SamplingParams::default()
                    },
                    position: r as u32,
                    history: Vec::new(),
                    logprobs: Some(n),
                })
                .collect();
            let got = lab.sample(&logits, vocab, &specs, 4).expect("sample");
            for (r, (token, lp)) in got.iter().enumerate() {
                let row = &logits[r * vocab..(r + 1) * vocab];
                let spec = &specs[r];
                let (_, want) = sample(row, &spec.params, spec.position, &[], Some(n));
                let (lp, want) = (lp.as_ref().expect("logprobs"), want.expect("cpu logprobs"));
                let ids = |l: &TokenLogprobs| l.top.iter().map(|x| x.0).collect::<Vec<_>>();
                assert_eq!(
                    ids(lp),
                    ids(&want),
                    "vocab {vocab} n {n} row {r} (token {token})"
                );
                for (g, w) in lp.top.iter().zip(&want.top) {
                    assert!(close(g.1, w.1, 1e-3), "vocab {vocab} n {n}: {g:?} vs {w:?}");
                }
            }
        }
    }
}

#[test]
fn wgpu_sample_logprobs_match_log_softmax() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(34);
    for (vocab, n) in [(3usize, 20u8), (512, 0), (1000, 1), (32000, 20), (5, 5)] {
        let rows = 3;
        let logits = uniform_row(&mut rng, rows * vocab, 8.0);
        let specs: Vec<LabSample> = (0..rows)
            .map(|r| LabSample {
                params: SamplingParams {
                    temperature: [0.0, 0.7, 3.0][r],
                    seed: 9,
                    ..SamplingParams::default()
                },
                position: 4,
                history: Vec::new(),
                logprobs: Some(n),
            })
            .collect();
        let got = lab.sample(&logits, vocab, &specs, 2).expect("sample");
        for (r, (token, lp)) in got.iter().enumerate() {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let full = log_softmax(row);
            let lp = lp.as_ref().expect("asked for logprobs");
            assert!((lp.logprob - full[*token as usize]).abs() < 1e-3);
            assert_eq!(lp.top.len(), (n as usize).min(vocab), "vocab {vocab} n {n}");
            let mut ids: Vec<usize> = (0..vocab).collect();
            ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            for (q, &(id, v)) in lp.top.iter().enumerate() {
                assert_eq!(id as usize, ids[q], "vocab {vocab} row {r} rank {q}");
                assert!((v - full[id as usize]).abs() < 1e-3, "rank {q}: {v}");
            }
        }
    }
}

/// Frequencies of `draws` draws (positions 0..draws) from `row` with `params`.
fn frequencies(lab: &mut KernelLab, row: &[f32], params: SamplingParams, draws: usize) -> Vec<f64> {
    let vocab = row.len();
    let specs: Vec<LabSample> = (0..draws)
        .map(|pos| LabSample {
            params: params.clone(),
            position: pos as u32,
            history: Vec::new(),
            logprobs: None,
        })
        .collect();
    let logits = row.repeat(draws);
    let mut count = vec![0.0; vocab];
    for (t, _) in lab.sample(&logits, vocab, &specs, 1000).expect("sample") {
        count[t as usize] += 1.0;
    }
    count.iter().map(|c| c / draws as f64).collect()
}

/// Softmax of `row / t` cut to the `k` best and the top-p prefix, as
/// probabilities over the whole vocabulary.
fn expected(row: &[f32], t: f64, k: usize, top_p: f64) -> Vec<f64> {
    let mut ids: Vec<usize> = (0..row.len()).collect();
    ids.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    ids.truncate(k.min(row.len()));
    let w: Vec<f64> = ids
        .iter()
        .map(|&i| ((row[i] as f64 - row[ids[0]] as f64) / t).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut kept = 0;
    let mut cum = 0.0;
    while kept < w.len() {
        cum += w[kept];
        kept += 1;
        if cum >= top_p * total {
            break;
        }
    }
    let mut p = vec![0.0; row.len()];
    for (j, &i) in ids[..kept].iter().enumerate() {
        p[i] = w[j] / cum;
    }
    p
}

fn max_abs(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn wgpu_sample_draws_follow_the_distribution() {
    let Some(mut lab) = lab() else { return };
    let row: Vec<f32> = vec![
        2.0, 1.5, 0.3, -0.5, 1.0, 0.0, -2.0, 0.8, -1.0, 0.5, -3.0, 1.2, 0.1, -0.2, -4.0, 0.9,
    ];
    let draws = 6000;
    // 6000 draws: a frequency's standard deviation is at most 0.0065, so
    // 0.03 (about 4.6 of them) is never reached by chance with this fixed
    // seed, while ignoring the temperature or the cuts moves some token's
    // probability by more than 0.06.
    let bound = 0.03;
    let cases = [
        ("temperature 0.7", 0.7f64, 0usize, 1.0f64),
        ("temperature 1.6", 1.6, 0, 1.0),
        ("top_k 4", 1.0, 4, 1.0),
        ("top_p 0.7", 1.0, 0, 0.7),
    ];
    for (what, t, k, top_p) in cases {
        let params = SamplingParams {
            temperature: t as f32,
            top_k: k as u32,
            top_p: top_p as f32,
            seed: 4242,
            ..SamplingParams::default()
        };
        let got = frequencies(&mut lab, &row, params, draws);
        let want = expected(&row, t, if k == 0 { row.len() } else { k }, top_p);
        let err = max_abs(&got, &want);
        // Pearson's chi-square over the kept tokens (15 degrees of freedom
        // at most; 60 is far beyond any chance deviation).
        let chi2: f64 = got
            .iter()
            .zip(&want)
            .filter(|(_, &w)| w > 0.0)
            .map(|(&g, &w)| draws as f64 * (g - w).powi(2) / w)
            .sum();
        eprintln!("{what}: max |freq - p| {err:.4}, chi-square {chi2:.1}");
        assert!(err < bound, "{what}: {got:?} vs {want:?}");
        assert!(chi2 < 60.0, "{what}: chi-square {chi2}");
        // Nothing outside the cuts.
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(w > 0.0 || g == 0.0, "{what}: token {i} drawn but cut");
        }
        // The test can tell: the plain softmax (temperature 1, nothing cut)
        // is far from what these parameters must give.
        let plain = expected(&row, 1.0, row.len(), 1.0);
        assert!(
            max_abs(&want, &plain) > 2.0 * bound,
            "{what}: case too weak"
        );
    }
}

/// Rows with +inf logits (or logits that overflow to +inf once divided by a
/// tiny temperature): the CPU sampler's weights are NaN, so it takes the
/// last element of its order, which with top-p alone is the lowest value
/// (ties to the highest id). Id 0 holds the lowest value in every row here,
/// so the device must answer 0, not the runner-up.
#[test]
fn wgpu_sample_pos_inf_takes_the_last_of_the_order() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(31);
    let mut tally = Tally::default();
    for vocab in [4usize, 300, 5000] {
        let rows = 6;
        let mut logits = uniform_row(&mut rng, rows * vocab, 3.0);
        let mut specs = Vec::new();
        for r in 0..rows {
            let row = &mut logits[r * vocab..(r + 1) * vocab];
            row[0] = if r % 2 == 0 { -50.0 } else { f32::NEG_INFINITY };
            let tiny_t = r >= 3;
            if !tiny_t {
                row[1 + r % (vocab - 1)] = f32::INFINITY;
            } else {
                row[1 + r % (vocab - 1)] = 10.0;
            }
            specs.push(LabSample {
                params: SamplingParams {
                    // 10 / 2e-38 overflows to +inf; the uniform logits do
                    // not. (2e-38 is the smallest kind of temperature that
                    // still draws: a subnormal one is greedy.)
                    temperature: if tiny_t { 2e-38 } else { 0.8 },
                    top_p: [0.9, 0.5, 1e-3][r % 3],
                    top_k: 0,
                    // Min-p stands aside under a +inf maximum, on both.
                    min_p: [0.0, 0.1][r % 2],
                    seed: 7 + r as u64,
                    ..SamplingParams::default()
                },
                position: r as u32,
                history: Vec::new(),
                logprobs: Some(2),
            });
        }
        let got = lab.sample(&logits, vocab, &specs, 4).expect("sample");
        for (r, g) in got.iter().enumerate() {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let (want, _) = sample(row, &specs[r].params, specs[r].position, &[], None);
            assert_eq!(want, 0, "vocab {vocab} row {r}: the cpu takes id 0");
            assert_eq!(g.0, want, "vocab {vocab} row {r}");
        }
        compare(
            &mut lab,
            &format!("+inf vocab {vocab}"),
            &logits,
            vocab,
            &specs,
            4,
            &mut tally,
        );
    }
    assert_eq!(tally.exact, tally.rows, "{tally:?}");
}

/// top_p so small that top_p * total mass is below the kernel's 2^-31 mass
/// unit (the API accepts any top_p in (0, 1]): the CPU keeps the best token
/// alone, so the device must pick it, never an empty prefix.
#[test]
fn wgpu_sample_tiny_top_p_keeps_the_best() {
    let Some(mut lab) = lab() else { return };
    let mut rng = Rng::new(37);
    for vocab in [7usize, 1000] {
        let rows = 6;
        let logits = uniform_row(&mut rng, rows * vocab, 4.0);
        let specs: Vec<LabSample> = (0..rows)
            .map(|r| LabSample {
                params: SamplingParams {
                    temperature: [1.0, 0.7][r % 2],
                    top_p: [1e-10, 1e-20, f32::MIN_POSITIVE][r % 3],
                    top_k: [0, 5][r / 3],
                    seed: rng.next_u64(),
                    ..SamplingParams::default()
                },
                position: r as u32,
                history: Vec::new(),
                logprobs: None,
            })
            .collect();
        let got = lab.sample(&logits, vocab, &specs, rows).expect("sample");
        for (r, g) in got.iter().enumerate() {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            let (want, _) = sample(row, &specs[r].params, specs[r].position, &[], None);
            assert_eq!(want as usize, best, "vocab {vocab} row {r}: cpu");
            assert_eq!(g.0 as usize, best, "vocab {vocab} row {r}: device");
        }
    }
}
