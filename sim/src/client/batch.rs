//! The simulated `batch` client: a batch job runner on `/ws`, every choice
//! drawn from its own seeded stream.
//!
//! Connected, it queues payloads of one to four raw prompts with random
//! `generation_config`s (`max_new_tokens`, `do_sample`, `temperature`,
//! `top_k`, `top_p`, `repetition_penalty`), `only_new_tokens` and
//! `stream_response`, several at once; continues batches of its own that
//! completed (the same ordered request ids, now and then with
//! `only_new_tokens: false`, or the same ids in another order, which is
//! another batch); puts a duplicate `request_id` into a payload now and
//! then; sends invalid payloads (garbage, no prompts, a bad config such as
//! `temperature: 9`, `num_beams: 2` with streaming, with a
//! `response_format`, with sampling or with a `length_penalty` past what
//! an f32 holds, `num_beams: 65` or more beams than the engine's
//! candidates allow (11 to 64 for the simulated model),
//! `early_stopping: "sometimes"`; their prompts are named `h<client>-<n>`,
//! which `batch_hostile` holds must be refused) and
//! binary frames; and hangs up early. Now and then a payload runs beam
//! search (`num_beams` 2 to 4, greedy, never streamed, with a
//! `length_penalty` and an `early_stopping` now and then).
//!
//! Request ids hold the client's index, so a continuation is always of this
//! client's own batch (which may have run on an earlier connection of it:
//! the Host's cache is keyed by ids alone; after a Host crash the cache is
//! gone and the prompts are used). Every prompt starts with the connection's
//! tag (`<c{conn}>`, see [`super`]); a continued batch's sequences carry the
//! tag of the connection they started on.
//!
//! In the liveness phase it starts nothing and waits for everything queued
//! to finish.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};
use tokenwire_core::dialect::batch::codec::{
    decode_events, encode_payload, EventKind, Payload, PromptEntry,
};
use tokenwire_core::rng::Rng;
use tokenwire_core::{ConnId, Dialect, Duration, Instant, Transport};

use super::base::{come_back_after, reconnect_after};
use super::{
    chance, conn_tag, garbage, text, think, ClientBase, ClientCx, ClientOp, Habits, SimClient,
};
use crate::swarm::Swarm;

/// A payload without an answer for this long is given up.
const GIVE_UP: Duration = Duration::from_secs(600);

/// A payload of this client in flight.
#[derive(Debug, Clone)]
struct Queued {
    /// Its ordered request ids.
    ids: Vec<String>,
    /// Ids not yet ended (COMPLETE or ERROR).
    open: BTreeSet<String>,
    /// Every prompt completed so far (an ERROR makes it not continuable).
    clean: bool,
    /// Last frame for it, or its sending.
    since: Instant,
}

/// One simulated `batch` user.
#[derive(Debug)]
pub struct BatchClient {
    /// Its index in the run.
    pub id: usize,
    rng: Rng,
    queued: Vec<Queued>,
    /// Batches of its own that completed (continuable), newest last.
    finished: Vec<Vec<String>>,
    next_req: u64,
    /// Batches sent under ids other clients use too.
    shared_serial: u64,
    /// Payloads it keeps in flight.
    most: usize,
    next_step: Option<Instant>,
    wake_at: Option<Instant>,
    /// Its connection, whether it stopped, its habits.
    base: ClientBase,
}

impl BatchClient {
    /// Client `id` of a run with `swarm`, drawing from `rng`.
    pub fn new(id: usize, swarm: &Swarm, mut rng: Rng) -> BatchClient {
        let habits = Habits::draw(&mut rng, swarm, true);
        let most = 1 + rng.below(4) as usize;
        BatchClient {
            id,
            rng,
            queued: Vec::new(),
            finished: Vec::new(),
            next_req: 0,
            shared_serial: 0,
            most,
            next_step: None,
            wake_at: None,
            base: ClientBase::new(habits),
        }
    }

    fn schedule(&mut self, now: Instant) -> Vec<ClientOp> {
        match self.next_step {
            Some(t) if self.wake_at != Some(t.max(now)) => {
                let t = t.max(now);
                self.wake_at = Some(t);
                vec![ClientOp::Wake(t - now)]
            }
            _ => Vec::new(),
        }
    }

