// Sampling on the device: finishes logits row r into its next token (and its
// logprobs when asked) by the rule of the shared CPU sampler
// (kernels/src/sampler.rs, `Sampler::sample`), so a step reads back token ids
// instead of vocabulary rows.
//
// * logit_bias and min_tokens first: the host sends the (id, change) pairs
//   the sampler applies (distinct ids); a change of -inf (an id min_tokens
//   holds back) writes -inf, any other is added (x + bias).
// * Repetition penalty (x > 0 ? x / p : x * p) over the row's distinct
//   history ids (deduplicated by the host), written back into the row; NaN
//   counts as -inf. Then the OpenAI presence and frequency penalties: the
//   host sends each generated id once with the amount the sampler
//   subtracts from its logit (presence + frequency * count, computed in
//   f32 as the sampler does), and x - amount is written back.
// * Temperature 0 (or not finite and positive): argmax, ties to the lowest id.
// * Otherwise s = x / t; with min-p, every s with s - max(s) < ln(min_p)
//   (f32, the threshold from the host) becomes -inf when max(s) is finite.
//   The sampler's "order" is (s descending, id ascending). Top-k keeps its
//   first k, top-p the shortest prefix of what is
//   kept whose mass (sum of exp(s - max)) reaches top_p times the kept total,
//   and the draw takes the first kept element whose cumulative mass exceeds
//   u * kept mass (u uploaded by the host, drawn exactly as the CPU sampler
//   draws it). With neither top-k nor top-p the CPU sampler accumulates in id
//   order, and so does this kernel.
// * Nothing is sorted. s maps to an order-preserving u32 key, and every
//   "first element of the order whose prefix reaches X" is found by radix
//   select (`search`): a pass over the row sums the count and mass of the
//   candidates into 256 buckets by the key's next 8 bits (workgroup atomics),
//   and a scan of the buckets from the top finds the one where the running
//   sum reaches X; the next pass looks only inside it. Four passes fix the
//   key; ties at that key are resolved the same way over the ids' bits
//   (ascending), and a bucket holding a single element ends the search early.
//   A search over a 32000-entry row takes at most 6 passes (bisection took
//   about 48). Whole-row sums and argmaxes are one pass and a
//   workgroup reduction (per invocation partial sums, then GROUPS x FAN in
//   workgroup memory: two barriers, no subgroup operations). A prefix of the
//   order is named (K, I): every element with key > K, and those with key ==
//   K and id <= I.
// * Masses are exact sums: each weight exp(s - max) (f32, in [0, 1]) is
//   rounded to a multiple of 2^-31 and summed as a 64-bit integer (two u32
//   words, the low word's carries counted into the high word even when
//   added atomically), so a sum does not depend on the order of the
//   additions, grows
//   with every element added, and differs from the CPU sampler's f64 sums
//   only by the rounding of each f32 exp (and 2^-32 per element). The
//   top-p and draw targets are p * total and u * kept with p and u as 32-bit
//   fractions, multiplied exactly.
// * Logprobs: log-softmax of the penalised row (before temperature): the
//   chosen token's, and the n best (id, logprob) pairs, best first, ties to
//   the lower id: for n of at least NTH_SEARCH_FROM (12), a count search finds
//   the n-th of the penalised order, one pass gathers the n before it, and
//   each is written at its rank among them; for fewer, n rounds of masked
//   argmax.
//
// One workgroup per row. Every decision below is taken on values that each
// invocation computes identically from workgroup memory, so control flow
// around the barriers stays uniform.
//
// Loops over the row visit UNROLL elements per iteration, written out:
// llvmpipe (lavapipe) silently ends every loop of an invocation after 65535
// iterations in all, so the host also picks WG on CPU adapters to keep a
// row's whole run below that (see `sample_loop_bound` in pipelines.rs). And
// each search, sum and argmax is called from as few places as possible:
// every call is inlined, and llvmpipe compiles a big shader slowly.

