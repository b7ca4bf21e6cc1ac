//! The simulated engine: deterministic, cheap, no model.
//!
//! It keeps every sequence's token history exactly as the plans fed it (apply
//! `free` first, then per sequence truncate to `start_pos` and append) and
//! answers with a token that is a hash of (history, sampling seed) mapped onto
//! the swarm's symbols as [`ByteCodec`](tokenwire_core::text::byte::ByteCodec)
//! byte tokens (`id = byte + 3`), sometimes end-of-sequence (id 2). A
//! generation that is paused, evicted, preempted or recomputed after a lost
//! device therefore continues with the same tokens, as long as the core feeds
//! it the same history: which [`SimEngine::validate`] checks. A plan that
//! feeds a position beyond what the engine holds, rewrites a held token with
//! another, does not feed back the token it was given, or hands out block
//! tables that do not cover the positions or overlap, is rejected as the
//! `engine_plan` invariant.
//!
//! It also keeps what each KV block slot holds (the position and token
//! written there, copies applied), as a real cache would. A sequence
//! admitted onto cached blocks (a plan's `cached_prefix`) must find exactly
//! its prefix's tokens at their positions in its table's blocks, and every
//! sequence the token just before its start: a prefix cache that hands out
//! another prompt's blocks, or a table that lost a block, is rejected.
//!
//! Embeddings and prompt scores are functions of the tokens alone too: an
//! embedding sequence's vector is [`embedding_of`] its prompt, a scored
//! prompt's token at position `p` scores [`prompt_score`] of the tokens
//! before it, so a checker can recompute both from the prompt a client
//! sent. Both must be fed as the engine contract says (chunks in order from
//! position 0, never onto a cached prefix, never with a draft), which
//! [`SimEngine::validate`] checks as a real engine refuses it.

use std::collections::{BTreeMap, BTreeSet};

use tokenwire_core::rng::mix64;
use tokenwire_core::text::byte::{BYTE_EOS, BYTE_OFFSET, BYTE_VOCAB};
use tokenwire_core::{
    BlockId, EngineFaultKind, ModelInfo, Pooling, SeqId, SeqResult, SeqStep, StepDone, StepPlan,
    TokenId, TokenLogprobs,
};

use crate::swarm::EngineOptions;

/// Name of the invariant a rejected plan breaks.
pub const ENGINE_PLAN: &str = "engine_plan";

/// Start value of a history's rolling hash.
const HASH_START: u64 = 0x7477_5f68_6973_7400;

#[derive(Debug, Clone, Default)]
struct SeqState {
    tokens: Vec<TokenId>,
    /// `hashes[i]` covers `tokens[..=i]`.
    hashes: Vec<u64>,
    /// The token last handed back, and the position it must be fed at.
    sampled: Option<(usize, TokenId)>,
    /// Positions fed as a scored chunk (`prompt_logprobs`), from 0.
    scored: usize,
    /// Positions fed as an embedding's chunk, from 0.
    pooled: usize,
}

impl SeqState {
    /// A fork's copy: the first `len` tokens, nothing sampled yet.
    fn forked(&self, len: usize) -> SeqState {
        SeqState {
            tokens: self.tokens[..len].to_vec(),
            hashes: self.hashes[..len].to_vec(),
            sampled: None,
            scored: 0,
            pooled: 0,
        }
    }

    fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.hashes.truncate(len);
        self.scored = self.scored.min(len);
        self.pooled = self.pooled.min(len);
    }

    fn push(&mut self, t: TokenId) {
        let prev = self.hashes.last().copied().unwrap_or(HASH_START);
        self.tokens.push(t);
        self.hashes.push(mix64(prev, u64::from(t)));
    }
}

/// The deterministic model-free engine.
#[derive(Debug, Clone)]
pub struct SimEngine {
    opts: EngineOptions,
    info: ModelInfo,
    seqs: BTreeMap<SeqId, SeqState>,
    /// What each KV block slot holds: the position and token written there.
    kv: BTreeMap<(BlockId, u32), (u32, TokenId)>,
    /// Symbols as byte strings.
    symbols: Vec<Vec<u8>>,
    last_step_id: Option<u64>,
    /// Steps computed.
    pub steps: u64,
}

