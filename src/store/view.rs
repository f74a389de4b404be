//! Typed access to a mapped store: the read-only part (header, namespaces,
//! buckets, entries) and the read-write part (use clock, counters, stamps,
//! data), which lie side by side in the daemon's mapping and in two
//! mappings in a client's.

use std::ptr::NonNull;

use radixd_ipc::sync::{AtomicU32, AtomicU64};

use super::layout::{Counters, Entry, Header, Namespace, StoreLayout};

/// A store's two parts, mapped.
#[derive(Clone, Copy, Debug)]
pub struct StoreView {
    ro: NonNull<u8>,
    rw: NonNull<u8>,
    layout: StoreLayout,
}

// SAFETY: the pointers lead into shared mappings whose every word is an
// atomic or raw data copied with explicit copies; nothing is thread-local.
unsafe impl Send for StoreView {}
// SAFETY: as above; all access through `&self` is by atomics or raw copies.
unsafe impl Sync for StoreView {}

impl StoreView {
    /// A view of the read-only part at `ro` (`layout.ro_bytes` bytes) and
    /// the read-write part at `rw` (`layout.rw_bytes()` bytes).
    ///
    /// # Safety
    ///
    /// Both ranges must stay mapped (readable; `rw` also writable) for as
    /// long as the view and its copies are used, and be aligned to 64
    /// bytes.
    pub unsafe fn new(ro: NonNull<u8>, rw: NonNull<u8>, layout: StoreLayout) -> Self {
        Self { ro, rw, layout }
    }

    /// The layout.
    pub fn layout(&self) -> &StoreLayout {
        &self.layout
    }

    fn ro_at<T>(&self, at: u64) -> &T {
        debug_assert!(at + size_of::<T>() as u64 <= self.layout.ro_bytes);
        // SAFETY: every caller passes an offset the layout places inside
        // the read-only part, aligned for `T` (the layout aligns each
        // array); `T` is made of atomics, valid for any bit pattern.
        unsafe { &*self.ro.as_ptr().add(at as usize).cast::<T>() }
    }

    fn rw_at<T>(&self, at: u64) -> &T {
        let at = at - self.layout.ro_bytes;
        debug_assert!(at + size_of::<T>() as u64 <= self.layout.rw_bytes());
        // SAFETY: as in `ro_at`, inside the read-write part.
        unsafe { &*self.rw.as_ptr().add(at as usize).cast::<T>() }
    }

    /// The header.
    pub fn header(&self) -> &Header {
        self.ro_at(0)
    }

    /// Namespace `i` (`None` out of range).
    pub fn namespace(&self, i: u32) -> Option<&Namespace> {
        (i < super::layout::NAMESPACES).then(|| {
            self.ro_at(self.layout.namespaces_at + u64::from(i) * size_of::<Namespace>() as u64)
        })
    }

    /// The head of the bucket of `hash`.
    pub fn bucket(&self, hash: u64) -> &AtomicU32 {
        let i = hash & u64::from(self.layout.buckets - 1);
        self.ro_at(self.layout.buckets_at + i * 4)
    }

    /// Bucket `i` (`i < buckets`).
    pub fn bucket_at(&self, i: u32) -> Option<&AtomicU32> {
        (i < self.layout.buckets).then(|| self.ro_at(self.layout.buckets_at + u64::from(i) * 4))
    }

    /// Entry `i` (`None` out of range).
    pub fn entry(&self, i: u32) -> Option<&Entry> {
        (i < self.layout.config.entries)
            .then(|| self.ro_at(self.layout.entries_at + u64::from(i) * size_of::<Entry>() as u64))
    }

    /// The global use clock.
    pub fn clock(&self) -> &AtomicU64 {
        self.rw_at(self.layout.clock_at)
    }

    /// Client `i`'s counters.
    pub fn counters(&self, i: u32) -> Option<&Counters> {
        (i < self.layout.config.clients).then(|| {
            self.rw_at(self.layout.counters_at + u64::from(i) * size_of::<Counters>() as u64)
        })
    }

    /// Entry `i`'s use stamp.
    pub fn stamp(&self, i: u32) -> Option<&AtomicU64> {
        (i < self.layout.config.entries)
            .then(|| self.rw_at(self.layout.stamps_at + u64::from(i) * 8))
    }

    /// The first byte of the `len` bytes at data offset `at`, if they lie
    /// inside the data region.
    pub fn data(&self, at: u64, len: u64) -> Option<*mut u8> {
        let end = at.checked_add(len)?;
        if end > self.layout.config.data_bytes {
            return None;
        }
        let off = self.layout.data_at - self.layout.ro_bytes + at;
        // SAFETY: inside the read-write mapping (checked just now).
        Some(unsafe { self.rw.as_ptr().add(off as usize) })
    }
}
