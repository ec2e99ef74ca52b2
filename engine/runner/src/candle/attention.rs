//! Paged attention with candle ops: a sequence's K/V are gathered from the pool by its block
//! table, then attended with grouped-query heads and a causal mask.
//!
//! The chunks of a step are attended in groups planned once per step ([`AttnPlan`]): every
//! one-token chunk (decode rows) in one batched group, padded to the longest context among
//! them, and each longer chunk (prefill) on its own, so a prefill's queries never pad the
//! decode rows. Per group and layer that is a fixed number of tensor ops, whatever its size.
//!
//! A plan is made per window: on a sliding-window layer the mask also hides the keys before
//! the window (the gather still reads the sequence's blocks from its first).
//!
//! Invariants: a query at position `p` sees exactly the keys at positions `0..=p` of its own
//! sequence, or `p + 1 - w ..= p` under a window `w` (padding keys and padded query rows are
//! masked); the output rows come back in the batch's row order.

use candle_core::{D, DType, Device, Tensor};

use super::kv_pool::DeviceKv;
use crate::SeqChunk;
use crate::error::Result;

/// Head counts of the model.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// K/V heads (each serves `heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Scores are `q·k · scale`.
    pub scale: f64,
}

/// One attention group's host-built inputs (uploaded once per step, used by every layer).
#[derive(Debug)]
struct Group {
    /// Sequences.
    b: usize,
    /// Query rows per sequence (padded).
    lq: usize,
    /// Key positions per sequence (padded to whole blocks).
    lk: usize,
    /// `[b * lk / block_size]` block ids.
    blocks: Tensor,
    /// `[b * lq]` rows of the step's queries (a padded row repeats a real one).
    q_rows: Tensor,
    /// `[b, 1, 1, lq, lk]`: 0 where a query may look, -inf elsewhere.
    mask: Tensor,
}

/// The step's attention groups, and where each batch row's output lands.
#[derive(Debug)]
pub struct AttnPlan {
    groups: Vec<Group>,
    /// `[T]`: for batch row `r`, its row in the concatenated group outputs.
    order: Tensor,
}

