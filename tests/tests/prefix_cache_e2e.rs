//! Prefix caching end to end (PROTOCOLS.md: Prefix caching): over real
//! sockets, with stories260K on the CPU engine, every dialect's repeated
//! prefixes are served from cached KV blocks (`generate`'s timing,
//! `responses`' usage and `/metrics` say how many tokens), and every text is
//! exactly the text a server with `--prefix-cache off` produces for the same
//! requests in the same order (greedy and seeded sampling).

use serde_json::{json, Value};
use tokenwire_tests::{
    http, keys_file, metric, start, stories260k, token_text, Client, ModelSource, RunningServer,
};

/// A prompt of well over four 16-token blocks in stories260K's vocabulary.
const STORY: &str = "Once upon a time, there was a little girl named Lily. She loved to play \
                     outside in the sunshine with her dog, Max. Every morning they ran to the \
                     big tree by the river and looked at the birds and the fish. One day, ";

const KEY: &str = "sk-prefix-0123456789";

/// A server with the prefix cache on or off; `test` names its keys file
/// (each test its own: they run at once).
async fn server(test: &str, cache: bool) -> RunningServer {
    let keys = keys_file(&format!("prefix-{test}-{cache}"), &[(KEY, &["org_a"])]);
    start(ModelSource::Dir(stories260k()), move |c| {
        c.host.prefix_cache = cache;
        c.keys = Some(keys);
    })
    .await
}

/// `(queries, hits)`: prompt tokens looked up in the prefix cache and found.
async fn cache_counters(server: &RunningServer) -> (f64, f64) {
    let m = http(server, "GET", "/metrics", None).await.body;
    let read = |name: &str| metric(&m, name).unwrap_or(-1.0);
    (
        read("tokenwire_prefix_cache_queries_total"),
        read("tokenwire_prefix_cache_hits_total"),
    )
}

/// What one scenario produced: every text in order, and the cached prompt
/// tokens each request reported where its dialect reports them.
#[derive(Debug, Default)]
struct Run {
    texts: Vec<String>,
    cached: Vec<u64>,
}

