//! The `chat` dialect: the OpenAI Chat Completions (`POST
//! /v1/chat/completions`) and Completions (`POST /v1/completions`) routes,
//! over HTTP only. A request body becomes one frame on a virtual connection;
//! this machine decodes it ([`codec::decode`]), renders the messages with
//! the model's chat template (or takes the raw prompt), starts `n`
//! generations of the same prompt (the prefix cache shares its blocks) and
//! answers with one completion object, or with `stream: true` one chunk per
//! piece, a usage chunk when asked, and `[DONE]` ([`http`] writes them).
//!
//! `response_format` (`json_object`, `json_schema`), or vLLM's fields for
//! a choice, a regular expression or a grammar ([`crate::dialect::guided`]),
//! is compiled by the model's grammar engine before the prompt is tokenized
//! (one it cannot enforce is a 400 naming the field), and every choice
//! decodes under its own copy ([`crate::constraint`]).
//!
//! `tools` are rendered into the prompt ([`crate::tools`]); with
//! `tool_choice` `required` or a named function a grammar forces the
//! calls; each choice's answer runs through a [`CallSplitter`], so calls
//! come out as `tool_calls` (whole, in one chunk each when streamed) and
//! never as text.
//!
//! With a reasoning parser (`HostConfig::reasoning_tags`), a chat choice's
//! text goes through a [`ReasoningSplitter`] first: its thinking comes out
//! as `reasoning_content`, and only the answer reaches the call splitter
//! and `content`. A grammar then starts where the reasoning ends
//! ([`crate::reasoning_gate`]). `chat_template_kwargs` go to the template with the
//! messages ([`Cx::encode_chat_templated`]).
//!
//! Beside them, vLLM's `POST /tokenize`, `POST /detokenize` and `GET
//! /tokenizer_info` ([`tokenize`]): the ids of a prompt or a conversation,
//! as these routes tokenize them (the ids `logit_bias` names), the text of
//! ids, and the tokenizer's special tokens (what lm-evaluation-harness's
//! remote tokenizer reads).
//!
//! The `anthropic` dialect runs on this machine too: its Messages bodies
//! are a third route ([`codec::Route::Messages`], decoded by [`anthropic`]),
//! whose chunks carry the usage so far, name the stop string that ended
//! the answer, and start at admission, for that dialect's HTTP mapping to
//! write as Anthropic's events; its `max_tokens` is a ceiling the context
//! may lower ([`codec::ChatRequest::fit_to_context`]). Its
//! `count_tokens` is answered as `/tokenize` is, with the count alone.

mod anthropic;
pub mod codec;
pub mod embeddings;
pub mod http;
mod tokenize;

use serde_json::{json, Map, Value};

use self::codec::{error_body, BadRequest, ChatRequest, Input, PromptInput, Route};
use super::{openai, Cx, DialectConn};
use crate::constraint::Constraint;
use crate::dialect::openai::surface;
use crate::engine::{SeqId, TokenId, TokenLogprobs};
use crate::gen::{
    Failure, FailureKind, FinishReason, GenRequest, RequestPart, StartError, TokenPiece,
};
use crate::reasoning::{ReasoningSplitter, PROMPT_TAIL_TOKENS};
use crate::reasoning_gate::ReasoningPlan;
use crate::text::cut_keeping_added;
use crate::text::{Encoded, TextJobId, CONTEXT_TOO_LONG};
use crate::token_rules::TokenRules;
use crate::tools::{CallSplitter, ParsedCall, Released};

/// The finish reason of an answer that reached the context's end before
/// its length (the Messages route's, [`codec::ChatRequest::fit_to_context`];
/// Anthropic's `model_context_window_exceeded`).
pub const CONTEXT_WINDOW: &str = "context_window";

/// One choice being generated.
#[derive(Debug, Default)]
struct Choice {
    /// Its prompt's index (Completions may batch prompts).
    prompt: usize,
    seq: Option<SeqId>,
    text: String,
    /// `stop` or `length` once it ended.
    finish: Option<&'static str>,
    tokens: u32,
    /// Per-token log-probabilities, in the route's shape.
    logprobs: Vec<Value>,
    /// Its first chunk went out (chat: the one that names the role).
    announced: bool,
    /// The token before the next one (the prompt's last at first): a
    /// token's text is what it adds after it, leading space included.
    last: Option<TokenId>,
    /// Completions: where the next logprob token starts in the answer's
    /// text (after the echoed prompt, if any).
    offset: usize,
    /// With tools offered: holds back text that may be a call's markup and
    /// finds the calls.
    splitter: Option<CallSplitter>,
    /// The calls it made, with their ids.
    calls: Vec<(String, ParsedCall)>,
    /// With a reasoning parser: parts the text into reasoning and answer
    /// (before the tool-call splitter, which sees the answer only).
    thinker: Option<ReasoningSplitter>,
    /// Its reasoning so far (kept with `include_reasoning`).
    reasoning: String,
    /// The stop string that ended it, if one did (for Anthropic's
    /// `stop_sequence`).
    stop_sequence: Option<String>,
    /// Tokens generated up to the end of the reasoning, its tags included
    /// (0 for an answer without reasoning).
    reasoning_tokens: u32,
}

/// The request in flight (one per virtual connection).
#[derive(Debug)]
struct Request {
    req: ChatRequest,
    id: String,
    created: u64,
    /// Its prompts: one, or a Completions batch. Choice `i` is prompt
    /// `i / n`'s.
    prompts: Vec<PromptState>,
    choices: Vec<Choice>,
    /// Choices refused a start for want of queue room (or by a rate limit)
    /// while others of this request ran, in order: tried again as each
    /// choice ends.
    waiting: std::collections::VecDeque<usize>,
    /// `response_format`'s compiled grammar, as each prompt's choices start
    /// from it ([`PromptState::constraint`]).
    constraint: Option<Constraint>,
    /// How a reasoning parser reads this answer, when it is split
    /// ([`reasoning_plan`]).
    reasoning: Option<ReasoningPlan>,
    /// `allowed_token_ids` and `bad_words`, put around each prompt's
    /// grammar (outside the reasoning gate: they hold while it thinks too).
    rules: TokenRules,
    /// The length was cut to what the context leaves after the prompt
    /// ([`codec::ChatRequest::fit_to_context`]): reaching it is reaching
    /// the context's end.
    capped: bool,
}

