//! Preallocated paged KV storage: for each layer one K and one V buffer (f32). V is laid out
//! `[num_blocks, kv_heads, block_size, head_dim]`; K is transposed within each block,
//! `[num_blocks, kv_heads, head_dim, block_size]`, so the scores of a whole block of positions
//! are one broadcast-FMA sweep over `head_dim` without horizontal sums. Either way one kv
//! head's data for a block is contiguous for attention to stream. Token position `p` of a sequence lives in block
//! `block_table[p / block_size]`, slot `p % block_size`. The store never
//! allocates after construction and knows nothing about which sequence owns a block.

use crate::error::{Error, Result};
use tidegate_kv::block_io::{BlockIo, BlockIoCause, BlockIoError, BlockOp};

type IoResult<T> = std::result::Result<T, BlockIoError>;

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

    /// The float range of `block` within a layer buffer, or why `op` cannot touch it.
    fn range(&self, op: BlockOp, block: u32) -> IoResult<std::ops::Range<usize>> {
        if block as usize >= self.num_blocks {
            let cause = BlockIoCause::OutOfRange {
                num_blocks: self.num_blocks,
            };
            return Err(BlockIoError::new(op, block, cause));
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

    /// [`BlockIo::read_block`] with the crate's error type.
    pub fn try_read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<()> {
        self.read_block(block, out).map_err(invalid)
    }

    /// [`BlockIo::write_block`] with the crate's error type.
    pub fn try_write_block(&mut self, block: u32, data: &[u8]) -> Result<()> {
        self.write_block(block, data).map_err(invalid)
    }

    /// [`BlockIo::copy_block`] with the crate's error type.
    pub fn try_copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        self.copy_block(src, dst).map_err(invalid)
    }
}

fn invalid(e: BlockIoError) -> Error {
    Error::InvalidInput(e.to_string())
}

/// The cache manager's interface. A bad block id or image size is refused with an error that
/// names the block; nothing is written then, and a failed read yields no image (never zeros,
/// which would be restored as if they were the session's KV). A block's image is, layer by
/// layer, its K floats then its V floats, little-endian; a batch is its blocks' images in
/// order. The single-block calls are batches of one, so both paths are the same code.
impl BlockIo for KvStore {
    fn block_bytes(&self) -> usize {
        self.image_bytes()
    }

    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> IoResult<()> {
        self.read_blocks(&[block], out)
    }

    fn write_block(&mut self, block: u32, data: &[u8]) -> IoResult<()> {
        self.write_blocks(&[block], data)
    }

    fn copy_block(&mut self, src: u32, dst: u32) -> IoResult<()> {
        self.copy_blocks(&[(src, dst)])
    }

    /// Layer-major over the batch: each layer's K and V buffers are swept once for all the
    /// blocks, and the floats are converted in whole slices.
    fn read_blocks(&self, blocks: &[u32], out: &mut Vec<u8>) -> IoResult<()> {
        let ranges = self.ranges(BlockOp::Read, blocks)?;
        let bb = self.image_bytes();
        let n = self.block_floats() * 4;
        out.clear();
        out.resize(blocks.len() * bb, 0);
        for (layer, (k, v)) in self.k.iter().zip(&self.v).enumerate() {
            for (i, r) in ranges.iter().enumerate() {
                let at = i * bb + layer * 2 * n;
                floats_to_bytes(&k[r.clone()], &mut out[at..at + n]);
                floats_to_bytes(&v[r.clone()], &mut out[at + n..at + 2 * n]);
            }
        }
        Ok(())
    }

    fn write_blocks(&mut self, blocks: &[u32], data: &[u8]) -> IoResult<()> {
        let ranges = self.ranges(BlockOp::Write, blocks)?;
        let bb = self.image_bytes();
        if data.len() != blocks.len() * bb {
            let cause = BlockIoCause::WrongSize {
                got: data.len(),
                want: blocks.len() * bb,
            };
            let first = blocks.first().copied().unwrap_or(0);
            return Err(BlockIoError::new(BlockOp::Write, first, cause));
        }
        let n = self.block_floats() * 4;
        for (layer, (k, v)) in self.k.iter_mut().zip(self.v.iter_mut()).enumerate() {
            for (i, r) in ranges.iter().enumerate() {
                let at = i * bb + layer * 2 * n;
                bytes_to_floats(&data[at..at + n], &mut k[r.clone()]);
                bytes_to_floats(&data[at + n..at + 2 * n], &mut v[r.clone()]);
            }
        }
        Ok(())
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> IoResult<()> {
        let mut moves = Vec::with_capacity(pairs.len());
        for &(src, dst) in pairs {
            let s = self.range(BlockOp::Copy, src)?;
            let d = self.range(BlockOp::Copy, dst)?;
            moves.push((s, d.start));
        }
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            for (s, d) in &moves {
                buf.copy_within(s.clone(), *d);
            }
        }
        Ok(())
    }
}

