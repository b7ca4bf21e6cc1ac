//! `session`'s promise to clients of stateless hosts: a host process killed
//! with SIGKILL mid-stream loses nothing the client holds. The client resumes
//! on a second `tokenwire serve` process with its history and gets the same
//! (greedy) continuation as a run that was never interrupted.

mod common;

use common::{connect, expect, recv, send, serve_model as serve, stories260k, Ws};

use serde_json::{json, Value};

fn prompt(content: &str, index: u64) -> Value {
    json!({"type":"prompt","session_id":"crash-test","content":content,"message_index":index,
           "max_tokens":48,"temperature":0})
}

/// A whole turn: the chunks streamed and the response.
async fn turn(ws: &mut Ws, content: &str, index: u64) -> (String, Value) {
    send(ws, prompt(content, index)).await;
    let mut streamed = String::new();
    loop {
        let v = recv(ws).await.expect("a frame");
        match v["type"].as_str() {
            Some("stream_chunk") => streamed.push_str(v["content"].as_str().unwrap_or("")),
            Some("response") => return (streamed, v),
            _ => panic!("unexpected {v}"),
        }
    }
}

#[cfg(unix)]
#[test]
fn a_session_killed_mid_stream_resumes_on_another_host_with_the_same_continuation() {
    let model = stories260k();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (mut first, addr1) = serve(&model);
    let (mut second, addr2) = serve(&model);
    rt.block_on(async {
        // Host 1: one whole turn, stored by the client; the second streams
        // and the host dies in the middle of it.
        let mut ws = connect(&addr1, "/ws/session").await;
        send(
            &mut ws,
            json!({"type":"session_init","session_id":"crash-test","job_id":7,
                             "conversation_context":[]}),
        )
        .await;
        expect(&mut ws, "session_ready").await;
        let (_, r1) = turn(&mut ws, "Once upon a time", 0).await;
        let reply1 = r1["content"].as_str().expect("content").to_string();
        assert!(!reply1.is_empty());
        send(&mut ws, prompt("Then", 2)).await;
        let mut partial = String::new();
        for _ in 0..3 {
            let v = expect(&mut ws, "stream_chunk").await;
            partial.push_str(v["content"].as_str().unwrap_or(""));
        }
        first.kill().expect("SIGKILL");
        first.wait().expect("reaped");
        while recv(&mut ws).await.is_some() {}

        // Host 2: resume with what the client holds, ask again.
        let mut ws = connect(&addr2, "/ws/session").await;
        let history = json!([{"role":"user","content":"Once upon a time"},
                             {"role":"assistant","content":reply1}]);
        send(
            &mut ws,
            json!({"type":"session_resume","session_id":"crash-test","job_id":7,
                             "conversation_context":history,"last_message_index":1}),
        )
        .await;
        let ready = expect(&mut ws, "session_ready").await;
        assert_eq!(ready["message_count"], 2);
        let (_, resumed) = turn(&mut ws, "Then", 2).await;
        assert_eq!(resumed["message_index"], 3);
        let resumed = resumed["content"].as_str().expect("content").to_string();
        assert!(
            resumed.starts_with(&partial),
            "{partial:?} then {resumed:?}"
        );
        send(
            &mut ws,
            json!({"type":"session_end","session_id":"crash-test"}),
        )
        .await;
        expect(&mut ws, "session_ended").await;

        // The same conversation never interrupted, on host 2 from scratch.
        send(
            &mut ws,
            json!({"type":"session_init","session_id":"crash-test","job_id":7,
                             "conversation_context":[]}),
        )
        .await;
        expect(&mut ws, "session_ready").await;
        let (_, u1) = turn(&mut ws, "Once upon a time", 0).await;
        assert_eq!(u1["content"], reply1.as_str());
        let (streamed, u2) = turn(&mut ws, "Then", 2).await;
        assert_eq!(u2["content"], resumed.as_str(), "the same continuation");
        assert_eq!(streamed, resumed);
    });
    let _ = second.kill();
    let _ = second.wait();
}
