//! `chat_scores`: a Completions request with `echo` gets each prompt back at
//! the start of its choices' text, and with `logprobs` its prompt's scores
//! first: `null` for the first token, then for each later token exactly the
//! score the engine gives it after the tokens before it
//! ([`prompt_score`]: the simulated engine's function of the prefix), so a
//! score moved by one position, taken from another prompt, or from a cached
//! prefix the engine never scored is caught. With `max_tokens: 0` a choice
//! is its prompt alone: its text, its scores, finish reason `length` and no
//! completion tokens. Streams are judged on each choice's chunks joined.

use std::collections::BTreeMap;

use super::answers::{JudgeAnswer, Outcome, Prompt, Request};
use crate::engine::prompt_score;
use crate::invariants::{Check, Cx};
use serde_json::Value;

/// See the module docs.
#[derive(Debug, Default)]
pub struct ChatScores;

/// One choice as the client reads it: its text, its logprobs' values (when
/// it has logprobs) and its finish reason.
#[derive(Debug, Default)]
struct Choice {
    text: String,
    logprobs: Option<Vec<Value>>,
    finish: Value,
}

impl Choice {
    /// Adds one choice object (a reply's, or a chunk's).
    fn add(&mut self, c: &Value) {
        self.text.push_str(c["text"].as_str().unwrap_or(""));
        if let Some(values) = c["logprobs"]["token_logprobs"].as_array() {
            self.logprobs
                .get_or_insert_with(Vec::new)
                .extend(values.iter().cloned());
        }
        if !c["finish_reason"].is_null() {
            self.finish = c["finish_reason"].clone();
        }
    }
}

/// What choice `i` (of prompt `p`) must echo.
fn judge_choice(r: &Request, i: usize, p: &Prompt, c: &Choice, usage: Option<&Value>) -> Check {
    let text = p.text();
    if !c.text.starts_with(&text) {
        return Err(format!("choice {i} does not start with its prompt's text"));
    }
    let ids = p.ids();
    if let (Some(values), Some(k)) = (&c.logprobs, r.body["logprobs"].as_u64()) {
        if values.len() < ids.len() || !values.first().is_some_and(Value::is_null) {
            return Err(format!(
                "choice {i} has {} logprobs (its prompt holds {} tokens) or a first that is not null",
                values.len(),
                ids.len()
            ));
        }
        for pos in 1..ids.len() {
            let want = f64::from(prompt_score(&ids[..pos], ids[pos], k as u8).logprob);
            if values[pos].as_f64() != Some(want) {
                return Err(format!(
                    "choice {i}'s prompt token at {pos} scored {}, the engine gives {want}",
                    values[pos]
                ));
            }
        }
    }
    if r.max_tokens() == Some(0) {
        let generated = c
            .logprobs
            .as_ref()
            .map_or(0, |v| v.len().saturating_sub(ids.len()));
        if c.text != text || c.finish != "length" || generated != 0 {
            return Err(format!(
                "choice {i} with max_tokens 0 wrote more than its prompt, or finished {}",
                c.finish
            ));
        }
        if let Some(u) = usage.filter(|u| u["completion_tokens"] != 0) {
            return Err(format!("max_tokens 0 used {u}"));
        }
    }
    Ok(())
}

fn judge(r: &Request, outcome: &Outcome) -> Check {
    let Some(prompts) = r.prompts() else {
        return Ok(());
    };
    let mut choices: BTreeMap<usize, Choice> = BTreeMap::new();
    let usage = match outcome {
        Outcome::Reply(v) => {
            for c in v["choices"].as_array().into_iter().flatten() {
                let i = c["index"].as_u64().unwrap_or(0) as usize;
                choices.entry(i).or_default().add(c);
            }
            Some(&v["usage"])
        }
        // Only a stream that ended well holds whole choices.
        Outcome::Stream(chunks, None) => {
            for c in chunks
                .iter()
                .flat_map(|c| c["choices"].as_array().into_iter().flatten())
            {
                let i = c["index"].as_u64().unwrap_or(0) as usize;
                choices.entry(i).or_default().add(c);
            }
            chunks.last().map(|c| &c["usage"]).filter(|u| !u.is_null())
        }
        _ => return Ok(()),
    };
    let n = r.n().max(1) as usize;
    for (&i, c) in &choices {
        if let Some(p) = prompts.get(i / n) {
            judge_choice(r, i, p, c, usage)?;
        }
    }
    Ok(())
}

impl JudgeAnswer for ChatScores {
    fn name(&self) -> &'static str {
        "chat_scores"
    }

    fn judges(&self, _cx: &Cx<'_>, r: &Request) -> bool {
        r.route == "completions" && r.body["echo"] == true
    }

    fn judge(&self, _cx: &Cx<'_>, r: &Request, outcome: &Outcome) -> Check {
        judge(r, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scored_reply(r: &Request, shift: usize) -> Value {
        let p = &r.prompts().expect("prompts")[0];
        let ids = p.ids();
        let mut values = vec![Value::Null];
        for pos in 1..ids.len() {
            let at = (pos + shift).min(ids.len() - 1);
            values.push(json!(prompt_score(&ids[..at], ids[at], 1).logprob));
        }
        json!({"choices": [{"index": 0, "text": p.text(), "finish_reason": "length",
                            "logprobs": {"token_logprobs": values}}],
               "usage": {"completion_tokens": 0}})
    }

    #[test]
    fn the_engines_scores_pass_and_a_shifted_score_is_caught() {
        let r = Request {
            route: "completions".into(),
            body: json!({"prompt": "<c1>abc", "echo": true, "logprobs": 1, "max_tokens": 0}),
        };
        judge(&r, &Outcome::Reply(scored_reply(&r, 0))).expect("the engine's scores");
        // Fabricated violation: each score one position late.
        let e = judge(&r, &Outcome::Reply(scored_reply(&r, 1))).expect_err("shifted");
        assert!(e.contains("prompt token at 1"), "{e}");
        // Fabricated violation: a generated token under max_tokens 0.
        let mut more = scored_reply(&r, 0);
        more["choices"][0]["text"] = json!("<c1>abcd");
        let e = judge(&r, &Outcome::Reply(more)).expect_err("wrote more");
        assert!(e.contains("max_tokens 0"), "{e}");
        // Fabricated violation: the echo is not the prompt.
        let mut other = scored_reply(&r, 0);
        other["choices"][0]["text"] = json!("<c2>abc");
        let e = judge(&r, &Outcome::Reply(other)).expect_err("not echoed");
        assert!(e.contains("does not start"), "{e}");
    }
}
