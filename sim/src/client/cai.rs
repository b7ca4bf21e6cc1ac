//! The simulated `cai` client: a voice or chat front end on `/`, every choice
//! drawn from its own seeded stream.
//!
//! It opens each connection with credentials in the query string
//! (`authorization=Bearer%20<key>&orgId=<org>`), now and then bad ones (an
//! unknown key, no key, no `orgId`, an organisation its key may not act for),
//! and then waits for the close. Connected, it sends `COMPLETION`s with
//! random options (`maxTokens`, `temperature`, `seed`, `stream`, `window`,
//! `sentenceWindow`, `stop`), several in flight at once (sometimes more than
//! the server allows), in conversations (`conversationId`: continued without
//! a context, or with one that replaces the kept one), interrupts them
//! (`INTERRUPTED`), acknowledges chunks with `AWAIT_MORE` eagerly, late or
//! never, and, as a text-to-speech client, completes each sentence
//! (`SENTENCE_COMPLETED`) once it has had time to say it. It also sends
//! malformed and hostile frames (unknown types, bad options, duplicate
//! in-flight ids, acknowledgements of chunks never sent, unknown ids) and
//! hangs up early.
//!
//! Every prompt is tagged with the connection (`<c{conn}>`, see
//! [`super`]): the `context` starts with a system message holding the tag,
//! a conversation id starts with the tag (so a conversation continued without
//! a context starts with this connection's tag too), and the prompt itself
//! starts with it (for a continued conversation the Host forgot).
//!
//! In the liveness phase it starts nothing and acknowledges every chunk and
//! sentence it has and gets, so that every request can finish; a client
//! that never acknowledges keeps to that, and its windowed requests must
//! then be ended by the pause timeout.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use tokenwire_core::dialect::cai::codec::{self, ClientMessage, Completion};
use tokenwire_core::rng::Rng;
use tokenwire_core::{ChatMessage, ConnId, Dialect, Duration, Instant, Role, Transport};

use super::base::{come_back_after, reconnect_after};
use super::{
    chance, conn_tag, garbage, text, think, ClientBase, ClientCx, ClientOp, Habits, SimClient,
};
use crate::swarm::{between, Swarm};

/// A request without a frame for this long is given up (its end was taken
/// for a hostile frame's error, or it was lost with a connection).
const GIVE_UP: Duration = Duration::from_secs(600);

/// How a client acknowledges chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acks {
    /// As soon as half its window is unacknowledged.
    Eager,
    /// A while after chunks arrive.
    Lagging,
    /// Never (a request with a window then waits for the pause timeout).
    Never,
}

/// A request in flight, as the client follows it.
#[derive(Debug, Clone)]
struct Req {
    /// Its chunk window, once it has one (`options.window`, or 32 after an
    /// `AWAIT_MORE`).
    window: Option<u64>,
    /// It asked for a sentence window.
    sentence_window: bool,
    /// Chunks seen (the next index).
    chunks: u64,
    /// Chunks acknowledged.
    acked: u64,
    /// It acknowledges chunks.
    acks: bool,
    /// An `AWAIT_MORE` is on the agenda.
    ack_due: bool,
    /// The last frame for it (or its sending).
    since: Instant,
}

/// Something to send later.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    /// `AWAIT_MORE` for the chunks seen by then.
    AckChunks(String),
    /// `SENTENCE_COMPLETED` for a sentence said.
    Sentence(String, u64),
}

/// One simulated `cai` user.
#[derive(Debug)]
pub struct CaiClient {
    /// Its index in the run.
    pub id: usize,
    rng: Rng,
    /// The query string of the next (or current) connection.
    query: String,
    /// The current connection opened with credentials the server must refuse.
    bad: bool,
    reqs: BTreeMap<String, Req>,
    /// Streams started on this connection and not known to be over:
    /// (chunks, sentences) seen, for the acknowledgements of the liveness phase.
    streams: BTreeMap<String, (u64, u64)>,
    /// Ids of this connection's requests that ended (to use again).
    ended: Vec<String>,
    /// Errors to come for hostile messages naming a request in flight.
    expected: BTreeMap<String, u32>,
    /// This connection's conversation ids.
    convs: Vec<String>,
    next_req: u64,
    next_conv: u64,
    /// Frames to send later, by time.
    agenda: BTreeMap<(Instant, u64), Item>,
    agenda_seq: u64,
    /// The next regular action.
    next_step: Option<Instant>,
    /// The wake-up asked for last.
    wake_at: Option<Instant>,
    /// Requests it keeps in flight.
    most: usize,
    acks: Acks,
    /// A speaking client: time to say one character.
    speaker: Option<Duration>,
    /// When its voice is free again.
    speaking_until: Instant,
    /// Its connection, whether it stopped, its habits.
    base: ClientBase,
}

