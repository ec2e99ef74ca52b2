//! The portable kernels: plain integer sums over the record layout, read back through
//! [`layout::q4_at`] / [`layout::q8_at`]. They are the reference the SIMD kernels are tested
//! against (the same integer sums; only the float products may round differently).

use half::f16;

use super::layout::{self, Q8_RECORD, q4_record};
use super::{COLS, MR, QK, RowsView};

/// `tile[r][c] = Σ_b d[c]·da[r,b]·Σ_t q[c,t]·qa[r,t] + m[c]·sa[r,b]` over a panel; `m` is
/// read from the record when it has `offsets`, else it is `−8·d` (Q4_0).
pub(super) fn q4_tile(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR], offsets: bool) {
    let nb = x.k / QK;
    let (record, quants) = q4_record(offsets);
    for (b, rec) in panel.chunks_exact(record).enumerate().take(nb) {
        for (r, out) in tile.iter_mut().enumerate().take(x.rows) {
            let qa = &x.q[r * x.k + b * QK..r * x.k + (b + 1) * QK];
            let (da, sa) = (x.d[r * nb + b], x.s[r * nb + b]);
            for (c, o) in out.iter_mut().enumerate() {
                let isum: i32 = (0..QK)
                    .map(|t| i32::from(layout::q4_at(rec, quants, c, t)) * i32::from(qa[t]))
                    .sum();
                let d = f16::from_bits(layout::f16_at(rec, 2 * c)).to_f32();
                let m = if offsets {
                    f16::from_bits(layout::f16_at(rec, 2 * COLS + 2 * c)).to_f32()
                } else {
                    -8.0 * d
                };
                *o += d * da * isum as f32 + m * sa;
            }
        }
    }
}

/// `tile[r][c] = Σ_b d[c]·da[r,b]·Σ_t q[c,t]·qa[r,t]` over a panel.
pub(super) fn q8_tile(panel: &[u8], x: &RowsView<'_>, tile: &mut [[f32; COLS]; MR]) {
    let nb = x.k / QK;
    for (b, rec) in panel.chunks_exact(Q8_RECORD).enumerate().take(nb) {
        for (r, out) in tile.iter_mut().enumerate().take(x.rows) {
            let qa = &x.q[r * x.k + b * QK..r * x.k + (b + 1) * QK];
            let da = x.d[r * nb + b];
            for (c, o) in out.iter_mut().enumerate() {
                let isum: i32 = (0..QK)
                    .map(|t| i32::from(layout::q8_at(rec, c, t)) * i32::from(qa[t]))
                    .sum();
                let d = f16::from_bits(layout::f16_at(rec, 2 * c)).to_f32();
                *o += d * da * isum as f32;
            }
        }
    }
}
