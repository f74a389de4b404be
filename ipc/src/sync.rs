//! The one place that chooses between std and loom primitives.
//!
//! Every other module imports atomics, fences, spin hints and `UnsafeCell`
//! from here, so the same protocol code runs over shared memory (std) and
//! under the loom model checker (`--cfg loom`). The std `UnsafeCell` mimics
//! loom's `with`/`with_mut` API so call sites never need `cfg`.

#[cfg(loom)]
pub use loom::{
    cell::UnsafeCell,
    hint::spin_loop,
    sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    sync::{Arc, Condvar, Mutex},
    thread::yield_now,
};

#[cfg(not(loom))]
pub use std::{
    hint::spin_loop,
    sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    sync::Arc,
    thread::yield_now,
};

/// `std::cell::UnsafeCell` with loom's closure-based access API.
///
/// `repr(transparent)`: same layout as `T`, so a slice of these can be laid
/// over plain message storage in shared memory.
#[cfg(not(loom))]
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `data`.
    pub const fn new(data: T) -> Self {
        Self(std::cell::UnsafeCell::new(data))
    }

    /// Runs `f` with a shared raw pointer to the contents.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable raw pointer to the contents.
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
