//! `chat_token_limits`: vLLM's `allowed_token_ids` and `bad_words` hold in
//! every choice a client reads. Under the byte tokenizer the simulator
//! serves, a token is a byte (`id = byte + 3`), so a choice's text may hold
//! only the bytes of the allowed ids, and never a bad word (its leading
//! whitespace dropped, as the server tokenizes it): the server bans a bad
//! word's last token wherever the tokens before it were generated, and
//! the simulated engine writes within the mask it is given. Streams are
//! judged on each choice's chunks joined, ended well or not; answers that
//! echo their prompt (Completions' `echo`) are not judged, the prompt not
//! being under the limits.

use std::collections::BTreeMap;

use serde_json::Value;
use tokenwire_core::text::byte::BYTE_OFFSET;

use super::answers::{JudgeAnswer, Outcome, Request};
use crate::invariants::{Check, Cx};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ChatTokenLimits;

/// The text of choice `c` (a reply's or a chunk's, either route).
fn text_of(c: &Value) -> &str {
    c["text"]
        .as_str()
        .or_else(|| c["message"]["content"].as_str())
        .or_else(|| c["delta"]["content"].as_str())
        .unwrap_or("")
}

/// Each choice's text, by index.
fn texts(outcome: &Outcome) -> BTreeMap<usize, String> {
    let choices: Vec<&Value> = match outcome {
        Outcome::Reply(v) => v["choices"].as_array().into_iter().flatten().collect(),
        Outcome::Stream(chunks, _) => chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().into_iter().flatten())
            .collect(),
        Outcome::Error(..) => Vec::new(),
    };
    let mut out: BTreeMap<usize, String> = BTreeMap::new();
    for c in choices {
        let i = c["index"].as_u64().unwrap_or(0) as usize;
        out.entry(i).or_default().push_str(text_of(c));
    }
    out
}

fn judge(r: &Request, outcome: &Outcome) -> Check {
    let allowed: Option<Vec<u8>> = r.body["allowed_token_ids"].as_array().map(|ids| {
        ids.iter()
            .filter_map(Value::as_u64)
            .filter_map(|id| u8::try_from(id.checked_sub(u64::from(BYTE_OFFSET))?).ok())
            .collect()
    });
    let bad: Vec<&str> = r.body["bad_words"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::trim_start)
        .filter(|w| !w.is_empty())
        .collect();
    for (i, text) in texts(outcome) {
        if let Some(allowed) = &allowed {
            if let Some(b) = text.bytes().find(|b| !allowed.contains(b)) {
                return Err(format!(
                    "choice {i} wrote byte {b:#04x}, which allowed_token_ids does not list: {text:?}"
                ));
            }
        }
        if let Some(w) = bad.iter().find(|w| text.contains(*w)) {
            return Err(format!("choice {i} wrote the bad word {w:?}: {text:?}"));
        }
    }
    Ok(())
}

impl JudgeAnswer for ChatTokenLimits {
    fn name(&self) -> &'static str {
        "chat_token_limits"
    }

    fn judges(&self, _cx: &Cx<'_>, r: &Request) -> bool {
        matches!(r.route.as_str(), "chat" | "completions")
            && r.body["echo"] != true
            && (r.body["allowed_token_ids"].is_array() || r.body["bad_words"].is_array())
    }

    fn judge(&self, _cx: &Cx<'_>, r: &Request, outcome: &Outcome) -> Check {
        judge(r, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn texts_within_the_limits_pass_and_a_token_outside_them_is_caught() {
        // `a` is byte 0x61, id 100; `b` id 101.
        let r = Request {
            route: "completions".into(),
            body: json!({"prompt": "<c1>", "allowed_token_ids": [100, 101, 2],
                         "bad_words": [" ab"]}),
        };
        let reply = |t: &str| Outcome::Reply(json!({"choices": [{"index": 0, "text": t}]}));
        judge(&r, &reply("bbaa")).expect("within the limits");
        // Fabricated violation: a byte the list does not allow.
        let e = judge(&r, &reply("bac")).expect_err("c is not allowed");
        assert!(e.contains("0x63"), "{e}");
        // Fabricated violation: the bad word, in a stream's chunks.
        let chat = Request {
            route: "chat".into(),
            body: json!({"messages": [], "bad_words": ["ab"]}),
        };
        let chunks = vec![
            json!({"choices": [{"index": 0, "delta": {"content": "xa"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "by"}}]}),
        ];
        let e = judge(&chat, &Outcome::Stream(chunks, None)).expect_err("the bad word");
        assert!(e.contains("\"ab\""), "{e}");
    }
}
