//! `tokenwire serve --backend wgpu --model stories260K` streams the golden text
//! over the `generate` dialect (on Mesa's lavapipe in CI, on a GPU elsewhere).

use serde_json::{json, Value};
use tokenwire_io::config::Backend;
use tokenwire_tests::{
    stories260k, stories_reference, token_text, Client, ModelSource, ServerConfig,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wgpu_backend_streams_the_stories260k_golden_text() {
    let dir = stories260k();
    let reference = stories_reference(&dir);
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        model: ModelSource::Dir(dir),
        backend: Backend::Wgpu,
        ..ServerConfig::default()
    };
    let server = match tokenwire_io::start(cfg).await {
        Ok(s) => s,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: no wgpu adapter here ({e:#})");
            return;
        }
        Err(e) => panic!("CI=true but the wgpu backend did not start: {e:#}"),
    };
    let mut c = Client::connect(&server, "/generate").await;
    c.send(json!({"type": "config", "prompt": "Once upon a time",
                  "parameters": {"max_tokens": 64, "temperature": 0},
                  "options": {"include_token_ids": true}}))
        .await;
    let frames = c.recv_until(&["completion", "error"]).await;
    let ids: Vec<u64> = frames
        .iter()
        .filter_map(|f| f["token_id"].as_u64())
        .collect();
    // `greedy_ids` holds the prompt's ids then the 64 generated ones.
    let all: Vec<u64> = reference["greedy_ids"]
        .as_array()
        .expect("golden ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(ids, all[all.len() - 64..].to_vec());
    let full = reference["full_text"].as_str().expect("full text");
    assert_eq!(format!("Once upon a time{}", token_text(&frames)), full);
    assert_eq!(
        frames.last().map(|f| f["finish_reason"].clone()),
        Some(json!("length"))
    );
    server.shutdown().await;
}