struct Params {
    n_rows: u32,   // rows in this dispatch
    vocab: u32,    // row length
    out_base: u32, // index of this dispatch's first row among the step's
    _p3: u32,
    _p4: u32, _p5: u32, _p6: u32, _p7: u32,
    _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

// f32 bits, so NaN payloads are seen as they are.
@group(0) @binding(0) var<storage, read_write> logits: array<u32>;
// ROW_WORDS words per row of the step, then the deduplicated histories.
@group(0) @binding(1) var<storage, read> rows: array<u32>;
// One token id per row of the step, then the logprob blocks.
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(1) @binding(0) var<uniform> p: Params;

// WG (invocations per workgroup, a power of two) and FAN (WG = FAN * GROUPS)
// are prepended by pipelines.rs: 256 on GPUs, fewer on CPU adapters; so is
// NTH_SEARCH_FROM (below).
const GROUPS: u32 = WG / FAN;
const UNROLL: u32 = 8u;
const STRIDE: u32 = WG * UNROLL;
const ROW_WORDS: u32 = 16u;
// Row words (see sample.rs).
const R_FLAGS: u32 = 0u;
const R_TEMP: u32 = 1u;
const R_TOP_K: u32 = 2u;
const R_TOP_P: u32 = 3u; // a 32-bit fraction
const R_PENALTY: u32 = 4u;
const R_U: u32 = 5u; // a 32-bit fraction
const R_HIST_OFF: u32 = 6u;
const R_HIST_LEN: u32 = 7u;
const R_N_LOGPROBS: u32 = 8u;
const R_LP_OFF: u32 = 9u;
const R_OAI_OFF: u32 = 10u; // (id, amount) pairs of the OpenAI penalties
const R_OAI_LEN: u32 = 11u;
const R_BIAS_OFF: u32 = 12u; // (id, change) pairs: logit_bias, min_tokens
const R_BIAS_LEN: u32 = 13u;
const R_MIN_P: u32 = 14u; // ln(min_p), f32 bits
// Flags.
const F_GREEDY: u32 = 1u;
const F_PENALTY: u32 = 2u;
const F_TOP_K: u32 = 4u;
const F_TOP_P: u32 = 8u;
const F_LOGPROBS: u32 = 16u;
const F_OPENAI: u32 = 32u;
const F_BIAS: u32 = 64u;
const F_MIN_P: u32 = 128u;
const F_SKIP: u32 = 0x80000000u;

const NEG_INF: u32 = 0xff800000u;
// okey(-inf) and okey(+inf): the smallest and largest keys of NaN-free values.
const KEY_NEG_INF: u32 = 0x007fffffu;
const KEY_POS_INF: u32 = 0xff800000u;
const NONE: u32 = 0xffffffffu;

var<workgroup> part_hi: array<u32, WG>;
var<workgroup> part_lo: array<u32, WG>;
var<workgroup> part_c: array<u32, WG>;
var<workgroup> mid_hi: array<u32, GROUPS>;
var<workgroup> mid_lo: array<u32, GROUPS>;
var<workgroup> mid_c: array<u32, GROUPS>;
var<workgroup> part_k: array<u32, WG>;
var<workgroup> part_i: array<u32, WG>;
var<workgroup> mid_k: array<u32, GROUPS>;
var<workgroup> mid_i: array<u32, GROUPS>;
// The radix select's buckets: mass (high, low words), count and smallest id
// of the candidates whose next 8 bits of the order are the bucket's, and the
// sums of 16 buckets each.
const RADIX: u32 = 256u;
const BUCKET_GROUPS: u32 = 16u;
const PER_GROUP: u32 = RADIX / BUCKET_GROUPS;
var<workgroup> bk_hi: array<atomic<u32>, RADIX>;
var<workgroup> bk_lo: array<atomic<u32>, RADIX>;
var<workgroup> bk_c: array<atomic<u32>, RADIX>;
var<workgroup> bk_id: array<atomic<u32>, RADIX>;
var<workgroup> grp_hi: array<u32, BUCKET_GROUPS>;
var<workgroup> grp_lo: array<u32, BUCKET_GROUPS>;
var<workgroup> grp_c: array<u32, BUCKET_GROUPS>;

// The same in every invocation of the workgroup.
var<private> lid: u32;
var<private> base: u32; // the row's first word in `logits`
var<private> n: u32;    // vocabulary
var<private> temp: f32; // temperature
var<private> mx: f32;   // the maximum weights are taken against (finite)
// Min-p, once mx is known and finite: scaled values with s - mx < floor
// are -inf.
var<private> min_p_on: bool;
var<private> min_p_floor: f32;
// The logprobs' search: "scaled" is the penalised row itself (the order
// of the n best is before temperature and min-p).
var<private> raw_order: bool;
// The n-th of the penalised order, once the logprobs' search found it.
var<private> nth_key: u32;
var<private> nth_id: u32;
// This invocation's run of consecutive candidates in one bucket, added to
// the buckets at once (most candidates of the first pass share a handful of
// buckets: one set of atomics per run, up to four, not per element).
var<private> run_b: u32; // bucket, or NONE
var<private> run_m: vec2<u32>;
var<private> run_c: u32;
var<private> run_id: u32; // the run's first (smallest) id

// Penalised logit j, NaN as -inf.
fn work(j: u32) -> f32 {
    let b = logits[base + j];
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return bitcast<f32>(NEG_INF);
    }
    return bitcast<f32>(b);
}

fn scaled(j: u32) -> f32 {
    if (raw_order) {
        return work(j);
    }
    let s = work(j) / temp;
    if (min_p_on && s - mx < min_p_floor) {
        return bitcast<f32>(NEG_INF);
    }
    return s;
}

// Order-preserving key of a NaN-free f32 (total order: -0 below +0, as
// `f32::total_cmp`, which the sampler's sort uses).
fn okey(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// Key for argmax by `>`: -0 and +0 are equal.
fn gkey(x: f32) -> u32 {
    var b = bitcast<u32>(x);
    if (b == 0x80000000u) {
        b = 0u;
    }
    return okey(bitcast<f32>(b));
}

// Whether (k, j) lies in prefix (pk, pi) of the order.
fn in_prefix(k: u32, j: u32, pk: u32, pi: u32) -> bool {
    return k > pk || (k == pk && j <= pi);
}

// The shorter of two prefixes (their intersection).
fn shorter(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (in_prefix(a.x, a.y, b.x, b.y)) {
        return a;
    }
    return b;
}

// A mass: a 64-bit count of 2^-31 units, (high word, low word).
fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.y + b.y;
    return vec2<u32>(a.x + b.x + select(0u, 1u, lo < a.y), lo);
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y >= b.y);
}

