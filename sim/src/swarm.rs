//! Swarm options: everything one run does, derived from its seed.
//!
//! Swarm testing (as TigerBeetle's VOPR does it): rather than one fixed mix of
//! behaviours, each seed switches whole features on or off and picks their
//! rates, so that some seeds hammer one fault and others never see it. Every
//! sub-system draws from its own stream (`mix64(seed, STREAM)`), so changing how
//! one of them uses randomness does not reshuffle the others.

use std::sync::Arc;

use tokenwire_core::config::{CacheScope, EmbedPooling};
use tokenwire_core::filter::{ContentFilter, FilterAction, FilterRule};
use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
use tokenwire_core::rng::{mix64, Rng};
use tokenwire_core::testing::tiny_model_info;
use tokenwire_core::{Dialect, DraftConfig, Duration, HostConfig, ModelInfo, Pooling};

/// Random stream for the swarm options themselves.
pub const STREAM_SWARM: u64 = 0x5357_4152_4d00_0001;
/// Random stream for network delays and readers.
pub const STREAM_NET: u64 = 0x4e45_5400_0000_0002;
/// Random stream for engine latency and fault rolls.
pub const STREAM_ENGINE: u64 = 0x454e_4700_0000_0003;
/// Random stream base for clients (mixed with the client index).
pub const STREAM_CLIENT: u64 = 0x434c_4900_0000_0004;
/// Random stream for the fault plan.
pub const STREAM_FAULTS: u64 = 0x4641_5500_0000_0005;
/// Random stream for speculative decoding's options (its own, so that the
/// options drawn before it existed stay what they were for every seed).
pub const STREAM_DRAFT: u64 = 0x4452_4146_5400_000e;
/// Random stream for text jobs (tokenizing): their options and latencies.
pub const STREAM_TEXT: u64 = 0x5445_5854_0000_0006;
/// Random stream for the dialect mix and the `session` / `responses`
/// settings of a run.
pub const STREAM_DIALECTS: u64 = 0x4449_414c_0000_0007;
/// Random stream for the job verifier's verdicts and latencies.
pub const STREAM_JOBS: u64 = 0x4a4f_4253_0000_0008;
/// Random stream for the `cai` clients of a run and its keys file.
pub const STREAM_CAI: u64 = 0x4341_4900_0000_0009;
/// Random stream for the `batch` clients of a run and its cache size.
pub const STREAM_BATCH: u64 = 0x4241_5443_0000_000a;
/// Random stream for the content filter of a run.
pub const STREAM_FILTER: u64 = 0x4649_4c54_0000_000b;
/// Random stream for the `cai` conversation store's per-organisation and
/// byte bounds.
pub const STREAM_CONVERSATIONS: u64 = 0x434f_4e56_0000_000d;
/// Random stream base for whether a `session` or `responses` client speaks
/// HTTP (mixed with the client index).
pub const STREAM_HTTP: u64 = 0x4854_5450_0000_000c;
/// Random stream for the `chat` clients of a run, its embeddings' pooling
/// and each connection's share of the queue.
pub const STREAM_CHAT: u64 = 0x4348_4154_0000_000f;

/// How the simulated engine writes and how fast it is.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// The symbols it writes (each one printable ASCII character, or one
    /// multi-byte UTF-8 character whose first byte no other symbol shares, so
    /// that a half-written character can be finished from the history alone).
    pub symbols: Vec<String>,
    /// Chance per token, in thousandths, of end-of-sequence.
    pub eos_permille: u32,
    /// Fixed latency of a step.
    pub step_base: Duration,
    /// Extra latency per token fed.
    pub per_token: Duration,
    /// Largest random extra latency of a step.
    pub jitter: Duration,
}

impl EngineOptions {
    /// The longest a step can take under `host` (the step-latency bound used
    /// in deadline slack and the liveness bound).
    pub fn max_step_latency(&self, host: &HostConfig) -> Duration {
        self.step_base + self.per_token * host.max_step_tokens + self.jitter
    }
}

