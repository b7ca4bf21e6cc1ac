//! The simulated `session` client: a user of `/ws/session` holding one or
//! two conversations on its connection, every choice drawn from its own
//! seeded stream.
//!
//! It starts sessions (`session_init` with a context of its own, under a job
//! id), prompts them at the right index with random parameters, streamed or
//! not, keeps each reply in its history, ends sessions and starts new ones.
//! It also sends messages batched in arrays and in the envelope form,
//! malformed and hostile messages (unknown sessions, wrong indexes, another
//! session's id, a wrong model, a `public_key` that is not a key, prompts
//! while a reply streams), signs the prompts of some conversations (now and
//! then wrongly, or not at all), hangs up
//! early, and after a broken connection (a host crash, a hang-up, a server
//! close) reconnects and resumes every session with the history it holds:
//! the dialect's recovery. The first message of every conversation is a
//! system message holding the connection tag (`<c{conn}>`), rewritten for
//! each connection it is resumed on.

use serde_json::{json, Map, Value};
use tokenwire_core::dialect::session::codec::{self, ClientMessage, Prompt, SessionStart};
use tokenwire_core::rng::Rng;
use tokenwire_core::{ChatMessage, ConnId, Dialect, Duration, Instant, Role, Transport};

use super::base::{come_back_after, reconnect_after};
use super::{
    chance, conn_tag, garbage, text, think, ClientBase, ClientCx, ClientOp, Habits, SimClient,
};
use crate::swarm::Swarm;

/// A reply in flight longer than this is given up (its error was taken for
/// a hostile frame's, or the frames were lost with a connection).
const GIVE_UP: Duration = Duration::from_secs(120);

/// Where one conversation is.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Not started on this connection: start it (resume it if it ran before).
    Idle,
    /// `session_init` / `session_resume` sent (with the first prompt
    /// batched behind it, if any).
    Starting { then: Option<String> },
    /// Ready for a prompt.
    Ready,
    /// A prompt is out (at this index).
    Prompting { content: String },
    /// `session_end` sent.
    Ending,
}

/// One conversation.
#[derive(Debug, Clone)]
struct Conversation {
    sid: String,
    job: Value,
    /// The conversation as the client holds it: the tag message first.
    history: Vec<ChatMessage>,
    /// It ran on some connection before (so it is resumed, not started).
    started: bool,
    state: State,
    since: Instant,
    /// Errors to come for hostile messages naming it.
    expected_errors: u32,
    /// Its first message is the system message holding the connection tag;
    /// otherwise (after a context too long for the window was dropped)
    /// every user message starts with the tag.
    tag_message: bool,
    /// The secret of its signing key, when it signs its prompts (its
    /// starts then carry the `public_key`).
    key: Option<[u8; 32]>,
}

impl Conversation {
    /// User and assistant messages held: the next `message_index`.
    fn count(&self) -> u64 {
        self.history
            .iter()
            .filter(|m| m.role != Role::System)
            .count() as u64
    }
}

/// One simulated `/ws/session` user.
#[derive(Debug)]
pub struct SessionClient {
    /// Its index in the run.
    pub id: usize,
    rng: Rng,
    convs: Vec<Conversation>,
    most: usize,
    next_sid: u64,
    next_job: u64,
    /// Its connection, whether it stopped, its habits.
    base: ClientBase,
}

impl SessionClient {
    /// Client `id` of a run with `swarm`, drawing from `rng`.
    pub fn new(id: usize, swarm: &Swarm, mut rng: Rng) -> SessionClient {
        let habits = Habits::draw(&mut rng, swarm, true);
        let most = 1 + rng.below(2) as usize;
        SessionClient {
            id,
            rng,
            convs: Vec::new(),
            most,
            next_sid: 0,
            next_job: 0,
            base: ClientBase::new(habits),
        }
    }

    fn new_job(&mut self) -> Value {
        self.next_job += 1;
        if chance(&mut self.rng, 0.2) {
            // Integers of either sign, and past i64 now and then: JSON
            // numbers the contract takes as job ids.
            let n = self.id as u64 * 1_000_000 + self.next_job;
            match self.rng.below(4) {
                0 => json!(-(n as i64)),
                1 => json!(u64::MAX - n),
                _ => json!(n),
            }
        } else {
            json!(format!("job-{}-{}", self.id, self.next_job))
        }
    }

