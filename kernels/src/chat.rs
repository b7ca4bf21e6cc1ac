//! Chat templates: the Jinja template from `tokenizer_config.json`, rendered
//! with minijinja the way `transformers`' `apply_chat_template` does.

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::Value;
use tokenwire_core::text::TemplateKwargs;
use tokenwire_core::tools::{ToolDef, ToolFormat};
use tokenwire_core::ChatMessage;

use crate::error::LoadError;
use crate::model_dir::ModelDir;

const TEMPLATE_NAME: &str = "chat_template";

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

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: &'a str,
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
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| e.to_string())?;
        // Llama 3.1's templates announce calls with `<|python_tag|>` and
        // name the tool role `ipython`; Hermes-style ones (Qwen 2.5,
        // Hermes) write `<tool_call>` blocks, as does the default.
        let tool_format = if source.contains("<|python_tag|>") || source.contains("ipython") {
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
        let msgs: Vec<Message<'_>> = messages
            .iter()
            .map(|m| Message {
                role: m.role.as_str(),
                content: &m.content,
            })
            .collect();
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| e.to_string())?;
        let tools: Option<Vec<serde_json::Value>> =
            (!tools.is_empty()).then(|| tools.iter().map(ToolDef::to_json).collect());
        tmpl.render(minijinja::context! {
            messages => msgs,
            tools => tools,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..minijinja::Value::from_serialize(kwargs)
        })
        .map_err(|e| format!("chat template: {e}"))
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

/// What a codec without a template renders: the contents joined by `\n`.
pub fn join_contents(messages: &[ChatMessage]) -> String {
    messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