/// Network delays and slow readers.
#[derive(Debug, Clone, PartialEq)]
pub struct NetOptions {
    /// Shortest one-way delay of a client frame.
    pub delay_min: Duration,
    /// Longest one-way delay of a client frame.
    pub delay_max: Duration,
    /// Chance that a client reads slowly (one frame per interval).
    pub slow_reader_p: f64,
    /// Chance that a client's reader stalls now and then.
    pub stall_p: f64,
    /// Longest reader stall (long ones cross the slow-client timeout).
    pub stall_max: Duration,
    /// Outbound queue capacity of a slow connection, in frames.
    pub queue_cap: (u32, u32),
}

/// Fault rates and counts for the safety phase.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultOptions {
    /// Chance per step of an engine out-of-memory fault.
    pub oom_p: f64,
    /// Chance per step of losing the device.
    pub device_lost_p: f64,
    /// Chance per step of an internal engine error.
    pub internal_p: f64,
    /// Host crashes during the safety phase.
    pub crashes: u32,
    /// KV capacity shrinks (each regrows later) during the safety phase.
    pub kv_shrinks: u32,
    /// Clock jumps during the safety phase.
    pub time_jumps: u32,
    /// Graceful shutdown near the end (at the start of the liveness phase).
    pub shutdown: bool,
}

/// How the simulated clients behave.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientMix {
    /// Chance that an action is a malformed or hostile frame.
    pub hostile_p: f64,
    /// Chance that an action during a generation is a control message.
    pub control_p: f64,
    /// Chance that an action is an early disconnect.
    pub disconnect_p: f64,
    /// Chance that a client never answers pings.
    pub silent_p: f64,
    /// Chance that a client speaks over HTTP (one request per connection).
    pub http_p: f64,
    /// Chance that a wait is a long one (minutes: crosses idle and pause deadlines).
    pub long_wait_p: f64,
    /// Longest ordinary think time between two actions.
    pub think_max: Duration,
    /// Largest `max_tokens` a valid config asks for (before the context cap).
    pub max_tokens_cap: u32,
}

/// How the shell's job verifier answers (`Output::VerifyJob`).
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    /// Chance that a job is refused.
    pub refuse_p: f64,
    /// Tokens a job may use on a host (`None`: no cap).
    pub token_budget: Option<u64>,
    /// Longest time a verdict takes.
    pub latency_max: Duration,
}

/// A `cai` API key as the run's clients know it (the Host's keys file
/// holds only its SHA-256).
#[derive(Debug, Clone, PartialEq)]
pub struct CaiKey {
    /// The key as clients present it.
    pub secret: String,
    /// The organisations it may act for.
    pub orgs: Vec<String>,
}

/// The `cai` side of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct CaiOptions {
    /// The keys of the keys file (empty when the run has none: every `cai`
    /// connection is then refused with 1008).
    pub keys: Vec<CaiKey>,
    /// Every organisation named anywhere, some of them allowed for no key.
    pub orgs: Vec<String>,
}

/// All options of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Swarm {
    /// The run's seed.
    pub seed: u64,
    /// Simulated clients.
    pub clients: usize,
    /// The dialect of each client, by index: the six simulated dialects
    /// (and `anthropic` in two mixed runs of three) in most seeds, a single
    /// one in a few.
    pub dialects: Vec<Dialect>,
    /// The `cai` keys and organisations (the keys file itself is in `host`).
    pub cai: CaiOptions,
    /// The job verifier.
    pub jobs: JobOptions,
    /// The served model (byte tokenizer).
    pub model: ModelInfo,
    /// The Host's settings.
    pub host: HostConfig,
    /// Seed of the first Host (a rebuilt one gets `mix64(host_seed, crashes)`).
    pub host_seed: u64,
    /// Start with the model still loading (`Host::new`, then `ModelLoaded`).
    pub start_loading: bool,
    /// How long loading takes when it does.
    pub load_time: Duration,
    /// The simulated engine.
    pub engine: EngineOptions,
    /// The network.
    pub net: NetOptions,
    /// The faults.
    pub faults: FaultOptions,
    /// The clients.
    pub mix: ClientMix,
    /// Longest time a text job (tokenizing a prompt) takes to come back; each
    /// takes a random time up to this, so answers overtake one another and
    /// engine steps.
    pub text_latency_max: Duration,
    /// Chance that a text job fails for a reason other than length (the
    /// error a tokenizer or a chat template gives).
    pub text_fail_p: f64,
}

