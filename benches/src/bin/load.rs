//! `tw-load`: a load generator for a real `tokenwire serve` process it starts
//! itself (so it can read the server's memory and per-thread CPU time from
//! `/proc`).
//!
//! ```text
//! tw-load idle     --connections 10000 [--sources 4]
//! tw-load stream   --clients 50 --max-tokens 64 --model DIR
//! tw-load overhead --clients 64 --max-tokens 400 --model DIR
//! tw-load hostile  --max-tokens 400 [--model DIR]
//! ```
//!
//! - `idle`: opens N WebSocket connections that only answer pings, and prints
//!   the server's resident memory before and after, and per connection.
//!   Past ~28,000 connections the clients bind several loopback source
//!   addresses (`--sources`), and the file limit must be raised (`ulimit -n`).
//! - `stream`: runs every prompt alone first (greedy), then all N clients at
//!   once; prints aggregate tokens/s, time to first token and inter-token
//!   latency (p50, p99), the server's resident memory, and checks that every
//!   concurrent stream is byte for byte its solo run.
//! - `overhead`: N greedy streams against tokenwire, then the very same
//!   frames, paced the same, from a bare tokio-tungstenite server
//!   (`tw-load bare-server`, a process of its own); prints each server's CPU
//!   time per streamed frame. For tokenwire the engine's threads are left
//!   out, so the figure is what the serving adds to what the engine costs.
//!
//! - `hostile`: one honest greedy `generate` stream alone, then the same
//!   stream while another client sends the hostile corpus (a 4 MiB `batch`
//!   payload of ~120,000 tiny prompts, thousands of tiny and binary frames,
//!   JSON nested past the limit, a 4 MiB prompt, full-size valid payloads
//!   to the per-connection bound); prints the honest stream's longest gap
//!   between tokens in both runs and the server's `host_handle_duration`
//!   histogram (how long single inputs held the driver).
//!
//! Common flags: `--tokenwire PATH` (default: the `tokenwire` binary next to
//! this one), `--server-arg ARG` (repeatable, passed to `tokenwire serve`),
//! `--dialect generate` (the only one served today).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

const USAGE: &str =
    "tw-load idle|stream|overhead|hostile [--connections N] [--clients N] [--max-tokens N]
        [--model DIR] [--sources N] [--tokenwire PATH] [--server-arg ARG]... [--dialect generate]";

/// Prompts the streams use, in turn.
const PROMPTS: [&str; 8] = [
    "Once upon a time",
    "The little dog",
    "One day, Lily",
    "Tom and his friend",
    "There was a big tree",
    "The sun was",
    "A girl named Sue",
    "In the park",
];

