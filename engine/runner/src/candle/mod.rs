//! The device runner on candle tensors (`--runner candle`): the same forward pass as the
//! packed runner (RMSNorm, half-split RoPE, grouped-query paged attention, gated MLP, and
//! every architecture's differences from the config's `ModelSpec`), written
//! as layer structs on candle ops (`layers`, `model`: embed → each layer's `forward` →
//! norm → LM head) so it runs on `Device::Cpu` and, with the `cuda` feature, on
//! `Device::Cuda` (cuBLAS matmuls). Weights are bf16 on CUDA and f32 on the CPU
//! ([`super::select::candle_dtype`] says why); the KV pool is block tensors on the device
//! ([`kv_pool`]); a step is one batched pass over mixed prefill chunks and decode rows.
//!
//! Numerics: projections and attention matmuls run in the weight dtype; the residual stream,
//! the norms, RoPE and the softmax run in f32; logits come back to the host in f32 and are
//! sampled there.
//!
//! Invariants: as every [`ModelRunner`] (see the runner module note); nothing a step does
//! allocates in or copies the KV pool, and only the wanted logits rows leave the device.

mod attention;
pub mod kv_pool;
mod layers;
mod model;
mod step;
mod weights;

use candle_core::{DType, Device};

use super::select::{DeviceChoice, candle_dtype, open_device};
use super::{ModelRunner, RunnerConfig, SeqChunk, StepLogits, validate_batch};
use crate::error::{Error, Result};
use crate::model::{ModelConfig, ModelFiles, Weights};
use kv_pool::{DeviceKv, PoolShape};
use model::DeviceModel;
use step::StepInputs;
use tidegate_kv::block_io::{BlockIo, BlockIoError};
use tidegate_kv::kv_sizing::Mib;
use weights::TensorSource;

/// Weights and KV pool on a candle device, and the forward pass over them.
#[derive(Debug)]
pub struct CandleRunner {
    cfg: ModelConfig,
    device: Device,
    dtype: DType,
    model: DeviceModel,
    kv: DeviceKv,
}

impl CandleRunner {
    /// Loads `files` onto `device` (bf16 on CUDA, f32 on the CPU) and allocates the pool.
    pub fn new(files: &ModelFiles, rc: RunnerConfig, device: DeviceChoice) -> Result<Self> {
        let dtype = candle_dtype(device);
        let device = open_device(device)?;
        Self::with_dtype(&files.weights, &files.config, rc, &device, dtype)
    }

    /// As [`CandleRunner::new`] on an open device with an explicit dtype (tests run the bf16
    /// path on the CPU).
    pub fn with_dtype(
        w: &Weights,
        cfg: &ModelConfig,
        rc: RunnerConfig,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        rc.check()?;
        let model = DeviceModel::load(&TensorSource::checkpoint(w, dtype, device), cfg)?;
        Self::with_model(model, cfg, rc, device, dtype)
    }

    /// Random weights of `cfg`'s shapes made on `device` in its dtype (`bench
    /// --random-config`): the same forward pass and pool as a loaded model, no files.
    pub fn random(cfg: &ModelConfig, rc: RunnerConfig, device: DeviceChoice) -> Result<Self> {
        rc.check()?;
        cfg.validate()?;
        let dtype = candle_dtype(device);
        let at = device;
        let device = open_device(device)?;
        let model = DeviceModel::load(&TensorSource::random(dtype, &device), cfg).map_err(|e| {
            Error::Placement(format!(
                "making random weights on {at} ({} in {}): {e}",
                Mib(device_weight_bytes(cfg, dtype)),
                dtype.as_str()
            ))
        })?;
        Self::with_model(model, cfg, rc, &device, dtype)
    }

    fn with_model(
        model: DeviceModel,
        cfg: &ModelConfig,
        rc: RunnerConfig,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let shape = Self::pool_shape(cfg, rc);
        // A pool that does not fit fails here, at start; say how much it asked for.
        let kv = DeviceKv::new(shape, dtype, device).map_err(|e| {
            Error::Placement(format!(
                "allocating the KV pool on the device: {} blocks x {} bytes = {} \
                 (weights already hold {}): {e}",
                rc.num_blocks,
                shape.block_bytes(dtype),
                Mib((rc.num_blocks * shape.block_bytes(dtype)) as u64),
                Mib(model.weight_bytes() as u64),
            ))
        })?;
        Ok(CandleRunner {
            cfg: cfg.clone(),
            device: device.clone(),
            dtype,
            model,
            kv,
        })
    }

    fn pool_shape(cfg: &ModelConfig, rc: RunnerConfig) -> PoolShape {
        PoolShape {
            layers: cfg.num_hidden_layers,
            kv_heads: cfg.kv_heads(),
            head_dim: cfg.head_dim(),
            block_size: rc.block_size,
            num_blocks: rc.num_blocks,
        }
    }

