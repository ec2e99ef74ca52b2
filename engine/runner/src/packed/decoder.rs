//! One pre-norm Llama decoder block on packed weights:
//! `x += attn(norm(x))`, then `x += mlp(norm(x))`, over all rows of a step at once.
//!
//! Invariant: `x` is the residual stream `[T, hidden]` in f32, updated in place; every
//! buffer a layer needs is in [`Scratch`], allocated once per step and reused by every layer.

use super::attention::{Attention, AttnScratch};
use super::ends::RmsNorm;
use super::mlp::{Mlp, MlpScratch};
use super::plan::{Packer, Spec};
use crate::attention::RowPos;
use crate::error::Result;
use crate::kernels::ops::add_assign;
use crate::kv_store::KvStore;
use crate::model::ModelConfig;

/// The buffers of one step, shared by its layers.
#[derive(Debug)]
pub struct Scratch {
    /// `[T, hidden]`: the normed rows a sub-block reads.
    hn: Vec<f32>,
    /// `[T, hidden]`: a sub-block's output, added to the residual stream.
    proj: Vec<f32>,
    attn: AttnScratch,
    mlp: MlpScratch,
}

impl Scratch {
    /// Buffers for `t` rows of `cfg`'s shapes.
    pub fn new(t: usize, cfg: &ModelConfig) -> Self {
        let h = cfg.hidden_size;
        Scratch {
            hn: vec![0f32; t * h],
            proj: vec![0f32; t * h],
            attn: AttnScratch::new(t, cfg),
            mlp: MlpScratch::new(t, cfg),
        }
    }
}

/// One decoder block.
#[derive(Debug)]
pub struct DecoderLayer {
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    /// The projections of layer `i`, in packing order.
    pub fn specs(i: usize, cfg: &ModelConfig) -> Vec<Spec> {
        let mut specs = Attention::specs(i, cfg).to_vec();
        specs.extend(Mlp::specs(i, cfg));
        specs
    }

    /// f32 values a decode step reads outside the projections: the two norm scales.
    pub fn f32_per_token(cfg: &ModelConfig) -> usize {
        2 * cfg.hidden_size
    }

    /// Packs `model.layers.{i}.*`.
    pub fn load(p: &Packer<'_>, i: usize, cfg: &ModelConfig) -> Result<Self> {
        let n = |s: &str| format!("model.layers.{i}.{s}.weight");
        Ok(DecoderLayer {
            attn_norm: RmsNorm::load(p, &n("input_layernorm"), cfg)?,
            attn: Attention::load(p, i, cfg)?,
            ffn_norm: RmsNorm::load(p, &n("post_attention_layernorm"), cfg)?,
            mlp: Mlp::load(p, i, cfg)?,
        })
    }

    /// Runs the block on the residual stream `x` of the step's `rows`.
    pub fn forward(&self, x: &mut [f32], rows: &[RowPos<'_>], kv: &mut KvStore, s: &mut Scratch) {
        self.attn_norm.forward(x, &mut s.hn);
        self.attn.forward(&s.hn, rows, kv, &mut s.attn, &mut s.proj);
        add_assign(x, &s.proj);
        self.ffn_norm.forward(x, &mut s.hn);
        self.mlp.forward(&s.hn, rows.len(), &mut s.mlp, &mut s.proj);
        add_assign(x, &s.proj);
    }

    /// Bytes of the block's weights (packed projections and norm scales).
    pub fn bytes(&self) -> usize {
        self.attn_norm.bytes() + self.attn.bytes() + self.ffn_norm.bytes() + self.mlp.bytes()
    }
}