/// Printable ASCII symbols the engine may write: no `<`, so that no
/// generated text can spell a connection's tag `<c{conn}>` (which the
/// `isolation` checker reads as a leak; over a sweep's hundred million
/// tokens, chance spelled one).
const ASCII: &[u8] = b" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?;:'\"-()[]{}>/\\|@#$%^&*_+=~`\n\t";
/// Multi-byte symbols with distinct first bytes (C3, E4, F0).
const WIDE: [&str; 3] = ["é", "世", "🦀"];

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.below(items.len() as u64) as usize]
}

fn chance(rng: &mut Rng, p: f64) -> bool {
    rng.next_f64() < p
}

/// A duration uniformly between `lo` and `hi`.
pub fn between(rng: &mut Rng, lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    let span = (hi - lo).as_nanos().min(u64::MAX as u128) as u64;
    lo + Duration::from_nanos(rng.below(span.saturating_add(1)))
}

impl Swarm {
    /// The options of `seed`. Pure: the same seed always gives the same options.
    pub fn from_seed(seed: u64) -> Swarm {
        let mut r = Rng::new(mix64(seed, STREAM_SWARM));
        let rng = &mut r;

        let mut model = tiny_model_info();
        model.context_len = pick(rng, &[96, 128, 256, 512]);
        model.block_size = pick(rng, &[4, 8, 16, 16, 32]);
        // From a pool that holds less than one context to a generous one.
        let pool_tokens = pick(rng, &[64u32, 128, 256, 512, 1024, 4096]);
        model.num_blocks = (pool_tokens / model.block_size).max(2);

        let host = HostConfig {
            epoch_unix_ms: 1_700_000_000_000 + rng.below(100_000_000_000),
            max_frame_bytes: pick(rng, &[1024, 4096, 65536, 4 * 1024 * 1024]),
            max_step_tokens: pick(rng, &[8, 16, 32, 64, 128, 512]),
            max_running_seqs: pick(rng, &[1, 2, 3, 4, 8, 64]),
            max_queued_requests: pick(rng, &[1, 2, 4, 16, 1024]),
            default_max_tokens: pick(rng, &[16, 64, 256]),
            draft: draft_options(&mut Rng::new(mix64(seed, STREAM_DRAFT))),
            ..HostConfig::default()
        };

        let mut symbols: Vec<String> = Vec::new();
        let alphabet = pick(rng, &[2usize, 4, 8, 16, 40, ASCII.len()]);
        let offset = rng.below(ASCII.len() as u64) as usize;
        for i in 0..alphabet {
            symbols.push((ASCII[(offset + i) % ASCII.len()] as char).to_string());
        }
        if chance(rng, 0.4) {
            for w in WIDE {
                if chance(rng, 0.6) {
                    symbols.push(w.to_string());
                }
            }
        }
        let engine = EngineOptions {
            symbols,
            eos_permille: pick(rng, &[0, 2, 10, 30, 80]),
            step_base: Duration::from_micros(pick(rng, &[200, 1_000, 5_000, 20_000])),
            per_token: Duration::from_micros(pick(rng, &[0, 10, 50, 200])),
            jitter: Duration::from_micros(pick(rng, &[0, 500, 5_000])),
        };

        let net = NetOptions {
            delay_min: Duration::from_micros(pick(rng, &[0, 100, 1_000])),
            delay_max: Duration::from_micros(pick(rng, &[200, 5_000, 50_000])),
            slow_reader_p: if chance(rng, 0.5) {
                pick(rng, &[0.1, 0.3, 0.7])
            } else {
                0.0
            },
            stall_p: if chance(rng, 0.4) {
                pick(rng, &[0.01, 0.05, 0.2])
            } else {
                0.0
            },
            stall_max: Duration::from_secs(pick(rng, &[2, 20, 45])),
            queue_cap: pick(rng, &[(2, 4), (4, 16), (16, 64)]),
        };

        let on = |rng: &mut Rng| chance(rng, 0.5);
        let faults = FaultOptions {
            oom_p: if on(rng) {
                pick(rng, &[0.002, 0.01, 0.05])
            } else {
                0.0
            },
            device_lost_p: if on(rng) {
                pick(rng, &[0.001, 0.005, 0.02])
            } else {
                0.0
            },
            internal_p: if chance(rng, 0.25) {
                pick(rng, &[0.001, 0.01])
            } else {
                0.0
            },
            crashes: if on(rng) { 1 + rng.below(3) as u32 } else { 0 },
            kv_shrinks: if on(rng) { 1 + rng.below(4) as u32 } else { 0 },
            time_jumps: if on(rng) { 1 + rng.below(3) as u32 } else { 0 },
            shutdown: chance(rng, 0.2),
        };

        let mix = ClientMix {
            hostile_p: if on(rng) {
                pick(rng, &[0.02, 0.08, 0.25])
            } else {
                0.0
            },
            control_p: pick(rng, &[0.05, 0.2, 0.5]),
            disconnect_p: if on(rng) {
                pick(rng, &[0.01, 0.04])
            } else {
                0.0
            },
            silent_p: if chance(rng, 0.2) { 0.3 } else { 0.0 },
            http_p: if chance(rng, 0.2) { 0.3 } else { 0.0 },
            long_wait_p: if on(rng) {
                pick(rng, &[0.01, 0.05])
            } else {
                0.0
            },
            think_max: Duration::from_millis(pick(rng, &[5, 50, 500, 3_000])),
            max_tokens_cap: pick(rng, &[8, 32, 96]),
        };

        // From its own stream, so the options above stay as they were.
        let mut text_rng = Rng::new(mix64(seed, STREAM_TEXT));
        let text_latency_max = Duration::from_micros(pick(&mut text_rng, &[0, 50, 1_000, 20_000]));
        let text_fail_p = pick(&mut text_rng, &[0.0, 0.0, 0.01, 0.05]);

        let most_clients = pick(rng, &[2u64, 4, 8, 16]);
        let generate_clients = 1 + rng.below(most_clients) as usize;
        let start_loading = chance(rng, 0.15);
        let load_time = Duration::from_millis(pick(rng, &[1, 50, 400]));

        // From their own stream, so the options above stay as they were.
        let mut host = host;
        let d = &mut Rng::new(mix64(seed, STREAM_DIALECTS));
        let dialects = dialect_mix(d, generate_clients);
        host.session_max_messages = pick(d, &[2, 4, 20]);
        host.max_sessions = pick(d, &[2, 8, 10_000]);
        host.max_sessions_per_conn = pick(d, &[1, 2, 64]);
        host.max_websocket_connections = pick(d, &[1, 2, 4, 100]);
        host.session_max_context_bytes = pick(d, &[64, 512, 1 << 20, 1 << 20]);
        let (warn, life) = pick(
            d,
            &[
                (55 * 60, 60 * 60),
                (20, 30),
                (90, 180),
                (300, 330),
                (50, 51),
            ],
        );
        host.responses_expiring_after = Duration::from_secs(warn);
        host.responses_lifetime = Duration::from_secs(life);
        let jobs = JobOptions {
            refuse_p: pick(d, &[0.0, 0.0, 0.05, 0.3]),
            token_budget: pick(d, &[None, Some(120), Some(300), Some(3_000)]),
            latency_max: Duration::from_micros(pick(d, &[0, 1_000, 20_000])),
        };
        // `cai` from its own stream too: its clients join the mix drawn above.
        let c = &mut Rng::new(mix64(seed, STREAM_CAI));
        let dialects = cai_mix(c, dialects);
        let cai = cai_options(c, &mut host);
        // The conversation store's other bounds, from a stream of their own
        // so that the options above stay as they were.
        let v = &mut Rng::new(mix64(seed, STREAM_CONVERSATIONS));
        host.max_conversations_per_org = pick(v, &[1, 2, 10_000]);
        host.conversation_max_bytes = pick(v, &[48, 256, 1 << 20]);
        host.conversation_max_messages = pick(v, &[3, 8, 256]);
        // `batch` from its own stream too: its clients join at the end.
        let b = &mut Rng::new(mix64(seed, STREAM_BATCH));
        let dialects = batch_mix(b, dialects);
        host.batch_cache_entries = pick(b, &[0, 1, 2, 4, 256]);
        // The bounds, small now and then so that clients meet them.
        host.batch_max_payloads = pick(b, &[1, 2, 16, 16]);
        host.batch_max_prompts = pick(b, &[2, 4, 256, 256]);
        // Mostly each connection's own cache; sometimes the source's
        // host-wide one (a trusted network's choice).
        host.batch_cache_scope = if chance(b, 0.25) {
            CacheScope::Host
        } else {
            CacheScope::Principal
        };
        // `chat` from its own stream too: its clients join at the end.
        let h = &mut Rng::new(mix64(seed, STREAM_CHAT));
        let dialects = chat_mix(h, dialects);
        model.pooling = pick(h, &[None, None, Some(Pooling::Last)]);
        host.embed_pooling = pick(
            h,
            &[
                EmbedPooling::Auto,
                EmbedPooling::Auto,
                EmbedPooling::Fixed(Pooling::Mean),
                EmbedPooling::Off,
            ],
        );
        // Now and then a share small enough that a batch of prompts, or
        // one prompt's choices, wait for one another (every dialect's
        // connections get it: `cai` and `batch` ones meet it too).
        host.max_queued_per_conn = pick(h, &[2, 3, 256, 256, 256]);
        // The content filter from its own stream too: a `stop` rule on two
        // of the symbols the engine writes, so generations run into it.
        let f = &mut Rng::new(mix64(seed, STREAM_FILTER));
        if chance(f, 0.3) {
            let a = &engine.symbols[rng_index(f, engine.symbols.len())];
            let b = &engine.symbols[rng_index(f, engine.symbols.len())];
            let rule = FilterRule {
                name: "sim-stop".into(),
                pattern: format!("{}{}", regex_literal(a), regex_literal(b)),
                action: FilterAction::Stop,
            };
            host.content_filter = ContentFilter::new(vec![rule]).ok().map(Arc::new);
        }
        Swarm {
            seed,
            clients: dialects.len(),
            dialects,
            cai,
            jobs,
            host_seed: mix64(seed, 0x484f_5354),
            start_loading,
            load_time,
            model,
            host,
            engine,
            net,
            faults,
            mix,
            text_latency_max,
            text_fail_p,
        }
    }

