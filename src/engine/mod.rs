//! The cache engine: a radix tree of token sequences over a pool of KV pages,
//! with per-client locks and page-granular, leaf-first LRU eviction.
//!
//! Everything a reader of the tree needs lives in one [`Region`] of plain
//! `#[repr(C)]` records addressed by `u32` indices (see [`layout`]), so the
//! same engine runs on the heap ([`HeapRegion`]) and in a shared-memory
//! segment. Per-client bookkeeping (which client holds which lock) lives
//! beside it in ordinary process memory.
//!
//! Semantics follow SGLang's `RadixCache`: keys are cut to whole pages; a
//! match or insert that ends inside an edge splits it there; `lock_ref`
//! counts locks on a node and its descendants, and `evictable_tokens` /
//! `protected_tokens` move on its 0 ↔ 1 transitions.
//!
//! Readers in other processes walk the same region without locks
//! ([`TreeReader`]), validating node by node against per-node versions.
//!
//! Memory: 48 bytes per node plus a 4-byte version (at most `capacity + 1`
//! nodes), 16 bytes + 4 bytes
//! of free ring + 16 bytes of child table per page, plus the tokens.

mod arena;
pub use arena::CORRUPT;
mod config;
mod error;
mod event;
mod grace;
mod hybrid;
pub mod layout;
mod limbo;
mod lru;
mod mem;
mod namespace;
mod pool;
mod reader;
mod record;
mod region;
mod session;
mod table;
mod tree;
mod validate;

use std::collections::HashMap;

pub use config::{Config, ConfigError};
pub use error::{AnchorError, HandleError, InvariantError, PageError};
pub use event::CacheEvent;
pub use grace::Grace;
pub use hybrid::{
    Component, ComponentError, ComponentStats, Components, ComponentsError, Evicted, InsertExtra,
    InsertedExtra, MambaConfig, MatchExtra, SwaConfig, MAX_STATES,
};
pub use layout::{EngineLayout, REGION_ALIGN};
pub use lru::{Recency, RecencyError};
#[cfg(loom)]
pub use mem::Mirror;
pub use mem::{Mapped, TreeMem};
pub use namespace::{
    check_namespace, check_namespace_len, NamespaceError, NamespaceSize, MAX_NAMESPACES,
    MAX_NAMESPACE_LEN,
};
pub use reader::{Anchor, Peeked, TreeReader, Usable};
#[cfg(loom)]
pub use region::MirroredRegion;
pub use region::{HeapRegion, Region};
pub use session::{SessionError, SessionStatus};

use arena::Arena;
use hybrid::Hybrid;
use layout::{NIL, NODE_LIVE, PAGE_CLAIMED, PAGE_OWNED, ROOT};
use session::Session;
use tree::Walk;

/// Recycled event buffers an engine keeps at most.
pub const SPARE_BUFFERS: usize = 64;
/// Longest recycled event buffer kept (elements): 64 KiB of tokens.
pub const SPARE_BUFFER_LEN: usize = 16 * 1024;

/// Identifies the client that owns pages and locks.
pub type ClientId = u32;

/// Names a tree node: its index and the generation it had when named, so a
/// handle to a node that has since been evicted is detected, never followed.
///
/// In an engine with SWA, the handle a lock answers names that lock (its
/// receipt: two locks on one node may cover different windows, so each must
/// release its own): [`Handle::LOCK`] is set in `index`, whose other bits
/// are the node, and `generation` is the lock's serial on that node. It
/// still names the node (for `lock`) while the node lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    /// Slot in the node arena (with [`Handle::LOCK`] on a lock's handle).
    pub index: u32,
    /// Generation of the slot when the handle was made (a lock's serial on
    /// a lock's handle).
    pub generation: u32,
}

impl Handle {
    /// The bit of `index` that marks a lock's handle (no node slot has it:
    /// there are at most 2^30 + 1).
    pub const LOCK: u32 = 1 << 31;

    /// Whether this handle names a lock (an engine with SWA).
    pub fn is_lock(self) -> bool {
        self.index & Self::LOCK != 0
    }

    /// The node slot the handle names.
    pub fn node(self) -> u32 {
        self.index & !Self::LOCK
    }

    /// The handle as one integer (generation in the high half), as it
    /// travels in JSON and over the wire.
    pub fn to_raw(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    /// The inverse of [`Handle::to_raw`].
    pub fn from_raw(raw: u64) -> Self {
        Self {
            index: raw as u32,
            generation: (raw >> 32) as u32,
        }
    }
}

/// The answer to an insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inserted {
    /// Page-aligned tokens of the key that were cached before.
    pub cached: usize,
    /// Page-aligned length of the key: tokens cached for it now.
    pub len: usize,
    /// The locked node covering the key, when a lock was asked for and the
    /// key holds at least one page.
    pub handle: Option<Handle>,
}

/// The answer to a match (the pages go to the caller's buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matched {
    /// Tokens of the longest cached page-aligned prefix.
    pub len: usize,
    /// The node covering exactly those tokens (locked when a lock was asked
    /// for); `None` when nothing matched.
    pub handle: Option<Handle>,
}

/// Figures of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tokens cached in the tree.
    pub total_tokens: u64,
    /// Cached tokens no lock protects.
    pub evictable_tokens: u64,
    /// Cached tokens some lock protects.
    pub protected_tokens: u64,
    /// Pages in the free pool.
    pub free_pages: u64,
    /// Pages owned by clients (allocated, not yet inserted or freed).
    pub owned_pages: u64,
    /// Tree nodes, the root not counted.
    pub nodes: u64,
    /// LRU list nodes visited by eviction scans since start or reset.
    pub evict_scanned: u64,
    /// Pages evicted since start or reset.
    pub evicted_pages: u64,
}

impl Stats {
    /// Number of figures.
    pub const LEN: usize = 8;

    /// The figures in declaration order, for compact transport.
    pub fn to_array(&self) -> [u64; Self::LEN] {
        [
            self.total_tokens,
            self.evictable_tokens,
            self.protected_tokens,
            self.free_pages,
            self.owned_pages,
            self.nodes,
            self.evict_scanned,
            self.evicted_pages,
        ]
    }

