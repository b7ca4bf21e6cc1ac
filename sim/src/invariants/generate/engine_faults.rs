//! `engine_faults`: a failed step fails exactly the requests the contract says.
//! An out-of-memory step of a single sequence (it cannot run even alone)
//! fails that request with `memory_pressure`, unless the sequence carried
//! draft tokens (it runs again without them); an internal engine error fails
//! every request of the step with `internal_error`; each failure is an
//! `error` carrying the partial text, in the same event.

use std::collections::BTreeMap;

use tokenwire_core::{ConnId, EngineFaultKind, Input, Output};

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct EngineFaults {
    /// Requests that must fail in this event: conn -> (request, error code).
    due: BTreeMap<ConnId, (String, &'static str)>,
}

impl Checker for EngineFaults {
    fn name(&self) -> &'static str {
        "engine_faults"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        self.due.clear();
        let Input::EngineFault(fault) = input else {
            return Ok(());
        };
        let Some(step) = cx.view.step.as_ref().filter(|s| s.id == fault.step_id) else {
            return Ok(());
        };
        let code = match &fault.kind {
            EngineFaultKind::OutOfMemory if step.seqs.len() == 1 && !step.drafted => {
                "memory_pressure"
            }
            EngineFaultKind::Internal(_) => "internal_error",
            _ => return Ok(()),
        };
        for seq in &step.seqs {
            let Some(rid) = cx.view.seq_request.get(seq) else {
                continue;
            };
            let Some(r) = cx.view.requests.get(rid) else {
                continue;
            };
            let live = cx
                .view
                .conns
                .get(&r.conn)
                .is_some_and(|c| !c.closed && c.current.as_deref() == Some(rid.as_str()));
            if live && r.terminals == 0 && !r.superseded {
                self.due.insert(r.conn, (rid.clone(), code));
            }
        }
        Ok(())
    }

    fn on_output(&mut self, _cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        if let Some((rid, code)) = self.due.get(conn) {
            if f.is_failure() && f.request_id() == Some(rid.as_str()) {
                if f.str("error") != Some(*code) {
                    return Err(format!(
                        "{rid} failed with {:?}, expected {code}",
                        f.str("error")
                    ));
                }
                self.due.remove(conn);
            }
        }
        Ok(())
    }

    fn on_end(&mut self, _cx: &Cx<'_>, _end: &EndState) -> Check {
        match self.due.iter().next() {
            Some((conn, (rid, code))) => Err(format!(
                "the failed step should have failed {rid} on {conn:?} with {code}, it did not"
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::EngineFault;

    #[test]
    fn a_lone_out_of_memory_step_that_fails_nobody_is_caught() {
        let mut k = kit(Box::new(EngineFaults::default()));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step");
        k.end().expect("end");
        k.input(Input::EngineFault(EngineFault {
            step_id: 1,
            kind: EngineFaultKind::OutOfMemory,
        }))
        .expect("fault");
        let err = k.end().expect_err("nobody failed");
        assert_eq!(err.invariant, "engine_faults");
        // With the failure it holds.
        let mut k = kit(Box::new(EngineFaults::default()));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.step(1, 1, 1).expect("step");
        k.end().expect("end");
        k.input(Input::EngineFault(EngineFault {
            step_id: 1,
            kind: EngineFaultKind::Internal("x".into()),
        }))
        .expect("fault");
        k.send(
            1,
            json!({"type": "error", "error": "internal_error", "message": "m",
                         "recoverable": true, "recovery_action": "retry",
                         "request_id": "gen_a", "generated_text": ""}),
        )
        .expect("failure");
        k.end().expect("failed as due");
    }
}
