//! Weight matrices kept in their file's dtype: owned (built in memory) or a
//! range of a memory-mapped file (safetensors or GGUF) or of a file built
//! into the binary.
//! The loaders fill [`WeightMatrix`]es; the backends dispatch on
//! [`WeightMatrix::dtype`] and read rows of raw blocks. No f32 copy of a
//! half-precision or quantized matrix is ever made. The CPU backend keeps
//! its own copy of the 32-block matrices in the layout its kernels read
//! ([`WeightMatrix::laid_out`], [`RowLayout`]); every other reader sees the
//! file's layout.

use std::sync::Arc;

use tokenwire_gguf::GgmlType;

use crate::quant::blocks::dequantize_row;
use crate::quant::lanes::{self, RowLayout};

/// Read-only bytes shared by every matrix that lives in them: a mapped
/// file, or a file built into the binary.
#[derive(Clone)]
pub struct SharedMap(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl SharedMap {
    /// Bytes built into the binary.
    pub fn from_static(bytes: &'static [u8]) -> SharedMap {
        SharedMap(Arc::new(bytes))
    }
}

impl std::ops::Deref for SharedMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// Where a matrix's bytes are.
#[derive(Clone)]
enum Storage {
    /// f32 values owned (4-byte aligned, so they can be read as `&[f32]`).
    F32(Vec<f32>),
    /// Any other dtype's bytes, owned (shared by clones: a model's copy for
    /// one backend is not copied again).
    Bytes(Arc<Vec<u8>>),
    /// `len` bytes at `start` of a mapped file.
    Mapped {
        map: SharedMap,
        start: usize,
        len: usize,
    },
}

/// A row-major `[rows, cols]` matrix in one of the [`GgmlType`]s; for the
/// block types each row is a whole number of blocks.
#[derive(Clone)]
pub struct WeightMatrix {
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    layout: RowLayout,
    storage: Storage,
}

impl std::fmt::Debug for WeightMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match self.storage {
            Storage::Mapped { .. } => "mapped",
            _ => "owned",
        };
        write!(
            f,
            "WeightMatrix({} [{}, {}], {place})",
            self.dtype, self.rows, self.cols
        )
    }
}

impl PartialEq for WeightMatrix {
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype
            && self.rows == other.rows
            && self.cols == other.cols
            && self.layout == other.layout
            && self.bytes() == other.bytes()
    }
}

/// Bytes of a `[rows, cols]` matrix of `dtype`, or why there is no such matrix.
fn matrix_bytes(dtype: GgmlType, rows: usize, cols: usize) -> Result<usize, String> {
    let row = dtype.row_bytes(cols as u64).ok_or_else(|| {
        format!(
            "a row of {cols} values is not a whole number of {dtype} blocks of {}",
            dtype.block_len()
        )
    })?;
    row.checked_mul(rows as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("a [{rows}, {cols}] {dtype} matrix does not fit in memory"))
}

impl WeightMatrix {
    /// An f32 matrix from its values.
    pub fn from_f32(rows: usize, cols: usize, values: Vec<f32>) -> Result<Self, String> {
        if Some(values.len()) != rows.checked_mul(cols) {
            return Err(format!(
                "{} values for a [{rows}, {cols}] matrix",
                values.len()
            ));
        }
        Ok(WeightMatrix {
            dtype: GgmlType::F32,
            rows,
            cols,
            layout: RowLayout::File,
            storage: Storage::F32(values),
        })
    }

