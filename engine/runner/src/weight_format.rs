//! Which format each projection is served in (`serve --weights`), and a projection packed in
//! it. `as-file` keeps what the checkpoint stores where a kernel exists for it (f32, bf16,
//! Q8_0, Q4_0, Q4_1; F16 files are widened to f32), and maps other GGUF encodings to the
//! nearest kernel format without losing precision (K-quants and Q5 to Q8_0). The other
//! choices convert every projection (dequantizing, then quantizing with GGML's reference
//! rounding); a matrix already in the target format is repacked as stored.
//!
//! The fused projections (`wqkv`, `w_gate_up`) need one format: when their parts differ,
//! the most precise of the parts' formats is used for all.

use candle_core::quantized::GgmlDType;

use crate::error::Result;
use crate::kernels::quant::QK;
use crate::kernels::quant::blocks::{
    GGML_Q4_0_BYTES, GGML_Q4_1_BYTES, GGML_Q8_0_BYTES, Q4Block, Q8Block,
};
use crate::kernels::{PackedMatrix, QFormat, QuantMatrix};
use crate::model::weights::{RawMatrix, Stored};

/// `--weights`: the format the projections are served in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightChoice {
    /// What the file stores (see the module note).
    #[default]
    AsFile,
    /// f32 everywhere (the reference).
    F32,
    /// bf16 everywhere: half f32's bytes, multiplied in f32 (each weight rounded to bf16).
    Bf16,
    /// 8-bit blocks of 32 with an f16 scale.
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit blocks of 32 with an f16 scale.
    #[value(name = "q4_0")]
    Q4_0,
    /// 4-bit blocks of 32 with an f16 scale and offset.
    #[value(name = "q4_1")]
    Q4_1,
}

/// The format one projection is served in, ordered from least to most precise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Served {
    Q4_0,
    Q4_1,
    Q8_0,
    Bf16,
    F32,
}

impl Served {
    /// Lower-case name (as in `--weights`).
    pub fn name(self) -> &'static str {
        match self {
            Served::Q4_0 => "q4_0",
            Served::Q4_1 => "q4_1",
            Served::Q8_0 => "q8_0",
            Served::Bf16 => "bf16",
            Served::F32 => "f32",
        }
    }

    /// Bytes an `[n, k]` projection takes in this format, packed.
    pub fn bytes_for(self, n: usize, k: usize) -> usize {
        match self {
            Served::F32 => PackedMatrix::bytes_for(n, k),
            Served::Bf16 => PackedMatrix::bytes_for_bf16(n, k),
            Served::Q8_0 => QuantMatrix::bytes_for(QFormat::Q8, n, k),
            Served::Q4_0 => QuantMatrix::bytes_for(QFormat::Q4Sym, n, k),
            Served::Q4_1 => QuantMatrix::bytes_for(QFormat::Q4, n, k),
        }
    }

    /// The format `choice` serves a stored matrix of `k` columns in.
    pub fn choose(choice: WeightChoice, stored: &Stored<'_>, k: usize) -> Served {
        let wanted = match choice {
            WeightChoice::F32 => Served::F32,
            WeightChoice::Bf16 => Served::Bf16,
            WeightChoice::Q8_0 => Served::Q8_0,
            WeightChoice::Q4_0 => Served::Q4_0,
            WeightChoice::Q4_1 => Served::Q4_1,
            WeightChoice::AsFile => match stored {
                Stored::F32(_) => Served::F32,
                Stored::Bf16(_) => Served::Bf16,
                Stored::Raw(r) => match r.dtype {
                    GgmlDType::F32 | GgmlDType::F16 => Served::F32,
                    GgmlDType::BF16 => Served::Bf16,
                    GgmlDType::Q4_0 => Served::Q4_0,
                    GgmlDType::Q4_1 => Served::Q4_1,
                    _ => Served::Q8_0,
                },
            },
        };
        // Block formats need whole blocks along k.
        if !matches!(wanted, Served::F32 | Served::Bf16) && !k.is_multiple_of(QK) {
            Served::F32
        } else {
            wanted
        }
    }
}

/// A projection in its served format.
#[derive(Debug)]
pub enum Projection {
    /// f32 or bf16 panels (the matrix says which).
    Dense(PackedMatrix),
    Quant(QuantMatrix, Served),
}

