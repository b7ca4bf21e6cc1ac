//! The server's clock: the Host's [`Instant`] is nanoseconds since the server
//! started, read from the monotonic `std::time::Instant`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokenwire_core::Instant;

/// Maps the monotonic OS clock to the Host's time and back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: std::time::Instant,
    epoch_unix_ms: u64,
}

impl Clock {
    /// A clock whose zero is now.
    pub(crate) fn start() -> Clock {
        let epoch_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Clock {
            start: std::time::Instant::now(),
            epoch_unix_ms,
        }
    }

    /// Wall-clock time of the Host's `Instant::ZERO`, in unix milliseconds.
    pub(crate) fn epoch_unix_ms(&self) -> u64 {
        self.epoch_unix_ms
    }

    /// The Host's current time.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The tokio instant of the Host time `t`.
    pub(crate) fn to_tokio(self, t: Instant) -> tokio::time::Instant {
        match self.start.checked_add(Duration::from_nanos(t.as_nanos())) {
            Some(std) => tokio::time::Instant::from_std(std),
            None => far_future(),
        }
    }
}

/// An instant that is never reached in practice (a disarmed timer).
pub(crate) fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_time_round_trips_through_tokio_time() {
        let c = Clock::start();
        let t = Instant::from_millis(1500);
        let back = c.to_tokio(t);
        let expected = tokio::time::Instant::from_std(c.start) + Duration::from_millis(1500);
        assert_eq!(back, expected);
        assert!(c.now() < Instant::from_secs(3600));
        assert!(c.epoch_unix_ms() > 1_600_000_000_000);
    }
}
