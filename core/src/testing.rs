//! Small deterministic parts for tests, examples and the simulator: the tiny
//! byte-level model's info, a scripted engine that needs no model, and a
//! virtual-time harness. Behind the `testing` feature: an embedder's build
//! does not carry them.

use std::collections::HashMap;
use std::sync::Arc;

use crate::constraint::{Grammar, TokenConstraint, TokenMask};
use crate::text::{SharedCodec, TextCodec};

use crate::engine::{ModelInfo, SeqId, SeqResult, StepDone, StepPlan, TokenId, TokenLogprobs};
pub use crate::text::byte::{ByteCodec, BYTE_BOS, BYTE_EOS, BYTE_OFFSET, BYTE_VOCAB};

/// Model info for a tiny byte-level model: context 512, 64 blocks of 16.
pub fn tiny_model_info() -> ModelInfo {
    ModelInfo {
        name: "tiny".into(),
        version: "test".into(),
        context_len: 512,
        vocab_size: BYTE_VOCAB,
        eos_ids: vec![BYTE_EOS],
        block_size: 16,
        num_blocks: 64,
        dtype: "f32".into(),
        embedding_size: SCRIPT_EMBEDDING_SIZE as u32,
        pooling: None,
    }
}

/// Values in a [`ScriptEngine`] embedding.
pub const SCRIPT_EMBEDDING_SIZE: usize = 4;

/// The vector a [`ScriptEngine`] returns for an embedding of `tokens`:
/// `[tokens, mean id, last id, 1]` (pooled by mean) or `[1, last id,
/// tokens, 0]` (by the last token), so tests can tell inputs and poolings
/// apart.
pub fn script_embedding(pooling: crate::engine::Pooling, tokens: &[TokenId]) -> Vec<f32> {
    let n = tokens.len() as f32;
    let last = tokens.last().copied().unwrap_or(0) as f32;
    match pooling {
        crate::engine::Pooling::Mean => {
            let mean = tokens.iter().map(|&t| t as f32).sum::<f32>() / n.max(1.0);
            vec![n, mean, last, 1.0]
        }
        crate::engine::Pooling::Last => vec![1.0, last, n, 0.0],
    }
}

/// The scores a [`ScriptEngine`] gives a prompt of `tokens`
/// ([`crate::engine::SeqStep::prompt_logprobs`] with `top` alternatives):
/// the token at position `p` (from 1) scores `-p / 4`, and its
/// alternatives are the ids after it, each one lower.
pub fn script_prompt_logprobs(tokens: &[TokenId], top: u8) -> Vec<TokenLogprobs> {
    (1..tokens.len())
        .map(|p| {
            let logprob = -(p as f32) / 4.0;
            TokenLogprobs {
                logprob,
                top: (0..top as TokenId)
                    .map(|i| (tokens[p] + i, logprob - i as f32))
                    .collect(),
            }
        })
        .collect()
}

/// A deterministic engine that needs no model: the token sampled after position
/// `p` is `script[(p + 1) % script.len()]` as a byte token (a `0` byte means EOS).
/// Because the choice depends only on the position, a sequence that is paused,
/// evicted and recomputed continues with the same tokens.
#[derive(Debug, Clone)]
pub struct ScriptEngine {
    script: Vec<u8>,
    /// Tokens fed per sequence, as the engine saw them (checks plan consistency).
    pub history: HashMap<SeqId, Vec<TokenId>>,
    /// Steps run so far.
    pub steps: u64,
    /// Sample the script's token even where a plan's mask forbids it (an
    /// engine that breaks the boundary's rule, for tests of the check).
    pub ignore_masks: bool,
}

impl ScriptEngine {
    /// An engine that writes `script` over and over (by position).
    pub fn new(script: &str) -> Self {
        ScriptEngine {
            script: script.as_bytes().to_vec(),
            history: HashMap::new(),
            steps: 0,
            ignore_masks: false,
        }
    }

