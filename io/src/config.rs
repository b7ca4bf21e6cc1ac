//! Settings: the command line, `TOKENWIRE_*` environment variables and a TOML
//! config file, merged into one [`ServerConfig`].
//!
//! Precedence, highest first: command line, environment, config file, default.
//! Every flag `--some-flag` is also read from `TOKENWIRE_SOME_FLAG` and from the
//! key `some_flag` of the file named by `--config` / `TOKENWIRE_CONFIG`.
//!
//! The environment is passed in as a map ([`EnvMap`]) rather than read here, so
//! the merging is a pure function that tests can call in parallel. The variable
//! names are declared once, with clap's `env` attribute (they show in `--help`);
//! parsing resets them and applies the map itself, feeding each value through the
//! flag's own clap parser so that a bad value names where it came from.
//!
//! Each setting is declared once, as a flag of [`ServeArgs`] (or of
//! [`TenancyArgs`]); the flags that set the Host take their defaults from
//! the core's [`HostConfig::default`], and [`ServerConfig::default`] is the
//! flags' defaults, so no default is written twice. [`ServerConfig`] keeps
//! the Host's settings as a [`HostConfig`] (`host`), the rest as its own
//! fields.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use tokenwire_core::dialect::batch::GenerationDefaults;
use tokenwire_core::HostConfig;

use crate::tenancy::TenancyArgs;

/// Environment variables, by name.
pub type EnvMap = BTreeMap<String, String>;

/// The `tokenwire` command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "tokenwire",
    version,
    about = "Streams LLM tokens over WebSocket (and HTTP/SSE) in five protocol dialects",
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `tokenwire` subcommands.
// Parsed once at start-up: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run the server.
    #[command(
        after_help = "Every flag can also be set with the environment variable shown, or \
                            with the same name in snake_case as a key of the --config TOML file. \
                            Precedence: command line > environment > config file > default."
    )]
    Serve(ServeArgs),
    /// Print the `sha256 = "..."` line of a `cai` keys file entry for the API
    /// key read from standard input (one line; the key is not echoed or stored).
    HashKey,
}

/// The compute backend.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The CPU reference engine.
    #[default]
    Cpu,
    /// Hand-written WGSL kernels on wgpu (Vulkan, Metal, DX12). The adapter is
    /// chosen by `--wgpu-adapter` (a name substring) among those wgpu finds,
    /// which `WGPU_BACKEND` (e.g. `vulkan`) restricts.
    Wgpu,
}

/// How the CPU backend multiplies quantized weights.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuActivations {
    /// Activations quantized to 8 bits per block, integer dot products
    /// (llama.cpp's arithmetic; fast).
    #[default]
    Int8,
    /// Weights widened to f32, f32 dot products: the arithmetic of the
    /// dequantized model (`transformers` on a GGUF file); slower.
    F32,
}

/// A feature turned on or off (`--prefix-cache on|off`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// `--reasoning-parser`: which tags a model writes its reasoning between
/// (vLLM's parser names).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// `<think>` ... `</think>`: Qwen3, QwQ.
    #[value(name = "qwen3")]
    Qwen3,
    /// `<think>` ... `</think>`: DeepSeek-R1 and its distills.
    #[value(name = "deepseek_r1")]
    DeepseekR1,
    /// `[THINK]` ... `[/THINK]`: Magistral.
    #[value(name = "mistral")]
    Mistral,
}

impl ReasoningParser {
    /// The tags this parser splits by.
    pub fn tags(self) -> tokenwire_core::reasoning::ReasoningTags {
        use tokenwire_core::reasoning::ReasoningTags;
        match self {
            ReasoningParser::Qwen3 | ReasoningParser::DeepseekR1 => ReasoningTags::THINK,
            ReasoningParser::Mistral => ReasoningTags::MISTRAL,
        }
    }
}

/// `--pooling`: how `POST /v1/embeddings` pools a prompt's final hidden
/// states into its vector.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolingFlag {
    /// What the model declares (a sentence-transformers Pooling module, a
    /// GGUF `pooling_type`), else the mean.
    #[default]
    Auto,
    /// The mean of every token's state.
    Mean,
    /// The last token's state (Qwen3-Embedding, e5-mistral, gte-Qwen2).
    Last,
    /// No embeddings route.
    Off,
}

impl PoolingFlag {
    /// The Host's setting.
    pub fn host(self) -> tokenwire_core::config::EmbedPooling {
        use tokenwire_core::config::EmbedPooling;
        use tokenwire_core::Pooling;
        match self {
            PoolingFlag::Auto => EmbedPooling::Auto,
            PoolingFlag::Mean => EmbedPooling::Fixed(Pooling::Mean),
            PoolingFlag::Last => EmbedPooling::Fixed(Pooling::Last),
            PoolingFlag::Off => EmbedPooling::Off,
        }
    }
}

