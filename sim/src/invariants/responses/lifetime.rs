//! `responses_lifetime`: an accepted `responses` WebSocket connection is
//! told `connection_expiring` once, at `responses_expiring_after` after it
//! opened (never earlier, no later than one step after), and is closed with
//! 1000 "connection lifetime reached" at `responses_lifetime` after it
//! opened (the same way). No other connection gets either.

use tokenwire_core::Output;

use super::view::code;
use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// The close reason at the end of a connection's lifetime.
pub const REASON: &str = "connection lifetime reached";

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesLifetime;

impl Checker for ResponsesLifetime {
    fn name(&self) -> &'static str {
        "responses_lifetime"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (conn, what, after) = match (out, frame) {
            (Output::Send { conn, .. }, Some(f))
                if f.kind() == "error" && code(f) == "connection_expiring" =>
            {
                (
                    *conn,
                    "connection_expiring",
                    cx.config.responses_expiring_after,
                )
            }
            (Output::Close { conn, code, reason }, _) if reason == REASON => {
                if *code != 1000 {
                    return Err(format!("{conn:?} closed at its lifetime with {code}"));
                }
                (*conn, "lifetime close", cx.config.responses_lifetime)
            }
            _ => return Ok(()),
        };
        let Some(c) = cx.view.conns.get(&conn) else {
            return Ok(());
        };
        let Some(r) = c.responses.as_ref().filter(|r| r.accepted) else {
            return Err(format!(
                "{what} for {conn:?}, not an accepted responses socket"
            ));
        };
        if what == "connection_expiring" && r.warned_at.is_some() {
            return Err(format!("connection_expiring a second time for {conn:?}"));
        }
        if cx.now < c.opened_at + after {
            return Err(format!(
                "{what} for {conn:?} at {:?}, it opened at {:?} ({after:?} due)",
                cx.now, c.opened_at
            ));
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        for (conn, c) in &cx.view.conns {
            let Some(r) = c.responses.as_ref().filter(|r| r.accepted) else {
                continue;
            };
            if c.closed {
                continue;
            }
            let warn = c.opened_at + cx.config.responses_expiring_after + cx.slack;
            if r.warned_at.is_none() && cx.nominal > warn {
                return Err(format!(
                    "{conn:?} opened at {:?} not told connection_expiring by {:?}",
                    c.opened_at, cx.nominal
                ));
            }
            let end = c.opened_at + cx.config.responses_lifetime + cx.slack;
            if cx.nominal > end {
                return Err(format!(
                    "{conn:?} opened at {:?} still open at {:?}, past its lifetime of {:?}",
                    c.opened_at, cx.nominal, cx.config.responses_lifetime
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
    use serde_json::json;
    use tokenwire_core::{ConnId, Dialect, Input};

    fn expiring() -> serde_json::Value {
        json!({"type": "error", "status": 400, "error": {"code": "connection_expiring"}})
    }

    #[test]
    fn an_early_warning_or_an_overdue_close_is_caught() {
        let mut k = kit(Box::new(ResponsesLifetime));
        k.open_as(1, Dialect::Responses);
        k.at(60_000);
        k.input(Input::Timeout).expect("input");
        let e = k.send(1, expiring()).expect_err("55 minutes early");
        assert_eq!(e.invariant, "responses_lifetime");

        let mut k = kit(Box::new(ResponsesLifetime));
        k.open_as(1, Dialect::Responses);
        k.at(55 * 60_000);
        k.input(Input::Timeout).expect("input");
        k.send(1, expiring()).expect("on time");
        k.end().expect("end");
        k.at(60 * 60_000 + 11);
        k.input(Input::Timeout).expect("input");
        let e = k.end().expect_err("open past its lifetime");
        assert!(e.detail.contains("lifetime"), "{}", e.detail);
        let e = k
            .out(Output::Close {
                conn: ConnId(1),
                code: 1001,
                reason: REASON.into(),
            })
            .expect_err("wrong code");
        assert_eq!(e.invariant, "responses_lifetime");
    }
}
