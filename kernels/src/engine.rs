//! [`Engine`]: the model behind the core's engine boundary. It checks each
//! [`StepPlan`], keeps per-sequence token history for the sampler, runs the
//! batched forward on its [`Backend`] and samples: with the shared sampler
//! on the rows the backend returns, or by taking the tokens a backend
//! sampled itself by the same rule (wgpu on its device, the CPU backend
//! across its thread pool).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use tokenwire_core::text::byte::ByteCodec;
use tokenwire_core::{
    EngineFault, EngineFaultKind, ModelInfo, Pooling, SamplingParams, SeqId, SeqResult, SeqStep,
    SharedCodec, StepDone, StepPlan, TokenId,
};

use crate::backend::cpu::ActivationPrecision;
use crate::backend::{
    Backend, BackendKind, CpuBackend, ForwardOutput, SampleSpec, SeqBatch, WgpuBackend, WgpuOptions,
};
use crate::builtin::STORIES260K_NAME;
use crate::config::{GenerationConfig, ModelConfig};
use crate::error::LoadError;
use crate::gguf_tokenizer::codec_from_gguf;
use crate::model::Model;
use crate::model_dir::ModelDir;
use crate::pooling::DeclaredPooling;
use crate::progress::{report, LoadProgress};
use crate::quant::Kernels;
use crate::sampler::Sampler;
use crate::scoring::PromptScores;
use crate::tiny::tiny_model;
use crate::tokenizer::HfCodec;

/// How to build an [`Engine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// KV blocks in the pool; `None` = enough for 4 full contexts, at least
    /// 64, within `kv_budget` (and, on wgpu, the device's largest binding
    /// per layer); a context the default pool cannot hold once is lowered
    /// to what it holds.
    pub num_blocks: Option<u32>,
    /// The context served, in tokens, below the model's own
    /// (`max_position_embeddings`, a GGUF file's `context_length`); `None`:
    /// the model's.
    pub max_context: Option<u32>,
    /// Bytes the default KV pool may take; `None`: a quarter of the memory
    /// available when loading starts, container limits included
    /// ([`default_kv_budget`]).
    pub kv_budget: Option<u64>,
    /// Token slots per KV block.
    pub block_size: u32,
    /// Compute backend (for the GPU: `BackendKind::Wgpu { .. }`).
    pub backend: BackendKind,
    /// How the CPU backend multiplies quantized weights: with activations
    /// quantized to 8 bits (fast, the default) or in f32.
    pub cpu_activations: ActivationPrecision,
    /// Told how far loading got (`/health`, a progress bar); `None`: silent.
    pub progress: Option<LoadProgress>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            num_blocks: None,
            max_context: None,
            kv_budget: None,
            block_size: 16,
            backend: BackendKind::Cpu,
            cpu_activations: ActivationPrecision::default(),
            progress: None,
        }
    }
}

/// Identity of a model as clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// Name clients use (`model` fields).
    pub name: String,
    /// Version string.
    pub version: String,
    /// Tokens that end a generation.
    pub eos_ids: Vec<TokenId>,
}

/// Weights, KV pool and compute (inside the [`Backend`], which owns the
/// device-side state), tokenizer and sampler of one served model.
pub struct Engine {
    model: Arc<Model>,
    info: ModelInfo,
    codec: SharedCodec,
    backend: Box<dyn Backend>,
    sampler: Sampler,
    history: HashMap<SeqId, Vec<TokenId>>,
    /// Mean-pooled embeddings part way through their prompt: their
    /// chunks' row sums.
    pooled: HashMap<SeqId, MeanChunks>,
    /// Prompts being scored ([`SeqStep::prompt_logprobs`]) part way
    /// through: their scores so far.
    scores: HashMap<SeqId, PromptScores>,
    declared_pooling: DeclaredPooling,
    out: ForwardOutput,
    full_logits: bool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", &self.info)
            .field("backend", &self.backend.name())
            .field("live_seqs", &self.history.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Loads a model: a GGUF file (see [`Engine::load_gguf`]), or a Hugging
    /// Face model directory (`config.json`, safetensors weights,
    /// `tokenizer.json`, optional `generation_config.json` and
    /// `tokenizer_config.json`).
    pub fn load(dir: &Path, opts: &EngineOptions) -> Result<Engine, LoadError> {
        if dir.is_file() {
            return Engine::load_gguf(dir, opts);
        }
        // `dir` may be "." or end in "..": the canonical path has the real name.
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "model".into());
        Engine::load_from(&ModelDir::new(dir), name, opts)
    }

