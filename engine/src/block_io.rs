//! The byte-level interface between the KV cache bookkeeping (which decides which block to
//! offload, restore or copy) and the tensor store that holds the blocks (the runner).
//!
//! A block is `block_size` token slots of K and V for all layers. Its byte image is opaque to
//! the caller: `read_block` then `write_block` of the same bytes into any block id restores
//! the exact contents (so offload to host RAM or disk and back is lossless). Block ids are
//! indexes into the preallocated pool, `0..num_blocks`.

use crate::error::Result;

/// Raw access to the blocks of a paged KV store.
pub trait BlockIo {
    /// Bytes in one block's image.
    fn block_bytes(&self) -> usize;
    /// Number of blocks in the pool.
    fn num_blocks(&self) -> usize;
    /// Replaces `out` with the byte image of `block`.
    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<()>;
    /// Overwrites `block` with an image from [`BlockIo::read_block`]
    /// (`data.len() == block_bytes()`).
    fn write_block(&mut self, block: u32, data: &[u8]) -> Result<()>;
    /// Copies the contents of `src` into `dst` (copy-on-write of a shared prefix block).
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<()>;
}
