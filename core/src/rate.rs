//! Token buckets driven by the core's clock, and the per-organisation rate
//! limits built from them (requests and tokens per minute, from the keys
//! file): `cai` admits each request through them, and with a key every
//! dialect's generations are charged to them. Exact integer arithmetic on
//! nanoseconds, so the same inputs give the same answers on any host.

use std::collections::BTreeMap;

use crate::keys::OrgLimits;
use crate::time::{Duration, Instant};

/// Nanoseconds in the refill period (a minute).
const PERIOD_NS: i128 = 60_000_000_000;

/// A bucket holding up to `per_minute` units, refilled continuously at
/// `per_minute` units a minute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    per_minute: u64,
    /// Units held, scaled by [`PERIOD_NS`] so refills never round; below
    /// zero after charges past empty (a debt later refills repay).
    scaled: i128,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(per_minute: u64, now: Instant) -> TokenBucket {
        TokenBucket {
            per_minute,
            scaled: i128::from(per_minute) * PERIOD_NS,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = i128::from(now.saturating_duration_since(self.last).as_nanos() as u64);
        let cap = i128::from(self.per_minute) * PERIOD_NS;
        self.scaled = (self.scaled + elapsed * i128::from(self.per_minute)).min(cap);
        if now > self.last {
            self.last = now;
        }
    }

    /// Whole units available at `now`.
    #[cfg(test)]
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        u64::try_from(self.scaled.max(0) / PERIOD_NS).unwrap_or(u64::MAX)
    }

    /// Takes `n` units at `now`, or says how long until `n` are there (never,
    /// as `None`, when `n` exceeds the bucket's size). Nothing is taken on refusal.
    #[cfg(test)]
    pub fn take(&mut self, now: Instant, n: u64) -> Result<(), Option<Duration>> {
        self.check(now, n)?;
        self.scaled -= i128::from(n) * PERIOD_NS;
        Ok(())
    }

    /// Whether `n` units are there at `now` (taking nothing), or how long
    /// until they are (`None`: never, `n` exceeds the bucket's size).
    pub fn check(&mut self, now: Instant, n: u64) -> Result<(), Option<Duration>> {
        self.refill(now);
        let need = i128::from(n) * PERIOD_NS;
        if need <= self.scaled {
            return Ok(());
        }
        if n > self.per_minute {
            return Err(None);
        }
        let missing = need - self.scaled;
        let rate = i128::from(self.per_minute);
        let ns = (missing + rate - 1) / rate;
        Err(Some(Duration::from_nanos(
            u64::try_from(ns).unwrap_or(u64::MAX),
        )))
    }

    /// Takes `n` units even past empty (tokens already generated are
    /// charged after the fact); the debt is repaid by later refills.
    pub fn charge(&mut self, now: Instant, n: u64) {
        self.refill(now);
        self.scaled -= i128::from(n) * PERIOD_NS;
    }
}

/// One organisation's buckets.
#[derive(Debug)]
struct Buckets {
    requests: Option<TokenBucket>,
    tokens: Option<TokenBucket>,
}

/// Rate limits per organisation (PROTOCOLS.md: every key acting for an
/// organisation draws from the same buckets).
#[derive(Debug, Default)]
pub struct RateLimits {
    buckets: BTreeMap<String, Buckets>,
}

impl RateLimits {
    fn buckets(&mut self, now: Instant, org: &str, limits: OrgLimits) -> &mut Buckets {
        self.buckets
            .entry(org.to_string())
            .or_insert_with(|| Buckets {
                requests: limits.requests_per_minute.map(|n| TokenBucket::new(n, now)),
                tokens: limits.tokens_per_minute.map(|n| TokenBucket::new(n, now)),
            })
    }

    /// Admits one request of `org` at `now` (taking one from its request
    /// bucket) when both buckets allow it; otherwise how long until they would.
    pub fn admit(&mut self, now: Instant, org: &str, limits: OrgLimits) -> Result<(), Duration> {
        let b = self.buckets(now, org, limits);
        // A token bucket in debt (tokens already generated past the limit)
        // refuses until it is back to one token.
        let tokens_wait = match b.tokens.as_mut().map(|t| t.check(now, 1)) {
            Some(Err(wait)) => Some(wait.unwrap_or(Duration::MAX)),
            _ => None,
        };
        let requests_wait = match b.requests.as_mut().map(|r| r.check(now, 1)) {
            Some(Err(wait)) => Some(wait.unwrap_or(Duration::MAX)),
            _ => None,
        };
        match tokens_wait.max(requests_wait) {
            Some(wait) => Err(wait),
            None => {
                if let Some(r) = b.requests.as_mut() {
                    r.charge(now, 1);
                }
                Ok(())
            }
        }
    }

