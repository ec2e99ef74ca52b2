//! The dense reference decoder written with candle tensor ops (candle-transformers style:
//! one small struct per layer, `load` from [`Weights`] with checkpoint names, `forward`),
//! for every architecture: it reads what the layers do from the [`ModelSpec`] (biases,
//! QK-norm, the `1 + w` norms, norms after the sub-blocks, GeGLU, windows, per-layer RoPE,
//! the query scale, logit softcapping) and computes the math itself.
//!
//! It recomputes the whole sequence each call (no KV cache) and exists to be obviously
//! correct: it is the "dense" side of the paged == dense test and a second check against the
//! golden logits. The serving hot path is [`crate`], which packs the same weights.
//! It shares no code with the serving runners' layer structs (`packed/`, `candle/layers.rs`:
//! fused projections, paged KV, their own RoPE tables and masks) beyond the spec's facts, so
//! paged == dense compares two independent implementations; keep it that way.
//! RoPE is the Hugging Face half-split form (`rotate_half`).

use candle_core::{D, DType, Device, Tensor};

use super::arch_params::Activation;
use super::config::ModelConfig;
use super::spec::{LayerAttn, ModelSpec, RopeScaling};
use super::weights::Weights;
use crate::error::Result;

fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.matmul(&w.t()?)?;
    Ok(match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

/// Root-mean-square norm over the last dimension with a learned scale (`w`, or `1 + w`).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `{name}` of `len` values; the family's offset is added to the scale.
    fn load(
        w: &Weights,
        name: &str,
        len: usize,
        cfg: &ModelConfig,
        spec: &ModelSpec,
    ) -> Result<Self> {
        let weight = w.get(name, &[len])?;
        Ok(Self {
            weight: (weight + f64::from(spec.norm_offset))?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// `x / sqrt(mean(x^2) + eps) * scale` over the last dimension.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = x.broadcast_div(&(ms + self.eps)?.sqrt()?)?;
        Ok(normed.broadcast_mul(&self.weight)?)
    }
}

/// Grouped-query self-attention with RoPE, optionally windowed.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Tensor,
    k_proj: Tensor,
    v_proj: Tensor,
    o_proj: Tensor,
    /// Q, K, V, O biases where the architecture has them.
    biases: [Option<Tensor>; 4],
    /// Per-head norms of Q and K.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f64,
    layer: LayerAttn,
}

impl Attention {
    /// Loads `{prefix}.{q,k,v,o}_proj.*` (and `{q,k}_norm` under QK-norm).
    fn load(
        w: &Weights,
        prefix: &str,
        i: usize,
        cfg: &ModelConfig,
        spec: &ModelSpec,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let (qd, kvd, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim());
        let m = |n: &str, rows, cols| w.get(&format!("{prefix}.{n}_proj.weight"), &[rows, cols]);
        let b = |n: &str, len, on: bool| -> Result<Option<Tensor>> {
            on.then(|| w.get(&format!("{prefix}.{n}_proj.bias"), &[len]))
                .transpose()
        };
        let qk_norm = if spec.family.qk_norm {
            let n = |s: &str| RmsNorm::load(w, &format!("{prefix}.{s}_norm.weight"), hd, cfg, spec);
            Some((n("q")?, n("k")?))
        } else {
            None
        };
        Ok(Self {
            q_proj: m("q", qd, h)?,
            k_proj: m("k", kvd, h)?,
            v_proj: m("v", kvd, h)?,
            o_proj: m("o", h, qd)?,
            biases: [
                b("q", qd, spec.qkv_bias)?,
                b("k", kvd, spec.qkv_bias)?,
                b("v", kvd, spec.qkv_bias)?,
                b("o", h, spec.o_bias)?,
            ],
            qk_norm,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.kv_heads(),
            head_dim: hd,
            scale: spec.attn_scale,
            layer: spec.layers[i].clone(),
        })
    }

    /// Causal attention over `x: [T, hidden]` at positions `0..T`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(0)?;
        let hd = self.head_dim;
        let [bq, bk, bv, bo] = &self.biases;
        let mut q = linear(x, &self.q_proj, bq.as_ref())?.reshape((t, self.heads, hd))?;
        let mut k = linear(x, &self.k_proj, bk.as_ref())?.reshape((t, self.kv_heads, hd))?;
        let v = linear(x, &self.v_proj, bv.as_ref())?.reshape((t, self.kv_heads, hd))?;
        if let Some((qn, kn)) = &self.qk_norm {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let rope = Rope::new(&self.layer, hd, t)?;
        let q = rope.apply(&q)?.transpose(0, 1)?.contiguous()?; // [H, T, hd]
        let k = self.repeat_kv(&rope.apply(&k)?)?; // [H, T, hd]
        let v = self.repeat_kv(&v)?;
        let mask = causal_mask(t, self.layer.window)?;
        let scores = (q.matmul(&k.t()?)? * self.scale)?.broadcast_add(&mask)?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let o = p
            .matmul(&v)?
            .transpose(0, 1)?
            .reshape((t, self.heads * hd))?;
        linear(&o, &self.o_proj, bo.as_ref())
    }

    /// `[T, KV, hd]` -> `[H, T, hd]`, each kv head serving `H / KV` query heads.
    fn repeat_kv(&self, x: &Tensor) -> Result<Tensor> {
        let (t, kv, hd) = x.dims3()?;
        let group = self.heads / self.kv_heads;
        Ok(x.transpose(0, 1)?
            .unsqueeze(1)?
            .broadcast_as((kv, group, t, hd))?
            .contiguous()?
            .reshape((kv * group, t, hd))?)
    }
}

/// `[T, T]`: 0 where query `r` may see key `c` (`c <= r`, and `r - c < window`), -inf else.
fn causal_mask(t: usize, window: Option<usize>) -> Result<Tensor> {
    let mask: Vec<f32> = (0..t * t)
        .map(|i| {
            let (r, c) = (i / t, i % t);
            let seen = c <= r && window.is_none_or(|w| r - c < w);
            if seen { 0.0 } else { f32::NEG_INFINITY }
        })
        .collect();
    Ok(Tensor::from_vec(mask, (t, t), &Device::Cpu)?)
}

/// Gated feed-forward: `down(act(gate(x)) * up(x))`, SiLU or tanh-GELU.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
    activation: Activation,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj.weight`.
    fn load(w: &Weights, prefix: &str, cfg: &ModelConfig, spec: &ModelSpec) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: w.get(&format!("{prefix}.gate_proj.weight"), &[i, h])?,
            up_proj: w.get(&format!("{prefix}.up_proj.weight"), &[i, h])?,
            down_proj: w.get(&format!("{prefix}.down_proj.weight"), &[h, i])?,
            activation: spec.activation,
        })
    }

    /// Applies the feed-forward to `[T, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = linear(x, &self.gate_proj, None)?;
        let act = match self.activation {
            // g / (1 + e^-g)
            Activation::Silu => (&g * g.neg()?.exp()?.affine(1.0, 1.0)?.recip()?)?,
            // 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
            Activation::GeluTanh => {
                let inner =
                    ((&g + (g.powf(3.0)? * 0.044715)?)? * (2.0 / std::f64::consts::PI).sqrt())?;
                ((&g * 0.5)? * inner.tanh()?.affine(1.0, 1.0)?)?
            }
        };
        linear(
            &(act * linear(x, &self.up_proj, None)?)?,
            &self.down_proj,
            None,
        )
    }
}

