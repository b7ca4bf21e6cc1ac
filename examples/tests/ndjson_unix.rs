//! Runs the `ndjson-unix` example as a user would: the built binary on a
//! fresh socket path, a client speaking `generate` frames as lines. Greedy
//! decoding must stream stories260K's reference text, and a bad line later
//! gets the dialect's recoverable error while the connection goes on.

#![cfg(unix)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// The example, started, killed when dropped.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(socket: &std::path::Path) -> Example {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ndjson-unix"))
        .arg(socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the example");
    let mut ready = String::new();
    let out = child.stdout.take().expect("stdout");
    BufReader::new(out)
        .read_line(&mut ready)
        .expect("its first line");
    assert!(ready.starts_with("listening on"), "{ready}");
    Example(child)
}

fn lines_until_completion(reader: &mut BufReader<UnixStream>) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "closed early: {frames:?}"
        );
        let frame: Value = serde_json::from_str(&line).expect("each line is JSON");
        let last = matches!(frame["type"].as_str(), Some("completion" | "error"));
        frames.push(frame);
        if last {
            return frames;
        }
    }
}

#[test]
fn the_example_streams_stories260k_over_a_unix_socket() {
    let socket = std::env::temp_dir().join(format!("tw-ndjson-{}.sock", std::process::id()));
    let _example = start(&socket);
    let reference: Value = serde_json::from_slice(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/stories260K/REFERENCE.json"
        ))
        .expect("REFERENCE.json"),
    )
    .expect("JSON");

    let mut stream = UnixStream::connect(&socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));

    let n = reference["greedy_new_tokens"].as_u64().expect("count");
    let config = json!({"type": "config", "prompt": reference["prompt"],
                        "parameters": {"max_tokens": n, "temperature": 0}});
    writeln!(stream, "{config}").expect("write");
    let frames = lines_until_completion(&mut reader);
    assert_eq!(frames[0]["type"], "init", "{frames:?}");
    assert_eq!(frames[0]["model"], "stories260K");
    let done = frames.last().expect("completion");
    assert_eq!(done["type"], "completion", "{frames:?}");
    let text = done["generated_text"].as_str().expect("text");
    let prompt = reference["prompt"].as_str().expect("prompt");
    let full = reference["full_text"].as_str().expect("full");
    assert_eq!(format!("{prompt}{text}"), full);

    // A line that is not a frame: a recoverable error, and the connection
    // goes on to the next generation.
    writeln!(stream, "not json").expect("write");
    let frames = lines_until_completion(&mut reader);
    let error = frames.last().expect("frame");
    assert_eq!(error["type"], "error", "{frames:?}");
    assert_eq!(error["error"], "invalid_request", "{error}");
    assert_eq!(error["recoverable"], true, "{error}");
    writeln!(stream, "{config}").expect("write");
    let again = lines_until_completion(&mut reader);
    assert_eq!(again.last().expect("frame")["generated_text"], text);
    let _ = std::fs::remove_file(&socket);
}
