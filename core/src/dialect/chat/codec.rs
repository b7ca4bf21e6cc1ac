//! The OpenAI Chat Completions and Completions bodies: what a request may
//! say (decoded into a [`ChatRequest`], every bad value a [`BadRequest`]
//! naming its field) and the objects the answer is made of.

use crate::dialect::guided::guided_format;
use serde_json::{json, Map, Value};

use crate::constraint::Grammar;
use crate::dialect::openai::{self, FormatShape};
use crate::engine::{LogitBias, TokenId};
use crate::json::{self, FieldError, Fields};
use crate::params::{self, GenParams, ParamNames};
use crate::text::{ChatMessage, HistoryCall, Role, TemplateKwargs};
use crate::tools::Tools;

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: u64 = 8;
/// Most `logit_bias` entries one request may give (every entry is applied
/// to the row at every step).
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Most `stop_token_ids` one request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;
/// A `logit_bias` value's bound: -100 to 100, as in the API.
pub const LOGIT_BIAS_LIMIT: f64 = 100.0;

/// Which route a request came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`: messages, rendered with the chat template.
    Chat,
    /// `POST /v1/completions`: a raw prompt.
    Completions,
    /// `POST /v1/messages` (the `anthropic` dialect): Anthropic's Messages
    /// API, a conversation as chat's, answered in Anthropic's shape by that
    /// dialect's HTTP mapping.
    Messages,
}

impl Route {
    /// The route's name in the frame the HTTP mapping sends.
    pub fn name(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
            Route::Messages => "messages",
        }
    }

    /// The `object` of a whole answer.
    pub fn object(self) -> &'static str {
        match self {
            Route::Chat | Route::Messages => "chat.completion",
            Route::Completions => "text_completion",
        }
    }

    /// The `object` of a streamed chunk.
    pub fn chunk_object(self) -> &'static str {
        match self {
            Route::Chat | Route::Messages => "chat.completion.chunk",
            Route::Completions => "text_completion",
        }
    }
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A conversation, for the chat template.
    Messages(Vec<ChatMessage>),
    /// Raw prompts (Completions): one or more, each answered with `n`
    /// choices.
    Prompts(Vec<PromptInput>),
}

/// Completions' prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text, for the tokenizer.
    Text(String),
    /// Token ids, fed as they are (no beginning-of-sequence token added).
    Ids(Vec<TokenId>),
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// Which route.
    pub route: Route,
    /// The model it names.
    pub model: String,
    /// What to generate from.
    pub input: Input,
    /// Sampling and length, validated against the context.
    pub params: GenParams,
    /// Choices to generate (`n`).
    pub n: u32,
    /// Log-probabilities per token, with this many alternatives.
    pub logprobs: Option<u8>,
    /// Stream chunks as server-sent events.
    pub stream: bool,
    /// With `stream`: a last chunk with the usage.
    pub include_usage: bool,
    /// Completions' `echo`: the prompt before the text.
    pub echo: bool,
    /// Completions' `suffix`: each prompt is the text before a gap and
    /// this the text after it, and the model writes what goes between
    /// (fill in the middle, [`crate::fim`]); `None` when absent or empty.
    pub suffix: Option<String>,
    /// `response_format` (or vLLM's fields, [`crate::dialect::guided`]):
    /// the grammar every choice's text must follow (`None` for free text).
    pub format: Option<Grammar>,
    /// The field that asked for `format`, for errors that name it.
    pub format_field: &'static str,
    /// `tools`, `tool_choice`, `parallel_tool_calls` (chat only).
    pub tools: Tools,
    /// `chat_template_kwargs`: more variables for the chat template (chat
    /// only; empty when absent).
    pub template_kwargs: TemplateKwargs,
    /// `include_reasoning` (vLLM's): with a reasoning parser, send the
    /// reasoning as `reasoning_content` (`true`, the default) or drop it.
    pub include_reasoning: bool,
    /// Most tokens the reasoning may take before the close tag is forced:
    /// vLLM's `thinking_token_budget`, Anthropic's `thinking.budget_tokens`
    /// ([`crate::reasoning_gate`]; chat answers with a reasoning parser).
    pub thinking_budget: Option<u32>,
    /// The length is a ceiling, not a reservation (Anthropic's
    /// `max_tokens`): the prompt may take all of the context but one token,
    /// and the answer what it leaves, up to the length.
    pub fit_to_context: bool,
    /// vLLM's `allowed_token_ids`: the only ids that may be sampled
    /// ([`crate::token_rules`]); `None` when absent.
    pub allowed_token_ids: Option<Vec<TokenId>>,
    /// vLLM's `bad_words`: words never generated ([`crate::token_rules`]),
    /// tokenized with the prompt.
    pub bad_words: Vec<String>,
    /// vLLM's `truncate_prompt_tokens`: each prompt is cut to its last this
    /// many tokens once tokenized (a conversation after its template, a
    /// prompt of ids as given), before its length is checked; `None`: no
    /// cut.
    pub truncate_prompt_tokens: Option<u32>,
}

/// Most `bad_words` one request may give.
pub const MAX_BAD_WORDS: usize = 256;
/// Longest bad word, in bytes.
pub const MAX_BAD_WORD_BYTES: usize = 256;

/// A request refused before anything runs: the status, the OpenAI error
/// code, the message and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error code.
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
    /// The field, when one is to blame.
    pub param: Option<String>,
}

impl BadRequest {
    pub(super) fn invalid(e: FieldError) -> BadRequest {
        BadRequest {
            status: 400,
            code: "invalid_request",
            message: e.to_string(),
            param: Some(e.field),
        }
    }

    pub(super) fn field(field: &str, message: impl Into<String>) -> BadRequest {
        BadRequest::invalid(FieldError::new(field, message))
    }

    pub(super) fn unsupported(field: &str, message: impl Into<String>) -> BadRequest {
        BadRequest {
            status: 400,
            code: "unsupported_parameter",
            message: message.into(),
            param: Some(field.to_string()),
        }
    }

    /// The error body: `{"error": {message, type, param, code}}`.
    pub fn body(&self) -> Value {
        error_body(self.status, self.code, &self.message, self.param.as_deref())
    }
}

/// An OpenAI error body: `{"error": {message, type, param, code}}`.
pub fn error_body(status: u16, code: &str, message: &str, param: Option<&str>) -> Value {
    json!({"error": crate::dialect::openai::error_object(status, code, message, param)})
}