    /// The model built into the binary, stories260K ([`crate::builtin`]):
    /// what `tokenwire serve` serves without `--model`.
    pub fn builtin(opts: &EngineOptions) -> Result<Engine, LoadError> {
        Engine::load_from(
            &crate::builtin::stories260k(),
            STORIES260K_NAME.into(),
            opts,
        )
    }

    /// A Hugging Face layout model from `dir` (a directory or a built-in
    /// set), served as `name`.
    pub fn load_from(
        dir: &ModelDir,
        name: String,
        opts: &EngineOptions,
    ) -> Result<Engine, LoadError> {
        report(&opts.progress, 0.0, "reading the model's files");
        let model = Model::load_from(dir)?;
        let gen = GenerationConfig::load_from(dir, "generation_config.json")?;
        report(&opts.progress, 0.2, "building the tokenizer");
        let mut codec = HfCodec::load_from(dir)?;
        let cfg = model.config();
        let identity = ModelIdentity {
            name,
            version: cfg.name_or_path.clone().unwrap_or_else(|| "1".into()),
            eos_ids: gen
                .eos_token_ids
                .unwrap_or_else(|| cfg.eos_token_ids.clone()),
        };
        codec.enable_grammar(cfg.vocab_size as u32, &identity.eos_ids);
        let declared = crate::pooling::declared_in_dir(dir);
        Engine::from_model(model, SharedCodec(Arc::new(codec)), identity, opts)
            .map(|e| e.declaring(declared))
    }

    /// Loads a GGUF file: weights mapped in their own dtypes, tokenizer,
    /// chat template, BOS/EOS and context length from its metadata. The
    /// model's name is the file name without `.gguf`.
    pub fn load_gguf(path: &Path, opts: &EngineOptions) -> Result<Engine, LoadError> {
        report(&opts.progress, 0.0, "reading the GGUF file");
        let (model, file) = Model::load_gguf(path)?;
        report(&opts.progress, 0.2, "building the tokenizer");
        let mut codec = codec_from_gguf(path, &file)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .map(|n| n.strip_suffix(".gguf").unwrap_or(&n).to_owned())
            .unwrap_or_else(|| "model".into());
        let cfg = model.config();
        let mut eos_ids = cfg.eos_token_ids.clone();
        // Chat models may end a turn with a token other than EOS: the end
        // of a turn, or Llama 3.1's end of a message that calls a tool.
        for id in crate::gguf_tokenizer::turn_end_ids(&file, cfg.vocab_size) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let identity = ModelIdentity {
            name,
            version: cfg.name_or_path.clone().unwrap_or_else(|| "1".into()),
            eos_ids,
        };
        codec.enable_grammar(cfg.vocab_size as u32, &identity.eos_ids);
        let declared = crate::pooling::declared_in_gguf(&file);
        Engine::from_model(model, SharedCodec(Arc::new(codec)), identity, opts)
            .map(|e| e.declaring(declared))
    }

    /// This engine, with the pooling its model's files declare.
    fn declaring(mut self, declared: DeclaredPooling) -> Engine {
        self.info.pooling = declared.supported();
        self.declared_pooling = declared;
        self
    }

    /// The pooling the model's files declare for embeddings (see
    /// [`crate::pooling`]); [`ModelInfo::pooling`] has it when the engine
    /// computes it.
    pub fn declared_pooling(&self) -> &DeclaredPooling {
        &self.declared_pooling
    }

    /// The built-in tiny model (see [`crate::tiny`]) with the byte tokenizer:
    /// name `tokenwire-tiny`, EOS 2, context 1024.
    pub fn tiny(seed: u64) -> Engine {
        match Engine::tiny_with(seed, &EngineOptions::default()) {
            Ok(e) => e,
            // The tiny pool is 256 blocks of 16 slots on the CPU: about 1 MiB.
            Err(e) => unreachable!("tiny engine: {e}"),
        }
    }

