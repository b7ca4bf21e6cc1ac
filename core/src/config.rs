//! The Host's settings. Every limit and deadline from PROTOCOLS.md lives here.

pub use crate::dialect::batch::cache::CacheScope;
use crate::dialect::batch::GenerationDefaults;
use crate::keys::KeyRing;
use crate::principal::AuthScope;
use crate::time::Duration;

/// Settings of a [`crate::Host`]. `Default` gives the values PROTOCOLS.md names.
#[derive(Debug, Clone, PartialEq)]
pub struct HostConfig {
    /// Content-filter rules (`--content-filter`): `refuse` rules refuse
    /// prompts before any compute, `stop` rules end generations before
    /// matching text; `None`: no filtering.
    pub content_filter: Option<std::sync::Arc<crate::filter::ContentFilter>>,
    /// Rate limits for clients without a key, per address (requests and
    /// tokens per minute; both `None`: no limit).
    pub anon_limits: crate::keys::OrgLimits,
    /// `session`: refuse sessions that bring no `public_key` (every prompt
    /// then signed).
    pub require_signatures: bool,
    /// Wall-clock time (unix ms) at the Host's `Instant::ZERO`; ids and timestamps
    /// are `epoch_unix_ms + now`.
    pub epoch_unix_ms: u64,
    /// Largest accepted frame in bytes (larger closes with 1009).
    pub max_frame_bytes: usize,
    /// A connection whose outbound queue stays full this long is closed with 1008.
    pub slow_client_timeout: Duration,
    /// A paused generation ends with `timeout` after this long.
    pub pause_timeout: Duration,
    /// Connections idle this long are closed with 1000.
    pub idle_timeout: Duration,
    /// Ping interval.
    pub keepalive_interval: Duration,
    /// A connection that answers no ping for this long is closed.
    pub keepalive_timeout: Duration,
    /// How long in-flight generations may run after shutdown begins.
    pub shutdown_grace: Duration,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: u32,
    /// `--reasoning-parser`: the tags the model writes its reasoning
    /// between, split from Chat Completions answers into
    /// `reasoning_content` and from Responses answers into a `reasoning`
    /// item ([`crate::reasoning`]); `None` leaves the reasoning in the text.
    pub reasoning_tags: Option<crate::reasoning::ReasoningTags>,
    /// How `POST /v1/embeddings` pools a prompt's final hidden states into
    /// its vector (`--pooling`).
    pub embed_pooling: EmbedPooling,
    /// Most tokens computed in one engine step (prefill chunks plus decodes).
    pub max_step_tokens: u32,
    /// Most sequences in one engine step.
    pub max_running_seqs: u32,
    /// Reuse the KV blocks of prompt prefixes already computed, keeping
    /// unheld full blocks cached until the pool needs them (`--prefix-cache`).
    pub prefix_cache: bool,
    /// Speculative decoding by prompt lookup (`--draft-tokens` and friends);
    /// [`crate::DraftConfig::OFF`] by default.
    pub draft: crate::DraftConfig,
    /// Most requests waiting for admission; more get the dialect's queue-full error.
    pub max_queued_requests: u32,
    /// Most of those waiting requests one connection may have: its share of
    /// the queue, so one client cannot fill it for everyone.
    pub max_queued_per_conn: u32,
    /// `session`: most non-system messages a prompt is built from (the newest).
    pub session_max_messages: usize,
    /// `session`: most live sessions on this host.
    pub max_sessions: usize,
    /// `session`: most live sessions one connection may hold.
    pub max_sessions_per_conn: usize,
    /// `session`: most bytes of message text one session keeps (its whole
    /// conversation); a turn that would grow past it is refused.
    pub session_max_context_bytes: usize,
    /// Most jobs whose token use this host remembers.
    pub max_jobs: usize,
    /// `responses`: most WebSocket connections at once; the next gets
    /// `websocket_connection_limit_reached` and close 1013.
    pub max_websocket_connections: u32,
    /// `responses`: a WebSocket connection is told `connection_expiring` this
    /// long after it opened.
    pub responses_expiring_after: Duration,
    /// `responses`: a WebSocket connection is closed (1000) this long after it opened.
    pub responses_lifetime: Duration,
    /// `responses`: most `store: true` HTTP responses kept.
    pub response_store_size: usize,
    /// `batch`: `generation_config` values a payload leaves out.
    pub batch_defaults: GenerationDefaults,
    /// `batch`: most finished batches kept for continuing (least recently
    /// used go first; 0 keeps none).
    pub batch_cache_entries: usize,
    /// `batch`: most prompts in one payload.
    pub batch_max_prompts: usize,
    /// `batch`: most payloads one connection may have queued or running.
    pub batch_max_payloads: usize,
    /// The accepted API keys (the keys file). `cai` needs one (without a
    /// ring it refuses every connection with 1008); on other routes a key
    /// names the client's principal, and [`HostConfig::auth`] says whether
    /// one is required.
    pub keys: Option<KeyRing>,
    /// Which routes need a key (`--auth`): `cai` only, or all of them.
    pub auth: AuthScope,
    /// `batch`: whose finished batches a payload may continue. `Principal`
    /// (the default): only its own principal's; `Host`: any client's, the
    /// source's host-wide cache, for trusted networks only
    /// (`--batch-cache-scope host`).
    pub batch_cache_scope: CacheScope,
    /// `cai`: most requests in flight per connection; more get `RATE_LIMITED`.
    pub cai_max_inflight: u32,
    /// `cai`: how long a conversation is kept after its last request.
    pub conversation_ttl: Duration,
    /// `cai`: most conversations kept (least recently used go first).
    pub max_conversations: usize,
    /// `cai`: most conversations one organisation may keep (its least
    /// recently used go first), so one cannot push the others' out.
    pub max_conversations_per_org: usize,
    /// `cai`: most bytes of message text one conversation keeps (the oldest
    /// messages go first).
    pub conversation_max_bytes: usize,
    /// `cai`: most messages one conversation keeps beside its system
    /// messages' room (the oldest non-system messages go first).
    pub conversation_max_messages: usize,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            content_filter: None,
            anon_limits: crate::keys::OrgLimits::default(),
            require_signatures: false,
            epoch_unix_ms: 0,
            max_frame_bytes: 4 * 1024 * 1024,
            slow_client_timeout: Duration::from_secs(30),
            pause_timeout: Duration::from_secs(5 * 60),
            idle_timeout: Duration::from_secs(10 * 60),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            default_max_tokens: 256,
            reasoning_tags: None,
            embed_pooling: EmbedPooling::Auto,
            max_step_tokens: 512,
            max_running_seqs: 64,
            prefix_cache: true,
            draft: crate::DraftConfig::OFF,
            max_queued_requests: 1024,
            max_queued_per_conn: 256,
            session_max_messages: 20,
            max_sessions: 10_000,
            max_sessions_per_conn: 64,
            session_max_context_bytes: 1024 * 1024,
            max_jobs: 10_000,
            max_websocket_connections: 100,
            responses_expiring_after: Duration::from_secs(55 * 60),
            responses_lifetime: Duration::from_secs(60 * 60),
            response_store_size: 1000,
            batch_defaults: GenerationDefaults::default(),
            batch_cache_entries: 256,
            batch_max_prompts: 256,
            batch_max_payloads: 16,
            keys: None,
            auth: AuthScope::Cai,
            batch_cache_scope: CacheScope::Principal,
            cai_max_inflight: 4,
            conversation_ttl: Duration::from_secs(30 * 60),
            max_conversations: 10_000,
            max_conversations_per_org: 1_000,
            conversation_max_bytes: 1024 * 1024,
            conversation_max_messages: 256,
        }
    }
}

