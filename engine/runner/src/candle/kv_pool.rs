//! The candle runner's KV pool: per layer one K and one V tensor on the device, shaped
//! `[num_blocks * block_size, kv_heads * head_dim]` (row `block * block_size + slot` is one
//! token's K or V), in the runner's dtype.
//!
//! Invariants: the pool is allocated whole at construction (a pool that does not fit fails at
//! start, not under load) and never reallocated; writes go in place (`scatter_set`,
//! `slice_set`), so a step never copies the pool; a block image is the block's rows of every
//! layer, K then V, in the pool's dtype, and a failed move names the block.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use tidegate_kv::block_io::{BlockIoCause, BlockIoError, BlockOp, first};

type IoResult<T> = std::result::Result<T, BlockIoError>;

/// The pool's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    /// Decoder layers.
    pub layers: usize,
    /// K/V heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks.
    pub num_blocks: usize,
}

impl PoolShape {
    /// Width of one token's K (or V) row.
    pub fn row(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes one block takes in `dtype` (all layers, K and V).
    pub fn block_bytes(&self, dtype: DType) -> usize {
        self.layers * 2 * self.block_size * self.row() * dtype.size_in_bytes()
    }
}

/// The device-resident pool.
#[derive(Debug)]
pub struct DeviceKv {
    shape: PoolShape,
    dtype: DType,
    device: Device,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl DeviceKv {
    /// Allocates the zeroed pool on `device`.
    pub fn new(shape: PoolShape, dtype: DType, device: &Device) -> Result<Self> {
        let rows = shape.num_blocks * shape.block_size;
        let alloc = || Tensor::zeros((rows, shape.row()), dtype, device);
        let mut k = Vec::with_capacity(shape.layers);
        let mut v = Vec::with_capacity(shape.layers);
        for _ in 0..shape.layers {
            k.push(alloc()?);
            v.push(alloc()?);
        }
        Ok(DeviceKv {
            shape,
            dtype,
            device: device.clone(),
            k,
            v,
        })
    }

    /// The pool's shape.
    pub fn shape(&self) -> PoolShape {
        self.shape
    }

    /// The scatter index that puts row `r` of a step's K/V at pool row `slots[r]`.
    pub fn slot_index(&self, slots: &[u32]) -> Result<Tensor> {
        let row = self.shape.row();
        let idx: Vec<u32> = slots
            .iter()
            .flat_map(|&s| std::iter::repeat_n(s, row))
            .collect();
        Ok(Tensor::from_vec(idx, (slots.len(), row), &self.device)?)
    }

    /// Writes a step's K and V rows (`[T, row]`, pool dtype) of `layer` at `index`'s slots.
    pub fn write(&self, layer: usize, index: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
        self.k[layer].scatter_set(index, k, 0)?;
        self.v[layer].scatter_set(index, v, 0)?;
        Ok(())
    }

    /// K and V of the blocks `blocks` (`[n]`, u32) of `layer`, each `[n * block_size, row]`.
    pub fn gather(&self, layer: usize, blocks: &Tensor) -> Result<(Tensor, Tensor)> {
        let s = self.shape;
        let per_block = s.block_size * s.row();
        let pick = |t: &Tensor| -> Result<Tensor> {
            let n = blocks.dim(0)?;
            Ok(t.reshape((s.num_blocks, per_block))?
                .index_select(blocks, 0)?
                .reshape((n * s.block_size, s.row()))?)
        };
        Ok((pick(&self.k[layer])?, pick(&self.v[layer])?))
    }

    fn rows_of(&self, op: BlockOp, block: u32) -> IoResult<usize> {
        if (block as usize) < self.shape.num_blocks {
            Ok(block as usize * self.shape.block_size)
        } else {
            let cause = BlockIoCause::OutOfRange {
                num_blocks: self.shape.num_blocks,
            };
            Err(BlockIoError::new(op, block, cause))
        }
    }

    /// Bytes of one block image.
    pub fn block_bytes(&self) -> usize {
        self.shape.block_bytes(self.dtype)
    }

    /// The image of `block` into `out`.
    pub fn read_block(&self, block: u32, out: &mut Vec<u8>) -> IoResult<()> {
        self.read_blocks(&[block], out)
    }

    /// Overwrites `block` with `data`.
    pub fn write_block(&mut self, block: u32, data: &[u8]) -> IoResult<()> {
        self.write_blocks(&[block], data)
    }

    /// Copies `src` onto `dst` (copy-on-write of a shared partial block).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> IoResult<()> {
        self.copy_blocks(&[(src, dst)])
    }