    fn new_rid(&mut self) -> String {
        self.next_req += 1;
        format!("b{}-{}", self.id, self.next_req)
    }

    /// A valid `generation_config`.
    fn config(&mut self, cx: &ClientCx<'_>) -> Map<String, Value> {
        let sw = cx.swarm;
        let r = &mut self.rng;
        let mut o = Map::new();
        if chance(r, 0.9) {
            let cap = sw.mix.max_tokens_cap.min(sw.model.context_len / 4).max(1);
            o.insert("max_new_tokens".into(), json!(1 + r.below(u64::from(cap))));
        }
        if chance(r, 0.6) {
            o.insert("do_sample".into(), json!(chance(r, 0.5)));
        }
        if chance(r, 0.4) {
            let t = [0.0, 0.5, 1.0, 1.7][r.below(4) as usize];
            o.insert("temperature".into(), json!(t));
        }
        if chance(r, 0.3) {
            o.insert("top_k".into(), json!(r.below(60)));
        }
        if chance(r, 0.3) {
            o.insert("top_p".into(), json!([0.5, 0.9, 1.0][r.below(3) as usize]));
        }
        if chance(r, 0.3) {
            let p = [1.0, 1.2, 2.0][r.below(3) as usize];
            o.insert("repetition_penalty".into(), json!(p));
        }
        if chance(r, 0.1) {
            o.insert("num_beams".into(), json!(1));
        } else if chance(r, 0.12) {
            // Beam search: greedy, no repetition penalty (what it takes),
            // and never streamed (see `send`).
            o.insert("num_beams".into(), json!(2 + r.below(3)));
            o.insert("do_sample".into(), json!(false));
            o.remove("temperature");
            o.remove("repetition_penalty");
            if chance(r, 0.5) {
                let lp = [0.5, 1.0, 2.0][r.below(3) as usize];
                o.insert("length_penalty".into(), json!(lp));
            }
            if chance(r, 0.5) {
                let es = [json!(true), json!(false), json!("never")][r.below(3) as usize].clone();
                o.insert("early_stopping".into(), es);
            }
        }
        o
    }