    /// Slack allowed on every deadline: one engine step plus a millisecond.
    pub fn slack(&self) -> Duration {
        self.engine.max_step_latency(&self.host) + Duration::from_millis(1)
    }
}

/// The dialect of each client. Most seeds mix `generate`, `session` and
/// `responses`: the `generate` clients the seed drew, then one to three of
/// each of the other two; a few seeds give every client one dialect.
/// ([`cai_mix`] then adds the `cai` clients, from a stream of their own.)
fn dialect_mix(rng: &mut Rng, generate_clients: usize) -> Vec<Dialect> {
    let x = rng.next_f64();
    let only = |d: Dialect| vec![d; generate_clients];
    if x < 0.06 {
        return only(Dialect::Generate);
    }
    if x < 0.1 {
        return only(Dialect::Session);
    }
    if x < 0.14 {
        return only(Dialect::Responses);
    }
    let mut v = only(Dialect::Generate);
    let sessions = 1 + rng.below(3) as usize;
    let responses = 1 + rng.below(3) as usize;
    v.extend(std::iter::repeat_n(Dialect::Session, sessions));
    v.extend(std::iter::repeat_n(Dialect::Responses, responses));
    v
}

/// Adds one to three `cai` clients to a mixed run (a run of one dialect
/// stays so), and makes a few runs all `cai`.
fn cai_mix(rng: &mut Rng, mut dialects: Vec<Dialect>) -> Vec<Dialect> {
    let x = rng.next_f64();
    let n = 1 + rng.below(3) as usize;
    let single = dialects.windows(2).all(|w| w[0] == w[1]);
    if x < 0.04 {
        return vec![Dialect::Cai; dialects.len().max(2)];
    }
    if !single {
        dialects.extend(std::iter::repeat_n(Dialect::Cai, n));
    }
    dialects
}

