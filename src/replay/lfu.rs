//! Least frequently used, O(1) per access (Shah, Mitra & Matani, "An O(1)
//! algorithm for implementing the LFU cache eviction scheme", 2010).
//!
//! Entries sit in one recency list per access count. A node enters its
//! count's list exactly when it is accessed, so each list's head is the least
//! recently accessed entry of that count: evicting the head of the lowest
//! non-empty count breaks ties by recency with no timestamps. No history is
//! kept after eviction.

use super::hash::{id_map, IdMap};
use super::policy::FlatCache;
use super::slab::{List, Slab};

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    count: u32,
}

/// LFU over block ids: admit with count 1, a hit adds 1, evict the lowest
/// count (least recently accessed among equals).
#[derive(Debug, Clone)]
pub struct Lfu {
    capacity: usize,
    len: usize,
    slab: Slab<Entry>,
    /// `buckets[c]` holds the entries with count `c`; index 0 stays empty.
    buckets: Vec<List>,
    /// Lowest count with a non-empty bucket while `len > 0`.
    min_count: u32,
    index: IdMap<u32>,
}

impl Lfu {
    /// An empty LFU cache of `capacity` blocks (`capacity ≥ 1`).
    pub fn new(capacity: usize) -> Self {
        let prealloc = capacity.min(1 << 20);
        Self {
            capacity,
            len: 0,
            slab: Slab::with_capacity(prealloc),
            buckets: vec![List::default(); 2],
            min_count: 1,
            index: id_map(prealloc),
        }
    }

    /// Resident `(id, count)` in eviction order: lowest count first, least
    /// recent first within a count.
    #[cfg(test)]
    pub(crate) fn order(&self) -> Vec<(u64, u32)> {
        self.buckets
            .iter()
            .flat_map(|b| b.indices(&self.slab))
            .map(|i| {
                let e = self.slab.get(i);
                (e.id, e.count)
            })
            .collect()
    }

    /// Checks counts, buckets, map and `min_count` agree.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        let mut total = 0;
        for (count, bucket) in self.buckets.iter().enumerate() {
            for idx in bucket.indices(&self.slab) {
                let e = self.slab.get(idx);
                assert_eq!(e.count as usize, count);
                assert_eq!(self.index.get(&e.id), Some(&idx));
                total += 1;
            }
        }
        assert_eq!(total, self.len);
        assert_eq!(total, self.index.len());
        assert!(total <= self.capacity);
        if total > 0 {
            let lowest = self.buckets.iter().position(|b| !b.is_empty());
            assert_eq!(lowest, Some(self.min_count as usize));
        }
    }

    fn ensure_bucket(&mut self, count: u32) {
        let c = count as usize;
        if self.buckets.len() <= c {
            self.buckets.resize(c + 1, List::default());
        }
    }
}

impl FlatCache for Lfu {
    const NAME: &'static str = "lfu";

    #[inline]
    fn contains(&self, id: u64) -> bool {
        self.index.contains_key(&id)
    }

    fn access(&mut self, id: u64) {
        if let Some(&idx) = self.index.get(&id) {
            let count = self.slab.get(idx).count;
            // Counts are bounded by the number of accesses replayed, far
            // below u32::MAX for any trace that fits in memory.
            let next = count.saturating_add(1);
            if next == count {
                return;
            }
            self.buckets[count as usize].unlink(&mut self.slab, idx);
            let emptied = self.buckets[count as usize].is_empty();
            self.slab.get_mut(idx).count = next;
            self.ensure_bucket(next);
            self.buckets[next as usize].push_back(&mut self.slab, idx);
            if emptied && self.min_count == count {
                self.min_count = next;
            }
            return;
        }
        if self.len >= self.capacity {
            let min = self.min_count as usize;
            if let Some(victim) = self.buckets[min].pop_front(&mut self.slab) {
                self.index.remove(&self.slab.get(victim).id);
                self.slab.remove(victim);
                self.len -= 1;
            }
        }
        let idx = self.slab.insert(Entry { id, count: 1 });
        self.buckets[1].push_back(&mut self.slab, idx);
        self.index.insert(id, idx);
        self.len += 1;
        self.min_count = 1;
    }

    fn resident(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::policy::Policy;

    #[test]
    fn evicts_lowest_count_then_least_recent() {
        let mut lfu = Lfu::new(3);
        // 1, 2, 3 admitted with count 1, in that order.
        assert_eq!(lfu.request(&[1, 2, 3]), 0);
        // 2 hits → count 2. Order: 1(1), 3(1), 2(2).
        assert_eq!(lfu.request(&[2]), 1);
        assert_eq!(lfu.order(), [(1, 1), (3, 1), (2, 2)]);
        // 1 hits → count 2, now more recent than 2. Order: 3(1), 2(2), 1(2).
        assert_eq!(lfu.request(&[1]), 1);
        assert_eq!(lfu.order(), [(3, 1), (2, 2), (1, 2)]);
        // 4 misses: lowest count is 3's → evict 3. Order: 4(1), 2(2), 1(2).
        assert_eq!(lfu.request(&[4]), 0);
        assert_eq!(lfu.order(), [(4, 1), (2, 2), (1, 2)]);
        // 5 misses: evict 4 (count 1). Then 6 misses: 5 is the only count-1
        // entry, so 5 goes even though 2 is older.
        assert_eq!(lfu.request(&[5, 6]), 0);
        assert_eq!(lfu.order(), [(6, 1), (2, 2), (1, 2)]);
        lfu.validate();
    }

    #[test]
    fn tie_on_count_evicts_least_recently_accessed() {
        let mut lfu = Lfu::new(2);
        // 1 and 2 both reach count 2; 1's last access (4th) is after 2's (3rd).
        lfu.request(&[1, 2]);
        lfu.request(&[2]);
        lfu.request(&[1]);
        // Both have count 2, so 3 evicts the less recently accessed one, 2.
        assert_eq!(lfu.request(&[3]), 0);
        assert_eq!(lfu.order(), [(3, 1), (1, 2)]);
        lfu.validate();
    }

    #[test]
    fn min_count_moves_up_when_its_bucket_empties() {
        let mut lfu = Lfu::new(2);
        // 1 → count 3, 2 → count 2: min_count must follow to 2.
        lfu.request(&[1, 1, 1, 2, 2]);
        assert_eq!(lfu.order(), [(2, 2), (1, 3)]);
        lfu.validate();
        // 3 evicts 2 (count 2 < 3), not 1.
        lfu.request(&[3]);
        assert_eq!(lfu.order(), [(3, 1), (1, 3)]);
        lfu.validate();
    }
}
