//! `y[m, n] = x[m, k] · w[n, k]ᵀ` for row-major f32 slices.
//!
//! The output columns (weight rows) are split into chunks that run on the rayon pool; each
//! chunk walks all `m` input rows in tiles of `R` rows × `O` weight rows, keeping the `R·O`
//! partial sums in vector registers, so a weight row is read from memory once per call
//! (GEMV: bandwidth bound) and reused `m` times from cache (GEMM: compute bound).
//! The AVX-512 and AVX2+FMA paths are chosen at run time; a portable path is used otherwise.
//! Results differ from a naive sum only by float reassociation.

use rayon::prelude::*;

/// Computes `y = x · wᵀ`; `x: [m, k]`, `w: [n, k]`, `y: [m, n]`.
///
/// # Panics
/// Never on consistent shapes; slices shorter than the shapes say are a caller bug and are
/// caught by the debug assertion only.
pub fn matmul_xwt(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, y: &mut [f32]) {
    debug_assert!(x.len() >= m * k && w.len() >= n * k && y.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let isa = Isa::detect();
    let chunk = chunk_rows(m, n);
    let nchunks = n.div_ceil(chunk);
    if nchunks == 1 {
        compute_chunk(isa, x, m, w, k, 0, n, y, n);
        return;
    }
    // Each task fills a private [m, rows] block; blocks are scattered into y afterwards.
    let blocks: Vec<Vec<f32>> = (0..nchunks)
        .into_par_iter()
        .map(|c| {
            let o0 = c * chunk;
            let rows = chunk.min(n - o0);
            let mut out = vec![0f32; m * rows];
            compute_chunk(
                isa,
                x,
                m,
                &w[o0 * k..(o0 + rows) * k],
                k,
                0,
                rows,
                &mut out,
                rows,
            );
            out
        })
        .collect();
    for (c, block) in blocks.iter().enumerate() {
        let o0 = c * chunk;
        let rows = chunk.min(n - o0);
        for r in 0..m {
            y[r * n + o0..r * n + o0 + rows].copy_from_slice(&block[r * rows..(r + 1) * rows]);
        }
    }
}

fn chunk_rows(m: usize, n: usize) -> usize {
    // Enough tasks to balance two or more threads, but large enough to amortise dispatch.
    let threads = rayon::current_num_threads().max(1);
    let target = if m == 1 { threads * 2 } else { threads * 4 };
    n.div_ceil(target).next_multiple_of(8).max(8)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}

/// Fills `y[r * ldy + o]` for `r < m`, `o0 <= o < o1` (weight rows local to `w`).
#[allow(clippy::too_many_arguments)]
fn compute_chunk(
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &[f32],
    k: usize,
    o0: usize,
    o1: usize,
    y: &mut [f32],
    ldy: usize,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::chunk_avx512(x, m, w, k, o0, o1, y, ldy),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::chunk_avx2(x, m, w, k, o0, o1, y, ldy),
        _ => portable_chunk(x, m, w, k, o0, o1, y, ldy),
    }
}

#[allow(clippy::too_many_arguments)]
fn portable_chunk(
    x: &[f32],
    m: usize,
    w: &[f32],
    k: usize,
    o0: usize,
    o1: usize,
    y: &mut [f32],
    ldy: usize,
) {
    for o in o0..o1 {
        let wr = &w[o * k..(o + 1) * k];
        for r in 0..m {
            y[r * ldy + o] = dot(&x[r * k..(r + 1) * k], wr);
        }
    }
}

