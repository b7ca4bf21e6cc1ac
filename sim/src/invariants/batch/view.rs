//! The `batch` side of the view: each `/ws` connection's payloads, in the
//! order the Host received them, the prompts it accepted and what each has
//! been sent, and the Host's continue-generation cache as the frames tell
//! it.
//!
//! Every frame is a list of events of one type. The Host answers each
//! payload (and binary frame) in arrival order, with ACCEPTED for its
//! prompts (then, right after, one ERROR frame for its duplicate ids), or,
//! refusing it as a whole, with one ERROR per prompt it names (one with a
//! null id if it names none). Every other frame is about prompts in flight.
//!
//! The cache ([`BatchCache`]) is modelled from the frames alone: a payload
//! without duplicate ids looks its ordered ids up when it is accepted (a
//! hit makes the entry the most recently used); a payload is put under its
//! ids once every prompt of it and of every payload accepted before it on
//! the connection ended (the Host retires payloads in order), when all of
//! its prompts completed cleanly (`is_eos`, or `new_tokens_count` equal to
//! its `max_new_tokens`: a generation ended by a deadline or a shutdown is
//! not kept) and it had no duplicates; the least recently used entry goes
//! once `batch_cache_entries` are held. A batch whose end does not tell
//! whether the Host kept it may have gone in ([`super::cache`] follows
//! both). A crash empties it.

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;
use tokenwire_core::dialect::batch::codec::{Event, EventKind};
use tokenwire_core::Instant;

/// One payload as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPayload {
    /// The request ids it names, in order (what a refusal as a whole names).
    pub named: Vec<String>,
    /// Its prompts' texts, in order (parallel to `named` when it decoded).
    pub prompts: Vec<String>,
    /// `stream_response` (default true).
    pub stream: bool,
    /// `only_new_tokens` (default true).
    pub only_new: bool,
    /// Effective `max_new_tokens` (`u32::MAX` when not a number).
    pub max_new: u64,
    /// `num_beams` (1 when absent or not a number): each of its prompts
    /// runs that many sequences at once, and momentarily twice as many
    /// while a round forks the beams it keeps.
    pub beams: u64,
    /// `generation_config`, as sent.
    pub config: Value,
    /// The ids named more than once, each once, in order of first use:
    /// none of their prompts run, and each gets one ERROR.
    pub dups: Vec<String>,
    /// Prompts in its `prompts` array.
    pub items: usize,
    /// `batch_max_prompts`: a payload holding more is refused with one
    /// ERROR whose id is null.
    pub max_prompts: usize,
    /// A binary frame (answered by one ERROR with a null id).
    pub binary: bool,
    /// Once accepted: the text before each prompt's run (the cached text
    /// of a continued batch, or the prompt).
    pub before: Vec<String>,
    /// Accepted as a continuation (a cache hit).
    pub continued: bool,
    /// Whether the Host may or may not have continued it (see
    /// [`BatchCache`]): its continuation is not checked.
    pub uncertain: bool,
}

impl BatchPayload {
    /// A text frame the client sent (`max_new` from the run's default when
    /// the payload gives none).
    pub fn of_text(
        text: &str,
        (default_max_new, context_len, max_prompts): (u64, u64, usize),
    ) -> BatchPayload {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        let items = v["prompts"].as_array().cloned().unwrap_or_default();
        let named: Vec<String> = items
            .iter()
            .filter_map(|p| p.get("request_id").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        let prompts = items
            .iter()
            .map(|p| p["prompt"].as_str().unwrap_or("").to_string())
            .collect();
        let mut dups: Vec<String> = Vec::new();
        for (i, id) in named.iter().enumerate() {
            if named[..i].contains(id) && !dups.contains(id) {
                dups.push(id.clone());
            }
        }
        let max_new = match v["generation_config"].get("max_new_tokens") {
            None => default_max_new.min(context_len),
            Some(m) => m.as_u64().unwrap_or(u64::from(u32::MAX)),
        };
        let beams = v["generation_config"]["num_beams"]
            .as_u64()
            .unwrap_or(1)
            .max(1);
        BatchPayload {
            beams,
            config: v["generation_config"].clone(),
            named,
            prompts,
            stream: v["stream_response"].as_bool().unwrap_or(true),
            only_new: v["only_new_tokens"].as_bool().unwrap_or(true),
            max_new,
            dups,
            items: items.len(),
            max_prompts,
            binary: false,
            before: Vec::new(),
            continued: false,
            uncertain: false,
        }
    }

    /// The request ids of its ACCEPTED frame: those named exactly once.
    pub fn unique(&self) -> Vec<String> {
        self.named
            .iter()
            .filter(|id| !self.dups.contains(id))
            .cloned()
            .collect()
    }

    /// The ids of the ERROR frame refusing it as a whole.
    pub fn refusal(&self) -> Vec<Option<String>> {
        if self.named.is_empty() || self.items > self.max_prompts {
            vec![None]
        } else {
            self.named.iter().cloned().map(Some).collect()
        }
    }
}

/// One accepted prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchPrompt {
    /// Its request id.
    pub rid: String,
    /// Its payload (index into [`BatchConnView::payloads`]).
    pub payload: usize,
    /// Its position in the payload's ACCEPTED order (payload order).
    pub pos: usize,
    /// Its position among the payload's named prompts.
    pub named_pos: usize,
    /// STARTED events.
    pub started: u32,
    /// When its ACCEPTED was sent.
    pub accepted_at: Option<Instant>,
    /// When the first STARTED was sent.
    pub started_at: Option<Instant>,
    /// INITIALIZED events.
    pub initialized: u32,
    /// PROGRESS events.
    pub progress: u32,
    /// Its PROGRESS texts, concatenated.
    pub streamed: String,
    /// Its COMPLETE: (text, is_eos, new_tokens_count).
    pub complete: Option<(String, bool, u32)>,
    /// It ended with an ERROR.
    pub failed: bool,
}

