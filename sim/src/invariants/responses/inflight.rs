//! `responses_inflight`: at most one response is in flight per connection.
//! No response is created, and no create is accepted, while another is in
//! flight; a create handled meanwhile gets `concurrent_request` (409), and
//! `concurrent_request` answers nothing else.

use tokenwire_core::Output;

use super::view::{code, RKind, RMsg, RStage, ResponsesConnView};
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesInflight;

impl Checker for ResponsesInflight {
    fn name(&self) -> &'static str {
        "responses_inflight"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match out {
            Output::Tokenize(job) => {
                let Some(r) = cx.view.responses(&job.conn) else {
                    return Ok(());
                };
                match &r.current {
                    Some(cur) => Err(format!(
                        "a create on {:?} was accepted while {} is in flight",
                        job.conn, cur.id
                    )),
                    None => Ok(()),
                }
            }
            Output::Send { conn, text } => {
                let Some(f) = frame else {
                    return Ok(());
                };
                let Some(r) = cx.view.responses(conn) else {
                    return Ok(());
                };
                if f.kind() == "response.created" {
                    if let Some(cur) = &r.current {
                        return Err(format!(
                            "response {:?} created on {conn:?} while {} is in flight",
                            f.v["response"]["id"].as_str().unwrap_or("?"),
                            cur.id
                        ));
                    }
                    return Ok(());
                }
                if f.kind() != "error" || ResponsesConnView::is_unprompted_error(f) {
                    return Ok(());
                }
                let create_now = matches!(
                    r.head(),
                    Some(RMsg {
                        kind: RKind::Create { .. },
                        stage: RStage::Sent,
                        ..
                    })
                );
                let concurrent = code(f) == "concurrent_request";
                match (&r.current, create_now, concurrent) {
                    (Some(cur), true, false) => Err(format!(
                        "a create on {conn:?} while {} is in flight got {}, not concurrent_request: {}",
                        cur.id,
                        code(f),
                        clip(text)
                    )),
                    (None, _, true) | (_, false, true) => Err(format!(
                        "concurrent_request on {conn:?} with no create meeting a response in flight"
                    )),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::{Dialect, Input};

    fn created(id: &str) -> serde_json::Value {
        json!({"type": "response.created", "sequence_number": 0, "response": {"id": id}})
    }

    #[test]
    fn a_second_response_in_flight_is_caught() {
        let mut k = kit(Box::new(ResponsesInflight));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        k.send(1, created("resp_a")).expect("first");
        let e = k.send(1, created("resp_b")).expect_err("second");
        assert_eq!(e.invariant, "responses_inflight");
        k.end().expect("end");
        k.text(1, json!({"type": "response.create", "input": "x"}))
            .expect("frame");
        let e = k
            .send(
                1,
                json!({"type": "error", "status": 400, "error": {"code": "invalid_request"}}),
            )
            .expect_err("must be concurrent_request");
        assert!(e.detail.contains("concurrent_request"), "{}", e.detail);
    }
}
