//! `responses_sequence`: the events of each response are numbered by
//! `sequence_number` from 0 (its `response.created`) up by exactly one per
//! event, so a client can tell that none was lost, repeated or reordered.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesSequence;

impl Checker for ResponsesSequence {
    fn name(&self) -> &'static str {
        "responses_sequence"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(r) = cx.view.responses(conn) else {
            return Ok(());
        };
        let Some(n) = f.v.get("sequence_number").and_then(|n| n.as_u64()) else {
            return Ok(());
        };
        let want = if f.kind() == "response.created" {
            0
        } else {
            match &r.current {
                Some(cur) => cur.next_seq,
                None => return Ok(()),
            }
        };
        if n != want {
            return Err(format!(
                "{} on {conn:?} has sequence_number {n}, expected {want}",
                f.kind()
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
    fn a_skipped_or_restarted_number_is_caught() {
        let mut k = kit(Box::new(ResponsesSequence));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        let ev = |t: &str, n: u64| json!({"type": t, "sequence_number": n, "response": {"id": "resp_a"}});
        k.send(1, ev("response.created", 0)).expect("0");
        k.send(1, ev("response.in_progress", 1)).expect("1");
        let e = k
            .send(1, ev("response.output_item.added", 3))
            .expect_err("2 skipped");
        assert_eq!(e.invariant, "responses_sequence");
        let mut k = kit(Box::new(ResponsesSequence));
        k.open_as(1, Dialect::Responses);
        k.input(Input::Timeout).expect("input");
        let e = k
            .send(1, ev("response.created", 1))
            .expect_err("not from 0");
        assert_eq!(e.invariant, "responses_sequence");
    }
}
