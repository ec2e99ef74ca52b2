//! The batched forward pass over a paged KV store: the engine loop's only entry point to a
//! model, behind one interface ([`ModelRunner`]) with several implementations — the packed
//! CPU runner ([`PackedRunner`], own SIMD kernels), the candle device runner
//! ([`candle::CandleRunner`], CPU and CUDA) and the echo runner ([`echo::EchoRunner`], deterministic tokens for tests and demos). Fakes are runners
//! under the real loop, never a second engine.
//!
//! Contract for the engine loop (every implementation keeps it):
//! - A runner owns a fixed pool (`num_blocks` blocks of `block_size` tokens, all layers). The
//!   KV cache bookkeeping owns block ids and hands each sequence a block table (`Vec<u32>`);
//!   position `p` lives in `block_table[p / block_size]`, slot `p % block_size`.
//! - Each step, [`ModelRunner::step`] is called once with one [`SeqChunk`] per scheduled
//!   sequence: a decode step is a chunk of one token, a prefill (or chunk of it) is several.
//!   Chunks of one step may mix freely. `start_pos` is the number of tokens of that sequence
//!   already in the cache; the block table must cover `start_pos + tokens.len()` positions.
//!   The step writes the chunk's K/V into those slots, then returns, per chunk, the logits
//!   of its last token when `want_logits` is set (typically: decode tokens and the final
//!   prefill chunk). A bad batch is an error ([`validate_batch`]), never a panic.
//! - The same sequence must not appear twice in one step. Block contents are moved by the
//!   cache side through [`BlockIo`]; that I/O is fallible and a failure names the block, so
//!   the cache can recompute instead of using a bad image.
//! - What a step returns depends only on the tokens at each sequence's positions (its
//!   history), not on block placement, batching or chunking, up to float reassociation
//!   (tests check batched == sequential, chunked == one-shot, and paged == the dense candle
//!   reference), so a restored or recomputed KV gives the same answer.

pub mod error;
pub mod generate;
pub mod kernels;
pub mod model;
pub mod sampling;

pub mod attention;
pub mod candle;
pub mod echo;
mod echo_model;
pub mod kv_store;
pub mod packed;
mod packed_runner;
pub mod select;
pub mod weight_format;

/// The element type of device weights and KV (what `select::candle_dtype` answers).
pub use candle_core::DType;
pub use error::{Error, Result};
pub use kv_store::{KvDtype, KvStore};
pub use packed::{PackedModel, WeightsPlan};
pub use packed_runner::PackedRunner;
pub use select::{DeviceChoice, Placement, RunnerChoice};
use tidegate_kv::block_io::BlockIo;
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
    /// The packed runner's KV element type (the candle runner keeps its own, per device).
    pub kv_dtype: KvDtype,
}

impl RunnerConfig {
    /// Refuses an empty pool (a runner with no blocks could never run a token).
    pub fn check(&self) -> Result<()> {
        if self.block_size == 0 || self.num_blocks == 0 {
            return Err(Error::Config(
                "block_size and num_blocks must be > 0".into(),
            ));
        }
        Ok(())
    }
}

/// Logits per chunk: `Some` exactly for the chunks with `want_logits`.
pub type StepLogits = Vec<Option<Vec<f32>>>;

/// What the engine loop needs from a model: one batched step over the scheduled chunks, the
/// pool's shape, and (through [`BlockIo`]) the fallible block moves of offload and restore.
///
/// `Send` because the loop builds the runner on its owner thread and keeps it there; nothing
/// else ever touches it, so no method needs to be `Sync`.
pub trait ModelRunner: BlockIo + Send {
    /// One batched forward pass; see the module note for the contract.
    fn step(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepLogits>;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
    /// Blocks in the KV pool.
    fn num_blocks(&self) -> usize;
    /// Logits per row (the vocabulary, special tokens included).
    fn vocab_size(&self) -> usize;
    /// A short name for logs (`packed`, `candle`, `echo`).
    fn kind(&self) -> &'static str;
}

/// Checks a batch against a pool's shape and a vocabulary: every chunk has tokens, every
/// token is in the vocabulary, every block table covers its chunk and names blocks of the
/// pool. Runners call it before touching their KV, so a bad batch fails whole.
pub fn validate_batch(
    batch: &[SeqChunk<'_>],
    vocab_size: usize,
    block_size: usize,
    num_blocks: usize,
) -> Result<()> {
    for (i, c) in batch.iter().enumerate() {
        if c.tokens.is_empty() {
            return Err(Error::InvalidInput(format!("chunk {i} has no tokens")));
        }
        if let Some(t) = c.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(Error::InvalidInput(format!(
                "token {t} outside the vocabulary"
            )));
        }
        let end = c.start_pos + c.tokens.len();
        if c.block_table.len() * block_size < end {
            return Err(Error::InvalidInput(format!(
                "chunk {i}: block table covers {} positions, needs {end}",
                c.block_table.len() * block_size
            )));
        }
        if let Some(b) = c.block_table[..end.div_ceil(block_size)]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return Err(Error::InvalidInput(format!(
                "chunk {i}: block {b} out of range"
            )));
        }
    }
    Ok(())
}
