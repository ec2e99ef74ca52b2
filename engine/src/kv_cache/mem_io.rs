//! An in-memory [`BlockIo`]: one `Vec<u8>` per block. Used by tests and by tensor-free
//! simulations of the engine loop.
//!
//! Invariant: every block is exactly `block_bytes` long; out-of-range block ids are ignored
//! (reads return zeros), so a buggy caller shows up as wrong bytes in a test, not a panic.

use crate::block_io::BlockIo;

/// `num_blocks` blocks of `block_bytes` bytes, zero-filled.
#[derive(Clone, Debug)]
pub struct MemBlockIo {
    block_bytes: usize,
    blocks: Vec<Vec<u8>>,
}

impl MemBlockIo {
    /// A zeroed store.
    pub fn new(num_blocks: usize, block_bytes: usize) -> Self {
        MemBlockIo {
            block_bytes,
            blocks: vec![vec![0; block_bytes]; num_blocks],
        }
    }

    /// The bytes of `block` (empty when out of range).
    pub fn bytes(&self, block: u32) -> &[u8] {
        self.blocks
            .get(block as usize)
            .map_or(&[], |b| b.as_slice())
    }

    /// Fills `block` with `byte`.
    pub fn fill(&mut self, block: u32, byte: u8) {
        if let Some(b) = self.blocks.get_mut(block as usize) {
            b.fill(byte);
        }
    }
}

impl BlockIo for MemBlockIo {
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn read_block(&self, block: u32, out: &mut Vec<u8>) {
        out.clear();
        match self.blocks.get(block as usize) {
            Some(b) => out.extend_from_slice(b),
            None => out.resize(self.block_bytes, 0),
        }
    }

    fn write_block(&mut self, block: u32, data: &[u8]) {
        if let Some(b) = self.blocks.get_mut(block as usize) {
            let n = data.len().min(b.len());
            b[..n].copy_from_slice(&data[..n]);
        }
    }

    fn copy_block(&mut self, src: u32, dst: u32) {
        if let Some(data) = self.blocks.get(src as usize).cloned() {
            self.write_block(dst, &data);
        }
    }
}
