//! Which decoder architecture a checkpoint is, and the one check both file formats go
//! through: a Hugging Face `config.json` names it in `architectures` (`LlamaForCausalLM`), a
//! GGUF file in its `general.architecture` metadata (`llama`). Anything else fails at load
//! with an error naming what the file says and every architecture this build serves.
//!
//! Invariant: a [`super::ModelConfig`] always holds a supported [`Architecture`]. What an
//! architecture does differently is data ([`super::family::Family`]), read by one
//! config-driven layer per runner; adding one is a variant here and its row of data there.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// A decoder architecture this build serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama: pre-norm RMSNorm, half-split RoPE, grouped-query attention without biases,
    /// SwiGLU MLP (also SmolLM2, TinyLlama, Llama 2/3).
    #[default]
    Llama,
    /// Mistral: Llama's block, sliding-window attention where the config sets a window.
    Mistral,
    /// Qwen2 and Qwen2.5: Llama's block with biases on Q, K and V.
    Qwen2,
    /// Qwen3: Llama's block with a per-head RMSNorm on Q and K.
    Qwen3,
    /// Gemma 3 (text): scaled embeddings, (1 + w) norms before and after attention and MLP,
    /// QK-norm, GeGLU, interleaved sliding-window and global layers.
    Gemma3,
}

impl Architecture {
    /// Every supported architecture.
    pub const ALL: [Architecture; 5] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Gemma3,
    ];

    /// The class name a Hugging Face `config.json` lists in `architectures`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    /// The value of a GGUF file's `general.architecture` (and its metadata key prefix).
    /// llama.cpp's converter writes Mistral as `llama` (its window is not kept), so a
    /// `llama` file is read as Llama.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Architecture::Llama | Architecture::Mistral => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
        }
    }

    /// The architecture of a Hugging Face `architectures` list: the first entry this build
    /// serves. `Gemma3ForConditionalGeneration` is not among them: its checkpoints nest the
    /// text model under `language_model`, which this loader does not read.
    pub fn from_hf_names(names: &[String]) -> Result<Self> {
        let found = names
            .iter()
            .find_map(|n| Self::ALL.into_iter().find(|a| a.hf_name() == n));
        found.ok_or_else(|| refusal(&names.join(", "), "config.json architectures"))
    }

    /// The architecture of a GGUF `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.gguf_name() == name)
            .ok_or_else(|| refusal(name, "GGUF general.architecture"))
    }

    /// The error for a checkpoint that does not say its architecture.
    pub fn missing(source: &str) -> Error {
        refusal("", source)
    }
}

/// The one error for an architecture this build does not serve (empty `what`: none given).
fn refusal(what: &str, source: &str) -> Error {
    let supported: Vec<String> = Architecture::ALL
        .iter()
        .map(|a| format!("{} (GGUF: {})", a.hf_name(), a.gguf_name()))
        .collect();
    let said = if what.is_empty() {
        format!("{source} is missing")
    } else {
        format!("unsupported architecture {what:?} ({source})")
    };
    Error::UnsupportedModel(format!("{said}; supported: {}", supported.join(", ")))
}

/// Serde form of the field: `"architectures": ["LlamaForCausalLM"]`.
pub(crate) mod hf_list {
    use super::*;

    /// Writes the one-entry list.
    pub fn serialize<S: Serializer>(
        a: &Architecture,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        [a.hf_name()].serialize(s)
    }

    /// Reads the list through [`Architecture::from_hf_names`].
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Architecture, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        Architecture::from_hf_names(&names).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn both_formats_go_through_one_check() {
        let llama = vec!["LlamaForCausalLM".to_string()];
        assert_eq!(
            Architecture::from_hf_names(&llama).unwrap(),
            Architecture::Llama
        );
        assert_eq!(
            Architecture::from_gguf_name("llama").unwrap(),
            Architecture::Llama
        );
        for a in Architecture::ALL {
            assert_eq!(
                Architecture::from_hf_names(&[a.hf_name().into()]).unwrap(),
                a
            );
        }
        let qwen3 = Architecture::from_gguf_name("qwen3").unwrap();
        assert_eq!(qwen3, Architecture::Qwen3);
        assert_eq!(
            Architecture::from_gguf_name("gemma3").unwrap(),
            Architecture::Gemma3
        );
        let gpt2 = Architecture::from_hf_names(&["GPT2LMHeadModel".into()])
            .unwrap_err()
            .to_string();
        assert!(gpt2.contains("\"GPT2LMHeadModel\""), "{gpt2}");
        assert!(
            gpt2.contains("supported: LlamaForCausalLM (GGUF: llama)"),
            "{gpt2}"
        );
        assert!(
            gpt2.contains("Qwen3ForCausalLM (GGUF: qwen3), Gemma3ForCausalLM (GGUF: gemma3)"),
            "{gpt2}"
        );
        let phi = Architecture::from_gguf_name("phi3")
            .unwrap_err()
            .to_string();
        assert!(
            phi.contains("\"phi3\" (GGUF general.architecture)"),
            "{phi}"
        );
        assert!(phi.contains("supported: LlamaForCausalLM"), "{phi}");
    }
}
