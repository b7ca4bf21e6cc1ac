// Weight prelude: Q8_0, blocks of 32 values as 9 words: the f16 scale d
// (low half of word 0; the file's 2 bytes padded to 4), then 32 signed
// bytes q. Value j of a block is d * q[j].

const BLOCK_WORDS: u32 = 9u;

fn w_at(i: u32) -> f32 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let d = unpack2x16float(w[base]).x;
    let q = extractBits(bitcast<i32>(w[base + 1u + (j >> 2u)]), (j & 3u) * 8u, 8u);
    return d * f32(q);
}

fn w_load8(i: u32) -> W8 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let o = base + 1u + ((i & 31u) >> 2u);
    let d = unpack2x16float(w[base]).x;
    return W8(d * i8x4(w[o]), d * i8x4(w[o + 1u]));
}
