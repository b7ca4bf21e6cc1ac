//! `POST /v1/embeddings`: the OpenAI Embeddings route, on the `chat`
//! machine. Each input (a string or token ids; up to [`MAX_INPUTS`] of them)
//! is tokenized off the Host's thread, then computed as an embedding
//! generation ([`GenRequest::embed`]): its prompt's final hidden states,
//! pooled by the server's `--pooling` ([`crate::HostConfig::embed_pooling`]),
//! come back as one vector, which this module normalizes to unit length
//! (after cutting it to `dimensions`, when asked) and writes as floats or
//! as base64 of little-endian f32s (what the OpenAI SDK asks for by
//! default). Inputs run [`WINDOW`] at a time (fewer when the connection's
//! share of the queue is smaller) and are tokenized two windows ahead, so a
//! request of 2,048 inputs fills neither the queue nor the tokenizer's pool;
//! the reply waits for the last.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::codec::BadRequest;
use crate::engine::{Pooling, SeqId, TokenId};
use crate::gen::{GenRequest, RequestPart, StartError};
use crate::json::{type_name, Fields};
use crate::params::GenParams;
use crate::text::{Encoded, TextJobId, CONTEXT_TOO_LONG};

/// Most inputs in one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Most inputs computing (queued or running) at once for one request.
pub const WINDOW: usize = 64;

/// How the vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// A JSON array of numbers.
    Float,
    /// Base64 of the vector's little-endian f32 bytes.
    Base64,
}

/// One input as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    /// Text, tokenized with the model's tokenizer (special tokens added as
    /// for a prompt).
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<TokenId>),
}

/// A decoded embeddings request.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedRequest {
    /// The model it names.
    pub model: String,
    /// Its inputs, in order.
    pub inputs: Vec<EmbedInput>,
    /// `input` was an array of inputs (errors name `input[i]`), not one
    /// string or one array of ids (errors name `input`).
    pub listed: bool,
    /// How the vectors are written.
    pub encoding: Encoding,
    /// Keep only the first this many values (then normalize).
    pub dimensions: Option<u32>,
    /// vLLM's `truncate_prompt_tokens`: each input cut to its last this
    /// many tokens before its length is checked.
    pub truncate_prompt_tokens: Option<u32>,
}

/// Decodes a body: `model`, `input` (a string, strings, ids, or arrays of
/// ids), `encoding_format`, `dimensions`; `user` and unknown fields are
/// ignored. Ids must be below `vocab`, id inputs at most `context_len` long,
/// `dimensions` at most `size`.
pub fn decode(
    obj: &Map<String, Value>,
    vocab: u32,
    context_len: u32,
    size: u32,
) -> Result<EmbedRequest, BadRequest> {
    let f = Fields::new(obj, "");
    let model = f.req_str("model").map_err(BadRequest::invalid)?.to_string();
    let truncate_prompt_tokens = super::codec::truncation(&f, context_len)?;
    let (inputs, listed) = inputs(f.raw("input"), vocab, context_len, truncate_prompt_tokens)?;
    let encoding = match f.str("encoding_format").map_err(BadRequest::invalid)? {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(BadRequest::field(
                "encoding_format",
                format!("must be `float` or `base64`, not `{other}`"),
            ))
        }
    };
    let dimensions = match f.u64("dimensions").map_err(BadRequest::invalid)? {
        None => None,
        Some(d) if d >= 1 && d <= u64::from(size) => Some(d as u32),
        Some(d) => {
            return Err(BadRequest::field(
                "dimensions",
                format!("must be from 1 to the model's embedding size, {size}, not {d}"),
            ))
        }
    };
    Ok(EmbedRequest {
        model,
        inputs,
        listed,
        encoding,
        dimensions,
        truncate_prompt_tokens,
    })
}