    /// Runs one step. Panics if the plan feeds positions out of order: a test
    /// engine should shout about a scheduler bug.
    pub fn step(&mut self, plan: &StepPlan) -> StepDone {
        self.steps += 1;
        for f in &plan.forks {
            if !self.history.contains_key(&f.dst) {
                let h = self
                    .history
                    .get(&f.src)
                    .map_or(Vec::new(), |h| h[..(f.len as usize).min(h.len())].to_vec());
                self.history.insert(f.dst, h);
            }
        }
        for seq in &plan.free {
            self.history.remove(seq);
        }
        let mut results = Vec::new();
        for s in &plan.seqs {
            let h = self.history.entry(s.seq).or_default();
            if !s.cached_prefix.is_empty() {
                // Admitted onto cached blocks: this is its history.
                assert_eq!(
                    s.cached_prefix.len(),
                    s.start_pos as usize,
                    "seq {:?}: a cached prefix must end where its chunk starts",
                    s.seq
                );
                *h = s.cached_prefix.clone();
            }
            assert!(
                h.len() >= s.start_pos as usize,
                "seq {:?} fed at {} but engine holds {} tokens",
                s.seq,
                s.start_pos,
                h.len()
            );
            if s.prompt_logprobs.is_some() {
                assert!(
                    s.cached_prefix.is_empty() && s.draft.is_empty(),
                    "seq {:?} scores its prompt from cached blocks or with a draft",
                    s.seq
                );
            }
            h.truncate(s.start_pos as usize);
            h.extend_from_slice(&s.tokens);
            if !s.sample {
                continue;
            }
            if let Some(pooling) = s.embed {
                results.push(SeqResult {
                    seq: s.seq,
                    token: 0,
                    logprobs: None,
                    embedding: Some(script_embedding(pooling, h)),
                    prompt_logprobs: None,
                });
                continue;
            }
            // The script's token after the last position fed, then after
            // each draft token as long as those tokens confirm the draft.
            let mut p = s.start_pos as usize + s.tokens.len() - 1;
            let mut draft = s.draft.iter();
            loop {
                let byte = self.script[(p + 1) % self.script.len()];
                let mut token = if byte == 0 {
                    BYTE_EOS
                } else {
                    byte as TokenId + BYTE_OFFSET
                };
                // A constrained row: the script's token if allowed, else
                // the next allowed id after it (wrapping), as a sampler
                // that honours the mask would pick some allowed token.
                if let Some(mask) = s.allowed.as_deref().filter(|_| !self.ignore_masks) {
                    let n = mask.len().max(1);
                    if let Some(t) = (0..n).map(|i| (token + i) % n).find(|&t| mask.allows(t)) {
                        token = t;
                    }
                }
                let logprobs = s.logprobs.map(|n| TokenLogprobs {
                    logprob: -0.5,
                    top: (0..n as TokenId)
                        .map(|i| (token + i, -0.5 - i as f32))
                        .collect(),
                });
                results.push(SeqResult {
                    seq: s.seq,
                    token,
                    logprobs,
                    embedding: None,
                    prompt_logprobs: s
                        .prompt_logprobs
                        .map(|top| script_prompt_logprobs(h, top))
                        .filter(|_| p + 1 == h.len()),
                });
                match draft.next() {
                    Some(&d) if d == token => {
                        h.push(d);
                        p += 1;
                    }
                    _ => break,
                }
            }
        }
        StepDone {
            step_id: plan.step_id,
            results,
        }
    }
}