    /// Bytes of one KV block for `cfg` in `dtype` (to size a pool from a byte budget).
    pub fn block_bytes_for(cfg: &ModelConfig, block_size: usize, dtype: DType) -> usize {
        let rc = RunnerConfig {
            block_size,
            num_blocks: 1,
            kv_dtype: crate::KvDtype::F16,
        };
        Self::pool_shape(cfg, rc).block_bytes(dtype)
    }

    /// Weight bytes on the device.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// The weight dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    fn forward(&self, batch: &[SeqChunk<'_>]) -> Result<StepLogits> {
        let inp = StepInputs::new(
            batch,
            &self.cfg,
            &self.model.variants,
            &self.kv,
            &self.device,
        )?;
        self.model.forward(batch, &inp, &self.kv)
    }
}

/// Weights multiplied per token: every projection and the LM head (embedding rows are read,
/// not multiplied).
pub fn weight_count_for(cfg: &ModelConfig) -> usize {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
    let layer = h * (qd + 2 * kvd) + h * qd + 3 * i * h;
    cfg.num_hidden_layers * layer + cfg.vocab_size * h
}

/// Bytes the weights of `cfg` take on the device in `dtype`, before they are loaded (to
/// check that they and the KV pool fit): every matrix and bias in `dtype` (the LM head
/// shares the embedding when tied), the norms in f32.
pub fn device_weight_bytes(cfg: &ModelConfig, dtype: DType) -> u64 {
    let h = cfg.hidden_size;
    let spec = cfg.spec();
    let embed = if cfg.tie_word_embeddings {
        0
    } else {
        cfg.vocab_size * h
    };
    let bias = usize::from(spec.qkv_bias) * (cfg.q_dim() + 2 * cfg.kv_dim())
        + usize::from(spec.o_bias) * h;
    let per_layer = cfg.num_hidden_layers * bias;
    let matrices = (weight_count_for(cfg) + embed + per_layer) * dtype.size_in_bytes();
    let layer_norms =
        spec.family.norms.count() * h + usize::from(spec.family.qk_norm) * 2 * cfg.head_dim();
    let norms = (cfg.num_hidden_layers * layer_norms + h) * DType::F32.size_in_bytes();
    (matrices + norms) as u64
}

impl ModelRunner for CandleRunner {
    fn step(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepLogits> {
        let s = self.kv.shape();
        validate_batch(batch, self.cfg.vocab_size, s.block_size, s.num_blocks)?;
        // As the packed runner: run the pass on one rayon worker, so candle's CPU kernels
        // split work in place instead of handing every op to the pool from outside it.
        rayon::scope(|_| self.forward(batch))
    }
    fn block_size(&self) -> usize {
        self.kv.shape().block_size
    }
    fn num_blocks(&self) -> usize {
        self.kv.shape().num_blocks
    }
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn kind(&self) -> &'static str {
        "candle"
    }
}

impl BlockIo for CandleRunner {
    fn block_bytes(&self) -> usize {
        self.kv.block_bytes()
    }
    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> std::result::Result<(), BlockIoError> {
        self.kv.read_block(block, out)
    }
    fn write_block(&mut self, block: u32, data: &[u8]) -> std::result::Result<(), BlockIoError> {
        self.kv.write_block(block, data)
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> std::result::Result<(), BlockIoError> {
        self.kv.copy_block(src, dst)
    }
    fn read_blocks(
        &self,
        blocks: &[u32],
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), BlockIoError> {
        self.kv.read_blocks(blocks, out)
    }
    fn write_blocks(
        &mut self,
        blocks: &[u32],
        data: &[u8],
    ) -> std::result::Result<(), BlockIoError> {
        self.kv.write_blocks(blocks, data)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> std::result::Result<(), BlockIoError> {
        self.kv.copy_blocks(pairs)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn random_weights_run_and_their_bytes_are_known_before_loading() {
        let cfg = ModelConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}"#,
        )
        .unwrap();
        let rc = RunnerConfig {
            block_size: 4,
            num_blocks: 8,
            kv_dtype: crate::KvDtype::F16,
        };
        let mut runner = CandleRunner::random(&cfg, rc, DeviceChoice::Cpu).unwrap();
        // The estimate is what lands on the device: the counted matrices, the untied
        // embedding, the norms in f32.
        let (h, l) = (cfg.hidden_size, cfg.num_hidden_layers);
        let expected = runner.weight_bytes() + cfg.vocab_size * h * 4 + (2 * l + 1) * h * 4;
        assert_eq!(device_weight_bytes(&cfg, DType::F32), expected as u64);
        let chunk = SeqChunk {
            tokens: &[1, 2, 3, 299],
            start_pos: 0,
            block_table: &[0, 1],
            want_logits: true,
        };
        let logits = runner.step(&[chunk]).unwrap();
        let row = logits[0].as_ref().unwrap();
        assert_eq!(row.len(), cfg.vocab_size);
        assert!(row.iter().all(|x| x.is_finite()), "{row:?}");
    }
}
