//! Figures of an engine ([`Stats`], and the components' beside it), as
//! `stats` reports them and the wire carries them, and the pools' free
//! counts ([`FreeCounts`]) an answer carries for a scheduler's next
//! allocation.

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

/// What each pool has free: the figures a scheduler sizes its next
/// allocation by (SGLang's `available_size` of the FULL and SWA token
/// allocators and of the Mamba state pool), as [`Stats::free_pages`] and
/// [`ComponentStats`] say them, in one place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeCounts {
    /// Pages in the FULL pool's free list.
    pub pages: u64,
    /// Pages in the SWA pool's free list (0 without SWA).
    pub swa_pages: u64,
    /// Slots in the MAMBA state pool's free list (0 without MAMBA).
    pub mamba_states: u64,
}

impl FreeCounts {
    /// Number of figures.
    pub const LEN: usize = 3;

    /// The figures in declaration order, for compact transport.
    pub fn to_array(&self) -> [u64; Self::LEN] {
        [self.pages, self.swa_pages, self.mamba_states]
    }

    /// The inverse of [`FreeCounts::to_array`].
    pub fn from_array([pages, swa_pages, mamba_states]: [u64; Self::LEN]) -> Self {
        Self {
            pages,
            swa_pages,
            mamba_states,
        }
    }
}

impl<R: Region> Engine<R> {
    /// What each pool has free now (three loads: no walk).
    pub fn free_counts(&self) -> FreeCounts {
        FreeCounts {
            pages: u64::from(self.arena.hdr().free_len),
            swa_pages: self.arena.swa().map_or(0, |s| s.free.len() as u64),
            mamba_states: self.arena.mamba().map_or(0, |m| m.free.len() as u64),
        }
    }

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
