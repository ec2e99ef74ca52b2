//! Transparent huge pages for the weight buffers.
//!
//! A batch-1 decode step streams every weight once, hundreds of MB per token on a 1B model.
//! With 4 KiB pages that is a TLB miss every 4 KiB, and the hardware prefetchers stop at
//! every page boundary, so each page starts with demand misses; 2 MiB pages remove both.
//! Many hosts set transparent huge pages to `madvise` (only regions that ask get them), so
//! the weight buffers ask, before their first write, when the kernel can still back them
//! with huge pages as they fault in. It changes how memory is backed, never its contents;
//! where the kernel refuses or has none, nothing changes.

/// Huge page size on x86-64 and most aarch64 kernels.
const HUGE: usize = 2 << 20;

/// A zeroed vector of `len` values whose whole 2 MiB-aligned interior asks for huge pages
/// (buffers under 8 MiB are left alone: they fit in few pages either way).
pub(crate) fn zeroed<T: Copy + Default>(len: usize) -> Vec<T> {
    let v = vec![T::default(); len];
    advise(&v);
    v
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn advise<T>(v: &[T]) {
    let bytes = std::mem::size_of_val(v);
    if bytes < 4 * HUGE {
        return;
    }
    let base = v.as_ptr() as usize;
    let (start, end) = (base.next_multiple_of(HUGE), (base + bytes) / HUGE * HUGE);
    if end > start {
        // SAFETY: [start, end) lies inside `v`'s allocation, which outlives the call;
        // MADV_HUGEPAGE changes only how the kernel backs the range, never its contents,
        // and a failure (EINVAL where THP is compiled out) leaves it as it was.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise<T>(_: &[T]) {}

#[cfg(test)]
mod tests {
    #[test]
    fn a_huge_buffer_is_zeroed_and_whole() {
        let v: Vec<f32> = super::zeroed(5 << 20);
        assert_eq!(v.len(), 5 << 20);
        assert!(v.iter().all(|&x| x == 0.0));
    }
}