    /// A matrix of `dtype` from its raw little-endian bytes, as a file stores them.
    pub fn from_bytes(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Result<Self, String> {
        let want = matrix_bytes(dtype, rows, cols)?;
        if bytes.len() != want {
            return Err(format!(
                "{} bytes for a [{rows}, {cols}] {dtype} matrix of {want} bytes",
                bytes.len()
            ));
        }
        if dtype == GgmlType::F32 {
            let values = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            return WeightMatrix::from_f32(rows, cols, values);
        }
        Ok(WeightMatrix {
            dtype,
            rows,
            cols,
            layout: RowLayout::File,
            storage: Storage::Bytes(Arc::new(bytes)),
        })
    }

    /// A matrix of `dtype` stored at `start` of the mapped file `map`. An f32
    /// matrix at an offset not divisible by 4 is copied (GGUF aligns tensor
    /// data, so only a file with `general.alignment` below 4 has one).
    pub fn mapped(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        map: &SharedMap,
        start: usize,
    ) -> Result<Self, String> {
        let len = matrix_bytes(dtype, rows, cols)?;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= map.len())
            .ok_or_else(|| {
                format!(
                    "{len} bytes at offset {start} run past the end of the {}-byte file",
                    map.len()
                )
            })?;
        let aligned = (map.as_ptr() as usize + start).is_multiple_of(4);
        if dtype == GgmlType::F32 && !aligned {
            return WeightMatrix::from_bytes(dtype, rows, cols, map[start..end].to_vec());
        }
        Ok(WeightMatrix {
            dtype,
            rows,
            cols,
            layout: RowLayout::File,
            storage: Storage::Mapped {
                map: map.clone(),
                start,
                len,
            },
        })
    }

    /// The values' type.
    pub fn dtype(&self) -> GgmlType {
        self.dtype
    }

    /// Rows (output features of a linear layer).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// How the rows' blocks are laid out: the file's layout unless this is
    /// a [`WeightMatrix::laid_out`] copy of a dtype with another layout.
    pub fn layout(&self) -> RowLayout {
        self.layout
    }

    /// Whether kernels that read rows in `layout` can read this matrix's
    /// (dtypes without an interleaved form read the same in every layout).
    pub fn reads_as(&self, layout: RowLayout) -> bool {
        self.layout == layout
            || !(lanes::changes(self.dtype, self.layout) || lanes::changes(self.dtype, layout))
    }

    /// This matrix with its rows in `layout`: itself (a cheap clone) where
    /// that changes nothing for its dtype, else an owned copy, row by row.
    pub fn laid_out(&self, layout: RowLayout) -> WeightMatrix {
        let from = self.layout;
        if self.reads_as(layout) {
            return self.clone();
        }
        let to = layout;
        let n = self.row_len_bytes();
        let mut bytes = vec![0u8; self.bytes().len()];
        let mut file = vec![0u8; n];
        // (`max(1)`: a matrix of empty rows has no bytes to lay out.)
        let rows = self.bytes().chunks_exact(n.max(1));
        for (src, dst) in rows.zip(bytes.chunks_exact_mut(n.max(1))) {
            // Through the file's layout, so any layout reaches any other.
            match from {
                RowLayout::File => file.copy_from_slice(src),
                RowLayout::Lanes8 => lanes::deinterleave_row(self.dtype, src, &mut file),
            }
            match to {
                RowLayout::File => dst.copy_from_slice(&file),
                RowLayout::Lanes8 => lanes::interleave_row(self.dtype, &file, dst),
            }
        }
        WeightMatrix {
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            layout,
            storage: Storage::Bytes(Arc::new(bytes)),
        }
    }

