//! Where a [`TreeReader`](super::TreeReader) reads an engine region from.
//!
//! Every load the walk makes goes through a [`TreeMem`]: in production
//! [`Mapped`], volatile loads of a (shared, possibly read-only) mapping;
//! under loom (`--cfg loom`) a [`Mirror`], loom atomics that the writer's
//! plain stores are copied into, so the model checker sees the real reader
//! race the real engine.
//!
//! # How loom sees the writer (`cfg(loom)`)
//!
//! The engine writes its records with plain stores through `&mut` slices,
//! which loom does not see: a reader reading them plainly would see every
//! store at once, in order (sequential consistency), and a model would pass
//! with any fence removed. So under loom the engine runs on a
//! [`MirroredRegion`](super::MirroredRegion): its versions are loom atomics
//! kept in the [`Mirror`], and every time the writer touches a version
//! (`Arena::version`, `Arena::table_version`, which every `begin` and `end`
//! goes through) the mirror first stores, `Relaxed`, every word of the
//! region the reader can read (nodes, pages, buckets, tokens) that changed
//! since the last such point. Each plain store thus becomes a relaxed
//! atomic store placed, in the writer's program order, between the same two
//! version operations as the plain store itself: loom may show it to the
//! reader early or late exactly as far as the versions' fences allow.
//!
//! What this does not show: two plain stores to one word between two
//! version operations are one store to loom (the reader never sees the
//! first), and a plain store outside every version bracket (a page's state
//! going from free to owned in `alloc`) becomes visible only at the
//! writer's next version operation.

use std::ptr::NonNull;

use radixd_ipc::Version;

use super::layout::EngineLayout;

/// The loads a [`TreeReader`](super::TreeReader) makes: versions, single
/// words and runs of tokens, each at a byte offset into the engine region
/// of [`TreeMem::layout`].
///
/// # Safety
///
/// An implementor promises that every read at an offset inside
/// `layout().size()` that the methods' contracts allow is sound (never
/// undefined behaviour, whatever another thread or process writes there
/// meanwhile).
pub unsafe trait TreeMem {
    /// The layout of the region read.
    fn layout(&self) -> EngineLayout;

    /// The version at byte offset `at`.
    ///
    /// # Safety
    ///
    /// `at` is 0 (the child table's version) or the offset of a node's
    /// version (`versions_at + 4 * node`, `node < node_cap`).
    unsafe fn version(&self, at: usize) -> &Version;

    /// One `u32` at byte offset `at`, read once.
    ///
    /// # Safety
    ///
    /// `at` is 4-byte aligned and `at + 4 <= layout().size()`.
    unsafe fn word(&self, at: usize) -> u32;

    /// Whether the `key.len()` tokens from byte offset `at` equal `key`,
    /// each read once.
    ///
    /// # Safety
    ///
    /// `at` is 4-byte aligned and `at + 4 * key.len() <= layout().size()`.
    unsafe fn same(&self, at: usize, key: &[u32]) -> bool;
}

/// A region mapped in this process: volatile loads of memory another
/// process (or thread) may be writing, which the versions then judge.
#[derive(Clone, Copy, Debug)]
pub struct Mapped {
    base: NonNull<u8>,
    layout: EngineLayout,
}

impl Mapped {
    /// The region of `layout` at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be aligned to [`REGION_ALIGN`](super::REGION_ALIGN) and
    /// valid for reads of `layout.size()` bytes for as long as the value
    /// (and any copy of it) lives: a shared mapping that stays mapped, or
    /// an engine's own region. Others may write it; this only copies out.
    pub unsafe fn new(base: NonNull<u8>, layout: EngineLayout) -> Self {
        Self { base, layout }
    }
}

// SAFETY: every read is a volatile load of plain integers inside the
// mapping `new`'s caller vouched for, at offsets the callers keep inside
// `layout.size()`; any bits a racing writer left are a valid `u32`.
unsafe impl TreeMem for Mapped {
    #[inline]
    fn layout(&self) -> EngineLayout {
        self.layout
    }

