//! The `responses` dialect (seed 002) at `/v1/responses`: the OpenAI Responses
//! API WebSocket mode, close enough that the official SDKs work unchanged.
//! Each `response.create` streams `response.created`, `response.in_progress`,
//! the output item and text part, one `response.output_text.delta` per piece,
//! their `done` events and exactly one terminal event (`response.completed`,
//! `response.incomplete` or `response.failed`), numbered from 0 per response.
//!
//! With a reasoning parser (`HostConfig::reasoning_tags`), the model's
//! thinking comes first as a `reasoning` item (its text one
//! `reasoning_text` part, streamed as `response.reasoning_text.delta`),
//! and the message item opens when the answer begins; a `text.format`
//! grammar starts where the reasoning ends ([`crate::reasoning_gate`]).
//! Reasoning items sent back in `input` are left out of the prompt.
//!
//! One response in flight per connection; `previous_response_id` resolves
//! only against this connection's last completed or incomplete response (on
//! the socket) or the bounded store of `store: true` responses (over HTTP).
//! A connection past `max_websocket_connections` gets
//! `websocket_connection_limit_reached` and close 1013; each lives
//! `responses_lifetime`, warned `connection_expiring` before.

pub mod codec;
pub mod http;
pub mod store;

use serde_json::{json, Map, Value};

use self::codec::{ClientEvent, CreateRequest, Echo, Usage};
use self::store::{ResponseStore, Stored};
use super::{openai, Cx, DialectConn, Refusal};
use crate::api::{Dialect, Transport};
use crate::constraint::Constraint;
use crate::engine::{SeqId, TokenId};
use crate::gen::{Failure, FinishReason, GenRequest, RequestPart, TokenPiece};
use crate::json::f32_number;
use crate::params::{self, GenParams, ParamNames};
use crate::reasoning::ReasoningSplitter;
use crate::reasoning_gate::ReasoningPlan;
use crate::text::{ChatMessage, Encoded, HistoryCall, Role, TextJobId};
use crate::tools::{CallSplitter, ParsedCall, Released, ToolChoice, Tools};

/// Close code past the connection limit (try again later).
const CLOSE_TRY_AGAIN: u16 = 1013;
/// Close code at the end of a connection's lifetime.
const CLOSE_NORMAL: u16 = 1000;
/// Timer tags.
const TIMER_EXPIRING: u8 = 0;
const TIMER_LIFETIME: u8 = 1;

/// The names of the sampling parameters in a Responses body.
const NAMES: ParamNames = ParamNames {
    max_tokens: "max_output_tokens",
    ..ParamNames::STANDARD
};

/// A response this connection can continue from.
#[derive(Debug, Clone)]
struct Cached {
    id: String,
    /// Its whole conversation: input (instructions excluded) and output.
    messages: Vec<ChatMessage>,
}

/// The response being built.
#[derive(Debug)]
struct Draft {
    id: String,
    msg_id: String,
    created_at: u64,
    model: String,
    previous_response_id: Option<String>,
    instructions: Option<String>,
    echo: Echo,
    params: GenParams,
    stream_id: Option<Value>,
    /// The conversation the prompt was built from (instructions excluded).
    messages: Vec<ChatMessage>,
    generate: bool,
    store: bool,
    usage: Usage,
    text: String,
    /// Next `sequence_number`.
    seq_no: u64,
    /// The open message item was announced (its `done` events are owed).
    item_open: bool,
    /// The open message item's place in `output`.
    msg_index: usize,
    /// Output items closed so far, in order.
    output: Vec<Value>,
    /// What the model wrote, its text and its calls: the assistant turn a
    /// continuation sees.
    transcript: ChatMessage,
    /// The tools offered and their choice.
    tools: Tools,
    /// With tools offered: holds back text that may be a call's markup.
    splitter: Option<CallSplitter>,
    /// Why an incomplete response stopped (`max_output_tokens`,
    /// `content_filter`).
    incomplete_reason: &'static str,
    /// `text.format`'s compiled grammar.
    constraint: Option<Constraint>,
    /// With a reasoning parser: parts the model's thinking (a `reasoning`
    /// item) from its answer, before the call splitter.
    thinker: Option<ReasoningSplitter>,
    /// The reasoning item, while open: its id, place in `output` and text.
    reasoning: Option<(String, usize, String)>,
    /// Alternatives per token where the output text's logprobs are asked
    /// for ([`codec::CreateRequest::logprobs`]).
    logprobs: Option<u8>,
    /// Log-probability entries of tokens whose text is not out yet (held
    /// by the call splitter): they go with the text delta that releases
    /// it, or nowhere if it turns out a call's or the reasoning's.
    pending_logprobs: Vec<Value>,
    /// The open message's entries so far (its `output_text.logprobs`).
    msg_logprobs: Vec<Value>,
    /// The last token generated (how the next one's text reads).
    last_token: Option<TokenId>,
}

