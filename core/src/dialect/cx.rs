//! [`Cx`]: everything a dialect machine may do (send, close, start and steer
//! generations, ask for text and job checks, keep host-wide state, set
//! timers), over the [`HostPort`] that the Host implements.

use serde_json::Value;

use super::state::{DialectState, HostWide};
use crate::api::{ConnId, Dialect, Event, FeedbackRecord, JobCheckId, Output, Transport};
use crate::config::HostConfig;
use crate::engine::{ModelInfo, SeqId, TokenId};
use crate::filter::{FilterAction, FilterGuard};
use crate::gen::{FinishReason, GenRequest, Generation, HoldReason, KeptKv, StartError};
use crate::params::GenParams;
use crate::principal::Principal;
use crate::rate::RateLimits;
use crate::rng::HostRng;
use crate::text::{min_tokens_for_bytes, ChatMessage, TextCodec, TextJobId, TextWork};
use crate::time::Instant;

/// What the Host offers its dialect machines. Implemented by the Host; a
/// dialect only sees it through [`Cx`].
pub trait HostPort {
    /// Queues an output.
    fn push_output(&mut self, out: Output);
    /// Closes `conn` with `code` once the current callback returns.
    fn request_close(&mut self, conn: ConnId, code: u16, reason: &str);
    /// The Host's settings.
    fn config(&self) -> &HostConfig;
    /// The served model (dialects run only once it is loaded).
    fn model_info(&self) -> &ModelInfo;
    /// Its tokenizer and chat template.
    fn codec(&self) -> &dyn TextCodec;
    /// The Host's random source (ids, seeds): cryptographic.
    fn rng(&mut self) -> &mut HostRng;
    /// Hands out a text job for `conn`; its frames wait for the answer.
    fn tokenize(&mut self, conn: ConnId, work: TextWork) -> TextJobId;
    /// Asks the shell to verify `job_id`; `conn`'s frames wait for the answer.
    fn verify_job(
        &mut self,
        conn: ConnId,
        dialect: Dialect,
        job_id: String,
        public_key: Option<String>,
    ) -> JobCheckId;
    /// Starts a generation owned by `conn`, which acts as `principal`.
    fn start(
        &mut self,
        now: Instant,
        conn: ConnId,
        dialect: Dialect,
        principal: &Principal,
        req: GenRequest,
    ) -> Result<SeqId, StartError>;
    /// A live generation.
    fn generation(&self, id: SeqId) -> Option<&Generation>;
    /// Ends a generation; its last piece comes through `on_token`.
    fn end(&mut self, id: SeqId, reason: FinishReason) -> bool;
    /// Adds a hold reason to a generation.
    fn hold(&mut self, now: Instant, id: SeqId, reason: HoldReason) -> bool;
    /// Removes a hold reason from a generation.
    fn release(&mut self, id: SeqId, reason: HoldReason) -> bool;
    /// Starts a copy of a live generation sharing its KV blocks.
    fn fork(&mut self, src: SeqId) -> Option<SeqId>;
    /// Replaces the last token of a raw generation before it is computed.
    fn set_last_token(&mut self, id: SeqId, token: TokenId) -> bool;
    /// Keeps a generation's KV blocks when it completes.
    fn keep_kv(&mut self, id: SeqId) -> Option<KeptKv>;
    /// Frees KV blocks kept by `keep_kv`.
    fn drop_kv(&mut self, kv: KeptKv);
    /// Replaces a generation's parameters.
    fn modify(&mut self, id: SeqId, params: GenParams) -> Result<(), StartError>;
    /// The dialects' host-wide state.
    fn dialect_state(&mut self) -> &mut DialectState;
    /// Connections open on `dialect`'s path over `transport`.
    fn open_connections(&self, dialect: Dialect, transport: Transport) -> u32;
    /// Sets (or moves) `conn`'s timer `tag`.
    fn set_timer(&mut self, conn: ConnId, tag: u8, at: Instant);
    /// Cancels `conn`'s timer `tag`.
    fn cancel_timer(&mut self, conn: ConnId, tag: u8);
}

