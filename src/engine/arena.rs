//! Typed views of a region: the only place that turns its bytes into slices.

use std::mem::size_of;

use super::config::ConfigError;
use super::event::CacheEvent;
use super::grace::Retirement;
use super::host::HostTier;
use super::hybrid::Hybrid;
use super::layout::{
    Bucket, EngineLayout, Header, Node, Page, ENGINE_VERSION, NIL, NODE_FREE, NODE_LIVE, PAGE_FREE,
    REGION_ALIGN, ROOT,
};
use super::lru::Lru;
use super::region::Region;
use radixd_ipc::Version;

/// Stops at a broken invariant of the region's shared data, which only a
/// process writing the segment behind the daemon's back can cause. The
/// daemon catches the unwind, shuts down with an error that says so and
/// removes the segment; every loop over shared links is bounded so that such
/// damage ends here instead of spinning forever.
#[cold]
#[track_caller]
pub(crate) fn corrupt(what: &str) -> ! {
    panic!("{CORRUPT}: {what}")
}

/// The start of the message of `corrupt`.
pub const CORRUPT: &str = "engine region corrupted";

/// An engine region and the layout that carves it.
pub(crate) struct Arena<R> {
    region: R,
    pub(crate) layout: EngineLayout,
    /// What became cached or went, while KV events are recorded
    /// ([`super::record`]); `None` when they are not.
    pub(crate) events: Option<Vec<CacheEvent>>,
    /// Emptied buffers handed back for the next `Stored` facts (see
    /// [`super::Engine::recycle_event_buffer`]).
    pub(crate) spares: Vec<Vec<u32>>,
    /// The readers' grace period and limbo; `None`: free at once.
    pub(crate) retire: Option<Retirement>,
    /// Last uses and the unlocked leaves eviction may take (`lru`).
    pub(crate) lru: Lru,
    /// The secondary components (`hybrid`); `None` when only FULL is on.
    pub(crate) hybrid: Option<Box<Hybrid>>,
    /// The host tier (`host`); `None` when the layout has no host pages.
    pub(crate) host: Option<Box<HostTier>>,
    /// The namespace the operation under way works in (0: the default);
    /// only walks from the root and leaves hung under it read it (see
    /// [`super::Engine::with_namespace`]).
    pub(crate) ns: u32,
}

impl<R: Region> Arena<R> {
    /// Counts one step along a chain of shared links (parents, limbo or
    /// free lists): a sound chain visits each node at most once, so a longer
    /// one loops and the region is corrupt.
    #[inline]
    pub fn hop(&self, hops: u64) -> u64 {
        if hops > u64::from(self.layout.node_cap) {
            corrupt("a parent chain or a list loops");
        }
        hops + 1
    }

    /// Takes `region` and formats it as an empty cache.
    pub fn new(region: R, layout: EngineLayout) -> Result<Self, ConfigError> {
        let have = region.len();
        if have < layout.size() || region.as_ptr() as usize % REGION_ALIGN != 0 {
            return Err(ConfigError::RegionTooSmall {
                need: layout.size(),
                have,
            });
        }
        let mut arena = Self {
            region,
            layout,
            events: None,
            spares: Vec::new(),
            retire: None,
            lru: Lru::new(layout.node_cap),
            hybrid: None,
            host: (layout.host_capacity > 0)
                .then(|| Box::new(HostTier::new(layout.host_capacity, layout.node_cap))),
            ns: 0,
        };
        arena.format();
        Ok(arena)
    }

    /// Writes an empty cache over the whole region: every page free (handed
    /// out in id order first, as SGLang's allocator does), only the root live.
    ///
    /// Every node's version and the table's move, so a reader standing
    /// anywhere (the root included) starts over.
    pub fn format(&mut self) {
        let nodes = self.layout.node_cap;
        self.table_version().begin();
        for i in 0..nodes {
            self.version(i).begin();
        }
        self.format_inner();
        self.forget_limbo();
        self.lru.clear();
        if let Some(h) = self.hybrid.as_deref_mut() {
            h.clear();
        }
        if let Some(t) = self.host.as_deref_mut() {
            t.clear();
        }
        for i in 0..nodes {
            self.version(i).end();
        }
        self.table_version().end();
    }

