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

/// Min-p's threshold as a difference of scaled logits: `ln(min_p)`, in
/// f32, for a `min_p` in (0, 1]; `None` when min-p is off (0, or not a
/// number in range). A token is kept when `s - max >= ln(min_p)` in f32,
/// one subtraction and one comparison that the wgpu kernel makes bit for
/// bit the same (the threshold is computed here, once, for both).
pub(crate) fn min_p_threshold(params: &SamplingParams) -> Option<f32> {
    let m = params.min_p;
    (m > 0.0 && m <= 1.0).then(|| (m as f64).ln() as f32)
}

/// Whether `min_tokens` holds `params.stop_ids` back when the token after
/// `history` is sampled.
fn holds_stop_ids(params: &SamplingParams, history: &[TokenId]) -> bool {
    let generated = history.len().saturating_sub(params.generated_from as usize);
    generated < params.min_tokens as usize && !params.stop_ids.is_empty()
}

/// Calls `each(id, change)` once for every id below `seen.len()` whose
/// logit changes before the penalties: with `change` -inf, an id
/// `min_tokens` holds back (its logit becomes -inf); otherwise the first
/// `params.logit_bias` pair of an id, when its bias is finite and not zero,
/// with that bias, added to the logit (later pairs of an id, ids past the
/// vocabulary and other biases are ignored). The shared sampler applies
/// them, and the wgpu backend sends the pairs to its sampling kernel, so
/// both apply the very same ones. `seen` is scratch, left all false.
pub(crate) fn for_each_logit_change(
    params: &SamplingParams,
    history: &[TokenId],
    seen: &mut [bool],
    mut each: impl FnMut(TokenId, f32),
) {
    let held: &[TokenId] = if holds_stop_ids(params, history) {
        &params.stop_ids
    } else {
        &[]
    };
    for &t in held {
        if let Some(s) = seen.get_mut(t as usize).filter(|s| !**s) {
            *s = true;
            each(t, f32::NEG_INFINITY);
        }
    }
    let applies = |b: f32| b != 0.0 && b.is_finite();
    for &(t, b) in params.logit_bias.iter() {
        if let Some(s) = seen.get_mut(t as usize).filter(|s| !**s) {
            *s = true;
            if applies(b) {
                each(t, b);
            }
        }
    }
    let touched = held.iter().chain(params.logit_bias.iter().map(|(t, _)| t));
    for &t in touched {
        if let Some(s) = seen.get_mut(t as usize) {
            *s = false;
        }
    }
}

/// `x` changed by a [`for_each_logit_change`] change: -inf sets it, any
/// other change is added. (Adding -inf would make NaN of +inf.)
#[inline]
pub(crate) fn changed_logit(x: f32, change: f32) -> f32 {
    if change == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        x + change
    }
}