/// `%`-escapes a query value.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl CaiClient {
    /// Client `id` of a run with `swarm`, drawing from `rng`.
    pub fn new(id: usize, swarm: &Swarm, mut rng: Rng) -> CaiClient {
        let habits = Habits::draw(&mut rng, swarm, true);
        let most = 1 + rng.below(6) as usize;
        let acks = match rng.below(5) {
            0 | 1 => Acks::Eager,
            2 | 3 => Acks::Lagging,
            _ => Acks::Never,
        };
        let speaker = chance(&mut rng, 0.4).then(|| {
            let us = [50u64, 500, 5_000][rng.below(3) as usize];
            Duration::from_micros(us)
        });
        let mut c = CaiClient {
            id,
            rng,
            query: String::new(),
            bad: false,
            reqs: BTreeMap::new(),
            streams: BTreeMap::new(),
            ended: Vec::new(),
            expected: BTreeMap::new(),
            convs: Vec::new(),
            next_req: 0,
            next_conv: 0,
            agenda: BTreeMap::new(),
            agenda_seq: 0,
            next_step: None,
            wake_at: None,
            most,
            acks,
            speaker,
            speaking_until: Instant::ZERO,
            base: ClientBase::new(habits),
        };
        c.choose_credentials(swarm);
        c
    }

    /// Picks the credentials of the next connection: good ones mostly, in
    /// each accepted spelling; now and then ones the server must refuse.
    fn choose_credentials(&mut self, swarm: &Swarm) {
        let keys = &swarm.cai.keys;
        let orgs = &swarm.cai.orgs;
        let r = &mut self.rng;
        let good = |r: &mut Rng| -> (String, String) {
            if keys.is_empty() {
                return ("sk-sim-limited".into(), "org_a".into());
            }
            let k = &keys[r.below(keys.len() as u64) as usize];
            let org = k.orgs[r.below(k.orgs.len() as u64) as usize].clone();
            (k.secret.clone(), org)
        };
        let auth = |r: &mut Rng, key: &str| -> String {
            match r.below(4) {
                0 => format!("authorization={}", escape(key)),
                1 => format!("authorization=bearer+{}", escape(key)),
                _ => format!("authorization=Bearer%20{}", escape(key)),
            }
        };
        self.bad = chance(r, 0.12);
        if !self.bad {
            let (key, org) = good(r);
            let a = auth(r, &key);
            self.query = if chance(r, 0.2) {
                format!("orgId={}&{a}&v=1", escape(&org))
            } else {
                format!("{a}&orgId={}", escape(&org))
            };
            return;
        }
        let (key, org) = good(r);
        self.query = match r.below(7) {
            0 => format!("{}&orgId={}", auth(r, "sk-nope"), escape(&org)),
            6 => {
                // A real key one character off: changed, dropped or added.
                let off = one_off(r, &key);
                format!("{}&orgId={}", auth(r, &off), escape(&org))
            }
            1 => format!("orgId={}", escape(&org)),
            2 => format!("authorization=Bearer%20&orgId={}", escape(&org)),
            3 => auth(r, &key),
            4 => format!("{}&orgId=", auth(r, &key)),
            _ => {
                // An organisation the key may not act for (or nobody's).
                let allowed: Vec<&String> = keys
                    .iter()
                    .find(|k| k.secret == key)
                    .map(|k| k.orgs.iter().collect())
                    .unwrap_or_default();
                let others: Vec<&String> = orgs.iter().filter(|o| !allowed.contains(o)).collect();
                let org = others
                    .get(r.below(others.len().max(1) as u64) as usize)
                    .map_or("org_zzz".to_string(), |o| o.to_string());
                format!("{}&orgId={}", auth(r, &key), escape(&org))
            }
        };
    }

    fn at(&mut self, when: Instant, item: Item) {
        self.agenda_seq += 1;
        self.agenda.insert((when, self.agenda_seq), item);
    }

    /// The wake-up for the earliest thing to do, if it changed.
    fn schedule(&mut self, now: Instant) -> Vec<ClientOp> {
        let next = [self.next_step, self.agenda.keys().next().map(|k| k.0)]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) if self.wake_at != Some(t.max(now)) => {
                let t = t.max(now);
                self.wake_at = Some(t);
                vec![ClientOp::Wake(t - now)]
            }
            _ => Vec::new(),
        }
    }

    fn ack_chunks(&mut self, rid: &str, index: bool) -> Option<ClientOp> {
        let r = self.reqs.get_mut(rid)?;
        r.ack_due = false;
        if r.chunks == 0 || r.acked >= r.chunks {
            return None;
        }
        r.acked = r.chunks;
        r.window.get_or_insert(32);
        let last = index.then(|| r.chunks - 1);
        Some(ClientOp::Text(codec::encode_client(
            &ClientMessage::AwaitMore {
                request_id: rid.to_string(),
                last_received_index: last,
            },
        )))
    }

    fn sentence_done(rid: &str, index: u64) -> ClientOp {
        ClientOp::Text(codec::encode_client(&ClientMessage::SentenceCompleted {
            request_id: rid.to_string(),
            sentence_index: index,
        }))
    }

    /// Sends what the agenda holds up to `now` (everything in the liveness phase).
    fn due(&mut self, now: Instant) -> Vec<ClientOp> {
        let mut ops = Vec::new();
        while let Some(entry) = self.agenda.first_entry() {
            if entry.key().0 > now && !self.base.liveness {
                break;
            }
            let item = entry.remove();
            if self.base.conn.is_none() {
                continue;
            }
            match item {
                Item::AckChunks(rid) => {
                    let index = !chance(&mut self.rng, 0.3);
                    ops.extend(self.ack_chunks(&rid, index));
                }
                Item::Sentence(rid, i) => ops.push(Self::sentence_done(&rid, i)),
            }
        }
        ops
    }

    fn new_rid(&mut self) -> String {
        if !self.ended.is_empty() && chance(&mut self.rng, 0.05) {
            // A finished id may be used again.
            let i = self.rng.below(self.ended.len() as u64) as usize;
            return self.ended.swap_remove(i);
        }
        self.next_req += 1;
        format!("r{}-{}", self.id, self.next_req)
    }

    /// A context: the tag's system message, then a few turns now and then.
    fn context(&mut self) -> Vec<ChatMessage> {
        let mut ctx = vec![ChatMessage::new(Role::System, conn_tag(self.base.conn))];
        let turns = match self.rng.below(4) {
            0..=1 => 0,
            2 => 1,
            _ => 1 + self.rng.below(3),
        };
        for _ in 0..turns {
            if chance(&mut self.rng, 0.1) {
                ctx.push(ChatMessage::new(Role::System, text(&mut self.rng, 8)));
            }
            ctx.push(ChatMessage::new(Role::User, text(&mut self.rng, 10)));
            ctx.push(ChatMessage::new(Role::Assistant, text(&mut self.rng, 10)));
        }
        ctx
    }

    fn options(&mut self, cx: &ClientCx<'_>) -> Map<String, Value> {
        let sw = cx.swarm;
        let r = &mut self.rng;
        let mut o = Map::new();
        if chance(r, 0.85) {
            let cap = sw.mix.max_tokens_cap.min(sw.model.context_len / 3).max(1);
            o.insert("maxTokens".into(), json!(1 + r.below(u64::from(cap))));
        }
        if chance(r, 0.4) {
            let t = [0.0, 0.5, 1.0, 2.0][r.below(4) as usize];
            o.insert("temperature".into(), json!(t));
        }
        if chance(r, 0.3) {
            o.insert("seed".into(), json!(r.below(1000)));
        }
        if chance(r, 0.2) {
            o.insert("stream".into(), json!(false));
        } else if chance(r, 0.1) {
            o.insert("stream".into(), json!(true));
        }
        if chance(r, 0.25) {
            o.insert("window".into(), json!(1 + r.below(8)));
        }
        let sentences = if self.speaker.is_some() { 0.5 } else { 0.1 };
        if chance(r, sentences) {
            o.insert("sentenceWindow".into(), json!(1 + r.below(3)));
        }
        if chance(r, 0.15) {
            // One to four symbols: text that may start a longer stop string
            // is held back, and released (or not) at once later.
            let syms = &sw.engine.symbols;
            let stop: String = (0..1 + r.below(4))
                .map(|_| syms[r.below(syms.len() as u64) as usize].as_str())
                .collect();
            o.insert("stop".into(), json!([stop]));
        }
        if chance(r, 0.1) {
            o.insert("topP".into(), json!(0.9));
        }
        o
    }

    /// A `COMPLETION` (`rid` given: a duplicate of one in flight).
    fn completion(&mut self, cx: &ClientCx<'_>, dup: Option<String>) -> ClientOp {
        let tag = conn_tag(self.base.conn);
        let rid = match &dup {
            Some(r) => r.clone(),
            None => self.new_rid(),
        };
        let (conversation_id, context) = match self.rng.below(10) {
            0 | 1 if !self.convs.is_empty() => {
                let i = self.rng.below(self.convs.len() as u64) as usize;
                (Some(self.convs[i].clone()), None)
            }
            2 if !self.convs.is_empty() => {
                let i = self.rng.below(self.convs.len() as u64) as usize;
                (Some(self.convs[i].clone()), Some(self.context()))
            }
            3 => {
                self.next_conv += 1;
                let id = format!("{tag}conv-{}-{}", self.id, self.next_conv);
                self.convs.push(id.clone());
                (Some(id), Some(self.context()))
            }
            _ => (None, Some(self.context())),
        };
        let options = self.options(cx);
        let model = match self.rng.below(20) {
            0 | 1 => Some(cx.swarm.model.name.clone()),
            2 => Some("gpt-4".to_string()),
            _ => None,
        };
        let stream = options.get("stream").and_then(Value::as_bool) != Some(false);
        let window = options.get("window").and_then(Value::as_u64);
        let acks = stream
            && match self.acks {
                Acks::Never => false,
                _ => window.is_some() || chance(&mut self.rng, 0.5),
            };
        let sentence_window = options.contains_key("sentenceWindow");
        let msg = ClientMessage::Completion(Completion {
            request_id: rid.clone(),
            prompt: format!("{tag}{}", text(&mut self.rng, 20)),
            model,
            options,
            conversation_id,
            context,
        });
        if dup.is_some() {
            *self.expected.entry(rid).or_default() += 1;
        } else {
            self.reqs.insert(
                rid,
                Req {
                    window,
                    sentence_window,
                    chunks: 0,
                    acked: 0,
                    acks,
                    ack_due: false,
                    since: cx.now,
                },
            );
        }
        ClientOp::Text(codec::encode_client(&msg))
    }

    fn pick_live(&mut self) -> Option<String> {
        if self.reqs.is_empty() {
            return None;
        }
        let i = self.rng.below(self.reqs.len() as u64) as usize;
        self.reqs.keys().nth(i).cloned()
    }

    /// A malformed or hostile message.
    fn hostile(&mut self, cx: &ClientCx<'_>) -> ClientOp {
        self.base.habits.hostile_sent += 1;
        let fresh = format!("h{}-{}", self.id, self.rng.below(1_000_000));
        let tag = conn_tag(self.base.conn);
        let v = match self.rng.below(15) {
            0 => return ClientOp::Text(garbage(&mut self.rng)),
            1 => return ClientOp::Binary(1 + self.rng.below(512) as usize),
            2 => return ClientOp::TooLarge,
            3 => json!({"type": "HELLO", "requestId": fresh}),
            4 => json!({"type": "COMPLETION", "requestId": fresh}),
            5 => {
                let bad = match self.rng.below(5) {
                    0 => json!({"temperature": 3}),
                    1 => json!({"window": 0}),
                    2 => json!({"stream": "yes"}),
                    3 => json!({"maxTokens": 0}),
                    _ => json!({"sentenceWindow": -1}),
                };
                json!({"type": "COMPLETION", "requestId": fresh,
                       "payload": {"prompt": format!("{tag}x"), "options": bad}})
            }
            6 => json!({"type": "COMPLETION", "requestId": fresh,
                        "payload": {"prompt": "x", "context": [{"role": "robot", "content": "x"}]}}),
            7 => json!({"type": "INTERRUPTED", "requestId": fresh}),
            8 => {
                json!({"type": "AWAIT_MORE", "requestId": fresh, "payload": {"lastReceivedIndex": 0}})
            }
            9 => match self.pick_live() {
                Some(rid) => {
                    *self.expected.entry(rid.clone()).or_default() += 1;
                    json!({"type": "SENTENCE_COMPLETED", "requestId": rid, "payload": {}})
                }
                None => json!({"type": "SENTENCE_COMPLETED", "requestId": fresh, "payload": {}}),
            },
            10 => match self.pick_live() {
                Some(rid) => return self.completion(cx, Some(rid)),
                None => json!({"type": "COMPLETION", "requestId": "", "payload": {"prompt": "x"}}),
            },
            11 => match self.pick_live() {
                Some(rid) => {
                    // Chunks never sent: far beyond, or (when its window
                    // is full, so that no chunk can be on its way) the
                    // first index past what it received.
                    *self.expected.entry(rid.clone()).or_default() += 1;
                    let beyond = match self.reqs.get(&rid) {
                        Some(r) if r.window.is_some_and(|w| r.chunks >= r.acked + w) => r.chunks,
                        Some(r) => r.chunks + 1000,
                        None => 1000,
                    };
                    json!({"type": "AWAIT_MORE", "requestId": rid,
                           "payload": {"lastReceivedIndex": beyond}})
                }
                None => json!({"type": "AWAIT_MORE", "requestId": fresh}),
            },
            12 => json!({"type": "COMPLETION", "requestId": "", "payload": {"prompt": "x"}}),
            13 => json!({"type": "COMPLETION", "requestId": fresh,
                         "payload": {"prompt": format!("{tag}x"), "conversationId": ""}}),
            _ => json!({"type": "COMPLETION", "requestId": fresh,
                        "payload": {"prompt": format!("{tag}x"), "model": "gpt-4"}}),
        };
        ClientOp::Text(v.to_string())
    }

    fn hang_up(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        self.base.habits.disconnects += 1;
        let Some(conn) = self.base.conn.take() else {
            return Vec::new();
        };
        self.lost(cx);
        let back = come_back_after(&mut self.rng, 0.8);
        self.next_step = Some(cx.now + back);
        let mut ops = vec![ClientOp::Close(conn)];
        ops.extend(self.schedule(cx.now));
        ops
    }

    /// The connection is gone: so is everything it held.
    fn lost(&mut self, cx: &ClientCx<'_>) {
        self.reqs.clear();
        self.streams.clear();
        self.ended.clear();
        self.expected.clear();
        self.convs.clear();
        self.agenda.clear();
        self.speaking_until = Instant::ZERO;
        self.choose_credentials(cx.swarm);
    }

    /// Forgets requests nothing was heard of for long.
    fn give_up(&mut self, now: Instant) {
        self.reqs.retain(|_, r| now < r.since + GIVE_UP);
    }

    /// A regular action on an open connection.
    fn step(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        let m = &cx.swarm.mix;
        let (hostile_p, disconnect_p, control_p) = (m.hostile_p, m.disconnect_p, m.control_p);
        self.give_up(cx.now);
        let mut ops = Vec::new();
        let x = self.rng.next_f64();
        if x < hostile_p {
            ops.push(self.hostile(cx));
        } else if x < hostile_p + disconnect_p {
            return self.hang_up(cx);
        } else if x < hostile_p + disconnect_p + control_p * 0.5 && !self.reqs.is_empty() {
            let rid = match self.pick_live() {
                Some(r) if !chance(&mut self.rng, 0.1) => r,
                _ => format!("nope-{}", self.id),
            };
            ops.push(ClientOp::Text(codec::encode_client(
                &ClientMessage::Interrupted { request_id: rid },
            )));
        } else if self.reqs.len() < self.most || chance(&mut self.rng, 0.05) {
            ops.push(self.completion(cx, None));
            while self.reqs.len() < self.most && chance(&mut self.rng, 0.3) {
                ops.push(self.completion(cx, None));
            }
        }
        self.next_step = Some(cx.now + think(&mut self.rng, cx));
        ops
    }

    /// What a chunk, a sentence or an end does to a request.
    fn on_stream_frame(&mut self, now: Instant, v: &Value) -> Vec<ClientOp> {
        let rid = v["requestId"].as_str().unwrap_or("").to_string();
        let mut ops = Vec::new();
        match v["type"].as_str().unwrap_or("") {
            "STREAM_START" => {
                self.streams.entry(rid.clone()).or_insert((0, 0));
                if let Some(r) = self.reqs.get_mut(&rid) {
                    r.since = now;
                }
            }
            "CONTENT_CHUNK" => {
                let index = v["payload"]["index"].as_u64().unwrap_or(0);
                self.streams.entry(rid.clone()).or_insert((0, 0)).0 = index + 1;
                if self.base.liveness && self.acks != Acks::Never {
                    ops.push(ClientOp::Text(codec::encode_client(
                        &ClientMessage::AwaitMore {
                            request_id: rid.clone(),
                            last_received_index: Some(index),
                        },
                    )));
                }
                let Some(r) = self.reqs.get_mut(&rid) else {
                    return ops;
                };
                r.since = now;
                r.chunks = r.chunks.max(index + 1);
                if self.base.liveness || !r.acks || r.ack_due {
                    return ops;
                }
                let unacked = r.chunks - r.acked;
                let half = (r.window.unwrap_or(32) / 2).max(1);
                match self.acks {
                    Acks::Eager if unacked >= half => {
                        let index = !chance(&mut self.rng, 0.2);
                        ops.extend(self.ack_chunks(&rid, index));
                    }
                    Acks::Lagging => {
                        r.ack_due = true;
                        let after = between(
                            &mut self.rng,
                            Duration::from_millis(1),
                            Duration::from_millis(400),
                        );
                        self.at(now + after, Item::AckChunks(rid));
                    }
                    _ => {}
                }
            }
            "SENTENCE_BOUNDARY" => {
                let index = v["payload"]["sentenceIndex"].as_u64().unwrap_or(0);
                let said = v["payload"]["sentence"]
                    .as_str()
                    .map_or(0, |s| s.chars().count());
                self.streams.entry(rid.clone()).or_insert((0, 0)).1 = index + 1;
                if self.base.liveness {
                    if self.acks != Acks::Never {
                        ops.push(Self::sentence_done(&rid, index));
                    }
                    return ops;
                }
                let windowed = self.reqs.get(&rid).is_some_and(|r| r.sentence_window);
                if let Some(r) = self.reqs.get_mut(&rid) {
                    r.since = now;
                }
                match self.speaker {
                    Some(pace) => {
                        let start = self.speaking_until.max(now);
                        let done = start + pace * u32::try_from(said).unwrap_or(u32::MAX);
                        self.speaking_until = done;
                        self.at(done, Item::Sentence(rid, index));
                    }
                    None if windowed && self.acks != Acks::Never => {
                        ops.push(Self::sentence_done(&rid, index))
                    }
                    None => {}
                }
            }
            "STREAM_COMPLETE" | "INTERRUPTED_ACK" => {
                self.streams.remove(&rid);
                if self.reqs.remove(&rid).is_some() {
                    self.ended.push(rid);
                }
            }
            _ => {}
        }
        ops
    }

    fn on_error(&mut self, cx: &ClientCx<'_>, v: &Value) {
        let Some(rid) = v["requestId"].as_str() else {
            return;
        };
        if let Some(n) = self.expected.get_mut(rid) {
            if *n > 0 {
                *n -= 1;
                return;
            }
        }
        if self.reqs.remove(rid).is_some() {
            self.ended.push(rid.to_string());
        }
        let wait = v["error"]["details"]["retryAfterMs"].as_u64();
        if let (Some(ms), false) = (wait, self.base.liveness) {
            // A polite client waits as told, now and then.
            if chance(&mut self.rng, 0.5) {
                let until = cx.now + Duration::from_millis(ms.min(120_000));
                self.next_step = Some(self.next_step.map_or(until, |t| t.max(until)));
            }
        }
    }
}

