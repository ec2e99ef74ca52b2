//! Model loading: a checkpoint of a supported [`Architecture`] (config, weights, tokenizer)
//! from either a Hugging Face directory (`config.json`, `*.safetensors`, `tokenizer.json`)
//! or a GGUF file (weights and tokenizer from its metadata). Loading never downloads
//! anything and never panics; bad files give an [`crate::Error`], and a file of another
//! architecture is refused before its weights are read.

pub mod arch_params;
pub mod architecture;
pub mod chat_template;
pub mod config;
pub mod dense;
pub mod family;
pub mod random;
pub mod spec;
pub mod tokenizer;
pub mod weights;

mod gguf_arch;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;

pub use architecture::Architecture;
pub use chat_template::ChatFormat;
pub use config::ModelConfig;
pub use dense::DenseDecoder;
pub use spec::ModelSpec;
pub use tokenizer::{ChatMessage, TextStream, Tokenizer, chat_prompt};
pub use weights::Weights;

use crate::error::{Error, Result};

/// A checkpoint loaded into memory.
#[derive(Debug)]
pub struct ModelFiles {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// f32 weights by Hugging Face name.
    pub weights: Weights,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

impl ModelFiles {
    /// Loads `path`: a `.gguf` file, a directory holding one `.gguf` file, or a Hugging Face
    /// directory with `config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        if path.is_file() {
            return Self::load_gguf(path);
        }
        if path.join("config.json").is_file() {
            return Self::load_hf_dir(path);
        }
        match find_gguf(path)? {
            Some(file) => Self::load_gguf(&file),
            None => Err(Error::UnsupportedModel(format!(
                "{}: neither a .gguf file nor a directory with config.json",
                path.display()
            ))),
        }
    }

    /// Loads `path` in a given format (`--model-format`, the pool's `model.format`): a
    /// format the files are not in is an error at start, never a silent switch.
    pub fn load_as(path: &Path, format: ModelFormat) -> Result<Self> {
        match format {
            ModelFormat::Auto => Self::load(path),
            ModelFormat::Safetensors if path.join("config.json").is_file() => {
                Self::load_hf_dir(path)
            }
            ModelFormat::Safetensors => Err(Error::UnsupportedModel(format!(
                "{}: the pool says Safetensors, but this is not a directory with config.json",
                path.display()
            ))),
            ModelFormat::Gguf if path.is_file() => Self::load_gguf(path),
            ModelFormat::Gguf => match find_gguf(path)? {
                Some(file) => Self::load_gguf(&file),
                None => Err(Error::UnsupportedModel(format!(
                    "{}: the pool says GGUF, but there is no .gguf file here",
                    path.display()
                ))),
            },
        }
    }

    /// Loads a Hugging Face model directory.
    pub fn load_hf_dir(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let config = ModelConfig::from_json(&text)?;
        let weights = Weights::from_safetensors_dir(dir)?;
        let chat = chat_template::from_hf_dir(dir)?;
        let mut tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        tokenizer.add_eos_ids(&config.eos_token_id);
        let tokenizer = tokenizer.with_chat_format(chat_format(chat));
        Ok(Self {
            config,
            weights,
            tokenizer,
        })
    }

    /// Loads a GGUF file, dequantizing every tensor to f32.
    pub fn load_gguf(file: &Path) -> Result<Self> {
        let f = File::open(file).map_err(|e| Error::io(file, e))?;
        let mut reader = BufReader::new(f);
        let content = gguf_file::Content::read(&mut reader)?;
        let architecture = gguf_architecture(&content)?;
        let mut tokenizer = Tokenizer::from_gguf(&content)?;
        let config = config_from_gguf(&content, &mut reader, architecture, tokenizer.vocab_size())?;
        tokenizer.add_eos_ids(&config.eos_token_id);
        let chat = chat_template::from_gguf(&content, &tokenizer)?;
        let tokenizer = tokenizer.with_chat_format(chat_format(chat));
        let weights = Weights::from_gguf(&content, &mut reader, &config)?;
        Ok(Self {
            config,
            weights,
            tokenizer,
        })
    }
}

