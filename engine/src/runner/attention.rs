//! Paged causal attention for a flattened batch. Row `t` (a token of some sequence at
//! position `pos`) attends to positions `0..=pos` of its own sequence, read through that
//! sequence's block table from the [`KvStore`]; the caller has already written this step's
//! K/V rows, so tokens of a prefill chunk see each other causally. Grouped-query: query head
//! `h` reads kv head `h / (heads / kv_heads)`. Work is split over (row, head) on rayon.

use rayon::prelude::*;

use super::kv_store::KvStore;
use crate::kernels::matmul::dot;
use crate::kernels::ops::softmax;

/// Where one batch row sits in its sequence.
#[derive(Debug, Clone, Copy)]
pub struct RowPos<'a> {
    /// Absolute position of the token.
    pub pos: usize,
    /// The owning sequence's block table.
    pub block_table: &'a [u32],
}

/// Shapes for [`paged_attention`].
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Row stride of `q` (the fused qkv row width).
    pub q_stride: usize,
}

/// Writes `out[t, h*hd..]` = softmax(q·Kᵀ/√hd)·V for every row and head.
pub fn paged_attention(
    q: &[f32],
    rows: &[RowPos<'_>],
    kv: &KvStore,
    layer: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.heads / s.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let (kbuf, vbuf) = kv.layer(layer);
    let bs = kv.block_size();
    out.par_chunks_mut(hd)
        .enumerate()
        .for_each_init(Vec::new, |scores, (idx, o)| {
            let (t, head) = (idx / s.heads, idx % s.heads);
            let row = rows[t];
            let qh = &q[t * s.q_stride + head * hd..t * s.q_stride + (head + 1) * hd];
            let kv_off = (head / group) * hd;
            scores.clear();
            for j in 0..=row.pos {
                let off = kv.offset(row.block_table[j / bs], j % bs) + kv_off;
                scores.push(dot(qh, &kbuf[off..off + hd]) * scale);
            }
            softmax(scores);
            o.fill(0.0);
            for (j, p) in scores.iter().enumerate() {
                let off = kv.offset(row.block_table[j / bs], j % bs) + kv_off;
                for (a, b) in o.iter_mut().zip(&vbuf[off..off + hd]) {
                    *a += p * b;
                }
            }
        });
}
