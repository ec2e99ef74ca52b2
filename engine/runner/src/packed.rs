//! The packed CPU runner's model, written as small layer structs in candle-transformers'
//! style, each with a `load` from the checkpoint and a `forward`: `Embedding` →
//! `DecoderLayer` (`RmsNorm`, `Attention`, `Mlp`) per layer → `RmsNorm` → `LmHead`
//! (files `packed/{ends,attention,mlp,decoder}.rs`). Every projection is a [`Projection`](crate::weight_format::Projection) in its
//! served format ([`crate::weight_format`]), with the projections that read the same input
//! fused so one kernel call serves them (`wqkv = [q; k; v]`, `w_gate_up = [gate; up]`). Norm
//! scales and the embedding (for row lookup) stay f32 row-major. Built once from
//! [`Weights`]; the checkpoint can be dropped afterwards.
//!
//! [`WeightsPlan`] decides every projection's format from the layer structs' specs and the
//! `--weights` choice without packing (`packed/plan.rs`).
//!
//! One set of layer structs serves every architecture: what differs (biases, QK-norm, the
//! norms around the sub-blocks, the activation, windows and per-layer RoPE) is read from the
//! config's [`ModelSpec`] at load.
//!
//! Invariants: `layout` and [`PackedModel::pack`] list the same projections; a forward pass
//! runs every layer over all rows of the step at once and computes the final norm and LM
//! head only for the rows whose logits are wanted.

mod attention;
mod decoder;
mod ends;
mod mlp;
mod plan;

use crate::attention::RowPos;
use crate::error::{Error, Result};
use crate::kv_store::KvStore;
use crate::model::{ModelConfig, ModelSpec, Weights};
use crate::weight_format::WeightChoice;
use crate::{SeqChunk, StepLogits};
use decoder::{DecoderLayer, Scratch};
use ends::{Embedding, LmHead, RmsNorm};
pub use plan::WeightsPlan;
use plan::{Layout, Packer};

/// All weights, packed, as layer structs.
#[derive(Debug)]
pub struct PackedModel {
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: LmHead,
    plan: WeightsPlan,
}

/// Every projection of `cfg`'s architecture, in packing order, and the f32 values a step
/// reads besides them.
fn layout(w: &Weights, cfg: &ModelConfig) -> Layout {
    let spec = cfg.spec();
    let mut specs: Vec<_> = (0..cfg.num_hidden_layers)
        .flat_map(|i| DecoderLayer::specs(i, cfg))
        .collect();
    specs.push(LmHead::spec(w, cfg));
    let layers = cfg.num_hidden_layers * DecoderLayer::f32_per_token(cfg, &spec);
    // The final norm's scale and one embedding row.
    Layout {
        specs,
        f32_per_token: layers + 2 * cfg.hidden_size,
    }
}