impl SimEngine {
    /// An engine writing `opts.symbols` for a model shaped like `info`.
    pub fn new(opts: EngineOptions, info: ModelInfo) -> SimEngine {
        let mut symbols: Vec<Vec<u8>> = opts
            .symbols
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .filter(|s| !s.is_empty())
            .collect();
        if symbols.is_empty() {
            symbols.push(b"a".to_vec());
        }
        SimEngine {
            opts,
            info,
            seqs: BTreeMap::new(),
            kv: BTreeMap::new(),
            symbols,
            last_step_id: None,
            steps: 0,
        }
    }

    /// The options it was built with.
    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// Tokens it holds for `seq` (empty when unknown).
    pub fn history(&self, seq: SeqId) -> &[TokenId] {
        self.seqs.get(&seq).map_or(&[], |s| s.tokens.as_slice())
    }

    /// Checks a plan against what the engine holds; the error describes the
    /// first problem. Nothing changes.
    pub fn validate(&self, plan: &StepPlan) -> Result<(), String> {
        if let Some(last) = self.last_step_id {
            if plan.step_id <= last {
                return Err(format!(
                    "step id {} does not increase (last was {last})",
                    plan.step_id
                ));
            }
        }
        if plan.seqs.is_empty() {
            return Err(format!("step {} computes nothing", plan.step_id));
        }
        // Forks come first: a beam's copy of its parent's history.
        let mut forked: BTreeMap<SeqId, SeqState> = BTreeMap::new();
        for f in &plan.forks {
            if self.seqs.contains_key(&f.dst) {
                continue;
            }
            let Some(src) = self.seqs.get(&f.src) else {
                return Err(format!("fork of unknown {:?} into {:?}", f.src, f.dst));
            };
            if f.len as usize > src.tokens.len() {
                return Err(format!(
                    "fork of {:?} into {:?} takes {} tokens, the engine holds {}",
                    f.src,
                    f.dst,
                    f.len,
                    src.tokens.len()
                ));
            }
            forked.insert(f.dst, src.forked(f.len as usize));
        }
        let freed: BTreeSet<SeqId> = plan.free.iter().copied().collect();
        let mut seen = BTreeSet::new();
        // Blocks a sequence writes in this step are its alone; blocks it
        // only reads (positions before its start) may be shared by forks.
        let mut written: BTreeMap<BlockId, SeqId> = BTreeMap::new();
        let mut read: BTreeMap<BlockId, SeqId> = BTreeMap::new();
        let bs = self.info.block_size as usize;
        for s in &plan.seqs {
            if !seen.insert(s.seq) {
                return Err(format!("{:?} twice in step {}", s.seq, plan.step_id));
            }
            if s.tokens.is_empty() {
                return Err(format!("{:?} fed no tokens", s.seq));
            }
            if let Some(t) = s.tokens.iter().chain(&s.draft).find(|&&t| t >= BYTE_VOCAB) {
                return Err(format!("{:?} fed token {t} outside the vocabulary", s.seq));
            }
            if !s.draft.is_empty() && (!s.sample || s.allowed.is_some()) {
                return Err(format!(
                    "{:?} drafted without sampling, or with a token mask",
                    s.seq
                ));
            }
            let held = if freed.contains(&s.seq) {
                None
            } else {
                self.seqs.get(&s.seq).or_else(|| forked.get(&s.seq))
            };
            let start = s.start_pos as usize;
            check_in_order(s, held)?;
            if !s.cached_prefix.is_empty() {
                if s.cached_prefix.len() != start {
                    return Err(format!(
                        "{:?} carries a cached prefix of {} tokens but starts at {start}",
                        s.seq,
                        s.cached_prefix.len()
                    ));
                }
                for (p, &t) in s.cached_prefix.iter().enumerate() {
                    self.check_slot(plan, s.seq, &s.block_table, p, t)?;
                }
            }
            let held_len = held
                .map_or(0, |h| h.tokens.len())
                .max(s.cached_prefix.len());
            if let Some(h) = held.filter(|_| s.cached_prefix.is_empty()) {
                // The token before its start must be where its table says.
                if start > 0 && start <= h.tokens.len() {
                    self.check_slot(plan, s.seq, &s.block_table, start - 1, h.tokens[start - 1])?;
                }
            }
            if start > held_len {
                return Err(format!(
                    "{:?} fed at position {start} but the engine holds {held_len} tokens",
                    s.seq
                ));
            }
            if let Some(h) = held {
                // Recomputing must feed exactly the history it had.
                for (i, &t) in s.tokens.iter().enumerate() {
                    let pos = start + i;
                    if pos < h.tokens.len() && h.tokens[pos] != t {
                        return Err(format!(
                            "{:?} position {pos} re-fed as token {t}, but it was {}",
                            s.seq, h.tokens[pos]
                        ));
                    }
                    if let Some((p, want)) = h.sampled {
                        if pos == p && t != want {
                            return Err(format!(
                                "{:?} position {pos} fed token {t}, but the engine sampled {want} there",
                                s.seq
                            ));
                        }
                    }
                }
            }
            // Draft tokens are written at the positions after its tokens.
            let end = start + s.tokens.len() + s.draft.len();
            if end > self.info.context_len as usize + 1 {
                return Err(format!(
                    "{:?} fed up to position {end}, beyond the context of {}",
                    s.seq, self.info.context_len
                ));
            }
            if s.block_table.len() * bs < end {
                return Err(format!(
                    "{:?}: {} blocks of {bs} do not cover {end} positions",
                    s.seq,
                    s.block_table.len()
                ));
            }
            for (i, &b) in s.block_table.iter().enumerate() {
                if b >= self.info.num_blocks {
                    return Err(format!(
                        "{:?} uses block {b} of a pool of {}",
                        s.seq, self.info.num_blocks
                    ));
                }
                let writes = (i + 1) * bs > start && i * bs < end;
                let clash = if writes {
                    written.insert(b, s.seq).or_else(|| read.get(&b).copied())
                } else {
                    read.insert(b, s.seq);
                    written.get(&b).copied()
                };
                if let Some(other) = clash {
                    return Err(format!(
                        "block {b} is in the tables of both {other:?} and {:?}, and one of them writes it in this step",
                        s.seq
                    ));
                }
            }
        }
        Ok(())
    }