impl BatchPrompt {
    /// It got its COMPLETE or ERROR.
    pub fn ended(&self) -> bool {
        self.complete.is_some() || self.failed
    }
}

/// What a frame is, as the view reads it before taking it in.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// The ACCEPTED answer of payload `0`.
    Accepted(usize),
    /// The ERROR frame refusing payload `0` as a whole.
    Refused(usize),
    /// The ERROR frame for the duplicate ids of the payload just accepted.
    Dups,
    /// The ERROR frame of payload `0`, all of whose ids are duplicates: it
    /// has no ACCEPTED frame, and nothing of it runs.
    AllDups(usize),
    /// Events for prompts in flight (`None`: no prompt in flight has it).
    Prompts(Vec<Option<usize>>),
    /// Nothing it can be.
    Bad(String),
}

/// One `batch` connection.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchConnView {
    /// Every payload received, in order.
    pub payloads: Vec<BatchPayload>,
    /// Payloads (and binary frames) not yet answered, oldest first.
    pub unanswered: VecDeque<usize>,
    /// Every prompt accepted.
    pub prompts: Vec<BatchPrompt>,
    /// Prompts in flight, by request id.
    pub live: BTreeMap<String, usize>,
    /// The duplicate ids whose ERROR frame comes next.
    pub expect_dups: Option<Vec<String>>,
    /// Accepted payloads not yet retired: (payload, its prompts).
    pub jobs: VecDeque<(usize, Vec<usize>)>,
    /// The same request id was accepted twice in flight: frames cannot be
    /// told apart any more, the exact checks stop.
    pub ambiguous: bool,
}

impl BatchConnView {
    /// A text frame arrived.
    pub fn on_text(&mut self, text: &str, limits: (u64, u64, usize)) {
        self.payloads.push(BatchPayload::of_text(text, limits));
        self.unanswered.push_back(self.payloads.len() - 1);
    }

    /// A binary frame arrived.
    pub fn on_binary(&mut self) {
        let mut p = BatchPayload::of_text("", (0, 0, 0));
        p.binary = true;
        self.payloads.push(p);
        self.unanswered.push_back(self.payloads.len() - 1);
    }

    /// What `events` are.
    pub fn read(&self, events: &[Event]) -> Reading {
        let ids: Vec<Option<String>> = events.iter().map(|e| e.request_id.clone()).collect();
        let all = |f: fn(&EventKind) -> bool| events.iter().all(|e| f(&e.kind));
        if all(|k| matches!(k, EventKind::Accepted)) {
            return match self.unanswered.front() {
                Some(&p) => Reading::Accepted(p),
                None => Reading::Bad("ACCEPTED with no payload waiting for an answer".into()),
            };
        }
        if all(|k| matches!(k, EventKind::Error { .. })) {
            if let Some(&p) = self.unanswered.front() {
                let pay = &self.payloads[p];
                let want: Vec<Option<String>> = pay.dups.iter().cloned().map(Some).collect();
                if !pay.binary && pay.unique().is_empty() && !want.is_empty() && want == ids {
                    return Reading::AllDups(p);
                }
            }
            if let Some(d) = &self.expect_dups {
                let want: Vec<Option<String>> = d.iter().cloned().map(Some).collect();
                if want == ids {
                    return Reading::Dups;
                }
            }
            let live = ids
                .iter()
                .all(|i| i.as_ref().is_some_and(|i| self.live.contains_key(i)));
            if !live {
                if let Some(&p) = self.unanswered.front() {
                    if self.payloads[p].refusal() == ids {
                        return Reading::Refused(p);
                    }
                }
            }
        }
        Reading::Prompts(
            ids.iter()
                .map(|i| i.as_ref().and_then(|i| self.live.get(i)).copied())
                .collect(),
        )
    }

