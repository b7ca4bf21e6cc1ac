//! Content filtering through the Host on every dialect, with a scripted
//! engine that writes "dragon" over and over (so every answer runs into the
//! `stop` rule within a few tokens, split across tokens as the byte model
//! writes it byte by byte): no frame of any dialect ever carries the word,
//! each ends with its content-filter finish, and a `refuse` rule refuses a
//! prompt on every dialect before anything is computed.

use std::sync::Arc;

use serde_json::{json, Value};
use tokenwire_core::filter::{ContentFilter, FilterAction, FilterRule};
use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
use tokenwire_core::testing::{tiny_model_info, ByteCodec, Harness};
use tokenwire_core::{ConnId, Dialect, Event, HostConfig, Output};

const SCRIPT: &str = "a dragon ";

fn config() -> HostConfig {
    let rules = vec![
        FilterRule {
            name: "dragons".into(),
            pattern: r"drag(on)?s?\b".into(),
            action: FilterAction::Stop,
        },
        FilterRule {
            name: "secrets".into(),
            pattern: r"top\s+secret".into(),
            action: FilterAction::Refuse,
        },
    ];
    HostConfig {
        content_filter: Some(Arc::new(ContentFilter::new(rules).expect("rules"))),
        keys: Some(
            KeyRing::new(vec![ApiKey {
                name: "t".into(),
                sha256: hash_key("k"),
                orgs: vec!["o".into()],
                requests_per_minute: None,
                tokens_per_minute: None,
            }])
            .expect("ring"),
        ),
        ..HostConfig::default()
    }
}

fn harness() -> Harness {
    Harness::with_codec(config(), tiny_model_info(), ByteCodec::shared(), SCRIPT, 1)
}

/// Sends one request on a fresh connection of each dialect whose prompt is
/// `prompt`, and runs the Host until it is quiet.
fn ask_everywhere(h: &mut Harness, prompt: &str) -> Vec<(Dialect, ConnId)> {
    let g = h.open(1, Dialect::Generate);
    h.send(
        g,
        json!({"type": "config", "prompt": prompt, "parameters": {"max_tokens": 40, "temperature": 0}}),
    );
    let s = h.open(2, Dialect::Session);
    h.send(
        s,
        json!({"type": "session_init", "session_id": "s", "job_id": 1, "conversation_context": []}),
    );
    h.send(
        s,
        json!({"type": "prompt", "session_id": "s", "content": prompt, "message_index": 0, "max_tokens": 40}),
    );
    let r = h.open(3, Dialect::Responses);
    h.send(
        r,
        json!({"type": "response.create", "model": "tiny", "input": prompt, "max_output_tokens": 40}),
    );
    let b = h.open(4, Dialect::Batch);
    h.send(
        b,
        json!({"prompts": [{"request_id": "b1", "prompt": prompt}], "generation_config": {"max_new_tokens": 40}}),
    );
    let c = h.open_with(5, Dialect::Cai, "authorization=Bearer%20k&orgId=o");
    h.send(
        c,
        json!({"type": "COMPLETION", "requestId": "c1", "payload": {"prompt": prompt, "options": {"maxTokens": 40}}}),
    );
    let chat = h.open_http(6, Dialect::Chat);
    h.send(
        chat,
        json!({"route": "chat", "body": {"model": "tiny", "max_tokens": 40, "stream": true,
               "messages": [{"role": "user", "content": prompt}]}}),
    );
    h.run(400);
    vec![
        (Dialect::Generate, g),
        (Dialect::Session, s),
        (Dialect::Responses, r),
        (Dialect::Batch, b),
        (Dialect::Cai, c),
        (Dialect::Chat, chat),
    ]
}

#[test]
fn a_stop_rule_never_lets_its_text_out_on_any_dialect() {
    let mut h = harness();
    let conns = ask_everywhere(&mut h, "Tell me a story.");
    for (dialect, c) in &conns {
        let frames = h.received(*c);
        assert!(!frames.is_empty(), "{dialect:?} answered nothing");
        let all = serde_json::to_string(frames).expect("json").to_lowercase();
        assert!(
            !all.contains("drag"),
            "{dialect:?} sent filtered text: {all}"
        );
    }
    let finish = |c: ConnId, kind: &str| h.of_type(c, kind);
    let g = finish(conns[0].1, "completion");
    assert_eq!(g[0]["finish_reason"], "content_filter", "{:?}", g);
    // What came before the match was said.
    assert!(
        g[0]["generated_text"]
            .as_str()
            .is_some_and(|t| t.contains('a')),
        "{:?}",
        g
    );
    let r = finish(conns[2].1, "response.incomplete");
    assert_eq!(
        r[0]["response"]["incomplete_details"]["reason"],
        "content_filter"
    );
    let chat = h.received(conns[5].1);
    assert!(
        chat.iter()
            .any(|f| f["data"]["choices"][0]["finish_reason"] == "content_filter"),
        "{chat:?}"
    );
    // Counted by rule name, per generation that it stopped.
    let stopped = h
        .others
        .iter()
        .filter(|o| {
            matches!(o, Output::Event(Event::ContentFiltered { rule, action, .. })
                if rule == "dragons" && *action == FilterAction::Stop)
        })
        .count();
    assert_eq!(stopped, 6, "one per dialect");
}

