//! The simulated network: per-frame delays on the way in (in order per
//! connection, as TCP delivers them), and a bounded outbound queue per
//! connection on the way out, read by a fast, slow or stalling reader.
//!
//! The queue is what the io shell keeps per connection: when it reaches its
//! capacity the shell reports `Input::QueueFull`, and `Input::QueueDrained`
//! once the reader brings it down to half. Frames the Host sends meanwhile are
//! still queued (a step already running may add its frames), so a queue may
//! hold more than its capacity.

use std::collections::{BTreeMap, VecDeque};

use tokenwire_core::rng::Rng;
use tokenwire_core::{ConnId, Duration, Instant, Transport};

use crate::swarm::{between, NetOptions};

/// How a client reads its connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reader {
    /// Time to read one frame; zero reads everything at once.
    pub per_frame: Duration,
    /// Chance, per read, of stalling before the next one.
    pub stall_p: f64,
    /// Longest stall.
    pub stall_max: Duration,
}

impl Reader {
    /// A reader that keeps up with anything.
    pub const FAST: Reader = Reader {
        per_frame: Duration::ZERO,
        stall_p: 0.0,
        stall_max: Duration::ZERO,
    };

    /// True when frames go straight to the client.
    pub fn is_fast(&self) -> bool {
        self.per_frame.is_zero() && self.stall_p == 0.0
    }
}

/// One simulated connection.
#[derive(Debug, Clone)]
pub struct NetConn {
    /// The client that owns it.
    pub client: usize,
    /// The Host generation (crash count) it belongs to.
    pub host_gen: u64,
    /// How it is carried.
    pub transport: Transport,
    /// The Host has been told it is gone (`Input::Closed`).
    pub closed_reported: bool,
    /// The client has hung up (its `Closed` may still be on the way).
    pub client_closed: bool,
    /// Frames sent by the Host, not yet read.
    pub queue: VecDeque<String>,
    /// Queue capacity before `QueueFull`.
    pub cap: usize,
    /// `QueueFull` reported and not yet drained.
    pub full: bool,
    /// The client's reader.
    pub reader: Reader,
    /// A read is scheduled.
    pub reading: bool,
    /// Arrival time of the latest frame sent towards the Host (keeps order).
    pub last_arrival: Instant,
}

/// What pushing a frame did.
#[derive(Debug, Default)]
pub struct Pushed {
    /// Hand this frame to the client now.
    pub deliver: Option<String>,
    /// The queue just filled: report `QueueFull`.
    pub became_full: bool,
    /// Schedule a read after this long.
    pub read_after: Option<Duration>,
}

/// What one read did.
#[derive(Debug, Default)]
pub struct Read {
    /// Frames handed to the client, in order.
    pub frames: Vec<String>,
    /// The queue drained to its low mark: report `QueueDrained`.
    pub drained: bool,
    /// Schedule the next read after this long.
    pub next_after: Option<Duration>,
}

/// Every connection of the run.
#[derive(Debug)]
pub struct Net {
    opts: NetOptions,
    rng: Rng,
    /// Connections by id (ids are never reused, across crashes too).
    pub conns: BTreeMap<ConnId, NetConn>,
    next_conn: u64,
}

impl Net {
    /// A network with `opts`, drawing from `rng`.
    pub fn new(opts: NetOptions, rng: Rng) -> Net {
        Net {
            opts,
            rng,
            conns: BTreeMap::new(),
            next_conn: 1,
        }
    }

    /// A random one-way delay.
    pub fn delay(&mut self) -> Duration {
        between(&mut self.rng, self.opts.delay_min, self.opts.delay_max)
    }

    /// A reader for a new connection of a client that reads slowly or not.
    pub fn reader_for(&mut self, slow: bool, stalls: bool) -> Reader {
        Reader {
            per_frame: if slow {
                between(
                    &mut self.rng,
                    Duration::from_millis(1),
                    Duration::from_millis(40),
                )
            } else {
                Duration::ZERO
            },
            stall_p: if stalls { 0.05 } else { 0.0 },
            stall_max: self.opts.stall_max,
        }
    }

    /// Opens a connection for `client` and returns its id.
    pub fn open(
        &mut self,
        client: usize,
        host_gen: u64,
        transport: Transport,
        reader: Reader,
    ) -> ConnId {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        let (lo, hi) = self.opts.queue_cap;
        let cap = lo + self.rng.below(u64::from(hi - lo) + 1) as u32;
        self.conns.insert(
            id,
            NetConn {
                client,
                host_gen,
                transport,
                closed_reported: false,
                client_closed: false,
                queue: VecDeque::new(),
                cap: cap.max(1) as usize,
                full: false,
                reader,
                reading: false,
                last_arrival: Instant::ZERO,
            },
        );
        id
    }