/// One prompt of a request.
#[derive(Debug, Default)]
struct PromptState {
    /// Its text, for completions' `echo`.
    text: String,
    /// Waiting for its tokens.
    tokenizing: Option<TextJobId>,
    /// Its token ids, once known.
    ids: Vec<TokenId>,
    /// Its tokens whose K/V its first choice found in the prefix cache.
    cached: u32,
    /// The grammar its choices start with: the request's, waiting for the
    /// reasoning to end where its prompt opened it.
    constraint: Option<Constraint>,
    /// Completions' `echo` with `logprobs`: its own logprobs object (the
    /// first token unscored), from its first choice's first piece, opening
    /// each of its choices'.
    scores: Option<Value>,
}

/// One `chat` (or `anthropic`) request's machine.
#[derive(Debug, Default)]
pub struct ChatConn {
    inflight: Option<Request>,
    /// A `/v1/embeddings` request in flight.
    embedding: Option<embeddings::Embedding>,
    /// A `/tokenize` or `count_tokens` request waiting for its tokens, and
    /// which of the two.
    tokenizing: Option<(TextJobId, Counting)>,
}

/// Which route asked for a prompt's tokens alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// vLLM's `/tokenize`: the ids and their count.
    Tokenize,
    /// Anthropic's `/v1/messages/count_tokens`: the count.
    CountTokens,
}

/// Checks a body's optional `model` against the served one (a 404 when it
/// names another).
fn other_model(cx: &mut Cx<'_>, body: &Map<String, Value>) -> bool {
    let served = cx.model().name.clone();
    match body.get("model") {
        None | Some(Value::Null) => false,
        Some(Value::String(m)) if *m == served => false,
        Some(Value::String(m)) => {
            let message =
                format!("the model `{m}` does not exist on this server; it serves `{served}`");
            send_error(cx, 404, "model_not_found", &message, Some("model"));
            true
        }
        Some(other) => {
            let message = format!(
                "`model` must be a string, got {}",
                crate::json::type_name(other)
            );
            send_error(cx, 400, "invalid_request", &message, Some("model"));
            true
        }
    }
}

/// `/detokenize`: the text of the ids, answered at once.
fn on_detokenize(cx: &mut Cx<'_>, body: &Map<String, Value>) {
    if other_model(cx, body) {
        return;
    }
    let (vocab, context_len) = (cx.model().vocab_size, cx.model().context_len);
    match tokenize::decode_detokenize(body, vocab, context_len) {
        Ok(ids) => {
            let text = cx.codec().decode(&ids);
            cx.send(json!({"kind": "reply", "data": tokenize::detokenize_reply(&text)}));
        }
        Err(e) => refuse(cx, &e),
    }
}

/// `/tokenize`'s (or `count_tokens`') tokens came back.
fn on_tokenized(cx: &mut Cx<'_>, counting: Counting, result: Result<Encoded, String>) {
    let context_len = cx.model().context_len;
    match result {
        Ok(e) if e.dropped == 0 => {
            let reply = match counting {
                Counting::Tokenize => tokenize::tokenize_reply(&e.ids, context_len),
                Counting::CountTokens => json!({"input_tokens": e.ids.len()}),
            };
            cx.send(json!({"kind": "reply", "data": reply}));
        }
        Ok(_) => too_long_to_tokenize(cx, context_len),
        Err(e) if e.starts_with(CONTEXT_TOO_LONG) => too_long_to_tokenize(cx, context_len),
        Err(e) => {
            let message = format!("the input could not be tokenized: {e}");
            send_error(cx, 400, "invalid_request", &message, kwargs_field(&e));
        }
    }
}

/// `chat_template_kwargs` when the codec refused them (its errors start
/// with the field's name).
fn kwargs_field(error: &str) -> Option<&'static str> {
    error
        .starts_with("chat_template_kwargs")
        .then_some("chat_template_kwargs")
}

fn too_long_to_tokenize(cx: &mut Cx<'_>, context_len: u32) {
    let message = format!("the conversation does not fit the context ({context_len} tokens)");
    send_error(
        cx,
        400,
        "context_length_exceeded",
        &message,
        Some("messages"),
    );
}

/// Sends a refusal: the frame the HTTP mapping turns into an error reply
/// (or, once streaming, a last error event).
fn send_error(
    cx: &mut Cx<'_>,
    status: u16,
    code: &'static str,
    message: &str,
    param: Option<&str>,
) {
    cx.count_error(code);
    cx.send(json!({"kind": "error", "status": status, "data": error_body(status, code, message, param)}));
}

fn refuse(cx: &mut Cx<'_>, e: &BadRequest) {
    send_error(cx, e.status, e.code, &e.message, e.param.as_deref());
}

