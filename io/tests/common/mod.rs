//! Helpers for the tests that run the `tokenwire` binary as an operator does.
#![allow(dead_code)] // Each test file uses its own share of these.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket client connection.
pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

#[cfg(unix)]
pub mod nginx;

/// Upper bound on any single wait; only reached when something is broken.
pub const WAIT: Duration = Duration::from_secs(60);

/// The `tokenwire` binary with no `TOKENWIRE_*` or `RUST_LOG` from the test's
/// own environment (the child's environment only) and no stdin.
pub fn tokenwire() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tokenwire"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TOKENWIRE_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// The stories260K directory kept in the repository (`models/stories260K`,
/// the model `tokenwire serve` has built in).
pub fn stories260k() -> std::path::PathBuf {
    tokenwire_kernels::builtin::stories260k_source_dir()
}

/// A `tokenwire serve` process, its log read up to "model loaded".
pub struct Served {
    /// The process.
    pub child: Child,
    /// The address it listens on, from its log.
    pub addr: String,
    /// The log lines read so far.
    pub log: Vec<String>,
    /// The rest of its log.
    pub lines: Lines<BufReader<ChildStderr>>,
}

/// Starts `cmd` (a `serve` with `--listen 127.0.0.1:0`, stderr piped) and
/// reads its log until the model is loaded.
pub fn serve(mut cmd: Command) -> Served {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tokenwire");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut log = Vec::new();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.expect("utf-8");
        if line.contains("listening") {
            addr = line
                .split("addr=")
                .nth(1)
                .and_then(|a| a.split_whitespace().next())
                .map(str::to_owned);
        }
        let loaded = line.contains("model loaded");
        log.push(line);
        if loaded {
            break;
        }
    }
    let addr = addr.expect("the listening address is logged");
    Served {
        child,
        addr,
        log,
        lines,
    }
}

/// Starts `tokenwire serve --model MODEL` on a free loopback port; its log is
/// drained on a thread. Returns the process and its address.
pub fn serve_model(model: &std::path::Path) -> (Child, String) {
    let mut cmd = tokenwire();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--model"])
        .arg(model);
    let served = serve(cmd);
    let lines = served.lines;
    std::thread::spawn(move || lines.for_each(drop));
    (served.child, served.addr)
}

/// Opens a WebSocket to `ws://ADDR{path}`.
pub async fn connect(addr: &str, path: &str) -> Ws {
    let url = format!("ws://{addr}{path}");
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("in time")
        .expect("handshake");
    ws
}

/// Opens a WebSocket to `ws://ADDR{path}` with extra request `headers`.
pub async fn connect_with(addr: &str, path: &str, headers: &[(&str, &str)]) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{addr}{path}")
        .into_client_request()
        .expect("a request");
    for (name, value) in headers {
        request.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(name.as_bytes())
                .expect("a header name"),
            value.parse().expect("a header value"),
        );
    }
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("in time")
        .expect("handshake");
    ws
}

/// Sends one JSON text frame.
pub async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.expect("send");
}

/// The next JSON frame, or None when the connection ended (closed, reset or
/// cut by a proxy).
pub async fn recv(ws: &mut Ws) -> Option<Value> {
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("in time")
        {
            Some(Ok(Message::Text(t))) => {
                return Some(serde_json::from_str(t.as_str()).expect("json"))
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

/// The next frame, which must be of type `kind`.
pub async fn expect(ws: &mut Ws, kind: &str) -> Value {
    let v = recv(ws).await.expect("a frame");
    assert_eq!(v["type"], kind, "{v}");
    v
}

/// A program from the system's packages (`names` tried on `PATH`, then in
/// `/usr/sbin`), or None with a printed reason to skip. Under CI (`CI=true`)
/// a missing one is a failure: `.ci/run` installs `package`.
pub fn system_binary(names: &[&str], package: &str) -> Option<std::path::PathBuf> {
    let dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let found = dirs
        .iter()
        .map(std::path::PathBuf::as_path)
        .chain([std::path::Path::new("/usr/sbin")])
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but {package} is not installed (apt-get install {package})"
        );
        eprintln!("skipping: {package} is not installed");
    }
    found
}

/// A plain HTTP/1.1 request: (status, body).
pub async fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("request");
    // Read to the end of the body its Content-Length gives (Chromium's
    // DevTools server keeps the connection open), or to the close.
    let mut resp = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = tokio::time::timeout(WAIT, s.read(&mut chunk))
            .await
            .expect("in time")
            .expect("read");
        resp.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&resp);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            });
            if length.is_some_and(|len| body.len() >= len) {
                break;
            }
        }
        if n == 0 {
            break;
        }
    }
    let resp = String::from_utf8(resp).expect("utf-8");
    let (head, body) = resp.split_once("\r\n\r\n").expect("head and body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, body.to_owned())
}
