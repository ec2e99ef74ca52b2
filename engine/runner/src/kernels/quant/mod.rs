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
//! Kernels ([`Isa`]): AMX int8 tiles for batches of [`AMX_MIN_ROWS`] rows or more, AVX-512
//! VNNI (two panels per 512-bit vector), AVX-VNNI (256-bit),
//! AVX2 (+FMA, F16C) and a portable one. The best the CPU has is picked once per process
//! ([`Isa::selected`]) after a start-up check against the portable kernel ([`select`]). All
//! compute the same integer sums, so they differ only in float rounding of the scale
//! products.

/// In the SIMD kernels' safe wrappers: calls `$f::<R>` (or `$f::<R, OFS>` for the 4-bit
/// kernels, `{ofs}`) for the tile's row count `R`, one of the listed ones (the first for
/// anything else).
#[cfg(target_arch = "x86_64")]
macro_rules! by_rows {
    ([$first:literal $(, $n:literal)*], $rows:expr, $f:ident, $args:tt) => {
        match $rows {
            $($n => $f::<$n> $args,)*
            _ => $f::<$first> $args,
        }
    };
    ([$first:literal $(, $n:literal)*], $rows:expr, $f:ident {$ofs:expr}, $args:tt) => {
        match ($rows, $ofs) {
            $(($n, true) => $f::<$n, true> $args,)*
            $(($n, false) => $f::<$n, false> $args,)*
            (_, true) => $f::<$first, true> $args,
            (_, false) => $f::<$first, false> $args,
        }
    };
}

pub mod act;
#[cfg(target_arch = "x86_64")]
mod amx;
pub mod blocks;
pub mod layout;
mod portable;
mod select;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod x86;

use select::Panel;
pub use select::{Isa, SelfCheckError, set_cap};

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
    /// 4-bit, a scale and an offset per block (Q4_1).
    Q4,
    /// 4-bit, a scale per block and the offset `−8·scale` (Q4_0): the offset is not stored.
    Q4Sym,
}

impl QFormat {
    /// Bytes of one panel record (8 rows × one block).
    pub const fn record_bytes(self) -> usize {
        match self {
            QFormat::Q8 => layout::Q8_RECORD,
            QFormat::Q4 => layout::Q4_RECORD,
            QFormat::Q4Sym => layout::Q4S_RECORD,
        }
    }

    /// Whether a 4-bit record stores its offsets (Q4_1) rather than implying them (Q4_0).
    fn offsets(self) -> bool {
        self != QFormat::Q4Sym
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
        Self::pack_q4(QFormat::Q4, n, k, block)
    }

    /// Packs Q4_0 blocks (each offset `−8·d`, as [`Q4Block::from_q4_0`] and
    /// [`Q4Block::quantize_q4_0`] make them) without their offsets: the file's 18/32 bytes.
    pub fn from_q4_0(n: usize, k: usize, block: impl Fn(usize, usize) -> Q4Block + Sync) -> Self {
        Self::pack_q4(QFormat::Q4Sym, n, k, block)
    }

    fn pack_q4(
        fmt: QFormat,
        n: usize,
        k: usize,
        block: impl Fn(usize, usize) -> Q4Block + Sync,
    ) -> Self {
        let data = layout::pack(fmt, n, k, |rec, p, b| {
            let cols = std::array::from_fn(|c| {
                let row = p * COLS + c;
                if row < n {
                    block(row, b)
                } else {
                    Q4Block::ZERO
                }
            });
            layout::write_q4(rec, &cols, fmt.offsets());
        });
        Self { fmt, n, k, data }
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
        self.matmul_quantized(Isa::selected(), &xq, m, y);
    }

    /// As [`QuantMatrix::matmul`] on already quantized rows, with a given kernel (which the
    /// CPU must have: [`Isa::available`]).
    pub(crate) fn matmul_quantized(&self, isa: Isa, xq: &QuantRows, m: usize, y: &mut [f32]) {
        assert!(isa.available(), "{isa:?} kernels on a CPU without them");
        let align = if pairs(isa, m) { 2 } else { 1 };
        for_panel_ranges(self.n.div_ceil(COLS), align, m, y, |p0, p1, out| {
            self.run_panels(isa, xq, m, p0, p1, out)
        });
    }

