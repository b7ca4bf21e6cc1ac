//! Arbitrary input sequences into a Host serving the tiny byte model: opens
//! on every path, frames that are either raw fuzz text or messages assembled
//! from fuzzed fields (so the fuzzer reaches deep dialect states), pongs,
//! closes, queue signals, time jumps, engine results and faults, KV capacity
//! changes, text jobs held and answered late, and shutdown, through the core's test harness (virtual time, a
//! scripted engine). After every operation the Host's own invariants must
//! hold, and it must never panic.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
use tokenwire_core::testing::Harness;
use tokenwire_core::{
    ConnId, Dialect, Duration, EngineFault, EngineFaultKind, HostConfig, Input, Transport,
};

#[derive(Debug, Arbitrary)]
enum Field {
    Str(String),
    Num(f64),
    Int(i64),
    Bool(bool),
    Null,
    Obj(Vec<(u8, i32)>),
}

#[derive(Debug, Arbitrary)]
enum Op {
    Open {
        conn: u8,
        path: u8,
    },
    Raw {
        conn: u8,
        text: String,
    },
    Config {
        conn: u8,
        prompt: String,
        max_tokens: Option<u16>,
        temperature: Option<u8>,
        stop: Option<String>,
        options: u8,
    },
    Control {
        conn: u8,
        action: u8,
        params: Vec<(u8, Field)>,
    },
    Feedback {
        conn: u8,
        rating: Field,
        text: Option<String>,
    },
    Typed {
        conn: u8,
        kind: u8,
        fields: Vec<(u8, Field)>,
    },
    Binary {
        conn: u8,
        len: u16,
    },
    TooLarge {
        conn: u8,
    },
    Pong {
        conn: u8,
    },
    Closed {
        conn: u8,
    },
    QueueFull {
        conn: u8,
    },
    QueueDrained {
        conn: u8,
    },
    Advance {
        millis: u32,
    },
    Step,
    Fault {
        kind: u8,
    },
    Capacity {
        blocks: u8,
    },
    Shutdown,
    /// Hold text jobs from now on (or answer them at once again).
    HoldText {
        hold: bool,
    },
    /// Answer the held text jobs, in the order they went out.
    FinishText,
}

const PATHS: [&str; 6] = [
    "/generate",
    "/ws/session",
    "/v1/responses",
    "/ws",
    "/",
    "/nope",
];
const ACTIONS: [&str; 6] = ["stop", "pause", "resume", "regenerate", "modify", "bogus"];
const KINDS: [&str; 14] = [
    "COMPLETION",
    "INTERRUPTED",
    "AWAIT_MORE",
    "SENTENCE_COMPLETED",
    "config",
    "control",
    "feedback",
    "other",
    "session_init",
    "session_resume",
    "prompt",
    "session_end",
    "response.create",
    "response.cancel",
];
const NAMES: [&str; 35] = [
    "requestId",
    "conversationId",
    "context",
    "lastReceivedIndex",
    "sentenceIndex",
    "window",
    "sentenceWindow",
    "maxTokens",
    "prompts",
    "request_id",
    "generation_config",
    "input",
    "previous_response_id",
    "instructions",
    "max_output_tokens",
    "generate",
    "session_id",
    "job_id",
    "content",
    "message_index",
    "conversation_context",
    "last_message_index",
    "payload",
    "prompt",
    "model",
    "parameters",
    "options",
    "action",
    "rating",
    "text",
    "position",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
];

fn field(f: &Field) -> Value {
    match f {
        Field::Str(s) => json!(s),
        Field::Num(x) => json!(x),
        Field::Int(i) => json!(i),
        Field::Bool(b) => json!(b),
        Field::Null => Value::Null,
        Field::Obj(kv) => Value::Object(
            kv.iter()
                .map(|(k, v)| (NAMES[*k as usize % NAMES.len()].to_string(), json!(v)))
                .collect(),
        ),
    }
}

fn object(kind: &str, fields: &[(u8, Field)]) -> Value {
    let mut m: serde_json::Map<String, Value> = fields
        .iter()
        .map(|(k, v)| (NAMES[*k as usize % NAMES.len()].to_string(), field(v)))
        .collect();
    m.insert("type".into(), json!(kind));
    Value::Object(m)
}

/// Feeds `input` to the harness's Host (which collects the outputs and
/// refuses a second outstanding step), then checks the Host's invariants.
fn feed(h: &mut Harness, input: Input) {
    h.input(input);
    checked(h);
}

fn checked(h: &Harness) {
    if let Err(e) = h.host.check_invariants() {
        panic!("host invariant broken: {e}");
    }
}

fn send_text(h: &mut Harness, conn: u8, text: String) {
    feed(
        h,
        Input::Text {
            conn: ConnId(conn as u64 % 4),
            text,
        },
    );
}

