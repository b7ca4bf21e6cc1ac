//! `scheduler`: the Host's own consistency check (`Host::check_invariants`:
//! block allocator counts, no block held twice, queues matching states, the
//! outstanding step naming live sequences) holds after every event.

use crate::invariants::{Check, Checker, Cx, EndState};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SchedulerInvariants;

impl Checker for SchedulerInvariants {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    fn on_end(&mut self, _cx: &Cx<'_>, end: &EndState) -> Check {
        end.sched.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{idle_end, kit};
    use tokenwire_core::Input;

    #[test]
    fn a_failed_host_check_is_reported() {
        let mut k = kit(Box::new(SchedulerInvariants));
        k.input(Input::Timeout).expect("input");
        let mut bad = idle_end();
        bad.sched = Err("block 3 held by both SeqId(1) and SeqId(2)".into());
        let err = k.m.end(&bad).expect_err("reported");
        assert_eq!(err.invariant, "scheduler");
        assert!(err.detail.contains("block 3"));
    }
}
