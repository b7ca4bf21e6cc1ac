//! `cai_rate`: per-organisation request limits hold, and refusals say why.
//! Per organisation (whichever key acts for it), the requests admitted
//! never exceed what a reference token bucket allows: it holds the
//! strictest `requests_per_minute` among the keys naming the organisation,
//! refills continuously at that many a minute and starts full (each Host
//! starts afresh: a crash empties the meter with everything else). A
//! request counts as admitted when the Host, handling its COMPLETION, asked
//! for its prompt to be tokenized, at that moment: that is the only way on
//! to a generation, and it comes after the meter; requests refused later
//! (the queue full, the context too long) had passed the meter and count
//! too. This covers and is exact for every request that got `STREAM_START`,
//! `STREAM_COMPLETE` or any outcome past the meter.
//!
//! `RATE_LIMITED` errors carry `details.maxInflight` (the configured
//! limit, given when the connection already had that many requests in
//! flight), or `details.retryAfterMs` > 0 for the meter, which only a key
//! with a limit may get; where the key limits requests but not tokens, the
//! reference bucket must be short of a unit then (a token limit cannot be
//! followed exactly from the wire: generated tokens are charged as they
//! are made, so a refusal is not judged against it). A `RATE_LIMITED` with
//! neither is the queue-full refusal of a prompt already tokenized.

use std::collections::BTreeMap;

use tokenwire_core::{Instant, Output};

use super::view::{code, rid_of, Creds, Expect};
use crate::invariants::{Check, Checker, Cx, Frame};

/// Nanoseconds in a minute.
const MINUTE_NS: i128 = 60_000_000_000;

/// The reference bucket: units held, scaled by a minute in nanoseconds
/// (`cai_tokens` replays its charges through one too).
#[derive(Debug, Clone)]
pub(super) struct Bucket {
    per_minute: i128,
    scaled: i128,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `per_minute` at `now`.
    pub(super) fn full(per_minute: u64, now: Instant) -> Bucket {
        let per_minute = i128::from(per_minute);
        Bucket {
            per_minute,
            scaled: per_minute * MINUTE_NS,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = i128::from((now - self.at).as_nanos() as u64);
        self.scaled = (self.scaled + elapsed * self.per_minute).min(self.per_minute * MINUTE_NS);
        self.at = self.at.max(now);
    }

    /// Units held at `now`, as a fraction.
    pub(super) fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.scaled as f64 / MINUTE_NS as f64
    }

    /// Takes `n` units at `now`, into debt if need be.
    pub(super) fn charge(&mut self, now: Instant, n: u64) {
        self.refill(now);
        self.scaled -= i128::from(n) * MINUTE_NS;
    }

    /// Takes a unit at `now`, or says it is not there.
    fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.scaled < MINUTE_NS {
            return false;
        }
        self.scaled -= MINUTE_NS;
        true
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiRate {
    buckets: BTreeMap<String, Bucket>,
}

impl CaiRate {
    fn bucket(&mut self, cx: &Cx<'_>, who: &Creds) -> Option<&mut Bucket> {
        let rpm = cx
            .config
            .keys
            .as_ref()?
            .org_limits(&who.org)
            .requests_per_minute?;
        Some(
            self.buckets
                .entry(who.org.clone())
                .or_insert_with(|| Bucket::full(rpm, cx.now)),
        )
    }
}

impl Checker for CaiRate {
    fn name(&self) -> &'static str {
        "cai_rate"
    }

