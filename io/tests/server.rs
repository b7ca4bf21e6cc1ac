//! The server over real sockets, serving the built-in tiny model. Generation
//! behaviour is tested end to end in the `tests` crate; these check the shell:
//! endpoints, upgrades, limits and shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokenwire_io::{start, RunningServer, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message};

fn config() -> ServerConfig {
    ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        seed: 7,
        ..ServerConfig::default()
    }
    .with_host(|h| h.shutdown_grace = Duration::from_secs(1))
}

/// A change to a configuration's Host settings, for the struct updates below.
trait WithHost {
    fn with_host(self, change: impl FnOnce(&mut tokenwire_core::HostConfig)) -> Self;
}

impl WithHost for ServerConfig {
    fn with_host(mut self, change: impl FnOnce(&mut tokenwire_core::HostConfig)) -> Self {
        change(&mut self.host);
        self
    }
}

async fn ready(config: ServerConfig) -> RunningServer {
    start(config)
        .await
        .expect("server starts with the tiny model loaded")
}

#[derive(Debug)]
struct Resp {
    status: u16,
    head: String,
    body: String,
}

impl Resp {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Resp {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Resp { status, head, body }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

#[tokio::test]
async fn health_models_metrics_and_404() {
    let server = ready(config()).await;
    let addr = server.local_addr;

    let r = http(addr, "GET", "/health", None).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json(), serde_json::json!({"status": "ok"}));

