//! JSON input with the limits of PROTOCOLS.md, and typed field access whose
//! errors name the field.

use serde_json::{Map, Value};

/// Deepest nesting of arrays and objects accepted in a frame.
pub const MAX_DEPTH: usize = 64;

/// Most JSON tokens (objects, arrays, strings and the commas between
/// values) accepted in a frame. Building a parsed value costs time per
/// value, on the one task that serves every connection: 4 MiB of tiny
/// objects would hold it for a tenth of a second. No frame of any dialect
/// needs more (a full `batch` payload of 256 prompts has about 2,000).
pub const MAX_TOKENS: usize = 50_000;

/// Parses `text` as JSON, rejecting nesting deeper than [`MAX_DEPTH`] and
/// more than [`MAX_TOKENS`] tokens as invalid (both found by one cheap byte
/// scan before anything is built).
/// The error is a message for the client; a number too large for a double
/// (`1e400`) is named by its field.
pub fn parse(text: &str) -> Result<Value, String> {
    check_shape(text)?;
    serde_json::from_str(text).map_err(|e| describe_error(text, &e))
}

/// The client's message for a parse error of `text`.
fn describe_error(text: &str, e: &serde_json::Error) -> String {
    if e.to_string().starts_with("number out of range") {
        if let Some(offset) = byte_offset(text, e.line(), e.column()) {
            let path = path_at(text, offset);
            if !path.is_empty() {
                return format!(
                    "invalid JSON: the number at `{path}` is out of range (line {}, column {})",
                    e.line(),
                    e.column()
                );
            }
        }
    }
    format!("invalid JSON: {e}")
}

/// The byte offset of serde_json's 1-based (line, byte column) position.
fn byte_offset(text: &str, line: usize, column: usize) -> Option<usize> {
    let line_start = if line <= 1 {
        0
    } else {
        text.match_indices('\n').nth(line - 2).map(|(i, _)| i + 1)?
    };
    let offset = line_start + column.checked_sub(1)?;
    (offset < text.len()).then_some(offset)
}

/// One open container while scanning for a path.
enum Open {
    Object { key: Option<String>, want_key: bool },
    Array { index: usize },
}

/// The field path (`parameters.stop[2]`) of the value at byte `offset` of
/// `text`, as far as the text up to there shows it; empty at the top level.
pub fn path_at(text: &str, offset: usize) -> String {
    let bytes = text.as_bytes();
    let mut stack: Vec<Open> = Vec::new();
    let mut i = 0;
    while i < bytes.len() && i < offset {
        match bytes[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                if let Some(Open::Object {
                    key,
                    want_key: want_key @ true,
                }) = stack.last_mut()
                {
                    let raw = text.get(start..=i.min(bytes.len() - 1)).unwrap_or("");
                    *key = Some(serde_json::from_str::<String>(raw).unwrap_or_default());
                    *want_key = false;
                }
            }
            b'{' => stack.push(Open::Object {
                key: None,
                want_key: true,
            }),
            b'[' => stack.push(Open::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Open::Object { key, want_key }) => {
                    *key = None;
                    *want_key = true;
                }
                Some(Open::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for open in &stack {
        match open {
            Open::Object { key: Some(k), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Open::Object { key: None, .. } => {}
            Open::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

/// Scans for nesting depth before parsing so a hostile frame cannot make the
/// parser recurse deeply.
fn check_shape(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    let mut tokens = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                tokens += 1;
            }
            b'[' | b'{' => {
                tokens += 1;
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "invalid JSON: nested deeper than {MAX_DEPTH} levels"
                    ));
                }
            }
            b',' => tokens += 1,
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if tokens > MAX_TOKENS {
            return Err(format!(
                "invalid JSON: more than {MAX_TOKENS} values, the most a frame may hold"
            ));
        }
    }
    Ok(())
}

/// A stored `f32` as a JSON number written as the shortest decimal that reads
/// back to it (`0.7`, not `0.699999988079071`); not finite: `null`.
pub fn f32_number(x: f32) -> Value {
    // `Display` for f32 is the shortest round-trip decimal; as an f64 that
    // decimal prints the same way.
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// A client field that is missing or of the wrong type or value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's name as the client wrote it (dotted for nested fields).
    pub field: String,
    /// What is wrong, in words.
    pub message: String,
}

impl FieldError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid `{}`: {}", self.field, self.message)
    }
}

/// JSON type name for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(field: &str, want: &str, got: &Value) -> FieldError {
    FieldError::new(field, format!("must be {want}, got {}", type_name(got)))
}