    /// The images of `blocks` into `out`, in order: per K or V tensor of each layer, one
    /// gather of all the blocks' rows and one device→host copy.
    pub fn read_blocks(&self, blocks: &[u32], out: &mut Vec<u8>) -> IoResult<()> {
        let dev = |e: candle_core::Error| device_err(BlockOp::Read, first(blocks), e);
        let rows = self.rows(BlockOp::Read, blocks)?;
        let index = Tensor::from_vec(rows, blocks.len() * self.shape.block_size, &self.device)
            .map_err(dev)?;
        let bb = self.block_bytes();
        let part = bb / (2 * self.shape.layers);
        out.clear();
        out.resize(blocks.len() * bb, 0);
        let mut host = Vec::with_capacity(blocks.len() * part);
        for (t_at, t) in self.k.iter().chain(&self.v).enumerate() {
            let picked = t.index_select(&index, 0).map_err(dev)?;
            host.clear();
            append_bytes(&picked, &mut host).map_err(dev)?;
            for (i, img) in host.chunks_exact(part).enumerate() {
                let at = i * bb + t_at * part;
                out[at..at + part].copy_from_slice(img);
            }
        }
        Ok(())
    }

    /// Writes `data` (the images of `blocks`, in order) into `blocks`: per K or V tensor of
    /// each layer, one host→device copy of all the blocks' rows and one scatter.
    pub fn write_blocks(&mut self, blocks: &[u32], data: &[u8]) -> IoResult<()> {
        let bb = self.block_bytes();
        if data.len() != blocks.len() * bb {
            let cause = BlockIoCause::WrongSize {
                got: data.len(),
                want: blocks.len() * bb,
            };
            return Err(BlockIoError::new(BlockOp::Write, first(blocks), cause));
        }
        let slots = self.rows(BlockOp::Write, blocks)?;
        let dev = |e: candle_core::Error| device_err(BlockOp::Write, first(blocks), e);
        let index = self.slot_index(&slots).map_err(|e| {
            BlockIoError::new(
                BlockOp::Write,
                first(blocks),
                BlockIoCause::Device(e.to_string()),
            )
        })?;
        let part = bb / (2 * self.shape.layers);
        let dims = [blocks.len() * self.shape.block_size, self.shape.row()];
        let mut staged = vec![0u8; blocks.len() * part];
        for (t_at, t) in self.k.iter().chain(&self.v).enumerate() {
            for (i, dst) in staged.chunks_exact_mut(part).enumerate() {
                let at = i * bb + t_at * part;
                dst.copy_from_slice(&data[at..at + part]);
            }
            let src =
                Tensor::from_raw_buffer(&staged, self.dtype, &dims, &self.device).map_err(dev)?;
            t.scatter_set(&index, &src, 0).map_err(dev)?;
        }
        Ok(())
    }

    /// Copies each `(src, dst)` pair: per K or V tensor of each layer, one gather and one
    /// scatter for all the pairs.
    pub fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> IoResult<()> {
        let srcs: Vec<u32> = pairs.iter().map(|p| p.0).collect();
        let dsts: Vec<u32> = pairs.iter().map(|p| p.1).collect();
        let from_rows = self.rows(BlockOp::Copy, &srcs)?;
        let slots = self.rows(BlockOp::Copy, &dsts)?;
        let dev = |e: candle_core::Error| device_err(BlockOp::Copy, first(&dsts), e);
        let from = Tensor::from_vec(from_rows, slots.len(), &self.device).map_err(dev)?;
        let to = self.slot_index(&slots).map_err(|e| {
            BlockIoError::new(
                BlockOp::Copy,
                first(&dsts),
                BlockIoCause::Device(e.to_string()),
            )
        })?;
        for t in self.k.iter().chain(&self.v) {
            // The gather gives the rows their own storage before the pool is written.
            let rows = t.index_select(&from, 0).map_err(dev)?;
            t.scatter_set(&to, &rows, 0).map_err(dev)?;
        }
        Ok(())
    }

