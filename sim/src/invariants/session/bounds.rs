//! `session_bounds`: a connection's sessions are refused exactly at the
//! bound (`max_sessions_per_conn`): a `session_ready` for a new session
//! goes only to a connection holding fewer, and the refusal for the bound
//! only to one holding that many.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cx, Frame};

/// What the Host's refusal for the bound says.
const BOUND_REFUSAL: &str = "sessions, the most one connection may";

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionBounds;

impl Checker for SessionBounds {
    fn name(&self) -> &'static str {
        "session_bounds"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(s) = cx.view.session(conn) else {
            return Ok(());
        };
        let most = cx.config.max_sessions_per_conn;
        let held = s.live.len();
        let sid = f.str("session_id").unwrap_or("");
        match f.kind() {
            "session_ready" if !s.live.contains_key(sid) && held >= most => Err(format!(
                "session {sid:?} started on {conn:?}, which already holds {held} sessions (the bound is {most})"
            )),
            "error"
                if f.str("message").is_some_and(|m| m.contains(BOUND_REFUSAL)) && held < most =>
            {
                Err(format!(
                    "session {sid:?} refused on {conn:?} for the bound while it holds {held} of {most}"
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit_with;
    use serde_json::json;
    use tokenwire_core::{Dialect, HostConfig};

    #[test]
    fn a_session_past_the_bound_and_a_refusal_under_it_are_caught() {
        let cfg = HostConfig {
            max_sessions_per_conn: 1,
            ..HostConfig::default()
        };
        let mut k = kit_with(Box::new(SessionBounds), cfg);
        k.open_as(1, Dialect::Session);
        let e = k
            .send(
                1,
                json!({"type": "error", "session_id": "a", "code": "rate_limited",
                       "message": "this connection holds 1 sessions, the most one connection may; end one first",
                       "timestamp": 1}),
            )
            .expect_err("it holds none");
        assert_eq!(e.invariant, "session_bounds");
        k.send(
            1,
            json!({"type": "session_ready", "session_id": "a", "message_count": 0,
                   "context_tokens": 0, "truncated_messages": 0, "timestamp": 1}),
        )
        .expect("the first is within the bound");
    }
}
