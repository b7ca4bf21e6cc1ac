//! Structured output over real sockets on real models: 100 seeded samples
//! at temperature 1 from stories260K and from SmolLM2, every one parsed and
//! checked against its JSON Schema (the target: all of them); the
//! WebSocket dialects' extension; and the refusals (a schema the grammar
//! engine cannot enforce, a model without a grammar engine).

use serde_json::{json, Value};
use tokenwire_tests::{http, smollm2_gguf, start, stories260k, Client, ModelSource};

const CHAT: &str = "/v1/chat/completions";

/// Bounded fields, so a small model at temperature 1 always reaches the end.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "hero": {"type": "string", "minLength": 1, "maxLength": 16},
            "age": {"type": "integer", "minimum": 1, "maximum": 99},
            "place": {"enum": ["forest", "castle", "sea"]},
            "brave": {"type": "boolean"},
            "friends": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2}
        },
        "required": ["hero", "age", "place", "brave", "friends"],
        "additionalProperties": false
    })
}

/// Checks one output against [`schema`], naming what is wrong.
fn check(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{e}: {text:?}"))?;
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    if keys != ["hero", "age", "place", "brave", "friends"] {
        return Err(format!("keys {keys:?}"));
    }
    let hero = o["hero"].as_str().ok_or("hero")?.chars().count();
    let age = o["age"].as_i64().ok_or("age")?;
    let place = o["place"].as_str().ok_or("place")?;
    let friends = o["friends"].as_array().ok_or("friends")?;
    let ok = (1..=16).contains(&hero)
        && (1..=99).contains(&age)
        && ["forest", "castle", "sea"].contains(&place)
        && o["brave"].is_boolean()
        && friends.len() <= 2
        && friends
            .iter()
            .all(|f| f.as_str().is_some_and(|s| s.chars().count() <= 10));
    ok.then_some(())
        .ok_or_else(|| format!("out of the schema: {v}"))
}

