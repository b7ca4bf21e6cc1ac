//! [`HfCodec`]: the model's `tokenizer.json` (through the `tokenizers` crate)
//! and chat template behind the core's [`TextCodec`] trait. Decoding, which
//! streaming does twice per generated token, uses a per-id table for the
//! SentencePiece and byte-level decoder pipelines (`decode_table`) and the
//! crate's decoder chain for any other.

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use tokenizers::Tokenizer;
use tokenwire_core::fim::FimMarkers;
use tokenwire_core::reasoning::ReasoningTags;
use tokenwire_core::text::TemplateKwargs;
use tokenwire_core::tools::{self, ToolDef, ToolFormat};
use tokenwire_core::{ChatMessage, Grammar, TextCodec, TokenConstraint, TokenId};

use crate::chat::{join_contents, ChatTemplate};
use crate::error::LoadError;
use crate::grammar::GrammarEngine;
use crate::model_dir::ModelDir;

mod decode_table;

pub use decode_table::byte_level_char;
use decode_table::{DecodeTable, SP_SPACE};

/// A Hugging Face tokenizer plus optional chat template.
pub struct HfCodec {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    max_token_bytes: Option<usize>,
    /// Set when the decoder is one `decode_table` reproduces exactly.
    table: Option<DecodeTable>,
    /// The text of every special added token (`<|im_start|>`, `<s>`, ...).
    specials: Vec<String>,
    /// Special tokens that decode into text all the same: the reasoning
    /// tags of [`ReasoningTags::ALL`] where the tokenizer makes them
    /// special (Magistral's `[THINK]` since 2507), so a reasoning parser
    /// finds them, as vLLM's Mistral parser does; and Mistral's tool-call
    /// markers ([`tools::MISTRAL_MARKERS`]), so calls are found.
    kept_specials: HashSet<TokenId>,
    /// Ids of the special tokens decoding skips (the others are kept).
    skipped_specials: HashSet<TokenId>,
    /// The tokenizer with special-token text encoded as plain text, for
    /// message contents that contain some; made the first time one does.
    plain: OnceLock<Tokenizer>,
    /// Structured output's grammar compiler, once the model's vocabulary
    /// size and end tokens are known ([`HfCodec::enable_grammar`]), or why
    /// there is none.
    grammar: Result<GrammarEngine, String>,
    /// Its fill-in-the-middle markers, when its added tokens have them.
    fim: Option<FimMarkers>,
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
        HfCodec::load_from(&ModelDir::new(dir))
    }

    /// [`HfCodec::load`] from a directory or a built-in model.
    pub fn load_from(dir: &ModelDir) -> Result<HfCodec, LoadError> {
        let bytes = dir.read("tokenizer.json")?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| LoadError::Tokenizer {
            path: dir.path("tokenizer.json"),
            msg: e.to_string(),
        })?;
        let template = ChatTemplate::load_from(dir)?;
        Ok(HfCodec::new(tokenizer, template))
    }

    /// A codec from parts already built.
    pub fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>) -> HfCodec {
        let max_token_bytes = max_token_bytes(&tokenizer);
        let added = tokenizer.get_added_tokens_decoder();
        let is_kept = |text: &str| {
            ReasoningTags::ALL
                .iter()
                .any(|t| t.open == text || t.close == text)
                || tools::MISTRAL_MARKERS.contains(&text)
        };
        let (kept_specials, skipped_specials): (HashSet<TokenId>, HashSet<TokenId>) = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .partition(|id| is_kept(&added[id].content));
        let table = DecodeTable::build(&tokenizer, &kept_specials);
        // Markers are added tokens, which a raw prompt's text matches
        // literally, so the prompt they are written into encodes to them.
        let fim = FimMarkers::detect(|t| added.values().any(|a| a.content == t));
        let mut specials: Vec<String> = added
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        specials.sort_unstable();
        HfCodec {
            tokenizer,
            template,
            max_token_bytes,
            table,
            specials,
            kept_specials,
            skipped_specials,
            plain: OnceLock::new(),
            grammar: Err("structured output is not enabled for this model".into()),
            fim,
        }
    }

    /// Enables structured output ([`TextCodec::constrain`]) for a model
    /// with `vocab_size` logits that ends generations with `eos_ids`:
    /// builds llguidance's token trie (tens of milliseconds for a large
    /// vocabulary, so done once, at load). When that fails, structured
    /// output is refused with the reason.
    pub fn enable_grammar(&mut self, vocab_size: u32, eos_ids: &[TokenId]) {
        self.grammar = GrammarEngine::new(&self.tokenizer, vocab_size, eos_ids)
            .map_err(|e| format!("structured output is not available for this model: {e}"));
    }

    /// The underlying tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether decoding uses a per-id table built at load (the decoder is a
    /// SentencePiece or byte-level pipeline) rather than the decoder chain.
    pub fn decodes_by_table(&self) -> bool {
        self.table.is_some()
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
        if let Some(table) = &self.table {
            return table.decode(ids);
        }
        // Decoding only fails inside exotic decoders; an empty string is the
        // least surprising text for such ids.
        if self.kept_specials.is_empty() {
            return self.tokenizer.decode(ids, true).unwrap_or_default();
        }
        let shown: Vec<TokenId> = ids
            .iter()
            .copied()
            .filter(|id| !self.skipped_specials.contains(id))
            .collect();
        self.tokenizer.decode(&shown, false).unwrap_or_default()
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

    fn max_token_bytes(&self) -> Option<usize> {
        self.max_token_bytes
    }

    fn fim_markers(&self) -> Option<FimMarkers> {
        self.fim.clone()
    }

    fn tool_format(&self) -> ToolFormat {
        self.template
            .as_ref()
            .map_or(ToolFormat::Hermes, ChatTemplate::tool_format)
    }

    fn chat_template(&self) -> Option<String> {
        self.template.as_ref().map(|t| t.source().to_string())
    }

    fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
    ) -> Option<Result<Vec<TokenId>, String>> {
        self.encode_template_tools(messages, tools, &TemplateKwargs::new())
    }

    fn encode_chat_templated(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
        kwargs: &TemplateKwargs,
    ) -> Result<Vec<TokenId>, String> {
        // Without a template there is nothing to give them to.
        let kwargs = match self.template {
            Some(_) => kwargs,
            None => &TemplateKwargs::new(),
        };
        self.check_kwargs(messages, tools, kwargs)?;
        if tools.is_empty() {
            return self.encode_rendered(messages, kwargs);
        }
        self.encode_template_tools(messages, tools, kwargs)
            .unwrap_or_else(|| {
                let described = tools::with_tools_prompt(messages, tools, self.tool_format());
                self.encode_rendered(&described, kwargs)
            })
    }

    fn constrain(&self, grammar: &Grammar) -> Result<Box<dyn TokenConstraint>, String> {
        match &self.grammar {
            Ok(engine) => engine.compile(grammar),
            Err(why) => Err(why.clone()),
        }
    }

    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, String> {
        self.render(messages, &TemplateKwargs::new())
    }

    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<TokenId>, String> {
        self.encode_rendered(messages, &TemplateKwargs::new())
    }
}