/// Log line format.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Flags of `tokenwire serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// A GGUF file, a Hugging Face model directory (safetensors weights,
    /// config.json, tokenizer.json), or a Hugging Face repository id
    /// (`org/name`, or `org/name/FILE.gguf`) found in the local Hugging Face
    /// cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub), offline.
    /// Without it the model built into the binary, stories260K (a
    /// 260K-parameter TinyStories llama), is served.
    #[arg(long, env = "TOKENWIRE_MODEL", value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Serve the built-in tiny model with random weights (seeded by
    /// `--seed`) instead of a real one: for load tests of the server itself.
    #[arg(long, conflicts_with = "model")]
    pub random_model: bool,

    /// Address to listen on.
    #[arg(
        long,
        env = "TOKENWIRE_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,

    /// Compute backend.
    #[arg(long, env = "TOKENWIRE_BACKEND", value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,

    /// TOML file with more settings (keys: the flags' names in snake_case).
    #[arg(long, env = "TOKENWIRE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Largest accepted frame or HTTP body in bytes; larger frames close the
    /// connection with 1009.
    #[arg(long, env = "TOKENWIRE_MAX_FRAME_BYTES", value_name = "N",
          default_value_t = host_default().max_frame_bytes as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_frame_bytes: u64,

    /// Outbound frames queued per connection before its generations pause.
    #[arg(long, env = "TOKENWIRE_MAX_QUEUED_FRAMES", value_name = "N",
          default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queued_frames: u64,

    /// WebSocket permessage-deflate (RFC 7692): `on` accepts it when a
    /// client offers it (browsers and most libraries do), `off` never
    /// negotiates it. Either way the frame limit holds after inflation.
    #[arg(long, env = "TOKENWIRE_WEBSOCKET_COMPRESSION", value_enum,
          default_value_t = Switch::On)]
    pub websocket_compression: Switch,

    /// Seconds a connection's outbound queue may stay full before it is closed (1008).
    #[arg(
        long,
        env = "TOKENWIRE_SLOW_CLIENT_TIMEOUT",
        value_name = "SECS",
        default_value_t = host_default().slow_client_timeout.as_secs()
    )]
    pub slow_client_timeout: u64,

    /// Seconds a paused generation may stay paused before it ends with `timeout`.
    #[arg(
        long,
        env = "TOKENWIRE_PAUSE_TIMEOUT",
        value_name = "SECS",
        default_value_t = host_default().pause_timeout.as_secs()
    )]
    pub pause_timeout: u64,

    /// Seconds without a request or frame after which a connection is closed (1000).
    #[arg(
        long,
        env = "TOKENWIRE_IDLE_TIMEOUT",
        value_name = "SECS",
        default_value_t = host_default().idle_timeout.as_secs()
    )]
    pub idle_timeout: u64,

    /// Seconds in-flight generations may run after shutdown begins.
    #[arg(
        long,
        env = "TOKENWIRE_SHUTDOWN_GRACE",
        value_name = "SECS",
        default_value_t = host_default().shutdown_grace.as_secs()
    )]
    pub shutdown_grace: u64,

    /// Append client feedback (request id, rating, position, text) to this file,
    /// one JSON line each. Without it feedback is only counted.
    #[arg(long, env = "TOKENWIRE_FEEDBACK_LOG", value_name = "FILE")]
    pub feedback_log: Option<PathBuf>,

    /// `session`: most user and assistant messages a prompt is built from
    /// (the newest; system messages are always kept).
    #[arg(long, env = "TOKENWIRE_SESSION_MAX_MESSAGES", value_name = "N",
          default_value_t = host_default().session_max_messages as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub session_max_messages: u64,

    /// `session`: most live sessions on this host; past it `session_init` and
    /// `session_resume` get `rate_limited`.
    #[arg(long, env = "TOKENWIRE_MAX_SESSIONS", value_name = "N",
          default_value_t = host_default().max_sessions as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sessions: u64,

    /// Tokens (prompt and generated) each job may use on this host, as the
    /// default job verifier grants them; past it prompts get
    /// `token_budget_exhausted`. Without it jobs have no cap.
    #[arg(long, env = "TOKENWIRE_JOB_TOKEN_BUDGET", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub job_token_budget: Option<u64>,

    /// `responses`: most WebSocket connections on `/v1/responses` at once; the
    /// next gets `websocket_connection_limit_reached` and close 1013.
    #[arg(long, env = "TOKENWIRE_MAX_WEBSOCKET_CONNECTIONS", value_name = "N",
          default_value_t = host_default().max_websocket_connections,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_websocket_connections: u32,

    /// `responses`: seconds after which a WebSocket connection is warned
    /// `connection_expiring`.
    #[arg(long, env = "TOKENWIRE_RESPONSES_EXPIRING_AFTER", value_name = "SECS",
          default_value_t = host_default().responses_expiring_after.as_secs())]
    pub responses_expiring_after: u64,

    /// `responses`: seconds after which a WebSocket connection is closed (1000).
    #[arg(long, env = "TOKENWIRE_RESPONSES_LIFETIME", value_name = "SECS",
          default_value_t = host_default().responses_lifetime.as_secs())]
    pub responses_lifetime: u64,

    /// `responses`: most `store: true` HTTP responses kept in memory for
    /// `GET /v1/responses/{id}` and continuations (least recently used go first).
    #[arg(
        long,
        env = "TOKENWIRE_RESPONSE_STORE_SIZE",
        value_name = "N",
        default_value_t = host_default().response_store_size as u64
    )]
    pub response_store_size: u64,

    /// `batch`: most finished batches kept to be continued (least recently
    /// used go first; 0 keeps none).
    #[arg(
        long,
        env = "TOKENWIRE_BATCH_CACHE_ENTRIES",
        value_name = "N",
        default_value_t = host_default().batch_cache_entries as u64
    )]
    pub batch_cache_entries: u64,

    /// `batch`: `generation_config.num_beams` when a payload leaves it out.
    #[arg(long, env = "TOKENWIRE_GEN_NUM_BEAMS", value_name = "N",
          default_value_t = host_default().batch_defaults.num_beams,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gen_num_beams: u32,

    /// `batch`: `generation_config.do_sample` when a payload leaves it out
    /// (false: greedy).
    #[arg(long, env = "TOKENWIRE_GEN_DO_SAMPLE", value_name = "BOOL",
          default_value_t = host_default().batch_defaults.do_sample,
          action = clap::ArgAction::Set)]
    pub gen_do_sample: bool,

    /// `batch`: `generation_config.temperature` when a payload leaves it out (0 to 2).
    #[arg(long, env = "TOKENWIRE_GEN_TEMPERATURE", value_name = "T",
          default_value_t = host_default().batch_defaults.temperature,
          value_parser = temperature)]
    pub gen_temperature: f32,

    /// `batch`: `generation_config.top_p` when a payload leaves it out (above 0, at most 1).
    #[arg(long, env = "TOKENWIRE_GEN_TOP_P", value_name = "P",
          default_value_t = host_default().batch_defaults.top_p,
          value_parser = top_p)]
    pub gen_top_p: f32,

    /// `batch`: `generation_config.top_k` when a payload leaves it out (0: off).
    #[arg(
        long,
        env = "TOKENWIRE_GEN_TOP_K",
        value_name = "K",
        default_value_t = host_default().batch_defaults.top_k
    )]
    pub gen_top_k: u32,

    /// `batch`: `generation_config.max_new_tokens` when a payload leaves it out.
    #[arg(long, env = "TOKENWIRE_GEN_MAX_NEW_TOKENS", value_name = "N",
          default_value_t = host_default().batch_defaults.max_new_tokens,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub gen_max_new_tokens: u32,

    /// `batch`: `generation_config.repetition_penalty` when a payload leaves
    /// it out (above 0; 1: off).
    #[arg(long, env = "TOKENWIRE_GEN_REPETITION_PENALTY", value_name = "X",
          default_value_t = host_default().batch_defaults.repetition_penalty,
          value_parser = positive)]
    pub gen_repetition_penalty: f32,

    /// `batch`: `generation_config.length_penalty` when a payload leaves it out.
    #[arg(long, env = "TOKENWIRE_GEN_LENGTH_PENALTY", value_name = "X",
          default_value_t = host_default().batch_defaults.length_penalty,
          value_parser = finite)]
    pub gen_length_penalty: f32,

    /// The keys file (TOML: each key's SHA-256, the organisations it may act
    /// for, their rate limits; see `tokenwire hash-key`). `cai` needs one
    /// (without it every `cai` connection is closed with 1008); with
    /// `--auth all` every route does. On other routes a known key names the
    /// client's principal (what it keeps is its own).
    #[arg(long, env = "TOKENWIRE_KEYS", value_name = "FILE")]
    pub keys: Option<PathBuf>,

    /// Content-filter rules (TOML: `[[rule]]` tables with `name`, `pattern`,
    /// a regular expression matched case-insensitively, and `action`,
    /// `refuse` or `stop`): a prompt or message matching a `refuse` rule
    /// gets the dialect's content-filter error before any compute;
    /// generated text that would match a `stop` rule is never sent and the
    /// generation ends with finish reason `content_filter`.
    #[arg(long, env = "TOKENWIRE_CONTENT_FILTER", value_name = "FILE")]
    pub content_filter: Option<PathBuf>,

    /// `cai`: most requests in flight per connection; more get `RATE_LIMITED`.
    #[arg(long, env = "TOKENWIRE_CAI_MAX_INFLIGHT", value_name = "N",
          default_value_t = host_default().cai_max_inflight,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub cai_max_inflight: u32,

    /// `cai`: seconds a conversation (per organisation and `conversationId`)
    /// is kept in memory after its last request.
    #[arg(long, env = "TOKENWIRE_CONVERSATION_TTL", value_name = "SECS",
          default_value_t = host_default().conversation_ttl.as_secs())]
    pub conversation_ttl: u64,

    /// `cai`: most conversations kept in memory (least recently used go first).
    #[arg(long, env = "TOKENWIRE_MAX_CONVERSATIONS", value_name = "N",
          default_value_t = host_default().max_conversations as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_conversations: u64,

    /// Most WebSocket and HTTP generation connections open at once; more get 503.
    #[arg(long, env = "TOKENWIRE_MAX_CONNECTIONS", value_name = "N",
          default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,

    /// Seconds an HTTP client may take to send a request's headers (also the
    /// longest an idle keep-alive connection stays open).
    #[arg(long, env = "TOKENWIRE_HEADER_TIMEOUT", value_name = "SECS",
          default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,

    /// Seconds an HTTP request body may take to arrive, extended by one second
    /// for every --body-min-rate bytes received; a slower body gets 408.
    #[arg(long, env = "TOKENWIRE_BODY_TIMEOUT", value_name = "SECS",
          default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout: u64,

    /// Bytes per second a request body must keep up, beyond --body-timeout.
    #[arg(long, env = "TOKENWIRE_BODY_MIN_RATE", value_name = "BYTES",
          default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_min_rate: u64,

    /// Kernel send buffer per connection in bytes (0: the OS's own sizing).
    /// The outbound queue is the buffer that matters; a small socket buffer
    /// lets a reader that stalls be seen as slow, and its close be delivered.
    #[arg(
        long,
        env = "TOKENWIRE_SEND_BUFFER_BYTES",
        value_name = "N",
        default_value_t = 256 * 1024
    )]
    pub send_buffer_bytes: u64,

    /// KV cache blocks of 16 tokens in the pool (default: four full
    /// contexts, within a quarter of the memory available at start; a
    /// context that pool cannot hold once is lowered to what it holds).
    #[arg(long, env = "TOKENWIRE_KV_BLOCKS", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_blocks: Option<u32>,

    /// Serve a context of N tokens, below the model's own (vLLM's
    /// `--max-model-len`, llama.cpp's `--ctx-size`): prompts and answers
    /// longer than N are refused, and the default KV pool is sized for N.
    #[arg(long, alias = "max-model-len", env = "TOKENWIRE_MAX_CONTEXT", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_context: Option<u32>,

    /// Prefix caching: `on` keeps the KV blocks of finished prompts and
    /// reuses them for any later prompt that starts with the same tokens
    /// (conversation turns, shared system prompts); `off` recomputes every
    /// prompt from scratch.
    #[arg(long, env = "TOKENWIRE_PREFIX_CACHE", value_enum,
          default_value_t = Switch::from(host_default().prefix_cache))]
    pub prefix_cache: Switch,

    /// Speculative decoding by prompt lookup (vLLM's `ngram` method,
    /// llama.cpp's lookup decoding): while few sequences decode, each step
    /// feeds up to N tokens guessed from an earlier occurrence of a
    /// sequence's last tokens in its own prompt and answer, and keeps those
    /// the model's own samples confirm, so a step yields up to N + 1 tokens.
    /// Answers are the same as without it; quoting, code edits and
    /// extraction run faster. 0 (the default) turns it off.
    #[arg(long, env = "TOKENWIRE_DRAFT_TOKENS", value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=64))]
    pub draft_tokens: u32,

    /// With `--draft-tokens`: the shortest run of last tokens matched
    /// against earlier ones (vLLM's `prompt_lookup_min`).
    #[arg(long, env = "TOKENWIRE_DRAFT_NGRAM_MIN", value_name = "N",
          default_value_t = tokenwire_core::DraftConfig::OFF.ngram_min,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub draft_ngram_min: u32,

    /// With `--draft-tokens`: the longest run of last tokens matched
    /// first (vLLM's `prompt_lookup_max`); at least `--draft-ngram-min`.
    #[arg(long, env = "TOKENWIRE_DRAFT_NGRAM_MAX", value_name = "N",
          default_value_t = tokenwire_core::DraftConfig::OFF.ngram_max,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub draft_ngram_max: u32,

    /// With `--draft-tokens`: draft only while at most N sequences decode in
    /// a step; larger batches keep the engine busy without guesses.
    #[arg(long, env = "TOKENWIRE_DRAFT_MAX_SEQS", value_name = "N",
          default_value_t = tokenwire_core::DraftConfig::OFF.max_seqs,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub draft_max_seqs: u32,

    /// With `--backend wgpu`: use the first GPU adapter whose name contains
    /// NAME (default: the best adapter found; `WGPU_BACKEND` limits the APIs).
    #[arg(long, env = "TOKENWIRE_WGPU_ADAPTER", value_name = "NAME")]
    pub wgpu_adapter: Option<String>,

    /// With `--backend wgpu`: `on` multiplies prefill chunks and decode
    /// batches of 16 or more token rows on the GPU's matrix units where the
    /// adapter offers cooperative matrices (NVIDIA's Vulkan driver does):
    /// weights and activations rounded to f16, sums in f32. `off`: the f32
    /// kernels everywhere (slower prefill, bit-for-bit the f32 path).
    #[arg(long, env = "TOKENWIRE_WGPU_MATRIX_UNITS", value_enum, default_value_t = Switch::On)]
    pub wgpu_matrix_units: Switch,

    /// With `--backend cpu`: how quantized weights meet activations.
    #[arg(long, env = "TOKENWIRE_CPU_ACTIVATIONS", value_enum, default_value_t = CpuActivations::Int8)]
    pub cpu_activations: CpuActivations,

    /// Seed of the tiny model's weights and, when given, of the server's id and
    /// sampling-seed generator, making ids reproducible (and predictable by
    /// whoever knows it: for tests). Default: the generator is keyed with 32
    /// bytes from the OS and the tiny model's seed is drawn at start.
    #[arg(long, env = "TOKENWIRE_SEED", value_name = "N")]
    pub seed: Option<u64>,

    /// Log format.
    #[arg(long, env = "TOKENWIRE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Split a reasoning model's thinking from its answers: Chat
    /// Completions' `reasoning_content`, the Responses API's `reasoning`
    /// item (vLLM's flag and names): `qwen3` and `deepseek_r1` split at
    /// `<think>`/`</think>`, `mistral` at `[THINK]`/`[/THINK]`. Without it
    /// the reasoning stays in the text.
    #[arg(long, env = "TOKENWIRE_REASONING_PARSER", value_enum)]
    pub reasoning_parser: Option<ReasoningParser>,

    /// How `POST /v1/embeddings` pools a prompt's final hidden states into
    /// its vector: `auto` takes what the model declares (a
    /// sentence-transformers `1_Pooling/config.json`, a GGUF
    /// `pooling_type`) and else the mean; `mean`, `last` (the last token's
    /// state, as decoder embedding models such as Qwen3-Embedding use);
    /// `off` turns the route off.
    #[arg(long, env = "TOKENWIRE_POOLING", value_enum, default_value_t = PoolingFlag::Auto)]
    pub pooling: PoolingFlag,

    /// Keys, tenancy and per-client bounds.
    #[command(flatten)]
    pub tenancy: TenancyArgs,
}

