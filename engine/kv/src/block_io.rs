//! Byte-level access to the paged KV store, so the cache manager can offload and restore blocks
//! without knowing about tensors.
//!
//! Invariant: every call either moves whole block images or fails with a [`BlockIoError`]
//! naming the block and the cause; an implementation never answers a failure with made-up
//! bytes (a zero-filled "image" would be restored as if it were the session's KV).

use std::fmt;

/// Which block operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockOp {
    /// Reading a block's image out of the pool.
    Read,
    /// Writing an image into a block.
    Write,
    /// Copying one block onto another.
    Copy,
}

impl fmt::Display for BlockOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockOp::Read => "read",
            BlockOp::Write => "write",
            BlockOp::Copy => "copy",
        })
    }
}

/// Why a block operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockIoCause {
    /// The block id is not in the pool.
    #[error("out of range (the pool has {num_blocks} blocks)")]
    OutOfRange {
        /// Blocks in the pool.
        num_blocks: usize,
    },
    /// An image of the wrong size was offered or came back.
    #[error("image has {got} bytes, a block has {want}")]
    WrongSize {
        /// Bytes seen.
        got: usize,
        /// Bytes in one block.
        want: usize,
    },
    /// The device (or whatever holds the pool) reported an error.
    #[error("device error: {0}")]
    Device(String),
}

/// A failed block operation: which operation, on which block, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("KV block {block}: {op} failed: {cause}")]
pub struct BlockIoError {
    /// The operation.
    pub op: BlockOp,
    /// The block it failed on (for a copy, whichever of source or destination was bad).
    pub block: u32,
    /// Why.
    pub cause: BlockIoCause,
}

impl BlockIoError {
    /// An error for `op` on `block`.
    pub fn new(op: BlockOp, block: u32, cause: BlockIoCause) -> Self {
        BlockIoError { op, block, cause }
    }
}

/// Implemented by the tensor-side KV store. The KV cache manager never calls it while it
/// decides: it plans block moves as data ([`crate::kv_cache::transfer`]) and the engine loop
/// has them executed, batched, before the forward pass. The batched methods are what a runner
/// implements for speed (one device↔host copy per layer and direction for a whole batch); the
/// single-block ones are the reference they must agree with.
pub trait BlockIo {
    /// Bytes one block occupies (all layers, K and V).
    fn block_bytes(&self) -> usize;
    /// Replaces `out` with the image of block `block` (exactly `block_bytes` long on success;
    /// unspecified on failure, and never to be used then).
    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BlockIoError>;
    /// Overwrites block `block` with `data`, which must be exactly `block_bytes` long. On
    /// failure the block's contents are unspecified.
    fn write_block(&mut self, block: u32, data: &[u8]) -> Result<(), BlockIoError>;
    /// Copies one block onto another (copy-on-write of a shared partial block).
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), BlockIoError>;

    /// Replaces `out` with the images of `blocks`, concatenated in order (each exactly as
    /// [`BlockIo::read_block`] gives it). On failure `out` is unspecified.
    fn read_blocks(&self, blocks: &[u32], out: &mut Vec<u8>) -> Result<(), BlockIoError> {
        let mut one = Vec::with_capacity(self.block_bytes());
        out.clear();
        for &b in blocks {
            self.read_block(b, &mut one)?;
            out.extend_from_slice(&one);
        }
        Ok(())
    }

    /// Writes `data` (images of `blocks`, concatenated in order) into `blocks`. On failure the
    /// blocks' contents are unspecified.
    fn write_blocks(&mut self, blocks: &[u32], data: &[u8]) -> Result<(), BlockIoError> {
        let bb = self.block_bytes();
        if data.len() != blocks.len() * bb {
            let cause = BlockIoCause::WrongSize {
                got: data.len(),
                want: blocks.len() * bb,
            };
            return Err(BlockIoError::new(BlockOp::Write, first(blocks), cause));
        }
        for (&b, image) in blocks.iter().zip(data.chunks_exact(bb.max(1))) {
            self.write_block(b, image)?;
        }
        Ok(())
    }

    /// Copies each `(src, dst)` pair, in order.
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BlockIoError> {
        for &(src, dst) in pairs {
            self.copy_block(src, dst)?;
        }
        Ok(())
    }
}

/// The block an error about a whole batch names when no single block is at fault.
pub fn first(blocks: &[u32]) -> u32 {
    blocks.first().copied().unwrap_or(0)
}
