//! lm-evaluation-harness against `POST /v1/completions`
//! (`tests/sdk/lm_eval_harness.py`): its `local-completions` model finds the
//! server's remote tokenizer, scores a multiple-choice task through echoed
//! prompt logprobs (accuracy 1, each right choice greedy and no other, each
//! log-likelihood the echoed scores' sum, read strictly with the OpenAI
//! SDK's `Completion`) and generates a task's answers in batches. Skips
//! without `TOKENWIRE_SDK_PYTHON`, except under `CI=true`.

use tokenwire_tests::{run_sdk_script, sdk_python, start, stories260k, ModelSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lm_evaluation_harness_scores_and_generates_through_the_server() {
    let Some(python) = sdk_python() else { return };
    let server = start(ModelSource::Dir(stories260k()), |_| {}).await;
    let out = run_sdk_script(&python, "lm_eval_harness.py", &server, &[]).await;
    assert!(out.contains("4 of 4 checks passed"), "{out}");
    server.shutdown().await;
}