    /// The built-in tiny model on the backend and pool `opts` choose (an error
    /// when, say, no GPU adapter exists).
    pub fn tiny_with(seed: u64, opts: &EngineOptions) -> Result<Engine, LoadError> {
        let identity = ModelIdentity {
            name: "tokenwire-tiny".into(),
            version: "1".into(),
            eos_ids: vec![tokenwire_core::text::byte::BYTE_EOS],
        };
        Engine::from_model(tiny_model(seed), ByteCodec::shared(), identity, opts)
    }

    /// An engine for an already-built model.
    pub fn from_model(
        model: Model,
        codec: SharedCodec,
        identity: ModelIdentity,
        opts: &EngineOptions,
    ) -> Result<Engine, LoadError> {
        let cfg = model.config();
        if opts.block_size == 0 {
            return Err(LoadError::Options("block_size must be positive".into()));
        }
        let model_context = cfg.max_position_embeddings as u64;
        let context = match opts.max_context {
            None => model_context,
            Some(0) => return Err(LoadError::Options("max_context must be positive".into())),
            Some(n) if u64::from(n) > model_context => {
                return Err(LoadError::Options(format!(
                    "max_context {n} is above the model's context of {model_context} tokens"
                )))
            }
            Some(n) => u64::from(n),
        };
        let num_blocks = match opts.num_blocks {
            Some(0) => return Err(LoadError::Options("num_blocks must be positive".into())),
            Some(n) => n,
            None => {
                let budget = opts.kv_budget.unwrap_or_else(default_kv_budget);
                let blocks = default_pool_blocks(cfg, context, opts.block_size, budget);
                u32::try_from(blocks).map_err(|_| {
                    LoadError::Options(format!("default KV pool of {blocks} blocks is too large"))
                })?
            }
        };
        let dtype = model.weights().dtype.clone();
        let vocab_size = cfg.vocab_size as u32;
        let embedding_size = cfg.hidden_size as u32;
        // LongRoPE's factors follow the context served: the one asked for,
        // or what the default pool holds of it (wgpu may cut that pool
        // further to the device's largest binding: then the backend is
        // built again below, where that changes the factors).
        let pooled = |blocks: u32| {
            if opts.num_blocks.is_none() {
                context.min(u64::from(blocks) * u64::from(opts.block_size))
            } else {
                context
            }
        };
        let model = Arc::new(model.for_context(pooled(num_blocks) as usize));
        report(
            &opts.progress,
            0.3,
            "setting up the backend and its KV cache",
        );
        let build = |model: &Arc<Model>, num_blocks: u32| -> Result<Box<dyn Backend>, LoadError> {
            Ok(match &opts.backend {
                BackendKind::Cpu => Box::new(
                    CpuBackend::with(
                        model.clone(),
                        opts.block_size as usize,
                        num_blocks as usize,
                        Kernels::detect(),
                        opts.cpu_activations,
                    )
                    .map_err(LoadError::Options)?,
                ),
                BackendKind::Wgpu {
                    adapter,
                    cooperative_matrix,
                } => Box::new(WgpuBackend::new(
                    model.clone(),
                    opts.block_size as usize,
                    num_blocks as usize,
                    &WgpuOptions {
                        adapter: adapter.clone(),
                        cooperative_matrix: *cooperative_matrix,
                        progress: opts.progress.as_ref().map(|p| p.span(0.3, 1.0)),
                        fit_kv_pool: opts.num_blocks.is_none(),
                        ..WgpuOptions::default()
                    },
                )?),
            })
        };
        let mut backend = build(&model, num_blocks)?;
        // The default pool may have been cut to the budget or to the
        // device's binding: a context it cannot hold once is lowered to what
        // it holds, so no request is admitted that could never be placed.
        let num_blocks = backend.kv_blocks() as u32;
        let context_len = pooled(num_blocks);
        let mut model = model;
        let served = model
            .config()
            .rope_scaling
            .for_context(context_len as usize);
        if served != model.config().rope_scaling {
            model = Arc::new((*model).clone().for_context(context_len as usize));
            drop(backend);
            backend = build(&model, num_blocks)?;
        }
        let info = ModelInfo {
            name: identity.name,
            version: identity.version,
            context_len: context_len as u32,
            vocab_size,
            eos_ids: identity.eos_ids,
            block_size: opts.block_size,
            num_blocks,
            dtype,
            embedding_size,
            pooling: None,
        };
        report(&opts.progress, 1.0, "loaded");
        Ok(Engine {
            model,
            info,
            codec,
            backend,
            sampler: Sampler::new(),
            history: HashMap::new(),
            pooled: HashMap::new(),
            scores: HashMap::new(),
            declared_pooling: DeclaredPooling::None,
            out: ForwardOutput::default(),
            full_logits: false,
        })
    }

