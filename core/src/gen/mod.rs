//! The generation machine shared by every dialect: queued, prefilling, decoding,
//! paused, finished; stop strings, incremental detokenisation.
//!
//! A [`Generation`] turns sampled tokens into text pieces and decides when it is
//! finished. It never talks to the scheduler or the wire: the Host does that.

pub mod beam;
pub mod detok;
pub mod hold;
pub mod request;
pub mod sentence;
pub mod stop;

use crate::conn::{ConnId, Dialect};
use crate::engine::{SeqId, SeqResult, TokenId, TokenLogprobs};
use crate::filter::FilterGuard;
use crate::params::GenParams;
use crate::text::TextCodec;
use crate::time::Instant;

use detok::IncrementalDecoder;
pub use hold::{HoldReason, Holds};
pub use request::{Failure, FailureKind, GenRequest, KeptKv, RequestPart, StartError};
use stop::StopMatcher;

/// Why a generation ended normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// A stop string or an end-of-sequence token.
    Stop,
    /// Stopped by the client (control stop, interrupt, cancel, disconnect).
    Cancelled,
    /// A deadline (pause timeout) ended it.
    Timeout,
    /// A content-filter `stop` rule matched what it was about to say
    /// ([`crate::filter`]); the matched text was never released.
    ContentFilter,
}

impl FinishReason {
    /// The `generate` dialect's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Timeout => "timeout",
            FinishReason::ContentFilter => "content_filter",
        }
    }
}

/// Where a generation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenState {
    /// Waiting for admission.
    Queued,
    /// Admitted; prompt being computed.
    Prefilling,
    /// Producing tokens.
    Decoding,
    /// Paused by its client (reported by [`Generation::phase`]; the underlying
    /// state is kept so resume continues where it was).
    Paused,
    /// Ended.
    Finished,
}

/// Text released by one sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenPiece {
    /// The sampled token, if this piece comes from one.
    pub token_id: Option<TokenId>,
    /// Text to stream (possibly empty: held back or an incomplete character).
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<TokenLogprobs>,
    /// Set when this token ends the generation.
    pub finish: Option<FinishReason>,
    /// An embedding generation's ([`GenRequest::embed`]) pooled vector, as
    /// the engine returned it (not normalized): its one and last piece,
    /// with no token and no text.
    pub embedding: Option<Vec<f32>>,
    /// With [`GenRequest::prompt_logprobs`], on the first piece: one entry
    /// per prompt token after the first, in order, as the engine scored
    /// them ([`crate::engine::SeqResult::prompt_logprobs`]).
    pub prompt_logprobs: Option<Vec<TokenLogprobs>>,
}

/// One request's generation state.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Its sequence id (also the scheduler's and engine's key).
    pub id: SeqId,
    /// The connection that owns it.
    pub owner: ConnId,
    /// Its owner's dialect (metrics and events name it).
    pub dialect: Dialect,
    /// Prompt token ids (as fed to the model, BOS included).
    pub prompt_ids: Vec<TokenId>,
    /// Generated token ids (end-of-sequence token included when one came).
    pub out_ids: Vec<TokenId>,
    /// Effective parameters.
    pub params: GenParams,
    /// The sampler seed actually used.
    pub seed: u64,
    /// Alternatives per token for logprobs, if asked for.
    pub logprobs: Option<u8>,
    /// Text streamed so far.
    pub text: String,
    /// Where it is.
    pub state: GenState,
    /// Why it is held (client pause, full outbound queue, flow window): not
    /// scheduled while any reason remains.
    pub holds: Holds,
    /// Results that arrived during a client pause, applied on resume.
    pub pending: Vec<SeqResult>,
    /// When the request arrived.
    pub created_at: Instant,
    /// When its first token was produced.
    pub first_token_at: Option<Instant>,
    /// When its latest token was produced.
    pub last_token_at: Option<Instant>,
    /// Last queue position reported to the client.
    pub reported_position: Option<u32>,
    /// A raw generation ([`GenRequest::raw`]): never ends by itself.
    pub raw: bool,
    /// Keep its KV blocks when it completes ([`crate::dialect::Cx::keep_kv`]).
    pub keep_kv: bool,
    /// The organisation its tokens are charged to (a key's, outside `cai`,
    /// which charges its own), when its owner has rate limits.
    pub charged_org: Option<(String, crate::keys::OrgLimits)>,
    /// Generated tokens it took over from the generation it was forked
    /// from (a beam's copy): charged to that one, so not again to this.
    pub inherited_tokens: u32,
    /// Prompt tokens whose K/V came from the prefix cache when it was
    /// admitted (0 before, and without a hit).
    pub cached_tokens: u32,
    /// The content-filter rule that ended it, if one did (its name only).
    pub filtered_by: Option<String>,
    /// The stop string that ended it, if one did (Anthropic's
    /// `stop_sequence`).
    pub stop_sequence: Option<String>,
    eos_ids: Vec<TokenId>,
    detok: IncrementalDecoder,
    stop: StopMatcher,
    /// Holds back text a content-filter `stop` rule could still match.
    filter: Option<FilterGuard>,
}