impl HfCodec {
    /// The prompt for `messages` with `kwargs` as template variables; with
    /// no template, the contents joined.
    fn render(&self, messages: &[ChatMessage], kwargs: &TemplateKwargs) -> Result<String, String> {
        match &self.template {
            Some(t) => t.render_with(messages, &[], kwargs),
            None => Ok(join_contents(messages)),
        }
    }

    /// [`HfCodec::render`] tokenized: the template's markup with special
    /// tokens, contents with typed control text as plain text.
    fn encode_rendered(
        &self,
        messages: &[ChatMessage],
        kwargs: &TemplateKwargs,
    ) -> Result<Vec<TokenId>, String> {
        let text = self.render(messages, kwargs)?;
        // Templates such as Llama 3's begin with `{{ bos_token }}`; the
        // tokenizer's post-processor would add a second one.
        let template_wrote_bos = self
            .template
            .as_ref()
            .is_some_and(|t| !t.bos_token().is_empty() && text.starts_with(t.bos_token()));
        if !self.has_control_text(messages) {
            // The common case: the whole text at once, as it always was.
            return self.encode(&text, !template_wrote_bos);
        }
        // The guarded path keeps every content plain: earlier calls, which
        // hold client text too, are written into theirs.
        let flat = tools::flatten_calls(messages, self.tool_format());
        let text = self.render(&flat, kwargs)?;
        self.encode_chat_guarded(&flat, kwargs, &text, !template_wrote_bos)
    }

