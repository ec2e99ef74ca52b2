//! VNNI kernels over the panel records of [`super::layout`]: `vpdpbusd` multiplies unsigned
//! bytes by signed bytes and adds each group of four products into an i32 lane in one
//! instruction (AVX2 needs `maddubs` + `madd` + `add`, with i16 intermediates).
//!
//! - AVX-512 VNNI ([`q4_pair`], [`q8_pair`]): one 512-bit vector holds the same group of two
//!   adjacent panels (16 output rows), so a 4-byte activation group is broadcast once for
//!   16 lanes and the record layout stays the one the other kernels read.
//! - 256-bit ([`q4_tile`], [`q8_tile`]): one panel, for CPUs with AVX-VNNI but no AVX-512,
//!   and on AVX-512 ones for one activation row (a GEMV reads each weight once, so the pair
//!   kernel's sharing buys nothing there and measured no faster) and a lone last panel; in
//!   the EVEX encoding where the CPU has AVX-512 VNNI but not AVX-VNNI.
//!
//! Signs: the 4-bit quants are unsigned already. The 8-bit ones are signed, as are the
//! activations, and `vpdpbusd` needs one unsigned side. 256-bit: llama.cpp's trick,
//! `|w| · (a·sign(w))`. 512-bit (no byte `sign` there): the activations are offset to
//! unsigned, `a + 128`, and `128 · Σw` — one more `vpdpbusd` per weight vector, shared by
//! every row of the tile — is subtracted.
//!
//! Invariants: entered only after [`super::Isa::detect`] (or the caller's own check) found
//! the features named on each function; the safe wrappers assert every length the pointer
//! arithmetic relies on before the `unsafe` call. No sum can overflow: a block's i32 sum is
//! at most `32 · 255 · 128 ≈ 1.0e6` in magnitude.

#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register tiles read clearest as indexed arrays

use std::arch::x86_64::*;

use super::layout::{Q8_QUANTS, Q8_RECORD, q4_record};
use super::x86::{PREFETCH_AHEAD, PREFETCH_AHEAD_EVEX, group as group256, prefetch_ahead};
use super::{COLS, MR, QK, RowsView};

/// Output rows of a panel pair.
pub(super) const PAIR: usize = 2 * COLS;
/// Activation rows per tile of the pair kernels: twice [`MR`], since a pair's weight-side
/// work (loads, nibble splits, the 8-bit offset sums) is shared by every row of the tile and
/// 32 vector registers hold 8 rows' accumulators beside the 8 weight vectors.
pub(super) const PAIR_MR: usize = 2 * MR;

/// 4-bit panels `a` and `b` (outputs `0..8` and `8..16`) × up to [`PAIR_MR`] rows, records with
/// `offsets` (Q4_1) or without (Q4_0, offset `−8·d`).
pub(super) fn q4_pair(
    a: &[u8],
    b: &[u8],
    x: &RowsView<'_>,
    tile: &mut [[f32; PAIR]; PAIR_MR],
    offsets: bool,
) {
    x.check(&[a, b], q4_record(offsets).0, PAIR_MR);
    // SAFETY: features detected by the caller; lengths asserted by `check`.
    unsafe {
        by_rows!(
            [1, 2, 3, 4, 5, 6, 7, 8],
            x.rows,
            q4x2 { offsets },
            (a, b, x, tile)
        )
    }
}

/// 8-bit panels `a` and `b` × up to [`PAIR_MR`] rows.
pub(super) fn q8_pair(a: &[u8], b: &[u8], x: &RowsView<'_>, tile: &mut [[f32; PAIR]; PAIR_MR]) {
    x.check(&[a, b], Q8_RECORD, PAIR_MR);
    // SAFETY: as in q4_pair.
    unsafe { by_rows!([1, 2, 3, 4, 5, 6, 7, 8], x.rows, q8x2, (a, b, x, tile)) }
}

/// 4-bit panel × up to [`MR`] rows, 256-bit VNNI: VEX-encoded (AVX-VNNI) unless `evex`
/// (AVX-512 VNNI + VL).
pub(super) fn q4_tile(
    panel: &[u8],
    x: &RowsView<'_>,
    tile: &mut [[f32; COLS]; MR],
    offsets: bool,
    evex: bool,
) {
    x.check(&[panel], q4_record(offsets).0, MR);
    // SAFETY: as in q4_pair (the caller detected the encoding's features).
    unsafe {
        if evex {
            by_rows!(
                [1, 2, 3, 4],
                x.rows,
                q4x1_evex { offsets },
                (panel, x, tile)
            )
        } else {
            by_rows!([1, 2, 3, 4], x.rows, q4x1 { offsets }, (panel, x, tile))
        }
    }
}

