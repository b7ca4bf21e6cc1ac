//! The `anthropic` dialect: Anthropic's Messages API (`POST /v1/messages`,
//! `POST /v1/messages/count_tokens`), over HTTP only, as vLLM and
//! llama.cpp's server serve it to Anthropic's SDKs and the tools built on
//! them.
//!
//! It has no machine of its own: a request is the `chat` machine's
//! [`crate::dialect::chat::codec::Route::Messages`], decoded from
//! Anthropic's body into the same request a Chat Completions body becomes
//! (so templates, tools, structured output, reasoning and the prefix cache
//! are one code path). This module turns what that machine sends into
//! Anthropic's shapes ([`http`] maps the routes):
//!
//! - a whole answer becomes a `message` ([`message`]): `thinking`, `text`
//!   and `tool_use` content blocks, `stop_reason` and `stop_sequence`,
//!   `usage` with `cache_read_input_tokens`;
//! - a streamed one becomes `message_start`, each block's
//!   `content_block_start` / `_delta` / `_stop`, `message_delta` and
//!   `message_stop` ([`MessageStream`]);
//! - an error becomes `{"type": "error", "error": {type, message}}` with
//!   Anthropic's error types ([`error_body`]).

pub mod http;

use serde_json::{json, Value};

use crate::dialect::chat::CONTEXT_WINDOW;
use crate::http::SseEvent;

/// Anthropic's `stop_reason` for a chat `finish_reason` (and the stop
/// string that ended the answer, if one did).
pub fn stop_reason(finish: &str, stop_sequence: Option<&str>) -> &'static str {
    match finish {
        "length" => "max_tokens",
        CONTEXT_WINDOW => "model_context_window_exceeded",
        "tool_calls" => "tool_use",
        "content_filter" => "refusal",
        _ if stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's `usage` from a chat one: `input_tokens` are the prompt's
/// tokens not read from the prefix cache, `cache_read_input_tokens` the
/// others, as Anthropic counts them.
pub fn usage(chat: &Value) -> Value {
    let prompt = chat["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = chat["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    json!({
        "input_tokens": prompt.saturating_sub(cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": chat["completion_tokens"].as_u64().unwrap_or(0),
    })
}

/// A `tool_use` block from a chat call (`{id, function: {name,
/// arguments}}`): the arguments as the `input` object.
fn tool_use(call: &Value) -> Value {
    let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
    // The call splitter only releases calls whose arguments are a JSON
    // object; anything else would be a bug upstream, sent as no input.
    let input = serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({
        "type": "tool_use",
        "id": call["id"],
        "name": call["function"]["name"],
        "input": input,
    })
}

/// The `message` for a whole chat completion (one choice, with its
/// `stop_sequence`, as the machine sends a Messages answer).
pub fn message(completion: &Value) -> Value {
    let choice = &completion["choices"][0];
    let m = &choice["message"];
    let mut content = Vec::new();
    if let Some(thinking) = m["reasoning_content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if let Some(text) = m["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in m["tool_calls"].as_array().map_or(&[][..], Vec::as_slice) {
        content.push(tool_use(call));
    }
    let finish = choice["finish_reason"].as_str().unwrap_or("stop");
    let stop_sequence = choice["stop_sequence"].as_str();
    json!({
        "id": completion["id"],
        "type": "message",
        "role": "assistant",
        "model": completion["model"],
        "content": content,
        "stop_reason": stop_reason(finish, stop_sequence),
        "stop_sequence": stop_sequence,
        "usage": usage(&completion["usage"]),
    })
}

/// Anthropic's error `type` for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error body, `{"type": "error", "error": {type, message}}`.
pub fn error_body(status: u16, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// The open content block of a streamed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
}

/// One streamed message: turns the chat machine's chunks into Anthropic's
/// events. Text and thinking blocks stay open while their kind goes on;
/// a call is one `tool_use` block, opened and closed at once (the machine
/// sends each call whole).
#[derive(Debug, Default)]
pub struct MessageStream {
    started: bool,
    open: Option<Block>,
    /// The index of the open block, or of the next one.
    index: u32,
    /// Set by the chunk that ends the answer.
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    /// The `message_delta` went out (with the usage chunk).
    delta_sent: bool,
}

fn event(name: &str, data: Value) -> SseEvent {
    SseEvent {
        event: Some(name.to_string()),
        data: data.to_string(),
    }
}

impl MessageStream {
    /// The events for one chat chunk (none when it says nothing new).
    pub fn on_chunk(&mut self, chunk: &Value) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let mut u = usage(&chunk["usage"]);
            u["output_tokens"] = json!(0);
            out.push(event(
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": chunk["id"],
                    "type": "message",
                    "role": "assistant",
                    "model": chunk["model"],
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": u,
                }}),
            ));
        }
        let Some(choice) = chunk["choices"].get(0) else {
            // The last chunk: the usage, after every choice ended.
            if chunk["usage"].is_object() {
                self.close(&mut out);
                out.push(self.message_delta(&chunk["usage"]));
            }
            return out;
        };
        let delta = &choice["delta"];
        if let Some(t) = delta["reasoning_content"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            self.ensure(Block::Thinking, &mut out);
            out.push(self.delta(json!({"type": "thinking_delta", "thinking": t})));
        }
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.ensure(Block::Text, &mut out);
            out.push(self.delta(json!({"type": "text_delta", "text": t})));
        }
        for call in delta["tool_calls"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
        {
            self.close(&mut out);
            let mut block = tool_use(call);
            let input = block["input"].to_string();
            block["input"] = json!({});
            out.push(self.start(block));
            out.push(self.delta(json!({"type": "input_json_delta", "partial_json": input})));
            out.push(self.stop());
        }
        if let Some(finish) = choice["finish_reason"].as_str() {
            self.close(&mut out);
            let stop_sequence = choice["stop_sequence"].as_str();
            self.stop_reason = Some(stop_reason(finish, stop_sequence));
            self.stop_sequence = stop_sequence.map(str::to_string);
        }
        out
    }

    /// The stream's end: `message_stop`, after closing what is still open
    /// (the machine always sends the usage first; a stream without it still
    /// ends well-formed).
    pub fn on_done(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.close(&mut out);
        if !self.delta_sent {
            out.push(self.message_delta(&json!({})));
        }
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn message_delta(&mut self, chat_usage: &Value) -> SseEvent {
        self.delta_sent = true;
        event(
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": {
                    "stop_reason": self.stop_reason.unwrap_or("end_turn"),
                    "stop_sequence": self.stop_sequence,
                },
                "usage": usage(chat_usage),
            }),
        )
    }

    /// Opens a block of `kind` unless one is open (closing another kind).
    fn ensure(&mut self, kind: Block, out: &mut Vec<SseEvent>) {
        if self.open == Some(kind) {
            return;
        }
        self.close(out);
        let block = match kind {
            Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::Text => json!({"type": "text", "text": ""}),
        };
        out.push(self.start(block));
        self.open = Some(kind);
    }

    fn close(&mut self, out: &mut Vec<SseEvent>) {
        if self.open.take().is_some() {
            out.push(self.stop());
        }
    }

    fn start(&self, block: Value) -> SseEvent {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        )
    }

    fn delta(&self, delta: Value) -> SseEvent {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        )
    }

    /// Stops the block at the current index; the next block takes the next.
    fn stop(&mut self) -> SseEvent {
        let e = event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": self.index}),
        );
        self.index += 1;
        e
    }
}

