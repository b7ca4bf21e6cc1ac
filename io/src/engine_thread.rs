//! The engine's own OS thread: loads (or builds) the model, then runs one
//! [`StepPlan`] at a time and reports back to the driver.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::Instant as StdInstant;

use tokenwire_core::{EngineFault, EngineFaultKind, Input, StepPlan};
use tokenwire_kernels::model_dir::ModelDir;
use tokenwire_kernels::{ActivationPrecision, BackendKind, Engine, EngineOptions};

use crate::channel::{DriverHandle, DriverMsg};
use crate::config::{Backend, CpuActivations, ModelSource};
use crate::hf_cache::CacheEnv;

/// Tokens per KV cache block (DESIGN.md: paged KV cache, block size 16).
pub(crate) const KV_BLOCK_SIZE: u32 = 16;

/// What the engine thread needs to start.
#[derive(Debug, Clone)]
pub(crate) struct EngineSpec {
    /// The model to serve.
    pub model: ModelSource,
    /// The backend.
    pub backend: Backend,
    /// KV pool size, if fixed.
    pub kv_blocks: Option<u32>,
    /// Context served, if below the model's.
    pub max_context: Option<u32>,
    /// Name substring of the wgpu adapter, if one was asked for.
    pub wgpu_adapter: Option<String>,
    /// wgpu: multiply wide passes on the GPU's matrix units where offered.
    pub wgpu_matrix_units: bool,
    /// CPU backend: how quantized weights meet activations.
    pub cpu_activations: CpuActivations,
    /// Seed of the tiny model's weights.
    pub seed: u64,
    /// `--reasoning-parser`'s tags, checked against the model's tokenizer
    /// once it loads.
    pub reasoning_tags: Option<tokenwire_core::reasoning::ReasoningTags>,
    /// `--pooling`, logged with what the model declares.
    pub embed_pooling: tokenwire_core::config::EmbedPooling,
}

/// Says how `/v1/embeddings` pools, and warns when the model declares a
/// pooling the engine does not compute (it then gets the mean, unless
/// `--pooling` names one).
fn log_pooling(engine: &Engine, choice: tokenwire_core::config::EmbedPooling) {
    use tokenwire_core::config::EmbedPooling;
    use tokenwire_kernels::pooling::DeclaredPooling;
    let info = engine.model_info();
    let pooling = choice.resolve(&info).map_or("off", |p| p.name());
    tracing::info!(pooling, embedding_size = info.embedding_size, "embeddings");
    if let (DeclaredPooling::Unsupported(what), EmbedPooling::Auto) =
        (engine.declared_pooling(), choice)
    {
        tracing::warn!(
            declared = %what,
            "the model declares a pooling tokenwire does not compute; /v1/embeddings \
             pools by the mean (--pooling mean|last|off says which)"
        );
    }
}

/// Starts the engine thread. It loads the model, sends `ModelLoaded` (or
/// `LoadFailed`) to the driver, then serves plans from the returned sender until
/// that sender is dropped.
pub(crate) fn spawn(
    spec: EngineSpec,
    driver: DriverHandle,
) -> anyhow::Result<mpsc::Sender<StepPlan>> {
    let (plans_tx, plans_rx) = mpsc::channel::<StepPlan>();
    std::thread::Builder::new()
        .name("tokenwire-engine".into())
        .spawn(move || run(spec, driver, plans_rx))
        .map_err(|e| anyhow::anyhow!("cannot start the engine thread: {e}"))?;
    Ok(plans_tx)
}

