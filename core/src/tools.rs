//! Tool calls (function calling) for the OpenAI routes: the tools a client
//! offers, how they reach the prompt, the grammar that forces a call, and
//! the parser that finds calls in what the model wrote.
//!
//! A model writes calls in its chat template's format ([`ToolFormat`],
//! from [`crate::TextCodec::tool_format`]):
//! - [`ToolFormat::Hermes`]: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//!   blocks (Hermes, Qwen 2.5, and the default for a template without tools);
//! - [`ToolFormat::Llama3Json`]: the whole answer one JSON object
//!   `{"name": ..., "parameters": {...}}` (Llama 3.1 and later);
//! - [`ToolFormat::MistralJson`]: `[TOOL_CALLS]` and a JSON list of
//!   `{"name", "arguments"}` (Mistral 7B v0.3, Nemo, Small up to 3.1);
//! - [`ToolFormat::MistralArgs`]: `[TOOL_CALLS]name[ARGS]{...}` per call
//!   (Mistral's tokenizers from v11: Small 3.2, Magistral, Devstral).
//!
//! Mistral's markers are special tokens; the server's codec keeps them in
//! the decoded text ([`MISTRAL_MARKERS`]) so that the parser finds them,
//! and the forcing grammar asks for them by token id.
//!
//! A template that takes `tools` renders them itself
//! ([`crate::TextCodec::encode_chat_with_tools`]); for any other, the tools
//! are described in a system message ([`with_tools_prompt`]). Earlier calls
//! come as [`crate::ChatMessage::tool_calls`]: a template that reads
//! `tool_calls` renders them as the model was trained, and for any other
//! they become message text in the model's format ([`flatten_calls`]), so
//! a conversation renders the same whichever route it came by.
//!
//! `tool_choice: "required"` or a named function compiles to a grammar
//! ([`forcing_grammar`]) under which the answer is exactly such calls, with
//! arguments that match each function's parameter schema, so a forced call
//! always parses.

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use crate::constraint::Grammar;
use crate::text::{ChatMessage, HistoryCall, Role, TextCodec};

/// Most calls one answer may hold when parallel calls are allowed (the
/// forcing grammar's bound, so a small model cannot call for ever).
pub const MAX_PARALLEL_CALLS: usize = 4;

/// Mistral's marker before its calls (a special token of its tokenizers).
pub const TOOL_CALLS: &str = "[TOOL_CALLS]";
/// Mistral's marker between a call's name and its arguments (v11 and later).
pub const ARGS: &str = "[ARGS]";
/// Mistral's marker before a call's id, where a model writes one.
pub const CALL_ID: &str = "[CALL_ID]";
/// The special tokens of Mistral's tool calls, which decoding keeps in the
/// text (as it keeps reasoning tags) so that [`parse_calls`] can find them.
pub const MISTRAL_MARKERS: [&str; 3] = [TOOL_CALLS, ARGS, CALL_ID];

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name", "arguments"}</tool_call>` blocks.
    Hermes,
    /// The answer one JSON object `{"name", "parameters"}`.
    Llama3Json,
    /// `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`.
    MistralJson,
    /// `[TOOL_CALLS]name[ARGS]{arguments}` for each call.
    MistralArgs,
}

impl ToolFormat {
    /// Whether calls are Mistral's, whose ids the templates require to be
    /// nine letters and digits ([`mistral_call_id`]).
    pub fn is_mistral(self) -> bool {
        matches!(self, ToolFormat::MistralJson | ToolFormat::MistralArgs)
    }
}

/// One function a client offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDef {
    /// Its name (letters, digits, `_`, `-`; at most 64).
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

impl ToolDef {
    /// The function in Chat Completions' tool shape, as templates and the
    /// default prompt show it.
    pub fn to_json(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), self.name.clone().into());
        if let Some(d) = &self.description {
            f.insert("description".into(), d.clone().into());
        }
        f.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": f})
    }
}

/// Whether and which tools the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No calls: the tools are left out of the prompt and nothing is parsed.
    None,
    /// The model decides; calls it writes are parsed out of its answer.
    Auto,
    /// At least one call (forced by the grammar).
    Required,
    /// A call to this function (forced by the grammar).
    Named(String),
}

/// The tools of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    /// The functions offered.
    pub defs: Vec<ToolDef>,
    /// Whether and which must be called.
    pub choice: ToolChoice,
    /// More than one call per answer allowed.
    pub parallel: bool,
}

