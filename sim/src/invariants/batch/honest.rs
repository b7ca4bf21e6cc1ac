//! `batch_honest`: a payload the simulated clients built to be valid (no
//! prompt named as the hostile ones are, `h<client>-<n>`, or with the empty
//! id one of them sends; a text frame) is
//! refused as a whole only for the bounds a valid payload can meet: its
//! connection already has as many payloads queued or running as it may, or
//! it has more prompts than one payload may hold (whether those refusals
//! came exactly at the bounds is `batch_bounds`' to judge). Every other
//! whole refusal (a `generation_config` field out of range,
//! beams with streaming, a `response_format` beside beams) says the
//! payload broke a rule, which an honest client's never does. The mirror of
//! `batch_hostile`.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::Output;

use super::bounds::{PAYLOADS_REFUSAL, PROMPTS_REFUSAL};
use super::hostile::hostile_id;
use super::view::{batch_send, Reading};
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchHonest;

impl Checker for BatchHonest {
    fn name(&self) -> &'static str {
        "batch_honest"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, Ok(events))) = batch_send(cx.view, out) else {
            return Ok(());
        };
        if b.ambiguous {
            return Ok(());
        }
        let Reading::Refused(p) = b.read(&events) else {
            return Ok(());
        };
        let pay = &b.payloads[p];
        let hostile = |id: &String| id.is_empty() || hostile_id(id);
        if pay.binary || pay.named.is_empty() || pay.named.iter().any(hostile) {
            return Ok(());
        }
        for e in &events {
            if let EventKind::Error { error } = &e.kind {
                if !error.contains(PAYLOADS_REFUSAL) && !error.contains(PROMPTS_REFUSAL) {
                    return Err(format!(
                        "payload #{p} on {conn:?} ({:?}), built to be valid, was refused: {error}",
                        pay.named
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{kit, Kit};
    use serde_json::json;
    use tokenwire_core::Dialect;

    /// A kit with one batch connection that sent `payload`.
    fn sent(payload: serde_json::Value) -> Kit {
        let mut k = kit(Box::new(BatchHonest));
        k.open_as(1, Dialect::Batch);
        k.text(1, payload).expect("frame");
        k
    }

    #[test]
    fn an_honest_payload_refused_for_a_rule_is_caught() {
        let honest = json!({"prompts": [{"request_id": "b1-5", "prompt": "<c1>x"}],
                            "generation_config": {"num_beams": 1}});
        let mut k = sent(honest.clone());
        let e = k
            .send(
                1,
                json!([{"type": "ERROR", "request_id": "b1-5",
                        "error": "`streamer` cannot be used with beam search (yet!)."}]),
            )
            .expect_err("refused for a rule it kept");
        assert_eq!(e.invariant, "batch_honest");
        // Refused at the per-connection bound, or for its prompts: fine.
        let mut k = sent(honest);
        k.send(
            1,
            json!([{"type": "ERROR", "request_id": "b1-5",
                    "error": "this connection already has 4 payloads queued or running, the most one connection may"}]),
        )
        .expect("the bound");
        let mut k = sent(
            json!({"prompts": [{"request_id": "b1-5", "prompt": "<c1>x"},
                                            {"request_id": "b1-6", "prompt": "<c1>y"}]}),
        );
        k.send(
            1,
            json!([{"type": "ERROR", "request_id": "b1-5", "error": "invalid `prompts`: 2 prompts, more than the 1 one payload may hold"},
                   {"type": "ERROR", "request_id": "b1-6", "error": "invalid `prompts`: 2 prompts, more than the 1 one payload may hold"}]),
        )
        .expect("the prompts' bound");
        // A hostile payload's refusal is the point.
        let mut k = sent(
            json!({"prompts": [{"request_id": "h1-5", "prompt": "<c1>x"}],
                            "generation_config": {"temperature": 9}}),
        );
        k.send(
            1,
            json!([{"type": "ERROR", "request_id": "h1-5", "error": "temperature out of range"}]),
        )
        .expect("hostile");
    }
}
