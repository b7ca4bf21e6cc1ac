//! `responses_terminal`: a response ends with exactly one terminal event
//! (`response.completed`, `response.incomplete` or `response.failed`) and
//! nothing of it comes after: every event of a response comes between its
//! `response.created` and its terminal event, the terminal event names the
//! response in flight, and every output item added was done before it. (That
//! every response does end is [`crate::invariants::common::liveness`]'s job.)

use tokenwire_core::Output;

use super::view::is_terminal;
use crate::invariants::clip;
use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesTerminal;

impl Checker for ResponsesTerminal {
    fn name(&self) -> &'static str {
        "responses_terminal"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, text }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(r) = cx.view.responses(conn) else {
            return Ok(());
        };
        let kind = f.kind();
        if kind == "response.created" || f.v.get("sequence_number").is_none() {
            return Ok(());
        }
        let Some(cur) = &r.current else {
            return Err(format!(
                "{kind} on {conn:?} with no response in flight (after its terminal event?): {}",
                clip(text)
            ));
        };
        if !is_terminal(f) {
            return Ok(());
        }
        let id = f.v["response"]["id"].as_str().unwrap_or("");
        if id != cur.id || r.ended.contains(id) {
            return Err(format!(
                "{kind} for {id} on {conn:?}, the response in flight is {} (ended before: {})",
                cur.id,
                r.ended.contains(id)
            ));
        }
        if cur.items_open != 0 {
            return Err(format!(
                "{kind} for {id} on {conn:?} with {} output items not done",
                cur.items_open
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
    use tokenwire_core::{Dialect, Input};

    #[test]
    fn a_second_terminal_or_an_open_item_is_caught() {
        let mut k = kit(Box::new(ResponsesTerminal));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        let ev = |t: &str, n: u64| json!({"type": t, "sequence_number": n, "response": {"id": "resp_a", "status": "completed"}});
        k.send(1, ev("response.created", 0)).expect("created");
        k.send(1, ev("response.completed", 1)).expect("terminal");
        let e = k.send(1, ev("response.completed", 2)).expect_err("twice");
        assert_eq!(e.invariant, "responses_terminal");

        let mut k = kit(Box::new(ResponsesTerminal));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        k.send(1, ev("response.created", 0)).expect("created");
        k.send(
            1,
            json!({"type": "response.output_item.added", "sequence_number": 1}),
        )
        .expect("item");
        let e = k
            .send(1, ev("response.completed", 2))
            .expect_err("item open");
        assert!(e.detail.contains("not done"), "{}", e.detail);
    }
}
