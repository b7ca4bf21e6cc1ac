//! The trace format: every input given to the Host, with its time, as JSON
//! lines, so that `--replay` can feed them back.
//!
//! ```text
//! {"trace":"tokenwire-sim","version":1,"seed":..,"host":{..},"model":{..},"engine":{..},"host_seed":..,"start":"loaded"|"loading","slack_ns":..}
//! {"t":<ns>,"n":<nominal ns>,"in":<input>}          one per input, in order
//! {"t":<ns>,"crash":{"host_seed":..}}               the Host was dropped and rebuilt
//! {"end":{"events":..,"inputs":"<sha256>","outputs":"<sha256>","failure":null|{"invariant":..,"event":..}}}
//! ```
//!
//! Inputs are written as `{"Variant": {fields}}` (`"Timeout"` and
//! `"Shutdown"` as bare strings). A trace holds only what the Host saw:
//! client frames are synthetic text made by the simulator.

use std::sync::Arc;

use serde_json::{json, Value};
use tokenwire_core::config::{CacheScope, EmbedPooling};
use tokenwire_core::dialect::batch::GenerationDefaults;
use tokenwire_core::filter::{ContentFilter, FilterAction, FilterRule};
use tokenwire_core::keys::{parse_sha256, to_hex, ApiKey, KeyRing};
use tokenwire_core::principal::AuthScope;
use tokenwire_core::reasoning::ReasoningTags;
use tokenwire_core::{
    ConnId, Dialect, DraftConfig, Duration, Encoded, EngineFault, EngineFaultKind, HostConfig,
    Input, Instant, JobCheckId, JobGrant, ModelInfo, Pooling, SeqId, SeqResult, StepDone, TextDone,
    TextJobId, TokenLogprobs, Transport,
};

use crate::swarm::EngineOptions;

/// Version of the format.
pub const VERSION: u64 = 1;

/// Everything needed to rebuild the run's Host and engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// The run's seed.
    pub seed: u64,
    /// The Host's settings.
    pub host: HostConfig,
    /// The model (byte tokenizer).
    pub model: ModelInfo,
    /// The engine's options.
    pub engine: EngineOptions,
    /// Seed of the first Host.
    pub host_seed: u64,
    /// The first Host started with its model still loading.
    pub start_loading: bool,
    /// Deadline slack the checkers used.
    pub slack: Duration,
    /// Checkers that were switched off (`--skip`).
    pub skip: Vec<String>,
}

/// The last line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    /// Inputs handled.
    pub events: u64,
    /// SHA-256 of the inputs, hex.
    pub inputs: String,
    /// SHA-256 of the outputs, hex.
    pub outputs: String,
    /// The invariant that failed, and at which event, if one did.
    pub failure: Option<(String, u64)>,
}

/// One line of a trace.
#[derive(Debug, Clone)]
pub enum Line {
    /// The first line.
    Header(Box<Header>),
    /// An input at `t` (meant for `nominal`).
    Input {
        /// The Host's time.
        t: Instant,
        /// The time it was meant for.
        nominal: Instant,
        /// The input.
        input: Input,
    },
    /// The Host crashed at `t` and a new one was built with `host_seed`.
    Crash {
        /// When.
        t: Instant,
        /// The new Host's seed.
        host_seed: u64,
    },
    /// The last line.
    End(End),
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn conn_of(v: &Value) -> Result<ConnId, String> {
    v["conn"]
        .as_u64()
        .map(ConnId)
        .ok_or_else(|| format!("missing conn in {v}"))
}

fn u64_of(v: &Value, field: &str) -> Result<u64, String> {
    v[field]
        .as_u64()
        .ok_or_else(|| format!("missing or bad `{field}` in {v}"))
}

fn str_of<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    v[field]
        .as_str()
        .ok_or_else(|| format!("missing or bad `{field}` in {v}"))
}

fn u32_of(v: &Value, field: &str) -> Result<u32, String> {
    u32::try_from(u64_of(v, field)?).map_err(|_| format!("`{field}` out of range in {v}"))
}