/// Typed, optional access to an object's fields. `null` counts as absent.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    /// Fields of `obj`; `prefix` (e.g. `"parameters."`) is prepended in errors.
    pub fn new(obj: &'a Map<String, Value>, prefix: &'a str) -> Self {
        Fields { obj, prefix }
    }

    fn name(&self, field: &str) -> String {
        format!("{}{}", self.prefix, field)
    }

    /// The prefix errors put before field names.
    pub fn prefix(&self) -> &'a str {
        self.prefix
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    /// True when the field is present and not null.
    pub fn has(&self, field: &str) -> bool {
        self.get(field).is_some()
    }

    /// A string field.
    pub fn str(&self, field: &str) -> Result<Option<&'a str>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong(&self.name(field), "a string", v)),
        }
    }

    /// A required string field.
    pub fn req_str(&self, field: &str) -> Result<&'a str, FieldError> {
        self.str(field)?
            .ok_or_else(|| FieldError::new(self.name(field), "is required"))
    }

    /// A boolean field.
    pub fn bool(&self, field: &str) -> Result<Option<bool>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong(&self.name(field), "a boolean", v)),
        }
    }

    /// A number field.
    pub fn f64(&self, field: &str) -> Result<Option<f64>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .map(Some)
                .ok_or_else(|| wrong(&self.name(field), "a number", &Value::Null)),
            Some(v) => Err(wrong(&self.name(field), "a number", v)),
        }
    }

    /// A non-negative integer field.
    pub fn u64(&self, field: &str) -> Result<Option<u64>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
                FieldError::new(
                    self.name(field),
                    format!("must be a non-negative integer, got {n}"),
                )
            }),
            Some(v) => Err(wrong(&self.name(field), "a non-negative integer", v)),
        }
    }

    /// An object field.
    pub fn obj(&self, field: &str) -> Result<Option<&'a Map<String, Value>>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(wrong(&self.name(field), "an object", v)),
        }
    }

    /// An array field.
    pub fn array(&self, field: &str) -> Result<Option<&'a Vec<Value>>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(wrong(&self.name(field), "an array", v)),
        }
    }

    /// The raw value of a field.
    pub fn raw(&self, field: &str) -> Option<&'a Value> {
        self.get(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_limit_rejects_deep_nesting_but_not_brackets_in_strings() {
        let deep = "[".repeat(65) + &"]".repeat(65);
        assert!(parse(&deep).unwrap_err().contains("deeper than 64"));
        let ok = "[".repeat(64) + &"]".repeat(64);
        assert!(parse(&ok).is_ok());
        let s = format!("{{\"a\":\"{}\"}}", "[".repeat(200));
        assert!(parse(&s).is_ok());
        let esc = r#"{"a":"\"[[[[","b":1}"#;
        assert!(parse(esc).is_ok());
    }

    #[test]
    fn many_values_are_refused_before_anything_is_built_and_strings_do_not_count_inside() {
        let many = format!("[{}{{}}]", "{},".repeat(MAX_TOKENS));
        let e = parse(&many).unwrap_err();
        assert!(e.contains("more than 50000 values"), "{e}");
        let fits = format!("[{}0]", "0,".repeat(MAX_TOKENS - 2));
        assert!(parse(&fits).is_ok());
        let commas_in_a_string = format!("\"{}\"", ",".repeat(4 * MAX_TOKENS));
        assert!(parse(&commas_in_a_string).is_ok());
    }

    #[test]
    fn a_number_out_of_range_is_named_by_its_field() {
        let e = parse(r#"{"type":"config","parameters":{"temperature":1e400}}"#).unwrap_err();
        assert!(e.contains("`parameters.temperature`"), "{e}");
        assert!(e.contains("out of range"), "{e}");
        let e = parse("{\"é\":\"ü\",\n \"stop\": [1, 2, -1e999]}").unwrap_err();
        assert!(e.contains("`stop[2]`"), "{e}");
        let e = parse(r#"{"a\"b":{"c":[{"d":1e999}]}}"#).unwrap_err();
        assert!(e.contains("`a\"b.c[0].d`"), "{e}");
        let e = parse("1e400").unwrap_err();
        assert!(e.contains("number out of range"), "{e}");
    }

    #[test]
    fn paths_follow_keys_and_indexes() {
        let t = r#"{"a":{"b":[10,{"c":5}]},"d":7}"#;
        assert_eq!(path_at(t, t.find('5').unwrap_or(0)), "a.b[1].c");
        assert_eq!(path_at(t, t.find("10").unwrap_or(0)), "a.b[0]");
        assert_eq!(path_at(t, t.find('7').unwrap_or(0)), "d");
        assert_eq!(path_at(t, 0), "");
    }

    #[test]
    fn wrong_types_name_the_field() {
        let v: Value = serde_json::json!({"t": "x", "n": -1, "b": 3});
        let m = v.as_object().expect("object");
        let f = Fields::new(m, "parameters.");
        assert_eq!(f.bool("b").unwrap_err().field, "parameters.b");
        assert!(f.u64("n").unwrap_err().message.contains("non-negative"));
        assert_eq!(f.req_str("missing").unwrap_err().message, "is required");
        assert_eq!(f.str("t").expect("ok"), Some("x"));
    }
}
