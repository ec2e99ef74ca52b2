//! The candle runner's whole model as layer structs: embedding → [`DecoderLayer`] per layer
//! → final [`RmsNorm`] → LM head, loaded from a checkpoint or made at random
//! ([`TensorSource`]) for the config's [`Architecture`].
//!
//! Invariants: the embedding and LM head are in the runner's dtype (one shared tensor when
//! tied); the final norm and LM head run only on the rows whose logits are wanted, and only
//! those rows leave the device.

use candle_core::{DType, Tensor};

use super::kv_pool::DeviceKv;
use super::layers::{DecoderLayer, RmsNorm};
use super::step::StepInputs;
use super::weights::{TensorSource, bytes};
use crate::SeqChunk;
use crate::StepLogits;
use crate::error::Result;
use crate::model::{Architecture, ModelConfig};

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
}

impl DeviceModel {
    /// Loads every layer of `cfg`'s architecture from `src`.
    pub fn load(src: &TensorSource<'_>, cfg: &ModelConfig) -> Result<Self> {
        match cfg.architecture {
            Architecture::Llama => Self::load_llama(src, cfg),
        }
    }

    fn load_llama(src: &TensorSource<'_>, cfg: &ModelConfig) -> Result<Self> {
        let (vocab, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed = src.matrix(&[("model.embed_tokens.weight".into(), vocab)], h)?;
        // Tied: one tensor on the device, shared (a clone shares the storage).
        let lm_head = if src.has_own_lm_head(cfg) {
            src.matrix(&[("lm_head.weight".into(), vocab)], h)?
        } else {
            embed.clone()
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::load(src, i, cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceModel {
            embed,
            layers,
            norm: RmsNorm::load(src, "model.norm.weight", cfg)?,
            lm_head,
            dtype: src.dtype(),
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
            normed
                .to_dtype(self.dtype)?
                .matmul(&self.lm_head.t()?)?
                .to_dtype(DType::F32)?
                .to_vec2::<f32>()?
        }
        .into_iter();
        Ok(batch
            .iter()
            .map(|c| if c.want_logits { per_row.next() } else { None })
            .collect())
    }
}