impl Draft {
    /// The Response object with `status` and `output`.
    fn object(&self, status: &str, output: Vec<Value>, usage: bool) -> Value {
        let incomplete =
            (status == "incomplete").then(|| json!({"reason": self.incomplete_reason}));
        let error = (status == "failed").then(
            || json!({"code": "server_error", "message": "the response could not be generated"}),
        );
        let p = &self.params;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            // With no tools there is nothing to call in parallel.
            "parallel_tool_calls": !self.tools.defs.is_empty() && self.tools.parallel,
            "tool_choice": if self.tools.defs.is_empty() { json!("auto") } else { tool_choice_json(&self.tools.choice) },
            "tools": self.tools.defs.iter().map(|d| json!({
                "type": "function", "name": d.name, "description": d.description,
                "parameters": d.parameters, "strict": null,
            })).collect::<Vec<_>>(),
            "previous_response_id": self.previous_response_id,
            "instructions": self.instructions,
            "temperature": self.echo.temperature.clone().unwrap_or_else(|| f32_number(p.temperature)),
            "top_p": self.echo.top_p.clone().unwrap_or_else(|| f32_number(p.top_p)),
            "max_output_tokens": self.echo.max_output_tokens.clone().unwrap_or(Value::Null),
            "metadata": self.echo.metadata.clone().unwrap_or_else(|| json!({})),
            "text": self.echo.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}})),
            "top_logprobs": self.echo.top_logprobs.clone().unwrap_or(Value::Null),
            "error": error,
            "incomplete_details": incomplete,
            "usage": if usage { self.usage.to_json() } else { Value::Null },
        })
    }

    /// Sends one event: `sequence_number` and `stream_id` added.
    fn emit(&mut self, cx: &mut Cx<'_>, mut event: Map<String, Value>) {
        event.insert("sequence_number".into(), self.seq_no.into());
        if let Some(s) = &self.stream_id {
            event.insert("stream_id".into(), s.clone());
        }
        self.seq_no += 1;
        cx.send(Value::Object(event));
    }

    fn emit_json(&mut self, cx: &mut Cx<'_>, event: Value) {
        if let Value::Object(m) = event {
            self.emit(cx, m);
        }
    }
}

/// Where the in-flight response is.
#[derive(Debug)]
enum Stage {
    /// Its prompt is being tokenized.
    Tokenizing(TextJobId),
    /// Its generation runs.
    Running(SeqId),
}

#[derive(Debug)]
struct Inflight {
    stage: Stage,
    draft: Draft,
}

/// One `/v1/responses` connection (or one HTTP request on that route).
#[derive(Debug, Default)]
pub struct ResponsesConn {
    cache: Option<Cached>,
    inflight: Option<Inflight>,
}

fn send_error(
    cx: &mut Cx<'_>,
    status: u16,
    code: &'static str,
    message: &str,
    param: Option<&str>,
) {
    cx.count_error(code);
    cx.send(codec::error_event(status, code, message, param));
}