    /// `messages` with `tools` rendered by the template itself, when it
    /// takes tools and no content holds typed control text (`None`
    /// otherwise: the caller describes the tools in a system message).
    fn encode_template_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
        kwargs: &TemplateKwargs,
    ) -> Option<Result<Vec<TokenId>, String>> {
        let template = self.template.as_ref().filter(|t| t.takes_tools())?;
        // Contents or tools with typed control text take the guarded path,
        // through the tools described in a system message instead.
        if self.has_control_text(messages) || self.tools_hold_control_text(tools) {
            return None;
        }
        Some(
            template
                .render_with(messages, tools, kwargs)
                .and_then(|text| {
                    let wrote_bos =
                        !template.bos_token().is_empty() && text.starts_with(template.bos_token());
                    self.encode(&text, !wrote_bos)
                }),
        )
    }

    /// Refuses kwargs that would write control tokens: a string holding a
    /// special token's text, or strings that the template writes so that
    /// one forms (pieces joined by a loop, a piece beside a message's
    /// text), seen as more special-token text in the prompt rendered with
    /// them than with every string replaced by a neutral one.
    fn check_kwargs(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
        kwargs: &TemplateKwargs,
    ) -> Result<(), String> {
        if let Some((key, special)) = self.control_text_in(kwargs) {
            return Err(format!(
                "chat_template_kwargs.{key} holds the model's control text `{special}`, \
                 which would be read as markup; remove it"
            ));
        }
        fn neutral(v: &serde_json::Value) -> Option<serde_json::Value> {
            use serde_json::Value as V;
            match v {
                V::String(_) => Some(V::String("x".into())),
                V::Array(a) => {
                    let n: Vec<Option<V>> = a.iter().map(neutral).collect();
                    n.iter().any(Option::is_some).then(|| {
                        V::Array(
                            n.into_iter()
                                .zip(a)
                                .map(|(n, v)| n.unwrap_or_else(|| v.clone()))
                                .collect(),
                        )
                    })
                }
                V::Object(o) => {
                    let n: Vec<(String, Option<V>)> =
                        o.iter().map(|(k, v)| (k.clone(), neutral(v))).collect();
                    n.iter().any(|(_, v)| v.is_some()).then(|| {
                        V::Object(
                            n.into_iter()
                                .zip(o.values())
                                .map(|((k, n), v)| (k, n.unwrap_or_else(|| v.clone())))
                                .collect(),
                        )
                    })
                }
                _ => None,
            }
        }
        let neutral: TemplateKwargs = match neutral(&serde_json::Value::Object(kwargs.clone())) {
            Some(serde_json::Value::Object(o)) => o,
            _ => return Ok(()), // no strings: nothing a client wrote reaches the text
        };
        let count = |text: &str| -> usize {
            self.specials
                .iter()
                .map(|s| text.matches(s.as_str()).count())
                .sum()
        };
        let real = self.render_for(messages, tools, kwargs)?;
        // A template that insists on its own values (one of a few names)
        // may refuse the neutral ones: then only the per-string check holds.
        let Ok(base) = self.render_for(messages, tools, &neutral) else {
            return Ok(());
        };
        if count(&real) != count(&base) {
            return Err(
                "chat_template_kwargs: the chat template writes its strings so that they \
                 spell the model's control text; remove it"
                    .into(),
            );
        }
        Ok(())
    }

    /// The text [`TextCodec::encode_chat_templated`] tokenizes: the
    /// template's own tools rendering where it takes them (and no content
    /// holds control text), else the tools described in a system message.
    fn render_for(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDef],
        kwargs: &TemplateKwargs,
    ) -> Result<String, String> {
        match self.template.as_ref() {
            Some(t)
                if !tools.is_empty()
                    && t.takes_tools()
                    && !self.has_control_text(messages)
                    && !self.tools_hold_control_text(tools) =>
            {
                t.render_with(messages, tools, kwargs)
            }
            _ if !tools.is_empty() => {
                let described = tools::with_tools_prompt(messages, tools, self.tool_format());
                self.render(&described, kwargs)
            }
            _ => self.render(messages, kwargs),
        }
    }

    /// Whether any text a client wrote into a message holds a special
    /// token's text: its content, its calls' names and arguments (as sent
    /// and as parsed, since JSON escapes such as `\u007c` spell the same
    /// text once a template writes the value), and the call ids, unless the
    /// template is Mistral's, which is given hashed ids
    /// ([`tools::mistral_call_id`]).
    fn has_control_text(&self, messages: &[ChatMessage]) -> bool {
        let holds = |t: &str| self.specials.iter().any(|s| t.contains(s.as_str()));
        let ids_written = !self.tool_format().is_mistral();
        messages.iter().any(|m| {
            holds(&m.content)
                || (ids_written && m.tool_call_id.as_deref().is_some_and(holds))
                || m.tool_calls.iter().any(|c| {
                    (ids_written && holds(&c.id))
                        || holds(&c.name)
                        || holds(&c.arguments)
                        || holds(&tools::arguments_value(&c.arguments).to_string())
                })
        })
    }

    /// Whether any tool definition (its name, description or schema, as the
    /// template would write it) holds a special token's text: such tools
    /// are described in a system message instead, whose content the
    /// guarded path keeps plain.
    fn tools_hold_control_text(&self, tools: &[ToolDef]) -> bool {
        tools.iter().any(|d| {
            let text = d.to_json().to_string();
            self.specials.iter().any(|s| text.contains(s.as_str()))
        })
    }

    /// The first kwarg (its key) whose text, anywhere in its value, holds a
    /// special token's text, and that text: a template writes kwargs as
    /// markup, so they must not spell control tokens.
    fn control_text_in(&self, kwargs: &TemplateKwargs) -> Option<(String, String)> {
        fn strings<'v>(v: &'v serde_json::Value, out: &mut Vec<&'v str>) {
            match v {
                serde_json::Value::String(s) => out.push(s),
                serde_json::Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
                serde_json::Value::Object(o) => o.iter().for_each(|(k, v)| {
                    out.push(k);
                    strings(v, out)
                }),
                _ => {}
            }
        }
        kwargs.iter().find_map(|(key, value)| {
            let mut texts = vec![key.as_str()];
            strings(value, &mut texts);
            texts.iter().find_map(|t| {
                let special = self.specials.iter().find(|s| t.contains(s.as_str()))?;
                Some((key.clone(), special.clone()))
            })
        })
    }

    /// A conversation some of whose contents contain special-token text
    /// (`<|im_end|>` typed by a client): the template's markup is tokenized
    /// with special tokens, the contents as plain text, so nobody writes a
    /// turn or a role they were not given (PROTOCOLS.md). The template is
    /// rendered once more with a placeholder for each content, to see which
    /// parts are markup; a template that changes contents (`| trim`) with
    /// such text in them is refused rather than guessed at.
    fn encode_chat_guarded(
        &self,
        messages: &[ChatMessage],
        kwargs: &TemplateKwargs,
        rendered: &str,
        add_special: bool,
    ) -> Result<Vec<TokenId>, String> {
        let refused = || {
            "a message contains the model's control text (such as a turn marker), and this \
             model's chat template rewrites message contents, so it cannot be kept as plain \
             text; remove it from the message"
                .to_string()
        };
        let marker = |i: usize| format!("\u{E000}{i}\u{E001}");
        if messages.iter().any(|m| m.content.contains('\u{E000}')) {
            return Err(refused());
        }
        if !self.tool_format().is_mistral()
            && messages.iter().any(|m| {
                m.tool_call_id
                    .as_deref()
                    .is_some_and(|id| self.specials.iter().any(|s| id.contains(s.as_str())))
            })
        {
            return Err(
                "a tool_call_id contains the model's control text (such as a turn \
                        marker); send the id the call was given"
                    .into(),
            );
        }
        let placeheld: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                // An empty content stays empty: a template may treat it
                // apart (a turn that only called tools; an empty prefill).
                content: if m.content.is_empty() {
                    String::new()
                } else {
                    marker(i)
                },
                ..m.clone()
            })
            .collect();
        let skeleton = self.render(&placeheld, kwargs)?;
        // Markup and contents in order, from the skeleton's markers.
        let mut pieces: Vec<(bool, &str)> = Vec::new();
        let mut rest = skeleton.as_str();
        while let Some(start) = rest.find('\u{E000}') {
            let after = &rest[start + '\u{E000}'.len_utf8()..];
            let end = after.find('\u{E001}').ok_or_else(refused)?;
            let index: usize = after[..end].parse().map_err(|_| refused())?;
            let content = messages.get(index).ok_or_else(refused)?;
            pieces.push((false, &rest[..start]));
            pieces.push((true, content.content.as_str()));
            rest = &after[end + '\u{E001}'.len_utf8()..];
        }
        pieces.push((false, rest));
        let rebuilt: String = pieces.iter().map(|(_, p)| *p).collect();
        if rebuilt != rendered {
            return Err(refused());
        }
        let plain = self.plain.get_or_init(|| {
            let mut t = self.tokenizer.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let mut ids = Vec::new();
        let mut first = true;
        for (is_content, piece) in pieces {
            if piece.is_empty() {
                continue;
            }
            let tokenizer = if is_content { plain } else { &self.tokenizer };
            let enc = tokenizer
                .encode(piece, add_special && first)
                .map_err(|e| format!("tokenizer: {e}"))?;
            ids.extend_from_slice(enc.get_ids());
            first = false;
        }
        Ok(ids)
    }
}

