//! `batch_order`: every frame on a `batch` connection concerns one payload,
//! its elements in payload order (strictly increasing positions among the
//! payload's prompts), and PROGRESS frames are sent only for payloads with
//! `stream_response` true.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::Output;

use super::view::prompt_events;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchOrder;

impl Checker for BatchOrder {
    fn name(&self) -> &'static str {
        "batch_order"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, events)) = prompt_events(cx.view, out) else {
            return Ok(());
        };
        let mut last: Option<(usize, usize)> = None;
        for (e, i) in events {
            let Some(i) = i else { continue };
            let pr = &b.prompts[i];
            if let Some((p, pos)) = last {
                if p != pr.payload || pos >= pr.pos {
                    return Err(format!(
                        "{} frame on {conn:?} out of payload order: {:?} (payload #{}, \
                         position {}) after payload #{p} position {pos}",
                        e.kind.as_str(),
                        pr.rid,
                        pr.payload,
                        pr.pos
                    ));
                }
            }
            last = Some((pr.payload, pr.pos));
            if matches!(e.kind, EventKind::Progress { .. }) && !b.payloads[pr.payload].stream {
                return Err(format!(
                    "PROGRESS for {:?} on {conn:?}, whose payload has stream_response false",
                    pr.rid
                ));
            }
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
    fn frames_out_of_payload_order_and_unasked_progress_are_caught() {
        let mut k = kit(Box::new(BatchOrder));
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "a", "prompt": "<c1>x"},
                               {"request_id": "b", "prompt": "<c1>y"}],
                   "stream_response": false}),
        )
        .expect("payload");
        k.send(
            1,
            json!([{"request_id": "a", "type": "ACCEPTED"},
                         {"request_id": "b", "type": "ACCEPTED"}]),
        )
        .expect("accepted");
        k.end().expect("end");
        k.send(
            1,
            json!([{"request_id": "a", "type": "STARTED"},
                         {"request_id": "b", "type": "STARTED"}]),
        )
        .expect("in order");
        let err = k
            .send(
                1,
                json!([{"request_id": "b", "type": "INITIALIZED", "text": ""},
                            {"request_id": "a", "type": "INITIALIZED", "text": ""}]),
            )
            .expect_err("reversed");
        assert_eq!(err.invariant, "batch_order");
        assert!(k
            .send(
                1,
                json!([{"request_id": "a", "type": "PROGRESS", "text": "x"}])
            )
            .is_err());
    }
}