/// The inputs, and whether `input` listed them (an array of inputs).
fn inputs(
    v: Option<&Value>,
    vocab: u32,
    context_len: u32,
    truncate: Option<u32>,
) -> Result<(Vec<EmbedInput>, bool), BadRequest> {
    let ids = |field: String, items: &[Value], vocab: u32, context_len: u32| {
        ids(field, items, vocab, context_len, truncate)
    };
    let bad = |field: String, message: String| BadRequest::field(&field, message);
    let items = match v {
        None => return Err(bad("input".into(), "is required".into())),
        Some(Value::String(s)) => return Ok((vec![text("input".into(), s)?], false)),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(bad(
                "input".into(),
                format!(
                    "must be a string, an array of strings, or token ids, not {}",
                    type_name(other)
                ),
            ))
        }
    };
    if items.is_empty() {
        return Err(bad("input".into(), "must not be empty".into()));
    }
    // An array of numbers is one input of ids (as long as the context
    // allows); otherwise each item is one.
    if items.iter().all(Value::is_number) {
        return Ok((vec![ids("input".into(), items, vocab, context_len)?], false));
    }
    if items.len() > MAX_INPUTS {
        return Err(bad(
            "input".into(),
            format!("holds {} inputs; at most {MAX_INPUTS}", items.len()),
        ));
    }
    let inputs = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = format!("input[{i}]");
            match item {
                Value::String(s) => text(field, s),
                Value::Array(a) if !a.is_empty() => ids(field, a, vocab, context_len),
                Value::Array(_) => Err(bad(field, "must not be empty".into())),
                other => Err(bad(
                    field,
                    format!("must be a string or token ids, not {}", type_name(other)),
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok((inputs, true))
}

fn text(field: String, s: &str) -> Result<EmbedInput, BadRequest> {
    if s.is_empty() {
        return Err(BadRequest::field(&field, "must not be empty"));
    }
    Ok(EmbedInput::Text(s.to_string()))
}

fn ids(
    field: String,
    items: &[Value],
    vocab: u32,
    context_len: u32,
    truncate: Option<u32>,
) -> Result<EmbedInput, BadRequest> {
    let kept = match truncate {
        Some(k) => {
            super::codec::token_ids(&field, items, vocab)?;
            &items[items.len().saturating_sub(k as usize)..]
        }
        None => items,
    };
    super::codec::prompt_ids(&field, kept, vocab, context_len).map(EmbedInput::Ids)
}

/// Cuts `v` to `dimensions` values and scales it to unit length (a zero
/// vector stays zero).
pub fn finish_vector(mut v: Vec<f32>, dimensions: Option<u32>) -> Vec<f32> {
    if let Some(d) = dimensions {
        v.truncate(d as usize);
    }
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
    v
}

/// One vector as the route writes it.
pub fn encode_vector(v: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => Value::Array(v.iter().map(|&x| crate::json::f32_number(x)).collect()),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// A request in flight: its inputs' ids as they come back from the
/// tokenizer, the generations computing them, and their vectors.
#[derive(Debug)]
pub(super) struct Embedding {
    req: EmbedRequest,
    pooling: Pooling,
    /// Inputs computing at once: [`WINDOW`], or the connection's share of
    /// the queue when that is smaller.
    window: usize,
    /// Per input: its tokenizing job while one runs.
    jobs: Vec<Option<TextJobId>>,
    /// Per input: its ids, once known, until it starts.
    ids: Vec<Option<Vec<TokenId>>>,
    /// Per input: the generation computing it.
    seqs: Vec<Option<SeqId>>,
    /// Per input: its finished vector.
    vectors: Vec<Option<Vec<f32>>>,
    /// Inputs handed to the tokenizer (or whose ids were given) so far, in
    /// order: at most two windows ahead of `started`, so a large request
    /// does not fill the tokenizer's pool either.
    read: usize,
    /// Inputs started so far (they start in order).
    started: usize,
    /// Inputs whose vector came back.
    done: usize,
    /// Tokens of the inputs started.
    prompt_tokens: u64,
}

/// What the machine does next with a request.
#[derive(Debug)]
pub(super) enum Next {
    /// Keep waiting.
    Wait,
    /// Send this reply; the request is over.
    Reply(Value),
    /// Send this error; the request is over (its generations were ended).
    Fail(BadRequest),
}

impl Embedding {
    /// Starts a decoded request: the first inputs go to the tokenizer (or,
    /// given as ids, are ready), and those ready start.
    pub(super) fn begin(
        cx: &mut super::Cx<'_>,
        req: EmbedRequest,
        pooling: Pooling,
    ) -> (Embedding, Next) {
        let n = req.inputs.len();
        let share = cx.config().max_queued_per_conn as usize;
        let mut e = Embedding {
            window: WINDOW.min(share).max(1),
            jobs: vec![None; n],
            ids: vec![None; n],
            seqs: vec![None; n],
            vectors: vec![None; n],
            read: 0,
            started: 0,
            done: 0,
            prompt_tokens: 0,
            pooling,
            req,
        };
        let next = e.start_more(cx);
        (e, next)
    }

    /// Whether `job` is one of this request's tokenizing jobs.
    pub(super) fn waits_for(&self, job: TextJobId) -> bool {
        self.jobs.contains(&Some(job))
    }

    /// An input's ids came back from the tokenizer.
    pub(super) fn on_tokens(
        &mut self,
        cx: &mut super::Cx<'_>,
        job: TextJobId,
        result: Result<Encoded, String>,
    ) -> Next {
        let Some(i) = self.jobs.iter().position(|j| *j == Some(job)) else {
            return Next::Wait;
        };
        self.jobs[i] = None;
        let context_len = cx.model().context_len;
        let field = self.field(i);
        let result = result.map(|mut e| {
            if let Some(k) = self.req.truncate_prompt_tokens {
                // A text input keeps the special tokens its tokenizer adds.
                let added = cx.codec().encode("", true).unwrap_or_default();
                crate::text::cut_keeping_added(&mut e.ids, k as usize, &added);
            }
            e
        });
        match result {
            Ok(e) if e.dropped == 0 && e.ids.len() > context_len as usize => {
                return self.fail(cx, too_long(&field, context_len));
            }
            Ok(e) if e.dropped == 0 && !e.ids.is_empty() => self.ids[i] = Some(e.ids),
            Ok(e) if e.dropped == 0 => {
                return self.fail(cx, BadRequest::field(&field, "makes no tokens"));
            }
            Err(e) if !e.starts_with(CONTEXT_TOO_LONG) => {
                let message = format!("could not be tokenized: {e}");
                return self.fail(cx, BadRequest::field(&field, message));
            }
            _ => return self.fail(cx, too_long(&field, context_len)),
        }
        self.start_more(cx)
    }

    /// Starts inputs in order while their ids are known and the window has
    /// room, reading ahead as inputs start. The first input's start admits
    /// the request under its rate limits, and the others are parts of it
    /// (one request however many inputs). A full queue waits for one of the
    /// request's own inputs to finish, and fails the request only when none
    /// is computing.
    pub(super) fn start_more(&mut self, cx: &mut super::Cx<'_>) -> Next {
        loop {
            let waiting = match self.start_ready(cx) {
                Ok(waiting) => waiting,
                Err(e) => return self.fail(cx, e),
            };
            let read = self.read;
            if let Err(e) = self.read_ahead(cx) {
                return self.fail(cx, e);
            }
            // Inputs given as ids are ready as soon as they are read.
            let ready = self.ids.get(self.started).is_some_and(Option::is_some);
            if waiting || self.read == read || !ready {
                return Next::Wait;
            }
        }
    }

    /// Starts the inputs whose ids are known, in order, while the window
    /// has room; true when the queue made it stop early.
    fn start_ready(&mut self, cx: &mut super::Cx<'_>) -> Result<bool, BadRequest> {
        while self.started < self.ids.len() && self.started - self.done < self.window {
            let i = self.started;
            let Some(ids) = self.ids[i].take() else {
                return Ok(false); // still tokenizing
            };
            let tokens = ids.len() as u64;
            let start = cx.start(GenRequest {
                prompt_ids: ids.clone(),
                params: GenParams {
                    max_tokens: 0,
                    ..GenParams::defaults(0)
                },
                logprobs: None,
                raw: false,
                reuse_kv: None,
                constraint: None,
                embed: Some(self.pooling),
                prompt_logprobs: None,
                part: if i == 0 {
                    RequestPart::First
                } else {
                    RequestPart::NewPrompt
                },
            });
            match start {
                Ok(seq) => self.seqs[i] = Some(seq),
                Err(StartError::QueueFull | StartError::ConnQueueFull { .. })
                    if self.started > self.done =>
                {
                    self.ids[i] = Some(ids);
                    return Ok(true);
                }
                Err(e) => return Err(start_refusal(&e, &self.field(i))),
            }
            self.prompt_tokens += tokens;
            self.started += 1;
        }
        Ok(false)
    }

    /// Hands inputs to the tokenizer (or takes their ids) up to two windows
    /// past those started.
    fn read_ahead(&mut self, cx: &mut super::Cx<'_>) -> Result<(), BadRequest> {
        let until = (self.started + 2 * self.window).min(self.ids.len());
        while self.read < until {
            let i = self.read;
            match &self.req.inputs[i] {
                EmbedInput::Ids(ids) => self.ids[i] = Some(ids.clone()),
                EmbedInput::Text(t) if self.req.truncate_prompt_tokens.is_some() => {
                    match cx.encode_prompt_to_cut(t.clone()) {
                        Ok(job) => self.jobs[i] = Some(job),
                        Err(err) => return Err(start_refusal(&err, &self.field(i))),
                    }
                }
                EmbedInput::Text(t) => match cx.encode_prompt(t.clone(), 0) {
                    Ok(job) => self.jobs[i] = Some(job),
                    Err(err) => return Err(start_refusal(&err, &self.field(i))),
                },
            }
            self.read += 1;
        }
        Ok(())
    }

    /// Whether `id` computes one of this request's inputs.
    pub(super) fn owns(&self, id: SeqId) -> bool {
        self.seqs.contains(&Some(id))
    }

    /// An input's vector came back: the reply once it was the last.
    pub(super) fn on_vector(&mut self, cx: &mut super::Cx<'_>, id: SeqId, v: Vec<f32>) -> Next {
        let Some(i) = self.seqs.iter().position(|s| *s == Some(id)) else {
            return Next::Wait;
        };
        self.seqs[i] = None;
        self.vectors[i] = Some(finish_vector(v, self.req.dimensions));
        self.done += 1;
        if self.done == self.vectors.len() {
            return Next::Reply(self.reply());
        }
        self.start_more(cx)
    }

    /// Ends every generation still computing and answers with `e`.
    pub(super) fn fail(&mut self, cx: &mut super::Cx<'_>, e: BadRequest) -> Next {
        self.cancel(cx);
        Next::Fail(e)
    }

    /// Ends every generation still computing (one failed, or the request
    /// did).
    pub(super) fn cancel(&mut self, cx: &mut super::Cx<'_>) {
        for id in self.seqs.iter_mut().filter_map(Option::take) {
            cx.end(id, crate::gen::FinishReason::Cancelled);
        }
    }

    /// How errors name input `i`: `input[i]` when the body listed inputs.
    fn field(&self, i: usize) -> String {
        if self.req.listed {
            format!("input[{i}]")
        } else {
            "input".into()
        }
    }

    fn reply(&self) -> Value {
        let prompt_tokens = self.prompt_tokens;
        let data: Vec<Value> = self
            .vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let v = v.as_deref().unwrap_or(&[]);
                json!({"object": "embedding", "index": i, "embedding": encode_vector(v, self.req.encoding)})
            })
            .collect();
        json!({
            "object": "list",
            "data": data,
            "model": self.req.model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        })
    }
}

/// An input longer than the context.
fn too_long(field: &str, context_len: u32) -> BadRequest {
    BadRequest {
        code: "context_length_exceeded",
        ..BadRequest::field(
            field,
            format!("is longer than the context of {context_len} tokens"),
        )
    }
}

/// A refusal to tokenize or start the input `field` names, in the route's
/// terms.
fn start_refusal(e: &StartError, field: &str) -> BadRequest {
    match e {
        StartError::PromptTooLong { context_len, .. }
        | StartError::ContextLength { context_len, .. } => too_long(field, *context_len),
        StartError::NeverFits {
            needed_blocks,
            total_blocks,
        } => BadRequest {
            code: "context_length_exceeded",
            ..BadRequest::field(
                field,
                format!(
                    "needs {needed_blocks} KV cache blocks, more than the {total_blocks} the server holds"
                ),
            )
        },
        _ => {
            let (status, code, message) = super::openai::start_error(e, "max_tokens");
            BadRequest {
                status,
                code,
                message,
                param: None,
            }
        }
    }
}
