//! A GGUF writer for tests: a parsed file written back, with metadata edited
//! and tensors added, so a real file (SmolLM2's) can be turned into one that
//! carries what another model's files carry.

use tokenwire_kernels::gguf::{GgmlType, GgufFile, MetaValue};

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// GGUF's type id of a value.
fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::Str(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn value(b: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => b.push(*x),
        MetaValue::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => b.push(u8::from(*x)),
        MetaValue::Str(s) => string(b, s),
        MetaValue::Array(items) => {
            // An empty array's element type is not kept by the parser: u8.
            let ty = items.first().map_or(0, type_id);
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                value(b, item);
            }
        }
    }
}

/// `file` (parsed from `source`) as a GGUF v3 file: its metadata, each of
/// its tensors with its bytes from `source`, then `extra` tensors (name,
/// type, ggml-order shape, bytes).
pub fn write(
    file: &GgufFile,
    source: &[u8],
    extra: &[(&str, GgmlType, Vec<u64>, Vec<u8>)],
) -> Vec<u8> {
    let align = file.alignment as usize;
    let mut tensors: Vec<(&str, GgmlType, Vec<u64>, &[u8])> = file
        .tensors
        .iter()
        .map(|t| {
            let start = t.offset as usize;
            (
                t.name.as_str(),
                t.dtype,
                t.dims.clone(),
                &source[start..start + t.len as usize],
            )
        })
        .collect();
    tensors.extend(
        extra
            .iter()
            .map(|(n, ty, d, b)| (*n, *ty, d.clone(), b.as_slice())),
    );
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(file.metadata.len() as u64).to_le_bytes());
    for (k, v) in &file.metadata {
        string(&mut b, k);
        b.extend_from_slice(&type_id(v).to_le_bytes());
        value(&mut b, v);
    }
    let mut offset = 0usize;
    for (name, ty, dims, data) in &tensors {
        string(&mut b, name);
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.id().to_le_bytes());
        b.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = (offset + data.len()).next_multiple_of(align);
    }
    b.resize(b.len().next_multiple_of(align), 0);
    for (_, _, _, data) in &tensors {
        b.extend_from_slice(data);
        b.resize(b.len().next_multiple_of(align), 0);
    }
    b
}
