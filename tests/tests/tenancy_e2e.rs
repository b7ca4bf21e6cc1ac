//! Tenancy, keys and bounds over real sockets (PROTOCOLS.md: Keys, Tenancy,
//! Bounds, Browser origins): what one client keeps is found by no other,
//! `--auth all` refuses every route without a key before any work, foreign
//! browser origins are refused at the upgrade, and one address cannot take
//! every connection.

use serde_json::{json, Value};
use tokenwire_tests::{
    http, http_with, keys_file, start, stories260k, Client, ModelSource, RunningServer,
};

const ALICE: &str = "sk-alice-0123456789";
const BOB: &str = "sk-bob-0123456789";

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

async fn keyed_server(name: &str, all: bool) -> RunningServer {
    let keys = keys_file(name, &[(ALICE, &["org_a"]), (BOB, &["org_b"])]);
    start(ModelSource::Dir(stories260k()), move |c| {
        c.keys = Some(keys);
        if all {
            c.tenancy.auth = tokenwire_io::tenancy::Auth::All;
            c.tenancy.metrics_auth = true;
        }
    })
    .await
}

fn batch(id: &str, prompt: &str, only_new: bool) -> Value {
    json!({"prompts": [{"request_id": id, "prompt": prompt}],
           "generation_config": {"max_new_tokens": 4, "do_sample": false},
           "only_new_tokens": only_new, "stream_response": false})
}