impl ChatConn {
    fn on_request(&mut self, cx: &mut Cx<'_>, route: Route, body: &Map<String, Value>) {
        let context_len = cx.model().context_len;
        let vocab_size = cx.model().vocab_size;
        let default_max = cx.config().default_max_tokens;
        let mut req = match codec::decode(route, body, default_max, context_len, vocab_size) {
            Ok(r) => r,
            Err(e) => return refuse(cx, &e),
        };
        let served = cx.model().name.clone();
        if req.model != served {
            let message = format!(
                "the model `{}` does not exist on this server; it serves `{served}`",
                req.model
            );
            return send_error(cx, 404, "model_not_found", &message, Some("model"));
        }
        let constraint = match openai::output_constraint(
            cx.codec(),
            req.format.as_ref(),
            req.format_field,
            &req.tools,
            cx.codec().tool_format(),
        ) {
            Ok(c) => c,
            Err((field, message)) => {
                return send_error(cx, 400, "invalid_request", &message, Some(field))
            }
        };
        if constraint.is_some() {
            // A grammar's end is the answer's end: past it the grammar
            // allows nothing, so `ignore_eos` cannot go on.
            req.params.ignore_eos = false;
        }
        let max_tokens = req.params.max_tokens;
        let mut prompts = Vec::new();
        match &mut req.input {
            Input::Messages(m) => {
                let budget = if req.truncate_prompt_tokens.is_some() {
                    // Cut once tokenized ([`ChatConn::on_tokens`]): no
                    // message is left out to fit.
                    u32::MAX
                } else if req.fit_to_context {
                    context_len.saturating_sub(1)
                } else {
                    context_len.saturating_sub(max_tokens)
                };
                let tools = req.tools.prompt_defs().to_vec();
                let kwargs = req.template_kwargs.clone();
                match cx.encode_chat_templated(m.clone(), usize::MAX, budget, tools, kwargs) {
                    Ok(job) => prompts.push(PromptState {
                        tokenizing: Some(job),
                        ..PromptState::default()
                    }),
                    Err(e) => {
                        let (status, code, message) = openai::start_error(&e, "max_tokens");
                        return send_error(cx, status, code, &message, Some("messages"));
                    }
                }
            }
            Input::Prompts(list) => {
                for p in list.iter_mut() {
                    let cut = req.truncate_prompt_tokens.is_some();
                    match start_prompt(cx, p, req.suffix.as_deref(), max_tokens, cut) {
                        Ok(state) => prompts.push(state),
                        Err(e) => {
                            // Prompts handed to the tokenizer come back to
                            // no request.
                            return refuse(cx, &e);
                        }
                    }
                }
            }
        }
        let n = req.n as usize;
        if prompts.len() * n > codec::MAX_PROMPTS {
            let message = format!(
                "{} prompts of {n} choices each are more than the {} choices one request may have",
                prompts.len(),
                codec::MAX_PROMPTS
            );
            return send_error(cx, 400, "invalid_request", &message, Some("n"));
        }
        let prefix = match route {
            Route::Chat => "chatcmpl-",
            Route::Completions => "cmpl-",
            Route::Messages => "msg_",
        };
        let choices = (0..prompts.len() * n)
            .map(|i| Choice {
                prompt: i / n,
                splitter: req
                    .tools
                    .active()
                    .then(|| CallSplitter::new(cx.codec().tool_format(), &req.tools.defs)),
                ..Choice::default()
            })
            .collect();
        let reasoning = reasoning_plan(cx, &req, constraint.is_some());
        let rules = token_rules(cx, &req);
        self.inflight = Some(Request {
            reasoning,
            rules,
            id: cx.new_id(prefix),
            created: cx.unix_ms() / 1000,
            prompts,
            choices,
            waiting: std::collections::VecDeque::new(),
            constraint,
            capped: false,
            req,
        });
        // Prompts given as ids are ready now.
        for p in 0..self.inflight.as_ref().map_or(0, |r| r.prompts.len()) {
            let given = self.inflight.as_mut().and_then(|r| {
                let state = &mut r.prompts[p];
                (state.tokenizing.is_none()).then(|| std::mem::take(&mut state.ids))
            });
            if let Some(ids) = given {
                self.on_tokens(cx, p, Ok(Encoded { ids, dropped: 0 }));
            }
        }
    }

    /// `/v1/embeddings`: decodes the body and starts tokenizing its inputs.
    fn on_embeddings(&mut self, cx: &mut Cx<'_>, body: &Map<String, Value>) {
        let Some(pooling) = cx.config().embed_pooling.resolve(cx.model()) else {
            let message = "this server does not serve embeddings (it runs with --pooling off)";
            return send_error(cx, 400, "invalid_request", message, None);
        };
        let m = cx.model();
        let (vocab, context_len, size) = (m.vocab_size, m.context_len, m.embedding_size);
        let req = match embeddings::decode(body, vocab, context_len, size) {
            Ok(r) => r,
            Err(e) => return refuse(cx, &e),
        };
        if other_model(cx, body) {
            return;
        }
        let (e, next) = embeddings::Embedding::begin(cx, req, pooling);
        self.embedding = Some(e);
        self.settle_embedding(cx, next);
    }

    /// Acts on what an embeddings request does next.
    fn settle_embedding(&mut self, cx: &mut Cx<'_>, next: embeddings::Next) {
        match next {
            embeddings::Next::Wait => {}
            embeddings::Next::Reply(reply) => {
                self.embedding = None;
                cx.send(json!({"kind": "reply", "data": reply}));
            }
            embeddings::Next::Fail(e) => {
                self.embedding = None;
                refuse(cx, &e);
            }
        }
    }

    /// `/tokenize`: starts the tokenizing job (answered in
    /// [`on_tokenized`]).
    fn on_tokenize(&mut self, cx: &mut Cx<'_>, body: &Map<String, Value>) {
        if other_model(cx, body) {
            return;
        }
        let context_len = cx.model().context_len;
        let job = match tokenize::decode_tokenize(body) {
            Ok(tokenize::ToTokenize::Prompt(p, add_special)) => {
                cx.encode_text(p, 0, add_special).map_err(|e| (e, "prompt"))
            }
            Ok(tokenize::ToTokenize::Messages(m, tools, kwargs)) => cx
                .encode_chat_templated(m, usize::MAX, context_len, tools, kwargs)
                .map_err(|e| (e, "messages")),
            Err(e) => return refuse(cx, &e),
        };
        match job {
            Ok(job) => self.tokenizing = Some((job, Counting::Tokenize)),
            Err((e, field)) => {
                let (status, code, message) = openai::start_error(&e, "max_tokens");
                send_error(cx, status, code, &message, Some(field));
            }
        }
    }

    /// Anthropic's `count_tokens`: the conversation (with its tools)
    /// rendered as `/v1/messages` renders it, counted (answered in
    /// [`on_tokenized`]).
    fn on_count_tokens(&mut self, cx: &mut Cx<'_>, body: &Map<String, Value>) {
        if other_model(cx, body) {
            return;
        }
        let context_len = cx.model().context_len;
        let prompt = match anthropic::prompt(&crate::json::Fields::new(body, "")) {
            Ok(p) => p,
            Err(e) => return refuse(cx, &e),
        };
        let tools = prompt.tools.prompt_defs().to_vec();
        let kwargs = prompt.template_kwargs();
        match cx.encode_chat_templated(prompt.messages, usize::MAX, context_len, tools, kwargs) {
            Ok(job) => self.tokenizing = Some((job, Counting::CountTokens)),
            Err(e) => {
                let (status, code, message) = openai::start_error(&e, "max_tokens");
                send_error(cx, status, code, &message, Some("messages"));
            }
        }
    }

