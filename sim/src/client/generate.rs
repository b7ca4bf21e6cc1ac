//! The simulated `generate` client: a scripted user of `/generate` whose every
//! choice comes from its own seeded stream.
//!
//! It connects, sends `config` requests with random parameters, steers running
//! generations with `control` messages at random moments, rates them with
//! `feedback`, sends malformed and hostile frames, hangs up early and comes
//! back, and after a broken connection (a host crash, a server close) reconnects
//! and sends its config again: the `generate` dialect's way to recover. It only
//! reacts to what it reads; whether the server was right is the invariant
//! checkers' business, never the client's.
//!
//! Every prompt starts with the tag `<c{conn}>` (the connection id), so that
//! checkers can tell which connection a sequence in an engine step belongs to.

use serde_json::{json, Map, Value};
use tokenwire_core::rng::Rng;
use tokenwire_core::{ConnId, Dialect, Duration, Transport};

use super::base::{come_back_after, reconnect_after};
use super::{
    chance, conn_tag, think, ClientBase, ClientCx, ClientOp, Habits, SimClient, PROMPT_CHARS,
};
use crate::swarm::Swarm;

/// Where the client is with its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Offline,
    Fresh,
    Idle,
    Awaiting,
    Generating { paused: bool, tokens: u32 },
    Closing,
}

/// A config the client may send again after reconnecting.
#[derive(Debug, Clone)]
struct Saved {
    body: String,
    rest: Map<String, Value>,
}

/// One simulated `/generate` user.
#[derive(Debug)]
pub struct GenerateClient {
    /// Its index in the run.
    pub id: usize,
    rng: Rng,
    phase: Phase,
    saved: Option<Saved>,
    /// Send the saved config again when next connected or idle.
    resend: bool,
    /// Speaks HTTP (one request per connection) rather than WebSocket.
    pub http: bool,
    /// Resumes a paused generation when the liveness phase starts (otherwise
    /// lets it time out).
    resume_at_liveness: bool,
    /// Its connection, whether it stopped, its habits.
    base: ClientBase,
}

impl GenerateClient {
    /// Client `id` of a run with `swarm`, drawing from `rng`.
    pub fn new(id: usize, swarm: &Swarm, mut rng: Rng) -> GenerateClient {
        let m = &swarm.mix;
        let http = chance(&mut rng, m.http_p);
        let habits = Habits::draw(&mut rng, swarm, !http);
        let resume_at_liveness = chance(&mut rng, 0.5);
        GenerateClient {
            id,
            rng,
            phase: Phase::Offline,
            saved: None,
            resend: false,
            http,
            resume_at_liveness,
            base: ClientBase::new(habits),
        }
    }

    /// True while it has a request in flight (sent, or generating).
    pub fn busy(&self) -> bool {
        matches!(self.phase, Phase::Awaiting | Phase::Generating { .. })
    }

    fn transport(&self) -> Transport {
        if self.http {
            Transport::Http
        } else {
            Transport::WebSocket
        }
    }

    fn hang_up(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        self.base.habits.disconnects += 1;
        self.resend = self.busy() && chance(&mut self.rng, 0.5);
        self.phase = Phase::Offline;
        let Some(conn) = self.base.conn.take() else {
            return Vec::new();
        };
        let back = come_back_after(&mut self.rng, 0.7);
        let _ = cx;
        vec![ClientOp::Close(conn), ClientOp::Wake(back)]
    }

    fn prompt_body(&mut self, cx: &ClientCx<'_>) -> String {
        let len = match self.rng.below(20) {
            0 => self.rng.below(u64::from(cx.swarm.model.context_len) + 64),
            1..=5 => 20 + self.rng.below(80),
            _ => self.rng.below(20),
        };
        (0..len)
            .map(|_| PROMPT_CHARS[self.rng.below(PROMPT_CHARS.len() as u64) as usize])
            .collect()
    }

    fn stop_string(&mut self, cx: &ClientCx<'_>) -> String {
        let syms = &cx.swarm.engine.symbols;
        let n = 1 + self.rng.below(3);
        (0..n)
            .map(|_| syms[self.rng.below(syms.len() as u64) as usize].as_str())
            .collect()
    }