/// Drives a [`crate::Host`] with a [`ScriptEngine`] and virtual time, recording
/// what each connection receives. The model of quinn's test `Pair`: no sockets,
/// no threads, no sleeping; time moves only when the test says so.
pub struct Harness {
    /// The Host under test.
    pub host: crate::Host,
    /// The engine that answers its steps.
    pub engine: ScriptEngine,
    /// Current virtual time.
    pub now: crate::Instant,
    /// Frames sent to each connection, in order, parsed as JSON.
    pub frames: std::collections::BTreeMap<crate::ConnId, Vec<serde_json::Value>>,
    /// Close codes sent to each connection.
    pub closes: std::collections::BTreeMap<crate::ConnId, (u16, String)>,
    /// Every output other than frames, in order.
    pub others: Vec<crate::Output>,
    /// The step handed out and not yet answered.
    pub pending_step: Option<StepPlan>,
    /// Virtual time one engine step takes.
    pub step_time: crate::Duration,
    /// Steps run.
    pub steps_run: u64,
    /// Answer every ping with a pong at once (a live client). Off to test keepalive.
    pub auto_pong: bool,
    /// Run every text job at once and hand its result back. Off to hold them
    /// in `text_jobs` and answer with [`Harness::finish_text_jobs`].
    pub auto_text: bool,
    /// Text jobs handed out and not yet answered (when `auto_text` is off).
    pub text_jobs: Vec<crate::TextJob>,
    /// Text jobs handed out so far.
    pub text_jobs_run: u64,
    /// The verdict given at once to every job check (default: accepted, no cap).
    pub verdict: Result<crate::JobGrant, String>,
    /// Leave job checks unanswered (the test answers them with
    /// [`crate::Input::JobVerified`]); off by default.
    pub hold_verdicts: bool,
    /// Every job check handed out, in order.
    pub job_checks: Vec<crate::JobCheck>,
}

impl Harness {
    /// A harness serving the tiny byte model whose engine writes `script`.
    pub fn new(config: crate::HostConfig, script: &str, seed: u64) -> Self {
        Self::with_info(config, tiny_model_info(), script, seed)
    }

    /// Like [`Harness::new`] with explicit model info (e.g. fewer KV blocks).
    pub fn with_info(config: crate::HostConfig, info: ModelInfo, script: &str, seed: u64) -> Self {
        Self::with_codec(config, info, ByteCodec::shared(), script, seed)
    }

    /// Like [`Harness::with_info`] with another codec (e.g. [`DigitsCodec`]).
    pub fn with_codec(
        config: crate::HostConfig,
        info: ModelInfo,
        codec: SharedCodec,
        script: &str,
        seed: u64,
    ) -> Self {
        Harness {
            host: crate::Host::with_model(config, info, codec, seed),
            engine: ScriptEngine::new(script),
            now: crate::Instant::ZERO,
            frames: Default::default(),
            closes: Default::default(),
            others: Vec::new(),
            pending_step: None,
            step_time: crate::Duration::from_millis(10),
            steps_run: 0,
            auto_pong: true,
            auto_text: true,
            text_jobs: Vec::new(),
            text_jobs_run: 0,
            verdict: Ok(crate::JobGrant::default()),
            hold_verdicts: false,
            job_checks: Vec::new(),
        }
    }

    /// Feeds an input at the current time and collects the outputs.
    pub fn input(&mut self, input: crate::Input) {
        self.host.handle(self.now, input);
        self.drain();
    }

    fn drain(&mut self) {
        let mut pongs = Vec::new();
        let mut texts = Vec::new();
        let mut verdicts = Vec::new();
        while let Some(out) = self.host.poll_output() {
            match out {
                crate::Output::Tokenize(job) => {
                    self.text_jobs_run += 1;
                    if self.auto_text {
                        texts.push(job.run());
                    } else {
                        self.text_jobs.push(job);
                    }
                }
                crate::Output::Ping { conn } if self.auto_pong => {
                    pongs.push(conn);
                    self.others.push(crate::Output::Ping { conn });
                }
                crate::Output::Send { conn, text } => {
                    let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
                    self.frames.entry(conn).or_default().push(v);
                }
                crate::Output::Close { conn, code, reason } => {
                    self.closes.insert(conn, (code, reason));
                }
                crate::Output::VerifyJob(check) => {
                    if !self.hold_verdicts {
                        verdicts.push(crate::Input::JobVerified {
                            check: check.id,
                            verdict: self.verdict.clone(),
                        });
                    }
                    self.job_checks.push(check);
                }
                crate::Output::RunStep(plan) => {
                    assert!(self.pending_step.is_none(), "two steps outstanding");
                    self.pending_step = Some(plan);
                }
                other => self.others.push(other),
            }
        }
        for conn in pongs {
            self.input(crate::Input::Pong { conn });
        }
        for done in texts {
            self.input(crate::Input::Tokenized(done));
        }
        for v in verdicts {
            self.input(v);
        }
    }

