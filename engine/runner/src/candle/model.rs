//! The candle runner's whole model as layer structs: embedding (scaled where the family
//! scales it) → [`DecoderLayer`] per layer → final [`RmsNorm`] → LM head (softcapped where
//! the model says), loaded from a checkpoint or made at random ([`TensorSource`]) for the
//! config's [`crate::model::ModelSpec`].
//!
//! Invariants: the embedding and LM head are in the runner's dtype (one shared tensor when
//! tied); the final norm and LM head run only on the rows whose logits are wanted, and only
//! those rows leave the device.

use candle_core::{DType, Tensor};

use super::kv_pool::DeviceKv;
use super::layers::{DecoderLayer, RmsNorm};
use super::step::{StepInputs, Variants};
use super::weights::{TensorSource, bytes};
use crate::SeqChunk;
use crate::StepLogits;
use crate::error::Result;
use crate::model::ModelConfig;

/// The whole model on the device.
#[derive(Debug)]
pub struct DeviceModel {
    /// `[vocab, hidden]`, runner dtype.
    embed: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `[vocab, hidden]` (the embedding when tied).
    lm_head: Tensor,
    dtype: DType,
    embed_scale: Option<f32>,
    softcap: Option<f64>,
    /// The layers' distinct RoPEs and windows.
    pub variants: Variants,
}

impl DeviceModel {
    /// Loads every layer of `cfg`'s architecture from `src`.
    pub fn load(src: &TensorSource<'_>, cfg: &ModelConfig) -> Result<Self> {
        let spec = cfg.spec();
        let variants = Variants::new(&spec, cfg.head_dim());
        let (vocab, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed = src.matrix(&[("model.embed_tokens.weight".into(), vocab)], h)?;
        // Tied: one tensor on the device, shared (a clone shares the storage).
        let lm_head = if src.has_own_lm_head(cfg) {
            src.matrix(&[("lm_head.weight".into(), vocab)], h)?
        } else {
            embed.clone()
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::load(src, i, cfg, &spec, variants.layers[i]))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceModel {
            embed,
            layers,
            norm: RmsNorm::load(src, "model.norm.weight", h, cfg, &spec)?,
            lm_head,
            dtype: src.dtype(),
            embed_scale: spec.embed_scale,
            softcap: spec.final_softcap,
            variants,
        })
    }

    /// Bytes of every weight matrix the layers multiply, and the LM head (the numerator of
    /// the batch-1 roofline is about this).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(DecoderLayer::bytes).sum();
        layers + bytes(&self.lm_head)
    }

    /// One pass over a step: embed → every layer (writing the step's K/V into `kv`) →
    /// final norm and LM head for the wanted rows, back to the host in f32.
    pub fn forward(
        &self,
        batch: &[SeqChunk<'_>],
        inp: &StepInputs,
        kv: &DeviceKv,
    ) -> Result<StepLogits> {
        let mut x = self.embed.index_select(&inp.ids, 0)?.to_dtype(DType::F32)?;
        if let Some(scale) = self.embed_scale {
            x = (x * f64::from(scale))?;
        }
        for layer in &self.layers {
            x = layer.forward(&x, inp, kv)?;
        }
        self.logits(&x, batch, &inp.last_rows)
    }

    fn logits(&self, x: &Tensor, batch: &[SeqChunk<'_>], rows: &[u32]) -> Result<StepLogits> {
        let mut per_row = if rows.is_empty() {
            Vec::new()
        } else {
            let idx = Tensor::from_vec(rows.to_vec(), rows.len(), x.device())?;
            let normed = self.norm.forward(&x.index_select(&idx, 0)?)?;
            let mut logits = normed
                .to_dtype(self.dtype)?
                .matmul(&self.lm_head.t()?)?
                .to_dtype(DType::F32)?;
            if let Some(cap) = self.softcap {
                logits = ((logits / cap)?.tanh()? * cap)?;
            }
            logits.to_vec2::<f32>()?
        }
        .into_iter();
        Ok(batch
            .iter()
            .map(|c| if c.want_logits { per_row.next() } else { None })
            .collect())
    }
}
