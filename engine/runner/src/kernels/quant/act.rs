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

fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, (xb, qb)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
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

    #[test]
    fn a_zero_block_has_a_zero_scale() {
        let r = QuantRows::quantize(&[0.0; 32], 1, 32);
        assert_eq!((r.d[0], r.s[0]), (0.0, 0.0));
        assert!(r.q.iter().all(|&q| q == 0));
    }
}
