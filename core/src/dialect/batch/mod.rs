//! The `batch` dialect (seed 003) at `/ws`: a queue of payloads, each a
//! batch of raw prompts generated together, answered with event arrays
//! (ACCEPTED, STARTED, INITIALIZED, PROGRESS, COMPLETE, ERROR), one element
//! per prompt the event concerns, in payload order.
//!
//! A connection may queue several payloads. They start in arrival order: the
//! next one's prompts are started once every prompt of the one before has
//! been admitted, all of a payload's prompts in one instant, so the scheduler
//! takes them into the same step as capacity allows. Events of one engine
//! step are gathered and sent when the step ends ([`DialectConn::on_step_end`]):
//! one PROGRESS frame per step with an element for each prompt that produced a
//! token in it (a step that gave prompts several tokens, by speculative
//! decoding, sends as many frames, one token per element).
//!
//! `generation_config` falls back to the server's [`GenerationDefaults`];
//! `do_sample: false` is greedy; `repetition_penalty` is the Hugging Face
//! (CTRL) penalty the engine applies. A finished batch is kept in the host's
//! continue-generation cache ([`cache`]) under its ordered request ids; a
//! later payload with the same ids continues every sequence instead of
//! reading its prompts.

mod beams;
pub mod cache;
pub mod codec;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{Map, Value};

use self::beams::beam_limits;
use self::cache::{CacheScope, CachedSeq, ContinueCache, Owner};
use self::codec::{Event, EventKind, Payload};
use super::{openai, Cx, DialectConn};
use crate::constraint::Constraint;
use crate::engine::{SeqId, TokenId};
use crate::gen::beam::{BeamConfig, BeamSearch, EarlyStopping};
use crate::gen::{Failure, FinishReason, GenRequest, KeptKv, RequestPart, StartError, TokenPiece};
use crate::json::Fields;
use crate::params::{self, GenParams, ParamNames};
use crate::principal::Principal;
use crate::text::{Encoded, TextJobId};
use crate::time::Instant;

/// Most log-probability alternatives a beam can ask the engine for per
/// step: beam search needs `max(2, 1 + EOS ids) * num_beams` of them.
pub const MAX_BEAM_CANDIDATES: usize = 20;

/// The source's error for beams with streaming.
pub const BEAMS_WITH_STREAMER: &str =
    "`streamer` cannot be used with beam search (yet!). Make sure that `num_beams` is set to 1.";

/// `generation_config` values used when a payload leaves them out (the
/// source's ".env"; the server's configuration sets them).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationDefaults {
    /// Beams (1: no beam search).
    pub num_beams: u32,
    /// Sample (true) or take the most likely token (false).
    pub do_sample: bool,
    /// Sampling temperature.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k filter (0: off).
    pub top_k: u32,
    /// New tokens per prompt.
    pub max_new_tokens: u32,
    /// Hugging Face repetition penalty (1: off).
    pub repetition_penalty: f32,
    /// Beam search length penalty exponent.
    pub length_penalty: f32,
}

impl Default for GenerationDefaults {
    /// Hugging Face `GenerationConfig`'s own defaults, and 256 new tokens.
    fn default() -> Self {
        GenerationDefaults {
            num_beams: 1,
            do_sample: false,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 50,
            max_new_tokens: 256,
            repetition_penalty: 1.0,
            length_penalty: 1.0,
        }
    }
}

/// The names of `generation_config`'s sampling fields.
const CONFIG_NAMES: ParamNames = ParamNames {
    max_tokens: "max_new_tokens",
    temperature: "temperature",
    top_p: "top_p",
    top_k: "top_k",
    repetition_penalty: "repetition_penalty",
    stop: "stop",
    seed: "seed",
    top_logprobs: "top_logprobs",
};

