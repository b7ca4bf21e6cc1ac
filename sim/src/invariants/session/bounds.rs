//! `session_bounds`: sessions are refused exactly at the bounds. Per
//! connection (`max_sessions_per_conn`): a `session_ready` for a new
//! session goes only to a connection holding fewer, and the refusal for the
//! bound only to one holding that many. Per host (`max_sessions`): a new
//! session starts only while fewer are live on every connection together
//! (the wire's live sessions are all held), and the host's refusal comes
//! only when that many may be held: the live ones and every start not yet
//! answered (the Host claims a session before its job is verified and its
//! context tokenized), the refused one aside.

use tokenwire_core::Output;

use super::view::MsgKind;
use crate::invariants::{Check, Checker, Cx, Frame};

/// What the Host's refusal for the connection's bound says.
const BOUND_REFUSAL: &str = "sessions, the most one connection may";
/// What the Host's refusal for its own bound says.
const HOST_REFUSAL: &str = "this host holds as many sessions as it may";

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
        let host_most = cx.config.max_sessions;
        let sessions = || cx.view.conns.values().filter_map(|c| c.session.as_ref());
        let host_held: usize = sessions().map(|s| s.live.len()).sum();
        let starting: usize = sessions()
            .map(|s| {
                s.queue
                    .iter()
                    .filter(|m| matches!(m.kind, MsgKind::Start { .. }))
                    .count()
            })
            .sum();
        // The refused start is among those not yet answered.
        let may_hold = host_held + starting.saturating_sub(1);
        match f.kind() {
            "session_ready" if !s.live.contains_key(sid) && host_held >= host_most => Err(format!(
                "session {sid:?} started on {conn:?} while the host holds {host_held} (the bound is {host_most})"
            )),
            "error"
                if f.str("message").is_some_and(|m| m.contains(HOST_REFUSAL))
                    && may_hold < host_most =>
            {
                Err(format!(
                    "session {sid:?} refused on {conn:?} for the host's bound while it may hold {may_hold} of {host_most} ({host_held} live, {starting} starting)"
                ))
            }
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

    #[test]
    fn the_hosts_bound_is_judged_over_every_connection() {
        let cfg = HostConfig {
            max_sessions: 1,
            ..HostConfig::default()
        };
        let ready = |sid: &str| {
            json!({"type": "session_ready", "session_id": sid, "message_count": 0,
                   "context_tokens": 0, "truncated_messages": 0, "timestamp": 1})
        };
        let full = |sid: &str| {
            json!({"type": "error", "session_id": sid, "code": "rate_limited",
                   "message": "this host holds as many sessions as it may; retry later or on another host",
                   "timestamp": 1})
        };
        let mut k = kit_with(Box::new(SessionBounds), cfg.clone());
        k.open_as(1, Dialect::Session);
        let e = k.send(1, full("a")).expect_err("nothing is live");
        assert!(e.detail.contains("may hold 0 of 1"), "{}", e.detail);

        let mut k = kit_with(Box::new(SessionBounds), cfg);
        k.open_as(1, Dialect::Session);
        k.open_as(2, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "a", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("init");
        k.send(1, ready("a")).expect("the first");
        k.end().expect("end");
        k.text(
            2,
            json!({"type": "session_init", "session_id": "b", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("init");
        let e = k.send(2, ready("b")).expect_err("a second on the host");
        assert!(e.detail.contains("the bound is 1"), "{}", e.detail);
    }
}
