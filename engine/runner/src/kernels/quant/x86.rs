//! AVX2 (+FMA, F16C) kernels over the panel records of [`super::layout`].
//!
//! Invariants: these are entered only after [`super::Isa::detect`] found avx2, fma and f16c;
//! the safe wrappers assert every length the pointer arithmetic relies on (panel ≥ `nb`
//! records, `rows` activation rows of `k` quants and `nb` scales) before the `unsafe` call.
//!
//! Integer ranges (why no sum saturates or overflows):
//! - 4-bit: `maddubs(q ∈ [0,15], a ∈ [−127,127])` gives pair sums within ±3810; the 8 groups
//!   of a block add up in i16 to within ±30480 < 32767, then `madd` widens to i32.
//! - 8-bit: `maddubs` needs one unsigned side, so it multiplies `|q| ∈ [0,128]` by
//!   `a·sign(q)` (llama.cpp's trick): pair sums within ±32512, widened to i32 per group.

#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register tiles read clearest as indexed arrays

use std::arch::x86_64::*;

use super::layout::{Q8_QUANTS, Q8_RECORD, q4_record};
use super::{COLS, MR, QK, RowsView};

/// 4-bit panel × up to [`MR`] rows, records with `offsets` (Q4_1) or without (Q4_0); see
/// [`super::portable::q4_tile`] for the formula.
pub(super) fn q4_tile(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR], offsets: bool) {
    x.check(&[panel], q4_record(offsets).0, MR);
    // SAFETY: features detected by the caller; lengths asserted by `check`.
    unsafe { by_rows!([1, 2, 3, 4], x.rows, q4 { offsets }, (panel, x, tile)) }
}

/// 8-bit panel × up to [`MR`] rows.
pub(super) fn q8_tile(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR]) {
    x.check(&[panel], Q8_RECORD, MR);
    // SAFETY: as in q4_tile.
    unsafe { by_rows!([1, 2, 3, 4], x.rows, q8, (panel, x, tile)) }
}

/// Sets all 8 lanes to the 4 activation bytes at `a` (one group of one row).
#[inline(always)]
pub(super) unsafe fn group(a: *const i8) -> __m256i {
    // SAFETY: the caller passes a pointer with 4 readable bytes.
    unsafe { _mm256_set1_epi32((a as *const i32).read_unaligned()) }
}

/// How far ahead of the record a one-panel kernel reads it asks for the weights: 2 KiB,
/// about 12 Q4_1 records. A panel range is one linear stream, but one projection's share of
/// it is a few hundred KiB, and the hardware prefetcher restarts at every 4 KiB page: without
/// this a batch-1 step waited on the weight loads (on the AMX Xeon, `bench-model --batch 1`
/// on SmolLM2 Q4_1 went from 154–166 to 198–204 tok/s with it; 512, 1024 and 4096 bytes
/// measured between the two).
pub(super) const PREFETCH_AHEAD: usize = 2048;

/// The distance for the one-panel kernels in their EVEX form (CPUs with AVX-512 VNNI and no
/// AVX-VNNI: Zen 4, Ice Lake), measured on one: 4 KiB. On Zen 4 with the Llama-3.2-1B-shaped
/// files, whose weights stream from memory, both distances run at once (one thread each, so
/// the host's moving bandwidth hits both alike) and 4 KiB was faster in 10 of 11 pairs: Q4_1
/// 27.2–28.8 against 25.1–27.5 tok/s, Q8_0 18.9–19.7 against 18.4–18.6, SmolLM2 Q4_1 too;
/// Q4_0 one pair slower (20.4 against 22.5), one faster (26.9 against 23.2).
/// The other paths keep 2 KiB, measured on their own CPUs and not re-measured.
pub(super) const PREFETCH_AHEAD_EVEX: usize = 4096;

/// Asks for the cache lines of the record `AHEAD` bytes after `rec` (`record` bytes long).
/// Past the panel's end it reaches the next panel or beyond the buffer, which a prefetch may:
/// it never faults.
#[inline(always)]
pub(super) fn prefetch_ahead<const AHEAD: usize>(rec: *const u8, record: usize) {
    let mut at = 0;
    while at < record {
        // SAFETY: a prefetch never faults, and `wrapping_add` makes no in-bounds claim.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(rec.wrapping_add(AHEAD + at) as *const i8) };
        at += 64;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4<const R: usize, const OFS: bool>(
    panel: &[u8],
    x: &RowsView<'_>,
    tile: &mut [[f32; COLS]; MR],
) {
    let (record, quants) = q4_record(OFS);
    let nb = x.k / QK;
    // SAFETY: R ≤ rows rows of k quants and nb scales, nb records in panel (asserted by the
    // wrapper); every offset below stays inside those.
    unsafe {
        let mask = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let qp: [*const i8; R] = std::array::from_fn(|r| x.q.as_ptr().add(r * x.k));
        let mut rec = panel.as_ptr();
        for b in 0..nb {
            prefetch_ahead::<PREFETCH_AHEAD>(rec, record);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(rec as *const __m128i));
            let m = if OFS {
                _mm256_cvtph_ps(_mm_loadu_si128(rec.add(2 * COLS) as *const __m128i))
            } else {
                _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
            };
            let mut w = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                let v = _mm256_loadu_si256(rec.add(quants + 32 * j) as *const __m256i);
                w[j] = _mm256_and_si256(v, mask);
                w[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
            }
            for r in 0..R {
                let a = qp[r].add(b * QK);
                let mut s = _mm256_maddubs_epi16(w[0], group(a));
                for g in 1..8 {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[g], group(a.add(4 * g))));
                }
                let si = _mm256_cvtepi32_ps(_mm256_madd_epi16(s, ones));
                let da = _mm256_set1_ps(*x.d.get_unchecked(r * nb + b));
                let sa = _mm256_set1_ps(*x.s.get_unchecked(r * nb + b));
                acc[r] = _mm256_fmadd_ps(si, _mm256_mul_ps(d, da), acc[r]);
                acc[r] = _mm256_fmadd_ps(m, sa, acc[r]);
            }
            rec = rec.add(record);
        }
        for r in 0..R {
            _mm256_storeu_ps(tile[r].as_mut_ptr(), acc[r]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8<const R: usize>(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR]) {
    let nb = x.k / QK;
    // SAFETY: as in q4.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let qp: [*const i8; R] = std::array::from_fn(|r| x.q.as_ptr().add(r * x.k));
        let mut rec = panel.as_ptr();
        for b in 0..nb {
            prefetch_ahead::<PREFETCH_AHEAD>(rec, Q8_RECORD);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(rec as *const __m128i));
            let mut w = [_mm256_setzero_si256(); 8];
            let mut wa = [_mm256_setzero_si256(); 8];
            for g in 0..8 {
                w[g] = _mm256_loadu_si256(rec.add(Q8_QUANTS + 32 * g) as *const __m256i);
                wa[g] = _mm256_abs_epi8(w[g]);
            }
            for r in 0..R {
                let a = qp[r].add(b * QK);
                let mut s = _mm256_setzero_si256();
                for g in 0..8 {
                    let av = _mm256_sign_epi8(group(a.add(4 * g)), w[g]);
                    let p = _mm256_maddubs_epi16(wa[g], av);
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
                let da = _mm256_set1_ps(*x.d.get_unchecked(r * nb + b));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, da), acc[r]);
            }
            rec = rec.add(Q8_RECORD);
        }
        for r in 0..R {
            _mm256_storeu_ps(tile[r].as_mut_ptr(), acc[r]);
        }
    }
}
