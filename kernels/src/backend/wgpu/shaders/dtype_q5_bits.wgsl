// Shared by the Q5_0 and Q5_1 weight preludes: a block's word qh holds
// value j's fifth bit at bit j.

// Values j..j+4's fifth bits as 16 or 0.
fn fifth4(qh: u32, j: u32) -> vec4<f32> {
    let b = (vec4<u32>(qh) >> (vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
    return vec4<f32>(b * 16u);
}
