//! Paged causal attention for a flattened batch. Row `t` (a token of some sequence at
//! position `pos`) attends to positions `0..=pos` of its own sequence, read through that
//! sequence's block table from the [`KvStore`]; the caller has already written this step's
//! K/V rows, so tokens of a prefill chunk see each other causally. Grouped-query: query head
//! `h` reads kv head `h / (heads / kv_heads)`. Work is split over (row, head) on rayon; the
//! per-head loop is compiled a second time with AVX-512 enabled and picked at run time.

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
    let group = s.heads / s.kv_heads;
    let avx512 = has_avx512() && s.head_dim.is_multiple_of(16);
    // One task per (row, kv head): the `group` query heads sharing a kv head are adjacent in
    // `out`, so each K/V row is loaded once for all of them.
    out.par_chunks_mut(group * s.head_dim)
        .enumerate()
        .for_each_init(Vec::new, |scores, (idx, o)| {
            let (t, kvh) = (idx / s.kv_heads, idx % s.kv_heads);
            let q0 = t * s.q_stride + kvh * group * s.head_dim;
            let job = GroupJob {
                q: &q[q0..q0 + group * s.head_dim],
                group,
                hd: s.head_dim,
                row: rows[t],
                kv,
                layer,
                kv_head: kvh,
            };
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                avx512::attend(&job, scores, o);
                return;
            }
            let _ = avx512;
            attend(&job, scores, o, dot_portable, axpy_portable);
        });
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The query heads of one row that share one kv head.
struct GroupJob<'a> {
    q: &'a [f32],
    group: usize,
    hd: usize,
    row: RowPos<'a>,
    kv: &'a KvStore,
    layer: usize,
    kv_head: usize,
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b)
}

fn axpy_portable(y: &mut [f32], a: f32, x: &[f32]) {
    for (p, q) in y.iter_mut().zip(x) {
        *p += a * q;
    }
}

/// Scores over the row's positions for every head of the group (`scores[g * len + j]`),
/// softmax per head, weighted sum of V.
#[inline(always)]
fn attend(
    job: &GroupJob<'_>,
    scores: &mut Vec<f32>,
    o: &mut [f32],
    dot: impl Fn(&[f32], &[f32]) -> f32,
    axpy: impl Fn(&mut [f32], f32, &[f32]),
) {
    let hd = job.hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let (kbuf, vbuf) = job.kv.layer(job.layer);
    let bs = job.kv.block_size();
    let len = job.row.pos + 1;
    let blocks = &job.row.block_table[..len.div_ceil(bs)];
    scores.clear();
    scores.resize(job.group * len, 0.0);
    let mut j = 0;
    for (bi, &block) in blocks.iter().enumerate() {
        let base = job.kv.head_offset(block, job.kv_head);
        for slot in 0..bs.min(len - bi * bs) {
            let k = &kbuf[base + slot * hd..base + (slot + 1) * hd];
            for g in 0..job.group {
                scores[g * len + j] = dot(&job.q[g * hd..(g + 1) * hd], k) * scale;
            }
            j += 1;
        }
    }
    for g in 0..job.group {
        softmax(&mut scores[g * len..(g + 1) * len]);
    }
    o.fill(0.0);
    let mut j = 0;
    for (bi, &block) in blocks.iter().enumerate() {
        let base = job.kv.head_offset(block, job.kv_head);
        for slot in 0..bs.min(len - bi * bs) {
            let v = &vbuf[base + slot * hd..base + (slot + 1) * hd];
            for g in 0..job.group {
                axpy(&mut o[g * hd..(g + 1) * hd], scores[g * len + j], v);
            }
            j += 1;
        }
    }
}

// AVX-512 dot/axpy for head_dim a multiple of 16. Intrinsics need `unsafe`; they are only
// reached after run-time detection, with lengths asserted.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512 {
    use super::GroupJob;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn dot16(a: &[f32], b: &[f32]) -> f32 {
        assert!(a.len() == b.len() && a.len().is_multiple_of(16));
        // SAFETY: in-bounds loads of whole 16-float groups (asserted).
        unsafe {
            // Two accumulators halve the FMA dependency chain.
            let mut acc = [_mm512_setzero_ps(); 2];
            let mut i = 0;
            while i < a.len() {
                let j = (i / 16) % 2;
                acc[j] = _mm512_fmadd_ps(
                    _mm512_loadu_ps(a.as_ptr().add(i)),
                    _mm512_loadu_ps(b.as_ptr().add(i)),
                    acc[j],
                );
                i += 16;
            }
            _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
        }
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn axpy16(y: &mut [f32], a: f32, x: &[f32]) {
        assert!(y.len() == x.len() && y.len().is_multiple_of(16));
        // SAFETY: in-bounds loads/stores of whole 16-float groups (asserted).
        unsafe {
            let av = _mm512_set1_ps(a);
            let mut i = 0;
            while i < y.len() {
                let yp = y.as_mut_ptr().add(i);
                _mm512_storeu_ps(
                    yp,
                    _mm512_fmadd_ps(av, _mm512_loadu_ps(x.as_ptr().add(i)), _mm512_loadu_ps(yp)),
                );
                i += 16;
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    fn attend_avx512(job: &GroupJob<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
        super::attend(
            job,
            scores,
            o,
            |a, b| dot16(a, b),
            |y, a, x| axpy16(y, a, x),
        )
    }

    pub(super) fn attend(job: &GroupJob<'_>, scores: &mut Vec<f32>, o: &mut [f32]) {
        // SAFETY: the caller checked `is_x86_feature_detected!("avx512f")`.
        unsafe { attend_avx512(job, scores, o) }
    }
}
