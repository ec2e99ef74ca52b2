//! Per-row int8 quantization of the activations a quantized matmul reads (llama.cpp's Q8_1
//! idea): each row is cut into blocks of [`QK`] values; a block keeps `d = max|x| / 127`,
//! the rounded quotients `q = round(x / d)` in `[-127, 127]` and `s = d · Σq`, which the
//! 4-bit kernels need for the weights' per-block offset. The error of a block is at most
//! `d / 2` per value.

use crate::kernels::team;

use super::QK;

/// `m` rows of `k` activations, quantized (`k` a multiple of [`QK`]).
#[derive(Debug, Default)]
pub struct QuantRows {
    /// Values per row.
    pub k: usize,
    /// `m·k` quotients, row-major.
    pub q: Vec<i8>,
    /// `m·(k/QK)` block scales.
    pub d: Vec<f32>,
    /// `m·(k/QK)` block sums `d·Σq`.
    pub s: Vec<f32>,
}

/// Rows quantized per task at least (the work per row is tiny).
const ROWS_PER_TASK: usize = 8;

impl QuantRows {
    /// Quantizes the first `m` rows of `x` (`[m, k]`).
    pub fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        debug_assert!(k.is_multiple_of(QK) && x.len() >= m * k);
        let nb = k / QK;
        let mut out = QuantRows {
            k,
            q: vec![0; m * k],
            d: vec![0.0; m * nb],
            s: vec![0.0; m * nb],
        };
        if m <= ROWS_PER_TASK {
            // One task's worth: handing it to the pool costs more than the work (a GEMV's
            // single row takes well under a microsecond).
            for (r, x) in x[..m * k].chunks_exact(k).enumerate() {
                let (q, d, s) = (
                    &mut out.q[r * k..][..k],
                    &mut out.d[r * nb..][..nb],
                    &mut out.s[r * nb..][..nb],
                );
                quantize_row(x, q, d, s);
            }
            return out;
        }
        let r = ROWS_PER_TASK;
        let tasks: Vec<_> = (out.q.chunks_mut(k * r))
            .zip(out.d.chunks_mut(nb * r))
            .zip(out.s.chunks_mut(nb * r))
            .zip(x[..m * k].chunks(k * r))
            .collect();
        team::for_each_item(tasks, |(((q, d), s), x)| {
            let rows = q.chunks_exact_mut(k).zip(d.chunks_exact_mut(nb));
            for ((q, d), (s, x)) in rows.zip(s.chunks_exact_mut(nb).zip(x.chunks_exact(k))) {
                quantize_row(x, q, d, s);
            }
        });
        out
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.k / QK
    }
}

/// One row's blocks: the AVX-512 loop where the CPU has it (it was 12% of a batch-32 step
/// with the scalar `round`), the AVX2 one where it has that (the build's baseline calls
/// libm's `roundf` per value: 9% of a batch-32 step on an AVX2-only Zen 3), the portable one
/// otherwise; all give the same bytes.
fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::width::Width;
        match Width::selected() {
            Width::Avx512 => return x86::quantize_row(x, q, d, s),
            Width::Avx2 => return x86_avx2::quantize_row(x, q, d, s),
            Width::Portable => {}
        }
    }
    quantize_row_portable(x, q, d, s)
}

fn quantize_row_portable(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, (xb, qb)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let (scale, inv) = scale_of(amax);
        let mut sum = 0i32;
        for (o, v) in qb.iter_mut().zip(xb) {
            // |v·inv| ≤ 127 (up to rounding of inv), so the cast never saturates usefully.
            let r = (v * inv).round().clamp(-127.0, 127.0) as i8;
            sum += i32::from(r);
            *o = r;
        }
        d[b] = scale;
        s[b] = scale * sum as f32;
    }
}

/// A block's scale `max|x| / 127` and its inverse (0 for an all-zero block).
#[inline(always)]
fn scale_of(amax: f32) -> (f32, f32) {
    let scale = amax / 127.0;
    (scale, if scale > 0.0 { 1.0 / scale } else { 0.0 })
}

