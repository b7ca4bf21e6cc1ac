// Weight prelude: Q5_K, super-blocks of 256 values as 44 words (the file's
// 176 bytes): f16 d and dmin, 12 bytes of 6-bit sub-block scales and
// minimums (Q4_K's), 32 bytes qh of fifth bits, then 128 bytes of nibbles.
// Group g (0..4) of 64 values uses nibble bytes 32g..32g+32: low nibbles
// for its first 32 values (sub-block 2g), whose fifth bits are bit 2g of
// qh[l], high nibbles for the next 32 (sub-block 2g + 1, bit 2g + 1).
// Value = (d * scale) * q - dmin * min.

const BLOCK_WORDS: u32 = 44u;

// Where value i lives: the word holding its nibble byte (and the next 3),
// the nibble's shift, the word holding its fifth bit's byte, that bit's
// place in each byte, and its sub-block's scale (d * sc) and offset
// (dmin * m).
struct Q5kAt {
    word: u32,
    shift: u32,
    hword: u32,
    hbit: u32,
    scale: f32,
    minv: f32,
}

fn q5k_at(i: u32) -> Q5kAt {
    let base = (i >> 8u) * BLOCK_WORDS;
    let t = i & 255u;
    let g = t >> 6u;
    let h = (t >> 5u) & 1u;
    let l = t & 31u;
    let dd = unpack2x16float(w[base]);
    let sm = q4k_scale_min(base, 2u * g + h);
    return Q5kAt(
        base + 12u + 8u * g + (l >> 2u),
        4u * h,
        base + 4u + (l >> 2u),
        2u * g + h,
        dd.x * sm.x,
        dd.y * sm.y,
    );
}

fn w_at(i: u32) -> f32 {
    let a = q5k_at(i);
    let b = 8u * (i & 3u);
    let q = ((w[a.word] >> (b + a.shift)) & 15u) | (((w[a.hword] >> (b + a.hbit)) & 1u) << 4u);
    return a.scale * f32(q) - a.minv;
}

// The fifth bits of the four bytes of `word` at `bit`, as 16 or 0.
fn fifth4k(word: u32, bit: u32) -> vec4<f32> {
    let v = (vec4<u32>(word) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(bit))) & vec4<u32>(1u);
    return vec4<f32>(v * 16u);
}

fn w_load8(i: u32) -> W8 {
    let a = q5k_at(i);
    return W8(
        a.scale * (nib4(w[a.word], a.shift) + fifth4k(w[a.hword], a.hbit)) - a.minv,
        a.scale * (nib4(w[a.word + 1u], a.shift) + fifth4k(w[a.hword + 1u], a.hbit)) - a.minv,
    );
}
