//! The packed CPU runner: weights repacked for this crate's SIMD kernels (quantized formats
//! served as stored), a paged f32 [`KvStore`], and the forward pass over it. The fast CPU
//! path and the CPU default; it implements [`ModelRunner`] by delegating to its inherent
//! methods, so the engine loop's dynamic call costs one indirect call per step.
//!
//! Invariant: the forward pass runs whole on one rayon worker (see [`PackedRunner::step`]).

use super::attention::{AttnShape, RowPos, paged_attention};
use super::kv_store::KvStore;
use super::packed::{PackedModel, WeightsPlan};
use super::weight_format::WeightChoice;
use super::{ModelRunner, RunnerConfig, SeqChunk, StepLogits, validate_batch};
use crate::error::Result;
use crate::kernels::ops::{add_assign, rms_norm, rope_inv_freq, rope_row, silu_mul};
use crate::model::{LlamaConfig, ModelFiles, Weights};
use rayon::prelude::*;
use tidegate_kv::block_io::{BlockIo, BlockIoError};

/// Packed weights + paged KV store + the forward pass.
#[derive(Debug)]
pub struct PackedRunner {
    cfg: LlamaConfig,
    model: PackedModel,
    kv: KvStore,
    inv_freq: Vec<f64>,
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
    pub fn from_weights(w: &Weights, cfg: &LlamaConfig, rc: RunnerConfig) -> Result<Self> {
        Self::build(w, cfg, rc, WeightChoice::AsFile)
    }

    fn build(
        w: &Weights,
        cfg: &LlamaConfig,
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
        );
        Ok(Self {
            cfg: cfg.clone(),
            model,
            kv,
            inv_freq: rope_inv_freq(cfg.head_dim(), cfg.rope_theta),
        })
    }

    /// Bytes of one KV block for `cfg` (to size a pool from a byte budget).
    pub fn block_bytes_for(cfg: &LlamaConfig, block_size: usize) -> usize {
        KvStore::bytes_per_block(
            cfg.num_hidden_layers,
            cfg.kv_heads(),
            cfg.head_dim(),
            block_size,
        )
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    /// Weight bytes read by one decode step (the numerator of the batch-1 roofline).
    pub fn bytes_read_per_token(&self) -> usize {
        self.model.plan.bytes_per_token()
    }

    /// The served formats and bytes per token.
    pub fn weights_plan(&self) -> &WeightsPlan {
        &self.model.plan
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
        let cfg = &self.cfg;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (heads, kvh) = (cfg.num_attention_heads, cfg.kv_heads());
        let kvd = kvh * hd;
        let qkv_w = h + 2 * kvd;
        let inter = cfg.intermediate_size;
        let eps = cfg.rms_norm_eps as f32;
        let bs = self.kv.block_size();

        let rows: Vec<RowPos<'_>> = batch
            .iter()
            .flat_map(|c| {
                (0..c.tokens.len()).map(move |i| RowPos {
                    pos: c.start_pos + i,
                    block_table: c.block_table,
                })
            })
            .collect();
        let t = rows.len();

        let mut x = Vec::with_capacity(t * h);
        for c in batch {
            for &tok in c.tokens {
                x.extend_from_slice(&self.model.embed[tok as usize * h..(tok as usize + 1) * h]);
            }
        }
        let mut hn = vec![0f32; t * h];
        let mut qkv = vec![0f32; t * qkv_w];
        let mut attn = vec![0f32; t * h];
        let mut proj = vec![0f32; t * h];
        let mut gu = vec![0f32; t * 2 * inter];
        let mut act = vec![0f32; t * inter];
        let mut cs = vec![0f32; hd];
        let shape = AttnShape {
            heads,
            kv_heads: kvh,
            head_dim: hd,
            q_stride: qkv_w,
        };

        for (li, layer) in self.model.layers.iter().enumerate() {
            norm_rows(&x, &layer.attn_norm, eps, h, &mut hn);
            layer.wqkv.matmul(&hn, t, &mut qkv);
            for (r, row) in rows.iter().enumerate() {
                let q_k = &mut qkv[r * qkv_w..r * qkv_w + h + kvd];
                rope_row(q_k, hd, row.pos, &self.inv_freq, &mut cs);
                let base = r * qkv_w;
                let block = row.block_table[row.pos / bs];
                self.kv.write_token(
                    li,
                    block,
                    row.pos % bs,
                    &qkv[base + h..base + h + kvd],
                    &qkv[base + h + kvd..base + qkv_w],
                );
            }
            paged_attention(&qkv, &rows, &self.kv, li, shape, &mut attn);
            layer.wo.matmul(&attn, t, &mut proj);
            add_assign(&mut x, &proj);
            norm_rows(&x, &layer.ffn_norm, eps, h, &mut hn);
            layer.w_gate_up.matmul(&hn, t, &mut gu);
            act.par_chunks_mut(inter)
                .zip(gu.par_chunks(2 * inter))
                .with_min_len(ROWS_PER_TASK)
                .for_each(|(a, row)| silu_mul(&row[..inter], &row[inter..], a));
            layer.w_down.matmul(&act, t, &mut proj);
            add_assign(&mut x, &proj);
        }

        // Final norm + LM head only for the rows whose logits are wanted.
        let mut last_rows = Vec::new();
        let mut end = 0;
        for c in batch {
            end += c.tokens.len();
            if c.want_logits {
                last_rows.push(end - 1);
            }
        }
        let l = last_rows.len();
        let mut normed = vec![0f32; l * h];
        for (i, &r) in last_rows.iter().enumerate() {
            rms_norm(
                &x[r * h..(r + 1) * h],
                &self.model.norm,
                eps,
                &mut normed[i * h..(i + 1) * h],
            );
        }
        let vocab = cfg.vocab_size;
        let mut logits = vec![0f32; l * vocab];
        self.model.lm_head.matmul(&normed, l, &mut logits);
        let mut per_row = logits.chunks_exact(vocab).map(<[f32]>::to_vec);
        Ok(batch
            .iter()
            .map(|c| if c.want_logits { per_row.next() } else { None })
            .collect())
    }
}

/// Row-wise work is split across threads only in chunks of this many rows.
const ROWS_PER_TASK: usize = 16;

/// RMSNorm of every `h`-wide row of `x` into `out`.
fn norm_rows(x: &[f32], w: &[f32], eps: f32, h: usize, out: &mut [f32]) {
    out.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .with_min_len(ROWS_PER_TASK)
        .for_each(|(o, r)| rms_norm(r, w, eps, o));
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
