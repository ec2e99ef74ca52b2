//! The panel record: one block (32 weights along `k`) of [`COLS`] = 8 output rows.
//!
//! - 8-bit record ([`Q8_RECORD`] = 272 bytes): `d[8]` f16 (16 bytes), then 8 groups of
//!   32 bytes; byte `i` of group `g` is weight `4g + i%4` of row `i/4`.
//! - 4-bit record ([`Q4_RECORD`] = 160 bytes): `d[8]` f16, `m[8]` f16, then 4 × 32 bytes;
//!   byte `i` of vector `j` holds group `j` in its low nibble and group `j + 4` in its high
//!   nibble, groups laid out as in the 8-bit record.
//! - 4-bit record without offsets ([`Q4S_RECORD`] = 144 bytes, Q4_0): `d[8]` f16, then the
//!   quants as in the 4-bit record; the offset is `−8·d`, computed, not stored.
//!
//! Each is exactly the file's bytes per weight (Q8_0: 34/32, Q4_1: 20/32, Q4_0: 18/32).

use rayon::prelude::*;

use super::blocks::{Q4Block, Q8Block};
use super::{COLS, QFormat, QK};

/// Bytes of an 8-bit record.
pub const Q8_RECORD: usize = 2 * COLS + COLS * QK;
/// Bytes of a 4-bit record.
pub const Q4_RECORD: usize = 4 * COLS + COLS * QK / 2;
/// Where the quants start in a 4-bit record.
pub const Q4_QUANTS: usize = 4 * COLS;
/// Bytes of a 4-bit record without offsets (Q4_0).
pub const Q4S_RECORD: usize = 2 * COLS + COLS * QK / 2;
/// Where the quants start in a 4-bit record without offsets.
pub const Q4S_QUANTS: usize = 2 * COLS;
/// A 4-bit record's size and where its quants start, with offsets (Q4_1) or without (Q4_0).
pub const fn q4_record(offsets: bool) -> (usize, usize) {
    if offsets {
        (Q4_RECORD, Q4_QUANTS)
    } else {
        (Q4S_RECORD, Q4S_QUANTS)
    }
}
/// Where the quants start in an 8-bit record.
pub const Q8_QUANTS: usize = 2 * COLS;

/// Allocates a packed `[n, k]` matrix and fills record `(p, b)` with `fill(record, p, b)`.
pub fn pack(
    fmt: QFormat,
    n: usize,
    k: usize,
    fill: impl Fn(&mut [u8], usize, usize) + Sync,
) -> Vec<u8> {
    assert!(k.is_multiple_of(QK), "k = {k} is not a multiple of {QK}");
    let (nb, rec) = (k / QK, fmt.record_bytes());
    let mut data = crate::kernels::huge_pages::zeroed::<u8>(n.div_ceil(COLS) * nb * rec);
    if nb == 0 {
        return data;
    }
    data.par_chunks_mut(nb * rec)
        .enumerate()
        .for_each(|(p, panel)| {
            for (b, r) in panel.chunks_exact_mut(rec).enumerate() {
                fill(r, p, b);
            }
        });
    data
}

/// Row `c` and in-block index `t` of byte `i` of group `g` (see the module note).
fn source(g: usize, i: usize) -> (usize, usize) {
    (i / 4, 4 * g + i % 4)
}

/// Writes the 4-bit record of 8 rows' blocks, with their offsets (`Q4_RECORD`) or without
/// (`Q4S_RECORD`, where every block's offset must be `−8·d`).
pub fn write_q4(rec: &mut [u8], cols: &[Q4Block; COLS], offsets: bool) {
    let quants = q4_record(offsets).1;
    for (c, b) in cols.iter().enumerate() {
        rec[2 * c..2 * c + 2].copy_from_slice(&b.d.to_le_bytes());
        if offsets {
            rec[2 * COLS + 2 * c..2 * COLS + 2 * c + 2].copy_from_slice(&b.m.to_le_bytes());
        }
    }
    for g in 0..8 {
        for i in 0..32 {
            let (c, t) = source(g, i);
            let byte = &mut rec[quants + 32 * (g % 4) + i];
            let v = cols[c].q[t] & 0x0f;
            *byte |= if g < 4 { v } else { v << 4 };
        }
    }
}

/// Writes the 8-bit record of 8 rows' blocks.
pub fn write_q8(rec: &mut [u8], cols: &[Q8Block; COLS]) {
    for (c, b) in cols.iter().enumerate() {
        rec[2 * c..2 * c + 2].copy_from_slice(&b.d.to_le_bytes());
    }
    for g in 0..8 {
        for i in 0..32 {
            let (c, t) = source(g, i);
            rec[Q8_QUANTS + 32 * g + i] = cols[c].q[t] as u8;
        }
    }
}

/// The 4-bit quant of row `c`, in-block index `t`, read back from a record whose quants
/// start at `quants` ([`Q4_QUANTS`] or [`Q4S_QUANTS`]).
pub fn q4_at(rec: &[u8], quants: usize, c: usize, t: usize) -> u8 {
    let (g, i) = (t / 4, 4 * c + t % 4);
    let byte = rec[quants + 32 * (g % 4) + i];
    if g < 4 { byte & 0x0f } else { byte >> 4 }
}

/// The 8-bit quant of row `c`, in-block index `t`, read back from a record.
pub fn q8_at(rec: &[u8], c: usize, t: usize) -> i8 {
    let (g, i) = (t / 4, 4 * c + t % 4);
    rec[Q8_QUANTS + 32 * g + i] as i8
}

/// The f16 bits at `rec[at..at + 2]`.
pub fn f16_at(rec: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([rec[at], rec[at + 1]])
}