#[derive(Debug, Clone)]
struct Args {
    mode: String,
    connections: usize,
    clients: usize,
    max_tokens: u32,
    model: Option<PathBuf>,
    sources: u8,
    tokenwire: PathBuf,
    server_args: Vec<String>,
    dialect: String,
    // bare-server only
    listen: String,
    frames: Option<PathBuf>,
    step_us: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mode = it.next().ok_or(USAGE)?;
    if mode == "--help" || mode == "-h" {
        println!("{USAGE}");
        std::process::exit(0);
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut a = Args {
        mode,
        connections: 10_000,
        clients: 50,
        max_tokens: 64,
        model: None,
        sources: 1,
        tokenwire: exe.with_file_name("tokenwire"),
        server_args: Vec::new(),
        dialect: "generate".into(),
        listen: "127.0.0.1:0".into(),
        frames: None,
        step_us: 1000,
    };
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--connections" => a.connections = num(val()?)? as usize,
            "--clients" => a.clients = num(val()?)? as usize,
            "--max-tokens" => a.max_tokens = num(val()?)? as u32,
            "--model" => a.model = Some(PathBuf::from(val()?)),
            "--sources" => a.sources = num(val()?)?.clamp(1, 250) as u8,
            "--tokenwire" => a.tokenwire = PathBuf::from(val()?),
            "--server-arg" => a.server_args.push(val()?),
            "--dialect" => a.dialect = val()?,
            "--listen" => a.listen = val()?,
            "--frames" => a.frames = Some(PathBuf::from(val()?)),
            "--step-us" => a.step_us = num(val()?)?,
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    if a.dialect != "generate" {
        return Err(format!(
            "--dialect {}: only `generate` is served so far",
            a.dialect
        ));
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tw-load: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = rt.block_on(async {
        match args.mode.as_str() {
            "idle" => idle(&args).await,
            "stream" => stream(&args).await,
            "overhead" => overhead(&args).await,
            "hostile" => hostile(&args).await,
            "bare-server" => bare_server(&args).await,
            other => Err(format!("unknown mode {other}\n{USAGE}")),
        }
    });
    if let Err(e) = result {
        eprintln!("tw-load: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- servers

/// A server process this tool started; killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program args`, waits for its `listening addr=` log line (and, for
/// tokenwire, `model loaded`), and keeps draining its log in the background.
fn spawn_server(program: &PathBuf, args: &[String], wait_model: bool) -> Result<Server, String> {
    let mut child = Command::new(program)
        .args(args)
        .env(
            "TOKENWIRE_LOG",
            "warn,tokenwire_io::server=info,tokenwire_io::engine_thread=info",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let mut addr = None;
    let mut loaded = !wait_model;
    for line in lines.by_ref() {
        let line = line.map_err(|e| e.to_string())?;
        if let Some(rest) = line.split("addr=").nth(1) {
            addr = rest.split_whitespace().next().and_then(|a| a.parse().ok());
        }
        loaded |= line.contains("model loaded");
        if addr.is_some() && loaded {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let addr = addr.ok_or("the server never said where it listens")?;
    Ok(Server { child, addr })
}

fn tokenwire_args(a: &Args, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["serve", "--listen", "127.0.0.1:0", "--seed", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(m) = &a.model {
        v.push("--model".into());
        v.push(m.display().to_string());
    } else {
        v.push("--random-model".into());
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(a.server_args.iter().cloned());
    v
}

/// Resident memory of `pid` in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU time (ns) of `pid`'s threads: (serving threads, engine threads). The
/// engine is the `tokenwire-engine` thread and the unnamed compute threads it
/// fans out to; serving is the tokio threads and the main thread.
fn cpu_split(pid: u32) -> (u64, u64) {
    let mut serving = 0;
    let mut engine = 0;
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for t in dir.flatten() {
        let tid = t.file_name().to_string_lossy().to_string();
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let comm = comm.trim();
        if comm.starts_with("tokio-") || tid == pid.to_string() {
            serving += ns;
        } else {
            engine += ns;
        }
    }
    (serving, engine)
}

/// Total CPU time (ns) of every thread of `pid`.
fn cpu_total(pid: u32) -> u64 {
    let (a, b) = cpu_split(pid);
    a + b
}

// ---------------------------------------------------------------- clients

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Connects from source address 127.0.0.`source` (1-based).
async fn connect(addr: SocketAddr, path: &str, source: u8) -> Result<Ws, String> {
    let sock = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    let src: SocketAddr = format!("127.0.0.{source}:0")
        .parse()
        .map_err(|e| format!("{e}"))?;
    sock.bind(src).map_err(|e| format!("bind {src}: {e}"))?;
    let stream = sock
        .connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let cfg = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let (ws, _) = tokio_tungstenite::client_async_with_config(
        format!("ws://{addr}{path}"),
        stream,
        Some(cfg),
    )
    .await
    .map_err(|e| format!("handshake: {e}"))?;
    Ok(ws)
}

async fn idle(a: &Args) -> Result<(), String> {
    let limit = (a.connections + 100).to_string();
    let server = spawn_server(
        &a.tokenwire,
        &tokenwire_args(a, &["--max-connections", &limit]),
        true,
    )?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss(server.pid());
    let started = Instant::now();
    let (done_tx, mut done_rx) = mpsc::channel::<Result<(), String>>(1024);
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for i in 0..a.connections {
        let source = 1 + (i % a.sources as usize) as u8;
        let ws = connect(server.addr, "/generate", source)
            .await
            .map_err(|e| format!("connection {i}: {e}"))?;
        opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let done = done_tx.clone();
        tokio::spawn(async move {
            // Only reading: pings are answered by the library.
            let (_, mut rx) = ws.split();
            while let Some(m) = rx.next().await {
                if m.is_err() {
                    break;
                }
            }
            let _ = done.send(Err(format!("connection {i} ended"))).await;
        });
    }
    let open_s = started.elapsed().as_secs_f64();
    // Let the server settle, then read its memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Ok(Err(e)) = done_rx.try_recv() {
        return Err(format!("a connection ended early: {e}"));
    }
    let after = rss(server.pid());
    let n = a.connections as u64;
    println!(
        "idle: {n} WebSocket connections opened in {open_s:.1} s; server RSS {:.1} MB before, {:.1} MB after; {:.0} bytes per idle connection",
        before as f64 / 1e6,
        after as f64 / 1e6,
        (after.saturating_sub(before)) as f64 / n as f64
    );
    Ok(())
}

/// One stream's record: its frames, when each came, and its text.
#[derive(Debug, Clone, Default)]
struct Streamed {
    frames: Vec<String>,
    token_times: Vec<Duration>,
    text: String,
}

async fn run_stream(addr: SocketAddr, prompt: &str, max_tokens: u32) -> Result<Streamed, String> {
    let mut ws = connect(addr, "/generate", 1).await?;
    let cfg = json!({"type": "config", "prompt": prompt,
                     "parameters": {"max_tokens": max_tokens, "temperature": 0}});
    let sent = Instant::now();
    ws.send(Message::text(cfg.to_string()))
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Streamed::default();
    while let Some(m) = ws.next().await {
        let m = m.map_err(|e| e.to_string())?;
        let Message::Text(t) = m else { continue };
        let v: Value = serde_json::from_str(t.as_str()).map_err(|e| e.to_string())?;
        out.frames.push(t.to_string());
        match v["type"].as_str() {
            Some("token") => out.token_times.push(sent.elapsed()),
            Some("completion") => {
                out.text = v["generated_text"].as_str().unwrap_or("").to_string();
                break;
            }
            Some("error") => return Err(format!("server error: {v}")),
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(out)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

async fn concurrent(
    addr: SocketAddr,
    n: usize,
    max_tokens: u32,
) -> Result<(Vec<Streamed>, f64), String> {
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..n {
        let prompt = PROMPTS[i % PROMPTS.len()].to_string();
        handles.push(tokio::spawn(async move {
            run_stream(addr, &prompt, max_tokens).await
        }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.map_err(|e| e.to_string())??);
    }
    Ok((out, started.elapsed().as_secs_f64()))
}

async fn stream(a: &Args) -> Result<(), String> {
    if a.model.is_none() {
        return Err("stream needs --model DIR (a real model)".into());
    }
    let server = spawn_server(&a.tokenwire, &tokenwire_args(a, &[]), true)?;
    // Solo runs: the reference text of each prompt.
    let mut solo: BTreeMap<&str, String> = BTreeMap::new();
    for p in PROMPTS.iter().take(a.clients.min(PROMPTS.len())) {
        solo.insert(p, run_stream(server.addr, p, a.max_tokens).await?.text);
    }
    let rss_before = rss(server.pid());
    let (runs, wall) = concurrent(server.addr, a.clients, a.max_tokens).await?;
    let rss_peak = rss(server.pid());
    let mut ttft = Vec::new();
    let mut itl = Vec::new();
    let mut tokens = 0usize;
    let mut mismatched = 0;
    for (i, r) in runs.iter().enumerate() {
        if let Some(first) = r.token_times.first() {
            ttft.push(first.as_secs_f64() * 1e3);
        }
        for w in r.token_times.windows(2) {
            itl.push((w[1] - w[0]).as_secs_f64() * 1e3);
        }
        tokens += r.token_times.len();
        if solo.get(PROMPTS[i % PROMPTS.len()]) != Some(&r.text) {
            mismatched += 1;
        }
    }
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    println!(
        "stream: {} concurrent greedy streams of {} tokens: {tokens} tokens in {wall:.2} s = {:.0} tokens/s; \
         TTFT p50 {:.1} ms p99 {:.1} ms; inter-token p50 {:.2} ms p99 {:.2} ms; server RSS {:.1} MB (idle {:.1} MB); \
         {} of {} streams byte for byte their solo run",
        a.clients,
        a.max_tokens,
        tokens as f64 / wall,
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.99),
        percentile(&itl, 0.5),
        percentile(&itl, 0.99),
        rss_peak as f64 / 1e6,
        rss_before as f64 / 1e6,
        a.clients - mismatched,
        a.clients
    );
    if mismatched > 0 {
        return Err(format!("{mismatched} streams differ from their solo runs"));
    }
    Ok(())
}

async fn overhead(a: &Args) -> Result<(), String> {
    let server = spawn_server(&a.tokenwire, &tokenwire_args(a, &[]), true)?;
    // Warm up (first-request costs) and measure.
    let _ = concurrent(server.addr, a.clients.min(4), 8).await?;
    let (s0, e0) = cpu_split(server.pid());
    let (runs, wall) = concurrent(server.addr, a.clients, a.max_tokens).await?;
    let (s1, e1) = cpu_split(server.pid());
    drop(server);
    let frames: usize = runs.iter().map(|r| r.frames.len()).sum();
    let per_client = runs
        .iter()
        .map(|r| r.frames.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let step_us = (wall * 1e6 / per_client as f64) as u64;
    let tw_serving = (s1 - s0) as f64 / frames as f64;
    let tw_engine = (e1 - e0) as f64 / frames as f64;

    // The same frames from the bare server, paced the same.
    let file = std::env::temp_dir().join(format!("tw-load-frames-{}.json", std::process::id()));
    let all: Vec<&Vec<String>> = runs.iter().map(|r| &r.frames).collect();
    std::fs::write(
        &file,
        serde_json::to_string(&all).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let bare = spawn_server(
        &exe,
        &[
            "bare-server".into(),
            "--frames".into(),
            file.display().to_string(),
            "--step-us".into(),
            step_us.to_string(),
        ],
        false,
    )?;
    let b0 = cpu_total(bare.pid());
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..a.clients {
        let addr = bare.addr;
        handles.push(tokio::spawn(async move {
            let mut ws = connect(addr, &format!("/generate?client={i}"), 1).await?;
            ws.send(Message::text("{\"type\":\"config\"}"))
                .await
                .map_err(|e| e.to_string())?;
            let mut n = 0usize;
            while let Some(m) = ws.next().await {
                match m.map_err(|e| e.to_string())? {
                    Message::Text(_) => n += 1,
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            Ok::<usize, String>(n)
        }));
    }
    let mut bare_frames = 0;
    for h in handles {
        bare_frames += h.await.map_err(|e| e.to_string())??;
    }
    let bare_wall = started.elapsed().as_secs_f64();
    let b1 = cpu_total(bare.pid());
    let _ = std::fs::remove_file(&file);
    let bare_cpu = (b1 - b0) as f64 / bare_frames.max(1) as f64;
    println!(
        "overhead: {} streams, {frames} frames in {wall:.2} s (tokenwire) and {bare_frames} in {bare_wall:.2} s (bare); \
         CPU per frame: tokenwire serving {:.1} us (engine {:.1} us more), bare tokio-tungstenite {:.1} us; ratio {:.2}",
        a.clients,
        tw_serving / 1e3,
        tw_engine / 1e3,
        bare_cpu / 1e3,
        tw_serving / bare_cpu
    );
    Ok(())
}

/// A bare tokio-tungstenite server: client `i` (from `?client=i`) gets the
/// frames recorded for stream `i`, one per tick of a shared `--step-us` clock
/// (as an engine step would produce them), then a close.
// The handshake callback's error type is tungstenite's own (an HTTP response).
#[allow(clippy::result_large_err)]
async fn bare_server(a: &Args) -> Result<(), String> {
    let path = a.frames.as_ref().ok_or("bare-server needs --frames FILE")?;
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let frames: Vec<Vec<String>> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let frames = Arc::new(frames);
    let listener = TcpListener::bind(&a.listen)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "listening addr={}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    // The shared clock: every tick, each connection may send its next frame.
    let (tick_tx, _) = tokio::sync::broadcast::channel::<()>(4);
    let tick = tick_tx.clone();
    let step = Duration::from_micros(a.step_us.max(1));
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(step);
        loop {
            iv.tick().await;
            let _ = tick.send(());
        }
    });
    loop {
        let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let frames = frames.clone();
        let mut ticks = tick_tx.subscribe();
        tokio::spawn(async move {
            let mut client = 0usize;
            let cb = |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                client = req
                    .uri()
                    .query()
                    .and_then(|q| q.strip_prefix("client="))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                Ok(resp)
            };
            let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, cb).await else {
                return;
            };
            // Wait for the client's request, as tokenwire would.
            if ws.next().await.is_none() {
                return;
            }
            let mine = frames.get(client).cloned().unwrap_or_default();
            for f in mine {
                if ticks.recv().await.is_err() {
                    return;
                }
                if ws.send(Message::text(f)).await.is_err() {
                    return;
                }
            }
            let _ = ws.close(None).await;
            while let Some(Ok(_)) = ws.next().await {}
        });
    }
}

// ---------------------------------------------------------------- hostile

/// The hostile corpus, as (what, frames); each frame text or binary.
fn hostile_corpus() -> Vec<(&'static str, Vec<Message>)> {
    // ~120,000 one-byte prompts: just under the 4 MiB frame limit.
    let mut big = String::with_capacity(4 << 20);
    big.push_str(r#"{"prompts":["#);
    let mut i = 0u32;
    while big.len() < (4 << 20) - 64 {
        if i > 0 {
            big.push(',');
        }
        big.push_str(&format!(r#"{{"request_id":"{i}","prompt":"x"}}"#));
        i += 1;
    }
    big.push_str("]}");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let long_prompt = json!({"type": "config", "prompt": "x".repeat((4 << 20) - 200),
                             "parameters": {"max_tokens": 4}})
    .to_string();
    let full_payload = json!({
        "prompts": (0..256).map(|i| json!({"request_id": format!("v{i}"), "prompt": "Once upon a time"}))
            .collect::<Vec<_>>(),
        "generation_config": {"max_new_tokens": 2},
        "stream_response": false
    })
    .to_string();
    vec![
        (
            "a 4 MiB batch payload of ~120,000 prompts",
            vec![Message::text(big)],
        ),
        (
            "5,000 tiny invalid frames",
            (0..5000).map(|_| Message::text("{")).collect(),
        ),
        (
            "5,000 binary frames",
            (0..5000).map(|_| Message::binary(vec![0u8; 8])).collect(),
        ),
        ("JSON nested 100,000 deep", vec![Message::text(deep)]),
        (
            "20 payloads of 256 valid prompts",
            (0..20)
                .map(|_| Message::text(full_payload.clone()))
                .collect(),
        ),
        ("a 4 MiB prompt", vec![Message::text(long_prompt)]),
    ]
}

/// Sends every frame of the corpus (a fresh connection per part, reading
/// and dropping whatever comes back, so the server never waits on this
/// client). Returns, per part, the longest any one input held the driver
/// meanwhile (an upper bound from the histogram's buckets, in seconds).
async fn send_hostile(addr: SocketAddr) -> Result<Vec<(&'static str, String)>, String> {
    let mut worst = Vec::new();
    for (what, frames) in hostile_corpus() {
        let before = handle_buckets(&get_metrics(addr).await?);
        let path = if what == "a 4 MiB prompt" {
            "/generate"
        } else {
            "/ws"
        };
        let ws = connect(addr, path, 2).await?;
        let (mut tx, mut rx) = ws.split();
        // Frames of one connection are handled in order: once the answer
        // to a last, recognisable frame comes, every frame before it has
        // been handled too.
        let reader = tokio::spawn(async move {
            while let Some(Ok(m)) = rx.next().await {
                if m.to_text().is_ok_and(|t| t.contains("sentinel-7f3a")) {
                    break;
                }
            }
        });
        for f in frames {
            if tx.send(f).await.is_err() {
                break;
            }
        }
        let sentinel = if path == "/ws" {
            json!({"prompts": [{"request_id": "sentinel-7f3a", "prompt": "x"}],
                   "generation_config": {"num_beams": 0}})
        } else {
            json!({"type": "config", "prompt": "x", "model": "sentinel-7f3a"})
        };
        let _ = tx.send(Message::text(sentinel.to_string())).await;
        let _ = tokio::time::timeout(Duration::from_secs(60), reader).await;
        let _ = tx.close().await;
        let after = handle_buckets(&get_metrics(addr).await?);
        worst.push((what, slowest_bucket(&before, &after)));
    }
    Ok(worst)
}

/// The smallest upper bound that holds every input counted between two
/// samples of the histogram.
fn slowest_bucket(before: &[(String, u64)], after: &[(String, u64)]) -> String {
    let total = |b: &[(String, u64)]| b.last().map_or(0, |x| x.1);
    let all = total(after) - total(before);
    for (i, (le, n)) in after.iter().enumerate() {
        let m = before.get(i).map_or(0, |x| x.1);
        if n - m == all {
            return le.clone();
        }
    }
    "+Inf".into()
}

/// The longest gap between two tokens of a stream, in milliseconds.
fn longest_gap(s: &Streamed) -> f64 {
    s.token_times
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .fold(0.0, f64::max)
}

/// `host_handle_duration` buckets from the metrics text: (upper bound in
/// seconds, cumulative count).
fn handle_buckets(metrics: &str) -> Vec<(String, u64)> {
    metrics
        .lines()
        .filter(|l| l.starts_with("tokenwire_host_handle_duration_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?.to_string();
            let n = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, n))
        })
        .collect()
}

async fn get_metrics(addr: SocketAddr) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

async fn hostile(a: &Args) -> Result<(), String> {
    let server = spawn_server(&a.tokenwire, &tokenwire_args(a, &[]), true)?;
    let prompt = PROMPTS[0];
    let alone = run_stream(server.addr, prompt, a.max_tokens).await?;
    let attack = tokio::spawn(send_hostile(server.addr));
    // Honest streams one after another for as long as the attack lasts.
    let mut streams = 0;
    let mut gap: f64 = 0.0;
    let mut changed = 0;
    while streams == 0 || !attack.is_finished() {
        let honest = run_stream(server.addr, prompt, a.max_tokens).await?;
        streams += 1;
        gap = gap.max(longest_gap(&honest));
        changed += usize::from(honest.text != alone.text);
    }
    let worst = attack.await.map_err(|e| e.to_string())??;
    println!(
        "hostile: honest greedy streams of {} tokens: longest gap {:.1} ms alone; {streams} streams during the attack, \
         longest gap {gap:.1} ms, {} of them with the text of the stream alone",
        a.max_tokens,
        longest_gap(&alone),
        streams - changed
    );
    println!("| hostile input | longest single input on the driver (bucket bound) |");
    println!("|---|---:|");
    for (what, le) in worst {
        let ms = le.parse::<f64>().map_or("over 0.33 s".to_string(), |s| {
            format!("<= {:.2} ms", s * 1e3)
        });
        println!("| {what} | {ms} |");
    }
    if changed > 0 {
        return Err(format!("{changed} honest streams changed under attack"));
    }
    Ok(())
}
