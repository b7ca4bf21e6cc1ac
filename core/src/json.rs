//! JSON input with the limits of PROTOCOLS.md, and typed field access whose
//! errors name the field.

use serde_json::{Map, Value};

/// Deepest nesting of arrays and objects accepted in a frame.
pub const MAX_DEPTH: usize = 64;

/// Parses `text` as JSON, rejecting nesting deeper than [`MAX_DEPTH`] as invalid.
/// The error is a message for the client.
pub fn parse(text: &str) -> Result<Value, String> {
    check_depth(text)?;
    serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))
}

/// Scans for nesting depth before parsing so a hostile frame cannot make the
/// parser recurse deeply.
fn check_depth(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
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
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "invalid JSON: nested deeper than {MAX_DEPTH} levels"
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
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
