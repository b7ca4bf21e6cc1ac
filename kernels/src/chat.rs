//! Chat templates: the Jinja template from `tokenizer_config.json`, rendered
//! with minijinja the way `transformers`' `apply_chat_template` does.

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::Value;
use tokenwire_core::text::TemplateKwargs;
use tokenwire_core::tools::{self, ToolDef, ToolFormat};
use tokenwire_core::ChatMessage;

use crate::error::LoadError;
use crate::model_dir::ModelDir;

const TEMPLATE_NAME: &str = "chat_template";

/// Marks where a prefill's content ends in a rendering, to cut it there (a
/// private-use character, which no model's markup holds).
const PREFILL_END: char = '\u{E002}';

/// Most minijinja instructions one rendering may take.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// A compiled chat template plus the special-token strings it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The Jinja source, as the model's files give it.
    source: String,
    bos_token: String,
    eos_token: String,
    /// The template reads `tools` (renders function definitions itself).
    takes_tools: bool,
    /// The template reads `tool_calls` (renders earlier calls itself).
    reads_tool_calls: bool,
    /// How the template's model writes calls.
    tool_format: ToolFormat,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// A message as Hugging Face's `apply_chat_template` gives it to a
/// template: `tool_calls` on an assistant turn that called tools
/// (`{"id", "type": "function", "function": {"name", "arguments"}}`, the
/// arguments an object), and `tool_call_id` on a tool's output. A turn
/// with calls and no text has content `""`, as vLLM gives it (templates
/// test it with `in`, which `none` fails).
#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`; the error is the template engine's message.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        // A template comes from a model file: one that loops without end
        // (or for ever longer over many messages) must stop with an error
        // instead of holding a text worker. Real templates use a few
        // thousand instructions for a long conversation.
        env.set_fuel(Some(TEMPLATE_FUEL));
        // HF renders with trim_blocks and lstrip_blocks; templates are written for that.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python string/dict methods (`.strip()`, `.startswith()`, `.items()`) that HF templates call.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_test("iterable", is_iterable);
        env.add_function("strftime_now", strftime_now);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned(TEMPLATE_NAME, without_generation_tags(source))
            .map_err(|e| e.to_string())?;
        // Mistral's templates write `[TOOL_CALLS]` (and, from v11,
        // `[ARGS]` after each name); Llama 3.1's announce calls with
        // `<|python_tag|>` and name the tool role `ipython`; Hermes-style
        // ones (Qwen 2.5, Hermes) write `<tool_call>` blocks, as does the
        // default.
        let tool_format = if source.contains(tools::TOOL_CALLS) {
            if source.contains(tools::ARGS) {
                ToolFormat::MistralArgs
            } else {
                ToolFormat::MistralJson
            }
        } else if source.contains("<|python_tag|>") || source.contains("ipython") {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        };
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            takes_tools: source.contains("tools"),
            reads_tool_calls: source.contains("tool_calls"),
            tool_format,
        })
    }

    /// Whether the template renders function definitions itself (it reads
    /// `tools`).
    pub fn takes_tools(&self) -> bool {
        self.takes_tools
    }

    /// How the template's model writes tool calls.
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// A call's id as the template is given it: Mistral's templates
    /// refuse any but nine letters and digits ([`tools::mistral_call_id`]).
    fn call_id(&self, id: &str) -> String {
        if self.tool_format.is_mistral() {
            tools::mistral_call_id(id)
        } else {
            id.to_string()
        }
    }

    /// The template's Jinja source, as the model's files give it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS token's text as the template sees it (`bos_token`).
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// Renders `messages` with `add_generation_prompt = true`.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, String> {
        self.render_with(messages, &[], &TemplateKwargs::new())
    }

    /// [`ChatTemplate::render`] with `tools` (Chat Completions' tool
    /// objects) given to the template; none gives it `tools = none`, as
    /// Hugging Face does.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
    ) -> Result<String, String> {
        self.render_with(messages, tools, &TemplateKwargs::new())
    }

    /// [`ChatTemplate::render_with_tools`] with `kwargs` as more variables
    /// (`chat_template_kwargs`, as `apply_chat_template` takes them):
    /// `enable_thinking` for Qwen3, for one. The variables this renders
    /// with itself (`messages`, `tools`, `add_generation_prompt`,
    /// `bos_token`, `eos_token`) win over a kwarg of the same name.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
        kwargs: &TemplateKwargs,
    ) -> Result<String, String> {
        // A template that does not read `tool_calls` sees earlier calls
        // in the content, as the model writes them.
        let messages = if !self.reads_tool_calls {
            tools::flatten_calls(messages, self.tool_format)
        } else if self.tool_format == ToolFormat::Llama3Json {
            one_call_per_turn(messages)
        } else {
            std::borrow::Cow::Borrowed(messages)
        };
        let msgs: Vec<Message<'_>> = messages
            .iter()
            .map(|m| Message {
                role: m.role.as_str(),
                content: &m.content,
                tool_calls: (!m.tool_calls.is_empty()).then(|| {
                    m.tool_calls
                        .iter()
                        .map(|c| {
                            serde_json::json!({
                                "id": self.call_id(&c.id),
                                "type": "function",
                                "function": {"name": c.name, "arguments": tools::arguments_value(&c.arguments)},
                            })
                        })
                        .collect()
                }),
                tool_call_id: m.tool_call_id.as_deref().map(|id| self.call_id(id)),
            })
            .collect();
        let mut msgs = msgs;
        let mut prefill = ChatMessage::ends_in_prefill(&messages);
        let start = messages.last().map_or("", |m| m.content.as_str());
        if prefill && start.is_empty() {
            // An empty prefill starts nothing: the answer starts where the
            // generation prompt has it start.
            msgs.pop();
            prefill = false;
        }
        // The mark must be the server's alone, wherever the template might
        // write a client's text.
        let typed = |s: &str| s.contains(PREFILL_END);
        if prefill
            && (messages
                .iter()
                .any(|m| typed(&m.content) || m.tool_calls.iter().any(|c| typed(&c.arguments)))
                || typed(&serde_json::to_string(kwargs).unwrap_or_default())
                || tools.iter().any(|t| typed(&t.to_json().to_string())))
        {
            return Err(format!(
                "the conversation holds U+{:04X}, a private-use character the server \
                 reserves to mark where a continued message ends; remove it",
                PREFILL_END as u32
            ));
        }
        let marked;
        if prefill {
            if let Some(last) = msgs.last_mut() {
                marked = format!("{start}{PREFILL_END}");
                last.content = &marked;
            }
        }
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| e.to_string())?;
        let tools: Option<Vec<serde_json::Value>> =
            (!tools.is_empty()).then(|| tools.iter().map(ToolDef::to_json).collect());
        let text = tmpl
            .render(minijinja::context! {
                messages => msgs,
                tools => tools,
                add_generation_prompt => !prefill,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                ..minijinja::Value::from_serialize(kwargs)
            })
            .map_err(|e| format!("chat template: {e}"))?;
        if !prefill {
            return Ok(text);
        }
        // The prompt ends where the prefill does: the end of its turn is
        // cut, so the model writes on. Found by a mark, not by searching
        // for the text, which the markup after it may contain too (and
        // which a template may rewrite: Llama 3's trim it).
        let mut marks = text.match_indices(PREFILL_END);
        match (marks.next(), marks.next()) {
            (Some((at, _)), None) => Ok(text[..at].to_string()),
            _ => Err(
                "the chat template does not write the final assistant message as given, \
                 so it cannot be continued"
                    .into(),
            ),
        }
    }

    /// The template of a model directory: `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of `{name, template}` from which
    /// "default" is taken), else a `chat_template.jinja` file; `None` if neither.
    pub fn load(dir: &Path) -> Result<Option<ChatTemplate>, LoadError> {
        ChatTemplate::load_from(&ModelDir::new(dir))
    }

    /// [`ChatTemplate::load`] from a directory or a built-in model.
    pub fn load_from(dir: &ModelDir) -> Result<Option<ChatTemplate>, LoadError> {
        let cfg_path = dir.path("tokenizer_config.json");
        let cfg = if dir.exists("tokenizer_config.json") {
            Some(dir.read_json("tokenizer_config.json")?)
        } else {
            None
        };
        let token = |name: &str| -> Result<String, LoadError> {
            match cfg.as_ref().and_then(|c| c.get(name)) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => Ok(s.clone()),
                    _ => Err(LoadError::json(
                        &cfg_path,
                        format!("field `{name}` has no string `content`"),
                    )),
                },
                Some(v) => Err(LoadError::json(
                    &cfg_path,
                    format!("field `{name}` must be a string or token object, got {v}"),
                )),
            }
        };
        let (bos, eos) = (token("bos_token")?, token("eos_token")?);

        let from_config = match cfg.as_ref().and_then(|c| c.get("chat_template")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => Some(default_from_list(&cfg_path, list)?),
            Some(v) => {
                return Err(LoadError::json(
                    &cfg_path,
                    format!("field `chat_template` must be a string or a list, got {v}"),
                ))
            }
        };
        let (source, path) = match from_config {
            Some(s) => (s, cfg_path),
            None => {
                let jinja = dir.path("chat_template.jinja");
                if !dir.exists("chat_template.jinja") {
                    return Ok(None);
                }
                let bytes = dir.read("chat_template.jinja")?;
                let s = String::from_utf8(bytes)
                    .map_err(|_| LoadError::json(&jinja, "not valid UTF-8"))?;
                (s, jinja)
            }
        };
        ChatTemplate::new(&source, &bos, &eos)
            .map(Some)
            .map_err(|msg| LoadError::ChatTemplate { path, msg })
    }
}

