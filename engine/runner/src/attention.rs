//! Paged causal attention for a flattened batch. Row `t` (a token of some sequence at
//! position `pos`) attends to positions `0..=pos` of its own sequence (the last `window` of
//! them on a sliding-window layer: `pos + 1 - window ..= pos`), read through that
//! sequence's block table from the [`KvStore`]; the caller has already written this step's
//! K/V rows, so tokens of a prefill chunk see each other causally. Grouped-query: query head
//! `h` reads kv head `h / (heads / kv_heads)`. Work is split over (row, kv head) on the
//! compute team; with 16-token blocks, [`avx512`] (or its 8-lane form [`avx2`]) computes a
//! group's scores, softmax and weighted sum in registers (picked at run time), otherwise a
//! portable loop does the same. K and V are read in the pool's element type (f16 or f32) and
//! widened to f32 as they are loaded; the arithmetic is f32 on every path.

use std::cell::RefCell;

use half::f16;

use super::kv_store::{KvElem, KvLayer, KvStore};
use crate::kernels::ops::softmax;
use crate::kernels::team;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod blocks;

/// Where one batch row sits in its sequence.
#[derive(Debug, Clone, Copy)]
pub struct RowPos<'a> {
    /// Absolute position of the token.
    pub pos: usize,
    /// The owning sequence's block table.
    pub block_table: &'a [u32],
}

/// Shapes for [`paged_attention`].
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// Row stride of `q` (the fused qkv row width).
    pub q_stride: usize,
    /// Scores are `q·k · scale` (`1/√head_dim` unless the model says otherwise).
    pub scale: f32,
    /// Positions a query sees, itself included, on a sliding-window layer.
    pub window: Option<usize>,
}

/// Writes `out[t, h*hd..]` = softmax(q·Kᵀ·scale)·V for every row and head.
pub fn paged_attention(
    q: &[f32],
    rows: &[RowPos<'_>],
    kv: &KvStore,
    layer: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    let path = Path::detect(s.head_dim, kv.block_size());
    paged_attention_on(path, q, rows, kv, layer, s, out);
}

/// The code that computes the scores and the weighted sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// 16 lanes = one block of positions (head_dim a multiple of 16, 16-token blocks).
    Avx512,
    /// Its 8-lane form (the same shapes).
    Avx2,
    /// The portable loops compiled for AVX2 and FMA (any shapes).
    Avx2Loops,
    /// The portable loops for the build's baseline.
    Portable,
}

impl Path {
    /// The widest path this CPU (at the width `--cpu-kernels` leaves it) and these shapes
    /// allow.
    fn detect(head_dim: usize, block_size: usize) -> Path {
        use crate::kernels::width::Width;
        let blocks = head_dim.is_multiple_of(16) && block_size == 16;
        match Width::selected() {
            Width::Avx512 if blocks => Path::Avx512,
            Width::Avx512 | Width::Avx2 if blocks && has_f16c() => Path::Avx2,
            Width::Avx512 | Width::Avx2 => Path::Avx2Loops,
            Width::Portable => Path::Portable,
        }
    }
}

fn paged_attention_on(
    path: Path,
    q: &[f32],
    rows: &[RowPos<'_>],
    kv: &KvStore,
    layer: usize,
    s: AttnShape,
    out: &mut [f32],
) {
    let at = Batch { q, rows, kv, s };
    match kv.layer(layer) {
        KvLayer::F16(k, v) => attend_all::<f16>(path, &at, (k, v), out),
        KvLayer::F32(k, v) => attend_all::<f32>(path, &at, (k, v), out),
    }
}

/// One [`paged_attention`] call's inputs.
struct Batch<'a> {
    q: &'a [f32],
    rows: &'a [RowPos<'a>],
    kv: &'a KvStore,
    s: AttnShape,
}