/// Adds one to three `batch` clients to a mixed run (a run of one dialect
/// stays so), and makes a few runs all `batch`. Appended last, so every
/// other client keeps its index and its random stream.
fn batch_mix(rng: &mut Rng, mut dialects: Vec<Dialect>) -> Vec<Dialect> {
    let x = rng.next_f64();
    let n = 1 + rng.below(3) as usize;
    let single = dialects.windows(2).all(|w| w[0] == w[1]);
    if x < 0.04 {
        return vec![Dialect::Batch; dialects.len().max(2)];
    }
    if !single {
        dialects.extend(std::iter::repeat_n(Dialect::Batch, n));
    }
    dialects
}

/// Adds one to three `chat` clients and up to two `anthropic` ones (HTTP
/// only) to a mixed run (a run of one dialect stays so), and makes a few
/// runs all `chat`. Appended last, so every other client keeps its index
/// and its random stream.
fn chat_mix(rng: &mut Rng, mut dialects: Vec<Dialect>) -> Vec<Dialect> {
    let x = rng.next_f64();
    let n = 1 + rng.below(3) as usize;
    let m = rng.below(3) as usize;
    let single = dialects.windows(2).all(|w| w[0] == w[1]);
    if x < 0.04 {
        return vec![Dialect::Chat; dialects.len().max(2)];
    }
    if !single {
        dialects.extend(std::iter::repeat_n(Dialect::Chat, n));
        dialects.extend(std::iter::repeat_n(Dialect::Anthropic, m));
    }
    dialects
}

