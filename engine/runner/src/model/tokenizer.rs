//! Byte-level BPE tokenizer (GPT-2 / SmolLM2 style), the model's chat format (its own
//! template, [`super::chat_template`], or the built-in ChatML one) and its end ids.
//!
//! Invariants: `decode(encode(text)) == text` for any UTF-8 text (no prefix space is ever
//! added: "Hello" encodes as "Hello", not "ĠHello"); special tokens written literally in the
//! text (e.g. `<|im_start|>`) encode to their single ids. The tokenizer comes either from a
//! Hugging Face `tokenizer.json` or is rebuilt from GGUF metadata as an equivalent
//! `tokenizer.json` document (see [`tokenizer_json`]).

use std::path::Path;

use serde_json::{Value, json};

use super::chat_template::ChatFormat;
use crate::error::{Error, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// A loaded tokenizer plus the ids the engine needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
    chat: ChatFormat,
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json_str(&text)
    }

    /// Parses a `tokenizer.json` document.
    pub fn from_json_str(text: &str) -> Result<Self> {
        let inner: tokenizers::Tokenizer = text
            .parse()
            .map_err(|e| Error::Tokenizer(format!("tokenizer.json: {e}")))?;
        let eos_ids = ["<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>"]
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        Ok(Self {
            inner,
            eos_ids,
            chat: ChatFormat::BuiltIn,
        })
    }

    /// The same tokenizer rendering chats in `chat`.
    pub fn with_chat_format(self, chat: ChatFormat) -> Self {
        Self { chat, ..self }
    }

    /// How chats are rendered.
    pub fn chat_format(&self) -> &ChatFormat {
        &self.chat
    }

    /// The prompt for a conversation, in the model's chat format.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.chat.render(messages, add_generation_prompt)
    }

    /// Adds ids that end a generation (the model config's `eos_token_id`), once each.
    pub fn add_eos_ids(&mut self, ids: &[u32]) {
        for &id in ids {
            if !self.eos_ids.contains(&id) && (id as usize) < self.vocab_size() {
                self.eos_ids.push(id);
            }
        }
    }

    /// Builds the tokenizer from GGUF `tokenizer.ggml.*` metadata (byte-level BPE only).
    pub fn from_gguf(content: &candle_core::quantized::gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let get = |k: &str| {
            md.get(k)
                .ok_or_else(|| Error::Tokenizer(format!("gguf metadata {k} missing")))
        };
        let model = get("tokenizer.ggml.model")?.to_string()?;
        if model != "gpt2" {
            return Err(Error::UnsupportedModel(format!(
                "gguf tokenizer model {model:?} (only byte-level BPE \"gpt2\" is supported)"
            )));
        }
        let tokens = get("tokenizer.ggml.tokens")?
            .to_vec()?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let merges = get("tokenizer.ggml.merges")?
            .to_vec()?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let types = match md.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()?
                .iter()
                .map(|t| t.to_i32())
                .collect::<std::result::Result<Vec<_>, _>>()?,
            None => vec![1; tokens.len()],
        };
        // llama.cpp token types: 3 = control, 4 = user defined; both are matched literally.
        let specials: Vec<u32> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == 3 || **t == 4)
            .map(|(i, _)| i as u32)
            .collect();
        let doc = tokenizer_json(&tokens, &merges, &specials);
        Self::from_json_str(&doc.to_string())
    }

    /// Encodes text; special tokens written in the text are recognised, nothing is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids back to text, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Decodes ids, leaving special tokens out (for user-facing output).
    pub fn decode_text(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Ids that end a generation (`<|im_end|>`, `<|endoftext|>`, ... when present).
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of a token string, if it exists.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Serializes as a `tokenizer.json` document.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

/// Incremental detokenizer for streaming: feed generated ids one at a time and get the text
/// they add. A token that ends inside a multi-byte UTF-8 character yields nothing until the
/// character completes, so the concatenated deltas always equal `decode_text(all ids)`.
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl TextStream {
    /// An empty stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one generated id; returns the newly completed text (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = tok.decode_text(&self.ids[self.prefix..self.read])?;
        let after = tok.decode_text(&self.ids[self.prefix..])?;
        if after.len() > before.len() && !after.ends_with('\u{FFFD}') {
            let delta = after
                .get(before.len()..)
                .map(str::to_string)
                .unwrap_or_default();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }
}

/// Renders messages with the ChatML template used by SmolLM2
/// (`<|im_start|>role\ncontent<|im_end|>\n`), ending with an open assistant turn when
/// `add_generation_prompt` is set.
pub fn chat_prompt(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// A Hugging Face `tokenizer.json` document for a byte-level BPE with SmolLM2's
/// pre-tokenization (single digits, GPT-2 regex, no prefix space). `tokens[i]` is the
/// byte-level string of id `i`; `merges` are `"a b"` pairs in rank order; `specials` are ids
/// matched literally in input text.
pub fn tokenizer_json(tokens: &[String], merges: &[String], specials: &[u32]) -> Value {
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let added: Vec<Value> = specials
        .iter()
        .filter_map(|&id| tokens.get(id as usize).map(|t| (id, t)))
        .map(|(id, t)| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

/// The 256 byte-level symbols of GPT-2's byte-to-unicode table, indexed by byte value.
pub fn byte_level_alphabet() -> Vec<String> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = vec![0u32; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        if printable.contains(&b) {
            map[b as usize] = b;
        } else {
            map[b as usize] = 256 + extra;
            extra += 1;
        }
    }
    map.iter()
        .map(|&c| char::from_u32(c).map(String::from).unwrap_or_default())
        .collect()
}
