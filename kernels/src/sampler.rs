//! The sampler: one deterministic function from logits to the next token,
//! shared by every backend.
//!
//! The random draw at a position depends only on (seed, position, logits,
//! history), so a sequence that is evicted and recomputed continues with the
//! same tokens.

use std::cmp::Ordering;

use tokenwire_core::rng::{mix64, Rng};
use tokenwire_core::{SamplingParams, TokenId, TokenLogprobs, TokenMask};

/// Picks the next token. See [`Sampler::sample`]; this one allocates its scratch.
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    position: u32,
    history: &[TokenId],
    logprobs: Option<u8>,
) -> (TokenId, Option<TokenLogprobs>) {
    Sampler::new().sample(logits, params, position, history, logprobs)
}

/// The uniform in [0, 1) that the draw at `position` of a sequence seeded
/// with `seed` uses (every backend draws with this one).
pub fn draw_uniform(seed: u64, position: u32) -> f64 {
    Rng::new(mix64(seed, position as u64)).next_f64()
}

/// Whether `temperature` means greedy: zero, negative, NaN, infinite, or
/// subnormal. A subnormal temperature is the limit of "almost greedy", and
/// dividing by it overflows every logit (on GPUs that flush denormals it
/// would divide by zero), so every backend treats it as greedy.
pub fn is_greedy(temperature: f32) -> bool {
    !(temperature.is_normal() && temperature > 0.0)
}

/// Log-softmax of `logits` (NaN counts as -inf).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let lse = log_sum_exp(logits);
    logits.iter().map(|&x| clean(x) - lse).collect()
}

/// True when `penalty` is a repetition penalty that changes logits (finite,
/// positive, not 1).
fn has_repetition_penalty(penalty: f32) -> bool {
    penalty != 1.0 && penalty.is_finite() && penalty > 0.0
}

/// True when `params` asks for a presence or frequency penalty (finite and
/// not zero). The wgpu backend applies them on the device, and leaves to
/// [`Sampler`] only rows where one of them, or an amount subtracted, is not
/// finite.
pub fn has_openai_penalties(params: &SamplingParams) -> bool {
    let on = |x: f32| x != 0.0 && x.is_finite();
    on(params.presence_penalty) || on(params.frequency_penalty)
}

/// The sampler with its scratch buffers, so steps do not allocate per token.
#[derive(Debug, Default, Clone)]
pub struct Sampler {
    work: Vec<f32>,
    scaled: Vec<f32>,
    seen: Vec<bool>,
    /// Times each token was generated (the OpenAI penalties); all zero
    /// between calls.
    counts: Vec<u32>,
    order: Vec<u32>,
    weights: Vec<f64>,
}

/// Better first: higher value, then lower id (so ties go to the lowest id).
#[inline]
fn better(work: &[f32], a: u32, b: u32) -> Ordering {
    work[b as usize]
        .total_cmp(&work[a as usize])
        .then(a.cmp(&b))
}

#[inline]
fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

fn log_sum_exp(xs: &[f32]) -> f32 {
    let m = xs
        .iter()
        .copied()
        .map(clean)
        .fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY || !m.is_finite() {
        return m;
    }
    let s: f64 = xs.iter().map(|&x| ((clean(x) - m) as f64).exp()).sum();
    m + s.ln() as f32
}

/// The first index of the largest value, NaN counting as -inf, and 0 when
/// nothing is above -inf: what a scan keeping the first `x > best` gives.
/// In two passes the compiler vectorises (the maximum over 16 lanes, then
/// the first chunk holding it); the scan's dependent compare-and-load was
/// a serial millisecond of every 32-sequence step on SmolLM2's 49,152
/// logits.
fn argmax(xs: &[f32]) -> TokenId {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            // `>` is false for NaN: it never becomes the maximum.
            if x > *m {
                *m = x;
            }
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(tail) {
        if x > max {
            max = x;
        }
    }
    if max == f32::NEG_INFINITY {
        return 0;
    }
    // Equal under `==` is equal under the scan's `>` (no NaN is `max`).
    let first = xs.chunks(LANES).position(|c| c.contains(&max)).unwrap_or(0);
    let at = xs[first * LANES..]
        .iter()
        .position(|&x| x == max)
        .unwrap_or(0);
    (first * LANES + at) as TokenId
}

/// The draw over `kept` (a prefix of the order): the first entry whose
/// cumulative weight exceeds `u`, where `weight(i)` is the weight of entry
/// i. Rounding can leave `u` just above the last cumulative sum: then the
/// last entry with any weight (a masked one has none).
fn pick(kept: &[u32], u: f64, weight: impl Fn(usize) -> f64) -> TokenId {
    let mut cum = 0.0;
    for (i, &id) in kept.iter().enumerate() {
        cum += weight(i);
        if u < cum {
            return id;
        }
    }
    let last = (0..kept.len())
        .rev()
        .find(|&i| weight(i) > 0.0)
        .unwrap_or(kept.len() - 1);
    kept[last]
}

