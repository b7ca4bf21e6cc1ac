//! The `tokenwire` binary as an operator runs it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn tokenwire() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tokenwire"));
    // The child's environment only: the test process's own is untouched.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TOKENWIRE_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

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
fn tiny_model_is_announced_first_and_sigterm_stops_cleanly() {
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
        first.contains("no --model given: serving the built-in tiny model (random weights)"),
        "{first}"
    );
    // Wait for the model, then ask it to stop.
    for line in lines.by_ref() {
        if line.expect("utf-8").contains("model loaded") {
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