    /// The model's own context in tokens (`max_position_embeddings`), which
    /// [`ModelInfo::context_len`] may be below: lowered by
    /// [`EngineOptions::max_context`] or to what the default KV pool holds.
    pub fn model_context(&self) -> u32 {
        self.model.config().max_position_embeddings as u32
    }

    /// What the core needs to know about the model.
    pub fn model_info(&self) -> ModelInfo {
        self.info.clone()
    }

    /// The model's tokenizer and chat template.
    pub fn codec(&self) -> SharedCodec {
        self.codec.clone()
    }

    /// The model (config and weights).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The backend's short name (`cpu`, `wgpu`).
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// With `true`, every sampled sequence's logits row comes back from the
    /// backend (see [`Engine::last_logits`]); with `false` (the default) a
    /// backend that samples on its device (wgpu) reads back only the chosen
    /// tokens (and logprobs when asked), not vocabulary rows (the CPU
    /// backend returns its rows either way). The chosen tokens are the same
    /// either way.
    pub fn set_full_logits(&mut self, on: bool) {
        self.full_logits = on;
    }

    /// Runs one step: frees the plan's finished sequences, copies blocks,
    /// computes every sequence's tokens in one batch and samples one token
    /// per sequence with `sample` set, and one more per draft token of a
    /// drafted sequence, through the first that differs from the draft
    /// ([`SeqStep::draft`]; each draft token is a one-token row of the same
    /// batch, drawn with the history through it). A chunk that scores its
    /// prompt ([`SeqStep::prompt_logprobs`]) is one row per token as well,
    /// each row's logits scoring the token after it. A plan that breaks the engine boundary's
    /// rules is refused with [`EngineFaultKind::Internal`] before anything changes.
    pub fn step(&mut self, plan: &StepPlan) -> Result<StepDone, EngineFault> {
        let fault = |kind| EngineFault {
            step_id: plan.step_id,
            kind,
        };
        self.validate(plan)
            .map_err(|m| fault(EngineFaultKind::Internal(m)))?;
        // Forks first: a beam's parent may be freed by this same plan.
        for f in &plan.forks {
            if self.history.contains_key(&f.dst) {
                continue; // sent again after a failed step
            }
            if let Some(h) = self.history.get(&f.src) {
                let h = h[..(f.len as usize).min(h.len())].to_vec();
                self.history.insert(f.dst, h);
            }
        }
        for seq in &plan.free {
            self.history.remove(seq);
            self.pooled.remove(seq);
            self.scores.remove(seq);
        }
        self.backend.copy_blocks(&plan.copy_blocks).map_err(fault)?;
        for s in &plan.seqs {
            let h = self.history.entry(s.seq).or_default();
            if !s.cached_prefix.is_empty() {
                // Admitted onto cached blocks: this is its history so far.
                h.clone_from(&s.cached_prefix);
            }
            h.truncate(s.start_pos as usize);
            h.extend_from_slice(&s.tokens);
            // Fed too: each draw after a draft token reads the history
            // through it.
            h.extend_from_slice(&s.draft);
        }
        let full = self.full_logits;
        let history = &self.history;
        // A drafted sequence is one row per draft token besides its own, each
        // one token at the next position over the same block table: the
        // backend writes every row's K/V before any row attends, so each
        // reads the ones before it, as a prefill chunk would.
        let mut batch: Vec<SeqBatch<'_>> = Vec::with_capacity(plan.seqs.len());
        for s in &plan.seqs {
            let h = history.get(&s.seq).map_or(&[][..], Vec::as_slice);
            let end = s.start_pos + s.tokens.len() as u32;
            let spec = |position: u32| SampleSpec {
                params: &s.sampling,
                // The token drawn will sit at `position`: it seeds the draw.
                position,
                history: &h[..(position as usize).min(h.len())],
                logprobs: s.logprobs,
                allowed: s.allowed.as_deref(),
            };
            // An embedding samples nothing: its rows come back pooled.
            let sample = s.sample && s.embed.is_none();
            let mut tokens = &s.tokens[..];
            if s.prompt_logprobs.is_some() {
                // A scored chunk is one row per token, each with its
                // logits (as a draft's rows are), but the last, which is
                // sampled as any chunk's (or, mid-prompt, carried).
                let (last, scored) = tokens.split_last().unwrap_or((&0, &[]));
                for (i, t) in scored.chunks_exact(1).enumerate() {
                    batch.push(SeqBatch {
                        tokens: t,
                        start_pos: s.start_pos + i as u32,
                        block_table: &s.block_table,
                        want_logits: true,
                        sample: None,
                        keep_row: false,
                        hidden: None,
                    });
                }
                tokens = std::slice::from_ref(last);
            }
            let start_pos = end - tokens.len() as u32;
            batch.push(SeqBatch {
                tokens,
                start_pos,
                block_table: &s.block_table,
                want_logits: sample || s.prompt_logprobs.is_some(),
                sample: sample.then(|| spec(end)),
                keep_row: full,
                // The last token's state is wanted from the last chunk only.
                hidden: s.embed.filter(|&p| p == Pooling::Mean || s.sample),
            });
            for (i, d) in s.draft.chunks_exact(1).enumerate() {
                let pos = end + i as u32;
                batch.push(SeqBatch {
                    tokens: d,
                    start_pos: pos,
                    block_table: &s.block_table,
                    want_logits: true,
                    sample: Some(spec(pos + 1)),
                    keep_row: full,
                    hidden: None,
                });
            }
        }
        self.backend
            .forward_select(&batch, &mut self.out)
            .map_err(fault)?;

        let vocab = self.info.vocab_size as usize;
        let mut rows = self.out.logits.chunks_exact(vocab);
        let mut entries = self.out.sampled.iter().zip(&self.out.has_row);
        let mut results = Vec::new();
        let short = || {
            fault(EngineFaultKind::Internal(
                "backend returned fewer outputs than sampling sequences".into(),
            ))
        };
        let mut specs = batch.iter().filter(|b| b.want_logits);
        let mut refused = Vec::new();
        let h = self.model.config().hidden_size;
        let mut hidden = self.out.hidden.chunks_exact(h);
        for s in &plan.seqs {
            if let Some(pooling) = s.embed {
                if pooling == Pooling::Last && !s.sample {
                    continue;
                }
                let row = hidden.next().ok_or_else(short)?;
                if let Some(embedding) = pool_chunk(&mut self.pooled, s, pooling, row) {
                    results.push(SeqResult {
                        seq: s.seq,
                        token: 0,
                        logprobs: None,
                        embedding: Some(embedding),
                        prompt_logprobs: None,
                    });
                }
                continue;
            }
            let mut scored = None;
            if let Some(top) = s.prompt_logprobs {
                let mut next = || -> Result<&[f32], EngineFault> {
                    specs.next().ok_or_else(short)?;
                    match entries.next() {
                        Some((None, true)) => rows.next().ok_or_else(short),
                        _ => Err(short()),
                    }
                };
                let mut p = self.scores.remove(&s.seq).unwrap_or_default();
                p.begin(s, top);
                for &t in &s.tokens[1..] {
                    p.push(next()?, t, top);
                }
                if !s.sample {
                    p.carry(s.start_pos + s.tokens.len() as u32 - 1, next()?);
                    self.scores.insert(s.seq, p);
                    continue;
                }
                scored = Some(p.finish());
            }
            if !s.sample {
                continue;
            }
            // Its row's draw, then one per draft token: kept through the
            // first that differs from the draft token at its position.
            let mut confirming = true;
            for i in 0..=s.draft.len() {
                let spec = specs.next().and_then(|b| b.sample).ok_or_else(short)?;
                let (done, &has_row) = entries.next().ok_or_else(short)?;
                let row = if has_row {
                    Some(rows.next().ok_or_else(short)?)
                } else {
                    None
                };
                if !confirming {
                    continue;
                }
                let (token, logprobs) = match (done, row) {
                    (Some(d), _) => (d.token, d.logprobs.clone()),
                    // The backend left this one to the shared sampler.
                    (None, Some(logits)) => spec.sample(&mut self.sampler, logits),
                    _ => return Err(short()),
                };
                confirming = s.draft.get(i) == Some(&token);
                results.push(SeqResult {
                    seq: s.seq,
                    token,
                    logprobs,
                    embedding: None,
                    prompt_logprobs: scored.take(),
                });
                if !confirming && i < s.draft.len() {
                    // The draft tokens from this one on are not the sequence's.
                    refused.push((s.seq, s.start_pos as usize + s.tokens.len() + i));
                }
            }
        }
        drop(batch);
        for (seq, held) in refused {
            if let Some(h) = self.history.get_mut(&seq) {
                h.truncate(held);
            }
        }
        Ok(StepDone {
            step_id: plan.step_id,
            results,
        })
    }

