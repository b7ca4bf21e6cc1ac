//! Anthropic's Messages API bodies (`POST /v1/messages`, `POST
//! /v1/messages/count_tokens`) as the chat machine reads them: decoded into
//! the same [`ChatRequest`] a Chat Completions body becomes, so both routes
//! share one machine (templates, tools, grammars, reasoning). Every bad
//! value is a [`BadRequest`] naming its field, as Anthropic's API spells it.
//!
//! The conversation maps onto the chat template's roles: `system` (a
//! string or text blocks) is the system message; a user message's
//! `tool_result` blocks are `tool` messages and its text blocks a user
//! message, in their order; an assistant message's `tool_use` blocks are
//! written as the model writes calls after its text, and its `thinking`
//! blocks are left out, as the models' templates leave out earlier
//! thinking. Consecutive turns of one role are one turn. `thinking`
//! reaches the template as its `enable_thinking` switch. The answer's
//! shape is [`crate::dialect::anthropic`]'s.

use serde_json::{Map, Value};

use super::codec::{BadRequest, ChatRequest, Input, Route};
use crate::constraint::Grammar;
use crate::dialect::openai::{function_def, MAX_TOOLS};
use crate::json::{self, Fields};
use crate::params::{self, GenParams, ParamNames};
use crate::text::{ChatMessage, HistoryCall, Role, TemplateKwargs};
use crate::tools::{ToolChoice, ToolDef, Tools};

/// The sampling fields' names: Anthropic's `stop_sequences` for `stop`.
/// `seed`, `repetition_penalty` and logprobs are not Anthropic's and are
/// not read; `max_tokens` is read apart ([`ceiling`]).
const NAMES: ParamNames = ParamNames {
    max_tokens: "",
    temperature: "temperature",
    top_p: "top_p",
    top_k: "top_k",
    repetition_penalty: "",
    stop: "stop_sequences",
    seed: "",
    top_logprobs: "",
};

/// Decodes a `POST /v1/messages` body. `max_tokens` is required, as in
/// Anthropic's API, and lowered to `context_len` past it ([`ceiling`]). Fields
/// this server does not know are ignored, as Anthropic's clients expect.
pub(super) fn decode(
    obj: &Map<String, Value>,
    context_len: u32,
) -> Result<ChatRequest, BadRequest> {
    let f = Fields::new(obj, "");
    let model = f.req_str("model").map_err(BadRequest::invalid)?.to_string();
    let max_tokens = ceiling(&f, context_len)?;
    let prompt = prompt(&f)?;
    let defaults = GenParams::defaults(max_tokens);
    let params =
        params::apply(obj, "", &NAMES, &defaults, context_len).map_err(BadRequest::invalid)?;
    let stream = f
        .bool("stream")
        .map_err(BadRequest::invalid)?
        .unwrap_or(false);
    let format = output_format(&f)?;
    if prompt.tools.forced() && format.is_some() {
        return Err(BadRequest::field(
            "tool_choice",
            "a forced tool call cannot be combined with `output_config.format`; use one or the other",
        ));
    }
    if format.is_some() && ChatMessage::ends_in_prefill(&prompt.messages) {
        // As Anthropic's API: a prefill starts the answer, which the
        // format's grammar would have to start instead.
        let last = format!("messages[{}]", super::codec::message_items(&f)?.len() - 1);
        return Err(BadRequest::field(
            &last,
            "a final `assistant` message (a prefill) cannot be combined with `output_config.format`",
        ));
    }
    Ok(ChatRequest {
        route: Route::Messages,
        model,
        input: Input::Messages(prompt.messages),
        params,
        n: 1,
        logprobs: None,
        stream,
        // The closing `message_delta` carries the usage.
        include_usage: stream,
        echo: false,
        suffix: None,
        format,
        format_field: "output_config.format",
        tools: prompt.tools,
        template_kwargs: prompt.thinking.template_kwargs(),
        include_reasoning: prompt.thinking != Thinking::Disabled,
        thinking_budget: match prompt.thinking {
            Thinking::Enabled { budget } => budget,
            Thinking::Default | Thinking::Disabled => None,
        },
        fit_to_context: true,
        allowed_token_ids: None,
        bad_words: Vec::new(),
        truncate_prompt_tokens: None,
    })
}