/// Frames until `id` completes or errs; the COMPLETE (or ERROR) element.
async fn batch_end(c: &mut Client, id: &str) -> Value {
    loop {
        let f = c.recv().await;
        let items = f.as_array().cloned().unwrap_or_default();
        if let Some(e) = items
            .iter()
            .find(|e| e["request_id"] == id && (e["type"] == "COMPLETE" || e["type"] == "ERROR"))
        {
            return e.clone();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_naming_a_batch_id_gets_only_its_own_text() {
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let mut alice = Client::connect(&server, "/ws").await;
    alice.send(batch("1", "Once upon a time", true)).await;
    let first = batch_end(&mut alice, "1").await;
    assert_eq!(first["type"], "COMPLETE", "{first}");
    // The attack: same id, another connection, the whole text asked for.
    let mut mallory = Client::connect(&server, "/ws").await;
    mallory.send(batch("1", "The", false)).await;
    let got = batch_end(&mut mallory, "1").await;
    let text = got["text"].as_str().unwrap_or("");
    assert!(text.starts_with("The"), "mallory's own prompt: {got}");
    assert!(
        !text.contains("Once upon a time"),
        "alice's text leaked: {text}"
    );
    // Alice still continues her own.
    alice.send(batch("1", "IGNORED", false)).await;
    let cont = batch_end(&mut alice, "1").await;
    let whole = cont["text"].as_str().unwrap_or("");
    assert!(whole.starts_with("Once upon a time"), "{cont}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_is_read_only_by_the_key_that_made_it() {
    let server = keyed_server("responses", false).await;
    let body =
        json!({"input": "Once upon a time", "max_output_tokens": 3, "temperature": 0}).to_string();
    let alice = [("Authorization", bearer(ALICE))];
    let alice: Vec<(&str, &str)> = alice.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let made = http_with(&server, "POST", "/v1/responses", Some(&body), &alice).await;
    assert_eq!(made.status, 200, "{}", made.body);
    let id = made.json()["id"].as_str().expect("id").to_string();
    let path = format!("/v1/responses/{id}");
    let mine = http_with(&server, "GET", &path, None, &alice).await;
    assert_eq!(mine.status, 200);
    let bob = bearer(BOB);
    for headers in [vec![("Authorization", bob.as_str())], vec![]] {
        let other = http_with(&server, "GET", &path, None, &headers).await;
        assert_eq!(other.status, 404, "{headers:?}: {}", other.body);
        let never = http_with(&server, "GET", "/v1/responses/resp_nope", None, &headers).await;
        assert_eq!(
            other.json()["error"]["code"],
            never.json()["error"]["code"],
            "the same answer as an id never used"
        );
        let cont =
            json!({"input": "x", "previous_response_id": id, "max_output_tokens": 1}).to_string();
        let r = http_with(&server, "POST", "/v1/responses", Some(&cont), &headers).await;
        assert_eq!(r.status, 404, "{}", r.body);
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_all_refuses_every_route_without_a_key_before_any_work() {
    let server = keyed_server("all", true).await;
    // WebSocket upgrades: 401, whatever the dialect (cai keeps its closes).
    for path in ["/generate", "/ws/session", "/v1/responses", "/ws"] {
        let refused = Client::try_connect(&server, path, &[]).await.err();
        assert_eq!(refused, Some(401), "{path}");
        let wrong = bearer("sk-wrong");
        let refused = Client::try_connect(&server, path, &[("Authorization", &wrong)])
            .await
            .err();
        assert_eq!(refused, Some(401), "{path} with an unknown key");
    }
    let alice = bearer(ALICE);
    let mut c = Client::connect_with(&server, "/generate", &[("Authorization", &alice)]).await;
    c.send(json!({"type": "config", "prompt": "Once", "parameters": {"max_tokens": 2}}))
        .await;
    assert_eq!(c.recv().await["type"], "init");
    // The query parameter works as the header does (browsers).
    let q = format!("/ws/session?authorization=Bearer%20{ALICE}");
    Client::connect(&server, &q).await;
    // HTTP routes: 401 in each dialect's own error shape.
    let body = json!({"prompt": "Once", "max_tokens": 2}).to_string();
    let r = http(&server, "POST", "/v1/generate", Some(&body)).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    assert_eq!(r.json()["error"], "invalid_request");
    let r = http(&server, "POST", "/v1/responses", Some("{}")).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = http(&server, "POST", "/v1/inference", Some(&body)).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["code"], "invalid_request");
    // The OpenAI routes and vLLM's tokenizer routes beside them.
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/tokenize",
        "/detokenize",
    ] {
        let r = http(
            &server,
            "POST",
            path,
            Some(r#"{"prompt": "Once", "tokens": [1]}"#),
        )
        .await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key", "{path}");
    }
    let ok = http_with(
        &server,
        "POST",
        "/v1/generate",
        Some(&body),
        &[("Authorization", &alice)],
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    // /health stays open; /metrics takes --metrics-auth.
    assert_eq!(http(&server, "GET", "/health", None).await.status, 200);
    assert_eq!(http(&server, "GET", "/metrics", None).await.status, 401);
    let m = http_with(
        &server,
        "GET",
        "/metrics",
        None,
        &[("Authorization", &alice)],
    )
    .await;
    assert_eq!(m.status, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keys_sessions_collide_across_its_connections_and_no_one_elses() {
    let server = keyed_server("sessions", false).await;
    let alice = bearer(ALICE);
    let h = [("Authorization", alice.as_str())];
    let init =
        json!({"type":"session_init","session_id":"s","job_id":"j","conversation_context":[]});
    let mut a1 = Client::connect_with(&server, "/ws/session", &h).await;
    let mut a2 = Client::connect_with(&server, "/ws/session", &h).await;
    let mut anon = Client::connect(&server, "/ws/session").await;
    a1.send(init.clone()).await;
    assert_eq!(a1.recv().await["type"], "session_ready");
    a2.send(init.clone()).await;
    assert_eq!(
        a2.recv().await["code"],
        "session_exists",
        "the same principal"
    );
    anon.send(init).await;
    assert_eq!(
        anon.recv().await["type"],
        "session_ready",
        "another principal's id says nothing"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_origins_other_than_the_servers_own_are_refused_unless_listed() {
    let server = start(ModelSource::Dir(stories260k()), |c| {
        c.tenancy.allowed_origins = vec!["https://app.example".into()];
    })
    .await;
    let own = format!("http://{}", server.local_addr);
    for (origin, allowed) in [
        ("https://evil.example", false),
        ("null", false),
        ("https://app.example", true),
        (own.as_str(), true),
    ] {
        let r = Client::try_connect(&server, "/generate", &[("Origin", origin)]).await;
        assert_eq!(r.is_ok(), allowed, "{origin}");
        if !allowed {
            assert_eq!(r.err(), Some(403), "{origin}");
        }
    }
    // SDKs and tools send no Origin.
    Client::connect(&server, "/generate").await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let server = start(ModelSource::Dir(stories260k()), |c| {
        c.tenancy.max_connections_per_ip = 3;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(Client::connect(&server, "/generate").await);
    }
    let r = http(&server, "GET", "/health", None).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("this address"), "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    // A slot comes back when a connection goes.
    held.pop().expect("one").close().await;
    // Its task lets the slot go right after the close; each try is a real
    // request, so this waits for that event, bounded.
    let deadline = std::time::Instant::now() + tokenwire_tests::WAIT;
    while http(&server, "GET", "/health", None).await.status != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the freed slot is usable again"
        );
    }
    server.shutdown().await;
}