impl PackedModel {
    /// Packs checked weights (shapes validated against `cfg`) in the formats `choice` gives.
    pub fn pack(w: &Weights, cfg: &ModelConfig, choice: WeightChoice) -> Result<Self> {
        let plan = WeightsPlan::new(w, cfg, choice)?;
        let p = Packer::new(w, &plan);
        let spec: ModelSpec = cfg.spec();
        let embed = Embedding::load(&p, cfg, &spec)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::load(&p, i, cfg, &spec))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(&p, "model.norm.weight", cfg.hidden_size, cfg, &spec)?;
        let lm_head = LmHead::load(&p, cfg, &spec)?;
        if layers.is_empty() {
            return Err(Error::Config("model without layers".into()));
        }
        Ok(Self {
            embed,
            layers,
            norm,
            lm_head,
            plan,
        })
    }

    /// The formats chosen and the bytes per token.
    pub fn plan(&self) -> &WeightsPlan {
        &self.plan
    }

    /// Bytes of weights one decode step reads, summed over the packed layer structs.
    pub fn bytes_per_token(&self) -> usize {
        let layers: usize = self.layers.iter().map(DecoderLayer::bytes).sum();
        self.embed.bytes_per_token() + layers + self.norm.bytes() + self.lm_head.bytes()
    }

    /// One forward pass over a validated batch: embed → every layer (writing this step's
    /// K/V into `kv`) → final norm → LM head, for the chunks that want logits.
    pub fn forward(
        &self,
        cfg: &ModelConfig,
        batch: &[SeqChunk<'_>],
        kv: &mut KvStore,
    ) -> StepLogits {
        let rows: Vec<RowPos<'_>> = batch
            .iter()
            .flat_map(|c| {
                (0..c.tokens.len()).map(move |i| RowPos {
                    pos: c.start_pos + i,
                    block_table: c.block_table,
                })
            })
            .collect();
        let mut x = Vec::with_capacity(rows.len() * cfg.hidden_size);
        for c in batch {
            self.embed.forward(c.tokens, &mut x);
        }
        let mut scratch = Scratch::new(rows.len(), cfg);
        for layer in &self.layers {
            layer.forward(&mut x, &rows, kv, &mut scratch);
        }
        self.logits(&x, batch, cfg.hidden_size)
    }

    /// Final norm and LM head for the last row of each chunk that wants logits.
    fn logits(&self, x: &[f32], batch: &[SeqChunk<'_>], h: usize) -> StepLogits {
        let mut wanted = Vec::new();
        let mut end = 0;
        for c in batch {
            end += c.tokens.len();
            if c.want_logits {
                wanted.push(end - 1);
            }
        }
        let mut normed = vec![0f32; wanted.len() * h];
        self.norm.forward_rows(x, &wanted, &mut normed);
        let logits = self.lm_head.forward(&normed, wanted.len());
        let mut per_row = logits
            .chunks_exact(self.lm_head.vocab())
            .map(<[f32]>::to_vec);
        batch
            .iter()
            .map(|c| if c.want_logits { per_row.next() } else { None })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::random::{random_config, random_weights};

    #[test]
    fn the_plan_predicts_the_packed_bytes_for_every_choice() {
        let cfg = random_config(300);
        let w = Weights::from_map(random_weights(&cfg, 1).unwrap());
        for choice in [
            WeightChoice::AsFile,
            WeightChoice::F32,
            WeightChoice::Bf16,
            WeightChoice::Q8_0,
            WeightChoice::Q4_0,
            WeightChoice::Q4_1,
        ] {
            let m = PackedModel::pack(&w, &cfg, choice).unwrap();
            assert_eq!(
                m.plan().bytes_per_token(),
                m.bytes_per_token(),
                "{choice:?}"
            );
        }
    }

    #[test]
    fn as_file_serves_an_f32_checkpoint_in_f32_and_converts_on_request() {
        let cfg = random_config(300);
        let w = Weights::from_map(random_weights(&cfg, 1).unwrap());
        let label = |c| WeightsPlan::new(&w, &cfg, c).unwrap().label();
        assert_eq!(label(WeightChoice::AsFile), "f32");
        assert_eq!(label(WeightChoice::Bf16), "bf16");
        assert_eq!(label(WeightChoice::Q8_0), "q8_0");
        assert!(
            label(WeightChoice::Q4_0).starts_with("q4_0 "),
            "the LM head stays q8_0"
        );
    }

    #[test]
    fn as_file_serves_a_bf16_safetensors_checkpoint_in_bf16_at_half_the_bytes() {
        let cfg = random_config(300);
        let tensors = random_weights(&cfg, 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bf16: std::collections::HashMap<_, _> = tensors
            .iter()
            .map(|(k, t)| (k.clone(), t.to_dtype(candle_core::DType::BF16).unwrap()))
            .collect();
        candle_core::safetensors::save(&bf16, dir.path().join("model.safetensors")).unwrap();
        let w = Weights::from_safetensors_dir(dir.path()).unwrap();
        let plan = WeightsPlan::new(&w, &cfg, WeightChoice::AsFile).unwrap();
        assert_eq!(plan.label(), "bf16");
        let f32_plan = WeightsPlan::new(&w, &cfg, WeightChoice::F32).unwrap();
        assert!(plan.bytes_per_token() < f32_plan.bytes_per_token() * 6 / 10);
        let m = PackedModel::pack(&w, &cfg, WeightChoice::AsFile).unwrap();
        assert_eq!(m.bytes_per_token(), plan.bytes_per_token());
    }
}
