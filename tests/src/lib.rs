//! Helpers for tokenwire's end-to-end tests: start a real server on a free
//! loopback port, talk to it with a real WebSocket client and a raw HTTP client.
//!
//! Waiting is always for an event (a frame, a response) with a generous upper
//! bound so a broken server fails the test instead of hanging it; nothing sleeps.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub use tokenwire_io::{ModelSource, RunningServer, ServerConfig};

/// Upper bound on any single wait; only reached when something is broken.
pub const WAIT: Duration = Duration::from_secs(60);

/// Writes a keys file holding `keys` (each an API key and the organisations
/// it may act for) to a fresh temporary path named after `name`.
pub fn keys_file(name: &str, keys: &[(&str, &[&str])]) -> PathBuf {
    use tokenwire_core::keys::{hash_key, to_hex};
    let path =
        std::env::temp_dir().join(format!("tokenwire-keys-{name}-{}.toml", std::process::id()));
    let text: String = keys
        .iter()
        .enumerate()
        .map(|(i, (key, orgs))| {
            let orgs: Vec<String> = orgs.iter().map(|o| format!("\"{o}\"")).collect();
            format!(
                "[[key]]\nname = \"k{i}\"\nsha256 = \"{}\"\norgs = [{}]\n\n",
                to_hex(&hash_key(key)),
                orgs.join(", ")
            )
        })
        .collect();
    std::fs::write(&path, text).expect("write the keys file");
    path
}

/// The stories260K directory kept in the repository (`models/stories260K`,
/// the model `tokenwire serve` has built in).
pub fn stories260k() -> PathBuf {
    tokenwire_kernels::builtin::stories260k_source_dir()
}

/// A chat template in Qwen3's shape for a reasoning model: the generation
/// prompt opens the reasoning (`<think>` then a newline, as DeepSeek-R1's
/// and Qwen3-Thinking's templates write it), unless `enable_thinking` is
/// `false`, when it writes an empty reasoning closed (Qwen3's switch).
pub const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

/// A copy of stories260K (named so still) whose tokenizer config carries
/// [`THINKING_TEMPLATE`], in a fresh folder of the system's temp dir named
/// after `name` and this process.
pub fn thinking_stories260k(name: &str) -> PathBuf {
    stories260k_with_template(name, THINKING_TEMPLATE)
}