/// The portable loop's operations on 16 lanes: the same products, and `round` (half away
/// from zero) built exactly as `trunc(v) + sign(v)·[|v − trunc(v)| ≥ ½]`, so the quants are
/// bit-identical (`vector_quantization_equals_the_portable_one`).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use super::{QK, scale_of};

    /// Entered only after run-time detection of avx512f.
    pub(super) fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        assert!(x.len() == q.len() && x.len() == d.len() * QK && d.len() == s.len());
        // SAFETY: avx512f detected by the caller; lengths asserted above.
        unsafe { blocks(x, q, d, s) }
    }

    #[target_feature(enable = "avx512f")]
    fn blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        for b in 0..d.len() {
            // SAFETY: block b's 32 values and quants are inside x and q (asserted).
            unsafe {
                let xp = x.as_ptr().add(b * QK);
                let v = [_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16))];
                let amax = _mm512_reduce_max_ps(_mm512_max_ps(abs(v[0]), abs(v[1])));
                let (scale, inv) = scale_of(amax);
                let inv = _mm512_set1_ps(inv);
                let mut sum = _mm512_setzero_si512();
                for (h, v) in v.into_iter().enumerate() {
                    let r = round_away(_mm512_mul_ps(v, inv));
                    let r = _mm512_min_ps(
                        _mm512_max_ps(r, _mm512_set1_ps(-127.0)),
                        _mm512_set1_ps(127.0),
                    );
                    let i = _mm512_cvttps_epi32(r);
                    sum = _mm512_add_epi32(sum, i);
                    let bytes = _mm512_cvtepi32_epi8(i);
                    _mm_storeu_si128(q.as_mut_ptr().add(b * QK + 16 * h) as *mut __m128i, bytes);
                }
                *d.get_unchecked_mut(b) = scale;
                *s.get_unchecked_mut(b) = scale * _mm512_reduce_add_epi32(sum) as f32;
            }
        }
    }

    #[inline(always)]
    fn abs(v: __m512) -> __m512 {
        // SAFETY: avx512f is enabled in the callers.
        unsafe {
            _mm512_castsi512_ps(_mm512_and_si512(
                _mm512_castps_si512(v),
                _mm512_set1_epi32(0x7fff_ffff),
            ))
        }
    }

    /// `f32::round` on 16 lanes (exact for |v| < 2²³, where `v − trunc(v)` is exact).
    #[inline(always)]
    fn round_away(v: __m512) -> __m512 {
        // SAFETY: avx512f is enabled in the callers.
        unsafe {
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
            let half =
                _mm512_cmp_ps_mask::<_CMP_GE_OQ>(abs(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5));
            let sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN));
            let one = _mm512_castsi512_ps(_mm512_or_si512(
                sign,
                _mm512_castps_si512(_mm512_set1_ps(1.0)),
            ));
            _mm512_mask_add_ps(t, half, t, one)
        }
    }
}