    /// Charges `tokens` (prompt or generated) to `org`'s bucket.
    pub fn charge_tokens(&mut self, now: Instant, org: &str, limits: OrgLimits, tokens: u64) {
        if let Some(t) = self.buckets(now, org, limits).tokens.as_mut() {
            t.charge(now, tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn a_bucket_empties_then_refills_at_its_rate() {
        let mut b = TokenBucket::new(60, at(0));
        for _ in 0..60 {
            b.take(at(0), 1).expect("full");
        }
        // One unit a second.
        assert_eq!(b.take(at(0), 1), Err(Some(Duration::from_secs(1))));
        assert_eq!(b.take(at(400), 1), Err(Some(Duration::from_millis(600))));
        b.take(at(1000), 1).expect("refilled");
        assert_eq!(b.available(at(1000)), 0);
        assert_eq!(b.available(at(31_000)), 30);
        assert_eq!(b.available(at(10_000_000)), 60, "never above its size");
        assert_eq!(
            b.take(at(10_000_000), 61),
            Err(None),
            "more than it can ever hold"
        );
    }

    #[test]
    fn refusals_take_nothing_and_charges_may_go_into_debt() {
        let mut b = TokenBucket::new(10, at(0));
        assert!(b.take(at(0), 11).is_err());
        assert_eq!(b.available(at(0)), 10);
        b.charge(at(0), 15);
        assert_eq!(b.available(at(0)), 0);
        // A debt of 5 units, then 1 to take: 6 units at 10 a minute.
        assert_eq!(b.take(at(0), 1), Err(Some(Duration::from_secs(36))));
        assert_eq!(b.available(at(30_000)), 0, "still repaying");
        assert_eq!(b.check(at(35_000), 1), Err(Some(Duration::from_secs(1))));
        assert_eq!(b.check(at(36_000), 1), Ok(()));
        assert_eq!(b.check(at(36_000), 1), Ok(()), "checking takes nothing");
        b.take(at(36_000), 1).expect("repaid");
    }

    #[test]
    fn limits_refuse_with_the_wait_and_tokens_may_go_into_debt() {
        let limits = OrgLimits {
            requests_per_minute: Some(2),
            tokens_per_minute: Some(600),
        };
        let mut l = RateLimits::default();
        l.admit(at(0), "o", limits).expect("1st");
        l.admit(at(0), "o", limits).expect("2nd");
        assert_eq!(l.admit(at(0), "o", limits), Err(Duration::from_secs(30)));
        l.admit(at(0), "p", limits)
            .expect("another org has its own buckets");
        l.charge_tokens(at(30000), "o", limits, 900);
        // 300 tokens of debt at 10 a second, plus one to admit.
        assert_eq!(
            l.admit(at(30000), "o", limits),
            Err(Duration::from_millis(30_100))
        );
        l.admit(at(61000), "o", limits).expect("repaid");
    }

    #[test]
    fn an_organisation_has_one_set_of_buckets_and_its_keys_strictest_limits() {
        use crate::keys::{hash_key, ApiKey, KeyRing};
        let key = |name: &str, orgs: &[&str], rpm| ApiKey {
            name: name.into(),
            sha256: hash_key(name),
            orgs: orgs.iter().map(|o| o.to_string()).collect(),
            requests_per_minute: rpm,
            tokens_per_minute: None,
        };
        let ring = KeyRing::new(vec![
            key("a", &["shared", "a_only"], Some(3)),
            key("b", &["shared"], Some(2)),
            key("c", &["free"], None),
        ])
        .expect("ring");
        assert_eq!(ring.org_limits("shared").requests_per_minute, Some(2));
        assert_eq!(ring.org_limits("a_only").requests_per_minute, Some(3));
        assert_eq!(ring.org_limits("free").requests_per_minute, None);
        // Two keys acting for one organisation draw from the same bucket.
        let mut l = RateLimits::default();
        let shared = ring.org_limits("shared");
        l.admit(at(0), "shared", shared).expect("via a");
        l.admit(at(0), "shared", shared).expect("via b");
        assert!(
            l.admit(at(0), "shared", shared).is_err(),
            "the org's 2 are used"
        );
    }
}
