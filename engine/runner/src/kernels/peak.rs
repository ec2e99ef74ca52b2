//! The cores' floating-point ceiling: f32 fused multiply-adds per second over the whole rayon
//! pool, measured with independent register-resident accumulators (no memory traffic), using
//! the widest vector unit the matmul kernel would use. Benchmarks divide by it to say how far
//! a compute-bound step (a large decode batch, a prefill) is from what the machine can do.
//!
//! Invariant: the figure is measured, never assumed from a model number or clock speed.

use rayon::prelude::*;
use std::time::Instant;

/// FMAs per chain per timed round (enough to dwarf the timer's resolution).
const ROUNDS: usize = 4_000_000;
/// Independent accumulators: more than FMA latency × issue width, so the units never wait.
const CHAINS: usize = 16;

/// Best-of-three f32 FLOP/s (an FMA counts as two) over `rayon::current_num_threads()`
/// threads running at once.
pub fn fma_peak_flops() -> f64 {
    let threads = rayon::current_num_threads().max(1);
    let (lanes, run): (usize, fn(usize) -> f32) = pick();
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: f32 = (0..threads).into_par_iter().map(|_| run(ROUNDS)).sum();
        std::hint::black_box(s);
        let flops = (threads * ROUNDS * CHAINS * lanes * 2) as f64;
        best = best.max(flops / t.elapsed().as_secs_f64());
    }
    best
}

fn pick() -> (usize, fn(usize) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::width::Width;
        match Width::selected() {
            Width::Avx512 => return (16, x86::chains_avx512),
            Width::Avx2 => return (8, x86::chains_avx2),
            Width::Portable => {}
        }
    }
    (1, chains_scalar)
}

fn chains_scalar(rounds: usize) -> f32 {
    let mut acc = [0f32; CHAINS];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = i as f32;
    }
    let (b, c) = (
        std::hint::black_box(0.999_f32),
        std::hint::black_box(0.001_f32),
    );
    for _ in 0..rounds {
        for a in &mut acc {
            *a = a.mul_add(b, c);
        }
    }
    acc.iter().sum()
}

// SIMD intrinsics need `unsafe`; each function is only called after run-time detection of
// its features (see `pick`), and touches no memory.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    pub(super) fn chains_avx512(rounds: usize) -> f32 {
        // SAFETY: avx512f was detected by `pick`.
        unsafe { run512(rounds) }
    }

    pub(super) fn chains_avx2(rounds: usize) -> f32 {
        // SAFETY: avx2 and fma were detected by `pick`.
        unsafe { run256(rounds) }
    }

    #[target_feature(enable = "avx512f")]
    fn run512(rounds: usize) -> f32 {
        let b = _mm512_set1_ps(std::hint::black_box(0.999));
        let c = _mm512_set1_ps(std::hint::black_box(0.001));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..rounds {
            for a in &mut acc {
                *a = _mm512_fmadd_ps(*a, b, c);
            }
        }
        acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
    }

    #[target_feature(enable = "avx2,fma")]
    fn run256(rounds: usize) -> f32 {
        let b = _mm256_set1_ps(std::hint::black_box(0.999));
        let c = _mm256_set1_ps(std::hint::black_box(0.001));
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for _ in 0..rounds {
            for a in &mut acc {
                *a = _mm256_fmadd_ps(*a, b, c);
            }
        }
        let mut out = [0f32; 8];
        let mut sum = 0f32;
        for a in acc {
            // SAFETY: `out` holds 8 floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), a) };
            sum += out.iter().sum::<f32>();
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn measures_a_positive_finite_rate() {
        let f = super::fma_peak_flops();
        assert!(f.is_finite() && f > 1e8, "{f}");
    }
}
