//! Structured output through the core: every dialect that takes an output
//! format compiles it with the model's codec and decodes under its mask,
//! with a stand-in grammar engine ([`DigitsCodec`]: four digits, then the
//! end) and a scripted engine whose script (letters) the grammar forbids,
//! so every digit in an answer came from the mask.

use serde_json::{json, Value};
use tokenwire_core::testing::{tiny_model_info, DigitsCodec, Harness};
use tokenwire_core::{Dialect, HostConfig};

const SCRIPT: &str = "abcdefghijklmnopqrstuvwxyz";

fn harness() -> Harness {
    Harness::with_codec(
        HostConfig::default(),
        tiny_model_info(),
        DigitsCodec::shared(4),
        SCRIPT,
        1,
    )
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 10, "temperature": 0});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    json!({"route": "chat", "body": b})
}

fn schema_format(schema: Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}})
}

fn is_digits(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_digit())
}

#[test]
fn every_chat_choice_follows_the_format_and_ends_when_it_is_complete() {
    let mut h = harness();
    let c = h.open_http(1, Dialect::Chat);
    h.send(
        c,
        chat(json!({"n": 3, "response_format": schema_format(json!({"type": "object"}))})),
    );
    h.run(100);
    let r = h.received(c).last().cloned().expect("reply");
    assert_eq!(r["kind"], "reply", "{r}");
    let choices = r["data"]["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for ch in choices {
        let text = ch["message"]["content"].as_str().expect("content");
        assert!(is_digits(text, 4), "{ch}");
        // The grammar ended it, not max_tokens.
        assert_eq!(ch["finish_reason"], "stop", "{ch}");
    }
    // Four digits and the end-of-sequence token per choice.
    assert_eq!(r["data"]["usage"]["completion_tokens"], 15, "{r}");
}

#[test]
fn without_a_format_the_same_request_is_free_text() {
    let mut h = harness();
    let c = h.open_http(1, Dialect::Chat);
    h.send(c, chat(json!({"response_format": {"type": "text"}})));
    h.run(100);
    let r = h.received(c).last().cloned().expect("reply");
    let text = r["data"]["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert_eq!(text.len(), 10, "{r}");
    assert!(text.bytes().all(|b| b.is_ascii_lowercase()), "{r}");
}

#[test]
fn a_format_the_grammar_engine_refuses_is_a_400_naming_response_format() {
    let mut h = harness();
    let c = h.open_http(1, Dialect::Chat);
    h.send(
        c,
        chat(json!({"response_format": schema_format(json!({"not": {}}))})),
    );
    h.run(10);
    let r = h.received(c).last().cloned().expect("reply");
    assert_eq!(r["kind"], "error", "{r}");
    assert_eq!(r["status"], 400);
    assert_eq!(r["data"]["error"]["param"], "response_format");
    assert!(
        r["data"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("matches nothing")),
        "{r}"
    );
    assert_eq!(h.steps_run, 0, "nothing ran");
}

#[test]
fn a_token_outside_the_mask_fails_the_generation_and_is_never_delivered() {
    let mut h = harness();
    h.engine.ignore_masks = true;
    let c = h.open_http(1, Dialect::Chat);
    h.send(
        c,
        chat(json!({"stream": true, "response_format": {"type": "json_object"}})),
    );
    h.run(100);
    let frames = h.received(c);
    let last = frames.last().cloned().expect("frames");
    assert_eq!(last["kind"], "error", "{frames:?}");
    assert!(
        last["data"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not allow")),
        "{last}"
    );
    // No chunk carried the script's letter.
    for f in frames {
        let content = &f["data"]["choices"][0]["delta"]["content"];
        assert!(
            content.is_null() || content == "",
            "a refused token was streamed: {f}"
        );
    }
}

#[test]
fn responses_text_format_constrains_the_output_and_is_echoed() {
    let mut h = harness();
    let c = h.open(1, Dialect::Responses);
    let format =
        json!({"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": true});
    h.send(
        c,
        json!({"type": "response.create", "model": "tiny", "input": "hi", "max_output_tokens": 10,
               "temperature": 0, "text": {"format": format}}),
    );
    h.run(100);
    let done = h.of_type(c, "response.completed");
    assert_eq!(done.len(), 1, "{:?}", h.received(c));
    let resp = &done[0]["response"];
    let text = resp["output"][0]["content"][0]["text"]
        .as_str()
        .expect("text");
    assert!(is_digits(text, 4), "{resp}");
    assert_eq!(resp["text"]["format"], format);
    // A bad format is refused with its field, over the socket too.
    h.send(
        c,
        json!({"type": "response.create", "model": "tiny", "input": "hi",
               "text": {"format": {"type": "json_schema", "schema": {}}}}),
    );
    h.run(10);
    let err = h.of_type(c, "error");
    assert_eq!(
        err.last().expect("error")["error"]["param"],
        "text.format.name"
    );
}

#[test]
fn generate_and_batch_take_response_format_as_an_extension() {
    let mut h = harness();
    let g = h.open(1, Dialect::Generate);
    h.send(
        g,
        json!({"type": "config", "prompt": "hi",
               "parameters": {"max_tokens": 10, "temperature": 0,
                              "response_format": {"type": "json_object"}}}),
    );
    h.run(100);
    let done = h.of_type(g, "completion");
    assert_eq!(done.len(), 1, "{:?}", h.received(g));
    assert!(
        is_digits(done[0]["generated_text"].as_str().unwrap_or(""), 4),
        "{}",
        done[0]
    );

    let b = h.open(2, Dialect::Batch);
    h.send(
        b,
        json!({"prompts": [{"request_id": "a", "prompt": "hi"}, {"request_id": "b", "prompt": "yo"}],
               "generation_config": {"max_new_tokens": 10, "do_sample": false,
                                     "response_format": {"type": "json_object"}}}),
    );
    h.run(100);
    let completes: Vec<Value> = h
        .received(b)
        .iter()
        .flat_map(|f| f.as_array().cloned().unwrap_or_default())
        .filter(|e| e["type"] == "COMPLETE")
        .collect();
    assert_eq!(completes.len(), 2, "{:?}", h.received(b));
    for e in &completes {
        assert!(is_digits(e["text"].as_str().unwrap_or(""), 4), "{e}");
        assert_eq!(e["is_eos"], true, "{e}");
    }
    // With beam search it is refused, naming both.
    h.send(
        b,
        json!({"prompts": [{"request_id": "c", "prompt": "hi"}], "stream_response": false,
               "generation_config": {"num_beams": 2, "response_format": {"type": "json_object"}}}),
    );
    h.run(10);
    let errors: Vec<Value> = h
        .received(b)
        .iter()
        .flat_map(|f| f.as_array().cloned().unwrap_or_default())
        .filter(|e| e["request_id"] == "c")
        .collect();
    assert!(
        errors.iter().any(|e| e["error"]
            .as_str()
            .is_some_and(|m| m.contains("response_format") && m.contains("num_beams"))),
        "{errors:?}"
    );
}
