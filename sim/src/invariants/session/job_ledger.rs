//! `session_job_ledger`: the Host's account of each job, modelled exactly,
//! decides its budget refusals both ways. A job's account since the Host
//! last started holds its verifier's `token_budget`, the tokens its ended
//! turns used (prompt and generated, as each turn's `RequestFinished`
//! reports them), and a hold for each turn in flight: its prompt and its
//! `max_tokens` (as its `RequestStarted` gives them). What the job has left
//! is the budget less both.
//!
//! A turn's hold turns into its use when the turn ends: the Host settles it
//! as it sends the turn's last frame (`response`, a failure's `error`, or
//! `session_ended`), which may come before its `RequestFinished`. Between
//! the two the model knows the turn used at least its prompt and at most
//! its hold, so it judges with what the job has left at least (every such
//! turn at its hold) and at most (at its prompt):
//!
//! - a prompt refused with `token_budget_exhausted` before its tokens came
//!   back had nothing left, and one refused after needed at least what was
//!   left;
//! - a turn that starts needed less than what was left, and its hold (its
//!   prompt and its `max_tokens`, cut to fit) is no more than that.
//!
//! Jobs are keyed as the Host keys them (the `job_id` it asked to verify);
//! past `max_jobs` jobs the Host forgets the least recently used, which the
//! model does not follow, so it stops judging until the Host restarts.

use std::collections::BTreeMap;

use tokenwire_core::{ConnId, Dialect, Event, Input, JobCheckId, Output};

use super::view::{code, Msg, MsgKind, Stage};
use crate::invariants::{Check, Checker, Cx, Frame};

/// A granted job's account.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Account {
    /// Its verifier's budget (`None`: no cap).
    budget: Option<u64>,
    /// Tokens its ended turns used.
    used: u64,
}

/// A turn in flight, by its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hold {
    job: String,
    conn: ConnId,
    sid: String,
    prompt: u64,
    max_tokens: u64,
    /// Its last frame went out: the Host charged what it used, which its
    /// `RequestFinished` will tell.
    settled: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionJobLedger {
    /// Jobs handed out for verification, by check.
    checks: BTreeMap<JobCheckId, String>,
    /// Granted jobs' accounts.
    accounts: BTreeMap<String, Account>,
    /// Session turns in flight, by sequence.
    holds: BTreeMap<u64, Hold>,
    /// More jobs than the Host keeps: the model no longer judges.
    forgetting: bool,
}

/// What a job has left, at least and at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Left {
    least: u64,
    most: u64,
}

impl SessionJobLedger {
    /// What capped `job` has left (`None`: no cap, or not judged).
    fn left(&self, job: &str) -> Option<Left> {
        if self.forgetting {
            return None;
        }
        let a = self.accounts.get(job)?;
        let budget = a.budget?;
        let (mut held_most, mut held_least) = (0u64, 0u64);
        for h in self.holds.values().filter(|h| h.job == job) {
            held_most += h.prompt + h.max_tokens;
            held_least += if h.settled {
                h.prompt
            } else {
                h.prompt + h.max_tokens
            };
        }
        Some(Left {
            least: budget.saturating_sub(a.used + held_most),
            most: budget.saturating_sub(a.used + held_least),
        })
    }

    /// The job of live session `sid` on `conn`.
    fn job_of<'v>(cx: &'v Cx<'_>, conn: &ConnId, sid: &str) -> Option<&'v str> {
        let s = cx.view.session(conn)?;
        s.live.get(sid).map(|l| l.job.as_str())
    }

    fn on_started(
        &mut self,
        cx: &Cx<'_>,
        conn: &ConnId,
        request: u64,
        prompt: u64,
        max_tokens: u64,
    ) -> Check {
        // The turn's prompt is the message at the head, its tokens back.
        let Some(s) = cx.view.session(conn) else {
            return Ok(());
        };
        let Some(Msg {
            kind: MsgKind::Prompt { sid, .. },
            stage: Stage::Tokenized,
            ..
        }) = s.head()
        else {
            return Ok(());
        };
        let Some(job) = Self::job_of(cx, conn, sid) else {
            return Ok(());
        };
        if let Some(left) = self.left(job) {
            if prompt >= left.most {
                return Err(format!(
                    "a turn of {sid:?} on {conn:?} started with a prompt of {prompt} tokens, but job {job:?} had at most {} left",
                    left.most
                ));
            }
            if prompt + max_tokens > left.most {
                return Err(format!(
                    "a turn of {sid:?} on {conn:?} holds {prompt} prompt tokens and max_tokens {max_tokens}, more than the at most {} job {job:?} had left",
                    left.most
                ));
            }
        }
        self.holds.insert(
            request,
            Hold {
                job: job.to_string(),
                conn: *conn,
                sid: sid.clone(),
                prompt,
                max_tokens,
                settled: false,
            },
        );
        Ok(())
    }