/// Which model to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The built-in tiny model with random weights (seeded).
    Tiny,
    /// The real model built into the binary, stories260K.
    Builtin,
    /// A GGUF file or a model directory, loaded with `Engine::load`.
    Dir(PathBuf),
}

/// Every setting of a server: what the shell reads itself, and the Host's
/// settings ([`HostConfig`], the core's, whose defaults are PROTOCOLS.md's)
/// as the flags set them. `Default` gives the flags' defaults (the flags
/// take theirs from the core where the core has one, so each default is
/// written once) on `127.0.0.1:8080`, except the model: the tiny random
/// model (instant and deterministic, for tests and embedders), where
/// `tokenwire serve` without `--model` serves the built-in stories260K.
/// Tests typically set `listen` to port 0.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Address to listen on (port 0: any free port, see `RunningServer::local_addr`).
    pub listen: SocketAddr,
    /// The model.
    pub model: ModelSource,
    /// Compute backend.
    pub backend: Backend,
    /// The Host's settings: frames, deadlines, queues, each dialect's limits,
    /// prefix caching. Its `epoch_unix_ms` is set when the server starts;
    /// its keys, auth scope and per-client bounds come from `tenancy` and
    /// `keys` ([`ServerConfig::host_config`]).
    pub host: HostConfig,
    /// Outbound queue capacity per connection (hard limit: twice this).
    pub max_queued_frames: usize,
    /// Accept WebSocket permessage-deflate when a client offers it.
    pub websocket_compression: bool,
    /// Where feedback is appended as JSON lines, if anywhere.
    pub feedback_log: Option<PathBuf>,
    /// Tokens each job may use on this host, as the default verifier grants.
    pub job_token_budget: Option<u64>,
    /// `cai`: the keys file, read when the server starts.
    pub keys: Option<PathBuf>,
    /// The content-filter rules file, read when the server starts.
    pub content_filter: Option<PathBuf>,
    /// Most connections (WebSocket and HTTP generations) at once.
    pub max_connections: usize,
    /// How long an HTTP client may take to send a request's headers.
    pub header_timeout: Duration,
    /// How long a request body may take, before the rate extension.
    pub body_timeout: Duration,
    /// Bytes per second a request body must keep up beyond `body_timeout`.
    pub body_min_rate: u64,
    /// Kernel send buffer per connection (0: the OS's own sizing).
    pub send_buffer_bytes: usize,
    /// KV cache blocks (`None`: the engine decides).
    pub kv_blocks: Option<u32>,
    /// Context served, below the model's (`None`: the model's).
    pub max_context: Option<u32>,
    /// Name substring of the wgpu adapter to use (`None`: the best one).
    pub wgpu_adapter: Option<String>,
    /// wgpu: multiply wide passes on the matrix units where offered.
    pub wgpu_matrix_units: bool,
    /// CPU backend: how quantized weights meet activations.
    pub cpu_activations: CpuActivations,
    /// Seed of the tiny model's weights, and of the Host's id generator when
    /// `reproducible_ids` is set.
    pub seed: u64,
    /// `--seed` was given: the Host's ChaCha20 is keyed from `seed`, so ids
    /// and default sampling seeds repeat from run to run (and can be
    /// predicted by whoever knows the seed: for tests and debugging).
    /// Otherwise it is keyed with 32 bytes from the OS.
    pub reproducible_ids: bool,
    /// Log format (used by the binary when it sets up logging).
    pub log_format: LogFormat,
    /// Keys, tenancy and per-client bounds.
    pub tenancy: TenancyArgs,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model: ModelSource::Tiny,
            // Embedders and tests get reproducible runs; the binary keys
            // the generator from the OS unless `--seed` is given.
            reproducible_ids: true,
            ..ServerConfig::from_args(&ServeArgs::defaults(), 0)
        }
    }
}

