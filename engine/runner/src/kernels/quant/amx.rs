//! AMX int8 kernels for batches: one tile instruction multiplies up to 16 activation rows by
//! a panel pair (16 output rows) over one 32-weight block, `16 × 16 × 32` multiply-adds that
//! AVX-512 VNNI spends 128 `vpdpbusd` on.
//!
//! Per block of a row tile:
//! - tile A: the rows' int8 quants of the block, read in place from [`RowsView`] (stride `k`);
//! - tile B: the pair's 8 groups of 4 weights, one 64-byte tile row per group (panel `a`'s
//!   32 bytes, then panel `b`'s), copied from the two records (4-bit: the nibbles split to
//!   bytes) into a 512-byte buffer: the same group layout as the records (module note of
//!   [`super::layout`]), which is the layout `tdpb**d` takes;
//! - `tdpbssd` (8-bit weights, signed × signed) or `tdpbsud` (4-bit, signed × unsigned): the
//!   block's exact i32 sums for 16 × 16 outputs, stored and scaled with AVX-512 as the VNNI
//!   pair kernels scale theirs (same float operations, so the results are bit-identical).
//!
//! The tiles need the OS's permission (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`, asked
//! once per process: [`usable`]); a refusal means the VNNI kernels run instead. The tiles
//! are configured by the first call of a panel range (and again only when the row count
//! changes) and released when its [`Scratch`] drops at the range's end, so no tile state is
//! live between ranges (a thread switch between them saves no tile data). `ldtilecfg` per
//! call had been 22% of the kernel's time at batch 32.
//!
//! Invariants: entered only when [`usable`] and the AVX-512 VNNI features hold; the safe
//! wrappers assert every length the pointer arithmetic relies on. The i32 sums cannot
//! overflow (a block's is within `32 · 128 · 127`).

#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register tiles read clearest as indexed arrays

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::layout::{Q8_QUANTS, Q8_RECORD, q4_record};
use super::vnni::PAIR;
use super::{COLS, QK, RowsView};

/// Activation rows per tile (the most a tile holds).
pub(super) const AMX_MR: usize = 16;

/// Whether the CPU has AMX tiles with int8 products and the OS lets this process use them.
pub(super) fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        // CPUID.(EAX=7, ECX=0):EDX bit 24 = AMX-TILE, bit 25 = AMX-INT8.
        let edx = __cpuid_count(7, 0).edx;
        if edx & (1 << 24) == 0 || edx & (1 << 25) == 0 {
            return false;
        }
        let granted = request_tile_permission();
        if !granted {
            tracing::warn!(
                "the CPU has AMX but the OS refused this process the tile state \
                 (arch_prctl ARCH_REQ_XCOMP_PERM); the AMX kernels are not used"
            );
        }
        granted
    })
}

/// Asks Linux for the dynamically enabled tile-data state (kernel 5.16 and later).
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permissions.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// The 64-byte operand of `ldtilecfg` (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row of each tile.
    colsb: [u16; 16],
    /// Rows of each tile.
    rows: [u8; 16],
}

impl TileConfig {
    /// tmm0 = C (`rows` × 16 i32), tmm1 = A (`rows` × one block of int8), tmm2 = B (8 groups
    /// × 16 outputs × 4 bytes); tmm3..5 likewise.
    fn for_rows(rows: usize) -> Self {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let rows = rows as u8;
        (c.colsb[0], c.rows[0]) = (64, rows);
        (c.colsb[1], c.rows[1]) = (QK as u16, rows);
        (c.colsb[2], c.rows[2]) = (64, 8);
        // tmm3..tmm5: the same again, for a second block in flight.
        for t in 0..3 {
            (c.colsb[t + 3], c.rows[t + 3]) = (c.colsb[t], c.rows[t]);
        }
        c
    }
}

/// A 64-byte aligned buffer a tile is loaded from or stored to.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// The buffers of the pair kernels, made once per panel range and reused by each call:
/// zeroing them per call (4 KiB) cost more than 3% of a batch-32 step.
pub(super) struct Scratch {
    /// Tile B of every block of the panel pair being multiplied ([`unpack_pair`]).
    wbuf: Vec<Aligned<[u8; 512]>>,
    /// Which pair `wbuf` holds: its first panel's address and block count.
    unpacked: Option<(usize, usize)>,
    /// The two blocks' i32 sums, as stored from the C tiles.
    c: Aligned<[[[i32; 16]; AMX_MR]; 2]>,
    /// The call's result: rows `0..rows` of the tile, 16 outputs each.
    pub tile: [[f32; PAIR]; AMX_MR],
    /// The row count the tiles are configured for on this thread, once configured.
    configured: Option<usize>,
    /// Tile configuration is per thread: the scratch must be dropped where it was used.
    not_send: std::marker::PhantomData<*const ()>,
}

