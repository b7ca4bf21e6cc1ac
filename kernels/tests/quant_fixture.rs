//! tokenwire's dequantization of every quantized type against llama.cpp's
//! reference (the `gguf` Python package), on seeded random blocks written
//! by `scripts/make-quant-fixture.py`.

use tokenwire_kernels::gguf::{GgmlType, GgufFile};
use tokenwire_kernels::quant::blocks::dequantize_row;

#[test]
fn dequantization_matches_llama_cpps_reference() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/quant_blocks.gguf"
    );
    let bytes = std::fs::read(path).expect("fixture");
    let file = GgufFile::parse(&bytes).expect("fixture parses");
    let mut checked = Vec::new();
    for dtype in GgmlType::ALL.into_iter().filter(|t| t.block_len() > 1) {
        let q = file
            .tensor(&format!("q.{dtype}"))
            .expect("quantized tensor");
        let f = file
            .tensor(&format!("f.{dtype}"))
            .expect("reference tensor");
        assert_eq!(q.dtype, dtype);
        assert_eq!(f.dtype, GgmlType::F32);
        assert_eq!(q.dims, f.dims);
        let n = q.elements() as usize;
        let raw = &bytes[q.offset as usize..(q.offset + q.len) as usize];
        let mut got = vec![0.0f32; n];
        let row_values = q.dims[0] as usize;
        let row_bytes = q.len as usize / (n / row_values);
        for (r, out) in got.chunks_exact_mut(row_values).enumerate() {
            dequantize_row(dtype, &raw[r * row_bytes..(r + 1) * row_bytes], out);
        }
        let want: Vec<f32> = bytes[f.offset as usize..(f.offset + f.len) as usize]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // numpy may round a product in another order: an ulp or two.
            assert!(
                (g - w).abs() <= w.abs() * 1e-6 + 1e-9,
                "{dtype} value {i}: got {g}, llama.cpp's reference {w}"
            );
        }
        checked.push(dtype);
    }
    assert_eq!(checked.len(), 12, "every quantized type is in the fixture");
}
