//! `flow_control`: once the Host has been told a connection's outbound queue
//! is full (`QueueFull`), no step it plans computes a sequence of that
//! connection until the queue drains (`QueueDrained`). A step already
//! outstanding may finish.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct FlowControl;

impl Checker for FlowControl {
    fn name(&self) -> &'static str {
        "flow_control"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Output::RunStep(plan) = out else {
            return Ok(());
        };
        for s in &plan.seqs {
            let Some(conn) = cx.view.owner(s.seq) else {
                continue;
            };
            if let Some(since) = cx.view.conns.get(&conn).and_then(|c| c.blocked_since) {
                return Err(format!(
                    "step {} computes {:?} of {conn:?}, whose queue is full since {since:?}",
                    plan.step_id, s.seq
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
    use tokenwire_core::{ConnId, Input};

    #[test]
    fn a_step_for_a_full_connection_is_caught() {
        let mut k = kit(Box::new(FlowControl));
        k.open(1);
        k.step(1, 1, 1).expect("not full yet");
        k.end().expect("end");
        k.step_done(1, 1).expect("done");
        k.end().expect("end");
        k.input(Input::QueueFull { conn: ConnId(1) }).expect("full");
        let err = k.step(2, 1, 1).expect_err("computes a blocked conn");
        assert_eq!(err.invariant, "flow_control");
        k.end().expect("end");
        k.input(Input::QueueDrained { conn: ConnId(1) })
            .expect("drained");
        k.step(3, 1, 1).expect("fine again");
    }
}