/// How `POST /v1/embeddings` pools a prompt's final hidden states into its
/// vector (`--pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmbedPooling {
    /// The pooling the model declares ([`crate::ModelInfo::pooling`]),
    /// else the mean.
    #[default]
    Auto,
    /// This pooling, whatever the model declares.
    Fixed(crate::engine::Pooling),
    /// The route is off (a 400 saying so).
    Off,
}

impl EmbedPooling {
    /// The pooling used for `model`'s embeddings; `None` when off.
    pub fn resolve(self, model: &crate::ModelInfo) -> Option<crate::engine::Pooling> {
        match self {
            EmbedPooling::Auto => Some(model.pooling.unwrap_or(crate::engine::Pooling::Mean)),
            EmbedPooling::Fixed(p) => Some(p),
            EmbedPooling::Off => None,
        }
    }

    /// Its name in flags (`auto`, `mean`, `last`, `off`).
    pub fn name(self) -> &'static str {
        match self {
            EmbedPooling::Auto => "auto",
            EmbedPooling::Fixed(p) => p.name(),
            EmbedPooling::Off => "off",
        }
    }

    /// The choice a name in [`EmbedPooling::name`] gives.
    pub fn from_name(name: &str) -> Option<EmbedPooling> {
        Some(match name {
            "auto" => EmbedPooling::Auto,
            "mean" => EmbedPooling::Fixed(crate::engine::Pooling::Mean),
            "last" => EmbedPooling::Fixed(crate::engine::Pooling::Last),
            "off" => EmbedPooling::Off,
            _ => return None,
        })
    }
}