/// `max_tokens`: required, at least 1, and a ceiling: past the context it
/// is the context (the machine then fits the answer to what the prompt
/// leaves, [`ChatRequest::fit_to_context`]).
fn ceiling(f: &Fields<'_>, context_len: u32) -> Result<u32, BadRequest> {
    match f.u64("max_tokens").map_err(BadRequest::invalid)? {
        None => Err(BadRequest::field("max_tokens", "`max_tokens` is required")),
        Some(0) => Err(BadRequest::field("max_tokens", "must be at least 1")),
        Some(m) => Ok(u32::try_from(m).unwrap_or(u32::MAX).min(context_len)),
    }
}

/// What a Messages or `count_tokens` body renders into the prompt.
#[derive(Debug)]
pub(super) struct Prompt {
    /// `system` and `messages`, as the chat template's roles.
    pub messages: Vec<ChatMessage>,
    /// `tools` and `tool_choice`.
    pub tools: Tools,
    /// `thinking`, which the template may read.
    thinking: Thinking,
}

impl Prompt {
    /// The variables the chat template renders it with.
    pub fn template_kwargs(&self) -> TemplateKwargs {
        self.thinking.template_kwargs()
    }
}

/// The prompt of a Messages or `count_tokens` body: `system`, `messages`,
/// `tools`, `tool_choice` and `thinking`, rendered alike by both routes so
/// that the count is the prompt's.
pub(super) fn prompt(f: &Fields<'_>) -> Result<Prompt, BadRequest> {
    let p = Prompt {
        messages: conversation(f)?,
        tools: tools(f)?,
        thinking: thinking(f)?,
    };
    if ChatMessage::ends_in_prefill(&p.messages) {
        // As Anthropic's API: a prefill starts the answer, which a
        // thinking block or a forced call would have to start instead.
        let last = format!("messages[{}]", super::codec::message_items(f)?.len() - 1);
        let clash = if matches!(p.thinking, Thinking::Enabled { .. }) {
            Some(
                "a final `assistant` message (a prefill) cannot be combined with extended thinking",
            )
        } else if p.tools.forced() {
            Some("a final `assistant` message (a prefill) cannot be combined with a forced `tool_choice`")
        } else {
            None
        };
        if let Some(message) = clash {
            return Err(BadRequest::field(&last, message));
        }
    }
    Ok(p)
}

/// `system` and `messages` as the chat template's roles. Consecutive user
/// (or assistant) messages are one turn, joined by a blank line, as
/// Anthropic's API combines them.
fn conversation(f: &Fields<'_>) -> Result<Vec<ChatMessage>, BadRequest> {
    let mut out = Vec::new();
    if let Some(system) = f.raw("system") {
        let text = text_of("system", system)?;
        out.push(ChatMessage::new(Role::System, text));
    }
    let items = super::codec::message_items(f)?;
    let mut last_is_assistant = false;
    for (i, item) in items.iter().enumerate() {
        let name = format!("messages[{i}]");
        let Value::Object(m) = item else {
            return Err(BadRequest::field(
                &name,
                format!("must be an object, got {}", json::type_name(item)),
            ));
        };
        let prefix = format!("{name}.");
        let mf = Fields::new(m, &prefix);
        let content = m
            .get("content")
            .ok_or_else(|| BadRequest::field(&format!("{name}.content"), "is required"))?;
        match mf.req_str("role").map_err(BadRequest::invalid)? {
            "user" => {
                user_turn(&format!("{name}.content"), content, &mut out)?;
                last_is_assistant = false;
            }
            "assistant" => {
                out.push(assistant_turn(&format!("{name}.content"), content)?);
                last_is_assistant = true;
            }
            other => {
                return Err(BadRequest::field(
                    &format!("{name}.role"),
                    format!("must be user or assistant, got `{other}`"),
                ))
            }
        }
    }
    let mut turns = merge_turns(out);
    // A last assistant message, merged with those before it as one turn,
    // is a prefill (and only the client's last message: a last user
    // message with no blocks adds no turn, but answers nothing either).
    if let Some(last) = turns
        .last_mut()
        .filter(|m| last_is_assistant && m.role == Role::Assistant)
    {
        prefill(&format!("messages[{}]", items.len() - 1), last)?;
    }
    Ok(turns)
}

