//! `idle_timeout`: a WebSocket connection of any dialect with no request in
//! flight (nor a text job or job check it waits for) and no frame received
//! for the idle timeout is closed (1000, "idle timeout") no
//! later than the timeout plus one step, and never earlier or while busy.

use tokenwire_core::{Output, Transport};

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// The close reason the Host gives.
pub const REASON: &str = tokenwire_core::api::close_reason::IDLE;

/// See the module docs.
#[derive(Debug, Default)]
pub struct IdleTimeout;

impl Checker for IdleTimeout {
    fn name(&self) -> &'static str {
        "idle_timeout"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, c)) = cx.closed_with(out, REASON) else {
            return Ok(());
        };
        if let Some(r) = c.in_flight() {
            return Err(format!(
                "{conn:?} closed as idle while request {r} is in flight"
            ));
        }
        if c.busy() {
            return Err(format!(
                "{conn:?} closed as idle while it waits for a text job or a job check"
            ));
        }
        if cx.now < c.last_activity + cx.config.idle_timeout {
            return Err(format!(
                "{conn:?} closed as idle at {:?}, but it was active at {:?} (idle timeout {:?})",
                cx.now, c.last_activity, cx.config.idle_timeout
            ));
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        for (conn, c) in &cx.view.conns {
            // A prompt being tokenized, a job being verified, is a request
            // in flight too.
            if c.closed || c.transport != Transport::WebSocket || c.busy() {
                continue;
            }
            let due = c.last_activity + cx.config.idle_timeout + cx.slack;
            if cx.nominal > due {
                return Err(format!(
                    "{conn:?} idle since {:?} is still open at {:?} (idle timeout {:?})",
                    c.last_activity, cx.nominal, cx.config.idle_timeout
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
    fn an_idle_connection_left_open_is_caught() {
        let mut k = kit(Box::new(IdleTimeout));
        k.open(1);
        k.at(600_005);
        k.input(Input::Timeout).expect("input");
        k.end().expect("within slack");
        k.at(600_011);
        k.input(Input::Timeout).expect("input");
        let err = k.end().expect_err("overdue");
        assert_eq!(err.invariant, "idle_timeout");
    }

    #[test]
    fn an_early_idle_close_is_caught() {
        let mut k = kit(Box::new(IdleTimeout));
        k.open(1);
        k.at(1_000);
        k.input(Input::Timeout).expect("input");
        let err = k
            .out(Output::Close {
                conn: ConnId(1),
                code: 1000,
                reason: REASON.into(),
            })
            .expect_err("early");
        assert!(err.detail.contains("active"));
    }
}
