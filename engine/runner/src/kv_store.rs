//! Preallocated paged KV storage: for each layer one K and one V buffer, in f16 (the default:
//! half the bytes attention streams and twice the tokens a memory budget holds) or f32
//! ([`KvDtype`]). V is laid out `[num_blocks, kv_heads, block_size, head_dim]`; K is
//! transposed within each block, `[num_blocks, kv_heads, head_dim, block_size]`, so the
//! scores of a whole block of positions are one broadcast-FMA sweep over `head_dim` without
//! horizontal sums. Either way one kv head's data for a block is contiguous for attention to
//! stream. Token position `p` of a sequence lives in block `block_table[p / block_size]`, slot
//! `p % block_size`. The store never allocates after construction and knows nothing about
//! which sequence owns a block.
//!
//! Invariant: values are rounded to the element type once, when a token is written; every
//! reader (each attention path, block images) sees the same stored values, so batched ==
//! sequential and an image restored == the one read, bit for bit. f16 saturates at ±65504
//! rather than becoming infinite.

use half::f16;

use crate::error::{Error, Result};
use tidegate_kv::block_io::{BlockIo, BlockIoCause, BlockIoError, BlockOp};

type IoResult<T> = std::result::Result<T, BlockIoError>;

/// The element type of the KV pool (`--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// IEEE half precision: 2 bytes, a relative rounding of at most 2⁻¹¹.
    #[default]
    F16,
    /// Single precision: 4 bytes, the activations' own precision.
    F32,
}

impl KvDtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" | "float16" | "half" => Ok(KvDtype::F16),
            "f32" | "float32" | "float" => Ok(KvDtype::F32),
            _ => Err(format!(
                "unknown KV cache dtype {s:?} (expected f16 or f32)"
            )),
        }
    }
}

/// A stored KV value.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Bytes per value, in a block image too.
    const BYTES: usize;
    /// The value a new pool is filled with (a negative zero: see [`KvStore::new`]).
    const TOUCH: Self;
    /// `x` rounded to this type.
    fn store(x: f32) -> Self;
    /// `src` widened to f32: itself for f32, converted into `buf` otherwise.
    fn widen<'a>(src: &'a [Self], buf: &'a mut Vec<f32>) -> &'a [f32];
    /// Little-endian bytes of `src` into `dst` (exactly `BYTES × src.len()` long).
    fn to_le(src: &[Self], dst: &mut [u8]);
    /// Little-endian bytes `src` into `dst` (exactly `BYTES × dst.len()` long).
    fn from_le(src: &[u8], dst: &mut [Self]);
}

impl KvElem for f32 {
    const BYTES: usize = 4;
    const TOUCH: Self = -0.0;
    fn store(x: f32) -> Self {
        x
    }
    fn widen<'a>(src: &'a [Self], _: &'a mut Vec<f32>) -> &'a [f32] {
        src
    }
    fn to_le(src: &[Self], dst: &mut [u8]) {
        for (d, x) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&x.to_le_bytes());
        }
    }
    fn from_le(src: &[u8], dst: &mut [Self]) {
        for (x, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *x = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
    }
}

impl KvElem for f16 {
    const BYTES: usize = 2;
    const TOUCH: Self = f16::NEG_ZERO;
    fn store(x: f32) -> Self {
        f16::from_f32(x.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32()))
    }
    fn widen<'a>(src: &'a [Self], buf: &'a mut Vec<f32>) -> &'a [f32] {
        use half::slice::HalfFloatSliceExt;
        buf.clear();
        buf.resize(src.len(), 0.0);
        src.convert_to_f32_slice(buf);
        buf
    }
    fn to_le(src: &[Self], dst: &mut [u8]) {
        for (d, x) in dst.chunks_exact_mut(2).zip(src) {
            d.copy_from_slice(&x.to_le_bytes());
        }
    }
    fn from_le(src: &[u8], dst: &mut [Self]) {
        for (x, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
            *x = f16::from_le_bytes([s[0], s[1]]);
        }
    }
}

