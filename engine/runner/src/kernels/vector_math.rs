//! Transcendental functions on 16 lanes for the AVX-512 paths, `exp` (attention's softmax,
//! the SwiGLU activation) and the activation itself, and both on 8 lanes for AVX2 (`exp256`
//! for its attention, `silu_mul256`). Each element goes through the vector
//! code whatever its position in a row (tails are masked, not handed to the scalar `exp`),
//! so a row's result does not depend on how many rows a step has.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// `exp(x)` per lane: `x = n·ln2 + r`, `|r| ≤ ln2/2`, `exp(r)` by Cephes' degree-7
/// polynomial, `2ⁿ` applied with `vscalefps` (which also flushes very negative `x` to 0).
/// Relative error about 1.2e-7 (`vector_exp_tracks_the_scalar_exp`); inputs above 88 give
/// `exp(88)`, not infinity.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn exp(x: __m512) -> __m512 {
    let x = _mm512_max_ps(
        _mm512_min_ps(x, _mm512_set1_ps(88.0)),
        _mm512_set1_ps(-104.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let e = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0)));
    _mm512_scalef_ps(e, n)
}

/// `exp(x)` on 8 lanes for AVX2 + FMA: [`exp`]'s reduction and polynomial, with `2ⁿ` built
/// in the exponent bits (AVX2 has no `vscalefps`), so `x` is held to `[−87.3, 88]` where
/// `2ⁿ` is a normal float: below, the result is `exp(−87.3)` ≈ 1.2e-38 rather than smaller.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn exp256(x: __m256) -> __m256 {
    let x = _mm256_max_ps(
        _mm256_min_ps(x, _mm256_set1_ps(88.0)),
        _mm256_set1_ps(-87.3),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let e = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    _mm256_mul_ps(e, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased)))
}

/// The 8 lanes folded into one by `op` (`_mm_max_ps` for the largest, `_mm_add_ps` for the
/// sum), as the AVX2 attention's softmax and the activations' quantization take them.
#[target_feature(enable = "avx2")]
pub(crate) fn horizontal(v: __m256, op: impl Fn(__m128, __m128) -> __m128) -> f32 {
    let x = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = op(x, _mm_movehl_ps(x, x));
    let x = op(x, _mm_shuffle_ps::<0b01>(x, x));
    _mm_cvtss_f32(x)
}

/// `out[i] = silu(gate[i]) · up[i]`, 16 lanes at a time (the scalar `exp` of the portable
/// loop was 4% of a batch-32 step). Entered only after run-time detection of avx512f.
pub(crate) fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == out.len() && up.len() == out.len());
    // SAFETY: avx512f detected by the caller; lengths asserted above.
    unsafe { silu_mul_avx512(gate, up, out) }
}

#[target_feature(enable = "avx512f")]
fn silu_mul_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len();
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i < n {
        let lanes = (n - i).min(16);
        let mask = ((1u32 << lanes) - 1) as __mmask16;
        // SAFETY: the mask limits every load and store to i..i + lanes ≤ n.
        unsafe {
            let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(i));
            let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(i));
            let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
            let o = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, o);
        }
        i += 16;
    }
}

/// [`silu_mul`] 8 lanes at a time for CPUs with AVX2 and FMA but no AVX-512, with
/// [`exp256`]; the tail is masked too. Entered only after run-time detection of avx2 and fma.
pub(crate) fn silu_mul256(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == out.len() && up.len() == out.len());
    // SAFETY: avx2 and fma detected by the caller; lengths asserted above.
    unsafe { silu_mul_avx2(gate, up, out) }
}

#[target_feature(enable = "avx2,fma")]
fn silu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len();
    let one = _mm256_set1_ps(1.0);
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut i = 0;
    while i < n {
        let lanes = (n - i).min(8) as i32;
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), lane);
        // SAFETY: the mask limits every load and store to i..i + lanes ≤ n.
        unsafe {
            let g = _mm256_maskload_ps(gate.as_ptr().add(i), mask);
            let u = _mm256_maskload_ps(up.as_ptr().add(i), mask);
            let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let o = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
            _mm256_maskstore_ps(out.as_mut_ptr().add(i), mask, o);
        }
        i += 8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avx512() -> bool {
        let has = std::arch::is_x86_feature_detected!("avx512f");
        if !has {
            eprintln!("skipped: no avx512f on this CPU");
        }
        has
    }

    /// The vector exp against the scalar one over the range softmax and SiLU feed it.
    #[test]
    fn vector_exp_tracks_the_scalar_exp() {
        if !avx512() {
            return;
        }
        let xs: Vec<f32> = (0..4096)
            .map(|i| -100.0 + i as f32 * (188.0 / 4096.0))
            .collect();
        let mut worst = 0f32;
        for chunk in xs.chunks_exact(16) {
            let mut got = [0f32; 16];
            // SAFETY: avx512f detected; 16 floats read and written.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp(_mm512_loadu_ps(chunk.as_ptr()))) };
            for (x, g) in chunk.iter().zip(got) {
                let want = x.exp();
                if want > f32::MIN_POSITIVE {
                    worst = worst.max(((g - want) / want).abs());
                }
            }
        }
        println!("vector exp: worst relative error {worst:e}");
        assert!(worst < 1e-6, "relative error {worst}");
    }

    /// The 8-lane exp against the scalar one, over the range it keeps exact.
    #[test]
    fn vector_exp256_tracks_the_scalar_exp() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            eprintln!("skipped: no avx2 and fma on this CPU");
            return;
        }
        let xs: Vec<f32> = (0..4096)
            .map(|i| -87.0 + i as f32 * (175.0 / 4096.0))
            .collect();
        let mut worst = 0f32;
        for chunk in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: avx2 and fma detected; 8 floats read and written.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp256(_mm256_loadu_ps(chunk.as_ptr()))) };
            for (x, g) in chunk.iter().zip(got) {
                let want = x.exp();
                worst = worst.max(((g - want) / want).abs());
            }
        }
        println!("vector exp256: worst relative error {worst:e}");
        assert!(worst < 1e-6, "relative error {worst}");
    }

    /// SiLU·up on 16 and on 8 lanes (each where the CPU has it) against the portable loop,
    /// on a length with a masked tail for both widths and gates out to ±100.
    #[test]
    fn vector_silu_tracks_the_portable_one() {
        let n = 16 * 7 + 5; // 5 lanes left over at either width
        let mut gate: Vec<f32> = (0..n).map(|i| (i as f32 - 60.0) * 0.37).collect();
        gate[..2].copy_from_slice(&[100.0, -100.0]);
        let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut want = vec![0f32; n];
        crate::kernels::ops::silu_mul_portable(&gate, &up, &mut want);
        let check = |name: &str, f: fn(&[f32], &[f32], &mut [f32])| {
            let mut got = vec![0f32; n];
            f(&gate, &up, &mut got);
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    (w - g).abs() <= 1e-6 * w.abs().max(1.0),
                    "{name}: {w} vs {g}"
                );
            }
            println!("{name}: agrees with the portable loop on {n} values");
        };
        if avx512() {
            check("avx512", silu_mul);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            check("avx2", silu_mul256);
        }
    }
}
