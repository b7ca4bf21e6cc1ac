//! `metrics`: the metrics events agree with the frames, for every dialect.
//! Within every event: each error frame is counted by an `Error` event of its
//! dialect with its code and each counted error was sent (a `responses`
//! failure counts as `server_error`); each terminal frame is one
//! `RequestFinished` of its dialect with the outcome its end means and its
//! token counts (a `generate` `completion`'s usage, a `session` `response`'s
//! `tokens_used`, a `responses` Response's usage; a warm-up runs no
//! generation), each failure one `Failed`; a `cai` `ERROR` is counted like
//! any error (and each `batch` ERROR element, and each `chat` error frame
//! or `anthropic` error frame by its `error.code`), but `cai`, `batch`,
//! `chat` and `anthropic` requests are not matched to finished-request
//! events (a `chat` answer gathers several generations: its choices, its
//! prompts, its embedding inputs)
//! (a generation is counted when it ends, and its `STREAM_COMPLETE` may
//! wait for the client's window long after); cancellations are counted; each
//! feedback ack one `FeedbackReceived`; each sampled `generate` token's frame
//! one `FirstToken` or `InterToken` (at least one, when the step also
//! computed another dialect's sequences, whose tokens are timed without a
//! frame of their own); `TokensGenerated` only for a finished step and never
//! more than it sampled. After every event, connections opened minus closed
//! is the Host's connection count, and the last gauges are the Host's own;
//! while the engine computes a sequence for a live, unpaused request, the
//! Host counts one running.

use std::collections::BTreeMap;

use tokenwire_core::{Dialect, Event, Input, Outcome, Output};

use crate::invariants::responses::view as responses;
use crate::invariants::session::view as session;
use crate::invariants::{Check, Checker, Cx, EndState, Frame};

/// (dialect, outcome, prompt tokens, completion tokens); `u64::MAX` where
/// the frame does not say (a `session` reply gives only the sum, kept as
/// the completion count).
type Finished = (&'static str, &'static str, u64, u64);

