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
        (4, 24, 64),
        (2, 48, 32),
        (7, 48, 64),
        (14, 40, 96),
        (16, 32, 64),
        (19, 48, 96),
        (37, 40, 64),
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
            QFormat::Q4Sym => {
                let blk = |o: usize, b: usize| Q4Block::quantize_q4_0(&w[o * k + b * QK..][..QK]);
                let deq = (0..n)
                    .flat_map(|o| (0..k / QK).flat_map(move |b| blk(o, b).dequantize()))
                    .collect();
                (QuantMatrix::from_q4_0(n, k, blk), deq)
            }
        };
        let xq = QuantRows::quantize(&x, m, k);
        let want = reference(&xq, m, &deq, n, k);
        let mut y = vec![0f32; m * n];
        packed.matmul_quantized(isa, &xq, m, &mut y);
        close(&y, &want, &format!("{isa:?} {fmt:?} {m}x{n}x{k}"));
        for kernel in Panel::available() {
            let mut y = vec![0f32; m * n];
            packed.matmul_one_panel(kernel, &xq, m, &mut y);
            close(&y, &want, &format!("{kernel:?} {fmt:?} {m}x{n}x{k}"));
        }
    }
}

fn close(got: &[f32], want: &[f32], what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() < 2e-3 * (1.0 + b.abs()),
            "{what} at {i}: {a} vs {b}"
        );
    }
}

/// The kernels this CPU has; the note of a run says which those were.
fn available() -> Vec<Isa> {
    let have: Vec<Isa> = select::ALL.into_iter().filter(|i| i.available()).collect();
    eprintln!(
        "quantized kernels this CPU runs: {have:?}; one-panel: {:?}",
        Panel::available()
    );
    have
}

#[test]
fn every_available_kernel_matches_the_dequantized_product() {
    for isa in available() {
        for fmt in [QFormat::Q8, QFormat::Q4, QFormat::Q4Sym] {
            check(isa, fmt);
        }
    }
}

#[test]
fn every_available_kernel_passes_the_start_up_check() {
    for isa in available() {
        select::self_check(isa).unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(Isa::selected().available());
    assert_eq!(
        Isa::from_name(Isa::selected().name()),
        Some(Isa::selected())
    );
}

#[test]
fn extreme_quants_do_not_overflow_or_saturate() {
    // Weights at the ends of their ranges (8-bit −128 included) against activations of
    // ±127: the VNNI offset trick and the AVX2 sign trick both meet their limits here.
    let (m, n, k) = (19, 40, 128);
    let x: Vec<f32> = (0..m * k)
        .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
        .collect();
    let xq = QuantRows::quantize(&x, m, k);
    let q8 = QuantMatrix::from_q8(n, k, |o, b| Q8Block {
        d: half::f16::from_f32(0.5).to_bits(),
        q: std::array::from_fn(|t| if (o + b + t) % 2 == 0 { -128 } else { 127 }),
    });
    let q4 = QuantMatrix::from_q4(n, k, |o, b| Q4Block {
        d: half::f16::from_f32(0.25).to_bits(),
        m: half::f16::from_f32(-2.0).to_bits(),
        q: std::array::from_fn(|t| if (o * 3 + b + t) % 2 == 0 { 15 } else { 0 }),
    });
    let q40 = QuantMatrix::from_q4_0(n, k, |o, b| Q4Block {
        d: half::f16::from_f32(0.25).to_bits(),
        m: half::f16::from_f32(-2.0).to_bits(),
        q: std::array::from_fn(|t| if (o + b * 3 + t) % 2 == 0 { 15 } else { 0 }),
    });
    for mat in [&q8, &q4, &q40] {
        let mut want = vec![0f32; m * n];
        mat.matmul_quantized(Isa::Portable, &xq, m, &mut want);
        for isa in available() {
            let mut got = vec![0f32; m * n];
            mat.matmul_quantized(isa, &xq, m, &mut got);
            assert_eq!(got, want, "{isa:?} {:?}", mat.format());
        }
        for kernel in Panel::available() {
            let mut got = vec![0f32; m * n];
            mat.matmul_one_panel(kernel, &xq, m, &mut got);
            assert_eq!(got, want, "{kernel:?} {:?}", mat.format());
        }
    }
}

#[test]
fn a_cap_the_cpu_lacks_is_refused_by_name() {
    if let Some(missing) = select::ALL.into_iter().find(|i| !i.available()) {
        let err = select::set_cap(missing).expect_err("unavailable kernel accepted");
        assert!(
            err.contains(missing.name()) && err.contains("portable"),
            "{err}"
        );
    }
}

#[test]
fn packed_size_is_the_file_size_per_weight() {
    assert_eq!(QuantMatrix::bytes_for(QFormat::Q8, 8, 64), 8 * 2 * 34);
    assert_eq!(QuantMatrix::bytes_for(QFormat::Q4, 8, 64), 8 * 2 * 20);
    assert_eq!(QuantMatrix::bytes_for(QFormat::Q4Sym, 8, 64), 8 * 2 * 18);
    let m = QuantMatrix::from_q4_0(9, 32, |_, _| Q4Block::ZERO);
    assert_eq!(m.bytes(), QuantMatrix::bytes_for(QFormat::Q4Sym, 9, 32));
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
            assert_eq!(layout::q4_at(&m.data, layout::Q4_QUANTS, c, t), want.q[t]);
        }
    }
    let m = QuantMatrix::from_q4_0(8, 32, |o, _| {
        Q4Block::quantize_q4_0(&w[o * 32..(o + 1) * 32])
    });
    for c in 0..8 {
        let want = Q4Block::quantize_q4_0(&w[c * 32..(c + 1) * 32]);
        assert_eq!(layout::f16_at(&m.data, 2 * c), want.d);
        for t in 0..32 {
            assert_eq!(layout::q4_at(&m.data, layout::Q4S_QUANTS, c, t), want.q[t]);
        }
    }
}

#[test]
fn q4_0_without_stored_offsets_computes_what_q4_with_them_does() {
    // The same Q4_0 blocks packed both ways: the implied offset −8·d must give exactly the
    // stored f16 one (−8·d is exact in f16), on every kernel.
    let (m, n, k) = (5, 40, 96);
    let x = data(m * k, 7, 13);
    let w = data(n * k, 5, 11);
    let blk = |o: usize, b: usize| Q4Block::quantize_q4_0(&w[o * k + b * QK..][..QK]);
    let (with, without) = (
        QuantMatrix::from_q4(n, k, blk),
        QuantMatrix::from_q4_0(n, k, blk),
    );
    let xq = QuantRows::quantize(&x, m, k);
    for isa in available() {
        let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
        with.matmul_quantized(isa, &xq, m, &mut a);
        without.matmul_quantized(isa, &xq, m, &mut b);
        assert_eq!(a, b, "{isa:?}");
    }
}
