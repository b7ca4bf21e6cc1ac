//! `responses_limit`: never more than `max_websocket_connections` accepted
//! `responses` WebSocket connections are open. A connection that opens when
//! that many are open gets `websocket_connection_limit_reached` and is closed
//! with 1013 in the same event; one that opens below the limit is accepted.

use tokenwire_core::{ConnId, Dialect, Input, Output, Transport};

use super::view::code;
use crate::invariants::view::View;
use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// The close reason of a refused connection.
pub const REASON: &str = "connection limit reached";

/// See the module docs.
#[derive(Debug, Default)]
pub struct ResponsesLimit {
    /// The connection opening in this event, and whether it must be refused.
    opening: Option<(ConnId, bool)>,
    /// It got its refusal.
    refused: bool,
}

/// Accepted `responses` WebSocket connections still open.
pub fn accepted_open(view: &View) -> u64 {
    view.conns
        .values()
        .filter(|c| !c.closed && c.responses.as_ref().is_some_and(|r| r.accepted))
        .count() as u64
}

impl Checker for ResponsesLimit {
    fn name(&self) -> &'static str {
        "responses_limit"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        self.opening = None;
        self.refused = false;
        if let Input::Open {
            conn,
            dialect: Dialect::Responses,
            transport: Transport::WebSocket,
            ..
        } = input
        {
            if cx.view.shutdown_at.is_none() && !cx.view.conns.contains_key(conn) {
                let full = accepted_open(cx.view) >= u64::from(cx.config.max_websocket_connections);
                self.opening = Some((*conn, full));
            }
        }
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::Send { conn, .. }, Some(f))
                if f.kind() == "error" && code(f) == "websocket_connection_limit_reached" =>
            {
                if self.opening != Some((*conn, true)) {
                    return Err(format!(
                        "{conn:?} refused for the connection limit with {} of {} open",
                        accepted_open(cx.view),
                        cx.config.max_websocket_connections
                    ));
                }
                self.refused = true;
                Ok(())
            }
            (Output::Close { conn, code, reason }, _) if *code == 1013 || reason == REASON => {
                if self.opening != Some((*conn, true)) || !self.refused || *code != 1013 {
                    return Err(format!(
                        "{conn:?} closed with {code} {reason:?} without a connection-limit refusal"
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        if let Some((conn, true)) = self.opening {
            let closed = cx.view.conns.get(&conn).is_none_or(|c| c.closed);
            if !closed {
                return Err(format!(
                    "{conn:?} opened with {} accepted connections open (limit {}) and was not refused",
                    accepted_open(cx.view).saturating_sub(1),
                    cx.config.max_websocket_connections
                ));
            }
        }
        let open = accepted_open(cx.view);
        if open > u64::from(cx.config.max_websocket_connections) {
            return Err(format!(
                "{open} responses WebSocket connections open, the limit is {}",
                cx.config.max_websocket_connections
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

    #[test]
    fn a_connection_over_the_limit_or_refused_below_it_is_caught() {
        let mut k = kit(Box::new(ResponsesLimit::default()));
        // The default limit is 100: open 100, the 101st must be refused.
        for c in 1..=100 {
            k.open_as(c, Dialect::Responses);
        }
        k.input(Input::Open {
            conn: ConnId(101),
            dialect: Dialect::Responses,
            transport: Transport::WebSocket,
            query: String::new(),
            authorization: None,
            peer: String::new(),
        })
        .expect("open");
        let e = k.end().expect_err("accepted over the limit");
        assert_eq!(e.invariant, "responses_limit");

        let mut k = kit(Box::new(ResponsesLimit::default()));
        k.input(Input::Open {
            conn: ConnId(1),
            dialect: Dialect::Responses,
            transport: Transport::WebSocket,
            query: String::new(),
            authorization: None,
            peer: String::new(),
        })
        .expect("open");
        let e = k
            .send(
                1,
                json!({"type": "error", "status": 503,
                            "error": {"code": "websocket_connection_limit_reached"}}),
            )
            .expect_err("room left");
        assert_eq!(e.invariant, "responses_limit");
    }
}
