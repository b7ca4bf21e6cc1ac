//! Text <-> token ids, behind a small trait so the server can use the model's real
//! tokenizer and the simulator a cheap deterministic one.

pub mod byte;

use crate::constraint::{Grammar, TokenConstraint};
use crate::engine::TokenId;
use crate::tools::{self, ToolDef, ToolFormat};

/// Who said a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// System instructions.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's output.
    Tool,
}

impl Role {
    /// The role's name as chat templates expect it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses `system`, `user`, `assistant`, `tool`.
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// What was said (for an assistant turn that called tools, the text
    /// beside its calls).
    pub content: String,
    /// The tools an assistant turn called, in order. A chat template that
    /// reads `tool_calls` renders them itself, as the model was trained;
    /// for any other they are written into the content in the model's
    /// format ([`crate::tools::flatten_calls`]).
    pub tool_calls: Vec<HistoryCall>,
    /// For a tool's output, the id of the call it answers (templates such
    /// as Mistral's write it beside the result).
    pub tool_call_id: Option<String>,
    /// On the last message, an assistant turn, the start of the answer
    /// rather than a finished turn (Anthropic's prefill, vLLM's
    /// `continue_final_message`): the prompt ends right after its content,
    /// with no end of turn and no generation prompt, so the model goes on
    /// writing it. Ignored on any other message.
    pub prefill: bool,
}

impl ChatMessage {
    /// A message of plain text: no calls, answering no call.
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            prefill: false,
        }
    }

    /// Whether the conversation ends in an assistant turn to be continued
    /// ([`ChatMessage::prefill`] on its last message).
    pub fn ends_in_prefill(messages: &[ChatMessage]) -> bool {
        messages
            .last()
            .is_some_and(|m| m.prefill && m.role == Role::Assistant)
    }
}

/// A tool call made earlier in a conversation, as a client sends it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryCall {
    /// The call's id (Chat Completions' `tool_calls[].id`, Anthropic's
    /// `tool_use.id`, Responses' `call_id`).
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments as the client sent them (JSON text, normally an object).
    pub arguments: String,
}

/// Tokenizer and chat template of the served model.
///
/// Implementations must be deterministic. `decode` skips special tokens (BOS,
/// EOS) so that generated text never contains them.
pub trait TextCodec: Send + Sync {
    /// Token ids of `text`; with `add_special` the tokenizer adds BOS as the
    /// model expects. Errors are messages naming what was wrong.
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, String>;

    /// Text of `ids`, special tokens skipped (a codec may keep some in the
    /// text: the server's keeps the reasoning tags of
    /// [`crate::reasoning::ReasoningTags::ALL`] and Mistral's tool-call
    /// markers, [`crate::tools::MISTRAL_MARKERS`]). Invalid UTF-8 byte runs
    /// decode to U+FFFD.
    fn decode(&self, ids: &[TokenId]) -> String;

    /// Display text of one token (for logprobs lists), as the vocabulary spells it.
    fn token_text(&self, id: TokenId) -> String {
        self.decode(&[id])
    }

    /// The model's chat template as its files give it (Jinja source), for
    /// clients that render it themselves (lm-evaluation-harness's remote
    /// tokenizer reads it from `/tokenizer_info`); `None` without one.
    fn chat_template(&self) -> Option<String> {
        None
    }

