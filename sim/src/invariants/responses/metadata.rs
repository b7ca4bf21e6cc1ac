//! `responses_metadata`: a `response.create` is never refused for its
//! `metadata` when that is what the API allows: an object of at most 16
//! keys, every value a string (PROTOCOLS.md, the Responses API's limits).
//! The metadata is read from the frame itself, not through the dialect's
//! decoder, which is what this judges.

use serde_json::Value;
use tokenwire_core::Output;

use super::view::code;
use crate::invariants::{Check, Checker, Cx, Frame};

/// The API's bound on `metadata` keys.
const MAX_KEYS: usize = 16;

/// Whether `m` is metadata the API allows.
fn allowed(m: &Value) -> bool {
    m.as_object()
        .is_some_and(|o| o.len() <= MAX_KEYS && o.values().all(Value::is_string))
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesMetadata;

impl Checker for ResponsesMetadata {
    fn name(&self) -> &'static str {
        "responses_metadata"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let blamed = f.v["error"]["param"]
            .as_str()
            .is_some_and(|p| p == "metadata" || p.starts_with("metadata."));
        if f.kind() != "error" || !blamed {
            return Ok(());
        }
        let Some(m) = cx
            .view
            .responses(conn)
            .and_then(|r| r.head())
            .and_then(|h| h.metadata.as_ref())
        else {
            return Ok(());
        };
        if allowed(m) {
            return Err(format!(
                "a create on {conn:?} was refused ({}) for metadata the API allows: {m}",
                code(f)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::Dialect;

    fn keys(n: usize) -> Value {
        Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
    }

    fn refused() -> Value {
        json!({"type": "error", "status": 400,
               "error": {"type": "invalid_request_error", "code": "invalid_request",
                         "message": "m", "param": "metadata"}})
    }

    #[test]
    fn allowed_metadata_refused_is_caught() {
        for (metadata, ok) in [
            (keys(16), false),
            (json!({"a": "b"}), false),
            (json!({"a": {}}), true),
            (keys(17), true),
            (json!({"n": 1}), true),
            (json!("s"), true),
        ] {
            let mut k = kit(Box::new(ResponsesMetadata));
            k.open_as(1, Dialect::Responses);
            k.text(
                1,
                json!({"type": "response.create", "input": "hi", "metadata": metadata}),
            )
            .expect("create");
            let got = k.send(1, refused());
            assert_eq!(got.is_ok(), ok, "{metadata}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.invariant, "responses_metadata");
            }
        }
        // Nested under `response`, as the SDKs may send it.
        let mut k = kit(Box::new(ResponsesMetadata));
        k.open_as(1, Dialect::Responses);
        k.text(
            1,
            json!({"type": "response.create",
                   "response": {"input": "hi", "metadata": keys(3)}}),
        )
        .expect("create");
        k.send(1, refused()).expect_err("nested, allowed");
    }
}