fn run(spec: EngineSpec, driver: DriverHandle, plans: mpsc::Receiver<StepPlan>) {
    let started = StdInstant::now();
    let Some(mut engine) = load(&spec, &driver) else {
        return;
    };
    let info = engine.model_info();
    tracing::info!(
        model = %info.name,
        context_len = info.context_len,
        vocab_size = info.vocab_size,
        kv_blocks = info.num_blocks,
        block_size = info.block_size,
        dtype = %info.dtype,
        load_ms = started.elapsed().as_millis() as u64,
        "model loaded"
    );
    let asked = spec.max_context.unwrap_or_else(|| engine.model_context());
    if info.context_len < asked {
        tracing::warn!(
            context_len = info.context_len,
            asked,
            kv_blocks = info.num_blocks,
            "context lowered to what the default KV pool holds (a quarter of the memory \
             available at start, within the device's largest buffer on wgpu); --kv-blocks \
             sets the pool, --max-context a shorter context"
        );
    }
    log_pooling(&engine, spec.embed_pooling);
    let codec = engine.codec();
    if let Some(Err(e)) = spec.reasoning_tags.map(|t| t.check(&*codec)) {
        let _ = driver.blocking_send(DriverMsg::LoadFailed(format!("--reasoning-parser: {e}")));
        return;
    }
    if driver
        .blocking_send(DriverMsg::Input(Input::ModelLoaded { info, codec }))
        .is_err()
    {
        return;
    }
    while let Ok(plan) = plans.recv() {
        let step_id = plan.step_id;
        let seqs = plan.seqs.len();
        let t0 = StdInstant::now();
        let result = catch_unwind(AssertUnwindSafe(|| engine.step(&plan)));
        let input = match result {
            Ok(Ok(done)) => Input::StepDone(done),
            Ok(Err(fault)) => {
                tracing::warn!(step_id, seqs, fault = ?fault.kind, "engine step failed");
                Input::EngineFault(fault)
            }
            Err(_) => {
                tracing::error!(step_id, seqs, "engine step panicked");
                Input::EngineFault(EngineFault {
                    step_id,
                    kind: EngineFaultKind::Internal("engine step panicked".into()),
                })
            }
        };
        tracing::trace!(
            step_id,
            seqs,
            step_us = t0.elapsed().as_micros() as u64,
            "step"
        );
        if driver.blocking_send(DriverMsg::Input(input)).is_err() {
            return;
        }
    }
}

/// Loads or builds the engine; on failure tells the driver and returns `None`.
fn load(spec: &EngineSpec, driver: &DriverHandle) -> Option<Engine> {
    let opts = EngineOptions {
        num_blocks: spec.kv_blocks,
        max_context: spec.max_context,
        kv_budget: None,
        block_size: KV_BLOCK_SIZE,
        backend: match spec.backend {
            Backend::Cpu => BackendKind::Cpu,
            Backend::Wgpu => BackendKind::Wgpu {
                adapter: spec.wgpu_adapter.clone(),
                cooperative_matrix: spec.wgpu_matrix_units,
            },
        },
        cpu_activations: match spec.cpu_activations {
            CpuActivations::Int8 => ActivationPrecision::Int8,
            CpuActivations::F32 => ActivationPrecision::F32,
        },
        progress: Some(crate::load_progress::reporter(
            driver.clone(),
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )),
    };
    let (what, result) = match &spec.model {
        ModelSource::Tiny => (
            "the built-in tiny model".to_string(),
            catch_unwind(AssertUnwindSafe(|| Engine::tiny_with(spec.seed, &opts))),
        ),
        ModelSource::Builtin => (
            "the built-in stories260K model".to_string(),
            catch_unwind(AssertUnwindSafe(|| Engine::builtin(&opts))),
        ),
        ModelSource::Dir(arg) => {
            // `org/name` that is not a path: the local Hugging Face cache.
            let dir = match crate::hf_cache::resolve_model(arg, &CacheEnv::from_process()) {
                Ok(dir) => dir,
                Err(msg) => {
                    let _ = driver.blocking_send(DriverMsg::LoadFailed(msg));
                    return None;
                }
            };
            // A cached snapshot directory is named after the repository,
            // not its commit hash.
            let cached_name = (&dir != arg && dir.is_dir())
                .then(|| arg.file_name().map(|n| n.to_string_lossy().into_owned()))
                .flatten();
            if &dir != arg {
                tracing::info!(
                    model = %arg.display(),
                    path = %dir.display(),
                    "found in the Hugging Face cache"
                );
            }
            (
                format!("the model from {}", dir.display()),
                catch_unwind(AssertUnwindSafe(|| match cached_name {
                    Some(name) => Engine::load_from(&ModelDir::new(&dir), name, &opts),
                    None => Engine::load(&dir, &opts),
                })),
            )
        }
    };
    match result {
        Ok(Ok(engine)) => Some(engine),
        Ok(Err(e)) => {
            let _ =
                driver.blocking_send(DriverMsg::LoadFailed(format!("failed to load {what}: {e}")));
            None
        }
        Err(_) => {
            let _ = driver.blocking_send(DriverMsg::LoadFailed(format!("loading {what} panicked")));
            None
        }
    }
}