    /// Logits of the last step, one `vocab_size` row per sampled sequence
    /// (and per draft token of a drafted one, and per scored prompt token)
    /// whose row the backend
    /// returned, in plan order, as the model computed
    /// them (before the repetition penalty and the sampler). The CPU backend
    /// returns every row; the wgpu backend, which samples on the device,
    /// returns rows only while [`Engine::set_full_logits`] is on.
    pub fn last_logits(&self) -> std::slice::ChunksExact<'_, f32> {
        self.out.logits.chunks_exact(self.info.vocab_size as usize)
    }

    /// Tokens the engine holds for `seq` (what it has been fed so far).
    pub fn history(&self, seq: SeqId) -> Option<&[TokenId]> {
        self.history.get(&seq).map(Vec::as_slice)
    }

    fn validate(&self, plan: &StepPlan) -> Result<(), String> {
        let nb = self.info.num_blocks;
        let bs = self.info.block_size as u64;
        for &(src, dst) in &plan.copy_blocks {
            if src >= nb || dst >= nb {
                return Err(format!(
                    "copy_blocks ({src}, {dst}) outside the pool of {nb} blocks"
                ));
            }
        }
        let mut forked: HashMap<SeqId, usize> = HashMap::new();
        for f in &plan.forks {
            if self.history.contains_key(&f.dst) {
                continue;
            }
            let held = self.history.get(&f.src).map_or(0, Vec::len);
            if (f.len as usize) > held {
                return Err(format!(
                    "fork of {:?} into {:?} takes {} tokens but the engine holds {held}",
                    f.src, f.dst, f.len
                ));
            }
            forked.insert(f.dst, f.len as usize);
        }
        let freed: HashSet<SeqId> = plan.free.iter().copied().collect();
        let mut seen = HashSet::with_capacity(plan.seqs.len());
        for s in &plan.seqs {
            if !seen.insert(s.seq) {
                return Err(format!("seq {:?} appears twice in one step", s.seq));
            }
            self.validate_seq(s, &freed, &forked, nb, bs)?;
        }
        Ok(())
    }

    fn validate_seq(
        &self,
        s: &SeqStep,
        freed: &HashSet<SeqId>,
        forked: &HashMap<SeqId, usize>,
        nb: u32,
        bs: u64,
    ) -> Result<(), String> {
        let id = s.seq;
        if s.tokens.is_empty() {
            return Err(format!("seq {id:?} has no tokens to feed"));
        }
        if let Some(t) = s.tokens.iter().find(|&&t| t >= self.info.vocab_size) {
            return Err(format!(
                "seq {id:?} feeds token {t}, vocabulary is {}",
                self.info.vocab_size
            ));
        }
        if !s.draft.is_empty() && (!s.sample || s.allowed.is_some()) {
            return Err(format!(
                "seq {id:?} carries a draft without sampling, or with a token mask"
            ));
        }
        if s.embed.is_some()
            && (!s.draft.is_empty() || s.allowed.is_some() || !s.cached_prefix.is_empty())
        {
            return Err(format!(
                "seq {id:?} is an embedding with a draft, a token mask or a cached prefix"
            ));
        }
        if s.embed == Some(Pooling::Mean) && s.start_pos > 0 {
            let pooled = pooled_end(self.pooled.get(&id), s.start_pos);
            if pooled != s.start_pos || freed.contains(&id) {
                return Err(format!(
                    "seq {id:?} is a mean-pooled embedding fed at position {}, but its pooled chunks end at {pooled}",
                    s.start_pos
                ));
            }
        }
        if s.prompt_logprobs.is_some() {
            if s.embed.is_some() || !s.draft.is_empty() || !s.cached_prefix.is_empty() {
                return Err(format!(
                    "seq {id:?} scores its prompt with an embedding, a draft or a cached prefix"
                ));
            }
            let next = if freed.contains(&id) {
                0
            } else {
                PromptScores::next_start(self.scores.get(&id))
            };
            if s.start_pos != 0 && s.start_pos != next {
                return Err(format!(
                    "seq {id:?} scores its prompt from position {}, but its scores end at {next}",
                    s.start_pos
                ));
            }
        }
        if let Some(t) = s.draft.iter().find(|&&t| t >= self.info.vocab_size) {
            return Err(format!(
                "seq {id:?} drafts token {t}, vocabulary is {}",
                self.info.vocab_size
            ));
        }
        let end = s.start_pos as u64 + s.tokens.len() as u64 + s.draft.len() as u64;
        if end > self.info.context_len as u64 {
            return Err(format!(
                "seq {id:?} reaches position {end}, context is {}",
                self.info.context_len
            ));
        }
        if (s.block_table.len() as u64) * bs < end {
            return Err(format!(
                "seq {id:?} block table covers {} positions, {end} needed",
                s.block_table.len() as u64 * bs
            ));
        }
        if let Some(b) = s.block_table.iter().find(|&&b| b >= nb) {
            return Err(format!("seq {id:?} uses block {b}, pool has {nb} blocks"));
        }
        if !s.cached_prefix.is_empty() && s.cached_prefix.len() != s.start_pos as usize {
            return Err(format!(
                "seq {id:?} carries a cached prefix of {} tokens but starts at {}",
                s.cached_prefix.len(),
                s.start_pos
            ));
        }
        let held = if freed.contains(&id) {
            0
        } else {
            self.history
                .get(&id)
                .map(Vec::len)
                .or_else(|| forked.get(&id).copied())
                .unwrap_or(0)
        }
        .max(s.cached_prefix.len());
        if s.start_pos as usize > held {
            return Err(format!(
                "seq {id:?} fed at position {} but the engine holds {held} tokens",
                s.start_pos
            ));
        }
        Ok(())
    }

    /// Greedy generation of one sequence, as a convenience for tests and
    /// examples: feeds `prompt` as one chunk, then one token per step, until
    /// `max_new` tokens or a token in `stop` (included in the result). Uses
    /// pool blocks from 0 up, so no other sequence may be live; the sequence
    /// is freed at the end.
    pub fn generate_greedy(
        &mut self,
        prompt: &[TokenId],
        max_new: usize,
        stop: &[TokenId],
    ) -> Result<Vec<TokenId>, EngineFault> {
        const SEQ: SeqId = SeqId(u64::MAX);
        let bs = self.info.block_size as usize;
        let needed = (prompt.len() + max_new).div_ceil(bs);
        let table: Vec<u32> = (0..needed as u32).collect();
        let mut out = Vec::with_capacity(max_new);
        let mut feed = prompt.to_vec();
        let mut pos = 0u32;
        let mut step_id = 0;
        while out.len() < max_new {
            step_id += 1;
            let plan = StepPlan {
                step_id,
                seqs: vec![SeqStep {
                    draft: Vec::new(),
                    seq: SEQ,
                    tokens: std::mem::take(&mut feed),
                    start_pos: pos,
                    block_table: table.clone(),
                    sampling: SamplingParams::greedy(),
                    sample: true,
                    logprobs: None,
                    cached_prefix: Vec::new(),
                    allowed: None,
                    embed: None,
                    prompt_logprobs: None,
                }],
                ..Default::default()
            };
            let done = self.step(&plan)?;
            pos += plan.seqs[0].tokens.len() as u32;
            let Some(r) = done.results.first() else {
                break;
            };
            out.push(r.token);
            if stop.contains(&r.token) {
                break;
            }
            feed.push(r.token);
        }
        self.history.remove(&SEQ);
        Ok(out)
    }
}