impl Scratch {
    /// Buffers for one panel range, on the thread that runs it (it is not `Send`).
    pub(super) fn new() -> Self {
        Scratch {
            wbuf: Vec::new(),
            unpacked: None,
            c: Aligned([[[0; 16]; AMX_MR]; 2]),
            tile: [[0.0; PAIR]; AMX_MR],
            configured: None,
            not_send: std::marker::PhantomData,
        }
    }

    /// Configures the tiles for `rows` rows unless they are already.
    ///
    /// # Safety
    /// The caller has checked [`usable`].
    #[inline(always)]
    unsafe fn configure_for(&mut self, rows: usize) {
        if self.configured != Some(rows) {
            // SAFETY: the caller checked `usable`; a palette-1 configuration.
            unsafe { configure(&TileConfig::for_rows(rows)) };
            self.configured = Some(rows);
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.configured.is_some() {
            // SAFETY: the tiles were configured on this thread (`Scratch` is not `Send`).
            unsafe { release() }
        }
    }
}

/// 4-bit panels `a` and `b` × up to [`AMX_MR`] rows, records with `offsets` (Q4_1) or
/// without (Q4_0, offset `−8·d`).
pub(super) fn q4_pair(a: &[u8], b: &[u8], x: &RowsView<'_>, s: &mut Scratch, offsets: bool) {
    x.check(&[a, b], q4_record(offsets).0, AMX_MR);
    // SAFETY: `usable` and the VNNI features checked by the caller; lengths asserted above.
    unsafe {
        by_rows!(
            [16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
            x.rows,
            q4x2 { offsets },
            (a, b, x, s)
        )
    }
}

/// 8-bit panels `a` and `b` × up to [`AMX_MR`] rows.
pub(super) fn q8_pair(a: &[u8], b: &[u8], x: &RowsView<'_>, s: &mut Scratch) {
    x.check(&[a, b], Q8_RECORD, AMX_MR);
    // SAFETY: as in q4_pair.
    unsafe {
        by_rows!(
            [16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
            x.rows,
            q8x2,
            (a, b, x, s)
        )
    }
}

/// Bytes `at..at + 32` of records `a` and `b`, as the low and high halves of one vector.
#[inline(always)]
unsafe fn join(a: *const u8, b: *const u8, at: usize) -> __m512i {
    // SAFETY: the caller passes records with 32 readable bytes at `at`.
    unsafe {
        let lo = _mm256_loadu_si256(a.add(at) as *const __m256i);
        let hi = _mm256_loadu_si256(b.add(at) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// The 8 f16 values at `at` of records `a` and `b`, as 16 floats.
#[inline(always)]
unsafe fn scales(a: *const u8, b: *const u8, at: usize) -> __m512 {
    // SAFETY: the caller passes records with 16 readable bytes at `at`.
    unsafe {
        let lo = _mm_loadu_si128(a.add(at) as *const __m128i);
        let hi = _mm_loadu_si128(b.add(at) as *const __m128i);
        _mm512_cvtph_ps(_mm256_set_m128i(hi, lo))
    }
}

/// Two blocks' products, in two sets of tiles so that the second does not wait on the
/// first: `c[i] = A_i · B_i` with A_i the `rows` quants at `a[i]` (stride `k`) and B_i
/// `w[i]`; 8-bit weights are signed (`tdpbssd`), 4-bit ones unsigned (`tdpbsud`).
#[inline(always)]
unsafe fn two_block_products(
    signed: bool,
    a: [*const i8; 2],
    k: usize,
    w: [&[u8; 512]; 2],
    c: &mut [[[i32; 16]; AMX_MR]; 2],
) {
    macro_rules! products {
        ($tdp:literal) => {
            asm!(
                "tilezero tmm0",
                "tilezero tmm3",
                "tileloadd tmm1, [{a0} + {k}*1]",
                "tileloadd tmm2, [{b0} + {s}*1]",
                "tileloadd tmm4, [{a1} + {k}*1]",
                "tileloadd tmm5, [{b1} + {s}*1]",
                concat!($tdp, " tmm0, tmm1, tmm2"),
                concat!($tdp, " tmm3, tmm4, tmm5"),
                "tilestored [{c0} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm3",
                a0 = in(reg) a[0], a1 = in(reg) a[1], k = in(reg) k,
                b0 = in(reg) w[0].as_ptr(), b1 = in(reg) w[1].as_ptr(), s = in(reg) 64usize,
                c0 = in(reg) c[0].as_mut_ptr(), c1 = in(reg) c[1].as_mut_ptr(),
                options(nostack),
            )
        };
    }
    // SAFETY: the tiles were configured by the caller for its row count; each `a[i]` has that
    // many rows of 32 readable bytes at stride `k`; `w` and `c` are 64-byte rows as configured.
    unsafe {
        if signed {
            products!("tdpbssd")
        } else {
            products!("tdpbsud")
        }
    }
}

/// One block's products, as [`two_block_products`] for the first set of tiles only.
#[inline(always)]
unsafe fn one_block_product(
    signed: bool,
    a: *const i8,
    k: usize,
    w: &[u8; 512],
    c: &mut [[i32; 16]; AMX_MR],
) {
    macro_rules! product {
        ($tdp:literal) => {
            asm!(
                "tilezero tmm0",
                "tileloadd tmm1, [{a} + {k}*1]",
                "tileloadd tmm2, [{b} + {s}*1]",
                concat!($tdp, " tmm0, tmm1, tmm2"),
                "tilestored [{c} + {s}*1], tmm0",
                a = in(reg) a, k = in(reg) k, b = in(reg) w.as_ptr(), s = in(reg) 64usize,
                c = in(reg) c.as_mut_ptr(), options(nostack),
            )
        };
    }
    // SAFETY: as in two_block_products.
    unsafe {
        if signed {
            product!("tdpbssd")
        } else {
            product!("tdpbsud")
        }
    }
}

/// Loads the tile configuration for `rows` rows.
#[inline(always)]
unsafe fn configure(cfg: &TileConfig) {
    // SAFETY: a valid palette-1 configuration; the caller has the tile permission.
    unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg as *const TileConfig, options(nostack, readonly)) }
}

/// Releases the tiles (their state is not saved on a thread switch afterwards).
#[inline(always)]
unsafe fn release() {
    // SAFETY: tilerelease has no operands and is valid after ldtilecfg.
    unsafe { asm!("tilerelease", options(nostack, nomem)) }
}

/// Tile B of one block: the 8 groups of records `ra` and `rb` as 64-byte rows (4-bit
/// records: the nibbles split to bytes).
#[inline(always)]
unsafe fn weights<const Q4: bool, const OFS: bool>(
    ra: *const u8,
    rb: *const u8,
    w: &mut [u8; 512],
) {
    // SAFETY: the caller passes whole records; `w` is 64-byte aligned.
    unsafe {
        let w = w.as_mut_ptr();
        if Q4 {
            let quants = q4_record(OFS).1;
            let mask = _mm512_set1_epi8(0x0f);
            for j in 0..4 {
                let v = join(ra, rb, quants + 32 * j);
                let lo = _mm512_and_si512(v, mask);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
                _mm512_store_si512(w.add(64 * j) as *mut __m512i, lo);
                _mm512_store_si512(w.add(64 * (j + 4)) as *mut __m512i, hi);
            }
        } else {
            for g in 0..8 {
                let v = join(ra, rb, Q8_QUANTS + 32 * g);
                _mm512_store_si512(w.add(64 * g) as *mut __m512i, v);
            }
        }
    }
}

/// Adds block `b`'s scaled sums `c` to the rows' accumulators, as the VNNI pair kernels do:
/// `acc += Σ · (d_w · d_a)`, then for 4-bit weights `acc += m_w · s_a`.
#[inline(always)]
unsafe fn scale_into<const R: usize, const Q4: bool, const OFS: bool>(
    acc: &mut [__m512; R],
    c: &[[i32; 16]; AMX_MR],
    ra: *const u8,
    rb: *const u8,
    x: &RowsView<'_>,
    b: usize,
) {
    let nb = x.k / QK;
    // SAFETY: whole records at `ra`/`rb`; `b < nb` and R rows of scales (the wrapper's check).
    unsafe {
        let d = scales(ra, rb, 0);
        let m = match (Q4, OFS) {
            (true, true) => scales(ra, rb, 2 * COLS),
            _ => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
        };
        for r in 0..R {
            let si = _mm512_cvtepi32_ps(_mm512_load_si512(c[r].as_ptr() as *const __m512i));
            let da = _mm512_set1_ps(*x.d.get_unchecked(r * nb + b));
            acc[r] = _mm512_fmadd_ps(si, _mm512_mul_ps(d, da), acc[r]);
            if Q4 {
                let sa = _mm512_set1_ps(*x.s.get_unchecked(r * nb + b));
                acc[r] = _mm512_fmadd_ps(m, sa, acc[r]);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
fn q4x2<const R: usize, const OFS: bool>(pa: &[u8], pb: &[u8], x: &RowsView<'_>, s: &mut Scratch) {
    pair::<R, true, OFS>(pa, pb, x, s)
}

#[target_feature(enable = "avx512f,avx512bw,avx2,f16c,fma")]
fn q8x2<const R: usize>(pa: &[u8], pb: &[u8], x: &RowsView<'_>, s: &mut Scratch) {
    pair::<R, false, false>(pa, pb, x, s)
}

/// Tile B of every block of panels `a` and `b` (4-bit with `offsets` or without, or 8-bit),
/// unpacked once into `s` for all the row tiles [`q4_pair`] or [`q8_pair`] then multiply
/// by them. Unpacked per call, the tile loads waited on the vector stores just made (16%
/// of the kernel at batch 32 on one `tileloadd`), and a batch of 32 rows unpacked each
/// block twice.
pub(super) fn unpack_pair(a: &[u8], b: &[u8], q4: bool, offsets: bool, k: usize, s: &mut Scratch) {
    let nb = k / QK;
    let record = if q4 { q4_record(offsets).0 } else { Q8_RECORD };
    assert!(k.is_multiple_of(QK) && a.len() >= nb * record && b.len() >= nb * record);
    if s.wbuf.len() < nb {
        s.wbuf.resize_with(nb, || Aligned([0; 512]));
    }
    // SAFETY: the caller checked `usable` (so AVX-512 F/BW); lengths asserted above.
    unsafe {
        match (q4, offsets) {
            (true, true) => unpack::<true, true>(a, b, nb, &mut s.wbuf),
            (true, false) => unpack::<true, false>(a, b, nb, &mut s.wbuf),
            (false, _) => unpack::<false, false>(a, b, nb, &mut s.wbuf),
        }
    }
    s.unpacked = Some((a.as_ptr() as usize, nb));
}

#[target_feature(enable = "avx512f,avx512bw")]
fn unpack<const Q4: bool, const OFS: bool>(
    a: &[u8],
    b: &[u8],
    nb: usize,
    wbuf: &mut [Aligned<[u8; 512]>],
) {
    let record = if Q4 { q4_record(OFS).0 } else { Q8_RECORD };
    for (blk, w) in wbuf[..nb].iter_mut().enumerate() {
        // SAFETY: nb whole records in each panel (asserted by `unpack_pair`).
        unsafe {
            weights::<Q4, OFS>(
                a.as_ptr().add(blk * record),
                b.as_ptr().add(blk * record),
                &mut w.0,
            )
        }
    }
}

/// Panels `pa` and `pb` × R rows: blocks two at a time (two sets of tiles in flight), then
/// a last one when the count is odd.
#[inline(always)]
fn pair<const R: usize, const Q4: bool, const OFS: bool>(
    pa: &[u8],
    pb: &[u8],
    x: &RowsView<'_>,
    s: &mut Scratch,
) {
    let nb = x.k / QK;
    let record = if Q4 { q4_record(OFS).0 } else { Q8_RECORD };
    // SAFETY: entered after `usable` (the wrappers' callers check it).
    unsafe { s.configure_for(R) };
    let Scratch {
        wbuf,
        unpacked,
        c,
        tile,
        ..
    } = s;
    assert!(*unpacked == Some((pa.as_ptr() as usize, nb)) && wbuf.len() >= nb);
    // SAFETY: R ≤ rows rows of k quants and nb scales, nb records in each panel (asserted by
    // the wrapper); every offset below stays inside those. Entered from a function with the
    // AVX-512 features enabled, after `usable`.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        let rec = |b: usize| (pa.as_ptr().add(b * record), pb.as_ptr().add(b * record));
        let act = |b: usize| x.q.as_ptr().add(b * QK);
        let mut b = 0;
        while b + 1 < nb {
            let ((a0, b0), (a1, b1)) = (rec(b), rec(b + 1));
            let w = [&wbuf.get_unchecked(b).0, &wbuf.get_unchecked(b + 1).0];
            two_block_products(!Q4, [act(b), act(b + 1)], x.k, w, &mut c.0);
            scale_into::<R, Q4, OFS>(&mut acc, &c.0[0], a0, b0, x, b);
            scale_into::<R, Q4, OFS>(&mut acc, &c.0[1], a1, b1, x, b + 1);
            b += 2;
        }
        if b < nb {
            let (a0, b0) = rec(b);
            one_block_product(!Q4, act(b), x.k, &wbuf.get_unchecked(b).0, &mut c.0[0]);
            scale_into::<R, Q4, OFS>(&mut acc, &c.0[0], a0, b0, x, b);
        }
        for r in 0..R {
            _mm512_storeu_ps(tile[r].as_mut_ptr(), acc[r]);
        }
    }
}