impl ResponsesConn {
    fn on_create(&mut self, cx: &mut Cx<'_>, req: CreateRequest) {
        if self.inflight.is_some() {
            return send_error(
                cx,
                409,
                "concurrent_request",
                "a response is already in progress on this connection; wait for its terminal event or send response.cancel",
                None,
            );
        }
        let served = cx.model().name.clone();
        if let Some(m) = req.model.as_deref().filter(|m| *m != served) {
            return send_error(
                cx,
                404,
                "model_not_found",
                &format!("the model `{m}` does not exist on this server; it serves `{served}`"),
                Some("model"),
            );
        }
        let context_len = cx.model().context_len;
        let defaults = GenParams::defaults(cx.config().default_max_tokens.min(context_len));
        let params = match params::apply(&req.sampling, "", &NAMES, &defaults, context_len) {
            Ok(p) => p,
            Err(e) => {
                return send_error(cx, 400, "invalid_request", &e.to_string(), Some(&e.field))
            }
        };
        let mut messages = Vec::new();
        if let Some(prev) = &req.previous_response_id {
            let found = if cx.transport == Transport::Http {
                let owner = cx.principal.clone();
                cx.state::<ResponseStore>()
                    .get(&owner, prev)
                    .map(|s| s.messages.clone())
            } else {
                self.cache
                    .as_ref()
                    .filter(|c| &c.id == prev)
                    .map(|c| c.messages.clone())
            };
            let Some(history) = found else {
                return send_error(
                    cx,
                    404,
                    "previous_response_not_found",
                    &format!("previous response with id '{prev}' not found"),
                    Some("previous_response_id"),
                );
            };
            messages = history;
        }
        messages.extend(req.input);
        if messages.is_empty() && req.instructions.is_none() {
            return send_error(
                cx,
                400,
                "invalid_request",
                "`input` is required",
                Some("input"),
            );
        }
        let constraint = match openai::output_constraint(
            cx.codec(),
            req.format.as_ref(),
            "text.format",
            &req.tools,
            cx.codec().tool_format(),
        ) {
            Ok(c) => c,
            Err((field, message)) => {
                return send_error(cx, 400, "invalid_request", &message, Some(field))
            }
        };
        let splitter = req
            .tools
            .active()
            .then(|| CallSplitter::new(cx.codec().tool_format(), &req.tools.defs));
        let draft = Draft {
            id: cx.new_id("resp_"),
            msg_id: String::new(),
            created_at: cx.unix_ms() / 1000,
            model: served,
            previous_response_id: req.previous_response_id,
            instructions: req.instructions,
            echo: req.echo,
            params,
            stream_id: req.stream_id,
            messages,
            generate: req.generate,
            store: req.store,
            usage: Usage::default(),
            text: String::new(),
            seq_no: 0,
            item_open: false,
            msg_index: 0,
            output: Vec::new(),
            transcript: ChatMessage::new(Role::Assistant, ""),
            tools: req.tools,
            splitter,
            incomplete_reason: "max_output_tokens",
            thinker: None,
            reasoning: None,
            constraint,
            logprobs: req.logprobs,
            pending_logprobs: Vec::new(),
            msg_logprobs: Vec::new(),
            last_token: None,
        };
        let mut prompt = Vec::with_capacity(draft.messages.len() + 1);
        if let Some(i) = &draft.instructions {
            prompt.push(ChatMessage::new(Role::System, i.clone()));
        }
        prompt.extend(draft.messages.iter().cloned());
        // Every message is kept (no truncation): one left out is an error.
        let budget = context_len.saturating_sub(if draft.generate {
            draft.params.max_tokens
        } else {
            0
        });
        let tools = draft.tools.prompt_defs().to_vec();
        let job = match cx.encode_chat_with_tools(prompt, usize::MAX, budget, tools) {
            Ok(job) => job,
            Err(e) => {
                let (status, code, message) = openai::start_error(&e, "max_output_tokens");
                return send_error(cx, status, code, &message, Some("input"));
            }
        };
        self.inflight = Some(Inflight {
            stage: Stage::Tokenizing(job),
            draft,
        });
    }