/// Decodes a request body (a JSON object) for `route`. `default_max_tokens`
/// and `context_len` bound the length, `vocab_size` the token ids of
/// `logit_bias`; fields this server does not know are ignored, as the
/// API's clients expect.
///
/// A [`Route::Messages`] body is Anthropic's ([`super::anthropic`]).
pub fn decode(
    route: Route,
    obj: &Map<String, Value>,
    default_max_tokens: u32,
    context_len: u32,
    vocab_size: u32,
) -> Result<ChatRequest, BadRequest> {
    if route == Route::Messages {
        // Anthropic's body: the arms below name `Messages` beside `Chat`
        // only because a match must.
        return super::anthropic::decode(obj, context_len);
    }
    let f = Fields::new(obj, "");
    let model = f.req_str("model").map_err(BadRequest::invalid)?.to_string();
    let truncate_prompt_tokens = truncation(&f, context_len)?;
    let input = match route {
        Route::Chat | Route::Messages => Input::Messages(continued(&f, messages(&f)?)?),
        Route::Completions => Input::Prompts(completion_prompts(
            &f,
            vocab_size,
            context_len,
            truncate_prompt_tokens,
        )?),
    };
    // `max_completion_tokens` is the newer name; it wins when both are set,
    // but a `max_tokens` that is no count at all is still refused.
    let names = if f.has("max_completion_tokens") {
        f.u64("max_tokens").map_err(BadRequest::invalid)?;
        ParamNames {
            max_tokens: "max_completion_tokens",
            top_logprobs: "",
            ..ParamNames::STANDARD
        }
    } else {
        ParamNames {
            top_logprobs: "",
            ..ParamNames::STANDARD
        }
    };
    let defaults = GenParams::defaults(default_max_tokens.min(context_len));
    // Completions' `max_tokens: 0` with `echo`: the prompt scored, nothing
    // generated (the API's way to read a text's logprobs).
    let score_only = route == Route::Completions
        && f.u64(names.max_tokens).ok().flatten() == Some(0)
        && f.bool("echo").ok().flatten() == Some(true);
    let names = ParamNames {
        // Read here, not by `apply`, which refuses 0.
        max_tokens: if score_only { "" } else { names.max_tokens },
        ..names
    };
    let mut params =
        params::apply(obj, "", &names, &defaults, context_len).map_err(BadRequest::invalid)?;
    if score_only {
        params.max_tokens = 0;
    }
    params.presence_penalty = penalty(&f, "presence_penalty")?;
    params.frequency_penalty = penalty(&f, "frequency_penalty")?;
    params.logit_bias = logit_bias(&f, vocab_size)?;
    if let Some(m) = f.f64("min_p").map_err(BadRequest::invalid)? {
        // Checked as stored (f32): a tiny value must not round to 0 (off)
        // or a subnormal.
        let stored = m as f32;
        if !(0.0..=1.0).contains(&m) || (m != 0.0 && !stored.is_normal()) {
            return Err(BadRequest::field(
                "min_p",
                format!("must be 0 (off) or between 1.2e-38 and 1, got {m}"),
            ));
        }
        params.min_p = stored;
    }
    // vLLM's extensions, which benchmark clients send for fixed lengths.
    params.ignore_eos = f
        .bool("ignore_eos")
        .map_err(BadRequest::invalid)?
        .unwrap_or(false);
    params.stop_token_ids = stop_token_ids(&f, vocab_size)?;
    params.include_stop_str = f
        .bool("include_stop_str_in_output")
        .map_err(BadRequest::invalid)?
        .unwrap_or(false);
    let allowed = f.array("allowed_token_ids").map_err(BadRequest::invalid)?;
    let allowed_token_ids = match allowed.map(Vec::as_slice) {
        None => None,
        Some([]) => {
            return Err(BadRequest::field(
                "allowed_token_ids",
                "must list at least one token id",
            ))
        }
        Some(items) => Some(token_ids("allowed_token_ids", items, vocab_size)?),
    };
    let bad_words = bad_words(&f)?;
    if let Some(m) = f.u64("min_tokens").map_err(BadRequest::invalid)? {
        if m > params.max_tokens as u64 {
            return Err(BadRequest::field(
                "min_tokens",
                format!(
                    "must be at most the maximum tokens ({}), got {m}",
                    params.max_tokens
                ),
            ));
        }
        params.min_tokens = m as u32;
    }
    let n = match f.u64("n").map_err(BadRequest::invalid)? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES).contains(&n) => n as u32,
        Some(n) => {
            return Err(BadRequest::field(
                "n",
                format!("must be between 1 and {MAX_CHOICES}, got {n}"),
            ))
        }
    };
    let logprobs = logprobs(route, &f)?;
    params.top_logprobs = logprobs.unwrap_or(0);
    let stream = f
        .bool("stream")
        .map_err(BadRequest::invalid)?
        .unwrap_or(false);
    let include_usage = match f.obj("stream_options").map_err(BadRequest::invalid)? {
        Some(o) => {
            let so = Fields::new(o, "stream_options.");
            so.bool("include_usage")
                .map_err(BadRequest::invalid)?
                .unwrap_or(false)
        }
        None => false,
    };
    if include_usage && !stream {
        return Err(BadRequest::field(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    let echo = route == Route::Completions
        && f.bool("echo")
            .map_err(BadRequest::invalid)?
            .unwrap_or(false);
    let suffix = match route {
        Route::Completions => f
            .str("suffix")
            .map_err(BadRequest::invalid)?
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        Route::Chat | Route::Messages => None,
    };
    if suffix.is_some() {
        if echo {
            return Err(BadRequest::field(
                "suffix",
                "`suffix` cannot be combined with `echo`",
            ));
        }
        if truncate_prompt_tokens.is_some() {
            // A cut from the left would take the markers the server writes
            // before the text.
            return Err(BadRequest::field(
                "truncate_prompt_tokens",
                "`truncate_prompt_tokens` cannot be combined with `suffix`",
            ));
        }
        let any_ids = matches!(&input, Input::Prompts(p) if p.iter().any(|p| matches!(p, PromptInput::Ids(_))));
        if any_ids {
            return Err(BadRequest::field(
                "suffix",
                "`suffix` needs text prompts, which the server writes around the markers; a prompt of token ids cannot take one",
            ));
        }
    }
    let format = match f.obj("response_format").map_err(BadRequest::invalid)? {
        Some(rf) => openai::output_format(rf, "response_format.", FormatShape::Nested)
            .map_err(BadRequest::invalid)?,
        None => None,
    };
    let (format, format_field) = match (format, guided_format(obj).map_err(BadRequest::invalid)?) {
        (format, None) => (format, "response_format"),
        (None, Some((grammar, field))) => (Some(grammar), field),
        (Some(_), Some((_, field))) => {
            return Err(BadRequest::field(
                field,
                "only one output format may be given, and `response_format` already is",
            ))
        }
    };
    let tools = match route {
        Route::Chat | Route::Messages => {
            openai::tools(&f, FormatShape::Nested).map_err(BadRequest::invalid)?
        }
        Route::Completions => Tools::default(),
    };
    if tools.forced() && format.is_some() {
        return Err(BadRequest::field(
            "tool_choice",
            format!(
                "a forced tool call cannot be combined with `{format_field}`; use one or the other"
            ),
        ));
    }
    if tools.forced() && matches!(&input, Input::Messages(m) if ChatMessage::ends_in_prefill(m)) {
        return Err(BadRequest::field(
            "tool_choice",
            "a forced tool call cannot be combined with `continue_final_message`: the call would have to start the answer the final message starts",
        ));
    }
    let template_kwargs = match route {
        Route::Chat | Route::Messages => template_kwargs(&f)?,
        Route::Completions => TemplateKwargs::new(),
    };
    let include_reasoning = f
        .bool("include_reasoning")
        .map_err(BadRequest::invalid)?
        .unwrap_or(true);
    let thinking_budget = match route {
        Route::Chat | Route::Messages => f
            .u64("thinking_token_budget")
            .map_err(BadRequest::invalid)?
            .map(|b| u32::try_from(b).unwrap_or(u32::MAX)),
        Route::Completions => None,
    };
    Ok(ChatRequest {
        route,
        model,
        input,
        params,
        n,
        logprobs,
        stream,
        include_usage,
        echo,
        suffix,
        format,
        format_field,
        tools,
        template_kwargs,
        include_reasoning,
        thinking_budget,
        fit_to_context: false,
        allowed_token_ids,
        bad_words,
        truncate_prompt_tokens,
    })
}

/// vLLM's `truncate_prompt_tokens`: a number of tokens from 1 to the
/// context length, or -1 for the context length; `None` when absent.
pub(super) fn truncation(f: &Fields<'_>, context_len: u32) -> Result<Option<u32>, BadRequest> {
    let bad = |v: &Value| {
        BadRequest::field(
            "truncate_prompt_tokens",
            format!("must be -1 (the context length) or from 1 to the context length {context_len}, got {v}"),
        )
    };
    match f.raw("truncate_prompt_tokens") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(-1) => Ok(Some(context_len)),
            Some(k) if k >= 1 && k <= i64::from(context_len) => Ok(Some(k as u32)),
            _ => Err(bad(v)),
        },
    }
}