    /// The pool rows of `blocks` (each block's `block_size` rows, in order); an out-of-range
    /// block is refused before anything moves.
    fn rows(&self, op: BlockOp, blocks: &[u32]) -> IoResult<Vec<u32>> {
        let bs = self.shape.block_size;
        let mut rows = Vec::with_capacity(blocks.len() * bs);
        for &b in blocks {
            let at = self.rows_of(op, b)?;
            rows.extend((at..at + bs).map(|r| r as u32));
        }
        Ok(rows)
    }
}

fn device_err(op: BlockOp, block: u32, e: candle_core::Error) -> BlockIoError {
    BlockIoError::new(op, block, BlockIoCause::Device(e.to_string()))
}

/// Appends the raw little-endian bytes of `t` (any float dtype the pool uses).
fn append_bytes(t: &Tensor, out: &mut Vec<u8>) -> candle_core::Result<()> {
    let flat = t.flatten_all()?;
    match t.dtype() {
        DType::F32 => put_le(&flat.to_vec1::<f32>()?, out, f32::to_le_bytes),
        DType::BF16 => put_le(&flat.to_vec1::<half::bf16>()?, out, half::bf16::to_le_bytes),
        DType::F16 => put_le(&flat.to_vec1::<half::f16>()?, out, half::f16::to_le_bytes),
        other => candle_core::bail!("KV pool dtype {other:?} has no block image"),
    }
    Ok(())
}

/// Appends `xs` as little-endian bytes, converted into one pre-sized slice.
fn put_le<T: Copy, const N: usize>(xs: &[T], out: &mut Vec<u8>, le: fn(T) -> [u8; N]) {
    let at = out.len();
    out.resize(at + xs.len() * N, 0);
    for (d, &x) in out[at..].chunks_exact_mut(N).zip(xs) {
        d.copy_from_slice(&le(x));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pool() -> DeviceKv {
        let shape = PoolShape {
            layers: 2,
            kv_heads: 1,
            head_dim: 3,
            block_size: 2,
            num_blocks: 4,
        };
        let kv = DeviceKv::new(shape, DType::F32, &Device::Cpu).unwrap();
        // Every row of every tensor distinct: row r of tensor t holds t*100 + r*10 + col.
        for (t, tensor) in kv.k.iter().chain(&kv.v).enumerate() {
            let vals: Vec<f32> = (0..8 * 3)
                .map(|i| (t * 100 + (i / 3) * 10 + i % 3) as f32)
                .collect();
            let src = Tensor::from_vec(vals, (8, 3), &Device::Cpu).unwrap();
            tensor.slice_set(&src, 0, 0).unwrap();
        }
        kv
    }

    /// The image format, computed independently: each tensor's rows of the block, K tensors
    /// of every layer then V tensors, little-endian.
    fn reference_image(kv: &DeviceKv, block: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for t in kv.k.iter().chain(&kv.v) {
            let rows = t.narrow(0, block * 2, 2).unwrap().flatten_all().unwrap();
            for x in rows.to_vec1::<f32>().unwrap() {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn batched_moves_match_the_reference_image_format() {
        let mut kv = pool();
        let (one, three) = (reference_image(&kv, 1), reference_image(&kv, 3));
        let mut both = Vec::new();
        kv.read_blocks(&[3, 1], &mut both).unwrap();
        assert_eq!(both, [three.clone(), one.clone()].concat());
        kv.write_blocks(&[0, 2], &both).unwrap();
        assert_eq!(reference_image(&kv, 0), three);
        assert_eq!(reference_image(&kv, 2), one);
        kv.copy_blocks(&[(1, 3), (0, 1)]).unwrap();
        assert_eq!(reference_image(&kv, 3), one);
        assert_eq!(reference_image(&kv, 1), three);
        let err = kv.read_blocks(&[0, 4], &mut both).unwrap_err();
        assert_eq!((err.op, err.block), (BlockOp::Read, 4));
        let err = kv.write_blocks(&[0], &both).unwrap_err();
        assert!(matches!(err.cause, BlockIoCause::WrongSize { .. }));
    }
}