    /// The prompt for `messages`: the model's chat template rendered with the
    /// generation prompt added; with no template, the contents (earlier
    /// calls written into them) joined by `\n`.
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String> {
        Ok(tools::flatten_calls(messages, self.tool_format())
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n"))
    }

    /// The prompt ids for `messages`: [`TextCodec::render_chat`] encoded
    /// with the BOS the tokenizer adds. A codec whose template writes the BOS
    /// itself (`{{ bos_token }}`) overrides this so the prompt does not start
    /// with two.
    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<TokenId>, String> {
        self.encode(&self.render_chat(messages)?, true)
    }

    /// An upper bound on the bytes of input text one token can stand for, when
    /// the tokenizer has one (no normalizer or pre-tokenizer that drops text,
    /// no unknown token that swallows a run of characters). A prompt of `b`
    /// bytes is then at least `b / max_token_bytes` tokens, which lets the Host
    /// refuse a prompt that can never fit the context before tokenizing it.
    /// `None` (the default) means no such bound is known.
    fn max_token_bytes(&self) -> Option<usize> {
        None
    }

    /// The fill-in-the-middle markers of a model trained for it
    /// (Completions' `suffix`); `None` (the default) for any other.
    fn fim_markers(&self) -> Option<crate::fim::FimMarkers> {
        None
    }

    /// How this model writes tool calls (its chat template's format;
    /// [`ToolFormat::Hermes`] by default, which [`crate::tools`] also
    /// describes to a model whose template has none).
    fn tool_format(&self) -> ToolFormat {
        ToolFormat::Hermes
    }

    /// The prompt ids for `messages` with `tools` offered, when the chat
    /// template renders tools itself; `None` (the default) when it does
    /// not, and the caller describes them in a system message
    /// ([`crate::tools::with_tools_prompt`]).
    fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
    ) -> Option<Result<Vec<TokenId>, String>> {
        let _ = (messages, tools);
        None
    }

    /// The prompt ids for `messages`, with `tools` offered (if any) and
    /// `kwargs` given to the chat template as variables beside
    /// `messages` (Chat Completions' `chat_template_kwargs`, such as
    /// Qwen3's `enable_thinking`). The default has no template to give
    /// them to and ignores them: [`TextCodec::encode_chat`], or with tools
    /// [`TextCodec::encode_chat_with_tools`], else the tools described in
    /// a system message ([`crate::tools::with_tools_prompt`]).
    fn encode_chat_templated(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
        kwargs: &TemplateKwargs,
    ) -> Result<Vec<TokenId>, String> {
        let _ = kwargs;
        if tools.is_empty() {
            return self.encode_chat(messages);
        }
        self.encode_chat_with_tools(messages, tools)
            .unwrap_or_else(|| {
                self.encode_chat(&tools::with_tools_prompt(
                    messages,
                    tools,
                    self.tool_format(),
                ))
            })
    }

    /// Compiles `grammar` into a fresh constraint over this vocabulary
    /// (structured output; see [`crate::constraint`]). Errors are messages
    /// for the client naming what in the grammar cannot be enforced. The
    /// default has no grammar engine and refuses every grammar.
    fn constrain(&self, grammar: &Grammar) -> Result<Box<dyn TokenConstraint>, String> {
        let _ = grammar;
        Err(
            "this server's tokenizer has no grammar engine, so structured output is not available"
                .into(),
        )
    }
}

/// Variables a request gives the chat template beside its messages
/// (`chat_template_kwargs`).
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// The fewest tokens a text of `bytes` bytes can encode to under `codec`
/// (0 when the codec knows no bound).
pub fn min_tokens_for_bytes(codec: &dyn TextCodec, bytes: usize) -> usize {
    match codec.max_token_bytes() {
        Some(per_token) if per_token > 0 => bytes.div_ceil(per_token),
        _ => 0,
    }
}

/// Cuts `ids`, a text's tokens with the special tokens the tokenizer adds
/// (`added`: what it gives an empty text, BOS and perhaps an EOS), to `k`
/// tokens, keeping its last ones and the added tokens at either end, as
/// Hugging Face tokenizers truncate from the left (vLLM's
/// `truncate_prompt_tokens` on a text prompt). Where `k` leaves no room
/// beside the added tokens, the last `k` are kept.
pub fn cut_keeping_added(ids: &mut Vec<TokenId>, k: usize, added: &[TokenId]) {
    if ids.len() <= k {
        return;
    }
    let head = (0..=added.len())
        .rev()
        .find(|&n| ids.starts_with(&added[..n]))
        .unwrap_or(0);
    let tail = if ids.ends_with(&added[head..]) {
        added.len() - head
    } else {
        0
    };
    if head + tail >= k {
        ids.drain(..ids.len() - k);
        return;
    }
    let body_end = ids.len() - tail;
    let keep_from = body_end - (k - head - tail);
    ids.drain(head..keep_from);
}