/// Calls `each(id, amount)` once for every id below `counts.len()` that
/// `history[params.generated_from..]` holds, in order of first appearance,
/// with what OpenAI's presence and frequency penalties subtract from its
/// logit: `presence + frequency * count`, in f32. The shared sampler
/// subtracts it, and the wgpu backend sends it to its sampling kernel, so
/// both use these very operations. `counts` is scratch, left all zero.
pub(crate) fn for_each_openai_amount(
    params: &SamplingParams,
    history: &[TokenId],
    counts: &mut [u32],
    mut each: impl FnMut(TokenId, f32),
) {
    let from = (params.generated_from as usize).min(history.len());
    let generated = &history[from..];
    for &t in generated {
        if let Some(c) = counts.get_mut(t as usize) {
            *c += 1;
        }
    }
    for &t in generated {
        // Each id once: later copies find a zero count.
        if let Some(c) = counts.get_mut(t as usize).filter(|c| **c > 0) {
            each(
                t,
                params.presence_penalty + params.frequency_penalty * *c as f32,
            );
            *c = 0;
        }
    }
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

/// The first entry of the order (`better` over `work`) whose prefix mass
/// (`weights` by id, counted from `start`) reaches `target` (exceeds it,
/// with `strict`): its index i and that mass, with `order` rearranged so
/// that `order[..i]` holds the entries before it (in no particular order)
/// and `order[i]` the entry itself; `None` when the whole of `order` falls
/// short. `start` itself must fall short.
/// A quickselect: each round partitions the candidates around a pivot
/// (median of three), sums the side that comes first, and keeps the side
/// where the running mass crosses the target. The same entries summed in
/// another grouping can round the other way: when a side found to cross
/// the target turns out, entry by entry, not to, the answer is the pivot
/// that closed it (the first entry after it).
fn first_reaching(
    order: &mut [u32],
    work: &[f32],
    weights: &[f64],
    start: f64,
    target: f64,
    strict: bool,
) -> Option<(usize, f64)> {
    let reaches = |mass: f64| {
        if strict {
            mass > target
        } else {
            mass >= target
        }
    };
    let before = |a: u32, b: u32| better(work, a, b).is_lt();
    let (mut lo, mut hi) = (0, order.len());
    // `start` and the mass of order[..lo], every entry of which comes
    // before order[lo..].
    let mut done = start;
    while lo < hi {
        let (a, b, c) = (lo, lo + (hi - lo) / 2, hi - 1);
        let mid = if before(order[a], order[b]) == before(order[b], order[c]) {
            b
        } else if before(order[b], order[a]) == before(order[a], order[c]) {
            a
        } else {
            c
        };
        order.swap(mid, hi - 1);
        let pivot = order[hi - 1];
        let mut split = lo;
        let mut mass = 0.0;
        for i in lo..hi - 1 {
            if before(order[i], pivot) {
                order.swap(i, split);
                mass += weights[order[split] as usize];
                split += 1;
            }
        }
        order.swap(split, hi - 1);
        if reaches(done + mass) {
            hi = split;
        } else {
            done += mass + weights[pivot as usize];
            if reaches(done) {
                return Some((split, done));
            }
            lo = split + 1;
        }
    }
    // lo == hi: below `hi` nothing crossed one entry at a time, so the
    // entry at `hi` (if any round closed the range there) is the first.
    order.get(hi).map(|&t| (hi, done + weights[t as usize]))
}

impl Sampler {
    /// A sampler with empty scratch.
    pub fn new() -> Sampler {
        Sampler::default()
    }

    /// Picks the next token from `logits` (one per vocabulary entry).
    ///
    /// Order: `min_tokens` and `logit_bias` (see
    /// [`SamplingParams::logit_bias`]), Hugging
    /// Face's repetition penalty over the distinct tokens of
    /// `history`, the OpenAI presence and frequency penalties over its
    /// generated part (from `params.generated_from`), then (unless `temperature == 0`, which is greedy with ties
    /// to the lowest id) temperature, min-p, top-k, top-p, and a draw from a PRNG
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
            && params.logit_bias.is_empty()
            && !holds_stop_ids(params, history)
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
        self.apply_logit_changes(params, history);
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

    /// Holds back what `min_tokens` holds back, and adds each `logit_bias`
    /// pair's bias to its token's logit (OpenAI's definition), before the
    /// penalties.
    fn apply_logit_changes(&mut self, params: &SamplingParams, history: &[TokenId]) {
        if params.logit_bias.is_empty() && !holds_stop_ids(params, history) {
            return;
        }
        self.seen.clear();
        self.seen.resize(self.work.len(), false);
        let work = &mut self.work;
        for_each_logit_change(params, history, &mut self.seen, |t, c| {
            work[t as usize] = changed_logit(work[t as usize], c);
        });
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
        self.counts.resize(self.work.len(), 0);
        let work = &mut self.work;
        for_each_openai_amount(params, history, &mut self.counts, |t, amount| {
            work[t as usize] -= amount;
        });
    }

    fn draw(&mut self, params: &SamplingParams, position: u32) -> TokenId {
        // Scaled into its own buffer: logprobs are reported before temperature.
        let t = params.temperature;
        self.scaled.clear();
        self.scaled.extend(self.work.iter().map(|&x| x / t));
        let max = |xs: &[f32]| xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // The maximum, when min-p needed it (what min-p drops never is).
        let mut known_max = None;
        if let Some(floor) = min_p_threshold(params) {
            // Against a finite maximum only (a +inf one keeps the rules for
            // +inf below): what min-p drops weighs nothing, as a -inf.
            let m = max(&self.scaled);
            known_max = Some(m);
            if m.is_finite() {
                for x in &mut self.scaled {
                    if *x - m < floor {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let n = self.scaled.len();
        let k = params.top_k as usize;
        let top_p = params.top_p;
        let use_top_p = top_p > 0.0 && top_p < 1.0;
        let top_k = k > 0 && k < n;
        if use_top_p && !top_k {
            let m = known_max.unwrap_or_else(|| max(&self.scaled));
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
    /// same cut and draw as sorting the whole row, without sorting it. The
    /// best 256 entries are selected and sorted, which holds the cut on a
    /// peaked row; past them, `first_reaching` (a quickselect that follows
    /// the running mass) finds the cut and the draw in time linear in the
    /// rest of the row, however many entries the cut keeps. Past the first
    /// 256, and for the total (summed in id order), the masses are summed in
    /// another sequence than the sorted prefix, so they can differ from
    /// the sorted sums in their last bits.
    fn draw_top_p(&mut self, top_p: f32, m: f32, uniform: f64) -> TokenId {
        const HEAD: usize = 256;
        let work = &self.scaled;
        let n = work.len();
        self.weights.clear();
        self.weights
            .extend(work.iter().map(|&x| ((x - m) as f64).exp()));
        let weights = &self.weights;
        let w = |t: u32| weights[t as usize];
        let total: f64 = weights.iter().sum();
        let target = top_p as f64 * total;
        self.order.clear();
        self.order.extend(0..n as u32);
        let order = &mut self.order;
        let head = HEAD.min(n);
        if head < n {
            order.select_nth_unstable_by(head - 1, |&a, &b| better(work, a, b));
        }
        order[..head].sort_unstable_by(|&a, &b| better(work, a, b));
        // Smallest prefix (best first) whose mass reaches top_p; at least
        // one. Rounding can leave every prefix short: then all of it.
        let mut cut = None;
        let mut cum = 0.0;
        for (i, &t) in order[..head].iter().enumerate() {
            cum += w(t);
            if cum >= target {
                cut = Some((i + 1, cum));
                break;
            }
        }
        let head_mass = cum;
        let (kept, kept_mass) = cut
            .or_else(|| {
                first_reaching(&mut order[head..], work, weights, head_mass, target, false)
                    .map(|(i, mass)| (head + i + 1, mass))
            })
            .unwrap_or((n, total));
        // The first kept entry whose prefix exceeds uniform * kept_mass.
        let u = uniform * kept_mass;
        let sorted = kept.min(head);
        let mut cum = 0.0;
        for &t in &order[..sorted] {
            cum += w(t);
            if u < cum {
                return t;
            }
        }
        let tail = &mut order[sorted..kept];
        if let Some((i, _)) = first_reaching(tail, work, weights, cum, u, true) {
            return tail[i];
        }
        // Rounding left u above them all: the last kept entry with any
        // weight, or the last kept one.
        let worst = |a: u32, b: u32| if better(work, a, b).is_lt() { b } else { a };
        let tail = &order[sorted..kept];
        tail.iter()
            .copied()
            .filter(|&t| w(t) > 0.0)
            .reduce(worst)
            .or_else(|| order[..sorted].iter().rev().copied().find(|&t| w(t) > 0.0))
            .or_else(|| tail.iter().copied().reduce(worst))
            .unwrap_or(order[kept - 1])
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

#[cfg(test)]
mod tests {
    use super::first_reaching;

    #[test]
    fn a_side_that_crosses_only_when_summed_at_once_yields_the_pivot_after_it() {
        // Ids 0..5 in order (values descending), weights by id: two of
        // 2^-53, then 1s. From a mass of 1, the two small ones summed at once
        // reach 1 + 2^-52, but added one at a time each rounds back to 1.
        // The array starts [1, 0, 4, 3, 2]: the first round's pivot is id 2
        // and closes the range on ids 1 and 0; the rounds after that add
        // them one at a time and never reach. The first entry that reaches,
        // one at a time as the sorted walk adds them, is id 2.
        let work = [5.0f32, 4.0, 3.0, 2.0, 1.0];
        let tiny = f64::EPSILON / 2.0;
        let weights = [tiny, tiny, 1.0, 1.0, 1.0];
        let mut order = [1u32, 0, 4, 3, 2];
        let got = first_reaching(&mut order, &work, &weights, 1.0, 1.0 + f64::EPSILON, false);
        assert_eq!(got, Some((2, 2.0)));
        assert_eq!(order[2], 2);
        let mut head = [order[0], order[1]];
        head.sort();
        assert_eq!(head, [0, 1]);
        // Nothing reaches 10: none.
        assert_eq!(
            first_reaching(&mut order, &work, &weights, 1.0, 10.0, false),
            None
        );
    }
}