    /// Position `p` of `seq` (token `t`) must be in `table`'s block for it,
    /// this plan's block copies applied first.
    fn check_slot(
        &self,
        plan: &StepPlan,
        seq: SeqId,
        table: &[BlockId],
        p: usize,
        t: TokenId,
    ) -> Result<(), String> {
        let bs = self.info.block_size as usize;
        let Some(&b) = table.get(p / bs) else {
            return Err(format!("{seq:?}'s table has no block for position {p}"));
        };
        let slot = (p % bs) as u32;
        let src = plan
            .copy_blocks
            .iter()
            .rev()
            .find(|&&(_, dst)| dst == b)
            .map_or(b, |&(src, _)| src);
        let got = self.kv.get(&(src, slot)).copied();
        if got != Some((p as u32, t)) {
            return Err(format!(
                "{seq:?} reads position {p} (token {t}) from block {b} slot {slot}, which holds {got:?}"
            ));
        }
        Ok(())
    }

    /// Runs a validated plan: applies `free`, feeds every sequence and samples.
    pub fn run(&mut self, plan: &StepPlan) -> StepDone {
        self.last_step_id = Some(plan.step_id);
        self.steps += 1;
        for f in &plan.forks {
            if self.seqs.contains_key(&f.dst) {
                continue;
            }
            if let Some(src) = self.seqs.get(&f.src) {
                let child = src.forked(f.len as usize);
                self.seqs.insert(f.dst, child);
            }
        }
        for seq in &plan.free {
            self.seqs.remove(seq);
        }
        let bs = self.info.block_size;
        for &(src, dst) in &plan.copy_blocks {
            for slot in 0..bs {
                match self.kv.get(&(src, slot)).copied() {
                    Some(v) => self.kv.insert((dst, slot), v),
                    None => self.kv.remove(&(dst, slot)),
                };
            }
        }
        for s in &plan.seqs {
            for (i, &t) in s.tokens.iter().chain(&s.draft).enumerate() {
                let p = s.start_pos + i as u32;
                if let Some(&b) = s.block_table.get((p / bs) as usize) {
                    self.kv.insert((b, p % bs), (p, t));
                }
            }
        }
        let mut results = Vec::new();
        for s in &plan.seqs {
            let st = self.seqs.entry(s.seq).or_default();
            if !s.cached_prefix.is_empty() {
                // Admitted onto cached blocks: this is its history.
                *st = SeqState::default();
                for &t in &s.cached_prefix {
                    st.push(t);
                }
            }
            st.truncate(s.start_pos as usize);
            for &t in &s.tokens {
                st.push(t);
            }
            if s.prompt_logprobs.is_some() {
                st.scored = st.tokens.len();
            }
            if s.embed.is_some() {
                st.pooled = st.tokens.len();
            }
            if !s.sample {
                continue;
            }
            if let Some(pooling) = s.embed {
                // Nothing is sampled, and the token is not the sequence's.
                results.push(SeqResult {
                    seq: s.seq,
                    token: 0,
                    logprobs: None,
                    embedding: Some(embedding_of(
                        pooling,
                        &st.tokens,
                        self.info.embedding_size as usize,
                    )),
                    prompt_logprobs: None,
                });
                continue;
            }
            let mut prompt_scores = s.prompt_logprobs.map(|k| {
                (1..st.tokens.len())
                    .map(|p| score_after(st.hashes[p - 1], st.tokens[p], k))
                    .collect::<Vec<_>>()
            });
            let seed = if s.sampling.temperature == 0.0 || s.sampling.top_k == 1 {
                0
            } else {
                s.sampling.seed
            };
            // One draw, then one after each draft token as long as the
            // draws confirm the draft (a real engine's rule).
            let mut draft = s.draft.iter();
            loop {
                let token = next_token(&self.symbols, self.opts.eos_permille, st, seed);
                let token = allowed_or_next(token, s.allowed.as_deref());
                st.sampled = Some((st.tokens.len(), token));
                let logprobs = s.logprobs.map(|n| alternatives(token, n));
                results.push(SeqResult {
                    seq: s.seq,
                    token,
                    logprobs,
                    embedding: None,
                    prompt_logprobs: prompt_scores.take(),
                });
                match draft.next() {
                    Some(&d) if d == token => st.push(d),
                    _ => break,
                }
            }
        }
        StepDone {
            step_id: plan.step_id,
            results,
        }
    }

