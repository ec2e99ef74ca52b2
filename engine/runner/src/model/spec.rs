//! The model as its layers are built: the family's flags ([`Family`]) and the config's
//! fields ([`super::arch_params::ArchParams`]) resolved once into what each layer does —
//! biases, QK-norm, the norm convention, the activation, the attention scale and, per layer,
//! its window and its RoPE. Both runners build their one config-driven layer from this, and
//! the dense reference reads the same facts (it computes the math on its own).
//!
//! Invariant: `layers` has one entry per decoder layer; a `window` of `Some(w)` means a
//! query at position `p` attends to positions `p + 1 - w ..= p` (transformers' sliding
//! window), `None` to `0 ..= p`.

use super::arch_params::{Activation, LayerType, RopeParameters, RopeParams};
use super::config::ModelConfig;
use super::family::{Family, WindowRule};

/// What the layers of a model do.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The family's flags (norm names, QK-norm, ...).
    pub family: Family,
    /// Q, K and V carry biases.
    pub qkv_bias: bool,
    /// The output projection carries a bias.
    pub o_bias: bool,
    /// Added to every stored norm scale before it multiplies (1 for Gemma's `1 + w`).
    pub norm_offset: f32,
    /// Embedding rows are multiplied by this (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// The gated MLP's activation.
    pub activation: Activation,
    /// Attention scores are multiplied by this (`head_dim^-0.5` unless the config says).
    pub attn_scale: f64,
    /// Logits become `cap · tanh(logits / cap)` (Gemma, when set).
    pub final_softcap: Option<f64>,
    /// Each layer's attention.
    pub layers: Vec<LayerAttn>,
}

/// One layer's attention span and rotary embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerAttn {
    /// The sliding window (see the module note), or `None` for global attention.
    pub window: Option<usize>,
    /// The layer's RoPE.
    pub rope: Rope,
}

/// A rotary embedding: base frequency and scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// Base frequency (`rope_theta`).
    pub theta: f64,
    /// How the frequencies are scaled.
    pub scaling: RopeScaling,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// None.
    None,
    /// Every frequency divided by `factor` (positions interpolated).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3's: long wavelengths divided by `factor`, short ones kept, a smooth blend in
    /// between.
    Llama3 {
        /// Divisor of the long wavelengths.
        factor: f64,
        /// Wavelengths beyond `original / low` are divided fully.
        low: f64,
        /// Wavelengths below `original / high` are kept.
        high: f64,
        /// The original training context.
        original: f64,
    },
    /// One divisor per frequency (llama.cpp's `rope_freqs` tensor: Llama 3's scaling, done).
    Divisors(Vec<f64>),
}

impl Rope {
    /// Inverse frequencies `theta^(-2i/head_dim)`, scaled, for `i < head_dim / 2`.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        (0..head_dim / 2)
            .map(|i| {
                let f = 1.0 / self.theta.powf(2.0 * i as f64 / head_dim as f64);
                self.scaling.apply(i, f)
            })
            .collect()
    }
}

impl RopeScaling {
    /// Frequency `i` (`f`) after scaling.
    fn apply(&self, i: usize, f: f64) -> f64 {
        match self {
            RopeScaling::None => f,
            RopeScaling::Linear { factor } => f / factor,
            RopeScaling::Divisors(d) => f / d.get(i).copied().unwrap_or(1.0),
            RopeScaling::Llama3 {
                factor,
                low,
                high,
                original,
            } => {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < original / high {
                    f
                } else if wavelen > original / low {
                    f / factor
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            }
        }
    }

    fn from_params(p: &RopeParams, max_ctx: usize) -> Self {
        match p.kind() {
            "linear" => RopeScaling::Linear {
                factor: p.factor.unwrap_or(1.0),
            },
            "llama3" => RopeScaling::Llama3 {
                factor: p.factor.unwrap_or(1.0),
                low: p.low_freq_factor.unwrap_or(1.0),
                high: p.high_freq_factor.unwrap_or(4.0),
                original: p.original_max_position_embeddings.unwrap_or(max_ctx) as f64,
            },
            // Checked at load (`ArchParams::validate`): only `default` is left.
            _ => RopeScaling::None,
        }
    }
}

impl ModelConfig {
    /// The resolved layer facts (see the module note).
    pub fn spec(&self) -> ModelSpec {
        let family = self.architecture.family();
        let a = &self.arch;
        let (global, local) = self.ropes(&family);
        let layers = (0..self.num_hidden_layers)
            .map(|i| {
                if self.slides(&family, i) {
                    LayerAttn {
                        window: a.sliding_window,
                        rope: local.clone(),
                    }
                } else {
                    LayerAttn {
                        window: None,
                        rope: global.clone(),
                    }
                }
            })
            .collect();
        ModelSpec {
            family,
            qkv_bias: family.qkv_bias || a.attention_bias,
            o_bias: a.attention_bias,
            norm_offset: if family.norm_plus_one { 1.0 } else { 0.0 },
            embed_scale: family
                .scaled_embedding
                .then(|| (self.hidden_size as f64).sqrt() as f32),
            activation: a.activation().unwrap_or(Activation::Silu),
            attn_scale: 1.0
                / a.query_pre_attn_scalar
                    .unwrap_or(self.head_dim() as f64)
                    .sqrt(),
            final_softcap: a.final_logit_softcapping,
            layers,
        }
    }