fn gt64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y > b.y);
}

// exp(d) for d <= 0 in units of 2^-31, rounded.
fn units(d: f32) -> u32 {
    return u32(exp(d) * 2147483648.0 + 0.5);
}

// floor(f / 2^32 * k), or with `up` its ceiling: a 32-bit fraction of a
// mass, exactly (16-bit limbs).
fn mul_frac(f: u32, k: vec2<u32>, up: bool) -> vec2<u32> {
    let fl = array<u32, 2>(f & 0xffffu, f >> 16u);
    let kl = array<u32, 4>(k.y & 0xffffu, k.y >> 16u, k.x & 0xffffu, k.x >> 16u);
    var col = array<u32, 7>(0u, 0u, 0u, 0u, 0u, 0u, 0u);
    for (var i = 0u; i < 2u; i++) {
        for (var j = 0u; j < 4u; j++) {
            let t = fl[i] * kl[j];
            col[i + j] += t & 0xffffu;
            col[i + j + 1u] += t >> 16u;
        }
    }
    var r = array<u32, 6>(0u, 0u, 0u, 0u, 0u, 0u);
    var carry = 0u;
    for (var m = 0u; m < 6u; m++) {
        let v = col[m] + carry;
        r[m] = v & 0xffffu;
        carry = v >> 16u;
    }
    let q = vec2<u32>(r[4] | (r[5] << 16u), r[2] | (r[3] << 16u));
    if (up && (r[0] | r[1]) != 0u) {
        return add64(q, vec2<u32>(0u, 1u));
    }
    return q;
}

struct Sum {
    m: vec2<u32>,
    c: u32,
}

// Workgroup sums of every invocation's (mass, count).
fn reduce_sum(m: vec2<u32>, c: u32) -> Sum {
    part_hi[lid] = m.x;
    part_lo[lid] = m.y;
    part_c[lid] = c;
    workgroupBarrier();
    if (lid < GROUPS) {
        var a = vec2<u32>(0u, 0u);
        var k = 0u;
        for (var i = 0u; i < FAN; i++) {
            a = add64(a, vec2<u32>(part_hi[lid * FAN + i], part_lo[lid * FAN + i]));
            k += part_c[lid * FAN + i];
        }
        mid_hi[lid] = a.x;
        mid_lo[lid] = a.y;
        mid_c[lid] = k;
    }
    workgroupBarrier();
    var a = vec2<u32>(0u, 0u);
    var k = 0u;
    for (var i = 0u; i < GROUPS; i++) {
        a = add64(a, vec2<u32>(mid_hi[i], mid_lo[i]));
        k += mid_c[i];
    }
    return Sum(a, k);
}

// Whether (kb, ib) comes before (ka, ia): higher key, then lower id.
fn before(kb: u32, ib: u32, ka: u32, ia: u32) -> bool {
    return kb > ka || (kb == ka && ib < ia);
}

// The earlier of a and c, where (.., NONE) is "none".
fn better(a: vec2<u32>, c: vec2<u32>) -> vec2<u32> {
    if (c.y != NONE && (a.y == NONE || before(c.x, c.y, a.x, a.y))) {
        return c;
    }
    return a;
}

// Workgroup best of every invocation's (key, id); (0, NONE) is "none".
fn reduce_best(b: vec2<u32>) -> vec2<u32> {
    part_k[lid] = b.x;
    part_i[lid] = b.y;
    workgroupBarrier();
    if (lid < GROUPS) {
        var m = vec2<u32>(0u, NONE);
        for (var j = 0u; j < FAN; j++) {
            m = better(m, vec2<u32>(part_k[lid * FAN + j], part_i[lid * FAN + j]));
        }
        mid_k[lid] = m.x;
        mid_i[lid] = m.y;
    }
    workgroupBarrier();
    var m = vec2<u32>(0u, NONE);
    for (var j = 0u; j < GROUPS; j++) {
        m = better(m, vec2<u32>(mid_k[j], mid_i[j]));
    }
    return m;
}

// What best_of looks for.
const B_ARGMAX: u32 = 0u; // the argmax of the penalised row (-0 == +0)
const B_FIRST: u32 = 1u;  // the first of the scaled order
const B_LAST: u32 = 2u;   // the last of the scaled order (key complemented, id n - 1 - id)
const B_NEXT: u32 = 3u;   // the first of the penalised order after prefix (pk, pi)