/// vLLM's `bad_words`: up to [`MAX_BAD_WORDS`] non-empty strings of at
/// most [`MAX_BAD_WORD_BYTES`] bytes; empty when absent.
fn bad_words(f: &Fields<'_>) -> Result<Vec<String>, BadRequest> {
    let Some(items) = f.array("bad_words").map_err(BadRequest::invalid)? else {
        return Ok(Vec::new());
    };
    if items.len() > MAX_BAD_WORDS {
        return Err(BadRequest::field(
            "bad_words",
            format!("at most {MAX_BAD_WORDS} words, got {}", items.len()),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_str() {
            Some(w) if !w.trim().is_empty() && w.len() <= MAX_BAD_WORD_BYTES => Ok(w.to_string()),
            _ => Err(BadRequest::field(
                &format!("bad_words[{i}]"),
                format!(
                    "must be a string of 1 to {MAX_BAD_WORD_BYTES} bytes that is not all whitespace, got {v}"
                ),
            )),
        })
        .collect()
}

/// Most `chat_template_kwargs` one request may give.
pub const MAX_TEMPLATE_KWARGS: usize = 64;

/// Variables the chat template renders with itself, which a kwarg may not
/// replace: the conversation, its tools and its markup are the server's.
const RESERVED_TEMPLATE_VARIABLES: [&str; 6] = [
    "messages",
    "tools",
    // Llama 3.1's templates render these instead of `tools`, which the
    // server's call parser would then not know.
    "custom_tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// `chat_template_kwargs` (vLLM's): an object of variables for the chat
/// template, at most [`MAX_TEMPLATE_KWARGS`], none of the reserved names;
/// empty when absent.
pub(super) fn template_kwargs(f: &Fields<'_>) -> Result<TemplateKwargs, BadRequest> {
    let Some(map) = f.obj("chat_template_kwargs").map_err(BadRequest::invalid)? else {
        return Ok(TemplateKwargs::new());
    };
    if map.len() > MAX_TEMPLATE_KWARGS {
        return Err(BadRequest::field(
            "chat_template_kwargs",
            format!("at most {MAX_TEMPLATE_KWARGS} variables, got {}", map.len()),
        ));
    }
    if let Some(key) = map
        .keys()
        .find(|k| RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()))
    {
        return Err(BadRequest::field(
            &format!("chat_template_kwargs.{key}"),
            format!("`{key}` is set by the server from the request and cannot be given here"),
        ));
    }
    Ok(map.clone())
}

/// An OpenAI presence or frequency penalty: -2 to 2, 0 when absent.
fn penalty(f: &Fields<'_>, field: &str) -> Result<f32, BadRequest> {
    match f.f64(field).map_err(BadRequest::invalid)? {
        None => Ok(0.0),
        Some(v) if (-2.0..=2.0).contains(&v) => Ok(v as f32),
        Some(v) => Err(BadRequest::field(
            field,
            format!("must be between -2 and 2, got {v}"),
        )),
    }
}

/// `logit_bias`: an object from token ids (decimal strings, below the
/// vocabulary's size) to biases from -100 to 100, at most
/// [`MAX_LOGIT_BIAS`] of them; empty when absent. Two keys naming one id
/// ("7" and "07") are refused rather than one silently chosen.
fn logit_bias(f: &Fields<'_>, vocab_size: u32) -> Result<LogitBias, BadRequest> {
    let Some(map) = f.obj("logit_bias").map_err(BadRequest::invalid)? else {
        return Ok(LogitBias::default());
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(BadRequest::field(
            "logit_bias",
            format!("at most {MAX_LOGIT_BIAS} entries, got {}", map.len()),
        ));
    }
    let mut pairs: Vec<(TokenId, f32)> = Vec::with_capacity(map.len());
    for (key, value) in map {
        let field = format!("logit_bias.{key}");
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
            return Err(BadRequest::field(
                &field,
                format!("keys must be token ids (decimal integers), got {key:?}"),
            ));
        }
        // All digits: only too big to parse, and then past any vocabulary.
        let id = key.parse::<TokenId>().unwrap_or(TokenId::MAX);
        if id >= vocab_size {
            return Err(BadRequest::field(
                &field,
                format!("token id {key} is past the vocabulary ({vocab_size} ids)"),
            ));
        }
        let bias = match value.as_f64() {
            Some(b) if (-LOGIT_BIAS_LIMIT..=LOGIT_BIAS_LIMIT).contains(&b) => b as f32,
            Some(b) => {
                return Err(BadRequest::field(
                    &field,
                    format!("must be between -100 and 100, got {b}"),
                ))
            }
            None => {
                return Err(BadRequest::field(
                    &field,
                    format!("must be a number, got {}", json::type_name(value)),
                ))
            }
        };
        if pairs.iter().any(|&(t, _)| t == id) {
            return Err(BadRequest::field(
                &field,
                format!("token id {id} is given twice"),
            ));
        }
        pairs.push((id, bias));
    }
    Ok(pairs.into())
}

/// vLLM's `stop_token_ids`: up to [`MAX_STOP_TOKEN_IDS`] token ids below
/// the vocabulary's size; empty when absent.
fn stop_token_ids(f: &Fields<'_>, vocab_size: u32) -> Result<Vec<TokenId>, BadRequest> {
    let Some(items) = f.array("stop_token_ids").map_err(BadRequest::invalid)? else {
        return Ok(Vec::new());
    };
    if items.len() > MAX_STOP_TOKEN_IDS {
        return Err(BadRequest::field(
            "stop_token_ids",
            format!("at most {MAX_STOP_TOKEN_IDS} ids, got {}", items.len()),
        ));
    }
    token_ids("stop_token_ids", items, vocab_size)
}

/// The array `field` as token ids, each below `vocab_size`; a bad one is a
/// 400 naming `field[i]`.
pub(super) fn token_ids(
    field: &str,
    items: &[Value],
    vocab_size: u32,
) -> Result<Vec<TokenId>, BadRequest> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(t) if t < u64::from(vocab_size) => Ok(t as TokenId),
            _ => Err(BadRequest::field(
                &format!("{field}[{i}]"),
                format!("must be a token id below the vocabulary's size ({vocab_size}), got {v}"),
            )),
        })
        .collect()
}

