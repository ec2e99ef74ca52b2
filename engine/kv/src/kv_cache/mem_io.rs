//! An in-memory [`BlockIo`]: one `Vec<u8>` per block. Used by tests and by tensor-free
//! simulations of the engine loop.
//!
//! Invariant: every block is exactly `block_bytes` long; an out-of-range block id or a
//! wrong-sized image is refused with a [`BlockIoError`] (nothing is written, no bytes are
//! made up), exactly as the tensor store does, so the manager's failure paths run in tests.

use crate::block_io::{BlockIo, BlockIoCause, BlockIoError, BlockOp};

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

impl MemBlockIo {
    fn out_of_range(&self, op: BlockOp, block: u32) -> BlockIoError {
        let cause = BlockIoCause::OutOfRange {
            num_blocks: self.blocks.len(),
        };
        BlockIoError::new(op, block, cause)
    }
}

impl BlockIo for MemBlockIo {
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BlockIoError> {
        let b = self
            .blocks
            .get(block as usize)
            .ok_or_else(|| self.out_of_range(BlockOp::Read, block))?;
        out.clear();
        out.extend_from_slice(b);
        Ok(())
    }

    fn write_block(&mut self, block: u32, data: &[u8]) -> Result<(), BlockIoError> {
        if data.len() != self.block_bytes {
            let cause = BlockIoCause::WrongSize {
                got: data.len(),
                want: self.block_bytes,
            };
            return Err(BlockIoError::new(BlockOp::Write, block, cause));
        }
        let err = self.out_of_range(BlockOp::Write, block);
        let b = self.blocks.get_mut(block as usize).ok_or(err)?;
        b.copy_from_slice(data);
        Ok(())
    }

    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), BlockIoError> {
        if dst as usize >= self.blocks.len() {
            return Err(self.out_of_range(BlockOp::Copy, dst));
        }
        let data = self
            .blocks
            .get(src as usize)
            .cloned()
            .ok_or_else(|| self.out_of_range(BlockOp::Copy, src))?;
        self.blocks[dst as usize] = data;
        Ok(())
    }
}
