//! `batch_bounds`: a connection's payloads are refused exactly at the
//! bound (`batch_max_payloads`): one that arrives with fewer payloads of
//! the connection queued or running is never refused for it, and one that
//! arrives with that many always is. Payloads are counted as the Host
//! counts them: accepted and not yet retired (the view's `jobs`), at the
//! moment the answer goes out. A payload's prompts are bounded the same
//! way (`batch_max_prompts`): as many as the bound are accepted, one more is
//! refused.

use tokenwire_core::dialect::batch::codec::EventKind;
use tokenwire_core::Output;

use super::view::{batch_send, Reading};
use crate::invariants::{Check, Checker, Cx, Frame};

/// What the Host's refusal for the bound says.
pub(super) const PAYLOADS_REFUSAL: &str = "payloads queued or running";
/// What the Host's refusal for a payload's prompts says.
pub(super) const PROMPTS_REFUSAL: &str = "one payload may hold";

/// See the module docs.
#[derive(Debug, Default)]
pub struct BatchBounds;

impl Checker for BatchBounds {
    fn name(&self) -> &'static str {
        "batch_bounds"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, b, Ok(events))) = batch_send(cx.view, out) else {
            return Ok(());
        };
        if b.ambiguous {
            return Ok(());
        }
        let most = cx.config.batch_max_payloads;
        let held = b.jobs.len();
        let for_bound = events.iter().any(
            |e| matches!(&e.kind, EventKind::Error { error } if error.contains(PAYLOADS_REFUSAL)),
        );
        let for_prompts = events.iter().any(
            |e| matches!(&e.kind, EventKind::Error { error } if error.contains(PROMPTS_REFUSAL)),
        );
        let reading = b.read(&events);
        if let Reading::Accepted(p) | Reading::Refused(p) = reading {
            let pay = &b.payloads[p];
            let accepted = matches!(reading, Reading::Accepted(_));
            if accepted && pay.items > pay.max_prompts {
                return Err(format!(
                    "payload #{p} on {conn:?} accepted with {} prompts (the bound is {})",
                    pay.items, pay.max_prompts
                ));
            }
            if !accepted && for_prompts && pay.items <= pay.max_prompts {
                return Err(format!(
                    "payload #{p} on {conn:?} refused for its {} prompts (the bound is {})",
                    pay.items, pay.max_prompts
                ));
            }
        }
        match reading {
            Reading::Accepted(p) if held >= most => Err(format!(
                "payload #{p} on {conn:?} accepted with {held} payloads already queued or running (the bound is {most})"
            )),
            Reading::Refused(p) if for_bound && held < most => Err(format!(
                "payload #{p} on {conn:?} refused for the bound with {held} payloads queued or running (the bound is {most})"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit_with;
    use serde_json::json;
    use tokenwire_core::{Dialect, HostConfig};

    fn payload(id: &str) -> serde_json::Value {
        json!({"prompts": [{"request_id": id, "prompt": "<c1>x"}]})
    }

    #[test]
    fn a_payload_refused_at_its_prompt_bound_is_caught() {
        let cfg = HostConfig {
            batch_max_prompts: 2,
            ..HostConfig::default()
        };
        let mut k = kit_with(Box::new(BatchBounds), cfg);
        k.open_as(1, Dialect::Batch);
        k.text(
            1,
            json!({"prompts": [{"request_id": "a", "prompt": "<c1>x"},
                               {"request_id": "b", "prompt": "<c1>y"}]}),
        )
        .expect("frame");
        let e = k
            .send(
                1,
                json!([{"type": "ERROR", "request_id": "a",
                        "error": "invalid `prompts`: 2 prompts, more than the 2 one payload may hold"},
                       {"type": "ERROR", "request_id": "b",
                        "error": "invalid `prompts`: 2 prompts, more than the 2 one payload may hold"}]),
            )
            .expect_err("2 of 2 fit");
        assert!(
            e.detail.contains("refused for its 2 prompts"),
            "{}",
            e.detail
        );
    }

    #[test]
    fn acceptance_past_the_bound_and_refusal_under_it_are_caught() {
        let cfg = HostConfig {
            batch_max_payloads: 1,
            ..HostConfig::default()
        };
        let mut k = kit_with(Box::new(BatchBounds), cfg.clone());
        k.open_as(1, Dialect::Batch);
        k.text(1, payload("a")).expect("frame");
        k.send(1, json!([{"type": "ACCEPTED", "request_id": "a"}]))
            .expect("under the bound");
        k.text(1, payload("b")).expect("frame");
        let e = k
            .send(1, json!([{"type": "ACCEPTED", "request_id": "b"}]))
            .expect_err("past the bound");
        assert_eq!(e.invariant, "batch_bounds");
        let mut k = kit_with(Box::new(BatchBounds), cfg);
        k.open_as(1, Dialect::Batch);
        k.text(1, payload("a")).expect("frame");
        let e = k
            .send(
                1,
                json!([{"type": "ERROR", "request_id": "a",
                        "error": "this connection already has 1 payloads queued or running, the most one connection may"}]),
            )
            .expect_err("nothing was queued");
        assert!(e.detail.contains("refused for the bound"), "{}", e.detail);
    }
}