    fn new_conversation(&mut self, cx: &ClientCx<'_>) {
        // A high-value conversation: its prompts are signed.
        let key = chance(&mut self.rng, 0.25).then(|| {
            let mut secret = [0u8; 32];
            for b in &mut secret {
                *b = self.rng.below(256) as u8;
            }
            secret
        });
        self.next_sid += 1;
        let sid = format!("s{}-{}", self.id, self.next_sid);
        // One job paid for by several conversations now and then: their
        // turns draw on one budget side by side.
        let job = match self.convs.len() {
            n if n > 0 && chance(&mut self.rng, 0.3) => {
                self.convs[self.rng.below(n as u64) as usize].job.clone()
            }
            _ => self.new_job(),
        };
        let mut history = vec![ChatMessage::new(Role::System, conn_tag(self.base.conn))];
        // A conversation handed over from elsewhere: a few turns already.
        let turns = match self.rng.below(4) {
            0 | 1 => 0,
            2 => 1,
            _ => self.rng.below(6),
        };
        for _ in 0..turns {
            if chance(&mut self.rng, 0.1) {
                history.push(ChatMessage::new(Role::System, text(&mut self.rng, 10)));
            }
            history.push(ChatMessage::new(Role::User, text(&mut self.rng, 12)));
            history.push(ChatMessage::new(Role::Assistant, text(&mut self.rng, 12)));
        }
        self.convs.push(Conversation {
            sid,
            job,
            history,
            started: false,
            state: State::Idle,
            since: cx.now,
            expected_errors: 0,
            tag_message: true,
            key,
        });
    }

    fn start_message(&mut self, i: usize) -> ClientMessage {
        let tag = conn_tag(self.base.conn);
        let c = &mut self.convs[i];
        if let Some(first) = c.history.first_mut().filter(|_| c.tag_message) {
            first.content = tag;
        }
        let start = SessionStart {
            session_id: c.sid.clone(),
            job_id: match &c.job {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            },
            conversation_context: c.history.clone(),
            model: None,
            public_key: c
                .key
                .and_then(|k| signing_key(&k))
                .map(|k| public_key_hex(&k)),
            last_message_index: (c.history.len() as u64)
                .checked_sub(1)
                .filter(|_| c.started),
        };
        if start.last_message_index.is_some() {
            ClientMessage::SessionResume(start)
        } else {
            ClientMessage::SessionInit(start)
        }
    }

    /// A message as a JSON value: flat with the job id as the client chose
    /// it, sometimes in the envelope form.
    fn value(&mut self, msg: &ClientMessage, job: Option<&Value>) -> Value {
        let mut v = codec::encode_client_value(msg);
        if let (Some(job), Value::Object(m)) = (job, &mut v) {
            m.insert("job_id".into(), job.clone());
        }
        if chance(&mut self.rng, 0.15) {
            let Value::Object(mut m) = v else { return v };
            let kind = m.remove("type").unwrap_or(Value::Null);
            let sid = m.get("session_id").cloned().unwrap_or(Value::Null);
            return json!({"type": kind, "session_id": sid, "timestamp": 0, "payload": Value::Object(m)});
        }
        v
    }

    fn prompt_message(&mut self, cx: &ClientCx<'_>, i: usize) -> ClientMessage {
        let mut content = text(&mut self.rng, 24);
        if !self.convs[i].tag_message {
            content = format!("{}{content}", conn_tag(self.base.conn));
        }
        let mut sampling = Map::new();
        let sw = cx.swarm;
        if chance(&mut self.rng, 0.85) {
            let cap = sw.mix.max_tokens_cap.min(sw.model.context_len / 3).max(1);
            sampling.insert(
                "max_tokens".into(),
                json!(1 + self.rng.below(u64::from(cap))),
            );
        }
        if chance(&mut self.rng, 0.4) {
            let t = [0.0, 0.5, 1.0, 2.0][self.rng.below(4) as usize];
            sampling.insert("temperature".into(), json!(t));
        }
        if chance(&mut self.rng, 0.3) {
            sampling.insert("seed".into(), json!(self.rng.below(1000)));
        }
        if chance(&mut self.rng, 0.2) {
            let syms = &sw.engine.symbols;
            let stop = syms[self.rng.below(syms.len() as u64) as usize].clone();
            sampling.insert("stop".into(), json!([stop]));
        }
        let stream = !chance(&mut self.rng, 0.2);
        let c = &mut self.convs[i];
        if matches!(c.state, State::Starting { .. }) {
            c.state = State::Starting {
                then: Some(content.clone()),
            };
        } else {
            c.state = State::Prompting {
                content: content.clone(),
            };
        }
        c.since = cx.now;
        let index = c.count();
        let signature = match c.key.and_then(|k| signing_key(&k)) {
            None => None,
            // Mostly signed right; now and then for another index, over
            // other content, not at all, or with a signature that is not one.
            Some(k) => match self.rng.below(20) {
                0 => Some(sign(&k, &c.sid, index + 1, &content)),
                1 => Some(sign(&k, &c.sid, index, "something else")),
                2 => None,
                3 => Some("ab".repeat(64)),
                _ => Some(sign(&k, &c.sid, index, &content)),
            },
        };
        ClientMessage::Prompt(Prompt {
            session_id: c.sid.clone(),
            content,
            message_index: index,
            stream,
            sampling,
            signature,
        })
    }

