//! One client request is one request to the rate limits, however many
//! generations compute it (Chat Completions' `n`, a Completions prompt
//! list, embedding inputs): admitted or refused whole, never cut short
//! once admitted, and its tokens charged all the same. A beam search is
//! limited and charged like any request, its forks for what they generate.
//! Anonymous limits here (every harness connection shares one address);
//! a key's organisation goes through the same admission.

use serde_json::{json, Value};
use tokenwire_core::keys::OrgLimits;
use tokenwire_core::testing::Harness;
use tokenwire_core::{ConnId, Dialect, Duration, HostConfig};

fn harness(requests_per_minute: Option<u64>, tokens_per_minute: Option<u64>) -> Harness {
    Harness::new(
        HostConfig {
            anon_limits: OrgLimits {
                requests_per_minute,
                tokens_per_minute,
            },
            ..HostConfig::default()
        },
        "abcdefghijklmnopqrstuvwxyz",
        1,
    )
}

/// One OpenAI-route request on a fresh HTTP connection: its reply.
fn call(h: &mut Harness, id: u64, route: &str, body: Value) -> Value {
    let c = h.open_http(id, Dialect::Chat);
    h.send(c, json!({"route": route, "body": body}));
    h.run(500);
    h.received(c).last().cloned().unwrap_or(Value::Null)
}

fn chat(n: u32) -> Value {
    json!({"model": "tiny", "max_tokens": 3, "n": n,
           "messages": [{"role": "user", "content": "hi"}]})
}

/// A request answered (not refused).
fn answered(r: &Value) -> bool {
    r["kind"] == "reply" && r["data"]["error"].is_null()
}

fn assert_rate_limited(r: &Value) {
    assert_eq!(r["status"], 429, "{r}");
    assert_eq!(r["data"]["error"]["code"], "rate_limit_exceeded", "{r}");
}

#[test]
fn a_chat_request_with_several_choices_counts_once_and_is_computed_whole() {
    let mut h = harness(Some(1), None);
    let r = call(&mut h, 1, "chat", chat(3));
    assert!(answered(&r), "{r}");
    let choices = r["data"]["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{r}");
    assert!(
        choices.iter().all(|c| c["finish_reason"] == "length"),
        "{r}"
    );
    // The minute's one request is used: the next is refused before any
    // compute, with nothing of it started.
    let steps = h.steps_run;
    assert_rate_limited(&call(&mut h, 2, "chat", chat(1)));
    assert_eq!(h.steps_run, steps, "a refused request computes nothing");
    h.advance(Duration::from_secs(60));
    assert!(answered(&call(&mut h, 3, "chat", chat(2))));
}

#[test]
fn choices_of_one_prompt_are_charged_the_prompt_once_as_the_usage_counts_it() {
    // Three choices of a 3-token prompt, 3 tokens each: the usage's 12
    // tokens. A bucket of 13 keeps one token for the next request; one of
    // 12 keeps none.
    for (tokens_per_minute, next_admitted) in [(13, true), (12, false)] {
        let mut h = harness(None, Some(tokens_per_minute));
        let r = call(&mut h, 1, "chat", chat(3));
        assert!(answered(&r), "{r}");
        assert_eq!(r["data"]["usage"]["total_tokens"], 12, "{r}");
        let next = call(&mut h, 2, "chat", chat(1));
        assert_eq!(
            answered(&next),
            next_admitted,
            "{tokens_per_minute}: {next}"
        );
    }
}

