//! vLLM's `POST /tokenize` and `POST /detokenize`, served beside the OpenAI
//! routes: the token ids a prompt (as Completions tokenizes it) or a
//! conversation (as Chat Completions renders it) becomes, which are the ids
//! `logit_bias` takes, and the text of token ids.

use serde_json::{json, Map, Value};

use super::codec::{self, BadRequest};
use crate::dialect::openai::{self, FormatShape};
use crate::engine::TokenId;
use crate::json::Fields;
use crate::text::{ChatMessage, TemplateKwargs};
use crate::tools::{ToolDef, ToolFormat};

/// What a `/tokenize` body asks to tokenize.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ToTokenize {
    /// `prompt`: a raw prompt, with the BOS the tokenizer adds.
    Prompt(String),
    /// `messages`: rendered with the chat template and its generation
    /// prompt, with `tools` offered and `chat_template_kwargs` given as
    /// Chat Completions does.
    Messages(Vec<ChatMessage>, Vec<ToolDef>, TemplateKwargs),
}

/// Decodes a `/tokenize` body: exactly one of `prompt` and `messages`.
pub(super) fn decode_tokenize(
    obj: &Map<String, Value>,
    format: ToolFormat,
) -> Result<ToTokenize, BadRequest> {
    let f = Fields::new(obj, "");
    match (f.has("prompt"), f.has("messages")) {
        (true, false) => codec::prompt(&f).map(ToTokenize::Prompt),
        (false, true) => {
            let tools = openai::tools(&f, FormatShape::Nested).map_err(BadRequest::invalid)?;
            let messages = codec::messages(&f, format)?;
            let kwargs = codec::template_kwargs(&f)?;
            Ok(ToTokenize::Messages(
                messages,
                tools.prompt_defs().to_vec(),
                kwargs,
            ))
        }
        (has_prompt, _) => Err(BadRequest::field(
            if has_prompt { "messages" } else { "prompt" },
            "give either `prompt` or `messages`",
        )),
    }
}

/// Decodes a `/detokenize` body: `tokens`, an array of at most `max_len`
/// token ids, each below `vocab_size`.
pub(super) fn decode_detokenize(
    obj: &Map<String, Value>,
    vocab_size: u32,
    max_len: u32,
) -> Result<Vec<TokenId>, BadRequest> {
    let f = Fields::new(obj, "");
    let Some(items) = f.array("tokens").map_err(BadRequest::invalid)? else {
        return Err(BadRequest::field("tokens", "`tokens` is required"));
    };
    if items.len() > max_len as usize {
        return Err(BadRequest::field(
            "tokens",
            format!(
                "at most the context length ({max_len}) tokens, got {}",
                items.len()
            ),
        ));
    }
    codec::token_ids("tokens", items, vocab_size)
}

/// The `/tokenize` reply, vLLM's shape.
pub(super) fn tokenize_reply(ids: &[TokenId], context_len: u32) -> Value {
    json!({"count": ids.len(), "max_model_len": context_len, "tokens": ids})
}

/// The `/detokenize` reply, vLLM's shape.
pub(super) fn detokenize_reply(text: &str) -> Value {
    json!({ "prompt": text })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::chat::codec::body;

    #[test]
    fn tokenize_takes_a_prompt_or_messages_not_both() {
        let p = decode_tokenize(&body(json!({"prompt": "Once"})), ToolFormat::Hermes);
        assert_eq!(p, Ok(ToTokenize::Prompt("Once".into())));
        let m = decode_tokenize(
            &body(json!({"messages": [{"role": "user", "content": "hi"}]})),
            ToolFormat::Hermes,
        )
        .expect("messages");
        assert!(
            matches!(m, ToTokenize::Messages(ref v, ref t, ref k) if v.len() == 1 && t.is_empty() && k.is_empty())
        );
        let with_kwargs = decode_tokenize(
            &body(json!({"messages": [{"role": "user", "content": "hi"}],
                         "chat_template_kwargs": {"enable_thinking": false}})),
            ToolFormat::Hermes,
        )
        .expect("messages with kwargs");
        assert!(
            matches!(with_kwargs, ToTokenize::Messages(_, _, ref k) if k["enable_thinking"] == json!(false))
        );
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let with_tools = decode_tokenize(
            &body(json!({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]})),
            ToolFormat::Hermes,
        )
        .expect("messages with tools");
        assert!(matches!(with_tools, ToTokenize::Messages(_, ref t, _) if t.len() == 1));
        for (b, field) in [
            (json!({}), "prompt"),
            (json!({"prompt": "a", "messages": []}), "messages"),
            (json!({"prompt": 5}), "prompt"),
        ] {
            let e = decode_tokenize(&body(b.clone()), ToolFormat::Hermes).expect_err("refused");
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)), "{b}");
        }
    }

    #[test]
    fn detokenize_takes_ids_in_the_vocabulary_up_to_the_context() {
        let ok = decode_detokenize(&body(json!({"tokens": [0, 5, 9]})), 10, 4);
        assert_eq!(ok, Ok(vec![0, 5, 9]));
        for (b, field) in [
            (json!({}), "tokens"),
            (json!({"tokens": "1 2"}), "tokens"),
            (json!({"tokens": [1, 10]}), "tokens[1]"),
            (json!({"tokens": [-1]}), "tokens[0]"),
            (json!({"tokens": [1.5]}), "tokens[0]"),
            (json!({"tokens": [1, 1, 1, 1, 1]}), "tokens"),
        ] {
            let e = decode_detokenize(&body(b.clone()), 10, 4).expect_err("refused");
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)), "{b}");
        }
    }
}
