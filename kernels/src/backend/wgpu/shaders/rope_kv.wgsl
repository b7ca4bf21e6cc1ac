// Rotary position embedding, then the paged KV cache write, in one dispatch
// (two kernels before: at batch 1 each was ~5 us of launch per layer on an
// H200 for a few hundred values).
//
// RoPE follows Hugging Face's `rotate_half` convention: in every head,
// element i pairs with i + head_dim / 2. The query and key heads of each
// row of the fused q|k|v buffer are rotated in place. The cos/sin of each
// row's position come from the host (computed in f64 from the same inverse
// frequencies as the CPU backend, Llama 3 scaling included), so long
// positions lose no precision to an f32 angle.
//
// The invocation that rotates a pair of a key head also writes that pair,
// rotated, and the same pair of the row's value head into one layer's cache
// through the step's slot mapping: slot = block * block_size + offset, and
// within a block the layout is [kv_head][slot][head_dim] (the CPU
// backend's layout). So every K and V value of the row is written once.
//
// With NORM (Qwen3), each query and key head is first RMS-normalised with
// its own head_dim weights (`nw`: the query heads', then the key heads'):
//   x = w * (x / sqrt(mean(x^2) + eps))
// The pairs of a head share a workgroup, which sums their squares in
// workgroup memory before any of them is rotated.
//
// One invocation per (row, head, pair); a workgroup takes 256 / half whole
// heads (every head of a row when half divides 256).

struct Params {
    n_rows: u32,   // rows in this pass
    q_heads: u32,  // query heads
    kv_heads: u32, // KV heads
    half: u32,     // head_dim / 2
    stride: u32,   // width of a q|k|v row
    cs_off: u32,   // word offset of cos[n_rows][half] (f32 bits) in `plan`
    sn_off: u32,   // word offset of sin[n_rows][half]
    slot_off: u32, // word offset of the rows' slots in `plan`
    bs: u32,       // block size
    flags: u32,    // NORM
    eps: f32,      // the head norms' epsilon
    _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<f32>;
@group(0) @binding(3) var<storage, read_write> vc: array<f32>;
@group(0) @binding(4) var<storage, read> nw: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const NORM: u32 = 1u;

var<workgroup> squares: array<f32, 256>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let per_wg = 256u / p.half;
    let local_head = lid / p.half;
    let i = lid % p.half;
    let heads = p.q_heads + p.kv_heads;
    // (row, head), counted over the pass.
    let item = (wid.x + wid.y * nwg.x) * per_wg + local_head;
    let in_pass = local_head < per_wg && item < p.n_rows * heads;
    let r = item / heads;
    let head = item % heads;
    let hd = 2u * p.half;
    let base = r * p.stride + head * hd;
    var u = 0.0;
    var v = 0.0;
    if (in_pass) {
        u = qkv[base + i];
        v = qkv[base + i + p.half];
    }
    // Uniform: the flag is the pass's, so every invocation reaches the
    // barrier.
    if ((p.flags & NORM) != 0u) {
        squares[lid] = u * u + v * v;
        workgroupBarrier();
        if (in_pass) {
            var ss = 0.0;
            let first = local_head * p.half;
            for (var j = 0u; j < p.half; j++) {
                ss += squares[first + j];
            }
            let inv = 1.0 / sqrt(ss / f32(hd) + p.eps);
            // The key heads' weights follow the query heads'.
            let w0 = select(0u, hd, head >= p.q_heads);
            u = nw[w0 + i] * (u * inv);
            v = nw[w0 + i + p.half] * (v * inv);
        }
    }
    if (!in_pass) {
        return;
    }
    let c = bitcast<f32>(plan[p.cs_off + r * p.half + i]);
    let s = bitcast<f32>(plan[p.sn_off + r * p.half + i]);
    let ru = u * c - v * s;
    let rv = v * c + u * s;
    qkv[base + i] = ru;
    qkv[base + i + p.half] = rv;
    if (head < p.q_heads) {
        return;
    }
    let g = head - p.q_heads;
    let slot = plan[p.slot_off + r];
    let dst = (((slot / p.bs) * p.kv_heads + g) * p.bs + slot % p.bs) * hd;
    kc[dst + i] = ru;
    kc[dst + i + p.half] = rv;
    // The value head g sits kv_heads heads after key head g.
    let vsrc = base + p.kv_heads * hd;
    vc[dst + i] = qkv[vsrc + i];
    vc[dst + i + p.half] = qkv[vsrc + i + p.half];
}