/// A last `assistant` message is a prefill: the start of the answer, which
/// the model continues ([`ChatMessage::prefill`]), refused as Anthropic's
/// API refuses it when it ends in whitespace or calls a tool.
fn prefill(field: &str, turn: &mut ChatMessage) -> Result<(), BadRequest> {
    if !turn.tool_calls.is_empty() {
        return Err(BadRequest::field(
            field,
            "a final `assistant` turn with `tool_use` cannot be continued: send its `tool_result` in a `user` message",
        ));
    }
    if turn.content.ends_with(char::is_whitespace) {
        return Err(BadRequest::field(
            field,
            "final assistant content cannot end with trailing whitespace",
        ));
    }
    turn.prefill = true;
    Ok(())
}

/// Joins consecutive user (or assistant) messages into one turn: chat
/// templates that require alternating roles then take what Anthropic's
/// API takes. Tool results stay one message each.
fn merge_turns(messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    for m in messages {
        match out.last_mut() {
            Some(last) if last.role == m.role && matches!(m.role, Role::User | Role::Assistant) => {
                if !m.content.is_empty() {
                    if !last.content.is_empty() {
                        last.content.push_str("\n\n");
                    }
                    last.content.push_str(&m.content);
                }
                last.tool_calls.extend(m.tool_calls);
                last.prefill = m.prefill;
            }
            _ => out.push(m),
        }
    }
    out
}

/// A user turn: its `tool_result` blocks as `tool` messages, its text
/// blocks (runs of them joined) as user messages, in their order.
fn user_turn(field: &str, content: &Value, out: &mut Vec<ChatMessage>) -> Result<(), BadRequest> {
    let blocks = match content {
        Value::String(s) => {
            out.push(ChatMessage::new(Role::User, s.clone()));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        other => return Err(not_content(field, other)),
    };
    let mut text: Option<String> = None;
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{field}[{j}]");
        match block_type(&at, b)? {
            ("text", o) => text
                .get_or_insert_with(String::new)
                .push_str(block_text(&at, o)?),
            ("tool_result", o) => {
                if let Some(t) = text.take() {
                    out.push(ChatMessage::new(Role::User, t));
                }
                let prefix = format!("{at}.");
                let answers = Fields::new(o, &prefix)
                    .req_str("tool_use_id")
                    .map_err(BadRequest::invalid)?;
                let result = match o.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => tool_output(&format!("{at}.content"), c)?,
                };
                // The chat templates have no flag for a failed call: the
                // model reads it in the result.
                let failed = o.get("is_error").and_then(Value::as_bool) == Some(true);
                out.push(ChatMessage {
                    tool_call_id: Some(answers.to_string()),
                    ..ChatMessage::new(
                        Role::Tool,
                        if failed {
                            format!("Error: {result}")
                        } else {
                            result
                        },
                    )
                });
            }
            (kind, _) => return Err(unsupported_block(&at, kind, "user")),
        }
    }
    if let Some(t) = text {
        out.push(ChatMessage::new(Role::User, t));
    }
    Ok(())
}