// Element j as a candidate: (key, id), or (0, NONE).
fn candidate(kind: u32, j: u32, pk: u32, pi: u32) -> vec2<u32> {
    if (j >= n) {
        return vec2<u32>(0u, NONE);
    }
    switch kind {
        case B_ARGMAX: {
            return vec2<u32>(gkey(work(j)), j);
        }
        case B_FIRST: {
            return vec2<u32>(okey(scaled(j)), j);
        }
        case B_LAST: {
            // Reversed, "before" picks the lowest key and the highest id.
            // (n - 1 - j, not ~j: ~0 would be NONE and drop id 0.)
            return vec2<u32>(~okey(scaled(j)), n - 1u - j);
        }
        default: {
            let k = okey(work(j));
            if (in_prefix(k, j, pk, pi)) {
                return vec2<u32>(0u, NONE);
            }
            return vec2<u32>(k, j);
        }
    }
}

fn best_of(kind: u32, pk: u32, pi: u32) -> vec2<u32> {
    var b = vec2<u32>(0u, NONE);
    for (var j = lid; j < n; j += STRIDE) {
        b = better(b, candidate(kind, j, pk, pi));
        b = better(b, candidate(kind, j + WG, pk, pi));
        b = better(b, candidate(kind, j + 2u * WG, pk, pi));
        b = better(b, candidate(kind, j + 3u * WG, pk, pi));
        b = better(b, candidate(kind, j + 4u * WG, pk, pi));
        b = better(b, candidate(kind, j + 5u * WG, pk, pi));
        b = better(b, candidate(kind, j + 6u * WG, pk, pi));
        b = better(b, candidate(kind, j + 7u * WG, pk, pi));
    }
    return reduce_best(b);
}

// What sum_of adds up.
const S_MASS: u32 = 1u;  // count and mass of prefix (pk, pi) of the scaled order
const S_IDS: u32 = 2u;   // mass of ids 0..=pi (id order)
const S_LSE: u32 = 3u;   // mass of the penalised row against mx

// Element j's (mass units, count) for sum_of.
fn term(kind: u32, j: u32, pk: u32, pi: u32) -> vec2<u32> {
    if (j >= n) {
        return vec2<u32>(0u, 0u);
    }
    switch kind {
        case S_MASS: {
            let s = scaled(j);
            if (in_prefix(okey(s), j, pk, pi)) {
                return vec2<u32>(units(s - mx), 1u);
            }
            return vec2<u32>(0u, 0u);
        }
        case S_IDS: {
            if (j <= pi) {
                return vec2<u32>(units(scaled(j) - mx), 1u);
            }
            return vec2<u32>(0u, 0u);
        }
        default: {
            return vec2<u32>(units(work(j) - mx), 1u);
        }
    }
}

fn add_term(acc: ptr<function, Sum>, t: vec2<u32>) {
    (*acc).m = add64((*acc).m, vec2<u32>(0u, t.x));
    (*acc).c += t.y;
}

fn sum_of(kind: u32, pk: u32, pi: u32) -> Sum {
    var a = Sum(vec2<u32>(0u, 0u), 0u);
    for (var j = lid; j < n; j += STRIDE) {
        add_term(&a, term(kind, j, pk, pi));
        add_term(&a, term(kind, j + WG, pk, pi));
        add_term(&a, term(kind, j + 2u * WG, pk, pi));
        add_term(&a, term(kind, j + 3u * WG, pk, pi));
        add_term(&a, term(kind, j + 4u * WG, pk, pi));
        add_term(&a, term(kind, j + 5u * WG, pk, pi));
        add_term(&a, term(kind, j + 6u * WG, pk, pi));
        add_term(&a, term(kind, j + 7u * WG, pk, pi));
    }
    return reduce_sum(a.m, a.c);
}

// What a search looks for: the first prefix whose count or mass meets a goal.
const COUNT_GE: u32 = 0u; // count >= goal_c (scaled order)
const MASS_GE: u32 = 1u;  // mass >= goal_m (scaled order)
const MASS_GT: u32 = 2u;  // mass > goal_m (scaled order, or id order by_id)
const MEASURE: u32 = 3u;  // no search: the mass of the bound itself

struct Found {
    key: u32,
    id: u32,
    m: vec2<u32>, // mass of the prefix (key, id), cut to `bound`
}

fn meets(mode: u32, m: vec2<u32>, c: u32, goal_m: vec2<u32>, goal_c: u32) -> bool {
    if (mode == COUNT_GE) {
        return c >= goal_c;
    }
    if (mode == MASS_GE) {
        return ge64(m, goal_m);
    }
    return gt64(m, goal_m);
}

// Whether a and b agree above bit s + 7 (always, when there are none).
fn same_above(a: u32, b: u32, s: u32) -> bool {
    return s + 8u >= 32u || (a >> (s + 8u)) == (b >> (s + 8u));
}

