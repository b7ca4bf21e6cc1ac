//! Host side of `shaders/sample.wgsl`: the per-row words the kernel reads
//! (flags and parameters, decided by the same tests as the CPU sampler, the
//! draw's uniform computed here exactly as the CPU sampler computes it, the
//! `logit_bias` and `min_tokens` changes and OpenAI penalty amounts the
//! CPU sampler applies,
//! the deduplicated repetition-penalty history) and the decoding of what it
//! writes back (token ids, logprob blocks).

use tokenwire_core::{TokenId, TokenLogprobs};

use super::pipelines::MAX_DEVICE_LOGPROBS;
use crate::backend::{SampleSpec, Sampled};
use crate::sampler::draw_uniform;

/// Words per row in the kernel's `rows` buffer.
pub(crate) const ROW_WORDS: usize = 16;
const R_FLAGS: usize = 0;
const R_TEMP: usize = 1;
const R_TOP_K: usize = 2;
/// top_p as a 32-bit fraction.
const R_TOP_P: usize = 3;
const R_PENALTY: usize = 4;
/// The draw's uniform as a 32-bit fraction.
const R_U: usize = 5;
const R_HIST_OFF: usize = 6;
const R_HIST_LEN: usize = 7;
const R_N_LOGPROBS: usize = 8;
const R_LP_OFF: usize = 9;
/// Where the row's (id, amount) pairs of the OpenAI penalties start, and
/// how many there are.
const R_OAI_OFF: usize = 10;
const R_OAI_LEN: usize = 11;
/// Where the row's (id, change) pairs start, and how many there are:
/// `logit_bias`'s biases, and -inf for the ids `min_tokens` holds back
/// (`sampler::for_each_logit_change`).
const R_BIAS_OFF: usize = 12;
const R_BIAS_LEN: usize = 13;
/// Min-p's threshold, ln(min_p) as f32 bits (`sampler::min_p_threshold`).
const R_MIN_P: usize = 14;

const F_GREEDY: u32 = 1;
const F_PENALTY: u32 = 2;
const F_TOP_K: u32 = 4;
const F_TOP_P: u32 = 8;
const F_LOGPROBS: u32 = 16;
const F_OPENAI: u32 = 32;
const F_BIAS: u32 = 64;
const F_MIN_P: u32 = 128;
/// Not sampled on the device (its row comes back instead).
const F_SKIP: u32 = 0x8000_0000;

/// The kernel's input for one step, and where its outputs land.
#[derive(Debug, Default, Clone)]
pub(crate) struct SampleRows {
    /// `ROW_WORDS` per row, then the histories.
    pub(crate) words: Vec<u32>,
    /// Per row: sampled on the device, and (word offset, count) of its
    /// logprob block in the output when logprobs were asked for.
    pub(crate) rows: Vec<(bool, Option<(u32, u32)>)>,
    /// Words of the output: one token per row, then the logprob blocks.
    pub(crate) out_words: u32,
}

impl SampleRows {
    /// Whether any row is sampled on the device.
    pub(crate) fn any(&self) -> bool {
        self.rows.iter().any(|r| r.0)
    }
}

/// Scratch of [`encode`], kept between steps so it allocates nothing per
/// token; left cleared.
#[derive(Debug, Default, Clone)]
pub(crate) struct Scratch {
    /// Times each id was generated (the OpenAI penalties), and ids taken
    /// into the repetition penalty's history.
    counts: Vec<u32>,
    /// Ids a change before the penalties was taken for.
    seen: Vec<bool>,
}

/// `x` in [0, 1) as a 32-bit fraction, rounded down (the kernel multiplies
/// masses by it exactly).
fn frac32(x: f64) -> u32 {
    (x.clamp(0.0, 1.0) * 4_294_967_296.0)
        .floor()
        .min(u32::MAX as f64) as u32
}