/// Model info as JSON.
pub fn model_json(m: &ModelInfo) -> Value {
    json!({
        "name": m.name, "version": m.version, "context_len": m.context_len,
        "vocab_size": m.vocab_size, "eos_ids": m.eos_ids, "block_size": m.block_size,
        "num_blocks": m.num_blocks, "dtype": m.dtype, "embedding_size": m.embedding_size,
        "pooling": m.pooling.map(|p| p.name()),
    })
}

/// Model info from JSON.
pub fn model_from(v: &Value) -> Result<ModelInfo, String> {
    Ok(ModelInfo {
        name: str_of(v, "name")?.to_string(),
        version: str_of(v, "version")?.to_string(),
        context_len: u32_of(v, "context_len")?,
        vocab_size: u32_of(v, "vocab_size")?,
        eos_ids: v["eos_ids"]
            .as_array()
            .ok_or("missing eos_ids")?
            .iter()
            .map(|e| {
                e.as_u64()
                    .and_then(|e| u32::try_from(e).ok())
                    .ok_or("bad eos id")
            })
            .collect::<Result<_, _>>()?,
        block_size: u32_of(v, "block_size")?,
        num_blocks: u32_of(v, "num_blocks")?,
        dtype: str_of(v, "dtype")?.to_string(),
        // Traces written before embeddings lack it: the tiny model's.
        embedding_size: u32_of(v, "embedding_size")
            .unwrap_or(tokenwire_core::testing::tiny_model_info().embedding_size),
        pooling: match v["pooling"].as_str() {
            Some("mean") => Some(Pooling::Mean),
            Some("last") => Some(Pooling::Last),
            _ => None,
        },
    })
}

fn host_json(h: &HostConfig) -> Value {
    json!({
        "epoch_unix_ms": h.epoch_unix_ms, "max_frame_bytes": h.max_frame_bytes,
        "slow_client_timeout_ns": ns(h.slow_client_timeout), "pause_timeout_ns": ns(h.pause_timeout),
        "idle_timeout_ns": ns(h.idle_timeout), "keepalive_interval_ns": ns(h.keepalive_interval),
        "keepalive_timeout_ns": ns(h.keepalive_timeout), "shutdown_grace_ns": ns(h.shutdown_grace),
        "default_max_tokens": h.default_max_tokens, "max_step_tokens": h.max_step_tokens,
        "max_running_seqs": h.max_running_seqs, "max_queued_requests": h.max_queued_requests,
        "prefix_cache": h.prefix_cache,
        "draft": [h.draft.max_tokens, h.draft.ngram_min, h.draft.ngram_max, h.draft.max_seqs],
        "reasoning_tags": h.reasoning_tags.map(|t| t.open),
        "embed_pooling": h.embed_pooling.name(),
        "max_queued_per_conn": h.max_queued_per_conn,
        "session_max_messages": h.session_max_messages, "max_sessions": h.max_sessions,
        "max_sessions_per_conn": h.max_sessions_per_conn,
        "session_max_context_bytes": h.session_max_context_bytes,
        "max_jobs": h.max_jobs, "max_websocket_connections": h.max_websocket_connections,
        "responses_expiring_after_ns": ns(h.responses_expiring_after),
        "responses_lifetime_ns": ns(h.responses_lifetime),
        "response_store_size": h.response_store_size,
        "batch_defaults": batch_json(&h.batch_defaults),
        "batch_cache_entries": h.batch_cache_entries,
        "batch_max_prompts": h.batch_max_prompts, "batch_max_payloads": h.batch_max_payloads,
        "batch_cache_scope": match h.batch_cache_scope { CacheScope::Principal => "principal", CacheScope::Host => "host" },
        "keys": h.keys.as_ref().map(keys_json),
        "content_filter": h.content_filter.as_ref().map(|f| f.rules().iter().map(|r| json!({
            "name": r.name, "pattern": r.pattern, "action": r.action.as_str(),
        })).collect::<Vec<_>>()),
        "auth": match h.auth { AuthScope::Cai => "cai", AuthScope::All => "all" },
        "cai_max_inflight": h.cai_max_inflight,
        "conversation_ttl_ns": ns(h.conversation_ttl),
        "max_conversations": h.max_conversations,
        "max_conversations_per_org": h.max_conversations_per_org,
        "conversation_max_bytes": h.conversation_max_bytes,
        "conversation_max_messages": h.conversation_max_messages,
    })
}