    fn on_tokens(&mut self, cx: &mut Cx<'_>, mut draft: Draft, result: Result<Encoded, String>) {
        let encoded = match result {
            Ok(e) if e.dropped == 0 => e,
            Ok(e) => {
                return send_error(
                    cx,
                    400,
                    "context_length_exceeded",
                    &format!("the input does not fit the context beside max_output_tokens ({}); {} of its messages would have to be left out", draft.params.max_tokens, e.dropped),
                    Some("input"),
                )
            }
            Err(e) if e.starts_with(crate::text::CONTEXT_TOO_LONG) => {
                return send_error(cx, 400, "context_length_exceeded", &format!("the input is too long for the context beside max_output_tokens ({})", draft.params.max_tokens), Some("input"))
            }
            Err(e) => return send_error(cx, 400, "invalid_request", &format!("the input could not be tokenized: {e}"), Some("input")),
        };
        draft.usage.input_tokens = encoded.ids.len() as u32;
        if !draft.generate {
            // Warm-up: the input is cached as a response, nothing runs.
            let created = draft.object("in_progress", Vec::new(), false);
            draft.emit_json(cx, json!({"type": "response.created", "response": created}));
            let done = draft.object("completed", Vec::new(), true);
            draft.emit_json(
                cx,
                json!({"type": "response.completed", "response": done.clone()}),
            );
            return self.remember(cx, &draft, done);
        }
        let prompt_tail = encoded.ids[encoded
            .ids
            .len()
            .saturating_sub(crate::reasoning::PROMPT_TAIL_TOKENS)..]
            .to_vec();
        let vocab = cx.model().vocab_size;
        let plan = cx.config().reasoning_tags.and_then(|tags| {
            ReasoningPlan::new(tags, cx.codec(), draft.constraint.is_some(), None, vocab)
        });
        if let Some(plan) = plan {
            // As the chat route reads it: did the template open the
            // reasoning? A grammar then waits for the reasoning to end.
            let opened = plan.tags.opened_by(&cx.codec().decode(&prompt_tail));
            draft.thinker = Some(plan.splitter(opened));
            draft.constraint = plan.constrain(draft.constraint.take(), opened);
        }
        // The first token's text reads as it follows the prompt, as Chat
        // Completions reads it.
        draft.last_token = encoded.ids.last().copied();
        let req = GenRequest {
            prompt_ids: encoded.ids,
            params: draft.params.clone(),
            logprobs: draft.logprobs,
            raw: false,
            reuse_kv: None,
            constraint: draft.constraint.clone(),
            embed: None,
            prompt_logprobs: None,
            part: RequestPart::First,
        };
        let seq = match cx.start(req) {
            Ok(seq) => seq,
            Err(e) => {
                let (status, code, message) = openai::start_error(&e, "max_output_tokens");
                return send_error(cx, status, code, &message, None);
            }
        };
        let created = draft.object("in_progress", Vec::new(), false);
        draft.emit_json(
            cx,
            json!({"type": "response.created", "response": created.clone()}),
        );
        draft.emit_json(
            cx,
            json!({"type": "response.in_progress", "response": created}),
        );
        // Without tools or reasoning the answer is one message, announced
        // at once; with them, items open as the answer shows what it is.
        if draft.splitter.is_none() && draft.thinker.is_none() {
            Self::open_message(cx, &mut draft);
        }
        self.inflight = Some(Inflight {
            stage: Stage::Running(seq),
            draft,
        });
    }

    /// Opens a message output item (its `added` events).
    fn open_message(cx: &mut Cx<'_>, draft: &mut Draft) {
        draft.msg_id = cx.new_id("msg_");
        draft.msg_index = draft.output.len();
        draft.text.clear();
        draft.msg_logprobs.clear();
        let at = draft.msg_index;
        let item = codec::message_item(&draft.msg_id, "in_progress", None);
        draft.emit_json(
            cx,
            json!({"type": "response.output_item.added", "output_index": at, "item": item}),
        );
        let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        let msg_id = draft.msg_id.clone();
        draft.emit_json(cx, json!({"type": "response.content_part.added", "item_id": msg_id, "output_index": at, "content_index": 0, "part": part}));
        draft.item_open = true;
    }

    /// Streams reasoning into the open reasoning item (opening one if
    /// needed: its `added` events).
    fn push_reasoning(cx: &mut Cx<'_>, draft: &mut Draft, text: &str) {
        if text.is_empty() {
            return;
        }
        if draft.reasoning.is_none() {
            let id = cx.new_id("rs_");
            let at = draft.output.len();
            let item = codec::reasoning_item(&id, "in_progress", None);
            draft.emit_json(
                cx,
                json!({"type": "response.output_item.added", "output_index": at, "item": item}),
            );
            let part = codec::reasoning_part("");
            draft.emit_json(cx, json!({"type": "response.content_part.added", "item_id": id, "output_index": at, "content_index": 0, "part": part}));
            draft.reasoning = Some((id, at, String::new()));
        }
        let Some((id, at, all)) = draft.reasoning.as_mut() else {
            return;
        };
        all.push_str(text);
        let (id, at) = (id.clone(), *at);
        draft.emit_json(cx, json!({"type": "response.reasoning_text.delta", "item_id": id, "output_index": at, "content_index": 0, "delta": text}));
    }

