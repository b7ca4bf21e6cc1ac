//! # tokenwire-gguf
//!
//! GGUF files (llama.cpp's model format): the header, metadata and tensor
//! table parsed and checked against the file's bytes, so that everything a
//! loader reads afterwards is known to be in range. Its own crate so that the
//! fuzz target builds it without the engines.
//!
//! [`GgufFile::parse`] takes the whole file (a memory map in the loader)
//! and refuses, with the byte offset and what is wrong, every malformed
//! file: a wrong magic or version, a truncated header, forged counts or
//! lengths, unknown value or tensor types, more than four dimensions, rows
//! that are not whole quantization blocks, tensors out of the data section,
//! misaligned or overlapping. It never panics and never allocates more than
//! the file's size justifies (the `gguf_header` fuzz target checks both).

mod cursor;
mod dtype;
mod meta;

use std::collections::{BTreeMap, BTreeSet};

pub use dtype::GgmlType;
pub use meta::MetaValue;

use cursor::Cursor;

/// "GGUF" as the first four bytes.
const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;

/// What is wrong with a GGUF file, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{msg}", at.map(|a| format!("at byte {a}: ")).unwrap_or_default())]
pub struct GgufError {
    /// Byte offset of the problem, when it has one.
    pub at: Option<u64>,
    /// What is wrong.
    pub msg: String,
}

impl GgufError {
    pub(crate) fn at(at: usize, msg: impl Into<String>) -> Self {
        GgufError {
            at: Some(at as u64),
            msg: msg.into(),
        }
    }

    fn whole(msg: impl Into<String>) -> Self {
        GgufError {
            at: None,
            msg: msg.into(),
        }
    }
}

/// One tensor of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`, ...).
    pub name: String,
    /// Its shape, fastest-varying dimension first (ggml's `ne`): a
    /// `[out, in]` matrix is `[in, out]` here.
    pub dims: Vec<u64>,
    /// Its element type.
    pub dtype: GgmlType,
    /// Byte offset of its data from the start of the file.
    pub offset: u64,
    /// Byte length of its data.
    pub len: u64,
}

impl TensorInfo {
    /// Number of values.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file: its metadata and tensor table, every tensor's bytes
/// known to lie inside the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata, by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensors, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Byte offset where tensor data starts.
    pub data_offset: u64,
    /// Alignment of tensor data.
    pub alignment: u64,
}

