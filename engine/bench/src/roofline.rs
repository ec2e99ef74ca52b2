//! The batch-1 roofline fraction measured in pairs: read bandwidth and decode steps taken
//! turn about, so each step is compared with the bandwidth of the same moment.
//!
//! Why: on a shared host the read bandwidth moves with the neighbours by more than a kernel
//! change does (one day's `bench-model` on the same file: 35 to 54 tok/s, the bandwidth read
//! before it 17 to 54 GB/s), and a fraction whose numerator and denominator were measured
//! half a minute apart says more about the neighbours than about the kernels. Here each
//! pair is a read pass, a few decode steps and a read pass; its fraction is the steps' weight
//! bytes per second over the faster of the two passes around them; the figure is the median
//! of the pairs.
//!
//! Invariants: the probe's buffer (256 MiB) exceeds any last-level cache, so a pass reads
//! memory; a pass is the same parallel sum [`crate::model_runner::measure_bandwidth`] times.

use std::time::Instant;

use rayon::prelude::*;

use crate::router::quantile;

/// A buffer whose parallel read measures the read bandwidth.
pub struct ReadProbe {
    src: Vec<f32>,
}

impl Default for ReadProbe {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadProbe {
    /// 256 MiB of f32s.
    pub fn new() -> Self {
        let n = 64 << 20;
        ReadProbe {
            src: (0..n).map(|i| (i % 7) as f32).collect(),
        }
    }

    /// The source buffer (for a copy measurement beside the read).
    pub fn source(&self) -> &[f32] {
        &self.src
    }

    /// One parallel read of the whole buffer: bytes per second.
    pub fn pass(&self) -> f64 {
        let t = Instant::now();
        let s: f32 = self.src.par_chunks(1 << 16).map(sum_wide).sum();
        std::hint::black_box(s);
        (self.src.len() * 4) as f64 / t.elapsed().as_secs_f64()
    }
}

/// Sum with 16 independent lanes, so the loop is limited by memory, not by add latency.
fn sum_wide(c: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for ch in c.chunks_exact(16) {
        for (a, b) in acc.iter_mut().zip(ch) {
            *a += b;
        }
    }
    acc.iter().sum()
}

/// One pair's reading: the decode steps' weight bandwidth and the read bandwidth around them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair {
    /// Weight bytes read per second by the decode steps (bytes per token ÷ median step time).
    pub decode: f64,
    /// The faster of the two read passes around the steps.
    pub read: f64,
}

impl Pair {
    /// The roofline fraction of this pair.
    pub fn fraction(&self) -> f64 {
        self.decode / self.read
    }
}

/// What [`summarize`] makes of the pairs: medians and the range of the fraction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub pairs: usize,
    pub fraction: f64,
    pub lowest: f64,
    pub highest: f64,
    /// Median read bandwidth of the pairs, bytes per second.
    pub read: f64,
    /// Median decode weight bandwidth of the pairs, bytes per second.
    pub decode: f64,
}

/// Runs `pairs` pairs: a read pass, `step()` called `steps` times (each returns its seconds),
/// a read pass. `bytes` is the weight bytes one step reads.
pub fn measure<E>(
    probe: &ReadProbe,
    pairs: usize,
    steps: usize,
    bytes: usize,
    mut step: impl FnMut() -> Result<f64, E>,
) -> Result<Vec<Pair>, E> {
    let mut out = Vec::with_capacity(pairs);
    for _ in 0..pairs {
        let before = probe.pass();
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps.max(1) {
            times.push(step()?);
        }
        let after = probe.pass();
        out.push(Pair {
            decode: bytes as f64 / median(&mut times),
            read: before.max(after),
        });
    }
    Ok(out)
}

/// The median fraction, its range and the median bandwidths; `None` without pairs.
pub fn summarize(pairs: &[Pair]) -> Option<Summary> {
    if pairs.is_empty() {
        return None;
    }
    let mut f: Vec<f64> = pairs.iter().map(Pair::fraction).collect();
    let mut read: Vec<f64> = pairs.iter().map(|p| p.read).collect();
    let mut decode: Vec<f64> = pairs.iter().map(|p| p.decode).collect();
    Some(Summary {
        pairs: pairs.len(),
        fraction: median(&mut f),
        lowest: f.iter().copied().fold(f64::INFINITY, f64::min),
        highest: f.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        read: median(&mut read),
        decode: median(&mut decode),
    })
}

/// The median (of an even count, the higher middle value; NaN of none), the bench's own.
fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pair_is_compared_with_the_faster_pass_around_it() {
        let p = Pair {
            decode: 30e9,
            read: 40e9,
        };
        assert!((p.fraction() - 0.75).abs() < 1e-12);
    }

    #[test]
    fn the_summary_is_the_median_of_the_pairs_not_a_ratio_of_medians() {
        // Neighbours move the bandwidth between pairs: the decode follows it.
        let pairs = [
            Pair {
                decode: 20e9,
                read: 25e9,
            }, // 0.80
            Pair {
                decode: 40e9,
                read: 45e9,
            }, // 0.889
            Pair {
                decode: 27e9,
                read: 30e9,
            }, // 0.90
        ];
        let s = summarize(&pairs).expect("pairs");
        assert_eq!(s.pairs, 3);
        assert!((s.fraction - 0.888_888).abs() < 1e-5, "{s:?}");
        assert!((s.lowest - 0.80).abs() < 1e-12 && (s.highest - 0.90).abs() < 1e-12);
        assert!((s.read - 30e9).abs() < 1.0 && (s.decode - 27e9).abs() < 1.0);
        assert_eq!(summarize(&[]), None);
    }

    #[test]
    fn measure_times_the_steps_between_two_passes_and_stops_on_an_error() {
        let probe = ReadProbe::new();
        let mut calls = 0;
        let pairs = measure(&probe, 2, 3, 1_000_000, || {
            calls += 1;
            Ok::<_, ()>(0.001)
        })
        .expect("no error");
        assert_eq!(calls, 6);
        assert_eq!(pairs.len(), 2);
        assert!(
            pairs
                .iter()
                .all(|p| (p.decode - 1e9).abs() < 1.0 && p.read > 0.0)
        );
        let err = measure(&probe, 2, 3, 1, || Err::<f64, _>("step failed"));
        assert_eq!(err, Err("step failed"));
    }
}
