//! Helpers for the tests that run the `tokenwire` binary as an operator does.
#![allow(dead_code)] // Each test file uses its own share of these.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStderr, Command, Stdio};

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
