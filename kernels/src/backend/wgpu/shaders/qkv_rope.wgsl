// The end of mat_vec.wgsl's ROPE variant (the q|k|v product with RoPE and
// the KV cache write fused in), appended to it only there: the bindings
// rope_kv.wgsl has beside q|k|v, and the store of one rotation pair.
// Every other mat-vec variant gets an empty `store_pair` instead, so its
// layout needs none of these bindings.
//
// The pair is rotated and written exactly as rope_kv.wgsl rotates and
// writes it after the product: the same f32 operations on the same sums,
// the cos/sin of the row's position from the host (f64 angles), the cache
// layout [block][kv_head][slot][head_dim] through the row's slot.

@group(0) @binding(6) var<storage, read> plan: array<u32>;
@group(0) @binding(7) var<storage, read_write> kc: array<f32>;
@group(0) @binding(8) var<storage, read_write> vc: array<f32>;

// Unit `unit` (pair element i of head `unit / half`) of column c, whose
// first row is `row` and whose finished sums are a and b: rotated where
// the head is a query or key head, stored in y, and for key and value
// heads also in the cache at the column's slot.
fn store_pair(a0: f32, b0: f32, unit: u32, row: u32, c: u32) {
    let half = p.up_row;
    let head = unit / half;
    let i = unit % half;
    // The column's row in the pass: cos, sin and slots are per pass row.
    let r = p.col0 + c;
    let v_head0 = p.k_head0 + p.kv_heads;
    var a = a0;
    var b = b0;
    if (head < v_head0) {
        let cs = bitcast<f32>(plan[p.cs_off + r * half + i]);
        let sn = bitcast<f32>(plan[p.sn_off + r * half + i]);
        a = a0 * cs - b0 * sn;
        b = b0 * cs + a0 * sn;
    }
    let at = p.y_off + c * p.ldy + p.row0 + row;
    y[at] = a;
    y[at + half] = b;
    if (head < p.k_head0) {
        return;
    }
    let key = head < v_head0;
    let g = select(head - v_head0, head - p.k_head0, key);
    let slot = plan[p.slot_off + r];
    let dst = (((slot / p.bs) * p.kv_heads + g) * p.bs + slot % p.bs) * 2u * half + i;
    if (key) {
        kc[dst] = a;
        kc[dst + half] = b;
    } else {
        vc[dst] = a;
        vc[dst + half] = b;
    }
}
