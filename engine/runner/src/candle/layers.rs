//! The candle runner's Llama layers, in candle-transformers' style: small structs, each
//! with a `load` from a [`TensorSource`] (checkpoint or random) and a `forward` on device
//! tensors. [`DecoderLayer`] is pre-norm: `x += attn(norm(x))`, then `x += mlp(norm(x))`.
//!
//! Numerics: projections and attention matmuls run in the weight dtype; the residual stream,
//! the norms, RoPE and the softmax run in f32.
//!
//! Invariant: [`Attention::forward`] writes the step's K/V of its own layer into the pool
//! before it attends, so a prefill chunk's tokens see each other causally.

use candle_core::{D, DType, Tensor};

use super::attention::Heads;
use super::kv_pool::DeviceKv;
use super::step::StepInputs;
use super::weights::{TensorSource, bytes};
use crate::error::Result;
use crate::model::ModelConfig;

/// Root-mean-square norm with a learned f32 scale.
#[derive(Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `{name}` (`[hidden]`).
    pub fn load(src: &TensorSource<'_>, name: &str, cfg: &ModelConfig) -> Result<Self> {
        Ok(RmsNorm {
            weight: src.norm(name, cfg.hidden_size)?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// `x / sqrt(mean(x²) + eps) · w` over the last dimension (f32).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        Ok(x.broadcast_div(&(ms + self.eps)?.sqrt()?)?
            .broadcast_mul(&self.weight)?)
    }
}

/// Grouped-query self-attention of one layer over the paged pool.
#[derive(Debug)]
pub struct Attention {
    layer: usize,
    /// `[q + 2·kv, hidden]`: Q rows, then K, then V.
    wqkv: Tensor,
    /// `[hidden, q]`.
    wo: Tensor,
    heads: Heads,
}

impl Attention {
    /// Loads layer `i`'s projections, Q, K and V fused into one matrix.
    pub fn load(src: &TensorSource<'_>, i: usize, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let hd = cfg.head_dim();
        let (q, kvd) = (cfg.num_attention_heads * hd, cfg.kv_heads() * hd);
        let n = |s: &str| format!("model.layers.{i}.self_attn.{s}_proj.weight");
        Ok(Attention {
            layer: i,
            wqkv: src.matrix(&[(n("q"), q), (n("k"), kvd), (n("v"), kvd)], h)?,
            wo: src.matrix(&[(n("o"), h)], q)?,
            heads: Heads {
                heads: cfg.num_attention_heads,
                kv_heads: cfg.kv_heads(),
                head_dim: hd,
            },
        })
    }

    /// Attention output `[T, hidden]` (weight dtype) of normed rows `hn` (weight dtype).
    pub fn forward(&self, hn: &Tensor, inp: &StepInputs, kv: &DeviceKv) -> Result<Tensor> {
        let Heads {
            heads,
            kv_heads,
            head_dim: hd,
        } = self.heads;
        let dtype = hn.dtype();
        let t = hn.dim(0)?;
        let (qd, kvd) = (heads * hd, kv_heads * hd);
        let qkv = hn.matmul(&self.wqkv.t()?)?;
        let rope = |from: usize, n: usize| -> Result<Tensor> {
            let part = qkv.narrow(1, from, n * hd)?.to_dtype(DType::F32)?;
            inp.rope(&part.reshape((t, n, hd))?)
        };
        let q = rope(0, heads)?.to_dtype(dtype)?;
        let k = rope(qd, kv_heads)?.to_dtype(dtype)?.reshape((t, kvd))?;
        let v = qkv.narrow(1, qd + kvd, kvd)?.contiguous()?;
        kv.write(self.layer, &inp.slots, &k, &v)?;
        let attn = inp.attn.attend(kv, self.layer, &q, self.heads)?;
        Ok(attn.matmul(&self.wo.t()?)?)
    }

    /// Bytes of the matrices.
    pub fn bytes(&self) -> usize {
        bytes(&self.wqkv) + bytes(&self.wo)
    }
}

/// SwiGLU feed-forward: `down(silu(gate(x)) · up(x))`, gate and up fused.
#[derive(Debug)]
pub struct Mlp {
    /// `[2·intermediate, hidden]`: gate rows, then up.
    w_gate_up: Tensor,
    /// `[hidden, intermediate]`.
    w_down: Tensor,
    inter: usize,
}

impl Mlp {
    /// Loads layer `i`'s feed-forward.
    pub fn load(src: &TensorSource<'_>, i: usize, cfg: &ModelConfig) -> Result<Self> {
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let n = |s: &str| format!("model.layers.{i}.mlp.{s}_proj.weight");
        Ok(Mlp {
            w_gate_up: src.matrix(&[(n("gate"), inter), (n("up"), inter)], h)?,
            w_down: src.matrix(&[(n("down"), h)], inter)?,
            inter,
        })
    }

    /// The feed-forward of normed rows `hn` (weight dtype), in the weight dtype.
    pub fn forward(&self, hn: &Tensor) -> Result<Tensor> {
        let gu = hn.matmul(&self.w_gate_up.t()?)?;
        let act = (gu.narrow(1, 0, self.inter)?.silu()? * gu.narrow(1, self.inter, self.inter)?)?;
        Ok(act.matmul(&self.w_down.t()?)?)
    }

    /// Bytes of the matrices.
    pub fn bytes(&self) -> usize {
        bytes(&self.w_gate_up) + bytes(&self.w_down)
    }
}

/// One pre-norm decoder block.
#[derive(Debug)]
pub struct DecoderLayer {
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
    dtype: DType,
}

impl DecoderLayer {
    /// Loads `model.layers.{i}.*`.
    pub fn load(src: &TensorSource<'_>, i: usize, cfg: &ModelConfig) -> Result<Self> {
        let n = |s: &str| format!("model.layers.{i}.{s}.weight");
        Ok(DecoderLayer {
            attn_norm: RmsNorm::load(src, &n("input_layernorm"), cfg)?,
            attn: Attention::load(src, i, cfg)?,
            ffn_norm: RmsNorm::load(src, &n("post_attention_layernorm"), cfg)?,
            mlp: Mlp::load(src, i, cfg)?,
            dtype: src.dtype(),
        })
    }

    /// The block on the f32 residual stream `x: [T, hidden]`.
    pub fn forward(&self, x: &Tensor, inp: &StepInputs, kv: &DeviceKv) -> Result<Tensor> {
        let hn = self.attn_norm.forward(x)?.to_dtype(self.dtype)?;
        let x = (x + self.attn.forward(&hn, inp, kv)?.to_dtype(DType::F32)?)?;
        let hn = self.ffn_norm.forward(&x)?.to_dtype(self.dtype)?;
        Ok((&x + self.mlp.forward(&hn)?.to_dtype(DType::F32)?)?)
    }

    /// Bytes of the matrices (the norms are not counted).
    pub fn bytes(&self) -> usize {
        self.attn.bytes() + self.mlp.bytes()
    }
}