#[test]
fn a_completions_prompt_list_with_choices_counts_once() {
    let mut h = harness(Some(2), None);
    let body = json!({"model": "tiny", "max_tokens": 2, "n": 2,
                      "prompt": ["ab", "cd", "ef"]});
    let r = call(&mut h, 1, "completions", body.clone());
    assert!(answered(&r), "{r}");
    let choices = r["data"]["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 6, "three prompts, two choices each: {r}");
    let indices: Vec<u64> = choices.iter().filter_map(|c| c["index"].as_u64()).collect();
    assert_eq!(indices, [0, 1, 2, 3, 4, 5]);
    assert!(answered(&call(&mut h, 2, "completions", body.clone())));
    assert_rate_limited(&call(&mut h, 3, "completions", body));
}

#[test]
fn an_embeddings_request_counts_once_however_many_inputs_it_has() {
    let mut h = harness(Some(1), None);
    // More inputs than the window, so later ones start as earlier end.
    let inputs: Vec<String> = (0..40).map(|i| format!("input {i}")).collect();
    let r = call(
        &mut h,
        1,
        "embeddings",
        json!({"model": "tiny", "input": inputs}),
    );
    assert!(answered(&r), "{r}");
    assert_eq!(r["data"]["data"].as_array().map(Vec::len), Some(40), "{r}");
    assert_rate_limited(&call(
        &mut h,
        2,
        "embeddings",
        json!({"model": "tiny", "input": "one"}),
    ));
}

#[test]
fn every_part_of_an_admitted_request_is_charged_its_tokens() {
    // Ten inputs of BOS + 7 bytes: 80 prompt tokens against 50 a minute.
    // The request was admitted with the bucket full, so it is computed
    // whole and leaves the bucket 30 tokens in debt.
    let mut h = harness(None, Some(50));
    let inputs: Vec<String> = (0..10).map(|i| format!("input {i}")).collect();
    let r = call(
        &mut h,
        1,
        "embeddings",
        json!({"model": "tiny", "input": inputs}),
    );
    assert!(answered(&r), "{r}");
    assert_eq!(r["data"]["usage"]["prompt_tokens"], 80, "{r}");
    assert_rate_limited(&call(&mut h, 2, "chat", chat(1)));
    // 31 tokens at 50 a minute: 37.2 s until the bucket holds one again.
    h.advance(Duration::from_secs(37));
    assert_rate_limited(&call(&mut h, 3, "chat", chat(1)));
    h.advance(Duration::from_secs(1));
    assert!(answered(&call(&mut h, 4, "chat", chat(1))));
}

fn batch_payload(rid: &str, beams: u32) -> Value {
    json!({"stream_response": false,
           "prompts": [{"request_id": rid, "prompt": "abcd"}],
           "generation_config": {"num_beams": beams, "max_new_tokens": 8}})
}

fn batch_outcome(h: &Harness, c: ConnId, rid: &str) -> Value {
    h.received(c)
        .iter()
        .flat_map(|f| f.as_array().cloned().unwrap_or_default())
        .find(|e| e["request_id"] == rid && (e["type"] == "COMPLETE" || e["type"] == "ERROR"))
        .unwrap_or(Value::Null)
}

#[test]
fn a_beam_search_is_one_request_to_the_limits() {
    let mut h = harness(Some(1), None);
    let c = h.open(1, Dialect::Batch);
    h.send(c, batch_payload("a", 3));
    h.run(200);
    assert_eq!(
        batch_outcome(&h, c, "a")["type"],
        "COMPLETE",
        "{:?}",
        h.received(c)
    );
    h.send(c, batch_payload("b", 3));
    h.run(200);
    let refused = batch_outcome(&h, c, "b");
    assert_eq!(refused["type"], "ERROR", "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("rate limit")),
        "{refused}"
    );
}

#[test]
fn a_beam_search_is_charged_for_every_beam_s_tokens() {
    // BOS + 4 prompt bytes and 8 new tokens: 13 tokens. A sampled answer
    // leaves 1 of 14 in the bucket; three beams generate more than one
    // answer does, so the bucket is empty after them.
    for (beams, next_admitted) in [(1, true), (3, false)] {
        let mut h = harness(None, Some(14));
        let c = h.open(1, Dialect::Batch);
        h.send(c, batch_payload("a", beams));
        h.run(200);
        assert_eq!(
            batch_outcome(&h, c, "a")["type"],
            "COMPLETE",
            "{beams} beams"
        );
        let next = call(&mut h, 2, "chat", chat(1));
        assert_eq!(answered(&next), next_admitted, "{beams} beams: {next}");
    }
}