/// One decoder block: pre-norms, and on the families that have them, norms on the
/// sub-blocks' outputs before the residual adds.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    attn_in: RmsNorm,
    attn_out: Option<RmsNorm>,
    self_attn: Attention,
    mlp_in: RmsNorm,
    mlp_out: Option<RmsNorm>,
    mlp: Mlp,
}

impl DecoderLayer {
    /// Loads `model.layers.{i}.*`.
    fn load(w: &Weights, i: usize, cfg: &ModelConfig, spec: &ModelSpec) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let h = cfg.hidden_size;
        let norm = |n: &str| RmsNorm::load(w, &format!("{p}.{n}.weight"), h, cfg, spec);
        let names = spec.family.norms;
        Ok(Self {
            attn_in: norm(names.attn_in)?,
            attn_out: names.attn_out.map(norm).transpose()?,
            self_attn: Attention::load(w, &format!("{p}.self_attn"), i, cfg, spec)?,
            mlp_in: norm(names.mlp_in)?,
            mlp_out: names.mlp_out.map(norm).transpose()?,
            mlp: Mlp::load(w, &format!("{p}.mlp"), cfg, spec)?,
        })
    }

    /// `x + [norm](attn(norm(x)))`, then `x + [norm](mlp(norm(x)))`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut a = self.self_attn.forward(&self.attn_in.forward(x)?)?;
        if let Some(n) = &self.attn_out {
            a = n.forward(&a)?;
        }
        let x = (x + a)?;
        let mut m = self.mlp.forward(&self.mlp_in.forward(&x)?)?;
        if let Some(n) = &self.mlp_out {
            m = n.forward(&m)?;
        }
        Ok((x + m)?)
    }
}