/// `logprobs`: chat's boolean with `top_logprobs` (0 to 20), completions'
/// number of alternatives (0 to 5).
fn logprobs(route: Route, f: &Fields<'_>) -> Result<Option<u8>, BadRequest> {
    match route {
        Route::Chat | Route::Messages => {
            let on = f
                .bool("logprobs")
                .map_err(BadRequest::invalid)?
                .unwrap_or(false);
            let top = f.u64("top_logprobs").map_err(BadRequest::invalid)?;
            match top {
                Some(k) if k > params::MAX_TOP_LOGPROBS => Err(BadRequest::field(
                    "top_logprobs",
                    format!(
                        "must be between 0 and {}, got {k}",
                        params::MAX_TOP_LOGPROBS
                    ),
                )),
                Some(_) if !on => Err(BadRequest::field(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                )),
                _ => Ok(on.then_some(top.unwrap_or(0) as u8)),
            }
        }
        Route::Completions => match f.u64("logprobs").map_err(BadRequest::invalid)? {
            Some(k) if k > 5 => Err(BadRequest::field(
                "logprobs",
                format!("must be between 0 and 5, got {k}"),
            )),
            k => Ok(k.map(|k| k as u8)),
        },
    }
}

/// Chat `messages`: roles `system`, `developer` (a system message),
/// `user`, `assistant` (with `tool_calls`) and `tool` (with its
/// `tool_call_id`);
/// content a string or an array of `text` parts.
pub(super) fn messages(f: &Fields<'_>) -> Result<Vec<ChatMessage>, BadRequest> {
    message_items(f)?
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let name = format!("messages[{i}]");
            let Value::Object(m) = item else {
                return Err(BadRequest::field(
                    &name,
                    format!("must be an object, got {}", json::type_name(item)),
                ));
            };
            let prefix = format!("{name}.");
            let mf = Fields::new(m, &prefix);
            let role = mf.req_str("role").map_err(BadRequest::invalid)?;
            let role = match role {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" | "function" => Role::Tool,
                other => {
                    return Err(BadRequest::field(
                        &format!("{name}.role"),
                        format!(
                            "must be system, developer, user, assistant or tool, got `{other}`"
                        ),
                    ))
                }
            };
            let calls = match m.get("tool_calls") {
                None | Some(Value::Null) => Vec::new(),
                Some(_) if role != Role::Assistant => {
                    return Err(BadRequest::field(
                        &format!("{name}.tool_calls"),
                        "only assistant messages carry `tool_calls`",
                    ))
                }
                Some(Value::Array(calls)) => calls
                    .iter()
                    .enumerate()
                    .map(|(j, c)| history_call(&format!("{name}.tool_calls[{j}]"), c))
                    .collect::<Result<Vec<_>, _>>()?,
                Some(other) => {
                    return Err(BadRequest::field(
                        &format!("{name}.tool_calls"),
                        format!("must be an array, got {}", json::type_name(other)),
                    ))
                }
            };
            let text = match (m.get("content"), calls.is_empty()) {
                // An assistant turn that only called tools has no content.
                (None | Some(Value::Null), false) => String::new(),
                (c, _) => content(&format!("{name}.content"), c)?,
            };
            let tool_call_id = match (role, m.get("tool_call_id")) {
                (Role::Tool, Some(Value::String(id))) => Some(id.clone()),
                _ => None,
            };
            Ok(ChatMessage {
                tool_calls: calls,
                tool_call_id,
                ..ChatMessage::new(role, text)
            })
        })
        .collect()
}

