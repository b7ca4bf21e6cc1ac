//! Drives a tokenwire Host from a plain loop, with no async runtime: the shape
//! of any custom transport (a game server's socket layer, an embedded device,
//! a message bus). The engine here is the scripted test engine; a real one is
//! `tokenwire_kernels::Engine::step`.
//!
//! Run: `cargo run -p tokenwire-core --example custom_loop`

use std::collections::VecDeque;
use std::time::Instant as WallClock;

use tokenwire_core::testing::{tiny_model_info, ByteCodec, ScriptEngine};
use tokenwire_core::{
    ConnId, Dialect, Host, HostConfig, Input, Instant, JobGrant, Output, Transport,
};

fn main() {
    let start = WallClock::now();
    // The core never reads a clock: we hand it ours, as nanoseconds since start.
    let now = || Instant::from_nanos(start.elapsed().as_nanos() as u64);

    let epoch_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let config = HostConfig {
        epoch_unix_ms,
        ..HostConfig::default()
    };
    let mut host = Host::with_model(config, tiny_model_info(), ByteCodec::shared(), 42u64);
    let mut engine = ScriptEngine::new("Hello from a custom transport! ");

    // Inputs our "transport" produced; a real one reads sockets here.
    let mut inbox: VecDeque<Input> = VecDeque::new();
    let conn = ConnId(1);
    inbox.push_back(Input::Open {
        conn,
        dialect: Dialect::Generate,
        transport: Transport::WebSocket,
        query: String::new(),
        authorization: None,
        peer: "in-process".into(),
    });
    inbox.push_back(Input::Text {
        conn,
        text: r#"{"type":"config","prompt":"Hi","parameters":{"max_tokens":24}}"#.into(),
    });

    let mut finished = false;
    while !finished {
        // 1. Feed one input (or a timeout once its deadline passed).
        let input = match inbox.pop_front() {
            Some(i) => i,
            None => match host.poll_timeout() {
                Some(t) if t <= now() => Input::Timeout,
                // Nothing to do: a real loop would sleep until the deadline or a socket event.
                _ => break,
            },
        };
        host.handle(now(), input);

        // 2. Drain every output before the next input: that is the whole contract.
        while let Some(out) = host.poll_output() {
            match out {
                Output::Send { conn, text } => {
                    println!("-> {conn:?} {text}");
                    finished |= text.contains(r#""type":"completion""#);
                }
                Output::Close { conn, code, reason } => println!("close {conn:?} {code} {reason}"),
                // One step at a time: run it (on any thread you like) and report back.
                Output::RunStep(plan) => inbox.push_back(Input::StepDone(engine.step(&plan))),
                // Tokenizing may be slow for long prompts: a real loop runs it
                // on a worker thread so other connections keep streaming.
                Output::Tokenize(job) => inbox.push_back(Input::Tokenized(job.run())),
                Output::Ping { conn } => inbox.push_back(Input::Pong { conn }),
                // A client's job id (`session`): ask your payment service; this
                // loop accepts every job with no token cap.
                Output::VerifyJob(check) => inbox.push_back(Input::JobVerified {
                    check: check.id,
                    verdict: Ok(JobGrant::default()),
                }),
                // Back-pressure: stop (and restart) reading this connection.
                Output::PauseReading { .. } | Output::ResumeReading { .. } => {}
                Output::Event(_) | Output::Feedback(_) | Output::ShutdownComplete => {}
            }
        }
    }
}
