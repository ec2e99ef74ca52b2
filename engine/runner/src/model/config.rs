//! A decoder's architecture and hyper-parameters. Read from a Hugging Face `config.json` or
//! from GGUF metadata (`{arch}.*` keys); both produce the same [`ModelConfig`], and both name
//! the architecture through [`Architecture`]'s one check (an unsupported or missing one is an
//! error at load). A field `config.json` leaves out takes the default of the architecture's
//! Hugging Face config class ([`super::family::Family::defaults`]), as transformers does.
//! Invariants checked by [`ModelConfig::validate`]: kv heads divide heads, head_dim even, no
//! zero size, a known activation and RoPE kind, `layer_types` one per layer.

use serde::{Deserialize, Serialize};

use super::arch_params::ArchParams;
use super::architecture::{Architecture, hf_list};
use crate::error::{Error, Result};

/// Hyper-parameters of a decoder (Hugging Face `config.json` field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// The architecture (`architectures` in `config.json`, `general.architecture` in GGUF).
    #[serde(rename = "architectures", with = "hf_list")]
    pub architecture: Architecture,
    /// Model width.
    pub hidden_size: usize,
    /// Gated MLP inner width.
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
    /// RoPE base frequency (of the global layers, where they differ).
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
    /// End-of-sequence token ids (`config.json` gives one id or a list).
    #[serde(default, with = "token_ids")]
    pub eos_token_id: Vec<u32>,
    /// The fields only some architectures have (head_dim, windows, RoPE scaling, ...).
    #[serde(flatten)]
    pub arch: ArchParams,
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

/// Just the `architectures` field, read before the rest so a file of another architecture
/// is refused for that, not for a field it lacks.
#[derive(Deserialize)]
struct ArchitectureProbe {
    architectures: Option<Vec<String>>,
}

impl ModelConfig {
    /// Key/value heads, resolving the default.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width: `head_dim` where the config sets it, else hidden / heads.
    pub fn head_dim(&self) -> usize {
        self.arch
            .head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Width of all query heads together (the hidden size unless `head_dim` says otherwise).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads() * self.head_dim()
    }

    /// Parses a Hugging Face `config.json` body; an error names the field it failed on
    /// (serde's own message says "invalid type" without saying where).
    pub fn from_json(text: &str) -> Result<Self> {
        // A probe that does not parse (bad JSON, a non-list) is reported by the full parse.
        let mut architecture = None;
        if let Ok(probe) = serde_json::from_str::<ArchitectureProbe>(text) {
            match probe.architectures {
                None => return Err(Architecture::missing("config.json architectures")),
                Some(names) => architecture = Some(Architecture::from_hf_names(&names)?),
            };
        }
        let mut value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("config.json: {e}")))?;
        if let (Some(a), Some(obj)) = (architecture, value.as_object_mut()) {
            for (key, default) in a.family().defaults() {
                obj.entry(key.to_string()).or_insert(default);
            }
        }
        let cfg: ModelConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let at = e.path().to_string();
            let inner = e.into_inner();
            if at.is_empty() || at == "." {
                Error::Config(format!("config.json: {inner}"))
            } else {
                Error::Config(format!("config.json: field {at}: {inner}"))
            }
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the shape invariants every other part relies on.
    pub fn validate(&self) -> Result<()> {
        let heads = self.num_attention_heads;
        let explicit_head_dim = self.arch.head_dim.is_some();
        if heads == 0 || (!explicit_head_dim && !self.hidden_size.is_multiple_of(heads)) {
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
        let sizes = [
            ("num_hidden_layers", self.num_hidden_layers),
            ("vocab_size", self.vocab_size),
            ("intermediate_size", self.intermediate_size),
            ("hidden_size", self.hidden_size),
            ("head_dim", self.head_dim()),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, n)| *n == 0) {
            return Err(Error::Config(format!("{name} must be > 0")));
        }
        self.arch.validate(self.num_hidden_layers)
    }

    /// Parameter count (token embedding counted once when tied; biases and norms of the
    /// architecture's layers included).
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let (qd, kvd) = (self.q_dim(), self.kv_dim());
        let fam = self.architecture.family();
        let norms = fam.norms.count() * h + usize::from(fam.qk_norm) * 2 * self.head_dim();
        let bias = if fam.qkv_bias || self.arch.attention_bias {
            qd + 2 * kvd
        } else {
            0
        };
        let layer = 2 * h * qd + 2 * h * kvd + 3 * h * self.intermediate_size + norms + bias;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_hidden_layers * layer + h + head
    }
}

