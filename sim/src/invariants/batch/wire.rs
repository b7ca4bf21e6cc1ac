//! `batch_wire`: every frame sent to a `batch` connection decodes with the
//! core's `decode_events` (a JSON array of well-formed events, only ERROR
//! with a null `request_id`), is not empty, and all its elements have one
//! type.

use tokenwire_core::Output;

use super::view::batch_send;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchWire;

impl Checker for BatchWire {
    fn name(&self) -> &'static str {
        "batch_wire"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, _, events)) = batch_send(cx.view, out) else {
            return Ok(());
        };
        let events = events.map_err(|e| format!("frame to {conn:?} does not decode: {e}"))?;
        let Some(first) = events.first() else {
            return Err(format!("empty frame to {conn:?}"));
        };
        if let Some(e) = events
            .iter()
            .find(|e| e.kind.as_str() != first.kind.as_str())
        {
            return Err(format!(
                "frame to {conn:?} mixes {} and {}",
                first.kind.as_str(),
                e.kind.as_str()
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

    #[test]
    fn mixed_empty_and_malformed_frames_are_caught() {
        let mut k = kit(Box::new(BatchWire));
        k.open_as(1, Dialect::Batch);
        k.send(1, json!([{"request_id": "a", "type": "ACCEPTED"}]))
            .expect("fine");
        let err = k
            .send(
                1,
                json!([{"request_id": "a", "type": "STARTED"},
                       {"request_id": "b", "type": "ACCEPTED"}]),
            )
            .expect_err("mixed");
        assert_eq!(err.invariant, "batch_wire");
        assert!(k.send(1, json!([])).is_err());
        assert!(k.send(1, json!({"type": "ACCEPTED"})).is_err());
        assert!(k
            .send(1, json!([{"request_id": null, "type": "ACCEPTED"}]))
            .is_err());
    }
}