    fn on_refused(&self, cx: &Cx<'_>, conn: &ConnId, f: &Frame) -> Check {
        let sid = f.str("session_id").unwrap_or("");
        let Some(job) = Self::job_of(cx, conn, sid) else {
            return Ok(());
        };
        let Some(left) = self.left(job) else {
            return Ok(());
        };
        let tokenized = cx
            .view
            .session(conn)
            .and_then(|s| s.answered_by(f))
            .and_then(|m| match m {
                Msg {
                    kind: MsgKind::Prompt { .. },
                    stage: Stage::Tokenized,
                    fitted: Some((n, _)),
                    ..
                } => Some(u64::from(*n)),
                _ => None,
            });
        match tokenized {
            Some(n) if n < left.least => Err(format!(
                "a prompt of {n} tokens for {sid:?} on {conn:?} was refused with token_budget_exhausted, but job {job:?} had at least {} left",
                left.least
            )),
            None if left.least > 0 => Err(format!(
                "a prompt for {sid:?} on {conn:?} was refused with token_budget_exhausted before its tokens, but job {job:?} had at least {} left",
                left.least
            )),
            _ => Ok(()),
        }
    }
}

impl Checker for SessionJobLedger {
    fn name(&self) -> &'static str {
        "session_job_ledger"
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        if let Input::JobVerified {
            check,
            verdict: Ok(grant),
        } = input
        {
            if let Some(job) = self.checks.remove(check) {
                // A new grant keeps what the job used.
                self.accounts
                    .entry(job)
                    .or_insert(Account {
                        budget: None,
                        used: 0,
                    })
                    .budget = grant.token_budget;
                self.forgetting |= self.accounts.len() > cx.config.max_jobs;
            }
        }
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::VerifyJob(check), _) if check.dialect == Dialect::Session => {
                self.checks.insert(check.id, check.job_id.clone());
                Ok(())
            }
            (
                Output::Event(Event::RequestStarted {
                    conn,
                    dialect: Dialect::Session,
                    request,
                    prompt_tokens,
                    max_tokens,
                }),
                _,
            ) => self.on_started(
                cx,
                conn,
                *request,
                u64::from(*prompt_tokens),
                u64::from(*max_tokens),
            ),
            (
                Output::Event(Event::RequestFinished {
                    request,
                    prompt_tokens,
                    completion_tokens,
                    ..
                }),
                _,
            ) => {
                if let Some(h) = self.holds.remove(request) {
                    if let Some(a) = self.accounts.get_mut(&h.job) {
                        a.used += u64::from(*prompt_tokens) + u64::from(*completion_tokens);
                    }
                }
                Ok(())
            }
            (Output::Send { conn, .. }, Some(f)) => {
                let Some(s) = cx.view.session(conn) else {
                    return Ok(());
                };
                if f.kind() == "error" && code(f) == "token_budget_exhausted" {
                    return self.on_refused(cx, conn, f);
                }
                if matches!(f.kind(), "response" | "session_ended") || s.is_turn_failure(f) {
                    let sid = f.str("session_id").unwrap_or("");
                    for h in self.holds.values_mut() {
                        if h.conn == *conn && h.sid == sid {
                            h.settled = true;
                        }
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn on_crash(&mut self) {
        *self = SessionJobLedger::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::{kit, Kit};
    use serde_json::json;
    use tokenwire_core::testing::ByteCodec;
    use tokenwire_core::{Encoded, JobGrant, Outcome, TextDone, TextJob, TextJobId, TextWork};

    /// A kit with a live session `s` of job `j`, granted `budget` tokens.
    fn live_session(budget: u64) -> Kit {
        let mut k = kit(Box::new(SessionJobLedger::default()));
        k.open_as(1, Dialect::Session);
        k.text(
            1,
            json!({"type": "session_init", "session_id": "s", "job_id": "j",
                   "conversation_context": []}),
        )
        .expect("init");
        k.job_verified(
            1,
            "j",
            JobGrant {
                token_budget: Some(budget),
            },
        );
        k.send(
            1,
            json!({"type": "session_ready", "session_id": "s", "message_count": 0,
                   "context_tokens": 0, "truncated_messages": 0, "timestamp": 0}),
        )
        .expect("ready");
        k.end().expect("end");
        k
    }

    /// A prompt for `s` whose `tokens` prompt tokens came back (text job
    /// `job`); the event stays open.
    fn prompt_tokenized(k: &mut Kit, job: u64, tokens: usize) {
        k.text(
            1,
            json!({"type": "prompt", "session_id": "s", "content": "hi", "message_index": 0}),
        )
        .expect("prompt");
        k.out(Output::Tokenize(TextJob {
            id: TextJobId(job),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Chat {
                messages: Vec::new(),
                max_messages: 20,
                max_tokens: 500,
                tools: Vec::new(),
                template_kwargs: Default::default(),
            },
        }))
        .expect("tokenize");
        k.end().expect("end");
        k.input(Input::Tokenized(TextDone {
            id: TextJobId(job),
            result: Ok(Encoded {
                ids: vec![7; tokens],
                dropped: 0,
            }),
        }))
        .expect("tokens back");
    }

    fn started(request: u64, prompt: u32, max_tokens: u32) -> Output {
        Output::Event(Event::RequestStarted {
            conn: ConnId(1),
            dialect: Dialect::Session,
            request,
            prompt_tokens: prompt,
            max_tokens,
        })
    }

    fn finished(request: u64, prompt: u32, completion: u32) -> Output {
        Output::Event(Event::RequestFinished {
            dialect: Dialect::Session,
            request,
            outcome: Outcome::Completed,
            prompt_tokens: prompt,
            completion_tokens: completion,
            elapsed: std::time::Duration::ZERO,
        })
    }

    fn response() -> serde_json::Value {
        json!({"type": "response", "session_id": "s", "content": "x",
               "tokens_used": 1, "message_index": 1, "finish_reason": "stop",
               "timestamp": 0})
    }

    fn refusal() -> serde_json::Value {
        json!({"type": "error", "session_id": "s", "code": "token_budget_exhausted",
               "message": "m", "recoverable": true, "timestamp": 0})
    }

    /// One turn of `prompt` tokens, `max_tokens` held, that generated
    /// `completion` and ended with its response.
    fn one_turn(k: &mut Kit, job: u64, prompt: u32, max_tokens: u32, completion: u32) {
        prompt_tokenized(k, job, prompt as usize);
        k.out(started(job, prompt, max_tokens)).expect("fits");
        k.end().expect("end");
        k.send(1, response()).expect("response");
        k.out(finished(job, prompt, completion)).expect("finished");
        k.end().expect("end");
    }

    /// A fabricated violation: a refusal while the job still had room (a
    /// ledger that kept an ended turn's whole hold, not what it used).
    #[test]
    fn a_refusal_with_room_left_is_caught() {
        let mut k = live_session(100);
        one_turn(&mut k, 1, 10, 80, 5);
        // 85 left: a prompt of 20 tokens fits.
        prompt_tokenized(&mut k, 2, 20);
        let e = k.send(1, refusal()).expect_err("20 of 85");
        assert_eq!(e.invariant, "session_job_ledger");
        assert!(e.detail.contains("at least 85"), "{}", e.detail);

        let mut k = live_session(100);
        one_turn(&mut k, 1, 10, 80, 5);
        prompt_tokenized(&mut k, 2, 85);
        k.send(1, refusal()).expect("85 of 85 leaves no room");
    }

    /// A fabricated violation: refused before tokenizing with room left.
    #[test]
    fn a_refusal_before_the_tokens_with_room_left_is_caught() {
        let mut k = live_session(100);
        one_turn(&mut k, 1, 10, 80, 5);
        k.text(
            1,
            json!({"type": "prompt", "session_id": "s", "content": "hi", "message_index": 2}),
        )
        .expect("prompt");
        let e = k.send(1, refusal()).expect_err("85 left");
        assert!(e.detail.contains("before its tokens"), "{}", e.detail);

        let mut k = live_session(100);
        one_turn(&mut k, 1, 10, 80, 90);
        k.text(
            1,
            json!({"type": "prompt", "session_id": "s", "content": "hi", "message_index": 2}),
        )
        .expect("prompt");
        k.send(1, refusal()).expect("all 100 used");
    }

    /// A fabricated violation: a turn that starts holding more than the
    /// job has left (a hold that did not count another turn in flight).
    #[test]
    fn a_turn_holding_more_than_is_left_is_caught() {
        let mut k = live_session(100);
        prompt_tokenized(&mut k, 1, 10);
        k.out(started(1, 10, 50)).expect("60 of 100");
        k.end().expect("end");
        prompt_tokenized(&mut k, 2, 10);
        let e = k.out(started(2, 10, 31)).expect_err("41 of 40");
        assert!(e.detail.contains("at most 40"), "{}", e.detail);

        let mut k = live_session(100);
        prompt_tokenized(&mut k, 1, 10);
        k.out(started(1, 10, 50)).expect("60 of 100");
        k.end().expect("end");
        prompt_tokenized(&mut k, 2, 40);
        let e = k
            .out(started(2, 40, 0))
            .expect_err("a prompt of 40 with 40 left");
        assert!(e.detail.contains("prompt of 40"), "{}", e.detail);
    }

    /// Between a turn's last frame and its `RequestFinished`, what it used
    /// is not known yet: the model judges neither way past its bounds.
    #[test]
    fn a_settled_turn_counts_between_its_prompt_and_its_hold() {
        let mut k = live_session(100);
        prompt_tokenized(&mut k, 1, 10);
        k.out(started(1, 10, 80)).expect("90 of 100");
        k.end().expect("end");
        k.send(1, response()).expect("response");
        k.end().expect("end");
        // Left: between 10 (the hold) and 90 (the prompt alone).
        prompt_tokenized(&mut k, 2, 10);
        k.send(1, refusal())
            .expect("10 of at least 10 may be refused");
        prompt_tokenized(&mut k, 3, 89);
        k.out(started(3, 89, 1))
            .expect("90 of at most 90 may start");
        k.end().expect("end");
        prompt_tokenized(&mut k, 4, 1);
        let e = k.out(started(4, 1, 0)).expect_err("nothing left at most");
        assert!(e.detail.contains("at most 0"), "{}", e.detail);
    }
}
