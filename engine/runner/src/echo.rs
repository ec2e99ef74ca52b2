//! The echo runner: a [`ModelRunner`] with no weights whose tokens are a deterministic
//! function of each sequence's history (see the echo model's notes: a chat echoes its last
//! user message, then `<|im_end|>`). Behind `serve --fake-model`, the server tests and demos,
//! it runs under the real engine loop, so the scheduler, the KV cache manager, admission,
//! offload and restore are the real ones.
//!
//! Its KV pool holds, for every slot, the token id at that position (4 bytes, little endian),
//! so a sequence's history is read back through its block table exactly as attention reads
//! K/V: prefix sharing, copy-on-write, offload to host or disk and restore move real bytes,
//! and a sequence whose KV was lost is recomputed by the scheduler, not by the runner.
//!
//! Invariants: a step validates the whole batch before writing anything; each step takes at
//! least `step_time` (slept, standing in for a forward pass), so capacity is
//! `max_batch_size / step_time` tokens per second in decode.

use std::time::{Duration, Instant};

use super::echo_model::{VOCAB_SIZE, next_token};
use super::{ModelRunner, RunnerConfig, SeqChunk, StepLogits, validate_batch};
use crate::error::Result;
use tidegate_kv::block_io::{BlockIo, BlockIoCause, BlockIoError, BlockOp};

pub use super::echo_model::{IM_END, echo_tokenizer};

/// Logit of every token the echo does not pick: far below 0 but finite, so a temperature
/// sampler gives it probability 0 and the echo's choice probability 1.
const UNPICKED: f32 = -1.0e30;

/// Bytes one slot takes (a u32 token id).
const SLOT_BYTES: usize = 4;

/// The echo "model" as `serve --fake-model` configures it.
#[derive(Clone, Debug)]
pub struct EchoConfig {
    /// Time one batched step takes at least (a forward pass's stand-in).
    pub step_time: Duration,
    /// Context length the "model" declares (tokens).
    pub context_length: usize,
    /// Time the runner takes to build (simulated weight loading; not ready meanwhile).
    pub load_delay: Duration,
}

impl Default for EchoConfig {
    fn default() -> Self {
        EchoConfig {
            step_time: Duration::from_millis(5),
            context_length: 4096,
            load_delay: Duration::ZERO,
        }
    }
}

/// The echo runner's state: the slot table of its KV pool and its step time.
#[derive(Debug)]
pub struct EchoRunner {
    block_size: usize,
    num_blocks: usize,
    slots: Vec<u32>,
    step_time: Duration,
}

impl EchoRunner {
    /// A runner with a zeroed pool; sleeps `cfg.load_delay` first (the "weights").
    pub fn new(cfg: &EchoConfig, rc: RunnerConfig) -> Result<Self> {
        rc.check()?;
        std::thread::sleep(cfg.load_delay);
        Ok(EchoRunner {
            block_size: rc.block_size,
            num_blocks: rc.num_blocks,
            slots: vec![0; rc.block_size * rc.num_blocks],
            step_time: cfg.step_time,
        })
    }

    /// Bytes of one block (to size a pool from a byte budget).
    pub fn block_bytes_for(block_size: usize) -> usize {
        block_size * SLOT_BYTES
    }

