//! The process's allocator: mimalloc for ordinary allocations, the system allocator for
//! large ones.
//!
//! The write path allocates a record's parts on a partition's worker and frees them after
//! its commit, a pattern where mimalloc costs less CPU than glibc's malloc
//! (`docs/bench/history.md`, "The write path: allocations and batch size"). But large blocks (a consumed chunk of a megabyte, a 1 MiB document,
//! 64 KiB metadata values by the dozen, a batch's vectors) churn through mimalloc's
//! segments, which it keeps for a while after they are freed: a replica catching up on
//! records at the validation limits held 576 MiB of anonymous memory for about 150 MiB
//! of live heap. Blocks of [`LARGE`] bytes or more therefore go to the system allocator
//! (glibc maps the largest alone and unmaps them when they are freed). Measured on the
//! release build: that catch-up peaked at 284 MiB, and W1 drains ran at 1.11x the
//! records/s of mimalloc alone (medians of 5 interleaved pairs, faster in 4). Pinning
//! glibc's mmap threshold as well (so that SQLite's and librdkafka's large blocks were
//! mapped each time) cost a fifth of W1's rate and was not kept.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of this size or more go to the system allocator.
pub const LARGE: usize = 256 * 1024;

/// See the module docs.
pub struct Split;

// SAFETY: every block is freed (and reallocated) by the allocator that allocated it: the
// choice depends only on the block's size, which `dealloc` and `realloc` are given (the
// layout it was allocated with); a `realloc` that crosses [`LARGE`] moves the block.
unsafe impl GlobalAlloc for Split {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees (a non-zero size).
        unsafe {
            if layout.size() >= LARGE {
                System.alloc(layout)
            } else {
                mimalloc::MiMalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if layout.size() >= LARGE {
                System.alloc_zeroed(layout)
            } else {
                mimalloc::MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` with `layout`, so by the same allocator.
        unsafe {
            if layout.size() >= LARGE {
                System.dealloc(ptr, layout)
            } else {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (was_large, is_large) = (layout.size() >= LARGE, new_size >= LARGE);
        // SAFETY: `ptr` was allocated with `layout` by the allocator its size selects;
        // within one allocator the block is resized in place or moved by it; across the
        // two it is copied into a new block of the other and freed by its own.
        unsafe {
            match (was_large, is_large) {
                (true, true) => System.realloc(ptr, layout, new_size),
                (false, false) => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks move between the two allocators as they grow and shrink across the
    /// threshold, keeping their contents.
    #[test]
    fn reallocation_across_the_threshold_keeps_the_contents() {
        let a = Split;
        // SAFETY: sizes are non-zero; every pointer is freed with the layout it has.
        unsafe {
            let small = Layout::from_size_align(100, 8).unwrap();
            let p = a.alloc(small);
            assert!(!p.is_null());
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let p = a.realloc(p, small, LARGE * 2);
            assert!(!p.is_null());
            assert!((0..100).all(|i| *p.add(i) == i as u8));
            let large = Layout::from_size_align(LARGE * 2, 8).unwrap();
            let p = a.realloc(p, large, 50);
            assert!((0..50).all(|i| *p.add(i) == i as u8));
            a.dealloc(p, Layout::from_size_align(50, 8).unwrap());
            let z = a.alloc_zeroed(large);
            assert!((0..LARGE * 2).step_by(4096).all(|i| *z.add(i) == 0));
            a.dealloc(z, large);
        }
    }
}
