//! What the two OpenAI dialects (`responses`, `chat`) share: the API's
//! error object, the error reply of an HTTP request, the reply for a
//! failure the shell met, and the status and code of a generation that
//! could not start, and the structured-output format both take.

use serde_json::{json, Map, Value};

use crate::constraint::{Constraint, Grammar};
use crate::engine::{TokenId, TokenLogprobs};
use crate::gen::StartError;
use crate::http::{describe, HttpFailure, HttpReply, RETRY_AFTER_S};
use crate::json::{FieldError, Fields};
use crate::text::TextCodec;
use crate::tools::{ToolChoice, ToolDef, ToolFormat, Tools};

/// The `error` object: `{type, code, message, param}`.
pub fn error_object(status: u16, code: &str, message: &str, param: Option<&str>) -> Value {
    json!({
        "type": if status >= 500 { "server_error" } else { "invalid_request_error" },
        "code": code,
        "message": message,
        "param": param,
    })
}

/// An HTTP error reply, `{"error": {...}}`, with `Retry-After` on a 429 or
/// 503.
pub fn error_reply(status: u16, code: &str, message: &str, param: Option<&str>) -> HttpReply {
    let body = json!({"error": error_object(status, code, message, param)}).to_string();
    HttpReply {
        retry_after: matches!(status, 429 | 503).then_some(RETRY_AFTER_S),
        ..HttpReply::new(status, body)
    }
}

/// The reply for a failure met before the Host saw the request.
pub fn failure(f: &HttpFailure) -> HttpReply {
    let (status, message, retry_after) = describe(f);
    let code = match f {
        HttpFailure::Unauthorized { .. } => "invalid_api_key",
        _ if status >= 500 => "server_error",
        _ => "invalid_request",
    };
    HttpReply {
        retry_after,
        ..error_reply(status, code, &message, None)
    }
}

/// Status, code and message of a generation that could not start;
/// `max_tokens` is the dialect's name for the length field.
pub fn start_error(e: &StartError, max_tokens: &str) -> (u16, &'static str, String) {
    let (status, code) = match e {
        StartError::ContextLength { .. }
        | StartError::PromptTooLong { .. }
        | StartError::NeverFits { .. } => (400, "context_length_exceeded"),
        StartError::QueueFull
        | StartError::ConnQueueFull { .. }
        | StartError::RateLimited { .. } => (429, "rate_limit_exceeded"),
        StartError::TokenOutOfVocab { .. } => (400, "invalid_request"),
        StartError::ContentFiltered { .. } => (400, "content_filter"),
        StartError::ShuttingDown | StartError::NotLoaded => (503, "server_error"),
    };
    (status, code, e.message(max_tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_start_error_has_its_status_and_code() {
        let cases = [
            (
                StartError::ContextLength {
                    prompt_tokens: 9,
                    max_tokens: 9,
                    context_len: 10,
                },
                400,
                "context_length_exceeded",
            ),
            (
                StartError::NeverFits {
                    needed_blocks: 9,
                    total_blocks: 8,
                },
                400,
                "context_length_exceeded",
            ),
            (StartError::QueueFull, 429, "rate_limit_exceeded"),
            (
                StartError::RateLimited { retry_after_ms: 5 },
                429,
                "rate_limit_exceeded",
            ),
            (
                StartError::TokenOutOfVocab {
                    token: 99,
                    vocab: 10,
                },
                400,
                "invalid_request",
            ),
            (StartError::ShuttingDown, 503, "server_error"),
            (StartError::NotLoaded, 503, "server_error"),
        ];
        for (e, status, code) in cases {
            let (s, c, message) = start_error(&e, "max_tokens");
            assert_eq!((s, c), (status, code), "{e:?}");
            assert!(!message.is_empty());
        }
        let (_, _, m) = start_error(
            &StartError::ContextLength {
                prompt_tokens: 9,
                max_tokens: 9,
                context_len: 10,
            },
            "max_output_tokens",
        );
        assert!(m.contains("max_output_tokens"), "the dialect's field: {m}");
    }

    #[test]
    fn shell_failures_get_the_apis_error_with_status_and_retry() {
        let reply = failure(&HttpFailure::Unauthorized { message: "no key" });
        assert_eq!((reply.status, reply.retry_after), (401, None));
        let v: Value = serde_json::from_str(&reply.body).expect("json");
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let reply = failure(&HttpFailure::Busy { retry_after: 3 });
        assert_eq!((reply.status, reply.retry_after), (503, Some(3)));
        let v: Value = serde_json::from_str(&reply.body).expect("json");
        assert_eq!(v["error"]["type"], "server_error");
        let reply = failure(&HttpFailure::BodyTooLarge { max: 10 });
        assert_eq!(reply.status, 413);
        let reply = error_reply(429, "rate_limit_exceeded", "slow down", None);
        assert_eq!(reply.retry_after, Some(RETRY_AFTER_S));
    }
}

/// Where a format's JSON Schema sits: Chat Completions nests it
/// (`response_format: {type, json_schema: {name, schema, strict}}`),
/// Responses flattens it (`text.format: {type, name, schema, strict}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatShape {
    /// `response_format.json_schema.schema`.
    Nested,
    /// `text.format.schema`.
    Flat,
}

/// The grammar an output format asks for: `None` for `text`, a
/// [`Grammar`] for `json_object` and `json_schema`. `prefix` names the
/// object in errors (`response_format.`, `text.format.`).
pub fn output_format(
    obj: &Map<String, Value>,
    prefix: &str,
    shape: FormatShape,
) -> Result<Option<Grammar>, FieldError> {
    let f = Fields::new(obj, prefix);
    let kind = f
        .str("type")?
        .ok_or_else(|| FieldError::new(format!("{prefix}type"), "is required"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Grammar::JsonObject)),
        "json_schema" => {
            let (holder, holder_prefix);
            let g = match shape {
                FormatShape::Flat => &f,
                FormatShape::Nested => {
                    let inner = f.obj("json_schema")?.ok_or_else(|| {
                        FieldError::new(
                            format!("{prefix}json_schema"),
                            "is required for `json_schema`",
                        )
                    })?;
                    holder_prefix = format!("{prefix}json_schema.");
                    holder = Fields::new(inner, &holder_prefix);
                    &holder
                }
            };
            let name = g
                .str("name")?
                .ok_or_else(|| FieldError::new(format!("{}name", g.prefix()), "is required"))?;
            let valid_name = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid_name {
                return Err(FieldError::new(
                    format!("{}name", g.prefix()),
                    "must be 1 to 64 letters, digits, underscores or dashes",
                ));
            }
            let schema = match g.raw("schema") {
                None => json!({}),
                Some(s @ Value::Object(_)) => s.clone(),
                Some(other) => {
                    return Err(FieldError::new(
                        format!("{}schema", g.prefix()),
                        format!("must be an object, got {}", crate::json::type_name(other)),
                    ))
                }
            };
            let strict = g.bool("strict")?.unwrap_or(false);
            Ok(Some(Grammar::JsonSchema { schema, strict }))
        }
        other => Err(FieldError::new(
            format!("{prefix}type"),
            format!("must be text, json_object or json_schema, got `{other}`"),
        )),
    }
}