    /// What to do with a connection that is open.
    fn step(&mut self, cx: &ClientCx<'_>) -> Vec<ClientOp> {
        let m = &cx.swarm.mix;
        let mut ops = Vec::new();
        let x = self.rng.next_f64();
        for c in self.convs.iter_mut() {
            let stuck = matches!(
                c.state,
                State::Starting { .. } | State::Prompting { .. } | State::Ending
            );
            if stuck && cx.now >= c.since + GIVE_UP {
                // Lost track: go on with the history under a new id.
                c.state = State::Idle;
                c.started = true;
                c.sid.push('g');
            }
        }
        if x < m.hostile_p {
            ops.push(self.hostile(cx));
        } else if x < m.hostile_p + m.disconnect_p {
            return self.hang_up();
        } else if let Some(i) = self.convs.iter().position(|c| c.state == State::Idle) {
            let msg = self.start_message(i);
            self.convs[i].state = State::Starting { then: None };
            self.convs[i].since = cx.now;
            let job = self.convs[i].job.clone();
            let start = self.value(&msg, Some(&job));
            if self.convs[i].count() == 0 && chance(&mut self.rng, 0.3) {
                // The first prompt batched behind the start: it waits for
                // the verdict on the server.
                let p = self.prompt_message(cx, i);
                let prompt = self.value(&p, None);
                ops.push(ClientOp::Text(
                    Value::Array(vec![start, prompt]).to_string(),
                ));
            } else {
                ops.push(ClientOp::Text(start.to_string()));
            }
        } else if self.convs.len() < self.most && chance(&mut self.rng, 0.5) {
            self.new_conversation(cx);
            return self.step(cx);
        } else {
            let ready: Vec<usize> = (0..self.convs.len())
                .filter(|&i| self.convs[i].state == State::Ready)
                .collect();
            if !ready.is_empty() {
                let i = ready[self.rng.below(ready.len() as u64) as usize];
                if chance(&mut self.rng, 0.06) {
                    let c = &mut self.convs[i];
                    c.state = State::Ending;
                    c.since = cx.now;
                    let end = ClientMessage::SessionEnd {
                        session_id: c.sid.clone(),
                    };
                    let v = self.value(&end, None);
                    ops.push(ClientOp::Text(v.to_string()));
                } else {
                    let p = self.prompt_message(cx, i);
                    let v = self.value(&p, None);
                    ops.push(ClientOp::Text(v.to_string()));
                }
            }
        }
        ops.push(ClientOp::Wake(think(&mut self.rng, cx)));
        ops
    }

    fn hang_up(&mut self) -> Vec<ClientOp> {
        self.base.habits.disconnects += 1;
        self.lost();
        let Some(conn) = self.base.conn.take() else {
            return Vec::new();
        };
        let back = come_back_after(&mut self.rng, 0.8);
        vec![ClientOp::Close(conn), ClientOp::Wake(back)]
    }

    /// The connection is gone: the Host forgot every session of it, so
    /// each conversation is resumed on the next connection with the history
    /// the client holds (a reply in flight is lost; one being ended is
    /// dropped).
    fn lost(&mut self) {
        self.convs.retain(|c| c.state != State::Ending);
        for c in self.convs.iter_mut() {
            if c.state != State::Idle {
                c.started = true;
            }
            c.state = State::Idle;
            c.expected_errors = 0;
        }
    }

    fn conv(&mut self, sid: &str) -> Option<&mut Conversation> {
        self.convs.iter_mut().find(|c| c.sid == sid)
    }

