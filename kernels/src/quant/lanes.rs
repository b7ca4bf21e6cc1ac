//! The row layout of the lane-per-block kernels: each whole eight blocks of
//! a Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL row stored interleaved, so that a kernel whose
//! vector lanes each hold one block loads them as they are, where the file's
//! layout took a transpose in registers for every tile (more instructions
//! than the dot products themselves in a batch).
//!
//! A group of eight blocks keeps its byte count, so a row keeps its length
//! and every row its offset; the blocks after a row's last whole eight stay
//! as the file has them. Within a group:
//!
//! * each 2-byte head field (the scale; Q4_1's and Q5_1's minimum next;
//!   a Q5 block's high-bit word as two fields, low half first) of the
//!   eight blocks side by side: field `f` of block `l` at `16 f + 2 l`;
//! * then the blocks' quantized bytes a 4-byte word at a time: word `k` of
//!   block `l` at `heads + 4 (8 k + l)`, so the 32 bytes at
//!   `heads + 32 k` are word `k` of all eight blocks, one block per lane.
//!
//! [`interleave_row`] and [`deinterleave_row`] are exact inverses (tested
//! on every format); nothing but the CPU backend's own copy of the weights
//! is ever in this layout.

use tokenwire_gguf::GgmlType;

/// Blocks in one interleaved group: one per 32-bit lane of a 256-bit vector.
pub const GROUP: usize = 8;

/// Bytes of the largest group (Q8_0's).
pub const MAX_GROUP_BYTES: usize = GROUP * 34;

/// How the blocks of a weight row are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowLayout {
    /// As the file stores them, block after block.
    #[default]
    File,
    /// Whole eights of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL blocks interleaved for kernels
    /// with a lane per block (this module's layout); other dtypes as
    /// [`RowLayout::File`].
    Lanes8,
}

/// The head bytes (2-byte fields) and quantized bytes of one block of a
/// format with an interleaved form; `None` for the others.
fn parts(dtype: GgmlType) -> Option<(usize, usize)> {
    match dtype {
        GgmlType::Q8_0 => Some((2, 32)),
        GgmlType::Q4_0 => Some((2, 16)),
        GgmlType::Q4_1 => Some((4, 16)),
        GgmlType::Q5_0 => Some((6, 16)),
        GgmlType::Q5_1 => Some((8, 16)),
        GgmlType::IQ4_NL => Some((2, 16)),
        _ => None,
    }
}

/// Whether `layout` changes how `dtype`'s rows are stored.
pub fn changes(dtype: GgmlType, layout: RowLayout) -> bool {
    layout == RowLayout::Lanes8 && parts(dtype).is_some()
}

/// The byte of a group at which block `l`'s byte `i` (in the file's block
/// layout) is stored, for blocks of `head` + `quants` bytes.
#[inline]
fn place(head: usize, quants: usize, l: usize, i: usize) -> usize {
    debug_assert!(i < head + quants && l < GROUP);
    if i < head {
        GROUP * 2 * (i / 2) + 2 * l + i % 2
    } else {
        let (k, b) = ((i - head) / 4, (i - head) % 4);
        GROUP * head + 4 * (GROUP * k + l) + b
    }
}

/// `row` (whole blocks of `dtype`, in the file's layout) into `out` (the
/// same length) with its whole groups interleaved. Formats without an
/// interleaved form are copied.
pub fn interleave_row(dtype: GgmlType, row: &[u8], out: &mut [u8]) {
    permute_row(dtype, row, out, true)
}

/// [`interleave_row`]'s inverse: `row` back into the file's layout.
pub fn deinterleave_row(dtype: GgmlType, row: &[u8], out: &mut [u8]) {
    permute_row(dtype, row, out, false)
}

fn permute_row(dtype: GgmlType, row: &[u8], out: &mut [u8], forward: bool) {
    out.copy_from_slice(row);
    let Some((head, quants)) = parts(dtype) else {
        return;
    };
    let bytes = head + quants;
    let group = GROUP * bytes;
    for (src, dst) in row.chunks_exact(group).zip(out.chunks_exact_mut(group)) {
        for l in 0..GROUP {
            for i in 0..bytes {
                let (file, laid) = (l * bytes + i, place(head, quants, l, i));
                if forward {
                    dst[laid] = src[file];
                } else {
                    dst[file] = src[laid];
                }
            }
        }
    }
}

/// Bytes of one group of `dtype` (eight blocks), for formats with an
/// interleaved form.
pub fn group_bytes(dtype: GgmlType) -> Option<usize> {
    parts(dtype).map(|(h, q)| GROUP * (h + q))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [GgmlType; 6] = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
    ];

    /// A row of `blocks` blocks whose every byte is distinct from its
    /// neighbours' (its index, wrapped).
    fn numbered_row(dtype: GgmlType, blocks: usize) -> Vec<u8> {
        (0..blocks * dtype.block_bytes())
            .map(|i| (i * 7 % 251) as u8)
            .collect()
    }

    #[test]
    fn deinterleaving_gives_back_every_row() {
        for dtype in FORMATS {
            for blocks in [1, 7, 8, 9, 18, 24] {
                let row = numbered_row(dtype, blocks);
                let mut laid = vec![0; row.len()];
                interleave_row(dtype, &row, &mut laid);
                let mut back = vec![0; row.len()];
                deinterleave_row(dtype, &laid, &mut back);
                assert_eq!(back, row, "{dtype} with {blocks} blocks");
                let whole = blocks / GROUP * GROUP * dtype.block_bytes();
                assert_eq!(
                    laid[whole..],
                    row[whole..],
                    "{dtype}: blocks after the last whole eight stay as they are"
                );
                if blocks >= GROUP {
                    assert_ne!(laid[..whole], row[..whole], "{dtype}: groups move");
                }
            }
        }
    }

    #[test]
    fn a_group_puts_each_blocks_words_in_its_own_lane() {
        for dtype in FORMATS {
            let (head, _) = parts(dtype).unwrap();
            let bytes = dtype.block_bytes();
            let row = numbered_row(dtype, GROUP);
            let mut laid = vec![0; row.len()];
            interleave_row(dtype, &row, &mut laid);
            for l in 0..GROUP {
                let block = &row[l * bytes..(l + 1) * bytes];
                // The scale, then Q4_1's and Q5_1's minimum, then a Q5
                // block's high-bit word in two halves, side by side per
                // field.
                for f in 0..head / 2 {
                    assert_eq!(
                        laid[16 * f + 2 * l..16 * f + 2 * l + 2],
                        block[2 * f..2 * f + 2],
                        "{dtype} field {f} of block {l}"
                    );
                }
                // Word k of block l in lane l of the k-th 32 bytes.
                for k in 0..(bytes - head) / 4 {
                    let at = GROUP * head + 32 * k + 4 * l;
                    assert_eq!(
                        laid[at..at + 4],
                        block[head + 4 * k..head + 4 * k + 4],
                        "{dtype} block {l} word {k}"
                    );
                }
            }
        }
    }

    #[test]
    fn other_formats_and_the_file_layout_are_unchanged() {
        assert!(!changes(GgmlType::Q4_K, RowLayout::Lanes8));
        assert!(!changes(GgmlType::Q8_0, RowLayout::File));
        assert!(changes(GgmlType::Q4_1, RowLayout::Lanes8));
        let row: Vec<u8> = (0..144u8).collect();
        let mut out = vec![0; row.len()];
        interleave_row(GgmlType::Q4_K, &row, &mut out);
        assert_eq!(out, row);
    }
}
