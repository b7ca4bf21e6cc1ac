//! vLLM's `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`,
//! served beside the OpenAI routes: the token ids a prompt (as Completions
//! tokenizes it, or without the special tokens) or a conversation (as Chat
//! Completions renders it) becomes, which are the ids `logit_bias` takes
//! and the ids a client scoring prompts sends; the text of token ids; and
//! the tokenizer's special tokens. lm-evaluation-harness finds the last
//! two and then tokenizes through the server (its remote tokenizer).

use serde_json::{json, Map, Value};

use super::codec::{self, BadRequest};
use crate::dialect::openai::{self, FormatShape};
use crate::engine::{ModelInfo, TokenId};
use crate::json::Fields;
use crate::text::{ChatMessage, TemplateKwargs, TextCodec};
use crate::tools::ToolDef;

/// What a `/tokenize` body asks to tokenize.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ToTokenize {
    /// `prompt`: a raw prompt, with the BOS the tokenizer adds unless
    /// `add_special_tokens` is false.
    Prompt(String, bool),
    /// `messages`: rendered with the chat template and its generation
    /// prompt, with `tools` offered and `chat_template_kwargs` given as
    /// Chat Completions does.
    Messages(Vec<ChatMessage>, Vec<ToolDef>, TemplateKwargs),
}

/// Decodes a `/tokenize` body: exactly one of `prompt` and `messages`.
pub(super) fn decode_tokenize(obj: &Map<String, Value>) -> Result<ToTokenize, BadRequest> {
    let f = Fields::new(obj, "");
    match (f.has("prompt"), f.has("messages")) {
        (true, false) => {
            let add_special = f
                .bool("add_special_tokens")
                .map_err(BadRequest::invalid)?
                .unwrap_or(true);
            codec::prompt(&f).map(|p| ToTokenize::Prompt(p, add_special))
        }
        (false, true) => {
            let tools = openai::tools(&f, FormatShape::Nested).map_err(BadRequest::invalid)?;
            let messages = codec::continued(&f, codec::messages(&f)?)?;
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

/// The `/tokenizer_info` reply, vLLM's shape where it applies: the
/// special tokens' text (`bos_token` when the tokenizer adds one, the first
/// end-of-sequence token as `eos_token`, each `null` without), no padding
/// token, the context as `model_max_length`, and the model's
/// `chat_template` source (`null` without one), which lm-evaluation-harness
/// renders itself under `--apply_chat_template`.
pub(super) fn tokenizer_info(codec: &dyn TextCodec, model: &ModelInfo) -> Value {
    let plain = codec.encode("a", false).unwrap_or_default();
    let special = codec.encode("a", true).unwrap_or_default();
    // The tokenizer adds a BOS when its special encoding is one longer and
    // ends with the plain one.
    let bos = (special.len() == plain.len() + 1 && special.ends_with(&plain))
        .then(|| special.first().map(|&t| codec.token_text(t)))
        .flatten();
    let eos = model.eos_ids.first().map(|&t| codec.token_text(t));
    json!({
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": null,
        "add_bos_token": bos.is_some(),
        "model_max_length": model.context_len,
        "chat_template": codec.chat_template(),
    })
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
        let p = decode_tokenize(&body(json!({"prompt": "Once"})));
        assert_eq!(p, Ok(ToTokenize::Prompt("Once".into(), true)));
        let plain = decode_tokenize(&body(
            json!({"prompt": "Once", "add_special_tokens": false}),
        ));
        assert_eq!(plain, Ok(ToTokenize::Prompt("Once".into(), false)));
        let m = decode_tokenize(&body(
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ))
        .expect("messages");
        assert!(
            matches!(m, ToTokenize::Messages(ref v, ref t, ref k) if v.len() == 1 && t.is_empty() && k.is_empty())
        );
        let with_kwargs = decode_tokenize(&body(
            json!({"messages": [{"role": "user", "content": "hi"}],
                         "chat_template_kwargs": {"enable_thinking": false}}),
        ))
        .expect("messages with kwargs");
        assert!(
            matches!(with_kwargs, ToTokenize::Messages(_, _, ref k) if k["enable_thinking"] == json!(false))
        );
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let with_tools = decode_tokenize(&body(
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}),
        ))
        .expect("messages with tools");
        assert!(matches!(with_tools, ToTokenize::Messages(_, ref t, _) if t.len() == 1));
        for (b, field) in [
            (json!({}), "prompt"),
            (json!({"prompt": "a", "messages": []}), "messages"),
            (json!({"prompt": 5}), "prompt"),
            (
                json!({"prompt": "a", "add_special_tokens": 1}),
                "add_special_tokens",
            ),
        ] {
            let e = decode_tokenize(&body(b.clone())).expect_err("refused");
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)), "{b}");
        }
    }

    #[test]
    fn tokenizer_info_names_the_bos_the_tokenizer_adds_and_the_eos() {
        let codec = crate::text::byte::ByteCodec;
        let mut model = crate::testing::tiny_model_info();
        let info = tokenizer_info(&codec, &model);
        let bos = codec.token_text(crate::text::byte::BYTE_BOS);
        let eos = codec.token_text(crate::text::byte::BYTE_EOS);
        assert_eq!(info["bos_token"], json!(bos));
        assert_eq!(info["eos_token"], json!(eos));
        assert_eq!(info["add_bos_token"], true);
        assert_eq!(info["model_max_length"], model.context_len);
        assert_eq!(
            info["chat_template"],
            Value::Null,
            "the byte codec has none"
        );
        model.eos_ids.clear();
        assert_eq!(tokenizer_info(&codec, &model)["eos_token"], Value::Null);
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