/// The most input bytes one token of `tokenizer` can stand for, when its
/// pipeline never shrinks or drops text: then every token's vocabulary
/// string is at least as long (in UTF-8 bytes) as the input it covers, since
/// byte-level BPE spells each input byte as one character of one or two bytes,
/// SentencePiece spells a space as the three-byte `▁` and a fallback byte as
/// `<0xAB>`, and added tokens match their content literally. `None` for any
/// normalizer, pre-tokenizer or model not known to keep that property.
fn max_token_bytes(tokenizer: &Tokenizer) -> Option<usize> {
    let json: serde_json::Value = serde_json::from_str(&tokenizer.to_string(false).ok()?).ok()?;
    if !keeps_bytes_normalizer(&json["normalizer"])
        || !keeps_text_pre_tokenizer(&json["pre_tokenizer"])
    {
        return None;
    }
    let model = &json["model"];
    // Only BPE: WordPiece, WordLevel and Unigram can turn a whole unknown word
    // into one unknown token, and so can BPE when it fuses unknown runs.
    if model["type"].as_str() != Some("BPE") {
        return None;
    }
    let vocab = tokenizer.get_vocab(true);
    // With byte fallback and every `<0xAB>` piece present, no character is
    // ever unknown.
    let all_bytes = model["byte_fallback"].as_bool() == Some(true)
        && (0..=255u8).all(|b| vocab.contains_key(&format!("<0x{b:02X}>")));
    let has_unk = model["unk_token"].as_str().is_some() && !all_bytes;
    if has_unk && model["fuse_unk"].as_bool() == Some(true) {
        return None;
    }
    let longest = vocab.keys().map(String::len).max()?;
    // An unknown character (at most 4 bytes) may become the unknown token.
    Some(if has_unk { longest.max(4) } else { longest })
}

/// True for normalizers that never make text shorter in bytes.
fn keeps_bytes_normalizer(n: &serde_json::Value) -> bool {
    match n["type"].as_str() {
        None => n.is_null(),
        Some("Sequence") => n["normalizers"]
            .as_array()
            .is_some_and(|all| all.iter().all(keeps_bytes_normalizer)),
        Some("Prepend") => true,
        Some("Replace") => match (n["pattern"]["String"].as_str(), n["content"].as_str()) {
            (Some(pattern), Some(content)) => content.len() >= pattern.len(),
            _ => false,
        },
        Some(_) => false,
    }
}

/// True for pre-tokenizers that keep every byte of the text.
fn keeps_text_pre_tokenizer(p: &serde_json::Value) -> bool {
    match p["type"].as_str() {
        None => p.is_null(),
        Some("Sequence") => p["pretokenizers"]
            .as_array()
            .is_some_and(|all| all.iter().all(keeps_text_pre_tokenizer)),
        Some("ByteLevel" | "Metaspace" | "Digits") => true,
        Some("Split" | "Punctuation") => p["behavior"].as_str() != Some("Removed"),
        Some(_) => false,
    }
}