/// Portable dot product with 8 independent accumulators (vectorises without target flags).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(p, q)| p * q)
        .sum();
    for (p, q) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += p[i] * q[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

// SIMD intrinsics need `unsafe`: the functions are only entered after run-time feature
// detection, and every pointer offset stays inside slices whose lengths were checked above.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    macro_rules! tiled_chunk {
        ($name:ident, $inner:ident, $feat:literal, $lanes:expr, $vec:ty, $zero:ident, $load:ident,
         $fma:ident, $reduce:path, $tiles:expr) => {
            #[allow(clippy::too_many_arguments)]
            pub(super) fn $name(
                x: &[f32],
                m: usize,
                w: &[f32],
                k: usize,
                o0: usize,
                o1: usize,
                y: &mut [f32],
                ldy: usize,
            ) {
                assert!(x.len() >= m * k && w.len() >= o1 * k && y.len() >= (m - 1) * ldy + o1);
                // SAFETY: the caller detected the CPU feature; bounds asserted above.
                unsafe { $inner(x, m, w, k, o0, o1, y, ldy) }
            }

            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn $inner(
                x: &[f32],
                m: usize,
                w: &[f32],
                k: usize,
                o0: usize,
                o1: usize,
                y: &mut [f32],
                ldy: usize,
            ) {
                let (rt, ot) = $tiles(m);
                let mut o = o0;
                while o < o1 {
                    let on = ot.min(o1 - o);
                    let mut r = 0;
                    while r < m {
                        let rn = rt.min(m - r);
                        match (rn, on) {
                            (4, 4) => tile::<4, 4>(x, w, k, r, o, y, ldy),
                            (1, 8) => tile::<1, 8>(x, w, k, r, o, y, ldy),
                            (2, 4) => tile::<2, 4>(x, w, k, r, o, y, ldy),
                            _ => {
                                for rr in r..r + rn {
                                    for oo in o..o + on {
                                        tile::<1, 1>(x, w, k, rr, oo, y, ldy);
                                    }
                                }
                            }
                        }
                        r += rn;
                    }
                    o += on;
                }

                #[target_feature(enable = $feat)]
                #[inline]
                fn tile<const R: usize, const O: usize>(
                    x: &[f32],
                    w: &[f32],
                    k: usize,
                    r: usize,
                    o: usize,
                    y: &mut [f32],
                    ldy: usize,
                ) {
                    // SAFETY: the enclosing function has the feature enabled; rows r..r+R of x
                    // and o..o+O of w exist (checked by the caller's assert and tile bounds).
                    unsafe {
                        let xp = x.as_ptr().add(r * k);
                        let wp = w.as_ptr().add(o * k);
                        let mut acc: [[$vec; O]; R] = [[$zero(); O]; R];
                        let kv = k - k % $lanes;
                        let mut kk = 0;
                        while kk < kv {
                            let mut wv: [$vec; O] = [$zero(); O];
                            for j in 0..O {
                                wv[j] = $load(wp.add(j * k + kk));
                            }
                            for i in 0..R {
                                let xv = $load(xp.add(i * k + kk));
                                for j in 0..O {
                                    acc[i][j] = $fma(xv, wv[j], acc[i][j]);
                                }
                            }
                            kk += $lanes;
                        }
                        for i in 0..R {
                            for j in 0..O {
                                let mut s = $reduce(acc[i][j]);
                                for t in kv..k {
                                    s += *xp.add(i * k + t) * *wp.add(j * k + t);
                                }
                                y[(r + i) * ldy + o + j] = s;
                            }
                        }
                    }
                }
            }
        };
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn hsum256(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    fn tiles512(m: usize) -> (usize, usize) {
        if m == 1 { (1, 8) } else { (4, 4) }
    }
    fn tiles256(m: usize) -> (usize, usize) {
        if m == 1 { (1, 8) } else { (2, 4) }
    }

    tiled_chunk!(
        chunk_avx512,
        inner_avx512,
        "avx512f",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_fmadd_ps,
        _mm512_reduce_add_ps,
        tiles512
    );
    tiled_chunk!(
        chunk_avx2,
        inner_avx2,
        "avx2,fma",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_fmadd_ps,
        hsum256,
        tiles256
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for r in 0..m {
            for o in 0..n {
                y[r * n + o] = (0..k).map(|t| x[r * k + t] * w[o * k + t]).sum();
            }
        }
        y
    }

    #[test]
    fn matches_naive_on_odd_shapes() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 37, 19),
            (3, 70, 33),
            (5, 129, 64),
            (32, 200, 96),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 9.0)
                .collect();
            let mut y = vec![0f32; m * n];
            matmul_xwt(&x, m, &w, n, k, &mut y);
            let want = naive(&x, m, &w, n, k);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "{m}x{n}x{k}: {a} vs {b}"
                );
            }
        }
    }
}