/// Identifies one [`TextJob`] of a Host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TextJobId(pub u64);

/// What a [`TextJob`] computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextWork {
    /// Tokenize a raw prompt exactly as given, with the BOS the tokenizer
    /// adds when `add_special` is set.
    Encode {
        /// The prompt.
        text: String,
        /// Add the special tokens the tokenizer adds (BOS): true for a
        /// prompt the model computes.
        add_special: bool,
    },
    /// Render a conversation with the chat template and tokenize it, keeping
    /// the newest messages that fit: every system message, then at most
    /// `max_messages` others, newest first, dropping the oldest until the
    /// prompt has at most `max_tokens` tokens. The newest message is never
    /// dropped; if it cannot fit, the job fails with [`CONTEXT_TOO_LONG`]'s
    /// message.
    Chat {
        /// The conversation, oldest first.
        messages: Vec<ChatMessage>,
        /// Most non-system messages kept.
        max_messages: usize,
        /// Most prompt tokens.
        max_tokens: u32,
        /// Functions offered to the model (rendered by the template when it
        /// takes tools, else described in a system message).
        tools: Vec<ToolDef>,
        /// Variables for the chat template (empty: none).
        template_kwargs: TemplateKwargs,
    },
}

/// Start of a [`TextWork::Chat`] job's error when even the newest message
/// alone (with the system messages) is over its token budget; the error goes
/// on with the prompt's token count.
pub const CONTEXT_TOO_LONG: &str = "context too long:";

/// The result of a [`TextJob`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoded {
    /// The prompt's token ids.
    pub ids: Vec<TokenId>,
    /// Messages of a [`TextWork::Chat`] left out to fit (0 for raw prompts).
    pub dropped: u32,
}

/// Keeps the newest messages that fit (see [`TextWork::Chat`]).
fn encode_fitting(
    codec: &dyn TextCodec,
    messages: &[ChatMessage],
    max_messages: usize,
    max_tokens: u32,
    tools: &[ToolDef],
    kwargs: &TemplateKwargs,
) -> Result<Encoded, String> {
    let others: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].role != Role::System)
        .collect();
    // Dropping `k` of the oldest non-system messages: the prompt shrinks as k
    // grows, so the fewest drops that fit is found by bisection.
    let encode = |k: usize| -> Result<Vec<TokenId>, String> {
        let first_kept = others.get(k).copied().unwrap_or(messages.len());
        let kept: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .filter(|(i, m)| m.role == Role::System || *i >= first_kept)
            .map(|(_, m)| m.clone())
            .collect();
        codec.encode_chat_templated(&kept, tools, kwargs)
    };
    let fits = |ids: &[TokenId]| ids.len() as u64 <= u64::from(max_tokens);
    let least = others.len().saturating_sub(max_messages);
    let most = others.len().saturating_sub(1).max(least);
    // Most conversations fit whole: one rendering then.
    let whole = encode(least)?;
    if fits(&whole) {
        return Ok(Encoded {
            ids: whole,
            dropped: u32::try_from(least).unwrap_or(u32::MAX),
        });
    }
    let at_most = encode(most)?;
    if !fits(&at_most) {
        return Err(format!("{CONTEXT_TOO_LONG} {} tokens", at_most.len()));
    }
    let (mut lo, mut hi, mut best) = (least, most, at_most);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let ids = encode(mid)?;
        if fits(&ids) {
            hi = mid;
            best = ids;
        } else {
            lo = mid + 1;
        }
    }
    Ok(Encoded {
        ids: best,
        dropped: u32::try_from(hi).unwrap_or(u32::MAX),
    })
}