// Element j as a candidate of a radix pass: (bucket, mass units), or
// (NONE, _) when it lies outside `bound` or outside the buckets chosen so
// far, or weighs nothing in a mass search. Key passes bucket the key's bits s..s+7 (key prefix kp fixed above
// them); id passes take the elements whose key is kp (every element by_id)
// and bucket their ids' bits s..s+7 reversed, so the scan from the top
// meets lower ids first.
fn radix_term(
    j: u32,
    key_pass: bool,
    s: u32,
    kp: u32,
    ip: u32,
    by_id: bool,
    bound: vec2<u32>,
    mass: bool,
) -> vec2<u32> {
    if (j >= n) {
        return vec2<u32>(NONE, 0u);
    }
    let x = scaled(j);
    var d = NONE;
    if (by_id) {
        if (same_above(j, ip, s)) {
            d = 255u - ((j >> s) & 255u);
        }
    } else {
        let k = okey(x);
        if (in_prefix(k, j, bound.x, bound.y)) {
            if (key_pass) {
                if (same_above(k, kp, s)) {
                    d = (k >> s) & 255u;
                }
            } else if (k == kp && same_above(j, ip, s)) {
                d = 255u - ((j >> s) & 255u);
            }
        }
    }
    if (d == NONE || !mass) {
        return vec2<u32>(d, 0u);
    }
    // An element without mass never moves a running mass across a goal, so
    // mass searches leave it out (fewer atomics: most of a peaked row).
    let u = units(x - mx);
    return vec2<u32>(select(NONE, d, u != 0u), u);
}

fn flush_run() {
    if (run_b == NONE) {
        return;
    }
    if (run_m.y != 0u) {
        let old = atomicAdd(&bk_lo[run_b], run_m.y);
        run_m.x += select(0u, 1u, old + run_m.y < old);
    }
    if (run_m.x != 0u) {
        atomicAdd(&bk_hi[run_b], run_m.x);
    }
    atomicAdd(&bk_c[run_b], run_c);
    atomicMin(&bk_id[run_b], run_id);
    run_b = NONE;
}

fn add_run(t: vec2<u32>, j: u32) {
    if (t.x == NONE) {
        return;
    }
    if (t.x != run_b) {
        flush_run();
        run_b = t.x;
        run_m = vec2<u32>(0u, 0u);
        run_c = 0u;
        run_id = j;
    }
    run_m = add64(run_m, vec2<u32>(0u, t.y));
    run_c += 1u;
}

fn bucket_mass(b: u32) -> vec2<u32> {
    return vec2<u32>(atomicLoad(&bk_hi[b]), atomicLoad(&bk_lo[b]));
}

// The first element (key, id) of the order (scaled, or ids ascending with
// by_id) whose prefix, cut to `bound`, meets the goal; the caller knows that
// the whole bound does. MEASURE only sums the bound. The kernel inlines
// every call, so there is one call site (in `choose`).
fn search(
    mode: u32,
    bound: vec2<u32>,
    goal_m: vec2<u32>,
    goal_c: u32,
    by_id: bool,
) -> Found {
    if (mode == MEASURE) {
        let kind = select(S_MASS, S_IDS, by_id);
        return Found(bound.x, bound.y, sum_of(kind, bound.x, bound.y).m);
    }
    let mass = mode != COUNT_GE;
    // Passes 0-3 take the key's bytes from the top; then the ids' bytes,
    // as many as the largest id has.
    let id_bytes = (39u - countLeadingZeros(max(n - 1u, 1u))) / 8u;
    let end = 4u + id_bytes;
    var level = select(0u, 4u, by_id);
    var kp = 0u;
    var ip = 0u;
    var above = vec2<u32>(0u, 0u); // before the buckets scanned
    var above_c = 0u;
    var found = Found(0u, 0u, vec2<u32>(0u, 0u));
    loop {
        let key_pass = level < 4u;
        let s = select(8u * (end - 1u - level), 24u - 8u * level, key_pass);
        for (var i = lid; i < RADIX; i += WG) {
            atomicStore(&bk_hi[i], 0u);
            atomicStore(&bk_lo[i], 0u);
            atomicStore(&bk_c[i], 0u);
            atomicStore(&bk_id[i], NONE);
        }
        workgroupBarrier();
        run_b = NONE;
        for (var j = lid; j < n; j += STRIDE) {
            add_run(radix_term(j, key_pass, s, kp, ip, by_id, bound, mass), j);
            add_run(radix_term(j + WG, key_pass, s, kp, ip, by_id, bound, mass), j + WG);
            add_run(radix_term(j + 2u * WG, key_pass, s, kp, ip, by_id, bound, mass), j + 2u * WG);
            add_run(radix_term(j + 3u * WG, key_pass, s, kp, ip, by_id, bound, mass), j + 3u * WG);
            add_run(radix_term(j + 4u * WG, key_pass, s, kp, ip, by_id, bound, mass), j + 4u * WG);
            add_run(radix_term(j + 5u * WG, key_pass, s, kp, ip, by_id, bound, mass), j + 5u * WG);
            add_run(radix_term(j + 6u * WG, key_pass, s, kp, ip, by_id, bound, mass), j + 6u * WG);
            add_run(radix_term(j + 7u * WG, key_pass, s, kp, ip, by_id, bound, mass), j + 7u * WG);
        }
        flush_run();
        workgroupBarrier();
        for (var g = lid; g < BUCKET_GROUPS; g += WG) {
            var a = vec2<u32>(0u, 0u);
            var c = 0u;
            for (var i = 0u; i < PER_GROUP; i++) {
                a = add64(a, bucket_mass(g * PER_GROUP + i));
                c += atomicLoad(&bk_c[g * PER_GROUP + i]);
            }
            grp_hi[g] = a.x;
            grp_lo[g] = a.y;
            grp_c[g] = c;
        }
        workgroupBarrier();
        // Every invocation scans the same sums: the group, then the bucket,
        // where the running sum meets the goal.
        var g = BUCKET_GROUPS - 1u;
        loop {
            let m = add64(above, vec2<u32>(grp_hi[g], grp_lo[g]));
            let c = above_c + grp_c[g];
            if (g == 0u || meets(mode, m, c, goal_m, goal_c)) {
                break;
            }
            above = m;
            above_c = c;
            g -= 1u;
        }
        var b = g * PER_GROUP + PER_GROUP - 1u;
        var bm = vec2<u32>(0u, 0u);
        var bc = 0u;
        loop {
            bm = bucket_mass(b);
            bc = atomicLoad(&bk_c[b]);
            if (b == g * PER_GROUP || meets(mode, add64(above, bm), above_c + bc, goal_m, goal_c)) {
                break;
            }
            above = add64(above, bm);
            above_c += bc;
            b -= 1u;
        }
        var first = atomicLoad(&bk_id[b]);
        if (first == NONE) {
            // Only if the goal were beyond the bound's sum, which the
            // callers rule out: still a valid id.
            first = min(bound.y, n - 1u);
        }
        // Every invocation has read the buckets before the next pass clears them.
        workgroupBarrier();
        if (key_pass) {
            kp |= b << s;
        } else {
            ip |= (255u - b) << s;
        }
        // The last pass leaves one element a bucket: ids are distinct.
        if (bc <= 1u || level + 1u >= end) {
            var key = 0u;
            if (!by_id) {
                key = okey(scaled(first));
            }
            found = Found(key, first, add64(above, bm));
            break;
        }
        level += 1u;
    }
    return found;
}