impl Default for Tools {
    /// No tools (parallel calls allowed, as the API's default).
    fn default() -> Self {
        Tools {
            defs: Vec::new(),
            choice: ToolChoice::None,
            parallel: true,
        }
    }
}

impl Tools {
    /// Whether the model sees the tools and its calls are parsed.
    pub fn active(&self) -> bool {
        !self.defs.is_empty() && self.choice != ToolChoice::None
    }

    /// Whether the grammar forces calls.
    pub fn forced(&self) -> bool {
        self.active() && matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }

    /// The definitions the prompt shows (none when not active).
    pub fn prompt_defs(&self) -> &[ToolDef] {
        if self.active() {
            &self.defs
        } else {
            &[]
        }
    }
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments as JSON text (an object).
    pub arguments: String,
}

/// `messages` with the tools described in a system message (appended to
/// the first system message, or a new one first), for a template that does
/// not take `tools` itself. The format is the one [`parse_calls`] reads.
pub fn with_tools_prompt(
    messages: &[ChatMessage],
    defs: &[ToolDef],
    format: ToolFormat,
) -> Vec<ChatMessage> {
    if defs.is_empty() {
        return messages.to_vec();
    }
    let listed: Vec<String> = defs.iter().map(|d| d.to_json().to_string()).collect();
    // Short: every token of it is paid on every turn, and small models
    // have small contexts.
    let how = match format {
        ToolFormat::Hermes => {
            "To call one, answer with <tool_call>{\"name\": <name>, \"arguments\": <object>}</tool_call> per call."
        }
        ToolFormat::Llama3Json => {
            "To call one, answer with only {\"name\": <name>, \"parameters\": <object>}."
        }
        ToolFormat::MistralJson => {
            "To call some, answer with [TOOL_CALLS][{\"name\": <name>, \"arguments\": <object>}, ...]."
        }
        ToolFormat::MistralArgs => {
            "To call one, answer with [TOOL_CALLS]<name>[ARGS]<object> per call."
        }
    };
    let text = format!(
        "You can call these functions:\n<tools>\n{}\n</tools>\n{how}",
        listed.join("\n")
    );
    let mut out = messages.to_vec();
    match out.first_mut() {
        Some(first) if first.role == Role::System => {
            first.content = format!("{}\n\n{text}", first.content);
        }
        _ => out.insert(0, ChatMessage::new(Role::System, text)),
    }
    out
}

/// An earlier call's arguments as a JSON value: the object the client sent,
/// or, when they are not JSON, the text itself (the history says what was
/// sent).
pub fn arguments_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| arguments.into())
}

/// An assistant turn's earlier calls as the model would have written them.
pub fn render_calls(format: ToolFormat, calls: &[HistoryCall]) -> String {
    let one = |c: &HistoryCall| -> String {
        let args = arguments_value(&c.arguments);
        match format {
            ToolFormat::Hermes => format!(
                "<tool_call>{}</tool_call>",
                json!({"name": c.name, "arguments": args})
            ),
            ToolFormat::Llama3Json => json!({"name": c.name, "parameters": args}).to_string(),
            ToolFormat::MistralArgs => format!("{TOOL_CALLS}{}{ARGS}{args}", c.name),
            ToolFormat::MistralJson => json!({"name": c.name, "arguments": args}).to_string(),
        }
    };
    match format {
        ToolFormat::MistralJson if !calls.is_empty() => format!(
            "{TOOL_CALLS}[{}]",
            calls.iter().map(one).collect::<Vec<_>>().join(", ")
        ),
        _ => calls.iter().map(one).collect(),
    }
}

/// `messages` with every assistant turn's [`ChatMessage::tool_calls`]
/// written into its content in `format` (after its text, on their own
/// line), for a template, or no template, that does not read `tool_calls`.
/// Borrowed unchanged when no message holds calls.
pub fn flatten_calls(messages: &[ChatMessage], format: ToolFormat) -> Cow<'_, [ChatMessage]> {
    if messages.iter().all(|m| m.tool_calls.is_empty()) {
        return Cow::Borrowed(messages);
    }
    Cow::Owned(
        messages
            .iter()
            .map(|m| {
                if m.tool_calls.is_empty() {
                    return m.clone();
                }
                let calls = render_calls(format, &m.tool_calls);
                let content = if m.content.is_empty() {
                    calls
                } else {
                    format!("{}\n{calls}", m.content)
                };
                ChatMessage {
                    content,
                    tool_calls: Vec::new(),
                    ..m.clone()
                }
            })
            .collect(),
    )
}