    fn send(
        &mut self,
        cx: &ClientCx<'_>,
        ids: Vec<String>,
        config: Map<String, Value>,
    ) -> ClientOp {
        let tag = conn_tag(self.base.conn);
        let mut prompts: Vec<PromptEntry> = ids
            .iter()
            .map(|id| PromptEntry {
                request_id: id.clone(),
                prompt: format!("{tag}{}", text(&mut self.rng, 16)),
            })
            .collect();
        // Now and then a prompt that exactly fills the context with its
        // new tokens, or passes it by one: one byte is one token, after BOS.
        let max_new = config.get("max_new_tokens").and_then(Value::as_u64);
        if let (1, Some(max_new)) = (prompts.len(), max_new) {
            if chance(&mut self.rng, 0.06) {
                let over = self.rng.below(2);
                let room = u64::from(cx.swarm.model.context_len)
                    .saturating_sub(max_new + 1 + tag.len() as u64);
                prompts[0].prompt = format!("{tag}{}", "a".repeat((room + over) as usize));
            }
        }
        let only_new_tokens = !chance(&mut self.rng, 0.3);
        let beams = config
            .get("num_beams")
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1);
        let stream_response = !chance(&mut self.rng, 0.3) && !beams;
        let p = Payload {
            prompts,
            only_new_tokens,
            stream_response,
            generation_config: config,
        };
        let open: BTreeSet<String> = ids.iter().cloned().collect();
        let clean = open.len() == ids.len();
        self.queued.push(Queued {
            ids,
            open,
            clean,
            since: cx.now,
        });
        ClientOp::Text(encode_payload(&p))
    }

    /// A new batch, a continuation of a finished one, or one with a
    /// duplicate id.
    fn payload(&mut self, cx: &ClientCx<'_>) -> ClientOp {
        let config = self.config(cx);
        let in_flight: BTreeSet<String> = self.queued.iter().flat_map(|q| q.ids.clone()).collect();
        if !self.finished.is_empty() && chance(&mut self.rng, 0.35) {
            let i = self.rng.below(self.finished.len() as u64) as usize;
            if self.finished[i].iter().any(|id| in_flight.contains(id)) {
                // Its ids are live again in another payload (shared ids):
                // frames of two live prompts with one id cannot be told apart.
                let fresh = vec![self.new_rid()];
                return self.send(cx, fresh, config);
            }
            let mut ids = self.finished.swap_remove(i);
            if ids.len() > 1 && chance(&mut self.rng, 0.15) {
                // The same ids in another order: another key.
                ids.rotate_left(1);
            }
            return self.send(cx, ids, config);
        }
        let n = 1 + self.rng.below(4) as usize;
        // Now and then ids other clients use too (a common scheme that
        // counts from 1 per connection): what one connection kept must stay
        // its own. Counted per client, so two live prompts of one
        // connection never share an id (their frames could not be told
        // apart), while every client's k-th such batch does.
        let shared = chance(&mut self.rng, 0.15);
        let serial = self.shared_serial;
        self.shared_serial += u64::from(shared);
        let mut ids: Vec<String> = (0..n)
            .map(|i| {
                if shared {
                    format!("shared-{serial}-{i}")
                } else {
                    self.new_rid()
                }
            })
            .collect();
        if chance(&mut self.rng, 0.08) {
            let d = ids[self.rng.below(n as u64) as usize].clone();
            let at = self.rng.below(n as u64 + 1) as usize;
            ids.insert(at, d);
        }
        self.send(cx, ids, config)
    }

    fn hostile(&mut self) -> ClientOp {
        self.base.habits.hostile_sent += 1;
        let tag = conn_tag(self.base.conn);
        let rid = format!("h{}-{}", self.id, self.rng.below(1_000_000));
        let prompt = json!([{"request_id": rid, "prompt": format!("{tag}x")}]);
        let v = match self.rng.below(14) {
            0 => return ClientOp::Text(garbage(&mut self.rng)),
            1 => return ClientOp::Binary(1 + self.rng.below(256) as usize),
            2 => json!({"only_new_tokens": true}),
            3 => json!({"prompts": []}),
            4 => json!({"prompts": prompt, "generation_config": {"temperature": 9}}),
            5 => json!({"prompts": prompt, "generation_config": {"num_beams": 2},
                        "stream_response": true}),
            // Past the contract's range, or within it but past what the
            // engine's candidates allow this model.
            6 => {
                let beams = match self.rng.below(2) {
                    0 => 65,
                    _ => 11 + self.rng.below(54),
                };
                json!({"prompts": prompt, "generation_config": {"num_beams": beams},
                       "stream_response": false})
            }
            // Beam search with a response format, or beam sampling.
            11 => json!({"prompts": prompt, "stream_response": false,
                         "generation_config": {"num_beams": 2, "do_sample": false,
                                               "response_format": {"type": "json_object"}}}),
            12 => json!({"prompts": prompt, "stream_response": false,
                         "generation_config": {"num_beams": 2, "do_sample": true}}),
            // Finite as JSON reads it, not as the f32 the search uses.
            13 => json!({"prompts": prompt, "stream_response": false,
                         "generation_config": {"num_beams": 2, "length_penalty": 1e39}}),
            7 => json!({"prompts": [{"request_id": rid}]}),
            8 => json!({"prompts": [{"request_id": "", "prompt": "x"}]}),
            9 => json!({"prompts": prompt, "generation_config": {"max_new_tokens": 0}}),
            _ => json!({"prompts": prompt, "generation_config": {"early_stopping": "sometimes"}}),
        };
        ClientOp::Text(v.to_string())
    }

    fn hang_up(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        self.base.habits.disconnects += 1;
        let Some(conn) = self.base.conn.take() else {
            return Vec::new();
        };
        self.queued.clear();
        let back = come_back_after(&mut self.rng, 0.8);
        self.next_step = Some(cx.now + back);
        let mut ops = vec![ClientOp::Close(conn)];
        ops.extend(self.schedule(cx.now));
        ops
    }

    fn step(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        let m = &cx.swarm.mix;
        let (hostile_p, disconnect_p) = (m.hostile_p, m.disconnect_p);
        let now = cx.now;
        self.queued.retain(|q| now < q.since + GIVE_UP);
        let mut ops = Vec::new();
        let x = self.rng.next_f64();
        if x < hostile_p {
            ops.push(self.hostile());
        } else if x < hostile_p + disconnect_p {
            return self.hang_up(cx);
        } else if self.queued.len() < self.most || chance(&mut self.rng, 0.05) {
            ops.push(self.payload(cx));
            while self.queued.len() < self.most && chance(&mut self.rng, 0.4) {
                ops.push(self.payload(cx));
            }
        }
        self.next_step = Some(cx.now + think(&mut self.rng, cx));
        ops
    }

    /// An event for one of its prompts.
    fn on_event(&mut self, now: Instant, rid: Option<&str>, kind: &EventKind) {
        let Some(rid) = rid else { return };
        let ended = matches!(kind, EventKind::Complete { .. } | EventKind::Error { .. });
        let Some(i) = self.queued.iter().position(|q| q.open.contains(rid)) else {
            return;
        };
        let q = &mut self.queued[i];
        q.since = now;
        if matches!(kind, EventKind::Error { .. }) {
            q.clean = false;
        }
        if ended {
            q.open.remove(rid);
        }
        if q.open.is_empty() {
            let q = self.queued.remove(i);
            if q.clean {
                self.finished.push(q.ids);
            }
        }
    }
}