/// A copy of stories260K (named so still) whose tokenizer config carries
/// `template`, in a fresh folder of the system's temp dir named after
/// `name` and this process.
pub fn stories260k_with_template(name: &str, template: &str) -> PathBuf {
    let parent =
        std::env::temp_dir().join(format!("tokenwire-thinking-{name}-{}", std::process::id()));
    let dir = parent.join("stories260K");
    std::fs::create_dir_all(&dir).expect("make the model folder");
    let source = stories260k();
    for entry in std::fs::read_dir(&source).expect("read stories260K") {
        let entry = entry.expect("an entry");
        if entry.file_type().expect("its type").is_file() {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy a model file");
        }
    }
    let config_path = dir.join("tokenizer_config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).expect("read the config"))
            .expect("the config is JSON");
    config["chat_template"] = Value::String(template.into());
    std::fs::write(&config_path, config.to_string()).expect("write the config");
    dir
}

/// Qwen2.5-Coder's fill-in-the-middle markers.
pub const FIM_TAGS: [&str; 3] = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"];

/// A copy of stories260K (as [`stories260k_with_template`] makes) with
/// [`FIM_TAGS`] as special tokens, so that it takes Completions' `suffix`.
pub fn fim_stories260k(name: &str) -> PathBuf {
    let dir = stories260k_with_template(name, "{{ messages[0].content }}");
    make_tags_one_token(&dir, &FIM_TAGS, true);
    dir
}

/// Makes `</think>` one token of the stories260K copy in `dir` (from
/// [`thinking_stories260k`]), as it is in Qwen3's and DeepSeek-R1's
/// vocabularies ([`make_tags_one_token`]). What needs the tag as one token
/// (a grammar that waits for the reasoning, a thinking budget) then works
/// on a real model.
pub fn make_close_tag_one_token(dir: &std::path::Path) {
    make_tags_one_token(dir, &["</think>"], false);
}

/// Byte tokens no story uses (`~`, `|`, `` ` ``), in the order
/// [`make_tags_one_token`] renames them.
const SPARE_BYTE_TOKENS: [&str; 3] = ["<0x7E>", "<0x7C>", "<0x60>"];

/// Makes each of `tags` (at most three) one token of the stories260K copy
/// in `dir`: a byte token no story uses is renamed to it and made an added
/// token (`special` as asked, as Magistral's `[THINK]` is since 2507), so
/// the text encodes to it and, where it is not special, decodes to it.
pub fn make_tags_one_token(dir: &std::path::Path, tags: &[&str], special: bool) {
    let path = dir.join("tokenizer.json");
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read tokenizer.json"))
            .expect("tokenizer.json is JSON");
    assert!(tags.len() <= SPARE_BYTE_TOKENS.len(), "too many tags");
    for (tag, spare) in tags.iter().zip(SPARE_BYTE_TOKENS) {
        let vocab = tokenizer["model"]["vocab"]
            .as_object_mut()
            .expect("a BPE vocabulary");
        let id = vocab.remove(spare).expect("a spare byte token");
        vocab.insert((*tag).into(), id.clone());
        let token = serde_json::json!({"id": id, "content": tag, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": special});
        tokenizer["added_tokens"]
            .as_array_mut()
            .expect("added tokens")
            .push(token);
    }
    std::fs::write(&path, tokenizer.to_string()).expect("write tokenizer.json");
}

/// A template in the form of Mistral's from tokenizer v11 (Small 3.2,
/// Magistral): written here, not copied. Earlier calls as
/// `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`, results with their call's id,
/// and ids that are not nine characters refused as Mistral's templates do.
pub const MISTRAL_ARGS_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message['content'] }}[/INST]{% elif message['role'] == 'assistant' %}{{ message['content'] }}{% if message.tool_calls %}{% for call in message.tool_calls %}{% if call.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}[TOOL_CALLS]{{ call.function.name }}[CALL_ID]{{ call.id }}[ARGS]{{ call.function.arguments | tojson }}{% endfor %}{% endif %}{{ eos_token }}{% elif message['role'] == 'tool' %}{% if message.tool_call_id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}[TOOL_RESULTS]{{ message.tool_call_id }}[TOOL_CONTENT]{{ message['content'] }}[/TOOL_RESULTS]{% endif %}{% endfor %}";

/// The same for Mistral's earlier form (7B v0.3, Nemo): `[TOOL_CALLS]` and
/// a JSON list of calls, each with its id.
pub const MISTRAL_JSON_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message['content'] }}[/INST]{% elif message.tool_calls %}[TOOL_CALLS][{% for call in message.tool_calls %}{% if call.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}, \"id\": \"{{ call.id }}\"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}{% elif message['role'] == 'tool' %}[TOOL_RESULTS]{\"content\": {{ message['content'] | tojson }}, \"call_id\": \"{{ message.tool_call_id }}\"}[/TOOL_RESULTS]{% endif %}{% endfor %}";

/// A stories260K copy with `template`, and `[TOOL_CALLS]` and `[ARGS]`
/// special tokens of its tokenizer, as in Mistral's: a model that calls
/// tools in Mistral's format ([`MISTRAL_ARGS_TEMPLATE`] or
/// [`MISTRAL_JSON_TEMPLATE`]).
pub fn mistral_copy(name: &str, template: &str) -> PathBuf {
    let dir = stories260k_with_template(name, template);
    make_tags_one_token(&dir, &["[TOOL_CALLS]", "[ARGS]"], true);
    dir
}

/// SmolLM2-135M-Instruct as a Q4_1 GGUF file (`scripts/fetch-smollm2-gguf.sh`
/// puts it in `target/models`; `TOKENWIRE_SMOLLM2_GGUF` names another place).
/// Under CI (`CI=true`) a missing file is a failure, elsewhere the caller
/// skips with a printed reason.
pub fn smollm2_gguf() -> Option<PathBuf> {
    let path = std::env::var_os("TOKENWIRE_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../target/models/SmolLM2-135M-Instruct.Q4_1.gguf"
            ))
        });
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but {} is missing (scripts/fetch-smollm2-gguf.sh fetches it)",
        path.display()
    );
    eprintln!("skipping: {} not found", path.display());
    None
}

/// The golden reference of stories260K.
pub fn stories_reference(dir: &std::path::Path) -> Value {
    let text =
        std::fs::read_to_string(dir.join("REFERENCE.json")).expect("REFERENCE.json readable");
    serde_json::from_str(&text).expect("REFERENCE.json is JSON")
}

/// Starts a server on 127.0.0.1 with a free port.
pub async fn start(model: ModelSource, tweak: impl FnOnce(&mut ServerConfig)) -> RunningServer {
    let mut cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        model,
        ..ServerConfig::default()
    };
    tweak(&mut cfg);
    tokenwire_io::start(cfg).await.expect("server starts")
}

/// A WebSocket client.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// What the server did next.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// A JSON text frame.
    Json(Value),
    /// A close frame with its code and reason.
    Close(u16, String),
    /// The stream ended without a close frame.
    Ended,
}