/// The id a Mistral template is given for a call: Mistral's templates
/// refuse any but nine letters and digits, while clients send back the
/// ids they were given (`call_…`, `toolu_…`) or their own. Such an id is
/// kept; any other maps to nine letters and digits by a hash of it, the
/// same for the call and for the result that answers it.
pub fn mistral_call_id(id: &str) -> String {
    if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return id.to_string();
    }
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (0..9)
        .map(|_| {
            let d = DIGITS[(h % 62) as usize] as char;
            h /= 62;
            d
        })
        .collect()
}

/// The grammar that forces the answer to be calls (`required` or a named
/// function): `None` when calls are not forced. Each call's arguments
/// follow its function's parameter schema; with `parallel`, an answer may
/// hold up to [`MAX_PARALLEL_CALLS`] calls (Llama 3 JSON holds one).
/// Mistral's markers are asked for as their token ids where `codec` spells
/// each in one token, as its tokenizers do.
pub fn forcing_grammar(
    tools: &Tools,
    format: ToolFormat,
    codec: &dyn TextCodec,
) -> Option<Grammar> {
    if !tools.forced() {
        return None;
    }
    let defs: Vec<&ToolDef> = tools
        .defs
        .iter()
        .filter(|d| match &tools.choice {
            ToolChoice::Named(n) => &d.name == n,
            _ => true,
        })
        .collect();
    let args_key = match format {
        ToolFormat::Llama3Json => "parameters",
        _ => "arguments",
    };
    let options = json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":", "lenient": true});
    let call_schema = |d: &ToolDef| {
        json!({
            "type": "object",
            "properties": {"name": {"const": d.name}, args_key: d.parameters},
            "required": ["name", args_key],
            "additionalProperties": false
        })
    };
    let alternatives: Vec<Value> = defs.iter().map(|d| call_schema(d)).collect();
    let schema = json!({"anyOf": alternatives, "x-guidance": options});
    let most = if tools.parallel {
        MAX_PARALLEL_CALLS
    } else {
        1
    };
    // A marker in the grammar: its token where it is one token, so the
    // model is asked for the special token it was trained to write.
    let marker = |text: &str| match codec.encode(text, false).as_deref() {
        Ok([id]) => format!("<[{id}]>"),
        _ => Value::from(text).to_string(),
    };
    let lark = match format {
        ToolFormat::Hermes => {
            format!(
                "start: call{{1,{most}}}\ncall: \"<tool_call>\" %json {schema} \"</tool_call>\"\n"
            )
        }
        ToolFormat::Llama3Json => format!("start: %json {schema}\n"),
        ToolFormat::MistralJson => {
            let list = json!({
                "type": "array", "items": {"anyOf": alternatives},
                "minItems": 1, "maxItems": most, "x-guidance": options
            });
            format!("start: {} %json {list}\n", marker(TOOL_CALLS))
        }
        ToolFormat::MistralArgs => {
            let (open, args) = (marker(TOOL_CALLS), marker(ARGS));
            let named: Vec<String> = defs
                .iter()
                .map(|d| {
                    let params = json!({"anyOf": [d.parameters], "x-guidance": options});
                    format!("{} {args} %json {params}", Value::from(d.name.as_str()))
                })
                .collect();
            format!(
                "start: call{{1,{most}}}\ncall: {open} ({})\n",
                named.join(" | ")
            )
        }
    };
    Some(Grammar::Lark(lark))
}