/// What a dialect machine may do, for one connection at one instant.
pub struct Cx<'a> {
    /// Current time.
    pub now: Instant,
    /// The connection being served.
    pub conn: ConnId,
    /// Its dialect.
    pub dialect: Dialect,
    /// Its transport.
    pub transport: Transport,
    /// Who owns what it keeps: every lookup of kept state goes through it.
    pub principal: &'a Principal,
    port: &'a mut dyn HostPort,
}

impl<'a> Cx<'a> {
    /// A context for `conn` (the Host makes these).
    pub fn new(
        now: Instant,
        conn: ConnId,
        dialect: Dialect,
        transport: Transport,
        principal: &'a Principal,
        port: &'a mut dyn HostPort,
    ) -> Cx<'a> {
        Cx {
            now,
            conn,
            dialect,
            transport,
            principal,
            port,
        }
    }

    /// Sends a JSON frame to this connection.
    pub fn send(&mut self, v: Value) {
        self.send_text(v.to_string());
    }

    /// Sends a text frame to this connection.
    pub fn send_text(&mut self, text: String) {
        self.port.push_output(Output::Send {
            conn: self.conn,
            text,
        });
    }

    /// Closes this connection with `code` after what was already sent.
    pub fn close(&mut self, code: u16, reason: &str) {
        self.port.request_close(self.conn, code, reason);
    }

    /// Counts an error code sent to the client.
    pub fn count_error(&mut self, code: &'static str) {
        let dialect = self.dialect;
        self.port
            .push_output(Output::Event(Event::Error { dialect, code }));
    }

    /// The Host's settings.
    pub fn config(&self) -> &HostConfig {
        self.port.config()
    }

    /// The served model. Dialects only run once it is loaded (except
    /// [`super::DialectConn::on_open`], which must not call this).
    pub fn model(&self) -> &ModelInfo {
        self.port.model_info()
    }

    /// The model's tokenizer and chat template.
    pub fn codec(&self) -> &dyn TextCodec {
        self.port.codec()
    }

    /// Wall-clock milliseconds since the unix epoch.
    pub fn unix_ms(&self) -> u64 {
        self.port.config().epoch_unix_ms + self.now.as_millis()
    }

    /// A fresh `prefix<uuid7>` id.
    pub fn new_id(&mut self, prefix: &str) -> String {
        let ms = self.unix_ms();
        crate::ids::prefixed(prefix, ms, self.port.rng())
    }

    /// Has a raw prompt tokenized off the Host's thread; the ids come back in
    /// [`super::DialectConn::on_text_done`], and until then this connection's
    /// frames wait. A prompt whose byte length alone shows that it cannot fit
    /// the context with `max_tokens` is refused at once, untokenized.
    pub fn encode_prompt(
        &mut self,
        text: String,
        max_tokens: u32,
    ) -> Result<TextJobId, StartError> {
        self.encode_text(text, max_tokens, true)
    }

    /// [`Cx::encode_prompt`] for a prompt that is cut to its last tokens
    /// once tokenized (vLLM's `truncate_prompt_tokens`): its length is
    /// not bounded here, only the content filter applies.
    pub fn encode_prompt_to_cut(&mut self, text: String) -> Result<TextJobId, StartError> {
        self.check_filter([text.as_str()])?;
        Ok(self.port.tokenize(
            self.conn,
            TextWork::Encode {
                text,
                add_special: true,
            },
        ))
    }

    /// [`Cx::encode_prompt`], with the tokenizer's special tokens (BOS)
    /// added only when `add_special` is set (vLLM's `add_special_tokens`).
    pub fn encode_text(
        &mut self,
        text: String,
        max_tokens: u32,
        add_special: bool,
    ) -> Result<TextJobId, StartError> {
        self.check_filter([text.as_str()])?;
        let context_len = self.model().context_len;
        let min_tokens =
            u32::try_from(min_tokens_for_bytes(self.codec(), text.len())).unwrap_or(u32::MAX);
        if u64::from(min_tokens) + u64::from(max_tokens) > u64::from(context_len) {
            return Err(StartError::PromptTooLong {
                bytes: text.len(),
                min_tokens,
                max_tokens,
                context_len,
            });
        }
        Ok(self
            .port
            .tokenize(self.conn, TextWork::Encode { text, add_special }))
    }

    /// Refuses a prompt given as token ids whose `text` (the ids decoded)
    /// a content-filter `refuse` rule matches, as [`Cx::encode_prompt`]
    /// refuses text ([`StartError::ContentFiltered`], the rule counted by
    /// name). Nothing else happens.
    pub fn check_prompt_text(&mut self, text: &str) -> Result<(), StartError> {
        self.check_filter([text])
    }

    /// Has a conversation rendered with the chat template and tokenized off
    /// the Host's thread, keeping the newest messages that fit
    /// ([`TextWork::Chat`]) in `max_tokens` prompt tokens; the answer comes
    /// back in [`super::DialectConn::on_text_done`].
    pub fn encode_chat(
        &mut self,
        messages: Vec<ChatMessage>,
        max_messages: usize,
        max_tokens: u32,
    ) -> Result<TextJobId, StartError> {
        self.encode_chat_with_tools(messages, max_messages, max_tokens, Vec::new())
    }

    /// [`Cx::encode_chat`] with functions offered to the model: the chat
    /// template renders them if it takes tools, else a system message
    /// describes them ([`crate::tools`]).
    pub fn encode_chat_with_tools(
        &mut self,
        messages: Vec<ChatMessage>,
        max_messages: usize,
        max_tokens: u32,
        tools: Vec<crate::tools::ToolDef>,
    ) -> Result<TextJobId, StartError> {
        let kwargs = crate::text::TemplateKwargs::new();
        self.encode_chat_templated(messages, max_messages, max_tokens, tools, kwargs)
    }

    /// [`Cx::encode_chat_with_tools`] with `template_kwargs` given to the
    /// chat template as variables (`chat_template_kwargs`).
    pub fn encode_chat_templated(
        &mut self,
        messages: Vec<ChatMessage>,
        max_messages: usize,
        max_tokens: u32,
        tools: Vec<crate::tools::ToolDef>,
        template_kwargs: crate::text::TemplateKwargs,
    ) -> Result<TextJobId, StartError> {
        // The kwargs' strings reach the prompt too.
        fn strings<'v>(v: &'v serde_json::Value, out: &mut Vec<&'v str>) {
            match v {
                serde_json::Value::String(s) => out.push(s),
                serde_json::Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
                serde_json::Value::Object(o) => o.values().for_each(|v| strings(v, out)),
                _ => {}
            }
        }
        let mut texts: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        template_kwargs
            .values()
            .for_each(|v| strings(v, &mut texts));
        self.check_filter(texts)?;
        Ok(self.port.tokenize(
            self.conn,
            TextWork::Chat {
                messages,
                max_messages,
                max_tokens,
                tools,
                template_kwargs,
            },
        ))
    }

    /// Refuses texts a content-filter `refuse` rule matches
    /// ([`StartError::ContentFiltered`]), counting the rule by name.
    fn check_filter<'t>(
        &mut self,
        texts: impl IntoIterator<Item = &'t str>,
    ) -> Result<(), StartError> {
        let Some(filter) = self.port.config().content_filter.clone() else {
            return Ok(());
        };
        for t in texts {
            if let Some(rule) = filter.refused(t) {
                let (dialect, rule) = (self.dialect, rule.name.clone());
                self.port.push_output(Output::Event(Event::ContentFiltered {
                    dialect,
                    rule: rule.clone(),
                    action: FilterAction::Refuse,
                }));
                return Err(StartError::ContentFiltered { rule });
            }
        }
        Ok(())
    }

    /// Runs the content filter's `stop` rules over a whole generated text
    /// that did not stream through a generation (a beam search's best
    /// hypothesis: beams are raw generations, which decode no text): the
    /// text before the first match, and the rule that matched, counted by
    /// name as a `stop`. The text as it is when no rule matches.
    pub fn filter_whole(&mut self, text: String) -> (String, Option<String>) {
        let Some(filter) = self.port.config().content_filter.clone() else {
            return (text, None);
        };
        let out = FilterGuard::new(filter).push_last(&text);
        let Some(rule) = out.matched else {
            return (text, None);
        };
        let dialect = self.dialect;
        self.port.push_output(Output::Event(Event::ContentFiltered {
            dialect,
            rule: rule.clone(),
            action: FilterAction::Stop,
        }));
        (out.emit, Some(rule))
    }

    /// Asks the shell's job verifier about `job_id`; the verdict comes back
    /// in [`super::DialectConn::on_job_verified`], and until then this
    /// connection's frames wait. With `public_key` (a job whose prompts are
    /// signed) the verifier sees the key, so it can refuse a key the job was
    /// not issued to.
    pub fn verify_job(&mut self, job_id: String, public_key: Option<String>) -> JobCheckId {
        let (conn, dialect) = (self.conn, self.dialect);
        self.port.verify_job(conn, dialect, job_id, public_key)
    }

    /// Starts a generation owned by this connection. With a key (outside
    /// `cai`, which admits its requests itself), or an address under
    /// anonymous limits, it is one request of the key's organisation (or the
    /// address), refused when its rate limit is reached, unless
    /// [`GenRequest::part`] says it is part of a request already admitted;
    /// its generated tokens are charged either way, and its prompt unless
    /// another choice of the same prompt was charged for it
    /// ([`crate::gen::RequestPart::SamePrompt`]).
    pub fn start(&mut self, req: GenRequest) -> Result<SeqId, StartError> {
        let (now, conn, dialect) = (self.now, self.conn, self.dialect);
        self.port.start(now, conn, dialect, self.principal, req)
    }

    /// A live generation.
    pub fn gen(&self, id: SeqId) -> Option<&Generation> {
        self.port.generation(id)
    }

    /// Ends a generation: its held text is released and its last piece (with
    /// `reason`) comes through [`super::DialectConn::on_token`] as soon as
    /// this callback returns, like any other ending. False if unknown.
    pub fn end(&mut self, id: SeqId, reason: FinishReason) -> bool {
        self.port.end(id, reason)
    }

    /// Pauses a generation for its client: not scheduled, results held until
    /// [`Cx::resume`]; ends with `timeout` after the pause timeout. Returns
    /// false if unknown.
    pub fn pause(&mut self, id: SeqId) -> bool {
        let now = self.now;
        self.port.hold(now, id, HoldReason::ClientPause)
    }

    /// Resumes a generation its client paused. Returns false if unknown.
    pub fn resume(&mut self, id: SeqId) -> bool {
        self.port.release(id, HoldReason::ClientPause)
    }

    /// Holds a generation for a dialect's flow window (not scheduled until
    /// [`Cx::open_window`]). Returns false if unknown.
    pub fn close_window(&mut self, id: SeqId) -> bool {
        let now = self.now;
        self.port.hold(now, id, HoldReason::FlowWindow)
    }

    /// Holds a generation until the generations it moves in step with catch
    /// up (a beam until its round is decided): not scheduled until
    /// [`Cx::release_for_siblings`], and, unlike a client's hold, not bounded
    /// by the pause timeout. Returns false if unknown.
    pub fn hold_for_siblings(&mut self, id: SeqId) -> bool {
        let now = self.now;
        self.port.hold(now, id, HoldReason::Siblings)
    }

    /// Releases a generation held by [`Cx::hold_for_siblings`]. Returns
    /// false if unknown.
    pub fn release_for_siblings(&mut self, id: SeqId) -> bool {
        self.port.release(id, HoldReason::Siblings)
    }

    /// Releases a generation held by [`Cx::close_window`]. Returns false if unknown.
    pub fn open_window(&mut self, id: SeqId) -> bool {
        self.port.release(id, HoldReason::FlowWindow)
    }

    /// Starts a copy of live generation `src` owned by this connection (a
    /// beam that continues another): the same tokens and state, its KV
    /// blocks shared copy-on-write through the step plan's block copies.
    /// `None` when `src` is unknown.
    pub fn fork(&mut self, src: SeqId) -> Option<SeqId> {
        self.port.fork(src)
    }

    /// Replaces the last token of raw generation `id` ([`GenRequest::raw`])
    /// while it is not computed yet: a beam continuing with another token
    /// than the one sampled. False otherwise.
    pub fn set_last_token(&mut self, id: SeqId, token: TokenId) -> bool {
        self.port.set_last_token(id, token)
    }

    /// Asks the Host to keep live generation `id`'s KV blocks when it
    /// completes (finishes with `stop` or `length`; any other ending frees
    /// them), so that a later [`GenRequest::reuse_kv`] continues from them
    /// without recomputing. The blocks are the first freed under memory
    /// pressure; free them with [`Cx::drop_kv`] once the handle is no longer
    /// wanted. `None` for an unknown or raw generation.
    pub fn keep_kv(&mut self, id: SeqId) -> Option<KeptKv> {
        self.port.keep_kv(id)
    }

    /// Frees KV blocks kept by [`Cx::keep_kv`]; nothing happens when they
    /// are already gone or were reused.
    pub fn drop_kv(&mut self, kv: KeptKv) {
        self.port.drop_kv(kv)
    }

    /// Replaces a generation's parameters from the next token on; refused
    /// (nothing changes) when its new length could never fit the KV cache.
    pub fn modify(&mut self, id: SeqId, params: GenParams) -> Result<(), StartError> {
        self.port.modify(id, params)
    }

    /// This dialect's host-wide state: the part of type `T` its row in
    /// [`super::registry::DIALECTS`] makes.
    ///
    /// # Panics
    /// When the row makes no `T`: a dialect asking for another's state, a
    /// bug that every test of the dialect meets on its first request.
    pub fn state<T: HostWide>(&mut self) -> &mut T {
        let dialect = self.dialect;
        match self.port.dialect_state().part::<T>(dialect) {
            Some(part) => part,
            None => panic!(
                "the {} dialect's row keeps no {}",
                dialect.name(),
                std::any::type_name::<T>()
            ),
        }
    }

    /// Each organisation's request and token buckets, shared by every
    /// dialect its keys are used on.
    pub fn rate_limits(&mut self) -> &mut RateLimits {
        &mut self.port.dialect_state().limits
    }

    /// Connections open on `dialect`'s path over `transport`, this one
    /// included (in [`super::DialectConn::on_open`] too).
    pub fn open_connections(&self, dialect: Dialect, transport: Transport) -> u32 {
        self.port.open_connections(dialect, transport)
    }

    /// Sets (or moves) this connection's timer `tag` (each of the 256 tags
    /// is its own timer) to fire at `at`, calling
    /// [`super::DialectConn::on_timer`]. Timers end with the connection.
    pub fn set_timer(&mut self, tag: u8, at: Instant) {
        let conn = self.conn;
        self.port.set_timer(conn, tag, at);
    }

    /// Cancels this connection's timer `tag`.
    pub fn cancel_timer(&mut self, tag: u8) {
        let conn = self.conn;
        self.port.cancel_timer(conn, tag);
    }

    /// Names this connection in the operator's log ([`Event::ConnectionNamed`]).
    pub fn name_connection(&mut self, name: String) {
        let (conn, dialect) = (self.conn, self.dialect);
        self.port.push_output(Output::Event(Event::ConnectionNamed {
            conn,
            dialect,
            name,
        }));
    }

    /// Hands feedback to the operator's log and counts it.
    pub fn feedback(&mut self, record: FeedbackRecord) {
        self.port
            .push_output(Output::Event(Event::FeedbackReceived {
                rating: record.rating,
            }));
        self.port.push_output(Output::Feedback(record));
    }
}
