// Shared by every weight prelude: eight consecutive weights widened to f32,
// as `w_load8` returns them, and the unpacking of quantized bytes.

struct W8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The four bytes of `word` as signed values.
fn i8x4(word: u32) -> vec4<f32> {
    let s = bitcast<vec4<i32>>(vec4<u32>(word << 24u, word << 16u, word << 8u, word));
    return vec4<f32>(s >> vec4<u32>(24u));
}

// The nibble at bit `shift` (0 or 4) of each of the four bytes of `word`.
fn nib4u(word: u32, shift: u32) -> vec4<u32> {
    let v = vec4<u32>(word, word >> 8u, word >> 16u, word >> 24u) >> vec4<u32>(shift);
    return v & vec4<u32>(15u);
}

fn nib4(word: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>(nib4u(word, shift));
}