/// What one event produced, as frames and as metrics events.
#[derive(Debug, Default)]
struct Tally {
    /// (dialect, code).
    error_frames: BTreeMap<(&'static str, String), i64>,
    error_events: BTreeMap<(&'static str, String), i64>,
    finished_frames: BTreeMap<Finished, i64>,
    finished_events: BTreeMap<Finished, i64>,
    cancelled_frames: i64,
    cancelled_events: i64,
    feedback_acks: i64,
    feedback_events: i64,
    sampled_token_frames: i64,
    timing_events: i64,
    tokens_generated: u64,
    step_results: Option<u64>,
    /// The finished step computed sequences of other dialects (or of no
    /// known connection): their tokens are timed with no `token` frame.
    step_mixed: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Metrics {
    t: Tally,
    /// Connections opened minus closed, by the events, since the Host started.
    balance: i64,
    /// The last gauges event: (queued, running, kv used, kv kept, kv total).
    gauges: Option<(u32, u32, u32, u32, u32, u32)>,
    /// Requests started and not yet finished, with their dialects.
    started: BTreeMap<u64, Dialect>,
}

fn outcome_name(o: Outcome) -> &'static str {
    o.name()
}

/// A `session` frame: its errors, its replies, its failed turns.
fn session_frame(t: &mut Tally, turn_failure: bool, f: &Frame) {
    match f.kind() {
        "error" => {
            *t.error_frames
                .entry(("session", session::code(f).to_string()))
                .or_default() += 1;
            if turn_failure {
                *t.finished_frames
                    .entry(("session", "failed", u64::MAX, u64::MAX))
                    .or_default() += 1;
            }
        }
        "response" => {
            let outcome = match f.str("finish_reason") {
                // A content filter's stop completes a request too.
                Some("length" | "stop" | "content_filter") => "completed",
                Some("timeout") => "timeout",
                _ => "cancelled",
            };
            let used = f.v["tokens_used"].as_u64().unwrap_or(u64::MAX);
            *t.finished_frames
                .entry(("session", outcome, u64::MAX, used))
                .or_default() += 1;
        }
        _ => {}
    }
}

/// A `responses` event: its errors and its terminal events.
fn responses_frame(t: &mut Tally, f: &Frame) {
    let r = &f.v["response"];
    let usage = (
        r["usage"]["input_tokens"].as_u64().unwrap_or(u64::MAX),
        r["usage"]["output_tokens"].as_u64().unwrap_or(u64::MAX),
    );
    let key = match (f.kind(), r["status"].as_str()) {
        ("error", _) => {
            let code = responses::code(f).to_string();
            *t.error_frames.entry(("responses", code)).or_default() += 1;
            return;
        }
        // A warm-up runs no generation.
        ("response.completed", _) if r["output"] == serde_json::json!([]) => return,
        ("response.completed", _) | ("response.incomplete", Some("incomplete")) => {
            ("responses", "completed", usage.0, usage.1)
        }
        ("response.incomplete", _) => {
            t.cancelled_frames += 1;
            return;
        }
        ("response.failed", _) => {
            *t.error_frames
                .entry(("responses", "server_error".into()))
                .or_default() += 1;
            ("responses", "failed", u64::MAX, u64::MAX)
        }
        _ => return,
    };
    *t.finished_frames.entry(key).or_default() += 1;
}

impl Checker for Metrics {
    fn name(&self) -> &'static str {
        "metrics"
    }

    fn on_crash(&mut self) {
        *self = Metrics::default();
    }

    fn on_input(&mut self, cx: &Cx<'_>, input: &Input) -> Check {
        self.t = Tally::default();
        if let Input::StepDone(d) = input {
            self.t.step_results = Some(d.results.len() as u64);
            self.t.step_mixed = cx.view.step.as_ref().is_some_and(|s| {
                s.seqs.iter().any(|q| {
                    cx.view.owner(*q).and_then(|c| cx.view.dialect_of(c)) != Some(Dialect::Generate)
                })
            });
        }
        Ok(())
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match out {
            Output::Event(Event::RequestStarted {
                conn,
                dialect,
                request,
                ..
            }) => {
                if cx.view.dialect_of(*conn) != Some(*dialect) {
                    return Err(format!(
                        "request {request} started for {dialect:?} on {conn:?}, which is not \
                         an open {dialect:?} connection"
                    ));
                }
                if self.started.insert(*request, *dialect).is_some() {
                    return Err(format!("request {request} started twice"));
                }
            }
            Output::Event(Event::RequestFinished {
                dialect, request, ..
            }) => match self.started.remove(request) {
                Some(d) if d == *dialect => {}
                Some(d) => {
                    return Err(format!(
                        "request {request} started as {d:?} and finished as {dialect:?}"
                    ))
                }
                None => {
                    return Err(format!(
                        "request {request} finished without a RequestStarted (or twice)"
                    ))
                }
            },
            _ => {}
        }
        let t = &mut self.t;
        if let (Output::Send { conn, .. }, Some(f)) = (out, frame) {
            let Some(c) = cx.view.conns.get(conn) else {
                return Ok(());
            };
            if let Some(s) = &c.session {
                session_frame(t, s.is_turn_failure(f), f);
                return Ok(());
            }
            if let Some(i) = &c.inference {
                session_frame(t, i.is_turn_failure(f), f);
                return Ok(());
            }
            if c.responses.is_some() {
                responses_frame(t, f);
                return Ok(());
            }
            if c.batch.is_some() {
                // One error counted per ERROR element.
                let text = match out {
                    Output::Send { text, .. } => text.as_str(),
                    _ => "",
                };
                if let Ok(events) = tokenwire_core::dialect::batch::codec::decode_events(text) {
                    let errors =
                        events.iter().filter(|e| e.kind.as_str() == "ERROR").count() as i64;
                    if errors > 0 {
                        *t.error_frames
                            .entry(("batch", "ERROR".to_string()))
                            .or_default() += errors;
                    }
                }
                return Ok(());
            }
            if c.chat.is_some() {
                if f.v["kind"] == "error" {
                    let code = f.v["data"]["error"]["code"]
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    *t.error_frames.entry((c.dialect.name(), code)).or_default() += 1;
                }
                return Ok(());
            }
            if c.cai.is_some() {
                if f.kind() == "ERROR" {
                    let code = f.v["error"]["code"].as_str().unwrap_or("").to_string();
                    *t.error_frames.entry(("cai", code)).or_default() += 1;
                }
                return Ok(());
            }
        }
        match (out, frame) {
            (Output::Send { .. }, Some(f)) => match f.kind() {
                "error" => {
                    *t.error_frames
                        .entry(("generate", f.str("error").unwrap_or("").to_string()))
                        .or_default() += 1;
                    if f.is_failure() {
                        *t.finished_frames
                            .entry(("generate", "failed", u64::MAX, u64::MAX))
                            .or_default() += 1;
                    }
                }
                "completion" => {
                    let usage = &f.v["usage"];
                    let (p, c) = (
                        usage["prompt_tokens"].as_u64().unwrap_or(u64::MAX),
                        usage["completion_tokens"].as_u64().unwrap_or(u64::MAX),
                    );
                    match f.str("finish_reason") {
                        Some("length" | "stop" | "content_filter") => {
                            *t.finished_frames
                                .entry(("generate", "completed", p, c))
                                .or_default() += 1
                        }
                        Some("timeout") => {
                            *t.finished_frames
                                .entry(("generate", "timeout", p, c))
                                .or_default() += 1
                        }
                        _ => t.cancelled_frames += 1,
                    }
                }
                "status" if f.str("operation") == Some("feedback_received") => t.feedback_acks += 1,
                "token" => {
                    let ended_by_client_or_deadline =
                        matches!(f.str("finish_reason"), Some("cancelled" | "timeout"));
                    if !ended_by_client_or_deadline {
                        t.sampled_token_frames += 1;
                    }
                }
                _ => {}
            },
            (Output::Event(e), _) => match e {
                // Counted by the shell; what it refuses or stops is the
                // dialects' frames, checked there.
                Event::ContentFiltered { .. } => {}
                Event::Error { code, dialect } => {
                    *t.error_events
                        .entry((dialect.name(), code.to_string()))
                        .or_default() += 1
                }
                Event::RequestFinished {
                    dialect,
                    outcome,
                    prompt_tokens,
                    completion_tokens,
                    request: _,
                    elapsed: _,
                } => {
                    let d = dialect.name();
                    if matches!(
                        *dialect,
                        Dialect::Cai | Dialect::Batch | Dialect::Chat | Dialect::Anthropic
                    ) {
                        return Ok(());
                    }
                    let (p, c) = (u64::from(*prompt_tokens), u64::from(*completion_tokens));
                    let key = match outcome {
                        Outcome::Cancelled => {
                            t.cancelled_events += 1;
                            None
                        }
                        Outcome::Failed => Some((d, "failed", u64::MAX, u64::MAX)),
                        o if *dialect == Dialect::Session => {
                            Some((d, outcome_name(*o), u64::MAX, p + c))
                        }
                        o => Some((d, outcome_name(*o), p, c)),
                    };
                    if let Some(key) = key {
                        *t.finished_events.entry(key).or_default() += 1;
                    }
                }
                Event::FeedbackReceived { .. } => t.feedback_events += 1,
                // Matched with its RequestFinished above.
                Event::RequestStarted { .. } => {}
                Event::ConnectionNamed { name, dialect, .. } => {
                    let uuid = name
                        .strip_prefix("ws-")
                        .and_then(|u| uuid::Uuid::parse_str(u).ok());
                    if *dialect != Dialect::Responses
                        || uuid.map(|u| u.get_version_num()) != Some(7)
                    {
                        return Err(format!(
                            "connection name {name:?} for {dialect:?} is not ws-<uuid7>"
                        ));
                    }
                }
                Event::FirstToken { .. } | Event::InterToken { .. } => t.timing_events += 1,
                Event::TokensGenerated { count } => {
                    t.tokens_generated += u64::from(*count);
                    match t.step_results {
                        Some(n) if u64::from(*count) <= n => {}
                        _ => {
                            return Err(format!(
                                "TokensGenerated {count} for a step that sampled {:?}",
                                t.step_results
                            ))
                        }
                    }
                }
                // Confirmed draft tokens are tokens the step generated
                // beyond one per sequence: never more than it drafted.
                Event::DraftTokens { drafted, confirmed } => {
                    if confirmed > drafted || *drafted == 0 {
                        return Err(format!(
                            "DraftTokens: {confirmed} confirmed of {drafted} drafted"
                        ));
                    }
                }
                // A continuation's prompt: checked by `batch_continuation`'s text.
                Event::PromptTokensReused { .. } => {}
                // Cached tokens never exceed the prompt and always leave its
                // last token to compute; they are whole blocks.
                Event::PrefixCacheLookup { queried, hit } => {
                    let bs = cx.model.block_size.max(1);
                    if *hit >= (*queried).max(1) || hit % bs != 0 {
                        return Err(format!(
                            "prefix cache hit of {hit} tokens for a prompt of {queried} (blocks of {bs})"
                        ));
                    }
                }
                Event::ConnectionOpened { .. } => self.balance += 1,
                Event::ConnectionClosed { .. } => self.balance -= 1,
                Event::Gauges {
                    queued,
                    running,
                    kv_blocks_used,
                    kv_blocks_kept,
                    kv_blocks_total,
                    kv_blocks_cached,
                } => {
                    self.gauges = Some((
                        *queued,
                        *running,
                        *kv_blocks_used,
                        *kv_blocks_kept,
                        *kv_blocks_total,
                        *kv_blocks_cached,
                    ))
                }
            },
            _ => {}
        }
        Ok(())
    }

    fn on_end(&mut self, cx: &Cx<'_>, end: &EndState) -> Check {
        let t = &self.t;
        if t.error_frames != t.error_events {
            return Err(format!(
                "error frames {:?} but error events {:?}",
                t.error_frames, t.error_events
            ));
        }
        if t.finished_frames != t.finished_events {
            return Err(format!(
                "terminal frames {:?} but finished-request events {:?}",
                t.finished_frames, t.finished_events
            ));
        }
        if t.cancelled_events < t.cancelled_frames {
            return Err(format!(
                "{} cancelled completions but {} cancelled-request events",
                t.cancelled_frames, t.cancelled_events
            ));
        }
        if t.feedback_acks != t.feedback_events {
            return Err(format!(
                "{} feedback acks but {} feedback events",
                t.feedback_acks, t.feedback_events
            ));
        }
        let timing_ok = if t.step_mixed {
            t.timing_events >= t.sampled_token_frames
        } else {
            t.timing_events == t.sampled_token_frames
        };
        if !timing_ok {
            return Err(format!(
                "{} sampled token frames but {} token timing events",
                t.sampled_token_frames, t.timing_events
            ));
        }
        let open = i64::from(end.stats.connections);
        if self.balance != open {
            return Err(format!(
                "connections opened minus closed is {} but the Host holds {open}",
                self.balance
            ));
        }
        let s = &end.stats;
        if s.loaded {
            // Every event of a Host with a model ends with its gauges current.
            let now = (
                s.queued,
                s.running,
                s.kv_blocks_used,
                s.kv_blocks_kept,
                s.kv_blocks_total,
                s.kv_blocks_cached,
            );
            match self.gauges {
                None => return Err(format!("no gauges event, the Host reports {now:?}")),
                Some(g) if g != now => {
                    return Err(format!("last gauges {g:?} but the Host reports {now:?}"))
                }
                Some(_) => {}
            }
            // A sequence the engine is computing for a live, unpaused request
            // is running, whatever the scheduler's own count says.
            let v = cx.view;
            let computing = v.step.as_ref().map_or(0, |step| {
                step.seqs
                    .iter()
                    .filter(|q| {
                        v.seq_request.get(q).is_some_and(|rid| {
                            v.requests.get(rid).is_some_and(|r| {
                                r.terminals == 0
                                    && r.paused_at.is_none()
                                    && v.conns.get(&r.conn).is_some_and(|c| {
                                        !c.closed
                                            && c.blocked_since.is_none()
                                            && c.current.as_deref() == Some(rid.as_str())
                                    })
                            })
                        })
                    })
                    .count()
            });
            if computing > 0 && s.running == 0 {
                return Err(format!(
                    "the Host reports no sequence running while the engine computes {computing} for live requests"
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
    use tokenwire_core::{ConnId, Dialect};

    /// A first event that leaves the gauges current.
    fn warm(k: &mut crate::invariants::testkit::Kit) {
        k.input(Input::Timeout).expect("input");
        k.out(idle_gauges()).expect("gauges");
        k.end().expect("end");
    }

    /// The gauges of the kit's idle Host.
    fn idle_gauges() -> Output {
        Output::Event(Event::Gauges {
            queued: 0,
            running: 0,
            kv_blocks_used: 0,
            kv_blocks_kept: 0,
            kv_blocks_total: 64,
            kv_blocks_cached: 0,
        })
    }

    #[test]
    fn an_error_frame_without_its_count_is_caught() {
        let mut k = kit(Box::new(Metrics::default()));
        warm(&mut k);
        k.open(1);
        k.text(1, json!({"type": "bogus"})).expect("frame");
        k.send(
            1,
            json!({"type": "error", "error": "invalid_request", "message": "m",
                         "recoverable": true, "recovery_action": "none"}),
        )
        .expect("frame");
        let err = k.end().expect_err("not counted");
        assert_eq!(err.invariant, "metrics");
        assert!(err.detail.contains("error frames"), "{}", err.detail);
    }

    #[test]
    fn a_completion_counted_with_other_tokens_is_caught() {
        let mut k = kit(Box::new(Metrics::default()));
        warm(&mut k);
        k.open(1);
        k.input(Input::Timeout).expect("input");
        k.send(
            1,
            json!({"type": "completion", "request_id": "gen_a", "generated_text": "",
                         "finish_reason": "length",
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
        )
        .expect("frame");
        k.out(Output::Event(Event::RequestStarted {
            conn: ConnId(1),
            dialect: Dialect::Generate,
            request: 9,
            prompt_tokens: 3,
            max_tokens: 2,
        }))
        .expect("event");
        k.out(Output::Event(Event::RequestFinished {
            dialect: Dialect::Generate,
            request: 9,
            outcome: Outcome::Completed,
            prompt_tokens: 3,
            completion_tokens: 1,
            elapsed: std::time::Duration::from_millis(5),
        }))
        .expect("event");
        let err = k.end().expect_err("counts differ");
        assert!(err.detail.contains("terminal frames"), "{}", err.detail);
    }

    #[test]
    fn a_request_finished_without_starting_or_twice_is_caught() {
        let finished = Output::Event(Event::RequestFinished {
            dialect: Dialect::Generate,
            request: 4,
            outcome: Outcome::Cancelled,
            prompt_tokens: 3,
            completion_tokens: 0,
            elapsed: std::time::Duration::from_millis(5),
        });
        let mut k = kit(Box::new(Metrics::default()));
        warm(&mut k);
        k.open(1);
        let err = k.out(finished.clone()).expect_err("never started");
        assert!(
            err.detail.contains("without a RequestStarted"),
            "{}",
            err.detail
        );

        let mut k = kit(Box::new(Metrics::default()));
        warm(&mut k);
        k.open(1);
        let started = Output::Event(Event::RequestStarted {
            conn: ConnId(1),
            dialect: Dialect::Generate,
            request: 4,
            prompt_tokens: 3,
            max_tokens: 8,
        });
        k.out(started.clone()).expect("started");
        let err = k.out(started).expect_err("twice");
        assert!(err.detail.contains("started twice"), "{}", err.detail);

        let mut k = kit(Box::new(Metrics::default()));
        warm(&mut k);
        let err = k
            .out(Output::Event(Event::RequestStarted {
                conn: ConnId(5),
                dialect: Dialect::Generate,
                request: 1,
                prompt_tokens: 3,
                max_tokens: 8,
            }))
            .expect_err("no such connection");
        assert!(err.detail.contains("not an open"), "{}", err.detail);
    }

    #[test]
    fn no_sequence_running_while_the_engine_computes_one_is_caught() {
        let mut k = kit(Box::new(Metrics::default()));
        warm(&mut k);
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.input(Input::Timeout).expect("input");
        k.step(1, 1, 1).expect("step");
        k.out(idle_gauges()).expect("gauges");
        let err = k.end().expect_err("counted none");
        assert!(err.detail.contains("no sequence running"), "{}", err.detail);
        // Counted, it is fine.
        let mut k = kit(Box::new(Metrics::default()));
        warm(&mut k);
        k.start(1, "gen_a", json!({"type": "config", "prompt": "<c1>hello"}));
        k.input(Input::Timeout).expect("input");
        k.step(1, 1, 1).expect("step");
        let running = Event::Gauges {
            queued: 0,
            running: 1,
            kv_blocks_used: 0,
            kv_blocks_kept: 0,
            kv_blocks_total: 64,
            kv_blocks_cached: 0,
        };
        k.out(Output::Event(running)).expect("gauges");
        let mut end = crate::invariants::testkit::idle_end();
        end.stats.running = 1;
        k.m.end(&end).expect("counted");
    }

    #[test]
    fn gauges_missing_or_stale_are_caught() {
        let mut k = kit(Box::new(Metrics::default()));
        k.input(Input::Timeout).expect("input");
        let err = k.end().expect_err("no gauges at all");
        assert!(err.detail.contains("no gauges"), "{}", err.detail);
        let mut k = kit(Box::new(Metrics::default()));
        k.input(Input::Timeout).expect("input");
        k.out(Output::Event(Event::Gauges {
            queued: 0,
            running: 1,
            kv_blocks_used: 0,
            kv_blocks_kept: 0,
            kv_blocks_total: 64,
            kv_blocks_cached: 0,
        }))
        .expect("event");
        let err = k.end().expect_err("stale");
        assert!(err.detail.contains("last gauges"), "{}", err.detail);
    }

    #[test]
    fn a_connection_count_that_drifts_is_caught() {
        let mut k = kit(Box::new(Metrics::default()));
        k.input(Input::Timeout).expect("input");
        k.out(idle_gauges()).expect("gauges");
        k.out(Output::Event(Event::ConnectionOpened {
            dialect: Dialect::Generate,
        }))
        .expect("event");
        // The kit reports a Host with no connection.
        let err = k.end().expect_err("drift");
        assert!(err.detail.contains("opened minus closed"), "{}", err.detail);
    }
}