/// Splits an answer into its text and the calls in it, as `format` writes
/// them. A block that does not parse, or names a function not offered, is
/// left in the text (for Mistral's formats, everything from `[TOOL_CALLS]`
/// on: its calls are taken all or none).
pub fn parse_calls(format: ToolFormat, text: &str, defs: &[ToolDef]) -> (String, Vec<ParsedCall>) {
    let known = |n: &str| defs.iter().any(|d| d.name == n);
    match format {
        ToolFormat::Hermes => {
            let mut content = String::new();
            let mut calls = Vec::new();
            let mut rest = text;
            while let Some(start) = rest.find(OPEN) {
                let after = &rest[start + OPEN.len()..];
                let Some(end) = after.find(CLOSE) else {
                    break;
                };
                match call_of(after[..end].trim(), "arguments", &known) {
                    Some(c) => {
                        content.push_str(&rest[..start]);
                        calls.push(c);
                    }
                    None => content.push_str(&rest[..start + OPEN.len() + end + CLOSE.len()]),
                }
                rest = &after[end + CLOSE.len()..];
            }
            content.push_str(rest);
            (content.trim().to_string(), calls)
        }
        ToolFormat::Llama3Json => {
            let body = text.trim();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
            match call_of(body, "parameters", &known) {
                Some(c) => (String::new(), vec![c]),
                None => (text.to_string(), Vec::new()),
            }
        }
        ToolFormat::MistralJson | ToolFormat::MistralArgs => {
            let Some(at) = text.find(TOOL_CALLS) else {
                return (text.to_string(), Vec::new());
            };
            match mistral_calls(&text[at..], &known) {
                Some(calls) => (text[..at].trim().to_string(), calls),
                None => (text.to_string(), Vec::new()),
            }
        }
    }
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The calls of a Mistral answer from its first `[TOOL_CALLS]` on, all of
/// them or none. Each marker is followed by a JSON list of calls (or one
/// call object), or by `name[ARGS]{...}` (with `[CALL_ID]id` before
/// `[ARGS]` where the model writes one): models trained on one form
/// sometimes write the other, so both are read in either format. Each JSON
/// value is read whole, so arguments may hold the markers' text.
fn mistral_calls(region: &str, known: &dyn Fn(&str) -> bool) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut rest = region.trim_start();
    while !rest.is_empty() {
        rest = rest.strip_prefix(TOOL_CALLS)?.trim_start();
        if rest.starts_with('[') || rest.starts_with('{') {
            let (value, after) = one_json(rest)?;
            match value {
                Value::Array(items) if !items.is_empty() => {
                    for item in &items {
                        calls.push(call_from(item, "arguments", known)?);
                    }
                }
                v @ Value::Object(_) => calls.push(call_from(&v, "arguments", known)?),
                _ => return None,
            }
            rest = after;
        } else {
            let at = rest.find(ARGS)?;
            let head = &rest[..at];
            let name = head.split_once(CALL_ID).map_or(head, |(n, _)| n).trim();
            if !known(name) {
                return None;
            }
            let (args, after) = one_json(rest[at + ARGS.len()..].trim_start())?;
            if !args.is_object() {
                return None;
            }
            calls.push(ParsedCall {
                name: name.to_string(),
                arguments: args.to_string(),
            });
            rest = after;
        }
        rest = rest.trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// The JSON value `text` starts with, and the text after it.
fn one_json(text: &str) -> Option<(Value, &str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

/// One call object: `{"name", <args_key> or "arguments"}`, the name offered.
fn call_of(body: &str, args_key: &str, known: &dyn Fn(&str) -> bool) -> Option<ParsedCall> {
    call_from(&serde_json::from_str(body).ok()?, args_key, known)
}

/// [`call_of`] of a parsed value.
fn call_from(v: &Value, args_key: &str, known: &dyn Fn(&str) -> bool) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?;
    if !known(name) {
        return None;
    }
    let args = v.get(args_key).or_else(|| v.get("arguments"))?;
    let arguments = match args {
        Value::Object(_) => args.to_string(),
        // Some models write the arguments as a JSON string.
        Value::String(s) if serde_json::from_str::<Map<String, Value>>(s).is_ok() => s.clone(),
        _ => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments,
    })
}

/// What a streamed answer releases as its text arrives: text that can no
/// longer start a call, and calls as each completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Text for the client.
    Text(String),
    /// A complete call.
    Call(ParsedCall),
}

/// Streams an answer that may hold calls: text is held back while it could
/// still be the start of a call, so a call's markup is never streamed as
/// text. Feeding the whole answer and then [`CallSplitter::finish`] gives
/// the calls [`parse_calls`] gives, and its text up to surrounding
/// whitespace, in order.
#[derive(Debug, Clone)]
pub struct CallSplitter {
    format: ToolFormat,
    defs: Vec<ToolDef>,
    held: String,
    /// Llama 3 JSON: the answer began like a call; Mistral: `[TOOL_CALLS]`
    /// came. All the rest waits for the end.
    whole: bool,
    /// Any text released yet (Llama 3 JSON decides at the answer's start).
    started: bool,
}

impl CallSplitter {
    /// A splitter for an answer in `format` that may call `defs`.
    pub fn new(format: ToolFormat, defs: &[ToolDef]) -> CallSplitter {
        CallSplitter {
            format,
            defs: defs.to_vec(),
            held: String::new(),
            whole: false,
            started: false,
        }
    }

