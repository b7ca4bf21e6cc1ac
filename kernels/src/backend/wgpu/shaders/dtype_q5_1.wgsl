// Weight prelude: Q5_1, blocks of 32 values as 6 words (the file's 24
// bytes): f16 scale d and minimum m in word 0, the word qh whose bit j is
// value j's fifth bit, then 16 bytes whose low nibbles are values 0..16
// and high nibbles values 16..32. Value j is d * q[j] + m.

const BLOCK_WORDS: u32 = 6u;

fn w_at(i: u32) -> f32 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let dm = unpack2x16float(w[base]);
    let lo = (w_byte(4u * base + 8u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
    let hi = (w[base + 1u] >> j) & 1u;
    return dm.x * f32(lo | (hi << 4u)) + dm.y;
}

fn w_load8(i: u32) -> W8 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let o = base + 2u + ((j & 15u) >> 2u);
    let shift = (j >> 4u) * 4u;
    let dm = unpack2x16float(w[base]);
    let qh = w[base + 1u];
    let lo = nib4(w[o], shift) + fifth4(qh, j);
    let hi = nib4(w[o + 1u], shift) + fifth4(qh, j + 4u);
    return W8(dm.x * lo + dm.y, dm.x * hi + dm.y);
}
