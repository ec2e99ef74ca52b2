//! Where a model keeps its chat template: in a Hugging Face directory, `chat_template.jinja`
//! (what transformers writes now) or the `chat_template` of `tokenizer_config.json` (a
//! string, or a list of named templates of which `default` is taken), with the special
//! tokens as `tokenizer_config.json` names them (a string or an `{"content": ...}` entry);
//! in a GGUF file, `tokenizer.chat_template`, with the special tokens named by id.
//!
//! Invariant: a model without a template gives `None` (the built-in format is used); a
//! template that is there but unreadable is an error, never silently replaced.

use std::path::Path;

use candle_core::quantized::gguf_file;
use serde_json::Value as Json;

use super::{ChatTemplate, SpecialTokens};
use crate::error::{Error, Result};
use crate::model::Tokenizer;

/// The template of a Hugging Face model directory, if it has one.
pub fn from_hf_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
    let cfg_path = dir.join("tokenizer_config.json");
    let cfg: Json = match std::fs::read_to_string(&cfg_path) {
        Ok(text) => serde_json::from_str(&text)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", cfg_path.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Json::Null,
        Err(e) => return Err(Error::io(&cfg_path, e)),
    };
    let jinja = dir.join("chat_template.jinja");
    let source = if jinja.is_file() {
        Some(std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?)
    } else {
        config_template(&cfg)
    };
    let tokens = SpecialTokens {
        bos: token_text(&cfg["bos_token"]),
        eos: token_text(&cfg["eos_token"]),
        unk: token_text(&cfg["unk_token"]),
        pad: token_text(&cfg["pad_token"]),
    };
    source.map(|s| ChatTemplate::new(s, tokens)).transpose()
}

/// `chat_template` of `tokenizer_config.json`: a string, or `[{"name", "template"}]`.
fn config_template(cfg: &Json) -> Option<String> {
    match &cfg["chat_template"] {
        Json::String(s) => Some(s.clone()),
        Json::Array(named) => {
            let pick = named
                .iter()
                .find(|t| t["name"] == "default")
                .or_else(|| named.first())?;
            pick["template"].as_str().map(str::to_string)
        }
        _ => None,
    }
}

/// A special token as `tokenizer_config.json` writes it.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// The template of a GGUF file, if it has one; special tokens by their ids.
pub fn from_gguf(content: &gguf_file::Content, tok: &Tokenizer) -> Result<Option<ChatTemplate>> {
    let md = &content.metadata;
    let Some(v) = md.get("tokenizer.chat_template") else {
        return Ok(None);
    };
    let source = v.to_string()?.clone();
    let text = |key: &str| {
        md.get(key)
            .and_then(|v| v.to_u32().ok())
            .and_then(|id| tok.decode(&[id]).ok())
    };
    let tokens = SpecialTokens {
        bos: text("tokenizer.ggml.bos_token_id"),
        eos: text("tokenizer.ggml.eos_token_id"),
        unk: text("tokenizer.ggml.unknown_token_id"),
        pad: text("tokenizer.ggml.padding_token_id"),
    };
    ChatTemplate::new(source, tokens).map(Some)
}
