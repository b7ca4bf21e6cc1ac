//! [`HfCodec`]: the model's `tokenizer.json` (through the `tokenizers` crate)
//! and chat template behind the core's [`TextCodec`] trait.

use std::path::Path;

use tokenizers::Tokenizer;
use tokenwire_core::{ChatMessage, TextCodec, TokenId};

use crate::chat::{join_contents, ChatTemplate};
use crate::error::{read_file, LoadError};

/// SentencePiece's word-boundary marker, which decoders turn into a space.
const SP_SPACE: char = '\u{2581}';

/// A Hugging Face tokenizer plus optional chat template.
pub struct HfCodec {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
}

impl std::fmt::Debug for HfCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfCodec")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("template", &self.template)
            .finish()
    }
}

impl HfCodec {
    /// Loads `dir/tokenizer.json` and the chat template of `dir`.
    pub fn load(dir: &Path) -> Result<HfCodec, LoadError> {
        let path = dir.join("tokenizer.json");
        let bytes = read_file(&path)?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| LoadError::Tokenizer {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        let template = ChatTemplate::load(dir)?;
        Ok(HfCodec::new(tokenizer, template))
    }

    /// A codec from parts already built.
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>) -> HfCodec {
        HfCodec {
            tokenizer,
            template,
        }
    }

    /// The underlying tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether the model has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }
}

impl TextCodec for HfCodec {
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<TokenId>, String> {
        self.tokenizer
            .encode(text, add_special)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| format!("tokenizer: {e}"))
    }

    fn decode(&self, ids: &[TokenId]) -> String {
        // Decoding only fails inside exotic decoders; an empty string is the
        // least surprising text for such ids.
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    fn token_text(&self, id: TokenId) -> String {
        let text = self.tokenizer.decode(&[id], false).unwrap_or_default();
        // SentencePiece decoders strip the leading space of a whole text; a
        // single token's display text should keep it ("▁time" is " time").
        match self.tokenizer.id_to_token(id) {
            Some(piece) if piece.starts_with(SP_SPACE) && !text.starts_with(' ') => {
                format!(" {text}")
            }
            _ => text,
        }
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String> {
        match &self.template {
            Some(t) => t.render(messages),
            None => Ok(join_contents(messages)),
        }
    }

    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<TokenId>, String> {
        let text = self.render_chat(messages)?;
        // Templates such as Llama 3's begin with `{{ bos_token }}`; the
        // tokenizer's post-processor would add a second one.
        let template_wrote_bos = self
            .template
            .as_ref()
            .is_some_and(|t| !t.bos_token().is_empty() && text.starts_with(t.bos_token()));
        self.encode(&text, !template_wrote_bos)
    }
}