impl Client {
    /// Connects to `ws://addr/path`.
    pub async fn connect(server: &RunningServer, path: &str) -> Client {
        Client::connect_with(server, path, &[]).await
    }

    /// Connects to `ws://addr/path` with extra upgrade `headers`.
    pub async fn connect_with(
        server: &RunningServer,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Client {
        match Client::try_connect(server, path, headers).await {
            Ok(c) => c,
            Err(status) => panic!("websocket handshake refused with {status}"),
        }
    }

    /// Connects to `ws://addr/path` with extra upgrade `headers`; the HTTP
    /// status when the upgrade is refused.
    pub async fn try_connect(
        server: &RunningServer,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Client, u16> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
        let url = format!("ws://{}{}", server.local_addr, path);
        let mut req = url.into_client_request().expect("a request");
        for (k, v) in headers {
            req.headers_mut().insert(
                HeaderName::from_bytes(k.as_bytes()).expect("a header name"),
                HeaderValue::from_str(v).expect("a header value"),
            );
        }
        let connected = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(req))
            .await
            .expect("connect in time");
        match connected {
            Ok((ws, _)) => Ok(Client { ws }),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
            Err(e) => panic!("websocket handshake failed: {e}"),
        }
    }

    /// Sends a JSON value as a text frame.
    pub async fn send(&mut self, v: Value) {
        self.send_text(&v.to_string()).await;
    }

    /// Sends raw text.
    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.expect("send");
    }

    /// Sends a binary frame.
    pub async fn send_binary(&mut self, bytes: Vec<u8>) {
        self.ws.send(Message::binary(bytes)).await.expect("send");
    }

    /// The next frame from the server (pings are answered by the library).
    pub async fn next(&mut self) -> Received {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("server answered in time");
            match msg {
                None | Some(Err(_)) => return Received::Ended,
                Some(Ok(Message::Text(t))) => {
                    return Received::Json(
                        serde_json::from_str(t.as_str()).expect("server sends JSON"),
                    )
                }
                Some(Ok(Message::Close(frame))) => {
                    return match frame {
                        Some(f) => Received::Close(u16::from(f.code), f.reason.to_string()),
                        None => Received::Close(u16::from(CloseCode::Status), String::new()),
                    }
                }
                Some(Ok(_)) => continue,
            }
        }
    }

    /// The next JSON frame; panics on close.
    pub async fn recv(&mut self) -> Value {
        match self.next().await {
            Received::Json(v) => v,
            other => panic!("expected a JSON frame, got {other:?}"),
        }
    }

    /// Frames up to and including the first whose `type` is one of `kinds`.
    pub async fn recv_until(&mut self, kinds: &[&str]) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let v = self.recv().await;
            let done = v["type"].as_str().is_some_and(|t| kinds.contains(&t));
            out.push(v);
            if done {
                return out;
            }
        }
    }

    /// Closes the connection from the client side.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }

    /// Drops the TCP connection without a close handshake.
    pub fn abort(self) {
        drop(self);
    }
}

/// Concatenated `token` fields.
pub fn token_text(frames: &[Value]) -> String {
    frames
        .iter()
        .filter(|f| f["type"] == "token")
        .filter_map(|f| f["token"].as_str())
        .collect()
}

/// A minimal HTTP/1.1 response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Header lines, lowercased names.
    pub headers: Vec<(String, String)>,
    /// Body (chunked encoding removed).
    pub body: String,
}

