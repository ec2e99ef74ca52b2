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
use tidegate_kv::block_io::{BlockIoCause, BlockIoError, BlockOp};

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
        let at = self.rows_of(BlockOp::Read, block)?;
        let dev = |e: candle_core::Error| device_err(BlockOp::Read, block, e);
        out.clear();
        for t in self.k.iter().chain(&self.v) {
            let rows = t.narrow(0, at, self.shape.block_size).map_err(dev)?;
            append_bytes(&rows, out).map_err(dev)?;
        }
        Ok(())
    }

    /// Overwrites `block` with `data`.
    pub fn write_block(&mut self, block: u32, data: &[u8]) -> IoResult<()> {
        let at = self.rows_of(BlockOp::Write, block)?;
        let want = self.block_bytes();
        if data.len() != want {
            let cause = BlockIoCause::WrongSize {
                got: data.len(),
                want,
            };
            return Err(BlockIoError::new(BlockOp::Write, block, cause));
        }
        let dev = |e: candle_core::Error| device_err(BlockOp::Write, block, e);
        let part = want / (2 * self.shape.layers);
        let dims = [self.shape.block_size, self.shape.row()];
        for (i, t) in self.k.iter().chain(&self.v).enumerate() {
            let bytes = &data[i * part..(i + 1) * part];
            let src =
                Tensor::from_raw_buffer(bytes, self.dtype, &dims, &self.device).map_err(dev)?;
            t.slice_set(&src, 0, at).map_err(dev)?;
        }
        Ok(())
    }

    /// Copies `src` onto `dst` (copy-on-write of a shared partial block).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> IoResult<()> {
        let from = self.rows_of(BlockOp::Copy, src)?;
        let to = self.rows_of(BlockOp::Copy, dst)?;
        let dev = |e: candle_core::Error| device_err(BlockOp::Copy, dst, e);
        for t in self.k.iter().chain(&self.v) {
            // `copy` gives the rows their own storage: slice_set refuses a shared source.
            let rows = t
                .narrow(0, from, self.shape.block_size)
                .and_then(|r| r.copy())
                .map_err(dev)?;
            t.slice_set(&rows, 0, to).map_err(dev)?;
        }
        Ok(())
    }
}

fn device_err(op: BlockOp, block: u32, e: candle_core::Error) -> BlockIoError {
    BlockIoError::new(op, block, BlockIoCause::Device(e.to_string()))
}

/// Appends the raw little-endian bytes of `t` (any float dtype the pool uses).
fn append_bytes(t: &Tensor, out: &mut Vec<u8>) -> candle_core::Result<()> {
    let flat = t.flatten_all()?;
    match t.dtype() {
        DType::F32 => flat
            .to_vec1::<f32>()?
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        DType::BF16 => flat
            .to_vec1::<half::bf16>()?
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        DType::F16 => flat
            .to_vec1::<half::f16>()?
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        other => candle_core::bail!("KV pool dtype {other:?} has no block image"),
    }
    Ok(())
}