/// 25 requests of 4 choices each (100 samples), seeds 0..25, temperature 1;
/// returns how many were valid and the first failure.
async fn hundred_samples(server: &tokenwire_tests::RunningServer, model: &str) -> usize {
    let mut valid = 0;
    for seed in 0..25 {
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": "Tell me about a hero, as JSON."}],
            "n": 4, "temperature": 1, "seed": seed, "max_tokens": 120,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "hero", "schema": schema(), "strict": true}}
        });
        let r = http(server, "POST", CHAT, Some(&body.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        for ch in v["choices"].as_array().expect("choices") {
            let text = ch["message"]["content"].as_str().unwrap_or("");
            assert_eq!(ch["finish_reason"], "stop", "seed {seed}: {ch}");
            check(text).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            valid += 1;
        }
    }
    valid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stories260k_gives_100_valid_outputs_of_100() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    assert_eq!(hundred_samples(&server, "stories260K").await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_gives_100_valid_outputs_of_100() {
    let Some(path) = smollm2_gguf() else { return };
    let server = start(ModelSource::Dir(path), |_| {}).await;
    assert_eq!(
        hundred_samples(&server, "SmolLM2-135M-Instruct.Q4_1").await,
        100
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_dialects_and_the_refusals() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let format = json!({"type": "json_schema",
                        "json_schema": {"name": "hero", "schema": schema()}});

    // generate: `parameters.response_format` (an extension).
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": "Once upon a time",
                  "parameters": {"max_tokens": 120, "temperature": 1, "seed": 3,
                                 "response_format": format}}))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let done = frames.last().expect("frame");
    assert_eq!(done["type"], "completion", "{done}");
    check(done["generated_text"].as_str().unwrap_or("")).expect("valid");

    // responses over its socket: `text.format`, flat.
    let mut r = Client::connect(&server, "/v1/responses").await;
    let flat = json!({"type": "json_schema", "name": "hero", "schema": schema(), "strict": true});
    r.send(
        json!({"type": "response.create", "model": "stories260K", "input": "Once",
                  "max_output_tokens": 120, "temperature": 1, "text": {"format": flat}}),
    )
    .await;
    let frames = r.recv_until(&["response.completed", "error"]).await;
    let done = frames.last().expect("frame");
    assert_eq!(done["type"], "response.completed", "{done}");
    let text = done["response"]["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or("");
    check(text).expect("valid");
    assert_eq!(done["response"]["text"]["format"], flat);

    // A schema the grammar engine cannot enforce: 400, naming the field.
    let bad = json!({"model": "stories260K", "messages": [{"role": "user", "content": "x"}],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "b",
                       "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}});
    let resp = http(&server, "POST", CHAT, Some(&bad.to_string())).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    let e: Value = serde_json::from_str(&resp.body).expect("json");
    assert_eq!(e["error"]["param"], "response_format", "{e}");

    // The server still answers after the refusal.
    let ok = json!({"model": "stories260K", "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 4, "response_format": {"type": "json_object"}});
    let resp = http(&server, "POST", CHAT, Some(&ok.to_string())).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let v: Value = serde_json::from_str(&resp.body).expect("json");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
    assert!(text.starts_with('{'), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_grammar_engine_refuses_with_the_reason() {
    // The random tiny model's byte codec has no grammar engine.
    let server = start(ModelSource::Tiny, |_| {}).await;
    let body = json!({"model": "tokenwire-tiny", "messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_object"}});
    let resp = http(&server, "POST", CHAT, Some(&body.to_string())).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert!(resp.body.contains("no grammar engine"), "{}", resp.body);
}

/// Whether all of `text` matches `pattern`.
fn matches_whole(pattern: &str, text: &str) -> bool {
    regex_automata::meta::Regex::new(&format!("^(?:{pattern})$"))
        .expect("a valid regex")
        .is_match(text)
}

/// vLLM's fields (`structured_outputs`, `guided_*`), as clients written for
/// vLLM send them: 40 seeded samples at temperature 1 for each of a
/// choice, a regular expression (on Completions, streamed) and a Lark
/// grammar, every one checked; and the refusals, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_s_choice_regex_and_grammar_fields_hold_on_every_sample() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let msgs = json!([{"role": "user", "content": "Where did the hero go?"}]);
    let places = ["forest", "castle", "sea", "the old mill"];
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..10 {
        let body = json!({"model": "stories260K", "messages": msgs, "n": 4,
                          "temperature": 1, "seed": seed, "max_tokens": 20,
                          "guided_choice": places});
        let r = http(&server, "POST", CHAT, Some(&body.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        for ch in r.json()["choices"].as_array().expect("choices") {
            let text = ch["message"]["content"].as_str().unwrap_or("");
            assert!(places.contains(&text), "seed {seed}: {ch}");
            assert_eq!(ch["finish_reason"], "stop", "seed {seed}: {ch}");
            seen.insert(text.to_string());
        }
    }
    assert!(seen.len() >= 2, "temperature 1 reaches several: {seen:?}");

    let pattern = "[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}";
    for seed in 0..40 {
        let body = json!({"model": "stories260K", "prompt": "Once upon a time",
                          "temperature": 1, "seed": seed, "max_tokens": 30, "stream": true,
                          "structured_outputs": {"regex": pattern}});
        let r = http(&server, "POST", "/v1/completions", Some(&body.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let text: String = r
            .body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
            .collect();
        assert!(matches_whole(pattern, &text), "seed {seed}: {text:?}");
    }

    let lark = "start: name \" met \" name \".\"\nname: \"Lily\" | \"Ben\" | /[A-Z][a-z]{1,5}/";
    for seed in 0..10 {
        let body = json!({"model": "stories260K", "messages": msgs, "n": 4,
                          "temperature": 1, "seed": seed, "max_tokens": 30,
                          "structured_outputs": {"grammar": lark}});
        let r = http(&server, "POST", CHAT, Some(&body.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        for ch in r.json()["choices"].as_array().expect("choices") {
            let text = ch["message"]["content"].as_str().unwrap_or("");
            let name = "(Lily|Ben|[A-Z][a-z]{1,5})";
            assert!(
                matches_whole(&format!("{name} met {name}\\."), text),
                "seed {seed}: {ch}"
            );
        }
    }

    for (extra, param, needle) in [
        (
            json!({"structured_outputs": {"regex": "[a-z"}}),
            "structured_outputs.regex",
            "the regular expression cannot be enforced",
        ),
        (
            json!({"guided_grammar": "root ::= \"a\""}),
            "guided_grammar",
            "the grammar cannot be enforced",
        ),
        (
            json!({"guided_choice": []}),
            "guided_choice",
            "1 to 1024 strings",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
            "guided_regex",
            "only one output format",
        ),
    ] {
        let mut body = json!({"model": "stories260K", "messages": msgs, "max_tokens": 4});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let r = http(&server, "POST", CHAT, Some(&body.to_string())).await;
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{extra}: {}", r.body);
        assert!(r.body.contains(needle), "{extra}: {}", r.body);
    }
    server.shutdown().await;
}