/// Speculative decoding by prompt lookup in half the swarms: from one draft
/// token to more than most generations hold, for one sequence or many.
fn draft_options(rng: &mut Rng) -> DraftConfig {
    if !chance(rng, 0.5) {
        return DraftConfig::OFF;
    }
    let ngram_min = pick(rng, &[1, 1, 2]);
    DraftConfig {
        max_tokens: pick(rng, &[1, 2, 4, 8, 64]),
        ngram_min,
        ngram_max: ngram_min + pick(rng, &[0, 1, 3]),
        max_seqs: pick(rng, &[1, 2, 8, 64]),
    }
}

/// The keys file of a run and the `cai` limits: a key with small per-minute
/// limits (so that `RATE_LIMITED` happens), one without, one for an
/// organisation of its own; a few runs have no keys file at all.
fn cai_options(rng: &mut Rng, host: &mut HostConfig) -> CaiOptions {
    let orgs: Vec<String> = ["org_a", "org_b", "org c", "org_d", "org_zzz"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let keys = vec![
        CaiKey {
            secret: "sk-sim-limited".into(),
            orgs: vec!["org_a".into(), "org c".into()],
        },
        CaiKey {
            secret: "sk-sim-open".into(),
            orgs: vec!["org_a".into(), "org_b".into()],
        },
        CaiKey {
            secret: "sk-sim-d".into(),
            orgs: vec!["org_d".into()],
        },
    ];
    let limits = [
        (
            Some(pick(rng, &[2u64, 6, 30, 120])),
            pick(rng, &[None, Some(300u64), Some(3_000), Some(30_000)]),
        ),
        (None, None),
        (pick(rng, &[None, Some(1u64), Some(20)]), None),
    ];
    host.cai_max_inflight = pick(rng, &[1, 2, 4, 4, 8]);
    host.conversation_ttl = Duration::from_secs(pick(rng, &[2, 60, 30 * 60]));
    host.max_conversations = pick(rng, &[1, 4, 10_000]);
    let no_keys = chance(rng, 0.05);
    if no_keys {
        host.keys = None;
        return CaiOptions {
            keys: Vec::new(),
            orgs,
        };
    }
    let ring = keys
        .iter()
        .zip(limits)
        .enumerate()
        .map(|(i, (k, (rpm, tpm)))| ApiKey {
            name: format!("sim-{i}"),
            sha256: hash_key(&k.secret),
            orgs: k.orgs.clone(),
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
        })
        .collect();
    host.keys = KeyRing::new(ring).ok();
    CaiOptions { keys, orgs }
}

/// Parses a seed: a decimal `u64`, or a 40-hex-digit commit hash, which is
/// taken as the first 8 bytes (big-endian) of the SHA-256 of its lowercase text.
pub fn parse_seed(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    if t.len() == 40 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(t.to_ascii_lowercase().as_bytes());
        let mut b = [0u8; 8];
        b.copy_from_slice(&digest[..8]);
        return Ok(u64::from_be_bytes(b));
    }
    Err(format!(
        "seed `{t}` is neither a decimal u64 nor a 40-hex-digit commit hash"
    ))
}

