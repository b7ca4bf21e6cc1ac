//! Arbitrary bytes as a GGUF file. The parser must return a file or an error
//! that says what is wrong (never panic, never allocate beyond what the
//! input's size justifies), and every tensor of a file it accepts must lie
//! inside the input, aligned, without overlapping another.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwire_gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    match GgufFile::parse(data) {
        Ok(f) => {
            let mut spans: Vec<(u64, u64)> = Vec::new();
            for t in &f.tensors {
                let end = t.offset.checked_add(t.len).expect("no overflow");
                assert!(end <= data.len() as u64, "{} out of range", t.name);
                assert_eq!((t.offset - f.data_offset) % f.alignment, 0);
                spans.push((t.offset, end));
            }
            spans.sort_unstable();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0, "overlap");
            }
        }
        Err(e) => assert!(!e.msg.is_empty(), "an error says what was wrong"),
    }
});
