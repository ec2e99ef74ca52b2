//! What the SIMD attention kernels share: a row's span of its block table (which blocks it
//! reads and which of their slots are its positions) and the prefetch of the blocks ahead.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256, __m256i, __m512, _MM_HINT_T0, _mm_loadu_si128, _mm_prefetch, _mm256_cvtph_ps,
    _mm256_loadu_ps, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_loadu_ps,
};

use half::f16;

use super::GroupJob;
use crate::kv_store::KvElem;

/// Loads of stored KV values as f32 vectors: f32 as they are, f16 widened on the way in
/// (`vcvtph2ps`, one instruction per vector; the bytes from memory are what they save).
pub(super) trait Lanes: KvElem {
    /// Values `p..p + 16` as f32.
    ///
    /// # Safety
    /// The CPU has avx512f; the 16 values are readable.
    unsafe fn load16(p: *const Self) -> __m512;

    /// Values `p..p + 8` as f32.
    ///
    /// # Safety
    /// The CPU has avx and f16c; the 8 values are readable.
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Lanes for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's promise.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Lanes for f16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller's promise; f16 is two bytes, so 16 of them are 32.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }

    #[inline]
    #[target_feature(enable = "avx,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: as in `load16`: 8 of them are 16 bytes.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const _)) }
    }
}

/// Slots per block (the kernels need 16-token blocks).
pub(super) const LANES: usize = 16;

/// The row's positions as slots of its block table: blocks `first..`, and the valid slots
/// `lo..hi` counted from the first block's slot 0.
pub(super) struct Span<'a> {
    pub blocks: &'a [u32],
    lo: usize,
    hi: usize,
}

impl<'a> Span<'a> {
    pub fn of<E>(job: &GroupJob<'a, E>) -> Self {
        let len = job.row.pos + 1;
        let start = job.window.map_or(0, |w| len.saturating_sub(w));
        let first = start / LANES;
        Span {
            blocks: &job.row.block_table[first..len.div_ceil(LANES)],
            lo: start - first * LANES,
            hi: len - first * LANES,
        }
    }

    pub fn padded(&self) -> usize {
        self.blocks.len() * LANES
    }

    /// The valid slots of block `bi`, as `from..to` within the block.
    pub fn slots(&self, bi: usize) -> (usize, usize) {
        let at = bi * LANES;
        (self.lo.saturating_sub(at), (self.hi - at).min(LANES))
    }

    /// The lanes of vector `bi` (block `bi`) that hold valid positions.
    pub fn mask(&self, bi: usize) -> u16 {
        let (from, to) = self.slots(bi);
        let upto = |n: usize| ((1u32 << n) - 1) as u16;
        upto(to) & !upto(from)
    }
}

/// Blocks a sweep prefetches ahead of the one it computes on. On the AMX Xeon, 1 to 6
/// measured alike in `bench-model --batch 1,32` on SmolLM2 (within the machine's noise);
/// none at all was 6% slower at batch 1 over a 400-token context (125.5 against 134 tok/s).
pub(super) const BLOCKS_AHEAD: usize = 2;

/// The start of item `i` of the group's reads in the order the sweeps make them: the span's
/// K blocks, then its V blocks; past the end, the last V block again (a harmless repeat).
pub(super) fn read_at<E>(job: &GroupJob<'_, E>, span: &Span<'_>, i: usize) -> *const E {
    let nb = span.blocks.len();
    let (buf, bi) = if i < nb {
        (job.k, i)
    } else {
        (job.v, (i - nb).min(nb - 1))
    };
    let base = job.kv.head_offset(span.blocks[bi], job.kv_head);
    buf[base..base + job.hd * LANES].as_ptr()
}

/// Asks for the cache line at `p` ahead of its use.
#[inline(always)]
pub(super) fn prefetch<E>(p: *const E) {
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
}

/// One vector width's three sweeps over a group, as [`drive`] runs them.
pub(super) trait Sweeps {
    /// Query heads per score sweep (their accumulators fit the width's registers).
    const SCORE_HEADS: usize;
    /// Query heads per V sweep.
    const VALUE_HEADS: usize;

    /// Scaled scores of query heads `g0..g0 + heads` over every block of the span, into `s`
    /// (`[heads, padded]`).
    ///
    /// # Safety
    /// The CPU has the width's features.
    unsafe fn scores<E: Lanes>(
        job: &GroupJob<'_, E>,
        span: &Span<'_>,
        g0: usize,
        heads: usize,
        s: &mut [f32],
    );

    /// Softmax over the valid slots of one head's padded scores; the others become 0.
    ///
    /// # Safety
    /// As [`Sweeps::scores`].
    unsafe fn softmax(s: &mut [f32], span: &Span<'_>);

    /// `out[g] = Σ_j p[g][j] · V[j]` for `heads` heads (`p`: `[heads, padded]`).
    ///
    /// # Safety
    /// As [`Sweeps::scores`].
    unsafe fn values<E: Lanes>(
        job: &GroupJob<'_, E>,
        span: &Span<'_>,
        heads: usize,
        p: &[f32],
        out: &mut [f32],
    );
}

/// The group's output `o` (`[group, head_dim]`) with width `S`: scores in head chunks, the
/// softmax per head, then the weighted sum in head chunks.
///
/// # Safety
/// The CPU has `S`'s features (the caller detected them).
pub(super) unsafe fn drive<S: Sweeps, E: Lanes>(
    job: &GroupJob<'_, E>,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    assert!(job.hd.is_multiple_of(LANES) && job.kv.block_size() == LANES);
    assert!(o.len() == job.group * job.hd && job.q.len() == job.group * job.hd);
    let span = Span::of(job);
    let padded = span.padded();
    scores.clear();
    scores.resize(job.group * padded, 0.0);
    // SAFETY: the features are the caller's promise; the shapes the sweeps rely on are
    // asserted above and inside them.
    unsafe {
        for g0 in (0..job.group).step_by(S::SCORE_HEADS) {
            let heads = S::SCORE_HEADS.min(job.group - g0);
            S::scores(
                job,
                &span,
                g0,
                heads,
                &mut scores[g0 * padded..(g0 + heads) * padded],
            );
        }
        for g in 0..job.group {
            S::softmax(&mut scores[g * padded..(g + 1) * padded], &span);
        }
        for g0 in (0..job.group).step_by(S::VALUE_HEADS) {
            let heads = S::VALUE_HEADS.min(job.group - g0);
            let p = &scores[g0 * padded..(g0 + heads) * padded];
            S::values(
                job,
                &span,
                heads,
                p,
                &mut o[g0 * job.hd..(g0 + heads) * job.hd],
            );
        }
    }
}
