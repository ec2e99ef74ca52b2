//! Llama architecture hyper-parameters. Read from a Hugging Face `config.json` or from GGUF
//! metadata (`llama.*` keys); both produce the same [`LlamaConfig`]. Invariants checked by
//! [`LlamaConfig::validate`]: heads divide hidden size, kv heads divide heads, head_dim even.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Hyper-parameters of a Llama-architecture decoder (Hugging Face `config.json` field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Model width.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to `num_attention_heads`.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base frequency.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Longest context the model was trained for.
    #[serde(default = "default_ctx")]
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the token embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Beginning-of-sequence token id, when the model has one.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token id, when the model has one.
    #[serde(default)]
    pub eos_token_id: Option<u32>,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_ctx() -> usize {
    2048
}

impl LlamaConfig {
    /// Key/value heads, resolving the default.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Parses a Hugging Face `config.json` body.
    pub fn from_json(text: &str) -> Result<Self> {
        let cfg: LlamaConfig =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("config.json: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the shape invariants every other part relies on.
    pub fn validate(&self) -> Result<()> {
        let heads = self.num_attention_heads;
        if heads == 0 || !self.hidden_size.is_multiple_of(heads) {
            return Err(Error::Config(format!(
                "hidden_size {} not divisible by num_attention_heads {heads}",
                self.hidden_size
            )));
        }
        let kv = self.kv_heads();
        if kv == 0 || !heads.is_multiple_of(kv) {
            return Err(Error::Config(format!(
                "num_attention_heads {heads} not divisible by num_key_value_heads {kv}"
            )));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(Error::Config("head_dim must be even for RoPE".into()));
        }
        if self.num_hidden_layers == 0 || self.vocab_size == 0 || self.intermediate_size == 0 {
            return Err(Error::Config("empty model dimensions".into()));
        }
        Ok(())
    }

    /// Parameter count (token embedding counted once when tied).
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let kvd = self.kv_heads() * self.head_dim();
        let layer = h * h * 2 + h * kvd * 2 + 3 * h * self.intermediate_size + 2 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_hidden_layers * layer + h + head
    }
}