    /// The plan failed instead of running: out of memory and internal errors
    /// change nothing; a lost device loses every sequence's state.
    pub fn fail(&mut self, plan: &StepPlan, kind: &EngineFaultKind) {
        self.last_step_id = Some(plan.step_id);
        if *kind == EngineFaultKind::DeviceLost {
            self.seqs.clear();
            self.kv.clear();
        }
    }
}

/// A scored or embedded chunk must come as the engine contract says: in
/// position order from 0 (every position before its start fed the same
/// way), never onto a cached prefix, never with a draft; and a prompt
/// being scored is scored to its end (an unscored chunk before its first
/// token is sampled would leave the client's scores short).
fn check_in_order(s: &SeqStep, held: Option<&SeqState>) -> Result<(), String> {
    let start = s.start_pos as usize;
    let (what, fed) = match (s.prompt_logprobs, s.embed) {
        (Some(_), Some(_)) => return Err(format!("{:?} is both scored and embedded", s.seq)),
        (Some(_), None) => ("scored", held.map_or(0, |h| h.scored)),
        (None, Some(_)) => ("embedded", held.map_or(0, |h| h.pooled)),
        (None, None) => {
            let mid_prompt = held.is_some_and(|h| h.scored > 0 && h.sampled.is_none());
            if mid_prompt && start > 0 {
                return Err(format!(
                    "{:?} was scored from 0 and goes on unscored at {start}",
                    s.seq
                ));
            }
            return Ok(());
        }
    };
    if !s.cached_prefix.is_empty() || !s.draft.is_empty() {
        return Err(format!(
            "{:?} is {what} onto a cached prefix of {} tokens or with a draft of {}",
            s.seq,
            s.cached_prefix.len(),
            s.draft.len()
        ));
    }
    if start > fed {
        return Err(format!(
            "{:?} is {what} from position {start}, but only {fed} positions before it were",
            s.seq
        ));
    }
    Ok(())
}

/// The rolling hash of `tokens` (what the engine's sampling draws from:
/// [`SeqState::push`]'s, from scratch).
fn history_hash(tokens: &[TokenId]) -> u64 {
    tokens
        .iter()
        .fold(HASH_START, |h, &t| mix64(h, u64::from(t)))
}

