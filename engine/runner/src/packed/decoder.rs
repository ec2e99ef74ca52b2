//! One decoder block on packed weights, over all rows of a step at once:
//! `x += [norm](attn(norm(x)))`, then `x += [norm](mlp(norm(x)))`, the bracketed norms on
//! the sub-blocks' outputs only where the family has them (Gemma).
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
use crate::model::{ModelConfig, ModelSpec};

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
    attn_out_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    mlp: Mlp,
    mlp_out_norm: Option<RmsNorm>,
}

impl DecoderLayer {
    /// The projections of layer `i`, in packing order.
    pub fn specs(i: usize, cfg: &ModelConfig) -> Vec<Spec> {
        let mut specs = Attention::specs(i, cfg).to_vec();
        specs.extend(Mlp::specs(i, cfg));
        specs
    }

    /// f32 values a decode step reads outside the projections: the norm scales, biases and
    /// QK-norm scales.
    pub fn f32_per_token(cfg: &ModelConfig, spec: &ModelSpec) -> usize {
        spec.family.norms.count() * cfg.hidden_size + Attention::f32_per_token(cfg, spec)
    }

    /// Packs `model.layers.{i}.*`.
    pub fn load(p: &Packer<'_>, i: usize, cfg: &ModelConfig, spec: &ModelSpec) -> Result<Self> {
        let h = cfg.hidden_size;
        let norm =
            |s: &str| RmsNorm::load(p, &format!("model.layers.{i}.{s}.weight"), h, cfg, spec);
        let names = spec.family.norms;
        Ok(DecoderLayer {
            attn_norm: norm(names.attn_in)?,
            attn: Attention::load(p, i, cfg, spec)?,
            attn_out_norm: names.attn_out.map(norm).transpose()?,
            ffn_norm: norm(names.mlp_in)?,
            mlp: Mlp::load(p, i, cfg, spec)?,
            mlp_out_norm: names.mlp_out.map(norm).transpose()?,
        })
    }

    /// Runs the block on the residual stream `x` of the step's `rows`.
    pub fn forward(&self, x: &mut [f32], rows: &[RowPos<'_>], kv: &mut KvStore, s: &mut Scratch) {
        self.attn_norm.forward(x, &mut s.hn);
        self.attn.forward(&s.hn, rows, kv, &mut s.attn, &mut s.proj);
        if let Some(n) = &self.attn_out_norm {
            n.forward(&s.proj, &mut s.hn);
            std::mem::swap(&mut s.proj, &mut s.hn);
        }
        add_assign(x, &s.proj);
        self.ffn_norm.forward(x, &mut s.hn);
        self.mlp.forward(&s.hn, rows.len(), &mut s.mlp, &mut s.proj);
        if let Some(n) = &self.mlp_out_norm {
            n.forward(&s.proj, &mut s.hn);
            std::mem::swap(&mut s.proj, &mut s.hn);
        }
        add_assign(x, &s.proj);
    }

    /// Bytes of the block's weights (packed projections, norm scales, biases).
    pub fn bytes(&self) -> usize {
        let out_norms = [&self.attn_out_norm, &self.mlp_out_norm]
            .iter()
            .map(|n| n.as_ref().map_or(0, RmsNorm::bytes))
            .sum::<usize>();
        self.attn_norm.bytes()
            + self.attn.bytes()
            + self.ffn_norm.bytes()
            + self.mlp.bytes()
            + out_norms
    }
}
