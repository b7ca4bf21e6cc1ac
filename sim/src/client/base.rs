//! What every simulated client keeps and does whatever its dialect: its
//! connection, whether it is done for good or in the liveness phase, its
//! [`Habits`], and the same few moves on them (binding the connection the
//! runner opened, telling its own connection's frames from a stale one's,
//! forgetting a closed connection, hanging up and coming back).
//!
//! Each dialect's client holds a [`ClientBase`] and hands it to
//! [`SimClient`](super::SimClient) through `base` / `base_mut`, which gives
//! it `conn`, `bind`, `habits` and (unless it does more) `start_liveness`.

use tokenwire_core::rng::Rng;
use tokenwire_core::{ConnId, Duration};

use super::chance;
use crate::swarm::{between, Swarm};

/// What every simulated user has whatever its dialect: how its connection
/// behaves (drawn once) and the faults it caused (counted for the report).
#[derive(Debug, Clone, Default)]
pub struct Habits {
    /// Never answers pings.
    pub silent: bool,
    /// Reads slowly.
    pub slow_reader: bool,
    /// Stops reading now and then.
    pub stalls: bool,
    /// Malformed or hostile frames sent.
    pub hostile_sent: u64,
    /// Early disconnects.
    pub disconnects: u64,
}

impl Habits {
    /// Draws them from `rng` (silence only when `may_be_silent`: no draw
    /// is made otherwise, so the stream stays as it was).
    pub(crate) fn draw(rng: &mut Rng, swarm: &Swarm, may_be_silent: bool) -> Habits {
        let silent = may_be_silent && chance(rng, swarm.mix.silent_p);
        let slow_reader = chance(rng, swarm.net.slow_reader_p);
        let stalls = chance(rng, swarm.net.stall_p * 5.0);
        Habits {
            silent,
            slow_reader,
            stalls,
            hostile_sent: 0,
            disconnects: 0,
        }
    }
}

/// The state every client shares: its connection, whether it stopped, its
/// habits.
#[derive(Debug, Clone)]
pub struct ClientBase {
    /// Its connection, if it has one.
    pub conn: Option<ConnId>,
    /// The server said it is going away (1001): never come back.
    pub gone: bool,
    /// The liveness phase began: no new work.
    pub liveness: bool,
    /// How its connection behaves, and what it counted.
    pub habits: Habits,
}

impl ClientBase {
    /// A client with no connection yet, behaving as `habits` say.
    pub fn new(habits: Habits) -> ClientBase {
        ClientBase {
            conn: None,
            gone: false,
            liveness: false,
            habits,
        }
    }

    /// True when it starts nothing new: gone for good, or in the liveness
    /// phase.
    pub fn stopped(&self) -> bool {
        self.gone || self.liveness
    }

    /// True when `conn` is its current connection (frames and closes of an
    /// earlier one are stale).
    pub fn owns(&self, conn: ConnId) -> bool {
        self.conn == Some(conn)
    }

    /// `conn` is gone, closed by the server with `code` or broken (`None`):
    /// false when it was not its connection (nothing changes); otherwise it
    /// forgets it, and after a 1001 (the server is going away) never comes
    /// back.
    pub fn closed(&mut self, conn: ConnId, code: Option<u16>) -> bool {
        if !self.owns(conn) {
            return false;
        }
        self.conn = None;
        if code == Some(1001) {
            self.gone = true;
        }
        true
    }
}

/// How long a client that hung up waits before it connects again: with
/// chance `p_soon` a moment (up to 2 s), otherwise long past the idle
/// timeout (700 s).
pub(crate) fn come_back_after(rng: &mut Rng, p_soon: f64) -> Duration {
    if chance(rng, p_soon) {
        between(rng, Duration::from_millis(1), Duration::from_secs(2))
    } else {
        Duration::from_secs(700)
    }
}

/// How long a client whose connection was closed or broke waits before it
/// connects again: a moment, up to `most`.
pub(crate) fn reconnect_after(rng: &mut Rng, most: Duration) -> Duration {
    between(rng, Duration::from_micros(10), most)
}