    #[inline]
    unsafe fn version(&self, at: usize) -> &Version {
        // SAFETY: `at` is where the layout keeps a version (the caller's
        // contract): inside the mapping, aligned for the u32 atomic; the
        // writer only ever touches versions atomically (never through
        // `&mut`), so a shared reference to one is sound.
        unsafe { self.base.add(at).cast::<Version>().as_ref() }
    }

    #[inline]
    unsafe fn word(&self, at: usize) -> u32 {
        // SAFETY: aligned and inside the mapping (the caller's contract).
        unsafe { self.base.as_ptr().add(at).cast::<u32>().read_volatile() }
    }

    #[inline]
    unsafe fn same(&self, at: usize, key: &[u32]) -> bool {
        // SAFETY: the caller's contract: `key.len()` aligned u32s from `at`
        // lie inside the mapping.
        unsafe { same_volatile(self.base.as_ptr().add(at).cast::<u32>(), key) }
    }
}

/// Tokens compared per volatile load where there is no SSE2.
#[cfg(not(target_arch = "x86_64"))]
const LANES: usize = 8;

/// Whether the `key.len()` tokens at `tokens` equal `key`, each read once,
/// volatile: with SSE2 on x86-64, else eight tokens per volatile load (one
/// 32-byte vector where the target has one), then the rest one by one.
///
/// # Safety
///
/// As for [`same_sse2`].
#[inline]
unsafe fn same_volatile(tokens: *const u32, key: &[u32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: forwarded from the caller.
        unsafe { same_sse2(tokens, key) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut diff = 0;
        let mut chunks = key.chunks_exact(LANES);
        for (c, k) in chunks.by_ref().enumerate() {
            // SAFETY: `(c + 1) * LANES <= key.len()`: inside what the caller
            // vouches for; `[u32; LANES]` has u32's alignment and takes any
            // bits.
            let t = unsafe { tokens.add(c * LANES).cast::<[u32; LANES]>().read_volatile() };
            diff |= t.iter().zip(k).fold(0, |d, (x, y)| d | (x ^ y));
        }
        let done = key.len() - chunks.remainder().len();
        for (i, k) in chunks.remainder().iter().enumerate() {
            // SAFETY: `done + i < key.len()`: inside what the caller vouches
            // for.
            let t = unsafe { tokens.add(done + i).read_volatile() };
            diff |= t ^ k;
        }
        diff == 0
    }
}

/// Whether the `key.len()` tokens at `tokens` equal `key`, four tokens per
/// volatile 16-byte load where `tokens` is 16-byte aligned (a page's
/// tokens are when the page size is a multiple of 4): a volatile load of a
/// vector type is one instruction, where one of `[u32; 8]` is eight. SSE2
/// is part of every x86-64.
///
/// # Safety
///
/// `tokens` must point at `key.len()` readable `u32`s (which another
/// process may be writing: each is read once, volatile, and judged by the
/// caller's version check).
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn same_sse2(tokens: *const u32, key: &[u32]) -> bool {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
        _mm_setzero_si128, _mm_xor_si128,
    };
    let vectors = if (tokens as usize) % 16 == 0 {
        key.len() / 4
    } else {
        0
    };
    let mut diff = 0u32;
    // SAFETY: SSE2 is baseline on x86-64. The vector loads read tokens
    // `4c..4c + 4` for `c < vectors <= key.len() / 4`, at 16-byte aligned
    // addresses (`tokens` is, and each step is 16 bytes); the key side is
    // an unaligned load inside `key`; the scalar loads read the tokens
    // from `4 * vectors` up to `key.len()`: all inside what the caller
    // vouches for.
    unsafe {
        let mut acc = _mm_setzero_si128();
        for c in 0..vectors {
            let stored = tokens.add(c * 4).cast::<__m128i>().read_volatile();
            let wanted = _mm_loadu_si128(key.as_ptr().add(c * 4).cast::<__m128i>());
            acc = _mm_or_si128(acc, _mm_xor_si128(stored, wanted));
        }
        if _mm_movemask_epi8(_mm_cmpeq_epi8(acc, _mm_setzero_si128())) != 0xffff {
            return false;
        }
        for (i, k) in key.iter().enumerate().skip(vectors * 4) {
            diff |= tokens.add(i).read_volatile() ^ k;
        }
    }
    diff == 0
}