/// 8-bit panel × up to [`MR`] rows, 256-bit VNNI, as [`q4_tile`].
pub(super) fn q8_tile(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR], evex: bool) {
    x.check(&[panel], Q8_RECORD, MR);
    // SAFETY: as in q4_tile.
    unsafe {
        if evex {
            by_rows!([1, 2, 3, 4], x.rows, q8x1_evex, (panel, x, tile))
        } else {
            by_rows!([1, 2, 3, 4], x.rows, q8x1, (panel, x, tile))
        }
    }
}

/// The 4 activation bytes at `a` (one group of one row) in every i32 lane.
#[inline(always)]
unsafe fn group512(a: *const i8) -> __m512i {
    // SAFETY: the caller passes a pointer with 4 readable bytes.
    unsafe { _mm512_set1_epi32((a as *const i32).read_unaligned()) }
}

/// Bytes `at..at + 32` of records `a` and `b`, as the low and high halves of one vector.
#[inline(always)]
unsafe fn join(a: *const u8, b: *const u8, at: usize) -> __m512i {
    // SAFETY: the caller passes records with 32 readable bytes at `at`.
    unsafe {
        let lo = _mm256_loadu_si256(a.add(at) as *const __m256i);
        let hi = _mm256_loadu_si256(b.add(at) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// The 8 f16 values at `at` of records `a` and `b`, as 16 floats.
#[inline(always)]
unsafe fn scales(a: *const u8, b: *const u8, at: usize) -> __m512 {
    // SAFETY: the caller passes records with 16 readable bytes at `at`.
    unsafe {
        let lo = _mm_loadu_si128(a.add(at) as *const __m128i);
        let hi = _mm_loadu_si128(b.add(at) as *const __m128i);
        _mm512_cvtph_ps(_mm256_set_m128i(hi, lo))
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
fn q4x2<const R: usize, const OFS: bool>(
    pa: &[u8],
    pb: &[u8],
    x: &RowsView<'_>,
    tile: &mut [[f32; PAIR]; PAIR_MR],
) {
    let nb = x.k / QK;
    let (record, quants) = q4_record(OFS);
    // SAFETY: R ≤ rows rows of k quants and nb scales, nb records in each panel (asserted by
    // the wrapper); every offset below stays inside those.
    unsafe {
        let mask = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); R];
        let qp: [*const i8; R] = std::array::from_fn(|r| x.q.as_ptr().add(r * x.k));
        let (mut ra, mut rb) = (pa.as_ptr(), pb.as_ptr());
        for b in 0..nb {
            let d = scales(ra, rb, 0);
            let m = if OFS {
                scales(ra, rb, 2 * COLS)
            } else {
                _mm512_mul_ps(d, _mm512_set1_ps(-8.0))
            };
            let mut w = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let v = join(ra, rb, quants + 32 * j);
                w[j] = _mm512_and_si512(v, mask);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
            }
            for r in 0..R {
                let a = qp[r].add(b * QK);
                // Two chains, so consecutive vpdpbusd do not wait on each other.
                let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], group512(a));
                let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], group512(a.add(4)));
                for g in (2..8).step_by(2) {
                    s0 = _mm512_dpbusd_epi32(s0, w[g], group512(a.add(4 * g)));
                    s1 = _mm512_dpbusd_epi32(s1, w[g + 1], group512(a.add(4 * g + 4)));
                }
                let si = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                let da = _mm512_set1_ps(*x.d.get_unchecked(r * nb + b));
                let sa = _mm512_set1_ps(*x.s.get_unchecked(r * nb + b));
                acc[r] = _mm512_fmadd_ps(si, _mm512_mul_ps(d, da), acc[r]);
                acc[r] = _mm512_fmadd_ps(m, sa, acc[r]);
            }
            ra = ra.add(record);
            rb = rb.add(record);
        }
        for r in 0..R {
            _mm512_storeu_ps(tile[r].as_mut_ptr(), acc[r]);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c,fma")]
fn q8x2<const R: usize>(pa: &[u8], pb: &[u8], x: &RowsView<'_>, tile: &mut [[f32; PAIR]; PAIR_MR]) {
    let nb = x.k / QK;
    // SAFETY: as in q4x2.
    unsafe {
        let bias = _mm512_set1_epi8(-128);
        let mut acc = [_mm512_setzero_ps(); R];
        let qp: [*const i8; R] = std::array::from_fn(|r| x.q.as_ptr().add(r * x.k));
        let (mut ra, mut rb) = (pa.as_ptr(), pb.as_ptr());
        for b in 0..nb {
            let d = scales(ra, rb, 0);
            let mut w = [_mm512_setzero_si512(); 8];
            // 128 · Σw per output: what offsetting the activations by 128 adds.
            let mut c0 = _mm512_setzero_si512();
            let mut c1 = _mm512_setzero_si512();
            for g in (0..8).step_by(2) {
                w[g] = join(ra, rb, Q8_QUANTS + 32 * g);
                w[g + 1] = join(ra, rb, Q8_QUANTS + 32 * g + 32);
                c0 = _mm512_dpbusd_epi32(c0, bias, w[g]);
                c1 = _mm512_dpbusd_epi32(c1, bias, w[g + 1]);
            }
            let corr = _mm512_add_epi32(c0, c1);
            for r in 0..R {
                let a = qp[r].add(b * QK);
                let au = |g: usize| _mm512_xor_si512(group512(a.add(4 * g)), bias);
                let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), au(0), w[0]);
                let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), au(1), w[1]);
                for g in (2..8).step_by(2) {
                    s0 = _mm512_dpbusd_epi32(s0, au(g), w[g]);
                    s1 = _mm512_dpbusd_epi32(s1, au(g + 1), w[g + 1]);
                }
                let s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), corr);
                let da = _mm512_set1_ps(*x.d.get_unchecked(r * nb + b));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, da), acc[r]);
            }
            ra = ra.add(Q8_RECORD);
            rb = rb.add(Q8_RECORD);
        }
        for r in 0..R {
            _mm512_storeu_ps(tile[r].as_mut_ptr(), acc[r]);
        }
    }
}