    let r = http(addr, "GET", "/v1/models", None).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().expect("data array");
    assert_eq!(data.len(), 1, "{v}");
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["owned_by"], "tokenwire");
    assert!(data[0]["id"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(data[0]["created"]
        .as_u64()
        .is_some_and(|t| t > 1_600_000_000));

    let r = http(addr, "GET", "/metrics", None).await;
    assert_eq!(r.status, 200);
    assert!(r
        .head
        .contains("content-type: application/openmetrics-text"));
    for name in tokenwire_io::metrics::METRIC_NAMES {
        assert!(
            r.body.contains(&format!("# TYPE {name} ")),
            "{name} missing"
        );
    }

    let r = http(addr, "GET", "/nope", None).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"], "not_found");
    let r = http(addr, "GET", "/", None).await;
    assert_eq!(r.status, 200, "a plain GET / is the playground, not cai");
    assert!(r.head.contains("content-type: text/html"));
    assert!(r
        .head
        .contains("content-security-policy: default-src 'none'"));
    assert!(r.body.contains("tokenwire playground"));
    let r = http(addr, "POST", "/health", Some("{}")).await;
    assert_eq!(r.status, 405);
    assert!(r.head.contains("allow: get"));
    let r = http(addr, "GET", "/v1/generate", None).await;
    assert_eq!(r.status, 405);

    server.finish().await.expect("clean shutdown");
}

#[tokio::test]
async fn start_loading_returns_before_the_model_is_ready() {
    let server = tokenwire_io::start_loading(config())
        .await
        .expect("listening");
    // The model may or may not be loaded yet; either answer is well formed.
    let r = http(server.local_addr, "GET", "/health", None).await;
    match r.status {
        200 => assert_eq!(r.json()["status"], "ok"),
        503 => {
            assert_eq!(r.json()["status"], "loading");
            assert!(r.json()["progress"].is_number());
        }
        other => panic!("unexpected status {other}"),
    }
    // The model by its id (the test model's, checked below): 503 with
    // Retry-After while it loads, never 404.
    let r = http(server.local_addr, "GET", "/v1/models/tokenwire-tiny", None).await;
    match r.status {
        200 => assert_eq!(r.json()["id"], "tokenwire-tiny"),
        503 => assert!(r.head.contains("retry-after: 1"), "{}", r.head),
        other => panic!("unexpected status {other}: {}", r.body),
    }
    server.wait_ready().await.expect("loads");
    let r = http(server.local_addr, "GET", "/health", None).await;
    assert_eq!(r.status, 200);
    let name = http(server.local_addr, "GET", "/v1/models", None)
        .await
        .json()["data"][0]["id"]
        .as_str()
        .expect("the served model")
        .to_owned();
    let r = http(
        server.local_addr,
        "GET",
        &format!("/v1/models/{name}"),
        None,
    )
    .await;
    assert_eq!(
        (r.status, r.json()["id"].as_str()),
        (200, Some(name.as_str())),
        "{}",
        r.body
    );
    server.finish().await.expect("clean shutdown");
}

#[tokio::test]
async fn start_fails_with_the_load_error() {
    let missing = std::env::temp_dir().join("tokenwire-io-test-no-such-model");
    let err = start(ServerConfig {
        model: tokenwire_io::ModelSource::Dir(missing),
        ..config()
    })
    .await
    .expect_err("a missing model directory cannot load");
    assert!(
        format!("{err:#}").contains("failed to load the model from"),
        "{err:#}"
    );
}

#[tokio::test]
async fn generate_over_http_rejects_bad_bodies() {
    let server = ready(config().with_host(|h| h.max_frame_bytes = 64)).await;
    let addr = server.local_addr;

    let r = http(addr, "POST", "/v1/generate", Some("[1, 2]")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "invalid_request");
    let r = http(addr, "POST", "/v1/generate", Some("{not json")).await;
    assert_eq!(r.status, 400);
    let r = http(
        addr,
        "POST",
        "/v1/generate",
        Some(r#"{"prompt": "x", "stream": "yes"}"#),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.json()["message"]
        .as_str()
        .unwrap_or("")
        .contains("stream"));
    let big = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(100));
    let r = http(addr, "POST", "/v1/generate", Some(&big)).await;
    assert_eq!(r.status, 413);

    server.finish().await.expect("clean shutdown");
}

#[tokio::test]
async fn websocket_upgrades_on_dialect_paths_only() {
    let server = ready(config()).await;
    let addr = server.local_addr;

    let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{addr}/generate"))
        .await
        .expect("upgrade on /generate");
    assert_eq!(resp.status().as_u16(), 101);
    ws.send(Message::text(r#"{"type":"config","prompt":"hi"}"#))
        .await
        .expect("send a frame");
    ws.close(None).await.expect("close");
    // Read to the end of the close handshake.
    while let Some(msg) = ws.next().await {
        if msg.is_err() {
            break;
        }
    }

    match tokio_tungstenite::connect_async(format!("ws://{addr}/not-a-dialect")).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 404),
        other => panic!("expected 404, got {other:?}"),
    }

    server.finish().await.expect("clean shutdown");
}

#[tokio::test]
async fn an_oversized_frame_closes_the_connection_with_1009() {
    let server = ready(config().with_host(|h| h.max_frame_bytes = 1000)).await;
    let addr = server.local_addr;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/generate"))
        .await
        .expect("connect");
    ws.send(Message::text("x".repeat(10_000)))
        .await
        .expect("send");
    let mut close_code = None;
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Close(Some(frame))) => close_code = Some(u16::from(frame.code)),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert_eq!(close_code, Some(1009));
    server.finish().await.expect("clean shutdown");
}

#[tokio::test]
async fn connection_limit_answers_503() {
    let server = ready(ServerConfig {
        max_connections: 1,
        ..config()
    })
    .await;
    let addr = server.local_addr;

    let (mut first, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws"))
        .await
        .expect("first connection");
    match tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 503),
        other => panic!("expected 503, got {other:?}"),
    }
    first.close(None).await.expect("close");
    while let Some(msg) = first.next().await {
        if msg.is_err() {
            break;
        }
    }
    server.finish().await.expect("clean shutdown");
}

#[tokio::test]
async fn shutdown_closes_open_websockets_within_the_hard_cap() {
    let server = ready(config().with_host(|h| h.shutdown_grace = Duration::ZERO)).await;
    let addr = server.local_addr;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/generate"))
        .await
        .expect("connect");
    let stop = tokio::spawn(server.finish());
    // The connection ends with a close frame (from the Host, or the shell's
    // 1001 at the hard cap), then the stream ends.
    let mut close_code = None;
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Close(Some(frame))) => close_code = Some(u16::from(frame.code)),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert_eq!(close_code, Some(1001));
    stop.await.expect("join").expect("clean shutdown");
}
