// Weight prelude: Q5_0, blocks of 32 values as 6 words: the f16 scale d
// (low half of word 0; the file's 2 bytes padded to 4), the word qh whose
// bit j is value j's fifth bit, then 16 bytes whose low nibbles are values
// 0..16 and high nibbles values 16..32. Value j is d * (q[j] - 16).

const BLOCK_WORDS: u32 = 6u;

fn w_at(i: u32) -> f32 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let d = unpack2x16float(w[base]).x;
    let lo = (w_byte(4u * base + 8u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
    let hi = (w[base + 1u] >> j) & 1u;
    return d * (f32(lo | (hi << 4u)) - 16.0);
}

fn w_load8(i: u32) -> W8 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let o = base + 2u + ((j & 15u) >> 2u);
    let shift = (j >> 4u) * 4u;
    let d = unpack2x16float(w[base]).x;
    let qh = w[base + 1u];
    let lo = nib4(w[o], shift) + fifth4(qh, j);
    let hi = nib4(w[o + 1u], shift) + fifth4(qh, j + 4u);
    return W8(d * (lo - 16.0), d * (hi - 16.0));
}
