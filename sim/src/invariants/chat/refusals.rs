//! `chat_refusals`: a request with a field the API does not allow is
//! refused, never answered: a `400` (a `404` for a model this server does
//! not serve) whose error's `param` names the field (or one of them, when
//! several are wrong), or, on Embeddings with the route off, that error.
//! The fields are judged here, by the API's rules, not by what the client
//! meant: on every generating route a `model` that is the served one,
//! `temperature` from 0 to 2, `top_p` above 0 up to 1, `n` from 1 to 8,
//! `max_tokens` (`max_completion_tokens` when given, and `max_tokens` a
//! whole number even then) from 1 to the context length (0 with
//! Completions' `echo`), a boolean `stream`, a non-negative integer `seed`, `stop` a
//! non-empty string or up to 8 of them; Chat's non-empty `messages`;
//! Completions' `prompt` (text, ids, or a non-empty list of them),
//! `logprobs` from 0 to 5 and a boolean `echo`; Embeddings' `input`,
//! `encoding_format` and `dimensions` up to the model's size; `/tokenize`'s
//! text `prompt` (or an array holding one) and boolean
//! `add_special_tokens`; `/detokenize`'s ids.

use serde_json::Value;
use tokenwire_core::ModelInfo;

use super::answers::{JudgeAnswer, Outcome, Request};
use crate::invariants::{clip, Check, Cx};

/// See the module docs.
#[derive(Debug, Default)]
pub struct ChatRefusals;

fn is_bool(v: &Value) -> bool {
    v.is_null() || v.is_boolean()
}

fn is_count(v: &Value) -> bool {
    v.is_null() || v.is_u64()
}

fn number_in(v: &Value, lo: f64, hi: f64, lo_open: bool) -> bool {
    v.is_null()
        || v.as_f64()
            .is_some_and(|x| x <= hi && if lo_open { x > lo } else { x >= lo })
}

/// A Completions prompt or an Embeddings input: text, ids, or a non-empty
/// list of them (each text or non-empty ids).
fn is_prompt(v: &Value) -> bool {
    let ids = |a: &[Value]| a.iter().all(Value::is_u64);
    match v {
        Value::String(_) => true,
        Value::Array(a) if a.is_empty() => false,
        Value::Array(a) if a[0].is_number() => ids(a),
        Value::Array(a) => a.iter().all(|x| match x {
            Value::String(_) => true,
            Value::Array(i) => !i.is_empty() && ids(i),
            _ => false,
        }),
        _ => false,
    }
}

/// The fields of `r` the API does not allow (see the module docs).
pub fn bad_fields(r: &Request, model: &ModelInfo) -> Vec<&'static str> {
    let b = &r.body;
    let mut bad = Vec::new();
    let mut check = |field: &'static str, ok: bool| {
        if !ok {
            bad.push(field);
        }
    };
    let generates = matches!(r.route.as_str(), "chat" | "completions");
    if generates || r.route == "embeddings" {
        check("model", b["model"].as_str() == Some(model.name.as_str()));
    }
    if generates {
        let context = u64::from(model.context_len);
        let least = u64::from(!(r.route == "completions" && b["echo"] == true));
        let effective = if b["max_completion_tokens"].is_null() {
            ("max_tokens", &b["max_tokens"])
        } else {
            ("max_completion_tokens", &b["max_completion_tokens"])
        };
        check(
            effective.0,
            effective.1.is_null()
                || effective
                    .1
                    .as_u64()
                    .is_some_and(|m| (least..=context).contains(&m)),
        );
        check("temperature", number_in(&b["temperature"], 0.0, 2.0, false));
        check("top_p", number_in(&b["top_p"], 0.0, 1.0, true));
        check(
            "n",
            b["n"].is_null() || b["n"].as_u64().is_some_and(|n| (1..=8).contains(&n)),
        );
        check("max_tokens", is_count(&b["max_tokens"]));
        check("stream", is_bool(&b["stream"]));
        check("seed", b["seed"].is_null() || b["seed"].is_u64());
        let stop_ok = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
        check(
            "stop",
            match &b["stop"] {
                Value::Null => true,
                Value::Array(a) => a.len() <= 8 && a.iter().all(stop_ok),
                one => stop_ok(one),
            },
        );
    }
    match r.route.as_str() {
        "chat" => {
            check(
                "messages",
                b["messages"].as_array().is_some_and(|m| !m.is_empty()),
            );
        }
        "completions" => {
            check("prompt", is_prompt(&b["prompt"]));
            check(
                "logprobs",
                b["logprobs"].is_null() || b["logprobs"].as_u64().is_some_and(|k| k <= 5),
            );
            check("echo", is_bool(&b["echo"]));
        }
        "embeddings" => {
            check("input", is_prompt(&b["input"]));
            check(
                "encoding_format",
                b["encoding_format"].is_null()
                    || matches!(b["encoding_format"].as_str(), Some("float" | "base64")),
            );
            let size = u64::from(model.embedding_size);
            check(
                "dimensions",
                b["dimensions"].is_null()
                    || b["dimensions"]
                        .as_u64()
                        .is_some_and(|d| (1..=size).contains(&d)),
            );
        }
        "tokenize" if b["messages"].is_null() => {
            // One string, or an array holding one.
            let one = |a: &Vec<Value>| a.len() == 1 && a[0].is_string();
            check(
                "prompt",
                b["prompt"].is_string() || b["prompt"].as_array().is_some_and(one),
            );
            check("add_special_tokens", is_bool(&b["add_special_tokens"]));
        }
        "detokenize" => {
            let vocab = u64::from(model.vocab_size);
            check(
                "tokens",
                b["tokens"]
                    .as_array()
                    .is_some_and(|t| t.iter().all(|x| x.as_u64().is_some_and(|x| x < vocab))),
            );
        }
        _ => {}
    }
    bad
}