    /// Closes the open reasoning item (its `done` events) with `item_status`.
    fn close_reasoning(cx: &mut Cx<'_>, draft: &mut Draft, item_status: &str) {
        let Some((id, at, text)) = draft.reasoning.take() else {
            return;
        };
        draft.emit_json(cx, json!({"type": "response.reasoning_text.done", "item_id": id, "output_index": at, "content_index": 0, "text": text}));
        draft.emit_json(cx, json!({"type": "response.content_part.done", "item_id": id, "output_index": at, "content_index": 0, "part": codec::reasoning_part(&text)}));
        let item = codec::reasoning_item(&id, item_status, Some(&text));
        draft.emit_json(
            cx,
            json!({"type": "response.output_item.done", "output_index": at, "item": item.clone()}),
        );
        draft.output.push(item);
    }

    /// Streams text into the open message item (opening one if needed).
    fn push_text(cx: &mut Cx<'_>, draft: &mut Draft, text: &str) {
        if text.is_empty() {
            return;
        }
        Self::close_reasoning(cx, draft, "completed");
        if !draft.item_open {
            Self::open_message(cx, draft);
            // A new message item after a call: its text on a line of its
            // own in the turn a continuation sees.
            if !draft.transcript.content.is_empty() {
                draft.transcript.content.push('\n');
            }
        }
        draft.text.push_str(text);
        draft.transcript.content.push_str(text);
        let (msg_id, at) = (draft.msg_id.clone(), draft.msg_index);
        let logprobs = std::mem::take(&mut draft.pending_logprobs);
        draft.msg_logprobs.extend(logprobs.iter().cloned());
        draft.emit_json(cx, json!({"type": "response.output_text.delta", "item_id": msg_id, "output_index": at, "content_index": 0, "delta": text, "logprobs": codec::event_logprobs(&logprobs)}));
    }

