// Weight prelude: Q4_1, blocks of 32 values as 5 words (the file's 20
// bytes): f16 scale d and minimum m in word 0, then 16 bytes whose low
// nibbles are values 0..16 and high nibbles values 16..32. Value j is
// d * q[j] + m.

const BLOCK_WORDS: u32 = 5u;

fn w_at(i: u32) -> f32 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let dm = unpack2x16float(w[base]);
    let q = (w_byte(4u * base + 4u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
    return dm.x * f32(q) + dm.y;
}

fn w_load8(i: u32) -> W8 {
    let base = (i >> 5u) * BLOCK_WORDS;
    let j = i & 31u;
    let o = base + 1u + ((j & 15u) >> 2u);
    let shift = (j >> 4u) * 4u;
    let dm = unpack2x16float(w[base]);
    return W8(dm.x * nib4(w[o], shift) + dm.y, dm.x * nib4(w[o + 1u], shift) + dm.y);
}