// Steps of the draw.
const D_TOP_K: u32 = 0u;
const D_KEPT: u32 = 1u;
const D_TOP_P: u32 = 2u;
const D_DRAW: u32 = 3u;
const D_IDS_TOTAL: u32 = 4u;
const D_IDS_DRAW: u32 = 5u;
const D_DONE: u32 = 6u;
const D_NTH: u32 = 7u; // the logprobs' n-th (not a step of the draw)

// NTH_SEARCH_FROM (prepended by pipelines.rs, `SAMPLE_NTH_SEARCH_FROM`):
// logprobs of at least this many best tokens find the n-th of the order by
// one count search and gather the n best in one pass; fewer take n rounds
// of masked argmax.

// The row's token: the argmax when greedy, else the draw (temperature >
// 0). With nth > 0, then also the nth element of the penalised order
// (into nth_key, nth_id), by the same single search call site.
fn choose(row: u32, flags: u32, nth_wanted: u32) -> u32 {
    var nth = nth_wanted;
    let whole = vec2<u32>(0u, n - 1u);
    var token = 0u;
    var step = D_DONE;
    let top_k = (flags & F_TOP_K) != 0u;
    let top_p = (flags & F_TOP_P) != 0u;
    var pos_inf = false;
    if ((flags & F_GREEDY) != 0u) {
        token = best_of(B_ARGMAX, 0u, 0u).y;
    } else {
        // The first of the scaled order; when it is +inf, the last one too.
        var top = vec2<u32>(0u, NONE);
        var last = 0u;
        for (var t = 0u; t < 2u; t++) {
            let b = best_of(select(B_FIRST, B_LAST, t == 1u), 0u, 0u);
            if (t == 0u) {
                top = b;
                if (top.x != KEY_POS_INF) {
                    break;
                }
            } else {
                last = n - 1u - b.y;
            }
        }
        // With a +inf the sampler's +inf entries weigh NaN (inf - inf), so
        // its total is NaN: no prefix ever reaches its target, and it takes
        // the last kept element (the k-th with top-k, found below).
        pos_inf = top.x == KEY_POS_INF;
        if (top.x == KEY_NEG_INF) {
            // Every scaled value is -inf: the sampler's argmax, id 0.
            token = top.y;
        } else if (pos_inf && !top_k) {
            token = select(last, n - 1u, !top_p);
        } else {
            mx = scaled(top.y);
            // Min-p against a finite maximum, as the sampler (from here on
            // every scaled value it drops is -inf).
            min_p_on = (flags & F_MIN_P) != 0u && !pos_inf;
            min_p_floor = bitcast<f32>(rows[row + R_MIN_P]);
            step = D_KEPT;
            if (top_k) {
                step = D_TOP_K;
            } else if (!top_p) {
                // The CPU sampler draws in id order when nothing is cut.
                step = D_IDS_TOTAL;
            }
        }
    }
    let u = rows[row + R_U];
    var kept = whole;
    var kept_mass = vec2<u32>(0u, 0u);
    loop {
        if (step == D_DONE) {
            if (nth == 0u) {
                break;
            }
            // The draw is over: the n-th of the penalised order.
            step = D_NTH;
            raw_order = true;
            min_p_on = false;
        }
        // One search per step (a single call site: see `search`).
        var mode = MASS_GT;
        var bound = kept;
        var goal = vec2<u32>(0u, 0u);
        var goal_c = 0u;
        var by_id = false;
        switch step {
            case D_NTH: {
                mode = COUNT_GE;
                bound = whole;
                goal_c = nth;
            }
            case D_TOP_K: {
                // The first k of the order (0 < k < n, checked by the host).
                mode = COUNT_GE;
                goal_c = rows[row + R_TOP_K];
            }
            case D_KEPT: {
                mode = MEASURE;
            }
            case D_TOP_P: {
                // The shortest prefix of the kept ones reaching top_p * kept:
                // mass >= ceil(top_p * kept), and at least one unit, since
                // top_p > 0 (a goal of 0 would keep the empty prefix when
                // top_p * kept rounds below one unit).
                mode = MASS_GE;
                goal = mul_frac(rows[row + R_TOP_P], kept_mass, true);
                if (goal.x == 0u && goal.y == 0u) {
                    goal.y = 1u;
                }
            }
            case D_DRAW: {
                // The first kept element whose prefix exceeds u * kept.
                // (The whole kept mass does: u < 1, and the first element
                // alone weighs 2^31 units.)
                goal = mul_frac(u, kept_mass, false);
            }
            case D_IDS_TOTAL: {
                mode = MEASURE;
                by_id = true;
            }
            default: {
                by_id = true;
                goal = mul_frac(u, kept_mass, false);
            }
        }
        let f = search(mode, bound, goal, goal_c, by_id);
        switch step {
            case D_NTH: {
                nth_key = f.key;
                nth_id = f.id;
                nth = 0u;
                step = D_DONE;
            }
            case D_TOP_K: {
                kept = vec2<u32>(f.key, f.id);
                step = select(D_KEPT, D_DONE, pos_inf);
                token = f.id;
            }
            case D_KEPT: {
                kept_mass = f.m;
                step = select(D_DRAW, D_TOP_P, top_p);
            }
            case D_TOP_P: {
                kept = vec2<u32>(f.key, f.id);
                kept_mass = f.m;
                step = D_DRAW;
            }
            case D_IDS_TOTAL: {
                kept_mass = f.m;
                step = D_IDS_DRAW;
            }
            default: {
                token = f.id;
                step = D_DONE;
            }
        }
    }
    return token;
}

