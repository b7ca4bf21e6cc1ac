//! GGUF metadata values: the typed key-value pairs before the tensor
//! infos (architecture, shapes, tokenizer, chat template).

use super::cursor::Cursor;
use super::GgufError;

/// Arrays inside arrays deeper than this are refused: real files nest at
/// most once, and a forged file must not recurse without end.
const MAX_DEPTH: usize = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// `string` (UTF-8).
    Str(String),
    /// `array` of values of one type.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// An integer value that is not negative, whatever its width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A signed integer value, whatever its width.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A float value (either width).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The GGUF type's name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "uint8",
            MetaValue::I8(_) => "int8",
            MetaValue::U16(_) => "uint16",
            MetaValue::I16(_) => "int16",
            MetaValue::U32(_) => "uint32",
            MetaValue::I32(_) => "int32",
            MetaValue::U64(_) => "uint64",
            MetaValue::I64(_) => "int64",
            MetaValue::F32(_) => "float32",
            MetaValue::F64(_) => "float64",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }
}

/// Fewest bytes a value of GGUF type `ty` takes (for bounding counts).
fn min_size(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        // A string's or an array's length, then (maybe) nothing.
        8 => 8,
        9 => 12,
        _ => 8,
    }
}

/// Reads a value of GGUF type `ty` for `key`.
pub(crate) fn read_value(c: &mut Cursor<'_>, ty: u32, key: &str) -> Result<MetaValue, GgufError> {
    read_at_depth(c, ty, key, 0)
}

fn read_at_depth(
    c: &mut Cursor<'_>,
    ty: u32,
    key: &str,
    depth: usize,
) -> Result<MetaValue, GgufError> {
    let what = format!("the value of `{key}`");
    Ok(match ty {
        0 => MetaValue::U8(c.u8(&what)?),
        1 => MetaValue::I8(c.u8(&what)? as i8),
        2 => MetaValue::U16(c.u16(&what)?),
        3 => MetaValue::I16(c.u16(&what)? as i16),
        4 => MetaValue::U32(c.u32(&what)?),
        5 => MetaValue::I32(c.u32(&what)? as i32),
        6 => MetaValue::F32(f32::from_bits(c.u32(&what)?)),
        7 => {
            let at = c.pos();
            match c.u8(&what)? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(GgufError::at(at, format!("{what} is bool {b}, not 0 or 1"))),
            }
        }
        8 => MetaValue::Str(c.string(&what)?),
        9 => {
            if depth >= MAX_DEPTH {
                return Err(GgufError::at(
                    c.pos(),
                    format!("{what} nests arrays more than {MAX_DEPTH} deep"),
                ));
            }
            let at = c.pos();
            let elem = c.u32(&format!("the element type of `{key}`"))?;
            if elem > 12 {
                return Err(GgufError::at(
                    at,
                    format!("`{key}` is an array of unknown value type {elem}"),
                ));
            }
            let n = c.count(min_size(elem), &format!("the length of `{key}`"))?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(read_at_depth(c, elem, key, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        10 => MetaValue::U64(c.u64(&what)?),
        11 => MetaValue::I64(c.u64(&what)? as i64),
        12 => MetaValue::F64(f64::from_bits(c.u64(&what)?)),
        other => {
            return Err(GgufError::at(
                c.pos(),
                format!("`{key}` has unknown value type {other}"),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_every_type_and_nesting_limits() {
        let mut b = Vec::new();
        b.extend_from_slice(&9u32.to_le_bytes()); // array of
        b.extend_from_slice(&5u32.to_le_bytes()); // int32
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&(-3i32).to_le_bytes());
        b.extend_from_slice(&7i32.to_le_bytes());
        let mut c = Cursor::new(&b[4..]);
        let v = read_value(&mut c, 9, "k").expect("array");
        assert_eq!(
            v,
            MetaValue::Array(vec![MetaValue::I32(-3), MetaValue::I32(7)])
        );
        assert_eq!(v.as_array().map(|a| a[0].as_i64()), Some(Some(-3)));
        assert_eq!(MetaValue::I32(-3).as_u64(), None);
        assert_eq!(MetaValue::U8(3).as_u64(), Some(3));
        // Arrays of arrays of ... past the limit.
        let mut deep = Vec::new();
        for _ in 0..10 {
            deep.extend_from_slice(&9u32.to_le_bytes());
            deep.extend_from_slice(&1u64.to_le_bytes());
        }
        let e = read_value(&mut Cursor::new(&deep), 9, "deep").expect_err("too deep");
        assert!(e.to_string().contains("nests"), "{e}");
        let e = read_value(&mut Cursor::new(&[2]), 7, "flag").expect_err("bool 2");
        assert!(e.to_string().contains("bool 2"), "{e}");
        let e = read_value(&mut Cursor::new(&[0; 8]), 13, "x").expect_err("type 13");
        assert!(e.to_string().contains("unknown value type 13"), "{e}");
    }
}