/// The score of `token` after `before`, with `k` alternatives: a logprob
/// and alternatives drawn from the history's hash, all multiples of 1/256
/// (exact through JSON), so a checker recomputes them from a prompt.
pub fn prompt_score(before: &[TokenId], token: TokenId, k: u8) -> TokenLogprobs {
    score_after(history_hash(before), token, k)
}

/// [`prompt_score`] from the hash of what comes before.
fn score_after(h: u64, token: TokenId, k: u8) -> TokenLogprobs {
    let logprob = -((mix64(h, u64::from(token)) % 4096) as f32) / 256.0;
    TokenLogprobs {
        logprob,
        top: (0..u64::from(k))
            .map(|i| {
                let alt = BYTE_OFFSET + ((h >> 8).wrapping_add(i) % 256) as TokenId;
                (alt, -0.125 - i as f32 / 2.0)
            })
            .collect(),
    }
}

/// The (unnormalized) vector of an embedding of `tokens` pooled by
/// `pooling`, `size` values, each a multiple of 1/256 drawn from the
/// prompt's hash.
pub fn embedding_of(pooling: Pooling, tokens: &[TokenId], size: usize) -> Vec<f32> {
    let h = mix64(history_hash(tokens), pooling as u64);
    (0..size as u64)
        .map(|i| ((mix64(h, i) % 512) as f32 - 255.5) / 256.0)
        .collect()
}

/// The token after `st`'s history under sampler `seed`.
fn next_token(symbols: &[Vec<u8>], eos_permille: u32, st: &SeqState, seed: u64) -> TokenId {
    // Finish a multi-byte character that the history ends inside.
    let bytes: Vec<u8> = st
        .tokens
        .iter()
        .rev()
        .take(3)
        .rev()
        .filter(|&&t| (BYTE_OFFSET..BYTE_OFFSET + 256).contains(&t))
        .map(|&t| (t - BYTE_OFFSET) as u8)
        .collect();
    for start in 0..bytes.len() {
        let tail = &bytes[start..];
        if let Some(sym) = symbols
            .iter()
            .find(|s| s.len() > tail.len() && s.starts_with(tail) && s.len() > 1)
        {
            if tail[0] >= 0xC0 {
                return TokenId::from(sym[tail.len()]) + BYTE_OFFSET;
            }
        }
    }
    let h = mix64(st.hashes.last().copied().unwrap_or(HASH_START), seed);
    if (h % 1000) < u64::from(eos_permille) {
        return BYTE_EOS;
    }
    let sym = &symbols[((h >> 16) % symbols.len() as u64) as usize];
    TokenId::from(sym[0]) + BYTE_OFFSET
}

/// `token`, or where `allowed` (a grammar's or a request's token mask)
/// forbids it, the next id it allows, counting up from it around the
/// vocabulary: as a real engine, never a token outside the mask, and
/// still a function of the history alone. (A mask that allows nothing
/// leaves `token`, which the core then refuses as the mask's.)
fn allowed_or_next(token: TokenId, allowed: Option<&tokenwire_core::TokenMask>) -> TokenId {
    let Some(mask) = allowed else {
        return token;
    };
    (0..BYTE_VOCAB)
        .map(|i| (token + i) % BYTE_VOCAB)
        .find(|&t| mask.allows(t))
        .unwrap_or(token)
}

