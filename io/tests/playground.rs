//! The playground at `GET /`, driven in headless Chromium (Debian's
//! `chromium`) through the DevTools protocol against a real `tokenwire serve`
//! process: the test types a prompt, watches text stream, pauses, changes the
//! temperature, resumes, regenerates and stops, then has a conversation in
//! the `session` and `responses` dialects, checking every final text against
//! the same request made without the browser. A screenshot is written to
//! `target/artifacts/playground.png`.
//!
//! Without Chromium the test is skipped with a reason; under CI (`CI=true`)
//! that is a failure.

#![cfg(unix)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use base64::Engine as _;
use common::{
    connect, expect, http, recv, send, serve_model, stories260k, system_binary, Ws, WAIT,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const PROMPT: &str = "Once upon a time";
const MAX_TOKENS: u64 = 300;

/// A headless Chromium and a DevTools connection to its one page.
struct Browser {
    child: Child,
    profile: PathBuf,
    page: Ws,
    next_id: u64,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Browser {
    async fn launch(binary: &PathBuf) -> Browser {
        // One profile per browser: tests of this binary run in parallel,
        // and Chromium locks its profile.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let profile =
            std::env::temp_dir().join(format!("tokenwire-chromium-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        let mut child = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
                "--window-size=1100,820",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(url) = line.strip_prefix("DevTools listening on ") {
                        let _ = tx.send(url.trim().to_owned());
                        sent = true;
                    }
                }
            }
        });
        let browser_url = rx.recv_timeout(WAIT).expect("chromium's DevTools address");
        let port = browser_url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .expect("host:port")
            .to_owned();
        let (_, body) = http(&port, "GET", "/json/list", None).await;
        let targets: Value = serde_json::from_str(&body).expect("targets");
        let page_url = targets
            .as_array()
            .expect("a list")
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_owned();
        let page = connect_url(&page_url).await;
        Browser {
            child,
            profile,
            page,
            next_id: 0,
        }
    }

    /// Calls a DevTools method and returns its result; events are skipped.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"id": id, "method": method, "params": params});
        self.page
            .send(Message::text(msg.to_string()))
            .await
            .expect("send to chromium");
        loop {
            let frame = tokio::time::timeout(WAIT, self.page.next())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer from chromium"))
                .expect("chromium connection open")
                .expect("chromium frame");
            let Message::Text(text) = frame else { continue };
            let v: Value = serde_json::from_str(text.as_str()).expect("json");
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {}", v["error"]);
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `js` in the page (awaiting a promise) and returns its value.
    async fn eval(&mut self, js: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": js, "awaitPromise": true, "returnByValue": true}),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{js}\nthrew: {}", e["exception"]["description"]);
        }
        r["result"]["value"].clone()
    }

    /// Waits, in the page, until `cond` (a JS expression) is truthy, and
    /// returns `value` then. `cond` is checked at once and after every change
    /// to the document (the page shows all its state there); the promise
    /// fails with `what` if the time bound passes first.
    async fn wait_for(&mut self, cond: &str, value: &str, what: &str) -> Value {
        let js = format!(
            "new Promise((resolve, reject) => {{ \
               const o = new MutationObserver(() => check()); \
               const bound = setTimeout(() => {{ o.disconnect(); \
                 reject(new Error({what:?} + ': ' + document.getElementById('status')?.textContent)); }}, {ms}); \
               function check() {{ if ({cond}) {{ o.disconnect(); clearTimeout(bound); resolve({value}); }} }} \
               o.observe(document, {{childList: true, subtree: true, attributes: true, characterData: true}}); \
               check(); }})",
            ms = WAIT.as_millis()
        );
        self.eval(&js).await
    }

    /// A real mouse click in the middle of the element.
    async fn click(&mut self, selector: &str) {
        let rect = self
            .eval(&format!(
                "(() => {{ const r = document.querySelector({selector:?}).getBoundingClientRect(); \
                 return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
            ))
            .await;
        let (x, y) = (rect[0].as_f64().expect("x"), rect[1].as_f64().expect("y"));
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            )
            .await;
        }
    }

    /// Clears a field and types `text` into it as keyboard input.
    async fn type_into(&mut self, selector: &str, text: &str) {
        self.eval(&format!(
            "(() => {{ const e = document.querySelector({selector:?}); e.value = ''; e.focus(); }})()"
        ))
        .await;
        self.call("Input.insertText", json!({"text": text})).await;
    }

    /// The assistant's text in the transcript (the last message).
    async fn reply(&mut self) -> String {
        self.eval("messages.length ? messages[messages.length - 1].content : ''")
            .await
            .as_str()
            .expect("reply")
            .to_owned()
    }

    /// Waits until the current request is over; returns the status line.
    async fn wait_done(&mut self) -> String {
        self.wait_for(
            "!running && /^(done|error)/.test(document.getElementById('status').textContent)",
            "document.getElementById('status').textContent",
            "the request ends",
        )
        .await
        .as_str()
        .expect("status")
        .to_owned()
    }

    /// Clicks `button` as soon as the assistant's text first appears.
    async fn click_on_first_text(&mut self, button: &str) {
        self.eval(&format!(
            "(() => {{ const o = new MutationObserver(() => {{ \
               const m = messages[messages.length - 1]; \
               if (m && m.role === 'assistant' && m.content.length > 0) {{ \
                 window.textWhenClicked = m.content; o.disconnect(); \
                 document.getElementById({button:?}).click(); }} }}); \
               o.observe(document.getElementById('transcript'), {{childList: true, subtree: true, characterData: true}}); }})()"
        ))
        .await;
    }
}