/// What every path needs of a stored value: on x86-64 its SIMD loads ([`blocks::Lanes`]),
/// elsewhere only its widening to f32 ([`KvElem`]), which the portable loops use.
#[cfg(target_arch = "x86_64")]
trait Elem: blocks::Lanes {}
#[cfg(target_arch = "x86_64")]
impl<E: blocks::Lanes> Elem for E {}
#[cfg(not(target_arch = "x86_64"))]
trait Elem: KvElem {}
#[cfg(not(target_arch = "x86_64"))]
impl<E: KvElem> Elem for E {}

fn attend_all<E: Elem>(path: Path, at: &Batch<'_>, (k, v): (&[E], &[E]), out: &mut [f32]) {
    let s = at.s;
    let group = s.heads / s.kv_heads;
    // One task per (row, kv head): the `group` query heads sharing a kv head are adjacent in
    // `out`, so each K/V row is loaded once for all of them.
    thread_local! {
        /// One thread's attention scores, kept across calls (a context's worth of floats),
        /// and the portable loops' block of K or V widened to f32.
        static SCORES: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }
    let tasks: Vec<_> = out.chunks_mut(group * s.head_dim).enumerate().collect();
    team::for_each_item(tasks, |(idx, o)| {
        SCORES.with_borrow_mut(|(scores, wide)| {
            let (t, kvh) = (idx / s.kv_heads, idx % s.kv_heads);
            let q0 = t * s.q_stride + kvh * group * s.head_dim;
            let job = GroupJob {
                q: &at.q[q0..q0 + group * s.head_dim],
                group,
                hd: s.head_dim,
                row: at.rows[t],
                kv: at.kv,
                k,
                v,
                kv_head: kvh,
                scale: s.scale,
                window: s.window,
            };
            match path {
                #[cfg(target_arch = "x86_64")]
                Path::Avx512 => avx512::attend(&job, scores, o),
                #[cfg(target_arch = "x86_64")]
                Path::Avx2 => avx2::attend(&job, scores, o),
                #[cfg(target_arch = "x86_64")]
                Path::Avx2Loops => avx2_loops::attend(&job, scores, wide, o),
                _ => attend(&job, scores, wide, o, block_scores_portable, axpy_portable),
            }
        })
    });
}

#[cfg(test)]
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn has_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The query heads of one row that share one kv head, over a layer's K and V of type `E`.
struct GroupJob<'a, E> {
    q: &'a [f32],
    group: usize,
    hd: usize,
    row: RowPos<'a>,
    /// The pool's geometry (offsets, block size).
    kv: &'a KvStore,
    k: &'a [E],
    v: &'a [E],
    kv_head: usize,
    scale: f32,
    window: Option<usize>,
}

/// `out[s] = Σ_d q[d] · kt[d · bs + s]` for the `bs = out.len()` slots of a block.
#[inline(always)]
fn block_scores_portable(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let bs = out.len();
    out.fill(0.0);
    for (d, qd) in q.iter().enumerate() {
        for (o, k) in out.iter_mut().zip(&kt[d * bs..(d + 1) * bs]) {
            *o += qd * k;
        }
    }
}

#[inline(always)]
fn axpy_portable(y: &mut [f32], a: f32, x: &[f32]) {
    for (p, q) in y.iter_mut().zip(x) {
        *p += a * q;
    }
}

