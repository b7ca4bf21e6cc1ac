// Shared by the block-quantized weight preludes: the tensor is an array of
// u32 words holding GGUF blocks, each padded to a whole number of words
// (the host inserts or appends the padding on upload; see
// `WeightDtype::pad_blocks`), so every field a kernel reads is word-aligned.

@group(0) @binding(1) var<storage, read> w: array<u32>;

// Byte `k` of the tensor.
fn w_byte(k: u32) -> u32 {
    return (w[k >> 2u] >> ((k & 3u) * 8u)) & 0xffu;
}
