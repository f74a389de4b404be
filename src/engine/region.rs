//! The memory an engine lives in: one contiguous, zero-initialised block.
//!
//! The engine stores everything that a reader of the tree needs in one region
//! of plain `#[repr(C)]` data addressed by `u32` indices, so the same code runs
//! over a heap allocation (tests, `radixd exec`) and over a shared-memory
//! segment (the daemon).

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use super::layout::REGION_ALIGN;
#[cfg(loom)]
use super::mem::Mirror;

/// A block of memory the engine may treat as its own.
///
/// # Safety
///
/// Implementors promise that `as_ptr()` is non-null, aligned to
/// [`REGION_ALIGN`], valid for reads and writes of `len()` bytes for as long as
/// the value lives, that the bytes were zeroed or written only by an engine,
/// and that nothing in this process accesses them except through the engine
/// that owns the value. Other processes may map the memory read-only.
pub unsafe trait Region {
    /// Start of the region.
    fn as_ptr(&self) -> *mut u8;
    /// Size of the region in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty (never, for a usable engine).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Under loom only: copies the writer's plain stores made since the
    /// last call into the region's loom-visible [`Mirror`](super::mem::Mirror) and returns it
    /// (see [`super::mem`]); `None` for a region without one, on which an
    /// engine cannot run under loom.
    #[cfg(loom)]
    fn mirror(&self) -> Option<&Mirror> {
        None
    }
}

/// A zeroed heap allocation, the region of an in-process engine.
pub struct HeapRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl HeapRegion {
    /// Allocates `len` zeroed bytes aligned to [`REGION_ALIGN`]; `None` when
    /// the size is zero, overflows, or the allocator refuses.
    pub fn zeroed(len: usize) -> Option<Self> {
        if len == 0 {
            return None;
        }
        let layout = Layout::from_size_align(len, REGION_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size, checked above.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| Self { ptr, layout })
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the allocation is owned by this value alone, aligned to
// REGION_ALIGN by its layout, zeroed at birth, and lives until drop.
unsafe impl Region for HeapRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

// SAFETY: the region is plain bytes owned by this value; moving it to another
// thread moves the only handle to it.
unsafe impl Send for HeapRegion {}

#[cfg(loom)]
pub use mirrored::MirroredRegion;

/// The region an engine runs on under loom (see [`super::mem`]).
#[cfg(loom)]
mod mirrored {
    use std::sync::Arc;

    use super::{HeapRegion, Region};
    use crate::engine::layout::EngineLayout;
    use crate::engine::mem::Mirror;

    /// A heap region whose reader-visible side is a [`Mirror`]: what an
    /// engine runs on under loom.
    pub struct MirroredRegion {
        heap: HeapRegion,
        mirror: Arc<Mirror>,
    }

    impl MirroredRegion {
        /// A zeroed region of `layout` and its mirror (`None` when the
        /// allocation fails).
        pub fn new(layout: EngineLayout) -> Option<(Self, Arc<Mirror>)> {
            let heap = HeapRegion::zeroed(layout.size())?;
            let mirror = Mirror::new(layout);
            Some((
                Self {
                    heap,
                    mirror: mirror.clone(),
                },
                mirror,
            ))
        }
    }

    // SAFETY: the heap region's promises, unchanged; the mirror lies
    // outside it.
    unsafe impl Region for MirroredRegion {
        fn as_ptr(&self) -> *mut u8 {
            self.heap.as_ptr()
        }
        fn len(&self) -> usize {
            self.heap.len()
        }
        fn mirror(&self) -> Option<&Mirror> {
            // SAFETY: the heap region is `layout.size()` bytes (`new`),
            // REGION_ALIGN-aligned; only this thread (the writer) writes
            // it, and not during this call (`&` borrow of the engine).
            unsafe { self.mirror.flush(self.heap.as_ptr().cast::<u32>()) };
            Some(&self.mirror)
        }
    }
}