// Change pair i (of len at off): -inf, or x + bias (-inf + inf is NaN).
fn add_bias(off: u32, len: u32, i: u32) {
    if (i >= len) {
        return;
    }
    let t = rows[off + 2u * i];
    if (t < n) {
        let c = rows[off + 2u * i + 1u];
        var y = NEG_INF;
        if (c != NEG_INF) {
            y = bitcast<u32>(work(t) + bitcast<f32>(c));
        }
        logits[base + t] = y;
    }
}

// OpenAI pair i (of len at off): x - amount.
fn subtract(off: u32, len: u32, i: u32) {
    if (i >= len) {
        return;
    }
    let t = rows[off + 2u * i];
    if (t < n) {
        logits[base + t] = bitcast<u32>(work(t) - bitcast<f32>(rows[off + 2u * i + 1u]));
    }
}

// History entry i (of len at off): x > 0 ? x / pen : x * pen.
fn penalise(off: u32, len: u32, i: u32, pen: f32) {
    if (i >= len) {
        return;
    }
    let t = rows[off + i];
    if (t < n) {
        let x = work(t);
        var y = x * pen;
        if (x > 0.0) {
            y = x / pen;
        }
        logits[base + t] = bitcast<u32>(y);
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.n_rows) {
        return;
    }
    let step_row = p.out_base + r;
    let row = step_row * ROW_WORDS;
    let flags = rows[row + R_FLAGS];
    if ((flags & F_SKIP) != 0u) {
        return;
    }
    lid = li;
    n = p.vocab;
    base = r * p.vocab;
    temp = bitcast<f32>(rows[row + R_TEMP]);
    mx = 0.0;
    min_p_on = false;
    raw_order = false;

    if ((flags & F_BIAS) != 0u) {
        // Distinct ids: no two invocations touch the same logit.
        let off = rows[row + R_BIAS_OFF];
        let len = rows[row + R_BIAS_LEN];
        for (var i = lid; i < len; i += STRIDE) {
            add_bias(off, len, i);
            add_bias(off, len, i + WG);
            add_bias(off, len, i + 2u * WG);
            add_bias(off, len, i + 3u * WG);
            add_bias(off, len, i + 4u * WG);
            add_bias(off, len, i + 5u * WG);
            add_bias(off, len, i + 6u * WG);
            add_bias(off, len, i + 7u * WG);
        }
    }
    // Every bias is in before an id's repetition penalty reads it.
    storageBarrier();
    if ((flags & F_PENALTY) != 0u) {
        let pen = bitcast<f32>(rows[row + R_PENALTY]);
        let off = rows[row + R_HIST_OFF];
        let len = rows[row + R_HIST_LEN];
        // Distinct ids (at most the vocabulary): no two invocations touch
        // the same logit.
        for (var i = lid; i < len; i += STRIDE) {
            penalise(off, len, i, pen);
            penalise(off, len, i + WG, pen);
            penalise(off, len, i + 2u * WG, pen);
            penalise(off, len, i + 3u * WG, pen);
            penalise(off, len, i + 4u * WG, pen);
            penalise(off, len, i + 5u * WG, pen);
            penalise(off, len, i + 6u * WG, pen);
            penalise(off, len, i + 7u * WG, pen);
        }
    }
    storageBarrier();
    if ((flags & F_OPENAI) != 0u) {
        // Distinct ids again; after the barrier above, so an id in both
        // lists sees its repetition penalty first, as in the sampler.
        let off = rows[row + R_OAI_OFF];
        let len = rows[row + R_OAI_LEN];
        for (var i = lid; i < len; i += STRIDE) {
            subtract(off, len, i);
            subtract(off, len, i + WG);
            subtract(off, len, i + 2u * WG);
            subtract(off, len, i + 3u * WG);
            subtract(off, len, i + 4u * WG);
            subtract(off, len, i + 5u * WG);
            subtract(off, len, i + 6u * WG);
            subtract(off, len, i + 7u * WG);
        }
    }
    storageBarrier();

    var count = 0u;
    if ((flags & F_LOGPROBS) != 0u) {
        count = min(rows[row + R_N_LOGPROBS], n);
    }
    let searched = count >= NTH_SEARCH_FROM;
    let token = choose(row, flags, select(0u, count, searched));
    if (lid == 0u) {
        out[step_row] = token;
    }

    if ((flags & F_LOGPROBS) != 0u) {
        let top = best_of(B_ARGMAX, 0u, 0u);
        let m = work(top.y);
        var lse = m;
        // As the sampler: lse = m when m is -inf or +inf.
        if (top.x != KEY_NEG_INF && top.x != KEY_POS_INF) {
            mx = m;
            let sum = sum_of(S_LSE, 0u, 0u).m;
            // sum / 2^31 >= 1: the best element alone weighs 2^31 units.
            let z = f32(sum.x) * 2.0 + f32(sum.y) * (1.0 / 2147483648.0);
            lse = m + log(z);
        }
        let lp_off = rows[row + R_LP_OFF];
        if (lid == 0u) {
            out[lp_off] = bitcast<u32>(work(token) - lse);
        }
        if (searched) {
            gather_best(count, lp_off, lse);
        } else {
            // The n best by the sampler's order (total order, ties to the
            // lower id): n rounds of argmax after the prefix found so far.
            var pk = NONE; // the empty prefix
            var pi = 0u;
            for (var q = 0u; q < count; q++) {
                let b = best_of(B_NEXT, pk, pi);
                pk = b.x;
                pi = b.y;
                if (lid == 0u) {
                    out[lp_off + 1u + 2u * q] = pi;
                    out[lp_off + 2u + 2u * q] = bitcast<u32>(work(pi) - lse);
                }
            }
        }
    }
}