/// Encodes one row per entry of `specs` (`None`, or more logprobs than
/// [`MAX_DEVICE_LOGPROBS`]: not sampled on the device).
pub(crate) fn encode(
    specs: &[Option<SampleSpec<'_>>],
    vocab: u32,
    scratch: &mut Scratch,
) -> SampleRows {
    let n = specs.len();
    let mut words = vec![0u32; n * ROW_WORDS];
    let mut rows = Vec::with_capacity(n);
    let mut out_words = n as u32;
    let counts = &mut scratch.counts;
    counts.resize(vocab as usize, 0);
    scratch.seen.resize(vocab as usize, false);
    for (i, spec) in specs.iter().enumerate() {
        let at = i * ROW_WORDS;
        // Rows the kernel does not do go to the shared sampler: many
        // logprobs, constrained rows (the grammar's mask is made on the
        // host, so the host applies it; a row read back costs less than a
        // mask upload per step on a batch that is mostly unconstrained),
        // and OpenAI penalties with an amount that is not finite (below).
        let device = spec.filter(|sp| {
            sp.logprobs.is_none_or(|k| k as u32 <= MAX_DEVICE_LOGPROBS) && sp.allowed.is_none()
        });
        let Some(sp) = device else {
            words[at + R_FLAGS] = F_SKIP;
            rows.push((false, None));
            continue;
        };
        let p = sp.params;
        let mut flags = 0;
        if crate::sampler::has_openai_penalties(p) {
            // Each generated id once, with what the sampler subtracts.
            let off = words.len();
            let mut finite = true;
            crate::sampler::for_each_openai_amount(p, sp.history, counts, |t, amount| {
                finite &= amount.is_finite();
                words.extend([t, amount.to_bits()]);
            });
            if !finite {
                // An infinite or NaN amount can make NaN of an infinite
                // logit on the host, which the kernel would read as -inf.
                words.truncate(off);
                words[at + R_FLAGS] = F_SKIP;
                rows.push((false, None));
                continue;
            }
            flags |= F_OPENAI;
            words[at + R_OAI_OFF] = off as u32;
            words[at + R_OAI_LEN] = ((words.len() - off) / 2) as u32;
        }
        // (After the check above, which may skip the row.)
        if !p.logit_bias.is_empty() || p.min_tokens > 0 {
            // Each change the sampler makes before the penalties. Distinct
            // ids: no two invocations touch the same logit.
            let off = words.len();
            crate::sampler::for_each_logit_change(p, sp.history, &mut scratch.seen, |t, c| {
                words.extend([t, c.to_bits()]);
            });
            if words.len() > off {
                flags |= F_BIAS;
                words[at + R_BIAS_OFF] = off as u32;
                words[at + R_BIAS_LEN] = ((words.len() - off) / 2) as u32;
            }
        }
        // The CPU sampler's tests, one for one.
        if crate::sampler::is_greedy(p.temperature) {
            flags |= F_GREEDY;
        }
        let r = p.repetition_penalty;
        let penalty = !(r == 1.0 || r.is_nan() || r <= 0.0 || r.is_infinite());
        if penalty && !sp.history.is_empty() {
            flags |= F_PENALTY;
            let off = words.len();
            for &tok in sp.history {
                if let Some(c) = counts.get_mut(tok as usize).filter(|c| **c == 0) {
                    *c = 1;
                    words.push(tok);
                }
            }
            for &tok in &words[off..] {
                counts[tok as usize] = 0;
            }
            words[at + R_HIST_OFF] = off as u32;
            words[at + R_HIST_LEN] = (words.len() - off) as u32;
        }
        if p.top_k > 0 && p.top_k < vocab {
            flags |= F_TOP_K;
        }
        if p.top_p > 0.0 && p.top_p < 1.0 {
            flags |= F_TOP_P;
        }
        if let Some(floor) = crate::sampler::min_p_threshold(p) {
            flags |= F_MIN_P;
            words[at + R_MIN_P] = floor.to_bits();
        }
        let lp = sp.logprobs.map(|k| {
            let k = (k as u32).min(vocab);
            let block = (out_words, k);
            out_words += 1 + 2 * k;
            block
        });
        if let Some((off, k)) = lp {
            flags |= F_LOGPROBS;
            words[at + R_N_LOGPROBS] = k;
            words[at + R_LP_OFF] = off;
        }
        words[at + R_FLAGS] = flags;
        words[at + R_TEMP] = p.temperature.to_bits();
        words[at + R_TOP_K] = p.top_k;
        words[at + R_TOP_P] = frac32(p.top_p as f64);
        words[at + R_PENALTY] = r.to_bits();
        words[at + R_U] = frac32(draw_uniform(p.seed, sp.position));
        rows.push((true, lp));
    }
    SampleRows {
        words,
        rows,
        out_words,
    }
}

/// What the kernel wrote for each row (`None` for rows it skipped).
pub(crate) fn decode(out: &[u32], rows: &SampleRows) -> Vec<Option<Sampled>> {
    let word = |i: u32| out.get(i as usize).copied().unwrap_or(0);
    rows.rows
        .iter()
        .enumerate()
        .map(|(i, &(device, lp))| {
            device.then(|| Sampled {
                token: word(i as u32) as TokenId,
                logprobs: lp.map(|(off, k)| TokenLogprobs {
                    logprob: f32::from_bits(word(off)),
                    top: (0..k)
                        .map(|q| {
                            let at = off + 1 + 2 * q;
                            (word(at) as TokenId, f32::from_bits(word(at + 1)))
                        })
                        .collect(),
                }),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row sampled at position 2 after `history`, without logprobs.
    fn spec<'a>(params: &'a SamplingParams, history: &'a [TokenId]) -> Option<SampleSpec<'a>> {
        Some(SampleSpec {
            params,
            position: 2,
            history,
            logprobs: None,
            allowed: None,
        })
    }

    fn w_flags(r: &SampleRows, row: usize) -> u32 {
        r.words[row * ROW_WORDS + R_FLAGS]
    }

    #[test]
    fn openai_penalties_go_up_as_generated_ids_with_their_amounts() {
        // The prompt's id 4 is not generated; 150 is past the vocabulary.
        let hist = [4u32, 1, 2, 1, 1, 150];
        let params = |presence: f32, frequency: f32| SamplingParams {
            presence_penalty: presence,
            frequency_penalty: frequency,
            generated_from: 1,
            ..SamplingParams::default()
        };
        let params = [
            params(0.0, 0.0),
            params(0.5, 0.25),
            params(0.5, f32::NAN),
            params(f32::INFINITY, 0.0),
            // Finite, but 3e38 + 3 * 3e38 overflows.
            params(3e38, 3e38),
        ];
        let mut scratch = Scratch::default();
        let specs: Vec<_> = params.iter().map(|p| spec(p, &hist)).collect();
        let r = encode(&specs, 10, &mut scratch);
        assert!(scratch.counts.iter().all(|&c| c == 0));
        // A NaN frequency beside a presence makes NaN amounts, and huge
        // penalties infinite ones: left to the CPU. An infinite penalty
        // alone is off (the sampler's test): sampled on the device, without
        // the pairs.
        assert_eq!(
            r.rows.iter().map(|x| x.0).collect::<Vec<_>>(),
            [true, true, false, true, false]
        );
        assert_eq!(w_flags(&r, 4), F_SKIP);
        assert_eq!(w_flags(&r, 3) & F_OPENAI, 0);
        let w = &r.words;
        assert_eq!(w[R_FLAGS] & F_OPENAI, 0);
        let row = &w[ROW_WORDS..2 * ROW_WORDS];
        assert_eq!(row[R_FLAGS] & F_OPENAI, F_OPENAI);
        let (off, len) = (row[R_OAI_OFF] as usize, row[R_OAI_LEN] as usize);
        let amount = |c: f32| (0.5f32 + 0.25 * c).to_bits();
        assert_eq!(&w[off..off + 2 * len], &[1, amount(3.0), 2, amount(1.0)]);
    }
    use tokenwire_core::SamplingParams;

    #[test]
    fn logit_bias_goes_up_as_the_pairs_the_sampler_applies() {
        let params = |bias: &[(TokenId, f32)]| SamplingParams {
            logit_bias: bias.into(),
            ..SamplingParams::default()
        };
        let params = [
            // Id 3 twice (the first counts), 12 past the vocabulary, a zero
            // and a NaN bias: two pairs go up.
            params(&[
                (3, 1.5),
                (12, 4.0),
                (3, 8.0),
                (5, 0.0),
                (6, f32::NAN),
                (0, -100.0),
            ]),
            // Nothing that changes a logit: no flag, no pairs.
            params(&[(5, 0.0), (40, 1.0)]),
        ];
        let mut scratch = Scratch::default();
        let specs: Vec<_> = params.iter().map(|p| spec(p, &[])).collect();
        let r = encode(&specs, 10, &mut scratch);
        assert!(scratch.seen.iter().all(|&s| !s), "scratch left cleared");
        let w = &r.words;
        assert_eq!(w_flags(&r, 0) & F_BIAS, F_BIAS);
        let (off, len) = (w[R_BIAS_OFF] as usize, w[R_BIAS_LEN] as usize);
        assert_eq!(
            &w[off..off + 2 * len],
            &[3, 1.5f32.to_bits(), 0, (-100.0f32).to_bits()]
        );
        assert_eq!(w_flags(&r, 1) & F_BIAS, 0);
        assert_eq!(r.rows.iter().map(|x| x.0).collect::<Vec<_>>(), [true, true]);
    }

    #[test]
    fn rows_follow_the_samplers_tests() {
        let hist = [5u32, 3, 5, 900, 3, 7];
        let specs = [
            Some(SampleSpec {
                params: &SamplingParams {
                    temperature: 0.7,
                    top_p: 0.9,
                    top_k: 40,
                    repetition_penalty: 1.2,
                    seed: 3,
                    ..SamplingParams::default()
                },
                position: 11,
                history: &hist,
                logprobs: Some(3),
                allowed: None,
            }),
            None,
            Some(SampleSpec {
                params: &SamplingParams {
                    top_k: 100,
                    top_p: 1.0,
                    repetition_penalty: f32::NAN,
                    ..SamplingParams::greedy()
                },
                position: 0,
                history: &hist,
                logprobs: Some(0),
                allowed: None,
            }),
            // More logprobs than the device computes: the row comes back.
            Some(SampleSpec {
                params: &SamplingParams::default(),
                position: 0,
                history: &hist,
                logprobs: Some(MAX_DEVICE_LOGPROBS as u8 + 1),
                allowed: None,
            }),
        ];
        let mut scratch = Scratch::default();
        let r = encode(&specs, 100, &mut scratch);
        assert!(scratch.counts.iter().all(|&c| c == 0));
        let w = &r.words;
        assert_eq!(
            w[R_FLAGS],
            F_PENALTY | F_TOP_K | F_TOP_P | F_LOGPROBS,
            "sampled row"
        );
        let (off, len) = (w[R_HIST_OFF] as usize, w[R_HIST_LEN] as usize);
        assert_eq!(
            &w[off..off + len],
            &[5, 3, 7],
            "distinct, in the vocabulary"
        );
        let u = w[R_U] as f64 / 4_294_967_296.0;
        let exact = draw_uniform(3, 11);
        assert!(u <= exact && exact - u < 1e-9);
        assert_eq!(w[R_TOP_P], (0.9f32 as f64 * 4_294_967_296.0) as u32);
        assert_eq!(w[ROW_WORDS + R_FLAGS], F_SKIP);
        // Greedy, top_k = vocab (off), top_p = 1 (off), NaN penalty (off).
        assert_eq!(w[2 * ROW_WORDS + R_FLAGS], F_GREEDY | F_LOGPROBS);
        assert_eq!(r.rows[0].1, Some((4, 3)));
        assert_eq!(r.rows[2].1, Some((11, 0)));
        assert_eq!(r.out_words, 12);
        assert_eq!(w[3 * ROW_WORDS + R_FLAGS], F_SKIP);
        assert_eq!(r.rows[3], (false, None));
        assert!(r.any());
        assert_eq!(frac32(1.0 - 1e-12), u32::MAX);
        assert_eq!(frac32(0.5), 1 << 31);
    }
}