/// Half-split rotary embedding tables for positions `0..T` of one layer.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// Tables `[T, 1, head_dim]` (each frequency repeated for both halves).
    fn new(layer: &LayerAttn, hd: usize, t: usize) -> Result<Self> {
        let half = hd / 2;
        let freqs: Vec<f64> = (0..half).map(|i| scaled_freq(layer, i, hd)).collect();
        let mut cos = Vec::with_capacity(t * hd);
        let mut sin = Vec::with_capacity(t * hd);
        for p in 0..t {
            for _ in 0..2 {
                for f in &freqs {
                    let a = p as f64 * f;
                    cos.push(a.cos() as f32);
                    sin.push(a.sin() as f32);
                }
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (t, 1, hd), &Device::Cpu)?,
            sin: Tensor::from_vec(sin, (t, 1, hd), &Device::Cpu)?,
        })
    }

    /// Rotates `[T, heads, hd]`: `x * cos + rotate_half(x) * sin`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let hd = x.dim(2)?;
        let x1 = x.narrow(2, 0, hd / 2)?;
        let x2 = x.narrow(2, hd / 2, hd / 2)?;
        let rot = Tensor::cat(&[&x2.neg()?, &x1], 2)?;
        Ok((x.broadcast_mul(&self.cos)? + rot.broadcast_mul(&self.sin)?)?)
    }
}

/// Frequency `i` of the layer's RoPE, as transformers' RoPE initializers compute it.
fn scaled_freq(layer: &LayerAttn, i: usize, hd: usize) -> f64 {
    let base = layer.rope.theta.powf(-((2 * i) as f64) / hd as f64);
    match &layer.rope.scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base / factor,
        RopeScaling::Divisors(d) => base / d.get(i).copied().unwrap_or(1.0),
        RopeScaling::Llama3 {
            factor,
            low,
            high,
            original,
        } => {
            // Wavelength in positions; long ones are interpolated, short ones kept.
            let wavelen = std::f64::consts::TAU / base;
            let (low_wavelen, high_wavelen) = (original / low, original / high);
            if wavelen > low_wavelen {
                base / factor
            } else if wavelen < high_wavelen {
                base
            } else {
                let s = (original / wavelen - low) / (high - low);
                base / factor * (1.0 - s) + base * s
            }
        }
    }
}

/// The whole decoder.
#[derive(Debug, Clone)]
pub struct DenseDecoder {
    embed_tokens: Tensor,
    embed_scale: Option<f32>,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Tensor,
    softcap: Option<f64>,
}

impl DenseDecoder {
    /// Loads every layer; the LM head falls back to the embedding when tied or absent.
    pub fn load(w: &Weights, cfg: &ModelConfig) -> Result<Self> {
        let spec = cfg.spec();
        let shape = [cfg.vocab_size, cfg.hidden_size];
        let embed_tokens = w.get("model.embed_tokens.weight", &shape)?;
        let lm_head = if !cfg.tie_word_embeddings && w.contains("lm_head.weight") {
            w.get("lm_head.weight", &shape)?
        } else {
            embed_tokens.clone()
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::load(w, i, cfg, &spec))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed_tokens,
            embed_scale: spec.embed_scale,
            layers,
            norm: RmsNorm::load(w, "model.norm.weight", cfg.hidden_size, cfg, &spec)?,
            lm_head,
            softcap: spec.final_softcap,
        })
    }

    /// Logits `[T, vocab]` for every position of `tokens` (full causal recompute).
    pub fn forward(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(tokens, &Device::Cpu)?;
        let mut x = self.embed_tokens.index_select(&ids, 0)?;
        if let Some(s) = self.embed_scale {
            x = (x * f64::from(s))?;
        }
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        let x = self.norm.forward(&x)?;
        let mut logits = linear(&x, &self.lm_head, None)?.to_dtype(DType::F32)?;
        if let Some(cap) = self.softcap {
            logits = ((logits / cap)?.tanh()? * cap)?;
        }
        Ok(logits)
    }
}
