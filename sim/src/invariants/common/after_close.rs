//! `after_close`: nothing is sent to a connection after the server closed it
//! (`Output::Close`) or after it was reported gone (`Input::Closed`, a crash),
//! a connection is closed at most once, and nothing goes to a connection that
//! never opened.

use std::collections::BTreeSet;

use tokenwire_core::{ConnId, Output};

use crate::invariants::{clip, Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct AfterClose {
    /// Connections ever opened (dead ones stay in the view's `dead` set too).
    seen: BTreeSet<ConnId>,
}

impl Checker for AfterClose {
    fn name(&self) -> &'static str {
        "after_close"
    }

    fn on_input(&mut self, _cx: &Cx<'_>, input: &tokenwire_core::Input) -> Check {
        if let tokenwire_core::Input::Open { conn, .. } = input {
            self.seen.insert(*conn);
        }
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        let (conn, what) = match out {
            Output::Send { conn, text } => (*conn, format!("frame {}", clip(text))),
            Output::Ping { conn } => (*conn, "ping".to_string()),
            Output::Close { conn, code, .. } => (*conn, format!("close {code}")),
            _ => return Ok(()),
        };
        match cx.view.conns.get(&conn) {
            Some(c) if c.closed => Err(format!(
                "{what} sent to {conn:?} after the server closed it"
            )),
            Some(_) => Ok(()),
            None if cx.view.dead.contains(&conn) => {
                Err(format!("{what} sent to {conn:?}, which is gone"))
            }
            // A connection refused at once (shutdown) is closed without ever
            // being tracked; only a close may go to it.
            None if self.seen.contains(&conn) && matches!(out, Output::Close { .. }) => Ok(()),
            None => Err(format!("{what} sent to {conn:?}, which never opened")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn a_frame_after_close_is_caught() {
        let mut k = kit(Box::new(AfterClose::default()));
        k.open(1);
        k.out(Output::Close {
            conn: ConnId(1),
            code: 1000,
            reason: tokenwire_core::api::close_reason::IDLE.into(),
        })
        .expect("first close is fine");
        let err = k
            .send(1, json!({"type": "status", "operation": "x"}))
            .expect_err("frame after close");
        assert_eq!(err.invariant, "after_close");
        k.input(tokenwire_core::Input::Closed { conn: ConnId(1) })
            .expect("closed");
        assert!(k.out(Output::Ping { conn: ConnId(1) }).is_err());
        assert!(
            k.out(Output::Ping { conn: ConnId(7) }).is_err(),
            "never opened"
        );
    }
}