    /// A valid config's text and the fields to keep for sending it again.
    fn config_text(&mut self, cx: &ClientCx<'_>) -> (String, Saved) {
        let sw = cx.swarm;
        let mut params = Map::new();
        let body = self.prompt_body(cx);
        if chance(&mut self.rng, 0.8) {
            let ctx = u64::from(sw.model.context_len);
            // The prompt's tokens: BOS, the tag, the body (one per byte).
            let prompt_tokens = 1 + conn_tag(self.base.conn).len() as u64 + body.len() as u64;
            let max = if chance(&mut self.rng, 0.08) {
                // The boundaries: the whole context, the most that fits, one more.
                let fits = ctx.saturating_sub(prompt_tokens).max(1);
                [ctx, fits, fits + 1][self.rng.below(3) as usize]
            } else {
                let cap = if chance(&mut self.rng, 0.05) {
                    sw.model.context_len
                } else {
                    sw.mix.max_tokens_cap.min(sw.model.context_len)
                };
                1 + self.rng.below(u64::from(cap))
            };
            params.insert("max_tokens".into(), json!(max));
        }
        if chance(&mut self.rng, 0.5) {
            let t = [0.0, 0.0, 0.7, 1.0, 2.0][self.rng.below(5) as usize];
            params.insert("temperature".into(), json!(t));
        }
        if chance(&mut self.rng, 0.2) {
            let p = if chance(&mut self.rng, 0.2) {
                1.0
            } else {
                0.05 + 0.95 * self.rng.next_f64()
            };
            params.insert("top_p".into(), json!(p));
        }
        if chance(&mut self.rng, 0.2) {
            params.insert("top_k".into(), json!(self.rng.below(50)));
        }
        if chance(&mut self.rng, 0.1) {
            params.insert(
                "repetition_penalty".into(),
                json!(0.5 + 1.5 * self.rng.next_f64()),
            );
        }
        if chance(&mut self.rng, 0.4) {
            params.insert("seed".into(), json!(self.rng.next_u64()));
        }
        if chance(&mut self.rng, 0.45) {
            let n = if chance(&mut self.rng, 0.05) {
                8
            } else {
                1 + self.rng.below(3)
            };
            let stops: Vec<String> = (0..n).map(|_| self.stop_string(cx)).collect();
            if stops.len() == 1 && chance(&mut self.rng, 0.5) {
                params.insert("stop".into(), json!(stops[0]));
            } else {
                params.insert("stop".into(), json!(stops));
            }
        }
        if chance(&mut self.rng, 0.1) {
            let n = if chance(&mut self.rng, 0.3) {
                20
            } else {
                self.rng.below(21)
            };
            params.insert("top_logprobs".into(), json!(n));
        }
        let mut rest = Map::new();
        rest.insert("type".into(), json!("config"));
        if !params.is_empty() {
            rest.insert("parameters".into(), Value::Object(params));
        }
        let mut options = Map::new();
        for name in [
            "echo_prompt",
            "include_token_ids",
            "include_logprobs",
            "include_timing",
            "include_generated_text",
            "stream",
        ] {
            if chance(&mut self.rng, 0.25) {
                options.insert(name.into(), json!(chance(&mut self.rng, 0.8)));
            }
        }
        if !options.is_empty() {
            rest.insert("options".into(), Value::Object(options));
        }
        if chance(&mut self.rng, 0.2) {
            rest.insert("model".into(), json!(sw.model.name));
        }
        if chance(&mut self.rng, 0.1) {
            rest.insert("x-unknown".into(), json!({"ignored": [1, 2, 3]}));
        }
        let saved = Saved { body, rest };
        (self.render(&saved), saved)
    }

    fn render(&self, saved: &Saved) -> String {
        let mut v = saved.rest.clone();
        v.insert(
            "prompt".into(),
            json!(format!("{}{}", conn_tag(self.base.conn), saved.body)),
        );
        Value::Object(v).to_string()
    }

    fn new_config(&mut self, cx: &ClientCx<'_>) -> ClientOp {
        let (text, saved) = self.config_text(cx);
        self.saved = Some(saved);
        self.phase = Phase::Awaiting;
        ClientOp::Text(text)
    }

    fn resend_config(&mut self) -> ClientOp {
        self.resend = false;
        match &self.saved {
            Some(s) => {
                let text = self.render(s);
                self.phase = Phase::Awaiting;
                ClientOp::Text(text)
            }
            None => ClientOp::Wake(Duration::from_millis(1)),
        }
    }