/// The model's own template, or the built-in format (said at start: a model whose template
/// differs would otherwise answer badly without any error).
fn chat_format(template: Option<chat_template::ChatTemplate>) -> ChatFormat {
    match template {
        Some(t) => {
            tracing::info!("chat prompts rendered with the model's chat template");
            ChatFormat::Template(t)
        }
        None => {
            tracing::warn!(
                "the model has no chat template; chat prompts use the built-in ChatML format"
            );
            ChatFormat::BuiltIn
        }
    }
}

/// Weight format a model is loaded as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelFormat {
    /// Detect from the files present.
    #[default]
    Auto,
    /// Hugging Face layout: config.json, *.safetensors, tokenizer.json.
    Safetensors,
    /// A GGUF file (or a directory holding one).
    Gguf,
}

fn find_gguf(dir: &Path) -> Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut found = Vec::new();
    for entry in entries {
        let p = entry.map_err(|e| Error::io(dir, e))?.path();
        if p.extension().is_some_and(|x| x == "gguf") {
            found.push(p);
        }
    }
    found.sort();
    Ok(found.into_iter().next())
}

/// The file's `general.architecture`, through the same check as `config.json`'s.
fn gguf_architecture(content: &gguf_file::Content) -> Result<Architecture> {
    match content.metadata.get("general.architecture") {
        Some(v) => Architecture::from_gguf_name(v.to_string()?),
        None => Err(Architecture::missing("GGUF general.architecture")),
    }
}

fn config_from_gguf<R: std::io::Read + std::io::Seek>(
    content: &gguf_file::Content,
    reader: &mut R,
    architecture: Architecture,
    vocab: usize,
) -> Result<ModelConfig> {
    let md = &content.metadata;
    let prefix = architecture.gguf_name();
    let get = |k: &str| md.get(&format!("{prefix}.{k}"));
    let u = |k: &str| -> Result<usize> {
        let v =
            get(k).ok_or_else(|| Error::Config(format!("gguf metadata {prefix}.{k} missing")))?;
        Ok(v.to_u32().or_else(|_| v.to_u64().map(|x| x as u32))? as usize)
    };
    let f = |k: &str| -> Result<Option<f64>> { get(k).map(|v| Ok(v.to_f32()? as f64)).transpose() };
    let tok_id = |k: &str| md.get(k).and_then(|v| v.to_u32().ok());
    let heads = u("attention.head_count")?;
    let hidden = u("embedding_length")?;
    // The GGUF names only what llama.cpp reads from it; the rest is what llama.cpp assumes
    // for the architecture (`gguf_arch`).
    let head_dim = u("attention.key_length")
        .ok()
        .filter(|&d| d * heads != hidden);
    let cfg = ModelConfig {
        architecture,
        hidden_size: hidden,
        intermediate_size: u("feed_forward_length")?,
        num_hidden_layers: u("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: Some(u("attention.head_count_kv").unwrap_or(heads)),
        vocab_size: vocab,
        rms_norm_eps: f("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
        rope_theta: f("rope.freq_base")?.unwrap_or(10_000.0),
        max_position_embeddings: u("context_length").unwrap_or(2048),
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
        eos_token_id: tok_id("tokenizer.ggml.eos_token_id").into_iter().collect(),
        arch: gguf_arch::params(content, reader, architecture, head_dim)?,
    };
    cfg.validate()?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A GGUF file with only `general.architecture` (and no tensors).
    fn gguf_of(arch: Option<&str>) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let value = arch.map(|a| gguf_file::Value::String(a.into()));
        let metadata: Vec<(&str, &gguf_file::Value)> =
            value.iter().map(|v| ("general.architecture", v)).collect();
        gguf_file::write(&mut file.reopen().unwrap(), &metadata, &[]).unwrap();
        file
    }

    #[test]
    fn a_gguf_of_another_architecture_is_refused_naming_it_and_the_supported_ones() {
        let err = ModelFiles::load_gguf(gguf_of(Some("phi3")).path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unsupported architecture \"phi3\" (GGUF general.architecture)"),
            "{err}"
        );
        assert!(
            err.contains("supported: LlamaForCausalLM (GGUF: llama)"),
            "{err}"
        );
        let err = ModelFiles::load_gguf(gguf_of(None).path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("GGUF general.architecture is missing"),
            "{err}"
        );
    }
}