#[test]
fn a_refuse_rule_refuses_on_every_dialect_before_any_compute() {
    let mut h = harness();
    let conns = ask_everywhere(&mut h, "Tell me the TOP   Secret plan.");
    assert_eq!(h.steps_run, 0, "nothing was computed");
    let code = |c: ConnId, kind: &str, path: &[&str]| -> Value {
        let f = h.of_type(c, kind).last().cloned().unwrap_or(Value::Null);
        path.iter().fold(f, |v, k| v[*k].clone())
    };
    assert_eq!(code(conns[0].1, "error", &["error"]), "content_filter");
    assert_eq!(code(conns[1].1, "error", &["code"]), "content_filter");
    assert_eq!(
        code(conns[2].1, "error", &["error", "code"]),
        "content_filter"
    );
    assert_eq!(
        code(conns[4].1, "ERROR", &["error", "code"]),
        "CONTENT_FILTERED"
    );
    let batch = serde_json::to_string(h.received(conns[3].1)).expect("json");
    assert!(batch.contains("content filter"), "{batch}");
    let chat = h.received(conns[5].1).last().cloned().expect("reply");
    assert_eq!(chat["status"], 400, "{chat}");
    assert_eq!(chat["data"]["error"]["code"], "content_filter", "{chat}");
    // Errors name the rule, never the text.
    for (_, c) in &conns {
        let all = serde_json::to_string(h.received(*c))
            .expect("json")
            .to_lowercase();
        assert!(!all.contains("secret plan"), "{all}");
    }
}

/// Beam search decodes no text as its beams run (they are raw generations):
/// its best hypothesis is judged whole when the search ends, and the
/// COMPLETE carries only the text before the match.
#[test]
fn a_stop_rule_holds_for_a_beam_search_result_too() {
    let mut h = harness();
    let b = h.open(1, Dialect::Batch);
    h.send(
        b,
        json!({"prompts": [{"request_id": "b1", "prompt": "Tell me a story."}],
               "stream_response": false,
               "generation_config": {"num_beams": 2, "max_new_tokens": 12, "do_sample": false}}),
    );
    h.run(400);
    let all = serde_json::to_string(h.received(b)).expect("json");
    let complete: Vec<Value> = h
        .received(b)
        .iter()
        .filter_map(Value::as_array)
        .flatten()
        .filter(|e| e["type"] == "COMPLETE")
        .cloned()
        .collect();
    assert_eq!(complete.len(), 1, "{all}");
    let text = complete[0]["text"].as_str().unwrap_or("");
    assert!(!text.to_lowercase().contains("drag"), "{all}");
    assert!(text.contains('a'), "what came before the match: {all}");
    assert_eq!(complete[0]["is_eos"], false, "{all}");
    let stopped = h
        .others
        .iter()
        .filter(|o| matches!(o, Output::Event(Event::ContentFiltered { dialect: Dialect::Batch, action, .. }) if *action == FilterAction::Stop))
        .count();
    assert_eq!(stopped, 1);
}

/// `chat_template_kwargs` reach the prompt through the template, so their
/// strings meet the `refuse` rules as messages do.
#[test]
fn a_refuse_rule_refuses_text_in_chat_template_kwargs() {
    let mut h = harness();
    let c = h.open(1, Dialect::Chat);
    h.send(
        c,
        json!({"route": "chat", "body": {"model": "tiny",
               "messages": [{"role": "user", "content": "hello"}],
               "chat_template_kwargs": {"notes": [{"text": "the top secret plan"}]}}}),
    );
    h.run(20);
    assert_eq!(h.steps_run, 0, "nothing was computed");
    let reply = h.received(c).last().cloned().expect("reply");
    assert_eq!(reply["data"]["error"]["code"], "content_filter", "{reply}");
}
