//! `session_cleanup`: nothing of a session is left after `session_end` or a
//! disconnect. No turn frame (`stream_chunk`, `response`) goes to a session
//! the connection no longer holds, and after every event the Host's session
//! count (`HostStats::sessions`) is exactly the sessions held by open
//! connections: the live ones, and those whose start waits for its verdict
//! or its context.

use tokenwire_core::{Dialect, Output};

use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionCleanup;

impl Checker for SessionCleanup {
    fn name(&self) -> &'static str {
        "session_cleanup"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(c) = cx.view.conns.get(conn) else {
            return Ok(());
        };
        // An HTTP request's one-turn session is never held (`session_http`).
        if c.dialect != Dialect::Session
            || c.inference.is_some()
            || !matches!(f.kind(), "stream_chunk" | "response")
        {
            return Ok(());
        }
        let sid = f.str("session_id").unwrap_or("");
        if c.session.as_ref().is_some_and(|s| s.live.contains_key(sid)) {
            return Ok(());
        }
        Err(format!(
            "{} for session {sid:?} on {conn:?}, which does not hold it (ended, or never ready)",
            f.kind()
        ))
    }

    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        let held = cx.view.sessions_held();
        if u64::from(end.stats.sessions) != held.len() as u64 {
            return Err(format!(
                "the Host holds {} sessions, open connections hold {}: {held:?}",
                end.stats.sessions,
                held.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{idle_end, kit};
    use serde_json::json;
    use tokenwire_core::Input;

    #[test]
    fn a_leaked_session_or_a_reply_after_the_end_is_caught() {
        let mut k = kit(Box::new(SessionCleanup));
        k.open_as(1, Dialect::Session);
        k.input(Input::Timeout).expect("input");
        let e = k
            .send(
                1,
                json!({"type": "stream_chunk", "session_id": "s", "content": "a",
                            "message_index": 1, "timestamp": 0}),
            )
            .expect_err("no such session");
        assert_eq!(e.invariant, "session_cleanup");
        k.input(Input::Closed {
            conn: tokenwire_core::ConnId(1),
        })
        .expect("closed");
        let mut leak = idle_end();
        leak.stats.sessions = 1;
        let e =
            k.m.end(&leak)
                .expect_err("a session outlives its connection");
        assert!(e.detail.contains("holds 1"), "{}", e.detail);
    }
}
