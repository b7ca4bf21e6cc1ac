//! `cai_tokens`: an organisation over its `tokens_per_minute` is refused.
//! The Host charges a request's prompt tokens when the prompt comes back
//! tokenized and its generated tokens when it ends (finished, interrupted,
//! failed, or cut off by a disconnect), and admits a request only while the
//! organisation's token bucket holds at least one token (PROTOCOLS.md: a
//! bucket may go into debt and refuses until it is back to one).
//!
//! The wire does not show every charge at the moment it was made, so this
//! checker keeps an upper bound on the bucket instead of its level: per
//! organisation, a bucket that starts full at the first admission it sees
//! and is charged, for every request whose usage the wire reports
//! (`STREAM_COMPLETE`'s `usage`, `INTERRUPTED_ACK`'s `tokensGenerated`),
//! those tokens as of the moment the request was admitted. A charge made
//! earlier leaves a bucket at least as full at every later moment (refills
//! stop at the bucket's size), and a charge the wire never shows (a
//! disconnect, another dialect's keyed request) only makes the real bucket
//! emptier, so the real level is never above this bound. An admission while
//! the bound is under one token is a request the Host should have refused.

use std::collections::BTreeMap;

use tokenwire_core::{Instant, Output};

use super::rate::Bucket;
use super::view::{rid_of, Creds};
use crate::invariants::{Check, Checker, Cx, Frame};

/// One organisation's known charges.
#[derive(Debug, Clone)]
struct Ledger {
    per_minute: u64,
    /// When the bucket was first seen (full then).
    since: Instant,
    /// Tokens charged, each as of its request's admission.
    charges: Vec<(Instant, u64)>,
}

