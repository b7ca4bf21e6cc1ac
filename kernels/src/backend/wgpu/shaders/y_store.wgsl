// The last step of the tiled products and of the split-k sums
// (mat_mul.wgsl, coop_mat_mul.wgsl, split_sum.wgsl), appended to each:
// token m's value `v` for chunk row n, plus the bias and, for a residual
// add, y's value, written into y. It reads the kernel's `p` (the three
// share one Params layout), `bias` and `y`.
fn store_y(m: u32, n: u32, v: f32) {
    var out = v;
    if (p.has_bias != 0u) {
        out += bias[p.row0 + n];
    }
    let at = p.y_off + m * p.ldy + p.row0 + n;
    if (p.accumulate != 0u) {
        out += y[at];
    }
    y[at] = out;
}
