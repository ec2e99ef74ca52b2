//! Element-wise and row-wise ops of the Llama block over `&[f32]` rows: RMSNorm, half-split
//! RoPE, SwiGLU activation, softmax. Each op works on whole rows; none allocates except
//! where it returns a value.

/// `out = x / sqrt(mean(x²) + eps) * w` for one row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ms + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// RoPE inverse frequencies `theta^(-2i/head_dim)` for `i < head_dim / 2`.
pub fn rope_inv_freq(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// Rotates every head of one row in place (Hugging Face half-split form) at position `pos`.
/// `cos_sin` is scratch of length `head_dim` (first half cos, second half sin).
pub fn rope_row(row: &mut [f32], head_dim: usize, pos: usize, inv_freq: &[f64], cs: &mut [f32]) {
    let half = head_dim / 2;
    for (i, f) in inv_freq.iter().enumerate() {
        let a = pos as f64 * f;
        cs[i] = a.cos() as f32;
        cs[half + i] = a.sin() as f32;
    }
    for head in row.chunks_exact_mut(head_dim) {
        let (x1, x2) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            let (c, s) = (cs[i], cs[half + i]);
            x1[i] = a * c - b * s;
            x2[i] = b * c + a * s;
        }
    }
}

/// `out[i] = silu(gate[i]) * up[i]`: on 16 lanes where the CPU has AVX-512, on 8 where it
/// has AVX2 and FMA (the width [`super::width`] selects).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::width::Width;
        match Width::selected() {
            Width::Avx512 => return super::vector_math::silu_mul(gate, up, out),
            Width::Avx2 => return super::vector_math::silu_mul256(gate, up, out),
            Width::Portable => {}
        }
    }
    silu_mul_portable(gate, up, out)
}

/// [`silu_mul`] for any CPU.
pub fn silu_mul_portable(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// In-place softmax of one row.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `acc += x`.
pub fn add_assign(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}