/// vLLM's `continue_final_message: true`: the last message, an
/// assistant's, is the start of the answer, which the model continues
/// ([`ChatMessage::prefill`]). `add_generation_prompt` may be left out or
/// `false` beside it (vLLM asks for `false`); `true` contradicts it.
pub(super) fn continued(
    f: &Fields<'_>,
    mut msgs: Vec<ChatMessage>,
) -> Result<Vec<ChatMessage>, BadRequest> {
    let field = "continue_final_message";
    if !f.bool(field).map_err(BadRequest::invalid)?.unwrap_or(false) {
        return Ok(msgs);
    }
    if f.bool("add_generation_prompt")
        .map_err(BadRequest::invalid)?
        == Some(true)
    {
        return Err(BadRequest::field(
            "add_generation_prompt",
            "must be false with `continue_final_message`: the final message is continued, not answered",
        ));
    }
    match msgs.last_mut() {
        Some(last) if last.role == Role::Assistant && last.tool_calls.is_empty() => {
            last.prefill = true;
            Ok(msgs)
        }
        Some(last) if last.role == Role::Assistant => Err(BadRequest::field(
            field,
            "the final assistant message has `tool_calls`, so there is no text to continue",
        )),
        _ => Err(BadRequest::field(
            field,
            "needs the last message to be an `assistant` message to continue",
        )),
    }
}

/// The `messages` array: required, and not empty (both routes' rule).
pub(super) fn message_items<'a>(f: &Fields<'a>) -> Result<&'a [Value], BadRequest> {
    let items = f
        .array("messages")
        .map_err(BadRequest::invalid)?
        .ok_or_else(|| BadRequest::field("messages", "`messages` is required"))?;
    if items.is_empty() {
        return Err(BadRequest::field(
            "messages",
            "must hold at least one message",
        ));
    }
    Ok(items)
}

/// One earlier call of an assistant message.
fn history_call(field: &str, v: &Value) -> Result<HistoryCall, BadRequest> {
    let Value::Object(o) = v else {
        return Err(BadRequest::field(field, "must be an object"));
    };
    let prefix = format!("{field}.function.");
    let func = o
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| BadRequest::field(&format!("{field}.function"), "is required"))?;
    let ff = Fields::new(func, &prefix);
    let name = ff.req_str("name").map_err(BadRequest::invalid)?;
    let arguments = ff
        .str("arguments")
        .map_err(BadRequest::invalid)?
        .unwrap_or("{}");
    let id = match o.get("id") {
        None | Some(Value::Null) => "",
        Some(Value::String(id)) => id,
        Some(other) => {
            return Err(BadRequest::field(
                &format!("{field}.id"),
                format!("must be a string, got {}", json::type_name(other)),
            ))
        }
    };
    Ok(HistoryCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// A message's content: a string, or `text` parts joined.
fn content(field: &str, v: Option<&Value>) -> Result<String, BadRequest> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let part = format!("{field}[{j}]");
                let kind = p.get("type").and_then(Value::as_str);
                match (kind, p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some("text"), None) => {
                        return Err(BadRequest::field(&format!("{part}.text"), "a `text` part needs a string `text`"))
                    }
                    (Some(other), _) => {
                        return Err(BadRequest::unsupported(
                            &part,
                            format!("`{other}` parts are not supported by this text model; send `text` parts"),
                        ))
                    }
                    (None, _) => return Err(BadRequest::field(&format!("{part}.type"), "each part needs a `type`")),
                }
            }
            Ok(out)
        }
        Some(Value::Null) | None => Err(BadRequest::field(field, "a message needs `content`")),
        Some(other) => Err(BadRequest::field(
            field,
            format!(
                "must be a string or an array of parts, got {}",
                json::type_name(other)
            ),
        )),
    }
}

/// A `prompt` that is one string (or an array holding one), as `/tokenize`
/// takes it.
pub(super) fn prompt(f: &Fields<'_>) -> Result<String, BadRequest> {
    match f.raw("prompt") {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(a[0].as_str().unwrap_or_default().to_string())
        }
        Some(Value::Array(_)) => Err(BadRequest::field(
            "prompt",
            "must be one string (or an array holding one)",
        )),
        None => Err(BadRequest::field("prompt", "`prompt` is required")),
        Some(other) => Err(BadRequest::field(
            "prompt",
            format!("must be a string, got {}", json::type_name(other)),
        )),
    }
}

/// Most prompts one Completions request may give.
pub const MAX_PROMPTS: usize = 1024;