fn default_from_list(path: &Path, list: &[Value]) -> Result<String, LoadError> {
    for item in list {
        if item.get("name").and_then(Value::as_str) == Some("default") {
            return match item.get("template") {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(LoadError::json(
                    path,
                    "chat_template entry \"default\" has no string `template`",
                )),
            };
        }
    }
    Err(LoadError::json(
        path,
        "chat_template is a list without an entry named \"default\"",
    ))
}

/// `messages` with each assistant turn of several calls given as that many
/// turns of one call each (its text with the first): Llama 3.x's templates
/// take one call per turn and refuse more ("This model only supports
/// single tool-calls at once!"), while clients send parallel calls back
/// together. Borrowed unchanged when no turn has more than one.
fn one_call_per_turn(messages: &[ChatMessage]) -> std::borrow::Cow<'_, [ChatMessage]> {
    if messages.iter().all(|m| m.tool_calls.len() <= 1) {
        return std::borrow::Cow::Borrowed(messages);
    }
    let mut out = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        if m.tool_calls.len() <= 1 {
            out.push(m.clone());
            continue;
        }
        for (i, call) in m.tool_calls.iter().enumerate() {
            out.push(ChatMessage {
                content: if i == 0 {
                    m.content.clone()
                } else {
                    String::new()
                },
                tool_calls: vec![call.clone()],
                ..m.clone()
            });
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `source` with transformers' `{% generation %}` and `{% endgeneration %}`
/// tags (which mark the assistant's tokens for training masks and render
/// what they enclose, as LFM2.5's and Laguna's templates use them) made
/// `{% if true %}` and `{% endif %}`, which minijinja knows: the same text,
/// whitespace control (`{%-`, `-%}`) kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The close after the open's own `%` (`{%}` is no tag).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            // An unclosed tag: minijinja names the error.
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (left, body) = inner.strip_prefix('-').map_or(("", inner), |b| ("-", b));
        let (body, right) = body.strip_suffix('-').map_or((body, ""), |b| (b, "-"));
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{left} if true {right}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{left} endif {right}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// `tojson` as transformers gives it to chat templates: Python's
/// `json.dumps`, so tools and calls read as the model saw them in training.
/// Keys keep their order, items are separated by `", "` and keys by
/// `": "`, and nothing is HTML-escaped (minijinja's own filter writes
/// `{"a":1}` and `\u003c`). Python's `indent` (also as the one positional
/// argument), `separators`, `sort_keys` and `ensure_ascii` are taken; any
/// other argument is the template's error rather than silently different
/// text.
fn tojson(
    value: &minijinja::Value,
    indent: Option<usize>,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, Error> {
    use serde::Serialize as _;
    let indent: Option<usize> = match kwargs.get::<Option<usize>>("indent")? {
        Some(n) => Some(n),
        None => indent,
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        None => (
            (if indent.is_some() { "," } else { ", " }).to_string(),
            ": ".to_string(),
        ),
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings (item, key)",
            ))
        }
    };
    let fail =
        |e: &dyn std::fmt::Display| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"));
    let mut json = serde_json::to_value(value).map_err(|e| fail(&e))?;
    if sort_keys == Some(true) {
        sort_object_keys(&mut json);
    }
    let mut out = Vec::new();
    let fmt = PythonJson {
        item: item.into_bytes(),
        key: key.into_bytes(),
        indent: indent.map(|n| vec![b' '; n]),
        level: 0,
        has_item: false,
    };
    json.serialize(&mut serde_json::Serializer::with_formatter(&mut out, fmt))
        .map_err(|e| fail(&e))?;
    let mut text = String::from_utf8(out).map_err(|e| fail(&e))?;
    // Every character past ASCII as `\uXXXX` (UTF-16), as Python writes it.
    // transformers passes `ensure_ascii=False` unless the template asks.
    if ensure_ascii == Some(true) {
        let mut ascii = String::with_capacity(text.len());
        for c in text.chars() {
            if c.is_ascii() {
                ascii.push(c);
            } else {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    ascii.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        text = ascii;
    }
    Ok(minijinja::Value::from_safe_string(text))
}

/// Sorts every object's keys, as `sort_keys=True` does.
fn sort_object_keys(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            let mut entries: Vec<(String, serde_json::Value)> =
                std::mem::take(o).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut v) in entries {
                sort_object_keys(&mut v);
                o.insert(k, v);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(sort_object_keys),
        _ => {}
    }
}