/// The same operations on 8 lanes (AVX2; `vroundps` for the truncation). The i32 quants
/// are narrowed by saturating packs, exact since they are in `[-127, 127]`, and the packs'
/// per-128-bit-lane interleave undone by one dword permute.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86_avx2 {
    use std::arch::x86_64::*;

    use super::{QK, scale_of};
    use crate::kernels::vector_math::horizontal;

    /// Entered only after run-time detection of avx2.
    pub(super) fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        assert!(x.len() == q.len() && x.len() == d.len() * QK && d.len() == s.len());
        // SAFETY: avx2 detected by the caller; lengths asserted above.
        unsafe { blocks(x, q, d, s) }
    }

    #[target_feature(enable = "avx2")]
    fn blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
        for b in 0..d.len() {
            // SAFETY: block b's 32 values and quants are inside x and q (asserted).
            unsafe {
                let xp = x.as_ptr().add(b * QK);
                let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xp.add(8 * i)));
                let m = _mm256_max_ps(
                    _mm256_max_ps(abs(v[0]), abs(v[1])),
                    _mm256_max_ps(abs(v[2]), abs(v[3])),
                );
                let (scale, inv) = scale_of(horizontal(m, |a, b| _mm_max_ps(a, b)));
                let inv = _mm256_set1_ps(inv);
                let i: [__m256i; 4] = std::array::from_fn(|h| {
                    let r = round_away(_mm256_mul_ps(v[h], inv));
                    let r = _mm256_min_ps(
                        _mm256_max_ps(r, _mm256_set1_ps(-127.0)),
                        _mm256_set1_ps(127.0),
                    );
                    _mm256_cvttps_epi32(r)
                });
                let bytes = _mm256_packs_epi16(
                    _mm256_packs_epi32(i[0], i[1]),
                    _mm256_packs_epi32(i[2], i[3]),
                );
                let bytes =
                    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(q.as_mut_ptr().add(b * QK) as *mut __m256i, bytes);
                let sum =
                    _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
                *d.get_unchecked_mut(b) = scale;
                *s.get_unchecked_mut(b) = scale * hsum(sum) as f32;
            }
        }
    }

    #[inline(always)]
    fn abs(v: __m256) -> __m256 {
        // SAFETY: avx2 is enabled in the callers.
        unsafe { _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff))) }
    }

    /// The sum of 8 i32 lanes (exact: each is at most 127 in size).
    #[inline(always)]
    fn hsum(v: __m256i) -> i32 {
        // SAFETY: avx2 is enabled in the callers.
        unsafe {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            _mm_cvtsi128_si32(s)
        }
    }

    /// `f32::round` on 8 lanes, as the AVX-512 form builds it.
    #[inline(always)]
    fn round_away(v: __m256) -> __m256 {
        // SAFETY: avx2 is enabled in the callers.
        unsafe {
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
            let half = _mm256_cmp_ps::<_CMP_GE_OQ>(abs(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5));
            let sign = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)));
            let one = _mm256_or_ps(sign, _mm256_set1_ps(1.0));
            _mm256_add_ps(t, _mm256_and_ps(half, one))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_rows_reconstruct_within_half_a_step() {
        let (m, k) = (3, 64);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
            .collect();
        let r = QuantRows::quantize(&x, m, k);
        for row in 0..m {
            for b in 0..k / QK {
                let d = r.d[row * 2 + b];
                let mut sum = 0i32;
                for i in 0..QK {
                    let at = row * k + b * QK + i;
                    let back = f32::from(r.q[at]) * d;
                    assert!((back - x[at]).abs() <= d * 0.5 + 1e-6);
                    sum += i32::from(r.q[at]);
                }
                assert!((r.s[row * 2 + b] - d * sum as f32).abs() < 1e-4);
            }
        }
    }

    /// The AVX-512 and AVX2 loops give the portable loop's bytes, ties (`k + ½` after scaling) and
    /// values at the clamp included.
    #[test]
    fn vector_quantization_equals_the_portable_one() {
        #[cfg(target_arch = "x86_64")]
        {
            type Row = fn(&[f32], &mut [i8], &mut [f32], &mut [f32]);
            let mut paths: Vec<(&str, Row)> = Vec::new();
            if std::arch::is_x86_feature_detected!("avx512f") {
                paths.push(("avx512", x86::quantize_row));
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                paths.push(("avx2", x86_avx2::quantize_row));
            }
            if paths.is_empty() {
                eprintln!("skipped: neither avx512f nor avx2 on this CPU");
                return;
            }
            let k = 32 * 64;
            let mut x: Vec<f32> = (0..k)
                .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 37.0)
                .collect();
            // A block whose scale is exactly 1 (max 127): every x.5 is a tie.
            for (i, v) in x[..QK].iter_mut().enumerate() {
                *v = if i == 0 {
                    127.0
                } else {
                    (i as f32 - 16.0) * 2.5 + 0.5
                };
            }
            x[QK..2 * QK].fill(0.0);
            let nb = k / QK;
            let (mut q0, mut d0, mut s0) = (vec![0i8; k], vec![0f32; nb], vec![0f32; nb]);
            quantize_row_portable(&x, &mut q0, &mut d0, &mut s0);
            for (name, row) in paths {
                let (mut q1, mut d1, mut s1) = (vec![0i8; k], vec![0f32; nb], vec![0f32; nb]);
                row(&x, &mut q1, &mut d1, &mut s1);
                assert_eq!(q0, q1, "{name}");
                assert_eq!(d0, d1, "{name}");
                assert_eq!(s0, s1, "{name}");
            }
        }
    }

    #[test]
    fn a_zero_block_has_a_zero_scale() {
        let r = QuantRows::quantize(&[0.0; 32], 1, 32);
        assert_eq!((r.d[0], r.s[0]), (0.0, 0.0));
        assert!(r.q.iter().all(|&q| q == 0));
    }
}