async fn connect_url(url: &str) -> Ws {
    let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("in time")
        .expect("DevTools handshake");
    ws
}

/// The same generation without the browser.
async fn generate_reference(addr: &str) -> Value {
    let (status, body) = http(
        addr,
        "POST",
        "/v1/generate",
        Some(&json!({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("completion")
}

/// One `session` turn without the browser.
async fn session_reference(addr: &str) -> String {
    let mut ws = connect(addr, "/ws/session").await;
    send(
        &mut ws,
        json!({"type":"session_init","session_id":"reference","job_id":"playground","conversation_context":[]}),
    )
    .await;
    expect(&mut ws, "session_ready").await;
    send(
        &mut ws,
        json!({"type":"prompt","session_id":"reference","content":PROMPT,"message_index":0,
               "max_tokens":MAX_TOKENS,"temperature":0}),
    )
    .await;
    loop {
        let v = recv(&mut ws).await.expect("a frame");
        if v["type"] == "response" {
            return v["content"].as_str().expect("content").to_owned();
        }
    }
}

/// One `responses` response without the browser.
async fn responses_reference(addr: &str) -> String {
    let mut ws = connect(addr, "/v1/responses").await;
    send(
        &mut ws,
        json!({"type":"response.create","input":[{"role":"user","content":PROMPT}],
               "max_output_tokens":MAX_TOKENS,"temperature":0}),
    )
    .await;
    loop {
        let v = recv(&mut ws).await.expect("a frame");
        if v["type"] == "response.completed" || v["type"] == "response.incomplete" {
            return v["response"]["output"][0]["content"][0]["text"]
                .as_str()
                .expect("text")
                .to_owned();
        }
    }
}

/// The same turn over `POST /v1/chat/completions`, as the server answers it.
async fn chat_reference(addr: &str) -> String {
    let body = json!({"model": "stories260K", "messages": [{"role": "user", "content": PROMPT}],
                      "max_tokens": MAX_TOKENS, "temperature": 0});
    let (status, text) = http(addr, "POST", "/v1/chat/completions", Some(&body)).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

fn artifact(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts directory");
    dir.join(name)
}

#[test]
fn the_playground_streams_pauses_resumes_and_converses_in_a_real_browser() {
    let Some(chromium) = system_binary(&["chromium", "chromium-browser"], "chromium") else {
        return;
    };
    let (mut server, addr) = serve_model(&stories260k());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (status, page) = http(&addr, "GET", "/", None).await;
        assert_eq!(status, 200);
        assert!(page.contains("tokenwire playground"));
        let reference = generate_reference(&addr).await;
        let expected = reference["generated_text"]
            .as_str()
            .expect("text")
            .to_owned();
        let expected_reason = format!(
            "done: {}",
            reference["finish_reason"].as_str().expect("reason")
        );

        let mut b = Browser::launch(&chromium).await;
        b.call("Page.navigate", json!({"url": format!("http://{addr}/")}))
            .await;
        b.wait_for(
            "document.body && document.body.dataset.ready === 'true' && \
             document.getElementById('model').textContent.includes('stories260K')",
            "true",
            "the page loads and names the model",
        )
        .await;
        // Chromium offers permessage-deflate and the server accepts it, so
        // everything below streams compressed.
        let extensions = b
            .eval(&format!(
                "new Promise(r => {{ const w = new WebSocket('ws://{addr}/generate'); \
                 w.onopen = () => {{ r(w.extensions); w.close(); }}; w.onerror = () => r('error'); }})"
            ))
            .await;
        assert!(
            extensions
                .as_str()
                .is_some_and(|e| e.starts_with("permessage-deflate")),
            "negotiated: {extensions}"
        );

        // generate: greedy, paused as soon as text appears.
        b.type_into("#temperature", "0").await;
        b.type_into("#max-tokens", &MAX_TOKENS.to_string()).await;
        b.type_into("#prompt", PROMPT).await;
        b.click_on_first_text("pause").await;
        b.click("#send").await;
        b.wait_for(
            "document.getElementById('status').textContent === 'paused'",
            "true",
            "paused",
        )
        .await;
        let at_pause = b.reply().await;
        let clicked_at = b.eval("window.textWhenClicked").await;
        let clicked_at = clicked_at.as_str().expect("text when pause was clicked");
        assert!(!clicked_at.is_empty(), "text streamed before the pause");
        assert!(at_pause.starts_with(clicked_at));
        assert!(
            at_pause.len() < expected.len() && expected.starts_with(&at_pause),
            "paused part way: {at_pause:?} of {expected:?}"
        );
        let ttft = b.eval("document.getElementById('ttft').textContent").await;
        assert!(ttft.as_str().is_some_and(|t| t.ends_with(" ms")), "{ttft}");

        // A temperature change while paused, acknowledged with its value.
        b.type_into("#temperature", "0").await;
        b.click("#modify").await;
        b.wait_for(
            "document.getElementById('status').textContent === 'modified: temperature 0'",
            "true",
            "the temperature change is acknowledged",
        )
        .await;
        // The pause holds: nothing streamed meanwhile.
        assert_eq!(b.reply().await, at_pause);

        b.click("#resume").await;
        let done = b.wait_done().await;
        assert_eq!(done, expected_reason);
        assert_eq!(b.reply().await, expected, "the paused generation's text");
        let tokens = b
            .eval("document.getElementById('tokens').textContent")
            .await;
        assert_eq!(
            tokens.as_str().and_then(|t| t.parse::<u64>().ok()),
            reference["usage"]["completion_tokens"].as_u64()
        );
        let rate = b.eval("document.getElementById('rate').textContent").await;
        assert!(
            rate.as_str()
                .and_then(|r| r.parse::<f64>().ok())
                .is_some_and(|r| r > 0.0),
            "tokens/s shown: {rate}"
        );
        let shot = b
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("data"))
            .expect("base64");
        assert!(png.starts_with(b"\x89PNG"));
        std::fs::write(artifact("playground.png"), &png).expect("screenshot written");

        // Regenerate: the same greedy text again.
        b.click("#regenerate").await;
        assert_eq!(b.wait_done().await, expected_reason);
        assert_eq!(b.reply().await, expected, "regenerated");

        // Stop as soon as text appears: cancelled with what streamed.
        b.type_into("#prompt", PROMPT).await;
        b.click_on_first_text("stop").await;
        b.click("#send").await;
        assert_eq!(b.wait_done().await, "done: cancelled");
        let stopped = b.reply().await;
        assert!(
            stopped.len() < expected.len() && expected.starts_with(&stopped),
            "stopped part way: {stopped:?}"
        );

        // The chat dialects: one turn each, as the server answers it directly.
        for (dialect, want) in [
            ("session", session_reference(&addr).await),
            ("responses", responses_reference(&addr).await),
            ("chat", chat_reference(&addr).await),
        ] {
            b.eval(&format!(
                "(() => {{ const s = document.getElementById('dialect'); s.value = {dialect:?}; \
                 s.dispatchEvent(new Event('change')); }})()"
            ))
            .await;
            b.type_into("#prompt", PROMPT).await;
            b.click("#send").await;
            let done = b.wait_done().await;
            assert!(done.starts_with("done: "), "{dialect}: {done}");
            assert_eq!(b.reply().await, want, "{dialect}");
            let roles = b
                .eval("[...document.querySelectorAll('#transcript .msg')].map(m => m.dataset.role)")
                .await;
            assert_eq!(roles, json!(["user", "assistant"]), "{dialect}");
        }
        std::fs::write(
            artifact("playground-chat.png"),
            base64::engine::general_purpose::STANDARD
                .decode(
                    b.call("Page.captureScreenshot", json!({"format": "png"}))
                        .await["data"]
                        .as_str()
                        .expect("data"),
                )
                .expect("base64"),
        )
        .expect("screenshot written");
    });
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn with_auth_all_the_playground_streams_once_its_api_key_is_typed() {
    let Some(chromium) = system_binary(&["chromium", "chromium-browser"], "chromium") else {
        return;
    };
    let key = "sk-playground-0123";
    let keys = std::env::temp_dir().join(format!(
        "tokenwire-playground-keys-{}.toml",
        std::process::id()
    ));
    let digest = tokenwire_core::keys::hash_key(key);
    std::fs::write(
        &keys,
        format!(
            "[[key]]\nsha256 = \"{}\"\norgs = [\"org\"]\n",
            tokenwire_core::keys::to_hex(&digest)
        ),
    )
    .expect("keys file");
    let mut cmd = common::tokenwire();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--auth",
        "all",
        "--keys",
    ])
    .arg(&keys)
    .arg("--model")
    .arg(stories260k());
    let served = common::serve(cmd);
    let (mut server, addr) = (served.child, served.addr);
    std::thread::spawn(move || served.lines.for_each(drop));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut b = Browser::launch(&chromium).await;
        b.call("Page.navigate", json!({"url": format!("http://{addr}/")}))
            .await;
        b.wait_for(
            "document.body && document.body.dataset.ready === 'true'",
            "true",
            "the page loads",
        )
        .await;
        b.type_into("#temperature", "0").await;
        b.type_into("#max-tokens", "8").await;
        b.type_into("#prompt", PROMPT).await;
        b.click("#send").await;
        b.wait_for(
            "document.getElementById('status').textContent.startsWith('error')",
            "true",
            "refused without a key",
        )
        .await;
        b.type_into("#api-key", key).await;
        b.type_into("#prompt", PROMPT).await;
        b.click("#send").await;
        let done = b.wait_done().await;
        assert!(done.starts_with("done: "), "{done}");
        assert!(!b.reply().await.is_empty(), "text streamed with the key");
    });
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_file(&keys);
}