async fn generate_ws(c: &mut Client, prompt: &str, params: Value, run: &mut Run) {
    c.send(
        json!({"type": "config", "prompt": prompt, "parameters": params,
                  "options": {"include_timing": true}}),
    )
    .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let done = frames.last().expect("completion");
    assert_eq!(done["type"], "completion", "{done}");
    run.texts.push(token_text(&frames));
    run.cached.push(
        done["timing"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens"),
    );
}

async fn generate(server: &RunningServer) -> Run {
    let mut run = Run::default();
    let greedy = json!({"max_tokens": 12, "temperature": 0});
    let seeded = json!({"max_tokens": 12, "temperature": 0.8, "seed": 42});
    let mut a = Client::connect(server, "/generate").await;
    generate_ws(&mut a, STORY, greedy.clone(), &mut run).await;
    // Another client, the same prompt: a shared system prompt.
    let mut b = Client::connect(server, "/generate").await;
    generate_ws(&mut b, STORY, greedy, &mut run).await;
    generate_ws(&mut b, STORY, seeded, &mut run).await;
    // A longer prompt that starts with the first (a raw conversation's
    // next turn).
    let next = format!("{STORY}{} Then they went home.", run.texts[0]);
    generate_ws(
        &mut a,
        &next,
        json!({"max_tokens": 12, "temperature": 0}),
        &mut run,
    )
    .await;
    // `regenerate`: the same prompt again, by the same client.
    a.send(json!({"type": "config", "prompt": STORY,
                  "parameters": {"max_tokens": 12, "temperature": 0.8, "seed": 7},
                  "options": {"include_timing": true}}))
        .await;
    let init = a.recv().await;
    assert_eq!(init["type"], "init", "{init}");
    a.send(json!({"type": "control", "action": "regenerate"}))
        .await;
    let frames = a.recv_until(&["completion", "error"]).await;
    let done = frames.last().expect("completion");
    assert_eq!(done["type"], "completion", "{done}");
    assert_ne!(
        done["request_id"], init["request_id"],
        "the regenerated one"
    );
    let after_init = frames
        .iter()
        .rposition(|f| f["type"] == "init")
        .expect("the new init");
    run.texts.push(token_text(&frames[after_init..]));
    run.cached
        .push(done["timing"]["cached_tokens"].as_u64().unwrap_or(0));
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_reuses_shared_prefixes_and_streams_the_cold_text() {
    let on = server("generate", true).await;
    let off = server("generate", false).await;
    let cached = generate(&on).await;
    let cold = generate(&off).await;
    assert_eq!(cached.texts, cold.texts, "the cache changes no token");
    assert!(cold.cached.iter().all(|&n| n == 0), "{:?}", cold.cached);
    assert_eq!(cached.cached[0], 0, "nothing cached before the first");
    for (i, &n) in cached.cached.iter().enumerate().skip(1) {
        assert!(n >= 48 && n % 16 == 0, "request {i}: {n} cached tokens");
    }
    assert!(
        cached.cached[3] > cached.cached[1],
        "the next turn reuses its turn's reply too: {:?}",
        cached.cached
    );
    let (queries, hits) = cache_counters(&on).await;
    let total: u64 = cached.cached.iter().sum();
    // The timings' sum, and the regenerated request's own lookup if it was
    // admitted before `regenerate` arrived.
    let unreported = hits - total as f64;
    assert!(
        unreported >= 0.0 && unreported % 16.0 == 0.0 && unreported <= cached.cached[4] as f64,
        "/metrics counts {hits} hits, the timings {total}"
    );
    assert!(queries > hits, "{queries} queried, {hits} hit");
    assert_eq!(cache_counters(&off).await.1, 0.0);
    on.shutdown().await;
    off.shutdown().await;
}

async fn session(server: &RunningServer) -> Run {
    let mut run = Run::default();
    let mut c = Client::connect(server, "/ws/session").await;
    c.send(
        json!({"type":"session_init","session_id":"s","job_id":"job-1",
                  "conversation_context":[{"role":"system","content":STORY}]}),
    )
    .await;
    assert_eq!(c.recv().await["type"], "session_ready");
    for (turn, said) in ["Lily ran to the park.", "Max barked.", "They played."]
        .iter()
        .enumerate()
    {
        c.send(json!({"type":"prompt","session_id":"s","content":said,
                      "message_index": 2 * turn,"max_tokens":10,"temperature":0}))
            .await;
        let frames = c.recv_until(&["response", "error"]).await;
        let last = frames.last().expect("response");
        assert_eq!(last["type"], "response", "{last}");
        run.texts
            .push(last["content"].as_str().unwrap_or("").to_string());
    }
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_turns_start_from_the_previous_turns_blocks() {
    let on = server("session", true).await;
    let off = server("session", false).await;
    let cached = session(&on).await;
    let cold = session(&off).await;
    assert_eq!(cached.texts, cold.texts);
    let (queries, hits) = cache_counters(&on).await;
    // Turns 2 and 3 find at least the system prompt's blocks.
    assert!(hits >= 2.0 * 48.0, "{hits} of {queries} prompt tokens hit");
    assert_eq!(cache_counters(&off).await.1, 0.0);
    on.shutdown().await;
    off.shutdown().await;
}

async fn responses(server: &RunningServer) -> Run {
    let mut run = Run::default();
    let mut c = Client::connect(server, "/v1/responses").await;
    let mut previous: Option<String> = None;
    for input in [STORY, "Lily ran to the park.", "Max barked."] {
        let mut create = json!({"type":"response.create","input":input,
                                "max_output_tokens":10,"temperature":0});
        if let Some(id) = &previous {
            create["previous_response_id"] = json!(id);
        }
        c.send(create).await;
        let end = loop {
            let e = c.recv().await;
            assert_ne!(e["type"], "error", "{e}");
            if e["type"] == "response.completed" || e["type"] == "response.incomplete" {
                break e;
            }
        };
        let r = &end["response"];
        run.texts.push(
            r["output"][0]["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        run.cached.push(
            r["usage"]["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached_tokens"),
        );
        previous = r["id"].as_str().map(str::to_string);
    }
    // Over HTTP: a continuation of the WebSocket's last response is not
    // found (the socket's are its own), so a stored HTTP chain instead.
    let mut previous: Option<String> = None;
    for input in [STORY, "The end."] {
        let mut body = json!({"input": input, "max_output_tokens": 6, "temperature": 0});
        if let Some(id) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let r = http(server, "POST", "/v1/responses", Some(&body.to_string())).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        run.texts.push(
            v["output"][0]["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        run.cached.push(
            v["usage"]["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached_tokens"),
        );
        previous = v["id"].as_str().map(str::to_string);
    }
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_report_the_real_cached_tokens_over_websocket_and_http() {
    let on = server("responses", true).await;
    let off = server("responses", false).await;
    let cached = responses(&on).await;
    let cold = responses(&off).await;
    assert_eq!(cached.texts, cold.texts);
    assert!(cold.cached.iter().all(|&n| n == 0), "{:?}", cold.cached);
    assert_eq!(cached.cached[0], 0);
    // Continuations over WebSocket, then HTTP's first request (the same
    // prompt as the socket's first) and its continuation.
    for (i, &n) in cached.cached.iter().enumerate().skip(1) {
        assert!(n >= 48 && n % 16 == 0, "request {i}: {:?}", cached.cached);
    }
    assert!(cached.cached[2] > cached.cached[1], "{:?}", cached.cached);
    on.shutdown().await;
    off.shutdown().await;
}

async fn batch(server: &RunningServer) -> Run {
    let mut run = Run::default();
    let mut c = Client::connect(server, "/ws").await;
    for (id, sample) in [("a", false), ("b", false), ("c", true)] {
        c.send(json!({"prompts": [{"request_id": id, "prompt": STORY}],
                      "generation_config": {"max_new_tokens": 10, "do_sample": sample,
                                            "temperature": 0.8},
                      "only_new_tokens": true, "stream_response": false}))
            .await;
        let done = loop {
            let f = c.recv().await;
            let items = f.as_array().cloned().unwrap_or_default();
            if let Some(e) = items.iter().find(|e| e["request_id"] == id) {
                if e["type"] == "COMPLETE" || e["type"] == "ERROR" {
                    break e.clone();
                }
            }
        };
        assert_eq!(done["type"], "COMPLETE", "{done}");
        run.texts
            .push(done["text"].as_str().unwrap_or("").to_string());
    }
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_prompts_sharing_a_prefix_share_its_blocks() {
    let on = server("batch", true).await;
    let off = server("batch", false).await;
    let cached = batch(&on).await;
    let cold = batch(&off).await;
    assert_eq!(cached.texts, cold.texts);
    let (_, hits) = cache_counters(&on).await;
    assert!(hits >= 2.0 * 48.0, "{hits} prompt tokens hit");
    assert_eq!(cache_counters(&off).await.1, 0.0);
    on.shutdown().await;
    off.shutdown().await;
}

async fn cai(server: &RunningServer) -> Run {
    let mut run = Run::default();
    let path = format!("/?authorization=Bearer%20{KEY}&orgId=org_a");
    let mut c = Client::connect(server, &path).await;
    for (rid, said) in [
        ("t1", STORY),
        ("t2", "Lily ran to the park."),
        ("t3", "Max barked."),
    ] {
        c.send(
            json!({"type":"COMPLETION","requestId":rid,"payload":{"prompt":said,
                      "conversationId":"c1",
                      "options":{"maxTokens":8,"stream":false,"temperature":0}}}),
        )
        .await;
        let done = c.recv().await;
        assert_eq!(done["type"], "STREAM_COMPLETE", "{done}");
        run.texts.push(
            done["payload"]["fullContent"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
    }
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cai_conversation_turns_reuse_the_earlier_turns() {
    let on = server("cai", true).await;
    let off = server("cai", false).await;
    let cached = cai(&on).await;
    let cold = cai(&off).await;
    assert_eq!(cached.texts, cold.texts);
    assert!(cached.texts.iter().all(|t| !t.is_empty()), "{cached:?}");
    let (_, hits) = cache_counters(&on).await;
    assert!(hits >= 2.0 * 48.0, "{hits} prompt tokens hit");
    assert_eq!(cache_counters(&off).await.1, 0.0);
    on.shutdown().await;
    off.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_under_memory_pressure_changes_only_time() {
    // 24 blocks: room for about two of these prompts at once, so later
    // prompts evict earlier ones' cached blocks.
    let server = start(ModelSource::Dir(stories260k()), |c| c.kv_blocks = Some(24)).await;
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("Story number {i}. {STORY}{STORY}"))
        .collect();
    let mut c = Client::connect(&server, "/generate").await;
    let greedy = json!({"max_tokens": 12, "temperature": 0});
    let mut first = Run::default();
    for p in &prompts {
        generate_ws(&mut c, p, greedy.clone(), &mut first).await;
    }
    let mut again = Run::default();
    for p in &prompts {
        generate_ws(&mut c, p, greedy.clone(), &mut again).await;
    }
    assert_eq!(first.texts, again.texts, "evicted or not, the same tokens");
    assert_eq!(
        again.cached.iter().filter(|&&n| n > 0).count(),
        0,
        "each prompt's blocks were evicted by the five after it: {:?}",
        again.cached
    );
    // Right after it ran, a prompt is still cached.
    generate_ws(&mut c, &prompts[5], greedy, &mut again).await;
    assert_eq!(again.texts[6], first.texts[5]);
    assert!(again.cached[6] > 0, "{:?}", again.cached);
    let m = http(&server, "GET", "/metrics", None).await.body;
    let cached_blocks = metric(&m, "tokenwire_kv_blocks_cached").unwrap_or(-1.0);
    assert!(
        (1.0..=24.0).contains(&cached_blocks),
        "{cached_blocks} blocks cached"
    );
    server.shutdown().await;
}
