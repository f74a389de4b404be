//! Typed access to a mapped store: the read-only part (header, namespaces,
//! buckets, entries) and the read-write part (use clock, counters, stamps,
//! data), which lie side by side in the daemon's mapping and in two
//! mappings in a client's.
//!
//! Under loom the records cannot lie in raw memory (loom's atomics are
//! handles into its model): a `LoomStore` holds them as typed values and
//! the view's accessors lead there instead, so the models drive the
//! shipped [`StoreIndex`](super::StoreIndex) and
//! [`StoreReader`](super::StoreReader) unchanged.

use std::ptr::NonNull;

use radixd_ipc::sync::{AtomicU32, AtomicU64};

use super::layout::{Counters, Entry, Header, Namespace, StoreLayout};

/// A store's two parts, mapped.
#[derive(Clone, Copy, Debug)]
pub struct StoreView {
    ro: NonNull<u8>,
    // Under loom the data lies in the `LoomStore` too.
    #[cfg_attr(loom, allow(dead_code))]
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

    #[cfg(not(loom))]
    fn ro_at<T>(&self, at: u64) -> &T {
        debug_assert!(at + size_of::<T>() as u64 <= self.layout.ro_bytes);
        // SAFETY: every caller passes an offset the layout places inside
        // the read-only part, aligned for `T` (the layout aligns each
        // array); `T` is made of atomics, valid for any bit pattern.
        unsafe { &*self.ro.as_ptr().add(at as usize).cast::<T>() }
    }

    #[cfg(not(loom))]
    fn rw_at<T>(&self, at: u64) -> &T {
        let at = at - self.layout.ro_bytes;
        debug_assert!(at + size_of::<T>() as u64 <= self.layout.rw_bytes());
        // SAFETY: as in `ro_at`, inside the read-write part.
        unsafe { &*self.rw.as_ptr().add(at as usize).cast::<T>() }
    }

    /// The header.
    #[cfg(not(loom))]
    pub fn header(&self) -> &Header {
        self.ro_at(0)
    }

    /// Namespace `i` (`None` out of range).
    #[cfg(not(loom))]
    pub fn namespace(&self, i: u32) -> Option<&Namespace> {
        (i < super::layout::NAMESPACES).then(|| {
            self.ro_at(self.layout.namespaces_at + u64::from(i) * size_of::<Namespace>() as u64)
        })
    }

    /// The head of the bucket of `hash`.
    #[cfg(not(loom))]
    pub fn bucket(&self, hash: u64) -> &AtomicU32 {
        let i = hash & u64::from(self.layout.buckets - 1);
        self.ro_at(self.layout.buckets_at + i * 4)
    }

    /// Bucket `i` (`i < buckets`).
    #[cfg(not(loom))]
    pub fn bucket_at(&self, i: u32) -> Option<&AtomicU32> {
        (i < self.layout.buckets).then(|| self.ro_at(self.layout.buckets_at + u64::from(i) * 4))
    }

    /// Entry `i` (`None` out of range).
    #[cfg(not(loom))]
    pub fn entry(&self, i: u32) -> Option<&Entry> {
        (i < self.layout.config.entries)
            .then(|| self.ro_at(self.layout.entries_at + u64::from(i) * size_of::<Entry>() as u64))
    }

    /// The global use clock.
    #[cfg(not(loom))]
    pub fn clock(&self) -> &AtomicU64 {
        self.rw_at(self.layout.clock_at)
    }

    /// Client `i`'s counters.
    #[cfg(not(loom))]
    pub fn counters(&self, i: u32) -> Option<&Counters> {
        (i < self.layout.config.clients).then(|| {
            self.rw_at(self.layout.counters_at + u64::from(i) * size_of::<Counters>() as u64)
        })
    }

    /// Entry `i`'s use stamp.
    #[cfg(not(loom))]
    pub fn stamp(&self, i: u32) -> Option<&AtomicU64> {
        (i < self.layout.config.entries)
            .then(|| self.rw_at(self.layout.stamps_at + u64::from(i) * 8))
    }

    /// The first byte of the `len` bytes at data offset `at`, if they lie
    /// inside the data region.
    #[cfg(not(loom))]
    pub fn data(&self, at: u64, len: u64) -> Option<*mut u8> {
        let end = at.checked_add(len)?;
        if end > self.layout.config.data_bytes {
            return None;
        }
        let off = self.layout.data_at - self.layout.ro_bytes + at;
        // SAFETY: inside the read-write mapping (checked just now).
        Some(unsafe { self.rw.as_ptr().add(off as usize) })
    }