    fn invalid_config(&mut self, cx: &ClientCx<'_>) -> String {
        let tag = conn_tag(self.base.conn);
        let ctx = cx.swarm.model.context_len;
        let p = |params: Value| json!({"type": "config", "prompt": format!("{tag}x"), "parameters": params});
        let v = match self.rng.below(14) {
            0 => p(json!({"temperature": 3.5})),
            1 => p(json!({"top_p": 0})),
            2 => p(json!({"max_tokens": 0})),
            3 => p(json!({"max_tokens": ctx + 1})),
            4 => p(json!({"stop": ["a","b","c","d","e","f","g","h","i"]})),
            5 => p(json!({"stop": [""]})),
            6 => p(json!({"stop": [1]})),
            7 => p(json!({"stop": "s".repeat(257)})),
            8 => json!({"type": "config"}),
            9 => json!({"type": "config", "prompt": 5}),
            10 => json!({"type": "config", "prompt": tag, "parameters": "hot"}),
            11 => json!({"type": "config", "prompt": tag, "options": {"echo_prompt": "yes"}}),
            12 => json!({"type": "config", "prompt": tag, "model": "gpt-9"}),
            _ => p(json!({"top_logprobs": 21, "seed": -1})),
        };
        v.to_string()
    }

    fn feedback(&mut self) -> ClientOp {
        let v = match self.rng.below(6) {
            0 => json!({"type": "feedback", "rating": 2}),
            1 => json!({"type": "feedback", "rating": 1, "text": "x".repeat(5000)}),
            2 => {
                json!({"type": "feedback", "rating": -1, "text": "meh", "position": self.rng.below(50)})
            }
            3 => json!({"type": "feedback", "rating": 0.5}),
            _ => json!({"type": "feedback", "rating": 1, "text": "Great response!"}),
        };
        ClientOp::Text(v.to_string())
    }

    fn control(&mut self, cx: &ClientCx<'_>, paused: bool, tokens: u32) -> ClientOp {
        let c = |action: &str| json!({"type": "control", "action": action});
        let v = match self.rng.below(12) {
            0 | 1 => c("stop"),
            2..=4 => {
                if paused {
                    c("resume")
                } else {
                    c("pause")
                }
            }
            5 => c(if paused { "pause" } else { "resume" }),
            6 => c("regenerate"),
            7..=9 => {
                let mut params = Map::new();
                if chance(&mut self.rng, 0.5) {
                    params.insert(
                        "max_tokens".into(),
                        json!(u64::from(tokens) + 1 + self.rng.below(20)),
                    );
                }
                if chance(&mut self.rng, 0.5) {
                    params.insert("temperature".into(), json!(self.rng.next_f64() * 2.0));
                }
                if chance(&mut self.rng, 0.4) {
                    params.insert("stop".into(), json!([self.stop_string(cx)]));
                }
                if chance(&mut self.rng, 0.2) {
                    params.insert("seed".into(), json!(self.rng.below(1000)));
                }
                json!({"type": "control", "action": "modify", "parameters": params})
            }
            10 => json!({"type": "control", "action": "modify", "parameters": {"temperature": 9}}),
            _ => json!({"type": "control", "action": "modify", "parameters": {"max_tokens": 0}}),
        };
        ClientOp::Text(v.to_string())
    }

    /// A malformed or hostile frame.
    fn hostile(&mut self, cx: &ClientCx<'_>) -> ClientOp {
        self.base.habits.hostile_sent += 1;
        let limit = cx.swarm.host.max_frame_bytes;
        let text = match self.rng.below(18) {
            0 => "{not json".to_string(),
            1 => {
                let mut b = vec![0u8; 1 + self.rng.below(64) as usize];
                self.rng.fill(&mut b);
                String::from_utf8_lossy(&b).into_owned()
            }
            2 => {
                let d = 65 + self.rng.below(300) as usize;
                "[".repeat(d) + &"]".repeat(d)
            }
            3 => {
                let d = 60 + self.rng.below(10) as usize;
                "{\"a\":".repeat(d) + "1" + &"}".repeat(d)
            }
            4 => "[1,2,3]".into(),
            5 => "null".into(),
            6 => String::new(),
            7 => json!({"type": 5}).to_string(),
            8 => json!({"type": "bogus"}).to_string(),
            9 => json!({"type": "control"}).to_string(),
            10 => json!({"type": "control", "action": "dance"}).to_string(),
            11 => json!({"type": "feedback", "rating": "good"}).to_string(),
            12 => return ClientOp::Binary(1 + self.rng.below(4096) as usize),
            13 => return ClientOp::TooLarge,
            14 if limit <= 65536 => "x".repeat(limit + 1),
            15 => "\u{0}\u{FFFF}\u{1F980}\"".into(),
            16 => json!({"type": "config", "prompt": conn_tag(self.base.conn), "parameters": {"stop": {"a": 1}}})
                .to_string(),
            _ => {
                // A config cut off in the middle.
                let (t, _) = self.config_text(cx);
                let half = t.chars().count() / 2;
                t.chars().take(half).collect()
            }
        };
        ClientOp::Text(text)
    }
}