    /// When a frame the client sends now reaches the Host (never before an
    /// earlier frame of the same connection).
    pub fn arrival(&mut self, conn: ConnId, now: Instant) -> Instant {
        let d = self.delay();
        let Some(c) = self.conns.get_mut(&conn) else {
            return now + d;
        };
        let at = (now + d).max(c.last_arrival);
        c.last_arrival = at;
        at
    }

    /// A frame from the Host for `conn`.
    pub fn push(&mut self, conn: ConnId, text: String) -> Pushed {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Pushed::default();
        };
        if c.closed_reported || c.client_closed {
            return Pushed::default();
        }
        if c.reader.is_fast() && c.queue.is_empty() {
            return Pushed {
                deliver: Some(text),
                ..Pushed::default()
            };
        }
        c.queue.push_back(text);
        let mut out = Pushed::default();
        if !c.full && c.queue.len() >= c.cap {
            c.full = true;
            out.became_full = true;
        }
        if !c.reading {
            c.reading = true;
            out.read_after = Some(c.reader.per_frame);
        }
        out
    }

    /// The client reads from `conn`'s queue.
    pub fn read(&mut self, conn: ConnId) -> Read {
        let mut out = Read::default();
        let stall_roll = self.rng.next_f64();
        let stall_len = self.rng.next_f64();
        let Some(c) = self.conns.get_mut(&conn) else {
            return out;
        };
        c.reading = false;
        if c.closed_reported || c.client_closed {
            c.queue.clear();
            return out;
        }
        if c.reader.per_frame.is_zero() {
            out.frames.extend(c.queue.drain(..));
        } else if let Some(f) = c.queue.pop_front() {
            out.frames.push(f);
        }
        if c.full && c.queue.len() <= c.cap / 2 {
            c.full = false;
            out.drained = true;
        }
        if !c.queue.is_empty() {
            c.reading = true;
            let mut next = c.reader.per_frame;
            if stall_roll < c.reader.stall_p {
                next += c.reader.stall_max.mul_f64(stall_len);
            }
            out.next_after = Some(next);
        }
        out
    }

    /// Every reader keeps up from now on (the liveness phase). Returns the
    /// connections whose queued frames must be read now.
    pub fn heal(&mut self) -> Vec<ConnId> {
        let mut flush = Vec::new();
        for (&id, c) in self.conns.iter_mut() {
            c.reader = Reader::FAST;
            if !c.queue.is_empty() || c.full {
                flush.push(id);
            }
        }
        flush
    }

    /// Live (not reported closed) connections of Host generation `host_gen`.
    pub fn live(&self, host_gen: u64) -> impl Iterator<Item = (&ConnId, &NetConn)> {
        self.conns
            .iter()
            .filter(move |(_, c)| c.host_gen == host_gen && !c.closed_reported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> NetOptions {
        NetOptions {
            delay_min: Duration::from_millis(1),
            delay_max: Duration::from_millis(9),
            slow_reader_p: 0.0,
            stall_p: 0.0,
            stall_max: Duration::from_secs(1),
            queue_cap: (4, 4),
        }
    }

    #[test]
    fn frames_arrive_in_order_and_slow_queues_fill_then_drain() {
        let mut n = Net::new(opts(), Rng::new(1));
        let slow = Reader {
            per_frame: Duration::from_millis(5),
            stall_p: 0.0,
            stall_max: Duration::ZERO,
        };
        let c = n.open(0, 0, Transport::WebSocket, slow);
        let mut last = Instant::ZERO;
        for _ in 0..50 {
            let at = n.arrival(c, Instant::from_millis(1));
            assert!(at >= last);
            last = at;
        }
        let p = n.push(c, "a".into());
        assert!(p.deliver.is_none() && p.read_after.is_some());
        for i in 0..3 {
            let p = n.push(c, format!("{i}"));
            assert_eq!(p.became_full, i == 2);
        }
        let r = n.read(c);
        assert_eq!(r.frames, vec!["a".to_string()]);
        assert!(!r.drained);
        let r = n.read(c);
        assert!(r.drained, "down to half the capacity");
        let fast = n.open(0, 0, Transport::WebSocket, Reader::FAST);
        assert_eq!(n.push(fast, "x".into()).deliver.as_deref(), Some("x"));
    }
}
