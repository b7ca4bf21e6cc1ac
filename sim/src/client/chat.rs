//! What a client of the `chat` routes asks: `POST /v1/chat/completions`,
//! `POST /v1/completions`, `POST /v1/embeddings`, `POST /tokenize`,
//! `POST /detokenize` and `GET /tokenizer_info`, each body drawn from the
//! client's own stream. [`super::HttpClient`] sends them, one request per
//! connection, as the io shell carries them.
//!
//! The bodies are what OpenAI clients and evaluation harnesses send: several
//! choices (`n`), streams with and without usage, logprobs with
//! alternatives, stop strings, batches of prompts as text and as token ids,
//! `echo` with `logprobs` (prompt scoring), `max_tokens: 0` with `echo`,
//! embeddings as floats and base64, cut to `dimensions`, vLLM's
//! `allowed_token_ids` and `bad_words`. Now and then one
//! names a model this server does not serve, or asks for more than the
//! bounds allow. Every prompt, message list, embedding input and text to
//! tokenize starts with the connection's tag (see [`super`]), as token ids
//! too: BOS, then the tag's bytes.

use serde_json::{json, Map, Value};
use tokenwire_core::rng::Rng;
use tokenwire_core::text::byte::{ByteCodec, BYTE_EOS, BYTE_OFFSET};
use tokenwire_core::{TextCodec, TokenId};

use super::{chance, text};
use crate::swarm::Swarm;

/// A request: its method, its path and its body (`Null` for a GET).
pub type Request = (String, String, Value);

/// A request of the `chat` routes, tagged with `tag`, most tokens `cap`;
/// now and then with one field the route must refuse ([`BAD_FIELDS`]).
pub fn request(rng: &mut Rng, swarm: &Swarm, tag: &str, cap: u64) -> Request {
    let (method, path, mut body) = valid_request(rng, swarm, tag, cap);
    if chance(rng, 0.06) {
        if let Value::Object(map) = &mut body {
            corrupt(rng, &path, map);
        }
    }
    (method, path, body)
}

/// Fields a client gets wrong: (the route's path, the field, a value the
/// route refuses, as JSON).
pub const BAD_FIELDS: &[(&str, &str, &str)] = &[
    ("/v1/chat/completions", "temperature", "9"),
    ("/v1/chat/completions", "temperature", "\"hot\""),
    ("/v1/chat/completions", "max_tokens", "-1"),
    ("/v1/chat/completions", "n", "0"),
    ("/v1/chat/completions", "top_p", "2"),
    ("/v1/chat/completions", "messages", "[]"),
    ("/v1/chat/completions", "stream", "\"yes\""),
    ("/v1/chat/completions", "seed", "\"x\""),
    ("/v1/completions", "prompt", "[]"),
    ("/v1/completions", "logprobs", "9"),
    ("/v1/completions", "max_tokens", "1.5"),
    ("/v1/completions", "echo", "\"yes\""),
    ("/v1/completions", "stop", "5"),
    ("/v1/embeddings", "input", "[]"),
    ("/v1/embeddings", "encoding_format", "\"hex\""),
    ("/v1/embeddings", "dimensions", "0"),
    ("/tokenize", "prompt", "5"),
    ("/tokenize", "add_special_tokens", "1"),
    ("/detokenize", "tokens", "\"1 2\""),
    ("/detokenize", "tokens", "[-1]"),
];

/// Sets one of `path`'s [`BAD_FIELDS`] in `body`.
fn corrupt(rng: &mut Rng, path: &str, body: &mut Map<String, Value>) {
    let fields: Vec<_> = BAD_FIELDS.iter().filter(|f| f.0 == path).collect();
    if fields.is_empty() {
        return;
    }
    let (_, field, value) = fields[rng.below(fields.len() as u64) as usize];
    let value = serde_json::from_str(value).unwrap_or(Value::Null);
    body.insert((*field).to_string(), value);
}

/// A request meant to be valid: the route refuses it only when it names
/// another model (or none), asks for more choices or dimensions than there
/// are, or draws an empty stop string.
fn valid_request(rng: &mut Rng, swarm: &Swarm, tag: &str, cap: u64) -> Request {
    let x = rng.next_f64();
    if x < 0.4 {
        return post("/v1/chat/completions", chat(rng, swarm, tag, cap));
    }
    if x < 0.75 {
        return post("/v1/completions", completions(rng, swarm, tag, cap));
    }
    if x < 0.9 {
        return post("/v1/embeddings", embeddings(rng, swarm, tag));
    }
    if x < 0.95 {
        let mut body = Map::new();
        body.insert("prompt".into(), json!(format!("{tag}{}", text(rng, 12))));
        if chance(rng, 0.5) {
            body.insert("add_special_tokens".into(), json!(chance(rng, 0.5)));
        }
        return post("/tokenize", Value::Object(body));
    }
    if x < 0.98 {
        return post("/detokenize", json!({"tokens": ids(rng, tag, 12)}));
    }
    ("GET".into(), "/tokenizer_info".into(), Value::Null)
}