    /// Output columns of panels `p0..p1` for all `m` rows into `out` (`[m, n]`): in pairs
    /// where the kernel takes two panels, one at a time otherwise.
    fn run_panels(&self, isa: Isa, xq: &QuantRows, m: usize, p0: usize, p1: usize, out: OutPtr) {
        let mut p = p0;
        #[cfg(target_arch = "x86_64")]
        let mut amx_scratch: Option<Box<amx::Scratch>> = None;
        while p < p1 {
            #[cfg(target_arch = "x86_64")]
            if pairs(isa, m) && p + 1 < p1 {
                if isa == Isa::Amx && m >= AMX_MIN_ROWS {
                    let s = amx_scratch.get_or_insert_with(|| Box::new(amx::Scratch::new()));
                    self.run_amx_pair(xq, m, p, out, s);
                } else {
                    self.run_pair(xq, m, p, out);
                }
                p += 2;
                continue;
            }
            self.run_panel(isa.one_panel(), xq, m, p, out);
            p += 1;
        }
    }

    /// Panel `p`'s bytes.
    fn panel(&self, p: usize) -> &[u8] {
        let len = (self.k / QK) * self.fmt.record_bytes();
        &self.data[p * len..(p + 1) * len]
    }

    /// Output columns of panel `p` for all `m` rows, with a one-panel kernel.
    fn run_panel(&self, kernel: Panel, xq: &QuantRows, m: usize, p: usize, out: OutPtr) {
        let panel = self.panel(p);
        let cols = COLS.min(self.n - p * COLS);
        for (r0, view) in RowsView::tiles(xq, m, MR) {
            let mut tile = [[0f32; COLS]; MR];
            match (kernel, self.fmt) {
                #[cfg(target_arch = "x86_64")]
                (Panel::Vnni256 { evex }, QFormat::Q4 | QFormat::Q4Sym) => {
                    vnni::q4_tile(panel, &view, &mut tile, self.fmt.offsets(), evex)
                }
                #[cfg(target_arch = "x86_64")]
                (Panel::Vnni256 { evex }, QFormat::Q8) => {
                    vnni::q8_tile(panel, &view, &mut tile, evex)
                }
                #[cfg(target_arch = "x86_64")]
                (Panel::Avx2, QFormat::Q4 | QFormat::Q4Sym) => {
                    x86::q4_tile(panel, &view, &mut tile, self.fmt.offsets())
                }
                #[cfg(target_arch = "x86_64")]
                (Panel::Avx2, QFormat::Q8) => x86::q8_tile(panel, &view, &mut tile),
                (_, QFormat::Q4 | QFormat::Q4Sym) => {
                    portable::q4_tile(panel, &view, &mut tile, self.fmt.offsets())
                }
                (_, QFormat::Q8) => portable::q8_tile(panel, &view, &mut tile),
            }
            for (r, t) in tile.iter().enumerate().take(view.rows) {
                out.write((r0 + r) * self.n + p * COLS, &t[..cols]);
            }
        }
    }

    /// `y = x · wᵀ` with one given one-panel kernel for every panel (the differential tests
    /// reach each encoding this way, whichever the CPU would pick).
    #[cfg(test)]
    fn matmul_one_panel(&self, kernel: Panel, xq: &QuantRows, m: usize, y: &mut [f32]) {
        let out = OutPtr::new(y);
        for p in 0..self.n.div_ceil(COLS) {
            self.run_panel(kernel, xq, m, p, out);
        }
    }

    /// Output columns of panels `p` and `p + 1` (both present) for all `m` rows, with the
    /// AVX-512 VNNI pair kernel.
    #[cfg(target_arch = "x86_64")]
    fn run_pair(&self, xq: &QuantRows, m: usize, p: usize, out: OutPtr) {
        let (a, b) = (self.panel(p), self.panel(p + 1));
        let cols = vnni::PAIR.min(self.n - p * COLS);
        for (r0, view) in RowsView::tiles(xq, m, vnni::PAIR_MR) {
            let mut tile = [[0f32; vnni::PAIR]; vnni::PAIR_MR];
            match self.fmt {
                QFormat::Q4 | QFormat::Q4Sym => {
                    vnni::q4_pair(a, b, &view, &mut tile, self.fmt.offsets())
                }
                QFormat::Q8 => vnni::q8_pair(a, b, &view, &mut tile),
            }
            for (r, t) in tile.iter().enumerate().take(view.rows) {
                out.write((r0 + r) * self.n + p * COLS, &t[..cols]);
            }
        }
    }
}