    /// A malformed or hostile message.
    fn hostile(&mut self, cx: &ClientCx<'_>) -> ClientOp {
        self.base.habits.hostile_sent += 1;
        let live: Vec<usize> = (0..self.convs.len())
            .filter(|&i| matches!(self.convs[i].state, State::Ready | State::Prompting { .. }))
            .collect();
        let pick_live = |rng: &mut Rng| -> Option<usize> {
            (!live.is_empty()).then(|| live[rng.below(live.len() as u64) as usize])
        };
        let job = json!("job-hostile");
        let v = match self.rng.below(18) {
            0 => return ClientOp::Text(garbage(&mut self.rng)),
            1 => return ClientOp::Binary(1 + self.rng.below(512) as usize),
            2 => return ClientOp::TooLarge,
            3 => json!([]),
            4 => json!([{"type": "bogus", "session_id": "x"}, 7]),
            5 => {
                json!({"type": "prompt", "session_id": "nobody", "content": "hi", "message_index": 0})
            }
            6 => json!({"type": "session_end", "session_id": "nobody"}),
            7 => json!({"type": "inference", "prompt": "hi"}),
            8 => json!({"type": "session_init", "session_id": "z", "job_id": job,
                        "conversation_context": [{"role": "robot", "content": "x"}]}),
            9 => json!({"type": "session_init", "session_id": "", "job_id": job}),
            10 => json!({"type": "session_init", "session_id": "w", "job_id": job,
                         "model": "gpt-9"}),
            11 => json!({"type": "prompt", "session_id": "x", "payload": 5}),
            12 => {
                // Another client's session (maybe live elsewhere): session_exists.
                let other = self.rng.below(cx.swarm.dialects.len() as u64);
                json!({"type": "session_init", "session_id": format!("s{other}-1"), "job_id": job})
            }
            15 => {
                // A `public_key` that is not a secp256k1 key.
                let keys = [
                    "zz".to_string(),
                    "02".into(),
                    "03".repeat(33),
                    "04".repeat(65),
                ];
                let key = keys[self.rng.below(4) as usize].clone();
                json!({"type": "session_init", "session_id": "k", "job_id": job, "public_key": key})
            }
            16 => {
                // A job id that is not a non-empty string or an integer, or
                // none: refused for the field, never a session.
                let jobs = [
                    json!(""),
                    json!(1.5),
                    json!(true),
                    json!({"id": "j"}),
                    Value::Null,
                ];
                let mut v = json!({"type": "session_init", "session_id": "jx",
                                   "conversation_context": []});
                let pick = self.rng.below(jobs.len() as u64 + 1) as usize;
                if let Some(job) = jobs.get(pick) {
                    v["job_id"] = job.clone();
                }
                v
            }
            13 | 14 => match pick_live(&mut self.rng) {
                Some(i) => {
                    let c = &mut self.convs[i];
                    c.expected_errors += 1;
                    let sid = c.sid.clone();
                    match (&c.state, self.rng.below(3)) {
                        // A second prompt while the reply streams.
                        (State::Prompting { .. }, 0) => {
                            json!({"type": "prompt", "session_id": sid, "content": "again",
                                   "message_index": c.count()})
                        }
                        // A prompt at the wrong index.
                        (_, 0 | 1) => {
                            json!({"type": "prompt", "session_id": sid, "content": "skip",
                                   "message_index": c.count() + 1 + self.rng.below(3)})
                        }
                        // A second start of a live session.
                        _ => json!({"type": "session_init", "session_id": sid, "job_id": job}),
                    }
                }
                None => json!({"type": "prompt", "session_id": "nobody", "content": "x",
                               "message_index": 1}),
            },
            _ => {
                // A resume whose last index does not match its context.
                json!({"type": "session_resume", "session_id": "r", "job_id": job,
                       "conversation_context": [{"role": "user", "content": "a"}],
                       "last_message_index": 3})
            }
        };
        ClientOp::Text(v.to_string())
    }

