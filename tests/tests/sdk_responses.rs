//! The official OpenAI Python SDK against tokenwire's `responses` dialect:
//! `client.responses.connect()` (WebSocket mode), `create()` as JSON and
//! with `stream=True`, `stream()` and `retrieve()`, every event validated
//! with the SDK's own pydantic types in strict mode
//! (`tests/sdk/responses_sdk.py`), pointed at a real server with
//! `base_url="http://127.0.0.1:PORT/v1"`.
//!
//! The SDK comes from a Python venv named by `TOKENWIRE_SDK_PYTHON` (`.ci/run`
//! makes one from `tests/sdk/requirements.txt`). Without it the test skips
//! with a printed reason, except under `CI=true`, where that is a failure.

use std::path::Path;
use std::time::Duration;

use tokenwire_tests::{run_sdk_script, sdk_python, start, stories260k, ModelSource, RunningServer};

/// Runs `responses_sdk.py` against `server` with `args`.
async fn run_sdk(python: &Path, server: &RunningServer, args: &[&str]) -> String {
    run_sdk_script(python, "responses_sdk.py", server, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_streams_continues_and_validates_strictly() {
    let dir = stories260k();
    let Some(python) = sdk_python() else { return };
    let server = start(ModelSource::Dir(dir), |c| {
        c.host.max_websocket_connections = 3
    })
    .await;
    let out = run_sdk(&python, &server, &["--max-connections", "3"]).await;
    for check in [
        "ok: ws create streams deltas to response.completed",
        "ok: ws continuation by previous_response_id",
        "ok: ws unknown previous_response_id -> 404, socket stays",
        "ok: ws response.cancel -> status cancelled",
        "ok: ws concurrent create -> 409, in-flight one finishes",
        "ok: ws generate:false warm-up and its continuation",
        "ok: http create (JSON) completed",
        "ok: http create(stream=True) SSE events",
        "ok: http output text logprobs (include, top_logprobs)",
        "ok: http responses.stream() and get_final_response()",
        "ok: http responses.parse(text_format=pydantic model)",
        "ok: http forced function call and function_call_output",
        "ok: http continuation and retrieve(id)",
        "ok: http unknown previous_response_id -> NotFoundError",
        "ok: ws connection limit 3 -> 1013",
    ] {
        assert!(out.contains(check), "missing `{check}` in:\n{out}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_sees_the_lifetime_warning_then_close_1000() {
    let dir = stories260k();
    let Some(python) = sdk_python() else { return };
    // Wall-clock limits (a real server and the real SDK), with seconds of
    // room between the warning and the close: on a loaded 2-core CI machine
    // a warning due at 1 s once arrived after a 2 s close was due.
    let server = start(ModelSource::Dir(dir), |c| {
        c.host.responses_expiring_after = Duration::from_secs(1);
        c.host.responses_lifetime = Duration::from_secs(5);
    })
    .await;
    let out = run_sdk(
        &python,
        &server,
        &[
            "--lifetime-check",
            "--expiring-after",
            "1",
            "--close-after",
            "5",
        ],
    )
    .await;
    assert!(
        out.contains("ok: ws lifetime: connection_expiring then close 1000"),
        "{out}"
    );
    server.shutdown().await;
}
