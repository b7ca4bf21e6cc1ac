//! lm-evaluation-harness against `POST /v1/completions`
//! (`tests/sdk/lm_eval_harness.py`): its `local-completions` model finds the
//! server's remote tokenizer, scores a multiple-choice task through echoed
//! prompt logprobs (accuracy 1, each right choice greedy and no other, each
//! log-likelihood the echoed scores' sum, read strictly with the OpenAI
//! SDK's `Completion`) and generates a task's answers in batches; its
//! remote tokenizer renders the chat template `/tokenizer_info` gives into
//! the ids the server's own rendering gives. The model is stories260K with
//! a chat template ([`tokenwire_tests::thinking_stories260k`]; Completions
//! does not use it). Skips without `TOKENWIRE_SDK_PYTHON`, except under
//! `CI=true`.

use tokenwire_tests::{run_sdk_script, sdk_python, start, thinking_stories260k, ModelSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lm_evaluation_harness_scores_and_generates_through_the_server() {
    let Some(python) = sdk_python() else { return };
    let dir = thinking_stories260k("lm-eval");
    let server = start(ModelSource::Dir(dir.clone()), |_| {}).await;
    let out = run_sdk_script(&python, "lm_eval_harness.py", &server, &[]).await;
    assert!(out.contains("5 of 5 checks passed"), "{out}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(dir.parent().expect("its folder"));
}
