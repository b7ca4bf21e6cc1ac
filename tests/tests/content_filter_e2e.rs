//! `--content-filter` over real sockets on stories260K: a `stop` rule on a
//! word of the greedy golden text ("outside", which stories260K writes in
//! more than one token) ends the text right before it on the WebSocket and
//! HTTP routes, its letters never sent; a `refuse` rule refuses a prompt on
//! every dialect before any compute; the metrics count both by rule name.

use serde_json::{json, Value};
use tokenwire_tests::{
    http, keys_file, metric, start, stories260k, stories_reference, token_text, Client,
    ModelSource, RunningServer,
};

const RULES: &str = r#"
[[rule]]
name = "no-outside"
pattern = "\\boutside\\b"
action = "stop"

[[rule]]
name = "no-secrets"
pattern = "top\\s+secret"
action = "refuse"
"#;

async fn server() -> RunningServer {
    let rules = std::env::temp_dir().join(format!("tokenwire-filter-{}.toml", std::process::id()));
    std::fs::write(&rules, RULES).expect("rules file");
    let keys = keys_file("filter-e2e", &[("sk-filter", &["org_a"])]);
    start(ModelSource::Dir(stories260k()), move |c| {
        c.content_filter = Some(rules);
        c.keys = Some(keys);
    })
    .await
}

/// The golden greedy text up to the filtered word.
fn before_outside() -> String {
    let golden = stories_reference(&stories260k())["greedy_text"]
        .as_str()
        .expect("golden text")
        .to_string();
    let at = golden
        .find("outside")
        .expect("the golden text has the word");
    golden[..at].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_rule_ends_the_golden_text_before_its_word_on_every_route() {
    let server = server().await;
    let want = before_outside();

    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": "Once upon a time",
                  "parameters": {"max_tokens": 64, "temperature": 0}}))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let done = frames.last().expect("completion");
    assert_eq!(done["finish_reason"], "content_filter", "{done}");
    assert_eq!(token_text(&frames), want);
    assert_eq!(done["generated_text"], want.as_str());

    let body = json!({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 64,
                      "temperature": 0, "stream": true});
    let r = http(&server, "POST", "/v1/completions", Some(&body.to_string())).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.to_lowercase().contains("outside"), "{}", r.body);
    let streamed: String = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("chunk"))
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, want);
    assert!(
        r.body.contains("\"finish_reason\":\"content_filter\""),
        "{}",
        r.body
    );

    let body = json!({"model": "stories260K", "input": "Once upon a time",
                      "max_output_tokens": 64, "temperature": 0});
    let r = http(&server, "POST", "/v1/responses", Some(&body.to_string())).await;
    let v: Value = serde_json::from_str(&r.body).expect("json");
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(v["incomplete_details"]["reason"], "content_filter", "{v}");
    assert!(!r.body.to_lowercase().contains("outside"), "{}", r.body);

    let m = http(&server, "GET", "/metrics", None).await.body;
    let stopped = metric(
        &m,
        "tokenwire_content_filtered_total{dialect=\"generate\",rule=\"no-outside\",action=\"stop\"}",
    );
    assert_eq!(stopped, Some(1.0), "{m}");
    assert!(
        !m.contains("outside\\b"),
        "metrics carry rule names, not patterns"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refuse_rule_refuses_on_every_dialect_before_any_compute() {
    let server = server().await;
    let prompt = "Tell me the top secret plan.";

    let mut g = Client::connect(&server, "/generate").await;
    g.send(json!({"type": "config", "prompt": prompt, "parameters": {"max_tokens": 8}}))
        .await;
    let e = g.recv_until(&["error", "completion"]).await;
    assert_eq!(e.last().expect("frame")["error"], "content_filter", "{e:?}");

    let mut s = Client::connect(&server, "/ws/session").await;
    s.send(
        json!({"type": "session_init", "session_id": "s", "job_id": 1, "conversation_context": []}),
    )
    .await;
    s.recv_until(&["session_ready"]).await;
    s.send(json!({"type": "prompt", "session_id": "s", "content": prompt, "message_index": 0}))
        .await;
    let e = s.recv_until(&["error", "response"]).await;
    assert_eq!(e.last().expect("frame")["code"], "content_filter", "{e:?}");

    let mut b = Client::connect(&server, "/ws").await;
    b.send(json!({"prompts": [{"request_id": "r", "prompt": prompt}]}))
        .await;
    // Accepted at once (a payload is accepted before its prompts are
    // read), then refused before it runs.
    let accepted = b.recv().await;
    assert_eq!(accepted[0]["type"], "ACCEPTED", "{accepted}");
    let refused = b.recv().await;
    assert_eq!(refused[0]["type"], "ERROR", "{refused}");
    assert!(refused.to_string().contains("content filter"), "{refused}");

    let mut c = Client::connect(&server, "/?authorization=Bearer%20sk-filter&orgId=org_a").await;
    c.send(json!({"type": "COMPLETION", "requestId": "c", "payload": {"prompt": prompt}}))
        .await;
    let e = c.recv_until(&["ERROR", "COMPLETION_RESPONSE"]).await;
    assert_eq!(
        e.last().expect("frame")["error"]["code"],
        "CONTENT_FILTERED",
        "{e:?}"
    );

    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "stories260K", "messages": [{"role": "user", "content": prompt}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "stories260K", "input": prompt}),
        ),
    ] {
        let r = http(&server, "POST", path, Some(&body.to_string())).await;
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        let v: Value = serde_json::from_str(&r.body).expect("json");
        assert_eq!(v["error"]["code"], "content_filter", "{path}: {v}");
        assert!(!r.body.contains("secret plan"), "{}", r.body);
    }

    let m = http(&server, "GET", "/metrics", None).await.body;
    let generated = metric(&m, "tokenwire_prompt_tokens_total").unwrap_or(0.0);
    assert_eq!(generated, 0.0, "nothing was computed: {m}");
    let refused = metric(
        &m,
        "tokenwire_content_filtered_total{dialect=\"chat\",rule=\"no-secrets\",action=\"refuse\"}",
    );
    assert_eq!(refused, Some(1.0), "{m}");
    server.shutdown().await;
}