/// An assistant turn: its text, and its `tool_use` blocks as its calls;
/// `thinking` blocks are left out.
fn assistant_turn(field: &str, content: &Value) -> Result<ChatMessage, BadRequest> {
    let blocks = match content {
        Value::String(s) => return Ok(ChatMessage::new(Role::Assistant, s.clone())),
        Value::Array(blocks) => blocks,
        other => return Err(not_content(field, other)),
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{field}[{j}]");
        match block_type(&at, b)? {
            ("text", o) => text.push_str(block_text(&at, o)?),
            ("tool_use", o) => {
                let prefix = format!("{at}.");
                let fields = Fields::new(o, &prefix);
                let name = fields.req_str("name").map_err(BadRequest::invalid)?;
                let id = fields.str("id").map_err(BadRequest::invalid)?.unwrap_or("");
                let input = match o.get("input") {
                    Some(i @ Value::Object(_)) => i.to_string(),
                    _ => {
                        return Err(BadRequest::field(
                            &format!("{at}.input"),
                            "must be an object (the call's arguments)",
                        ))
                    }
                };
                calls.push(HistoryCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: input,
                });
            }
            ("thinking" | "redacted_thinking", _) => {}
            (kind, _) => return Err(unsupported_block(&at, kind, "assistant")),
        }
    }
    Ok(ChatMessage {
        tool_calls: calls,
        ..ChatMessage::new(Role::Assistant, text)
    })
}

/// A block's `type` and its object.
fn block_type<'a>(at: &str, b: &'a Value) -> Result<(&'a str, &'a Map<String, Value>), BadRequest> {
    let Value::Object(o) = b else {
        return Err(BadRequest::field(
            at,
            format!("must be a content block object, got {}", json::type_name(b)),
        ));
    };
    match o.get("type").and_then(Value::as_str) {
        Some(kind) => Ok((kind, o)),
        None => Err(BadRequest::field(
            &format!("{at}.type"),
            "each content block needs a `type`",
        )),
    }
}

/// A `text` block's text.
fn block_text<'a>(at: &str, o: &'a Map<String, Value>) -> Result<&'a str, BadRequest> {
    o.get("text").and_then(Value::as_str).ok_or_else(|| {
        BadRequest::field(
            &format!("{at}.text"),
            "a `text` block needs a string `text`",
        )
    })
}

/// Text given as a string or as `text` blocks (`system`, a tool result's
/// `content`), joined.
fn text_of(field: &str, v: &Value) -> Result<String, BadRequest> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("{field}[{j}]");
                match block_type(&at, b)? {
                    ("text", o) => out.push_str(block_text(&at, o)?),
                    (kind, _) => return Err(unsupported_block(&at, kind, "text")),
                }
            }
            Ok(out)
        }
        other => Err(not_content(field, other)),
    }
}

fn not_content(field: &str, v: &Value) -> BadRequest {
    BadRequest::field(
        field,
        format!(
            "must be a string or an array of content blocks, got {}",
            json::type_name(v)
        ),
    )
}

/// What a tool returned: a string or blocks, text joined. An image or a
/// document a tool returned (a screenshot, a file it read) is left out
/// with a note saying so, rather than refused: the result stays in the
/// conversation's history, and refusing it would refuse every later turn.
fn tool_output(field: &str, v: &Value) -> Result<String, BadRequest> {
    let Value::Array(blocks) = v else {
        return text_of(field, v);
    };
    let mut out = String::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{field}[{j}]");
        match block_type(&at, b)? {
            ("text", o) => out.push_str(block_text(&at, o)?),
            (kind @ ("image" | "document"), _) => {
                out.push_str(&format!("[{kind} omitted: this model reads text only]"))
            }
            (kind, _) => return Err(unsupported_block(&at, kind, "text")),
        }
    }
    Ok(out)
}

