//! Many hosts behind a real load balancer: two `tokenwire serve` processes
//! behind nginx (Debian's package) running the repository's own
//! configuration, `deploy/nginx/tokenwire.conf`. One host is killed with
//! SIGKILL while `session` and `responses` clients stream through nginx.
//!
//! - Every `session` client on the dead host reconnects through nginx, lands
//!   on the survivor, resumes with its full history and gets the same greedy
//!   continuation as a conversation that was never interrupted.
//! - Every `responses` client on the dead host gets
//!   `previous_response_not_found` on the survivor (the cache it named died
//!   with its connection) and recovers by resending the conversation as
//!   input, which gives the same continuation.
//!
//! Without nginx the test is skipped with a reason; under CI (`CI=true`) that
//! is a failure.

#![cfg(unix)]

mod common;

use std::sync::Arc;

use common::nginx::start_nginx;
use common::{
    connect, expect, http, recv, send, serve_model, stories260k, system_binary, Ws, WAIT,
};
use serde_json::{json, Value};
use tokio::sync::Barrier;

/// Clients of each dialect. nginx's round robin (one worker) alternates
/// hosts connection by connection, so each host gets some of each.
const CLIENTS: usize = 4;
/// Tokens of the turn that is streaming when the host dies: long enough
/// that every stream is still running at the kill.
const LONG: u64 = 400;
const SHORT: u64 = 24;

fn first_prompt(i: usize) -> String {
    format!("Story {i}. Once upon a time")
}

const SECOND_PROMPT: &str = "Then";

/// Where every client waits for the others. All start their long second
/// turn together (`start`), so that none is near its end while the last
/// still connects, and the host dies once every one has streamed a few
/// bytes of it (`kill`, which the test waits on too). Without `start`, a
/// loaded machine could let the first clients' turns finish on the doomed
/// host before the kill: they would never see it die.
#[derive(Clone)]
struct Sync {
    start: Arc<Barrier>,
    kill: Arc<Barrier>,
}

/// What a client saw: its two replies, and whether it had to recover.
#[derive(Debug)]
struct Run {
    reply1: String,
    reply2: String,
    recovered: bool,
}

// ---- session ----

fn session_prompt(sid: &str, content: &str, index: u64, max: u64) -> Value {
    json!({"type":"prompt","session_id":sid,"content":content,"message_index":index,
           "max_tokens":max,"temperature":0})
}

/// Reads a turn's stream to its `response`; `partial` already holds what was
/// streamed. None if the connection ended first.
async fn finish_session_turn(ws: &mut Ws, partial: &mut String) -> Option<String> {
    loop {
        let v = recv(ws).await?;
        match v["type"].as_str() {
            Some("stream_chunk") => partial.push_str(v["content"].as_str().unwrap_or("")),
            Some("response") => {
                let content = v["content"].as_str().expect("content").to_owned();
                assert_eq!(&content, partial, "the response is what was streamed");
                return Some(content);
            }
            _ => panic!("unexpected {v}"),
        }
    }
}

async fn session_start(ws: &mut Ws, sid: &str) {
    send(
        ws,
        json!({"type":"session_init","session_id":sid,"job_id":1,"conversation_context":[]}),
    )
    .await;
    expect(ws, "session_ready").await;
}

async fn session_client(mut ws: Ws, nginx: String, i: usize, sync: Sync) -> Run {
    let sid = format!("failover-{i}");
    session_start(&mut ws, &sid).await;
    send(&mut ws, session_prompt(&sid, &first_prompt(i), 0, SHORT)).await;
    let reply1 = finish_session_turn(&mut ws, &mut String::new())
        .await
        .expect("the first turn completes");
    sync.start.wait().await;
    send(&mut ws, session_prompt(&sid, SECOND_PROMPT, 2, LONG)).await;
    // A few tokens of the second turn, then the host may die.
    let mut partial = String::new();
    while partial.len() < 8 {
        let v = recv(&mut ws).await.expect("streaming");
        assert_eq!(v["type"], "stream_chunk", "{v}");
        partial.push_str(v["content"].as_str().unwrap_or(""));
    }
    sync.kill.wait().await;
    if let Some(reply2) = finish_session_turn(&mut ws, &mut partial).await {
        return Run {
            reply1,
            reply2,
            recovered: false,
        };
    }
    // The host died mid-stream: reconnect through nginx with the history.
    let mut ws = connect(&nginx, "/ws/session").await;
    let history = json!([{"role":"user","content":first_prompt(i)},
                         {"role":"assistant","content":reply1}]);
    send(
        &mut ws,
        json!({"type":"session_resume","session_id":sid,"job_id":1,
               "conversation_context":history,"last_message_index":1}),
    )
    .await;
    let ready = expect(&mut ws, "session_ready").await;
    assert_eq!(ready["message_count"], 2, "{ready}");
    send(&mut ws, session_prompt(&sid, SECOND_PROMPT, 2, LONG)).await;
    let reply2 = finish_session_turn(&mut ws, &mut String::new())
        .await
        .expect("the resumed turn completes");
    assert!(
        reply2.starts_with(&partial),
        "the resumed reply continues what streamed before the crash: {partial:?} then {reply2:?}"
    );
    Run {
        reply1,
        reply2,
        recovered: true,
    }
}

