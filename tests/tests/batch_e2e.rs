//! The `batch` dialect end to end: a real server on a loopback port, a real
//! WebSocket client and the stories260K model: the event arrays, greedy text
//! against the golden reference, continuing a batch (which extends each
//! sequence exactly), validation errors, queued payloads and the server's
//! `generation_config` defaults.

use serde_json::{json, Value};
use tokenwire_core::dialect::batch::BEAMS_WITH_STREAMER;
use tokenwire_tests::{
    http, metric, start, stories260k, stories_reference, Client, ModelSource, RunningServer,
};

fn payload(prompts: &[(&str, &str)], config: Value, extra: Value) -> Value {
    let mut p = json!({
        "prompts": prompts.iter().map(|(id, p)| json!({"request_id": id, "prompt": p})).collect::<Vec<_>>(),
        "generation_config": config,
    });
    if let (Value::Object(m), Value::Object(e)) = (&mut p, extra) {
        m.extend(e);
    }
    p
}

/// Frames until every one of `ids` has a COMPLETE or ERROR element.
async fn until_done(c: &mut Client, ids: &[&str]) -> Vec<Value> {
    let mut frames = Vec::new();
    let mut left: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    while !left.is_empty() {
        let f = c.recv().await;
        let items = f.as_array().expect("every frame is an array").clone();
        assert!(!items.is_empty());
        for e in &items {
            if e["type"] == "COMPLETE" || e["type"] == "ERROR" {
                left.retain(|id| e["request_id"] != id.as_str());
            }
        }
        frames.push(f);
    }
    frames
}

/// A sample of the server's `/metrics` (0 when absent).
async fn sample(server: &RunningServer, name: &str) -> f64 {
    let m = http(server, "GET", "/metrics", None).await;
    metric(&m.body, &format!("{name} ")).unwrap_or(0.0)
}

fn kind(f: &Value) -> String {
    f[0]["type"].as_str().unwrap_or("").to_string()
}