fn batch_json(d: &GenerationDefaults) -> Value {
    json!({"num_beams": d.num_beams, "do_sample": d.do_sample, "temperature": d.temperature,
           "top_p": d.top_p, "top_k": d.top_k, "max_new_tokens": d.max_new_tokens,
           "repetition_penalty": d.repetition_penalty, "length_penalty": d.length_penalty})
}

fn batch_from(v: &Value) -> Result<GenerationDefaults, String> {
    let f = |k: &str| v[k].as_f64().map(|x| x as f32).ok_or(format!("bad {k}"));
    Ok(GenerationDefaults {
        num_beams: u32_of(v, "num_beams")?,
        do_sample: v["do_sample"].as_bool().ok_or("bad do_sample")?,
        temperature: f("temperature")?,
        top_p: f("top_p")?,
        top_k: u32_of(v, "top_k")?,
        max_new_tokens: u32_of(v, "max_new_tokens")?,
        repetition_penalty: f("repetition_penalty")?,
        length_penalty: f("length_penalty")?,
    })
}

/// The content filter's rules from a trace (`null`: none).
fn filter_from(v: &Value) -> Result<Option<Arc<ContentFilter>>, String> {
    let Some(rules) = v.as_array() else {
        return Ok(None);
    };
    let rules = rules
        .iter()
        .map(|r| {
            let action = match str_of(r, "action")? {
                "refuse" => FilterAction::Refuse,
                "stop" => FilterAction::Stop,
                other => return Err(format!("bad filter action {other}")),
            };
            Ok(FilterRule {
                name: str_of(r, "name")?.to_string(),
                pattern: str_of(r, "pattern")?.to_string(),
                action,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    ContentFilter::new(rules).map(|f| Some(Arc::new(f)))
}

fn keys_json(ring: &KeyRing) -> Value {
    (0..ring.len())
        .filter_map(|i| ring.key(i))
        .map(|k| {
            json!({"name": k.name, "sha256": to_hex(&k.sha256), "orgs": k.orgs,
                   "requests_per_minute": k.requests_per_minute,
                   "tokens_per_minute": k.tokens_per_minute})
        })
        .collect()
}

fn keys_from(v: &Value) -> Result<Option<KeyRing>, String> {
    let Some(items) = v.as_array() else {
        return Ok(None);
    };
    let keys = items
        .iter()
        .map(|k| {
            Ok(ApiKey {
                name: str_of(k, "name")?.to_string(),
                sha256: parse_sha256(str_of(k, "sha256")?)?,
                orgs: k["orgs"]
                    .as_array()
                    .ok_or("missing orgs")?
                    .iter()
                    .map(|o| o.as_str().map(str::to_string).ok_or("bad org"))
                    .collect::<Result<_, _>>()?,
                requests_per_minute: k["requests_per_minute"].as_u64(),
                tokens_per_minute: k["tokens_per_minute"].as_u64(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    KeyRing::new(keys).map(Some)
}

fn host_from(v: &Value) -> Result<HostConfig, String> {
    let d = |f: &str| u64_of(v, f).map(Duration::from_nanos);
    Ok(HostConfig {
        content_filter: filter_from(&v["content_filter"])?,
        // The simulator sets no anonymous limits.
        anon_limits: Default::default(),
        require_signatures: false,
        epoch_unix_ms: u64_of(v, "epoch_unix_ms")?,
        max_frame_bytes: usize::try_from(u64_of(v, "max_frame_bytes")?)
            .map_err(|e| e.to_string())?,
        slow_client_timeout: d("slow_client_timeout_ns")?,
        pause_timeout: d("pause_timeout_ns")?,
        idle_timeout: d("idle_timeout_ns")?,
        keepalive_interval: d("keepalive_interval_ns")?,
        keepalive_timeout: d("keepalive_timeout_ns")?,
        shutdown_grace: d("shutdown_grace_ns")?,
        default_max_tokens: u32_of(v, "default_max_tokens")?,
        max_step_tokens: u32_of(v, "max_step_tokens")?,
        max_running_seqs: u32_of(v, "max_running_seqs")?,
        prefix_cache: v["prefix_cache"].as_bool().unwrap_or(true),
        draft: match v["draft"].as_array().map(Vec::as_slice) {
            None => DraftConfig::OFF,
            Some([a, b, c, d]) => {
                let n = |x: &Value| {
                    x.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(|| format!("`draft` holds {x}, not a count"))
                };
                DraftConfig {
                    max_tokens: n(a)?,
                    ngram_min: n(b)?,
                    ngram_max: n(c)?,
                    max_seqs: n(d)?,
                }
            }
            Some(_) => return Err("`draft` is not four counts".into()),
        },
        reasoning_tags: match v["reasoning_tags"].as_str() {
            None => None,
            Some(open) => Some(
                [ReasoningTags::THINK, ReasoningTags::MISTRAL]
                    .into_iter()
                    .find(|t| t.open == open)
                    .ok_or_else(|| format!("unknown reasoning tags {open}"))?,
            ),
        },
        // Traces written before embeddings lack it: the default.
        embed_pooling: match v.get("embed_pooling") {
            None => HostConfig::default().embed_pooling,
            Some(p) => p
                .as_str()
                .and_then(EmbedPooling::from_name)
                .ok_or_else(|| format!("unknown pooling {p}"))?,
        },
        max_queued_requests: u32_of(v, "max_queued_requests")?,
        max_queued_per_conn: u32_of(v, "max_queued_per_conn")?,
        session_max_messages: usize_of(v, "session_max_messages")?,
        max_sessions: usize_of(v, "max_sessions")?,
        max_sessions_per_conn: usize_of(v, "max_sessions_per_conn")?,
        session_max_context_bytes: usize_of(v, "session_max_context_bytes")?,
        max_jobs: usize_of(v, "max_jobs")?,
        max_websocket_connections: u32_of(v, "max_websocket_connections")?,
        responses_expiring_after: d("responses_expiring_after_ns")?,
        responses_lifetime: d("responses_lifetime_ns")?,
        response_store_size: usize_of(v, "response_store_size")?,
        batch_defaults: batch_from(&v["batch_defaults"])?,
        batch_cache_entries: usize_of(v, "batch_cache_entries")?,
        batch_max_prompts: usize_of(v, "batch_max_prompts")?,
        batch_max_payloads: usize_of(v, "batch_max_payloads")?,
        batch_cache_scope: match str_of(v, "batch_cache_scope")? {
            "host" => CacheScope::Host,
            _ => CacheScope::Principal,
        },
        keys: keys_from(&v["keys"])?,
        auth: match str_of(v, "auth")? {
            "all" => AuthScope::All,
            _ => AuthScope::Cai,
        },
        cai_max_inflight: u32_of(v, "cai_max_inflight")?,
        conversation_ttl: d("conversation_ttl_ns")?,
        max_conversations: usize_of(v, "max_conversations")?,
        max_conversations_per_org: usize_of(v, "max_conversations_per_org")?,
        conversation_max_bytes: usize_of(v, "conversation_max_bytes")?,
        conversation_max_messages: usize_of(v, "conversation_max_messages")?,
    })
}

fn usize_of(v: &Value, field: &str) -> Result<usize, String> {
    usize::try_from(u64_of(v, field)?).map_err(|e| e.to_string())
}

fn engine_json(e: &EngineOptions) -> Value {
    json!({
        "symbols": e.symbols, "eos_permille": e.eos_permille, "step_base_ns": ns(e.step_base),
        "per_token_ns": ns(e.per_token), "jitter_ns": ns(e.jitter),
    })
}

fn engine_from(v: &Value) -> Result<EngineOptions, String> {
    Ok(EngineOptions {
        symbols: v["symbols"]
            .as_array()
            .ok_or("missing symbols")?
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or("bad symbol"))
            .collect::<Result<_, _>>()?,
        eos_permille: u32_of(v, "eos_permille")?,
        step_base: Duration::from_nanos(u64_of(v, "step_base_ns")?),
        per_token: Duration::from_nanos(u64_of(v, "per_token_ns")?),
        jitter: Duration::from_nanos(u64_of(v, "jitter_ns")?),
    })
}

/// An input as JSON.
pub fn input_json(input: &Input) -> Value {
    match input {
        Input::Open {
            conn,
            dialect,
            transport,
            query,
            authorization,
            peer,
        } => json!({"Open": {
            "conn": conn.0, "dialect": dialect.name(),
            "transport": match transport { Transport::WebSocket => "ws", Transport::Http => "http" },
            "query": query, "authorization": authorization, "peer": peer,
        }}),
        Input::Text { conn, text } => json!({"Text": {"conn": conn.0, "text": text}}),
        Input::Binary { conn, len } => json!({"Binary": {"conn": conn.0, "len": len}}),
        Input::FrameTooLarge { conn } => json!({"FrameTooLarge": {"conn": conn.0}}),
        Input::Pong { conn } => json!({"Pong": {"conn": conn.0}}),
        Input::Closed { conn } => json!({"Closed": {"conn": conn.0}}),
        Input::QueueFull { conn } => json!({"QueueFull": {"conn": conn.0}}),
        Input::QueueDrained { conn } => json!({"QueueDrained": {"conn": conn.0}}),
        Input::Timeout => json!("Timeout"),
        Input::Tokenized(d) => match &d.result {
            Ok(e) => json!({"Tokenized": {"job": d.id.0, "ids": e.ids, "dropped": e.dropped}}),
            Err(m) => json!({"Tokenized": {"job": d.id.0, "error": m}}),
        },
        Input::JobVerified { check, verdict } => match verdict {
            Ok(g) => json!({"JobVerified": {"check": check.0, "token_budget": g.token_budget}}),
            Err(m) => json!({"JobVerified": {"check": check.0, "refused": m}}),
        },
        Input::StepDone(d) => json!({"StepDone": {
            "step_id": d.step_id,
            "results": d.results.iter().map(|r| json!({
                "seq": r.seq.0, "token": r.token,
                "logprobs": r.logprobs.as_ref().map(logprobs_json),
                "embedding": r.embedding,
                "prompt_logprobs": r.prompt_logprobs.as_ref()
                    .map(|p| p.iter().map(logprobs_json).collect::<Vec<_>>()),
            })).collect::<Vec<_>>(),
        }}),
        Input::EngineFault(f) => json!({"EngineFault": {
            "step_id": f.step_id,
            "kind": match &f.kind {
                EngineFaultKind::OutOfMemory => json!("oom"),
                EngineFaultKind::DeviceLost => json!("device_lost"),
                EngineFaultKind::Internal(m) => json!({"internal": m}),
            },
        }}),
        Input::KvCapacity { num_blocks } => json!({"KvCapacity": {"num_blocks": num_blocks}}),
        Input::ModelLoading {
            progress,
            message,
            eta,
        } => json!({"ModelLoading": {
            "progress": progress, "message": message, "eta_ns": eta.map(ns),
        }}),
        Input::ModelLoaded { info, .. } => json!({"ModelLoaded": {"model": model_json(info)}}),
        Input::Shutdown => json!("Shutdown"),
    }
}

fn f32_of(v: &Value) -> Result<f32, String> {
    v.as_f64()
        .map(|f| f as f32)
        .ok_or_else(|| format!("not a number: {v}"))
}

/// A token's logprobs as a trace writes them.
fn logprobs_json(l: &TokenLogprobs) -> Value {
    json!({
        "logprob": l.logprob,
        "top": l.top.iter().map(|(t, p)| json!([t, p])).collect::<Vec<_>>(),
    })
}

/// A token's logprobs from a trace ([`logprobs_json`]).
fn logprobs_from(l: &Value) -> Result<TokenLogprobs, String> {
    Ok(TokenLogprobs {
        logprob: f32_of(&l["logprob"])?,
        top: l["top"]
            .as_array()
            .ok_or("missing top")?
            .iter()
            .map(|p| -> Result<(u32, f32), String> {
                let id = p[0]
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or("bad token id")?;
                Ok((id, f32_of(&p[1])?))
            })
            .collect::<Result<_, _>>()?,
    })
}

/// An input from JSON (the codec of `ModelLoaded` is the byte tokenizer).
pub fn input_from(v: &Value) -> Result<Input, String> {
    match v.as_str() {
        Some("Timeout") => return Ok(Input::Timeout),
        Some("Shutdown") => return Ok(Input::Shutdown),
        Some(other) => return Err(format!("unknown input {other}")),
        None => {}
    }
    let obj = v.as_object().ok_or_else(|| format!("bad input {v}"))?;
    let (name, b) = obj.iter().next().ok_or("empty input")?;
    Ok(match name.as_str() {
        "Open" => Input::Open {
            conn: conn_of(b)?,
            dialect: Dialect::ALL
                .into_iter()
                .find(|d| Some(d.name()) == b["dialect"].as_str())
                .ok_or("bad dialect")?,
            transport: match str_of(b, "transport")? {
                "http" => Transport::Http,
                _ => Transport::WebSocket,
            },
            query: str_of(b, "query")?.to_string(),
            authorization: b["authorization"].as_str().map(str::to_string),
            peer: str_of(b, "peer")?.to_string(),
        },
        "Text" => Input::Text {
            conn: conn_of(b)?,
            text: str_of(b, "text")?.to_string(),
        },
        "Binary" => Input::Binary {
            conn: conn_of(b)?,
            len: usize::try_from(u64_of(b, "len")?).map_err(|e| e.to_string())?,
        },
        "FrameTooLarge" => Input::FrameTooLarge { conn: conn_of(b)? },
        "Pong" => Input::Pong { conn: conn_of(b)? },
        "Closed" => Input::Closed { conn: conn_of(b)? },
        "QueueFull" => Input::QueueFull { conn: conn_of(b)? },
        "QueueDrained" => Input::QueueDrained { conn: conn_of(b)? },
        "Tokenized" => Input::Tokenized(TextDone {
            id: TextJobId(u64_of(b, "job")?),
            result: match b["error"].as_str() {
                Some(m) => Err(m.to_string()),
                None => Ok(Encoded {
                    ids: b["ids"]
                        .as_array()
                        .ok_or("missing ids")?
                        .iter()
                        .map(|t| {
                            t.as_u64()
                                .and_then(|t| u32::try_from(t).ok())
                                .ok_or("bad token id")
                        })
                        .collect::<Result<_, _>>()?,
                    dropped: b["dropped"]
                        .as_u64()
                        .and_then(|d| u32::try_from(d).ok())
                        .unwrap_or(0),
                }),
            },
        }),
        "JobVerified" => Input::JobVerified {
            check: JobCheckId(u64_of(b, "check")?),
            verdict: match b["refused"].as_str() {
                Some(m) => Err(m.to_string()),
                None => Ok(JobGrant {
                    token_budget: b["token_budget"].as_u64(),
                }),
            },
        },
        "StepDone" => Input::StepDone(StepDone {
            step_id: u64_of(b, "step_id")?,
            results: b["results"]
                .as_array()
                .ok_or("missing results")?
                .iter()
                .map(|r| -> Result<SeqResult, String> {
                    Ok(SeqResult {
                        seq: SeqId(u64_of(r, "seq")?),
                        token: u32_of(r, "token")?,
                        logprobs: match &r["logprobs"] {
                            Value::Null => None,
                            l => Some(logprobs_from(l)?),
                        },
                        // Traces written before embeddings and prompt
                        // scores lack them: none.
                        embedding: match &r["embedding"] {
                            Value::Null => None,
                            v => Some(
                                v.as_array()
                                    .ok_or("bad embedding")?
                                    .iter()
                                    .map(f32_of)
                                    .collect::<Result<_, _>>()?,
                            ),
                        },
                        prompt_logprobs: match &r["prompt_logprobs"] {
                            Value::Null => None,
                            v => Some(
                                v.as_array()
                                    .ok_or("bad prompt_logprobs")?
                                    .iter()
                                    .map(logprobs_from)
                                    .collect::<Result<_, _>>()?,
                            ),
                        },
                    })
                })
                .collect::<Result<_, _>>()?,
        }),
        "EngineFault" => Input::EngineFault(EngineFault {
            step_id: u64_of(b, "step_id")?,
            kind: match &b["kind"] {
                Value::String(s) if s == "oom" => EngineFaultKind::OutOfMemory,
                Value::String(s) if s == "device_lost" => EngineFaultKind::DeviceLost,
                k => EngineFaultKind::Internal(
                    k["internal"].as_str().ok_or("bad fault kind")?.to_string(),
                ),
            },
        }),
        "KvCapacity" => Input::KvCapacity {
            num_blocks: u32_of(b, "num_blocks")?,
        },
        "ModelLoading" => Input::ModelLoading {
            progress: f32_of(&b["progress"])?,
            message: str_of(b, "message")?.to_string(),
            eta: b["eta_ns"].as_u64().map(Duration::from_nanos),
        },
        "ModelLoaded" => Input::ModelLoaded {
            info: model_from(&b["model"])?,
            codec: tokenwire_core::testing::ByteCodec::shared(),
        },
        other => return Err(format!("unknown input {other}")),
    })
}

impl Line {
    /// The line as JSON text (no newline).
    pub fn to_json(&self) -> String {
        match self {
            Line::Header(h) => json!({
                "trace": "tokenwire-sim", "version": VERSION, "seed": h.seed,
                "host": host_json(&h.host), "model": model_json(&h.model),
                "engine": engine_json(&h.engine), "host_seed": h.host_seed,
                "start": if h.start_loading { "loading" } else { "loaded" },
                "slack_ns": ns(h.slack), "skip": h.skip,
            }),
            Line::Input { t, nominal, input } => {
                json!({"t": t.as_nanos(), "n": nominal.as_nanos(), "in": input_json(input)})
            }
            Line::Crash { t, host_seed } => {
                json!({"t": t.as_nanos(), "crash": {"host_seed": host_seed}})
            }
            Line::End(e) => json!({"end": {
                "events": e.events, "inputs": e.inputs, "outputs": e.outputs,
                "failure": e.failure.as_ref().map(|(i, n)| json!({"invariant": i, "event": n})),
            }}),
        }
        .to_string()
    }

    /// Parses one line.
    pub fn parse(text: &str) -> Result<Line, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("bad trace line: {e}"))?;
        if v.get("trace").is_some() {
            if u64_of(&v, "version")? != VERSION {
                return Err(format!("trace version {} is not {VERSION}", v["version"]));
            }
            return Ok(Line::Header(Box::new(Header {
                seed: u64_of(&v, "seed")?,
                host: host_from(&v["host"])?,
                model: model_from(&v["model"])?,
                engine: engine_from(&v["engine"])?,
                host_seed: u64_of(&v, "host_seed")?,
                start_loading: v["start"] == "loading",
                slack: Duration::from_nanos(u64_of(&v, "slack_ns")?),
                skip: v["skip"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            })));
        }
        if let Some(e) = v.get("end") {
            return Ok(Line::End(End {
                events: u64_of(e, "events")?,
                inputs: str_of(e, "inputs")?.to_string(),
                outputs: str_of(e, "outputs")?.to_string(),
                failure: match &e["failure"] {
                    Value::Null => None,
                    f => Some((str_of(f, "invariant")?.to_string(), u64_of(f, "event")?)),
                },
            }));
        }
        let t = Instant::from_nanos(u64_of(&v, "t")?);
        if let Some(c) = v.get("crash") {
            return Ok(Line::Crash {
                t,
                host_seed: u64_of(c, "host_seed")?,
            });
        }
        Ok(Line::Input {
            t,
            nominal: v["n"].as_u64().map_or(t, Instant::from_nanos),
            input: input_from(&v["in"])?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swarm::Swarm;

    #[test]
    fn every_input_round_trips() {
        let inputs = vec![
            Input::Open {
                conn: ConnId(3),
                dialect: Dialect::Generate,
                transport: Transport::Http,
                query: "a=b".into(),
                authorization: Some("Bearer k".into()),
                peer: "p".into(),
            },
            Input::Text {
                conn: ConnId(3),
                text: "{\"x\":\"\\u0000é\"}".into(),
            },
            Input::Binary {
                conn: ConnId(3),
                len: 9,
            },
            Input::FrameTooLarge { conn: ConnId(1) },
            Input::Pong { conn: ConnId(1) },
            Input::Closed { conn: ConnId(1) },
            Input::QueueFull { conn: ConnId(1) },
            Input::QueueDrained { conn: ConnId(1) },
            Input::Timeout,
            Input::StepDone(StepDone {
                step_id: 4,
                results: vec![
                    SeqResult {
                        seq: SeqId(2),
                        token: 77,
                        logprobs: Some(TokenLogprobs {
                            logprob: -0.1,
                            top: vec![(5, -1.3), (6, -2.7)],
                        }),
                        embedding: None,
                        prompt_logprobs: Some(vec![TokenLogprobs {
                            logprob: -2.5,
                            top: vec![(9, -0.5)],
                        }]),
                    },
                    SeqResult {
                        seq: SeqId(3),
                        token: 0,
                        logprobs: None,
                        embedding: Some(vec![0.25, -1.5]),
                        prompt_logprobs: None,
                    },
                ],
            }),
            Input::EngineFault(EngineFault {
                step_id: 5,
                kind: EngineFaultKind::Internal("x".into()),
            }),
            Input::EngineFault(EngineFault {
                step_id: 6,
                kind: EngineFaultKind::DeviceLost,
            }),
            Input::Tokenized(TextDone {
                id: TextJobId(8),
                result: Ok(Encoded {
                    ids: vec![1, 70, 71],
                    dropped: 2,
                }),
            }),
            Input::JobVerified {
                check: JobCheckId(3),
                verdict: Ok(JobGrant {
                    token_budget: Some(50),
                }),
            },
            Input::JobVerified {
                check: JobCheckId(4),
                verdict: Err("unpaid".into()),
            },
            Input::Tokenized(TextDone {
                id: TextJobId(10),
                result: Ok(Encoded {
                    ids: vec![1],
                    dropped: 0,
                }),
            }),
            Input::Tokenized(TextDone {
                id: TextJobId(9),
                result: Err("tokenizer: bad".into()),
            }),
            Input::KvCapacity { num_blocks: 3 },
            Input::ModelLoading {
                progress: 33.3,
                message: "w".into(),
                eta: Some(Duration::from_millis(5)),
            },
            Input::Shutdown,
        ];
        for i in inputs {
            let line = Line::Input {
                t: Instant::from_nanos(7),
                nominal: Instant::from_nanos(5),
                input: i.clone(),
            };
            let back = Line::parse(&line.to_json()).expect("parses");
            let Line::Input { input, t, nominal } = back else {
                panic!("not an input line")
            };
            assert_eq!(
                (t, nominal),
                (Instant::from_nanos(7), Instant::from_nanos(5))
            );
            assert_eq!(format!("{input:?}"), format!("{i:?}"));
        }
        let sw = Swarm::from_seed(3);
        let h = Header {
            seed: 3,
            host: sw.host.clone(),
            model: sw.model.clone(),
            engine: sw.engine.clone(),
            host_seed: 9,
            start_loading: true,
            slack: Duration::from_millis(3),
            skip: vec!["pause".into()],
        };
        match Line::parse(&Line::Header(Box::new(h.clone())).to_json()) {
            Ok(Line::Header(back)) => assert_eq!(*back, h),
            other => panic!("{other:?}"),
        }
    }
}