impl SimClient for GenerateClient {
    fn dialect(&self) -> Dialect {
        Dialect::Generate
    }

    fn transport(&self) -> Transport {
        GenerateClient::transport(self)
    }

    fn base(&self) -> &ClientBase {
        &self.base
    }

    fn base_mut(&mut self) -> &mut ClientBase {
        &mut self.base
    }

    /// The client acts (its wake-up came).
    fn act(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        if self.base.stopped() {
            return Vec::new();
        }
        let m = &cx.swarm.mix;
        let mut ops = Vec::new();
        match self.phase {
            Phase::Offline => ops.push(ClientOp::Open(self.transport())),
            Phase::Fresh => return self.on_open(cx),
            Phase::Closing => {}
            Phase::Awaiting => {
                if !self.http && chance(&mut self.rng, m.hostile_p * 0.3) {
                    ops.push(self.hostile(cx));
                }
                ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
            }
            Phase::Idle => {
                if self.http {
                    // Its one request is over.
                    if let Some(conn) = self.base.conn.take() {
                        ops.push(ClientOp::Close(conn));
                    }
                    self.phase = Phase::Offline;
                    ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
                    return ops;
                }
                let x = self.rng.next_f64();
                if self.resend {
                    ops.push(self.resend_config());
                } else if x < m.hostile_p * 0.2 {
                    // A config with a burst of frames behind it, sent without
                    // waiting: they pile up while its prompt is tokenized.
                    ops.push(self.new_config(cx));
                    let n = 8 + self.rng.below(40);
                    for _ in 0..n {
                        ops.push(self.feedback());
                    }
                } else if x < m.hostile_p {
                    ops.push(self.hostile(cx));
                } else if x < m.hostile_p + m.disconnect_p {
                    return self.hang_up(cx);
                } else if x < m.hostile_p + m.disconnect_p + 0.08 {
                    ops.push(self.feedback());
                } else if x < m.hostile_p + m.disconnect_p + 0.16 {
                    ops.push(ClientOp::Text(self.invalid_config(cx)));
                } else {
                    ops.push(self.new_config(cx));
                }
                ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
            }
            Phase::Generating { paused, tokens } => {
                let x = self.rng.next_f64();
                if self.http {
                    ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
                    return ops;
                }
                if x < m.hostile_p * 0.5 {
                    ops.push(self.hostile(cx));
                } else if x < m.hostile_p * 0.5 + m.disconnect_p {
                    return self.hang_up(cx);
                } else if x < m.hostile_p * 0.5 + m.disconnect_p + m.control_p {
                    ops.push(self.control(cx, paused, tokens));
                } else if x < m.hostile_p * 0.5 + m.disconnect_p + m.control_p + 0.03 {
                    ops.push(self.feedback());
                } else if x < m.hostile_p * 0.5 + m.disconnect_p + m.control_p + 0.05 {
                    // A config while generating: the server must refuse it.
                    ops.push(ClientOp::Text(self.config_text(cx).0));
                }
                let wait = if paused {
                    think(&mut self.rng, cx)
                } else {
                    think(&mut self.rng, cx) / 4
                };
                ops.push(ClientOp::Wake(wait));
            }
        }
        ops
    }

