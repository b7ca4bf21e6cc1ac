//! `session_job_tokens`: a job never uses more tokens on a host than its
//! verifier granted it. Every `response` reports the tokens its turn used
//! (prompt and reply), which the Host charges to the session's job; a turn
//! that fails or is cut short by `session_end` is charged too, at least its
//! prompt and a token per `stream_chunk` it sent. Their sum per job, since the Host last started,
//! stays within the job's `token_budget`: the Host holds each turn's prompt
//! and `max_tokens`, cut to what the job has left, while it runs. (Turns
//! cut short by a disconnect are charged but not counted here, so the sum
//! is a lower bound of what the Host counts: sound either way.) A job
//! granted without a cap is never refused with `token_budget_exhausted`.

use std::collections::BTreeMap;

use tokenwire_core::{Input, JobCheckId, Output};

use crate::invariants::{Check, Checker, Cx, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionJobTokens {
    /// Jobs handed out for verification, by check.
    checks: BTreeMap<JobCheckId, String>,
    /// Each granted job's budget (`None`: no cap).
    budgets: BTreeMap<String, Option<u64>>,
    /// Tokens each job's turns reported since the Host last started.
    used: BTreeMap<String, u64>,
    /// Host crashes seen (a restarted Host starts every job from zero).
    crashes: u64,
}

impl SessionJobTokens {
    fn restart_if_crashed(&mut self, cx: &Cx<'_>) {
        if cx.view.crashes != self.crashes {
            self.crashes = cx.view.crashes;
            self.used.clear();
            self.checks.clear();
        }
    }
}

impl Checker for SessionJobTokens {
    fn name(&self) -> &'static str {
        "session_job_tokens"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        self.restart_if_crashed(cx);
        if let Input::JobVerified {
            check,
            verdict: Ok(grant),
        } = input
        {
            if let Some(job) = self.checks.remove(check) {
                self.budgets.insert(job, grant.token_budget);
            }
        }
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        self.restart_if_crashed(cx);
        if let Output::VerifyJob(check) = out {
            self.checks.insert(check.id, check.job_id.clone());
            return Ok(());
        }
        let (Output::Send { conn, .. }, Some(f)) = (out, frame) else {
            return Ok(());
        };
        let Some(s) = cx.view.session(conn) else {
            return Ok(());
        };
        let sid = f.str("session_id").unwrap_or("");
        let Some(live) = s.live.get(sid) else {
            return Ok(());
        };
        if f.kind() == "error" && f.str("code") == Some("token_budget_exhausted") {
            // A job granted without a cap has no budget to run out of.
            return match self.budgets.get(&live.job) {
                Some(None) => Err(format!(
                    "a prompt of {sid:?} on {conn:?} was refused with token_budget_exhausted, but job {:?} was granted no cap",
                    live.job
                )),
                _ => Ok(()),
            };
        }
        let tokens = match (f.kind(), &live.turn) {
            ("response", _) => f.v["tokens_used"].as_u64().unwrap_or(0),
            // Failed, or cut short by its session's end.
            ("session_ended", Some(t)) => u64::from(t.prompt_tokens) + u64::from(t.chunk_frames),
            (_, Some(t)) if s.is_turn_failure(f) => {
                u64::from(t.prompt_tokens) + u64::from(t.chunk_frames)
            }
            _ => return Ok(()),
        };
        // The Host forgets the least recently used jobs past `max_jobs`,
        // and a forgotten job starts again from zero.
        if self.used.len() >= cx.config.max_jobs {
            return Ok(());
        }
        let used = self.used.entry(live.job.clone()).or_default();
        *used += tokens;
        match self.budgets.get(&live.job) {
            Some(Some(budget)) if *used > *budget => Err(format!(
                "job {:?} has reported {used} tokens on this host (this turn of {sid:?} on {conn:?}: {tokens}), past its budget of {budget}",
                live.job
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::session::view::{Live, Turn};
    use crate::invariants::testkit::kit;
    use serde_json::json;
    use tokenwire_core::{ConnId, Dialect, Instant, JobGrant};

    /// A kit with a live session `s` of job `j`, granted `budget` tokens.
    fn live_session(budget: u64) -> crate::invariants::testkit::Kit {
        live_session_granted(Some(budget))
    }

    /// A kit with a live session `s` of job `j`, granted `token_budget`.
    fn live_session_granted(token_budget: Option<u64>) -> crate::invariants::testkit::Kit {
        let mut k = kit(Box::new(SessionJobTokens::default()));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("init");
        let grant = JobGrant { token_budget };
        k.job_verified(1, "j", grant);
        k.send(
            1,
            json!({"type": "session_ready", "session_id": "s", "message_count": 0,
                   "context_tokens": 0, "truncated_messages": 0, "timestamp": 0}),
        )
        .expect("ready");
        k.end().expect("end");
        k
    }

    fn response(tokens: u64) -> serde_json::Value {
        json!({"type": "response", "session_id": "s", "content": "x",
               "tokens_used": tokens, "message_index": 1, "finish_reason": "length",
               "timestamp": 0})
    }

    #[test]
    fn turns_past_the_jobs_budget_are_caught() {
        let mut k = live_session(100);
        k.send(1, response(60)).expect("within the budget");
        let e = k.send(1, response(41)).expect_err("101 of 100");
        assert_eq!(e.invariant, "session_job_tokens");
        assert!(e.detail.contains("101"), "{}", e.detail);

        let mut k = live_session(100);
        k.send(1, response(60)).expect("within the budget");
        k.send(1, response(40)).expect("exactly the budget");
    }

    /// Session `s` of [`live_session`] has a turn in flight: a prompt of
    /// 58 tokens, two chunks sent.
    fn turn_in_flight(k: &mut crate::invariants::testkit::Kit) {
        let c = k.m.view_mut().conns.get_mut(&ConnId(1)).expect("conn");
        let live = c
            .session
            .as_mut()
            .and_then(|s| s.live.get_mut("s"))
            .expect("live");
        live.turn = Some(Turn {
            prompt_index: 0,
            count_at_start: 0,
            stream: true,
            prompt: "x".into(),
            chunks: "ab".into(),
            chunk_frames: 2,
            started_at: Instant::ZERO,
            after_shutdown: false,
            prompt_tokens: 58,
        });
        k.input(Input::Timeout).expect("an event");
    }

    #[test]
    fn a_turn_cut_short_by_its_sessions_end_counts_too() {
        let mut k = live_session(100);
        turn_in_flight(&mut k);
        k.send(
            1,
            json!({"type": "session_ended", "session_id": "s", "timestamp": 0}),
        )
        .expect("60 of 100");
        // Another session of the same job goes on, no turn in flight.
        let c = k.m.view_mut().conns.get_mut(&ConnId(1)).expect("conn");
        let s = c.session.as_mut().expect("session");
        s.live
            .insert("s".into(), Live::started(vec![], None, "j".into()));
        let e = k.send(1, response(41)).expect_err("101 of 100");
        assert!(e.detail.contains("101"), "{}", e.detail);
    }

    #[test]
    fn a_failed_turn_counts_its_prompt_and_its_chunks() {
        let mut k = live_session(100);
        turn_in_flight(&mut k);
        k.send(
            1,
            json!({"type": "error", "session_id": "s", "code": "internal_error",
                   "message": "m", "recoverable": true, "timestamp": 0}),
        )
        .expect("60 of 100");
        let e = k.send(1, response(41)).expect_err("101 of 100");
        assert!(e.detail.contains("101"), "{}", e.detail);
    }

    /// A fabricated violation: a job without a cap told its budget ran out.
    #[test]
    fn a_job_without_a_cap_refused_for_its_budget_is_caught() {
        let refusal = json!({"type": "error", "session_id": "s", "code": "token_budget_exhausted",
                             "message": "m", "recoverable": true, "timestamp": 0});
        let mut k = live_session_granted(None);
        let e = k.send(1, refusal.clone()).expect_err("no cap");
        assert!(e.detail.contains("granted no cap"), "{}", e.detail);
        let mut k = live_session(100);
        k.send(1, refusal).expect("a capped job may run out");
    }
}
