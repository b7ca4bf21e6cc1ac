// Shared by the Q4_K and Q5_K weight preludes: their 12 bytes of 6-bit
// sub-block scales and minimums, at byte 4 of each super-block.

// Scale and minimum of sub-block j (0..8) of the super-block at word `base`.
fn q4k_scale_min(base: u32, j: u32) -> vec2<f32> {
    let s = 4u * base + 4u;
    if (j < 4u) {
        return vec2<f32>(f32(w_byte(s + j) & 63u), f32(w_byte(s + j + 4u) & 63u));
    }
    let hi = w_byte(s + j + 4u);
    let sc = (hi & 15u) | ((w_byte(s + j - 4u) >> 6u) << 4u);
    let mn = (hi >> 4u) | ((w_byte(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}