/// Completions' `prompt`: a string, token ids, or an array of strings or
/// of arrays of ids (a batch of prompts, as evaluation clients send them).
fn completion_prompts(
    f: &Fields<'_>,
    vocab: u32,
    context_len: u32,
    truncate: Option<u32>,
) -> Result<Vec<PromptInput>, BadRequest> {
    let items = match f.raw("prompt") {
        Some(Value::Array(a)) => a,
        _ => return prompt(f).map(|p| vec![PromptInput::Text(p)]),
    };
    let ids = |field: &str, a: &[Value]| {
        if a.is_empty() {
            return Err(BadRequest::field(field, "must not be empty"));
        }
        // Cut before the length is checked; every id is still checked.
        let kept = match truncate {
            Some(k) => {
                token_ids(field, a, vocab)?;
                &a[a.len().saturating_sub(k as usize)..]
            }
            None => a,
        };
        prompt_ids(field, kept, vocab, context_len).map(PromptInput::Ids)
    };
    if items.is_empty() {
        return Err(BadRequest::field("prompt", "must not be empty"));
    }
    if items[0].is_number() {
        // One prompt of ids.
        return Ok(vec![ids("prompt", items)?]);
    }
    if items.len() > MAX_PROMPTS {
        return Err(BadRequest::field(
            "prompt",
            format!("at most {MAX_PROMPTS} prompts, got {}", items.len()),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(PromptInput::Text(s.clone())),
            Value::Array(a) => ids(&format!("prompt[{i}]"), a),
            other => Err(BadRequest::field(
                &format!("prompt[{i}]"),
                format!(
                    "must be a string or token ids, not {}",
                    json::type_name(other)
                ),
            )),
        })
        .collect()
}

/// A prompt's token ids (`field` names it in errors): at most
/// `context_len` of them, each below `vocab`.
pub(super) fn prompt_ids(
    field: &str,
    items: &[Value],
    vocab: u32,
    context_len: u32,
) -> Result<Vec<TokenId>, BadRequest> {
    if items.len() > context_len as usize {
        return Err(BadRequest {
            code: "context_length_exceeded",
            ..BadRequest::field(
                field,
                format!(
                    "holds {} tokens, more than the context of {context_len}",
                    items.len()
                ),
            )
        });
    }
    token_ids(field, items, vocab)
}

/// A JSON object's map, for the tests of this dialect's decoders.
#[cfg(test)]
pub(super) fn body(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("the tests pass objects"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolChoice;

    fn chat(v: Value) -> Result<ChatRequest, BadRequest> {
        decode(Route::Chat, &body(v), 64, 512, 1000)
    }

    #[test]
    fn a_chat_body_with_every_common_field_decodes() {
        let r = chat(json!({
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
                {"role": "assistant", "content": "Hello", "tool_calls": null},
                {"role": "user", "content": "More"}
            ],
            "max_completion_tokens": 20, "max_tokens": 99,
            "temperature": 0, "top_p": 0.5, "stop": ["\n"], "seed": 3, "n": 2,
            "logprobs": true, "top_logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": -1,
            "stream": true, "stream_options": {"include_usage": true},
            "user": "u", "response_format": {"type": "text"}, "tools": [],
            "some_future_field": {"x": 1}
        }))
        .expect("decodes");
        let Input::Messages(m) = &r.input else {
            panic!("messages")
        };
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].role, Role::System, "developer is a system message");
        assert_eq!(m[1].content, "Hi!");
        assert_eq!(r.params.max_tokens, 20, "max_completion_tokens wins");
        assert_eq!(r.params.stop, vec!["\n".to_string()]);
        assert_eq!(r.params.seed, Some(3));
        assert_eq!((r.n, r.logprobs), (2, Some(2)));
        assert_eq!(
            (r.params.presence_penalty, r.params.frequency_penalty),
            (0.5, -1.0)
        );
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "model",
            ),
            (json!({"model": "m"}), "messages"),
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}),
                "n",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}),
                "temperature",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                // Found by the simulator: superseded, but no count at all.
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                       "max_completion_tokens": 4, "max_tokens": -1}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5}),
                "presence_penalty",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": [1]}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                       "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice.function.name",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                       "tool_choice": "required", "response_format": {"type": "json_object"}}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]}),
                "messages[0].tool_calls",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10000}),
                "max_tokens",
            ),
        ];
        for (v, field) in cases {
            let e = chat(v.clone()).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(field), "{v}: {e:?}");
            assert_eq!(e.status, 400);
            let b = e.body();
            assert_eq!(b["error"]["param"], field);
            assert_eq!(b["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn tools_and_a_tool_conversation_decode() {
        let r = chat(json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false
        }))
        .expect("decodes");
        let Input::Messages(m) = &r.input else {
            panic!("messages")
        };
        assert_eq!((m[1].role, m[1].content.as_str()), (Role::Assistant, ""));
        assert_eq!(
            m[1].tool_calls,
            [HistoryCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: r#"{"city": "Paris"}"#.into()
            }]
        );
        assert_eq!((m[2].role, m[2].content.as_str()), (Role::Tool, "sunny"));
        assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(r.tools.defs.len(), 1);
        assert_eq!(r.tools.choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.tools.parallel && r.tools.forced());
    }

    #[test]
    fn response_formats_decode_to_their_grammars() {
        let with = |rf: Value| {
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": rf}))
                .expect("decodes")
                .format
        };
        assert_eq!(with(json!({"type": "text"})), None);
        assert_eq!(
            with(json!({"type": "json_object"})),
            Some(Grammar::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            with(
                json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": true}})
            ),
            Some(Grammar::JsonSchema {
                schema,
                strict: true
            })
        );
        assert_eq!(
            with(json!({"type": "json_schema", "json_schema": {"name": "p"}})),
            Some(Grammar::JsonSchema {
                schema: json!({}),
                strict: false
            })
        );
    }

    #[test]
    fn vllm_s_structured_output_fields_are_formats_too_but_only_one_of_all() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        let r = chat(json!({"model": "m", "messages": msgs, "guided_choice": ["a", "b"]}))
            .expect("decodes");
        assert_eq!(
            r.format,
            Some(Grammar::Choice(vec!["a".into(), "b".into()]))
        );
        assert_eq!(r.format_field, "guided_choice");
        let r = chat(
            json!({"model": "m", "messages": msgs, "response_format": {"type": "text"},
                            "structured_outputs": {"regex": "[0-9]+"}}),
        )
        .expect("a text response_format asks for nothing");
        assert_eq!(r.format, Some(Grammar::Regex("[0-9]+".into())));
        assert_eq!(r.format_field, "structured_outputs.regex");
        let r = chat(
            json!({"model": "m", "messages": msgs, "response_format": {"type": "json_object"}}),
        )
        .expect("decodes");
        assert_eq!(r.format_field, "response_format");
        let e = chat(
            json!({"model": "m", "messages": msgs, "response_format": {"type": "json_object"},
                            "guided_regex": "a"}),
        )
        .expect_err("two formats");
        assert_eq!(e.param.as_deref(), Some("guided_regex"), "{e:?}");
        let e = chat(json!({"model": "m", "messages": msgs, "guided_regex": "a",
                            "tools": [{"type": "function", "function": {"name": "f"}}],
                            "tool_choice": "required"}))
        .expect_err("a forced call and a format");
        assert_eq!(e.param.as_deref(), Some("tool_choice"), "{e:?}");
    }

    #[test]
    fn continue_final_message_makes_the_last_assistant_message_a_prefill() {
        let msgs =
            json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": "The"}]);
        let decode_msgs = |extra: Value| {
            let mut b = json!({"model": "m", "messages": msgs});
            for (k, v) in extra.as_object().expect("object") {
                b[k] = v.clone();
            }
            chat(b).map(|r| match r.input {
                Input::Messages(m) => m,
                Input::Prompts(_) => panic!("messages"),
            })
        };
        let m = decode_msgs(json!({})).expect("decodes");
        assert!(
            !ChatMessage::ends_in_prefill(&m),
            "answered, by default, as vLLM does"
        );
        for extra in [
            json!({"continue_final_message": true}),
            json!({"continue_final_message": true, "add_generation_prompt": false}),
        ] {
            let m = decode_msgs(extra.clone()).expect("decodes");
            assert!(ChatMessage::ends_in_prefill(&m), "{extra}");
            assert!(!m[0].prefill);
        }
        let e = decode_msgs(json!({"continue_final_message": true, "add_generation_prompt": true}))
            .expect_err("contradicts");
        assert_eq!(e.param.as_deref(), Some("add_generation_prompt"));
        let e = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                            "continue_final_message": true}),
        )
        .expect_err("nothing to continue");
        assert_eq!(e.param.as_deref(), Some("continue_final_message"));
        let e = chat(
            json!({"model": "m", "continue_final_message": true, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
        )
        .expect_err("a call to continue");
        assert_eq!(e.param.as_deref(), Some("continue_final_message"));
        let e = chat(
            json!({"model": "m", "messages": msgs, "continue_final_message": true,
                            "tools": [{"type": "function", "function": {"name": "f"}}],
                            "tool_choice": "required"}),
        )
        .expect_err("a forced call cannot start a continued answer");
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn a_completions_suffix_needs_text_prompts_and_no_echo() {
        let completions = |v: Value| decode(Route::Completions, &body(v), 64, 512, 1000);
        let r = completions(json!({"model": "m", "prompt": ["a", "b"], "suffix": "z"}))
            .expect("decodes");
        assert_eq!(r.suffix.as_deref(), Some("z"));
        let r = completions(json!({"model": "m", "prompt": "a", "suffix": ""})).expect("decodes");
        assert_eq!(r.suffix, None, "an empty suffix is none");
        for bad in [
            json!({"model": "m", "prompt": "a", "suffix": "z", "echo": true}),
            json!({"model": "m", "prompt": [[1, 2]], "suffix": "z"}),
            json!({"model": "m", "prompt": ["a", [1, 2]], "suffix": "z"}),
        ] {
            let e = completions(bad.clone()).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some("suffix"), "{bad}");
        }
        let r = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                            "suffix": "z"}),
        )
        .expect("chat ignores it");
        assert_eq!(r.suffix, None);
    }

    #[test]
    fn completions_take_one_prompt_echo_and_numeric_logprobs() {
        let r = decode(
            Route::Completions,
            &body(json!({"model": "m", "prompt": ["Once"], "logprobs": 3, "echo": true})),
            64,
            512,
            1000,
        )
        .expect("decodes");
        assert_eq!(
            r.input,
            Input::Prompts(vec![PromptInput::Text("Once".into())])
        );
        assert_eq!(r.logprobs, Some(3));
        assert!(r.echo);
    }

    #[test]
    fn completions_take_strings_and_token_ids_alone_or_in_a_batch() {
        let prompt = |p: Value| {
            decode(
                Route::Completions,
                &body(json!({"model": "m", "prompt": p})),
                64,
                512,
                1000,
            )
        };
        let ids = PromptInput::Ids(vec![1, 999, 0]);
        let one = Input::Prompts(vec![ids.clone()]);
        assert_eq!(prompt(json!([1, 999, 0])).expect("ids").input, one);
        assert_eq!(prompt(json!([[1, 999, 0]])).expect("ids in one").input, one);
        let text = PromptInput::Text("a".into());
        assert_eq!(
            prompt(json!(["a", [1, 999, 0], "a"]))
                .expect("a batch")
                .input,
            Input::Prompts(vec![text.clone(), ids, text])
        );
        let cases = [
            (json!([]), "prompt", "invalid_request"),
            (json!([[]]), "prompt[0]", "invalid_request"),
            (json!([1, 1000]), "prompt[1]", "invalid_request"),
            (json!([1, -1]), "prompt[1]", "invalid_request"),
            (json!([[1, 2.5]]), "prompt[0][1]", "invalid_request"),
            (json!([1, "a"]), "prompt[1]", "invalid_request"),
            (json!([[1], []]), "prompt[1]", "invalid_request"),
            (json!(["a", 1]), "prompt[1]", "invalid_request"),
            (json!([{"a": 1}]), "prompt[0]", "invalid_request"),
            (
                json!(vec!["a"; MAX_PROMPTS + 1]),
                "prompt",
                "invalid_request",
            ),
            (json!(vec![1; 513]), "prompt", "context_length_exceeded"),
        ];
        for (p, field, code) in cases {
            let e = prompt(p.clone()).expect_err("refused");
            assert_eq!(
                (e.param.as_deref(), e.code),
                (Some(field), code),
                "{p}: {e:?}"
            );
        }
    }

    #[test]
    fn min_p_min_tokens_ignore_eos_and_stop_token_ids_decode_in_range() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        let r = chat(json!({"model": "m", "messages": msgs, "max_tokens": 9,
            "min_tokens": 9, "ignore_eos": true, "min_p": 0.05, "stop_token_ids": [11]}))
        .expect("decodes");
        assert_eq!((r.params.min_tokens, r.params.ignore_eos), (9, true));
        assert_eq!(r.params.stop_token_ids, [11]);
        assert_eq!(r.params.sampling(1, 3, &[]).min_p, 0.05);
        // min_tokens holds back the EOS ids and the stop token ids.
        let s = r.params.sampling(1, 3, &[2, 7]);
        assert_eq!((s.min_tokens, &s.stop_ids[..]), (9, &[2, 7, 11][..]));
        let off = chat(json!({"model": "m", "messages": msgs})).expect("decodes");
        assert_eq!((off.params.min_tokens, off.params.ignore_eos), (0, false));
        assert!(off.params.sampling(1, 3, &[2]).stop_ids.is_empty());
        for (extra, field) in [
            (json!({"max_tokens": 9, "min_tokens": 10}), "min_tokens"),
            (json!({"min_tokens": -1}), "min_tokens"),
            (json!({"ignore_eos": "yes"}), "ignore_eos"),
            (json!({"min_p": 1.5}), "min_p"),
            (json!({"min_p": -0.1}), "min_p"),
            (json!({"min_p": 1e-50}), "min_p"),
            (json!({"stop_token_ids": [5, 1000]}), "stop_token_ids[1]"),
            (json!({"stop_token_ids": 5}), "stop_token_ids"),
        ] {
            let mut b = json!({"model": "m", "messages": msgs});
            for (k, v) in extra.as_object().expect("object") {
                b[k] = v.clone();
            }
            let e = chat(b).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(field), "{extra}");
        }
    }

    #[test]
    fn allowed_token_ids_bad_words_and_include_stop_str_decode_in_range() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        let r = chat(
            json!({"model": "m", "messages": msgs, "allowed_token_ids": [5, 999],
            "bad_words": ["foo", " bar baz"], "include_stop_str_in_output": true}),
        )
        .expect("decodes");
        assert_eq!(r.allowed_token_ids, Some(vec![5, 999]));
        assert_eq!(r.bad_words, ["foo", " bar baz"]);
        assert!(r.params.include_stop_str);
        let off = chat(json!({"model": "m", "messages": msgs})).expect("decodes");
        assert_eq!((off.allowed_token_ids, off.bad_words.len()), (None, 0));
        assert!(!off.params.include_stop_str);
        for (extra, field) in [
            (json!({"allowed_token_ids": []}), "allowed_token_ids"),
            (
                json!({"allowed_token_ids": [1, 1000]}),
                "allowed_token_ids[1]",
            ),
            (json!({"allowed_token_ids": 4}), "allowed_token_ids"),
            (json!({"bad_words": "foo"}), "bad_words"),
            (json!({"bad_words": ["a", ""]}), "bad_words[1]"),
            (json!({"bad_words": ["  "]}), "bad_words[0]"),
            (json!({"bad_words": [7]}), "bad_words[0]"),
            (json!({"bad_words": ["x".repeat(257)]}), "bad_words[0]"),
            (
                json!({"bad_words": vec!["w"; MAX_BAD_WORDS + 1]}),
                "bad_words",
            ),
            (
                json!({"include_stop_str_in_output": 1}),
                "include_stop_str_in_output",
            ),
        ] {
            let mut b = json!({"model": "m", "messages": msgs});
            for (k, v) in extra.as_object().expect("object") {
                b[k] = v.clone();
            }
            let e = chat(b).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(field), "{extra}");
        }
    }

    #[test]
    fn truncate_prompt_tokens_cuts_id_prompts_before_their_length_is_checked() {
        let completions = |v: Value| decode(Route::Completions, &body(v), 64, 512, 1000);
        let long: Vec<u32> = (0..700).map(|i| i % 1000).collect();
        let r = completions(json!({"model": "m", "prompt": long.clone(),
            "truncate_prompt_tokens": 100}))
        .expect("cut to fit");
        assert_eq!(r.truncate_prompt_tokens, Some(100));
        assert_eq!(
            r.input,
            Input::Prompts(vec![PromptInput::Ids(long[600..].to_vec())])
        );
        let r = completions(json!({"model": "m", "prompt": "a", "truncate_prompt_tokens": -1}))
            .expect("the context");
        assert_eq!(r.truncate_prompt_tokens, Some(512));
        let e = completions(json!({"model": "m", "prompt": long})).expect_err("too long");
        assert_eq!(e.code, "context_length_exceeded");
        for bad in [json!(0), json!(-2), json!(513), json!(1.5), json!("9")] {
            let e =
                completions(json!({"model": "m", "prompt": "a", "truncate_prompt_tokens": bad}))
                    .expect_err("refused");
            assert_eq!(e.param.as_deref(), Some("truncate_prompt_tokens"), "{bad}");
        }
        // An id past the vocabulary in the part cut off is still refused.
        let e = completions(json!({"model": "m", "prompt": [5000, 1, 2],
            "truncate_prompt_tokens": 2}))
        .expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("prompt[0]"));
        let e = completions(json!({"model": "m", "prompt": "a", "suffix": "b",
            "truncate_prompt_tokens": 2}))
        .expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("truncate_prompt_tokens"));
    }

    #[test]
    fn logit_bias_maps_token_ids_to_biases() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        let r = chat(json!({"model": "m", "messages": msgs,
            "logit_bias": {"7": -100, "999": 100, "0": 2.5}}))
        .expect("decodes");
        let mut pairs = r.params.logit_bias.to_vec();
        pairs.sort_by_key(|p| p.0);
        assert_eq!(pairs, [(0, 2.5), (7, -100.0), (999, 100.0)]);
        // Absent or null: off.
        for absent in [
            json!({"model": "m", "messages": msgs}),
            json!({"model": "m", "messages": msgs, "logit_bias": null}),
        ] {
            assert!(chat(absent).expect("decodes").params.logit_bias.is_empty());
        }
        // Every choice's sampling gets the same pairs.
        assert_eq!(r.params.sampling(1, 3, &[]).logit_bias, r.params.logit_bias);
        let too_many: Map<String, Value> = (0..=MAX_LOGIT_BIAS)
            .map(|i| (i.to_string(), json!(1)))
            .collect();
        let cases = [
            (json!([1, 2]), "logit_bias", "an object"),
            (json!({"x": 1}), "logit_bias.x", "token ids"),
            (json!({"-1": 1}), "logit_bias.-1", "token ids"),
            (json!({"+3": 1}), "logit_bias.+3", "token ids"),
            (json!({"": 1}), "logit_bias.", "token ids"),
            (
                json!({"4294967296": 1}),
                "logit_bias.4294967296",
                "past the vocabulary",
            ),
            (
                json!({"1000": 1}),
                "logit_bias.1000",
                "past the vocabulary (1000 ids)",
            ),
            (json!({"5": 100.5}), "logit_bias.5", "between -100 and 100"),
            (json!({"5": "1"}), "logit_bias.5", "a number, got a string"),
            (json!({"5": 1, "05": 2}), "logit_bias.05", "given twice"),
            (
                Value::Object(too_many),
                "logit_bias",
                "at most 1024 entries",
            ),
        ];
        for (bias, field, says) in cases {
            let e = chat(json!({"model": "m", "messages": msgs, "logit_bias": bias}))
                .expect_err("refused");
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)), "{bias}");
            assert!(e.message.contains(says), "{bias}: {}", e.message);
        }
    }
}
