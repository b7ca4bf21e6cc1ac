//! The `tokenwire` binary as an operator runs it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{stories260k, tokenwire};

#[test]
fn a_model_that_cannot_load_is_a_clear_error_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("tokenwire-no-model-{}", std::process::id()));
    let out = tokenwire()
        .args(["serve", "--listen", "127.0.0.1:0", "--model"])
        .arg(&dir)
        .output()
        .expect("run tokenwire");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("failed to load the model from"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn random_model_serves_the_tiny_model_with_random_weights() {
    let mut served = common::serve({
        let mut cmd = tokenwire();
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--random-model",
            "--seed",
            "3",
        ]);
        cmd
    });
    assert!(
        served.log[0].contains("--random-model: serving the built-in tiny model"),
        "{:?}",
        served.log
    );
    let loaded = served.log.last().expect("a log line");
    assert!(loaded.contains("model=tokenwire-tiny"), "{loaded}");
    let _ = served.child.kill();
    let _ = served.child.wait();

    let out = tokenwire()
        .args(["serve", "--random-model", "--model", "/x"])
        .output()
        .expect("run tokenwire");
    assert_eq!(
        out.status.code(),
        Some(2),
        "--random-model with --model is refused"
    );
}

#[test]
fn bad_settings_exit_with_a_message_naming_them() {
    let out = tokenwire()
        .args(["serve", "--max-queued-frames", "none"])
        .output()
        .expect("run tokenwire");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-queued-frames"));

    let out = tokenwire()
        .args(["serve"])
        .env("TOKENWIRE_IDLE_TIMEOUT", "soon")
        .output()
        .expect("run tokenwire");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TOKENWIRE_IDLE_TIMEOUT"));

    let file = std::env::temp_dir().join(format!("tokenwire-test-{}.toml", std::process::id()));
    std::fs::write(&file, "idle_timeout = 3\nbogus_key = 1\n").expect("write config");
    let out = tokenwire()
        .args(["serve", "--config"])
        .arg(&file)
        .output()
        .expect("run tokenwire");
    let _ = std::fs::remove_file(&file);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus_key"));
}