    /// Rows `start..start + count` as a matrix of their own: a fused
    /// projection (Phi-3's `qkv_proj`, `gate_up_proj`) split into the
    /// separate ones the backends read. A mapped matrix's rows stay where
    /// they lie in the file; an owned one's are copied.
    pub fn row_range(&self, start: usize, count: usize) -> Result<WeightMatrix, String> {
        let end = start
            .checked_add(count)
            .filter(|&e| e <= self.rows)
            .ok_or_else(|| {
                format!(
                    "rows {start}..{start}+{count} of a matrix of {} rows",
                    self.rows
                )
            })?;
        let n = self.row_len_bytes();
        let storage = match &self.storage {
            Storage::F32(v) => Storage::F32(v[start * self.cols..end * self.cols].to_vec()),
            Storage::Bytes(b) => Storage::Bytes(Arc::new(b[start * n..end * n].to_vec())),
            Storage::Mapped { map, start: at, .. } => {
                let at = at + start * n;
                // An f32 range off 4-byte alignment is copied, as `mapped` does.
                if self.dtype == GgmlType::F32 && !(map.as_ptr() as usize + at).is_multiple_of(4) {
                    let values = map[at..at + count * n]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    Storage::F32(values)
                } else {
                    Storage::Mapped {
                        map: map.clone(),
                        start: at,
                        len: count * n,
                    }
                }
            }
        };
        Ok(WeightMatrix {
            dtype: self.dtype,
            rows: count,
            cols: self.cols,
            layout: self.layout,
            storage,
        })
    }

    /// Whether the bytes are a range of a mapped file rather than owned.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }

    /// All bytes, row after row, in [`WeightMatrix::layout`].
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::F32(v) => bytemuck::cast_slice(v),
            Storage::Bytes(b) => b,
            Storage::Mapped { map, start, len } => &map[*start..*start + *len],
        }
    }

    /// Bytes of one row.
    pub fn row_len_bytes(&self) -> usize {
        // Whole blocks by construction (`matrix_bytes` checked the shape).
        (self.cols / self.dtype.block_len()) * self.dtype.block_bytes()
    }

    /// The bytes of row `r`, in [`WeightMatrix::layout`].
    #[inline]
    pub fn row(&self, r: usize) -> &[u8] {
        let n = self.row_len_bytes();
        &self.bytes()[r * n..(r + 1) * n]
    }

    /// The values of an f32 matrix as a slice; `None` for other dtypes.
    pub fn as_f32(&self) -> Option<&[f32]> {
        if self.dtype != GgmlType::F32 {
            return None;
        }
        match &self.storage {
            Storage::F32(v) => Some(v),
            // `mapped` copied any f32 matrix whose start is not 4-aligned.
            _ => bytemuck::try_cast_slice(self.bytes()).ok(),
        }
    }

    /// Row `r` widened to f32 into `out` (`cols` values), whatever its
    /// layout.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (row, out) = (self.row(r), &mut out[..self.cols]);
        let group =
            lanes::group_bytes(self.dtype).filter(|_| lanes::changes(self.dtype, self.layout));
        let Some(group) = group else {
            return dequantize_row(self.dtype, row, out);
        };
        // A group at a time through the file's layout, on the stack: this
        // runs once per token for the embedding.
        let values = lanes::GROUP * self.dtype.block_len();
        let mut file = [0u8; lanes::MAX_GROUP_BYTES];
        let (groups, tail) = row.split_at(row.len() / group * group);
        let (out_groups, out_tail) = out.split_at_mut(groups.len() / group * values);
        for (g, o) in groups
            .chunks_exact(group)
            .zip(out_groups.chunks_exact_mut(values))
        {
            lanes::deinterleave_row(self.dtype, g, &mut file[..group]);
            dequantize_row(self.dtype, &file[..group], o);
        }
        dequantize_row(self.dtype, tail, out_tail);
    }

    /// Every value widened to f32 (for the small vectors: norms, biases).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = Vec::new();
        self.dequantize_rows(0, self.rows, &mut out);
        out
    }

    /// Rows `r0..r1` widened to f32, appended to `out`: for uploads and
    /// tests, a chunk at a time, never the whole model.
    pub fn dequantize_rows(&self, r0: usize, r1: usize, out: &mut Vec<f32>) {
        let at = out.len();
        out.resize(at + (r1 - r0) * self.cols, 0.0);
        for (r, o) in (r0..r1).zip(out[at..].chunks_exact_mut(self.cols.max(1))) {
            self.dequantize_row(r, o);
        }
    }
}

