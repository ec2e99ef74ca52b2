//! The batched forward pass over a paged KV store (the engine loop's only tensor entry point).
//!
//! Contract for the engine loop:
//! - Build one [`Runner`] per model with a fixed pool (`num_blocks` blocks of `block_size`
//!   tokens, all layers). The KV cache bookkeeping owns block ids and hands each sequence a
//!   block table (`Vec<u32>`); position `p` lives in `block_table[p / block_size]`.
//! - Each step, call [`Runner::step`] once with one [`SeqChunk`] per scheduled sequence: a
//!   decode step is a chunk of one token, a prefill (or chunk of it) is several. Chunks of
//!   one step may mix freely. `start_pos` is the number of tokens of that sequence already in
//!   the cache; the block table must cover `start_pos + tokens.len()` positions. The step
//!   writes the chunk's K/V into those slots, then returns, per chunk, the logits of its last
//!   token when `want_logits` is set (typically: decode tokens and the final prefill chunk).
//! - The same sequence must not appear twice in one step. Block contents are moved by the
//!   cache side through [`BlockIo`] (implemented by [`Runner`]); that I/O is fallible and a
//!   failure names the block, so the cache can recompute instead of using a bad image.
//!
//! Results are independent of how sequences are batched or how a prefill is chunked, up to
//! float reassociation (tests check batched == sequential, chunked == one-shot, and paged ==
//! the dense candle reference).

pub mod attention;
pub mod kv_store;
pub mod packed;
pub mod weight_format;

use crate::block_io::{BlockIo, BlockIoError};
use crate::error::{Error, Result};
use crate::kernels::ops::{add_assign, rms_norm, rope_inv_freq, rope_row, silu_mul};
use crate::model::{LlamaConfig, ModelFiles, Weights};
use attention::{AttnShape, RowPos, paged_attention};
pub use kv_store::KvStore;
pub use packed::{PackedModel, WeightsPlan};
use rayon::prelude::*;
pub use weight_format::WeightChoice;

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    /// Tokens to run (at least one).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` (tokens already cached for this sequence).
    pub start_pos: usize,
    /// The sequence's block table, covering at least `start_pos + tokens.len()` positions.
    pub block_table: &'a [u32],
    /// Whether to return the logits of the chunk's last token.
    pub want_logits: bool,
}

/// Pool sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
}

/// Packed weights + paged KV store + the forward pass.
#[derive(Debug)]
pub struct Runner {
    cfg: LlamaConfig,
    model: PackedModel,
    kv: KvStore,
    inv_freq: Vec<f64>,
}

impl Runner {
    /// Packs the weights of a loaded checkpoint (as the file stores them) and allocates the
    /// KV pool.
    pub fn new(files: &ModelFiles, rc: RunnerConfig) -> Result<Self> {
        Self::with_weights(files, rc, WeightChoice::AsFile)
    }

    /// As [`Runner::new`], serving the projections in the formats `choice` gives.
    pub fn with_weights(
        files: &ModelFiles,
        rc: RunnerConfig,
        choice: WeightChoice,
    ) -> Result<Self> {
        Self::build(&files.weights, &files.config, rc, choice)
    }

    /// As [`Runner::new`], from weights and config.
    pub fn from_weights(w: &Weights, cfg: &LlamaConfig, rc: RunnerConfig) -> Result<Self> {
        Self::build(w, cfg, rc, WeightChoice::AsFile)
    }

    fn build(
        w: &Weights,
        cfg: &LlamaConfig,
        rc: RunnerConfig,
        choice: WeightChoice,
    ) -> Result<Self> {
        if rc.block_size == 0 || rc.num_blocks == 0 {
            return Err(Error::Config(
                "block_size and num_blocks must be > 0".into(),
            ));
        }
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

    fn validate(&self, batch: &[SeqChunk<'_>]) -> Result<()> {
        let bs = self.kv.block_size();
        for (i, c) in batch.iter().enumerate() {
            if c.tokens.is_empty() {
                return Err(Error::InvalidInput(format!("chunk {i} has no tokens")));
            }
            if let Some(t) = c
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(Error::InvalidInput(format!(
                    "token {t} outside the vocabulary"
                )));
            }
            let end = c.start_pos + c.tokens.len();
            if c.block_table.len() * bs < end {
                return Err(Error::InvalidInput(format!(
                    "chunk {i}: block table covers {} positions, needs {end}",
                    c.block_table.len() * bs
                )));
            }
            if let Some(b) = c.block_table[..end.div_ceil(bs)]
                .iter()
                .find(|&&b| b as usize >= self.kv.num_blocks())
            {
                return Err(Error::InvalidInput(format!(
                    "chunk {i}: block {b} out of range"
                )));
            }
        }
        Ok(())
    }

    /// One batched forward pass; see the module note for the contract.
    pub fn step(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        self.validate(batch)?;
        // The caller (the engine loop's own thread) is not a rayon worker, so every parallel
        // loop it started would be handed to the pool and waited on: hundreds of cross-thread
        // hand-offs per token, each a scheduler wake-up on a busy machine. Running the whole
        // pass on a worker pays that once; the loops inside then split work in place.
        rayon::scope(|_| self.forward(batch))
    }

    fn forward(&mut self, batch: &[SeqChunk<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
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

impl Runner {
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
impl BlockIo for Runner {
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
}
