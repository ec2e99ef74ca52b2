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

use super::layout::{Q4_QUANTS, Q4_RECORD, Q4S_QUANTS, Q4S_RECORD, Q8_QUANTS, Q8_RECORD};
use super::{COLS, MR, QK, RowsView};

fn check(panel: &[u8], record: usize, x: &RowsView<'_>) {
    let nb = x.k / QK;
    assert!((1..=MR).contains(&x.rows) && x.k.is_multiple_of(QK));
    assert!(panel.len() >= nb * record);
    assert!(x.q.len() >= x.rows * x.k && x.d.len() >= x.rows * nb && x.s.len() >= x.rows * nb);
}

/// 4-bit panel × up to [`MR`] rows, records with `offsets` (Q4_1) or without (Q4_0); see
/// [`super::portable::q4_tile`] for the formula.
pub(super) fn q4_tile(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR], offsets: bool) {
    check(panel, if offsets { Q4_RECORD } else { Q4S_RECORD }, x);
    // SAFETY: features detected by the caller; lengths asserted by `check`.
    unsafe {
        match (x.rows, offsets) {
            (4, true) => q4::<4, true>(panel, x, tile),
            (3, true) => q4::<3, true>(panel, x, tile),
            (2, true) => q4::<2, true>(panel, x, tile),
            (_, true) => q4::<1, true>(panel, x, tile),
            (4, false) => q4::<4, false>(panel, x, tile),
            (3, false) => q4::<3, false>(panel, x, tile),
            (2, false) => q4::<2, false>(panel, x, tile),
            (_, false) => q4::<1, false>(panel, x, tile),
        }
    }
}

/// 8-bit panel × up to [`MR`] rows.
pub(super) fn q8_tile(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR]) {
    check(panel, Q8_RECORD, x);
    // SAFETY: as in q4_tile.
    unsafe {
        match x.rows {
            4 => q8::<4>(panel, x, tile),
            3 => q8::<3>(panel, x, tile),
            2 => q8::<2>(panel, x, tile),
            _ => q8::<1>(panel, x, tile),
        }
    }
}

/// Sets all 8 lanes to the 4 activation bytes at `a` (one group of one row).
#[inline(always)]
unsafe fn group(a: *const i8) -> __m256i {
    // SAFETY: the caller passes a pointer with 4 readable bytes.
    unsafe { _mm256_set1_epi32((a as *const i32).read_unaligned()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4<const R: usize, const OFS: bool>(
    panel: &[u8],
    x: &RowsView<'_>,
    tile: &mut [[f32; COLS]; MR],
) {
    let (record, quants) = if OFS {
        (Q4_RECORD, Q4_QUANTS)
    } else {
        (Q4S_RECORD, Q4S_QUANTS)
    };
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