/// The `error` event of a stream that fails after it started.
pub fn error_event(status: u16, message: &str) -> SseEvent {
    event("error", error_body(status, message))
}

/// The message of a chat error body (`{"error": {"message", "param"}}`),
/// naming its field where the message does not: Anthropic's errors have
/// no field of their own for it.
pub fn chat_error_message(body: &Value) -> String {
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or("the request failed");
    match body["error"]["param"].as_str() {
        Some(field) if !message.contains(field) => format!("{field}: {message}"),
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(delta: Value, finish: Option<&str>) -> Value {
        json!({"id": "msg_1", "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "stop_sequence": null}],
               "usage": {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}})
    }

    fn names(events: &[SseEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                let v: Value = serde_json::from_str(&e.data).expect("json");
                assert_eq!(e.event.as_deref(), v["type"].as_str(), "event = type");
                let at = v["index"]
                    .as_u64()
                    .map(|i| format!("@{i}"))
                    .unwrap_or_default();
                format!("{}{at}", v["type"].as_str().unwrap_or_default())
            })
            .collect()
    }

    #[test]
    fn a_stream_opens_thinking_then_text_then_calls_in_order() {
        let mut s = MessageStream::default();
        let mut all = s.on_chunk(&chunk(json!({"role": "assistant", "content": ""}), None));
        let start: Value = serde_json::from_str(&all[0].data).expect("json");
        assert_eq!(
            start["message"]["usage"]["input_tokens"], 5,
            "9 less 4 cached"
        );
        assert_eq!(start["message"]["usage"]["cache_read_input_tokens"], 4);
        all.extend(s.on_chunk(&chunk(json!({"reasoning_content": "hm"}), None)));
        all.extend(s.on_chunk(&chunk(json!({"reasoning_content": "m"}), None)));
        all.extend(s.on_chunk(&chunk(json!({"content": "Hi"}), None)));
        all.extend(s.on_chunk(&chunk(
            json!({"tool_calls": [{"index": 0, "id": "toolu_a", "type": "function",
                   "function": {"name": "f", "arguments": "{\"x\":1}"}}]}),
            None,
        )));
        all.extend(s.on_chunk(&chunk(json!({}), Some("tool_calls"))));
        all.extend(
            s.on_chunk(&json!({"id": "msg_1", "model": "m", "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 7}})),
        );
        all.extend(s.on_done());
        assert_eq!(
            names(&all),
            [
                "message_start",
                "content_block_start@0",
                "content_block_delta@0",
                "content_block_delta@0",
                "content_block_stop@0",
                "content_block_start@1",
                "content_block_delta@1",
                "content_block_stop@1",
                "content_block_start@2",
                "content_block_delta@2",
                "content_block_stop@2",
                "message_delta",
                "message_stop",
            ]
        );
        let call: Value = serde_json::from_str(&all[8].data).expect("json");
        assert_eq!(
            call["content_block"]["input"],
            json!({}),
            "input comes as deltas"
        );
        let input: Value = serde_json::from_str(&all[9].data).expect("json");
        assert_eq!(input["delta"]["partial_json"], r#"{"x":1}"#);
        let end: Value = serde_json::from_str(&all[11].data).expect("json");
        assert_eq!(end["delta"]["stop_reason"], "tool_use");
        assert_eq!(end["usage"]["output_tokens"], 7);
    }

    #[test]
    fn a_stream_cut_short_still_closes_its_block_and_message() {
        let mut s = MessageStream::default();
        let mut all = s.on_chunk(&chunk(json!({"content": "a"}), None));
        all.extend(s.on_done());
        assert_eq!(
            names(&all),
            [
                "message_start",
                "content_block_start@0",
                "content_block_delta@0",
                "content_block_stop@0",
                "message_delta",
                "message_stop"
            ]
        );
    }

    #[test]
    fn a_stop_string_is_the_stop_sequence() {
        let mut s = MessageStream::default();
        s.on_chunk(&chunk(json!({"content": "a"}), None));
        let mut c = chunk(json!({}), Some("stop"));
        c["choices"][0]["stop_sequence"] = json!("END");
        let closed = s.on_chunk(&c);
        assert_eq!(names(&closed), ["content_block_stop@0"]);
        let usage = json!({"id": "x", "choices": [], "usage": {"completion_tokens": 2}});
        let end: Value = serde_json::from_str(&s.on_chunk(&usage)[0].data).expect("json");
        assert_eq!(
            end["delta"],
            json!({"stop_reason": "stop_sequence", "stop_sequence": "END"})
        );
    }

    #[test]
    fn a_whole_answer_becomes_a_message_with_its_blocks() {
        let completion = json!({"id": "msg_2", "model": "m",
            "choices": [{"index": 0, "finish_reason": "length", "stop_sequence": null,
                "message": {"role": "assistant", "content": "Hello", "reasoning_content": "think",
                    "tool_calls": [{"id": "toolu_b", "type": "function",
                                    "function": {"name": "g", "arguments": "{\"y\":[2]}"}}]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}});
        let m = message(&completion);
        assert_eq!(m["type"], "message");
        assert_eq!(
            m["content"][0],
            json!({"type": "thinking", "thinking": "think", "signature": ""})
        );
        assert_eq!(m["content"][1], json!({"type": "text", "text": "Hello"}));
        assert_eq!(
            m["content"][2],
            json!({"type": "tool_use", "id": "toolu_b", "name": "g", "input": {"y": [2]}})
        );
        assert_eq!(
            (m["stop_reason"].as_str(), m["stop_sequence"].is_null()),
            (Some("max_tokens"), true)
        );
        assert_eq!(m["usage"]["input_tokens"], 3);
        assert_eq!(m["usage"]["output_tokens"], 5);
        let empty = json!({"id": "x", "choices": [{"finish_reason": "stop",
            "message": {"content": ""}}], "usage": {}});
        assert_eq!(message(&empty)["content"], json!([]), "no empty text block");
        assert_eq!(message(&empty)["stop_reason"], "end_turn");
    }

    #[test]
    fn statuses_map_to_anthropics_error_types() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (503, "overloaded_error"),
        ];
        for (status, kind) in cases {
            assert_eq!(error_body(status, "m")["error"]["type"], kind);
        }
        assert_eq!(stop_reason("content_filter", None), "refusal");
        let named =
            json!({"error": {"message": "images are not read", "param": "messages[0].content[1]"}});
        assert_eq!(
            chat_error_message(&named),
            "messages[0].content[1]: images are not read"
        );
        let already = json!({"error": {"message": "invalid `model`: x", "param": "model"}});
        assert_eq!(chat_error_message(&already), "invalid `model`: x");
    }
}