/// Where one prompt of a running payload is.
#[derive(Debug, Clone, PartialEq)]
enum Stage {
    /// Waiting for its turn to be tokenized or started.
    Waiting,
    /// Its generation runs.
    Running(SeqId),
    /// It completed or failed.
    Done,
}

/// One prompt of a payload.
#[derive(Debug)]
struct Prompt {
    request_id: String,
    /// The prompt as the client sent it (a fresh batch).
    prompt: String,
    /// The token ids to start from, once known.
    ids: Option<Vec<TokenId>>,
    /// A continuation's kept KV blocks (for exactly `ids`), handed to its
    /// generation.
    kv: Option<KeptKv>,
    /// The text before this run's (the prompt, or for a continuation the
    /// original prompt and everything generated since).
    before: String,
    stage: Stage,
    started_at: Option<Instant>,
    /// Set when the payload's duplicate of an earlier prompt (answered with
    /// ERROR and never run).
    duplicate: bool,
    /// Its beam search, when the payload asked for beams.
    beam: Option<BeamRun>,
}

/// One prompt's beam search in flight: its search machine and the
/// generations that are its running beams (raw generations sharing KV blocks).
#[derive(Debug)]
struct BeamRun {
    search: BeamSearch,
    /// The running beams' generations, in the search's beam order (one, the
    /// prompt's, before the first step).
    beams: Vec<SeqId>,
    /// Candidates reported this round, by generation.
    reported: std::collections::BTreeMap<SeqId, Vec<(TokenId, f32)>>,
    prompt_ids: Vec<TokenId>,
}

/// A payload accepted on this connection.
#[derive(Debug)]
struct Job {
    /// Its number on this connection (jobs leave from the front, so an
    /// index into `jobs` does not name a job for long).
    serial: u64,
    prompts: Vec<Prompt>,
    only_new_tokens: bool,
    stream: bool,
    params: GenParams,
    /// The continue-generation key (ordered request ids), when cacheable.
    key: Option<Vec<String>>,
    /// Whether all of its prompts' generations were started.
    launched: bool,
    /// Cached sequences of completed prompts, by index, for the cache.
    finished: Vec<Option<CachedSeq>>,
    failed: bool,
    /// Beam search settings, when `num_beams` > 1.
    beams: Option<BeamConfig>,
    /// Its events of the current step, sent at the step's end.
    events: StepEvents,
    /// `generation_config.response_format`'s compiled grammar (an
    /// extension), copied into each prompt's generation.
    constraint: Option<Constraint>,
}

/// Events gathered during one engine step, per kind, for one job.
#[derive(Debug, Default)]
struct StepEvents {
    started: Vec<usize>,
    initialized: Vec<usize>,
    progress: Vec<(usize, String)>,
    complete: Vec<(usize, EventKind)>,
}

/// One `/ws` connection.
#[derive(Debug, Default)]
pub struct BatchConn {
    /// Accepted payloads, oldest first; finished ones leave from the front.
    jobs: VecDeque<Job>,
    /// The prompt being tokenized: (its text job, its job's serial, the
    /// prompt's index).
    tokenizing: Option<(TextJobId, u64, usize)>,
    /// The next job's serial.
    next_serial: u64,
    /// The job (by serial) and prompt each generation belongs to, so a
    /// token finds its prompt in one lookup however many are in flight.
    owners: BTreeMap<SeqId, (u64, usize)>,
}

/// A prompt's end, as its COMPLETE reports it and a continuation starts
/// from.
struct Finished {
    /// Prompt and generated ids.
    ids: Vec<TokenId>,
    /// The generated text.
    generated: String,
    /// Tokens generated.
    new_tokens: u32,
    /// It ended with an end-of-sequence token.
    is_eos: bool,
    /// When it started, if the prompt never recorded a start.
    started: Instant,
    /// Its KV blocks, kept for a continuation.
    kv: Option<KeptKv>,
}