impl Generation {
    /// A new queued generation.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: SeqId,
        owner: ConnId,
        dialect: Dialect,
        prompt_ids: Vec<TokenId>,
        params: GenParams,
        seed: u64,
        logprobs: Option<u8>,
        eos_ids: Vec<TokenId>,
        now: Instant,
    ) -> Self {
        let detok = IncrementalDecoder::new(&prompt_ids);
        let stop = StopMatcher::new(params.stop.clone());
        Generation {
            id,
            owner,
            dialect,
            prompt_ids,
            out_ids: Vec::new(),
            params,
            seed,
            logprobs,
            text: String::new(),
            state: GenState::Queued,
            holds: Holds::NONE,
            pending: Vec::new(),
            created_at: now,
            first_token_at: None,
            last_token_at: None,
            reported_position: None,
            raw: false,
            keep_kv: false,
            charged_org: None,
            inherited_tokens: 0,
            cached_tokens: 0,
            filtered_by: None,
            stop_sequence: None,
            eos_ids,
            detok,
            stop,
            filter: None,
        }
    }

    /// Guards its text with a content filter's `stop` rules (before its
    /// first token).
    pub fn set_filter(&mut self, guard: FilterGuard) {
        self.filter = Some(guard);
    }

    /// Where it is, with a client pause shown as [`GenState::Paused`].
    pub fn phase(&self) -> GenState {
        if self.client_paused() && self.state != GenState::Finished {
            GenState::Paused
        } else {
            self.state
        }
    }

    /// True while its client has it paused (results are then kept back).
    pub fn client_paused(&self) -> bool {
        self.holds.contains(HoldReason::ClientPause)
    }

    /// True when the scheduler may compute it.
    pub fn runnable(&self) -> bool {
        self.holds.is_empty() && self.state != GenState::Finished
    }

    /// Replaces the parameters (a `modify`); takes effect from the next token.
    pub fn set_params(&mut self, params: GenParams) {
        self.stop.set_stops(params.stop.clone());
        self.params = params;
    }

    /// Applies one sampled token: decodes it, checks stop strings, end of
    /// sequence and `max_tokens`.
    pub fn on_token(
        &mut self,
        codec: &dyn TextCodec,
        result: SeqResult,
        now: Instant,
    ) -> TokenPiece {
        let token = result.token;
        if self.first_token_at.is_none() {
            self.first_token_at = Some(now);
        }
        self.last_token_at = Some(now);
        if let Some(vector) = result.embedding {
            self.state = GenState::Finished;
            return TokenPiece {
                token_id: None,
                text: String::new(),
                logprobs: None,
                finish: Some(FinishReason::Stop),
                embedding: Some(vector),
                prompt_logprobs: None,
            };
        }
        let prompt_logprobs = result.prompt_logprobs;
        if self.params.max_tokens == 0 {
            // A scored prompt with nothing to generate: its scores are the
            // answer; the token drawn after it is not the generation's.
            self.state = GenState::Finished;
            return TokenPiece {
                token_id: None,
                text: String::new(),
                logprobs: None,
                finish: Some(FinishReason::Length),
                embedding: None,
                prompt_logprobs,
            };
        }
        self.out_ids.push(token);
        self.state = GenState::Decoding;
        if self.raw {
            return TokenPiece {
                token_id: Some(token),
                text: String::new(),
                logprobs: result.logprobs,
                finish: None,
                embedding: None,
                prompt_logprobs,
            };
        }
        let mut text = String::new();
        let mut finish = None;
        // Text goes through the content filter first, then the stop
        // strings: what the filter holds back is checked against the stop
        // strings of the moment it is released.
        let eos = self.eos_ids.contains(&token) && !self.params.ignore_eos;
        if eos || self.params.stop_token_ids.contains(&token) {
            let (tail, reason) = self.release_at_end(codec, FinishReason::Stop);
            text.push_str(&tail);
            finish = Some(reason);
        } else {
            let piece = self.detok.push(codec, token);
            let guarded = self.guard(&piece, false);
            let outcome = self.stop.push_checking(&guarded, self.past_min_tokens());
            text.push_str(&outcome.emit);
            if outcome.stopped {
                self.name_stop(outcome.matched);
                text.push_str(self.included_stop());
                finish = Some(FinishReason::Stop);
            } else if self.filtered_by.is_some() {
                // What the stop strings held is text before the match.
                text.push_str(&self.stop.finish());
                finish = Some(FinishReason::ContentFilter);
            } else if self.out_ids.len() >= self.params.max_tokens as usize {
                let (tail, reason) = self.release_at_end(codec, FinishReason::Length);
                text.push_str(&tail);
                finish = Some(reason);
            }
        }
        self.text.push_str(&text);
        if finish.is_some() {
            self.state = GenState::Finished;
        }
        TokenPiece {
            token_id: Some(token),
            text,
            logprobs: result.logprobs,
            finish,
            embedding: None,
            prompt_logprobs,
        }
    }

    /// Ends the generation from outside (cancel, timeout): releases held
    /// text (but never what a content-filter rule matches).
    pub fn end(&mut self, codec: &dyn TextCodec, reason: FinishReason) -> TokenPiece {
        // A stop string found in the released text still cuts it there, but
        // the reason stays the caller's: the generation did not end on it.
        let text = if self.state == GenState::Finished {
            String::new()
        } else {
            let (tail, _) = self.flush(codec);
            self.stop_sequence = None;
            tail
        };
        self.text.push_str(&text);
        self.state = GenState::Finished;
        TokenPiece {
            token_id: None,
            text,
            logprobs: None,
            finish: Some(reason),
            embedding: None,
            prompt_logprobs: None,
        }
    }

    /// Releases the text still held at the end: the decoder's last bytes
    /// and what the content filter held back (less anything one of its rules
    /// matches) go through the stop strings like any other text, so a stop
    /// string first seen here still cuts the text and names itself in
    /// [`Generation::stop_sequence`] (true returned: it ended on it).
    fn flush(&mut self, codec: &dyn TextCodec) -> (String, bool) {
        let tail = self.detok.finish(codec);
        let guarded = self.guard(&tail, true);
        let check = self.past_min_tokens();
        let outcome = self.stop.push_checking(&guarded, check);
        let mut out = outcome.emit;
        if outcome.stopped {
            self.name_stop(outcome.matched);
            out.push_str(self.included_stop());
        }
        out.push_str(&self.stop.finish());
        (out, outcome.stopped)
    }

    /// [`Generation::flush`] for a generation that ends by itself, and why
    /// it ended: on a stop string in the released text, on a content-filter
    /// rule, or for `otherwise` (its end-of-sequence token, its length).
    fn release_at_end(
        &mut self,
        codec: &dyn TextCodec,
        otherwise: FinishReason,
    ) -> (String, FinishReason) {
        let (tail, stopped) = self.flush(codec);
        let reason = match (stopped, self.filtered_by.is_some()) {
            (true, _) => FinishReason::Stop,
            (false, true) => FinishReason::ContentFilter,
            (false, false) => otherwise,
        };
        (tail, reason)
    }

    /// The stop string that ended it, where the text keeps it (vLLM's
    /// `include_stop_str_in_output`); else nothing.
    fn included_stop(&self) -> &str {
        match &self.stop_sequence {
            Some(s) if self.params.include_stop_str => s,
            _ => "",
        }
    }

    /// Records the stop string at `matched` as the one that ended it.
    fn name_stop(&mut self, matched: Option<usize>) {
        self.stop_sequence = matched.and_then(|i| self.stop.stop(i)).map(str::to_string);
    }

    /// Whether stop strings may end it: more than `min_tokens` generated
    /// (vLLM's rule; the engine holds the end-of-sequence tokens back as
    /// long).
    fn past_min_tokens(&self) -> bool {
        self.out_ids.len() > self.params.min_tokens as usize
    }

    /// Passes text through the content filter's guard (`at_end`: the text
    /// ends here); a match sets [`Generation::filtered_by`].
    fn guard(&mut self, text: &str, at_end: bool) -> String {
        let Some(g) = self.filter.as_mut() else {
            return text.to_string();
        };
        let r = if at_end {
            g.push_last(text)
        } else {
            g.push(text)
        };
        if let Some(rule) = r.matched {
            self.filtered_by.get_or_insert(rule);
        }
        r.emit
    }

    /// Replaces the last generated token (a beam continuing with another
    /// token than the one sampled). Raw generations only: no text was decoded.
    pub fn set_last_token(&mut self, token: TokenId) -> bool {
        match self.out_ids.last_mut() {
            Some(t) if self.raw => {
                *t = token;
                true
            }
            _ => false,
        }
    }

    /// Prompt tokens, for usage.
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt_ids.len() as u32
    }

    /// Generated tokens, for usage.
    pub fn completion_tokens(&self) -> u32 {
        self.out_ids.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ByteCodec, BYTE_EOS};

    fn gen(stop: &[&str], max_tokens: u32) -> Generation {
        let mut p = GenParams::defaults(max_tokens);
        p.stop = stop.iter().map(|s| s.to_string()).collect();
        let prompt = ByteCodec.encode("Q: ", true).expect("encode");
        Generation::new(
            SeqId(1),
            ConnId(1),
            Dialect::Generate,
            prompt,
            p,
            0,
            None,
            vec![BYTE_EOS],
            Instant::ZERO,
        )
    }

    fn feed(g: &mut Generation, text: &str) -> Vec<TokenPiece> {
        text.bytes()
            .map(|b| {
                g.on_token(
                    &ByteCodec,
                    SeqResult {
                        seq: g.id,
                        token: b as u32 + 3,
                        logprobs: None,
                        embedding: None,
                        prompt_logprobs: None,
                    },
                    Instant::ZERO,
                )
            })
            .take_while(|_| true)
            .collect()
    }

    #[test]
    fn stop_string_ends_generation_and_is_not_in_text() {
        let mut g = gen(&["END"], 100);
        let pieces = feed(&mut g, "abcEND");
        assert_eq!(
            pieces.last().and_then(|p| p.finish),
            Some(FinishReason::Stop)
        );
        assert_eq!(g.text, "abc");
        let streamed: String = pieces.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(streamed, "abc");
        assert_eq!(g.stop_sequence.as_deref(), Some("END"), "it names the stop");
        let mut g = gen(&["END"], 3);
        feed(&mut g, "abcEND");
        assert_eq!(g.stop_sequence, None, "ended by its length");
    }

    #[test]
    fn under_min_tokens_stop_strings_do_not_end_it_as_in_vllm() {
        // min_tokens 4: "END" in the first four tokens is text; one that
        // ends at the fifth token or later stops it, even begun before.
        let with_min = |min_tokens: u32| {
            let mut g = gen(&["END"], 100);
            g.set_params(GenParams {
                min_tokens,
                ..g.params.clone()
            });
            g
        };
        let mut g = with_min(4);
        let pieces = feed(&mut g, "ENDxEND");
        assert_eq!(pieces[6].finish, Some(FinishReason::Stop));
        assert_eq!(g.text, "ENDx");
        let mut g = with_min(4);
        let pieces = feed(&mut g, "abcEND");
        assert_eq!(
            (pieces[5].finish, g.text.as_str()),
            (Some(FinishReason::Stop), "abc")
        );
        let mut g = with_min(0);
        let pieces = feed(&mut g, "END");
        assert_eq!(
            (pieces[2].finish, g.text.as_str()),
            (Some(FinishReason::Stop), "")
        );
    }

    #[test]
    fn max_tokens_ends_with_length_and_flushes_held_text() {
        let mut g = gen(&["xyz"], 4);
        let pieces = feed(&mut g, "abxy");
        assert_eq!(pieces[3].finish, Some(FinishReason::Length));
        assert_eq!(g.text, "abxy");
        assert_eq!(g.completion_tokens(), 4);
    }

    #[test]
    fn eos_ends_with_stop_and_adds_no_text() {
        let mut g = gen(&[], 10);
        feed(&mut g, "hi");
        let p = g.on_token(
            &ByteCodec,
            SeqResult {
                seq: g.id,
                token: BYTE_EOS,
                logprobs: None,
                embedding: None,
                prompt_logprobs: None,
            },
            Instant::ZERO,
        );
        assert_eq!(p.finish, Some(FinishReason::Stop));
        assert_eq!(p.text, "");
        assert_eq!(g.text, "hi");
        assert_eq!(g.completion_tokens(), 3);
    }

    #[test]
    fn with_ignore_eos_an_eos_adds_no_text_and_max_tokens_ends_it() {
        let mut g = gen(&[], 4);
        g.set_params(GenParams {
            ignore_eos: true,
            ..g.params.clone()
        });
        feed(&mut g, "hi");
        let eos = SeqResult {
            seq: g.id,
            token: BYTE_EOS,
            logprobs: None,
            embedding: None,
            prompt_logprobs: None,
        };
        let p = g.on_token(&ByteCodec, eos.clone(), Instant::ZERO);
        assert_eq!((p.finish, p.text.as_str()), (None, ""));
        let p = g.on_token(&ByteCodec, eos, Instant::ZERO);
        assert_eq!(p.finish, Some(FinishReason::Length));
        assert_eq!((g.text.as_str(), g.completion_tokens()), ("hi", 4));
    }

    #[test]
    fn a_stop_token_id_ends_with_stop_and_adds_no_text_even_with_ignore_eos() {
        let mut g = gen(&[], 10);
        g.set_params(GenParams {
            ignore_eos: true,
            stop_token_ids: vec![b'!' as TokenId + 3],
            ..g.params.clone()
        });
        let pieces = feed(&mut g, "hi!");
        assert_eq!(pieces[2].finish, Some(FinishReason::Stop));
        assert_eq!((pieces[2].text.as_str(), g.text.as_str()), ("", "hi"));
    }

    #[test]
    fn with_include_stop_str_the_stop_string_ends_the_text() {
        let mut g = gen(&["END", "ENOUGH"], 40);
        g.set_params(GenParams {
            include_stop_str: true,
            ..g.params.clone()
        });
        let pieces = feed(&mut g, "abc ENOUGH");
        let last = pieces.len() - 1;
        assert_eq!(pieces[last].finish, Some(FinishReason::Stop));
        assert_eq!(g.text, "abc ENOUGH", "the stop string kept");
        let streamed: String = pieces[..=last].iter().map(|p| p.text.as_str()).collect();
        assert_eq!(streamed, g.text);
        assert_eq!(g.stop_sequence.as_deref(), Some("ENOUGH"));
        // Without it, the text ends before the stop string.
        let mut plain = gen(&["END", "ENOUGH"], 40);
        feed(&mut plain, "abc ENOUGH");
        assert_eq!(plain.text, "abc ");
    }

    /// A generation whose content filter holds back text that could still
    /// begin its `stop` rule "end of story".
    fn filtered_gen(stop: &[&str], max_tokens: u32) -> Generation {
        let rule = crate::filter::FilterRule {
            name: "story".into(),
            pattern: "end of story".into(),
            action: crate::filter::FilterAction::Stop,
        };
        let filter = crate::filter::ContentFilter::new(vec![rule]).expect("rule");
        let mut g = gen(stop, max_tokens);
        g.set_filter(FilterGuard::new(std::sync::Arc::new(filter)));
        g
    }

    #[test]
    fn a_stop_string_first_seen_when_held_text_is_released_at_the_end_names_itself() {
        // The filter holds "end" (it may begin "end of story"), so the stop
        // string "end" meets the stop matcher only when the end releases it.
        let eos = |g: &mut Generation| {
            let result = SeqResult {
                seq: g.id,
                token: BYTE_EOS,
                logprobs: None,
                embedding: None,
                prompt_logprobs: None,
            };
            g.on_token(&ByteCodec, result, Instant::ZERO)
        };
        let mut g = filtered_gen(&["end"], 100);
        let streamed: String = feed(&mut g, "abc end")
            .iter()
            .map(|p| p.text.clone())
            .collect();
        assert_eq!(streamed, "abc ", "the filter holds what may begin its rule");
        let p = eos(&mut g);
        assert_eq!((p.finish, p.text.as_str()), (Some(FinishReason::Stop), ""));
        assert_eq!(
            g.stop_sequence.as_deref(),
            Some("end"),
            "the stop names itself"
        );
        assert_eq!((g.text.as_str(), g.filtered_by.as_deref()), ("abc ", None));

        // The last token allowed: the text ended on the stop string, not
        // on its length.
        let mut g = filtered_gen(&["end"], 7);
        let pieces = feed(&mut g, "abc end");
        assert_eq!(pieces[6].finish, Some(FinishReason::Stop));
        assert_eq!(
            (g.text.as_str(), g.stop_sequence.as_deref()),
            ("abc ", Some("end"))
        );

        // No stop string in the released text: the reasons stay as they were.
        let mut g = filtered_gen(&["zzz"], 7);
        let pieces = feed(&mut g, "abc end");
        assert_eq!(pieces[6].finish, Some(FinishReason::Length));
        assert_eq!(
            (g.text.as_str(), g.stop_sequence.as_deref()),
            ("abc end", None)
        );
        let mut g = filtered_gen(&["end"], 100);
        feed(&mut g, "abc end");
        let p = g.end(&ByteCodec, FinishReason::Cancelled);
        assert_eq!(
            (p.finish, g.text.as_str()),
            (Some(FinishReason::Cancelled), "abc ")
        );
        assert_eq!(g.stop_sequence, None, "a cancel did not end on the stop");
    }

    #[test]
    fn cancel_releases_held_partial_stop_prefix() {
        let mut g = gen(&["STOP"], 10);
        feed(&mut g, "aST");
        assert_eq!(g.text, "a");
        let p = g.end(&ByteCodec, FinishReason::Cancelled);
        assert_eq!(p.text, "ST");
        assert_eq!(g.text, "aST");
    }

    #[test]
    fn phase_moves_queued_decoding_paused_finished() {
        let mut g = gen(&[], 3);
        assert_eq!(g.phase(), GenState::Queued);
        feed(&mut g, "a");
        assert_eq!(g.phase(), GenState::Decoding);
        g.holds.insert(HoldReason::ClientPause);
        assert_eq!(g.phase(), GenState::Paused);
        assert!(!g.runnable());
        g.holds.insert(HoldReason::OutboundFull);
        g.holds.remove(HoldReason::ClientPause);
        assert_eq!(
            g.phase(),
            GenState::Decoding,
            "a slow reader is no client pause"
        );
        assert!(!g.runnable(), "still held by the full queue");
        g.holds.remove(HoldReason::OutboundFull);
        assert!(g.runnable());
        feed(&mut g, "bc");
        assert_eq!(g.phase(), GenState::Finished);
    }
}
