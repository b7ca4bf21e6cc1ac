//! The OpenAI Agents SDK (`tests/sdk/agents_sdk.py`, `openai-agents`
//! pinned) running an agent with one function tool against tokenwire's
//! Responses API, over HTTP and over the WebSocket mode: the first turn
//! is forced to call the tool (the grammar makes the call parse), the SDK
//! runs it and sends its output back, and the run ends with a message (the
//! tool is offered only until its first call, so that the answer does not
//! hang on what a 135M model happens to sample).
//! On SmolLM2: the tools, the instructions and the conversation do not fit
//! stories260K's 512-token context beside an answer. Skips without
//! `TOKENWIRE_SDK_PYTHON` or the SmolLM2 file, except under `CI=true`.

use tokenwire_tests::{run_sdk_script, sdk_python, smollm2_gguf, start, ModelSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calls_its_tool_and_answers_over_http_and_websocket() {
    let Some(python) = sdk_python() else { return };
    let Some(path) = smollm2_gguf() else { return };
    let server = start(ModelSource::Dir(path), |_| {}).await;
    let out = run_sdk_script(
        &python,
        "agents_sdk.py",
        &server,
        &["--model", "SmolLM2-135M-Instruct.Q4_1"],
    )
    .await;
    assert!(out.contains("2 of 2 checks passed"), "{out}");
    server.shutdown().await;
}
