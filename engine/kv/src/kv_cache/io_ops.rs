//! The only place the KV cache manager touches block bytes: thin wrappers over [`BlockIo`]
//! that also enforce the image size, so each caller has one failure path (offload that cannot
//! read → drop; restore that cannot write → recompute; a copy-on-write that cannot copy →
//! recompute that block) and one error to log.
//!
//! Invariant: `Ok` means the bytes moved completely; a short or long image is an error even
//! when the implementation itself reported success.

use crate::block_io::{BlockIo, BlockIoCause, BlockIoError, BlockOp};

fn wrong_size(op: BlockOp, block: u32, got: usize, want: usize) -> BlockIoError {
    BlockIoError::new(op, block, BlockIoCause::WrongSize { got, want })
}

/// Reads `block` into `out`; `Ok` only when exactly `block_bytes` came back.
pub(super) fn read(
    io: &dyn BlockIo,
    block: u32,
    out: &mut Vec<u8>,
    block_bytes: usize,
) -> Result<(), BlockIoError> {
    io.read_block(block, out)?;
    if out.len() != block_bytes {
        return Err(wrong_size(BlockOp::Read, block, out.len(), block_bytes));
    }
    Ok(())
}

/// Writes a full block image into `block`; `Ok` when `data` was a full image and it landed.
pub(super) fn write(
    io: &mut dyn BlockIo,
    block: u32,
    data: &[u8],
    block_bytes: usize,
) -> Result<(), BlockIoError> {
    if data.len() != block_bytes {
        return Err(wrong_size(BlockOp::Write, block, data.len(), block_bytes));
    }
    io.write_block(block, data)
}

/// Copies `src` onto `dst`.
pub(super) fn copy(io: &mut dyn BlockIo, src: u32, dst: u32) -> Result<(), BlockIoError> {
    io.copy_block(src, dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::MemBlockIo;

    /// Claims success but hands back a short image (a device that lost part of a transfer).
    struct ShortReads;

    impl BlockIo for ShortReads {
        fn block_bytes(&self) -> usize {
            8
        }
        fn read_block(&self, _block: u32, out: &mut Vec<u8>) -> Result<(), BlockIoError> {
            out.clear();
            out.extend_from_slice(&[1, 2, 3]);
            Ok(())
        }
        fn write_block(&mut self, _block: u32, _data: &[u8]) -> Result<(), BlockIoError> {
            Ok(())
        }
        fn copy_block(&mut self, _src: u32, _dst: u32) -> Result<(), BlockIoError> {
            Ok(())
        }
    }

    #[test]
    fn short_images_are_errors_even_when_the_store_says_ok() {
        let mut buf = Vec::new();
        let err = read(&ShortReads, 5, &mut buf, 8).unwrap_err();
        assert_eq!(err, wrong_size(BlockOp::Read, 5, 3, 8));
        let err = write(&mut ShortReads, 6, &[0; 7], 8).unwrap_err();
        assert_eq!(err, wrong_size(BlockOp::Write, 6, 7, 8));
    }

    #[test]
    fn store_errors_pass_through_with_the_block() {
        let mut io = MemBlockIo::new(2, 8);
        let mut buf = Vec::new();
        read(&io, 1, &mut buf, 8).unwrap();
        write(&mut io, 0, &[7; 8], 8).unwrap();
        copy(&mut io, 0, 1).unwrap();
        assert_eq!(io.bytes(1), &[7; 8]);
        let err = read(&io, 2, &mut buf, 8).unwrap_err();
        assert_eq!((err.op, err.block), (BlockOp::Read, 2));
        let err = copy(&mut io, 0, 9).unwrap_err();
        assert_eq!((err.op, err.block), (BlockOp::Copy, 9));
        assert!(matches!(
            err.cause,
            BlockIoCause::OutOfRange { num_blocks: 2 }
        ));
    }
}
