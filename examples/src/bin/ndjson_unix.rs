//! tokenwire-core over a custom transport: newline-delimited JSON on a Unix socket, each line
//! a `generate` frame, the built-in stories260K model as the engine, one thread driving the Host.
//! Run: `cargo run --release -p tokenwire-examples --bin ndjson-unix -- /tmp/tw.sock`
//! Try: `echo '{"type":"config","prompt":"Once upon a time"}' | nc -U /tmp/tw.sock`

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as Wall};

use tokenwire_core::{ConnId, Dialect, Host, HostConfig, Input, Instant, Output, Transport};
use tokenwire_kernels::{Engine, EngineOptions};

type Writers = Arc<Mutex<HashMap<ConnId, UnixStream>>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1);
    let path = path.ok_or("usage: ndjson-unix SOCKET_PATH")?;
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let mut engine = Engine::builtin(&EngineOptions::default())?;
    let (info, codec) = (engine.model_info(), engine.codec());
    let mut host = Host::with_model(HostConfig::default(), info, codec, 7u64);
    let (tx, rx) = channel();
    let writers = Writers::default();
    let w = writers.clone();
    std::thread::spawn(move || accept(listener, tx, w));
    println!("listening on {path}");
    let start = Wall::now();
    let now = || Instant::from_nanos(start.elapsed().as_nanos() as u64);
    let mut inbox = VecDeque::new();
    loop {
        // An input the Host's outputs asked for, a socket's, or a timeout.
        let input = match inbox.pop_front() {
            Some(input) => input,
            None => {
                let deadline = host.poll_timeout().map_or(u64::MAX, |t| t.as_nanos());
                let wait = Duration::from_nanos(deadline.saturating_sub(now().as_nanos()));
                match rx.recv_timeout(wait) {
                    Ok(input) => input,
                    Err(RecvTimeoutError::Timeout) => Input::Timeout,
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            }
        };
        host.handle(now(), input);
        // Every output is handled before the next input: the whole contract.
        while let Some(out) = host.poll_output() {
            let mut writers = writers.lock().map_err(|_| "a socket thread panicked")?;
            match out {
                Output::Send { conn, text } => {
                    writers.get_mut(&conn).map(|w| writeln!(w, "{text}"));
                }
                Output::Close { conn, .. } => {
                    writers
                        .remove(&conn)
                        .map(|w| w.shutdown(std::net::Shutdown::Both));
                }
                Output::RunStep(plan) => inbox.push_back(match engine.step(&plan) {
                    Ok(done) => Input::StepDone(done),
                    Err(fault) => Input::EngineFault(fault),
                }),
                Output::Tokenize(job) => inbox.push_back(Input::Tokenized(job.run())),
                Output::Ping { conn } => inbox.push_back(Input::Pong { conn }),
                _ => {} // Metrics events, back-pressure: not needed here.
            }
        }
    }
}

/// Opens each connection as a `generate` connection, and gives it a thread
/// that reads its lines into the Host until it closes.
fn accept(listener: UnixListener, tx: Sender<Input>, writers: Writers) {
    for (n, stream) in listener.incoming().flatten().enumerate() {
        let (conn, Ok(reader)) = (ConnId(n as u64 + 1), stream.try_clone()) else {
            continue;
        };
        if let Ok(mut map) = writers.lock() {
            map.insert(conn, stream);
        }
        let (tx, dialect, transport) = (tx.clone(), Dialect::Generate, Transport::WebSocket);
        let (query, peer) = (String::new(), "unix".into());
        let _ = tx.send(Input::Open {
            conn,
            dialect,
            transport,
            query,
            authorization: None,
            peer,
        });
        std::thread::spawn(move || {
            for text in BufReader::new(reader).lines().map_while(Result::ok) {
                let _ = tx.send(Input::Text { conn, text });
            }
            let _ = tx.send(Input::Closed { conn });
        });
    }
}