    #[cfg(loom)]
    fn mem(&self) -> &LoomStore {
        // SAFETY: under loom `ro` is the `LoomStore` that made the view
        // (`LoomStore::view`), which outlives it.
        unsafe { self.ro.cast::<LoomStore>().as_ref() }
    }

    /// The header.
    #[cfg(loom)]
    pub fn header(&self) -> &Header {
        &self.mem().header
    }

    /// Namespace `i` (`None` out of range).
    #[cfg(loom)]
    pub fn namespace(&self, i: u32) -> Option<&Namespace> {
        self.mem().namespaces.get(i as usize)
    }

    /// The head of the bucket of `hash`.
    #[cfg(loom)]
    pub fn bucket(&self, hash: u64) -> &AtomicU32 {
        &self.mem().buckets[(hash & u64::from(self.layout.buckets - 1)) as usize]
    }

    /// Bucket `i` (`i < buckets`).
    #[cfg(loom)]
    pub fn bucket_at(&self, i: u32) -> Option<&AtomicU32> {
        self.mem().buckets.get(i as usize)
    }

    /// Entry `i` (`None` out of range).
    #[cfg(loom)]
    pub fn entry(&self, i: u32) -> Option<&Entry> {
        self.mem().entries.get(i as usize)
    }

    /// The global use clock.
    #[cfg(loom)]
    pub fn clock(&self) -> &AtomicU64 {
        &self.mem().clock
    }

    /// Client `i`'s counters.
    #[cfg(loom)]
    pub fn counters(&self, i: u32) -> Option<&Counters> {
        self.mem().counters.get(i as usize)
    }

    /// Entry `i`'s use stamp.
    #[cfg(loom)]
    pub fn stamp(&self, i: u32) -> Option<&AtomicU64> {
        self.mem().stamps.get(i as usize)
    }
}

/// A store's records as typed values, for loom models (see the module
/// docs): the same records the file holds, and a plain data region.
#[cfg(loom)]
#[derive(Debug)]
pub struct LoomStore {
    layout: StoreLayout,
    header: Header,
    namespaces: Vec<Namespace>,
    buckets: Vec<AtomicU32>,
    entries: Vec<Entry>,
    clock: AtomicU64,
    counters: Vec<Counters>,
    stamps: Vec<AtomicU64>,
    /// The data region, as words loom sees.
    data: Vec<AtomicU64>,
}

#[cfg(loom)]
impl LoomStore {
    /// A store of `config`, every word zero (a fresh file); format it with
    /// `StoreIndex::format(store.view())`.
    pub fn new(config: super::StoreConfig) -> Result<Self, super::layout::ConfigError> {
        use super::layout::{KEY_WORDS, NAMESPACES};
        let layout = StoreLayout::new(config)?;
        let words = || std::array::from_fn::<AtomicU64, KEY_WORDS, _>(|_| AtomicU64::new(0));
        let n = |x: u32| 0..x as usize;
        Ok(Self {
            layout,
            header: Header {
                magic: AtomicU64::new(0),
                version: AtomicU64::new(0),
                hash: AtomicU64::new(0),
                data_bytes: AtomicU64::new(0),
                extent_bytes: AtomicU64::new(0),
                entries: AtomicU64::new(0),
                clients: AtomicU64::new(0),
                file_bytes: AtomicU64::new(0),
                values: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                failed_reserves: AtomicU64::new(0),
                namespaces: AtomicU64::new(0),
                retired_hits: AtomicU64::new(0),
                retired_misses: AtomicU64::new(0),
                _reserved: std::array::from_fn(|_| AtomicU64::new(0)),
            },
            namespaces: n(NAMESPACES)
                .map(|_| Namespace {
                    state: AtomicU32::new(0),
                    name_len: AtomicU32::new(0),
                    value_size: AtomicU64::new(0),
                    name: words(),
                })
                .collect(),
            buckets: n(layout.buckets).map(|_| AtomicU32::new(0)).collect(),
            entries: n(config.entries)
                .map(|_| Entry {
                    version: radixd_ipc::Version::new(),
                    state: AtomicU32::new(0),
                    ns: AtomicU32::new(0),
                    key_len: AtomicU32::new(0),
                    hash: AtomicU64::new(0),
                    data: AtomicU64::new(0),
                    next: AtomicU32::new(0),
                    generation: AtomicU32::new(0),
                    parent: AtomicU32::new(0),
                    parent_generation: AtomicU32::new(0),
                    _pad: [0; 4],
                    key: words(),
                })
                .collect(),
            clock: AtomicU64::new(0),
            counters: n(config.clients).map(|_| Counters::default()).collect(),
            stamps: n(config.entries).map(|_| AtomicU64::new(0)).collect(),
            data: (0..config.data_bytes.div_ceil(8))
                .map(|_| AtomicU64::new(0))
                .collect(),
        })
    }

