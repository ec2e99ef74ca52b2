//! AVX-512 attention of one (row, kv head) group: 16-token blocks, so 16 lanes are the 16
//! slots of a block's transposed keys, and `head_dim` a multiple of 16.
//!
//! Why its own loops rather than the portable ones compiled 16 lanes wide: those run one
//! query head at a time, each block's scores one chain of `head_dim` dependent FMAs and each
//! V row an `axpy` into the output through memory (a store, then the next row's load of it),
//! so a decode step spent most of its attention time waiting on latencies (profiled: 40% of
//! `attend` in the score chain, 48% in the axpy's load-FMA-store). Here:
//! - scores: each K row of a block is loaded once for up to [`HEADS`] query heads, two
//!   accumulator chains per head (even and odd `d`), and the scale is applied at the store;
//! - softmax: the vector `exp` of [`crate::kernels::vector_math`] on whole 16-slot vectors,
//!   the positions outside the row's range masked to 0;
//! - V: up to [`HEADS`] × 4 output vectors (64 of `head_dim`) stay in registers over all
//!   positions; each V row is loaded once for every head of the chunk.
//! - prefetch: a block's K (or V) rows are `head_dim` × 64 bytes in one place and the next
//!   block's are `kv_heads` × that further on, so the hardware prefetcher, which stays within
//!   a 4 KiB page, starts over at every block and the loads wait on memory (profiled: the
//!   loads, not the FMAs, were the hot instructions). Each sweep asks for the lines of the
//!   block [`BLOCKS_AHEAD`] on while it computes on this one; the scores' last blocks ask for
//!   the first V blocks.
//!
//! Invariant: every slice bound the pointer arithmetic relies on is asserted in safe code
//! before the `unsafe` loads (one assertion per block, not per load).

#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register tiles read clearest as indexed arrays

use std::arch::x86_64::*;

use super::GroupJob;
use super::blocks::{BLOCKS_AHEAD, LANES, Lanes, Span, Sweeps, drive, prefetch, read_at};
use crate::kernels::vector_math::exp;
/// Query heads computed together (their accumulators must fit in the 32 registers).
const HEADS: usize = 4;

/// The group's output `o` (`[group, head_dim]`); entered only after run-time detection of
/// avx512f, with 16-token blocks and `head_dim % 16 == 0`.
pub(super) fn attend<E: Lanes>(job: &GroupJob<'_, E>, scores: &mut Vec<f32>, o: &mut [f32]) {
    // SAFETY: the caller detected avx512f.
    unsafe { drive::<Avx512, E>(job, scores, o) }
}

/// The 16-lane sweeps.
struct Avx512;

impl Sweeps for Avx512 {
    const SCORE_HEADS: usize = HEADS;
    const VALUE_HEADS: usize = HEADS;

    unsafe fn scores<E: Lanes>(
        job: &GroupJob<'_, E>,
        span: &Span<'_>,
        g0: usize,
        heads: usize,
        s: &mut [f32],
    ) {
        // SAFETY: avx512f, the trait's contract.
        unsafe {
            match heads {
                1 => all_scores::<1, E>(job, span, g0, s),
                2 => all_scores::<2, E>(job, span, g0, s),
                3 => all_scores::<3, E>(job, span, g0, s),
                _ => all_scores::<4, E>(job, span, g0, s),
            }
        }
    }

    unsafe fn softmax(s: &mut [f32], span: &Span<'_>) {
        // SAFETY: as in `scores`.
        unsafe { softmax_masked(s, span) }
    }

    unsafe fn values<E: Lanes>(
        job: &GroupJob<'_, E>,
        span: &Span<'_>,
        heads: usize,
        p: &[f32],
        out: &mut [f32],
    ) {
        let vecs = if job.hd.is_multiple_of(64) {
            4
        } else if job.hd.is_multiple_of(32) {
            2
        } else {
            1
        };
        // SAFETY: as in `scores`.
        unsafe {
            match (heads, vecs) {
                (1, 4) => weighted_values::<1, 4, E>(job, span, p, out),
                (2, 4) => weighted_values::<2, 4, E>(job, span, p, out),
                (3, 4) => weighted_values::<3, 4, E>(job, span, p, out),
                (_, 4) => weighted_values::<4, 4, E>(job, span, p, out),
                (1, 2) => weighted_values::<1, 2, E>(job, span, p, out),
                (2, 2) => weighted_values::<2, 2, E>(job, span, p, out),
                (3, 2) => weighted_values::<3, 2, E>(job, span, p, out),
                (_, 2) => weighted_values::<4, 2, E>(job, span, p, out),
                (1, _) => weighted_values::<1, 1, E>(job, span, p, out),
                (2, _) => weighted_values::<2, 1, E>(job, span, p, out),
                (3, _) => weighted_values::<3, 1, E>(job, span, p, out),
                (_, _) => weighted_values::<4, 1, E>(job, span, p, out),
            }
        }
    }
}