impl GgufFile {
    /// Parses and checks the file `bytes` (the whole file).
    pub fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let mut c = Cursor::new(bytes);
        let magic = c.take(4, "the magic number")?;
        if magic != MAGIC {
            return Err(GgufError::at(
                0,
                format!(
                    "not a GGUF file (it starts with {:02x?}, a GGUF file with \"GGUF\")",
                    magic
                ),
            ));
        }
        let version = c.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::at(
                4,
                format!("GGUF version {version}; versions 2 and 3 are read"),
            ));
        }
        // A tensor info is at least a name length, a dimension count, a
        // type and an offset; a key-value pair a key length and a type.
        let n_tensors = c.count(24, "the tensor count")?;
        let n_meta = c.count(13, "the metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_meta {
            let at = c.pos();
            let key = c.string(&format!("metadata key {i}"))?;
            let ty = c.u32(&format!("the value type of `{key}`"))?;
            let value = meta::read_value(&mut c, ty, &key)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(GgufError::at(
                    at,
                    format!("metadata key `{key}` appears twice"),
                ));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::whole(format!(
                        "`general.alignment` is {v:?}, not a power of two"
                    )))
                }
            },
        };
        let mut raw = Vec::with_capacity(n_tensors);
        let mut names = BTreeSet::new();
        for i in 0..n_tensors {
            let at = c.pos();
            let name = c.string(&format!("the name of tensor {i}"))?;
            if !names.insert(name.clone()) {
                return Err(GgufError::at(at, format!("tensor `{name}` appears twice")));
            }
            let n_dims = c.u32(&format!("the dimension count of `{name}`"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::at(
                    at,
                    format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} are valid)"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&format!("the shape of `{name}`"))?);
            }
            let ty = c.u32(&format!("the type of `{name}`"))?;
            let dtype = GgmlType::from_id(ty)
                .map_err(|e| GgufError::at(at, format!("tensor `{name}` has {e}")))?;
            let offset = c.u64(&format!("the data offset of `{name}`"))?;
            raw.push((at, name, dims, dtype, offset));
        }
        let data_offset = (c.pos() as u64).div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        if data_offset > file_len && !raw.is_empty() {
            return Err(GgufError::whole(format!(
                "the tensor data would start at byte {data_offset}, past the end of the {file_len}-byte file"
            )));
        }
        let mut tensors = Vec::with_capacity(raw.len());
        for (at, name, dims, dtype, rel) in raw {
            let len = tensor_bytes(&name, &dims, dtype).map_err(|m| GgufError::at(at, m))?;
            if !rel.is_multiple_of(alignment) {
                return Err(GgufError::at(
                    at,
                    format!("tensor `{name}`'s data offset {rel} is not a multiple of the alignment {alignment}"),
                ));
            }
            let offset = data_offset.checked_add(rel);
            let end = offset.and_then(|o| o.checked_add(len));
            match (offset, end) {
                (Some(offset), Some(end)) if end <= file_len => tensors.push(TensorInfo {
                    name,
                    dims,
                    dtype,
                    offset,
                    len,
                }),
                _ => {
                    return Err(GgufError::at(
                        at,
                        format!(
                            "tensor `{name}` ({len} bytes at data offset {rel}) runs past the end of the {file_len}-byte file (truncated?)"
                        ),
                    ))
                }
            }
        }
        let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
        by_offset.sort_by_key(|t| t.offset);
        for pair in by_offset.windows(2) {
            if pair[0].offset + pair[0].len > pair[1].offset {
                return Err(GgufError::whole(format!(
                    "tensors `{}` and `{}` overlap",
                    pair[0].name, pair[1].name
                )));
            }
        }
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            data_offset,
            alignment,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// A string under `key`; an error when it is there with another type.
    pub fn str(&self, key: &str) -> Result<Option<&str>, String> {
        self.typed(key, "a string", MetaValue::as_str)
    }

    /// A non-negative integer under `key`.
    pub fn uint(&self, key: &str) -> Result<Option<u64>, String> {
        self.typed(key, "a non-negative integer", MetaValue::as_u64)
    }

    /// A float under `key`.
    pub fn float(&self, key: &str) -> Result<Option<f64>, String> {
        self.typed(key, "a float", MetaValue::as_f64)
    }

    /// An array under `key`.
    pub fn array(&self, key: &str) -> Result<Option<&[MetaValue]>, String> {
        self.typed(key, "an array", MetaValue::as_array)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        get: impl Fn(&'a MetaValue) -> Option<T>,
    ) -> Result<Option<T>, String> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => get(v).map(Some).ok_or_else(|| {
                format!(
                    "metadata `{key}` is {} {}, not {want}",
                    article(v),
                    v.type_name()
                )
            }),
        }
    }
}

fn article(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::I8(_) | MetaValue::I16(_) | MetaValue::I32(_) | MetaValue::I64(_) => "an",
        MetaValue::Array(_) => "an",
        _ => "a",
    }
}

/// Bytes of a tensor of `dims` (rows along `dims[0]`) and `dtype`.
fn tensor_bytes(name: &str, dims: &[u64], dtype: GgmlType) -> Result<u64, String> {
    let row = dims[0];
    if !row.is_multiple_of(dtype.block_len() as u64) {
        return Err(format!(
            "tensor `{name}` is {dtype} with rows of {row} values, not a whole number of its {}-value blocks",
            dtype.block_len()
        ));
    }
    dtype
        .row_bytes(row)
        .and_then(|r| dims[1..].iter().try_fold(r, |acc, &d| acc.checked_mul(d)))
        .ok_or_else(|| format!("tensor `{name}`'s shape {dims:?} overflows"))
}

#[cfg(test)]
mod tests;