impl ServeArgs {
    /// Every flag at its default (no command line, no environment, no file).
    pub fn defaults() -> ServeArgs {
        let matches = parsing_command()
            .try_get_matches_from(["tokenwire", "serve"])
            .expect("every flag of `serve` has a default or is optional");
        match Cli::from_arg_matches(&matches).map(|cli| cli.command) {
            Ok(Command::Serve(args)) => args,
            other => unreachable!("`serve` parses as itself: {other:?}"),
        }
    }
}

/// The core's defaults, which the flags that set the Host's settings take.
fn host_default() -> HostConfig {
    HostConfig::default()
}

impl From<bool> for Switch {
    fn from(on: bool) -> Switch {
        if on {
            Switch::On
        } else {
            Switch::Off
        }
    }
}

impl ServerConfig {
    /// The configuration `args` describe; `seed` is used when `args.seed` is unset.
    pub fn from_args(args: &ServeArgs, default_seed: u64) -> ServerConfig {
        let host = HostConfig {
            max_frame_bytes: to_usize(args.max_frame_bytes),
            slow_client_timeout: Duration::from_secs(args.slow_client_timeout),
            pause_timeout: Duration::from_secs(args.pause_timeout),
            idle_timeout: Duration::from_secs(args.idle_timeout),
            shutdown_grace: Duration::from_secs(args.shutdown_grace),
            session_max_messages: to_usize(args.session_max_messages),
            max_sessions: to_usize(args.max_sessions),
            max_websocket_connections: args.max_websocket_connections,
            responses_expiring_after: Duration::from_secs(args.responses_expiring_after),
            responses_lifetime: Duration::from_secs(args.responses_lifetime),
            response_store_size: to_usize(args.response_store_size),
            batch_cache_entries: to_usize(args.batch_cache_entries),
            batch_defaults: GenerationDefaults {
                num_beams: args.gen_num_beams,
                do_sample: args.gen_do_sample,
                temperature: args.gen_temperature,
                top_p: args.gen_top_p,
                top_k: args.gen_top_k,
                max_new_tokens: args.gen_max_new_tokens,
                repetition_penalty: args.gen_repetition_penalty,
                length_penalty: args.gen_length_penalty,
            },
            cai_max_inflight: args.cai_max_inflight,
            conversation_ttl: Duration::from_secs(args.conversation_ttl),
            max_conversations: to_usize(args.max_conversations),
            prefix_cache: args.prefix_cache == Switch::On,
            draft: tokenwire_core::DraftConfig {
                max_tokens: args.draft_tokens,
                ngram_min: args.draft_ngram_min,
                ngram_max: args.draft_ngram_max,
                max_seqs: args.draft_max_seqs,
            },
            reasoning_tags: args.reasoning_parser.map(ReasoningParser::tags),
            embed_pooling: args.pooling.host(),
            ..HostConfig::default()
        };
        ServerConfig {
            listen: args.listen,
            model: match &args.model {
                Some(dir) => ModelSource::Dir(dir.clone()),
                None if args.random_model => ModelSource::Tiny,
                None => ModelSource::Builtin,
            },
            backend: args.backend,
            host,
            max_queued_frames: to_usize(args.max_queued_frames),
            websocket_compression: args.websocket_compression == Switch::On,
            feedback_log: args.feedback_log.clone(),
            job_token_budget: args.job_token_budget,
            keys: args.keys.clone(),
            content_filter: args.content_filter.clone(),
            max_connections: to_usize(args.max_connections),
            header_timeout: Duration::from_secs(args.header_timeout),
            body_timeout: Duration::from_secs(args.body_timeout),
            body_min_rate: args.body_min_rate,
            send_buffer_bytes: to_usize(args.send_buffer_bytes),
            kv_blocks: args.kv_blocks,
            max_context: args.max_context,
            wgpu_adapter: args.wgpu_adapter.clone(),
            wgpu_matrix_units: args.wgpu_matrix_units == Switch::On,
            cpu_activations: args.cpu_activations,
            seed: args.seed.unwrap_or(default_seed),
            reproducible_ids: args.seed.is_some(),
            log_format: args.log_format,
            tenancy: args.tenancy.clone(),
        }
    }

