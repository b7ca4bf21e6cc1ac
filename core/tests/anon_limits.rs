//! Rate limits for clients without a key (`anon_limits`): per address, on
//! every dialect that takes anonymous clients, with the dialect's
//! rate-limit error and a retry hint; another address, or a key, is not
//! affected.

use serde_json::json;
use tokenwire_core::keys::OrgLimits;
use tokenwire_core::testing::Harness;
use tokenwire_core::{ConnId, Dialect, Duration, HostConfig, Input, Transport};

fn harness(limits: OrgLimits) -> Harness {
    Harness::new(
        HostConfig {
            anon_limits: limits,
            ..HostConfig::default()
        },
        "abcdefgh",
        1,
    )
}

fn open(h: &mut Harness, id: u64, dialect: Dialect, transport: Transport, peer: &str) -> ConnId {
    let conn = ConnId(id);
    h.input(Input::Open {
        conn,
        dialect,
        transport,
        query: String::new(),
        authorization: None,
        peer: peer.into(),
    });
    conn
}

fn generate(h: &mut Harness, c: ConnId) -> serde_json::Value {
    h.send(
        c,
        json!({"type": "config", "prompt": "hi", "parameters": {"max_tokens": 2, "temperature": 0}}),
    );
    h.run(50);
    h.received(c).last().cloned().expect("a frame")
}

#[test]
fn an_address_over_its_requests_per_minute_is_refused_with_a_retry_hint() {
    let mut h = harness(OrgLimits {
        requests_per_minute: Some(2),
        tokens_per_minute: None,
    });
    // Two connections from one address share its budget.
    let a = open(
        &mut h,
        1,
        Dialect::Generate,
        Transport::WebSocket,
        "10.0.0.1:4000",
    );
    let b = open(
        &mut h,
        2,
        Dialect::Generate,
        Transport::WebSocket,
        "10.0.0.1:4001",
    );
    assert_eq!(generate(&mut h, a)["type"], "completion");
    assert_eq!(generate(&mut h, b)["type"], "completion");
    let refused = generate(&mut h, a);
    assert_eq!(refused["error"], "rate_limited", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("retry in")),
        "{refused}"
    );
    // Another address (IPv6, with its brackets) is not affected.
    let c = open(
        &mut h,
        3,
        Dialect::Generate,
        Transport::WebSocket,
        "[::1]:5000",
    );
    assert_eq!(generate(&mut h, c)["type"], "completion");
    // Over HTTP too: a 429 with the API's code.
    let chat = open(&mut h, 4, Dialect::Chat, Transport::Http, "10.0.0.1:4002");
    h.send(
        chat,
        json!({"route": "chat", "body": {"model": "tiny", "max_tokens": 2,
               "messages": [{"role": "user", "content": "hi"}]}}),
    );
    h.run(50);
    let r = h.received(chat).last().cloned().expect("reply");
    assert_eq!(r["status"], 429, "{r}");
    assert_eq!(r["data"]["error"]["code"], "rate_limit_exceeded", "{r}");
    // A minute later the address may start again.
    h.advance(Duration::from_secs(61));
    assert_eq!(generate(&mut h, a)["type"], "completion");
}

#[test]
fn tokens_per_minute_count_prompt_and_generated_tokens() {
    let mut h = harness(OrgLimits {
        requests_per_minute: None,
        tokens_per_minute: Some(10),
    });
    let a = open(
        &mut h,
        1,
        Dialect::Generate,
        Transport::WebSocket,
        "10.0.0.9:1",
    );
    // Prompt (BOS + 2) and 2 generated tokens: 5 of 10.
    assert_eq!(generate(&mut h, a)["type"], "completion");
    assert_eq!(generate(&mut h, a)["type"], "completion");
    let refused = generate(&mut h, a);
    assert_eq!(refused["error"], "rate_limited", "{refused}");
}

#[test]
fn without_limits_nothing_is_refused() {
    let mut h = harness(OrgLimits::default());
    let a = open(
        &mut h,
        1,
        Dialect::Generate,
        Transport::WebSocket,
        "10.0.0.1:4000",
    );
    for _ in 0..20 {
        assert_eq!(generate(&mut h, a)["type"], "completion");
    }
}
