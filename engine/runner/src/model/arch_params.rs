//! The `config.json` fields only some architectures have, as their Hugging Face config
//! classes name them: an explicit `head_dim`, attention biases, sliding windows and which
//! layers use them, RoPE scaling (the older `rope_scaling` / `rope_local_base_freq` and the
//! newer `rope_parameters`, per layer type or not), Gemma's query scale and logit
//! softcapping, the MLP activation. What they mean for the layers is resolved once by
//! [`super::spec::ModelSpec`]; this file only reads and checks them.
//!
//! Invariant: after [`ArchParams::validate`], the activation and every RoPE kind are ones
//! the runners implement, and `layer_types` (when given) has one entry per layer.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Architecture-specific fields of `config.json` (all optional; a family fills its defaults
/// in before these are read).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArchParams {
    /// Per-head width, where it is not hidden / heads (Qwen3, Gemma 3, Mistral Nemo).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Biases on Q, K, V and O (Llama's and Qwen3's flag; Qwen2 has Q/K/V biases always).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_bias: bool,
    /// The sliding window, in tokens a query sees (itself included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// Qwen: whether the window is used at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    /// Qwen: layers below this one attend globally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window_layers: Option<usize>,
    /// Gemma 3 (older configs): every n-th layer is global, the others slide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<usize>,
    /// Each layer's attention, where the config lists them (newer configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<LayerType>>,
    /// RoPE scaling of the (global) layers (older configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeParams>,
    /// RoPE base of Gemma 3's sliding layers (older configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f64>,
    /// RoPE of every layer, or per layer type (newer configs; wins over the fields above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// Gemma: attention scores are scaled by `query_pre_attn_scalar^-0.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma: logits become `cap · tanh(logits / cap)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 2's attention softcapping: refused (Gemma 3 has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcapping: Option<f64>,
    /// The MLP activation (most configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    /// The MLP activation (Gemma's name for it; read first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_activation: Option<String>,
    /// llama.cpp's form of Llama 3 RoPE scaling: one divisor per frequency, read from a
    /// GGUF file's `rope_freqs` tensor (a Hugging Face config says `rope_scaling` instead).
    #[serde(skip)]
    pub rope_freq_factors: Option<Vec<f64>>,
}

/// A layer's attention, as `layer_types` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Attends to every earlier position.
    FullAttention,
    /// Attends to the last `sliding_window` positions.
    SlidingAttention,
}

/// One RoPE: its kind, base and scaling parameters (Hugging Face's keys).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RopeParams {
    /// `default`, `linear` or `llama3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    /// The older key for the same.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Base frequency (in `rope_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Scaling factor (linear: positions divided by it; llama3: long wavelengths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// llama3: wavelengths beyond `original / low_freq_factor` are scaled fully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_freq_factor: Option<f64>,
    /// llama3: wavelengths below `original / high_freq_factor` are not scaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_freq_factor: Option<f64>,
    /// llama3: the context the model was first trained at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
}

impl RopeParams {
    /// The kind, `default` when unnamed.
    pub fn kind(&self) -> &str {
        self.rope_type
            .as_deref()
            .or(self.type_.as_deref())
            .unwrap_or("default")
    }

    fn check(&self, at: &str) -> Result<()> {
        match self.kind() {
            "default" | "linear" | "llama3" => Ok(()),
            other => Err(Error::Config(format!(
                "config.json: {at}: RoPE type {other:?} is not served \
                 (served: default, linear, llama3)"
            ))),
        }
    }
}

/// `rope_parameters`: one RoPE for every layer, or one per layer type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RopeParameters {
    /// Gemma 3: the global and the sliding layers each have their own.
    PerLayerType {
        /// For `full_attention` layers.
        full_attention: RopeParams,
        /// For `sliding_attention` layers.
        sliding_attention: RopeParams,
    },
    /// The same for all layers.
    All(RopeParams),
}

/// The MLP's activation (of the gate, multiplied by the up projection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(g) = g · sigmoid(g)`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

impl ArchParams {
    /// The MLP activation named by the config (SiLU when it names none).
    pub fn activation(&self) -> Result<Activation> {
        let name = self
            .hidden_activation
            .as_deref()
            .or(self.hidden_act.as_deref())
            .unwrap_or("silu");
        match name {
            "silu" | "swish" => Ok(Activation::Silu),
            "gelu_pytorch_tanh" | "gelu_tanh" => Ok(Activation::GeluTanh),
            other => Err(Error::Config(format!(
                "config.json: activation {other:?} is not served (served: silu, gelu_pytorch_tanh)"
            ))),
        }
    }

    /// Checks what the runners rely on (see the module note).
    pub fn validate(&self, layers: usize) -> Result<()> {
        self.activation()?;
        if let Some(r) = &self.rope_scaling {
            r.check("rope_scaling")?;
        }
        match &self.rope_parameters {
            Some(RopeParameters::All(r)) => r.check("rope_parameters")?,
            Some(RopeParameters::PerLayerType {
                full_attention,
                sliding_attention,
            }) => {
                full_attention.check("rope_parameters.full_attention")?;
                sliding_attention.check("rope_parameters.sliding_attention")?;
            }
            None => {}
        }
        if let Some(types) = &self.layer_types
            && types.len() != layers
        {
            return Err(Error::Config(format!(
                "config.json: layer_types has {} entries for {layers} layers",
                types.len()
            )));
        }
        if self.attn_logit_softcapping.is_some() {
            return Err(Error::Config(
                "config.json: attn_logit_softcapping (Gemma 2) is not served".into(),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(Error::Config(
                "config.json: sliding_window must be > 0".into(),
            ));
        }
        Ok(())
    }
}