impl KvStore {
    /// Every block's float range, or the error naming the first bad one (nothing moved then).
    fn ranges(&self, op: BlockOp, blocks: &[u32]) -> IoResult<Vec<std::ops::Range<usize>>> {
        blocks.iter().map(|&b| self.range(op, b)).collect()
    }
}

/// `src` as little-endian bytes into `dst` (exactly `4 × src.len()` long).
fn floats_to_bytes(src: &[f32], dst: &mut [u8]) {
    for (d, x) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// Little-endian bytes `src` into `dst` (exactly `4 × dst.len()` long).
fn bytes_to_floats(src: &[u8], dst: &mut [f32]) {
    for (x, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *x = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
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
        kv.read_block(1, &mut img).unwrap();
        assert_eq!(img.len(), kv.block_bytes());
        kv.write_block(2, &img).unwrap();
        kv.copy_block(1, 0).unwrap();
        for b in [0, 2] {
            let mut other = Vec::new();
            kv.read_block(b, &mut other).unwrap();
            assert_eq!(other, img);
        }
        assert!(kv.try_read_block(3, &mut img).is_err());
        assert!(kv.try_write_block(0, &img[1..]).is_err());
        assert!(kv.try_copy_block(0, 9).is_err());
    }

    #[test]
    fn a_batch_is_its_blocks_images_in_order_both_ways() {
        let mut kv = KvStore::new(2, 1, 2, 2, 4);
        kv.write_token(0, 1, 0, &[1.0, 2.0], &[3.0, 4.0]);
        kv.write_token(1, 2, 1, &[5.0, 6.0], &[7.0, 8.0]);
        let (mut a, mut b, mut both) = (Vec::new(), Vec::new(), Vec::new());
        kv.read_block(1, &mut a).unwrap();
        kv.read_block(2, &mut b).unwrap();
        kv.read_blocks(&[2, 1], &mut both).unwrap();
        assert_eq!(both, [b.clone(), a.clone()].concat());
        kv.write_blocks(&[0, 3], &both).unwrap();
        let mut got = Vec::new();
        kv.read_block(0, &mut got).unwrap();
        assert_eq!(got, b);
        kv.read_block(3, &mut got).unwrap();
        assert_eq!(got, a);
        kv.copy_blocks(&[(1, 0), (2, 3)]).unwrap();
        kv.read_blocks(&[0, 3], &mut got).unwrap();
        assert_eq!(got, [a, b].concat());
        let err = kv.read_blocks(&[1, 9], &mut got).unwrap_err();
        assert_eq!((err.op, err.block), (BlockOp::Read, 9));
        assert!(kv.write_blocks(&[0, 1], &both[1..]).is_err());
    }

    /// The bug this guards against: a failed read used to hand back a zero-filled image of
    /// the right size, which offloading stored (and a restore then loaded) as real KV.
    #[test]
    fn failed_block_io_is_an_error_naming_the_block_not_zeros() {
        let mut kv = KvStore::new(2, 1, 2, 2, 3);
        let mut img = Vec::new();
        let err = kv.read_block(3, &mut img).unwrap_err();
        assert_eq!(
            err,
            BlockIoError::new(BlockOp::Read, 3, BlockIoCause::OutOfRange { num_blocks: 3 })
        );
        assert_ne!(img, vec![0; kv.block_bytes()]);
        assert!(err.to_string().contains("KV block 3"), "{err}");
        // A short image is refused and nothing is written.
        kv.write_token(0, 0, 0, &[1.0, 2.0], &[3.0, 4.0]);
        let mut before = Vec::new();
        kv.read_block(0, &mut before).unwrap();
        let err = kv.write_block(0, &[1, 2, 3]).unwrap_err();
        let want = kv.block_bytes();
        assert_eq!(err.cause, BlockIoCause::WrongSize { got: 3, want });
        let mut after = Vec::new();
        kv.read_block(0, &mut after).unwrap();
        assert_eq!(before, after);
        let err = kv.copy_block(0, 7).unwrap_err();
        assert_eq!((err.op, err.block), (BlockOp::Copy, 7));
    }
}