    /// Answers the held text jobs, in the order they were handed out.
    pub fn finish_text_jobs(&mut self) {
        for job in std::mem::take(&mut self.text_jobs) {
            let done = job.run();
            self.input(crate::Input::Tokenized(done));
        }
    }

    /// Opens a WebSocket connection on `dialect`.
    pub fn open(&mut self, conn: u64, dialect: crate::Dialect) -> crate::ConnId {
        self.open_with(conn, dialect, "")
    }

    /// Opens the virtual connection of one HTTP request on `dialect` (the
    /// body then comes as one frame, as the shell sends it).
    pub fn open_http(&mut self, conn: u64, dialect: crate::Dialect) -> crate::ConnId {
        let id = crate::ConnId(conn);
        self.input(crate::Input::Open {
            conn: id,
            dialect,
            transport: crate::Transport::Http,
            query: String::new(),
            authorization: None,
            peer: "127.0.0.1:9".into(),
        });
        id
    }

    /// Opens a WebSocket connection on `dialect` whose upgrade carried
    /// `query` (without `?`).
    pub fn open_with(&mut self, conn: u64, dialect: crate::Dialect, query: &str) -> crate::ConnId {
        let id = crate::ConnId(conn);
        self.input(crate::Input::Open {
            conn: id,
            dialect,
            transport: crate::Transport::WebSocket,
            query: query.to_string(),
            authorization: None,
            peer: "127.0.0.1:9".into(),
        });
        id
    }

    /// Sends a text frame from a client.
    pub fn send(&mut self, conn: crate::ConnId, v: serde_json::Value) {
        self.send_raw(conn, &v.to_string());
    }

    /// Sends raw text from a client.
    pub fn send_raw(&mut self, conn: crate::ConnId, text: &str) {
        self.input(crate::Input::Text {
            conn,
            text: text.to_string(),
        });
    }

    /// Runs the outstanding step (if any): time advances by `step_time` and due
    /// timers fire first. Returns false when no step was outstanding.
    pub fn step(&mut self) -> bool {
        let Some(plan) = self.pending_step.take() else {
            return false;
        };
        self.advance(self.step_time);
        let done = self.engine.step(&plan);
        self.steps_run += 1;
        self.input(crate::Input::StepDone(done));
        true
    }

    /// Runs steps until none is outstanding or `max` steps ran.
    pub fn run(&mut self, max: usize) -> usize {
        let mut n = 0;
        while n < max && self.step() {
            n += 1;
        }
        n
    }

    /// Moves time forward by `d`, firing every timer that comes due on the way.
    pub fn advance(&mut self, d: crate::Duration) {
        let target = self.now + d;
        while let Some(t) = self.host.poll_timeout() {
            if t > target {
                break;
            }
            self.now = t.max(self.now);
            self.input(crate::Input::Timeout);
        }
        self.now = target;
    }