/// `response_format` in `obj` (Chat Completions' shape, also taken as an
/// extension by `generate`'s `parameters` and `batch`'s
/// `generation_config`), compiled by the model's grammar engine: `None`
/// when absent or `text`. Errors are messages naming the field under
/// `prefix`.
pub fn compile_response_format(
    codec: &dyn TextCodec,
    obj: &Map<String, Value>,
    prefix: &str,
) -> Result<Option<Constraint>, String> {
    let field = format!("{prefix}response_format");
    let Some(rf) = Fields::new(obj, prefix)
        .obj("response_format")
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let grammar =
        output_format(rf, &format!("{field}."), FormatShape::Nested).map_err(|e| e.to_string())?;
    grammar
        .map(|g| codec.constrain(&g).map(Constraint::new))
        .transpose()
        .map_err(|e| format!("invalid `{field}`: {e}"))
}

/// Most functions one request may offer.
pub const MAX_TOOLS: usize = 128;

/// Whether `name` is a valid function name: 1 to 64 letters, digits,
/// underscores or dashes (the API's rule).
fn valid_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One function a request offers, read from `func`: its `name` (valid and
/// not among `offered`), `description`, and its arguments' JSON Schema
/// under `schema_field` (`parameters` here, Anthropic's `input_schema`;
/// absent, any object). Errors name the field as `func`'s prefix does.
pub(crate) fn function_def(
    func: &Fields<'_>,
    schema_field: &str,
    offered: &[ToolDef],
) -> Result<ToolDef, FieldError> {
    let fn_prefix = func.prefix();
    let name = func
        .str("name")?
        .ok_or_else(|| FieldError::new(format!("{fn_prefix}name"), "is required"))?;
    if !valid_function_name(name) {
        return Err(FieldError::new(
            format!("{fn_prefix}name"),
            "must be 1 to 64 letters, digits, underscores or dashes",
        ));
    }
    if offered.iter().any(|d| d.name == name) {
        return Err(FieldError::new(
            format!("{fn_prefix}name"),
            format!("`{name}` is offered twice"),
        ));
    }
    let parameters = match func.raw(schema_field) {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(other) => {
            return Err(FieldError::new(
                format!("{fn_prefix}{schema_field}"),
                format!(
                    "must be a JSON Schema object, got {}",
                    crate::json::type_name(other)
                ),
            ))
        }
    };
    Ok(ToolDef {
        name: name.to_string(),
        description: func.str("description")?.map(str::to_string),
        parameters,
    })
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a request body:
/// Chat Completions nests each function (`{"type": "function", "function":
/// {name, description, parameters}}`, [`FormatShape::Nested`]), Responses
/// flattens it (`{"type": "function", name, ...}`, [`FormatShape::Flat`]).
/// Other tool types (built-in tools) are refused with the field named.
pub fn tools(f: &Fields<'_>, shape: FormatShape) -> Result<Tools, FieldError> {
    let mut defs: Vec<ToolDef> = Vec::new();
    let items = f.array("tools")?.map(Vec::as_slice).unwrap_or(&[]);
    if items.len() > MAX_TOOLS {
        return Err(FieldError::new(
            "tools",
            format!("at most {MAX_TOOLS} tools, got {}", items.len()),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(obj) = item else {
            return Err(FieldError::new(at, "must be an object"));
        };
        let prefix = format!("{at}.");
        let t = Fields::new(obj, &prefix);
        let kind = t.str("type")?.unwrap_or("function");
        if kind != "function" {
            return Err(FieldError::new(
                format!("{at}.type"),
                format!("only `function` tools are supported, got `{kind}`"),
            ));
        }
        let (fn_obj, fn_prefix) = match shape {
            FormatShape::Flat => (obj, prefix.clone()),
            FormatShape::Nested => match t.obj("function")? {
                Some(o) => (o, format!("{at}.function.")),
                None => return Err(FieldError::new(format!("{at}.function"), "is required")),
            },
        };
        let func = Fields::new(fn_obj, &fn_prefix);
        defs.push(function_def(&func, "parameters", &defs)?);
    }
    let choice = match f.raw("tool_choice") {
        None | Some(Value::Null) => {
            if defs.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(FieldError::new(
                    "tool_choice",
                    format!("must be none, auto, required or a function, got `{other}`"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let c = Fields::new(o, "tool_choice.");
            let kind = c.str("type")?.unwrap_or("function");
            if kind != "function" {
                return Err(FieldError::new(
                    "tool_choice.type",
                    format!("only `function` is supported, got `{kind}`"),
                ));
            }
            let name = match shape {
                FormatShape::Flat => c.str("name")?,
                FormatShape::Nested => match c.obj("function")? {
                    Some(inner) => Fields::new(inner, "tool_choice.function.").str("name")?,
                    None => None,
                },
            };
            let field = match shape {
                FormatShape::Flat => "tool_choice.name",
                FormatShape::Nested => "tool_choice.function.name",
            };
            let name = name.ok_or_else(|| FieldError::new(field, "is required"))?;
            if !defs.iter().any(|d| d.name == name) {
                return Err(FieldError::new(
                    field,
                    format!("`{name}` is not one of the `tools`"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(other) => {
            return Err(FieldError::new(
                "tool_choice",
                format!(
                    "must be a string or an object, got {}",
                    crate::json::type_name(other)
                ),
            ))
        }
    };
    if matches!(choice, ToolChoice::Required) && defs.is_empty() {
        return Err(FieldError::new(
            "tool_choice",
            "`required` needs at least one of `tools`",
        ));
    }
    Ok(Tools {
        defs,
        choice,
        parallel: f.bool("parallel_tool_calls")?.unwrap_or(true),
    })
}

/// The constraint a request's output follows, compiled by the model's
/// codec: its format's grammar (`format_field` names the field, as the
/// route spells it), or the grammar that forces its tool calls (`tools`);
/// never both, which the codecs refuse. An error is the field to blame and
/// the message.
pub fn output_constraint(
    codec: &dyn TextCodec,
    format: Option<&Grammar>,
    format_field: &'static str,
    tools: &Tools,
    tool_format: ToolFormat,
) -> Result<Option<Constraint>, (&'static str, String)> {
    let (grammar, field) = match (
        format,
        crate::tools::forcing_grammar(tools, tool_format, codec),
    ) {
        (Some(g), _) => (g.clone(), format_field),
        (None, Some(g)) => (g, "tools"),
        (None, None) => return Ok(None),
    };
    codec
        .constrain(&grammar)
        .map(|c| Some(Constraint::new(c)))
        .map_err(|e| (field, format!("`{field}` cannot be used: {e}")))
}

/// The text token `t` adds after `last` (its leading space included, which
/// a SentencePiece decoder drops from a token decoded alone): what a token
/// shows in a logprobs list.
pub fn surface(codec: &dyn TextCodec, last: Option<TokenId>, t: TokenId) -> String {
    if let Some(p) = last {
        let before = codec.decode(&[p]);
        if let Some(added) = codec.decode(&[p, t]).strip_prefix(before.as_str()) {
            return added.to_string();
        }
    }
    codec.decode(&[t])
}

/// One token's log-probability entry as Chat Completions' `logprobs.content`
/// and the Responses API's `output_text.logprobs` write it: `token`,
/// `logprob`, `bytes`, and `top_logprobs` (the same without their own).
pub fn token_logprob(
    codec: &dyn TextCodec,
    last: Option<TokenId>,
    token: TokenId,
    lp: &TokenLogprobs,
) -> Value {
    let entry = |t: TokenId, logprob: f32| {
        let s = surface(codec, last, t);
        json!({"token": s, "logprob": logprob, "bytes": s.as_bytes()})
    };
    let mut e = entry(token, lp.logprob);
    e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
    e
}