/// The row sums of a mean-pooled embedding's chunks so far: `(start,
/// tokens, sum)` in position order.
type MeanChunks = Vec<(u32, u32, Vec<f32>)>;

/// Adds an embedding chunk's pooled row (`row`, from the backend) to what
/// `s`'s earlier chunks gave (kept in `pooled`); its vector once the chunk
/// reaches the prompt's end (`s.sample`). A chunk replaces every chunk from
/// its position on: one fed again after a failed step, or a prompt computed
/// again from 0 after a preemption, counts once.
fn pool_chunk(
    pooled: &mut HashMap<SeqId, MeanChunks>,
    s: &SeqStep,
    pooling: Pooling,
    row: &[f32],
) -> Option<Vec<f32>> {
    match pooling {
        Pooling::Last => s.sample.then(|| row.to_vec()),
        Pooling::Mean => {
            let chunks = pooled.entry(s.seq).or_default();
            chunks.retain(|c| c.0 < s.start_pos);
            chunks.push((s.start_pos, s.tokens.len() as u32, row.to_vec()));
            if !s.sample {
                return None;
            }
            let chunks = pooled.remove(&s.seq)?;
            let n: u32 = chunks.iter().map(|c| c.1).sum();
            let mut mean = vec![0.0f32; row.len()];
            for (_, _, sum) in &chunks {
                for (m, x) in mean.iter_mut().zip(sum) {
                    *m += x;
                }
            }
            mean.iter_mut().for_each(|x| *x /= n as f32);
            Some(mean)
        }
    }
}

