//! The simulated `responses` client: a user of `/v1/responses` (the OpenAI
//! Responses API WebSocket mode), every choice drawn from its own seeded
//! stream.
//!
//! It creates responses from a string or from input items, with random
//! parameters, instructions, metadata and a `stream_id`; continues its last
//! one with `previous_response_id`; warms up with `generate: false`; cancels
//! responses in flight; and sends hostile frames: concurrent creates (409),
//! `previous_response_id`s that must not resolve (one of an earlier
//! connection, one that failed, an invented one), unknown event types,
//! malformed JSON, binary and oversized frames. It hangs up early, moves to a
//! new connection when told `connection_expiring`, and backs off when
//! refused at the connection limit. The server answers a connection's frames
//! in order, so the client keeps what it sent in a queue and each answer
//! settles the oldest. Every conversation starts with the connection tag
//! (`<c{conn}>`): in the instructions when it has some, in its first input
//! message otherwise.

use std::collections::VecDeque;

use serde_json::{json, Map, Value};
use tokenwire_core::rng::Rng;
use tokenwire_core::{ConnId, Dialect, Duration, Transport};

use super::base::{come_back_after, reconnect_after};
use super::{
    chance, conn_tag, garbage, text, think, ClientBase, ClientCx, ClientOp, Habits, SimClient,
};
use crate::swarm::{between, Swarm};

/// A frame sent and not yet answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// `response.create`: a `response.created` or an error answers it.
    Create,
    /// `response.cancel`: the response's terminal event or an error.
    Cancel,
    /// Anything else: an error.
    Other,
}

/// One simulated `/v1/responses` user.
#[derive(Debug)]
pub struct ResponsesClient {
    /// Its index in the run.
    pub id: usize,
    rng: Rng,
    sent: VecDeque<Sent>,
    /// The response in flight, once created.
    streaming: Option<String>,
    /// This connection's last response that ended completed or incomplete.
    latest: Option<String>,
    /// Ids that must not resolve on this connection: of earlier
    /// connections, of failed responses.
    stale: Vec<String>,
    /// An id that no longer resolves here that the next create continues
    /// anyway, as a client would that retries after a failure or carries a
    /// conversation over to a new connection (it must get a 404).
    retry_prev: Option<String>,
    /// Told `connection_expiring`: move to a new connection soon.
    expiring: bool,
    /// Refused at the connection limit: wait longer before trying again.
    refused: bool,
    /// Its connection, whether it stopped, its habits.
    base: ClientBase,
}

impl ResponsesClient {
    /// Client `id` of a run with `swarm`, drawing from `rng`.
    pub fn new(id: usize, swarm: &Swarm, mut rng: Rng) -> ResponsesClient {
        let habits = Habits::draw(&mut rng, swarm, true);
        ResponsesClient {
            id,
            rng,
            sent: VecDeque::new(),
            streaming: None,
            latest: None,
            stale: Vec::new(),
            retry_prev: None,
            expiring: false,
            refused: false,
            base: ClientBase::new(habits),
        }
    }

    /// True while a create is unanswered or a response is in flight.
    fn busy(&self) -> bool {
        self.streaming.is_some() || self.sent.contains(&Sent::Create)
    }

    fn send(&mut self, what: Sent, v: Value) -> ClientOp {
        self.sent.push_back(what);
        ClientOp::Text(v.to_string())
    }

    /// The new input: a string, or message items (with a tool output now
    /// and then); it starts with the tag when it starts a conversation.
    /// Now and then it is longer alone than the model's context of
    /// `context_len` tokens (`context_length_exceeded`).
    fn input(&mut self, first: bool, context_len: u32) -> Value {
        let tag = if first {
            conn_tag(self.base.conn)
        } else {
            String::new()
        };
        let body = if chance(&mut self.rng, 0.03) {
            "z".repeat(context_len as usize + 1)
        } else {
            text(&mut self.rng, 20)
        };
        let said = format!("{tag}{body}");
        if chance(&mut self.rng, 0.5) {
            return json!(said);
        }
        let content = if chance(&mut self.rng, 0.5) {
            json!(said)
        } else {
            json!([{"type": "input_text", "text": said},
                   {"type": "input_text", "text": text(&mut self.rng, 6)}])
        };
        let mut items = Vec::new();
        if !first && chance(&mut self.rng, 0.2) {
            // An earlier answer the client carries itself: it stays a
            // message of its own, apart from the user's after it.
            items.push(json!({"type": "message", "role": "assistant",
                              "content": text(&mut self.rng, 8)}));
        }
        items.push(json!({"type": "message", "role": "user", "content": content}));
        if chance(&mut self.rng, 0.2) {
            items.push(json!({"type": "function_call_output", "call_id": "call_1",
                              "output": text(&mut self.rng, 8)}));
        }
        if chance(&mut self.rng, 0.2) {
            items.push(json!({"role": "developer", "content": text(&mut self.rng, 8)}));
        }
        Value::Array(items)
    }

