//! The official OpenAI Python SDK and LangChain's `OpenAIEmbeddings`
//! against `POST /v1/embeddings` (`tests/sdk/embeddings_sdk.py`): the SDK's
//! default base64 call decoding to the float vectors, strict validation
//! with the SDK's `CreateEmbeddingResponse`, unit length and order,
//! `dimensions`, token-id inputs, the SDK's exceptions, and LangChain's
//! `embed_documents` / `embed_query`. Skips without `TOKENWIRE_SDK_PYTHON`,
//! except under `CI=true`.

use tokenwire_tests::{run_sdk_script, sdk_python, start, stories260k, ModelSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_and_langchain_embed_through_the_route() {
    let Some(python) = sdk_python() else { return };
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    // stories260K's hidden size.
    let out = run_sdk_script(&python, "embeddings_sdk.py", &server, &["--size", "64"]).await;
    assert!(out.contains("6 of 6 checks passed"), "{out}");
    server.shutdown().await;
}

/// Under `--anon-requests-per-minute 1`, LangChain's `embed_documents` of
/// 150 documents is one request (one call, 150 inputs), answered whole; the
/// SDK's next call gets `RateLimitError`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_inputs_are_one_request_to_the_rate_limit() {
    let Some(python) = sdk_python() else { return };
    let server = start(ModelSource::Dir(stories260k()), |c| {
        c.tenancy.anon_requests_per_minute = Some(1);
    })
    .await;
    let args = ["--size", "64", "--one-request-per-minute"];
    let out = run_sdk_script(&python, "embeddings_sdk.py", &server, &args).await;
    assert!(out.contains("1 of 1 checks passed"), "{out}");
    server.shutdown().await;
}