/// What `outcome` must be for a request whose `bad` fields the API refuses
/// (`off`: an Embeddings request with the route off, refused for that).
fn judge(bad: &[&str], off: bool, outcome: &Outcome) -> Check {
    let Outcome::Error(status, body) = outcome else {
        return Err(format!("answered, though {bad:?} are not allowed"));
    };
    let param = &body["error"]["param"];
    // `messages[0].role` names `messages`; `n` does not name `name`.
    let names = |p: &str, f: &str| {
        p.strip_prefix(f)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['[', '.']))
    };
    let named = match param.as_str() {
        Some(p) => bad.iter().any(|f| names(p, f)),
        None => off,
    };
    if !named || !matches!(status, 400 | 404) {
        return Err(format!(
            "refused {bad:?} with {status} {}",
            clip(&body.to_string())
        ));
    }
    Ok(())
}

impl JudgeAnswer for ChatRefusals {
    fn name(&self) -> &'static str {
        "chat_refusals"
    }

    fn judges(&self, cx: &Cx<'_>, r: &Request) -> bool {
        !bad_fields(r, cx.model).is_empty()
    }

    fn judge(&self, cx: &Cx<'_>, r: &Request, outcome: &Outcome) -> Check {
        let off = r.route == "embeddings" && cx.config.embed_pooling.resolve(cx.model).is_none();
        judge(&bad_fields(r, cx.model), off, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokenwire_core::testing::tiny_model_info;

    fn req(route: &str, body: Value) -> Request {
        Request {
            route: route.into(),
            body,
        }
    }

    #[test]
    fn fields_are_judged_by_the_apis_rules() {
        let m = tiny_model_info();
        let ok = req(
            "chat",
            json!({"model": "tiny", "messages": [{}], "temperature": 2, "n": 8}),
        );
        assert!(bad_fields(&ok, &m).is_empty());
        let both = req(
            "chat",
            json!({"model": "tiny", "messages": [{}], "max_completion_tokens": 4, "max_tokens": -1}),
        );
        assert_eq!(bad_fields(&both, &m), vec!["max_tokens"]);
        let zero = req(
            "completions",
            json!({"model": "tiny", "prompt": "a", "max_tokens": 0}),
        );
        assert_eq!(bad_fields(&zero, &m), vec!["max_tokens"]);
        let echo = req(
            "completions",
            json!({"model": "tiny", "prompt": "a", "max_tokens": 0, "echo": true, "stop": ["a", ""]}),
        );
        assert_eq!(bad_fields(&echo, &m), vec!["stop"]);
        let bad = req(
            "chat",
            json!({"model": "x", "messages": [], "temperature": "hot"}),
        );
        assert_eq!(
            bad_fields(&bad, &m),
            vec!["model", "temperature", "messages"]
        );
        let c = req(
            "completions",
            json!({"model": "tiny", "prompt": [[]], "logprobs": 6}),
        );
        assert_eq!(bad_fields(&c, &m), vec!["prompt", "logprobs"]);
        let c = req("completions", json!({"model": "tiny", "prompt": [1, 2]}));
        assert!(bad_fields(&c, &m).is_empty());
        let e = req(
            "embeddings",
            json!({"model": "tiny", "input": "a", "dimensions": 5}),
        );
        assert_eq!(bad_fields(&e, &m), vec!["dimensions"]);
        let d = req("detokenize", json!({"tokens": [1, 259]}));
        assert_eq!(bad_fields(&d, &m), vec!["tokens"]);
    }

    /// Fabricated violations: a bad field answered, or refused naming
    /// another field.
    #[test]
    fn a_bad_field_answered_or_misnamed_is_caught() {
        let bad = ["temperature"];
        let err = |param: &str| json!({"error": {"message": "m", "type": "t", "param": param}});
        judge(&bad, false, &Outcome::Error(400, err("temperature"))).expect("named");
        let e = judge(&bad, false, &Outcome::Reply(json!({}))).expect_err("answered");
        assert!(e.contains("answered"), "{e}");
        let e = judge(&bad, false, &Outcome::Error(400, err("n"))).expect_err("misnamed");
        assert!(e.contains("refused"), "{e}");
        let e = judge(&bad, false, &Outcome::Error(429, err("temperature")))
            .expect_err("a queue refusal first");
        assert!(e.contains("429"), "{e}");
        judge(&["model"], false, &Outcome::Error(404, err("model"))).expect("a 404");
        let off = json!({"error": {"message": "off", "type": "t", "param": null}});
        judge(&["input"], true, &Outcome::Error(400, off.clone())).expect("the route is off");
        judge(&["input"], false, &Outcome::Error(400, off)).expect_err("unnamed");
    }
}