/// Tokenizing (and chat-template rendering) handed out by the Host as
/// [`crate::Output::Tokenize`], so that a long prompt costs the thread that
/// runs the job, never the one that drives the Host. Run it anywhere with
/// [`TextJob::run`] and hand the result back as [`crate::Input::Tokenized`].
#[derive(Clone)]
pub struct TextJob {
    /// The job's id, echoed in its [`TextDone`].
    pub id: TextJobId,
    /// The connection whose request it is.
    pub conn: crate::conn::ConnId,
    /// The model's tokenizer and chat template.
    pub codec: SharedCodec,
    /// What to compute.
    pub work: TextWork,
}

impl std::fmt::Debug for TextJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the text: jobs carry conversation content.
        let (kind, bytes) = match &self.work {
            TextWork::Encode { text, .. } => ("encode", text.len()),
            TextWork::Chat { messages, .. } => (
                "chat",
                messages.iter().map(|m| m.content.len()).sum::<usize>(),
            ),
        };
        f.debug_struct("TextJob")
            .field("id", &self.id)
            .field("conn", &self.conn)
            .field("work", &kind)
            .field("bytes", &bytes)
            .finish()
    }
}

impl PartialEq for TextJob {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.conn == other.conn && self.work == other.work
    }
}

impl TextJob {
    /// Computes the job (pure: the same job always gives the same result).
    pub fn run(&self) -> TextDone {
        let result = match &self.work {
            TextWork::Encode { text, add_special } => self
                .codec
                .encode(text, *add_special)
                .map(|ids| Encoded { ids, dropped: 0 }),
            TextWork::Chat {
                messages,
                max_messages,
                max_tokens,
                tools,
                template_kwargs,
            } => encode_fitting(
                &*self.codec,
                messages,
                *max_messages,
                *max_tokens,
                tools,
                template_kwargs,
            ),
        };
        TextDone {
            id: self.id,
            result,
        }
    }
}

/// A finished [`TextJob`]: the token ids, or the tokenizer's error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextDone {
    /// The job's id.
    pub id: TextJobId,
    /// Its result.
    pub result: Result<Encoded, String>,
}

/// A shareable handle to the model's [`TextCodec`].
#[derive(Clone)]
pub struct SharedCodec(pub std::sync::Arc<dyn TextCodec>);

impl std::fmt::Debug for SharedCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedCodec")
    }
}

impl std::ops::Deref for SharedCodec {
    type Target = dyn TextCodec;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_keeps_the_last_tokens_and_the_added_ones_at_either_end() {
        let cut = |ids: &[TokenId], k: usize, added: &[TokenId]| {
            let mut v = ids.to_vec();
            cut_keeping_added(&mut v, k, added);
            v
        };
        // BOS (1) added before the text.
        assert_eq!(cut(&[1, 10, 11, 12, 13], 3, &[1]), [1, 12, 13]);
        // BOS and EOS (2) around it.
        assert_eq!(cut(&[1, 10, 11, 12, 13, 2], 4, &[1, 2]), [1, 12, 13, 2]);
        // EOS alone after it (a decoder embedding model's).
        assert_eq!(cut(&[10, 11, 12, 2], 2, &[2]), [12, 2]);
        // Nothing added, or ids that do not carry it: the last k.
        assert_eq!(cut(&[10, 11, 12, 13], 2, &[]), [12, 13]);
        assert_eq!(cut(&[10, 11, 12, 13], 2, &[1]), [12, 13]);
        // No room beside the added tokens: the last k.
        assert_eq!(cut(&[1, 10, 11, 2], 2, &[1, 2]), [11, 2]);
        // Short enough already: untouched.
        assert_eq!(cut(&[1, 10], 5, &[1]), [1, 10]);
    }
}
