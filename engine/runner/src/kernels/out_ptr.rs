//! The output of a panel-parallel matmul, shared by its rayon tasks, and the split of the
//! panels into those tasks.
//!
//! Invariant (upheld by the callers): each task owns a disjoint set of panels, i.e. disjoint
//! column ranges of every output row, so no element is written by two tasks; the pointer is
//! valid for the whole output for the duration of the call (the `&mut` borrow of the output
//! is held across the parallel loop).

/// A raw pointer to the output buffer; see the module note.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(*mut f32);

// SAFETY: see the module note: writes are disjoint and the borrow outlives every task.
#[allow(unsafe_code)]
unsafe impl Send for OutPtr {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Points at `y`, which must stay borrowed while the pointer is used.
    pub(crate) fn new(y: &mut [f32]) -> Self {
        OutPtr(y.as_mut_ptr())
    }

    /// Copies `src` to `y[at..at + src.len()]`; the caller guarantees `at + src.len()` is
    /// within the output (columns of a panel are clipped to `n`).
    #[allow(unsafe_code)]
    pub(crate) fn write(self, at: usize, src: &[f32]) {
        // SAFETY: in bounds and not aliased by another task (module note).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.0.add(at), src.len()) }
    }
}

/// Runs `run(p0, p1, out)` over `0..panels` in disjoint ranges on the compute team
/// ([`super::team`]): about two ranges per thread for one row (GEMV, bandwidth-bound: few,
/// long streams), four for a batch (more, shorter ones balance the compute better). Each range
/// is one task, so the module note's disjointness holds by construction. Every range but the
/// last starts and ends on a multiple of `align` (a kernel that takes panels in pairs keeps
/// its pairs).
pub(crate) fn for_panel_ranges(
    panels: usize,
    align: usize,
    m: usize,
    y: &mut [f32],
    run: impl Fn(usize, usize, OutPtr) + Send + Sync,
) {
    let threads = super::team::threads();
    let tasks = if m == 1 { threads * 2 } else { threads * 4 };
    let per_task = panels.div_ceil(tasks).next_multiple_of(align.max(1)).max(1);
    let out = OutPtr::new(y);
    super::team::for_each_task(panels.div_ceil(per_task), |t| {
        let p0 = t * per_task;
        run(p0, (p0 + per_task).min(panels), out)
    });
}
