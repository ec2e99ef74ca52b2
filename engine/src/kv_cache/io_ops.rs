//! The only place the KV cache manager touches block bytes: thin wrappers over
//! [`BlockIo`] that report success as a `bool`, so each caller has one failure path (offload
//! that cannot read → drop; restore that cannot write → recompute; a copy-on-write that
//! cannot copy → recompute that block). Should `BlockIo` grow fallible methods, only this file
//! changes.
//!
//! Invariant: a `true` answer means the bytes moved completely (a short read is a failure).

use crate::block_io::BlockIo;

/// Reads `block` into `out`; true when exactly `block_bytes` came back.
pub(super) fn read(io: &dyn BlockIo, block: u32, out: &mut Vec<u8>, block_bytes: usize) -> bool {
    io.read_block(block, out);
    out.len() == block_bytes
}

/// Writes a full block image into `block`; true when `data` was a full image.
pub(super) fn write(io: &mut dyn BlockIo, block: u32, data: &[u8], block_bytes: usize) -> bool {
    if data.len() != block_bytes {
        return false;
    }
    io.write_block(block, data);
    true
}

/// Copies `src` onto `dst`.
pub(super) fn copy(io: &mut dyn BlockIo, src: u32, dst: u32) -> bool {
    io.copy_block(src, dst);
    true
}
