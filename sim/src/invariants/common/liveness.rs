//! `liveness`: at the end of the liveness phase (faults healed, no new work)
//! every request of every dialect has reached its terminal event (a
//! `generate` request its `completion` or failure, a `session` turn its
//! `response` or error, a `responses` response its terminal event) and
//! every message sent got its answer, unless its connection died or a
//! `regenerate` replaced it. The runner bounds the phase in simulated
//! time and steps and reports this invariant when the bound is passed.

use crate::invariants::{Check, Checker, Cx, View};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Liveness;

/// Requests still in flight on live connections, described for a failure.
pub fn describe_outstanding(view: &View) -> Vec<String> {
    view.outstanding()
        .into_iter()
        .map(|(rid, conn)| match view.requests.get(&rid) {
            Some(r) => format!(
                "{rid} on {conn:?} (started {:?}, {} token frames, max_tokens {}, paused: {})",
                r.started_at,
                r.token_frames,
                r.config.max_tokens,
                r.paused_at.is_some()
            ),
            None => format!("{rid} on {conn:?}"),
        })
        .collect()
}

impl Checker for Liveness {
    fn name(&self) -> &'static str {
        "liveness"
    }

    fn on_finish(&mut self, cx: &Cx<'_>) -> Check {
        let left = describe_outstanding(cx.view);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} request(s) never reached a terminal event: {}",
                left.len(),
                left.join("; ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::kit;
    use serde_json::json;

    #[test]
    fn a_request_without_terminal_event_is_caught_at_the_end() {
        let mut k = kit(Box::new(Liveness));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        let now = k.now();
        let err = k.m.finish(now).expect_err("never ended");
        assert_eq!(err.invariant, "liveness");
        assert!(err.detail.contains("gen_a"));
        // A regenerate replaces it: nothing is due for the old one.
        let mut k = kit(Box::new(Liveness));
        k.start(1, "gen_a", json!({"type": "config", "prompt": "hi"}));
        k.text(1, json!({"type": "control", "action": "regenerate"}))
            .expect("regen");
        k.end().expect("end");
        k.m.finish(now).expect("superseded, connection idle");
    }
}
