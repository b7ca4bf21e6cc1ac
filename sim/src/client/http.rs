//! A stateless client of the `session`, `responses`, `chat` and
//! `anthropic` HTTP routes (`POST /v1/inference`, `POST /v1/responses`,
//! `GET /v1/responses/{id}`, the OpenAI routes of [`super::chat`] and the
//! Messages routes of [`super::anthropic`]), one request per connection as
//! the io shell carries them: it maps its
//! body with the dialect's own [`http_call`] (the shell's first move),
//! sends the frames on a [`Transport::Http`] connection once it opens, hands
//! every frame to the exchange, and hangs up once the exchange gives its
//! reply or its stream's last event (the shell's last move).
//!
//! Its `session` and `responses` bodies are valid, now and then naming a
//! model this server does not serve (the `chat` and `anthropic` bodies say
//! what they get wrong in their modules); a `responses` client continues and retrieves responses an earlier
//! request of its own stored, and now and then one that does not exist.
//! Every prompt starts with the connection's tag: a `session` body through
//! the system message its `conversation_context` starts with, a `responses`
//! one through its instructions (always given when it continues, so that
//! the tag at the prompt's start is this connection's).
//!
//! Whether a reply was right is the `session_http` and `responses_http`
//! checkers' business, and the `chat` and `anthropic` checkers' for the
//! OpenAI and Messages routes: they replay each exchange over the frames the Host
//! sent and judge what it gives.

use serde_json::{json, Map, Value};
use tokenwire_core::dialect::registry::http_call;
use tokenwire_core::http::{HttpExchange, HttpRequest, HttpStep};
use tokenwire_core::rng::Rng;
use tokenwire_core::{ConnId, Dialect, Transport};

use super::base::reconnect_after;
use super::{chance, conn_tag, text, think, ClientBase, ClientCx, ClientOp, Habits, SimClient};
use crate::swarm::Swarm;

/// See the module docs.
pub struct HttpClient {
    id: usize,
    dialect: Dialect,
    rng: Rng,
    /// The request in flight: its exchange, until its reply.
    exchange: Option<Box<dyn HttpExchange>>,
    /// Ids of responses its earlier requests stored (newest last).
    stored: Vec<String>,
    /// Requests made so far (for ids).
    made: u64,
    /// Its connection, whether it stopped, its habits.
    base: ClientBase,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("id", &self.id)
            .field("dialect", &self.dialect)
            .field("in_flight", &self.exchange.is_some())
            .field("stored", &self.stored.len())
            .field("base", &self.base)
            .finish()
    }
}

impl HttpClient {
    /// Client `id` of `dialect` (`session`, `responses`, `chat` or
    /// `anthropic`) in a run with
    /// `swarm`, drawing from `rng`.
    pub fn new(id: usize, dialect: Dialect, swarm: &Swarm, mut rng: Rng) -> HttpClient {
        let habits = Habits::draw(&mut rng, swarm, false);
        HttpClient {
            id,
            dialect,
            rng,
            exchange: None,
            stored: Vec::new(),
            made: 0,
            base: ClientBase::new(habits),
        }
    }

    /// `model`: absent mostly, now and then the served one or another.
    fn model(&mut self, swarm: &Swarm, body: &mut Map<String, Value>) {
        if chance(&mut self.rng, 0.2) {
            body.insert("model".into(), json!(swarm.model.name));
        } else if chance(&mut self.rng, 0.05) {
            body.insert("model".into(), json!(format!("not-{}", swarm.model.name)));
        }
    }

    /// A whole number of tokens to generate, within the run's cap.
    fn max_tokens(&mut self, swarm: &Swarm) -> u64 {
        1 + self.rng.below(self.max_tokens_cap(swarm))
    }

    /// The most tokens a request of this run generates.
    fn max_tokens_cap(&self, swarm: &Swarm) -> u64 {
        u64::from(
            swarm
                .mix
                .max_tokens_cap
                .min(swarm.model.context_len / 3)
                .max(1),
        )
    }

    /// A `POST /v1/inference` body.
    fn inference(&mut self, swarm: &Swarm) -> (String, String, Value) {
        let mut context = vec![json!({"role": "system", "content": conn_tag(self.base.conn)})];
        for _ in 0..self.rng.below(3) {
            context.push(json!({"role": "user", "content": text(&mut self.rng, 12)}));
            context.push(json!({"role": "assistant", "content": text(&mut self.rng, 12)}));
        }
        let mut body = Map::new();
        body.insert("prompt".into(), json!(text(&mut self.rng, 16)));
        body.insert("conversation_context".into(), Value::Array(context));
        if chance(&mut self.rng, 0.5) {
            body.insert(
                "session_id".into(),
                json!(format!("h{}-{}", self.id, self.made)),
            );
        }
        if chance(&mut self.rng, 0.85) {
            body.insert("max_tokens".into(), json!(self.max_tokens(swarm)));
        }
        if chance(&mut self.rng, 0.4) {
            body.insert("temperature".into(), json!(self.rng.below(3)));
        }
        if chance(&mut self.rng, 0.5) {
            body.insert("stream".into(), json!(true));
        }
        self.model(swarm, &mut body);
        ("POST".into(), "/v1/inference".into(), Value::Object(body))
    }