    /// The connection it asked for is open (bound to `conn`): the first frame.
    fn on_open(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        let mut ops = Vec::new();
        if self.base.stopped() {
            return ops;
        }
        self.phase = Phase::Fresh;
        let m = &cx.swarm.mix;
        if self.resend && self.saved.is_some() {
            ops.push(self.resend_config());
        } else if !self.http && chance(&mut self.rng, m.hostile_p * 0.5) {
            // A first message that is not a config: error, then close 1008.
            ops.push(self.hostile(cx));
            self.phase = Phase::Idle;
        } else if !self.http && chance(&mut self.rng, 0.05) {
            ops.push(ClientOp::Text(self.invalid_config(cx)));
            self.phase = Phase::Idle;
        } else {
            ops.push(self.new_config(cx));
        }
        ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
        ops
    }

    /// A frame from the server arrived.
    fn on_frame(&mut self, cx: &ClientCx<'_>, conn: ConnId, text: &str) -> Vec<ClientOp> {
        if !self.base.owns(conn) {
            return Vec::new();
        }
        // Most frames are tokens, all a client counts of them: skip parsing.
        if text.starts_with("{\"type\":\"token\"") {
            if let Phase::Generating { paused, tokens } = self.phase {
                self.phase = Phase::Generating {
                    paused,
                    tokens: tokens + 1,
                };
            }
            return Vec::new();
        }
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Vec::new();
        };
        let mut ops = Vec::new();
        match v["type"].as_str().unwrap_or("") {
            "init" => {
                self.phase = Phase::Generating {
                    paused: false,
                    tokens: 0,
                };
                self.resend = false;
            }
            "token" => {
                if let Phase::Generating { paused, tokens } = self.phase {
                    self.phase = Phase::Generating {
                        paused,
                        tokens: tokens + 1,
                    };
                }
            }
            "completion" => {
                self.phase = Phase::Idle;
                if !self.base.liveness {
                    let soon = think(&mut self.rng, cx) / 8;
                    ops.push(ClientOp::Wake(soon));
                } else if self.http {
                    if let Some(conn) = self.base.conn.take() {
                        ops.push(ClientOp::Close(conn));
                    }
                    self.phase = Phase::Offline;
                }
            }
            "error" => {
                if v.get("recoverable") == Some(&Value::Bool(false)) {
                    self.phase = Phase::Closing;
                } else if v.get("generated_text").is_some() || matches!(self.phase, Phase::Awaiting)
                {
                    // Our generation failed, or our config was refused.
                    let retry = v["recovery_action"] == "retry";
                    self.phase = Phase::Idle;
                    self.resend = retry && self.saved.is_some() && chance(&mut self.rng, 0.5);
                    if !self.base.liveness {
                        ops.push(ClientOp::Wake(think(&mut self.rng, cx) / 8));
                    } else if self.http {
                        if let Some(conn) = self.base.conn.take() {
                            ops.push(ClientOp::Close(conn));
                        }
                        self.phase = Phase::Offline;
                    }
                }
            }
            "status" => {
                if let Phase::Generating { tokens, .. } = self.phase {
                    match v["operation"].as_str() {
                        Some("paused") => {
                            self.phase = Phase::Generating {
                                paused: true,
                                tokens,
                            }
                        }
                        Some("resumed") => {
                            self.phase = Phase::Generating {
                                paused: false,
                                tokens,
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        ops
    }

    /// Its connection is gone: closed by the server with `code`, or broken
    /// (`None`: the host crashed).
    fn on_closed(&mut self, cx: &ClientCx<'_>, conn: ConnId, code: Option<u16>) -> Vec<ClientOp> {
        let unfinished = self.busy();
        if !self.base.closed(conn, code) {
            return Vec::new();
        }
        self.phase = Phase::Offline;
        if self.base.stopped() {
            return Vec::new();
        }
        // Recovery: come back and ask again for what was not finished.
        self.resend = unfinished && self.saved.is_some();
        let back = reconnect_after(&mut self.rng, Duration::from_secs(1));
        let _ = cx;
        vec![ClientOp::Wake(back)]
    }

    /// The liveness phase begins: no new work; a paused generation is resumed
    /// or left to time out.
    fn start_liveness(&mut self) -> Vec<ClientOp> {
        self.base.liveness = true;
        match self.phase {
            Phase::Generating { paused: true, .. } if self.resume_at_liveness => {
                vec![ClientOp::Text(
                    json!({"type": "control", "action": "resume"}).to_string(),
                )]
            }
            _ => Vec::new(),
        }
    }
}