    /// Prompt `p`'s tokens are known: its first choice starts (or the
    /// request fails with the tokenizer's error).
    fn on_tokens(&mut self, cx: &mut Cx<'_>, p: usize, result: Result<Encoded, String>) {
        let Some(r) = self.inflight.as_mut() else {
            return;
        };
        r.prompts[p].tokenizing = None;
        let field = match r.req.route {
            Route::Chat | Route::Messages => "messages",
            Route::Completions => "prompt",
        };
        let context_len = cx.model().context_len;
        let too_long = if r.req.fit_to_context {
            // Anthropic's wording, which its clients read to offer
            // compacting the conversation.
            format!(
                "prompt is too long: it does not fit the context of {context_len} tokens with one token left for the answer"
            )
        } else {
            format!(
                "the input does not fit the context beside max_tokens ({})",
                r.req.params.max_tokens
            )
        };
        let mut encoded = match result {
            Ok(e) if e.dropped == 0 => e,
            Ok(_) => {
                return self.fail(cx, 400, "context_length_exceeded", &too_long, Some(field));
            }
            Err(e) if e.starts_with(CONTEXT_TOO_LONG) => {
                return self.fail(cx, 400, "context_length_exceeded", &too_long, Some(field));
            }
            Err(e) => {
                let message = format!("the input could not be tokenized: {e}");
                let field = kwargs_field(&e).unwrap_or(field);
                return self.fail(cx, 400, "invalid_request", &message, Some(field));
            }
        };
        if let Some(k) = r.req.truncate_prompt_tokens.map(|k| k as usize) {
            if encoded.ids.len() > k {
                match r.req.route {
                    // A text prompt keeps the BOS its tokenizer added (the
                    // ids given as a prompt were cut as given).
                    Route::Completions => {
                        let added = cx.codec().encode("", true).unwrap_or_default();
                        cut_keeping_added(&mut encoded.ids, k, &added);
                    }
                    // A conversation's BOS is its template's text: cut as
                    // any other token.
                    Route::Chat | Route::Messages => {
                        encoded.ids.drain(..encoded.ids.len() - k);
                    }
                }
                // An echo shows the prompt the model read.
                r.prompts[p].text = cx.codec().decode(&encoded.ids);
            }
        }
        let room = context_len.saturating_sub(encoded.ids.len() as u32);
        if r.req.fit_to_context && room < r.req.params.max_tokens {
            // Messages: one prompt, so the request's length is its.
            r.req.params.max_tokens = room;
            r.capped = true;
        }
        let n = r.req.n as usize;
        let mut constraint = r.constraint.clone();
        if let Some(plan) = r.reasoning {
            // Whether the template opened the reasoning is read off the
            // prompt's last tokens.
            let tail = &encoded.ids[encoded.ids.len().saturating_sub(PROMPT_TAIL_TOKENS)..];
            let opened = plan.tags.opened_by(&cx.codec().decode(tail));
            for c in &mut r.choices[p * n..(p + 1) * n] {
                c.thinker = Some(plan.splitter(opened));
            }
            // A grammar waits for the reasoning to end.
            constraint = plan.constrain(constraint, opened);
        }
        let prompt = &mut r.prompts[p];
        prompt.ids = encoded.ids;
        prompt.constraint = r.rules.wrap(constraint, cx.model().vocab_size);
        // The first choice alone computes the prompt; the others start once
        // it has (its first token), and find the prompt's full blocks in
        // the prefix cache instead of computing them again.
        self.start_choices(cx, [p * n]);
    }

    /// Ends the request in flight with an error: every choice still
    /// running is cancelled (whichever prompt it answers), then the error
    /// goes out.
    fn fail(
        &mut self,
        cx: &mut Cx<'_>,
        status: u16,
        code: &'static str,
        message: &str,
        param: Option<&str>,
    ) {
        if let Some(r) = self.inflight.take() {
            let live = r.choices.iter().filter(|c| c.finish.is_none());
            for s in live.filter_map(|c| c.seq) {
                cx.end(s, FinishReason::Cancelled);
            }
        }
        send_error(cx, status, code, message, param);
    }

    /// Starts choices `indices`, in order. The first start admits the
    /// request under its rate limits; the others are parts of it, never
    /// refused by a limit (one request however many prompts and choices).
    /// A start refused for queue room, while another choice of the request
    /// runs, waits with those after it for a choice to end; any other
    /// refusal (or one with nothing running) ends every choice started and
    /// answers with the error.
    fn start_choices(&mut self, cx: &mut Cx<'_>, indices: impl IntoIterator<Item = usize>) {
        let Some(r) = self.inflight.as_mut() else {
            return;
        };
        let n = r.req.n as usize;
        let mut indices = indices.into_iter();
        while let Some(i) = indices.next() {
            let j = i % n;
            let prompt = &r.prompts[r.choices[i].prompt];
            let mut params = r.req.params.clone();
            // Seeded choices differ from each other and repeat run to run
            // (a prompt's in a batch as alone).
            params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
            let part = if !r.choices.iter().any(|c| c.seq.is_some()) {
                RequestPart::First
            } else if j == 0 {
                RequestPart::NewPrompt
            } else {
                RequestPart::SamePrompt
            };
            let start = cx.start(GenRequest {
                prompt_ids: prompt.ids.clone(),
                params,
                logprobs: r.req.logprobs,
                raw: false,
                reuse_kv: None,
                constraint: prompt.constraint.clone(),
                embed: None,
                // A prompt's first choice scores the echoed prompt for all
                // of its choices.
                prompt_logprobs: r.req.logprobs.filter(|_| r.req.echo && j == 0),
                part,
            });
            match start {
                Ok(seq) => {
                    r.choices[i].seq = Some(seq);
                    r.choices[i].last = prompt.ids.last().copied();
                }
                Err(StartError::QueueFull | StartError::ConnQueueFull { .. })
                    if r.choices
                        .iter()
                        .any(|c| c.seq.is_some() && c.finish.is_none()) =>
                {
                    r.waiting.push_back(i);
                    r.waiting.extend(indices);
                    return;
                }
                Err(e) => {
                    let (status, code, message) = openai::start_error(&e, "max_tokens");
                    // A prompt that does not fit (one of a batch) is named.
                    let param = match (&e, r.req.route) {
                        (StartError::ContextLength { .. }, Route::Completions) => Some("prompt"),
                        _ => None,
                    };
                    return self.fail(cx, status, code, &message, param);
                }
            }
        }
    }

