//! The candle runner's decoder layers, in candle-transformers' style: small structs, each
//! with a `load` from a [`TensorSource`] (checkpoint or random) and a `forward` on device
//! tensors, one set for every architecture: what differs (biases, QK-norm, `1 + w` norms,
//! norms after the sub-blocks, GeGLU, the query scale, a layer's window and RoPE) is read
//! from the [`ModelSpec`] at load. [`DecoderLayer`] is
//! `x += [norm](attn(norm(x)))`, then `x += [norm](mlp(norm(x)))`.
//!
//! Numerics: projections and attention matmuls run in the weight dtype; the residual stream,
//! the norms, RoPE and the softmax run in f32.
//!
//! Invariant: [`Attention::forward`] writes the step's K/V of its own layer into the pool
//! (normed and rotated) before it attends, so a prefill chunk's tokens see each other
//! causally.

use candle_core::{D, DType, Tensor};

use super::attention::Heads;
use super::kv_pool::DeviceKv;
use super::step::{StepInputs, Variant};
use super::weights::{TensorSource, bytes};
use crate::error::Result;
use crate::model::arch_params::Activation;
use crate::model::{ModelConfig, ModelSpec};

/// Root-mean-square norm with a learned f32 scale (the family's offset added at load).
#[derive(Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `{name}` (`[len]`).
    pub fn load(
        src: &TensorSource<'_>,
        name: &str,
        len: usize,
        cfg: &ModelConfig,
        spec: &ModelSpec,
    ) -> Result<Self> {
        Ok(RmsNorm {
            weight: (src.norm(name, len)? + f64::from(spec.norm_offset))?,
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
    /// `[q + 2·kv]`, where the architecture has Q/K/V biases.
    bqkv: Option<Tensor>,
    /// Per-head norms of Q and K, under QK-norm.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    /// `[hidden, q]`.
    wo: Tensor,
    bo: Option<Tensor>,
    heads: Heads,
    /// Which of the step's RoPE tables and attention plans this layer uses.
    variant: Variant,
}

impl Attention {
    /// Loads layer `i`'s projections, Q, K and V fused into one matrix.
    pub fn load(
        src: &TensorSource<'_>,
        i: usize,
        cfg: &ModelConfig,
        spec: &ModelSpec,
        variant: Variant,
    ) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (q, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let n = |s: &str| format!("model.layers.{i}.self_attn.{s}");
        let bqkv = spec
            .qkv_bias
            .then(|| {
                let parts = [
                    (n("q_proj.bias"), q),
                    (n("k_proj.bias"), kvd),
                    (n("v_proj.bias"), kvd),
                ];
                src.vector(&parts)
            })
            .transpose()?;
        let bo = spec
            .o_bias
            .then(|| src.vector(&[(n("o_proj.bias"), h)]))
            .transpose()?;
        let qk_norm = if spec.family.qk_norm {
            let norm = |s: &str| RmsNorm::load(src, &n(s), hd, cfg, spec);
            Some((norm("q_norm.weight")?, norm("k_norm.weight")?))
        } else {
            None
        };
        Ok(Attention {
            layer: i,
            wqkv: src.matrix(
                &[
                    (n("q_proj.weight"), q),
                    (n("k_proj.weight"), kvd),
                    (n("v_proj.weight"), kvd),
                ],
                h,
            )?,
            bqkv,
            qk_norm,
            wo: src.matrix(&[(n("o_proj.weight"), h)], q)?,
            bo,
            heads: Heads {
                heads: cfg.num_attention_heads,
                kv_heads: cfg.kv_heads(),
                head_dim: hd,
                scale: spec.attn_scale,
            },
            variant,
        })
    }

    /// Attention output `[T, hidden]` (weight dtype) of normed rows `hn` (weight dtype).
    pub fn forward(&self, hn: &Tensor, inp: &StepInputs, kv: &DeviceKv) -> Result<Tensor> {
        let Heads {
            heads,
            kv_heads,
            head_dim: hd,
            ..
        } = self.heads;
        let dtype = hn.dtype();
        let t = hn.dim(0)?;
        let (qd, kvd) = (heads * hd, kv_heads * hd);
        let mut qkv = hn.matmul(&self.wqkv.t()?)?;
        if let Some(b) = &self.bqkv {
            qkv = qkv.broadcast_add(b)?;
        }
        let rope = |from: usize, n: usize, norm: Option<&RmsNorm>| -> Result<Tensor> {
            let mut part = qkv
                .narrow(1, from, n * hd)?
                .to_dtype(DType::F32)?
                .reshape((t, n, hd))?;
            if let Some(norm) = norm {
                part = norm.forward(&part)?;
            }
            inp.rope(self.variant, &part)
        };
        let (qn, kn) = match &self.qk_norm {
            Some((q, k)) => (Some(q), Some(k)),
            None => (None, None),
        };
        let q = rope(0, heads, qn)?.to_dtype(dtype)?;
        let k = rope(qd, kv_heads, kn)?.to_dtype(dtype)?.reshape((t, kvd))?;
        let v = qkv.narrow(1, qd + kvd, kvd)?.contiguous()?;
        kv.write(self.layer, &inp.slots, &k, &v)?;
        let attn = inp.attend(self.variant, kv, self.layer, &q, self.heads)?;
        let out = attn.matmul(&self.wo.t()?)?;
        Ok(match &self.bo {
            Some(b) => out.broadcast_add(b)?,
            None => out,
        })
    }

    /// Bytes of the matrices.
    pub fn bytes(&self) -> usize {
        bytes(&self.wqkv) + bytes(&self.wo)
    }
}

/// Gated feed-forward: `down(act(gate(x)) · up(x))`, gate and up fused; SiLU or tanh-GELU.
#[derive(Debug)]
pub struct Mlp {
    /// `[2·intermediate, hidden]`: gate rows, then up.
    w_gate_up: Tensor,
    /// `[hidden, intermediate]`.
    w_down: Tensor,
    inter: usize,
    activation: Activation,
}

impl Mlp {
    /// Loads layer `i`'s feed-forward.
    pub fn load(
        src: &TensorSource<'_>,
        i: usize,
        cfg: &ModelConfig,
        spec: &ModelSpec,
    ) -> Result<Self> {
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let n = |s: &str| format!("model.layers.{i}.mlp.{s}_proj.weight");
        Ok(Mlp {
            w_gate_up: src.matrix(&[(n("gate"), inter), (n("up"), inter)], h)?,
            w_down: src.matrix(&[(n("down"), h)], inter)?,
            inter,
            activation: spec.activation,
        })
    }

    /// The feed-forward of normed rows `hn` (weight dtype), in the weight dtype.
    pub fn forward(&self, hn: &Tensor) -> Result<Tensor> {
        let gu = hn.matmul(&self.w_gate_up.t()?)?;
        let gate = gu.narrow(1, 0, self.inter)?;
        // candle's `gelu` is the tanh approximation (`gelu_erf` the exact one).
        let gate = match self.activation {
            Activation::Silu => gate.silu()?,
            Activation::GeluTanh => gate.gelu()?,
        };
        let act = (gate * gu.narrow(1, self.inter, self.inter)?)?;
        Ok(act.matmul(&self.w_down.t()?)?)
    }

    /// Bytes of the matrices.
    pub fn bytes(&self) -> usize {
        bytes(&self.w_gate_up) + bytes(&self.w_down)
    }
}

/// One decoder block.
#[derive(Debug)]
pub struct DecoderLayer {
    attn_norm: RmsNorm,
    attn: Attention,
    attn_out_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    mlp: Mlp,
    mlp_out_norm: Option<RmsNorm>,
    dtype: DType,
}

impl DecoderLayer {
    /// Loads `model.layers.{i}.*`; `variant` names the layer's RoPE and window in the step.
    pub fn load(
        src: &TensorSource<'_>,
        i: usize,
        cfg: &ModelConfig,
        spec: &ModelSpec,
        variant: Variant,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let norm =
            |s: &str| RmsNorm::load(src, &format!("model.layers.{i}.{s}.weight"), h, cfg, spec);
        let names = spec.family.norms;
        Ok(DecoderLayer {
            attn_norm: norm(names.attn_in)?,
            attn: Attention::load(src, i, cfg, spec, variant)?,
            attn_out_norm: names.attn_out.map(norm).transpose()?,
            ffn_norm: norm(names.mlp_in)?,
            mlp: Mlp::load(src, i, cfg, spec)?,
            mlp_out_norm: names.mlp_out.map(norm).transpose()?,
            dtype: src.dtype(),
        })
    }

    /// The block on the f32 residual stream `x: [T, hidden]`.
    pub fn forward(&self, x: &Tensor, inp: &StepInputs, kv: &DeviceKv) -> Result<Tensor> {
        let hn = self.attn_norm.forward(x)?.to_dtype(self.dtype)?;
        let mut a = self.attn.forward(&hn, inp, kv)?.to_dtype(DType::F32)?;
        if let Some(n) = &self.attn_out_norm {
            a = n.forward(&a)?;
        }
        let x = (x + a)?;
        let hn = self.ffn_norm.forward(&x)?.to_dtype(self.dtype)?;
        let mut m = self.mlp.forward(&hn)?.to_dtype(DType::F32)?;
        if let Some(n) = &self.mlp_out_norm {
            m = n.forward(&m)?;
        }
        Ok((&x + m)?)
    }

    /// Bytes of the matrices (the norms are not counted).
    pub fn bytes(&self) -> usize {
        self.attn.bytes() + self.mlp.bytes()
    }
}