    /// A `POST /v1/responses` body, or a `GET /v1/responses/{id}`.
    fn responses(&mut self, swarm: &Swarm) -> (String, String, Value) {
        let known = (!self.stored.is_empty())
            .then(|| self.stored[self.rng.below(self.stored.len() as u64) as usize].clone());
        let missing = format!("resp_missing{}x{}", self.id, self.made);
        if chance(&mut self.rng, 0.15) {
            let id = match known {
                Some(id) if chance(&mut self.rng, 0.8) => id,
                _ => missing,
            };
            return ("GET".into(), format!("/v1/responses/{id}"), Value::Null);
        }
        let prev = match known {
            Some(id) if chance(&mut self.rng, 0.4) => Some(id),
            _ if chance(&mut self.rng, 0.05) => Some(missing),
            _ => None,
        };
        let mut body = Map::new();
        let tag = conn_tag(self.base.conn);
        if prev.is_some() || chance(&mut self.rng, 0.3) {
            body.insert(
                "instructions".into(),
                json!(format!("{tag}{}", text(&mut self.rng, 12))),
            );
            body.insert("input".into(), json!(text(&mut self.rng, 16)));
        } else {
            body.insert(
                "input".into(),
                json!(format!("{tag}{}", text(&mut self.rng, 16))),
            );
        }
        if let Some(p) = prev {
            body.insert("previous_response_id".into(), json!(p));
        }
        if chance(&mut self.rng, 0.85) {
            body.insert("max_output_tokens".into(), json!(self.max_tokens(swarm)));
        }
        if chance(&mut self.rng, 0.4) {
            body.insert("temperature".into(), json!(self.rng.below(3)));
        }
        if chance(&mut self.rng, 0.5) {
            body.insert("stream".into(), json!(true));
        }
        if chance(&mut self.rng, 0.1) {
            body.insert("store".into(), json!(false));
        }
        self.model(swarm, &mut body);
        ("POST".into(), "/v1/responses".into(), Value::Object(body))
    }

    /// The request is over (answered, or its connection gone): come back
    /// for the next one after a while.
    fn done(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        self.exchange = None;
        let mut ops = Vec::new();
        if let Some(conn) = self.base.conn.take() {
            ops.push(ClientOp::Close(conn));
        }
        if !self.base.stopped() {
            ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
        }
        ops
    }

    /// Keeps the id of a response that was stored: `v` is a reply's body
    /// (the Response object) or a stream's last event (which holds it).
    fn remember(&mut self, text: &str) {
        let Ok(mut v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        if v.get("response").is_some() {
            v = v["response"].take();
        }
        if v["status"] == "completed" && v["store"] != false {
            if let Some(id) = v["id"].as_str() {
                self.stored.push(id.to_string());
            }
        }
    }
}

impl SimClient for HttpClient {
    fn dialect(&self) -> Dialect {
        self.dialect
    }

    fn transport(&self) -> Transport {
        Transport::Http
    }

    fn base(&self) -> &ClientBase {
        &self.base
    }

    fn base_mut(&mut self) -> &mut ClientBase {
        &mut self.base
    }

    fn act(&mut self, _cx: &ClientCx<'_>) -> Vec<ClientOp> {
        if self.base.stopped() || self.base.conn.is_some() {
            return Vec::new();
        }
        vec![ClientOp::Open(Transport::Http)]
    }

    fn on_open(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        self.made += 1;
        let (method, path, body) = match self.dialect {
            Dialect::Session => self.inference(cx.swarm),
            Dialect::Chat => {
                let cap = self.max_tokens_cap(cx.swarm);
                super::chat::request(&mut self.rng, cx.swarm, &conn_tag(self.base.conn), cap)
            }
            Dialect::Anthropic => {
                let cap = self.max_tokens_cap(cx.swarm);
                super::anthropic::request(&mut self.rng, cx.swarm, &conn_tag(self.base.conn), cap)
            }
            _ => self.responses(cx.swarm),
        };
        let body = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let req = HttpRequest {
            method: &method,
            path: &path,
            body: &body,
            model: &cx.swarm.model.name,
        };
        match http_call(self.dialect, &req) {
            Ok(call) => {
                self.exchange = Some(call.exchange);
                call.frames.into_iter().map(ClientOp::Text).collect()
            }
            // Answered before a connection would open: nothing to send.
            Err(_) => self.done(cx),
        }
    }

    fn on_frame(&mut self, cx: &ClientCx<'_>, conn: ConnId, text: &str) -> Vec<ClientOp> {
        if !self.base.owns(conn) {
            return Vec::new();
        }
        let Some(exchange) = self.exchange.as_mut() else {
            return Vec::new();
        };
        match exchange.on_frame(text) {
            HttpStep::Wait | HttpStep::Event(_) | HttpStep::Events { last: false, .. } => {
                Vec::new()
            }
            HttpStep::LastEvent(event) => {
                self.remember(&event.data);
                self.done(cx)
            }
            HttpStep::Events { events, last: true } => {
                if let Some(event) = events.last() {
                    self.remember(&event.data);
                }
                self.done(cx)
            }
            HttpStep::Reply(reply) => {
                if reply.status == 200 {
                    self.remember(&reply.body);
                }
                self.done(cx)
            }
        }
    }

    fn on_closed(&mut self, _cx: &ClientCx<'_>, conn: ConnId, code: Option<u16>) -> Vec<ClientOp> {
        if !self.base.closed(conn, code) {
            return Vec::new();
        }
        self.exchange = None;
        if self.base.stopped() {
            return Vec::new();
        }
        let back = reconnect_after(&mut self.rng, tokenwire_core::Duration::from_secs(1));
        vec![ClientOp::Wake(back)]
    }
}
