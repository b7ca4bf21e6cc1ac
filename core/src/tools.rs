//! Tool calls (function calling) for the OpenAI routes: the tools a client
//! offers, how they reach the prompt, the grammar that forces a call, and
//! the parser that finds calls in what the model wrote.
//!
//! A model writes calls in its chat template's format ([`ToolFormat`],
//! from [`crate::TextCodec::tool_format`]):
//! - [`ToolFormat::Hermes`]: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
//!   blocks (Hermes, Qwen 2.5, and the default for a template without tools);
//! - [`ToolFormat::Llama3Json`]: the whole answer one JSON object
//!   `{"name": ..., "parameters": {...}}` (Llama 3.1 and later).
//!
//! A template that takes `tools` renders them itself
//! ([`crate::TextCodec::encode_chat_with_tools`]); for any other, the tools
//! are described in a system message ([`with_tools_prompt`]). Earlier
//! calls and their results become message text in the same format, so a
//! conversation renders the same whichever way it came.
//!
//! `tool_choice: "required"` or a named function compiles to a grammar
//! ([`forcing_grammar`]) under which the answer is exactly such calls, with
//! arguments that match each function's parameter schema, so a forced call
//! always parses.

use serde_json::{json, Map, Value};

use crate::constraint::Grammar;
use crate::text::{ChatMessage, Role};

/// Most calls one answer may hold when parallel calls are allowed (the
/// forcing grammar's bound, so a small model cannot call for ever).
pub const MAX_PARALLEL_CALLS: usize = 4;

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name", "arguments"}</tool_call>` blocks.
    Hermes,
    /// The answer one JSON object `{"name", "parameters"}`.
    Llama3Json,
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
        _ => out.insert(
            0,
            ChatMessage {
                role: Role::System,
                content: text,
            },
        ),
    }
    out
}

/// An earlier call as the model would have written it (assistant history).
pub fn render_call(format: ToolFormat, name: &str, arguments: &str) -> String {
    // Arguments that are not JSON are kept as a string: the history says
    // what was sent.
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|_| arguments.into());
    match format {
        ToolFormat::Hermes => {
            format!(
                "<tool_call>{}</tool_call>",
                json!({"name": name, "arguments": args})
            )
        }
        ToolFormat::Llama3Json => json!({"name": name, "parameters": args}).to_string(),
    }
}

/// The grammar that forces the answer to be calls (`required` or a named
/// function): `None` when calls are not forced. Each call's arguments
/// follow its function's parameter schema; with `parallel`, Hermes answers
/// may hold up to [`MAX_PARALLEL_CALLS`] calls.
pub fn forcing_grammar(tools: &Tools, format: ToolFormat) -> Option<Grammar> {
    if !tools.forced() {
        return None;
    }
    let defs = tools.defs.iter().filter(|d| match &tools.choice {
        ToolChoice::Named(n) => &d.name == n,
        _ => true,
    });
    let args_key = match format {
        ToolFormat::Hermes => "arguments",
        ToolFormat::Llama3Json => "parameters",
    };
    let alternatives: Vec<Value> = defs
        .map(|d| {
            json!({
                "type": "object",
                "properties": {"name": {"const": d.name}, args_key: d.parameters},
                "required": ["name", args_key],
                "additionalProperties": false
            })
        })
        .collect();
    let schema = json!({
        "anyOf": alternatives,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ",", "key_separator": ":", "lenient": true}
    });
    let lark = match format {
        ToolFormat::Hermes => {
            let most = if tools.parallel {
                MAX_PARALLEL_CALLS
            } else {
                1
            };
            format!(
                "start: call{{1,{most}}}\ncall: \"<tool_call>\" %json {schema} \"</tool_call>\"\n"
            )
        }
        ToolFormat::Llama3Json => format!("start: %json {schema}\n"),
    };
    Some(Grammar::Lark(lark))
}

/// Splits an answer into its text and the calls in it, as `format` writes
/// them. A block that does not parse, or names a function not offered, is
/// left in the text.
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
    }
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One call object: `{"name", <args_key> or "arguments"}`, the name offered.
fn call_of(body: &str, args_key: &str, known: &dyn Fn(&str) -> bool) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(body).ok()?;
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
    /// Llama 3 JSON: the answer began like a call, so all of it waits.
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
                // Keep the longest tail that could begin `<tool_call>`.
                let keep = (1..OPEN.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&k| {
                        self.held.is_char_boundary(self.held.len() - k)
                            && OPEN.starts_with(&self.held[self.held.len() - k..])
                    })
                    .unwrap_or(0);
                let cut = self.held.len() - keep;
                if cut > 0 {
                    out.push(Released::Text(self.held[..cut].to_string()));
                    self.held.drain(..cut);
                }
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
        }
        out.retain(|r| !matches!(r, Released::Text(t) if t.is_empty()));
        out
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
            ChatMessage {
                role: Role::System,
                content: "Be brief.".into(),
            },
            ChatMessage {
                role: Role::User,
                content: "Weather?".into(),
            },
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
        assert_eq!(forcing_grammar(&t, ToolFormat::Hermes), None);
        t.choice = ToolChoice::Named("add".into());
        let Some(Grammar::Lark(g)) = forcing_grammar(&t, ToolFormat::Hermes) else {
            panic!("a grammar")
        };
        assert!(g.contains("\"add\"") && !g.contains("get_weather"), "{g}");
        assert!(g.contains("call{1,4}"), "{g}");
        t.choice = ToolChoice::Required;
        t.parallel = false;
        let Some(Grammar::Lark(g)) = forcing_grammar(&t, ToolFormat::Llama3Json) else {
            panic!("a grammar")
        };
        assert!(
            g.contains("get_weather") && g.contains("\"parameters\""),
            "{g}"
        );
        t.choice = ToolChoice::None;
        assert!(!t.active() && t.prompt_defs().is_empty());
    }
}