/// A block this text server cannot take where it stands: images and
/// documents are `unsupported_parameter`, anything else a bad value.
fn unsupported_block(at: &str, kind: &str, place: &str) -> BadRequest {
    if matches!(kind, "image" | "document" | "search_result") {
        return BadRequest::unsupported(
            at,
            format!("`{kind}` blocks are not supported by this text model; send `text` blocks"),
        );
    }
    let allowed = match place {
        "user" => "text or tool_result",
        "assistant" => "text, tool_use or thinking",
        _ => "text",
    };
    BadRequest::field(
        &format!("{at}.type"),
        format!("must be {allowed} here, got `{kind}`"),
    )
}

/// `tools` (custom tools: `name`, `description`, `input_schema`) and
/// `tool_choice` (`auto`, `any`, `tool` with a `name`, `none`; with
/// `disable_parallel_tool_use`). Anthropic's server tools (web search,
/// code execution, ...) run on Anthropic's side and are refused.
fn tools(f: &Fields<'_>) -> Result<Tools, BadRequest> {
    let items = f
        .array("tools")
        .map_err(BadRequest::invalid)?
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if items.len() > MAX_TOOLS {
        return Err(BadRequest::field(
            "tools",
            format!("at most {MAX_TOOLS} tools, got {}", items.len()),
        ));
    }
    let mut defs: Vec<ToolDef> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(o) = item else {
            return Err(BadRequest::field(&at, "must be an object"));
        };
        let prefix = format!("{at}.");
        let t = Fields::new(o, &prefix);
        let kind = t
            .str("type")
            .map_err(BadRequest::invalid)?
            .unwrap_or("custom");
        if kind != "custom" {
            return Err(BadRequest::field(
                &format!("{at}.type"),
                format!("only custom tools (with `input_schema`) are supported, got `{kind}`"),
            ));
        }
        if !o.contains_key("input_schema") {
            return Err(BadRequest::field(
                &format!("{at}.input_schema"),
                "is required",
            ));
        }
        defs.push(function_def(&t, "input_schema", &defs).map_err(BadRequest::invalid)?);
    }
    let (choice, parallel) = match f.obj("tool_choice").map_err(BadRequest::invalid)? {
        None if defs.is_empty() => (ToolChoice::None, true),
        None => (ToolChoice::Auto, true),
        Some(o) => {
            let c = Fields::new(o, "tool_choice.");
            let parallel = !c
                .bool("disable_parallel_tool_use")
                .map_err(BadRequest::invalid)?
                .unwrap_or(false);
            let choice = match c.req_str("type").map_err(BadRequest::invalid)? {
                "auto" if defs.is_empty() => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "any" if defs.is_empty() => {
                    return Err(BadRequest::field(
                        "tool_choice.type",
                        "`any` needs at least one of `tools`",
                    ))
                }
                "any" => ToolChoice::Required,
                "tool" => {
                    let name = c.req_str("name").map_err(BadRequest::invalid)?;
                    if !defs.iter().any(|d| d.name == name) {
                        return Err(BadRequest::field(
                            "tool_choice.name",
                            format!("`{name}` is not one of the `tools`"),
                        ));
                    }
                    ToolChoice::Named(name.to_string())
                }
                other => {
                    return Err(BadRequest::field(
                        "tool_choice.type",
                        format!("must be auto, any, tool or none, got `{other}`"),
                    ))
                }
            };
            (choice, parallel)
        }
    };
    Ok(Tools {
        defs,
        choice,
        parallel,
    })
}

