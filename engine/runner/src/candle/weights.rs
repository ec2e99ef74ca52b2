//! The candle runner's weights on the device: each layer's Q, K and V projections fused into
//! one matrix (one matmul per layer instead of three), gate and up fused likewise, all in the
//! runner's dtype. Quantized GGUF matrices are dequantized at load ([`Weights::get`]), then
//! narrowed to the dtype; norms are kept in f32 (the normalization runs in f32).
//!
//! [`DeviceModel::random`] makes the same tensors from a config alone, drawn on the device
//! (`bench --random-config`): a GPU benchmark of real shapes needs no weight files to carry.
//!
//! Invariant: every matrix is `[out, in]` (the checkpoint's layout), used as `x · Wᵀ`.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::model::{LlamaConfig, Weights};

/// One decoder layer's tensors.
#[derive(Debug)]
pub struct DeviceLayer {
    /// RMSNorm before attention, f32 `[hidden]`.
    pub attn_norm: Tensor,
    /// `[hidden + 2 * kv_dim, hidden]`: Q rows, then K, then V.
    pub wqkv: Tensor,
    /// `[hidden, hidden]`.
    pub wo: Tensor,
    /// RMSNorm before the MLP, f32 `[hidden]`.
    pub ffn_norm: Tensor,
    /// `[2 * intermediate, hidden]`: gate rows, then up.
    pub w_gate_up: Tensor,
    /// `[hidden, intermediate]`.
    pub w_down: Tensor,
}

/// The whole model on the device.
#[derive(Debug)]
pub struct DeviceModel {
    /// `[vocab, hidden]`, runner dtype.
    pub embed: Tensor,
    /// The decoder layers.
    pub layers: Vec<DeviceLayer>,
    /// Final RMSNorm, f32 `[hidden]`.
    pub norm: Tensor,
    /// `[vocab, hidden]` (the embedding when tied).
    pub lm_head: Tensor,
}

impl DeviceModel {
    /// Loads `w` onto `device` in `dtype`.
    pub fn load(w: &Weights, cfg: &LlamaConfig, dtype: DType, device: &Device) -> Result<Self> {
        let h = cfg.hidden_size;
        let vocab = cfg.vocab_size;
        let put =
            |t: Tensor, dt: DType| -> Result<Tensor> { Ok(t.to_dtype(dt)?.to_device(device)?) };
        let embed = put(w.get("model.embed_tokens.weight", &[vocab, h])?, dtype)?;
        // Tied: one tensor on the device, shared (a clone shares the storage).
        let lm_head = if !cfg.tie_word_embeddings && w.contains("lm_head.weight") {
            put(w.get("lm_head.weight", &[vocab, h])?, dtype)?
        } else {
            embed.clone()
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| load_layer(w, cfg, i, &|t| put(t, dtype), &|t| put(t, DType::F32)))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceModel {
            embed,
            layers,
            norm: put(w.get("model.norm.weight", &[h])?, DType::F32)?,
            lm_head,
        })
    }

    /// Random weights of `cfg`'s shapes, drawn on `device` (no host copy): projections
    /// N(0, 1/in) so activations keep unit scale through the layers (bf16 neither overflows
    /// nor flushes), norms all ones. Only the shapes matter to a benchmark: a step does the
    /// same work whatever the values.
    pub fn random(cfg: &LlamaConfig, dtype: DType, device: &Device) -> Result<Self> {
        let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let kvd = cfg.kv_heads() * cfg.head_dim();
        // candle draws normals only in f32 on CUDA; each matrix is narrowed as it is made,
        // so the f32 copy of one matrix at a time is the only transient.
        let mat = |out: usize, inp: usize| -> Result<Tensor> {
            let std = 1.0 / (inp as f32).sqrt();
            Ok(Tensor::randn(0f32, std, (out, inp), device)?.to_dtype(dtype)?)
        };
        let ones = || -> Result<Tensor> { Ok(Tensor::ones(h, DType::F32, device)?) };
        let embed = mat(cfg.vocab_size, h)?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            mat(cfg.vocab_size, h)?
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| {
                Ok(DeviceLayer {
                    attn_norm: ones()?,
                    wqkv: mat(h + 2 * kvd, h)?,
                    wo: mat(h, h)?,
                    ffn_norm: ones()?,
                    w_gate_up: mat(2 * inter, h)?,
                    w_down: mat(h, inter)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceModel {
            embed,
            layers,
            norm: ones()?,
            lm_head,
        })
    }

    /// Bytes of every weight (the numerator of the batch-1 roofline is about this).
    pub fn weight_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| bytes(&l.wqkv) + bytes(&l.wo) + bytes(&l.w_gate_up) + bytes(&l.w_down))
            .sum();
        layers + bytes(&self.lm_head)
    }
}

fn load_layer(
    w: &Weights,
    cfg: &LlamaConfig,
    i: usize,
    mat: &dyn Fn(Tensor) -> Result<Tensor>,
    vec: &dyn Fn(Tensor) -> Result<Tensor>,
) -> Result<DeviceLayer> {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let kvd = cfg.kv_heads() * cfg.head_dim();
    let p = format!("model.layers.{i}");
    let get = |s: &str, shape: &[usize]| w.get(&format!("{p}.{s}"), shape);
    let wqkv = Tensor::cat(
        &[
            get("self_attn.q_proj.weight", &[h, h])?,
            get("self_attn.k_proj.weight", &[kvd, h])?,
            get("self_attn.v_proj.weight", &[kvd, h])?,
        ],
        0,
    )?;
    let w_gate_up = Tensor::cat(
        &[
            get("mlp.gate_proj.weight", &[inter, h])?,
            get("mlp.up_proj.weight", &[inter, h])?,
        ],
        0,
    )?;
    Ok(DeviceLayer {
        attn_norm: vec(get("input_layernorm.weight", &[h])?)?,
        wqkv: mat(wqkv)?,
        wo: mat(get("self_attn.o_proj.weight", &[h, h])?)?,
        ffn_norm: vec(get("post_attention_layernorm.weight", &[h])?)?,
        w_gate_up: mat(w_gate_up)?,
        w_down: mat(get("mlp.down_proj.weight", &[h, inter])?)?,
    })
}