/// Serde form of `eos_token_id`: one id or a list of them (Llama 3.1 and Gemma 3 list
/// several); written back as one id when there is one.
mod token_ids {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(u32),
        Many(Vec<u32>),
    }

    pub fn serialize<S: Serializer>(ids: &[u32], s: S) -> Result<S::Ok, S::Error> {
        match ids {
            [] => s.serialize_none(),
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
        Ok(match Option::<OneOrMany>::deserialize(d)? {
            None => Vec::new(),
            Some(OneOrMany::One(id)) => vec![id],
            Some(OneOrMany::Many(ids)) => ids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}"#;

    fn err(text: &str) -> String {
        match ModelConfig::from_json(text) {
            Ok(c) => panic!("accepted {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_bad_config_names_the_field() {
        let ok = ModelConfig::from_json(TINY).expect("tiny config");
        assert_eq!((ok.kv_heads(), ok.head_dim()), (2, 16));
        let missing = err(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128}"#,
        );
        assert!(
            missing.contains("missing field `num_hidden_layers`"),
            "{missing}"
        );
        let bad = err(&TINY.replace("\"hidden_size\": 64", "\"hidden_size\": \"wide\""));
        assert!(bad.contains("field hidden_size: invalid type"), "{bad}");
        let zero = err(&TINY.replace("\"vocab_size\": 512", "\"vocab_size\": 0"));
        assert!(zero.contains("vocab_size must be > 0"), "{zero}");
        let heads = err(&TINY.replace("\"num_attention_heads\": 4", "\"num_attention_heads\": 5"));
        assert!(
            heads.contains("not divisible by num_attention_heads 5"),
            "{heads}"
        );
    }

    #[test]
    fn another_architecture_is_refused_naming_it_and_the_supported_ones() {
        let gpt2 = err(&TINY.replace("LlamaForCausalLM", "GPT2LMHeadModel"));
        assert!(
            gpt2.contains("unsupported architecture \"GPT2LMHeadModel\""),
            "{gpt2}"
        );
        assert!(gpt2.contains("supported: LlamaForCausalLM"), "{gpt2}");
        // Refused for its architecture even when it also lacks Llama's fields.
        let bare = err(r#"{"architectures": ["GPT2LMHeadModel"], "n_embd": 768}"#);
        assert!(bare.contains("GPT2LMHeadModel"), "{bare}");
        let none = err(&TINY.replace(r#""architectures": ["LlamaForCausalLM"], "#, ""));
        assert!(
            none.contains("config.json architectures is missing"),
            "{none}"
        );
        assert!(none.contains("supported: LlamaForCausalLM"), "{none}");
        // The first entry this build serves is taken; the field round-trips.
        let multi = TINY.replace(r#"["LlamaForCausalLM"]"#, r#"["Foo", "LlamaForCausalLM"]"#);
        let cfg = ModelConfig::from_json(&multi).expect("second entry served");
        assert_eq!(cfg.architecture, Architecture::Llama);
        let text = serde_json::to_string(&cfg).expect("serialize");
        assert!(
            text.contains(r#""architectures":["LlamaForCausalLM"]"#),
            "{text}"
        );
        assert_eq!(ModelConfig::from_json(&text).expect("round trip"), cfg);
    }

    #[test]
    fn eos_ids_are_one_id_or_a_list_and_head_dim_may_differ_from_hidden_over_heads() {
        let one = ModelConfig::from_json(&TINY.replace("}", r#", "eos_token_id": 7}"#)).unwrap();
        assert_eq!(one.eos_token_id, vec![7]);
        let many = TINY.replace("}", r#", "eos_token_id": [1, 106], "head_dim": 32}"#);
        let many = ModelConfig::from_json(&many).unwrap();
        assert_eq!(many.eos_token_id, vec![1, 106]);
        assert_eq!(
            (many.head_dim(), many.q_dim(), many.kv_dim()),
            (32, 128, 64)
        );
        let text = serde_json::to_string(&many).unwrap();
        assert_eq!(ModelConfig::from_json(&text).unwrap(), many);
    }

    #[test]
    fn a_missing_field_takes_the_architecture_s_default() {
        let gemma = TINY.replace("LlamaForCausalLM", "Gemma3ForCausalLM");
        let cfg = ModelConfig::from_json(&gemma).unwrap();
        assert!(cfg.tie_word_embeddings, "Gemma 3 ties by default");
        assert_eq!(cfg.rms_norm_eps, 1e-6);
        assert_eq!(cfg.head_dim(), 256);
        let llama = ModelConfig::from_json(TINY).unwrap();
        assert!(!llama.tie_word_embeddings);
    }
}
