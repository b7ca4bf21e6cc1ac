//! `chat_tokenize`: vLLM's tokenizer routes answer as the tokenizer reads.
//! `POST /tokenize` gives the prompt's ids (BOS first unless
//! `add_special_tokens` is false), their count and the context length;
//! `POST /detokenize` gives the ids' text; `GET /tokenizer_info` names the
//! BOS the tokenizer adds. Errors are OpenAI's error object.

use serde_json::{json, Value};
use tokenwire_core::text::byte::ByteCodec;
use tokenwire_core::{TextCodec, TokenId};

use super::answers::{JudgeAnswer, Outcome, Request};
use super::refusals::bad_fields;
use super::replies::judge_refusal;
use crate::invariants::{clip, Check, Cx};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ChatTokenize;

fn judge(cx: &Cx<'_>, r: &Request, v: &Value) -> Check {
    match r.route.as_str() {
        "tokenize" => {
            let text = r.body["prompt"].as_str().unwrap_or("");
            let special = r.body["add_special_tokens"] != false;
            let ids = ByteCodec.encode(text, special).unwrap_or_default();
            let want =
                json!({"count": ids.len(), "max_model_len": cx.model.context_len, "tokens": ids});
            if v != &want {
                return Err(format!("answered {} (want {want})", clip(&v.to_string())));
            }
        }
        "detokenize" => {
            let ids: Vec<TokenId> = r.body["tokens"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_u64().and_then(|t| TokenId::try_from(t).ok()))
                .collect();
            let want = ByteCodec.decode(&ids);
            if v["prompt"] != want.as_str() {
                return Err(format!("answered {} (want {want:?})", clip(&v.to_string())));
            }
        }
        "tokenizer_info" if v["add_bos_token"] != true => {
            return Err(format!(
                "answered {} (the tokenizer adds a BOS)",
                clip(&v.to_string())
            ));
        }
        _ => {}
    }
    Ok(())
}

impl JudgeAnswer for ChatTokenize {
    fn name(&self) -> &'static str {
        "chat_tokenize"
    }

    fn judges(&self, cx: &Cx<'_>, r: &Request) -> bool {
        let routes = ["tokenize", "detokenize", "tokenizer_info"];
        routes.contains(&r.route.as_str()) && bad_fields(r, cx.model).is_empty()
    }

    fn judge(&self, cx: &Cx<'_>, r: &Request, outcome: &Outcome) -> Check {
        match outcome {
            Outcome::Reply(v) => judge(cx, r, v),
            Outcome::Error(status, body) => judge_refusal(*status, body),
            Outcome::Stream(..) => Err("a tokenizer route streamed".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::chat::answers::OnAnswers;
    use crate::invariants::testkit::kit;
    use tokenwire_core::{ConnId, Dialect, Input};

    #[test]
    fn the_tokenizers_ids_pass_and_a_missing_bos_is_caught() {
        for (tokens, ok) in [(json!([1, 66, 67]), true), (json!([66, 67]), false)] {
            let mut k = kit(OnAnswers::checker(ChatTokenize));
            k.open_http(1, Dialect::Chat);
            k.input(Input::Text {
                conn: ConnId(1),
                text: json!({"route": "tokenize", "body": {"prompt": "?@"}}).to_string(),
            })
            .expect("request");
            let count = tokens.as_array().map_or(0, Vec::len);
            let r = k.send(
                1,
                json!({"kind": "reply", "data": {"count": count, "max_model_len": 512, "tokens": tokens}}),
            );
            assert_eq!(r.is_ok(), ok, "{r:?}");
        }
    }
}