/// The 256-bit one-panel kernels, once per encoding of `vpdpbusd`: VEX (AVX-VNNI) and EVEX
/// (AVX-512 VNNI + VL, for the CPUs that have AVX-512 VNNI but not AVX-VNNI, e.g. Ice Lake).
macro_rules! one_panel_kernels {
    ($q4:ident, $q8:ident, $features:literal, $dpbusd:ident, $ahead:ident) => {
        #[target_feature(enable = $features)]
        fn $q4<const R: usize, const OFS: bool>(
            panel: &[u8],
            x: &RowsView<'_>,
            tile: &mut [[f32; COLS]; MR],
        ) {
            let nb = x.k / QK;
            let (record, quants) = q4_record(OFS);
            // SAFETY: as in q4x2, for one panel.
            unsafe {
                let mask = _mm256_set1_epi8(0x0f);
                let mut acc = [_mm256_setzero_ps(); R];
                let qp: [*const i8; R] = std::array::from_fn(|r| x.q.as_ptr().add(r * x.k));
                let mut rec = panel.as_ptr();
                for b in 0..nb {
                    prefetch_ahead::<$ahead>(rec, record);
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
                        let mut s0 = $dpbusd(_mm256_setzero_si256(), w[0], group256(a));
                        let mut s1 = $dpbusd(_mm256_setzero_si256(), w[1], group256(a.add(4)));
                        for g in (2..8).step_by(2) {
                            s0 = $dpbusd(s0, w[g], group256(a.add(4 * g)));
                            s1 = $dpbusd(s1, w[g + 1], group256(a.add(4 * g + 4)));
                        }
                        let si = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
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

        #[target_feature(enable = $features)]
        fn $q8<const R: usize>(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR]) {
            let nb = x.k / QK;
            // SAFETY: as in q4x2, for one panel.
            unsafe {
                let mut acc = [_mm256_setzero_ps(); R];
                let qp: [*const i8; R] = std::array::from_fn(|r| x.q.as_ptr().add(r * x.k));
                let mut rec = panel.as_ptr();
                for b in 0..nb {
                    prefetch_ahead::<$ahead>(rec, Q8_RECORD);
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(rec as *const __m128i));
                    let mut w = [_mm256_setzero_si256(); 8];
                    let mut wa = [_mm256_setzero_si256(); 8];
                    for g in 0..8 {
                        w[g] = _mm256_loadu_si256(rec.add(Q8_QUANTS + 32 * g) as *const __m256i);
                        wa[g] = _mm256_abs_epi8(w[g]);
                    }
                    for r in 0..R {
                        let a = qp[r].add(b * QK);
                        let av = |g: usize| _mm256_sign_epi8(group256(a.add(4 * g)), w[g]);
                        let mut s0 = $dpbusd(_mm256_setzero_si256(), wa[0], av(0));
                        let mut s1 = $dpbusd(_mm256_setzero_si256(), wa[1], av(1));
                        for g in (2..8).step_by(2) {
                            s0 = $dpbusd(s0, wa[g], av(g));
                            s1 = $dpbusd(s1, wa[g + 1], av(g + 1));
                        }
                        let s = _mm256_add_epi32(s0, s1);
                        let da = _mm256_set1_ps(*x.d.get_unchecked(r * nb + b));
                        acc[r] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, da), acc[r]);
                    }
                    rec = rec.add(Q8_RECORD);
                }
                for r in 0..R {
                    _mm256_storeu_ps(tile[r].as_mut_ptr(), acc[r]);
                }
            }
        }
    };
}

one_panel_kernels!(
    q4x1,
    q8x1,
    "avxvnni,avx2,f16c,fma",
    _mm256_dpbusd_avx_epi32,
    PREFETCH_AHEAD
);
one_panel_kernels!(
    q4x1_evex,
    q8x1_evex,
    "avx512vnni,avx512vl,avx2,f16c,fma",
    _mm256_dpbusd_epi32,
    PREFETCH_AHEAD_EVEX
);