/// Whose continue-cache entries this connection reads and writes.
fn cache_owner(cx: &Cx<'_>) -> Owner {
    match cx.config().batch_cache_scope {
        CacheScope::Principal => Some(cx.principal.clone()),
        CacheScope::Host => None,
    }
}

fn event(rid: &str, kind: EventKind) -> Event {
    Event {
        request_id: Some(rid.to_string()),
        kind,
    }
}

fn send(cx: &mut Cx<'_>, events: &[Event]) {
    if events.is_empty() {
        return;
    }
    for e in events {
        if matches!(e.kind, EventKind::Error { .. }) {
            cx.count_error("ERROR");
        }
    }
    cx.send_text(codec::encode_events(events));
}

/// The effective parameters of a payload, or what is wrong with them.
fn config_params(
    cfg: &Map<String, Value>,
    defaults: &GenerationDefaults,
    context_len: u32,
) -> Result<(GenParams, u32, f32, EarlyStopping), String> {
    let f = Fields::new(cfg, "generation_config.");
    let num_beams = match f.u64("num_beams").map_err(|e| e.to_string())? {
        None => defaults.num_beams,
        Some(n @ 1..=64) => n as u32,
        Some(n) => {
            return Err(format!(
                "invalid `generation_config.num_beams`: must be from 1 to 64, got {n}"
            ))
        }
    };
    let do_sample = f
        .bool("do_sample")
        .map_err(|e| e.to_string())?
        .unwrap_or(defaults.do_sample);
    let length_penalty = match f.f64("length_penalty").map_err(|e| e.to_string())? {
        None => defaults.length_penalty,
        Some(v) if v.is_finite() && (v as f32).is_finite() => v as f32,
        Some(v) => {
            return Err(format!(
                "invalid `generation_config.length_penalty`: must be a finite number, got {v}"
            ))
        }
    };
    let early_stopping = match cfg.get("early_stopping") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => EarlyStopping::No,
        Some(Value::Bool(true)) => EarlyStopping::Yes,
        Some(Value::String(s)) if s == "never" => EarlyStopping::Never,
        Some(other) => {
            return Err(format!(
                "invalid `generation_config.early_stopping`: must be true, false or \"never\", got {other}"
            ))
        }
    };
    let base = GenParams {
        max_tokens: defaults.max_new_tokens.min(context_len),
        temperature: defaults.temperature,
        top_p: defaults.top_p,
        top_k: defaults.top_k,
        repetition_penalty: defaults.repetition_penalty,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        stop: Vec::new(),
        seed: None,
        top_logprobs: 0,
        logit_bias: Default::default(),
        min_p: 0.0,
        min_tokens: 0,
        ignore_eos: false,
        stop_token_ids: Vec::new(),
        include_stop_str: false,
    };
    // Only the source's fields: a stop list or a seed is not part of it.
    let known: Map<String, Value> = cfg
        .iter()
        .filter(|(k, _)| {
            matches!(
                k.as_str(),
                "max_new_tokens" | "temperature" | "top_p" | "top_k" | "repetition_penalty"
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut p = params::apply(
        &known,
        "generation_config.",
        &CONFIG_NAMES,
        &base,
        context_len,
    )
    .map_err(|e| e.to_string())?;
    if !do_sample {
        // Greedy: the most likely token, whatever the sampling fields say
        // (as `generate` ignores them without `do_sample`).
        p.temperature = 0.0;
    }
    Ok((p, num_beams, length_penalty, early_stopping))
}

impl BatchConn {
    fn on_payload(&mut self, cx: &mut Cx<'_>, payload: Payload) {
        let ids: Vec<String> = payload
            .prompts
            .iter()
            .map(|p| p.request_id.clone())
            .collect();
        let fail_all = |cx: &mut Cx<'_>, message: String| {
            let events: Vec<Event> = ids
                .iter()
                .map(|id| {
                    event(
                        id,
                        EventKind::Error {
                            error: message.clone(),
                        },
                    )
                })
                .collect();
            send(cx, &events);
        };
        let most = cx.config().batch_max_payloads;
        if self.jobs.len() >= most {
            return fail_all(
                cx,
                format!(
                    "this connection already has {most} payloads queued or running, the most one connection may; send more once one completes"
                ),
            );
        }
        let context_len = cx.model().context_len;
        let defaults = cx.config().batch_defaults.clone();
        let (params, num_beams, length_penalty, early_stopping) =
            match config_params(&payload.generation_config, &defaults, context_len) {
                Ok(p) => p,
                Err(e) => return fail_all(cx, e),
            };
        if num_beams > 1 && payload.stream_response {
            return fail_all(cx, BEAMS_WITH_STREAMER.to_string());
        }
        let constraint = match openai::compile_response_format(
            cx.codec(),
            &payload.generation_config,
            "generation_config.",
        ) {
            Ok(c) => c,
            Err(e) => return fail_all(cx, e),
        };
        if constraint.is_some() && num_beams > 1 {
            return fail_all(
                cx,
                "`generation_config.response_format` cannot be combined with beam search (`num_beams` > 1); use one or the other".to_string(),
            );
        }
        let beams = if num_beams > 1 {
            let cfg = BeamConfig {
                num_beams: num_beams as usize,
                length_penalty,
                early_stopping,
                max_new_tokens: params.max_tokens as usize,
                eos_ids: cx.model().eos_ids.clone(),
            };
            if let Err(e) = beam_limits(&cfg, &params) {
                return fail_all(cx, e);
            }
            Some(cfg)
        } else {
            None
        };
        // An id named twice is ambiguous (as a cache key, and for its
        // events): every prompt under it is refused, the others run.
        let mut uses: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &payload.prompts {
            *uses.entry(p.request_id.as_str()).or_default() += 1;
        }
        let mut prompts = Vec::with_capacity(payload.prompts.len());
        for p in &payload.prompts {
            let duplicate = uses.get(p.request_id.as_str()).is_some_and(|&n| n > 1);
            prompts.push(Prompt {
                request_id: p.request_id.clone(),
                prompt: p.prompt.clone(),
                ids: None,
                kv: None,
                before: p.prompt.clone(),
                stage: if duplicate {
                    Stage::Done
                } else {
                    Stage::Waiting
                },
                started_at: None,
                duplicate,
                beam: None,
            });
        }
        let any_duplicate = prompts.iter().any(|p| p.duplicate);
        let key = (!any_duplicate).then(|| ids.clone());
        // A continuation: the same ordered ids as a finished batch.
        let owner = cache_owner(cx);
        if let Some(cached) = key
            .as_ref()
            .and_then(|k| cx.state::<ContinueCache>().get(&owner, k))
        {
            for (p, c) in prompts.iter_mut().zip(cached) {
                p.ids = Some(c.ids);
                p.kv = c.kv;
                p.before = c.text;
            }
        }
        let mut accepted = Vec::new();
        let mut errors = Vec::new();
        let mut refused: BTreeSet<&str> = BTreeSet::new();
        for p in &prompts {
            if p.duplicate {
                // One ERROR per duplicated id, at its first use.
                if refused.insert(&p.request_id) {
                    errors.push(event(
                        &p.request_id,
                        EventKind::Error {
                            error: format!(
                                "duplicate request_id `{}` in this payload: none of its prompts run; each prompt needs its own id",
                                p.request_id
                            ),
                        },
                    ));
                }
            } else {
                accepted.push(event(&p.request_id, EventKind::Accepted));
            }
        }
        send(cx, &accepted);
        send(cx, &errors);
        let n = prompts.len();
        let serial = self.next_serial;
        self.next_serial += 1;
        self.jobs.push_back(Job {
            serial,
            prompts,
            only_new_tokens: payload.only_new_tokens,
            stream: payload.stream_response,
            params,
            key,
            launched: false,
            finished: vec![None; n],
            failed: any_duplicate,
            beams,
            events: StepEvents::default(),
            constraint,
        });
        self.advance(cx);
    }

    /// Starts what can start: the first payload not yet launched, once
    /// every earlier one is, tokenizing its prompts one by one first.
    fn advance(&mut self, cx: &mut Cx<'_>) {
        if self.tokenizing.is_some() {
            return;
        }
        loop {
            let Some(ji) = self.jobs.iter().position(|j| !j.launched) else {
                return;
            };
            // Earlier payloads must have every prompt admitted first.
            let earlier_admitted = self.jobs.iter().take(ji).all(|j| {
                j.prompts
                    .iter()
                    .all(|p| p.stage == Stage::Done || p.started_at.is_some())
            });
            if !earlier_admitted {
                return;
            }
            let job = &self.jobs[ji];
            let next = job
                .prompts
                .iter()
                .position(|p| p.stage == Stage::Waiting && p.ids.is_none());
            if let Some(pi) = next {
                let text = job.prompts[pi].prompt.clone();
                let max_tokens = job.params.max_tokens;
                match cx.encode_prompt(text, max_tokens) {
                    Ok(tj) => {
                        self.tokenizing = Some((tj, job.serial, pi));
                        return;
                    }
                    Err(e) => {
                        self.fail_prompt(cx, ji, pi, start_error(&e));
                        continue;
                    }
                }
            }
            self.launch(cx, ji);
        }
    }

    /// Starts every waiting prompt of job `ji` at once.
    fn launch(&mut self, cx: &mut Cx<'_>, ji: usize) {
        self.jobs[ji].launched = true;
        let params = self.jobs[ji].params.clone();
        let beams = self.jobs[ji].beams.clone();
        for pi in 0..self.jobs[ji].prompts.len() {
            let p = &mut self.jobs[ji].prompts[pi];
            if p.stage != Stage::Waiting {
                continue;
            }
            let Some(ids) = p.ids.clone() else { continue };
            let reuse_kv = p.kv.take();
            // A beam is a raw generation: it reports its best next tokens
            // and the search decides how it goes on.
            let req = GenRequest {
                prompt_ids: ids.clone(),
                params: params.clone(),
                logprobs: beams
                    .as_ref()
                    .map(|b| b.beams_to_keep().min(MAX_BEAM_CANDIDATES) as u8),
                raw: beams.is_some(),
                reuse_kv,
                constraint: self.jobs[ji].constraint.clone(),
                embed: None,
                prompt_logprobs: None,
                part: RequestPart::First,
            };
            match cx.start(req) {
                Ok(seq) => {
                    self.owners.insert(seq, (self.jobs[ji].serial, pi));
                    let p = &mut self.jobs[ji].prompts[pi];
                    p.stage = Stage::Running(seq);
                    p.beam = beams.clone().map(|cfg| BeamRun {
                        search: BeamSearch::new(cfg),
                        beams: vec![seq],
                        reported: Default::default(),
                        prompt_ids: ids,
                    });
                }
                Err(e) => self.fail_prompt(cx, ji, pi, start_error(&e)),
            }
        }
        self.retire_done(cx);
    }

    fn fail_prompt(&mut self, cx: &mut Cx<'_>, ji: usize, pi: usize, message: String) {
        let Some(job) = self.jobs.get_mut(ji) else {
            return;
        };
        job.failed = true;
        let p = &mut job.prompts[pi];
        p.stage = Stage::Done;
        if let Some(run) = p.beam.take() {
            for seq in run.beams {
                cx.end(seq, FinishReason::Cancelled);
            }
        }
        let rid = p.request_id.clone();
        send(cx, &[event(&rid, EventKind::Error { error: message })]);
    }

    /// Prompt `pi` of job `ji` is done: its COMPLETE is queued and what a
    /// continuation starts from is kept. The one place a COMPLETE is built,
    /// for sampled prompts and beam searches alike.
    fn complete(&mut self, now: Instant, ji: usize, pi: usize, f: Finished) {
        let job = &mut self.jobs[ji];
        let p = &mut job.prompts[pi];
        let started = p.started_at.unwrap_or(f.started);
        let execution_time = ((now - started).as_secs_f64() * 1000.0).round() / 1000.0;
        let text = if job.only_new_tokens {
            f.generated.clone()
        } else {
            format!("{}{}", p.before, f.generated)
        };
        job.finished[pi] = Some(CachedSeq {
            ids: f.ids,
            text: format!("{}{}", p.before, f.generated),
            kv: f.kv,
        });
        p.stage = Stage::Done;
        self.jobs[ji].events.complete.push((
            pi,
            EventKind::Complete {
                text,
                is_eos: f.is_eos,
                new_tokens_count: f.new_tokens,
                execution_time,
            },
        ));
    }

    /// The job and prompt whose generation is `seq`.
    fn find(&self, seq: SeqId) -> Option<(usize, usize)> {
        let &(serial, pi) = self.owners.get(&seq)?;
        let ji = self.jobs.iter().position(|j| j.serial == serial)?;
        let p = self.jobs[ji].prompts.get(pi)?;
        let live = match &p.beam {
            Some(run) => p.stage != Stage::Done && run.beams.contains(&seq),
            None => p.stage == Stage::Running(seq),
        };
        live.then_some((ji, pi))
    }

    /// Sends the gathered events, then retires finished payloads.
    fn flush(&mut self, cx: &mut Cx<'_>) {
        self.flush_events(cx);
        self.retire_done(cx);
    }

    /// Sends the gathered events of every job, each kind as one frame in
    /// payload order.
    fn flush_events(&mut self, cx: &mut Cx<'_>) {
        for job in self.jobs.iter_mut() {
            let mut ev = std::mem::take(&mut job.events);
            let job = &*job;
            let rid = |i: usize| job.prompts[i].request_id.as_str();
            let mut started: Vec<usize> = std::mem::take(&mut ev.started);
            started.sort_unstable();
            let frame: Vec<Event> = started
                .iter()
                .map(|&i| event(rid(i), EventKind::Started))
                .collect();
            send(cx, &frame);
            let mut init = std::mem::take(&mut ev.initialized);
            init.sort_unstable();
            let frame: Vec<Event> = init
                .iter()
                .map(|&i| {
                    let text = if job.only_new_tokens {
                        String::new()
                    } else {
                        job.prompts[i].before.clone()
                    };
                    event(rid(i), EventKind::Initialized { text })
                })
                .collect();
            send(cx, &frame);
            let mut progress = std::mem::take(&mut ev.progress);
            progress.sort_by_key(|(i, _)| *i);
            if job.stream {
                // One element per token: a step that gave a prompt several
                // tokens (speculative decoding) is sent as that many
                // frames, the n-th holding each prompt's n-th token, as if
                // they had come from as many steps.
                let mut frames: Vec<Vec<Event>> = Vec::new();
                let mut nth = 0;
                let mut last = None;
                for (i, text) in progress {
                    nth = if last == Some(i) { nth + 1 } else { 0 };
                    last = Some(i);
                    if frames.len() <= nth {
                        frames.push(Vec::new());
                    }
                    frames[nth].push(event(rid(i), EventKind::Progress { text }));
                }
                for frame in &frames {
                    send(cx, frame);
                }
            }
            let mut complete = std::mem::take(&mut ev.complete);
            complete.sort_by_key(|(i, _)| *i);
            let frame: Vec<Event> = complete
                .into_iter()
                .map(|(i, kind)| event(rid(i), kind))
                .collect();
            send(cx, &frame);
        }
    }

    /// Forgets every payload (the connection is going), freeing the KV
    /// blocks kept for prompts of payloads that never completed.
    fn drop_unfinished(&mut self, cx: &mut Cx<'_>) {
        for job in self.jobs.drain(..) {
            drop_kept(cx, job.finished.into_iter().flatten());
        }
        self.owners.clear();
        self.tokenizing = None;
    }

    /// Drops finished payloads from the front, keeping each in the
    /// continue-generation cache when all of its prompts completed.
    fn retire_done(&mut self, cx: &mut Cx<'_>) {
        while let Some(job) = self.jobs.front() {
            let done = job.launched && job.prompts.iter().all(|p| p.stage == Stage::Done);
            if !done {
                break;
            }
            let Some(job) = self.jobs.pop_front() else {
                break;
            };
            self.owners.retain(|_, (serial, _)| *serial != job.serial);
            if job.failed {
                drop_kept(cx, job.finished.into_iter().flatten());
                continue;
            }
            let seqs: Option<Vec<CachedSeq>> = job.finished.into_iter().collect();
            if let (Some(key), Some(seqs)) = (job.key, seqs) {
                let owner = cache_owner(cx);
                let displaced = cx.state::<ContinueCache>().put(owner, key, seqs);
                drop_kept(cx, displaced);
            }
        }
    }
}

/// Frees the KV blocks kept for `seqs`, which no cache entry will hold.
fn drop_kept(cx: &mut Cx<'_>, seqs: impl IntoIterator<Item = CachedSeq>) {
    for kv in seqs.into_iter().filter_map(|s| s.kv) {
        cx.drop_kv(kv);
    }
}

/// The error text for a prompt that could not start.
fn start_error(e: &StartError) -> String {
    e.message("max_new_tokens")
}

impl DialectConn for BatchConn {
    fn on_text(&mut self, cx: &mut Cx<'_>, text: &str) {
        match codec::decode_payload(text, cx.config().batch_max_prompts) {
            Ok(p) => self.on_payload(cx, p),
            Err(e) => {
                let events: Vec<Event> = if e.request_ids.is_empty() {
                    vec![Event {
                        request_id: None,
                        kind: EventKind::Error { error: e.message },
                    }]
                } else {
                    e.request_ids
                        .iter()
                        .map(|id| {
                            event(
                                id,
                                EventKind::Error {
                                    error: e.message.clone(),
                                },
                            )
                        })
                        .collect()
                };
                send(cx, &events);
            }
        }
    }

    fn on_binary(&mut self, cx: &mut Cx<'_>, len: usize) {
        send(
            cx,
            &[Event {
                request_id: None,
                kind: EventKind::Error {
                    error: format!("binary frames are not supported ({len} bytes received); send a JSON payload as a text frame"),
                },
            }],
        );
    }

    fn on_admitted(&mut self, cx: &mut Cx<'_>, id: SeqId) {
        let Some((ji, pi)) = self.find(id) else {
            return;
        };
        self.jobs[ji].prompts[pi].started_at = Some(cx.now);
        self.jobs[ji].events.started.push(pi);
    }

    fn on_token(&mut self, cx: &mut Cx<'_>, id: SeqId, piece: &TokenPiece) {
        let Some((ji, pi)) = self.find(id) else {
            return;
        };
        if self.jobs[ji].prompts[pi].beam.is_some() {
            return self.on_beam_token(cx, ji, pi, id, piece);
        }
        let Some(g) = cx.gen(id) else { return };
        if piece.token_id.is_some() && g.out_ids.len() == 1 {
            self.jobs[ji].events.initialized.push(pi);
        }
        if piece.token_id.is_some() || !piece.text.is_empty() {
            self.jobs[ji].events.progress.push((pi, piece.text.clone()));
        }
        let Some(reason) = piece.finish else {
            return;
        };
        let is_eos = reason == FinishReason::Stop
            && g.out_ids
                .last()
                .is_some_and(|t| cx.model().eos_ids.contains(t));
        let mut ids = g.prompt_ids.clone();
        ids.extend_from_slice(&g.out_ids);
        let generated = g.text.clone();
        let new_tokens = g.completion_tokens();
        let created_at = g.created_at;
        let clean = matches!(reason, FinishReason::Length | FinishReason::Stop);
        let job = &self.jobs[ji];
        // Its blocks stay for a continuation while memory allows.
        let kv = (clean && job.key.is_some() && !job.failed)
            .then(|| cx.keep_kv(id))
            .flatten();
        self.complete(
            cx.now,
            ji,
            pi,
            Finished {
                ids,
                generated,
                new_tokens,
                is_eos,
                started: created_at,
                kv,
            },
        );
        if !matches!(reason, FinishReason::Length | FinishReason::Stop) {
            // Ended from outside (shutdown grace, a deadline): not a clean
            // state to continue from.
            self.jobs[ji].failed = true;
        }
    }

    fn on_step_end(&mut self, cx: &mut Cx<'_>) {
        self.flush(cx);
        self.advance(cx);
    }

    fn on_failed(&mut self, cx: &mut Cx<'_>, id: SeqId, failure: &Failure) {
        let Some((ji, pi)) = self.find(id) else {
            return;
        };
        // What this step gathered goes first, so events stay in order.
        self.flush_events(cx);
        self.fail_prompt(cx, ji, pi, failure.message.clone());
        self.retire_done(cx);
        self.advance(cx);
    }

    fn on_text_done(&mut self, cx: &mut Cx<'_>, job: TextJobId, result: Result<Encoded, String>) {
        let Some((tj, serial, pi)) = self.tokenizing else {
            return;
        };
        if tj != job {
            return;
        }
        self.tokenizing = None;
        // Earlier payloads may have left the front meanwhile.
        let Some(ji) = self.jobs.iter().position(|j| j.serial == serial) else {
            return;
        };
        match result {
            Ok(enc) => {
                let max_tokens = self.jobs[ji].params.max_tokens;
                let context_len = cx.model().context_len;
                let n = enc.ids.len() as u32;
                if u64::from(n) + u64::from(max_tokens) > u64::from(context_len) {
                    let e = StartError::ContextLength {
                        prompt_tokens: n,
                        max_tokens,
                        context_len,
                    };
                    self.fail_prompt(cx, ji, pi, start_error(&e));
                } else {
                    self.jobs[ji].prompts[pi].ids = Some(enc.ids);
                }
            }
            Err(e) => self.fail_prompt(
                cx,
                ji,
                pi,
                format!("the prompt could not be tokenized: {e}"),
            ),
        }
        self.advance(cx);
    }

    fn on_shutdown(&mut self, cx: &mut Cx<'_>) {
        // What gathered in the last step goes first; then every prompt that
        // never finished (waiting behind an earlier payload, or being
        // tokenized) gets its error, one frame per payload.
        self.flush_events(cx);
        for job in &mut self.jobs {
            let events: Vec<Event> = job
                .prompts
                .iter_mut()
                .filter(|p| p.stage != Stage::Done)
                .map(|p| {
                    p.stage = Stage::Done;
                    event(
                        &p.request_id,
                        EventKind::Error {
                            error: "the server is shutting down; retry on another host".into(),
                        },
                    )
                })
                .collect();
            send(cx, &events);
        }
        self.drop_unfinished(cx);
    }

    fn on_closed(&mut self, cx: &mut Cx<'_>) {
        self.drop_unfinished(cx);
        // A connection's own entries can never be named again.
        let owner = cache_owner(cx);
        if matches!(owner, Some(Principal::Conn(_))) {
            let gone = cx.state::<ContinueCache>().remove_owner(&owner);
            drop_kept(cx, gone);
        }
    }

    fn busy(&self) -> bool {
        !self.jobs.is_empty() || self.tokenizing.is_some()
    }
}