/// A uniform index below `n` (0 when `n` is 0).
fn rng_index(rng: &mut Rng, n: usize) -> usize {
    if n == 0 {
        0
    } else {
        rng.below(n as u64) as usize
    }
}

/// `s` as a regular expression that matches exactly it.
fn regex_literal(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_punctuation() || c == ' ' {
                format!("\\x{:02x}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_options_and_seeds_differ() {
        assert_eq!(Swarm::from_seed(9), Swarm::from_seed(9));
        let distinct: std::collections::BTreeSet<String> = (0..20)
            .map(|s| format!("{:?}", Swarm::from_seed(s)))
            .collect();
        assert_eq!(distinct.len(), 20);
    }

    #[test]
    fn most_seeds_mix_all_six_dialects() {
        // Six of the seven the swarm simulates (`anthropic` joins two
        // mixed runs in three).
        let served = [
            Dialect::Generate,
            Dialect::Session,
            Dialect::Responses,
            Dialect::Batch,
            Dialect::Cai,
            Dialect::Chat,
        ];
        let mixed = (0..200)
            .filter(|&s| {
                let d = Swarm::from_seed(s).dialects;
                served.iter().all(|x| d.contains(x))
            })
            .count();
        assert!(mixed >= 140, "{mixed} of 200 seeds mix all six dialects");
        let only_cai = (0..200)
            .filter(|&s| {
                let d = Swarm::from_seed(s).dialects;
                d.iter().all(|x| *x == Dialect::Cai)
            })
            .count();
        assert!(only_cai >= 1, "no seed of 200 is all cai");
        let only_batch = (0..200)
            .filter(|&s| {
                let d = Swarm::from_seed(s).dialects;
                d.iter().all(|x| *x == Dialect::Batch)
            })
            .count();
        assert!(only_batch >= 1, "no seed of 200 is all batch");
        let only_chat = (0..200)
            .filter(|&s| {
                let d = Swarm::from_seed(s).dialects;
                d.iter().all(|x| *x == Dialect::Chat)
            })
            .count();
        assert!(only_chat >= 1, "no seed of 200 is all chat");
        let keyless = (0..200)
            .filter(|&s| Swarm::from_seed(s).host.keys.is_none())
            .count();
        assert!(
            (1..40).contains(&keyless),
            "{keyless} of 200 seeds have no keys file"
        );
        let sw = Swarm::from_seed(3);
        assert_eq!(sw.clients, sw.dialects.len());
    }

    #[test]
    fn seeds_parse_as_numbers_or_commit_hashes() {
        assert_eq!(parse_seed("42"), Ok(42));
        let h = "0123456789abcdef0123456789abcdef01234567";
        let a = parse_seed(h).expect("hash seed");
        assert_eq!(parse_seed(&h.to_uppercase()), Ok(a));
        assert!(parse_seed("xyz").is_err());
        assert!(parse_seed("abc").is_err());
    }
}
