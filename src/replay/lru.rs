//! Least recently used: a recency list over a slab plus an id → node map.
//!
//! Memory per resident block: 16 bytes of slab node (id + two links) plus a
//! hash map slot (12 bytes + control byte, before load factor).

use super::hash::{id_map, IdMap};
use super::policy::FlatCache;
use super::slab::{List, Slab};

/// LRU over block ids: hit → most recent; miss → admit as most recent,
/// evicting the least recent when full.
#[derive(Debug, Clone)]
pub struct Lru {
    capacity: usize,
    slab: Slab<u64>,
    /// Head is least recent.
    recency: List,
    index: IdMap<u32>,
}

impl Lru {
    /// An empty LRU cache of `capacity` blocks (`capacity ≥ 1`).
    pub fn new(capacity: usize) -> Self {
        // Cap the up-front allocation; huge capacities grow on demand.
        let prealloc = capacity.min(1 << 20);
        Self {
            capacity,
            slab: Slab::with_capacity(prealloc),
            recency: List::default(),
            index: id_map(prealloc),
        }
    }

    /// Resident ids from least to most recent.
    #[cfg(test)]
    pub(crate) fn order(&self) -> Vec<u64> {
        self.recency
            .indices(&self.slab)
            .iter()
            .map(|&i| *self.slab.get(i))
            .collect()
    }

    /// Checks that the map and the list agree and the capacity holds.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        let order = self.recency.indices(&self.slab);
        assert_eq!(order.len(), self.recency.len());
        assert_eq!(order.len(), self.index.len());
        assert!(order.len() <= self.capacity);
        for idx in order {
            assert_eq!(self.index.get(self.slab.get(idx)), Some(&idx));
        }
    }
}

impl FlatCache for Lru {
    const NAME: &'static str = "lru";

    #[inline]
    fn contains(&self, id: u64) -> bool {
        self.index.contains_key(&id)
    }

    fn access(&mut self, id: u64) {
        if let Some(&idx) = self.index.get(&id) {
            self.recency.move_to_back(&mut self.slab, idx);
            return;
        }
        if self.recency.len() >= self.capacity {
            if let Some(victim) = self.recency.pop_front(&mut self.slab) {
                self.index.remove(self.slab.get(victim));
                self.slab.remove(victim);
            }
        }
        let idx = self.slab.insert(id);
        self.recency.push_back(&mut self.slab, idx);
        self.index.insert(id, idx);
    }

    fn resident(&self) -> usize {
        self.recency.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::policy::Policy;

    #[test]
    fn hit_moves_to_most_recent() {
        let mut lru = Lru::new(3);
        // Cold: no prefix hit; resident [1, 2, 3].
        assert_eq!(lru.request(&[1, 2, 3]), 0);
        // 1 is resident, 4 is not: k = 1. Access 1 → [2, 3, 1]; admit 4
        // evicts 2 (least recent) → [3, 1, 4].
        assert_eq!(lru.request(&[1, 4]), 1);
        assert_eq!(lru.order(), [3, 1, 4]);
        // 2 was evicted: k = 0 even though 3 is resident.
        assert_eq!(lru.request(&[2, 3]), 0);
        // Admit 2 evicts 3 → [1, 4, 2]; then 3 misses again, evicts 1 → [4, 2, 3].
        assert_eq!(lru.order(), [4, 2, 3]);
        lru.validate();
    }

    #[test]
    fn request_longer_than_capacity_evicts_its_own_blocks() {
        let mut lru = Lru::new(2);
        // 1, 2 fill; 3 evicts 1; 4 evicts 2 → [3, 4].
        assert_eq!(lru.request(&[1, 2, 3, 4]), 0);
        assert_eq!(lru.order(), [3, 4]);
        // Same request again: 1 is gone, so k = 0 (3 and 4 don't count).
        assert_eq!(lru.request(&[1, 2, 3, 4]), 0);
        assert_eq!(lru.resident_blocks(), 2);
        lru.validate();
    }
}
