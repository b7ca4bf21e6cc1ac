// Shared by the IQ4_NL and IQ4_XS weight preludes: the 16 values their
// nibbles index (llama.cpp's non-uniform table, denser near zero), as
// signed bytes four to a word.

const IQ4_TABLE: vec4<u32> = vec4<u32>(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

// The table's value for nibble `q`.
fn iq4_value(q: u32) -> f32 {
    let byte = (IQ4_TABLE[q >> 2u] >> (8u * (q & 3u))) << 24u;
    return f32(bitcast<i32>(byte) >> 24u);
}

// The table's values for the nibbles at bit `shift` (0 or 4) of the four
// bytes of `word`.
fn iq4_values4(word: u32, shift: u32) -> vec4<f32> {
    let q = nib4u(word, shift);
    return vec4<f32>(iq4_value(q.x), iq4_value(q.y), iq4_value(q.z), iq4_value(q.w));
}