    /// Takes `events` in; returns the payloads retired by them, each with
    /// whether it goes into the cache.
    pub fn on_events(
        &mut self,
        now: Instant,
        events: &[Event],
        owner: Owner,
        cache: &mut BatchCache,
    ) {
        let reading = self.read(events);
        self.expect_dups = None;
        match reading {
            Reading::Accepted(p) => {
                self.unanswered.pop_front();
                let pay = &mut self.payloads[p];
                let unique = pay.unique();
                let lookup = if pay.dups.is_empty() {
                    cache.get(owner, &unique)
                } else {
                    Lookup::Miss
                };
                pay.uncertain = lookup == Lookup::Uncertain;
                pay.continued = matches!(lookup, Lookup::Hit(_));
                pay.before = match lookup {
                    Lookup::Hit(texts) => texts,
                    _ => unique
                        .iter()
                        .map(|id| {
                            let i = pay.named.iter().position(|n| n == id).unwrap_or(0);
                            pay.prompts.get(i).cloned().unwrap_or_default()
                        })
                        .collect(),
                };
                if !pay.dups.is_empty() {
                    self.expect_dups = Some(pay.dups.clone());
                }
                let mut idx = Vec::new();
                for (pos, id) in unique.iter().enumerate() {
                    let named_pos = pay.named.iter().position(|n| n == id).unwrap_or(0);
                    self.prompts.push(BatchPrompt {
                        rid: id.clone(),
                        payload: p,
                        pos,
                        named_pos,
                        accepted_at: Some(now),
                        ..BatchPrompt::default()
                    });
                    let i = self.prompts.len() - 1;
                    idx.push(i);
                    if self.live.insert(id.clone(), i).is_some() {
                        self.ambiguous = true;
                    }
                }
                self.jobs.push_back((p, idx));
            }
            Reading::Refused(_) => {
                self.unanswered.pop_front();
            }
            Reading::AllDups(p) => {
                self.unanswered.pop_front();
                self.jobs.push_back((p, Vec::new()));
            }
            Reading::Dups | Reading::Bad(_) => {}
            Reading::Prompts(idx) => {
                for (e, i) in events.iter().zip(idx) {
                    let Some(i) = i else { continue };
                    let pr = &mut self.prompts[i];
                    match &e.kind {
                        EventKind::Started => {
                            pr.started += 1;
                            pr.started_at.get_or_insert(now);
                        }
                        EventKind::Initialized { .. } => pr.initialized += 1,
                        EventKind::Progress { text } => {
                            pr.progress += 1;
                            pr.streamed.push_str(text);
                        }
                        EventKind::Complete {
                            text,
                            is_eos,
                            new_tokens_count,
                            ..
                        } => {
                            pr.complete = Some((text.clone(), *is_eos, *new_tokens_count));
                        }
                        EventKind::Error { .. } => pr.failed = true,
                        EventKind::Accepted => {}
                    }
                    if pr.ended() {
                        let rid = pr.rid.clone();
                        self.live.remove(&rid);
                    }
                }
            }
        }
        self.retire(owner, cache);
    }