    fn format_inner(&mut self) {
        let l = self.layout;
        *self.hdr_mut() = Header {
            layout_version: ENGINE_VERSION,
            page_size: l.page_size,
            capacity: l.capacity,
            bucket_mask: l.buckets - 1,
            free_head: 0,
            free_len: l.capacity,
            node_free: if l.node_cap > 1 { 1 } else { NIL },
            nodes_live: 1,
            components: self.hybrid.as_deref().map_or(0, |h| h.header_bits()),
            swa_window: self.hybrid.as_deref().map_or(0, |h| h.window()),
            owned_pages: 0,
            host_capacity: l.host_capacity,
            total_tokens: 0,
            evictable_tokens: 0,
            protected_tokens: 0,
            evict_scanned: 0,
            evicted_pages: 0,
            _reserved: [0; 1],
        };
        let node_cap = l.node_cap;
        for (i, node) in self.nodes_mut().iter_mut().enumerate() {
            let next = i as u32 + 1;
            let link = if next < node_cap { next } else { NIL };
            *node = Node::empty(node.generation, NODE_FREE, link);
        }
        let root = &mut self.nodes_mut()[ROOT as usize];
        root.state = NODE_LIVE;
        root.generation = root.generation.wrapping_add(1);
        root.link = NIL;
        for page in self.pages_mut() {
            *page = Page {
                state: PAGE_FREE,
                owner_or_run: NIL,
                next: NIL,
                prev: NIL,
            };
        }
        for (i, slot) in self.free_ring_mut().iter_mut().enumerate() {
            *slot = i as u32;
        }
        for b in self.buckets_mut() {
            *b = Bucket { hash: 0, node: NIL };
        }
    }