    /// Takes the next piece of text; returns what may be released now.
    pub fn push(&mut self, piece: &str) -> Vec<Released> {
        self.held.push_str(piece);
        let mut out = Vec::new();
        match self.format {
            ToolFormat::Hermes => loop {
                if let Some(start) = self.held.find(OPEN) {
                    if start > 0 {
                        out.push(Released::Text(self.held[..start].to_string()));
                        self.held.drain(..start);
                    }
                    let Some(end) = self.held.find(CLOSE) else {
                        break;
                    };
                    let block: String = self.held.drain(..end + CLOSE.len()).collect();
                    let (text, calls) = parse_calls(self.format, &block, &self.defs);
                    out.extend(calls.into_iter().map(Released::Call));
                    if !text.is_empty() {
                        out.push(Released::Text(block));
                    }
                    continue;
                }
                self.release_all_but_prefix_of(OPEN, &mut out);
                break;
            },
            ToolFormat::Llama3Json => {
                if !self.started && !self.whole {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        return out;
                    }
                    if t.starts_with('{')
                        || "<|python_tag|>".starts_with(t)
                        || t.starts_with("<|python_tag|>")
                    {
                        self.whole = true;
                    } else {
                        self.started = true;
                    }
                }
                if self.started && !self.held.is_empty() {
                    out.push(Released::Text(std::mem::take(&mut self.held)));
                }
            }
            ToolFormat::MistralJson | ToolFormat::MistralArgs => {
                if self.whole {
                    return out;
                }
                if let Some(start) = self.held.find(TOOL_CALLS) {
                    out.push(Released::Text(self.held[..start].to_string()));
                    self.held.drain(..start);
                    self.whole = true;
                } else {
                    self.release_all_but_prefix_of(TOOL_CALLS, &mut out);
                }
            }
        }
        out.retain(|r| !matches!(r, Released::Text(t) if t.is_empty()));
        out
    }

    /// Releases the held text but its longest tail that could begin
    /// `marker`.
    fn release_all_but_prefix_of(&mut self, marker: &str, out: &mut Vec<Released>) {
        let keep = (1..marker.len().min(self.held.len() + 1))
            .rev()
            .find(|&k| {
                self.held.is_char_boundary(self.held.len() - k)
                    && marker.starts_with(&self.held[self.held.len() - k..])
            })
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        if cut > 0 {
            out.push(Released::Text(self.held[..cut].to_string()));
            self.held.drain(..cut);
        }
    }

    /// The answer ended: releases what was held (a call if it is one).
    pub fn finish(&mut self) -> Vec<Released> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return Vec::new();
        }
        let (text, calls) = parse_calls(self.format, &held, &self.defs);
        let mut out: Vec<Released> = calls.into_iter().map(Released::Call).collect();
        if !text.is_empty() {
            out.insert(0, Released::Text(if out.is_empty() { held } else { text }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TokenId;
    use crate::text::byte::ByteCodec;

    fn defs() -> Vec<ToolDef> {
        vec![
            ToolDef {
                name: "get_weather".into(),
                description: Some("The weather in a city.".into()),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
            ToolDef {
                name: "add".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}),
            },
        ]
    }

    #[test]
    fn hermes_blocks_are_parsed_and_unknown_or_broken_ones_stay_text() {
        let text = "Let me check. <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n<tool_call>{\"name\":\"add\",\"arguments\":\"{\\\"a\\\":1}\"}</tool_call><tool_call>{\"name\":\"nope\",\"arguments\":{}}</tool_call>";
        let (content, calls) = parse_calls(ToolFormat::Hermes, text, &defs());
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[1].arguments, r#"{"a":1}"#);
        assert!(content.starts_with("Let me check."), "{content}");
        assert!(
            content.contains("nope"),
            "an unknown function stays text: {content}"
        );
        let (content, calls) = parse_calls(
            ToolFormat::Hermes,
            "<tool_call>{broken</tool_call>",
            &defs(),
        );
        assert!(calls.is_empty());
        assert_eq!(content, "<tool_call>{broken</tool_call>");
    }

    #[test]
    fn llama3_json_is_a_call_only_when_the_whole_answer_is_one() {
        let (c, calls) = parse_calls(
            ToolFormat::Llama3Json,
            "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}",
            &defs(),
        );
        assert_eq!(c, "");
        assert_eq!(calls[0].name, "add");
        assert_eq!(calls[0].arguments, r#"{"a":1,"b":2}"#);
        let (c, calls) = parse_calls(ToolFormat::Llama3Json, "The answer is {\"a\": 1}", &defs());
        assert!(calls.is_empty());
        assert_eq!(c, "The answer is {\"a\": 1}");
    }

    #[test]
    fn the_splitter_holds_markup_and_gives_what_parse_calls_gives() {
        let text = "Sure. <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call> Done <tool_";
        for step in [1usize, 2, 3, 7, 100] {
            let mut s = CallSplitter::new(ToolFormat::Hermes, &defs());
            let mut got = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(step) {
                let piece: String = chunk.iter().collect();
                for r in s.push(&piece) {
                    if let Released::Text(t) = &r {
                        assert!(!t.contains('<'), "markup streamed: {t:?}");
                    }
                    got.push(r);
                }
            }
            got.extend(s.finish());
            let texts: String = got
                .iter()
                .filter_map(|r| match r {
                    Released::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            let calls: Vec<&ParsedCall> = got
                .iter()
                .filter_map(|r| match r {
                    Released::Call(c) => Some(c),
                    _ => None,
                })
                .collect();
            assert_eq!(texts, "Sure.  Done <tool_", "step {step}");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].arguments, r#"{"a":1,"b":2}"#);
        }
    }

    #[test]
    fn the_default_prompt_lists_every_tool_in_the_first_system_message() {
        let msgs = vec![
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Weather?"),
        ];
        let out = with_tools_prompt(&msgs, &defs(), ToolFormat::Hermes);
        assert_eq!(out.len(), 2);
        assert!(out[0].content.starts_with("Be brief.\n\n"));
        assert!(out[0].content.contains("\"name\":\"get_weather\""));
        assert!(out[0].content.contains("<tool_call>"));
        let out = with_tools_prompt(&msgs[1..], &defs(), ToolFormat::Llama3Json);
        assert_eq!(out[0].role, Role::System);
        assert!(out[0].content.contains("\"parameters\""));
    }

    #[test]
    fn forcing_grammars_name_the_chosen_functions() {
        let mut t = Tools {
            defs: defs(),
            choice: ToolChoice::Auto,
            parallel: true,
        };
        assert_eq!(forcing_grammar(&t, ToolFormat::Hermes, &ByteCodec), None);
        t.choice = ToolChoice::Named("add".into());
        let Some(Grammar::Lark(g)) = forcing_grammar(&t, ToolFormat::Hermes, &ByteCodec) else {
            panic!("a grammar")
        };
        assert!(g.contains("\"add\"") && !g.contains("get_weather"), "{g}");
        assert!(g.contains("call{1,4}"), "{g}");
        t.choice = ToolChoice::Required;
        t.parallel = false;
        let Some(Grammar::Lark(g)) = forcing_grammar(&t, ToolFormat::Llama3Json, &ByteCodec) else {
            panic!("a grammar")
        };
        assert!(
            g.contains("get_weather") && g.contains("\"parameters\""),
            "{g}"
        );
        t.choice = ToolChoice::None;
        assert!(!t.active() && t.prompt_defs().is_empty());
    }

    /// Streams `text` through a splitter in pieces of `step` characters;
    /// returns the text released and the calls.
    fn split(format: ToolFormat, text: &str, step: usize) -> (String, Vec<ParsedCall>) {
        let mut s = CallSplitter::new(format, &defs());
        let mut got = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step) {
            got.extend(s.push(&chunk.iter().collect::<String>()));
        }
        got.extend(s.finish());
        let mut texts = String::new();
        let mut calls = Vec::new();
        for r in got {
            match r {
                Released::Text(t) => texts.push_str(&t),
                Released::Call(c) => calls.push(c),
            }
        }
        (texts, calls)
    }

    #[test]
    fn mistral_calls_parse_in_both_forms_whichever_the_template_writes() {
        let list = r#"Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1}}]"#;
        let args = r#"Let me look.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[CALL_ID]abc123XYZ[ARGS]{"a": 1}"#;
        for format in [ToolFormat::MistralJson, ToolFormat::MistralArgs] {
            for text in [list, args] {
                let (content, calls) = parse_calls(format, text, &defs());
                assert_eq!(content, "Let me look.", "{format:?} {text}");
                let got: Vec<(&str, &str)> = calls
                    .iter()
                    .map(|c| (c.name.as_str(), c.arguments.as_str()))
                    .collect();
                assert_eq!(
                    got,
                    [
                        ("get_weather", r#"{"city":"Paris"}"#),
                        ("add", r#"{"a":1}"#)
                    ],
                    "{format:?} {text}"
                );
            }
        }
        // Arguments that hold the markers' own text.
        let text = r#"[TOOL_CALLS]add[ARGS]{"a": "[TOOL_CALLS]x[ARGS]{}"}[TOOL_CALLS][{"name": "add", "arguments": {"b": "[TOOL_CALLS]"}}]"#;
        for format in [ToolFormat::MistralJson, ToolFormat::MistralArgs] {
            let (content, calls) = parse_calls(format, text, &defs());
            assert_eq!(content, "");
            let args: Vec<&str> = calls.iter().map(|c| c.arguments.as_str()).collect();
            assert_eq!(
                args,
                [
                    r#"{"a":"[TOOL_CALLS]x[ARGS]{}"}"#,
                    r#"{"b":"[TOOL_CALLS]"}"#
                ]
            );
        }
        // One call object rather than a list; arguments as a JSON string.
        let (_, calls) = parse_calls(
            ToolFormat::MistralJson,
            r#"[TOOL_CALLS] {"name": "add", "arguments": "{\"a\": 2}"}"#,
            &defs(),
        );
        assert_eq!(calls[0].arguments, r#"{"a": 2}"#);
    }

    #[test]
    fn a_mistral_answer_with_a_bad_call_keeps_all_of_it_as_text() {
        for text in [
            r#"[TOOL_CALLS][{"name": "nope", "arguments": {}}]"#,
            r#"[TOOL_CALLS][{"name": "add", "arguments": {}}, {"name": "nope", "arguments": {}}]"#,
            r#"[TOOL_CALLS]add[ARGS]{"a": 1"#,
            r#"[TOOL_CALLS]add{"a": 1}"#,
            r#"[TOOL_CALLS]add[ARGS][1, 2]"#,
            r#"[TOOL_CALLS][]"#,
            r#"[TOOL_CALLS]add[ARGS]{"a": 1} and some text"#,
            "[TOOL_CALLS]",
        ] {
            for format in [ToolFormat::MistralJson, ToolFormat::MistralArgs] {
                let (content, calls) = parse_calls(format, text, &defs());
                assert!(calls.is_empty(), "{text}: {calls:?}");
                assert_eq!(content, text);
            }
        }
        let (content, calls) = parse_calls(ToolFormat::MistralArgs, "No calls [TOOL", &defs());
        assert!(calls.is_empty());
        assert_eq!(content, "No calls [TOOL");
    }

    #[test]
    fn the_mistral_splitter_streams_text_and_holds_the_calls_to_the_end() {
        let text = r#"It is [sunny] [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}"#;
        for step in [1usize, 2, 5, 100] {
            let (texts, calls) = split(ToolFormat::MistralArgs, text, step);
            assert_eq!(texts, "It is [sunny] ", "step {step}");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].name, "get_weather");
            // A marker's first characters at the end are released at the end.
            let (texts, calls) = split(ToolFormat::MistralJson, "A list: [TOOL_", step);
            assert_eq!((texts.as_str(), calls.len()), ("A list: [TOOL_", 0));
            // A broken call comes out as text, markup and all.
            let broken = r#"Hm [TOOL_CALLS][{"name": "nope"}]"#;
            let (texts, calls) = split(ToolFormat::MistralJson, broken, step);
            assert_eq!((texts.as_str(), calls.len()), (broken, 0));
        }
    }

    #[test]
    fn earlier_calls_render_in_each_format_and_flatten_into_content() {
        let calls = [
            HistoryCall {
                id: "call_1".into(),
                name: "add".into(),
                arguments: r#"{"a": 1}"#.into(),
            },
            HistoryCall {
                id: "call_2".into(),
                name: "get_weather".into(),
                arguments: "not json".into(),
            },
        ];
        assert_eq!(
            render_calls(ToolFormat::MistralJson, &calls),
            r#"[TOOL_CALLS][{"name":"add","arguments":{"a":1}}, {"name":"get_weather","arguments":"not json"}]"#
        );
        assert_eq!(
            render_calls(ToolFormat::MistralArgs, &calls),
            r#"[TOOL_CALLS]add[ARGS]{"a":1}[TOOL_CALLS]get_weather[ARGS]"not json""#
        );
        assert_eq!(
            render_calls(ToolFormat::Hermes, &calls[..1]),
            r#"<tool_call>{"name":"add","arguments":{"a":1}}</tool_call>"#
        );
        // What the model wrote parses back into the same calls.
        for format in [
            ToolFormat::MistralJson,
            ToolFormat::MistralArgs,
            ToolFormat::Hermes,
        ] {
            let (_, parsed) = parse_calls(format, &render_calls(format, &calls[..1]), &defs());
            assert_eq!(parsed[0].arguments, r#"{"a":1}"#, "{format:?}");
        }
        let msgs = vec![
            ChatMessage::new(Role::User, "sum?"),
            ChatMessage {
                tool_calls: calls[..1].to_vec(),
                ..ChatMessage::new(Role::Assistant, "Adding.")
            },
            ChatMessage {
                tool_calls: calls[..1].to_vec(),
                ..ChatMessage::new(Role::Assistant, "")
            },
        ];
        let flat = flatten_calls(&msgs, ToolFormat::MistralArgs);
        assert_eq!(flat[0], msgs[0]);
        assert_eq!(flat[1].content, "Adding.\n[TOOL_CALLS]add[ARGS]{\"a\":1}");
        assert_eq!(flat[2].content, "[TOOL_CALLS]add[ARGS]{\"a\":1}");
        assert!(flat.iter().all(|m| m.tool_calls.is_empty()));
        assert!(matches!(
            flatten_calls(&msgs[..1], ToolFormat::Hermes),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn mistral_call_ids_are_nine_letters_and_digits_and_stable() {
        assert_eq!(mistral_call_id("a1B2c3D4e"), "a1B2c3D4e");
        let ids = [
            "call_7f3a9c2b1d",
            "toolu_01",
            "",
            "a1B2c3D4e5",
            "call_7f3a9c2b1e",
        ];
        let mapped: Vec<String> = ids.iter().map(|i| mistral_call_id(i)).collect();
        for m in &mapped {
            assert_eq!(m.len(), 9, "{m}");
            assert!(m.bytes().all(|b| b.is_ascii_alphanumeric()), "{m}");
        }
        assert_eq!(mapped[0], mistral_call_id(ids[0]), "the same id maps alike");
        let distinct: std::collections::HashSet<&String> = mapped.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{mapped:?}");
    }

    /// A codec that spells Mistral's markers as one token each (ids 900,
    /// 901), and everything else as bytes.
    struct MistralCodec;

    impl TextCodec for MistralCodec {
        fn encode(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, String> {
            match text {
                TOOL_CALLS => Ok(vec![900]),
                ARGS => Ok(vec![901]),
                _ => ByteCodec.encode(text, add_special),
            }
        }

        fn decode(&self, ids: &[TokenId]) -> String {
            ByteCodec.decode(ids)
        }
    }

    #[test]
    fn mistral_forcing_grammars_ask_for_the_markers_by_token() {
        let mut t = Tools {
            defs: defs(),
            choice: ToolChoice::Required,
            parallel: true,
        };
        let Some(Grammar::Lark(g)) = forcing_grammar(&t, ToolFormat::MistralArgs, &MistralCodec)
        else {
            panic!("a grammar")
        };
        assert!(g.starts_with("start: call{1,4}\ncall: <[900]> ("), "{g}");
        assert!(g.contains(r#""get_weather" <[901]> %json"#), "{g}");
        assert!(g.contains(r#" | "add" <[901]> %json"#), "{g}");
        t.parallel = false;
        t.choice = ToolChoice::Named("add".into());
        let Some(Grammar::Lark(g)) = forcing_grammar(&t, ToolFormat::MistralJson, &MistralCodec)
        else {
            panic!("a grammar")
        };
        assert!(g.starts_with("start: <[900]> %json "), "{g}");
        assert!(
            g.contains(r#""maxItems":1"#) && g.contains(r#""minItems":1"#),
            "{g}"
        );
        assert!(
            g.contains(r#""const":"add""#) && !g.contains("get_weather"),
            "{g}"
        );
        // A codec that spells the marker in many tokens gets its text.
        let Some(Grammar::Lark(g)) = forcing_grammar(&t, ToolFormat::MistralJson, &ByteCodec)
        else {
            panic!("a grammar")
        };
        assert!(g.starts_with(r#"start: "[TOOL_CALLS]" %json"#), "{g}");
    }
}