    fn create(&mut self, cx: &ClientCx<'_>, prev: Option<String>) -> ClientOp {
        let sw = cx.swarm;
        let mut v = Map::new();
        v.insert("type".into(), json!("response.create"));
        let instructions = chance(&mut self.rng, 0.2);
        if instructions {
            let said = format!("{}{}", conn_tag(self.base.conn), text(&mut self.rng, 12));
            v.insert("instructions".into(), json!(said));
        }
        // A conversation's first input carries the tag too: a continuation
        // without instructions starts with it.
        v.insert(
            "input".into(),
            self.input(prev.is_none(), sw.model.context_len),
        );
        if let Some(p) = prev {
            v.insert("previous_response_id".into(), json!(p));
        }
        if chance(&mut self.rng, 0.85) {
            let cap = sw.mix.max_tokens_cap.min(sw.model.context_len / 3).max(1);
            v.insert(
                "max_output_tokens".into(),
                json!(1 + self.rng.below(u64::from(cap))),
            );
        }
        if chance(&mut self.rng, 0.4) {
            let t = [0, 1, 2][self.rng.below(3) as usize];
            v.insert("temperature".into(), json!(t));
        }
        if chance(&mut self.rng, 0.2) {
            v.insert("top_p".into(), json!(0.9));
        }
        if chance(&mut self.rng, 0.1) {
            v.insert("generate".into(), json!(false));
        }
        if chance(&mut self.rng, 0.2) {
            v.insert("stream_id".into(), json!(self.rng.below(100)));
        }
        if chance(&mut self.rng, 0.15) {
            // Up to the API's 16 keys, the bound included.
            let n = 1 + self.rng.below(16);
            let m: Map<String, Value> = (0..n)
                .map(|i| (format!("k{i}"), json!(text(&mut self.rng, 4))))
                .collect();
            v.insert("metadata".into(), Value::Object(m));
        }
        if chance(&mut self.rng, 0.2) {
            v.insert("model".into(), json!(sw.model.name));
        } else if chance(&mut self.rng, 0.03) {
            // A model this server does not serve: `model_not_found`.
            v.insert("model".into(), json!(format!("not-{}", sw.model.name)));
        }
        if chance(&mut self.rng, 0.1) {
            v.insert("store".into(), json!(false));
        }
        if chance(&mut self.rng, 0.1) {
            // The SDKs may nest the body under `response`.
            let mut outer = Map::new();
            outer.insert("type".into(), json!("response.create"));
            v.remove("type");
            outer.insert("response".into(), Value::Object(v));
            return self.send(Sent::Create, Value::Object(outer));
        }
        self.send(Sent::Create, Value::Object(v))
    }

    /// A malformed or hostile frame.
    fn hostile(&mut self, cx: &ClientCx<'_>) -> ClientOp {
        self.base.habits.hostile_sent += 1;
        match self.rng.below(12) {
            0 => {
                self.sent.push_back(Sent::Other);
                ClientOp::Text(garbage(&mut self.rng))
            }
            1 => {
                self.sent.push_back(Sent::Other);
                ClientOp::Binary(1 + self.rng.below(512) as usize)
            }
            2 => ClientOp::TooLarge,
            3 => self.send(Sent::Other, json!({"type": "response.steer", "input": "x"})),
            4 => self.send(Sent::Other, json!({"input": "no type"})),
            5 => self.send(Sent::Other, json!({"type": "response.create", "input": 5})),
            6 => self.send(
                Sent::Other,
                json!({"type": "response.create", "input": "x", "temperature": 7}),
            ),
            7 => self.send(
                Sent::Other,
                json!({"type": "response.create", "input": [{"type": "image", "url": "x"}]}),
            ),
            8 => {
                let id = if self.stale.is_empty() || chance(&mut self.rng, 0.3) {
                    "resp_nope".to_string()
                } else {
                    self.stale[self.rng.below(self.stale.len() as u64) as usize].clone()
                };
                self.create(cx, Some(id))
            }
            9 => {
                let id = match &self.streaming {
                    Some(id) if chance(&mut self.rng, 0.5) => format!("{id}x"),
                    _ => "resp_other".into(),
                };
                self.send(
                    Sent::Cancel,
                    json!({"type": "response.cancel", "response_id": id}),
                )
            }
            10 => self.send(
                Sent::Other,
                json!({"type": "response.retrieve", "response_id": "r"}),
            ),
            _ => self.create(cx, None),
        }
    }