    /// # Safety
    ///
    /// `at .. at + len * size_of::<T>()` must lie inside the region and be
    /// aligned for `T`, and `T` must be valid for every bit pattern.
    unsafe fn slice<T>(&self, at: usize, len: usize) -> &[T] {
        debug_assert!(at + len * size_of::<T>() <= self.region.len());
        // SAFETY: in bounds and aligned per the caller; every record is plain
        // integers, so any bytes are a valid value; `&self` excludes writers
        // in this process (Region's contract).
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(at).cast::<T>(), len) }
    }

    /// # Safety
    ///
    /// As [`Self::slice`].
    unsafe fn slice_mut<T>(&mut self, at: usize, len: usize) -> &mut [T] {
        debug_assert!(at + len * size_of::<T>() <= self.region.len());
        // SAFETY: as in `slice`; `&mut self` makes this the only live
        // reference into the region.
        unsafe { std::slice::from_raw_parts_mut(self.region.as_ptr().add(at).cast::<T>(), len) }
    }

    /// The child table's version, which readers in other processes check
    /// around a probe (see [`TreeReader`](super::TreeReader)).
    pub fn table_version(&self) -> &Version {
        #[cfg(loom)]
        {
            self.mirror().table_version()
        }
        #[cfg(not(loom))]
        // SAFETY: offset 0 of a REGION_ALIGN-aligned region, a cache line
        // the layout leaves to this word alone; `Version` is one atomic,
        // valid for any bits and only ever shared through `&`.
        unsafe {
            &self.slice::<Version>(0, 1)[0]
        }
    }

    /// Node `node`'s version: made odd before and even after every change
    /// of the node a reader could see (its record, its pages' links and
    /// tokens, its freeing and reuse).
    #[inline]
    pub fn version(&self, node: u32) -> &Version {
        #[cfg(loom)]
        let version = self.mirror().version(node);
        #[cfg(not(loom))]
        // SAFETY: the layout places `node_cap` versions at `versions_at`,
        // aligned; no `&mut` slice ever covers them (they are not inside
        // any record), so a shared reference to the atomic is sound.
        let version = unsafe {
            self.slice::<Version>(self.layout.versions_at, self.layout.node_cap as usize)
        }
        .get(node as usize);
        version.unwrap_or_else(|| corrupt("node index out of range"))
    }

    /// Under loom, the region's mirror, with every plain store made so far
    /// copied into it: each version operation of the writer goes through
    /// here first (see `engine::mem`).
    #[cfg(loom)]
    fn mirror(&self) -> &super::mem::Mirror {
        self.region
            .mirror()
            .unwrap_or_else(|| corrupt("under loom an engine runs on a MirroredRegion"))
    }

    /// Runs a change of the child table inside its version.
    pub fn table_change<T>(&mut self, change: impl FnOnce(&mut Self) -> T) -> T {
        self.table_version().begin();
        let result = change(self);
        self.table_version().end();
        result
    }

    /// Runs a change of node `node` inside its version.
    pub fn node_change<T>(&mut self, node: u32, change: impl FnOnce(&mut Self) -> T) -> T {
        self.version(node).begin();
        let result = change(self);
        self.version(node).end();
        result
    }

    pub fn hdr(&self) -> &Header {
        // SAFETY: the header sits at offset 0 of a REGION_ALIGN-aligned
        // region at least `layout.size()` bytes long (checked in `new`).
        unsafe { &self.slice::<Header>(self.layout.header_at, 1)[0] }
    }

    pub fn hdr_mut(&mut self) -> &mut Header {
        // SAFETY: as in `hdr`; `&mut self` makes the reference unique.
        unsafe { &mut self.slice_mut::<Header>(self.layout.header_at, 1)[0] }
    }

    pub fn nodes(&self) -> &[Node] {
        // SAFETY: the layout places `node_cap` nodes at `nodes_at`, aligned.
        unsafe { self.slice(self.layout.nodes_at, self.layout.node_cap as usize) }
    }

    pub fn nodes_mut(&mut self) -> &mut [Node] {
        // SAFETY: as in `nodes`; `&mut self` makes the slice unique.
        unsafe { self.slice_mut(self.layout.nodes_at, self.layout.node_cap as usize) }
    }

    pub fn pages(&self) -> &[Page] {
        // SAFETY: the layout places `capacity` pages at `pages_at`, aligned.
        unsafe { self.slice(self.layout.pages_at, self.layout.capacity as usize) }
    }

    pub fn pages_mut(&mut self) -> &mut [Page] {
        // SAFETY: as in `pages`; `&mut self` makes the slice unique.
        unsafe { self.slice_mut(self.layout.pages_at, self.layout.capacity as usize) }
    }

    pub fn free_ring(&self) -> &[u32] {
        // SAFETY: the layout places `capacity` u32s at `free_at`, aligned.
        unsafe { self.slice(self.layout.free_at, self.layout.capacity as usize) }
    }

    pub fn free_ring_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `free_ring`; `&mut self` makes the slice unique.
        unsafe { self.slice_mut(self.layout.free_at, self.layout.capacity as usize) }
    }

    pub fn buckets(&self) -> &[Bucket] {
        // SAFETY: the layout places `buckets` buckets at `buckets_at`.
        unsafe { self.slice(self.layout.buckets_at, self.layout.buckets as usize) }
    }

    pub fn buckets_mut(&mut self) -> &mut [Bucket] {
        // SAFETY: as in `buckets`; `&mut self` makes the slice unique.
        unsafe { self.slice_mut(self.layout.buckets_at, self.layout.buckets as usize) }
    }

    fn token_len(&self) -> usize {
        self.layout.capacity as usize * self.layout.page_size as usize
    }

    pub fn tokens(&self) -> &[u32] {
        // SAFETY: the layout places `capacity * page_size` u32s at
        // `tokens_at`, aligned.
        unsafe { self.slice(self.layout.tokens_at, self.token_len()) }
    }

    pub fn tokens_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `tokens`; `&mut self` makes the slice unique.
        unsafe { self.slice_mut(self.layout.tokens_at, self.token_len()) }
    }

    /// The tokens stored for `page`.
    #[inline]
    pub fn page_tokens(&self, page: u32) -> &[u32] {
        let p = self.layout.page_size as usize;
        let at = page as usize * p;
        &self.tokens()[at..at + p]
    }

    /// Whether `page` holds exactly `key` (one page of tokens).
    #[inline]
    pub fn page_is(&self, page: u32, key: &[u32]) -> bool {
        same_tokens(self.page_tokens(page), key)
    }

    /// The region, for whoever maps it elsewhere.
    pub fn region(&self) -> &R {
        &self.region
    }
}

/// `a == b` for two pages of tokens, as a branch-free fold: it vectorizes
/// for any page size and, unlike slice equality, never calls `bcmp`, whose
/// call costs more than comparing a small page (P = 1 compares a token per
/// page hop).
#[inline]
pub fn same_tokens(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}