/// `output_config.format`: `{"type": "json_schema", "schema": {...}}`, the
/// grammar the answer follows (strictly, as Anthropic's structured outputs
/// do); `None` when absent. `output_config.effort` is ignored.
fn output_format(f: &Fields<'_>) -> Result<Option<Grammar>, BadRequest> {
    let Some(config) = f.obj("output_config").map_err(BadRequest::invalid)? else {
        return Ok(None);
    };
    let c = Fields::new(config, "output_config.");
    let Some(format) = c.obj("format").map_err(BadRequest::invalid)? else {
        return Ok(None);
    };
    let ff = Fields::new(format, "output_config.format.");
    match ff.req_str("type").map_err(BadRequest::invalid)? {
        "json_schema" => match format.get("schema") {
            Some(s @ Value::Object(_)) => Ok(Some(Grammar::JsonSchema {
                schema: s.clone(),
                strict: true,
            })),
            Some(other) => Err(BadRequest::field(
                "output_config.format.schema",
                format!(
                    "must be a JSON Schema object, got {}",
                    json::type_name(other)
                ),
            )),
            None => Err(BadRequest::field(
                "output_config.format.schema",
                "is required",
            )),
        },
        other => Err(BadRequest::field(
            "output_config.format.type",
            format!("must be json_schema, got `{other}`"),
        )),
    }
}

/// What `thinking` asks of a reasoning model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thinking {
    /// No `thinking`, or `adaptive`: as the model's template does.
    Default,
    /// `enabled`, with its `budget_tokens` (most tokens the thinking may
    /// take; enforced where the model's close tag is one token).
    Enabled {
        /// `budget_tokens`.
        budget: Option<u32>,
    },
    /// `disabled`: no thinking block is sent.
    Disabled,
}

impl Thinking {
    /// The chat template's switch for it, `enable_thinking`, as Qwen3's
    /// template (and others after it) reads it; templates without it
    /// ignore it.
    fn template_kwargs(self) -> TemplateKwargs {
        let mut kwargs = TemplateKwargs::new();
        match self {
            Thinking::Default => {}
            Thinking::Enabled { .. } => {
                kwargs.insert("enable_thinking".into(), Value::Bool(true));
            }
            Thinking::Disabled => {
                kwargs.insert("enable_thinking".into(), Value::Bool(false));
            }
        }
        kwargs
    }
}