    /// The inverse of [`Stats::to_array`].
    pub fn from_array(a: [u64; Self::LEN]) -> Self {
        let [total_tokens, evictable_tokens, protected_tokens, free_pages, owned_pages, nodes, evict_scanned, evicted_pages] =
            a;
        Self {
            total_tokens,
            evictable_tokens,
            protected_tokens,
            free_pages,
            owned_pages,
            nodes,
            evict_scanned,
            evicted_pages,
        }
    }
}

/// A radix-tree prefix cache over a region `R`.
pub struct Engine<R = HeapRegion> {
    arena: Arena<R>,
    /// `(client, node)` → locks that client holds on that node.
    locks: HashMap<(ClientId, u32), u32>,
    /// With SWA: `(client, node)` → the serials of those locks, oldest
    /// first (see [`Handle`]).
    serials: HashMap<(ClientId, u32), Vec<u32>>,
    /// Live sessions by id.
    sessions: HashMap<String, Session>,
    /// Reused buffer for the pages a walk passes.
    walked: Vec<u32>,
    /// The namespaces' names (see `namespace`).
    namespaces: namespace::Namespaces,
}

impl Engine<HeapRegion> {
    /// An empty engine on the heap.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        let layout = EngineLayout::new(config.page_size, config.capacity)?;
        let region = HeapRegion::zeroed(layout.size()).ok_or(ConfigError::OutOfMemory {
            bytes: layout.size(),
        })?;
        Self::in_region(region, layout)
    }
}

impl Engine<HeapRegion> {
    /// An empty engine on the heap caching `components` beside FULL.
    pub fn with_components(
        config: Config,
        components: Components,
    ) -> Result<Self, ComponentsError> {
        let mut e = Self::new(config).map_err(|e| ComponentsError(e.to_string()))?;
        e.set_components(components)?;
        Ok(e)
    }
}

impl<R: Region> Engine<R> {
    /// Empties the cache and from now on caches `components` beside FULL
    /// (their pools start empty of data: every SWA page and state free).
    pub fn set_components(&mut self, components: Components) -> Result<(), ComponentsError> {
        components.check()?;
        let l = self.arena.layout;
        self.arena.hybrid = Hybrid::new(components, l.node_cap, l.capacity);
        self.reset();
        Ok(())
    }

    /// Sets what a split counts as a use of (see [`Recency`]); the cache
    /// keeps what it holds.
    pub fn set_recency(&mut self, recency: Recency) {
        self.arena.lru.set_recency(recency);
    }

    /// What a split counts as a use of.
    pub fn recency(&self) -> Recency {
        self.arena.lru.recency()
    }

    /// The components this engine caches.
    pub fn components(&self) -> Components {
        self.arena
            .hybrid
            .as_deref()
            .map_or_else(Components::full, Hybrid::components)
    }

    /// Figures of the secondary components; `None` when only FULL is on.
    pub fn component_stats(&self) -> Option<ComponentStats> {
        self.arena.hybrid.as_deref().map(Hybrid::stats)
    }