    /// A view of the store (valid while `self` lives and stays put).
    pub fn view(&self) -> StoreView {
        let ro = NonNull::from(self).cast::<u8>();
        // SAFETY: under loom the view reads `ro` as this `LoomStore` (see
        // `mem`), which the caller keeps alive and in place; it never uses
        // `rw`.
        unsafe { StoreView::new(ro, ro, self.layout) }
    }
}

impl StoreView {
    /// Copies the `len` bytes at data offset `at` to `dst`; `false`
    /// (nothing copied) when they do not lie inside the data region.
    /// Another process may write them meanwhile: the caller validates the
    /// copy (the entry's version re-check).
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `len` bytes and not overlap the
    /// store's mapping.
    #[cfg(not(loom))]
    pub unsafe fn copy_out(&self, at: u64, dst: *mut u8, len: usize) -> bool {
        let Some(src) = self.data(at, len as u64) else {
            return false;
        };
        // SAFETY: the source lies inside the data mapping (checked by
        // `data`); the caller vouches for `dst`.
        unsafe { radixd_ipc::copy::copy_bulk(src, dst, len) };
        true
    }

    /// Copies `len` bytes from `src` to data offset `at`; `false` (nothing
    /// copied) when they do not lie inside the data region.
    ///
    /// # Safety
    ///
    /// `src` must be valid for reads of `len` bytes, and the range must be
    /// the caller's to write (a slot it reserved).
    #[cfg(not(loom))]
    pub unsafe fn copy_in(&self, at: u64, src: *const u8, len: usize) -> bool {
        let Some(dst) = self.data(at, len as u64) else {
            return false;
        };
        // Release: pairs with the Acquire fence in `Version::still` of a
        // reader whose copy reads these bytes, so the version change that
        // gave the caller this slot (before its reserve was answered) is
        // seen by that re-check. (No instruction on x86.)
        radixd_ipc::sync::fence(radixd_ipc::sync::Ordering::Release);
        // SAFETY: the destination lies inside the data mapping (checked by
        // `data`) and is the caller's; the caller vouches for `src`.
        unsafe { radixd_ipc::copy::copy_bulk(src, dst, len) };
        true
    }

    /// The words of the data region that `len` bytes at `at` touch, if
    /// inside it.
    #[cfg(loom)]
    fn data_words(&self, at: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let end = at.checked_add(len as u64)?;
        (end <= self.layout.config.data_bytes).then(|| (at / 8) as usize..end.div_ceil(8) as usize)
    }

    /// [`StoreView::copy_out`] under loom: one Relaxed load per data word,
    /// so loom sees the copy race the writer's stores.
    ///
    /// # Safety
    ///
    /// As in production.
    #[cfg(loom)]
    pub unsafe fn copy_out(&self, at: u64, dst: *mut u8, len: usize) -> bool {
        let Some(words) = self.data_words(at, len) else {
            return false;
        };
        let data = &self.mem().data;
        for w in words {
            // Relaxed: validated by the caller's version re-check.
            let bytes = data[w]
                .load(radixd_ipc::sync::Ordering::Relaxed)
                .to_le_bytes();
            for (i, b) in bytes.iter().enumerate() {
                let pos = (w * 8 + i) as u64;
                if (at..at + len as u64).contains(&pos) {
                    // SAFETY: inside `dst .. + len` (the caller's).
                    unsafe { dst.add((pos - at) as usize).write(*b) };
                }
            }
        }
        true
    }

    /// [`StoreView::copy_in`] under loom: one Relaxed store per data word.
    ///
    /// # Safety
    ///
    /// As in production.
    #[cfg(loom)]
    pub unsafe fn copy_in(&self, at: u64, src: *const u8, len: usize) -> bool {
        use radixd_ipc::sync::Ordering::{Relaxed, Release};
        let Some(words) = self.data_words(at, len) else {
            return false;
        };
        let data = &self.mem().data;
        // Release: as in production.
        radixd_ipc::sync::fence(Release);
        for w in words {
            // Relaxed, both: the writer owns the slot; its commit publishes.
            let mut bytes = data[w].load(Relaxed).to_le_bytes();
            for (i, b) in bytes.iter_mut().enumerate() {
                let pos = (w * 8 + i) as u64;
                if (at..at + len as u64).contains(&pos) {
                    // SAFETY: inside `src .. + len` (the caller's).
                    *b = unsafe { src.add((pos - at) as usize).read() };
                }
            }
            data[w].store(u64::from_le_bytes(bytes), Relaxed);
        }
        true
    }
}