    /// The log-probability entry of one token, in the route's shape.
    fn logprob_entry(
        cx: &Cx<'_>,
        route: Route,
        last: Option<TokenId>,
        token: TokenId,
        piece: &TokenPiece,
    ) -> Option<Value> {
        let lp = piece.logprobs.as_ref()?;
        let text = |t: TokenId| surface(cx.codec(), last, t);
        Some(match route {
            Route::Chat | Route::Messages => openai::token_logprob(cx.codec(), last, token, lp),
            Route::Completions => {
                let top: Map<String, Value> =
                    lp.top.iter().map(|&(t, l)| (text(t), json!(l))).collect();
                json!({"token": text(token), "logprob": lp.logprob, "top": top})
            }
        })
    }

    /// A streamed chunk for choice `index`: more of its answer's `text`
    /// and (chat, with a reasoning parser) of its `reasoning`.
    fn chunk(
        r: &Request,
        index: usize,
        text: &str,
        reasoning: &str,
        logprobs: Option<(Value, usize)>,
        finish: Option<&str>,
        role: bool,
    ) -> Value {
        let mut choice = match r.req.route {
            Route::Chat | Route::Messages => {
                let mut delta = Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if !reasoning.is_empty() {
                    delta.insert("reasoning_content".into(), json!(reasoning));
                }
                if !text.is_empty() || (role && reasoning.is_empty()) {
                    delta.insert("content".into(), json!(text));
                }
                json!({
                    "index": index,
                    "delta": delta,
                    "logprobs": logprobs.map(|(l, _)| json!({"content": [l], "refusal": null})),
                    "finish_reason": finish,
                })
            }
            Route::Completions => json!({
                "index": index,
                "text": text,
                "logprobs": logprobs.map(|(l, offset)| completion_logprobs(&[l], offset)),
                "finish_reason": finish,
            }),
        };
        if choice["logprobs"].is_null()
            && r.req.route != Route::Completions
            && r.req.logprobs.is_none()
        {
            choice.as_object_mut().map(|c| c.remove("logprobs"));
        }
        if r.req.route == Route::Messages && finish.is_some() {
            choice["stop_sequence"] = json!(r.choices[index].stop_sequence);
        }
        Self::with_running_usage(
            r,
            json!({
                "id": r.id,
                "object": r.req.route.chunk_object(),
                "created": r.created,
                "model": r.req.model,
                "choices": [choice],
            }),
        )
    }

    /// A Messages chunk carries the usage so far (vLLM's continuous usage
    /// statistics): Anthropic's `message_start` tells the prompt's tokens.
    fn with_running_usage(r: &Request, mut chunk: Value) -> Value {
        if r.req.route == Route::Messages {
            chunk["usage"] = Self::usage(r);
        }
        chunk
    }

    /// A streamed chunk carrying choice `index`'s call `k` whole (its
    /// id, name and arguments in one `delta.tool_calls` entry, which the
    /// SDKs' stream accumulators take as they take a split one).
    fn call_chunk(r: &Request, index: usize, k: usize) -> Value {
        let (id, call) = &r.choices[index].calls[k];
        let chunk = json!({
            "id": r.id,
            "object": r.req.route.chunk_object(),
            "created": r.created,
            "model": r.req.model,
            "choices": [{
                "index": index,
                "delta": {"tool_calls": [{
                    "index": k,
                    "id": id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }]},
                "finish_reason": null,
            }],
        });
        Self::with_running_usage(r, chunk)
    }

    fn usage(r: &Request) -> Value {
        let completion: u32 = r.choices.iter().map(|c| c.tokens).sum();
        let prompt: u32 = r.prompts.iter().map(|p| p.ids.len() as u32).sum();
        let mut u = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        });
        if r.req.route != Route::Completions {
            let cached: u32 = r.prompts.iter().map(|p| p.cached).sum();
            u["prompt_tokens_details"] = json!({"cached_tokens": cached});
        }
        if r.reasoning.is_some() {
            let reasoning: u32 = r.choices.iter().map(|c| c.reasoning_tokens).sum();
            u["completion_tokens_details"] = json!({"reasoning_tokens": reasoning});
        }
        u
    }

    /// Every choice ended: the whole answer, or the stream's last frames.
    fn complete(&mut self, cx: &mut Cx<'_>) {
        let Some(r) = self.inflight.take() else {
            return;
        };
        if r.req.stream {
            if r.req.include_usage {
                cx.send(json!({"kind": "chunk", "data": {
                    "id": r.id,
                    "object": r.req.route.chunk_object(),
                    "created": r.created,
                    "model": r.req.model,
                    "choices": [],
                    "usage": Self::usage(&r),
                }}));
            }
            cx.send(json!({"kind": "done"}));
            return;
        }
        let choices: Vec<Value> = r
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| match r.req.route {
                Route::Chat => json!({
                    "index": i,
                    "message": message(c, r.reasoning.is_some() && r.req.include_reasoning),
                    "logprobs": r.req.logprobs.map(|_| json!({"content": c.logprobs, "refusal": null})),
                    "finish_reason": c.finish,
                }),
                Route::Messages => json!({
                    "index": i,
                    "message": message(c, r.reasoning.is_some() && r.req.include_reasoning),
                    "finish_reason": c.finish,
                    "stop_sequence": c.stop_sequence,
                }),
                Route::Completions => {
                    let prompt = &r.prompts[c.prompt];
                    let echo = if r.req.echo { prompt.text.as_str() } else { "" };
                    json!({
                        "index": i,
                        "text": format!("{echo}{}", c.text),
                        "logprobs": r.req.logprobs.map(|_| {
                            let answer = completion_logprobs(&c.logprobs, echo.len());
                            match (r.req.echo, &prompt.scores) {
                                (true, Some(p)) => echoed_logprobs(p, answer),
                                _ => answer,
                            }
                        }),
                        "finish_reason": c.finish,
                    })
                }
            })
            .collect();
        cx.send(json!({"kind": "reply", "data": {
            "id": r.id,
            "object": r.req.route.object(),
            "created": r.created,
            "model": r.req.model,
            "choices": choices,
            "usage": Self::usage(&r),
        }}));
    }
}

/// A chat choice's `message`: its text, and its calls when it made any
/// (then `content` is null unless it also wrote text); with `reasoning`,
/// its `reasoning_content` (null when it wrote none).
fn message(c: &Choice, reasoning: bool) -> Value {
    let mut m = message_without_reasoning(c);
    if reasoning {
        m["reasoning_content"] = if c.reasoning.is_empty() {
            Value::Null
        } else {
            json!(c.reasoning)
        };
    }
    m
}