// Gathers the `count` best of the penalised order (the prefix up to the
// n-th, which `choose` found) into the buckets' words, in one pass, then
// writes each at its rank: best first, ties to the lower id.
fn gather_best(count: u32, lp_off: u32, lse: f32) {
    // The search's last reads of the buckets are behind its last barrier.
    if (lid == 0u) {
        atomicStore(&bk_c[0], 0u);
    }
    workgroupBarrier();
    for (var j = lid; j < n; j += STRIDE) {
        gather_one(j);
        gather_one(j + WG);
        gather_one(j + 2u * WG);
        gather_one(j + 3u * WG);
        gather_one(j + 4u * WG);
        gather_one(j + 5u * WG);
        gather_one(j + 6u * WG);
        gather_one(j + 7u * WG);
    }
    workgroupBarrier();
    for (var q = lid; q < count; q += WG) {
        let kq = atomicLoad(&bk_hi[q]);
        let iq = atomicLoad(&bk_lo[q]);
        var rank = 0u;
        for (var r = 0u; r < count; r++) {
            if (before(atomicLoad(&bk_hi[r]), atomicLoad(&bk_lo[r]), kq, iq)) {
                rank += 1u;
            }
        }
        out[lp_off + 1u + 2u * rank] = iq;
        out[lp_off + 2u + 2u * rank] = bitcast<u32>(work(iq) - lse);
    }
}

// Element j into the gathered ones when it lies in the prefix up to the
// n-th (exactly n elements do: slots 0..n).
fn gather_one(j: u32) {
    if (j >= n) {
        return;
    }
    let k = okey(work(j));
    if (in_prefix(k, j, nth_key, nth_id)) {
        let slot = atomicAdd(&bk_c[0], 1u);
        if (slot < RADIX) {
            atomicStore(&bk_hi[slot], k);
            atomicStore(&bk_lo[slot], j);
        }
    }
}