impl Projection {
    /// `y = x · wᵀ`; `x: [m, k]`, `y: [m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        match self {
            Projection::Dense(p) => p.matmul(x, m, y),
            Projection::Quant(q, _) => q.matmul(x, m, y),
        }
    }

    /// Bytes read by one pass over the weights.
    pub fn bytes(&self) -> usize {
        match self {
            Projection::Dense(p) => p.bytes(),
            Projection::Quant(q, _) => q.bytes(),
        }
    }

    /// The served format.
    pub fn served(&self) -> Served {
        match self {
            Projection::Dense(p) if p.is_bf16() => Served::Bf16,
            Projection::Dense(_) => Served::F32,
            Projection::Quant(_, s) => *s,
        }
    }

    /// Packs the row-wise concatenation of `parts` (each `[rows_i, k]`) in `fmt`.
    pub fn pack(parts: &[Stored<'_>], k: usize, fmt: Served) -> Result<Self> {
        let sources = parts
            .iter()
            .map(|p| Source::new(p, fmt))
            .collect::<Result<Vec<_>>>()?;
        let n: usize = sources.iter().map(Source::rows).sum();
        // Row `row` of the fused matrix: its part and the row within it.
        let locate = |mut row: usize| {
            for s in &sources {
                if row < s.rows() {
                    return (s, row);
                }
                row -= s.rows();
            }
            unreachable!("row beyond the fused matrix")
        };
        Ok(match fmt {
            Served::F32 | Served::Bf16 => {
                let mut w = Vec::with_capacity(n * k);
                for s in &sources {
                    if let Source::F32(v, _) = s {
                        w.extend_from_slice(v);
                    }
                }
                Projection::Dense(if fmt == Served::Bf16 {
                    PackedMatrix::pack_bf16(&w, n, k)
                } else {
                    PackedMatrix::pack(&w, n, k)
                })
            }
            Served::Q8_0 => Projection::Quant(
                QuantMatrix::from_q8(n, k, |row, b| {
                    let (s, r) = locate(row);
                    s.q8(r, b, k)
                }),
                fmt,
            ),
            Served::Q4_0 => Projection::Quant(
                QuantMatrix::from_q4_0(n, k, |row, b| {
                    let (s, r) = locate(row);
                    s.q4(r, b, k, fmt)
                }),
                fmt,
            ),
            Served::Q4_1 => Projection::Quant(
                QuantMatrix::from_q4(n, k, |row, b| {
                    let (s, r) = locate(row);
                    s.q4(r, b, k, fmt)
                }),
                fmt,
            ),
        })
    }
}

/// One part's weights, ready to hand out blocks of the target format: the file's own bytes
/// when they are already in it, f32 values to quantize otherwise.
enum Source<'a> {
    Blocks(&'a RawMatrix),
    F32(Vec<f32>, usize),
}

impl<'a> Source<'a> {
    fn new(stored: &Stored<'a>, fmt: Served) -> Result<Self> {
        let same = |r: &RawMatrix| {
            matches!(
                (r.dtype, fmt),
                (GgmlDType::Q8_0, Served::Q8_0)
                    | (GgmlDType::Q4_0, Served::Q4_0)
                    | (GgmlDType::Q4_1, Served::Q4_1)
            )
        };
        Ok(match stored {
            Stored::Raw(r) if same(r) => Source::Blocks(r),
            Stored::Raw(r) => Source::F32(r.dequantize()?.flatten_all()?.to_vec1()?, r.rows),
            Stored::F32(t) | Stored::Bf16(t) => {
                Source::F32(t.flatten_all()?.to_vec1()?, t.dims()[0])
            }
        })
    }

    fn rows(&self) -> usize {
        match self {
            Source::Blocks(r) => r.rows,
            Source::F32(_, rows) => *rows,
        }
    }

    fn values(v: &[f32], row: usize, b: usize, k: usize) -> &[f32] {
        &v[row * k + b * QK..row * k + (b + 1) * QK]
    }

    fn block_bytes(r: &RawMatrix, row: usize, b: usize, size: usize) -> &[u8] {
        &r.data[row * r.row_bytes() + b * size..][..size]
    }

    fn q8(&self, row: usize, b: usize, k: usize) -> Q8Block {
        match self {
            Source::Blocks(r) => Q8Block::from_q8_0(Self::block_bytes(r, row, b, GGML_Q8_0_BYTES)),
            Source::F32(v, _) => Q8Block::quantize(Self::values(v, row, b, k)),
        }
    }

    fn q4(&self, row: usize, b: usize, k: usize, fmt: Served) -> Q4Block {
        match (self, fmt) {
            (Source::Blocks(r), Served::Q4_0) => {
                Q4Block::from_q4_0(Self::block_bytes(r, row, b, GGML_Q4_0_BYTES))
            }
            (Source::Blocks(r), _) => {
                Q4Block::from_q4_1(Self::block_bytes(r, row, b, GGML_Q4_1_BYTES))
            }
            (Source::F32(v, _), Served::Q4_0) => Q4Block::quantize_q4_0(Self::values(v, row, b, k)),
            (Source::F32(v, _), _) => Q4Block::quantize_q4_1(Self::values(v, row, b, k)),
        }
    }
}