    /// The Host's settings; `epoch_unix_ms` is the wall-clock time of the Host's
    /// `Instant::ZERO` (the server's start). The tenancy flags are applied
    /// here; the `cai` keys are not read here (see [`crate::keys::load`]).
    pub fn host_config(&self, epoch_unix_ms: u64) -> HostConfig {
        let mut host = HostConfig {
            epoch_unix_ms,
            ..self.host.clone()
        };
        self.tenancy.apply(&mut host);
        host
    }
}

fn float(s: &str) -> Result<f32, String> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("`{s}` is not a finite number"))
    }
}

fn temperature(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        (0.0..=2.0)
            .contains(&v)
            .then_some(v)
            .ok_or_else(|| format!("must be from 0 to 2, got {v}"))
    })
}

fn top_p(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        (v > 0.0 && v <= 1.0)
            .then_some(v)
            .ok_or_else(|| format!("must be above 0 and at most 1, got {v}"))
    })
}

fn positive(s: &str) -> Result<f32, String> {
    float(s).and_then(|v| {
        (v > 0.0)
            .then_some(v)
            .ok_or_else(|| format!("must be above 0, got {v}"))
    })
}

fn finite(s: &str) -> Result<f32, String> {
    float(s)
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Why the settings could not be read.
#[derive(Debug)]
pub enum ConfigError {
    /// A command-line problem, or `--help` / `--version`: clap renders it
    /// (`err.exit()` prints it with the right exit code).
    Cli(clap::Error),
    /// A bad environment variable or config file; the message names it.
    Invalid(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Cli(e) => write!(f, "{}", e.render()),
            ConfigError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The command as it is parsed: no clap-side environment reading (the [`EnvMap`]
/// is applied by [`parse_args`] instead).
fn parsing_command() -> clap::Command {
    Cli::command().mut_subcommand("serve", |s| s.mut_args(|a| a.env(None::<&'static str>)))
}

/// Reads a file's contents; the real one reads the disk. Lets tests pass a file
/// without touching the filesystem.
pub type FileReader<'a> = &'a dyn Fn(&Path) -> std::io::Result<String>;

/// Parses `args` (including the program name) with `env` as the environment and
/// the config file read from disk. See the module documentation for precedence.
pub fn parse_args<I, T>(args: I, env: &EnvMap) -> Result<Cli, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    parse_args_with(args, env, &|p| std::fs::read_to_string(p))
}

/// [`parse_args`] with the config file read through `read_file`.
pub fn parse_args_with<I, T>(
    args: I,
    env: &EnvMap,
    read_file: FileReader<'_>,
) -> Result<Cli, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cmd = parsing_command();
    let matches = match cmd.clone().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => return Err(ConfigError::Cli(with_env_help(e, &args))),
    };
    let Some(serve) = matches.subcommand_matches("serve") else {
        // Only one subcommand exists and one is required.
        return Cli::from_arg_matches(&matches).map_err(ConfigError::Cli);
    };

    let documented = Cli::command();
    let serve_cmd = documented
        .find_subcommand("serve")
        .ok_or_else(|| ConfigError::Invalid("internal: no serve subcommand".into()))?;
    let settings: Vec<Setting> = serve_cmd
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            Some(Setting {
                id: a.get_id().to_string(),
                long: long.to_string(),
                env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
            })
        })
        .filter(|s| s.id != "help" && s.id != "version")
        .collect();
    let on_cli = |id: &str| serve.value_source(id) == Some(ValueSource::CommandLine);

    // The config file's path: command line, then environment.
    let config_path: Option<PathBuf> = if on_cli("config") {
        serve.get_one::<PathBuf>("config").cloned()
    } else {
        env.get("TOKENWIRE_CONFIG").map(PathBuf::from)
    };
    let file = match &config_path {
        Some(p) => Some(read_config_file(p, read_file, &settings)?),
        None => None,
    };

    let mut extra: Vec<OsString> = Vec::new();
    for s in &settings {
        if on_cli(&s.id) {
            continue;
        }
        if let Some(value) = s.env.as_ref().and_then(|name| env.get(name)) {
            let name = s.env.as_deref().unwrap_or_default();
            check_value(&cmd, &s.long, value)
                .map_err(|m| ConfigError::Invalid(format!("environment variable {name}: {m}")))?;
            extra.push(format!("--{}", s.long).into());
            extra.push(value.into());
            continue;
        }
        if s.id == "config" {
            continue;
        }
        if let Some((path, table)) = &file {
            if let Some(v) = table.get(&s.id) {
                let value = toml_scalar(v).ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "config file {}: key `{}`: expected a single string, number or boolean",
                        path.display(),
                        s.id
                    ))
                })?;
                check_value(&cmd, &s.long, &value).map_err(|m| {
                    ConfigError::Invalid(format!(
                        "config file {}: key `{}`: {m}",
                        path.display(),
                        s.id
                    ))
                })?;
                extra.push(format!("--{}", s.long).into());
                extra.push(value.into());
            }
        }
    }

    let mut all = args;
    all.extend(extra);
    let merged = cmd.try_get_matches_from(&all).map_err(ConfigError::Cli)?;
    let cli = Cli::from_arg_matches(&merged).map_err(ConfigError::Cli)?;
    check_together(&cli)?;
    Ok(cli)
}

