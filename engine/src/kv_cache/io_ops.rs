//! The only place the KV cache manager touches block bytes: thin wrappers over
//! [`BlockIo`] that report success as a `bool`, so each caller has one failure path (offload
//! that cannot read → drop; restore that cannot write → recompute; a copy-on-write that
//! cannot copy → recompute that block). [`Outcome`] accepts both an infallible `()` and a
//! `Result`, so these wrappers do not change if `BlockIo`'s methods become fallible.
//!
//! Invariant: a `true` answer means the bytes moved completely (a short read is a failure).

// With today's infallible trait the calls return `()`, which `Outcome` maps to success.
#![allow(clippy::unit_arg)]

use crate::block_io::BlockIo;

/// What a `BlockIo` call returned, reduced to "did it work".
pub(super) trait Outcome {
    fn succeeded(self) -> bool;
}

impl Outcome for () {
    fn succeeded(self) -> bool {
        true
    }
}

impl<E> Outcome for Result<(), E> {
    fn succeeded(self) -> bool {
        self.is_ok()
    }
}

/// Reads `block` into `out`; true when exactly `block_bytes` came back.
pub(super) fn read(io: &dyn BlockIo, block: u32, out: &mut Vec<u8>, block_bytes: usize) -> bool {
    io.read_block(block, out).succeeded() && out.len() == block_bytes
}

/// Writes a full block image into `block`; true when `data` was a full image and it landed.
pub(super) fn write(io: &mut dyn BlockIo, block: u32, data: &[u8], block_bytes: usize) -> bool {
    data.len() == block_bytes && io.write_block(block, data).succeeded()
}

/// Copies `src` onto `dst`.
pub(super) fn copy(io: &mut dyn BlockIo, src: u32, dst: u32) -> bool {
    io.copy_block(src, dst).succeeded()
}
