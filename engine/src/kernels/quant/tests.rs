//! The quantized matmul against a naive f32 product of the dequantized weights with the
//! dequantized activations (the same numbers, so only float rounding may differ), on every
//! kernel this CPU has, for shapes with partial panels and partial row tiles.

use super::*;

fn data(len: usize, mul: usize, modulo: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * mul % modulo) as f32 - (modulo / 2) as f32) / modulo as f32)
        .collect()
}

/// `y[r][o] = Σ_t deq(x)[r][t] · w[o][t]`.
fn reference(xq: &QuantRows, m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    let nb = k / QK;
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        for o in 0..n {
            y[r * n + o] = (0..k)
                .map(|t| f32::from(xq.q[r * k + t]) * xq.d[r * nb + t / QK] * w[o * k + t])
                .sum();
        }
    }
    y
}

fn check(isa: Isa, fmt: QFormat) {
    for &(m, n, k) in &[
        (1, 8, 32),
        (1, 37, 64),
        (3, 70, 96),
        (5, 129, 64),
        (9, 16, 160),
    ] {
        let x = data(m * k, 7, 13);
        let w = data(n * k, 5, 11);
        let (packed, deq): (QuantMatrix, Vec<f32>) = match fmt {
            QFormat::Q8 => {
                let blk = |o: usize, b: usize| Q8Block::quantize(&w[o * k + b * QK..][..QK]);
                let deq = (0..n)
                    .flat_map(|o| (0..k / QK).flat_map(move |b| blk(o, b).dequantize()))
                    .collect();
                (QuantMatrix::from_q8(n, k, blk), deq)
            }
            QFormat::Q4 => {
                let blk = |o: usize, b: usize| Q4Block::quantize_q4_1(&w[o * k + b * QK..][..QK]);
                let deq = (0..n)
                    .flat_map(|o| (0..k / QK).flat_map(move |b| blk(o, b).dequantize()))
                    .collect();
                (QuantMatrix::from_q4(n, k, blk), deq)
            }
        };
        let xq = QuantRows::quantize(&x, m, k);
        let mut y = vec![0f32; m * n];
        packed.matmul_quantized(isa, &xq, m, &mut y);
        let want = reference(&xq, m, &deq, n, k);
        for (i, (a, b)) in y.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() < 2e-3 * (1.0 + b.abs()),
                "{isa:?} {fmt:?} {m}x{n}x{k} at {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn every_available_kernel_matches_the_dequantized_product() {
    for fmt in [QFormat::Q8, QFormat::Q4] {
        check(Isa::Portable, fmt);
        if Isa::detect() != Isa::Portable {
            check(Isa::detect(), fmt);
        }
    }
}

#[test]
fn packed_size_is_the_file_size_per_weight() {
    assert_eq!(QuantMatrix::bytes_for(QFormat::Q8, 8, 64), 8 * 2 * 34);
    assert_eq!(QuantMatrix::bytes_for(QFormat::Q4, 8, 64), 8 * 2 * 20);
    let m = QuantMatrix::from_q4(9, 32, |_, _| Q4Block::ZERO);
    assert_eq!(m.bytes(), QuantMatrix::bytes_for(QFormat::Q4, 9, 32));
}

#[test]
fn records_read_back_what_was_written() {
    let w = data(8 * 32, 3, 17);
    let m = QuantMatrix::from_q8(8, 32, |o, _| Q8Block::quantize(&w[o * 32..(o + 1) * 32]));
    for c in 0..8 {
        let want = Q8Block::quantize(&w[c * 32..(c + 1) * 32]);
        for t in 0..32 {
            assert_eq!(layout::q8_at(&m.data, c, t), want.q[t]);
        }
    }
    let m = QuantMatrix::from_q4(8, 32, |o, _| {
        Q4Block::quantize_q4_1(&w[o * 32..(o + 1) * 32])
    });
    for c in 0..8 {
        let want = Q4Block::quantize_q4_1(&w[c * 32..(c + 1) * 32]);
        for t in 0..32 {
            assert_eq!(layout::q4_at(&m.data, c, t), want.q[t]);
        }
    }
}