impl HttpResponse {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, parsed as JSON (the `[DONE]`
    /// that ends an OpenAI stream left out).
    pub fn sse_events(&self) -> Vec<Value> {
        self.body
            .split("\n\n")
            .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data:")))
            // The OpenAI routes end their streams with a `[DONE]` sentinel.
            .filter(|d| d.trim() != "[DONE]")
            .map(|d| serde_json::from_str(d.trim()).expect("SSE data is JSON"))
            .collect()
    }
}

/// Sends one HTTP/1.1 request with `Connection: close` and reads the whole response.
pub async fn http(
    server: &RunningServer,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> HttpResponse {
    http_with(server, method, path, body, &[]).await
}

/// [`http`] with extra request `headers`.
pub async fn http_with(
    server: &RunningServer,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> HttpResponse {
    let fut = async {
        let mut s = TcpStream::connect(server.local_addr)
            .await
            .expect("connect");
        let body = body.unwrap_or("");
        let extra: String = headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        parse_response(&raw)
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .expect("HTTP answered in time")
}

/// Parses a raw HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> HttpResponse {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP head");
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of a Prometheus sample line starting with `prefix` (name plus labels).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Sends `bytes` as they are on a fresh connection and reads the response
/// until the server closes the connection.
pub async fn raw_http(server: &RunningServer, bytes: &[u8]) -> HttpResponse {
    let fut = async {
        let mut s = TcpStream::connect(server.local_addr)
            .await
            .expect("connect");
        s.write_all(bytes).await.expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        parse_response(&raw)
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .expect("HTTP answered in time")
}

/// Performs a WebSocket handshake on `path` by hand and returns the raw
/// stream, for tests that must send what a well-behaved client never does.
pub async fn raw_websocket(server: &RunningServer, path: &str) -> TcpStream {
    raw_websocket_with(server, path, "").await.0
}

/// [`raw_websocket`] with `extra` header lines (each ending in `\r\n`) in
/// the upgrade request; also returns the 101 response's head.
pub async fn raw_websocket_with(
    server: &RunningServer,
    path: &str,
    extra: &str,
) -> (TcpStream, String) {
    let mut s = TcpStream::connect(server.local_addr)
        .await
        .expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("write");
    // Read the 101 head byte by byte so no frame byte is consumed with it.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, s.read(&mut b))
            .await
            .expect("handshake in time")
            .expect("read");
        assert!(n == 1, "connection closed during the handshake");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    (s, head)
}

/// A client frame: FIN set as given, reserved bits `rsv` (0..8), `opcode`,
/// masked unless `masked` is false.
pub fn client_frame(fin: bool, rsv: u8, opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut f = vec![(u8::from(fin) << 7) | (rsv << 4) | opcode];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => f.push(mask_bit | n as u8),
        n if n < 65536 => {
            f.push(mask_bit | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(mask_bit | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        let key = [0x1a, 0x2b, 0x3c, 0x4d];
        f.extend_from_slice(&key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        f.extend_from_slice(payload);
    }
    f
}

/// What a raw WebSocket stream received up to its end: the text frames and
/// the close frame's code and reason, if one came.
#[derive(Debug, Default)]
pub struct RawReceived {
    /// Text frames, in order.
    pub texts: Vec<String>,
    /// The close frame, if any.
    pub close: Option<(u16, String)>,
}

/// Reads server frames from a raw stream until the server closes it (or
/// `limit` passes, which fails the test).
pub async fn read_raw_frames(s: &mut TcpStream, limit: Duration) -> RawReceived {
    let mut raw = Vec::new();
    let read = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .expect("the server ended the connection in time");
    let mut out = RawReceived::default();
    let mut i = 0;
    while i + 2 <= raw.len() {
        let opcode = raw[i] & 0x0f;
        let mut len = (raw[i + 1] & 0x7f) as usize;
        let mut at = i + 2;
        if len == 126 {
            len = u16::from_be_bytes([raw[at], raw[at + 1]]) as usize;
            at += 2;
        } else if len == 127 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[at..at + 8]);
            len = u64::from_be_bytes(b) as usize;
            at += 8;
        }
        if at + len > raw.len() {
            break;
        }
        let payload = &raw[at..at + len];
        match opcode {
            1 => out
                .texts
                .push(String::from_utf8_lossy(payload).into_owned()),
            8 if payload.len() >= 2 => {
                out.close = Some((
                    u16::from_be_bytes([payload[0], payload[1]]),
                    String::from_utf8_lossy(&payload[2..]).into_owned(),
                ))
            }
            8 => out.close = Some((1005, String::new())),
            _ => {}
        }
        i = at + len;
    }
    out
}

/// The Python of a venv holding the official OpenAI SDK
/// (`tests/sdk/requirements.txt`), named by `TOKENWIRE_SDK_PYTHON`; `None`
/// (the test skips) without it, except under `CI=true`, where that fails.
pub fn sdk_python() -> Option<PathBuf> {
    match std::env::var_os("TOKENWIRE_SDK_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but TOKENWIRE_SDK_PYTHON (a venv with tests/sdk/requirements.txt) is not set"
            );
            eprintln!("skipping: set TOKENWIRE_SDK_PYTHON to a venv's python with tests/sdk/requirements.txt");
            None
        }
    }
}

/// Runs `tests/sdk/SCRIPT` with `python` against `server` (its
/// `--base-url` and `--model stories260K` first, then `args`); fails with
/// the script's output unless every check passed, else returns it.
pub async fn run_sdk_script(
    python: &std::path::Path,
    script: &str,
    server: &RunningServer,
    args: &[&str],
) -> String {
    let script = format!("{}/sdk/{script}", env!("CARGO_MANIFEST_DIR"));
    let base = format!("http://{}/v1", server.local_addr);
    let out = tokio::process::Command::new(python)
        .arg(&script)
        .args(["--base-url", &base, "--model", "stories260K"])
        .args(args)
        .env("OPENAI_API_KEY", "unused")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .expect("the SDK checks finish in time")
        .expect("the venv's python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "SDK checks failed:\n{text}");
    text
}