/// A request's `allowed_token_ids` and `bad_words` as token ids: each bad
/// word as vLLM tokenizes it, its leading whitespace dropped, and also
/// with one space before it where that is as many tokens and starts with
/// another one (the word in the middle of a text).
fn token_rules(cx: &Cx<'_>, req: &ChatRequest) -> TokenRules {
    let mut bad_words = Vec::new();
    for word in &req.bad_words {
        let word = word.trim_start();
        let Ok(alone) = cx.codec().encode(word, false) else {
            continue;
        };
        if let Ok(spaced) = cx.codec().encode(&format!(" {word}"), false) {
            if spaced.len() == alone.len() && spaced.first() != alone.first() {
                bad_words.push(spaced);
            }
        }
        bad_words.push(alone);
    }
    TokenRules {
        allowed: req.allowed_token_ids.clone(),
        bad_words,
        eos: cx.model().eos_ids.clone(),
    }
}

/// How to read this request's answers: the server's reasoning parser, for
/// chat answers. Under a grammar (`response_format`, forced calls) the
/// grammar waits for the reasoning to end where the model's tags are one
/// token each ([`ReasoningPlan::new`]); where not, the grammar's text is
/// all answer and nothing is split. A thinking budget is enforced where
/// the tags are one token each.
fn reasoning_plan(cx: &Cx<'_>, req: &ChatRequest, constrained: bool) -> Option<ReasoningPlan> {
    let tags = cx.config().reasoning_tags?;
    if req.route == Route::Completions {
        return None;
    }
    let vocab = cx.model().vocab_size;
    ReasoningPlan::new(tags, cx.codec(), constrained, req.thinking_budget, vocab)
}