fn post(path: &str, body: Value) -> Request {
    ("POST".into(), path.into(), body)
}

/// `model`: the served one mostly, now and then another, rarely none (a
/// `400`: the routes require it).
fn model(rng: &mut Rng, swarm: &Swarm, body: &mut Map<String, Value>) {
    if chance(rng, 0.05) {
        body.insert("model".into(), json!(format!("not-{}", swarm.model.name)));
    } else if !chance(rng, 0.02) {
        body.insert("model".into(), json!(swarm.model.name));
    }
}

/// The prompt's token ids: BOS, `tag`'s bytes and up to `max` more bytes.
fn ids(rng: &mut Rng, tag: &str, max: u64) -> Vec<TokenId> {
    let words = format!("{tag}{}", text(rng, max));
    ByteCodec.encode(&words, true).unwrap_or_default()
}

/// What every generating body may carry: `n`, `stream` (with usage now and
/// then), temperature, `seed`, stop strings.
fn common(rng: &mut Rng, body: &mut Map<String, Value>, most_n: u64) {
    if chance(rng, 0.3) {
        let n = if chance(rng, 0.03) {
            9
        } else {
            1 + rng.below(most_n)
        };
        body.insert("n".into(), json!(n));
    }
    if chance(rng, 0.5) {
        body.insert("stream".into(), json!(true));
        if chance(rng, 0.5) {
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    if chance(rng, 0.4) {
        body.insert("temperature".into(), json!(rng.below(3)));
    }
    if chance(rng, 0.2) {
        body.insert("seed".into(), json!(rng.below(1000)));
    }
    if chance(rng, 0.15) {
        body.insert("stop".into(), json!([text(rng, 2)]));
    }
}

/// A Chat Completions body: a system message with the tag, a few turns.
fn chat(rng: &mut Rng, swarm: &Swarm, tag: &str, cap: u64) -> Value {
    let mut messages =
        vec![json!({"role": "system", "content": format!("{tag}{}", text(rng, 12))})];
    for _ in 0..rng.below(3) {
        messages.push(json!({"role": "user", "content": text(rng, 12)}));
        messages.push(json!({"role": "assistant", "content": text(rng, 12)}));
    }
    messages.push(json!({"role": "user", "content": text(rng, 16)}));
    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(messages));
    model(rng, swarm, &mut body);
    common(rng, &mut body, 3);
    if chance(rng, 0.85) {
        let field = if chance(rng, 0.5) {
            "max_tokens"
        } else {
            "max_completion_tokens"
        };
        body.insert(field.into(), json!(1 + rng.below(cap)));
    }
    if chance(rng, 0.25) {
        body.insert("logprobs".into(), json!(true));
        body.insert("top_logprobs".into(), json!(rng.below(4)));
    }
    limits(rng, swarm, &mut body);
    Value::Object(body)
}

/// Now and then vLLM's `allowed_token_ids` (a few of the engine's ASCII
/// symbols, mostly with the end of sequence) and `bad_words` (pairs of
/// them, so the engine runs into them), which every choice must keep.
fn limits(rng: &mut Rng, swarm: &Swarm, body: &mut Map<String, Value>) {
    let ascii: Vec<u8> = swarm
        .engine
        .symbols
        .iter()
        .filter(|s| s.len() == 1)
        .map(|s| s.as_bytes()[0])
        .collect();
    if ascii.is_empty() {
        return;
    }
    let pick = |rng: &mut Rng| ascii[rng.below(ascii.len() as u64) as usize];
    if chance(rng, 0.1) {
        let mut ids: Vec<TokenId> = (0..1 + rng.below(4))
            .map(|_| TokenId::from(pick(rng)) + BYTE_OFFSET)
            .collect();
        if chance(rng, 0.7) {
            ids.push(BYTE_EOS);
        }
        body.insert("allowed_token_ids".into(), json!(ids));
    }
    if chance(rng, 0.1) {
        let words: Vec<String> = (0..1 + rng.below(2))
            .map(|_| {
                let pair = [pick(rng), pick(rng)];
                String::from_utf8_lossy(&pair).into_owned()
            })
            .filter(|w| !w.trim().is_empty())
            .collect();
        if !words.is_empty() {
            body.insert("bad_words".into(), json!(words));
        }
    }
}

/// A Completions body: one prompt or a batch, text or token ids, scored
/// (`echo` with `logprobs`) now and then.
fn completions(rng: &mut Rng, swarm: &Swarm, tag: &str, cap: u64) -> Value {
    let one = |rng: &mut Rng| -> Value {
        if chance(rng, 0.25) {
            json!(ids(rng, tag, 16))
        } else {
            json!(format!("{tag}{}", text(rng, 16)))
        }
    };
    let prompt = if chance(rng, 0.3) {
        Value::Array((0..1 + rng.below(4)).map(|_| one(rng)).collect())
    } else {
        one(rng)
    };
    let mut body = Map::new();
    body.insert("prompt".into(), prompt);
    model(rng, swarm, &mut body);
    common(rng, &mut body, 2);
    let echo = chance(rng, 0.35);
    if echo {
        body.insert("echo".into(), json!(true));
    }
    if chance(rng, if echo { 0.6 } else { 0.2 }) {
        body.insert("logprobs".into(), json!(rng.below(4)));
    }
    if echo && chance(rng, 0.2) {
        body.insert("max_tokens".into(), json!(0));
    } else if chance(rng, 0.85) {
        body.insert("max_tokens".into(), json!(1 + rng.below(cap)));
    }
    if !echo {
        limits(rng, swarm, &mut body);
    }
    Value::Object(body)
}

/// An Embeddings body: one input or several, text or ids, as floats or
/// base64, cut to `dimensions` now and then.
fn embeddings(rng: &mut Rng, swarm: &Swarm, tag: &str) -> Value {
    let one = |rng: &mut Rng| -> Value {
        if chance(rng, 0.2) {
            json!(ids(rng, tag, 16))
        } else {
            json!(format!("{tag}{}", text(rng, 16)))
        }
    };
    let input = if chance(rng, 0.4) {
        Value::Array((0..1 + rng.below(4)).map(|_| one(rng)).collect())
    } else {
        one(rng)
    };
    let mut body = Map::new();
    body.insert("input".into(), input);
    model(rng, swarm, &mut body);
    if chance(rng, 0.3) {
        body.insert("encoding_format".into(), json!("base64"));
    }
    if chance(rng, 0.3) {
        // Now and then one more than the model has: a `400`.
        let most = u64::from(swarm.model.embedding_size) + 1;
        body.insert("dimensions".into(), json!(1 + rng.below(most)));
    }
    Value::Object(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwire_core::text::byte::{BYTE_BOS, BYTE_OFFSET};

    #[test]
    fn every_body_starts_with_the_tag() {
        let swarm = Swarm::from_seed(7);
        let mut rng = Rng::new(3);
        let tag_ids: Vec<TokenId> = std::iter::once(BYTE_BOS)
            .chain("<c5>".bytes().map(|b| TokenId::from(b) + BYTE_OFFSET))
            .collect();
        let tagged = |v: &Value| match v {
            Value::String(s) => s.starts_with("<c5>"),
            Value::Array(ids) => ids
                .iter()
                .map(|i| i.as_u64().unwrap_or(0) as TokenId)
                .take(tag_ids.len())
                .eq(tag_ids.iter().copied()),
            _ => false,
        };
        let mut paths = std::collections::BTreeSet::new();
        for _ in 0..400 {
            let (_, path, body) = valid_request(&mut rng, &swarm, "<c5>", 8);
            paths.insert(path.clone());
            let inputs: Vec<&Value> = match path.as_str() {
                "/v1/chat/completions" => vec![&body["messages"][0]["content"]],
                "/v1/completions" | "/v1/embeddings" => {
                    let v = if path == "/v1/completions" {
                        &body["prompt"]
                    } else {
                        &body["input"]
                    };
                    match v {
                        // A batch: strings and id arrays; else one prompt.
                        Value::Array(a) if !a[0].is_number() => a.iter().collect(),
                        other => vec![other],
                    }
                }
                "/tokenize" => vec![&body["prompt"]],
                "/detokenize" => vec![&body["tokens"]],
                _ => vec![],
            };
            for v in inputs {
                assert!(tagged(v), "{path}: {v}");
            }
        }
        assert_eq!(paths.len(), 6, "{paths:?}");
    }

    #[test]
    fn now_and_then_one_field_is_one_the_route_refuses() {
        let swarm = Swarm::from_seed(7);
        let mut rng = Rng::new(4);
        let mut corrupted = 0;
        for _ in 0..1000 {
            let (_, path, body) = request(&mut rng, &swarm, "<c5>", 8);
            let bad = BAD_FIELDS.iter().any(|(p, field, value)| {
                *p == path && serde_json::from_str::<Value>(value).ok().as_ref() == body.get(*field)
            });
            corrupted += u32::from(bad);
        }
        assert!((20..120).contains(&corrupted), "{corrupted} of 1000");
    }
}
