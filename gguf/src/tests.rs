//! The parser against files built byte by byte: a valid one, then each way
//! a file can be malformed, every one a specific error and none a panic.

use super::*;

/// Builds a GGUF file.
#[derive(Default)]
struct Writer {
    version: u32,
    meta: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data: Vec<u8>,
    alignment: u64,
}

fn s(v: &str) -> Vec<u8> {
    let mut b = (v.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(v.as_bytes());
    b
}

impl Writer {
    fn new() -> Self {
        Writer {
            version: 3,
            alignment: 32,
            ..Writer::default()
        }
    }

    fn meta(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
        self.meta.push((key.into(), ty, value));
        self
    }

    /// A tensor whose data follows the previous one's, aligned.
    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, bytes: usize) -> Self {
        let offset = (self.data.len() as u64).div_ceil(self.alignment) * self.alignment;
        self.data.resize(offset as usize, 0);
        self.data.extend((0..bytes).map(|i| i as u8));
        self.tensors.push((name.into(), dims.to_vec(), ty, offset));
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.meta {
            b.extend(s(k));
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(v);
        }
        for (name, dims, ty, off) in &self.tensors {
            b.extend(s(name));
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
        b.resize(
            (b.len() as u64).div_ceil(self.alignment) as usize * self.alignment as usize,
            0,
        );
        b.extend_from_slice(&self.data);
        b
    }
}

fn valid() -> Writer {
    let mut tokens = 9u32.to_le_bytes().to_vec(); // array of strings
    tokens.extend_from_slice(&8u32.to_le_bytes());
    tokens.extend_from_slice(&2u64.to_le_bytes());
    tokens.extend(s("<s>"));
    tokens.extend(s("hi"));
    Writer::new()
        .meta("general.architecture", 8, s("llama"))
        .meta("llama.block_count", 4, 1u32.to_le_bytes().to_vec())
        .meta("llama.rope.freq_base", 6, 10000f32.to_le_bytes().to_vec())
        .meta("tokenizer.ggml.tokens", 9, tokens[4..].to_vec())
        .tensor("token_embd.weight", &[64, 2], 1, 64 * 2 * 2)
        .tensor("blk.0.attn_q.weight", &[64, 64], 3, 2 * 64 * 20)
        .tensor("output_norm.weight", &[64], 0, 64 * 4)
}

fn err(bytes: &[u8]) -> String {
    GgufFile::parse(bytes)
        .expect_err("malformed file parsed")
        .to_string()
}

#[test]
fn a_valid_file_gives_its_metadata_and_tensors_in_range() {
    let w = valid();
    let bytes = w.bytes();
    let f = GgufFile::parse(&bytes).expect("valid");
    assert_eq!(f.version, 3);
    assert_eq!(f.str("general.architecture"), Ok(Some("llama")));
    assert_eq!(f.uint("llama.block_count"), Ok(Some(1)));
    assert_eq!(f.float("llama.rope.freq_base"), Ok(Some(10000.0)));
    assert_eq!(
        f.array("tokenizer.ggml.tokens").map(|a| a.map(<[_]>::len)),
        Ok(Some(2))
    );
    assert!(
        f.uint("general.architecture").is_err(),
        "a string, not an integer"
    );
    assert_eq!(f.str("missing"), Ok(None));
    assert_eq!(f.tensors.len(), 3);
    let q = f.tensor("blk.0.attn_q.weight").expect("q");
    assert_eq!((q.dtype, q.len, q.elements()), (GgmlType::Q4_1, 2560, 4096));
    assert_eq!(q.offset % 32, 0);
    let data = &bytes[q.offset as usize..(q.offset + q.len) as usize];
    assert_eq!(
        &data[..3],
        &[0, 1, 2],
        "the offset points at the tensor's bytes"
    );
    assert_eq!(f.data_offset % 32, 0);
}

#[test]
fn every_truncation_is_an_error_naming_what_was_cut() {
    let bytes = valid().bytes();
    for len in 0..bytes.len() {
        let e = GgufFile::parse(&bytes[..len]);
        assert!(e.is_err(), "a {len}-byte prefix parsed");
    }
    let cut = err(&bytes[..bytes.len() - 1]);
    assert!(
        cut.contains("output_norm.weight") && cut.contains("truncated"),
        "{cut}"
    );
    let cut = err(&bytes[..60]);
    assert!(cut.contains("truncated"), "{cut}");
}

#[test]
fn header_problems_are_named() {
    let mut bytes = valid().bytes();
    bytes[0] = b'g';
    assert!(err(&bytes).contains("not a GGUF file"));
    let mut w = valid();
    w.version = 1;
    assert!(err(&w.bytes()).contains("version 1"));
    // A forged tensor count.
    let mut bytes = valid().bytes();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&bytes).contains("tensor count"));
    let mut bytes = valid().bytes();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(err(&bytes).contains("metadata count"));
    let w = valid().meta("llama.block_count", 4, 2u32.to_le_bytes().to_vec());
    assert!(err(&w.bytes()).contains("appears twice"));
    let w = valid().meta("general.alignment", 4, 24u32.to_le_bytes().to_vec());
    assert!(err(&w.bytes()).contains("power of two"));
    let w = valid().meta("x", 99, vec![0; 8]);
    assert!(err(&w.bytes()).contains("unknown value type 99"));
}

#[test]
fn tensor_problems_are_named() {
    let w = valid().tensor("blk.0.ffn_down.weight", &[256, 4], 16, 4 * 66);
    let e = err(&w.bytes());
    assert!(e.contains("ffn_down") && e.contains("IQ2_XXS"), "{e}");
    let w = valid().tensor("t", &[1, 1, 1, 1, 1], 0, 4);
    assert!(err(&w.bytes()).contains("5 dimensions"));
    let w = valid().tensor("t", &[48, 2], 2, 100);
    let e = err(&w.bytes());
    assert!(
        e.contains("48 values") && e.contains("32-value blocks"),
        "{e}"
    );
    let w = valid().tensor("blk.0.attn_q.weight", &[64], 0, 256);
    assert!(err(&w.bytes()).contains("appears twice"));
    let w = valid().tensor("t", &[u64::MAX / 2, 4], 0, 4);
    assert!(err(&w.bytes()).contains("overflows"));
    // A misaligned offset, an overlap, and one past the end.
    let mut w = valid();
    w.tensors[1].3 += 4;
    assert!(err(&w.bytes()).contains("not a multiple of the alignment"));
    let mut w = valid();
    w.tensors[2].3 = w.tensors[1].3;
    assert!(err(&w.bytes()).contains("overlap"));
    let mut w = valid();
    w.tensors[2].3 += 1 << 20;
    assert!(err(&w.bytes()).contains("past the end"));
}