    fn hang_up(&mut self, soon: bool) -> Vec<ClientOp> {
        self.base.habits.disconnects += u64::from(!soon);
        self.lost();
        let Some(conn) = self.base.conn.take() else {
            return Vec::new();
        };
        let back = if soon {
            between(
                &mut self.rng,
                Duration::from_millis(1),
                Duration::from_secs(2),
            )
        } else {
            come_back_after(&mut self.rng, 0.8)
        };
        vec![ClientOp::Close(conn), ClientOp::Wake(back)]
    }

    /// The connection is gone: its cache with it.
    fn lost(&mut self) {
        self.sent.clear();
        self.streaming = None;
        self.expiring = false;
        if let Some(id) = self.latest.take() {
            if chance(&mut self.rng, 0.5) {
                self.retry_prev = Some(id.clone());
            }
            self.stale.push(id);
        }
        if self.stale.len() > 8 {
            self.stale.remove(0);
        }
    }

    fn step(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        let m = &cx.swarm.mix;
        let x = self.rng.next_f64();
        if self.expiring && !self.busy() {
            // Continue on a fresh connection (the old id will not resolve there).
            return self.hang_up(true);
        }
        let mut ops = Vec::new();
        if x < m.hostile_p {
            ops.push(self.hostile(cx));
        } else if x < m.hostile_p + m.disconnect_p {
            return self.hang_up(false);
        } else if self.streaming.is_some() {
            if x < m.hostile_p + m.disconnect_p + m.control_p {
                let cancel = match &self.streaming {
                    Some(id) if chance(&mut self.rng, 0.5) => {
                        json!({"type": "response.cancel", "response_id": id})
                    }
                    _ => json!({"type": "response.cancel"}),
                };
                ops.push(self.send(Sent::Cancel, cancel));
            }
        } else if !self.busy() {
            let retry = self.retry_prev.take();
            let prev = match (&self.latest, retry) {
                (_, Some(id)) if chance(&mut self.rng, 0.7) => Some(id),
                (Some(id), _) if chance(&mut self.rng, 0.6) => Some(id.clone()),
                _ => None,
            };
            ops.push(self.create(cx, prev));
        }
        ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
        ops
    }
}

impl SimClient for ResponsesClient {
    fn dialect(&self) -> Dialect {
        Dialect::Responses
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
        if self.base.stopped() {
            return Vec::new();
        }
        if self.base.conn.is_none() {
            return vec![ClientOp::Open(Transport::WebSocket)];
        }
        self.step(cx)
    }

    fn on_open(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        if self.base.stopped() {
            return Vec::new();
        }
        self.refused = false;
        self.step(cx)
    }

    fn on_frame(&mut self, cx: &ClientCx<'_>, conn: ConnId, text: &str) -> Vec<ClientOp> {
        if !self.base.owns(conn) {
            return Vec::new();
        }
        // Deltas are most frames, and tell the client nothing it needs.
        if text.contains("\"response.output_text.delta\"") {
            return Vec::new();
        }
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Vec::new();
        };
        let kind = v["type"].as_str().unwrap_or("");
        let id = v["response"]["id"].as_str().map(str::to_string);
        match kind {
            "error" => match v["error"]["code"].as_str().unwrap_or("") {
                "connection_expiring" => self.expiring = true,
                "websocket_connection_limit_reached" => self.refused = true,
                code => {
                    if self.sent.pop_front() == Some(Sent::Create)
                        && code == "previous_response_not_found"
                    {
                        self.latest = None;
                    }
                }
            },
            "response.created" => {
                if self.sent.front() == Some(&Sent::Create) {
                    self.sent.pop_front();
                }
                self.streaming = id;
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                let status = v["response"]["status"].as_str().unwrap_or("");
                if status == "cancelled" && self.sent.front() == Some(&Sent::Cancel) {
                    self.sent.pop_front();
                }
                self.streaming = None;
                match (kind, id) {
                    ("response.failed", Some(id)) => {
                        // Nothing continues past a failure: neither the
                        // failed response nor the one before it.
                        self.stale.push(id);
                        if let Some(before) = self.latest.take() {
                            self.retry_prev = Some(before.clone());
                            self.stale.push(before);
                        }
                    }
                    (_, Some(id)) if status != "cancelled" => self.latest = Some(id),
                    _ => {}
                }
                if !self.base.liveness {
                    let soon = think(&mut self.rng, cx) / 8;
                    return vec![ClientOp::Wake(soon)];
                }
            }
            _ => {}
        }
        Vec::new()
    }

    fn on_closed(&mut self, _cx: &ClientCx<'_>, conn: ConnId, code: Option<u16>) -> Vec<ClientOp> {
        if !self.base.closed(conn, code) {
            return Vec::new();
        }
        self.lost();
        if self.base.stopped() {
            return Vec::new();
        }
        let most = if self.refused || code == Some(1013) {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(1)
        };
        let back = reconnect_after(&mut self.rng, most);
        vec![ClientOp::Wake(back)]
    }
}
