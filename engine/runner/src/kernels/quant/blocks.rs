//! One 32-weight block of a weight row, decoded from its GGML encoding or quantized from
//! f32, in the two shapes the kernels use: 4-bit (`w = d·q + m`, `q` in `0..16`; Q4_0's
//! `w = d·(q − 8)` is the same with `m = −8d`) and 8-bit (`w = d·q`). Scales stay f16 bit
//! patterns, exactly as the file has them, so repacking a file's blocks is lossless.
//!
//! GGML encodings (per block of 32, little-endian): Q4_0 = `d: f16, qs: [u8; 16]`;
//! Q4_1 = `d: f16, m: f16, qs: [u8; 16]`; in both, `qs[j]`'s low nibble is weight `j` and its
//! high nibble weight `j + 16`. Q8_0 = `d: f16, qs: [i8; 32]`.

use half::f16;

use super::QK;

/// A 4-bit block: `w[i] = d·q[i] + m`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Q4Block {
    /// Scale, f16 bits.
    pub d: u16,
    /// Offset, f16 bits.
    pub m: u16,
    /// Quants, `0..16`.
    pub q: [u8; QK],
}

/// An 8-bit block: `w[i] = d·q[i]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Q8Block {
    /// Scale, f16 bits.
    pub d: u16,
    /// Quants.
    pub q: [i8; QK],
}

/// Bytes of one GGML Q4_0 / Q4_1 / Q8_0 block.
pub const GGML_Q4_0_BYTES: usize = 18;
pub const GGML_Q4_1_BYTES: usize = 20;
pub const GGML_Q8_0_BYTES: usize = 34;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn nibbles(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (j, &byte) in qs.iter().enumerate().take(QK / 2) {
        q[j] = byte & 0x0f;
        q[j + QK / 2] = byte >> 4;
    }
    q
}

impl Q4Block {
    /// The zero block (padding columns).
    pub const ZERO: Q4Block = Q4Block {
        d: 0,
        m: 0,
        q: [0; QK],
    };

    /// Decodes a GGML Q4_0 block (18 bytes).
    pub fn from_q4_0(b: &[u8]) -> Self {
        let d = u16_at(b, 0);
        // −8·d is exact in f16 (a power-of-two multiple) short of overflow, which a real
        // scale never reaches.
        let m = f16::from_f32(-8.0 * f16::from_bits(d).to_f32()).to_bits();
        Q4Block {
            d,
            m,
            q: nibbles(&b[2..18]),
        }
    }

    /// Decodes a GGML Q4_1 block (20 bytes).
    pub fn from_q4_1(b: &[u8]) -> Self {
        Q4Block {
            d: u16_at(b, 0),
            m: u16_at(b, 2),
            q: nibbles(&b[4..20]),
        }
    }

    /// Quantizes 32 values as GGML's reference Q4_0 does: `d = max / −8` where `max` is the
    /// value of largest magnitude, `q = clamp(round(x/d) + 8, 0, 15)`.
    pub fn quantize_q4_0(x: &[f32]) -> Self {
        let max = x
            .iter()
            .fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (o, v) in q.iter_mut().zip(x) {
            *o = ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        }
        let d16 = f16::from_f32(d);
        Q4Block {
            d: d16.to_bits(),
            m: f16::from_f32(-8.0 * d16.to_f32()).to_bits(),
            q,
        }
    }

    /// Quantizes 32 values as GGML's reference Q4_1 does: `m = min`, `d = (max − min)/15`.
    pub fn quantize_q4_1(x: &[f32]) -> Self {
        let (lo, hi) = x
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        let d = (hi - lo) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (o, v) in q.iter_mut().zip(x) {
            *o = (((v - lo) * id + 0.5) as i32).clamp(0, 15) as u8;
        }
        Q4Block {
            d: f16::from_f32(d).to_bits(),
            m: f16::from_f32(lo).to_bits(),
            q,
        }
    }

    /// The 32 weights in f32.
    pub fn dequantize(&self) -> [f32; QK] {
        let (d, m) = (
            f16::from_bits(self.d).to_f32(),
            f16::from_bits(self.m).to_f32(),
        );
        self.q.map(|q| d * f32::from(q) + m)
    }
}

impl Q8Block {
    /// The zero block (padding columns).
    pub const ZERO: Q8Block = Q8Block { d: 0, q: [0; QK] };

    /// Decodes a GGML Q8_0 block (34 bytes).
    pub fn from_q8_0(b: &[u8]) -> Self {
        let mut q = [0i8; QK];
        for (o, &v) in q.iter_mut().zip(&b[2..2 + QK]) {
            *o = v as i8;
        }
        Q8Block { d: u16_at(b, 0), q }
    }

    /// Quantizes 32 values as GGML's reference Q8_0 does: `d = max|x| / 127`,
    /// `q = round(x/d)`.
    pub fn quantize(x: &[f32]) -> Self {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0i8; QK];
        for (o, v) in q.iter_mut().zip(x) {
            *o = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        Q8Block {
            d: f16::from_f32(d).to_bits(),
            q,
        }
    }

    /// The 32 weights in f32.
    pub fn dequantize(&self) -> [f32; QK] {
        let d = f16::from_bits(self.d).to_f32();
        self.q.map(|q| d * f32::from(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> Vec<f32> {
        (0..QK).map(|i| (i as f32 - 11.0) / 7.0).collect()
    }

    #[test]
    fn quantizers_reconstruct_within_a_step() {
        let x = ramp();
        let q8 = Q8Block::quantize(&x).dequantize();
        let q40 = Q4Block::quantize_q4_0(&x).dequantize();
        let q41 = Q4Block::quantize_q4_1(&x).dequantize();
        // Half a step, plus what rounding the scale (and offset) to f16 adds over 15 steps.
        // x spans [−11/7, 20/7]: Q8_0 and Q4_0 steps are set by the largest magnitude, Q4_1's
        // by the whole span.
        let (amax, span) = (20.0 / 7.0, 31.0 / 7.0);
        let f16_slack = 4e-3;
        for i in 0..QK {
            assert!((q8[i] - x[i]).abs() <= amax / 254.0 + f16_slack, "q8 {i}");
            assert!((q40[i] - x[i]).abs() <= amax / 16.0 + f16_slack, "q4_0 {i}");
            assert!((q41[i] - x[i]).abs() <= span / 30.0 + f16_slack, "q4_1 {i}");
        }
    }

    #[test]
    fn ggml_encodings_decode_to_what_was_encoded() {
        let x = ramp();
        let b = Q4Block::quantize_q4_1(&x);
        let mut bytes = vec![0u8; GGML_Q4_1_BYTES];
        bytes[0..2].copy_from_slice(&b.d.to_le_bytes());
        bytes[2..4].copy_from_slice(&b.m.to_le_bytes());
        for j in 0..16 {
            bytes[4 + j] = b.q[j] | (b.q[j + 16] << 4);
        }
        assert_eq!(Q4Block::from_q4_1(&bytes), b);
        let mut q40 = vec![0u8; GGML_Q4_0_BYTES];
        q40[0..2].copy_from_slice(&bytes[0..2]);
        q40[2..].copy_from_slice(&bytes[4..]);
        let d = f16::from_bits(b.d).to_f32();
        assert_eq!(
            Q4Block::from_q4_0(&q40).dequantize()[3],
            d * (f32::from(b.q[3]) - 8.0)
        );
        let q8 = Q8Block::quantize(&x);
        let mut b8 = q8.d.to_le_bytes().to_vec();
        b8.extend(q8.q.iter().map(|&v| v as u8));
        assert_eq!(Q8Block::from_q8_0(&b8), q8);
    }
}
