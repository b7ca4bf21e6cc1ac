//! The official Anthropic Python SDK against tokenwire's Messages API
//! routes (`tests/sdk/anthropic_sdk.py`): `messages.create` as JSON and
//! streamed (every event validated), the SDK's `stream()` helper and its
//! accumulated message, a stop sequence named, a forced tool call (JSON and
//! streamed) and its result sent back, `parse()` with a pydantic model, a
//! prefill (a last assistant message) continued,
//! `count_tokens`, and the SDK's exceptions for errors; every body
//! validated with the SDK's own pydantic types in strict mode. Skips
//! without `TOKENWIRE_SDK_PYTHON`, except under `CI=true`.

use tokenwire_tests::{run_sdk_script, sdk_python, start, stories260k, ModelSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_anthropic_sdk_speaks_the_messages_api_strictly() {
    let Some(python) = sdk_python() else { return };
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let out = run_sdk_script(&python, "anthropic_sdk.py", &server, &[]).await;
    assert!(out.contains("8 of 8 checks passed"), "{out}");
    server.shutdown().await;
}
