//! The official OpenAI Python SDK against tokenwire's Chat Completions and
//! Completions routes (`tests/sdk/chat_sdk.py`): `chat.completions.create`
//! as JSON and streamed with `include_usage`, `n` = 2 with logprobs and a
//! seed, `models.list` and `models.retrieve`, a token forced by
//! `logit_bias`, stop strings,
//! `completions.create` as JSON and streamed,
//! `json_schema` output validated with a pydantic model,
//! Completions' `suffix` (fill in the middle),
//! `chat.completions.parse()` and `.stream()` with a pydantic model, vLLM's
//! `structured_outputs` / `guided_regex` through `extra_body`, a
//! forced tool call (JSON, streamed, and its result sent back), and the
//! SDK's exceptions for bad requests; every body and chunk validated with
//! the SDK's own pydantic types in strict mode. Skips without
//! `TOKENWIRE_SDK_PYTHON`, except under `CI=true`.

use tokenwire_tests::{run_sdk_script, sdk_python, start, stories260k, ModelSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_speaks_chat_completions_and_completions_strictly() {
    let Some(python) = sdk_python() else { return };
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let out = run_sdk_script(&python, "chat_sdk.py", &server, &[]).await;
    assert!(out.contains("14 of 14 checks passed"), "{out}");
    server.shutdown().await;
}

/// The SDK's tool round trip (`chat_sdk.py`'s forced call, streamed, and
/// its result sent back with the SDK's `call_…` id) on a model that calls in
/// Mistral's current format (`[TOOL_CALLS]name[ARGS]{...}`): stories260K
/// with a Mistral-style template and `[TOOL_CALLS]`/`[ARGS]` as special
/// tokens. (The older list form takes more tokens per call than the check's
/// `max_tokens` leaves four parallel calls; `tools_e2e.rs` covers it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_calls_tools_on_a_mistral_format_model() {
    let Some(python) = sdk_python() else { return };
    let dir = tokenwire_tests::mistral_copy("sdk-mistral", tokenwire_tests::MISTRAL_ARGS_TEMPLATE);
    let server = start(ModelSource::Dir(dir.clone()), |_| {}).await;
    let only = ["--only", "a_forced_tool_call_parses_json_and_stream"];
    let out = run_sdk_script(&python, "chat_sdk.py", &server, &only).await;
    assert!(out.contains("1 of 1 checks passed"), "{out}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}

/// Completions' `suffix` through the SDK on a model with Qwen's
/// fill-in-the-middle tokens (stories260K with `<|fim_prefix|>`,
/// `<|fim_suffix|>` and `<|fim_middle|>` as special tokens): strict types,
/// and the same greedy text as the prompt written out by hand. (The full
/// run above checks that a model without them refuses a suffix.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_fills_in_the_middle() {
    let Some(python) = sdk_python() else { return };
    let dir = tokenwire_tests::fim_stories260k("sdk-fim");
    let server = start(ModelSource::Dir(dir.clone()), |_| {}).await;
    let only = ["--only", "completions_fill_in_the_middle", "--fim"];
    let out = run_sdk_script(&python, "chat_sdk.py", &server, &only).await;
    assert!(out.contains("1 of 1 checks passed"), "{out}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}

/// LangChain's `ChatOpenAI` (`tests/sdk/langchain_chat.py`): invoke, stream
/// with usage, batch and `n`, the same text the route gives the SDK,
/// `with_structured_output` with a pydantic model, and `bind_tools` with a
/// forced choice giving calls whose arguments parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_chat_openai_invokes_streams_batches_and_calls_tools() {
    let Some(python) = sdk_python() else { return };
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let out = run_sdk_script(&python, "langchain_chat.py", &server, &[]).await;
    assert!(out.contains("6 of 6 checks passed"), "{out}");
    server.shutdown().await;
}

/// `--reasoning-parser qwen3` with the official SDK (`tests/sdk/reasoning_sdk.py`),
/// on stories260K with a template that opens the reasoning: the SDK's
/// message and deltas carry `reasoning_content` (the only field its strict
/// types do not name), `usage.completion_tokens_details.reasoning_tokens`
/// counts them, and `extra_body={"chat_template_kwargs": {"enable_thinking":
/// False}}` turns the reasoning off; the Responses API gives a `reasoning`
/// item (streamed as `response.reasoning_text.delta` events) and takes it
/// back in `input`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_reads_reasoning_content_and_sends_chat_template_kwargs() {
    let Some(python) = sdk_python() else { return };
    let dir = tokenwire_tests::thinking_stories260k("sdk");
    let server = start(ModelSource::Dir(dir.clone()), |c| {
        c.host.reasoning_tags = Some(tokenwire_core::reasoning::ReasoningTags::THINK);
    })
    .await;
    let out = run_sdk_script(&python, "reasoning_sdk.py", &server, &[]).await;
    assert!(out.contains("5 of 5 checks passed"), "{out}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}
