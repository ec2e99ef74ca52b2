//! The dense reference decoder written with candle tensor ops (candle-transformers style:
//! one small struct per layer, `load` from [`Weights`] with checkpoint names, `forward`).
//!
//! It recomputes the whole sequence each call (no KV cache) and exists to be obviously
//! correct: it is the "dense" side of the paged == dense test and a second check against the
//! golden logits. The serving hot path is [`crate`], which packs the same weights.
//! It shares no code with the serving runners' layer structs (`packed/`, `candle/layers.rs`:
//! fused projections, paged KV, their own RoPE tables), so paged == dense compares two
//! independent implementations; keep it that way.
//! RoPE is the Hugging Face half-split form (`rotate_half`) with the config's theta.

use candle_core::{D, DType, Device, Tensor};

use super::config::ModelConfig;
use super::weights::Weights;
use crate::error::Result;

fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(x.matmul(&w.t()?)?)
}

/// Root-mean-square layer norm with a learned scale.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `{prefix}.weight`.
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        Ok(Self {
            weight: w.get(&format!("{prefix}.weight"), &[cfg.hidden_size])?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// `x / sqrt(mean(x^2) + eps) * weight` over the last dimension.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = x.broadcast_div(&(ms + self.eps)?.sqrt()?)?;
        Ok(normed.broadcast_mul(&self.weight)?)
    }
}

/// Grouped-query self-attention with RoPE.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Tensor,
    k_proj: Tensor,
    v_proj: Tensor,
    o_proj: Tensor,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    /// Loads `{prefix}.{q,k,v,o}_proj.weight`.
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let kvd = cfg.kv_heads() * cfg.head_dim();
        Ok(Self {
            q_proj: w.get(&format!("{prefix}.q_proj.weight"), &[h, h])?,
            k_proj: w.get(&format!("{prefix}.k_proj.weight"), &[kvd, h])?,
            v_proj: w.get(&format!("{prefix}.v_proj.weight"), &[kvd, h])?,
            o_proj: w.get(&format!("{prefix}.o_proj.weight"), &[h, h])?,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.kv_heads(),
            head_dim: cfg.head_dim(),
        })
    }

    /// Causal attention over `x: [T, hidden]` at positions `0..T`.
    pub fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor) -> Result<Tensor> {
        let t = x.dim(0)?;
        let hd = self.head_dim;
        let q = linear(x, &self.q_proj)?.reshape((t, self.heads, hd))?;
        let k = linear(x, &self.k_proj)?.reshape((t, self.kv_heads, hd))?;
        let v = linear(x, &self.v_proj)?.reshape((t, self.kv_heads, hd))?;
        let q = rope.apply(&q)?.transpose(0, 1)?.contiguous()?; // [H, T, hd]
        let k = self.repeat_kv(&rope.apply(&k)?)?; // [H, T, hd]
        let v = self.repeat_kv(&v)?;
        let scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?.broadcast_add(mask)?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let o = p
            .matmul(&v)?
            .transpose(0, 1)?
            .reshape((t, self.heads * hd))?;
        linear(&o, &self.o_proj)
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

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj.weight`.
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: w.get(&format!("{prefix}.gate_proj.weight"), &[i, h])?,
            up_proj: w.get(&format!("{prefix}.up_proj.weight"), &[i, h])?,
            down_proj: w.get(&format!("{prefix}.down_proj.weight"), &[h, i])?,
        })
    }

    /// Applies the feed-forward to `[T, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = linear(x, &self.gate_proj)?;
        let silu = (&g
            * candle_core::Tensor::exp(&g.neg()?)?
                .affine(1.0, 1.0)?
                .recip()?)?;
        linear(&(silu * linear(x, &self.up_proj)?)?, &self.down_proj)
    }
}

/// One pre-norm decoder block.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    /// Loads `model.layers.{i}.*`.
    pub fn load(w: &Weights, i: usize, cfg: &ModelConfig) -> Result<Self> {
        let p = format!("model.layers.{i}");
        Ok(Self {
            input_layernorm: RmsNorm::load(w, &format!("{p}.input_layernorm"), cfg)?,
            self_attn: Attention::load(w, &format!("{p}.self_attn"), cfg)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                cfg,
            )?,
            mlp: Mlp::load(w, &format!("{p}.mlp"), cfg)?,
        })
    }

    /// `x + attn(norm(x))`, then `x + mlp(norm(x))`.
    pub fn forward(&self, x: &Tensor, rope: &Rope, mask: &Tensor) -> Result<Tensor> {
        let a = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, rope, mask)?;
        let x = (x + a)?;
        let m = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?;
        Ok((x + m)?)
    }
}

/// Half-split rotary embedding tables for positions `0..T`.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// Tables `[T, head_dim]` (each frequency repeated for both halves).
    pub fn new(cfg: &ModelConfig, t: usize) -> Result<Self> {
        let hd = cfg.head_dim();
        let half = hd / 2;
        let mut cos = Vec::with_capacity(t * hd);
        let mut sin = Vec::with_capacity(t * hd);
        for p in 0..t {
            for _ in 0..2 {
                for i in 0..half {
                    let freq = 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / hd as f64);
                    let a = p as f64 * freq;
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

/// The whole decoder.
#[derive(Debug, Clone)]
pub struct Llama {
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Tensor,
    cfg: ModelConfig,
}

impl Llama {
    /// Loads every layer; the LM head falls back to the embedding when tied or absent.
    pub fn load(w: &Weights, cfg: &ModelConfig) -> Result<Self> {
        let shape = [cfg.vocab_size, cfg.hidden_size];
        let embed_tokens = w.get("model.embed_tokens.weight", &shape)?;
        let lm_head = if !cfg.tie_word_embeddings && w.contains("lm_head.weight") {
            w.get("lm_head.weight", &shape)?
        } else {
            embed_tokens.clone()
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::load(w, i, cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed_tokens,
            layers,
            norm: RmsNorm::load(w, "model.norm", cfg)?,
            lm_head,
            cfg: cfg.clone(),
        })
    }

    /// Logits `[T, vocab]` for every position of `tokens` (full causal recompute).
    pub fn forward(&self, tokens: &[u32]) -> Result<Tensor> {
        let t = tokens.len();
        let ids = Tensor::new(tokens, &Device::Cpu)?;
        let mut x = self.embed_tokens.index_select(&ids, 0)?;
        let rope = Rope::new(&self.cfg, t)?;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu)?;
        for layer in &self.layers {
            x = layer.forward(&x, &rope, &mask)?;
        }
        let x = self.norm.forward(&x)?;
        Ok(linear(&x, &self.lm_head)?.to_dtype(DType::F32)?)
    }
}