fuzz_target!(|ops: Vec<Op>| {
    // One cai key, so that `/` connections (opened with it) reach the dialect.
    let keys = KeyRing::new(vec![ApiKey {
        name: "fuzz".into(),
        sha256: hash_key("k"),
        orgs: vec!["o".into()],
        requests_per_minute: Some(30),
        tokens_per_minute: Some(2000),
    }])
    .ok();
    let config = HostConfig {
        keys: keys,
        // The script repeats itself: prompt lookup drafts, and steps give
        // several tokens at once.
        draft: tokenwire_core::DraftConfig {
            max_tokens: 4,
            ngram_min: 1,
            ngram_max: 3,
            max_seqs: 4,
        },
        ..HostConfig::default()
    };
    let mut h = Harness::new(config, "the fox. e.g. 3.14 is it? ", 7);
    // Pongs come only when the fuzzer sends them, so keepalive closes happen.
    h.auto_pong = false;
    for op in ops.into_iter().take(256) {
        let c = |conn: u8| ConnId(conn as u64 % 4);
        match op {
            Op::Open { conn, path } => {
                let path = PATHS[path as usize % PATHS.len()];
                if let Some(dialect) = Dialect::from_path(path) {
                    feed(
                        &mut h,
                        Input::Open {
                            conn: c(conn),
                            dialect,
                            transport: Transport::WebSocket,
                            // Every other `/` connection authenticates.
                            query: if conn % 2 == 0 {
                                "authorization=Bearer%20k&orgId=o".into()
                            } else {
                                String::new()
                            },
                            authorization: None,
                            peer: "fuzz".into(),
                        },
                    );
                }
            }
            Op::Raw { conn, text } => send_text(&mut h, conn, text),
            Op::Config {
                conn,
                prompt,
                max_tokens,
                temperature,
                stop,
                options,
            } => {
                let mut params = serde_json::Map::new();
                if let Some(m) = max_tokens {
                    params.insert("max_tokens".into(), json!(m));
                }
                if let Some(t) = temperature {
                    params.insert("temperature".into(), json!(t as f64 / 100.0));
                }
                if let Some(s) = stop {
                    params.insert("stop".into(), json!([s]));
                }
                let v = json!({"type": "config", "prompt": prompt, "parameters": params,
                    "options": {"include_token_ids": options & 1 != 0,
                                "include_logprobs": options & 2 != 0,
                                "include_timing": options & 4 != 0,
                                "include_generated_text": options & 8 != 0,
                                "echo_prompt": options & 16 != 0}});
                send_text(&mut h, conn, v.to_string());
            }
            Op::Control {
                conn,
                action,
                params,
            } => {
                let mut v = object("control", &[]);
                v["action"] = json!(ACTIONS[action as usize % ACTIONS.len()]);
                v["parameters"] = object("x", &params);
                send_text(&mut h, conn, v.to_string());
            }
            Op::Feedback { conn, rating, text } => {
                let v = json!({"type": "feedback", "rating": field(&rating), "text": text});
                send_text(&mut h, conn, v.to_string());
            }
            Op::Typed { conn, kind, fields } => {
                let v = object(KINDS[kind as usize % KINDS.len()], &fields);
                send_text(&mut h, conn, v.to_string());
            }
            Op::Binary { conn, len } => feed(
                &mut h,
                Input::Binary {
                    conn: c(conn),
                    len: len as usize,
                },
            ),
            Op::TooLarge { conn } => feed(&mut h, Input::FrameTooLarge { conn: c(conn) }),
            Op::Pong { conn } => feed(&mut h, Input::Pong { conn: c(conn) }),
            Op::Closed { conn } => feed(&mut h, Input::Closed { conn: c(conn) }),
            Op::QueueFull { conn } => feed(&mut h, Input::QueueFull { conn: c(conn) }),
            Op::QueueDrained { conn } => feed(&mut h, Input::QueueDrained { conn: c(conn) }),
            Op::Advance { millis } => {
                h.advance(Duration::from_millis(millis as u64 % 700_000));
                checked(&h);
            }
            Op::Step => {
                h.step();
                checked(&h);
            }
            Op::Fault { kind } => {
                if let Some(plan) = h.pending_step.take() {
                    let kind = match kind % 3 {
                        0 => EngineFaultKind::OutOfMemory,
                        1 => EngineFaultKind::DeviceLost,
                        _ => EngineFaultKind::Internal("fuzz".into()),
                    };
                    feed(
                        &mut h,
                        Input::EngineFault(EngineFault {
                            step_id: plan.step_id,
                            kind,
                        }),
                    );
                }
            }
            Op::Capacity { blocks } => feed(
                &mut h,
                Input::KvCapacity {
                    num_blocks: blocks as u32,
                },
            ),
            Op::Shutdown => feed(&mut h, Input::Shutdown),
            Op::HoldText { hold } => h.auto_text = !hold,
            Op::FinishText => {
                h.finish_text_jobs();
                checked(&h);
            }
        }
    }
});
