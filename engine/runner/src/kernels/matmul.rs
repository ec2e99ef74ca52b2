//! `y[m, n] = x[m, k] · wᵀ` with the weight `w: [n, k]` repacked once at load into panels of
//! [`NR`] output columns: panel `p` holds `w[p·NR + j][t]` at `p·k·NR + t·NR + j` (rows past
//! `n` are zero). The kernel is an outer product: for each `t` it loads the panel's `NR`
//! weights (contiguous) and broadcasts `x[r][t]` for a tile of up to `MR` rows, keeping the
//! `MR × NR` sums in vector registers; no horizontal reductions. One layout serves both
//! cases: with one row it is a GEMV streaming the weights sequentially (bandwidth bound);
//! with many rows each panel is reused from cache for every row tile (compute bound).
//! Panels are split across the compute team. AVX-512 and AVX2+FMA paths are picked at run
//! time, a portable one otherwise; results differ from a naive sum only by reassociation.
//!
//! Panels hold f32, or bf16 (`pack_bf16`: half the bytes a batch-1 step streams). bf16
//! weights are widened to f32 in registers and multiplied in f32 by the same kernels, so a
//! bf16 matrix gives exactly the f32 result on its widened weights; the activations are
//! never rounded (which `vdpbf16ps` and AMX-BF16 would do).

use super::out_ptr::{OutPtr, for_panel_ranges};
use super::width::Width;

/// Output columns per panel.
pub const NR: usize = 32;
/// Rows per register tile (AVX-512: 12 × 2 accumulators of 16 lanes, 24 of 32 registers).
const MR: usize = 12;
/// Inner-dimension slice: `KC · NR` floats of a panel (16 KiB) stay in L1 across row tiles.
const KC: usize = 128;

/// A weight matrix `[n, k]` in the panel layout described in the module note.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    data: Panels,
    n: usize,
    k: usize,
}

/// The panels' element type.
#[derive(Debug, Clone)]
enum Panels {
    F32(Vec<f32>),
    /// The upper 16 bits of each f32 (bf16), rounded to nearest even.
    Bf16(Vec<u16>),
}

/// `v` rounded to bf16 (nearest, ties to even; NaN stays a quiet NaN).
pub fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 a bf16 value stands for (exact).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Panels of `w: [n, k]` (row-major) as `conv` of each weight; rows past `n` are zero.
fn panels<E: Copy + Default>(w: &[f32], n: usize, k: usize, conv: impl Fn(f32) -> E) -> Vec<E> {
    debug_assert_eq!(w.len(), n * k);
    let mut data = super::huge_pages::zeroed::<E>(n.div_ceil(NR) * k * NR);
    for (o, row) in w.chunks_exact(k).enumerate().take(n) {
        let (p, j) = (o / NR, o % NR);
        let base = p * k * NR + j;
        for (t, v) in row.iter().enumerate() {
            data[base + t * NR] = conv(*v);
        }
    }
    data
}