/// One layer's K and V buffers, in the pool's element type.
#[derive(Debug, Clone, Copy)]
pub enum KvLayer<'a> {
    /// An f16 pool's.
    F16(&'a [f16], &'a [f16]),
    /// An f32 pool's.
    F32(&'a [f32], &'a [f32]),
}

/// Per-layer K and V buffers of one element type.
#[derive(Debug)]
struct Planes<E> {
    k: Vec<Vec<E>>,
    v: Vec<Vec<E>>,
}

#[derive(Debug)]
enum Buffers {
    F16(Planes<f16>),
    F32(Planes<f32>),
}

/// The block pool's tensors.
#[derive(Debug)]
pub struct KvStore {
    geo: Geometry,
    buf: Buffers,
}

/// Where a value sits: the pool's shape.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    block_size: usize,
    num_blocks: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Geometry {
    fn head_offset(&self, block: u32, kv_head: usize) -> usize {
        ((block as usize * self.kv_heads + kv_head) * self.block_size) * self.head_dim
    }

    fn block_values(&self) -> usize {
        self.block_size * self.kv_heads * self.head_dim
    }

    /// The value range of `block` within a layer buffer, or why `op` cannot touch it.
    fn range(&self, op: BlockOp, block: u32) -> IoResult<std::ops::Range<usize>> {
        if block as usize >= self.num_blocks {
            let cause = BlockIoCause::OutOfRange {
                num_blocks: self.num_blocks,
            };
            return Err(BlockIoError::new(op, block, cause));
        }
        let start = self.head_offset(block, 0);
        Ok(start..start + self.block_values())
    }

    /// Every block's range, or the error naming the first bad one (nothing moved then).
    fn ranges(&self, op: BlockOp, blocks: &[u32]) -> IoResult<Vec<std::ops::Range<usize>>> {
        blocks.iter().map(|&b| self.range(op, b)).collect()
    }
}

impl<E: KvElem> Planes<E> {
    fn new(layers: usize, per_layer: usize) -> Self {
        let touched = || vec![E::TOUCH; per_layer];
        Self {
            k: (0..layers).map(|_| touched()).collect(),
            v: (0..layers).map(|_| touched()).collect(),
        }
    }

    fn write_token(&mut self, g: &Geometry, at: (usize, u32, usize), k: &[f32], v: &[f32]) {
        let (layer, block, slot) = at;
        let (hd, bs) = (g.head_dim, g.block_size);
        for h in 0..g.kv_heads {
            let base = g.head_offset(block, h);
            let off = base + slot * hd;
            let vrow = &mut self.v[layer][off..off + hd];
            for (d, x) in vrow.iter_mut().zip(&v[h * hd..(h + 1) * hd]) {
                *d = E::store(*x);
            }
            let kt = &mut self.k[layer][base..base + hd * bs];
            for (d, x) in k[h * hd..(h + 1) * hd].iter().enumerate() {
                kt[d * bs + slot] = E::store(*x);
            }
        }
    }

    /// Layer-major over the batch: each layer's K and V buffers are swept once for all the
    /// blocks, and the values are converted in whole slices.
    fn read_blocks(&self, ranges: &[std::ops::Range<usize>], bb: usize, out: &mut [u8]) {
        let n = ranges.first().map_or(0, |r| r.len()) * E::BYTES;
        for (layer, (k, v)) in self.k.iter().zip(&self.v).enumerate() {
            for (i, r) in ranges.iter().enumerate() {
                let at = i * bb + layer * 2 * n;
                E::to_le(&k[r.clone()], &mut out[at..at + n]);
                E::to_le(&v[r.clone()], &mut out[at + n..at + 2 * n]);
            }
        }
    }

    fn write_blocks(&mut self, ranges: &[std::ops::Range<usize>], bb: usize, data: &[u8]) {
        let n = ranges.first().map_or(0, |r| r.len()) * E::BYTES;
        for (layer, (k, v)) in self.k.iter_mut().zip(self.v.iter_mut()).enumerate() {
            for (i, r) in ranges.iter().enumerate() {
                let at = i * bb + layer * 2 * n;
                E::from_le(&data[at..at + n], &mut k[r.clone()]);
                E::from_le(&data[at + n..at + 2 * n], &mut v[r.clone()]);
            }
        }
    }

