//! AVX2 + FMA attention of one (row, kv head) group, the 8-lane form of [`super::avx512`]:
//! 16-token blocks (a block's transposed key row is two vectors) and `head_dim` a multiple
//! of 16. For CPUs without AVX-512 (AMD Zen 2/3, older Intel), which otherwise run the
//! portable loops compiled for AVX2, latency-bound as described in [`super::avx512`].
//! - scores: each K row of a block is loaded once for up to [`HEADS`] query heads;
//! - softmax: [`crate::kernels::vector_math::exp256`] on whole 8-slot vectors, the positions
//!   outside the row's range masked to 0;
//! - V: with 16 registers, up to 2 heads × 32 of `head_dim` stay in registers over all
//!   positions;
//! - prefetch: the block [`BLOCKS_AHEAD`] on, as on AVX-512.
//!
//! Invariant: every slice bound the pointer arithmetic relies on is asserted in safe code
//! before the `unsafe` loads (one assertion per block, not per load).

#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register tiles read clearest as indexed arrays

use std::arch::x86_64::*;

use super::GroupJob;
use super::blocks::{BLOCKS_AHEAD, LANES, Lanes, Span, Sweeps, drive, prefetch, read_at};
use crate::kernels::vector_math::{exp256, horizontal};

/// Lanes of one vector: half a block.
const HALF: usize = 8;
/// Query heads in the score sweep (2 accumulators each, beside the two K halves).
const HEADS: usize = 4;
/// Query heads in the V sweep (up to 4 accumulators each).
const V_HEADS: usize = 2;

/// The group's output `o` (`[group, head_dim]`); entered only after run-time detection of
/// avx2, fma and f16c, with 16-token blocks and `head_dim % 16 == 0`.
pub(super) fn attend<E: Lanes>(job: &GroupJob<'_, E>, scores: &mut Vec<f32>, o: &mut [f32]) {
    // SAFETY: the caller detected avx2, fma and f16c.
    unsafe { drive::<Avx2, E>(job, scores, o) }
}

/// The 8-lane sweeps.
struct Avx2;

impl Sweeps for Avx2 {
    const SCORE_HEADS: usize = HEADS;
    const VALUE_HEADS: usize = V_HEADS;

    unsafe fn scores<E: Lanes>(
        job: &GroupJob<'_, E>,
        span: &Span<'_>,
        g0: usize,
        heads: usize,
        s: &mut [f32],
    ) {
        // SAFETY: avx2, fma and f16c, the trait's contract.
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
        let wide = job.hd.is_multiple_of(4 * HALF);
        // SAFETY: as in `scores`.
        unsafe {
            match (heads, wide) {
                (1, true) => weighted_values::<1, 4, E>(job, span, p, out),
                (_, true) => weighted_values::<2, 4, E>(job, span, p, out),
                (1, false) => weighted_values::<1, 2, E>(job, span, p, out),
                (_, false) => weighted_values::<2, 2, E>(job, span, p, out),
            }
        }
    }
}

/// Scaled scores of query heads `g0..g0 + H` over every block of the span, into `s`
/// (`[H, padded]`).
#[target_feature(enable = "avx2,fma,f16c")]
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
    for (bi, &block) in span.blocks.iter().enumerate() {
        let base = job.kv.head_offset(block, job.kv_head);
        let kt = &kbuf[base..base + hd * LANES];
        let next = read_at(job, span, bi + BLOCKS_AHEAD);
        // SAFETY: `kt` holds hd rows of 16 floats, `q` H rows of hd, `s` H rows of padded
        // with block bi's 16 slots inside each (all checked by the slicing above); `next`
        // as `kt`.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            for d in 0..hd {
                prefetch(next.add(d * LANES));
                let lo = E::load8(kt.as_ptr().add(d * LANES));
                let hi = E::load8(kt.as_ptr().add(d * LANES + HALF));
                for g in 0..H {
                    let qd = _mm256_broadcast_ss(&*q.as_ptr().add(g * hd + d));
                    acc[g][0] = _mm256_fmadd_ps(qd, lo, acc[g][0]);
                    acc[g][1] = _mm256_fmadd_ps(qd, hi, acc[g][1]);
                }
            }
            let scale = _mm256_set1_ps(job.scale);
            for g in 0..H {
                let at = s.as_mut_ptr().add(g * padded + bi * LANES);
                _mm256_storeu_ps(at, _mm256_mul_ps(acc[g][0], scale));
                _mm256_storeu_ps(at.add(HALF), _mm256_mul_ps(acc[g][1], scale));
            }
        }
    }
}