    /// A call the model made: the open message closes, and a
    /// `function_call` item is announced, its arguments streamed and done.
    fn push_call(cx: &mut Cx<'_>, draft: &mut Draft, call: ParsedCall) {
        Self::close_reasoning(cx, draft, "completed");
        Self::close_item(cx, draft, "completed");
        let id = cx.new_id("fc_");
        let call_id = cx.new_id("call_");
        let at = draft.output.len();
        let item = |status: &str, arguments: &str| {
            json!({"type": "function_call", "id": id, "call_id": call_id, "name": call.name,
                   "arguments": arguments, "status": status})
        };
        draft.emit_json(cx, json!({"type": "response.output_item.added", "output_index": at, "item": item("in_progress", "")}));
        draft.emit_json(cx, json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": at, "delta": call.arguments}));
        draft.emit_json(cx, json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": at, "arguments": call.arguments}));
        let done = item("completed", &call.arguments);
        draft.emit_json(
            cx,
            json!({"type": "response.output_item.done", "output_index": at, "item": done.clone()}),
        );
        draft.output.push(done);
        draft.transcript.tool_calls.push(HistoryCall {
            id: call_id,
            name: call.name,
            arguments: call.arguments,
        });
    }

    /// Closes the open message item (its `done` events) with `item_status`.
    fn close_item(cx: &mut Cx<'_>, draft: &mut Draft, item_status: &str) {
        if !draft.item_open {
            return;
        }
        draft.item_open = false;
        let id = draft.msg_id.clone();
        let text = draft.text.clone();
        let at = draft.msg_index;
        let logprobs = std::mem::take(&mut draft.msg_logprobs);
        draft.emit_json(cx, json!({"type": "response.output_text.done", "item_id": id, "output_index": at, "content_index": 0, "text": text, "logprobs": codec::event_logprobs(&logprobs)}));
        draft.emit_json(cx, json!({"type": "response.content_part.done", "item_id": id, "output_index": at, "content_index": 0, "part": codec::text_part(&text, &logprobs)}));
        let item = codec::message_item(&id, item_status, Some((&text, &logprobs)));
        draft.emit_json(
            cx,
            json!({"type": "response.output_item.done", "output_index": at, "item": item.clone()}),
        );
        draft.output.push(item);
    }

    /// Ends the in-flight response with its terminal event.
    fn finish(&mut self, cx: &mut Cx<'_>, reason: FinishReason) {
        let Some(Inflight { mut draft, .. }) = self.inflight.take() else {
            return;
        };
        let (status, item_status) = match reason {
            FinishReason::Stop => ("completed", "completed"),
            FinishReason::Length => ("incomplete", "incomplete"),
            FinishReason::ContentFilter => {
                draft.incomplete_reason = "content_filter";
                ("incomplete", "incomplete")
            }
            FinishReason::Cancelled | FinishReason::Timeout => ("cancelled", "incomplete"),
        };
        Self::close_reasoning(cx, &mut draft, item_status);
        Self::close_item(cx, &mut draft, item_status);
        let object = draft.object(status, draft.output.clone(), true);
        let kind = codec::terminal_event_type(status);
        draft.emit_json(cx, json!({"type": kind, "response": object.clone()}));
        if status != "cancelled" {
            draft.messages.push(draft.transcript.clone());
            self.remember(cx, &draft, object);
        }
    }

    /// Keeps a finished response for continuations: this connection's cache
    /// (the socket), or the host's store (HTTP, `store: true`).
    fn remember(&mut self, cx: &mut Cx<'_>, draft: &Draft, object: Value) {
        if cx.transport == Transport::Http {
            if draft.store {
                let owner = cx.principal.clone();
                cx.state::<ResponseStore>().put(
                    &owner,
                    draft.id.clone(),
                    Stored {
                        response: codec::without_logprobs(object),
                        messages: draft.messages.clone(),
                    },
                );
            }
        } else {
            self.cache = Some(Cached {
                id: draft.id.clone(),
                messages: draft.messages.clone(),
            });
        }
    }

    fn on_cancel(&mut self, cx: &mut Cx<'_>, response_id: Option<String>) {
        let running = match &self.inflight {
            Some(Inflight {
                stage: Stage::Running(seq),
                draft,
            }) => Some((*seq, draft.id.clone())),
            _ => None,
        };
        let Some((seq, id)) = running else {
            return send_error(
                cx,
                400,
                "invalid_request",
                "no response is in progress on this connection",
                None,
            );
        };
        if response_id.as_deref().is_some_and(|r| r != id) {
            return send_error(
                cx,
                400,
                "invalid_request",
                &format!("the response in progress is '{id}'"),
                Some("response_id"),
            );
        }
        cx.end(seq, FinishReason::Cancelled);
    }

    fn on_retrieve(&mut self, cx: &mut Cx<'_>, id: &str) {
        let owner = cx.principal.clone();
        match cx
            .state::<ResponseStore>()
            .get(&owner, id)
            .map(|s| s.response.clone())
        {
            Some(response) => cx.send(json!({"type": "response.retrieved", "response": response})),
            None => send_error(
                cx,
                404,
                "not_found",
                &format!("no stored response with id '{id}'"),
                None,
            ),
        }
    }
}

impl DialectConn for ResponsesConn {
    fn on_open(&mut self, cx: &mut Cx<'_>, _query: &str, _peer: &str) -> Result<(), Refusal> {
        if cx.transport != Transport::WebSocket {
            return Ok(());
        }
        let limit = cx.config().max_websocket_connections;
        // This socket is counted already: refuse the one past the limit.
        if cx.open_connections(Dialect::Responses, Transport::WebSocket) > limit {
            send_error(
                cx,
                503,
                "websocket_connection_limit_reached",
                &format!("this server holds its limit of {limit} Responses WebSocket connections; retry later"),
                None,
            );
            return Err(Refusal {
                code: CLOSE_TRY_AGAIN,
                reason: "connection limit reached".into(),
            });
        }
        let name = cx.new_id("ws-");
        cx.name_connection(name);
        let (warn, end) = (
            cx.config().responses_expiring_after,
            cx.config().responses_lifetime,
        );
        let now = cx.now;
        cx.set_timer(TIMER_EXPIRING, now + warn);
        cx.set_timer(TIMER_LIFETIME, now + end);
        Ok(())
    }

    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        match codec::decode_client(text) {
            Ok(ClientEvent::Create(req)) => self.on_create(cx, *req),
            Ok(ClientEvent::Cancel { response_id }) => self.on_cancel(cx, response_id),
            Ok(ClientEvent::Retrieve { response_id }) if cx.transport == Transport::Http => {
                self.on_retrieve(cx, &response_id)
            }
            Ok(ClientEvent::Retrieve { .. }) => send_error(cx, 400, "unknown_event_type", "unknown event type `response.retrieve`; this server accepts response.create and response.cancel", Some("type")),
            Err(e) => send_error(cx, 400, e.code, &e.message, e.param.as_deref()),
        }
    }

    fn on_binary(&mut self, cx: &mut Cx<'_>, len: usize) {
        send_error(
            cx,
            400,
            "invalid_request",
            &format!(
                "binary frames are not supported ({len} bytes received); send JSON text frames"
            ),
            None,
        );
    }

    fn on_token(&mut self, cx: &mut Cx<'_>, id: SeqId, piece: &TokenPiece) {
        let Some(inflight) = self.inflight.as_mut() else {
            return;
        };
        if !matches!(inflight.stage, Stage::Running(s) if s == id) {
            return;
        }
        let draft = &mut inflight.draft;
        if let (Some(t), Some(lp)) = (piece.token_id, piece.logprobs.as_ref()) {
            if draft.logprobs.is_some() {
                let entry = openai::token_logprob(cx.codec(), draft.last_token, t, lp);
                draft.pending_logprobs.push(entry);
            }
        }
        if let Some(t) = piece.token_id {
            draft.last_token = Some(t);
        }
        let answer = match draft.thinker.as_mut() {
            None => piece.text.clone(),
            Some(thinker) => {
                let mut split = thinker.push_token(&piece.text, piece.token_id);
                if piece.finish.is_some() {
                    split.extend(thinker.finish());
                }
                let reasoning_token = thinker.last_in_reasoning();
                if reasoning_token {
                    // Every token so far, this one included.
                    draft.usage.reasoning_tokens = cx.gen(id).map_or(0, |g| g.completion_tokens());
                    if split.answer.is_empty() && piece.token_id.is_some() {
                        // Not the answer's: no entry in its logprobs.
                        draft.pending_logprobs.pop();
                    }
                }
                Self::push_reasoning(cx, draft, &split.reasoning);
                split.answer
            }
        };
        let released = match draft.splitter.as_mut() {
            None => vec![Released::Text(answer)],
            Some(sp) => {
                let mut r = sp.push(&answer);
                if piece.finish.is_some() {
                    r.extend(sp.finish());
                }
                r
            }
        };
        for item in released {
            match item {
                Released::Text(t) => Self::push_text(cx, draft, &t),
                Released::Call(c) => {
                    // The call's own tokens: no text to score.
                    draft.pending_logprobs.clear();
                    Self::push_call(cx, draft, c)
                }
            }
        }
        let Some(reason) = piece.finish else { return };
        if let Some(g) = cx.gen(id) {
            draft.usage.output_tokens = g.completion_tokens();
            draft.usage.cached_tokens = g.cached_tokens;
        }
        self.finish(cx, reason);
    }

    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure) {
        if !matches!(&self.inflight, Some(Inflight { stage: Stage::Running(s), .. }) if *s == id) {
            return;
        }
        let Some(Inflight { mut draft, .. }) = self.inflight.take() else {
            return;
        };
        if let Some(g) = cx.gen(id) {
            draft.usage.output_tokens = g.completion_tokens();
            draft.usage.cached_tokens = g.cached_tokens;
        }
        Self::close_reasoning(cx, &mut draft, "incomplete");
        Self::close_item(cx, &mut draft, "incomplete");
        let mut object = draft.object("failed", draft.output.clone(), true);
        object["error"] = json!({"code": "server_error", "message": failure.message});
        draft.emit_json(cx, json!({"type": "response.failed", "response": object}));
        // A failed response leaves nothing to continue from.
        self.cache = None;
        cx.count_error("server_error");
    }

    fn on_text_done(&mut self, cx: &mut Cx<'_>, job: TextJobId, result: Result<Encoded, String>) {
        match self.inflight.take() {
            Some(Inflight {
                stage: Stage::Tokenizing(j),
                draft,
            }) if j == job => self.on_tokens(cx, draft, result),
            other => self.inflight = other,
        }
    }

    fn on_timer(&mut self, cx: &mut Cx<'_>, tag: u8) {
        match tag {
            TIMER_EXPIRING => send_error(
                cx,
                400,
                "connection_expiring",
                "this connection reaches its time limit soon; open a new one and send the conversation as input there (previous_response_id does not cross connections)",
                None,
            ),
            TIMER_LIFETIME => cx.close(CLOSE_NORMAL, "connection lifetime reached"),
            _ => {}
        }
    }

    fn busy(&self) -> bool {
        self.inflight.is_some()
    }
}

/// `tool_choice` as the Response object echoes it.
fn tool_choice_json(c: &ToolChoice) -> Value {
    match c {
        ToolChoice::None => json!("none"),
        ToolChoice::Auto => json!("auto"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Named(name) => json!({"type": "function", "name": name}),
    }
}