/// The same conversation, never interrupted.
async fn session_reference(nginx: &str, i: usize) -> (String, String) {
    let sid = format!("reference-{i}");
    let mut ws = connect(nginx, "/ws/session").await;
    session_start(&mut ws, &sid).await;
    send(&mut ws, session_prompt(&sid, &first_prompt(i), 0, SHORT)).await;
    let r1 = finish_session_turn(&mut ws, &mut String::new()).await;
    send(&mut ws, session_prompt(&sid, SECOND_PROMPT, 2, LONG)).await;
    let r2 = finish_session_turn(&mut ws, &mut String::new()).await;
    (r1.expect("reply 1"), r2.expect("reply 2"))
}

// ---- responses ----

fn create(input: Value, previous: Option<&str>, max: u64) -> Value {
    let mut v = json!({"type":"response.create","model":"stories260K","input":input,
                       "max_output_tokens":max,"temperature":0});
    if let Some(id) = previous {
        v["previous_response_id"] = json!(id);
    }
    v
}

/// Reads a response's events to its terminal one; `partial` already holds
/// the text streamed. Returns (response id, text), or None if the connection
/// ended first.
async fn finish_response(ws: &mut Ws, partial: &mut String) -> Option<(String, String)> {
    loop {
        let v = recv(ws).await?;
        match v["type"].as_str() {
            Some("response.output_text.delta") => {
                partial.push_str(v["delta"].as_str().unwrap_or(""))
            }
            Some("response.completed") | Some("response.incomplete") => {
                let r = &v["response"];
                let text = r["output"][0]["content"][0]["text"]
                    .as_str()
                    .expect("output text")
                    .to_owned();
                assert_eq!(&text, partial, "the response is what was streamed");
                return Some((r["id"].as_str().expect("id").to_owned(), text));
            }
            Some("error") | Some("response.failed") => panic!("unexpected {v}"),
            _ => {}
        }
    }
}

async fn responses_client(mut ws: Ws, nginx: String, i: usize, sync: Sync) -> Run {
    send(&mut ws, create(json!(first_prompt(i)), None, SHORT)).await;
    let (id1, reply1) = finish_response(&mut ws, &mut String::new())
        .await
        .expect("the first response completes");
    sync.start.wait().await;
    send(&mut ws, create(json!(SECOND_PROMPT), Some(&id1), LONG)).await;
    let mut partial = String::new();
    while partial.len() < 8 {
        let v = recv(&mut ws).await.expect("streaming");
        assert_ne!(v["type"], "error", "{v}");
        if v["type"] == "response.output_text.delta" {
            partial.push_str(v["delta"].as_str().unwrap_or(""));
        }
    }
    sync.kill.wait().await;
    if let Some((_, reply2)) = finish_response(&mut ws, &mut partial).await {
        return Run {
            reply1,
            reply2,
            recovered: false,
        };
    }
    // The host died, and with it the connection's cache: the survivor does
    // not know the previous response, and says so.
    let mut ws = connect(&nginx, "/v1/responses").await;
    send(&mut ws, create(json!(SECOND_PROMPT), Some(&id1), LONG)).await;
    let err = expect(&mut ws, "error").await;
    assert_eq!(err["status"], 404, "{err}");
    assert_eq!(err["error"]["code"], "previous_response_not_found", "{err}");
    // Recovery: the whole conversation as input.
    let context = json!([
        {"role":"user","content":first_prompt(i)},
        {"role":"assistant","content":reply1},
        {"role":"user","content":SECOND_PROMPT},
    ]);
    send(&mut ws, create(context, None, LONG)).await;
    let (_, reply2) = finish_response(&mut ws, &mut String::new())
        .await
        .expect("the resent conversation completes");
    assert!(
        reply2.starts_with(&partial),
        "the recovered reply continues what streamed before the crash: {partial:?} then {reply2:?}"
    );
    Run {
        reply1,
        reply2,
        recovered: true,
    }
}