    fn slot(&self, table: &[u32], pos: usize) -> usize {
        table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// Writes the chunk's tokens into its slots; returns the next token when it wants one.
    fn run_chunk(&mut self, c: &SeqChunk<'_>) -> Option<u32> {
        for (i, &t) in c.tokens.iter().enumerate() {
            let s = self.slot(c.block_table, c.start_pos + i);
            self.slots[s] = t;
        }
        if !c.want_logits {
            return None;
        }
        let end = c.start_pos + c.tokens.len();
        let history: Vec<u32> = (0..end)
            .map(|p| self.slots[self.slot(c.block_table, p)])
            .collect();
        Some(next_token(&history))
    }

    fn range(&self, op: BlockOp, block: u32) -> std::result::Result<usize, BlockIoError> {
        if (block as usize) < self.num_blocks {
            Ok(block as usize * self.block_size)
        } else {
            let cause = BlockIoCause::OutOfRange {
                num_blocks: self.num_blocks,
            };
            Err(BlockIoError::new(op, block, cause))
        }
    }
}

impl ModelRunner for EchoRunner {
    fn step(&mut self, batch: &[SeqChunk<'_>]) -> Result<StepLogits> {
        validate_batch(batch, VOCAB_SIZE, self.block_size, self.num_blocks)?;
        let started = Instant::now();
        let out = batch
            .iter()
            .map(|c| {
                self.run_chunk(c).map(|tok| {
                    let mut logits = vec![UNPICKED; VOCAB_SIZE];
                    logits[tok as usize] = 0.0;
                    logits
                })
            })
            .collect();
        std::thread::sleep(self.step_time.saturating_sub(started.elapsed()));
        Ok(out)
    }
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    fn vocab_size(&self) -> usize {
        VOCAB_SIZE
    }
    fn kind(&self) -> &'static str {
        "echo"
    }
}

impl BlockIo for EchoRunner {
    fn block_bytes(&self) -> usize {
        Self::block_bytes_for(self.block_size)
    }
    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> std::result::Result<(), BlockIoError> {
        let at = self.range(BlockOp::Read, block)?;
        out.clear();
        for t in &self.slots[at..at + self.block_size] {
            out.extend_from_slice(&t.to_le_bytes());
        }
        Ok(())
    }
    fn write_block(&mut self, block: u32, data: &[u8]) -> std::result::Result<(), BlockIoError> {
        let at = self.range(BlockOp::Write, block)?;
        let want = self.block_bytes();
        if data.len() != want {
            let cause = BlockIoCause::WrongSize {
                got: data.len(),
                want,
            };
            return Err(BlockIoError::new(BlockOp::Write, block, cause));
        }
        for (slot, bytes) in self.slots[at..at + self.block_size]
            .iter_mut()
            .zip(data.chunks_exact(SLOT_BYTES))
        {
            *slot = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        }
        Ok(())
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> std::result::Result<(), BlockIoError> {
        let from = self.range(BlockOp::Copy, src)?;
        let to = self.range(BlockOp::Copy, dst)?;
        self.slots.copy_within(from..from + self.block_size, to);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn runner(blocks: usize) -> EchoRunner {
        let cfg = EchoConfig {
            step_time: Duration::ZERO,
            ..EchoConfig::default()
        };
        let rc = RunnerConfig {
            block_size: 4,
            num_blocks: blocks,
            kv_dtype: crate::KvDtype::F16,
        };
        EchoRunner::new(&cfg, rc).unwrap()
    }

    fn picked(logits: &Option<Vec<f32>>) -> u32 {
        crate::sampling::argmax(logits.as_ref().unwrap())
    }

    #[test]
    fn chunked_paged_and_restored_histories_answer_alike() {
        let tok = echo_tokenizer().unwrap();
        let prompt = tok.encode("tidal").unwrap();
        let mut a = runner(8);
        let one_shot = a
            .step(&[SeqChunk {
                tokens: &prompt,
                start_pos: 0,
                block_table: &[0, 1],
                want_logits: true,
            }])
            .unwrap();
        // Chunked, in other blocks, after the first block went out and came back.
        let mut b = runner(8);
        let table = [5, 2];
        b.step(&[SeqChunk {
            tokens: &prompt[..4],
            start_pos: 0,
            block_table: &table,
            want_logits: false,
        }])
        .unwrap();
        let mut image = Vec::new();
        b.read_block(5, &mut image).unwrap();
        b.write_block(5, &vec![0; image.len()]).unwrap();
        b.write_block(5, &image).unwrap();
        let chunked = b
            .step(&[SeqChunk {
                tokens: &prompt[4..],
                start_pos: 4,
                block_table: &table,
                want_logits: true,
            }])
            .unwrap();
        assert_eq!(picked(&one_shot[0]), picked(&chunked[0]));
        assert_eq!(picked(&one_shot[0]), u32::from(b't'));
    }

    #[test]
    fn bad_batches_and_block_ids_are_errors() {
        let mut r = runner(2);
        let bad = SeqChunk {
            tokens: &[1, 2, 3, 4, 5],
            start_pos: 0,
            block_table: &[0],
            want_logits: true,
        };
        assert!(r.step(&[bad]).is_err());
        let mut out = Vec::new();
        assert!(r.read_block(2, &mut out).is_err());
        assert!(r.write_block(0, &[0; 3]).is_err());
        assert!(r.copy_block(0, 9).is_err());
    }
}