/// Maps the file at `path` read-only. The mapping outlives the file handle.
///
/// Soundness: `Mmap::map` is `unsafe` because another process could change
/// or truncate the file while it is mapped. A model file is not written
/// while a server reads it (the same contract llama.cpp and safetensors
/// loaders rely on), and every read through the map is bounds-checked
/// against the length it had when mapped.
#[allow(unsafe_code)]
pub fn map_file(path: &std::path::Path) -> std::io::Result<SharedMap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: see above; the map is never written (read-only mapping).
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(SharedMap(Arc::new(map)))
}

/// Rounds f32 values to `dtype` (F32, F16 or BF16), as a file of that dtype
/// would hold them: for benchmarks and tests that build models in memory.
pub fn encode_floats(dtype: GgmlType, values: &[f32]) -> Result<Vec<u8>, String> {
    Ok(match dtype {
        GgmlType::F32 => bytemuck::cast_slice(values).to_vec(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        other => return Err(format!("{other} is not a float type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_that_are_not_whole_blocks_or_lengths_are_refused() {
        let e = WeightMatrix::from_bytes(GgmlType::Q4_1, 2, 48, vec![0; 60]).unwrap_err();
        assert!(e.contains("not a whole number of Q4_1 blocks"), "{e}");
        let e = WeightMatrix::from_bytes(GgmlType::Q8_0, 2, 32, vec![0; 67]).unwrap_err();
        assert!(e.contains("67 bytes"), "{e}");
        let e = WeightMatrix::from_f32(2, 3, vec![0.0; 5]).unwrap_err();
        assert!(e.contains("5 values"), "{e}");
    }

    #[test]
    fn rows_widen_to_their_values() {
        let vals = [1.5f32, -2.0, 0.25, 8.0];
        let m = WeightMatrix::from_bytes(
            GgmlType::F16,
            2,
            2,
            encode_floats(GgmlType::F16, &vals).expect("f16"),
        )
        .expect("matrix");
        let mut out = Vec::new();
        m.dequantize_rows(1, 2, &mut out);
        assert_eq!(out, vec![0.25, 8.0]);
        assert!(m.as_f32().is_none());
        let f = WeightMatrix::from_f32(2, 2, vals.to_vec()).expect("matrix");
        assert_eq!(f.as_f32(), Some(&vals[..]));
        assert_eq!(f.row(1), bytemuck::cast_slice::<f32, u8>(&vals[2..]));
    }

    #[test]
    fn a_laid_out_copy_widens_to_the_same_values_and_lays_back() {
        // Q4_1 rows of 18 blocks: two whole groups and two blocks after them.
        let (rows, cols) = (3, 18 * 32);
        let bytes: Vec<u8> = (0..rows * 18 * 20)
            .map(|i| match i % 20 {
                // Small finite f16 scales and minimums (0x2c00 = 0.0625).
                1 | 3 => 0x2c,
                0 | 2 => (i / 20) as u8,
                _ => (i * 13 % 256) as u8,
            })
            .collect();
        let file = WeightMatrix::from_bytes(GgmlType::Q4_1, rows, cols, bytes).expect("matrix");
        let laid = file.laid_out(RowLayout::Lanes8);
        assert_eq!(laid.layout(), RowLayout::Lanes8);
        assert_ne!(laid.bytes(), file.bytes());
        assert_ne!(laid, file);
        let (mut want, mut got) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            file.dequantize_row(r, &mut want);
            laid.dequantize_row(r, &mut got);
            assert_eq!(got, want, "row {r}");
        }
        assert_eq!(laid.laid_out(RowLayout::File), file);
        // Formats without an interleaved form keep their bytes.
        let f16 = WeightMatrix::from_bytes(GgmlType::F16, 1, 2, vec![0, 60, 0, 64]).unwrap();
        assert_eq!(f16.laid_out(RowLayout::Lanes8).bytes(), f16.bytes());
    }
}