impl SimClient for BatchClient {
    fn dialect(&self) -> Dialect {
        Dialect::Batch
    }

    fn transport(&self) -> Transport {
        Transport::WebSocket
    }

    fn base(&self) -> &ClientBase {
        &self.base
    }

    fn base_mut(&mut self) -> &mut ClientBase {
        &mut self.base
    }

    fn act(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        self.wake_at = None;
        if self.base.stopped() {
            return Vec::new();
        }
        let mut ops = Vec::new();
        if self.next_step.is_none_or(|t| cx.now >= t) {
            if self.base.conn.is_none() {
                self.next_step = None;
                ops.push(ClientOp::Open(Transport::WebSocket));
                return ops;
            }
            ops.extend(self.step(cx));
        }
        ops.extend(self.schedule(cx.now));
        ops
    }

    fn on_open(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        if self.base.stopped() {
            return Vec::new();
        }
        let mut ops = self.step(cx);
        ops.extend(self.schedule(cx.now));
        ops
    }

    fn on_frame(&mut self, cx: &ClientCx<'_>, conn: ConnId, text: &str) -> Vec<ClientOp> {
        if !self.base.owns(conn) {
            return Vec::new();
        }
        let Ok(events) = decode_events(text) else {
            return Vec::new();
        };
        let before = self.queued.len();
        for e in &events {
            self.on_event(cx.now, e.request_id.as_deref(), &e.kind);
        }
        // A whole payload refused: its ids name no prompt in flight any more
        // (given up at the deadline otherwise).
        if events
            .iter()
            .all(|e| matches!(e.kind, EventKind::Error { .. }))
        {
            let ids: Vec<Option<&str>> = events.iter().map(|e| e.request_id.as_deref()).collect();
            if let Some(i) = self
                .queued
                .iter()
                .position(|q| q.ids.iter().map(|s| Some(s.as_str())).collect::<Vec<_>>() == ids)
            {
                self.queued.remove(i);
            }
        }
        if self.base.liveness {
            return Vec::new();
        }
        if self.queued.len() < before {
            // Room for the next payload soon.
            let soon = cx.now + think(&mut self.rng, cx) / 8;
            self.next_step = Some(self.next_step.map_or(soon, |t| t.min(soon)));
        }
        self.schedule(cx.now)
    }

    fn on_closed(&mut self, cx: &ClientCx<'_>, conn: ConnId, code: Option<u16>) -> Vec<ClientOp> {
        if !self.base.closed(conn, code) {
            return Vec::new();
        }
        self.queued.clear();
        if self.base.stopped() {
            return Vec::new();
        }
        let back = reconnect_after(&mut self.rng, Duration::from_secs(1));
        self.next_step = Some(cx.now + back);
        self.schedule(cx.now)
    }
}