/// Where a mean-pooled embedding's chunks so far end (0 with none).
fn pooled_end(chunks: Option<&MeanChunks>, before: u32) -> u32 {
    chunks
        .into_iter()
        .flatten()
        .filter(|c| c.0 < before)
        .map(|c| c.0 + c.1)
        .max()
        .unwrap_or(0)
}

/// The default pool: 4 full contexts of `block_size` blocks, at least 64
/// blocks, but no more than `budget` bytes of f32 K and V (the pool's
/// element type on both backends) unless 64 blocks already take more.
fn default_pool_blocks(cfg: &ModelConfig, context: u64, block_size: u32, budget: u64) -> u64 {
    let want = context
        .saturating_mul(4)
        .div_ceil(u64::from(block_size))
        .max(64);
    let block_bytes = [cfg.num_layers, 2, cfg.num_kv_heads, cfg.head_dim]
        .into_iter()
        .fold(u64::from(block_size) * 4, |b, d| b.saturating_mul(d as u64));
    let affordable = budget / block_bytes.max(1);
    want.min(affordable).max(64)
}

/// The default KV budget: a quarter of the memory this process may still
/// take, the smaller of what Linux says is available (`MemAvailable` in
/// `/proc/meminfo`) and what its cgroup's limit leaves (a container's
/// memory limit, v2 or v1; a container's `/proc/meminfo` shows the host's);
/// 4 GiB where neither can be read. It is host memory: on a GPU the pool
/// lives in device memory, which wgpu does not report, and the engine
/// caps it only by the largest binding per layer (`--kv-blocks` or
/// `--max-context` set it where the device has less).
pub fn default_kv_budget() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let number = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok());
    let available = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024))
    });
    // "max" (no limit) does not parse: no cap from the cgroup.
    let cgroup_left = |limit: &str, usage: &str| {
        number(read(limit)).map(|l| l.saturating_sub(number(read(usage)).unwrap_or(0)))
    };
    let left =
        cgroup_left("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current").or_else(|| {
            cgroup_left(
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            )
        });
    match (available, left) {
        (Some(a), Some(l)) => a.min(l) / 4,
        (Some(b), None) | (None, Some(b)) => b / 4,
        (None, None) => 4 << 30,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_can_move_to_its_own_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Engine>();
        let mut e = Engine::tiny(1);
        let h = std::thread::spawn(move || e.generate_greedy(&[1, 4, 5], 3, &[]));
        let ids = h.join().expect("thread").expect("generate");
        assert_eq!(ids.len(), 3);
    }
}