impl PackedMatrix {
    /// Repacks a row-major `[n, k]` matrix.
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        let data = Panels::F32(panels(w, n, k, |v| v));
        Self { data, n, k }
    }

    /// Repacks a row-major `[n, k]` matrix in bf16 (each weight rounded to nearest even;
    /// exact for weights that came from bf16).
    pub fn pack_bf16(w: &[f32], n: usize, k: usize) -> Self {
        let data = Panels::Bf16(panels(w, n, k, bf16_bits));
        Self { data, n, k }
    }

    /// Whether the panels hold bf16.
    pub fn is_bf16(&self) -> bool {
        matches!(self.data, Panels::Bf16(_))
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
        match &self.data {
            Panels::F32(d) => d.len() * 4,
            Panels::Bf16(d) => d.len() * 2,
        }
    }

    /// Bytes an `[n, k]` matrix takes once packed (whole panels), without packing it.
    pub fn bytes_for(n: usize, k: usize) -> usize {
        n.div_ceil(NR) * k * NR * 4
    }

    /// As [`Self::bytes_for`], packed in bf16.
    pub fn bytes_for_bf16(n: usize, k: usize) -> usize {
        Self::bytes_for(n, k) / 2
    }

    /// `y = x · wᵀ`; `x: [m, k]`, `y: [m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert!(x.len() >= m * k && y.len() >= m * n, "matmul shapes");
        if m == 0 || n == 0 {
            return;
        }
        self.matmul_with(Width::selected(), x, m, y);
    }

    fn matmul_with(&self, width: Width, x: &[f32], m: usize, y: &mut [f32]) {
        match &self.data {
            Panels::F32(d) => self.matmul_panels(d, width, x, m, y),
            Panels::Bf16(d) => self.matmul_panels(d, width, x, m, y),
        }
    }

    fn matmul_panels<E: PanelElem>(
        &self,
        data: &[E],
        width: Width,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) {
        for_panel_ranges(self.n.div_ceil(NR), 1, m, y, |p0, p1, out| {
            self.run_panels(data, width, x, m, p0, p1, out)
        });
    }

    /// Computes output columns of panels `p0..p1` for all `m` rows into `out` (`[m, n]`).
    #[allow(clippy::too_many_arguments)]
    fn run_panels<E: PanelElem>(
        &self,
        data: &[E],
        width: Width,
        x: &[f32],
        m: usize,
        p0: usize,
        p1: usize,
        out: OutPtr,
    ) {
        let k = self.k;
        let row_tiles = m.div_ceil(MR);
        let mut tiles = vec![[0f32; MR * NR]; row_tiles];
        for p in p0..p1 {
            let panel = &data[p * k * NR..(p + 1) * k * NR];
            let cols = NR.min(self.n - p * NR);
            // k is walked in slices of KC so the panel slice stays in L1 while every row
            // tile uses it; partial sums live in `tiles` between slices.
            let mut kc = 0;
            while kc < k {
                let kn = KC.min(k - kc);
                let ps = &panel[kc * NR..(kc + kn) * NR];
                for (ti, tile) in tiles.iter_mut().enumerate() {
                    let r0 = ti * MR;
                    let rows = MR.min(m - r0);
                    let xs = &x[r0 * k + kc..(r0 + rows - 1) * k + kc + kn];
                    E::tile(width, xs, k, rows, ps, kn, tile, kc > 0);
                }
                kc += kn;
            }
            for (ti, tile) in tiles.iter().enumerate() {
                let r0 = ti * MR;
                for r in 0..MR.min(m - r0) {
                    out.write((r0 + r) * self.n + p * NR, &tile[r * NR..r * NR + cols]);
                }
            }
        }
    }
}

/// Row-major convenience: packs `w: [n, k]` and multiplies (for tests and one-off use).
pub fn matmul_xwt(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, y: &mut [f32]) {
    PackedMatrix::pack(w, n, k).matmul(x, m, y);
}

/// The f32 kernel this CPU runs (`avx512`, `avx2` or `portable`), at the width
/// `--cpu-kernels` leaves it ([`super::width`]).
pub fn isa_name() -> &'static str {
    Width::selected().name()
}

/// A panel element type and its register-tile kernel on each instruction set.
trait PanelElem: Copy + Sync {
    /// `tile[r][j] (+)= Σ_t x[r·ldx + t] · panel[t][j]` (see [`tile_portable`]) on `width`.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        width: Width,
        x: &[f32],
        ldx: usize,
        rows: usize,
        panel: &[Self],
        kn: usize,
        tile: &mut [f32; MR * NR],
        acc: bool,
    );
}

impl PanelElem for f32 {
    fn tile(
        width: Width,
        x: &[f32],
        k: usize,
        rows: usize,
        ps: &[f32],
        kn: usize,
        tile: &mut [f32; MR * NR],
        acc: bool,
    ) {
        match width {
            #[cfg(target_arch = "x86_64")]
            Width::Avx512 => x86::tile_avx512(x, k, rows, ps, kn, tile, acc),
            #[cfg(target_arch = "x86_64")]
            Width::Avx2 => x86::tile_avx2(x, k, rows, ps, kn, tile, acc),
            _ => tile_portable(x, k, rows, ps, kn, tile, acc, |w| w),
        }
    }
}