/// All-ones lanes where bit `i` of `bits` is set (lane `i` of 8).
#[target_feature(enable = "avx2")]
fn lane_mask(bits: u16) -> __m256 {
    let lanes = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let set = _mm256_and_si256(_mm256_set1_epi32(i32::from(bits & 0xff)), lanes);
    _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lanes))
}

/// Softmax over the valid slots of one head's padded scores; the others become 0.
#[target_feature(enable = "avx2,fma")]
fn softmax_masked(s: &mut [f32], span: &Span<'_>) {
    assert!(s.len() == span.padded());
    let nv = 2 * span.blocks.len();
    let mask = |v: usize| lane_mask(span.mask(v / 2) >> (HALF * (v % 2)));
    // SAFETY: vector v covers s[8·v..8·v + 8], inside s (asserted).
    unsafe {
        let base = s.as_mut_ptr();
        let at = |v: usize| base.add(v * HALF);
        let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
        for v in 0..nv {
            let x = _mm256_blendv_ps(max, _mm256_loadu_ps(at(v)), mask(v));
            max = _mm256_max_ps(max, x);
        }
        let max = _mm256_set1_ps(horizontal(max, |a, b| _mm_max_ps(a, b)));
        let mut sum = _mm256_setzero_ps();
        for v in 0..nv {
            let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(at(v)), max));
            let e = _mm256_and_ps(e, mask(v));
            sum = _mm256_add_ps(sum, e);
            _mm256_storeu_ps(at(v), e);
        }
        let inv = _mm256_set1_ps(1.0 / horizontal(sum, |a, b| _mm_add_ps(a, b)));
        for v in 0..nv {
            _mm256_storeu_ps(at(v), _mm256_mul_ps(_mm256_loadu_ps(at(v)), inv));
        }
    }
}

/// `out[g] = Σ_j p[g][j] · V[j]` for `H` heads, `V` vectors of 8 of the head at a time held
/// in registers over every valid position.
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_values<const H: usize, const V: usize, E: Lanes>(
    job: &GroupJob<'_, E>,
    span: &Span<'_>,
    p: &[f32],
    out: &mut [f32],
) {
    let hd = job.hd;
    let vbuf = job.v;
    let padded = span.padded();
    assert!(p.len() == H * padded && out.len() == H * hd && hd.is_multiple_of(V * HALF));
    for d0 in (0..hd).step_by(V * HALF) {
        let mut acc = [[_mm256_setzero_ps(); V]; H];
        for (bi, &block) in span.blocks.iter().enumerate() {
            let base = job.kv.head_offset(block, job.kv_head);
            let rows = &vbuf[base..base + LANES * hd];
            let (from, to) = span.slots(bi);
            let next = read_at(job, span, span.blocks.len() + bi + BLOCKS_AHEAD);
            // SAFETY: `rows` holds 16 rows of hd floats, and d0 + V·8 ≤ hd; p's index
            // g·padded + bi·16 + slot < H·padded (asserted above); `next` as `rows`.
            unsafe {
                for slot in from..to {
                    for c in (0..V).step_by(2) {
                        prefetch(next.add(slot * hd + d0 + c * HALF));
                    }
                    let v: [__m256; V] = std::array::from_fn(|c| {
                        E::load8(rows.as_ptr().add(slot * hd + d0 + c * HALF))
                    });
                    for g in 0..H {
                        let w =
                            _mm256_broadcast_ss(&*p.as_ptr().add(g * padded + bi * LANES + slot));
                        for c in 0..V {
                            acc[g][c] = _mm256_fmadd_ps(w, v[c], acc[g][c]);
                        }
                    }
                }
            }
        }
        for g in 0..H {
            for c in 0..V {
                // SAFETY: g·hd + d0 + (c + 1)·8 ≤ H·hd = out.len() (asserted above).
                unsafe {
                    _mm256_storeu_ps(out.as_mut_ptr().add(g * hd + d0 + c * HALF), acc[g][c]);
                }
            }
        }
    }
}