/// Scaled scores of query heads `g0..g0 + H` over every block of the span, into `s`
/// (`[H, padded]`).
#[target_feature(enable = "avx512f")]
fn all_scores<const H: usize, E: Lanes>(
    job: &GroupJob<'_, E>,
    span: &Span<'_>,
    g0: usize,
    s: &mut [f32],
) {
    let hd = job.hd;
    let kbuf = job.k;
    let padded = span.padded();
    let q = &job.q[g0 * hd..(g0 + H) * hd];
    assert!(s.len() == H * padded);
    for i in 0..BLOCKS_AHEAD.min(span.blocks.len()) {
        let first = read_at(job, span, i);
        for line in 0..hd {
            // SAFETY: `read_at` returns the start of hd rows of 16 floats.
            prefetch(unsafe { first.add(line * LANES) });
        }
    }
    for (bi, &block) in span.blocks.iter().enumerate() {
        let base = job.kv.head_offset(block, job.kv_head);
        let kt = &kbuf[base..base + hd * LANES];
        let next = read_at(job, span, bi + BLOCKS_AHEAD);
        // SAFETY: `kt` holds hd rows of 16 floats, `q` H rows of hd, `s` H rows of padded
        // with block bi's 16 slots inside each (all checked by the slicing above); `next`
        // as `kt` (prefetches do not fault anyway).
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; H];
            let mut d = 0;
            while d < hd {
                prefetch(next.add(d * LANES));
                prefetch(next.add((d + 1) * LANES));
                let k0 = E::load16(kt.as_ptr().add(d * LANES));
                let k1 = E::load16(kt.as_ptr().add((d + 1) * LANES));
                for g in 0..H {
                    let qg = q.as_ptr().add(g * hd + d);
                    acc[g][0] = _mm512_fmadd_ps(_mm512_set1_ps(*qg), k0, acc[g][0]);
                    acc[g][1] = _mm512_fmadd_ps(_mm512_set1_ps(*qg.add(1)), k1, acc[g][1]);
                }
                d += 2;
            }
            let scale = _mm512_set1_ps(job.scale);
            for g in 0..H {
                let v = _mm512_mul_ps(_mm512_add_ps(acc[g][0], acc[g][1]), scale);
                _mm512_storeu_ps(s.as_mut_ptr().add(g * padded + bi * LANES), v);
            }
        }
    }
}

/// Softmax over the valid slots of one head's padded scores; the others become 0.
#[target_feature(enable = "avx512f")]
fn softmax_masked(s: &mut [f32], span: &Span<'_>) {
    assert!(s.len() == span.padded());
    let nv = span.blocks.len();
    // SAFETY: vector bi covers s[16·bi..16·bi + 16], inside s (asserted).
    unsafe {
        let base = s.as_mut_ptr();
        let at = |bi: usize| base.add(bi * LANES);
        let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
        for bi in 0..nv {
            max = _mm512_mask_max_ps(max, span.mask(bi), max, _mm512_loadu_ps(at(bi)));
        }
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(max));
        let mut sum = _mm512_setzero_ps();
        for bi in 0..nv {
            let e = exp(_mm512_sub_ps(_mm512_loadu_ps(at(bi)), max));
            let e = _mm512_maskz_mov_ps(span.mask(bi), e);
            sum = _mm512_add_ps(sum, e);
            _mm512_storeu_ps(at(bi), e);
        }
        let inv = _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(sum));
        for bi in 0..nv {
            _mm512_storeu_ps(at(bi), _mm512_mul_ps(_mm512_loadu_ps(at(bi)), inv));
        }
    }
}

/// `out[g] = Σ_j p[g][j] · V[j]` for `H` heads, `V` vectors of the head at a time held in
/// registers over every valid position.
#[target_feature(enable = "avx512f")]
fn weighted_values<const H: usize, const V: usize, E: Lanes>(
    job: &GroupJob<'_, E>,
    span: &Span<'_>,
    p: &[f32],
    out: &mut [f32],
) {
    let hd = job.hd;
    let vbuf = job.v;
    let padded = span.padded();
    assert!(p.len() == H * padded && out.len() == H * hd && hd.is_multiple_of(V * LANES));
    for d0 in (0..hd).step_by(V * LANES) {
        let mut acc = [[_mm512_setzero_ps(); V]; H];
        for (bi, &block) in span.blocks.iter().enumerate() {
            let base = job.kv.head_offset(block, job.kv_head);
            let rows = &vbuf[base..base + LANES * hd];
            let (from, to) = span.slots(bi);
            let next = read_at(job, span, span.blocks.len() + bi + BLOCKS_AHEAD);
            // SAFETY: `rows` holds 16 rows of hd floats, and d0 + V·16 ≤ hd; p's index
            // g·padded + bi·16 + slot < H·padded (asserted above); `next` as `rows`.
            unsafe {
                for slot in from..to {
                    for c in 0..V {
                        prefetch(next.add(slot * hd + d0 + c * LANES));
                    }
                    let v: [__m512; V] = std::array::from_fn(|c| {
                        E::load16(rows.as_ptr().add(slot * hd + d0 + c * LANES))
                    });
                    for g in 0..H {
                        let w = _mm512_set1_ps(*p.as_ptr().add(g * padded + bi * LANES + slot));
                        for c in 0..V {
                            acc[g][c] = _mm512_fmadd_ps(w, v[c], acc[g][c]);
                        }
                    }
                }
            }
        }
        for g in 0..H {
            for c in 0..V {
                // SAFETY: g·hd + d0 + (c + 1)·16 ≤ H·hd = out.len() (asserted above).
                unsafe {
                    _mm512_storeu_ps(out.as_mut_ptr().add(g * hd + d0 + c * LANES), acc[g][c]);
                }
            }
        }
    }
}