impl AttnPlan {
    /// Plans `batch` (already validated) for a pool of `block_size`-token blocks, each
    /// query seeing the last `window` positions (all, when `None`).
    pub fn new(
        batch: &[SeqChunk<'_>],
        block_size: usize,
        window: Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        let mut row0 = Vec::with_capacity(batch.len());
        let mut r = 0;
        for c in batch {
            row0.push(r);
            r += c.tokens.len();
        }
        let decode: Vec<usize> = (0..batch.len())
            .filter(|&i| batch[i].tokens.len() == 1)
            .collect();
        let mut members: Vec<Vec<usize>> = Vec::new();
        if !decode.is_empty() {
            members.push(decode);
        }
        members.extend(
            (0..batch.len())
                .filter(|&i| batch[i].tokens.len() > 1)
                .map(|i| vec![i]),
        );
        let mut order = vec![0u32; r];
        let mut groups = Vec::with_capacity(members.len());
        let mut out_base = 0;
        for m in &members {
            let g = Group::new(batch, m, &row0, (block_size, window), device)?;
            for (slot, &ci) in m.iter().enumerate() {
                for i in 0..batch[ci].tokens.len() {
                    order[row0[ci] + i] = (out_base + slot * g.lq + i) as u32;
                }
            }
            out_base += g.b * g.lq;
            groups.push(g);
        }
        Ok(AttnPlan {
            groups,
            order: Tensor::from_vec(order, r, device)?,
        })
    }

    /// Attention output `[T, heads * head_dim]` (dtype of `q`) of `layer` for queries `q:
    /// [T, heads, head_dim]` whose K/V are already in the pool.
    pub fn attend(&self, kv: &DeviceKv, layer: usize, q: &Tensor, h: Heads) -> Result<Tensor> {
        let outs = self
            .groups
            .iter()
            .map(|g| g.attend(kv, layer, q, h))
            .collect::<Result<Vec<_>>>()?;
        let all = Tensor::cat(&outs, 0)?;
        Ok(all.index_select(&self.order, 0)?)
    }
}

impl Group {
    fn new(
        batch: &[SeqChunk<'_>],
        members: &[usize],
        row0: &[usize],
        (block_size, window): (usize, Option<usize>),
        device: &Device,
    ) -> Result<Self> {
        let chunks: Vec<&SeqChunk<'_>> = members.iter().map(|&i| &batch[i]).collect();
        let b = chunks.len();
        let lq = chunks.iter().map(|c| c.tokens.len()).max().unwrap_or(1);
        let nb = chunks
            .iter()
            .map(|c| (c.start_pos + c.tokens.len()).div_ceil(block_size))
            .max()
            .unwrap_or(1);
        let lk = nb * block_size;
        let mut blocks = Vec::with_capacity(b * nb);
        let mut q_rows = Vec::with_capacity(b * lq);
        let mut mask = vec![f32::NEG_INFINITY; b * lq * lk];
        for (s, (c, &ci)) in chunks.iter().zip(members).enumerate() {
            let used = (c.start_pos + c.tokens.len()).div_ceil(block_size);
            blocks.extend_from_slice(&c.block_table[..used]);
            // Padding blocks: any valid id (block 0 of this table); their keys are masked.
            blocks.extend(std::iter::repeat_n(c.block_table[0], nb - used));
            for i in 0..lq {
                let real = i < c.tokens.len();
                q_rows.push((row0[ci] + if real { i } else { 0 }) as u32);
                // A padded query row looks at key 0 only, so its softmax stays finite.
                let end = if real { c.start_pos + i + 1 } else { 1 };
                let start = window.map_or(0, |w| end.saturating_sub(w));
                let at = (s * lq + i) * lk;
                mask[at + start..at + end].fill(0.0);
            }
        }
        Ok(Group {
            b,
            lq,
            lk,
            blocks: Tensor::from_vec(blocks, b * nb, device)?,
            q_rows: Tensor::from_vec(q_rows, b * lq, device)?,
            mask: Tensor::from_vec(mask, (b, 1, 1, lq, lk), device)?,
        })
    }

    fn attend(&self, kv: &DeviceKv, layer: usize, q: &Tensor, h: Heads) -> Result<Tensor> {
        let (b, lq, lk) = (self.b, self.lq, self.lk);
        let (kvh, hd) = (h.kv_heads, h.head_dim);
        let group = h.heads / kvh;
        let dtype = q.dtype();
        // [b, kvh, group * lq, hd]: the query heads each K/V head serves, stacked.
        let qg = q
            .index_select(&self.q_rows, 0)?
            .reshape((b, lq, kvh, group, hd))?
            .permute((0, 2, 3, 1, 4))?
            .contiguous()?
            .reshape((b, kvh, group * lq, hd))?;
        let (k, v) = kv.gather(layer, &self.blocks)?;
        let per_seq = |t: Tensor| -> Result<Tensor> {
            Ok(t.reshape((b, lk, kvh, hd))?.transpose(1, 2)?.contiguous()?)
        };
        let (k, v) = (per_seq(k)?, per_seq(v)?);
        let scores = (qg.matmul(&k.t()?)? * h.scale)?
            .to_dtype(DType::F32)?
            .reshape((b, kvh, group, lq, lk))?
            .broadcast_add(&self.mask)?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let o = p
            .to_dtype(dtype)?
            .reshape((b, kvh, group * lq, lk))?
            .matmul(&v)?
            .reshape((b, kvh, group, lq, hd))?
            .permute((0, 3, 1, 2, 4))?
            .contiguous()?
            .reshape((b * lq, h.heads * hd))?;
        Ok(o)
    }
}