/// `n` plausible alternatives to `token` with falling log-probabilities.
fn alternatives(token: TokenId, n: u8) -> TokenLogprobs {
    TokenLogprobs {
        logprob: -0.25,
        top: (0..u32::from(n))
            .map(|i| {
                let alt = BYTE_OFFSET + (token - BYTE_OFFSET.min(token) + 1 + i) % 256;
                (alt, -1.0 - i as f32)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_moves_the_token_to_the_next_id_it_allows() {
        let mut mask = tokenwire_core::TokenMask::none(BYTE_VOCAB);
        for id in [2, 100, 140] {
            mask.allow(id);
        }
        assert_eq!(allowed_or_next(100, Some(&mask)), 100);
        assert_eq!(allowed_or_next(101, Some(&mask)), 140);
        assert_eq!(
            allowed_or_next(141, Some(&mask)),
            2,
            "around the vocabulary"
        );
        assert_eq!(allowed_or_next(77, None), 77);
        let nothing = tokenwire_core::TokenMask::none(BYTE_VOCAB);
        assert_eq!(allowed_or_next(77, Some(&nothing)), 77);
    }
    use tokenwire_core::testing::tiny_model_info;
    use tokenwire_core::{SamplingParams, SeqStep};

    fn opts() -> EngineOptions {
        EngineOptions {
            symbols: vec!["a".into(), "b".into(), "🦀".into()],
            eos_permille: 0,
            step_base: Default::default(),
            per_token: Default::default(),
            jitter: Default::default(),
        }
    }

    fn step(seq: u64, tokens: Vec<TokenId>, start: u32, id: u64) -> StepPlan {
        let end = start as usize + tokens.len();
        StepPlan {
            step_id: id,
            seqs: vec![SeqStep {
                seq: SeqId(seq),
                tokens,
                start_pos: start,
                block_table: (0..end.div_ceil(16) as u32).collect(),
                sampling: SamplingParams {
                    seed: 5,
                    ..SamplingParams::default()
                },
                sample: true,
                logprobs: Some(2),
                cached_prefix: Vec::new(),
                allowed: None,
                draft: Vec::new(),
                embed: None,
                prompt_logprobs: None,
            }],
            free: vec![],
            copy_blocks: vec![],
            forks: vec![],
        }
    }

    #[test]
    fn same_history_same_token_even_after_recompute() {
        let mut e = SimEngine::new(opts(), tiny_model_info());
        let prompt = vec![1, 50, 51, 52];
        let p1 = step(1, prompt.clone(), 0, 1);
        e.validate(&p1).expect("valid");
        let t1 = e.run(&p1).results[0].token;
        let p2 = step(1, vec![t1], 4, 2);
        e.validate(&p2).expect("valid");
        let t2 = e.run(&p2).results[0].token;
        // Preempted and recomputed from scratch: the same next token.
        let mut all = prompt.clone();
        all.push(t1);
        let p3 = step(1, all, 0, 3);
        e.validate(&p3).expect("valid");
        assert_eq!(e.run(&p3).results[0].token, t2);
        // Another engine, same history: same token (no hidden state).
        let mut f = SimEngine::new(opts(), tiny_model_info());
        let mut all2 = prompt;
        all2.push(t1);
        assert_eq!(f.run(&step(9, all2, 0, 1)).results[0].token, t2);
    }

    #[test]
    fn multi_byte_symbols_are_finished_from_the_history() {
        let mut e = SimEngine::new(opts(), tiny_model_info());
        let crab = "🦀".as_bytes();
        let fed = vec![1, crab[0] as u32 + 3, crab[1] as u32 + 3];
        let done = e.run(&step(1, fed, 0, 1));
        assert_eq!(done.results[0].token, crab[2] as u32 + 3);
    }

    #[test]
    fn plans_beyond_the_history_or_rewriting_it_are_rejected() {
        let mut e = SimEngine::new(opts(), tiny_model_info());
        let err = e.validate(&step(1, vec![5], 3, 1)).expect_err("beyond");
        assert!(err.contains("holds 0 tokens"), "{err}");
        let t = e.run(&step(1, vec![1, 10, 11], 0, 1)).results[0].token;
        let err = e
            .validate(&step(1, vec![1, 12], 0, 2))
            .expect_err("rewrite");
        assert!(err.contains("re-fed"), "{err}");
        let wrong = if t == 10 { 11 } else { 10 };
        let err = e
            .validate(&step(1, vec![wrong], 3, 2))
            .expect_err("sampled");
        assert!(err.contains("sampled"), "{err}");
        let err = e.validate(&step(1, vec![t], 3, 1)).expect_err("step id");
        assert!(err.contains("does not increase"), "{err}");
        let mut overlap = step(1, vec![t], 3, 2);
        let mut other = overlap.seqs[0].clone();
        other.seq = SeqId(2);
        other.start_pos = 0;
        overlap.seqs.push(other);
        let err = e.validate(&overlap).expect_err("overlap");
        assert!(err.contains("both"), "{err}");
        let mut freed = step(1, vec![t], 3, 2);
        freed.free.push(SeqId(1));
        assert!(e.validate(&freed).is_err(), "freed state is gone");
    }

    #[test]
    fn prompt_scores_are_the_prefixes_scores_however_chunked() {
        let prompt: Vec<TokenId> = vec![1, 50, 51, 52, 53];
        let want: Vec<TokenLogprobs> = (1..prompt.len())
            .map(|p| prompt_score(&prompt[..p], prompt[p], 2))
            .collect();
        let scored = |mut plan: StepPlan| {
            plan.seqs[0].prompt_logprobs = Some(2);
            plan
        };
        // Whole.
        let mut e = SimEngine::new(opts(), tiny_model_info());
        let whole = e.run(&scored(step(1, prompt.clone(), 0, 1)));
        assert_eq!(whole.results[0].prompt_logprobs.as_ref(), Some(&want));
        // In two chunks, the first without sampling.
        let mut e = SimEngine::new(opts(), tiny_model_info());
        let mut first = scored(step(1, prompt[..2].to_vec(), 0, 1));
        first.seqs[0].sample = false;
        e.validate(&first).expect("valid");
        assert!(e.run(&first).results.is_empty());
        let second = scored(step(1, prompt[2..].to_vec(), 2, 2));
        e.validate(&second).expect("valid");
        let done = e.run(&second);
        assert_eq!(done.results[0].prompt_logprobs.as_ref(), Some(&want));
        assert_eq!(done.results[0].token, whole.results[0].token);
        // The scores depend on the token scored and what came before it.
        assert_ne!(want[0], prompt_score(&prompt[..1], 99, 2));
        assert_ne!(want[1], prompt_score(&[1, 49], prompt[2], 2));
    }

    #[test]
    fn scored_or_embedded_chunks_out_of_order_are_rejected() {
        let mut e = SimEngine::new(opts(), tiny_model_info());
        let mut plain = step(1, vec![1, 50], 0, 1);
        plain.seqs[0].sample = false;
        e.run(&plain);
        let mut late = step(1, vec![51], 2, 2);
        late.seqs[0].prompt_logprobs = Some(1);
        let err = e.validate(&late).expect_err("scored after a plain chunk");
        assert!(err.contains("only 0 positions"), "{err}");
        late.seqs[0].prompt_logprobs = None;
        late.seqs[0].embed = Some(Pooling::Mean);
        let err = e.validate(&late).expect_err("embedded after a plain chunk");
        assert!(err.contains("embedded from position 2"), "{err}");
        let mut drafted = step(2, vec![1, 50], 0, 2);
        drafted.seqs[0].prompt_logprobs = Some(1);
        drafted.seqs[0].draft = vec![51];
        let err = e.validate(&drafted).expect_err("scored with a draft");
        assert!(err.contains("draft of 1"), "{err}");
        let mut both = step(3, vec![1], 0, 2);
        both.seqs[0].prompt_logprobs = Some(1);
        both.seqs[0].embed = Some(Pooling::Last);
        assert!(e.validate(&both).is_err(), "both scored and embedded");
        // Scored from 0, then going on unscored before its first token.
        let mut first = step(4, vec![1, 50], 0, 2);
        first.seqs[0].prompt_logprobs = Some(1);
        first.seqs[0].sample = false;
        e.run(&first);
        let unscored = step(4, vec![51], 2, 3);
        let err = e.validate(&unscored).expect_err("scores cut short");
        assert!(err.contains("goes on unscored"), "{err}");
    }

    #[test]
    fn embeddings_are_the_prompts_vector_and_add_no_token() {
        let mut e = SimEngine::new(opts(), tiny_model_info());
        let prompt: Vec<TokenId> = vec![1, 60, 61];
        let mut plan = step(1, prompt.clone(), 0, 1);
        plan.seqs[0].embed = Some(Pooling::Last);
        plan.seqs[0].logprobs = None;
        let done = e.run(&plan);
        let size = tiny_model_info().embedding_size as usize;
        let want = embedding_of(Pooling::Last, &prompt, size);
        assert_eq!(done.results[0].embedding.as_ref(), Some(&want));
        assert_eq!(want.len(), size);
        assert_ne!(want, embedding_of(Pooling::Mean, &prompt, size));
        assert_ne!(want, embedding_of(Pooling::Last, &prompt[..2], size));
        assert_eq!(e.history(SeqId(1)), prompt.as_slice());
    }
}
