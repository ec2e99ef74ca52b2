//! Quantized weight matrices and their integer matmul: `y[m, n] = x[m, k] · wᵀ` where `w` is
//! stored in 32-weight blocks (8-bit Q8_0, or 4-bit Q4_0/Q4_1 with a per-block scale and
//! offset), and `x` is quantized per row to int8 blocks ([`act::QuantRows`]) at each call.
//!
//! Layout ([`layout`]): the `n` output rows of `w` are grouped in panels of [`COLS`]; panel
//! `p` holds, for every block `b` of the inner dimension, one fixed-size record with the 8
//! rows' scales (f16, as in the file) and their quants interleaved 4 weights per row, so
//! that one 32-byte vector holds 4 consecutive weights of each of the 8 rows. Multiplying it
//! bytewise with 4 activations broadcast 8 times and summing each 4-byte group gives 8 lanes
//! = 8 outputs: no horizontal reductions, the scales apply lane-wise. The same record serves
//! one row (a GEMV that streams the weights once, in file-size bytes) and many (each record
//! is reused from L1 for every row tile).
//!
//! Kernels: AVX2 (+FMA, F16C) and a portable one, picked at run time ([`Isa::detect`]);
//! both compute the same integer sums, so they differ only in float rounding of the scale
//! products.

pub mod act;
pub mod blocks;
pub mod layout;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::out_ptr::{OutPtr, for_panel_ranges};
use act::QuantRows;
use blocks::{Q4Block, Q8Block};

/// Weights per block (and activation values per block).
pub const QK: usize = 32;
/// Output rows per panel.
pub const COLS: usize = 8;
/// Activation rows per register tile.
const MR: usize = 4;

/// How a [`QuantMatrix`] stores its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QFormat {
    /// 8-bit, one scale per block.
    Q8,
    /// 4-bit, a scale and an offset per block (Q4_1; Q4_0 is the offset `−8·scale`).
    Q4,
}

impl QFormat {
    /// Bytes of one panel record (8 rows × one block).
    pub const fn record_bytes(self) -> usize {
        match self {
            QFormat::Q8 => layout::Q8_RECORD,
            QFormat::Q4 => layout::Q4_RECORD,
        }
    }
}

/// A quantized `[n, k]` weight matrix in the panel layout (module note).
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    fmt: QFormat,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl QuantMatrix {
    /// Packs 4-bit blocks: `block(row, b)` is block `b` of weight row `row` (`k % QK == 0`).
    pub fn from_q4(n: usize, k: usize, block: impl Fn(usize, usize) -> Q4Block + Sync) -> Self {
        let data = layout::pack(QFormat::Q4, n, k, |rec, p, b| {
            let cols = std::array::from_fn(|c| {
                let row = p * COLS + c;
                if row < n {
                    block(row, b)
                } else {
                    Q4Block::ZERO
                }
            });
            layout::write_q4(rec, &cols);
        });
        Self {
            fmt: QFormat::Q4,
            n,
            k,
            data,
        }
    }

    /// Packs 8-bit blocks, as [`QuantMatrix::from_q4`].
    pub fn from_q8(n: usize, k: usize, block: impl Fn(usize, usize) -> Q8Block + Sync) -> Self {
        let data = layout::pack(QFormat::Q8, n, k, |rec, p, b| {
            let cols = std::array::from_fn(|c| {
                let row = p * COLS + c;
                if row < n {
                    block(row, b)
                } else {
                    Q8Block::ZERO
                }
            });
            layout::write_q8(rec, &cols);
        });
        Self {
            fmt: QFormat::Q8,
            n,
            k,
            data,
        }
    }

    /// The block format.
    pub fn format(&self) -> QFormat {
        self.fmt
    }

    /// Output width.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input width.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes read by one pass over the weights.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Bytes an `[n, k]` matrix takes once packed, without packing it.
    pub fn bytes_for(fmt: QFormat, n: usize, k: usize) -> usize {
        n.div_ceil(COLS) * (k / QK) * fmt.record_bytes()
    }

    /// `y = x · wᵀ`; `x: [m, k]`, `y: [m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        assert!(
            x.len() >= m * self.k && y.len() >= m * self.n,
            "matmul shapes"
        );
        if m == 0 || self.n == 0 {
            return;
        }
        let xq = QuantRows::quantize(x, m, self.k);
        self.matmul_quantized(Isa::detect(), &xq, m, y);
    }

    /// As [`QuantMatrix::matmul`] on already quantized rows, with a given kernel.
    fn matmul_quantized(&self, isa: Isa, xq: &QuantRows, m: usize, y: &mut [f32]) {
        for_panel_ranges(self.n.div_ceil(COLS), m, y, |p0, p1, out| {
            self.run_panels(isa, xq, m, p0, p1, out)
        });
    }

    /// Output columns of panels `p0..p1` for all `m` rows into `out` (`[m, n]`).
    fn run_panels(&self, isa: Isa, xq: &QuantRows, m: usize, p0: usize, p1: usize, out: OutPtr) {
        let (k, nb) = (self.k, self.k / QK);
        let rec = self.fmt.record_bytes();
        for p in p0..p1 {
            let panel = &self.data[p * nb * rec..(p + 1) * nb * rec];
            let cols = COLS.min(self.n - p * COLS);
            let mut r0 = 0;
            while r0 < m {
                let rows = MR.min(m - r0);
                let view = RowsView {
                    q: &xq.q[r0 * k..(r0 + rows) * k],
                    d: &xq.d[r0 * nb..(r0 + rows) * nb],
                    s: &xq.s[r0 * nb..(r0 + rows) * nb],
                    k,
                    rows,
                };
                let mut tile = [[0f32; COLS]; MR];
                match (isa, self.fmt) {
                    #[cfg(target_arch = "x86_64")]
                    (Isa::Avx2, QFormat::Q4) => x86::q4_tile(panel, &view, &mut tile),
                    #[cfg(target_arch = "x86_64")]
                    (Isa::Avx2, QFormat::Q8) => x86::q8_tile(panel, &view, &mut tile),
                    (_, QFormat::Q4) => portable::q4_tile(panel, &view, &mut tile),
                    (_, QFormat::Q8) => portable::q8_tile(panel, &view, &mut tile),
                }
                for (r, t) in tile.iter().enumerate().take(rows) {
                    out.write((r0 + r) * self.n + p * COLS, &t[..cols]);
                }
                r0 += rows;
            }
        }
    }
}

/// Up to [`MR`] quantized activation rows, as a kernel reads them.
pub(crate) struct RowsView<'a> {
    /// `rows·k` quants.
    pub q: &'a [i8],
    /// `rows·k/QK` scales.
    pub d: &'a [f32],
    /// `rows·k/QK` block sums.
    pub s: &'a [f32],
    /// Values per row.
    pub k: usize,
    /// Rows (1..=MR).
    pub rows: usize,
}

/// Kernel family, detected once per call (the check is a cached atomic load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Avx2,
    Portable,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}

#[cfg(test)]
mod tests;
