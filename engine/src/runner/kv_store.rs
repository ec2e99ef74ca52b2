//! Preallocated paged KV storage: for each layer one K and one V buffer (f32). V is laid out
//! `[num_blocks, kv_heads, block_size, head_dim]`; K is transposed within each block,
//! `[num_blocks, kv_heads, head_dim, block_size]`, so the scores of a whole block of positions
//! are one broadcast-FMA sweep over `head_dim` without horizontal sums. Either way one kv
//! head's data for a block is contiguous for attention to stream. Token position `p` of a sequence lives in block
//! `block_table[p / block_size]`, slot `p % block_size`. The store never
//! allocates after construction and knows nothing about which sequence owns a block.

use crate::block_io::BlockIo;
use crate::error::{Error, Result};

/// The block pool's tensors.
#[derive(Debug)]
pub struct KvStore {
    block_size: usize,
    num_blocks: usize,
    kv_heads: usize,
    head_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvStore {
    /// Allocates `num_blocks` zeroed blocks.
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        num_blocks: usize,
    ) -> Self {
        let per_layer = num_blocks * block_size * kv_heads * head_dim;
        // The pool is touched now, not on first use: the process reaches its steady memory
        // when it turns ready (so a memory limit fails at start-up, not under load, and RSS
        // stays flat while serving). -0.0 rather than 0.0 because zeroed allocations are
        // mapped lazily; the value is never read before a token's K/V is written there.
        let touched = || vec![-0.0f32; per_layer];
        Self {
            block_size,
            num_blocks,
            kv_heads,
            head_dim,
            k: (0..layers).map(|_| touched()).collect(),
            v: (0..layers).map(|_| touched()).collect(),
        }
    }

    /// Bytes one block takes for a model shape (to size the pool from a byte budget).
    pub fn bytes_per_block(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
    ) -> usize {
        layers * 2 * block_size * kv_heads * head_dim * std::mem::size_of::<f32>()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Offset of (block, kv head) in a layer buffer: V slot `s` starts `s · head_dim` on; K
    /// element (`d`, slot `s`) is at `d · block_size + s`.
    #[inline]
    pub fn head_offset(&self, block: u32, kv_head: usize) -> usize {
        ((block as usize * self.kv_heads + kv_head) * self.block_size) * self.head_dim
    }

    fn block_floats(&self) -> usize {
        self.block_size * self.kv_heads * self.head_dim
    }

    /// K and V buffers of one layer.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }

    /// Writes one token's K and V rows (`[kv_heads · head_dim]` each) for a layer.
    pub fn write_token(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for h in 0..self.kv_heads {
            let base = self.head_offset(block, h);
            let off = base + slot * hd;
            self.v[layer][off..off + hd].copy_from_slice(&v[h * hd..(h + 1) * hd]);
            let kt = &mut self.k[layer][base..base + hd * self.block_size];
            for (d, x) in k[h * hd..(h + 1) * hd].iter().enumerate() {
                kt[d * self.block_size + slot] = *x;
            }
        }
    }

    fn check(&self, block: u32) -> Result<std::ops::Range<usize>> {
        if block as usize >= self.num_blocks {
            return Err(Error::InvalidInput(format!(
                "block {block} out of range (pool has {})",
                self.num_blocks
            )));
        }
        let start = self.head_offset(block, 0);
        Ok(start..start + self.block_floats())
    }
}

impl KvStore {
    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Bytes in one block's image (all layers, K and V).
    pub fn image_bytes(&self) -> usize {
        self.k.len() * 2 * self.block_floats() * 4
    }

    /// Replaces `out` with the byte image of `block`; errors on an out-of-range id.
    pub fn try_read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<()> {
        let range = self.check(block)?;
        out.clear();
        out.reserve(self.image_bytes());
        for (k, v) in self.k.iter().zip(&self.v) {
            for x in k[range.clone()].iter().chain(&v[range.clone()]) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        Ok(())
    }

    /// Overwrites `block` with an image from [`KvStore::try_read_block`]; errors on an
    /// out-of-range id or a wrong-sized image (nothing is written then).
    pub fn try_write_block(&mut self, block: u32, data: &[u8]) -> Result<()> {
        let range = self.check(block)?;
        if data.len() != self.image_bytes() {
            return Err(Error::InvalidInput(format!(
                "block image has {} bytes, expected {}",
                data.len(),
                self.image_bytes()
            )));
        }
        let n = range.len() * 4;
        for (i, (k, v)) in self.k.iter_mut().zip(self.v.iter_mut()).enumerate() {
            let base = i * 2 * n;
            for (dst, src) in k[range.clone()]
                .iter_mut()
                .chain(v[range.clone()].iter_mut())
                .zip(data[base..base + 2 * n].chunks_exact(4))
            {
                *dst = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
            }
        }
        Ok(())
    }

    /// Copies the contents of `src` into `dst`; errors on an out-of-range id.
    pub fn try_copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        let s = self.check(src)?;
        let d = self.check(dst)?;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.copy_within(s.clone(), d.start);
        }
        Ok(())
    }
}

/// The cache manager's infallible interface. A bad block id or image size is a caller bug:
/// it is logged and the operation does nothing (a read yields zeros), never a panic.
impl BlockIo for KvStore {
    fn block_bytes(&self) -> usize {
        self.image_bytes()
    }

    fn read_block(&self, block: u32, out: &mut Vec<u8>) {
        if let Err(e) = self.try_read_block(block, out) {
            tracing::warn!(error = %e, "read_block");
            out.clear();
            out.resize(self.image_bytes(), 0);
        }
    }

    fn write_block(&mut self, block: u32, data: &[u8]) {
        if let Err(e) = self.try_write_block(block, data) {
            tracing::warn!(error = %e, "write_block");
        }
    }

    fn copy_block(&mut self, src: u32, dst: u32) {
        if let Err(e) = self.try_copy_block(src, dst) {
            tracing::warn!(error = %e, "copy_block");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_images_round_trip_and_copy() {
        let mut kv = KvStore::new(2, 1, 2, 2, 3);
        kv.write_token(0, 1, 0, &[1.0, 2.0], &[3.0, 4.0]);
        kv.write_token(1, 1, 1, &[5.0, 6.0], &[7.0, 8.0]);
        let mut img = Vec::new();
        kv.read_block(1, &mut img);
        assert_eq!(img.len(), kv.block_bytes());
        kv.write_block(2, &img);
        kv.copy_block(1, 0);
        for b in [0, 2] {
            let mut other = Vec::new();
            kv.read_block(b, &mut other);
            assert_eq!(other, img);
        }
        assert!(kv.try_read_block(3, &mut img).is_err());
        assert!(kv.try_write_block(0, &img[1..]).is_err());
        assert!(kv.try_copy_block(0, 9).is_err());
        // The trait form never panics on bad input.
        kv.read_block(3, &mut img);
        assert_eq!(img, vec![0; kv.block_bytes()]);
        kv.write_block(0, &[1, 2, 3]);
    }
}