impl Ledger {
    /// The bound on the tokens held at `now`: the charges replayed in time
    /// order, the bucket refilling at its rate up to its size between them.
    fn bound(&self, now: Instant) -> f64 {
        let mut charges: Vec<(Instant, u64)> = self
            .charges
            .iter()
            .copied()
            .filter(|c| c.0 <= now)
            .collect();
        charges.sort_by_key(|c| c.0);
        let mut bucket = Bucket::full(self.per_minute, self.since);
        for (when, tokens) in charges {
            bucket.charge(when, tokens);
        }
        bucket.level(now)
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiTokens {
    ledgers: BTreeMap<String, Ledger>,
}

impl CaiTokens {
    fn ledger(&mut self, cx: &Cx<'_>, who: &Creds) -> Option<&mut Ledger> {
        let tpm = cx
            .config
            .keys
            .as_ref()?
            .org_limits(&who.org)
            .tokens_per_minute?;
        Some(self.ledgers.entry(who.org.clone()).or_insert(Ledger {
            per_minute: tpm,
            since: cx.now,
            charges: Vec::new(),
        }))
    }
}

/// The tokens a terminal frame reports its request used.
fn reported_tokens(f: &Frame) -> Option<u64> {
    match f.kind() {
        "STREAM_COMPLETE" => {
            let usage = &f.v["payload"]["usage"];
            let prompt = usage["promptTokens"].as_u64().unwrap_or(0);
            let completion = usage["completionTokens"].as_u64().unwrap_or(0);
            Some(prompt + completion)
        }
        "INTERRUPTED_ACK" => f.v["payload"]["tokensGenerated"].as_u64(),
        _ => None,
    }
}

impl Checker for CaiTokens {
    fn name(&self) -> &'static str {
        "cai_tokens"
    }

    fn on_crash(&mut self) {
        self.ledgers.clear();
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::Tokenize(job), _) => {
                let Some(Ok(who)) = cx.view.cai(&job.conn).map(|a| a.auth.clone()) else {
                    return Ok(());
                };
                let now = cx.now;
                let Some(ledger) = self.ledger(cx, &who) else {
                    return Ok(());
                };
                let bound = ledger.bound(now);
                if bound < 1.0 {
                    return Err(format!(
                        "a request of key {} for {:?} on {:?} admitted at {now:?} with at most {bound:.3} tokens in its bucket of {} a minute",
                        who.key, who.org, job.conn, ledger.per_minute
                    ));
                }
                Ok(())
            }
            (Output::Send { conn, .. }, Some(f)) => {
                let Some(tokens) = reported_tokens(f) else {
                    return Ok(());
                };
                let Some(a) = cx.view.cai(conn) else {
                    return Ok(());
                };
                let Ok(who) = a.auth.clone() else {
                    return Ok(());
                };
                let Some(admitted) = rid_of(f)
                    .and_then(|rid| a.requests.get(rid))
                    .map(|r| r.accepted_at)
                else {
                    return Ok(());
                };
                if let Some(ledger) = self.ledger(cx, &who) {
                    ledger.since = ledger.since.min(admitted);
                    ledger.charges.push((admitted, tokens));
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
    use crate::invariants::testkit::cai_kit_limits;
    use serde_json::json;

    fn complete(rid: &str, prompt: u64, completion: u64) -> serde_json::Value {
        json!({"type": "STREAM_COMPLETE", "requestId": rid,
               "payload": {"fullContent": "x", "model": "tiny", "finishReason": "length",
                           "usage": {"promptTokens": prompt, "completionTokens": completion,
                                     "totalTokens": prompt + completion}}})
    }

    #[test]
    fn an_admission_with_the_bucket_spent_is_caught_until_it_refills() {
        // 60 tokens a minute: one a second.
        let mut k = cai_kit_limits(Box::new(CaiTokens::default()), None, Some(60));
        k.open_cai(1);
        k.completion(1, "a", json!({"stream": false}))
            .expect("full bucket");
        k.tokenized(1).expect("tokenized");
        k.end().expect("end");
        k.at(1_000);
        k.send(1, complete("a", 10, 60)).expect("its usage");
        k.end().expect("end");
        // 70 charged as of 0 ms: 10 in debt at 1 s even with a second's refill.
        k.at(2_000);
        let e = k
            .completion(1, "b", json!({"stream": false}))
            .expect_err("the bucket is in debt");
        assert_eq!(e.invariant, "cai_tokens");
        assert!(e.detail.contains("at most -8.000 tokens"), "{}", e.detail);

        // The same history, admitted once the debt is repaid (11 s in).
        let mut k = cai_kit_limits(Box::new(CaiTokens::default()), None, Some(60));
        k.open_cai(1);
        k.completion(1, "a", json!({"stream": false}))
            .expect("full");
        k.tokenized(1).expect("tokenized");
        k.end().expect("end");
        k.at(1_000);
        k.send(1, complete("a", 10, 60)).expect("usage");
        k.end().expect("end");
        k.at(11_000);
        k.completion(1, "b", json!({"stream": false}))
            .expect("repaid by then");
    }

    #[test]
    fn interrupted_requests_count_their_tokens_and_unlimited_orgs_are_left_alone() {
        let mut k = cai_kit_limits(Box::new(CaiTokens::default()), None, Some(6));
        k.open_cai(1);
        k.completion(1, "a", json!({})).expect("full");
        k.tokenized(1).expect("tokenized");
        k.end().expect("end");
        k.text(1, json!({"type": "INTERRUPTED", "requestId": "a"}))
            .expect("interrupt");
        k.send(
            1,
            json!({"type": "INTERRUPTED_ACK", "requestId": "a",
                   "payload": {"partialContent": "", "tokensGenerated": 6}}),
        )
        .expect("ack");
        k.end().expect("end");
        let e = k.completion(1, "b", json!({})).expect_err("spent");
        assert!(e.detail.contains("of 6 a minute"), "{}", e.detail);

        let mut k = cai_kit_limits(Box::new(CaiTokens::default()), None, None);
        k.open_cai(1);
        k.completion(1, "a", json!({"stream": false}))
            .expect("no limit");
        k.tokenized(1).expect("tokenized");
        k.end().expect("end");
        k.send(1, complete("a", 1_000, 1_000)).expect("usage");
        k.end().expect("end");
        k.completion(1, "b", json!({"stream": false}))
            .expect("still no limit");
    }

    #[test]
    fn the_bound_refills_only_up_to_the_bucket_size() {
        let t = |ms: u64| Instant::ZERO + tokenwire_core::Duration::from_millis(ms);
        let ledger = Ledger {
            per_minute: 60,
            since: t(0),
            charges: vec![(t(30_000), 60)],
        };
        // Full until 30 s (no credit above the size), emptied then, 10 back by 40 s.
        assert!((ledger.bound(t(40_000)) - 10.0).abs() < 1e-9);
        assert!((ledger.bound(t(20_000)) - 60.0).abs() < 1e-9);
    }
}