impl QuantMatrix {
    /// Output columns of panels `p` and `p + 1` (both present) for all `m` rows, with the AMX
    /// pair kernel (tiles of 16 rows).
    #[cfg(target_arch = "x86_64")]
    fn run_amx_pair(&self, xq: &QuantRows, m: usize, p: usize, out: OutPtr, s: &mut amx::Scratch) {
        let (a, b) = (self.panel(p), self.panel(p + 1));
        let cols = vnni::PAIR.min(self.n - p * COLS);
        let q4 = self.fmt != QFormat::Q8;
        amx::unpack_pair(a, b, q4, self.fmt.offsets(), self.k, s);
        for (r0, view) in RowsView::tiles(xq, m, amx::AMX_MR) {
            match self.fmt {
                QFormat::Q4 | QFormat::Q4Sym => amx::q4_pair(a, b, &view, s, self.fmt.offsets()),
                QFormat::Q8 => amx::q8_pair(a, b, &view, s),
            }
            for (r, t) in s.tile.iter().enumerate().take(view.rows) {
                out.write((r0 + r) * self.n + p * COLS, &t[..cols]);
            }
        }
    }
}

/// Rows from which the AMX kernels serve a batch: below, the tile's fixed cost (the
/// weights copied into a tile, the sums stored and reloaded) outweighs what it saves, and
/// the AVX-512 VNNI pair kernel runs. Measured (docs/engine-loop.md): AMX slower at 2 rows,
/// even at 3, ahead from 4.
pub(crate) const AMX_MIN_ROWS: usize = 4;

/// A tile of quantized activation rows (up to [`MR`], or the pair kernels' `PAIR_MR`), as a
/// kernel reads them.
pub(crate) struct RowsView<'a> {
    /// `rows·k` quants.
    pub q: &'a [i8],
    /// `rows·k/QK` scales.
    pub d: &'a [f32],
    /// `rows·k/QK` block sums.
    pub s: &'a [f32],
    /// Values per row.
    pub k: usize,
    /// Rows (1 up to the kernel's tile height).
    pub rows: usize,
}

/// Whether `isa` runs `m` rows on panel pairs: the AVX-512 VNNI and AMX pair kernels serve
/// batches; one row (a GEMV reads each weight once, nothing to share) goes one panel at a
/// time.
fn pairs(isa: Isa, m: usize) -> bool {
    matches!(isa, Isa::Amx | Isa::Avx512Vnni) && m > 1
}

impl<'a> RowsView<'a> {
    /// Asserts what the SIMD kernels' pointer arithmetic relies on: 1 to `max_rows` rows of
    /// `k` quants and `k / QK` scales, and at least `k / QK` records of `record` bytes in
    /// every panel.
    #[cfg(target_arch = "x86_64")]
    fn check(&self, panels: &[&[u8]], record: usize, max_rows: usize) {
        let (rows, nb) = (self.rows, self.k / QK);
        assert!((1..=max_rows).contains(&rows) && self.k.is_multiple_of(QK));
        assert!(panels.iter().all(|p| p.len() >= nb * record));
        assert!(
            self.q.len() >= rows * self.k && self.d.len() >= rows * nb && self.s.len() >= rows * nb
        );
    }

    /// The row tiles of `m` quantized rows: `(first row, view)` for up to `per_tile` rows each.
    fn tiles(
        xq: &'a QuantRows,
        m: usize,
        per_tile: usize,
    ) -> impl Iterator<Item = (usize, RowsView<'a>)> {
        let (k, nb) = (xq.k, xq.k / QK);
        (0..m).step_by(per_tile).map(move |r0| {
            let rows = per_tile.min(m - r0);
            let view = RowsView {
                q: &xq.q[r0 * k..(r0 + rows) * k],
                d: &xq.d[r0 * nb..(r0 + rows) * nb],
                s: &xq.s[r0 * nb..(r0 + rows) * nb],
                k,
                rows,
            };
            (r0, view)
        })
    }
}

#[cfg(test)]
mod tests;
