// The tile loads of the tiled products (mat_mul.wgsl and coop_mat_mul.wgsl),
// appended to both: eight values of a weight row or of a token's x, zero
// past the chunk's rows, the tokens or k. They read the kernel's `p` (both
// kernels' `Params` share one layout), `x`, and the weight prelude's `w_at`,
// `w_load8` and `W8`.

// Weights k0 .. k0 + 8 of chunk row n (zero past the chunk's rows or k).
fn load_w(n: u32, k0: u32) -> W8 {
    if (n >= p.rows || k0 >= p.k) {
        return W8(vec4<f32>(0.0), vec4<f32>(0.0));
    }
    let base = n * p.k + k0;
    if (p.k % 8u == 0u) {
        return w_load8(base);
    }
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (k0 + j < p.k) {
            v[j] = w_at(base + j);
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}

// x values k0 .. k0 + 8 of token m (zero past the tokens or k).
fn load_x(m: u32, k0: u32) -> W8 {
    if (m >= p.m || k0 >= p.k) {
        return W8(vec4<f32>(0.0), vec4<f32>(0.0));
    }
    let base = p.x_off + m * p.ldx + k0;
    if (p.k % 8u == 0u && p.ldx % 4u == 0u && p.x_off % 4u == 0u) {
        return W8(x[base >> 2u], x[(base >> 2u) + 1u]);
    }
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (k0 + j < p.k) {
            v[j] = x[(base + j) >> 2u][(base + j) & 3u];
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}