/// `thinking`: `{"type": "enabled" | "adaptive" | "disabled"}`, and with
/// `enabled` a `budget_tokens` (a whole number; Anthropic's 1,024 minimum
/// is not required, so small models can be given small budgets).
fn thinking(f: &Fields<'_>) -> Result<Thinking, BadRequest> {
    let Some(t) = f.obj("thinking").map_err(BadRequest::invalid)? else {
        return Ok(Thinking::Default);
    };
    let tf = Fields::new(t, "thinking.");
    match tf.req_str("type").map_err(BadRequest::invalid)? {
        "disabled" => Ok(Thinking::Disabled),
        "enabled" => Ok(Thinking::Enabled {
            budget: tf
                .u64("budget_tokens")
                .map_err(BadRequest::invalid)?
                .map(|b| u32::try_from(b).unwrap_or(u32::MAX)),
        }),
        "adaptive" | "between_tools" => Ok(Thinking::Default),
        other => Err(BadRequest::field(
            "thinking.type",
            format!("must be enabled, adaptive or disabled, got `{other}`"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::body;
    use super::*;
    use serde_json::json;

    fn decode_body(v: Value) -> Result<ChatRequest, BadRequest> {
        decode(&body(v), 512)
    }

    fn param_of(v: Value) -> String {
        let e = decode_body(v).expect_err("refused");
        assert_eq!(e.status, 400, "{e:?}");
        e.param.unwrap_or_default()
    }

    #[test]
    fn a_last_assistant_message_is_a_prefill_and_only_the_last() {
        let r = decode_body(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "no"},
            {"role": "user", "content": "y"},
            {"role": "assistant", "content": [{"type": "text", "text": "Sure"}]},
            {"role": "assistant", "content": "thing: {"}]}))
        .expect("decodes");
        let Input::Messages(m) = r.input else {
            panic!("messages")
        };
        assert_eq!(m.len(), 4, "the two last assistant messages are one turn");
        assert!(!m[1].prefill, "an earlier assistant turn is finished");
        assert_eq!(m[3].content, "Sure\n\nthing: {");
        assert!(m[3].prefill && ChatMessage::ends_in_prefill(&m));
        // A last user message with no blocks adds no turn, and makes no
        // prefill of the assistant's before it.
        let r = decode_body(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "Hi"},
            {"role": "user", "content": []}]}))
        .expect("decodes");
        let Input::Messages(m) = r.input else {
            panic!("messages")
        };
        assert!(!ChatMessage::ends_in_prefill(&m), "{m:?}");
    }

    #[test]
    fn a_conversation_with_tools_maps_onto_the_chat_roles() {
        let r = decode_body(json!({
            "model": "m", "max_tokens": 20, "temperature": 0.5, "top_k": 4,
            "stop_sequences": ["\n\n"], "stream": true,
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Always."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": ""},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And "}, {"type": "text", "text": "Rome?"}
                ]}
            ],
            "tools": [{"name": "weather", "description": "Weather now",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
            "metadata": {"user_id": "u"}
        }))
        .expect("decodes");
        let Input::Messages(m) = &r.input else {
            panic!("messages")
        };
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::User
            ]
        );
        assert_eq!(m[0].content, "Be brief. Always.");
        assert_eq!(m[2].content, "Checking.", "no thinking");
        assert_eq!(
            m[2].tool_calls,
            [HistoryCall {
                id: "toolu_1".into(),
                name: "weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(
            (m[3].content.as_str(), m[4].content.as_str()),
            ("sunny", "And Rome?")
        );
        assert_eq!(r.route, Route::Messages);
        assert_eq!((r.params.max_tokens, r.params.top_k), (20, 4));
        assert!(r.fit_to_context);
        assert_eq!(r.params.stop, ["\n\n"]);
        assert!(r.stream && r.include_usage, "a stream ends with its usage");
        assert_eq!(r.tools.choice, ToolChoice::Auto);
        assert!(!r.tools.parallel);
        assert_eq!(
            r.tools.defs[0].parameters["properties"]["city"]["type"],
            "string"
        );
        assert_eq!((r.n, r.logprobs, r.include_reasoning), (1, None, true));
    }

    #[test]
    fn max_tokens_past_the_context_is_the_context() {
        let r = decode_body(json!({"model": "m", "max_tokens": 32000,
            "messages": [{"role": "user", "content": "x"}]}))
        .expect("decodes");
        assert_eq!(r.params.max_tokens, 512, "the context");
    }

    #[test]
    fn tool_choice_any_and_tool_force_calls() {
        let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        let with = |choice: Value| {
            decode_body(
                json!({"model": "m", "max_tokens": 5, "tools": tools.clone(),
                "tool_choice": choice, "messages": [{"role": "user", "content": "x"}]}),
            )
            .expect("decodes")
            .tools
        };
        assert_eq!(with(json!({"type": "any"})).choice, ToolChoice::Required);
        assert_eq!(
            with(json!({"type": "tool", "name": "f"})).choice,
            ToolChoice::Named("f".into())
        );
        assert_eq!(with(json!({"type": "none"})).choice, ToolChoice::None);
        assert!(with(json!({"type": "any"})).forced());
    }

    #[test]
    fn structured_output_and_thinking_settings_decode() {
        let r = decode_body(json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "low"},
            "thinking": {"type": "disabled"}}))
        .expect("decodes");
        assert_eq!(
            r.format,
            Some(Grammar::JsonSchema {
                schema: json!({"type": "object"}),
                strict: true
            })
        );
        assert!(!r.include_reasoning, "disabled thinking is not sent");
        assert_eq!(r.template_kwargs["enable_thinking"], false, "{r:?}");
        let r = decode_body(json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "thinking": {"type": "enabled", "budget_tokens": 2048}}))
        .expect("decodes");
        assert!(r.include_reasoning && r.format.is_none());
        assert_eq!(r.template_kwargs["enable_thinking"], true);
        let r = decode_body(json!({"model": "m", "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}]}))
        .expect("decodes");
        assert!(r.include_reasoning && r.template_kwargs.is_empty());
    }

    #[test]
    fn bad_values_name_their_field() {
        let user = json!([{"role": "user", "content": "x"}]);
        let cases = [
            (json!({"max_tokens": 5, "messages": user.clone()}), "model"),
            (
                json!({"model": "m", "messages": user.clone()}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": 0, "messages": user.clone()}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "max_tokens": -1, "messages": user.clone()}),
                "max_tokens",
            ),
            (json!({"model": "m", "max_tokens": 5}), "messages"),
            (
                json!({"model": "m", "max_tokens": 5, "messages": []}),
                "messages",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
                "messages[0].content[0].text",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "r"}]}]}),
                "messages[0].content[0].tool_use_id",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]},
                    {"role": "user", "content": "y"}]}),
                "messages[1].content[0].input",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure: "}]}),
                "messages[1]",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}),
                "messages[1]",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "x"}, {"role": "assistant", "content": "{"}],
                    "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
                "messages[1]",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "x"}, {"role": "assistant", "content": "Hm"}],
                    "thinking": {"type": "enabled", "budget_tokens": 1024}}),
                "messages[1]",
            ),
            (
                // A call earlier in the merged last turn is refused too.
                json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
                    {"role": "assistant", "content": "and"}]}),
                "messages[2]",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": [
                    {"role": "user", "content": "x"}, {"role": "assistant", "content": "Hm"}],
                    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                    "tool_choice": {"type": "any"}}),
                "messages[1]",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(), "system": 4}),
                "system",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(), "temperature": 3}),
                "temperature",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(), "stop_sequences": [""]}),
                "stop_sequences",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(),
                       "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(), "tools": [{"name": "f"}]}),
                "tools[0].input_schema",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(),
                       "tools": [{"name": "no spaces", "input_schema": {}}]}),
                "tools[0].name",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(), "tool_choice": {"type": "any"}}),
                "tool_choice.type",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(),
                       "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}}),
                "tool_choice.name",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(),
                       "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"},
                       "output_config": {"format": {"type": "json_schema", "schema": {}}}}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(),
                       "output_config": {"format": {"type": "json_schema"}}}),
                "output_config.format.schema",
            ),
            (
                json!({"model": "m", "max_tokens": 5, "messages": user.clone(), "thinking": {"type": "sometimes"}}),
                "thinking.type",
            ),
        ];
        for (v, field) in cases {
            assert_eq!(param_of(v.clone()), field, "{v}");
        }
    }

    #[test]
    fn turns_of_one_role_join_and_failed_or_image_tool_results_stay_readable() {
        let r = decode_body(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "is_error": true, "content": "no such file"},
                {"type": "tool_result", "tool_use_id": "t2", "content": [
                    {"type": "text", "text": "shot: "},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
            {"role": "user", "content": "c"}
        ]}))
        .expect("decodes");
        let Input::Messages(m) = &r.input else {
            panic!("messages")
        };
        let seen: Vec<(Role, &str)> = m.iter().map(|m| (m.role, m.content.as_str())).collect();
        assert_eq!(m[1].tool_calls.len(), 1);
        assert_eq!(
            seen,
            [
                (Role::User, "a\n\nb"),
                (Role::Assistant, ""),
                (Role::Tool, "Error: no such file"),
                (
                    Role::Tool,
                    "shot: [image omitted: this model reads text only]"
                ),
                (Role::User, "c"),
            ]
        );
    }

    #[test]
    fn images_are_unsupported_rather_than_bad() {
        let e = decode_body(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}))
        .expect_err("refused");
        assert_eq!(
            (e.code, e.param.as_deref()),
            ("unsupported_parameter", Some("messages[0].content[0]"))
        );
    }
}