#[cfg(loom)]
pub use mirror::Mirror;

#[cfg(loom)]
mod mirror {
    use std::mem::size_of;
    use std::ops::Range;
    use std::sync::{Arc, Mutex};

    use radixd_ipc::sync::{AtomicU32, Ordering};
    use radixd_ipc::Version;

    use super::TreeMem;
    use crate::engine::layout::EngineLayout;

    /// The loom-visible side of an engine region (see the module doc): the
    /// versions, and a loom atomic per word that readers read.
    pub struct Mirror {
        layout: EngineLayout,
        table: Version,
        versions: Box<[Version]>,
        words: Box<[AtomicU32]>,
        /// The writer's region as last flushed, word by word (the writer's
        /// private memory: a std lock no reader ever takes).
        flushed: Mutex<Vec<u32>>,
    }

    impl Mirror {
        /// The mirror of an empty (zeroed) region of `layout`; made inside
        /// the loom model, like every loom object.
        pub fn new(layout: EngineLayout) -> Arc<Self> {
            let words = layout.size() / size_of::<u32>();
            Arc::new(Self {
                layout,
                table: Version::new(),
                versions: (0..layout.node_cap).map(|_| Version::new()).collect(),
                words: (0..words).map(|_| AtomicU32::new(0)).collect(),
                flushed: Mutex::new(vec![0; words]),
            })
        }

        /// Byte ranges a reader reads: nodes, pages, buckets, tokens (the
        /// header, the versions' bytes and the free ring it never reads).
        fn read_ranges(&self) -> [Range<usize>; 3] {
            let l = &self.layout;
            [
                l.nodes_at..l.versions_at,
                l.pages_at..l.free_at,
                l.buckets_at..l.size(),
            ]
        }

        /// Stores, `Relaxed`, every readable word of the region at `base`
        /// (the writer's plain memory, `layout.size()` bytes) that changed
        /// since the last flush.
        ///
        /// # Safety
        ///
        /// `base` is aligned for `u32` and valid for reads of
        /// `layout.size()` bytes, which nothing writes during the call.
        pub(crate) unsafe fn flush(&self, base: *const u32) {
            let mut flushed = self.flushed.lock().unwrap_or_else(|e| e.into_inner());
            for range in self.read_ranges() {
                for i in range.start / 4..range.end / 4 {
                    // SAFETY: `i * 4 < layout.size()`, aligned, inside the
                    // region, which nothing writes meanwhile (the caller's
                    // contract).
                    let w = unsafe { base.add(i).read() };
                    if w != flushed[i] {
                        // Relaxed: a plain store of the writer, as loom
                        // should see it (ordered only by the versions).
                        self.words[i].store(w, Ordering::Relaxed);
                        flushed[i] = w;
                    }
                }
            }
        }

        /// The child table's version.
        pub(crate) fn table_version(&self) -> &Version {
            &self.table
        }

        /// Node `node`'s version, if in range.
        pub(crate) fn version(&self, node: u32) -> Option<&Version> {
            self.versions.get(node as usize)
        }
    }

    // SAFETY: every read is a loom atomic load or a reference to a loom
    // atomic owned by the mirror; offsets outside it yield a panic, never
    // undefined behaviour.
    unsafe impl TreeMem for Arc<Mirror> {
        fn layout(&self) -> EngineLayout {
            self.layout
        }

        unsafe fn version(&self, at: usize) -> &Version {
            if at == 0 {
                return &self.table;
            }
            let node = (at - self.layout.versions_at) / size_of::<Version>();
            &self.versions[node]
        }

        unsafe fn word(&self, at: usize) -> u32 {
            // Relaxed: a volatile load of a word the writer stores plainly;
            // the versions' fences order it.
            self.words[at / 4].load(Ordering::Relaxed)
        }

        unsafe fn same(&self, at: usize, key: &[u32]) -> bool {
            // Every token read once, as the volatile compare does.
            let mut diff = 0;
            for (i, k) in key.iter().enumerate() {
                // Relaxed: as in `word`.
                diff |= self.words[at / 4 + i].load(Ordering::Relaxed) ^ k;
            }
            diff == 0
        }
    }
}