#[cfg(unix)]
#[test]
fn without_model_the_built_in_stories260k_is_served_and_sigterm_stops_cleanly() {
    let mut child = tokenwire()
        .args(["serve", "--listen", "127.0.0.1:0", "--seed", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tokenwire");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let first = lines.next().expect("a first log line").expect("utf-8");
    assert!(
        first.contains("no --model given: serving the built-in stories260K model"),
        "{first}"
    );
    // Wait for the model (the real one, named), then ask it to stop.
    for line in lines.by_ref() {
        let line = line.expect("utf-8");
        if line.contains("model loaded") {
            assert!(line.contains("model=stories260K"), "{line}");
            assert!(line.contains("vocab_size=512"), "{line}");
            break;
        }
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}: {rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("received SIGTERM")),
        "{rest:?}"
    );
}

/// Runs every dialect the server speaks, over WebSocket and HTTP, with a
/// marker in every prompt, at the most verbose log level: neither the
/// marker, nor any character-by-character trace of it, nor the generated
/// text may reach the log.
#[cfg(unix)]
#[test]
fn no_conversation_text_reaches_the_log_at_trace_level() {
    use futures_util::{SinkExt, StreamExt};
    let model = stories260k();
    // A cai key the log must not show either (nor its hash).
    let key = "Zephyr-secret-key";
    let digest = tokenwire_core::keys::to_hex(&tokenwire_core::keys::hash_key(key));
    let keys = std::env::temp_dir().join(format!("tokenwire-log-keys-{}.toml", std::process::id()));
    std::fs::write(
        &keys,
        format!("[[key]]\nsha256 = \"{digest}\"\norgs = [\"org_log\"]\n"),
    )
    .expect("write the keys file");
    let mut cmd = tokenwire();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--seed", "3", "--model"])
        .arg(&model)
        .arg("--keys")
        .arg(&keys)
        .env("TOKENWIRE_LOG", "trace");
    let common::Served {
        mut child,
        addr,
        mut log,
        lines,
    } = common::serve(cmd);
    // A marker the model's vocabulary spells out piece by piece.
    let marker = "Quixotic Zephyr marker";
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let generated: Vec<String> = rt.block_on(async {
        let mut texts = Vec::new();
        // Every WebSocket dialect: one request each that reaches the model.
        let requests = [
            (
                "/generate",
                serde_json::json!({"type": "config", "prompt": format!("{marker} once upon a time"),
                                   "parameters": {"max_tokens": 24, "temperature": 0}}),
                "completion",
            ),
            (
                "/ws/session",
                serde_json::json!([
                    {"type": "session_init", "session_id": "redact", "job_id": 1,
                     "conversation_context": [{"role": "system", "content": format!("{marker} system")}]},
                    {"type": "prompt", "session_id": "redact", "content": format!("{marker} once upon a time"),
                     "message_index": 0, "max_tokens": 24, "temperature": 0}
                ]),
                "response",
            ),
            (
                "/v1/responses",
                serde_json::json!({"type": "response.create", "input": format!("{marker} once upon a time"),
                                   "instructions": format!("{marker} instructions"),
                                   "max_output_tokens": 24, "temperature": 0}),
                "response.incomplete",
            ),
            (
                "/?authorization=Bearer%20Zephyr-secret-key&orgId=org_log",
                serde_json::json!({"type": "COMPLETION", "requestId": "redact",
                                   "payload": {"prompt": format!("{marker} once upon a time"),
                                               "conversationId": "redact",
                                               "context": [{"role": "system", "content": format!("{marker} system")}],
                                               "options": {"maxTokens": 24, "temperature": 0}}}),
                "STREAM_COMPLETE",
            ),
        ];
        for (path, request, terminal) in requests {
            let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}{path}"))
                .await
                .expect("connect");
            ws.send(tokio_tungstenite::tungstenite::Message::text(request.to_string()))
                .await
                .expect("send");
            while let Some(Ok(m)) = ws.next().await {
                if let tokio_tungstenite::tungstenite::Message::Text(t) = m {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("json");
                    if v["type"] == terminal {
                        let text = v["generated_text"]
                            .as_str()
                            .or(v["content"].as_str())
                            .or(v["payload"]["fullContent"].as_str())
                            .or(v["response"]["output"][0]["content"][0]["text"].as_str());
                        texts.push(text.unwrap_or("").to_string());
                        break;
                    }
                }
            }
            let _ = ws.close(None).await;
        }
        // The HTTP routes, JSON and streaming.
        for (route, stream) in [
            ("/v1/generate", false),
            ("/v1/generate", true),
            ("/v1/inference", false),
            ("/v1/inference", true),
            ("/v1/responses", false),
            ("/v1/responses", true),
            ("/v1/chat/completions", false),
            ("/v1/chat/completions", true),
            ("/v1/completions", true),
        ] {
            let body = if route == "/v1/responses" {
                serde_json::json!({"input": format!("{marker} and then"), "max_output_tokens": 8,
                                   "temperature": 0, "stream": stream})
            } else if route == "/v1/chat/completions" {
                serde_json::json!({"model": "stories260K", "max_tokens": 8, "temperature": 0,
                                   "stream": stream, "logprobs": true, "top_logprobs": 2,
                                   "messages": [{"role": "system", "content": format!("{marker} system")},
                                                {"role": "user", "content": format!("{marker} and then")}]})
            } else if route == "/v1/completions" {
                serde_json::json!({"model": "stories260K", "prompt": format!("{marker} and then"),
                                   "max_tokens": 8, "temperature": 0, "stream": stream, "echo": true})
            } else {
                serde_json::json!({"prompt": format!("{marker} and then"), "max_tokens": 8,
                                   "temperature": 0, "stream": stream})
            }
            .to_string();
            let mut s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
            let req = format!(
                "POST {route} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(req.as_bytes()).await.expect("write");
            let mut raw = String::new();
            s.read_to_string(&mut raw).await.expect("read");
            assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        }
        texts
    });
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    log.extend(lines.map_while(Result::ok));
    assert!(child.wait().expect("wait").success());
    let _ = std::fs::remove_file(&keys);

    assert!(
        log.iter().any(|l| l.contains("TRACE")),
        "the log really is at trace level"
    );
    // Each dialect's requests are traced in a request span inside their
    // connection's span, with ids and lengths.
    for dialect in ["generate", "session", "responses", "cai", "chat"] {
        let conn = format!("dialect=\"{dialect}\"");
        assert!(
            log.iter().any(|l| l.contains("conn{id=")
                && l.contains(&conn)
                && l.contains("request{id=")
                && l.contains("prompt_tokens=")
                && l.contains("max_tokens=")
                && l.contains("request finished")
                && l.contains("completion_tokens=")
                && l.contains("elapsed_ms=")),
            "no traced {dialect} request in the log"
        );
    }
    let generated: Vec<&String> = generated.iter().filter(|t| t.len() >= 12).collect();
    assert!(
        !generated.is_empty(),
        "the model generated text to look for"
    );
    for line in &log {
        for word in ["Quixotic", "Zephyr", "marker", "secret", &digest[..16]] {
            assert!(!line.contains(word), "prompt text in the log: {line}");
        }
        for text in &generated {
            assert!(
                !line.contains(text.as_str()),
                "generated text in the log: {line}"
            );
        }
        assert!(
            !line.contains("Replacing char") && !line.contains(" tokenizers"),
            "the tokenizer's character trace in the log: {line}"
        );
    }
}

/// `--model org/name` finds the repository in a Hugging Face cache laid out
/// as `huggingface_hub` writes it (files in `blobs/`, the snapshot's entries
/// symlinks to them, `refs/main` naming the snapshot), and serves it under
/// the repository's name; an id that is not cached fails, naming where it
/// looked.
#[cfg(unix)]
#[test]
fn a_repository_id_is_served_from_the_hugging_face_cache() {
    let hub = std::env::temp_dir().join(format!("tokenwire-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&hub);
    let repo = hub.join("models--karpathy--stories260K");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).expect("snapshot dir");
    std::fs::create_dir_all(repo.join("blobs")).expect("blobs dir");
    std::fs::create_dir_all(repo.join("refs")).expect("refs dir");
    std::fs::write(repo.join("refs").join("main"), commit).expect("refs/main");
    let source = stories260k();
    for (i, name) in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    .iter()
    .enumerate()
    {
        let blob = repo.join("blobs").join(format!("blob{i}"));
        std::fs::copy(source.join(name), &blob).expect("copy into blobs");
        std::os::unix::fs::symlink(format!("../../blobs/blob{i}"), snapshot.join(name))
            .expect("snapshot link");
    }

    let mut served = common::serve({
        let mut cmd = tokenwire();
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "karpathy/stories260K",
        ])
        .env("HF_HUB_CACHE", &hub);
        cmd
    });
    assert!(
        served
            .log
            .iter()
            .any(|l| l.contains("found in the Hugging Face cache")
                && l.contains(&snapshot.display().to_string())),
        "{:?}",
        served.log
    );
    let loaded = served.log.last().expect("a log line");
    assert!(loaded.contains("model=stories260K"), "{loaded}");
    assert!(loaded.contains("vocab_size=512"), "{loaded}");
    let _ = served.child.kill();
    let _ = served.child.wait();

    let out = tokenwire()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--model",
            "karpathy/not-cached",
        ])
        .env("HF_HUB_CACHE", &hub)
        .output()
        .expect("run tokenwire");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not in the Hugging Face cache"), "{stderr}");
    assert!(
        stderr.contains(
            &hub.join("models--karpathy--not-cached")
                .display()
                .to_string()
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(&hub);
}