async fn responses_reference(nginx: &str, i: usize) -> (String, String) {
    let mut ws = connect(nginx, "/v1/responses").await;
    send(&mut ws, create(json!(first_prompt(i)), None, SHORT)).await;
    let (id1, r1) = finish_response(&mut ws, &mut String::new())
        .await
        .expect("reply 1");
    send(&mut ws, create(json!(SECOND_PROMPT), Some(&id1), LONG)).await;
    let (_, r2) = finish_response(&mut ws, &mut String::new())
        .await
        .expect("reply 2");
    (r1, r2)
}

#[test]
fn a_host_killed_behind_nginx_loses_no_session_and_responses_clients_recover() {
    let Some(nginx_bin) = system_binary(&["nginx"], "nginx") else {
        return;
    };
    let model = stories260k();
    let (mut doomed, addr1) = serve_model(&model);
    let (mut survivor, addr2) = serve_model(&model);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let nginx = start_nginx(&nginx_bin, &[addr1.clone(), addr2.clone()]);
        assert_eq!(http(&nginx.addr, "GET", "/health", None).await.0, 200);

        // Connected one after another, so the round robin alternates hosts.
        let sync = Sync {
            start: Arc::new(Barrier::new(2 * CLIENTS)),
            kill: Arc::new(Barrier::new(2 * CLIENTS + 1)),
        };
        let mut sessions = Vec::new();
        for i in 0..CLIENTS {
            let ws = connect(&nginx.addr, "/ws/session").await;
            sessions.push(tokio::spawn(session_client(
                ws,
                nginx.addr.clone(),
                i,
                sync.clone(),
            )));
        }
        let mut responses = Vec::new();
        for i in 0..CLIENTS {
            let ws = connect(&nginx.addr, "/v1/responses").await;
            responses.push(tokio::spawn(responses_client(
                ws,
                nginx.addr.clone(),
                i,
                sync.clone(),
            )));
        }

        // Every client is mid-stream: kill one host.
        tokio::time::timeout(WAIT, sync.kill.wait())
            .await
            .expect("every client streams");
        doomed.kill().expect("SIGKILL");
        doomed.wait().expect("reaped");

        let mut session_runs = Vec::new();
        for s in sessions {
            session_runs.push(s.await.expect("session client"));
        }
        let mut responses_runs = Vec::new();
        for r in responses {
            responses_runs.push(r.await.expect("responses client"));
        }
        for (kind, runs) in [("session", &session_runs), ("responses", &responses_runs)] {
            let recovered = runs.iter().filter(|r| r.recovered).count();
            assert!(
                recovered > 0 && recovered < runs.len(),
                "{kind}: {recovered} of {} clients were on the killed host; the round robin \
                 should have put some on each: {runs:?}",
                runs.len()
            );
        }

        // nginx sends everything to the survivor now, HTTP included.
        assert_eq!(http(&nginx.addr, "GET", "/health", None).await.0, 200);
        for (i, run) in session_runs.iter().enumerate() {
            let (r1, r2) = session_reference(&nginx.addr, i).await;
            assert_eq!(run.reply1, r1, "session {i}: first reply");
            assert_eq!(run.reply2, r2, "session {i}: the same continuation");
        }
        for (i, run) in responses_runs.iter().enumerate() {
            let (r1, r2) = responses_reference(&nginx.addr, i).await;
            assert_eq!(run.reply1, r1, "responses {i}: first reply");
            assert_eq!(run.reply2, r2, "responses {i}: the same continuation");
        }
        drop(nginx);
    });
    let _ = survivor.kill();
    let _ = survivor.wait();
}