    fn on_error(&mut self, cx: &ClientCx<'_>, sid: &str, v: &Value) {
        let code = v["code"].as_str().unwrap_or("");
        let now = cx.now;
        let coin = chance(&mut self.rng, 0.5);
        let fresh_job = code == "invalid_request"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("job was not accepted"));
        let Some(c) = self.conv(sid) else {
            return;
        };
        let failure = matches!(
            code,
            "rate_limited"
                | "internal_error"
                | "context_length_exceeded"
                | "token_budget_exhausted"
        );
        if c.expected_errors > 0 && !(failure && matches!(c.state, State::Prompting { .. })) {
            c.expected_errors -= 1;
            return;
        }
        match &c.state {
            State::Starting { then } => {
                if then.is_some() {
                    // The batched prompt meets no session.
                    c.expected_errors += 1;
                }
                c.state = State::Idle;
                c.since = now;
                if code == "session_exists" && coin {
                    // Maybe held by this very connection: go on under a new id.
                    c.sid.push('e');
                }
                if code == "context_length_exceeded" {
                    // The conversation does not fit the window a reply of the
                    // default length leaves: start over, with less or nothing.
                    if c.history.len() > 3 {
                        c.history.drain(1..3);
                    } else {
                        c.history.clear();
                        c.tag_message = false;
                    }
                    c.started = false;
                    c.sid.push('c');
                }
            }
            State::Prompting { .. } | State::Ready | State::Ending if code == "unknown_session" => {
                // The server does not hold it (any more): resume it.
                c.state = State::Idle;
                c.started = true;
            }
            State::Prompting { .. } => {
                c.state = State::Ready;
                if code == "message_index_mismatch" {
                    // Out of step with the server: start over elsewhere.
                    c.state = State::Idle;
                    c.started = false;
                    c.sid.push('m');
                }
            }
            State::Ending => c.state = State::Ready,
            _ => {}
        }
        if code == "token_budget_exhausted" || fresh_job {
            let job = self.new_job();
            if let Some(c) = self.conv(sid) {
                c.job = job;
                if code == "token_budget_exhausted" {
                    c.state = State::Ending;
                }
            }
            if code == "token_budget_exhausted" {
                // A budget spent: end the session, a new one comes later.
                self.convs
                    .retain(|c| c.sid != sid || c.state != State::Ending);
            }
        }
    }
}

impl SimClient for SessionClient {
    fn dialect(&self) -> Dialect {
        Dialect::Session
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
        if self.convs.is_empty() {
            self.new_conversation(cx);
        }
        self.step(cx)
    }

    fn on_frame(&mut self, cx: &ClientCx<'_>, conn: ConnId, text: &str) -> Vec<ClientOp> {
        if !self.base.owns(conn) {
            return Vec::new();
        }
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return Vec::new();
        };
        let sid = v["session_id"].as_str().unwrap_or("").to_string();
        let now = cx.now;
        match v["type"].as_str().unwrap_or("") {
            "session_ready" => {
                if let Some(c) = self.conv(&sid) {
                    if let State::Starting { then } = &c.state {
                        c.started = true;
                        c.state = match then {
                            Some(content) => State::Prompting {
                                content: content.clone(),
                            },
                            None => State::Ready,
                        };
                    }
                }
            }
            "response" => {
                if let Some(c) = self.conv(&sid) {
                    if let State::Prompting { content } = &c.state {
                        let content = content.clone();
                        c.history.push(ChatMessage::new(Role::User, content));
                        c.history.push(ChatMessage::new(
                            Role::Assistant,
                            v["content"].as_str().unwrap_or("").to_string(),
                        ));
                        c.state = State::Ready;
                        c.since = now;
                    }
                }
                if !self.base.liveness {
                    let soon = think(&mut self.rng, cx) / 8;
                    return vec![ClientOp::Wake(soon)];
                }
            }
            "session_ended" => {
                self.convs.retain(|c| c.sid != sid);
            }
            "error" => self.on_error(cx, &sid, &v),
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
        let back = reconnect_after(&mut self.rng, Duration::from_secs(1));
        vec![ClientOp::Wake(back)]
    }
}

/// The signing key of a secret, if it is one (almost every 32 bytes are).
fn signing_key(secret: &[u8; 32]) -> Option<k256::ecdsa::SigningKey> {
    k256::ecdsa::SigningKey::from_slice(secret).ok()
}

/// The hex of `k`'s public key (SEC1, compressed).
fn public_key_hex(k: &k256::ecdsa::SigningKey) -> String {
    hex(&k.verifying_key().to_sec1_bytes())
}

/// A prompt's signature as PROTOCOLS.md has clients make it.
fn sign(k: &k256::ecdsa::SigningKey, sid: &str, index: u64, content: &str) -> String {
    use k256::ecdsa::signature::Signer;
    let sig: k256::ecdsa::Signature = k.sign(format!("{sid}\n{index}\n{content}").as_bytes());
    hex(&sig.to_bytes())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