    /// Retires finished payloads from the front, caching the clean ones.
    fn retire(&mut self, owner: Owner, cache: &mut BatchCache) {
        while let Some((p, idx)) = self.jobs.front() {
            if !idx.iter().all(|&i| self.prompts[i].ended()) {
                return;
            }
            let pay = &self.payloads[*p];
            // A content filter's stop ends a run early, uncached, or at
            // `max_new_tokens`, cached or not: the frames do not say which,
            // so the owner's cache is not known from here on.
            if cache.filter_stops
                && idx
                    .iter()
                    .any(|&i| !self.prompts[i].complete.as_ref().is_some_and(|c| c.1))
            {
                if pay.dups.is_empty() && idx.iter().all(|&i| !self.prompts[i].failed) {
                    cache.may_put(owner, pay.unique());
                }
                self.jobs.pop_front();
                continue;
            }
            let clean = pay.dups.is_empty()
                && idx.iter().all(|&i| {
                    self.prompts[i]
                        .complete
                        .as_ref()
                        .is_some_and(|(_, eos, n)| *eos || u64::from(*n) == pay.max_new)
                });
            if clean {
                let texts: Vec<String> = idx
                    .iter()
                    .map(|&i| {
                        let pr = &self.prompts[i];
                        let text = pr.complete.as_ref().map_or("", |c| c.0.as_str());
                        let before = pay.before.get(pr.pos).map_or("", String::as_str);
                        if pay.only_new {
                            format!("{before}{text}")
                        } else {
                            text.to_string()
                        }
                    })
                    .collect();
                // A run that may or may not have continued one: what it
                // started from, so its texts, are not known here.
                let texts = (!pay.uncertain).then_some(texts);
                cache.put(owner, pay.unique(), texts);
            } else if pay.dups.is_empty() && idx.iter().all(|&i| self.prompts[i].complete.is_some())
            {
                // Ended short of `max_new_tokens` without end of sequence:
                // a full context (kept) or a deadline (not).
                cache.may_put(owner, pay.unique());
            }
            self.jobs.pop_front();
        }
    }

    /// What is still due on it: prompts in flight, payloads unanswered.
    pub fn outstanding(&self) -> Vec<String> {
        // A beam search's prompt counts as the sequences it may hold, as
        // the Host's queue does.
        let mut v: Vec<String> = self
            .live
            .iter()
            .flat_map(|(r, &i)| {
                let beams = self
                    .prompts
                    .get(i)
                    .and_then(|p| self.payloads.get(p.payload))
                    .map_or(1, |p| if p.beams > 1 { 2 * p.beams } else { 1 });
                (0..beams).map(move |b| match b {
                    0 => format!("batch prompt {r:?}"),
                    _ => format!("batch prompt {r:?} (beam sequence {b})"),
                })
            })
            .collect();
        v.extend(
            self.unanswered
                .iter()
                .map(|p| format!("batch payload #{p} (no answer)")),
        );
        v
    }

    /// The Host counts it busy: a payload accepted and not finished.
    pub fn busy(&self) -> bool {
        !self.jobs.is_empty()
    }
}

pub use super::cache::{BatchCache, Lookup, Owner};

/// The coverage tally key of a frame.
pub fn tally_key(events: &[Event], reading: &Reading) -> Option<String> {
    let kind = events.first()?.kind.as_str();
    Some(match reading {
        Reading::Accepted(_) => "batch:ACCEPTED".into(),
        Reading::Refused(_) => "batch:refused".into(),
        Reading::Dups => "batch:duplicate".into(),
        _ => format!("batch:{kind}"),
    })
}

/// A `Send` to a `batch` connection: the connection, its view and the
/// frame's events (or why they do not decode).
pub type BatchSend<'a> = (
    tokenwire_core::ConnId,
    &'a BatchConnView,
    Result<Vec<Event>, String>,
);

/// A frame about prompts in flight on an unambiguous `batch` connection:
/// the connection, its view, and each event with its prompt's index (as
/// [`BatchConnView::read`] gives it).
pub type PromptEvents<'a> = (
    tokenwire_core::ConnId,
    &'a BatchConnView,
    Vec<(Event, Option<usize>)>,
);

/// The [`PromptEvents`] of `out`, if it is such a frame: what the checkers
/// that judge prompts' events read.
pub fn prompt_events<'a>(
    view: &'a crate::invariants::View,
    out: &tokenwire_core::Output,
) -> Option<PromptEvents<'a>> {
    let (conn, b, Ok(events)) = batch_send(view, out)? else {
        return None;
    };
    if b.ambiguous {
        return None;
    }
    let Reading::Prompts(idx) = b.read(&events) else {
        return None;
    };
    Some((conn, b, events.into_iter().zip(idx).collect()))
}

/// The [`BatchSend`] of `out`, if it is one.
pub fn batch_send<'a>(
    view: &'a crate::invariants::View,
    out: &tokenwire_core::Output,
) -> Option<BatchSend<'a>> {
    let tokenwire_core::Output::Send { conn, text } = out else {
        return None;
    };
    let b = view.batch(conn)?;
    Some((
        *conn,
        b,
        tokenwire_core::dialect::batch::codec::decode_events(text),
    ))
}