    fn on_crash(&mut self) {
        self.buckets.clear();
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::Tokenize(job), _) => {
                let Some(Ok(who)) = cx.view.cai(&job.conn).map(|a| a.auth.clone()) else {
                    return Ok(());
                };
                let now = cx.now;
                let Some(b) = self.bucket(cx, &who) else {
                    return Ok(());
                };
                if b.take(now) {
                    return Ok(());
                }
                Err(format!(
                    "a request of key {} for {:?} on {:?} admitted at {now:?} with {:.3} requests left in its bucket",
                    who.key,
                    who.org,
                    job.conn,
                    b.level(now)
                ))
            }
            (Output::Send { conn, .. }, Some(f))
                if f.kind() == "ERROR" && code(f) == "RATE_LIMITED" =>
            {
                let Some(a) = cx.view.cai(conn) else {
                    return Ok(());
                };
                let d = &f.v["error"]["details"];
                let rid = rid_of(f).unwrap_or("");
                if let Some(n) = d.get("maxInflight") {
                    let handling = matches!(&a.cur, Some(Expect::Completion { done: false, .. }));
                    let max = cx.config.cai_max_inflight;
                    if n.as_u64() != Some(u64::from(max)) || !handling {
                        return Err(format!(
                            "RATE_LIMITED for {rid:?} on {conn:?} with maxInflight {n} (the limit is {max}; a COMPLETION handled: {handling})"
                        ));
                    }
                    if a.requests.len() < max as usize {
                        return Err(format!(
                            "RATE_LIMITED for {rid:?} on {conn:?} at {} requests in flight, under the limit of {max}",
                            a.requests.len()
                        ));
                    }
                    return Ok(());
                }
                let Some(wait) = d.get("retryAfterMs") else {
                    return Ok(());
                };
                if wait.as_u64().is_none_or(|w| w == 0) {
                    return Err(format!(
                        "RATE_LIMITED for {rid:?} on {conn:?} with retryAfterMs {wait}"
                    ));
                }
                let Ok(who) = a.auth.clone() else {
                    return Ok(());
                };
                let limits = cx.config.keys.as_ref().map(|k| k.org_limits(&who.org));
                let (rpm, tpm) = limits.map_or((None, None), |l| {
                    (l.requests_per_minute, l.tokens_per_minute)
                });
                if rpm.is_none() && tpm.is_none() {
                    return Err(format!(
                        "RATE_LIMITED for {rid:?} on {conn:?}: organisation {:?} has no limits",
                        who.org
                    ));
                }
                if tpm.is_none() {
                    let now = cx.now;
                    if let Some(b) = self.bucket(cx, &who) {
                        let level = b.level(now);
                        if level >= 1.0 {
                            return Err(format!(
                                "RATE_LIMITED for {rid:?} on {conn:?} (key {}, {:?}) with {level:.3} requests left in its bucket",
                                who.key, who.org
                            ));
                        }
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::cai_kit;
    use serde_json::{json, Value};

    fn limited(rid: &str, details: Value) -> Value {
        json!({"type": "ERROR", "requestId": rid,
               "error": {"code": "RATE_LIMITED", "message": "m", "details": details}})
    }

    #[test]
    fn admissions_past_the_bucket_are_caught() {
        // The kit's key allows 2 requests a minute.
        let mut k = cai_kit(Box::new(CaiRate::default()));
        k.open_cai(1);
        k.completion(1, "a", json!({})).expect("1st");
        k.at(1_000);
        k.completion(1, "b", json!({})).expect("2nd");
        k.at(2_000);
        let e = k.completion(1, "c", json!({})).expect_err("3rd");
        assert_eq!(e.invariant, "cai_rate");
        // Half a minute refills one.
        let mut k = cai_kit(Box::new(CaiRate::default()));
        k.open_cai(1);
        k.completion(1, "a", json!({})).expect("1st");
        k.completion(1, "b", json!({})).expect("2nd");
        k.at(30_000);
        k.completion(1, "c", json!({})).expect("refilled");
    }

    fn handling() -> crate::invariants::testkit::Kit {
        let mut k = cai_kit(Box::new(CaiRate::default()));
        k.open_cai(1);
        k.text(
            1,
            json!({"type": "COMPLETION", "requestId": "a", "payload": {"prompt": "<c1>x"}}),
        )
        .expect("frame");
        k
    }

    #[test]
    fn refusals_without_cause_or_reason_are_caught() {
        let e = handling()
            .send(1, limited("a", json!({"retryAfterMs": 100})))
            .expect_err("the bucket is full");
        assert!(e.detail.contains("left in its bucket"), "{}", e.detail);
        let e = handling()
            .send(1, limited("a", json!({"retryAfterMs": 0})))
            .expect_err("no wait");
        assert!(e.detail.contains("retryAfterMs 0"), "{}", e.detail);
        let e = handling()
            .send(1, limited("a", json!({"maxInflight": 2})))
            .expect_err("none in flight");
        assert!(e.detail.contains("under the limit"), "{}", e.detail);
        let e = handling()
            .send(1, limited("a", json!({"maxInflight": 3})))
            .expect_err("another limit");
        assert!(e.detail.contains("the limit is 2"), "{}", e.detail);
    }
}