    /// Whether layer `i` uses the sliding window.
    fn slides(&self, family: &Family, i: usize) -> bool {
        let a = &self.arch;
        if let Some(types) = &a.layer_types {
            return types.get(i) == Some(&LayerType::SlidingAttention);
        }
        match family.windows {
            WindowRule::Never => false,
            WindowRule::EveryLayer => true,
            WindowRule::FromMaxWindowLayers => {
                a.use_sliding_window == Some(true) && i >= a.max_window_layers.unwrap_or(0)
            }
            WindowRule::AllButEveryNth => {
                let n = a.sliding_window_pattern.unwrap_or(6).max(1);
                !(i + 1).is_multiple_of(n)
            }
        }
    }

    /// The RoPE of the global layers and of the sliding ones.
    fn ropes(&self, family: &Family) -> (Rope, Rope) {
        let a = &self.arch;
        let max_ctx = self.max_position_embeddings;
        let from = |p: &RopeParams| Rope {
            theta: p.rope_theta.unwrap_or(self.rope_theta),
            scaling: RopeScaling::from_params(p, max_ctx),
        };
        match &a.rope_parameters {
            Some(RopeParameters::All(p)) => (from(p), from(p)),
            Some(RopeParameters::PerLayerType {
                full_attention,
                sliding_attention,
            }) => (from(full_attention), from(sliding_attention)),
            None => {
                let mut global = from(&a.rope_scaling.clone().unwrap_or_default());
                global.theta = self.rope_theta;
                if let Some(d) = &a.rope_freq_factors {
                    global.scaling = RopeScaling::Divisors(d.clone());
                }
                let local = if family.local_rope_base {
                    Rope {
                        theta: a.rope_local_base_freq.unwrap_or(10_000.0),
                        scaling: RopeScaling::None,
                    }
                } else {
                    global.clone()
                };
                (global, local)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn cfg(arch: &str, extra: &str) -> ModelConfig {
        ModelConfig::from_json(&format!(
            r#"{{"architectures": ["{arch}"], "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 512 {extra}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn gemma3_interleaves_sliding_and_global_layers_with_their_own_rope() {
        let g = cfg(
            "Gemma3ForCausalLM",
            r#", "sliding_window": 8, "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#,
        )
        .spec();
        let windows: Vec<_> = g.layers.iter().map(|l| l.window).collect();
        assert_eq!(windows, [Some(8), Some(8), Some(8), Some(8), Some(8), None]);
        assert_eq!(g.layers[0].rope.theta, 10_000.0);
        assert_eq!(g.layers[0].rope.scaling, RopeScaling::None);
        assert_eq!(g.layers[5].rope.theta, 1_000_000.0);
        assert_eq!(
            g.layers[5].rope.scaling,
            RopeScaling::Linear { factor: 8.0 }
        );
        assert_eq!((g.norm_offset, g.embed_scale), (1.0, Some(8.0)));
        assert_eq!(g.attn_scale, 1.0 / 16.0, "query_pre_attn_scalar 256");
        assert_eq!(g.activation, Activation::GeluTanh);
        // Newer configs list the layer types and the RoPE per type.
        let listed = cfg(
            "Gemma3ForCausalLM",
            r#", "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                "full_attention", "sliding_attention", "full_attention"],
                "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}"#,
        )
        .spec();
        assert_eq!(listed.layers[1].window, None);
        assert_eq!(listed.layers[2].window, Some(4096));
        assert_eq!(listed.layers[1].rope.theta, 5e5);
    }

    #[test]
    fn mistral_slides_where_set_qwen_only_when_asked_llama_never() {
        assert_eq!(
            cfg("MistralForCausalLM", "").spec().layers[3].window,
            Some(4096)
        );
        let none = cfg("MistralForCausalLM", r#", "sliding_window": null"#).spec();
        assert_eq!(none.layers[3].window, None);
        let q = cfg("Qwen2ForCausalLM", r#", "sliding_window": 32"#).spec();
        assert!(q.layers.iter().all(|l| l.window.is_none()));
        assert!(q.qkv_bias && !q.o_bias);
        let q = cfg(
            "Qwen2ForCausalLM",
            r#", "sliding_window": 32, "use_sliding_window": true, "max_window_layers": 4"#,
        )
        .spec();
        assert_eq!(q.layers[3].window, None);
        assert_eq!(q.layers[4].window, Some(32));
        assert!(cfg("Qwen3ForCausalLM", "").spec().family.qk_norm);
        assert!(
            cfg("LlamaForCausalLM", "")
                .spec()
                .layers
                .iter()
                .all(|l| l.window.is_none())
        );
    }

    #[test]
    fn llama3_scaling_keeps_short_wavelengths_and_divides_long_ones() {
        let c = cfg(
            "LlamaForCausalLM",
            r#", "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        );
        let rope = &c.spec().layers[0].rope;
        let plain = Rope {
            theta: 500_000.0,
            scaling: RopeScaling::None,
        };
        let (scaled, base) = (rope.inv_freq(64), plain.inv_freq(64));
        assert_eq!(scaled[0], base[0], "the fastest frequency is kept");
        assert!(
            (scaled[31] - base[31] / 8.0).abs() < 1e-15,
            "the slowest is divided"
        );
        let bad = ModelConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(bad.contains("RoPE type \"yarn\" is not served"), "{bad}");
    }
}