impl Sampler {
    /// A sampler with empty scratch.
    pub fn new() -> Sampler {
        Sampler::default()
    }

    /// Picks the next token from `logits` (one per vocabulary entry).
    ///
    /// Hugging Face order: repetition penalty over the distinct tokens of
    /// `history`, the OpenAI presence and frequency penalties over its
    /// generated part (from `params.generated_from`), then (unless `temperature == 0`, which is greedy with ties
    /// to the lowest id) temperature, top-k, top-p, and a draw from a PRNG
    /// seeded with `mix64(seed, position)`. With `logprobs = Some(n)` also
    /// returns the log-softmax of the penalised logits (before temperature) of
    /// the chosen token and of the `n` best tokens, best first.
    pub fn sample(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        position: u32,
        history: &[TokenId],
        logprobs: Option<u8>,
    ) -> (TokenId, Option<TokenLogprobs>) {
        self.sample_masked(logits, params, position, history, logprobs, None)
    }

    /// [`Sampler::sample`] restricted to the tokens `allowed` allows
    /// (structured output): every other logit counts as -inf before
    /// anything else, so penalties, filters, the draw and the logprobs all
    /// see only allowed tokens (the logprobs are those of the masked
    /// distribution). An allowed set with no finite logit gives the lowest
    /// allowed id.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        position: u32,
        history: &[TokenId],
        logprobs: Option<u8>,
        allowed: Option<&TokenMask>,
    ) -> (TokenId, Option<TokenLogprobs>) {
        if logits.is_empty() {
            return (0, logprobs.map(|_| TokenLogprobs::default()));
        }
        let plain = allowed.is_none()
            && logprobs.is_none()
            && !has_repetition_penalty(params.repetition_penalty)
            && !has_openai_penalties(params);
        if plain && is_greedy(params.temperature) {
            // Nothing changes the logits first: the argmax of the row as
            // given (it reads NaN as -inf, as cleaning would make it).
            return (argmax(logits), None);
        }
        self.work.clear();
        self.work.extend(logits.iter().copied().map(clean));
        if let Some(mask) = allowed {
            for (i, x) in self.work.iter_mut().enumerate() {
                if !mask.allows(i as TokenId) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        self.apply_repetition_penalty(params.repetition_penalty, history);
        self.apply_openai_penalties(params, history);

        let greedy = is_greedy(params.temperature);
        let mut token = if greedy {
            argmax(&self.work)
        } else {
            self.draw(params, position)
        };
        if let Some(mask) = allowed {
            // Only when no allowed token has a finite logit (argmax then
            // falls back to id 0).
            if !mask.allows(token) {
                token = (0..mask.len()).find(|&t| mask.allows(t)).unwrap_or(token);
            }
        }
        let mut lp = logprobs.map(|n| self.logprobs(token, n));
        if let (Some(lp), Some(mask)) = (lp.as_mut(), allowed) {
            // Tokens the grammar forbids are not alternatives (and their
            // -inf has no JSON spelling).
            lp.top.retain(|&(t, l)| mask.allows(t) && l.is_finite());
        }
        (token, lp)
    }

    fn apply_repetition_penalty(&mut self, penalty: f32, history: &[TokenId]) {
        if !has_repetition_penalty(penalty) {
            return;
        }
        let n = self.work.len();
        self.seen.clear();
        self.seen.resize(n, false);
        for &t in history {
            let t = t as usize;
            if t < n && !self.seen[t] {
                self.seen[t] = true;
                let x = &mut self.work[t];
                *x = if *x > 0.0 { *x / penalty } else { *x * penalty };
            }
        }
    }

    /// Subtracts `presence + frequency * count` from the logit of every
    /// token generated `count > 0` times so far (OpenAI's definition).
    fn apply_openai_penalties(&mut self, params: &SamplingParams, history: &[TokenId]) {
        if !has_openai_penalties(params) {
            return;
        }
        let (presence, frequency) = (params.presence_penalty, params.frequency_penalty);
        let n = self.work.len();
        let from = (params.generated_from as usize).min(history.len());
        self.counts.resize(n, 0);
        for &t in &history[from..] {
            if let Some(c) = self.counts.get_mut(t as usize) {
                *c += 1;
            }
        }
        for &t in &history[from..] {
            let t = t as usize;
            if t < n && self.counts[t] > 0 {
                self.work[t] -= presence + frequency * self.counts[t] as f32;
                // Each token once: later copies find a zero count.
                self.counts[t] = 0;
            }
        }
    }

    fn draw(&mut self, params: &SamplingParams, position: u32) -> TokenId {
        // Scaled into its own buffer: logprobs are reported before temperature.
        let t = params.temperature;
        self.scaled.clear();
        self.scaled.extend(self.work.iter().map(|&x| x / t));
        let n = self.scaled.len();
        let k = params.top_k as usize;
        let top_p = params.top_p;
        let use_top_p = top_p > 0.0 && top_p < 1.0;
        let top_k = k > 0 && k < n;
        if use_top_p && !top_k {
            let m = self
                .scaled
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            // A +inf gives the +inf entries NaN weights (inf - inf) and a NaN
            // total, which the general path below handles (it takes the last
            // of the order).
            if m.is_finite() {
                return self.draw_top_p(top_p, m, draw_uniform(params.seed, position));
            }
        }
        self.order.clear();
        self.order.extend(0..n as u32);
        let work = &self.scaled;
        if top_k {
            self.order
                .select_nth_unstable_by(k - 1, |&a, &b| better(work, a, b));
            self.order.truncate(k);
        }
        if use_top_p || top_k {
            self.order.sort_unstable_by(|&a, &b| better(work, a, b));
        }
        let m = self
            .order
            .iter()
            .map(|&i| work[i as usize])
            .fold(f32::NEG_INFINITY, f32::max);
        if m == f32::NEG_INFINITY {
            return argmax(work);
        }
        self.weights.clear();
        self.weights.extend(
            self.order
                .iter()
                .map(|&i| ((work[i as usize] - m) as f64).exp()),
        );
        let total: f64 = self.weights.iter().sum();
        let mut kept = self.weights.len();
        let mut kept_mass = total;
        if use_top_p {
            // Smallest prefix (best first) whose mass reaches top_p; at least one.
            let target = top_p as f64 * total;
            let mut cum = 0.0;
            for (i, w) in self.weights.iter().enumerate() {
                cum += w;
                if cum >= target {
                    kept = i + 1;
                    kept_mass = cum;
                    break;
                }
            }
        }
        let u = draw_uniform(params.seed, position) * kept_mass;
        let weights = &self.weights;
        pick(&self.order[..kept], u, |i| weights[i])
    }

    /// Top-p without top-k over `self.scaled` (maximum `m`, finite): the
    /// same cut and draw as sorting the whole row, but only the best part
    /// of the order is sorted, in growing slices, each the best of what
    /// is left (`select_nth_unstable_by`), until the prefix reaches the
    /// target. The prefix sums run in the order's sequence as before; the
    /// total is summed in id order, so it can differ from a sorted sum in
    /// its last bits.
    fn draw_top_p(&mut self, top_p: f32, m: f32, uniform: f64) -> TokenId {
        let work = &self.scaled;
        let n = work.len();
        self.weights.clear();
        self.weights
            .extend(work.iter().map(|&x| ((x - m) as f64).exp()));
        let total: f64 = self.weights.iter().sum();
        let target = top_p as f64 * total;
        self.order.clear();
        self.order.extend(0..n as u32);
        let mut kept = n;
        let mut kept_mass = total;
        let mut cum = 0.0;
        let (mut start, mut slice) = (0, 256);
        'slices: while start < n {
            let end = (start + slice).min(n);
            let rest = &mut self.order[start..];
            if end < n {
                rest.select_nth_unstable_by(end - start - 1, |&a, &b| better(work, a, b));
            }
            rest[..end - start].sort_unstable_by(|&a, &b| better(work, a, b));
            for i in start..end {
                cum += self.weights[self.order[i] as usize];
                if cum >= target {
                    kept = i + 1;
                    kept_mass = cum;
                    break 'slices;
                }
            }
            start = end;
            slice *= 4;
        }
        let (order, weights) = (&self.order, &self.weights);
        pick(&order[..kept], uniform * kept_mass, |i| {
            weights[order[i] as usize]
        })
    }

    fn logprobs(&mut self, token: TokenId, n: u8) -> TokenLogprobs {
        let lse = log_sum_exp(&self.work);
        let work = &self.work;
        let lp = |t: u32| work[t as usize] - lse;
        let n = (n as usize).min(work.len());
        self.order.clear();
        self.order.extend(0..work.len() as u32);
        if n > 0 && n < work.len() {
            self.order
                .select_nth_unstable_by(n - 1, |&a, &b| better(work, a, b));
        }
        self.order.truncate(n);
        self.order.sort_unstable_by(|&a, &b| better(work, a, b));
        TokenLogprobs {
            logprob: lp(token),
            top: self.order.iter().map(|&t| (t, lp(t))).collect(),
        }
    }
}