/// Settings that are each valid but contradict one another.
fn check_together(cli: &Cli) -> Result<(), ConfigError> {
    let Command::Serve(args) = &cli.command else {
        return Ok(());
    };
    if args.draft_ngram_min > args.draft_ngram_max {
        return Err(ConfigError::Invalid(format!(
            "--draft-ngram-min {} is above --draft-ngram-max {}",
            args.draft_ngram_min, args.draft_ngram_max
        )));
    }
    Ok(())
}

struct Setting {
    id: String,
    long: String,
    env: Option<String>,
}

/// For `--help`, renders the documented command (with its `[env: ...]` notes)
/// instead of the parsing one.
fn with_env_help(e: clap::Error, args: &[OsString]) -> clap::Error {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let documented =
                Cli::command().mut_subcommand("serve", |s| s.mut_args(|a| a.hide_env_values(true)));
            match documented.try_get_matches_from(args) {
                Err(help) => help,
                Ok(_) => e,
            }
        }
        _ => e,
    }
}

/// Checks one value with the flag's own parser; the error is clap's, first line.
fn check_value(cmd: &clap::Command, long: &str, value: &str) -> Result<(), String> {
    let probe = ["tokenwire", "serve", &format!("--{long}"), value];
    match cmd.clone().try_get_matches_from(probe) {
        Ok(_) => Ok(()),
        Err(e) => {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid value").trim();
            Err(first.strip_prefix("error: ").unwrap_or(first).to_string())
        }
    }
}

/// Reads and checks the config file: a TOML table whose keys are settings.
fn read_config_file(
    path: &Path,
    read_file: FileReader<'_>,
    settings: &[Setting],
) -> Result<(PathBuf, toml::Table), ConfigError> {
    let text = read_file(path).map_err(|e| {
        ConfigError::Invalid(format!("cannot read config file {}: {e}", path.display()))
    })?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        ConfigError::Invalid(format!(
            "config file {}: invalid TOML: {}",
            path.display(),
            e.message()
        ))
    })?;
    let known: HashSet<&str> = settings
        .iter()
        .map(|s| s.id.as_str())
        .filter(|id| *id != "config")
        .collect();
    for key in table.keys() {
        if !known.contains(key.as_str()) {
            let mut names: Vec<&str> = known.iter().copied().collect();
            names.sort_unstable();
            return Err(ConfigError::Invalid(format!(
                "config file {}: unknown key `{key}` (known keys: {})",
                path.display(),
                names.join(", ")
            )));
        }
    }
    Ok((path.to_path_buf(), table))
}