/// bf16 panels (the upper 16 bits of each f32).
impl PanelElem for u16 {
    fn tile(
        width: Width,
        x: &[f32],
        k: usize,
        rows: usize,
        ps: &[u16],
        kn: usize,
        tile: &mut [f32; MR * NR],
        acc: bool,
    ) {
        match width {
            #[cfg(target_arch = "x86_64")]
            Width::Avx512 => x86_bf16::tile_avx512(x, k, rows, ps, kn, tile, acc),
            #[cfg(target_arch = "x86_64")]
            Width::Avx2 => x86_bf16::tile_avx2(x, k, rows, ps, kn, tile, acc),
            _ => tile_portable(x, k, rows, ps, kn, tile, acc, bf16_to_f32),
        }
    }
}

/// `tile[r][j] (+)= Σ_t x[r·ldx + t] · panel[t][j]` for `r < rows`, `t < kn`; accumulates
/// into `tile` when `acc`, else overwrites.
#[allow(clippy::too_many_arguments)]
fn tile_portable<E: Copy>(
    x: &[f32],
    ldx: usize,
    rows: usize,
    panel: &[E],
    kn: usize,
    tile: &mut [f32; MR * NR],
    acc: bool,
    widen: impl Fn(E) -> f32,
) {
    if !acc {
        tile.fill(0.0);
    }
    for r in 0..rows {
        let out = &mut tile[r * NR..(r + 1) * NR];
        for t in 0..kn {
            let xv = x[r * ldx + t];
            for (a, w) in out.iter_mut().zip(&panel[t * NR..(t + 1) * NR]) {
                *a += xv * widen(*w);
            }
        }
    }
}

