//! `closes`: the server closes a connection only with a code and reason the
//! contract names, and only when that reason holds: 1009 for a frame over the
//! limit (this event's frame), 1008 after refusing a first frame that was not
//! a config (in this event), 1008 for frames piled up past every bound, 1001
//! during a shutdown, 1013 for a `responses` connection refused as it opens
//! (over the connection limit), 1000 at a `responses` connection's lifetime,
//! 1008 or 4001 to 4003 for a `cai` connection refused as it opens (which
//! code, [`crate::invariants::cai::auth`] judges). (Idle, keepalive, slow-client, connection-limit and lifetime closes have
//! checkers of their own.) And the other way: a refused first frame of a
//! `generate` connection closes it in the same event.

use std::collections::BTreeSet;

use tokenwire_core::api::close_reason;
use tokenwire_core::{ConnId, Dialect, Input, Output};

use crate::invariants::{Check, Checker, Cur, Cx, EndState, Frame};

/// Frames a connection may have waiting before the Host may give up on it.
const MAX_HELD_FRAMES: usize = 4096;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Closes {
    /// Connections refused for good in this event (a non-recoverable error).
    refused: BTreeSet<ConnId>,
}

impl Checker for Closes {
    fn name(&self) -> &'static str {
        "closes"
    }

    fn on_input(&mut self, _cx: &Cx<'_>, _input: &Input) -> Check {
        self.refused.clear();
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        if let (Output::Send { conn, .. }, Some(f)) = (out, frame) {
            let generate = cx.view.dialect_of(*conn) == Some(Dialect::Generate);
            if generate && f.kind() == "error" && f.v["recoverable"] == false {
                self.refused.insert(*conn);
            }
            return Ok(());
        }
        let Output::Close { conn, code, reason } = out else {
            return Ok(());
        };
        let c = cx.view.conns.get(conn);
        let refused = self.refused.remove(conn);
        let ok = match (*code, reason.as_str()) {
            (1009, close_reason::FRAME_TOO_LARGE) => {
                cx.input == Cur::TooLarge(*conn)
                    || (cx.input == Cur::Text(*conn)
                        && c.and_then(|c| c.pending.back())
                            .is_some_and(|h| h.frame.len > cx.config.max_frame_bytes))
            }
            (1008, close_reason::FIRST_FRAME) => refused,
            (1008, close_reason::HELD_TOO_MANY) => {
                let bytes: usize = c.map_or(0, |c| c.pending.iter().map(|h| h.frame.len).sum());
                c.is_some_and(|c| c.pending.len() > MAX_HELD_FRAMES)
                    || bytes > cx.config.max_frame_bytes.saturating_mul(4)
            }
            (1001, close_reason::SHUTTING_DOWN) => cx.view.shutdown_at.is_some(),
            (1013, crate::invariants::responses::limit::REASON) => {
                cx.input == Cur::Open(*conn) && c.is_some_and(|c| c.dialect == Dialect::Responses)
            }
            (1000, crate::invariants::responses::lifetime::REASON) => {
                c.is_some_and(|c| c.dialect == Dialect::Responses)
            }
            (1008, close_reason::SLOW_CLIENT)
            | (1000, close_reason::IDLE)
            | (1000, close_reason::KEEPALIVE) => true,
            // A `cai` opening refused: which code is `cai_auth`'s business.
            (1008 | 4001..=4003, _) => {
                cx.input == Cur::Open(*conn) && c.is_some_and(|c| c.dialect == Dialect::Cai)
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{conn:?} closed with {code} {reason:?}, which nothing here calls for"
            ))
        }
    }

    fn on_end(&mut self, _cx: &Cx<'_>, _end: &EndState) -> Check {
        match self.refused.first() {
            Some(conn) => Err(format!(
                "{conn:?} had its first frame refused for good but was not closed"
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

    fn close(code: u16, reason: &str) -> Output {
        Output::Close {
            conn: ConnId(1),
            code,
            reason: reason.into(),
        }
    }

    #[test]
    fn closes_without_their_cause_are_caught() {
        let mut k = kit(Box::new(Closes::default()));
        k.open(1);
        k.text(1, json!({"type": "config", "prompt": "hi"}))
            .expect("frame");
        for (code, reason) in [
            (1008, close_reason::HELD_TOO_MANY),
            (1008, close_reason::FIRST_FRAME),
            (1009, close_reason::FRAME_TOO_LARGE),
            (1001, close_reason::SHUTTING_DOWN),
            (1011, "oops"),
        ] {
            let err = k.out(close(code, reason)).expect_err("no cause");
            assert_eq!(err.invariant, "closes", "{reason}");
        }
        // With its cause, a close is fine.
        k.send(
            1,
            json!({"type": "error", "error": "invalid_request", "message": "m",
                         "recoverable": false, "recovery_action": "none"}),
        )
        .expect("refusal");
        k.out(close(1008, close_reason::FIRST_FRAME))
            .expect("refused first frame");
        k.end().expect("closed in the event");
    }

    #[test]
    fn a_refused_first_frame_left_open_is_caught() {
        let mut k = kit(Box::new(Closes::default()));
        k.open(1);
        k.text(1, json!({"type": "bogus"})).expect("frame");
        k.send(
            1,
            json!({"type": "error", "error": "invalid_request", "message": "m",
                         "recoverable": false, "recovery_action": "none"}),
        )
        .expect("refusal");
        let err = k.end().expect_err("left open");
        assert!(err.detail.contains("not closed"), "{}", err.detail);
    }
}
