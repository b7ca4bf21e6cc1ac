//! Text <-> token ids, behind a small trait so the server can use the model's real
//! tokenizer and the simulator a cheap deterministic one.

use crate::engine::TokenId;

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
    /// What was said.
    pub content: String,
}

/// Tokenizer and chat template of the served model.
///
/// Implementations must be deterministic. `decode` skips special tokens (BOS,
/// EOS) so that generated text never contains them.
pub trait TextCodec: Send + Sync {
    /// Token ids of `text`; with `add_special` the tokenizer adds BOS as the
    /// model expects. Errors are messages naming what was wrong.
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, String>;

    /// Text of `ids`, special tokens skipped. Invalid UTF-8 byte runs decode to U+FFFD.
    fn decode(&self, ids: &[TokenId]) -> String;

    /// Display text of one token (for logprobs lists), as the vocabulary spells it.
    fn token_text(&self, id: TokenId) -> String {
        self.decode(&[id])
    }

    /// The prompt for `messages`: the model's chat template rendered with the
    /// generation prompt added; with no template, the contents joined by `\n`.
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String> {
        Ok(messages
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