/// `json.dumps`'s layout: `item` between items, `key` after keys, and with
/// an indent each item on its own line, `indent` spaces per level.
struct PythonJson {
    item: Vec<u8>,
    key: Vec<u8>,
    indent: Option<Vec<u8>>,
    level: usize,
    /// The innermost open container has an item (its close goes on a new
    /// line under an indent).
    has_item: bool,
}

impl PythonJson {
    /// Before an item: its separator (after the first), then with an indent
    /// a new line at the current level.
    fn before_item<W: ?Sized + std::io::Write>(
        &self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(&self.item)?;
        }
        self.new_line(w)
    }

    fn new_line<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(pad) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.level {
                w.write_all(pad)?;
            }
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level += 1;
        self.has_item = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_item {
            self.new_line(w)?;
        }
        w.write_all(b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.before_item(w, first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_item = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level += 1;
        self.has_item = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_item {
            self.new_line(w)?;
        }
        w.write_all(b"}")
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_item = true;
        Ok(())
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.before_item(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(&self.key)
    }
}

/// Jinja's `iterable` test for `none` as Python has it: not iterable
/// (minijinja iterates it as empty and says it is). Qwen3-Coder's and
/// Nemotron's templates guard `tools | length` with it, and fail without
/// tools otherwise. Undefined is not iterable here either: the templates
/// test `is defined` first, and Jinja's lenient undefined would only
/// iterate as empty.
fn is_iterable(v: &minijinja::Value) -> bool {
    use minijinja::value::ValueKind;
    match v.kind() {
        ValueKind::Undefined | ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        ValueKind::String | ValueKind::Bytes | ValueKind::Seq | ValueKind::Map => true,
        _ => v.try_iter().is_ok(),
    }
}

/// `strftime_now(format)` as transformers gives it to chat templates:
/// the current date and time in Python's `strftime` format (UTC here; the
/// server's clock has no zone to speak of). Mistral Small 3.2's template
/// writes today's date into its system prompt; Llama 3.2's, where it is
/// defined. A directive chrono does not know is the template's error.
fn strftime_now(format: String) -> Result<String, Error> {
    use std::fmt::Write as _;
    let mut out = String::new();
    write!(out, "{}", chrono::Utc::now().format(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: `{format}` is not a date format this server knows"),
        )
    })?;
    Ok(out)
}

/// What a codec without a template renders: the contents (earlier calls
/// written into them in the default format) joined by `\n`.
pub fn join_contents(messages: &[ChatMessage]) -> String {
    tools::flatten_calls(messages, ToolFormat::Hermes)
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