/// Scores over the row's positions for every head of the group (`scores[g * len + j]`),
/// softmax per head, weighted sum of V.
#[inline(always)]
fn attend<E: KvElem>(
    job: &GroupJob<'_, E>,
    scores: &mut Vec<f32>,
    wide: &mut Vec<f32>,
    o: &mut [f32],
    block_scores: impl Fn(&[f32], &[f32], &mut [f32]),
    axpy: impl Fn(&mut [f32], f32, &[f32]),
) {
    let hd = job.hd;
    let (kbuf, vbuf) = (job.k, job.v);
    let bs = job.kv.block_size();
    let len = job.row.pos + 1;
    // The first position seen, and the block it is in: blocks wholly before the window are
    // never read.
    let start = job.window.map_or(0, |w| len.saturating_sub(w));
    let first = start / bs;
    let blocks = &job.row.block_table[first..len.div_ceil(bs)];
    // Scores are laid out [group][blocks · bs] (padded to whole blocks; the ends are unused),
    // position `first · bs + j` at `j`.
    let padded = blocks.len() * bs;
    let (lo, n) = (start - first * bs, len - start);
    scores.clear();
    scores.resize(job.group * padded, 0.0);
    for (bi, &block) in blocks.iter().enumerate() {
        let base = job.kv.head_offset(block, job.kv_head);
        let kt = E::widen(&kbuf[base..base + hd * bs], wide);
        for g in 0..job.group {
            let out = &mut scores[g * padded + bi * bs..g * padded + (bi + 1) * bs];
            block_scores(&job.q[g * hd..(g + 1) * hd], kt, out);
        }
    }
    for g in 0..job.group {
        scores.copy_within(g * padded + lo..g * padded + lo + n, g * n);
    }
    scores.truncate(job.group * n);
    for v in scores.iter_mut() {
        *v *= job.scale;
    }
    for g in 0..job.group {
        softmax(&mut scores[g * n..(g + 1) * n]);
    }
    o.fill(0.0);
    let mut j = 0;
    for (bi, &block) in blocks.iter().enumerate() {
        let base = job.kv.head_offset(block, job.kv_head);
        let from = if bi == 0 { lo } else { 0 };
        let rows = E::widen(&vbuf[base..base + bs * hd], wide);
        for slot in from..bs.min(len - (first + bi) * bs) {
            let v = &rows[slot * hd..(slot + 1) * hd];
            for g in 0..job.group {
                axpy(&mut o[g * hd..(g + 1) * hd], scores[g * n + j], v);
            }
            j += 1;
        }
    }
}

