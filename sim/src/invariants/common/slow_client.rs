//! `slow_client`: a connection whose outbound queue stays full for the
//! slow-client timeout is closed (1008, "client too slow to read") no later
//! than the timeout plus one step, and never earlier or with a queue that
//! drained.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// The close reason the Host gives.
pub const REASON: &str = tokenwire_core::api::close_reason::SLOW_CLIENT;

/// See the module docs.
#[derive(Debug, Default)]
pub struct SlowClient;

impl Checker for SlowClient {
    fn name(&self) -> &'static str {
        "slow_client"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, c)) = cx.closed_with(out, REASON) else {
            return Ok(());
        };
        match c.blocked_since {
            None => Err(format!(
                "{conn:?} closed as a slow reader but its queue is not full"
            )),
            Some(b) if cx.now < b + cx.config.slow_client_timeout => Err(format!(
                "{conn:?} closed as a slow reader at {:?}, full only since {b:?}",
                cx.now
            )),
            Some(_) => Ok(()),
        }
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        for (conn, c) in &cx.view.conns {
            let Some(b) = c.blocked_since else { continue };
            if !c.closed && cx.nominal > b + cx.config.slow_client_timeout + cx.slack {
                return Err(format!(
                    "{conn:?} full since {b:?} still open at {:?} (slow-client timeout {:?})",
                    cx.nominal, cx.config.slow_client_timeout
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
    fn a_full_queue_never_closed_is_caught() {
        let mut k = kit(Box::new(SlowClient));
        k.open(1);
        k.input(Input::QueueFull { conn: ConnId(1) }).expect("full");
        k.end().expect("end");
        k.at(30_011);
        k.input(Input::Timeout).expect("input");
        let err = k.end().expect_err("overdue");
        assert_eq!(err.invariant, "slow_client");
    }
}