fn message_without_reasoning(c: &Choice) -> Value {
    if c.calls.is_empty() {
        return json!({"role": "assistant", "content": c.text, "refusal": null});
    }
    let calls: Vec<Value> = c
        .calls
        .iter()
        .map(|(id, call)| {
            json!({"id": id, "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments}})
        })
        .collect();
    let content = (!c.text.is_empty()).then(|| c.text.clone());
    json!({"role": "assistant", "content": content, "refusal": null, "tool_calls": calls})
}

/// Completions' `logprobs` object from per-token entries, offsets counted
/// from `start` bytes into the text.
fn completion_logprobs(entries: &[Value], start: usize) -> Value {
    let mut offset = start;
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for e in entries {
        let t = e["token"].as_str().unwrap_or_default();
        offsets.push(offset);
        offset += t.len();
        tokens.push(json!(t));
        token_logprobs.push(e["logprob"].clone());
        top.push(e["top"].clone());
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// Completions' `logprobs` object of a prompt of `ids` from the engine's
/// `scores` (one per token after the first): the first token has no
/// logprob and no alternatives, as OpenAI's `echo` gives it; offsets count
/// from the prompt's start.
fn prompt_logprobs(cx: &Cx<'_>, ids: &[TokenId], scores: &[TokenLogprobs]) -> Value {
    let mut entries = Vec::with_capacity(ids.len());
    let mut last = None;
    for (p, &t) in ids.iter().enumerate() {
        let text = |alt: TokenId| surface(cx.codec(), last, alt);
        entries.push(match p.checked_sub(1).and_then(|i| scores.get(i)) {
            None => json!({"token": text(t), "logprob": null, "top": null}),
            Some(lp) => {
                let top: Map<String, Value> =
                    lp.top.iter().map(|&(a, l)| (text(a), json!(l))).collect();
                json!({"token": text(t), "logprob": lp.logprob, "top": top})
            }
        });
        last = Some(t);
    }
    completion_logprobs(&entries, 0)
}

/// Completions' `logprobs` of an echoed prompt followed by the answer's.
fn echoed_logprobs(prompt: &Value, answer: Value) -> Value {
    let mut out = prompt.clone();
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        if let (Some(all), Some(more)) = (out[key].as_array_mut(), answer[key].as_array()) {
            all.extend(more.iter().cloned());
        }
    }
    out
}

/// Readies one Completions prompt: text goes to the tokenizer (refused at
/// once when its length alone cannot fit, unless it is to be `cut` to its
/// last tokens once tokenized), with `suffix` written into the
/// model's fill-in-the-middle prompt around it; ids, taken as they are,
/// must fit beside `max_tokens`, and the content filter reads their text.
fn start_prompt(
    cx: &mut Cx<'_>,
    prompt: &mut PromptInput,
    suffix: Option<&str>,
    max_tokens: u32,
    cut: bool,
) -> Result<PromptState, BadRequest> {
    let refused = |e: StartError| {
        let (status, code, message) = openai::start_error(&e, "max_tokens");
        BadRequest {
            status,
            code,
            message,
            param: Some("prompt".into()),
        }
    };
    match prompt {
        PromptInput::Text(text) => {
            let full = match suffix {
                None => text.clone(),
                Some(suffix) => match cx.codec().fim_markers() {
                    Some(fim) => fim.prompt(text, suffix),
                    None => return Err(BadRequest::field(
                        "suffix",
                        "this model has no fill-in-the-middle tokens, so it cannot take a `suffix`",
                    )),
                },
            };
            let job = if cut {
                cx.encode_prompt_to_cut(full)
            } else {
                cx.encode_prompt(full, max_tokens)
            }
            .map_err(refused)?;
            Ok(PromptState {
                text: std::mem::take(text),
                tokenizing: Some(job),
                ..PromptState::default()
            })
        }
        PromptInput::Ids(ids) => {
            let text = cx.codec().decode(ids);
            cx.check_prompt_text(&text).map_err(refused)?;
            let context_len = cx.model().context_len;
            if ids.len() as u64 + u64::from(max_tokens) > u64::from(context_len) {
                return Err(BadRequest {
                    code: "context_length_exceeded",
                    ..BadRequest::field(
                        "prompt",
                        format!(
                            "the input does not fit the context beside max_tokens ({max_tokens})"
                        ),
                    )
                });
            }
            Ok(PromptState {
                text,
                ids: std::mem::take(ids),
                ..PromptState::default()
            })
        }
    }
}

impl DialectConn for ChatConn {
    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        // Only the HTTP mapping writes here, one frame per request.
        let frame = crate::json::parse(text).ok();
        let name = frame.as_ref().and_then(|f| f["route"].as_str());
        let route = match name {
            Some("chat") => Some(Route::Chat),
            Some("completions") => Some(Route::Completions),
            Some("messages") => Some(Route::Messages),
            Some("tokenize" | "detokenize" | "count_tokens" | "embeddings" | "tokenizer_info") => {
                None
            }
            _ => {
                return send_error(cx, 400, "invalid_request", "not a request frame", None);
            }
        };
        if self.busy() {
            let message = "a request is already in progress on this connection";
            return send_error(cx, 409, "concurrent_request", message, None);
        }
        match frame.as_ref().and_then(|f| f["body"].as_object()) {
            Some(body) => match route {
                Some(route) => self.on_request(cx, route, body),
                None if name == Some("tokenize") => self.on_tokenize(cx, body),
                None if name == Some("count_tokens") => self.on_count_tokens(cx, body),
                None if name == Some("embeddings") => self.on_embeddings(cx, body),
                None if name == Some("tokenizer_info") => {
                    let info = tokenize::tokenizer_info(cx.codec(), cx.model());
                    cx.send(json!({"kind": "reply", "data": info}));
                }
                None => on_detokenize(cx, body),
            },
            None => send_error(
                cx,
                400,
                "invalid_request",
                "the body must be a JSON object",
                None,
            ),
        }
    }

    fn on_binary(&mut self, cx: &mut Cx<'_>, _len: usize) {
        send_error(
            cx,
            400,
            "invalid_request",
            "binary frames are not spoken here",
            None,
        );
    }

    fn on_text_done(&mut self, cx: &mut Cx<'_>, job: TextJobId, result: Result<Encoded, String>) {
        if let Some(e) = self.embedding.as_mut().filter(|e| e.waits_for(job)) {
            let next = e.on_tokens(cx, job, result);
            return self.settle_embedding(cx, next);
        }
        if let Some((waiting, counting)) = self.tokenizing {
            if waiting == job {
                self.tokenizing = None;
                return on_tokenized(cx, counting, result);
            }
        }
        let prompt = self
            .inflight
            .as_ref()
            .and_then(|r| r.prompts.iter().position(|p| p.tokenizing == Some(job)));
        if let Some(p) = prompt {
            self.on_tokens(cx, p, result);
        }
    }

    fn on_admitted(&mut self, cx: &mut Cx<'_>, id: SeqId) {
        let cached = cx.gen(id).map_or(0, |g| g.cached_tokens);
        if let Some(r) = self.inflight.as_mut() {
            // A prompt's choices share it; its first says how much of it
            // came from the cache.
            let n = r.req.n as usize;
            let first = r.choices.iter().position(|c| c.seq == Some(id));
            if let Some(i) = first.filter(|i| i % n == 0) {
                r.prompts[i / n].cached = cached;
            }
            // Anthropic's stream starts (`message_start`, with the prompt's
            // usage) as its prompt is computed, not at the first token.
            if r.req.route == Route::Messages && r.req.stream {
                if let Some(i) = r.choices.iter().position(|c| c.seq == Some(id)) {
                    if !r.choices[i].announced {
                        r.choices[i].announced = true;
                        let chunk = Self::chunk(r, i, "", "", None, None, true);
                        cx.send(json!({"kind": "chunk", "data": chunk}));
                    }
                }
            }
        }
    }

    fn on_token(&mut self, cx: &mut Cx<'_>, id: SeqId, piece: &TokenPiece) {
        if let Some(e) = self.embedding.as_mut().filter(|e| e.owns(id)) {
            let next = match &piece.embedding {
                Some(v) => e.on_vector(cx, id, v.clone()),
                // Ended without a vector (a deadline, a shutdown).
                None => e.fail(
                    cx,
                    BadRequest {
                        status: 503,
                        code: "server_error",
                        message: "the embedding was ended before it was computed".into(),
                        param: None,
                    },
                ),
            };
            return self.settle_embedding(cx, next);
        }
        let Some(r) = self.inflight.as_ref() else {
            return;
        };
        let Some(index) = r.choices.iter().position(|c| c.seq == Some(id)) else {
            return;
        };
        let scoring = r.req.echo && r.req.logprobs.is_some();
        // `max_tokens: 0` with `echo`: the prompt's first piece ends it.
        let score_only = r.req.params.max_tokens == 0;
        let first_piece =
            piece.token_id.is_some() || (score_only && piece.finish == Some(FinishReason::Length));
        let p = r.choices[index].prompt;
        if scoring && r.prompts[p].scores.is_none() && first_piece {
            // The prompt's first choice's first token: its piece scores
            // the prompt.
            let Some(scores) = piece.prompt_logprobs.as_deref() else {
                let message = "the engine did not score the prompt for `echo` with `logprobs`";
                return self.fail(cx, 500, "server_error", message, None);
            };
            let object = prompt_logprobs(cx, &r.prompts[p].ids, scores);
            if let Some(r) = self.inflight.as_mut() {
                r.prompts[p].scores = Some(object);
            }
        }
        let Some(r) = self.inflight.as_ref() else {
            return;
        };
        let route = r.req.route;
        let entry = match (piece.token_id, r.req.logprobs) {
            (Some(t), Some(_)) => Self::logprob_entry(cx, route, r.choices[index].last, t, piece),
            _ => None,
        };
        let finish = match piece.finish {
            None => None,
            Some(FinishReason::Stop) => Some("stop"),
            Some(FinishReason::Length) if r.capped => Some(CONTEXT_WINDOW),
            Some(FinishReason::Length) => Some("length"),
            Some(FinishReason::ContentFilter) => Some("content_filter"),
            Some(FinishReason::Cancelled | FinishReason::Timeout) => {
                let message = "the request ended before it completed";
                return self.fail(cx, 500, "server_error", message, None);
            }
        };
        let stop_sequence = cx.gen(id).and_then(|g| g.stop_sequence.clone());
        let Some(r) = self.inflight.as_mut() else {
            return;
        };
        // With a reasoning parser, the reasoning is parted from the answer
        // first; only the answer goes on.
        let include_reasoning = r.req.include_reasoning;
        let c = &mut r.choices[index];
        let (reasoning, answer) = match c.thinker.as_mut() {
            None => (String::new(), piece.text.clone()),
            Some(thinker) => {
                let mut split = thinker.push_token(&piece.text, piece.token_id);
                if finish.is_some() {
                    split.extend(thinker.finish());
                }
                // Every token up to the one that ends the reasoning is the
                // reasoning's: the open tag's too, which may take several.
                if thinker.last_in_reasoning() {
                    c.reasoning_tokens = c.tokens + u32::from(piece.token_id.is_some());
                }
                (split.reasoning, split.answer)
            }
        };
        let reasoning = if include_reasoning {
            reasoning
        } else {
            String::new()
        };
        c.reasoning.push_str(&reasoning);
        // With tools, only what cannot be a call's markup is text; calls
        // come out whole. Text released after a call (`trailing`) streams
        // after it, so block order holds where a stream has blocks
        // (Anthropic's).
        let (visible, new_calls, trailing) = match c.splitter.as_mut() {
            None => (answer, Vec::new(), String::new()),
            Some(sp) => {
                let mut released = sp.push(&answer);
                if finish.is_some() {
                    released.extend(sp.finish());
                }
                let mut text = String::new();
                let mut trailing = String::new();
                let mut calls = Vec::new();
                for item in released {
                    match item {
                        Released::Text(t) if calls.is_empty() => text.push_str(&t),
                        Released::Text(t) => trailing.push_str(&t),
                        Released::Call(c) => calls.push(c),
                    }
                }
                (text, calls, trailing)
            }
        };
        // Anthropic's clients know calls by `toolu_` ids.
        let call_prefix = match r.req.route {
            Route::Messages => "toolu_",
            _ => "call_",
        };
        let new_calls: Vec<(String, ParsedCall)> = new_calls
            .into_iter()
            .map(|c| (cx.new_id(call_prefix), c))
            .collect();
        let echo = r.req.echo && r.req.stream && !r.choices[index].announced;
        let c = &mut r.choices[index];
        let prompt = &r.prompts[c.prompt];
        if echo {
            // A streamed echo: the prompt opens the choice's first chunk.
            c.offset = prompt.text.len();
        }
        let offset = c.offset;
        if let Some(e) = &entry {
            c.offset += e["token"].as_str().map_or(0, str::len);
        }
        c.text.push_str(&visible);
        c.text.push_str(&trailing);
        if let Some(t) = piece.token_id {
            c.tokens += 1;
            c.last = Some(t);
        }
        let n = r.req.n as usize;
        // The prompt is computed once its first choice has its first token
        // (or, scoring only, has ended).
        let first_token = index % n == 0
            && ((piece.token_id.is_some() && c.tokens == 1) || (score_only && finish.is_some()));
        if let Some(e) = &entry {
            c.logprobs.push(e.clone());
        }
        let first_call = c.calls.len();
        c.calls.extend(new_calls);
        // A choice that called tools and ended by itself ends for them.
        let finish = match finish {
            Some("stop") if !c.calls.is_empty() => Some("tool_calls"),
            f => f,
        };
        c.finish = finish;
        if finish == Some("stop") {
            c.stop_sequence = stop_sequence;
        }
        let news = !visible.is_empty() || !reasoning.is_empty() || entry.is_some();
        if r.req.stream && (news || !c.announced) {
            let role = !c.announced;
            c.announced = true;
            let text = if echo {
                format!("{}{}", r.prompts[r.choices[index].prompt].text, visible)
            } else {
                visible
            };
            let logprobs = entry.map(|e| (e, offset));
            let mut chunk = Self::chunk(r, index, &text, &reasoning, logprobs, None, role);
            if let (true, Some(p)) = (echo, &r.prompts[r.choices[index].prompt].scores) {
                // The echoed prompt's logprobs open the choice's.
                let answer = chunk["choices"][0]["logprobs"].take();
                chunk["choices"][0]["logprobs"] = echoed_logprobs(p, answer);
            }
            cx.send(json!({"kind": "chunk", "data": chunk}));
        }
        if r.req.stream {
            for k in first_call..r.choices[index].calls.len() {
                let chunk = Self::call_chunk(r, index, k);
                cx.send(json!({"kind": "chunk", "data": chunk}));
            }
            if !trailing.is_empty() {
                let chunk = Self::chunk(r, index, &trailing, "", None, None, false);
                cx.send(json!({"kind": "chunk", "data": chunk}));
            }
        }
        if let Some(f) = finish {
            if r.req.stream {
                let chunk = Self::chunk(r, index, "", "", None, Some(f), false);
                cx.send(json!({"kind": "chunk", "data": chunk}));
            }
        }
        if first_token && n > 1 {
            // The prompt is computed: its other choices start on its blocks.
            self.start_choices(cx, index + 1..index + n);
        }
        if finish.is_some() {
            // A choice ended: room for those that waited.
            let waiting = self
                .inflight
                .as_mut()
                .map(|r| std::mem::take(&mut r.waiting))
                .unwrap_or_default();
            if !waiting.is_empty() {
                self.start_choices(cx, waiting);
            }
        }
        let done = self
            .inflight
            .as_ref()
            .is_some_and(|r| r.choices.iter().all(|c| c.finish.is_some()));
        if finish.is_some() && done {
            self.complete(cx);
        }
    }

    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure) {
        let (status, code) = match failure.kind {
            FailureKind::MemoryPressure | FailureKind::ShuttingDown => (503, "server_error"),
            FailureKind::Internal => (500, "server_error"),
        };
        if let Some(e) = self.embedding.as_mut().filter(|e| e.owns(id)) {
            let refusal = BadRequest {
                status,
                code,
                message: failure.message.clone(),
                param: None,
            };
            let next = e.fail(cx, refusal);
            return self.settle_embedding(cx, next);
        }
        let Some(r) = self.inflight.take() else {
            return;
        };
        for s in r.choices.iter().filter_map(|c| c.seq).filter(|&s| s != id) {
            cx.end(s, FinishReason::Cancelled);
        }
        send_error(cx, status, code, &failure.message, None);
    }

    fn on_shutdown(&mut self, cx: &mut Cx<'_>) {
        // Generations were failed first (answered through `on_failed`); what
        // is left had none running: prompts at the tokenizer or waiting for
        // queue room, a `/tokenize` waiting for its ids. It gets the 503 a
        // going-away server gives, so the client retries elsewhere, rather
        // than a bare close.
        if !self.busy() {
            return;
        }
        self.tokenizing = None;
        if let Some(mut e) = self.embedding.take() {
            e.cancel(cx);
        }
        let (status, _, message) = crate::http::closed_early(1001); // going away
        self.fail(cx, status, "server_error", message, None);
    }

    fn busy(&self) -> bool {
        self.inflight.is_some() || self.tokenizing.is_some() || self.embedding.is_some()
    }
}
