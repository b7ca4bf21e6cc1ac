//! `keepalive`: every open WebSocket connection is pinged at least every
//! keepalive interval (plus one step), a connection that answers no ping for
//! the keepalive timeout is closed ("keepalive timeout") no later than the
//! timeout plus one step, and no connection is closed for it earlier. A
//! connection the Host stopped reading cannot be seen answering: while it is
//! not read its deadline moves on, to one timeout after it was last not read.

use tokenwire_core::{Output, Transport};

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// The close reason the Host gives.
pub const REASON: &str = tokenwire_core::api::close_reason::KEEPALIVE;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Keepalive;

impl Checker for Keepalive {
    fn name(&self) -> &'static str {
        "keepalive"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let Some((conn, c)) = cx.closed_with(out, REASON) else {
            return Ok(());
        };
        match c.unanswered_ping {
            None => Err(format!(
                "{conn:?} closed for keepalive but every ping was answered"
            )),
            Some(p) if cx.now < p + cx.config.keepalive_timeout => Err(format!(
                "{conn:?} closed for keepalive at {:?}, ping unanswered only since {p:?}",
                cx.now
            )),
            Some(_) => Ok(()),
        }
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        for (conn, c) in &cx.view.conns {
            if c.closed || c.transport != Transport::WebSocket {
                continue;
            }
            if cx.nominal > c.last_ping + cx.config.keepalive_interval + cx.slack {
                return Err(format!(
                    "{conn:?} not pinged since {:?} (now {:?}, interval {:?})",
                    c.last_ping, cx.nominal, cx.config.keepalive_interval
                ));
            }
            if let Some(p) = c.unanswered_ping {
                let unread = match c.reading_paused_since {
                    Some(_) => Some(cx.now),
                    None => c.reading_resumed_at,
                };
                let from = unread.map_or(p, |u| u.max(p));
                if cx.nominal > from + cx.config.keepalive_timeout + cx.slack {
                    return Err(format!(
                        "{conn:?} has not answered the ping of {p:?} and is still open at {:?}",
                        cx.nominal
                    ));
                }
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
    fn a_connection_not_read_may_stay_past_its_deadline_until_read_again() {
        let mut k = kit(Box::new(Keepalive));
        k.open(1);
        k.at(30_000);
        k.input(Input::Timeout).expect("input");
        k.out(Output::Ping { conn: ConnId(1) }).expect("ping");
        k.out(Output::PauseReading { conn: ConnId(1) })
            .expect("not read");
        k.end().expect("end");
        k.at(100_000);
        k.input(Input::Timeout).expect("input");
        k.out(Output::Ping { conn: ConnId(1) }).expect("ping");
        k.out(Output::ResumeReading { conn: ConnId(1) })
            .expect("read again");
        k.end().expect("not read until now");
        k.at(130_000);
        k.input(Input::Timeout).expect("input");
        k.out(Output::Ping { conn: ConnId(1) }).expect("ping");
        k.end().expect("end");
        k.at(160_011);
        k.input(Input::Timeout).expect("input");
        k.out(Output::Ping { conn: ConnId(1) }).expect("ping");
        let err = k.end().expect_err("a timeout after it was read again");
        assert!(err.detail.contains("not answered"));
    }

    #[test]
    fn missing_pings_and_silent_peers_left_open_are_caught() {
        let mut k = kit(Box::new(Keepalive));
        k.open(1);
        k.at(30_020);
        k.input(Input::Timeout).expect("input");
        let err = k.end().expect_err("no ping for 30 s");
        assert_eq!(err.invariant, "keepalive");

        let mut k = kit(Box::new(Keepalive));
        k.open(1);
        for s in 1..=3u64 {
            // The third ping comes late: 60 s plus the slack after the first.
            k.at(s * 30_000 + if s == 3 { 20 } else { 0 });
            k.input(Input::Timeout).expect("input");
            k.out(Output::Ping { conn: ConnId(1) }).expect("ping");
            let r = k.end();
            if s < 3 {
                r.expect("still within the timeout");
            } else {
                let err = r.expect_err("silent for 60 s");
                assert!(err.detail.contains("not answered"));
            }
        }
    }
}
