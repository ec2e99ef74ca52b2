//! The runner's weight layout: every projection is a [`PackedMatrix`] (panel layout chosen
//! for the matmul kernel), with the projections that read the same input fused so one kernel
//! call serves them (`wqkv = [q; k; v]`, `w_gate_up = [gate; up]`). Norm scales and the
//! embedding (for row lookup) stay row-major. Built once from [`Weights`]; the candle tensors
//! can be dropped afterwards.

use candle_core::Tensor;

use crate::error::Result;
use crate::kernels::PackedMatrix;
use crate::model::{LlamaConfig, Weights};

/// One decoder layer, packed.
#[derive(Debug)]
pub struct PackedLayer {
    /// Input RMSNorm scale `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// `[(heads + 2·kv_heads)·head_dim, hidden]`.
    pub wqkv: PackedMatrix,
    /// `[hidden, hidden]`.
    pub wo: PackedMatrix,
    /// Post-attention RMSNorm scale `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// `[2·intermediate, hidden]`: gate rows then up rows.
    pub w_gate_up: PackedMatrix,
    /// `[hidden, intermediate]`.
    pub w_down: PackedMatrix,
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
    /// `[vocab, hidden]` (a packed copy of `embed` when tied).
    pub lm_head: PackedMatrix,
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
                wqkv: PackedMatrix::pack(&wqkv, h + 2 * kvd, h),
                wo: PackedMatrix::pack(&get("self_attn.o_proj.weight", &[h, h])?, h, h),
                ffn_norm: get("post_attention_layernorm.weight", &[h])?,
                w_gate_up: PackedMatrix::pack(&w_gate_up, 2 * inter, h),
                w_down: PackedMatrix::pack(&get("mlp.down_proj.weight", &[h, inter])?, h, inter),
            });
        }
        let vh = [cfg.vocab_size, h];
        let embed = flat(&w.get("model.embed_tokens.weight", &vh)?)?;
        let lm_head = if !cfg.tie_word_embeddings && w.contains("lm_head.weight") {
            PackedMatrix::pack(&flat(&w.get("lm_head.weight", &vh)?)?, cfg.vocab_size, h)
        } else {
            PackedMatrix::pack(&embed, cfg.vocab_size, h)
        };
        Ok(Self {
            embed,
            layers,
            norm: flat(&w.get("model.norm.weight", &[h])?)?,
            lm_head,
        })
    }

    /// Bytes of weights read per decode step (every matrix once, plus one embedding row),
    /// from the shapes alone, so a caller can size a roofline without packing the model.
    pub fn bytes_read_per_token(cfg: &LlamaConfig) -> usize {
        let h = cfg.hidden_size;
        let kvd = cfg.kv_heads() * cfg.head_dim();
        let inter = cfg.intermediate_size;
        let layer = 2 * h * 4
            + PackedMatrix::bytes_for(h + 2 * kvd, h)
            + PackedMatrix::bytes_for(h, h)
            + PackedMatrix::bytes_for(2 * inter, h)
            + PackedMatrix::bytes_for(h, inter);
        cfg.num_hidden_layers * layer + 2 * h * 4 + PackedMatrix::bytes_for(cfg.vocab_size, h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::random::{random_config, random_weights};

    #[test]
    fn bytes_per_token_from_shapes_match_the_packed_model() {
        let cfg = random_config(300);
        let m =
            PackedModel::pack(&Weights::from_map(random_weights(&cfg, 1).unwrap()), &cfg).unwrap();
        let packed: usize = m
            .layers
            .iter()
            .map(|l| {
                (l.attn_norm.len() + l.ffn_norm.len()) * 4
                    + l.wqkv.bytes()
                    + l.wo.bytes()
                    + l.w_gate_up.bytes()
                    + l.w_down.bytes()
            })
            .sum::<usize>()
            + (m.norm.len() + cfg.hidden_size) * 4
            + m.lm_head.bytes();
        assert_eq!(PackedModel::bytes_read_per_token(&cfg), packed);
    }
}