impl SimClient for CaiClient {
    fn dialect(&self) -> Dialect {
        Dialect::Cai
    }

    fn transport(&self) -> Transport {
        Transport::WebSocket
    }

    fn query(&self) -> String {
        self.query.clone()
    }

    fn base(&self) -> &ClientBase {
        &self.base
    }

    fn base_mut(&mut self) -> &mut ClientBase {
        &mut self.base
    }

    fn act(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        self.wake_at = None;
        if self.base.gone {
            return Vec::new();
        }
        let mut ops = self.due(cx.now);
        if self.base.liveness {
            return ops;
        }
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
        let mut ops = Vec::new();
        if self.bad {
            // Refused at the opening: wait for the close (a frame sent
            // meanwhile reaches nobody).
            self.base.habits.hostile_sent += 1;
            if chance(&mut self.rng, 0.3) {
                ops.push(self.completion(cx, None));
            }
            self.next_step = Some(cx.now + Duration::from_secs(5));
        } else {
            ops.extend(self.step(cx));
        }
        ops.extend(self.schedule(cx.now));
        ops
    }

    fn on_frame(&mut self, cx: &ClientCx<'_>, conn: ConnId, text: &str) -> Vec<ClientOp> {
        if !self.base.owns(conn) {
            return Vec::new();
        }
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Vec::new();
        };
        let mut ops = match v["type"].as_str().unwrap_or("") {
            "ERROR" => {
                self.on_error(cx, &v);
                Vec::new()
            }
            kind => {
                let ended = matches!(kind, "STREAM_COMPLETE" | "INTERRUPTED_ACK");
                let ops = self.on_stream_frame(cx.now, &v);
                if ended && !self.base.liveness {
                    // Room for the next request soon.
                    let soon = cx.now + think(&mut self.rng, cx) / 8;
                    self.next_step = Some(self.next_step.map_or(soon, |t| t.min(soon)));
                }
                ops
            }
        };
        if !self.base.liveness {
            ops.extend(self.schedule(cx.now));
        }
        ops
    }

    fn on_closed(&mut self, cx: &ClientCx<'_>, conn: ConnId, code: Option<u16>) -> Vec<ClientOp> {
        if !self.base.closed(conn, code) {
            return Vec::new();
        }
        self.lost(cx);
        if self.base.stopped() {
            return Vec::new();
        }
        let back = match code {
            // No keys file: nothing will change soon.
            Some(1008) if self.bad || cx.swarm.cai.keys.is_empty() => between(
                &mut self.rng,
                Duration::from_secs(5),
                Duration::from_secs(60),
            ),
            Some(4001..=4003) => between(
                &mut self.rng,
                Duration::from_millis(1),
                Duration::from_secs(3),
            ),
            _ => reconnect_after(&mut self.rng, Duration::from_secs(1)),
        };
        self.next_step = Some(cx.now + back);
        self.schedule(cx.now)
    }

    fn start_liveness(&mut self) -> Vec<ClientOp> {
        self.base.liveness = true;
        let mut ops = Vec::new();
        // A client that never acknowledges keeps to it: its windowed
        // requests must then end by the pause timeout, which the liveness
        // phase outlasts.
        if self.base.conn.is_none() || self.acks == Acks::Never {
            return ops;
        }
        // Everything seen so far is acknowledged (what the agenda holds is
        // sent at the next wake-up).
        for (rid, (chunks, sentences)) in &self.streams {
            ops.push(ClientOp::Text(codec::encode_client(
                &ClientMessage::AwaitMore {
                    request_id: rid.clone(),
                    last_received_index: None,
                },
            )));
            if *chunks == 0 {
                continue;
            }
            if let Some(last) = sentences.checked_sub(1) {
                ops.push(Self::sentence_done(rid, last));
            }
        }
        for item in std::mem::take(&mut self.agenda).into_values() {
            if let Item::Sentence(rid, i) = item {
                ops.push(Self::sentence_done(&rid, i));
            }
        }
        ops
    }
}

/// `key` with one character changed, dropped or added, at a random place.
fn one_off(r: &mut Rng, key: &str) -> String {
    let mut chars: Vec<char> = key.chars().collect();
    let at = r.below(chars.len() as u64 + 1) as usize;
    match r.below(3) {
        0 if at < chars.len() => chars[at] = if chars[at] == 'x' { 'y' } else { 'x' },
        1 if at < chars.len() => {
            chars.remove(at);
        }
        _ => chars.insert(at, 'q'),
    }
    chars.into_iter().collect()
}