    /// Frames received by `conn` so far.
    pub fn received(&self, conn: crate::ConnId) -> &[serde_json::Value] {
        self.frames.get(&conn).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Frames of `kind` (`type` field) received by `conn`.
    pub fn of_type(&self, conn: crate::ConnId, kind: &str) -> Vec<serde_json::Value> {
        self.received(conn)
            .iter()
            .filter(|v| v["type"] == kind)
            .cloned()
            .collect()
    }

    /// Concatenation of the `token` fields received by `conn`.
    pub fn streamed_text(&self, conn: crate::ConnId) -> String {
        self.of_type(conn, "token")
            .iter()
            .filter_map(|v| v["token"].as_str().map(str::to_string))
            .collect()
    }
}

/// The text [`ScriptEngine`] writes after a prompt of `prompt_tokens` tokens,
/// for `n` tokens (before any stop string or EOS).
pub fn script_text(script: &str, prompt_tokens: usize, n: usize) -> String {
    let b = script.as_bytes();
    (0..n)
        .map(|i| b[(prompt_tokens + i) % b.len()] as char)
        .collect()
}

/// [`ByteCodec`] with a stand-in grammar engine, for tests of how
/// constrained generations flow through the core: every [`Grammar`]
/// compiles to [`DigitsConstraint`] (`digits` ASCII digits, then the end),
/// except a JSON Schema `{"not": {}}`, which (matching nothing) is refused.
///
/// With `think_tags` (made by [`DigitsCodec::thinking`]), bytes 1 and 2 are
/// the reasoning tags `<think>` and `</think>`, one token each as in
/// Qwen3's vocabulary: a script writes them as `\u{1}` and `\u{2}`.
#[derive(Debug, Clone, Copy)]
pub struct DigitsCodec {
    /// Digits each constrained output has.
    pub digits: usize,
    /// Whether bytes 1 and 2 stand for `<think>` and `</think>`.
    pub think_tags: bool,
}

/// The tags [`DigitsCodec::thinking`] gives a byte token each.
const THINK_BYTES: [(u8, &str); 2] = [(1, "<think>"), (2, "</think>")];

impl DigitsCodec {
    /// A codec of `digits`-digit outputs without tag tokens.
    pub fn new(digits: usize) -> DigitsCodec {
        DigitsCodec {
            digits,
            think_tags: false,
        }
    }

    /// A codec of `digits`-digit outputs whose reasoning tags are one token
    /// each.
    pub fn thinking(digits: usize) -> DigitsCodec {
        DigitsCodec {
            digits,
            think_tags: true,
        }
    }

    /// The codec behind the Host's shared handle.
    pub fn shared(digits: usize) -> SharedCodec {
        SharedCodec(Arc::new(DigitsCodec::new(digits)))
    }

    /// [`DigitsCodec::thinking`] behind the Host's shared handle.
    pub fn shared_thinking(digits: usize) -> SharedCodec {
        SharedCodec(Arc::new(DigitsCodec::thinking(digits)))
    }
}

impl TextCodec for DigitsCodec {
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, String> {
        let mut text = text.to_string();
        if self.think_tags {
            for (byte, tag) in THINK_BYTES {
                text = text.replace(tag, &char::from(byte).to_string());
            }
        }
        ByteCodec.encode(&text, add_special)
    }

    fn decode(&self, ids: &[TokenId]) -> String {
        let mut text = ByteCodec.decode(ids);
        if self.think_tags {
            for (byte, tag) in THINK_BYTES {
                text = text.replace(char::from(byte), tag);
            }
        }
        text
    }

    fn constrain(&self, grammar: &Grammar) -> Result<Box<dyn TokenConstraint>, String> {
        if let Grammar::JsonSchema { schema, .. } = grammar {
            if schema.get("not").is_some() {
                return Err("the schema matches nothing".into());
            }
        }
        Ok(Box::new(DigitsConstraint {
            left: self.digits,
            ended: false,
        }))
    }
}

/// A byte-token grammar: a fixed number of ASCII digits, then the end.
#[derive(Debug, Clone)]
pub struct DigitsConstraint {
    left: usize,
    ended: bool,
}

impl TokenConstraint for DigitsConstraint {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
        mask.clear();
        if self.left == 0 {
            mask.allow(BYTE_EOS);
        } else {
            for d in b'0'..=b'9' {
                mask.allow(d as TokenId + BYTE_OFFSET);
            }
        }
        Ok(())
    }

    fn advance(&mut self, token: TokenId) -> Result<(), String> {
        let digit =
            (b'0' as TokenId + BYTE_OFFSET..=b'9' as TokenId + BYTE_OFFSET).contains(&token);
        match (self.left, self.ended) {
            (_, true) => Err("ended".into()),
            (0, false) if token == BYTE_EOS => {
                self.ended = true;
                Ok(())
            }
            (n, false) if n > 0 && digit => {
                self.left -= 1;
                Ok(())
            }
            _ => Err(format!("token {token} is not allowed here")),
        }
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}
