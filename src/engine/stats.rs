//! Figures of an engine ([`Stats`], and the components' beside it), as
//! `stats` reports them and the wire carries them.

use super::cache::Engine;
use super::hybrid::{ComponentStats, Hybrid};
use super::region::Region;

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

impl<R: Region> Engine<R> {
    /// Figures of the secondary components; `None` when only FULL is on.
    pub fn component_stats(&self) -> Option<ComponentStats> {
        self.arena.hybrid.as_deref().map(Hybrid::stats)
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
