//! Byte-level access to the paged KV store, so the cache manager can offload and restore blocks without knowing about tensors.
/// Implemented by the tensor-side KV store; the KV cache manager calls it to offload, restore and copy blocks.
pub trait BlockIo {
    /// Bytes one block occupies (all layers, K and V).
    fn block_bytes(&self) -> usize;
    /// Copies block `block` into `out` (cleared first).
    fn read_block(&self, block: u32, out: &mut Vec<u8>);
    /// Overwrites block `block` with `data` (exactly block_bytes long).
    fn write_block(&mut self, block: u32, data: &[u8]);
    /// Copies one block onto another (copy-on-write of a shared partial block).
    fn copy_block(&mut self, src: u32, dst: u32);
}
