//! What each architecture family does differently from Llama, as data: one [`Family`] row
//! per [`Architecture`]. The runners and the dense reference read these flags (resolved with
//! the config into [`super::spec::ModelSpec`]); none of them matches on the architecture.
//!
//! Invariant: a flag here is a property of the family's Hugging Face modeling code (what
//! transformers always does for it); what a config may switch is in
//! [`super::arch_params::ArchParams`].

use serde_json::{Value, json};

use super::architecture::Architecture;

/// The RMSNorm tensors of one decoder block, by their Hugging Face names under
/// `model.layers.{i}.` (without `.weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockNorms {
    /// Before attention.
    pub attn_in: &'static str,
    /// On the attention's output, before the residual add (Gemma).
    pub attn_out: Option<&'static str>,
    /// Before the MLP.
    pub mlp_in: &'static str,
    /// On the MLP's output, before the residual add (Gemma).
    pub mlp_out: Option<&'static str>,
}

impl BlockNorms {
    /// Norm tensors per block.
    pub fn count(&self) -> usize {
        2 + usize::from(self.attn_out.is_some()) + usize::from(self.mlp_out.is_some())
    }
}

/// Llama's two pre-norms (`post_attention_layernorm` is the MLP's input norm there).
const PRE_NORMS: BlockNorms = BlockNorms {
    attn_in: "input_layernorm",
    attn_out: None,
    mlp_in: "post_attention_layernorm",
    mlp_out: None,
};

/// Gemma's norms before and after each sub-block.
const SANDWICH_NORMS: BlockNorms = BlockNorms {
    attn_in: "input_layernorm",
    attn_out: Some("post_attention_layernorm"),
    mlp_in: "pre_feedforward_layernorm",
    mlp_out: Some("post_feedforward_layernorm"),
};

/// Which layers slide when `config.json` has no `layer_types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowRule {
    /// No layer (Llama).
    Never,
    /// Every layer, when the config sets `sliding_window` (Mistral).
    EveryLayer,
    /// With `use_sliding_window`, the layers from `max_window_layers` on (Qwen).
    FromMaxWindowLayers,
    /// All but every `sliding_window_pattern`-th layer (Gemma 3: 5 sliding, 1 global).
    AllButEveryNth,
}

/// One family's differences from Llama.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    /// Q, K and V projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Q and K are RMS-normed per head before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norm scales are stored as offsets from one: the norm multiplies by `1 + w` (Gemma).
    pub norm_plus_one: bool,
    /// Embedding rows are multiplied by `sqrt(hidden_size)` (Gemma).
    pub scaled_embedding: bool,
    /// The block's norms.
    pub norms: BlockNorms,
    /// Which layers slide.
    pub windows: WindowRule,
    /// Sliding layers have their own RoPE base, `rope_local_base_freq` (Gemma 3).
    pub local_rope_base: bool,
    /// Config fields the family's config class defaults differently from Llama's.
    defaults: &'static [(&'static str, ConfigDefault)],
}

const LLAMA: Family = Family {
    qkv_bias: false,
    qk_norm: false,
    norm_plus_one: false,
    scaled_embedding: false,
    norms: PRE_NORMS,
    windows: WindowRule::Never,
    local_rope_base: false,
    defaults: &[],
};

use ConfigDefault::{Bool, Float, Int, Text};

/// MistralConfig: a 4096-token window unless the config says null.
const MISTRAL_DEFAULTS: &[(&str, ConfigDefault)] =
    &[("rms_norm_eps", Float(1e-6)), ("sliding_window", Int(4096))];

/// Qwen2Config.
const QWEN2_DEFAULTS: &[(&str, ConfigDefault)] = &[
    ("rms_norm_eps", Float(1e-6)),
    ("use_sliding_window", Bool(false)),
];

/// Qwen3Config.
const QWEN3_DEFAULTS: &[(&str, ConfigDefault)] = &[
    ("rms_norm_eps", Float(1e-6)),
    ("head_dim", Int(128)),
    ("use_sliding_window", Bool(false)),
];

/// Gemma3TextConfig.
const GEMMA3_DEFAULTS: &[(&str, ConfigDefault)] = &[
    ("tie_word_embeddings", Bool(true)),
    ("rms_norm_eps", Float(1e-6)),
    ("rope_theta", Float(1_000_000.0)),
    ("head_dim", Int(256)),
    ("query_pre_attn_scalar", Float(256.0)),
    ("sliding_window", Int(4096)),
    ("sliding_window_pattern", Int(6)),
    ("rope_local_base_freq", Float(10_000.0)),
    ("hidden_activation", Text("gelu_pytorch_tanh")),
    ("max_position_embeddings", Int(131_072)),
];

impl Architecture {
    /// The family's row.
    pub fn family(self) -> Family {
        match self {
            Architecture::Llama => LLAMA,
            Architecture::Mistral => Family {
                windows: WindowRule::EveryLayer,
                defaults: MISTRAL_DEFAULTS,
                ..LLAMA
            },
            Architecture::Qwen2 => Family {
                qkv_bias: true,
                windows: WindowRule::FromMaxWindowLayers,
                defaults: QWEN2_DEFAULTS,
                ..LLAMA
            },
            Architecture::Qwen3 => Family {
                qk_norm: true,
                windows: WindowRule::FromMaxWindowLayers,
                defaults: QWEN3_DEFAULTS,
                ..LLAMA
            },
            Architecture::Gemma3 => Family {
                qkv_bias: false,
                qk_norm: true,
                norm_plus_one: true,
                scaled_embedding: true,
                norms: SANDWICH_NORMS,
                windows: WindowRule::AllButEveryNth,
                local_rope_base: true,
                defaults: GEMMA3_DEFAULTS,
            },
        }
    }
}

/// A default value of a config field (const, so a family's row can hold its defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConfigDefault {
    /// A flag.
    Bool(bool),
    /// A count.
    Int(u64),
    /// A real number.
    Float(f64),
    /// A name.
    Text(&'static str),
}

impl ConfigDefault {
    /// As a JSON value.
    pub fn to_json(self) -> Value {
        match self {
            ConfigDefault::Bool(b) => json!(b),
            ConfigDefault::Int(n) => json!(n),
            ConfigDefault::Float(x) => json!(x),
            ConfigDefault::Text(t) => json!(t),
        }
    }
}

impl Family {
    /// The defaults of the family's Hugging Face config class for the fields that a
    /// `config.json` may leave out and that differ from Llama's (transformers fills them in
    /// the same way).
    pub fn defaults(&self) -> impl Iterator<Item = (&'static str, Value)> {
        self.defaults.iter().map(|(k, d)| (*k, d.to_json()))
    }
}
