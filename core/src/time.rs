//! The core's own clock: a monotonic instant in nanoseconds, passed in by the caller.
//!
//! The core never reads a clock. Whoever drives the [`crate::Host`] passes `now`
//! with every input, so a test or the simulator can move time by hand.

use std::ops::{Add, Sub};
pub use std::time::Duration;

/// A point on the caller's monotonic clock, in nanoseconds since an arbitrary origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The origin of the caller's clock.
    pub const ZERO: Instant = Instant(0);

    /// An instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// An instant `millis` milliseconds after the origin.
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// An instant `secs` seconds after the origin.
    pub const fn from_secs(secs: u64) -> Self {
        Instant(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

/// Milliseconds as a float, for timing fields on the wire.
pub fn millis_f64(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}