    fn copy_blocks(&mut self, moves: &[(std::ops::Range<usize>, usize)]) {
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            for (s, d) in moves {
                buf.copy_within(s.clone(), *d);
            }
        }
    }
}

impl KvStore {
    /// Allocates `num_blocks` blocks of `dtype` values.
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        num_blocks: usize,
        dtype: KvDtype,
    ) -> Self {
        let geo = Geometry {
            block_size,
            num_blocks,
            kv_heads,
            head_dim,
        };
        let per_layer = num_blocks * geo.block_values();
        // The pool is touched now, not on first use: the process reaches its steady memory
        // when it turns ready (so a memory limit fails at start-up, not under load, and RSS
        // stays flat while serving). -0.0 rather than 0.0 because zeroed allocations are
        // mapped lazily; the value is never read before a token's K/V is written there.
        let buf = match dtype {
            KvDtype::F16 => Buffers::F16(Planes::new(layers, per_layer)),
            KvDtype::F32 => Buffers::F32(Planes::new(layers, per_layer)),
        };
        Self { geo, buf }
    }

    /// Bytes one block takes for a model shape (to size the pool from a byte budget).
    pub fn bytes_per_block(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> usize {
        layers * 2 * block_size * kv_heads * head_dim * dtype.bytes()
    }

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        match self.buf {
            Buffers::F16(_) => KvDtype::F16,
            Buffers::F32(_) => KvDtype::F32,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.geo.block_size
    }

    /// Offset of (block, kv head) in a layer buffer: V slot `s` starts `s · head_dim` on; K
    /// element (`d`, slot `s`) is at `d · block_size + s`.
    #[inline]
    pub fn head_offset(&self, block: u32, kv_head: usize) -> usize {
        self.geo.head_offset(block, kv_head)
    }

    /// K and V buffers of one layer.
    pub fn layer(&self, layer: usize) -> KvLayer<'_> {
        match &self.buf {
            Buffers::F16(p) => KvLayer::F16(&p.k[layer], &p.v[layer]),
            Buffers::F32(p) => KvLayer::F32(&p.k[layer], &p.v[layer]),
        }
    }

    /// Writes one token's K and V rows (`[kv_heads · head_dim]` each) for a layer, rounded
    /// to the pool's type.
    pub fn write_token(&mut self, layer: usize, block: u32, slot: usize, k: &[f32], v: &[f32]) {
        let at = (layer, block, slot);
        match &mut self.buf {
            Buffers::F16(p) => p.write_token(&self.geo, at, k, v),
            Buffers::F32(p) => p.write_token(&self.geo, at, k, v),
        }
    }

    fn layers(&self) -> usize {
        match &self.buf {
            Buffers::F16(p) => p.k.len(),
            Buffers::F32(p) => p.k.len(),
        }
    }
}

