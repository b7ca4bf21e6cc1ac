//! `batch_hostile`: a payload the simulated clients built to be refused is
//! refused as a whole, never accepted. The clients name every prompt of
//! such a payload `h<client>-<n>` (and no other prompt so): each breaks one
//! rule of the payload's contract (a `temperature` out of range, beams with
//! streaming or too many of them, `max_new_tokens` 0, an `early_stopping`
//! that is neither a boolean nor `"never"`, a prompt without text).

use super::view::{batch_send, Reading};
use crate::invariants::{Check, Checker, Cx, Frame};
use tokenwire_core::Output;

/// True for a request id of the clients' hostile payloads.
pub(super) fn hostile_id(id: &str) -> bool {
    id.strip_prefix('h')
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(client, n)| {
            !client.is_empty()
                && !n.is_empty()
                && client.bytes().all(|b| b.is_ascii_digit())
                && n.bytes().all(|b| b.is_ascii_digit())
        })
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchHostile;

impl Checker for BatchHostile {
    fn name(&self) -> &'static str {
        "batch_hostile"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, Ok(events))) = batch_send(cx.view, out) else {
            return Ok(());
        };
        if b.ambiguous {
            return Ok(());
        }
        let Reading::Accepted(p) = b.read(&events) else {
            return Ok(());
        };
        let named = &b.payloads[p].named;
        if !named.is_empty() && named.iter().all(|id| hostile_id(id)) {
            return Err(format!(
                "payload #{p} on {conn:?} ({named:?}), built to be refused, was accepted"
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
    fn an_accepted_hostile_payload_is_caught() {
        assert!(hostile_id("h3-17") && !hostile_id("b3-17") && !hostile_id("h-1"));
        let mut k = kit(Box::new(BatchHostile));
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "h1-5", "prompt": "<c1>x"}],
                   "generation_config": {"early_stopping": "sometimes"}}),
        )
        .expect("frame");
        let e = k
            .send(1, json!([{"type": "ACCEPTED", "request_id": "h1-5"}]))
            .expect_err("accepted");
        assert_eq!(e.invariant, "batch_hostile");

        let mut k = kit(Box::new(BatchHostile));
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "b1-5", "prompt": "<c1>x"}]}),
        )
        .expect("frame");
        k.send(1, json!([{"type": "ACCEPTED", "request_id": "b1-5"}]))
            .expect("an honest payload");
    }
}