/// Portable dot product with 8 independent accumulators (vectorises without target flags;
/// inlined so callers compiled with wider SIMD get wider code).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(p, q)| p * q)
        .sum();
    for (p, q) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += p[i] * q[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

// SIMD intrinsics need `unsafe`: these functions are only entered after run-time feature
// detection, and every pointer offset stays inside slices whose lengths are asserted first.
/// The x86 tile kernels for one panel element type: `$elem` panels, `$l512(p)` loading 16
/// of them at `p` as f32 lanes, `$l256(p)` 8. One body serves f32 and bf16 panels, so both
/// do the same sums in the same order (bf16 results equal f32 ones on the widened weights).
macro_rules! x86_tiles {
    ($module:ident, $elem:ty, $l512:ident, $l256:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        #[allow(clippy::needless_range_loop)] // register tiles read clearest as indexed arrays
        mod $module {
            use super::loads::*;
            use super::{KC, MR, NR};
            use std::arch::x86_64::*;

            pub(super) fn tile_avx512(
                x: &[f32],
                ldx: usize,
                rows: usize,
                panel: &[$elem],
                kn: usize,
                tile: &mut [f32; MR * NR],
                acc: bool,
            ) {
                assert!((1..=MR).contains(&rows) && kn <= ldx);
                assert!(x.len() >= (rows - 1) * ldx + kn && panel.len() >= kn * NR);
                // SAFETY: avx512f detected by the caller; bounds asserted above.
                unsafe {
                    match rows {
                        12 => t512::<12>(x, ldx, panel, kn, tile, acc),
                        11 => t512::<11>(x, ldx, panel, kn, tile, acc),
                        10 => t512::<10>(x, ldx, panel, kn, tile, acc),
                        9 => t512::<9>(x, ldx, panel, kn, tile, acc),
                        8 => t512::<8>(x, ldx, panel, kn, tile, acc),
                        7 => t512::<7>(x, ldx, panel, kn, tile, acc),
                        6 => t512::<6>(x, ldx, panel, kn, tile, acc),
                        5 => t512::<5>(x, ldx, panel, kn, tile, acc),
                        4 => t512::<4>(x, ldx, panel, kn, tile, acc),
                        3 => t512::<3>(x, ldx, panel, kn, tile, acc),
                        2 => t512::<2>(x, ldx, panel, kn, tile, acc),
                        _ => t512::<1>(x, ldx, panel, kn, tile, acc),
                    }
                }
            }

            #[target_feature(enable = "avx512f")]
            fn t512<const R: usize>(
                x: &[f32],
                ldx: usize,
                panel: &[$elem],
                kn: usize,
                tile: &mut [f32; MR * NR],
                acc: bool,
            ) {
                // SAFETY: R rows of kn floats at stride ldx in x and kn·NR floats in panel (asserted
                // by the caller); tile holds MR·NR ≥ R·NR floats.
                unsafe {
                    // Row pointers are computed once: the inner loop then does no index arithmetic
                    // (which overflow checks would otherwise turn into branches).
                    let xp = x.as_ptr();
                    let rows: [*const f32; R] = std::array::from_fn(|r| xp.wrapping_add(r * ldx));
                    let mut wp = panel.as_ptr();
                    let tp = tile.as_mut_ptr();
                    let mut acc0 = [_mm512_setzero_ps(); R];
                    let mut acc1 = [_mm512_setzero_ps(); R];
                    if acc {
                        for r in 0..R {
                            acc0[r] = _mm512_loadu_ps(tp.add(r * NR));
                            acc1[r] = _mm512_loadu_ps(tp.add(r * NR + 16));
                        }
                    }
                    for t in 0..kn {
                        // Weights stream from DRAM (the model is far larger than the caches): fetch
                        // one k-slice ahead so the first row tile does not stall on every line.
                        let ahead = wp.wrapping_add(KC * NR) as *const i8;
                        _mm_prefetch::<_MM_HINT_T0>(ahead);
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
                        let w0 = $l512(wp);
                        let w1 = $l512(wp.add(16));
                        for r in 0..R {
                            let xv = _mm512_set1_ps(*rows[r].add(t));
                            acc0[r] = _mm512_fmadd_ps(xv, w0, acc0[r]);
                            acc1[r] = _mm512_fmadd_ps(xv, w1, acc1[r]);
                        }
                        wp = wp.add(NR);
                    }
                    for r in 0..R {
                        _mm512_storeu_ps(tp.add(r * NR), acc0[r]);
                        _mm512_storeu_ps(tp.add(r * NR + 16), acc1[r]);
                    }
                }
            }

            pub(super) fn tile_avx2(
                x: &[f32],
                ldx: usize,
                rows: usize,
                panel: &[$elem],
                kn: usize,
                tile: &mut [f32; MR * NR],
                acc: bool,
            ) {
                assert!((1..=MR).contains(&rows) && kn <= ldx);
                assert!(x.len() >= (rows - 1) * ldx + kn && panel.len() >= kn * NR);
                let mut r0 = 0;
                while r0 < rows {
                    let n = (rows - r0).min(2);
                    let xs = &x[r0 * ldx..];
                    let (_, rest) = tile.split_at_mut(r0 * NR);
                    // SAFETY: avx2+fma detected by the caller; bounds asserted above.
                    unsafe {
                        if n == 2 {
                            t256::<2>(xs, ldx, panel, kn, rest, acc);
                        } else {
                            t256::<1>(xs, ldx, panel, kn, rest, acc);
                        }
                    }
                    r0 += n;
                }
            }

            #[target_feature(enable = "avx2,fma")]
            fn t256<const R: usize>(
                x: &[f32],
                ldx: usize,
                panel: &[$elem],
                kn: usize,
                tile: &mut [f32],
                acc_in: bool,
            ) {
                // SAFETY: as in t512, with R ≤ 2 rows and tile ≥ R·NR floats.
                unsafe {
                    let xp = x.as_ptr();
                    let mut wp = panel.as_ptr();
                    let tp = tile.as_mut_ptr();
                    let mut acc = [[_mm256_setzero_ps(); 4]; R];
                    if acc_in {
                        for r in 0..R {
                            for j in 0..4 {
                                acc[r][j] = _mm256_loadu_ps(tp.add(r * NR + j * 8));
                            }
                        }
                    }
                    for t in 0..kn {
                        let w = [
                            $l256(wp),
                            $l256(wp.add(8)),
                            $l256(wp.add(16)),
                            $l256(wp.add(24)),
                        ];
                        for r in 0..R {
                            let xv = _mm256_set1_ps(*xp.add(r * ldx + t));
                            for j in 0..4 {
                                acc[r][j] = _mm256_fmadd_ps(xv, w[j], acc[r][j]);
                            }
                        }
                        wp = wp.add(NR);
                    }
                    for r in 0..R {
                        for j in 0..4 {
                            _mm256_storeu_ps(tp.add(r * NR + j * 8), acc[r][j]);
                        }
                    }
                }
            }
        }
    };
}

/// Loads of 16 or 8 panel elements as f32 lanes: plain for f32; for bf16 the 16-bit values
/// zero-extended to 32 bits and shifted into the high half, which is exactly the f32 with
/// those upper 16 bits (bf16 is f32 with the low mantissa bits dropped).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod loads {
    use std::arch::x86_64::*;

    #[inline(always)]
    pub(super) unsafe fn f32_512(p: *const f32) -> __m512 {
        // SAFETY: the caller has avx512f and 16 floats at p.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    pub(super) unsafe fn f32_256(p: *const f32) -> __m256 {
        // SAFETY: the caller has avx2 and 8 floats at p.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    pub(super) unsafe fn bf16_512(p: *const u16) -> __m512 {
        // SAFETY: the caller has avx512f and 16 u16 at p.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }

    #[inline(always)]
    pub(super) unsafe fn bf16_256(p: *const u16) -> __m256 {
        // SAFETY: the caller has avx2 and 8 u16 at p.
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

x86_tiles!(x86, f32, f32_512, f32_256);
x86_tiles!(x86_bf16, u16, bf16_512, bf16_256);

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for r in 0..m {
            for o in 0..n {
                y[r * n + o] = (0..k).map(|t| x[r * k + t] * w[o * k + t]).sum();
            }
        }
        y
    }

    fn check(width: Width) {
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 37, 19),
            (3, 70, 300),
            (9, 129, 64),
            (32, 200, 96),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 9.0)
                .collect();
            let p = PackedMatrix::pack(&w, n, k);
            let mut y = vec![0f32; m * n];
            p.matmul_with(width, &x, m, &mut y);
            let want = naive(&x, m, &w, n, k);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "{width:?} {m}x{n}x{k}: {a} vs {b}"
                );
            }
        }
    }

    /// bf16 panels give bit for bit the f32 result on the widened weights, on `width`.
    fn check_bf16(width: Width) {
        for &(m, n, k) in &[(1, 37, 19), (3, 70, 300), (13, 129, 64), (32, 200, 96)] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.1) / 7.3)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.2) / 9.7)
                .collect();
            let widened: Vec<f32> = w.iter().map(|&v| bf16_to_f32(bf16_bits(v))).collect();
            let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
            PackedMatrix::pack_bf16(&w, n, k).matmul_with(width, &x, m, &mut a);
            PackedMatrix::pack(&widened, n, k).matmul_with(width, &x, m, &mut b);
            assert_eq!(a, b, "{width:?} {m}x{n}x{k}");
            assert_eq!(
                PackedMatrix::pack_bf16(&w, n, k).bytes() * 2,
                PackedMatrix::pack(&w, n, k).bytes()
            );
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_widens_exactly() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(bf16_bits(-2.5)), -2.5);
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        // Just above halfway rounds up.
        assert_eq!(bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(bf16_bits(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(bf16_bits(f32::INFINITY)), f32::INFINITY);
    }

    /// Every path this CPU can run, the portable one first: each width from the portable one
    /// up to the widest the CPU has ([`Width::detect`]; widths order widest first).
    fn available() -> Vec<Width> {
        let widest = Width::detect();
        [Width::Portable, Width::Avx2, Width::Avx512]
            .into_iter()
            .filter(|w| *w >= widest)
            .collect()
    }

    #[test]
    fn bf16_panels_equal_f32_on_the_widened_weights_on_every_path() {
        available().into_iter().for_each(check_bf16);
    }

    #[test]
    fn every_available_path_matches_naive() {
        available().into_iter().for_each(check);
    }
}