// The portable loops compiled with AVX2 and FMA enabled (the default target has only SSE2):
// the same code, inlined into a function the compiler may vectorize 8 lanes wide.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2_loops {
    use super::{GroupJob, attend as attend_generic, axpy_portable, block_scores_portable};
    use crate::kv_store::KvElem;

    #[target_feature(enable = "avx2,fma")]
    fn attend_avx2<E: KvElem>(
        job: &GroupJob<'_, E>,
        scores: &mut Vec<f32>,
        wide: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        attend_generic(job, scores, wide, o, block_scores_portable, axpy_portable);
    }

    /// Entered only after run-time detection of avx2 and fma.
    pub(super) fn attend<E: KvElem>(
        job: &GroupJob<'_, E>,
        scores: &mut Vec<f32>,
        wide: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        // SAFETY: the caller checked avx2 and fma (`Width::selected`); the body is safe code.
        unsafe { attend_avx2(job, scores, wide, o) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_store::KvDtype;

    /// Deterministic values in [-1, 1).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.next() * scale).collect()
        }
    }

    /// Rows at positions inside, at the end of and past a block, over a scattered block
    /// table, for `heads` query heads over `kv_heads` of `hd`; returns the output of every
    /// available path.
    fn outputs(
        (heads, kv_heads, hd): (usize, usize, usize),
        q_scale: f32,
        window: Option<usize>,
        dtype: KvDtype,
    ) -> Vec<(Path, Vec<f32>)> {
        let (bs, blocks) = (16, 12);
        let mut rng = Lcg(7);
        let mut kv = KvStore::new(1, kv_heads, hd, bs, blocks, dtype);
        let table: Vec<u32> = vec![5, 2, 9, 0, 11, 3, 7, 1];
        let positions = [0usize, 5, 15, 16, 17, 40, 100, 127];
        let last = *positions.iter().max().unwrap_or(&0);
        for p in 0..=last {
            let k = rng.vec(kv_heads * hd, 1.0);
            let v = rng.vec(kv_heads * hd, 1.0);
            kv.write_token(0, table[p / bs], p % bs, &k, &v);
        }
        let rows: Vec<RowPos<'_>> = positions
            .iter()
            .map(|&pos| RowPos {
                pos,
                block_table: &table,
            })
            .collect();
        let shape = AttnShape {
            heads,
            kv_heads,
            head_dim: hd,
            q_stride: (heads + 2 * kv_heads) * hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window,
        };
        let q = rng.vec(rows.len() * shape.q_stride, q_scale);
        let mut paths = vec![Path::Portable];
        if has_avx2_fma() {
            paths.push(Path::Avx2Loops);
        }
        if has_avx2_fma() && has_f16c() {
            paths.push(Path::Avx2);
        }
        if Path::detect(hd, bs) == Path::Avx512 {
            paths.push(Path::Avx512);
        }
        paths
            .into_iter()
            .map(|path| {
                let mut out = vec![0.0; rows.len() * heads * hd];
                paged_attention_on(path, &q, &rows, &kv, 0, shape, &mut out);
                (path, out)
            })
            .collect()
    }

    /// SmolLM2's 9 heads over 3 of 64, one head per kv head of 16, 5 per kv head of 32 (a
    /// chunk of 4 and one of 1), 8 per kv head of 128 (two chunks of 4, two passes over V),
    /// 2 per kv head of 32: every register tiling of the AVX-512 path.
    const SHAPES: [(usize, usize, usize); 5] = [
        (9, 3, 64),
        (4, 4, 16),
        (10, 2, 32),
        (16, 2, 128),
        (6, 3, 32),
    ];
    /// Soft and peaked attention, globally and in a window that starts inside a block.
    const QUERIES: [(f32, Option<usize>); 3] = [(0.5, None), (8.0, None), (0.5, Some(21))];

    fn relative(got: &[f32], want: &[f32]) -> f32 {
        let diff: f32 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
        let norm: f32 = want.iter().map(|b| b * b).sum();
        (diff / norm).sqrt()
    }

    /// Every path computes the same sums in another order (and the SIMD ones their own
    /// `exp`) over the same stored values: they agree to float rounding (measured: under
    /// 1e-6 relative; bound 1e-5) on every shape and query, for both pool types.
    #[test]
    fn every_available_path_agrees_with_the_portable_one() {
        for dtype in [KvDtype::F16, KvDtype::F32] {
            for shape in SHAPES {
                for (q_scale, window) in QUERIES {
                    let outs = outputs(shape, q_scale, window, dtype);
                    let (_, want) = &outs[0];
                    for (path, got) in &outs[1..] {
                        let rel = relative(got, want);
                        println!(
                            "{path:?} vs portable, {dtype}, {shape:?}, q {q_scale}, {window:?}: {rel:e}"
                        );
                        assert!(
                            rel < 1e-5,
                            "{path:?} {dtype} {shape:?}: relative difference {rel}"
                        );
                    }
                }
            }
        }
    }

    /// An f16 pool's output is the f32 pool's within the rounding of its inputs: each K and
    /// V value is within 2⁻¹¹ relative, which moves the scores by up to `|q|·|k|·2⁻¹¹` and
    /// the output by about as much again (measured: at most 4e-4 relative, peaked attention
    /// the largest; bound 2e-3).
    #[test]
    fn an_f16_pool_tracks_the_f32_one_within_its_rounding() {
        for shape in SHAPES {
            for (q_scale, window) in QUERIES {
                let half = outputs(shape, q_scale, window, KvDtype::F16);
                let full = outputs(shape, q_scale, window, KvDtype::F32);
                for ((path, got), (_, want)) in half.iter().zip(&full) {
                    let rel = relative(got, want);
                    println!("{path:?} f16 vs f32, {shape:?}, q {q_scale}, {window:?}: {rel:e}");
                    assert!(rel < 2e-3, "{path:?} {shape:?}: relative difference {rel}");
                }
            }
        }
    }
}