/// A TOML scalar as the string a flag would take.
fn toml_scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Datetime(_) | toml::Value::Array(_) | toml::Value::Table(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> EnvMap {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn no_file(_: &Path) -> std::io::Result<String> {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file",
        ))
    }

    fn serve(cli: Cli) -> ServeArgs {
        match cli.command {
            Command::Serve(a) => a,
            other => panic!("expected serve, got {other:?}"),
        }
    }

    fn parse(args: &[&str], env: &EnvMap, file: Option<&str>) -> Result<ServeArgs, ConfigError> {
        let owned = file.map(str::to_owned);
        let reader = move |_: &Path| match &owned {
            Some(text) => Ok(text.clone()),
            None => no_file(Path::new("")),
        };
        let mut argv = vec!["tokenwire", "serve"];
        argv.extend_from_slice(args);
        parse_args_with(argv, env, &reader).map(serve)
    }

    fn invalid(r: Result<ServeArgs, ConfigError>) -> String {
        match r {
            Err(ConfigError::Invalid(m)) => m,
            other => panic!("expected an invalid-setting error, got {other:?}"),
        }
    }

    #[test]
    fn speculative_decoding_flags() {
        let a = parse(&[], &EnvMap::new(), None).expect("parses");
        let off = ServerConfig::from_args(&a, 7).host_config(0).draft;
        assert!(!off.enabled(), "off by default");
        let a = parse(
            &[
                "--draft-tokens",
                "6",
                "--draft-ngram-min",
                "3",
                "--draft-max-seqs",
                "2",
            ],
            &EnvMap::from([("TOKENWIRE_DRAFT_NGRAM_MAX".into(), "5".into())]),
            None,
        )
        .expect("parses");
        let d = ServerConfig::from_args(&a, 7).host_config(0).draft;
        assert_eq!(
            (d.max_tokens, d.ngram_min, d.ngram_max, d.max_seqs),
            (6, 3, 5, 2)
        );
        assert!(d.enabled());
        let m = invalid(parse(
            &["--draft-ngram-min", "5", "--draft-ngram-max", "4"],
            &EnvMap::new(),
            None,
        ));
        assert_eq!(m, "--draft-ngram-min 5 is above --draft-ngram-max 4");
        for bad in [
            ["--draft-tokens", "65"],
            ["--draft-ngram-min", "0"],
            ["--draft-max-seqs", "0"],
        ] {
            assert!(parse(&bad, &EnvMap::new(), None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults() {
        let a = parse(&[], &EnvMap::new(), None).expect("parses");
        let c = ServerConfig::from_args(&a, 7);
        assert!(!c.reproducible_ids, "ids keyed from the OS without --seed");
        assert_eq!(c.listen, "127.0.0.1:8080".parse().expect("addr"));
        assert_eq!(c.model, ModelSource::Builtin);
        let a = parse(&["--random-model"], &EnvMap::new(), None).expect("parses");
        assert_eq!(ServerConfig::from_args(&a, 7).model, ModelSource::Tiny);
        assert_eq!(c.host.max_frame_bytes, 4 * 1024 * 1024);
        assert_eq!(c.max_queued_frames, 1024);
        assert_eq!(c.host.slow_client_timeout, Duration::from_secs(30));
        assert_eq!(c.host.pause_timeout, Duration::from_secs(300));
        assert_eq!(c.host.idle_timeout, Duration::from_secs(600));
        assert_eq!(c.host.shutdown_grace, Duration::from_secs(10));
        assert_eq!(c.max_connections, 10_000);
        assert_eq!(c.kv_blocks, None);
        assert_eq!(c.max_context, None, "the model's context");
        assert_eq!(c.host.reasoning_tags, None, "reasoning left in the text");
        use tokenwire_core::reasoning::ReasoningTags;
        for (name, tags) in [
            ("qwen3", ReasoningTags::THINK),
            ("deepseek_r1", ReasoningTags::THINK),
            ("mistral", ReasoningTags::MISTRAL),
        ] {
            let a = parse(&["--reasoning-parser", name], &EnvMap::new(), None).expect("parses");
            let c = ServerConfig::from_args(&a, 7);
            assert_eq!(c.host_config(0).reasoning_tags, Some(tags), "{name}");
        }
        assert!(parse(&["--reasoning-parser", "granite"], &EnvMap::new(), None).is_err());
        for flag in ["--max-context", "--max-model-len"] {
            let a = parse(&[flag, "4096"], &EnvMap::new(), None).expect("parses");
            assert_eq!(
                ServerConfig::from_args(&a, 7).max_context,
                Some(4096),
                "{flag}"
            );
        }
        assert!(parse(&["--max-context", "0"], &EnvMap::new(), None).is_err());
        assert!(c.host.prefix_cache && c.host_config(0).prefix_cache);
        let off = parse(&["--prefix-cache", "off"], &EnvMap::new(), None).expect("parses");
        assert!(!ServerConfig::from_args(&off, 7).host_config(0).prefix_cache);
        assert!(
            c.wgpu_matrix_units,
            "matrix units where the adapter has them"
        );
        let off = parse(&["--wgpu-matrix-units", "off"], &EnvMap::new(), None).expect("parses");
        assert!(!ServerConfig::from_args(&off, 7).wgpu_matrix_units);
        assert_eq!(c.seed, 7);
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.feedback_log, None);
        // `Default` differs from the flags in the model and in the id
        // generator's key only (reproducible for embedders and tests).
        let d = ServerConfig {
            seed: 7,
            model: ModelSource::Builtin,
            reproducible_ids: false,
            ..ServerConfig::default()
        };
        assert_eq!(c, d, "ServerConfig::default matches the flag defaults");
    }

    #[test]
    fn precedence_cli_over_env_over_file_over_default() {
        let file = "max_queued_frames = 3\nidle_timeout = 4\npause_timeout = 5\nseed = 6\n";
        let e = env(&[
            ("TOKENWIRE_CONFIG", "/etc/tokenwire.toml"),
            ("TOKENWIRE_IDLE_TIMEOUT", "40"),
            ("TOKENWIRE_PAUSE_TIMEOUT", "50"),
        ]);
        let a = parse(&["--pause-timeout", "500"], &e, Some(file)).expect("parses");
        assert_eq!(a.pause_timeout, 500, "command line beats env and file");
        assert_eq!(a.idle_timeout, 40, "env beats file");
        assert_eq!(a.max_queued_frames, 3, "file beats default");
        assert_eq!(a.seed, Some(6));
        assert_eq!(a.shutdown_grace, 10, "default when nobody sets it");
        assert_eq!(a.config, Some(PathBuf::from("/etc/tokenwire.toml")));
    }

    #[test]
    fn config_path_from_the_command_line_beats_env() {
        let e = env(&[("TOKENWIRE_CONFIG", "/nope.toml")]);
        let a = parse(&["--config", "/yes.toml"], &e, Some("kv_blocks = 9")).expect("parses");
        assert_eq!(a.kv_blocks, Some(9));
        assert_eq!(a.config, Some(PathBuf::from("/yes.toml")));
    }

    #[test]
    fn every_flag_has_its_env_var() {
        let e = env(&[
            ("TOKENWIRE_MODEL", "/models/m"),
            ("TOKENWIRE_LISTEN", "0.0.0.0:9000"),
            ("TOKENWIRE_BACKEND", "cpu"),
            ("TOKENWIRE_MAX_FRAME_BYTES", "1000"),
            ("TOKENWIRE_MAX_QUEUED_FRAMES", "8"),
            ("TOKENWIRE_SLOW_CLIENT_TIMEOUT", "1"),
            ("TOKENWIRE_PAUSE_TIMEOUT", "2"),
            ("TOKENWIRE_IDLE_TIMEOUT", "3"),
            ("TOKENWIRE_SHUTDOWN_GRACE", "4"),
            ("TOKENWIRE_FEEDBACK_LOG", "/tmp/fb.jsonl"),
            ("TOKENWIRE_MAX_CONNECTIONS", "5"),
            ("TOKENWIRE_KV_BLOCKS", "6"),
            ("TOKENWIRE_HEADER_TIMEOUT", "8"),
            ("TOKENWIRE_BODY_TIMEOUT", "9"),
            ("TOKENWIRE_BODY_MIN_RATE", "10"),
            ("TOKENWIRE_SEND_BUFFER_BYTES", "11"),
            ("TOKENWIRE_SEED", "7"),
            ("TOKENWIRE_LOG_FORMAT", "json"),
            ("TOKENWIRE_GEN_TEMPERATURE", "0.25"),
            ("TOKENWIRE_GEN_DO_SAMPLE", "true"),
            ("TOKENWIRE_GEN_MAX_NEW_TOKENS", "12"),
            ("TOKENWIRE_BATCH_CACHE_ENTRIES", "3"),
        ]);
        let a = parse(&[], &e, None).expect("parses");
        let c = ServerConfig::from_args(&a, 0);
        assert_eq!(c.model, ModelSource::Dir("/models/m".into()));
        assert_eq!(c.listen, "0.0.0.0:9000".parse().expect("addr"));
        assert_eq!(c.host.max_frame_bytes, 1000);
        assert_eq!(c.max_queued_frames, 8);
        assert_eq!(c.host.slow_client_timeout, Duration::from_secs(1));
        assert_eq!(c.host.pause_timeout, Duration::from_secs(2));
        assert_eq!(c.host.idle_timeout, Duration::from_secs(3));
        assert_eq!(c.host.shutdown_grace, Duration::from_secs(4));
        assert_eq!(c.feedback_log, Some(PathBuf::from("/tmp/fb.jsonl")));
        assert_eq!(c.max_connections, 5);
        assert_eq!(c.kv_blocks, Some(6));
        assert_eq!(c.header_timeout, Duration::from_secs(8));
        assert_eq!(c.body_timeout, Duration::from_secs(9));
        assert_eq!(c.body_min_rate, 10);
        assert_eq!(c.send_buffer_bytes, 11);
        assert_eq!(c.seed, 7);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.host.batch_defaults.temperature, 0.25);
        assert!(c.host.batch_defaults.do_sample);
        assert_eq!(c.host.batch_defaults.max_new_tokens, 12);
        assert_eq!(c.host.batch_cache_entries, 3);
        let h = c.host_config(0);
        assert_eq!(
            h.batch_defaults, c.host.batch_defaults,
            "they reach the Host"
        );
        let bad = parse(&[], &env(&[("TOKENWIRE_GEN_TEMPERATURE", "3")]), None);
        assert!(invalid(bad).contains("TOKENWIRE_GEN_TEMPERATURE"));
    }

    #[test]
    fn every_flag_has_its_file_key() {
        let file = r#"
            model = "/models/m"
            listen = "0.0.0.0:9000"
            backend = "cpu"
            max_frame_bytes = 1000
            max_queued_frames = 8
            slow_client_timeout = 1
            pause_timeout = 2
            idle_timeout = 3
            shutdown_grace = 4
            feedback_log = "/tmp/fb.jsonl"
            max_connections = 5
            kv_blocks = 6
            header_timeout = 8
            body_timeout = 9
            body_min_rate = 10
            send_buffer_bytes = 11
            seed = 7
            log_format = "json"
        "#;
        let a = parse(&["--config", "t.toml"], &EnvMap::new(), Some(file)).expect("parses");
        let c = ServerConfig::from_args(&a, 0);
        assert_eq!(c.model, ModelSource::Dir("/models/m".into()));
        assert_eq!(c.max_connections, 5);
        assert_eq!(c.kv_blocks, Some(6));
        assert_eq!(c.body_min_rate, 10);
        assert_eq!(c.send_buffer_bytes, 11);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.host.shutdown_grace, Duration::from_secs(4));
    }

    #[test]
    fn unknown_file_key_is_an_error_naming_it() {
        let m = invalid(parse(
            &["--config", "t.toml"],
            &EnvMap::new(),
            Some("idle_timeout = 3\nmax_frames = 1\n"),
        ));
        assert!(m.contains("unknown key `max_frames`"), "{m}");
        assert!(m.contains("t.toml"), "{m}");
        let m = invalid(parse(
            &["--config", "t.toml"],
            &EnvMap::new(),
            Some("config = \"other.toml\"\n"),
        ));
        assert!(m.contains("unknown key `config`"), "{m}");
    }

    #[test]
    fn bad_file_value_names_the_key() {
        let m = invalid(parse(
            &["--config", "t.toml"],
            &EnvMap::new(),
            Some("max_frame_bytes = \"lots\"\n"),
        ));
        assert!(m.contains("key `max_frame_bytes`"), "{m}");
        assert!(m.contains("lots"), "{m}");
        let m = invalid(parse(
            &["--config", "t.toml"],
            &EnvMap::new(),
            Some("max_queued_frames = 0\n"),
        ));
        assert!(m.contains("key `max_queued_frames`"), "{m}");
        let m = invalid(parse(
            &["--config", "t.toml"],
            &EnvMap::new(),
            Some("listen = [1, 2]\n"),
        ));
        assert!(m.contains("key `listen`"), "{m}");
        let m = invalid(parse(
            &["--config", "t.toml"],
            &EnvMap::new(),
            Some("listen = \n"),
        ));
        assert!(m.contains("invalid TOML"), "{m}");
    }

    #[test]
    fn bad_env_value_names_the_variable() {
        let m = invalid(parse(
            &[],
            &env(&[("TOKENWIRE_MAX_CONNECTIONS", "many")]),
            None,
        ));
        assert!(m.contains("TOKENWIRE_MAX_CONNECTIONS"), "{m}");
        assert!(m.contains("many"), "{m}");
        let m = invalid(parse(&[], &env(&[("TOKENWIRE_BACKEND", "tpu")]), None));
        assert!(m.contains("TOKENWIRE_BACKEND"), "{m}");
    }

    #[test]
    fn a_bad_env_value_is_ignored_when_the_command_line_sets_it() {
        let a = parse(
            &["--max-connections", "3"],
            &env(&[("TOKENWIRE_MAX_CONNECTIONS", "many")]),
            None,
        )
        .expect("the command line wins, the env value is not read");
        assert_eq!(a.max_connections, 3);
    }

    #[test]
    fn missing_config_file_names_the_path() {
        let m = invalid(parse(&["--config", "/missing.toml"], &EnvMap::new(), None));
        assert!(m.contains("/missing.toml"), "{m}");
    }

    #[test]
    fn bad_command_line_is_a_clap_error() {
        assert!(matches!(
            parse(&["--max-frame-bytes", "x"], &EnvMap::new(), None),
            Err(ConfigError::Cli(_))
        ));
        assert!(matches!(
            parse(&["--no-such-flag"], &EnvMap::new(), None),
            Err(ConfigError::Cli(_))
        ));
    }

    #[test]
    fn help_mentions_the_env_vars() {
        match parse(&["--help"], &EnvMap::new(), None) {
            Err(ConfigError::Cli(e)) => {
                let text = e.render().to_string();
                assert!(text.contains("TOKENWIRE_MAX_FRAME_BYTES"), "{text}");
            }
            other => panic!("expected help, got {other:?}"),
        }
    }

    #[test]
    fn host_config_carries_the_limits() {
        let mut c = ServerConfig::default();
        c.host.max_frame_bytes = 10;
        c.host.idle_timeout = Duration::from_secs(1);
        let h = c.host_config(123);
        assert_eq!(h.epoch_unix_ms, 123);
        assert_eq!(h.max_frame_bytes, 10);
        assert_eq!(h.idle_timeout, Duration::from_secs(1));
        assert_eq!(h.shutdown_grace, c.host.shutdown_grace);
    }
}