    /// An empty engine formatted over `region`, which must be at least
    /// `layout.size()` bytes.
    pub fn in_region(region: R, layout: EngineLayout) -> Result<Self, ConfigError> {
        Ok(Self {
            arena: Arena::new(region, layout)?,
            locks: HashMap::new(),
            serials: HashMap::new(),
            sessions: HashMap::new(),
            walked: Vec::new(),
            namespaces: namespace::Namespaces::default(),
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> u32 {
        self.arena.layout.page_size
    }

    /// Pages in the pool.
    pub fn capacity(&self) -> u32 {
        self.arena.layout.capacity
    }

    /// The region the engine lives in.
    pub fn region(&self) -> &R {
        self.arena.region()
    }

    /// Where everything sits in the region (for a [`TreeReader`]).
    pub fn layout(&self) -> EngineLayout {
        self.arena.layout
    }

    fn aligned(&self, len: usize) -> usize {
        let p = self.page_size() as usize;
        len / p * p
    }

    /// Hands `n` pages to `client`, evicting exactly the shortfall when the
    /// free pool is short. Fails, changing nothing, when free plus evictable
    /// pages are fewer than `n`.
    ///
    /// With a [`Grace`] set ([`Engine::set_grace`]), evicted pages pass
    /// through limbo: `alloc` first reclaims what readers have released
    /// (with no reader announced, what it evicts is reusable at once). Pages
    /// still in limbo count as on their way back, so the shortfall is
    /// evicted once, however often the caller retries. If readers still
    /// hold what it needs after a bounded few microseconds, it fails with
    /// [`PageError::HeldByReaders`] and hands out nothing (what it evicted
    /// waits in limbo, counted in [`Engine::in_limbo`]).
    pub fn alloc(&mut self, client: ClientId, n: u64) -> Result<Vec<u32>, PageError> {
        let mut pages = Vec::new();
        self.alloc_into(client, n, &mut pages).map(|()| pages)
    }

    /// [`Engine::alloc`] into `pages` (cleared first; left empty on error),
    /// for a caller that reuses its buffer.
    pub fn alloc_into(
        &mut self,
        client: ClientId,
        n: u64,
        pages: &mut Vec<u32>,
    ) -> Result<(), PageError> {
        pages.clear();
        self.arena.reclaim();
        let h = self.arena.hdr();
        let free = u64::from(h.free_len);
        let held = u64::from(self.arena.in_limbo().0);
        let evictable = h.evictable_tokens / u64::from(self.page_size());
        if n > free + held + evictable {
            return Err(PageError::Insufficient {
                requested: n,
                available: free + held + evictable,
            });
        }
        if n > free {
            self.arena.evict_pages(n - free - held.min(n - free));
            // n <= free + held + evictable <= capacity, so it fits in u32.
            self.arena.reclaim_until_free(n as u32);
            let free = u64::from(self.arena.hdr().free_len);
            if free < n {
                return Err(PageError::HeldByReaders {
                    requested: n,
                    free,
                    held: u64::from(self.arena.in_limbo().0),
                });
            }
        }
        if let Some(free) = self.arena.swa().map(|s| s.free.len() as u64) {
            // SGLang's SWA allocator pairs each page with an SWA page,
            // evicting SWA data when its pool is short.
            if n > free {
                self.arena.hy_tally_reset();
                let p = u64::from(self.page_size());
                self.arena.hy_swa_evict((n - free) * p);
                let free = self.arena.swa().map_or(0, |s| s.free.len() as u64);
                if n > free {
                    return Err(PageError::SwaInsufficient {
                        requested: n,
                        available: free,
                    });
                }
            }
        }
        pages.extend((0..n).map(|_| self.arena.pool_take(client)));
        if self.arena.swa().is_some() {
            for &page in pages.iter() {
                self.arena.hy_pair(page);
            }
        }
        Ok(())
    }

    /// Gives readers of the region a grace period: from now on freed nodes
    /// and evicted pages wait in limbo until `grace` says no reader can
    /// still hold them. Without one (the default) they are reusable at
    /// once. Records already in limbo wait on under the new grace.
    pub fn set_grace(&mut self, grace: Box<dyn Grace + Send>) {
        self.arena.set_grace(grace);
    }

    /// Advances the readers' grace period as far as they allow and returns
    /// what it released to the free lists; the daemon calls it each round.
    /// Returns the records released (0 without a grace).
    pub fn reclaim(&mut self) -> usize {
        self.arena.reclaim()
    }

    /// Pages and nodes waiting in limbo for readers to move on. Limbo pages
    /// are counted neither in `Stats::free_pages` nor as cached.
    pub fn in_limbo(&self) -> (u32, u32) {
        self.arena.in_limbo()
    }

    /// Returns pages `client` owns to the free pool; all or none.
    pub fn free(&mut self, client: ClientId, pages: &[u32]) -> Result<(), PageError> {
        self.check_range(pages)?;
        self.claim(client, pages, |_, _| false)?;
        for &page in pages {
            self.arena.pool_release_owned(page);
        }
        Ok(())
    }

    fn check_range(&self, pages: &[u32]) -> Result<(), PageError> {
        let capacity = self.capacity();
        match pages.iter().find(|&&p| p >= capacity) {
            Some(&page) => Err(PageError::OutOfRange {
                page: u64::from(page),
                capacity,
            }),
            None => Ok(()),
        }
    }

    /// Marks every page of `pages` that `keep(i, page)` does not excuse as
    /// claimed, checking that `client` owns it; a page named twice fails the
    /// second time. On failure every mark is undone.
    fn claim(
        &mut self,
        client: ClientId,
        pages: &[u32],
        keep: impl Fn(usize, u32) -> bool,
    ) -> Result<(), PageError> {
        for (i, &page) in pages.iter().enumerate() {
            if keep(i, page) {
                continue;
            }
            let pg = &mut self.arena.pages_mut()[page as usize];
            if pg.state != PAGE_OWNED || pg.owner_or_run != client {
                for (j, &undo) in pages[..i].iter().enumerate() {
                    let pg = &mut self.arena.pages_mut()[undo as usize];
                    if !keep(j, undo) && pg.state == PAGE_CLAIMED {
                        pg.state = PAGE_OWNED;
                    }
                }
                return Err(PageError::NotOwned { page });
            }
            pg.state = PAGE_CLAIMED;
        }
        Ok(())
    }

    /// Caches `tokens` (cut to whole pages) with `pages`, one per whole page.
    ///
    /// Where the prefix is already cached by the same page id nothing
    /// changes; a different page id there is a duplicate the caller owns and
    /// goes back to the free pool. The rest of the key becomes a new leaf.
    /// With `lock`, the node covering the key is locked for `client`.
    pub fn insert(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<Inserted, PageError> {
        self.insert_with(client, tokens, pages, lock, InsertExtra::default())
            .map(|(inserted, _)| inserted)
    }

    /// [`Engine::insert`] with the extras of a hybrid engine: a state to
    /// checkpoint at the key's end and the tokens whose SWA pages the
    /// client already freed. Either extra on an engine without its
    /// component fails with [`PageError::Component`], changing nothing.
    pub fn insert_with(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        extra: InsertExtra,
    ) -> Result<(Inserted, InsertedExtra), PageError> {
        let (node, mut inserted, ie) = self.insert_node(client, tokens, pages, extra)?;
        if lock && node != ROOT {
            inserted.handle = Some(self.lock_node(client, node));
        }
        Ok((inserted, ie))
    }

    /// `insert` without the lock: returns the node that covers the key.
    fn insert_node(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        extra: InsertExtra,
    ) -> Result<(u32, Inserted, InsertedExtra), PageError> {
        let len = self.aligned(tokens.len());
        let key = &tokens[..len];
        self.check_pages(len / self.page_size() as usize, pages)?;
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        let walk = self.arena.walk(key, &mut walked);
        let cached = walk.pages * self.page_size() as usize;
        let (node, ie) = self.insert_walked(client, walk, walked, key, 0, pages, extra)?;
        Ok((
            node,
            Inserted {
                cached,
                len,
                handle: None,
            },
            ie,
        ))
    }

    /// The count and range checks of an insert of `expected` pages.
    fn check_pages(&self, expected: usize, pages: &[u32]) -> Result<(), PageError> {
        if pages.len() != expected {
            return Err(PageError::CountMismatch {
                expected,
                got: pages.len(),
            });
        }
        self.check_range(pages)
    }

    /// The rest of an insert once `walk` has followed the key, whose matched
    /// pages are `walked`: `key` is the key from page `base` on, `pages`
    /// one per page of the whole key (count and range checked). Claims the
    /// pages not already cached at their place, returns duplicates to the
    /// pool, hangs the uncached rest as a new leaf; all or nothing.
    #[allow(clippy::too_many_arguments)] // one call per insert form; a struct would only rename them
    fn insert_walked(
        &mut self,
        client: ClientId,
        walk: Walk,
        walked: Vec<u32>,
        key: &[u32],
        base: usize,
        pages: &[u32],
        extra: InsertExtra,
    ) -> Result<(u32, InsertedExtra), PageError> {
        let cached = walk.pages;
        let same = |i: usize, page: u32| i < cached && walked[i] == page;
        let hybrid = self.arena.hybrid.is_some() || extra != InsertExtra::default();
        if hybrid {
            if let Err(e) = self.check_extra(client, pages, same, extra) {
                self.walked = walked;
                return Err(e);
            }
        }
        if let Err(e) = self.claim(client, pages, same) {
            self.walked = walked;
            return Err(e);
        }
        let mut node = self.arena.settle(walk);
        if hybrid && self.arena.swa().is_some() {
            self.recover_swa(node, &walked[..cached], pages, extra.swa_evicted);
        }
        for (i, &page) in pages[..cached].iter().enumerate() {
            if walked[i] != page {
                self.arena.pool_release_owned(page);
            }
        }
        self.walked = walked;
        let p = self.page_size() as usize;
        if cached < pages.len() {
            node = self
                .arena
                .add_leaf(node, &key[(cached - base) * p..], &pages[cached..]);
            if hybrid {
                let live_from = (extra.swa_evicted as usize / p).max(cached) - cached;
                self.arena.hy_swa_commit_leaf(node, live_from as u32);
            }
        }
        self.arena.touch(node);
        let mut ie = InsertedExtra::default();
        if hybrid {
            if let Some(state) = extra.mamba_state {
                ie.mamba_exist = self.arena.hy_mamba_commit(node, state);
            }
            self.arena.hy_refresh(node, false);
        }
        Ok((node, ie))
    }

    /// The checks of an insert's extras, before anything changes: a state
    /// the client owns, `swa_evicted` page-aligned and within the key, and
    /// the client's pages paired exactly from `swa_evicted` on. Pages the
    /// claim will refuse are left to it.
    fn check_extra(
        &self,
        client: ClientId,
        pages: &[u32],
        same: impl Fn(usize, u32) -> bool,
        extra: InsertExtra,
    ) -> Result<(), PageError> {
        if let Some(state) = extra.mamba_state {
            let Some(m) = self.arena.mamba() else {
                return Err(PageError::Component(ComponentError::NotEnabled(
                    Component::Mamba,
                )));
            };
            if !m.owns(client, u64::from(state)) {
                return Err(PageError::Component(ComponentError::StateNotOwned {
                    state: u64::from(state),
                }));
            }
        }
        let Some(s) = self.arena.swa() else {
            if extra.swa_evicted > 0 {
                return Err(PageError::Component(ComponentError::NotEnabled(
                    Component::Swa,
                )));
            }
            return Ok(());
        };
        let p = u64::from(self.page_size());
        let len = pages.len() as u64 * p;
        if extra.swa_evicted % p != 0 || extra.swa_evicted > len {
            return Err(PageError::SwaEvicted {
                tokens: extra.swa_evicted,
                len,
            });
        }
        for (i, &page) in pages.iter().enumerate() {
            let pg = &self.arena.pages()[page as usize];
            if same(i, page) || pg.state != PAGE_OWNED || pg.owner_or_run != client {
                continue;
            }
            let paired = s.pair[page as usize] != NIL;
            if paired != (i as u64 * p >= extra.swa_evicted) {
                return Err(PageError::SwaPairing { page, paired });
            }
        }
        Ok(())
    }

    /// SGLang's tombstone recovery: each SWA tombstone on the path to
    /// `node` (whose pages are `walked`) inside the window takes the SWA
    /// pages of the client's `pages` at its place, from `swa_evicted` on
    /// (splitting the tombstone there), where every one of them is a
    /// paired duplicate.
    fn recover_swa(&mut self, node: u32, walked: &[u32], pages: &[u32], swa_evicted: u64) {
        if self.arena.path_holds_swa(node) {
            // No tombstone on the path (the usual case): nothing to
            // recover, and no path to collect.
            return;
        }
        let p = u64::from(self.page_size());
        let from = (swa_evicted / p) as usize;
        let path = self.arena.path_up(node);
        let mut end = walked.len();
        let mut spans = Vec::with_capacity(path.len());
        for &n in &path {
            let start = end - self.arena.nodes()[n as usize].num_pages as usize;
            spans.push((n, start, end));
            end = start;
        }
        for (n, start, end) in spans.into_iter().rev() {
            let Some(s) = self.arena.swa() else { return };
            if s.live[n as usize] {
                continue;
            }
            let live = from.max(start);
            let usable =
                (live..end).all(|i| walked[i] != pages[i] && s.pair[pages[i] as usize] != NIL);
            if live >= end || !usable {
                continue;
            }
            if live > start {
                self.arena.split_at(n, (live - start) as u32);
            }
            self.arena.hy_swa_recover(n, &pages[live..end]);
        }
    }

    /// Where `anchor` (from a [`TreeReader::peek_anchored`] of a key whose
    /// first `matched_pages` pages it covers) stands in the tree now, as
    /// the walk of those pages would have left it; changes nothing.
    ///
    /// # Why a version check suffices
    ///
    /// The anchor is untrusted: everything is checked against the tree, and
    /// every loop is bounded. What makes a matching version enough is the
    /// reader's guarantee: every change of a node a walk could see moves
    /// its version (creation, split of it, trim of its pages, removal,
    /// freeing and reuse); a split of an ancestor keeps the node's path;
    /// eviction only takes leaves, never an ancestor of a live node. So
    /// while the version stands still, so do the node's path from the root
    /// and its pages: the tokens and pages the reader matched down to the
    /// anchor are still cached there, and a match that stopped inside the
    /// node still stops there (its next page is unchanged). What moves no
    /// version: lock counts, LRU links, and children added under the node
    /// (only the child table's version moves); the first two do not change
    /// what a match finds, and the callers handle the third (`match_at`
    /// probes the key's next page's hash, `insert_at` walks on).
    fn anchored_walk(&self, anchor: &Anchor, matched_pages: usize) -> Result<Walk, AnchorError> {
        let a = &self.arena;
        let node = anchor.node;
        if node == ROOT || node >= a.layout.node_cap {
            return Err(AnchorError::Invalid("node out of range or the root"));
        }
        if anchor.version % 2 != 0 {
            return Err(AnchorError::Invalid(
                "a reader validates only even versions",
            ));
        }
        let n = a.nodes()[node as usize];
        if n.state != NODE_LIVE || n.generation != anchor.generation {
            return Err(AnchorError::Moved);
        }
        // The daemon is the only writer and changes nothing now: the
        // version is even and current.
        if a.version(node).stable() != Some(anchor.version) {
            return Err(AnchorError::Moved);
        }
        let k = anchor.pages_into_node;
        if k == 0 || k > n.num_pages {
            return Err(AnchorError::Invalid(
                "pages into the node outside 1..=its pages",
            ));
        }
        let mut depth = u64::from(k);
        let (mut up, mut hops) = (n.parent, 0);
        while up != ROOT {
            hops = a.hop(hops);
            let u = a.nodes().get(up as usize);
            let u = u.unwrap_or_else(|| arena::corrupt("parent out of range"));
            depth += u64::from(u.num_pages);
            up = u.parent;
        }
        if depth != matched_pages as u64 {
            return Err(AnchorError::Invalid(
                "matched pages are not the anchor's depth",
            ));
        }
        if k == n.num_pages {
            return Ok(Walk {
                node,
                partial: None,
                pages: matched_pages,
                ns: n.ns,
            });
        }
        let at = self.nth_page(n.first_page, k);
        Ok(Walk {
            node: n.parent,
            partial: Some((node, at, k)),
            pages: matched_pages,
            ns: n.ns,
        })
    }

    /// The page `k` links after `page` (bounded: `k` is below the node's
    /// page count, and a shorter list is corrupt).
    fn nth_page(&self, mut page: u32, k: u32) -> u32 {
        let pages = self.arena.pages();
        for _ in 0..k {
            let pg = pages.get(page as usize);
            page = pg.unwrap_or_else(|| arena::corrupt("page list")).next;
        }
        if page == NIL {
            arena::corrupt("page list shorter than its node");
        }
        page
    }

    /// Appends the pages of the path from the root to the first `k` pages
    /// of `node` to `out`, root first (bounded as in `anchored_walk`).
    fn path_pages(&self, node: u32, k: u32, out: &mut Vec<u32>) {
        let nodes = self.arena.nodes();
        let node_at = |at: u32| {
            *nodes
                .get(at as usize)
                .unwrap_or_else(|| arena::corrupt("parent link"))
        };
        // Pages on the path, then filled from the node up, each node's
        // pages in order in its range: no list of the path's nodes.
        let (mut total, mut up, mut hops) = (0usize, node, 0);
        while up != ROOT {
            hops = self.arena.hop(hops);
            let n = node_at(up);
            total += if up == node { k } else { n.num_pages } as usize;
            up = n.parent;
        }
        let start = out.len();
        out.resize(start + total, 0);
        let (mut end, mut up, mut hops) = (start + total, node, 0);
        while up != ROOT {
            hops = self.arena.hop(hops);
            let n = node_at(up);
            let count = if up == node { k } else { n.num_pages } as usize;
            let from = end
                .checked_sub(count)
                .unwrap_or_else(|| arena::corrupt("path pages changed while read"));
            let mut page = n.first_page;
            for slot in &mut out[from..end] {
                *slot = page;
                page = self
                    .arena
                    .pages()
                    .get(page as usize)
                    .unwrap_or_else(|| arena::corrupt("page list"))
                    .next;
            }
            end = from;
            up = n.parent;
        }
    }

    /// [`Engine::match_prefix`] of a key whose first `matched_pages` pages a
    /// reader matched down to `anchor`, without the key: the same answer
    /// and the same changes as the full request now (split, LRU touch,
    /// lock), or [`AnchorError::Moved`] when the tree changed under the
    /// anchor, and then nothing changed.
    ///
    /// `next_hash` is the reader's [`Peeked::next_hash`]: when the match
    /// took the anchor's node whole and the key goes on, a child added
    /// since under that hash may continue the match, and the answer would
    /// no longer be the longest: `Moved` (a hash collision only costs a
    /// fallback). A match that stops inside the node needs no such check:
    /// the node's next page is as the reader saw it.
    ///
    /// With `pages`, the matched pages are written there (cleared first);
    /// a client has them from its read already.
    pub fn match_at(
        &mut self,
        client: ClientId,
        anchor: &Anchor,
        matched_pages: usize,
        next_hash: Option<u32>,
        lock: bool,
        pages: Option<&mut Vec<u32>>,
    ) -> Result<Matched, AnchorError> {
        let walk = self.anchored_walk(anchor, matched_pages)?;
        if let (None, Some(hash)) = (walk.partial, next_hash) {
            if self.arena.has_child_hashed(anchor.node, hash) {
                return Err(AnchorError::Moved);
            }
        }
        let mut out = pages;
        if let Some(out) = out.as_deref_mut() {
            out.clear();
            self.path_pages(anchor.node, anchor.pages_into_node, out);
        }
        let mut node = self.arena.settle(walk);
        let mut len_pages = matched_pages;
        if self.arena.hybrid.is_some() {
            (node, len_pages) = self.arena.hy_match(node);
            if let Some(out) = out {
                out.truncate(len_pages);
            }
        }
        self.arena.touch(node);
        let handle = match (node == ROOT, lock) {
            (true, _) => None,
            (false, true) => Some(self.lock_node(client, node)),
            (false, false) => Some(self.handle_of(node)),
        };
        Ok(Matched {
            len: len_pages * self.page_size() as usize,
            handle,
        })
    }

    /// [`Engine::insert`] of a key whose first `matched_pages` pages a
    /// reader matched down to `anchor`, sent as `tokens`, the key after
    /// those pages, and `pages`, one per whole page of the whole key
    /// (`matched_pages` of them for the matched part, compared with the
    /// cached ones exactly as `insert` does). The same answer and changes
    /// as the full request now, or [`AnchorError::Moved`] (nothing
    /// changed). Whatever was cached below the anchor since the read is
    /// found by walking on from it.
    pub fn insert_at(
        &mut self,
        client: ClientId,
        anchor: &Anchor,
        matched_pages: usize,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<Inserted, AnchorError> {
        let start = self.anchored_walk(anchor, matched_pages)?;
        let p = self.page_size() as usize;
        let len = self.aligned(tokens.len());
        let key = &tokens[..len];
        self.check_pages(matched_pages + len / p, pages)?;
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        self.path_pages(anchor.node, anchor.pages_into_node, &mut walked);
        let walk = self.arena.walk_on(start, key, &mut walked);
        let cached = walk.pages * p;
        let (node, _) = self.insert_walked(
            client,
            walk,
            walked,
            key,
            matched_pages,
            pages,
            InsertExtra::default(),
        )?;
        let handle = lock.then(|| self.lock_node(client, node));
        Ok(Inserted {
            cached,
            len: matched_pages * p + len,
            handle,
        })
    }

    /// [`TreeReader::peek_anchored`] on this engine's own region (what a
    /// client reads through the segment), for tests and tools.
    pub fn peek_anchored(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<Peeked> {
        self.own_reader()?.peek_anchored(tokens, pages)
    }

    /// [`TreeReader::peek_usable`] on this engine's own region: what a
    /// match would answer (cut back by the components), touching nothing.
    pub fn peek_usable(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<Usable> {
        self.own_reader()?
            .peek_usable(tokens, pages)
            .map(|(u, _)| u)
    }

    /// A reader of this engine's own region, for one call of `&self`.
    fn own_reader(&self) -> Option<TreeReader> {
        let base = std::ptr::NonNull::new(self.arena.region().as_ptr())?;
        // SAFETY: the region is REGION_ALIGN-aligned and `layout.size()`
        // bytes long (checked when the engine was built) and outlives the
        // reader, which the callers use only within their `&self` call;
        // that borrow keeps this process's writers out meanwhile, and the
        // reader only copies.
        Some(unsafe { TreeReader::new(base, self.arena.layout) })
    }

    /// Finds the longest cached page-aligned prefix of `tokens`, writes its
    /// page ids to `pages` (cleared first) and marks the path as just used.
    /// A match that ends inside an edge splits it there, so the handle covers
    /// exactly the matched tokens; with `lock` it is also locked (SGLang's
    /// `match_prefix` then `inc_lock_ref(last_node)` in one step).
    pub fn match_prefix(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        lock: bool,
        pages: &mut Vec<u32>,
    ) -> Matched {
        self.match_with(client, tokens, lock, pages).0
    }

    /// [`Engine::match_prefix`] with the hybrid parts of the answer: the
    /// match is cut back to where every component can serve it (SWA: the
    /// last `window` tokens hold SWA pages; MAMBA: the node holds a
    /// state), and the extras say how far FULL alone reached and which
    /// state the match ends at.
    pub fn match_with(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        lock: bool,
        pages: &mut Vec<u32>,
    ) -> (Matched, MatchExtra) {
        let key = &tokens[..self.aligned(tokens.len())];
        pages.clear();
        let walk = self.arena.walk(key, pages);
        let mut node = self.arena.settle(walk);
        let p = self.page_size() as usize;
        let mut extra = MatchExtra {
            full_len: walk.pages * p,
            mamba_state: None,
        };
        let mut len_pages = walk.pages;
        if self.arena.hybrid.is_some() {
            // As SGLang, only the usable part is marked used: a node below
            // it keeps its last use (older than its parent or not).
            (node, len_pages) = self.arena.hy_match(node);
            pages.truncate(len_pages);
            extra.mamba_state = self
                .arena
                .mamba()
                .map(|m| m.state[node as usize])
                .filter(|&s| s != NIL && node != ROOT);
        }
        self.arena.touch(node);
        let handle = match (node == ROOT, lock) {
            (true, _) => None,
            (false, true) => Some(self.lock_node(client, node)),
            (false, false) => Some(self.handle_of(node)),
        };
        let matched = Matched {
            len: len_pages * p,
            handle,
        };
        (matched, extra)
    }

    /// The longest cached prefix of `tokens`, without touching anything.
    pub fn peek(&self, tokens: &[u32], pages: &mut Vec<u32>) -> usize {
        let key = &tokens[..self.aligned(tokens.len())];
        pages.clear();
        self.arena.walk(key, pages).pages * self.page_size() as usize
    }

    fn lock_node(&mut self, client: ClientId, node: u32) -> Handle {
        let serial = self.arena.lock_path(node);
        *self.locks.entry((client, node)).or_insert(0) += 1;
        if self.arena.swa().is_none() {
            return self.handle_of(node);
        }
        self.serials.entry((client, node)).or_default().push(serial);
        Handle {
            index: node | Handle::LOCK,
            generation: serial,
        }
    }

    fn handle_of(&self, node: u32) -> Handle {
        Handle {
            index: node,
            generation: self.arena.nodes()[node as usize].generation,
        }
    }

    /// The node `raw` names, and the lock's serial when it is a lock's
    /// handle (SWA on): one taken on the node now in that slot, held or not.
    fn resolve_named(&self, raw: u64) -> Result<(u32, Option<u32>), HandleError> {
        let h = Handle::from_raw(raw);
        if !h.is_lock() || self.arena.swa().is_none() {
            return self.resolve(raw).map(|node| (node, None));
        }
        let node = h.node();
        let live = self
            .arena
            .nodes()
            .get(node as usize)
            .filter(|_| node != ROOT)
            .map(|n| n.state == NODE_LIVE);
        match live {
            None => Err(HandleError::Unknown(raw)),
            Some(true) if self.arena.hy_names(node, h.generation) => Ok((node, Some(h.generation))),
            Some(_) => Err(HandleError::Stale(raw)),
        }
    }

    fn resolve(&self, raw: u64) -> Result<u32, HandleError> {
        let h = Handle::from_raw(raw);
        let node = self
            .arena
            .nodes()
            .get(h.index as usize)
            .filter(|_| h.index != ROOT);
        match node {
            None => Err(HandleError::Unknown(raw)),
            Some(n) if h.generation == 0 || h.generation > n.generation => {
                Err(HandleError::Unknown(raw))
            }
            Some(n) if n.state != NODE_LIVE || n.generation != h.generation => {
                Err(HandleError::Stale(raw))
            }
            Some(_) => Ok(h.index),
        }
    }

    /// Locks the node `handle` names, and its ancestors, for `client`;
    /// answers the lock's handle: with SWA one naming this lock (which
    /// `unlock` then releases exactly), else the node's.
    pub fn lock(&mut self, client: ClientId, handle: u64) -> Result<Handle, HandleError> {
        let (node, _) = self.resolve_named(handle)?;
        Ok(self.lock_node(client, node))
    }

    /// Drops one lock `client` holds on the node `handle` names: with SWA,
    /// the lock a lock's handle names when `client` still holds it (so each
    /// lock releases exactly the window it took, in any order), else the
    /// oldest one (as a node's handle does).
    pub fn unlock(&mut self, client: ClientId, handle: u64) -> Result<(), HandleError> {
        let (node, serial) = self.resolve_named(handle)?;
        let Some(count) = self.locks.get_mut(&(client, node)) else {
            return Err(HandleError::NotLocked(handle));
        };
        *count -= 1;
        if *count == 0 {
            self.locks.remove(&(client, node));
        }
        let serial = self.take_serial(client, node, serial);
        self.arena.unlock_path(node, serial);
        Ok(())
    }

    /// Forgets the serial of one lock `client` holds on `node`: `wanted`
    /// if it holds that one, else its oldest (0 without SWA).
    fn take_serial(&mut self, client: ClientId, node: u32, wanted: Option<u32>) -> u32 {
        let Some(held) = self.serials.get_mut(&(client, node)) else {
            return 0;
        };
        let at = wanted
            .and_then(|w| held.iter().position(|&s| s == w))
            .unwrap_or(0);
        let serial = if at < held.len() { held.remove(at) } else { 0 };
        if held.is_empty() {
            self.serials.remove(&(client, node));
        }
        serial
    }

    /// Evicts `ceil(tokens / page_size)` pages (fewer only when fewer are
    /// evictable); returns the tokens evicted.
    ///
    /// With a [`Grace`] set, what readers have released is reclaimed first
    /// and after (with no reader announced, all of what was just evicted).
    pub fn evict(&mut self, tokens: u64) -> u64 {
        let p = u64::from(self.page_size());
        self.arena.reclaim();
        let evicted = self.arena.evict_pages(tokens.div_ceil(p)) * p;
        self.arena.reclaim();
        evicted
    }

    /// Evicts per component, as SGLang's `evict(EvictParams)`: FULL first
    /// (`tokens`, leaves least recently used first, with their SWA pages
    /// and states), then SWA until `swa_tokens` SWA tokens went in this
    /// call, then MAMBA until `mamba_states` states did; each walk counts
    /// what the earlier ones freed. A nonzero request for a component the
    /// engine lacks fails, changing nothing.
    pub fn evict_components(
        &mut self,
        tokens: u64,
        swa_tokens: u64,
        mamba_states: u64,
    ) -> Result<Evicted, ComponentError> {
        if swa_tokens > 0 && self.arena.swa().is_none() {
            return Err(ComponentError::NotEnabled(Component::Swa));
        }
        if mamba_states > 0 && self.arena.mamba().is_none() {
            return Err(ComponentError::NotEnabled(Component::Mamba));
        }
        if self.arena.hybrid.is_none() {
            return Ok(Evicted {
                tokens: self.evict(tokens),
                ..Evicted::default()
            });
        }
        let p = u64::from(self.page_size());
        self.arena.reclaim();
        self.arena.hy_tally_reset();
        self.arena.evict_pages(tokens.div_ceil(p));
        self.arena.hy_swa_evict(swa_tokens);
        self.arena.hy_mamba_evict(mamba_states);
        self.arena.reclaim();
        let t = self.arena.hy_tally();
        Ok(Evicted {
            tokens: t.full_pages * p,
            swa_tokens: t.swa_tokens,
            mamba_states: t.mamba_states,
        })
    }

    /// Hands a free state slot to `client`, evicting one state (least
    /// recently used, unlocked) when none is free.
    pub fn alloc_state(&mut self, client: ClientId) -> Result<u32, ComponentError> {
        if self.arena.mamba().is_none() {
            return Err(ComponentError::NotEnabled(Component::Mamba));
        }
        if self.arena.mamba().is_some_and(|m| m.free.is_empty()) {
            self.arena.reclaim();
            self.arena.hy_tally_reset();
            self.arena.hy_mamba_evict(1);
            self.arena.reclaim();
        }
        self.arena
            .hy_take_state(client)
            .ok_or(ComponentError::NoFreeState)
    }

    /// Returns the state slot `client` owns to the pool.
    pub fn free_state(&mut self, client: ClientId, state: u64) -> Result<(), ComponentError> {
        self.arena.hy_free_state(client, state)
    }

    /// Frees the SWA pages paired with `pages` (which `client` owns), as
    /// SGLang frees a running request's SWA pages that slid out of its
    /// window; returns how many SWA pages went. An insert of these pages
    /// then names them with `swa_evicted`.
    pub fn free_swa(&mut self, client: ClientId, pages: &[u32]) -> Result<u64, PageError> {
        if self.arena.swa().is_none() {
            return Err(PageError::Component(ComponentError::NotEnabled(
                Component::Swa,
            )));
        }
        self.check_range(pages)?;
        for &page in pages {
            let pg = &self.arena.pages()[page as usize];
            if pg.state != PAGE_OWNED || pg.owner_or_run != client {
                return Err(PageError::NotOwned { page });
            }
        }
        Ok(pages.iter().filter(|&&p| self.arena.hy_unpair(p)).count() as u64)
    }

    /// The SWA page paired with each of `pages` (SGLang's
    /// `translate_loc_from_full_to_swa`): where a scheduler reads and
    /// writes a page's sliding-window KV; `u32::MAX` where a page has none
    /// (free, an SWA tombstone's, or freed with `free_swa`). Reads only.
    pub fn swa_pages(&self, pages: &[u32]) -> Result<Vec<u32>, PageError> {
        let Some(s) = self.arena.swa() else {
            return Err(PageError::Component(ComponentError::NotEnabled(
                Component::Swa,
            )));
        };
        self.check_range(pages)?;
        Ok(pages.iter().map(|&p| s.pair[p as usize]).collect())
    }

    /// Drops every lock, session and page `client` holds, as when it dies.
    pub fn release_client(&mut self, client: ClientId) {
        self.release_client_sessions(client);
        let mut held: Vec<(u32, u32)> = Vec::new();
        self.locks.retain(|&(c, node), &mut count| {
            if c == client {
                held.push((node, count));
            }
            c != client
        });
        for (node, count) in held {
            for _ in 0..count {
                let serial = self.take_serial(client, node, None);
                self.arena.unlock_path(node, serial);
            }
        }
        let owned: Vec<u32> = (0..self.capacity())
            .filter(|&i| {
                let pg = &self.arena.pages()[i as usize];
                pg.state == PAGE_OWNED && pg.owner_or_run == client
            })
            .collect();
        for page in owned {
            self.arena.pool_release_owned(page);
        }
        self.arena.hy_release_states(client);
    }

    /// Empties the tree but keeps what clients own: every lock and session
    /// of every client goes (their handles name evicted nodes afterwards:
    /// `stale`), then every cached page is evicted as `evict` evicts (KV
    /// events report them removed), with the SWA pages and states the tree
    /// held. Owned pages and state slots stay their owners'. What a daemon
    /// does when its pool's binding changes: the KV the cached pages index
    /// lived in another buffer than the next binder's.
    pub fn drop_cached(&mut self) {
        let mut with_sessions: Vec<ClientId> = self.sessions.values().map(|s| s.client).collect();
        with_sessions.sort_unstable();
        with_sessions.dedup();
        for client in with_sessions {
            self.release_client_sessions(client);
        }
        let held: Vec<((ClientId, u32), u32)> = self.locks.drain().collect();
        for ((client, node), count) in held {
            for _ in 0..count {
                let serial = self.take_serial(client, node, None);
                self.arena.unlock_path(node, serial);
            }
        }
        let c = self.components();
        let all = |on: bool| if on { u64::MAX } else { 0 };
        // Cannot fail: only the components this engine keeps are asked for.
        let _ = self.evict_components(u64::MAX, all(c.swa.is_some()), all(c.mamba.is_some()));
    }

    /// Empties the cache: every page free, every lock and handle gone.
    pub fn reset(&mut self) {
        self.arena.format();
        self.arena.record(|_| CacheEvent::Cleared);
        self.locks.clear();
        self.serials.clear();
        self.sessions.clear();
    }

    /// Starts (or stops) recording what becomes cached and what goes, for
    /// KV events: see [`CacheEvent`] and [`Engine::take_events`]. Off by
    /// default; when off, each hook costs one branch. Turned on, the
    /// record starts with the namespaces registered so far.
    pub fn record_events(&mut self, on: bool) {
        self.arena.events = on.then(|| self.namespace_events().collect());
        if !on {
            self.arena.spares = Vec::new();
        }
    }

    /// Whether [`Engine::record_events`] is on.
    pub fn recording_events(&self) -> bool {
        self.arena.recording()
    }

    /// Hands back an emptied buffer of a consumed [`CacheEvent::Stored`],
    /// so the next one copies into it instead of allocating. Keeps at most
    /// [`SPARE_BUFFERS`] of at most [`SPARE_BUFFER_LEN`] elements; returns
    /// whether it was kept.
    pub fn recycle_event_buffer(&mut self, buf: Vec<u32>) -> bool {
        let keep = self.arena.recording()
            && self.arena.spares.len() < SPARE_BUFFERS
            && buf.capacity() <= SPARE_BUFFER_LEN;
        if keep {
            self.arena.spares.push(buf);
        }
        keep
    }

    /// How many recycled buffers the engine holds now.
    pub fn spare_event_buffers(&self) -> usize {
        self.arena.spares.len()
    }

    /// Moves the facts recorded since the last call to the end of `out`.
    pub fn take_events(&mut self, out: &mut Vec<CacheEvent>) {
        if let Some(log) = self.arena.events.as_mut() {
            out.append(log);
        }
    }

    /// Every registered namespace ([`CacheEvent::Namespace`]), then one
    /// [`CacheEvent::Stored`] per cached run (node), parents first: applied
    /// after a [`CacheEvent::Cleared`], they rebuild exactly the cached
    /// pages. For resynchronising event consumers.
    pub fn cached_runs(&self) -> Vec<CacheEvent> {
        let mut out: Vec<CacheEvent> = self.namespace_events().collect();
        out.extend(self.arena.cached_runs());
        out
    }

    /// Current figures.
    pub fn stats(&self) -> Stats {
        let h = self.arena.hdr();
        Stats {
            total_tokens: h.total_tokens,
            evictable_tokens: h.evictable_tokens,
            protected_tokens: h.protected_tokens,
            free_pages: u64::from(h.free_len),
            owned_pages: u64::from(h.owned_pages),
            nodes: u64::from(h.nodes_live - 1),
            evict_scanned: h.evict_scanned,
            evicted_pages: h.evicted_pages,
        }
    }
}