fn element(frames: &[Value], kind: &str, rid: &str) -> Value {
    frames
        .iter()
        .flat_map(|f| f.as_array().cloned().unwrap_or_default())
        .find(|e| e["type"] == kind && e["request_id"] == rid)
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_streams_event_arrays_and_continuing_it_extends_each_sequence_exactly() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let golden = reference["full_text"]
        .as_str()
        .expect("full_text")
        .to_string();
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&server, "/ws").await;
    let greedy = json!({"do_sample": false, "max_new_tokens": 32});
    c.send(payload(
        &[("a", "Once upon a time"), ("b", "Lily and Ben")],
        greedy.clone(),
        json!({}),
    ))
    .await;
    let frames = until_done(&mut c, &["a", "b"]).await;
    let kinds: Vec<String> = frames.iter().map(kind).collect();
    assert_eq!(
        kinds[..3],
        ["ACCEPTED", "STARTED", "INITIALIZED"],
        "{kinds:?}"
    );
    for f in &frames {
        let ids: Vec<&str> = f
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["request_id"].as_str())
            .collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "payload order in {f}");
    }
    let progress: Vec<&Value> = frames.iter().filter(|f| kind(f) == "PROGRESS").collect();
    assert_eq!(progress.len(), 32, "one PROGRESS frame per decode step");
    assert!(progress
        .iter()
        .all(|f| f.as_array().map(Vec::len) == Some(2)));
    let a = element(&frames, "COMPLETE", "a");
    assert_eq!(a["new_tokens_count"], 32);
    assert_eq!(a["is_eos"], false);
    assert!(a["execution_time"].as_f64().is_some_and(|t| t > 0.0));
    let first = a["text"].as_str().unwrap_or("").to_string();
    assert!(
        golden.starts_with(&format!("Once upon a time{first}")),
        "{first}"
    );
    let streamed: String = progress
        .iter()
        .filter_map(|f| f[0]["text"].as_str())
        .collect();
    assert_eq!(streamed, first);

    // Both sequences' KV blocks are kept for a continuation.
    let prompt_tokens = sample(&server, "tokenwire_prompt_tokens_total").await;
    assert!(sample(&server, "tokenwire_kv_blocks_kept").await > 0.0);

    // The same ids in the same order continue both sequences (the prompts
    // are ignored) from their kept blocks, feeding only each one's last
    // token; the whole text from the original prompt on is the golden
    // 64-token greedy text.
    c.send(payload(
        &[("a", "ignored"), ("b", "ignored")],
        greedy.clone(),
        json!({"only_new_tokens": false}),
    ))
    .await;
    let frames = until_done(&mut c, &["a", "b"]).await;
    let init = element(&frames, "INITIALIZED", "a");
    assert_eq!(init["text"], format!("Once upon a time{first}"));
    let whole = element(&frames, "COMPLETE", "a")["text"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert_eq!(whole, golden);
    assert_eq!(
        sample(&server, "tokenwire_prompt_tokens_reused_total").await,
        prompt_tokens + 2.0 * 31.0,
        "every token of both sequences but the last was reused"
    );
    // Another order is another key: the prompts are used again.
    c.send(payload(
        &[("b", "Once upon a time"), ("a", "Once upon a time")],
        greedy,
        json!({"stream_response": false}),
    ))
    .await;
    let frames = until_done(&mut c, &["a", "b"]).await;
    assert!(frames.iter().all(|f| kind(f) != "PROGRESS"));
    assert_eq!(element(&frames, "COMPLETE", "a")["text"], first.as_str());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_blocks_give_way_to_new_work_and_a_continuation_recomputes_them_exactly() {
    let dir = stories260k();
    let golden = stories_reference(&dir)["full_text"]
        .as_str()
        .expect("full_text")
        .to_string();
    // 7 blocks of 16 positions. "Once upon a time" is 5 tokens with BOS.
    let server = start(ModelSource::Dir(dir), |c| c.kv_blocks = Some(7)).await;
    let mut c = Client::connect(&server, "/ws").await;
    let greedy = |n: u32| json!({"do_sample": false, "max_new_tokens": n});
    let once = "Once upon a time";
    c.send(payload(&[("a", once), ("b", once)], greedy(32), json!({})))
        .await;
    until_done(&mut c, &["a", "b"]).await;
    // 36 computed positions each: 3 blocks each kept, one block free.
    assert_eq!(sample(&server, "tokenwire_kv_blocks_kept").await, 6.0);
    // 17 computed positions need 2 blocks: a's kept blocks (the oldest)
    // are freed for this new request.
    c.send(payload(&[("c", once)], greedy(13), json!({}))).await;
    let frames = until_done(&mut c, &["c"]).await;
    assert!(golden.starts_with(&format!(
        "{once}{}",
        element(&frames, "COMPLETE", "c")["text"]
            .as_str()
            .unwrap_or("?")
    )));
    assert_eq!(
        sample(&server, "tokenwire_kv_blocks_kept").await,
        5.0,
        "b's 3 and c's 2"
    );
    // Continuing a and b: a is recomputed from its token ids, b goes on
    // from its kept blocks; both texts are exactly the golden ones.
    c.send(payload(
        &[("a", "-"), ("b", "-")],
        greedy(32),
        json!({"only_new_tokens": false}),
    ))
    .await;
    let frames = until_done(&mut c, &["a", "b"]).await;
    for rid in ["a", "b"] {
        assert_eq!(element(&frames, "COMPLETE", rid)["text"], golden.as_str());
    }
    assert_eq!(
        sample(&server, "tokenwire_prompt_tokens_reused_total").await,
        36.0,
        "only b's blocks were still kept"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_queued_payloads_and_the_servers_defaults() {
    let dir = stories260k();
    let server = start(ModelSource::Dir(dir), |c| {
        c.host.batch_defaults.max_new_tokens = 5;
    })
    .await;
    let mut c = Client::connect(&server, "/ws").await;
    c.send_text("{nope").await;
    let e = c.recv().await;
    assert_eq!(
        (e[0]["type"].as_str(), e[0]["request_id"].is_null()),
        (Some("ERROR"), true)
    );
    c.send(payload(
        &[("a", "x"), ("b", "y")],
        json!({"num_beams": 3}),
        json!({}),
    ))
    .await;
    let e = c.recv().await;
    assert_eq!(e.as_array().map(Vec::len), Some(2));
    assert_eq!(e[0]["error"], BEAMS_WITH_STREAMER);
    assert_eq!(e[1]["request_id"], "b");
    c.send_binary(vec![0; 4]).await;
    assert_eq!(c.recv().await[0]["type"], "ERROR");
    // Three payloads queued at once, one with a duplicate id, all on the
    // server's default of 5 new tokens; they start in arrival order.
    c.send(payload(&[("p1", "Once")], json!({}), json!({})))
        .await;
    c.send(payload(
        &[("p2", "Once"), ("p2", "again")],
        json!({}),
        json!({}),
    ))
    .await;
    c.send(payload(&[("p3", "Once")], json!({}), json!({})))
        .await;
    let frames = until_done(&mut c, &["p1", "p2", "p3"]).await;
    let started: Vec<&str> = frames
        .iter()
        .filter(|f| kind(f) == "STARTED")
        .flat_map(|f| f.as_array().into_iter().flatten())
        .filter_map(|e| e["request_id"].as_str())
        .collect();
    assert_eq!(
        started,
        ["p1", "p3"],
        "none of a duplicated id's prompts run"
    );
    let dup: Vec<&Value> = frames.iter().filter(|f| kind(f) == "ERROR").collect();
    assert_eq!(dup.len(), 1);
    assert!(dup[0][0]["error"]
        .as_str()
        .unwrap_or("")
        .contains("duplicate"));
    for id in ["p1", "p3"] {
        assert_eq!(
            element(&frames, "COMPLETE", id)["new_tokens_count"],
            5,
            "{id}"
        );
    }
    assert!(
        frames
            .iter()
            .flat_map(|f| f.as_array().into_iter().flatten())
            .all(|e| !(e["request_id"] == "p2" && e["type"] == "COMPLETE")),
        "a duplicated id never completes"
    );
    server.shutdown().await;
}

/// Beam search over the socket against Hugging Face transformers'
/// `generate(num_beams=..., early_stopping=...)` on stories260K: the golden
/// cases that use the model's own EOS ids (those with "." as an extra EOS
/// are checked on the search machine alone, kernels/tests/beam_goldens.rs).
/// The beams share KV blocks copy-on-write through the scheduler's forks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_search_matches_transformers_over_the_socket() {
    let dir = stories260k();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/goldens/stories260k_beams.json"
    );
    let goldens: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("goldens")).expect("JSON");
    let server = start(ModelSource::Dir(dir), |_| {}).await;
    let mut c = Client::connect(&server, "/ws").await;
    let mut checked = 0;
    let mut differ = 0;
    for case in goldens["cases"].as_array().expect("cases") {
        if case["eos_ids"] != json!([2, 1]) {
            continue;
        }
        let prompt = case["prompt"].as_str().expect("prompt");
        // A new id each time: the same id would continue the last batch.
        let rid = format!("beam-{checked}");
        c.send(payload(
            &[(rid.as_str(), prompt)],
            json!({"do_sample": false, "num_beams": case["num_beams"],
                   "length_penalty": case["length_penalty"],
                   "early_stopping": case["early_stopping"],
                   "max_new_tokens": case["max_new_tokens"]}),
            json!({"stream_response": false}),
        ))
        .await;
        let frames = until_done(&mut c, &[rid.as_str()]).await;
        let done = element(&frames, "COMPLETE", &rid);
        assert_eq!(done["type"], "COMPLETE", "{frames:?}");
        assert_eq!(done["text"], case["text"], "{case}");
        assert_eq!(
            done["new_tokens_count"].as_u64(),
            case["ids"].as_array().map(|a| a.len() as u64)
        );
        if case["ids"] != case["greedy_ids"] {
            differ += 1;
        }
        checked += 1;
    }
    assert!(
        checked >= 12 && differ * 2 >= checked,
        "{checked} checked, {differ} differ from greedy"
    );
    // Several prompts of one payload run their searches side by side.
    c.send(payload(
        &[("x", "Once upon a time"), ("y", "Lily and Ben")],
        json!({"do_sample": false, "num_beams": 3, "max_new_tokens": 24}),
        json!({"stream_response": false}),
    ))
    .await;
    let frames = until_done(&mut c, &["x", "y"]).await;
    assert_eq!(element(&frames, "COMPLETE", "x")["new_tokens_count"], 24);
    assert_eq!(element(&frames, "COMPLETE", "y")["new_tokens_count"], 24);
    server.shutdown().await;
}
