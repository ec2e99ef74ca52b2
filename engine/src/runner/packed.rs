//! The runner's weight layout: plain row-major `Vec<f32>` per matrix, `[out, in]`, with the
//! projections that read the same input fused so one kernel call serves them
//! (`wqkv = [q; k; v]`, `w_gate_up = [gate; up]`). Built once from [`Weights`]; the candle
//! tensors can be dropped afterwards.

use candle_core::Tensor;

use crate::error::Result;
use crate::model::{LlamaConfig, Weights};

/// One decoder layer, packed.
#[derive(Debug)]
pub struct PackedLayer {
    /// Input RMSNorm scale `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// `[(heads + 2·kv_heads)·head_dim, hidden]`.
    pub wqkv: Vec<f32>,
    /// `[hidden, hidden]`.
    pub wo: Vec<f32>,
    /// Post-attention RMSNorm scale `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// `[2·intermediate, hidden]`: gate rows then up rows.
    pub w_gate_up: Vec<f32>,
    /// `[hidden, intermediate]`.
    pub w_down: Vec<f32>,
}

/// All weights, packed.
#[derive(Debug)]
pub struct PackedModel {
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    /// The layers in order.
    pub layers: Vec<PackedLayer>,
    /// Final norm scale.
    pub norm: Vec<f32>,
    /// `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<Vec<f32>>,
}

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

impl PackedModel {
    /// Packs checked weights (shapes validated against `cfg`).
    pub fn pack(w: &Weights, cfg: &LlamaConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let kvd = cfg.kv_heads() * cfg.head_dim();
        let inter = cfg.intermediate_size;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
                flat(&w.get(&format!("{p}.{name}"), shape)?)
            };
            let mut wqkv = get("self_attn.q_proj.weight", &[h, h])?;
            wqkv.extend(get("self_attn.k_proj.weight", &[kvd, h])?);
            wqkv.extend(get("self_attn.v_proj.weight", &[kvd, h])?);
            let mut w_gate_up = get("mlp.gate_proj.weight", &[inter, h])?;
            w_gate_up.extend(get("mlp.up_proj.weight", &[inter, h])?);
            layers.push(PackedLayer {
                attn_norm: get("input_layernorm.weight", &[h])?,
                wqkv,
                wo: get("self_attn.o_proj.weight", &[h, h])?,
                ffn_norm: get("post_attention_layernorm.weight", &[h])?,
                w_gate_up,
                w_down: get("mlp.down_proj.weight", &[h, inter])?,
            });
        }
        let vh = [cfg.vocab_size, h];
        let lm_head = if !cfg.tie_word_embeddings && w.contains("lm_head.weight") {
            Some(flat(&w.get("lm_head.weight", &vh)?)?)
        } else {
            None
        };
        Ok(Self {
            embed: flat(&w.get("model.embed_tokens.weight", &vh)?)?,
            layers,
            norm: flat(&w.get("model.norm.weight", &[h])?)?,
            lm_head,
        })
    }

    /// The LM head matrix (the embedding when tied).
    pub fn lm_head(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }

    /// Bytes of weights read per decode step (every matrix once, plus one embedding row).
    pub fn bytes_read_per_token(&self, hidden: usize) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.attn_norm.len()
                    + l.wqkv.len()
                    + l.wo.len()
                    + l.ffn_norm.len()
                    + l.w_gate_up.len()
                    + l.w_down.len()
            })
            .sum();
        (layers + self.norm.len() + self.lm_head().len() + hidden) * 4
    }
}
