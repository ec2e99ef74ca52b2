//! The packed CPU runner: weights repacked for this crate's SIMD kernels (quantized formats
//! served as stored) as layer structs ([`PackedModel`]), a paged f16 or f32 [`KvStore`], and the
//! step over them (embed → each layer's `forward` → norm → LM head). The fast CPU
//! path and the CPU default; it implements [`ModelRunner`] by delegating to its inherent
//! methods, so the engine loop's dynamic call costs one indirect call per step.
//!
//! Invariant: the forward pass runs whole on one rayon worker (see [`PackedRunner::step`]).

use super::kv_store::{KvDtype, KvStore};
use super::packed::{PackedModel, WeightsPlan};
use super::weight_format::WeightChoice;
use super::{ModelRunner, RunnerConfig, SeqChunk, StepLogits, validate_batch};
use crate::error::Result;
use crate::model::{ModelConfig, ModelFiles, Weights};
use tidegate_kv::block_io::{BlockIo, BlockIoError};

/// Packed weights + paged KV store + the forward pass.
#[derive(Debug)]
pub struct PackedRunner {
    cfg: ModelConfig,
    model: PackedModel,
    kv: KvStore,
}

impl PackedRunner {
    /// Packs the weights of a loaded checkpoint (as the file stores them) and allocates the
    /// KV pool.
    pub fn new(files: &ModelFiles, rc: RunnerConfig) -> Result<Self> {
        Self::with_weights(files, rc, WeightChoice::AsFile)
    }

    /// As [`PackedRunner::new`], serving the projections in the formats `choice` gives.
    pub fn with_weights(
        files: &ModelFiles,
        rc: RunnerConfig,
        choice: WeightChoice,
    ) -> Result<Self> {
        Self::build(&files.weights, &files.config, rc, choice)
    }

    /// As [`PackedRunner::new`], from weights and config.
    pub fn from_weights(w: &Weights, cfg: &ModelConfig, rc: RunnerConfig) -> Result<Self> {
        Self::build(w, cfg, rc, WeightChoice::AsFile)
    }

    fn build(
        w: &Weights,
        cfg: &ModelConfig,
        rc: RunnerConfig,
        choice: WeightChoice,
    ) -> Result<Self> {
        rc.check()?;
        let model = PackedModel::pack(w, cfg, choice)?;
        let kv = KvStore::new(
            cfg.num_hidden_layers,
            cfg.kv_heads(),
            cfg.head_dim(),
            rc.block_size,
            rc.num_blocks,
            rc.kv_dtype,
        );
        Ok(Self {
            cfg: cfg.clone(),
            model,
            kv,
        })
    }

    /// Bytes of one KV block for `cfg` (to size a pool from a byte budget).
    pub fn block_bytes_for(cfg: &ModelConfig, block_size: usize, dtype: KvDtype) -> usize {
        KvStore::bytes_per_block(
            cfg.num_hidden_layers,
            cfg.kv_heads(),
            cfg.head_dim(),
            block_size,
            dtype,
        )
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    /// Weight bytes read by one decode step (the numerator of the batch-1 roofline).
    pub fn bytes_read_per_token(&self) -> usize {
        self.model.plan().bytes_per_token()
    }

    /// The served formats and bytes per token.
    pub fn weights_plan(&self) -> &WeightsPlan {
        self.model.plan()
    }

    /// One batched forward pass; see the module note for the contract.
    pub fn step(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepLogits> {
        validate_batch(
            batch,
            self.cfg.vocab_size,
            self.kv.block_size(),
            self.kv.num_blocks(),
        )?;
        // The caller (the engine loop's own thread) is not a rayon worker, so every parallel
        // loop it started would be handed to the pool and waited on: hundreds of cross-thread
        // hand-offs per token, each a scheduler wake-up on a busy machine. Running the whole
        // pass on a worker pays that once; the loops inside then split work in place.
        rayon::scope(|_| self.forward(batch))
    }

    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepLogits> {
        Ok(self.model.forward(&self.cfg, batch, &mut self.kv))
    }
}

impl PackedRunner {
    /// Blocks in the KV pool.
    pub fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }

    /// The KV store (fallible block I/O: `try_read_block`, `try_write_block`, ...).
    pub fn kv_store(&self) -> &KvStore {
        &self.kv
    }

    /// The KV store, mutably.
    pub fn kv_store_mut(&mut self) -> &mut KvStore {
        &mut self.kv
    }
}

/// Block I/O for the KV cache manager, delegated to the [`KvStore`] (errors name the block).
impl BlockIo for PackedRunner {
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

impl ModelRunner for PackedRunner {
    fn step(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepLogits> {
        PackedRunner::step(self, batch)
    }
    fn block_size(&self) -> usize {
        self.kv.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn kind(&self) -> &'static str {
        "packed"
    }
}