impl KvStore {
    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.geo.num_blocks
    }

    /// Bytes in one block's image (all layers, K and V).
    pub fn image_bytes(&self) -> usize {
        self.layers() * 2 * self.geo.block_values() * self.dtype().bytes()
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
/// layer, its K values then its V values, little-endian in the pool's type (so an image
/// taken from a pool of another type has another size and is refused); a batch is its
/// blocks' images in order. The single-block calls are batches of one, so both paths are the
/// same code.
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

    fn read_blocks(&self, blocks: &[u32], out: &mut Vec<u8>) -> IoResult<()> {
        let ranges = self.geo.ranges(BlockOp::Read, blocks)?;
        let bb = self.image_bytes();
        out.clear();
        out.resize(blocks.len() * bb, 0);
        match &self.buf {
            Buffers::F16(p) => p.read_blocks(&ranges, bb, out),
            Buffers::F32(p) => p.read_blocks(&ranges, bb, out),
        }
        Ok(())
    }

    fn write_blocks(&mut self, blocks: &[u32], data: &[u8]) -> IoResult<()> {
        let ranges = self.geo.ranges(BlockOp::Write, blocks)?;
        let bb = self.image_bytes();
        if data.len() != blocks.len() * bb {
            let cause = BlockIoCause::WrongSize {
                got: data.len(),
                want: blocks.len() * bb,
            };
            let first = blocks.first().copied().unwrap_or(0);
            return Err(BlockIoError::new(BlockOp::Write, first, cause));
        }
        match &mut self.buf {
            Buffers::F16(p) => p.write_blocks(&ranges, bb, data),
            Buffers::F32(p) => p.write_blocks(&ranges, bb, data),
        }
        Ok(())
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> IoResult<()> {
        let mut moves = Vec::with_capacity(pairs.len());
        for &(src, dst) in pairs {
            let s = self.geo.range(BlockOp::Copy, src)?;
            let d = self.geo.range(BlockOp::Copy, dst)?;
            moves.push((s, d.start));
        }
        match &mut self.buf {
            Buffers::F16(p) => p.copy_blocks(&moves),
            Buffers::F32(p) => p.copy_blocks(&moves),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DTYPES: [KvDtype; 2] = [KvDtype::F16, KvDtype::F32];

    #[test]
    fn block_images_round_trip_and_copy() {
        for dtype in DTYPES {
            let mut kv = KvStore::new(2, 1, 2, 2, 3, dtype);
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
    }

    #[test]
    fn a_batch_is_its_blocks_images_in_order_both_ways() {
        for dtype in DTYPES {
            let mut kv = KvStore::new(2, 1, 2, 2, 4, dtype);
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
    }

    /// The bug this guards against: a failed read used to hand back a zero-filled image of
    /// the right size, which offloading stored (and a restore then loaded) as real KV.
    #[test]
    fn failed_block_io_is_an_error_naming_the_block_not_zeros() {
        for dtype in DTYPES {
            let mut kv = KvStore::new(2, 1, 2, 2, 3, dtype);
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

    /// f16 halves a block, rounds to within 2⁻¹¹ relative, saturates instead of becoming
    /// infinite, and an image from a pool of the other type is refused by its size (so a
    /// restore of it recomputes rather than reading the bytes as the wrong type).
    #[test]
    fn f16_halves_the_block_rounds_once_and_saturates() {
        let (mut h, mut f) = (
            KvStore::new(1, 1, 2, 2, 2, KvDtype::F16),
            KvStore::new(1, 1, 2, 2, 2, KvDtype::F32),
        );
        assert_eq!(h.block_bytes() * 2, f.block_bytes());
        assert_eq!(
            KvStore::bytes_per_block(1, 1, 2, 2, KvDtype::F16),
            h.block_bytes()
        );
        let (k, v) = ([0.1f32, 1e6], [-3.3f32, -1e9]);
        h.write_token(0, 0, 0, &k, &v);
        let KvLayer::F16(hk, hv) = h.layer(0) else {
            panic!("an f16 pool gave another layer type");
        };
        // K is transposed within the block: element (d, slot 0) is at d · block_size.
        assert!((hk[0].to_f32() - 0.1).abs() <= 0.1 * 2f32.powi(-11));
        assert_eq!(hk[2].to_f32(), 65504.0);
        assert!((hv[0].to_f32() + 3.3).abs() <= 3.3 * 2f32.powi(-11));
        assert_eq!(hv[1].to_f32(), -65504.0);
        let mut img = Vec::new();
        h.read_block(0, &mut img).unwrap();
        let err = f.write_block(0, &img).unwrap_err();
        assert!(matches!(err.cause, BlockIoCause::WrongSize { .. }), "{err}");
    }

    #[test]
    fn the_dtype_flag_parses_and_names_itself() {
        for d in DTYPES {
            assert_eq!(d.name().parse::<KvDtype>(), Ok(d));
        }
        assert_eq!(KvDtype::default(), KvDtype::F16);
        let err = "bf16".parse::<KvDtype>().unwrap_err();
        assert!(err.contains("f16 or f32"), "{err}");
    }
}
