//! S3-FIFO (Yang, Zhang, Qiu, Yue & Vinayak, "FIFO queues are all you need
//! for cache eviction", SOSP'23), the variant specified for radixd:
//!
//! - small FIFO `S` of `round(capacity * 0.1)` blocks (half to even), main
//!   FIFO `M` of the rest, ghost FIFO `G` of ids only, as long as `M`;
//! - a 2-bit frequency per resident block, saturating at 3;
//! - a new id enters `S`; an id found in `G` enters `M` with frequency 0;
//! - `S` evicts its head to `M` (keeping its frequency) if it was hit,
//!   otherwise to `G`; `M` gives hit heads a second chance (requeue with
//!   frequency − 1) and evicts the first cold head to `G`.
//!
//! All three queues thread one slab and one id → node map, so an access costs
//! one map lookup and a node moves between queues without reallocation.

use super::hash::{id_map, IdMap};
use super::policy::FlatCache;
use super::slab::{List, Slab};
use super::ReplayError;

/// Frequencies saturate here (two bits in the paper).
const MAX_FREQ: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
    Ghost,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    freq: u8,
    queue: Queue,
}

/// `round(capacity * 0.1)` with ties to even, computed exactly in integers
/// (25 → 2, 35 → 4, 15 → 2, 5 → 0).
pub fn small_queue_capacity(capacity: usize) -> usize {
    let (q, r) = (capacity / 10, capacity % 10);
    if r > 5 || (r == 5 && q % 2 == 1) {
        q + 1
    } else {
        q
    }
}

/// The S3-FIFO cache. Resident blocks are `S ∪ M`; `G` holds ids only.
#[derive(Debug, Clone)]
pub struct S3Fifo {
    small_cap: usize,
    main_cap: usize,
    ghost_cap: usize,
    slab: Slab<Entry>,
    small: List,
    main: List,
    ghost: List,
    index: IdMap<u32>,
}

impl S3Fifo {
    /// An empty cache of `capacity` blocks; an error when the small queue
    /// would round to zero blocks (capacity ≤ 5).
    pub fn new(capacity: usize) -> Result<Self, ReplayError> {
        if capacity == 0 {
            return Err(ReplayError::ZeroCapacity);
        }
        let small_cap = small_queue_capacity(capacity);
        if small_cap < 1 {
            return Err(ReplayError::SmallQueueTooSmall {
                capacity,
                small_cap,
            });
        }
        let main_cap = capacity - small_cap;
        // Resident blocks plus ghosts: at most capacity + main_cap nodes.
        let prealloc = capacity.saturating_add(main_cap).min(1 << 21);
        Ok(Self {
            small_cap,
            main_cap,
            ghost_cap: main_cap,
            slab: Slab::with_capacity(prealloc),
            small: List::default(),
            main: List::default(),
            ghost: List::default(),
            index: id_map(prealloc),
        })
    }

    /// Capacity of the small queue `S`.
    pub fn small_cap(&self) -> usize {
        self.small_cap
    }

    /// Capacity of the main queue `M` (and of the ghost queue `G`).
    pub fn main_cap(&self) -> usize {
        self.main_cap
    }

    /// `S` then `M` as `(id, freq)` head to tail, and `G`'s ids head to tail.
    #[cfg(test)]
    #[allow(clippy::type_complexity)]
    pub(crate) fn queues(&self) -> (Vec<(u64, u8)>, Vec<(u64, u8)>, Vec<u64>) {
        let pairs = |list: &List| -> Vec<(u64, u8)> {
            list.indices(&self.slab)
                .iter()
                .map(|&i| (self.slab.get(i).id, self.slab.get(i).freq))
                .collect()
        };
        let ghosts = self
            .ghost
            .indices(&self.slab)
            .iter()
            .map(|&i| self.slab.get(i).id)
            .collect();
        (pairs(&self.small), pairs(&self.main), ghosts)
    }

    /// Checks queue bounds, queue tags, frequencies and the map.
    #[cfg(test)]
    pub(crate) fn validate(&self) {
        assert!(self.small.len() <= self.small_cap);
        assert!(self.main.len() <= self.main_cap);
        assert!(self.ghost.len() <= self.ghost_cap);
        let mut total = 0;
        for (list, queue) in [
            (&self.small, Queue::Small),
            (&self.main, Queue::Main),
            (&self.ghost, Queue::Ghost),
        ] {
            let nodes = list.indices(&self.slab);
            assert_eq!(nodes.len(), list.len());
            for idx in nodes {
                let e = self.slab.get(idx);
                assert_eq!(e.queue, queue);
                assert!(e.freq <= MAX_FREQ);
                assert_eq!(self.index.get(&e.id), Some(&idx));
                total += 1;
            }
        }
        assert_eq!(total, self.index.len());
    }

    /// Appends a new id to `S`, first draining `S` below its capacity.
    fn admit_small(&mut self, id: u64) {
        while self.small.len() >= self.small_cap {
            let Some(head) = self.small.pop_front(&mut self.slab) else {
                break;
            };
            if self.slab.get(head).freq >= 1 {
                self.admit_main(head);
            } else {
                self.insert_ghost(head);
            }
        }
        let idx = self.slab.insert(Entry {
            id,
            freq: 0,
            queue: Queue::Small,
        });
        self.small.push_back(&mut self.slab, idx);
        self.index.insert(id, idx);
    }

    /// Appends the unlinked node `idx` (frequency already set) to `M`, first
    /// making room: hot heads are requeued one frequency cooler, the first
    /// cold head goes to `G`.
    fn admit_main(&mut self, idx: u32) {
        while self.main.len() >= self.main_cap {
            let Some(head) = self.main.head() else {
                break;
            };
            let entry = self.slab.get_mut(head);
            if entry.freq >= 1 {
                entry.freq -= 1;
                self.main.move_to_back(&mut self.slab, head);
            } else {
                self.main.unlink(&mut self.slab, head);
                self.insert_ghost(head);
                break;
            }
        }
        self.slab.get_mut(idx).queue = Queue::Main;
        self.main.push_back(&mut self.slab, idx);
    }

    /// Turns the unlinked, just-evicted node `idx` into the newest ghost.
    ///
    /// The spec's "if already in G, remove it" cannot happen here: the map
    /// holds one node per id, and `idx` was resident until now.
    fn insert_ghost(&mut self, idx: u32) {
        if self.ghost.len() >= self.ghost_cap {
            if let Some(oldest) = self.ghost.pop_front(&mut self.slab) {
                self.index.remove(&self.slab.get(oldest).id);
                self.slab.remove(oldest);
            }
        }
        let entry = self.slab.get_mut(idx);
        entry.queue = Queue::Ghost;
        entry.freq = 0;
        self.ghost.push_back(&mut self.slab, idx);
    }
}

impl FlatCache for S3Fifo {
    const NAME: &'static str = "s3fifo";

    #[inline]
    fn contains(&self, id: u64) -> bool {
        self.index
            .get(&id)
            .is_some_and(|&idx| self.slab.get(idx).queue != Queue::Ghost)
    }

    fn access(&mut self, id: u64) {
        match self.index.get(&id) {
            Some(&idx) => {
                let entry = self.slab.get_mut(idx);
                if entry.queue == Queue::Ghost {
                    self.ghost.unlink(&mut self.slab, idx);
                    self.slab.get_mut(idx).freq = 0;
                    self.admit_main(idx);
                } else {
                    entry.freq = (entry.freq + 1).min(MAX_FREQ);
                }
            }
            None => self.admit_small(id),
        }
    }

    fn resident(&self) -> usize {
        self.small.len() + self.main.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::policy::Policy;

    #[test]
    fn small_cap_rounds_half_to_even() {
        // 2.5 → 2, 3.5 → 4, 1.5 → 2, 0.5 → 0, 0.6 → 1, 4.5 → 4, 10.5 → 10.
        for (capacity, small) in [
            (25, 2),
            (35, 4),
            (15, 2),
            (5, 0),
            (6, 1),
            (45, 4),
            (105, 10),
            (1000, 100),
            (1004, 100),
            (1006, 101),
        ] {
            assert_eq!(small_queue_capacity(capacity), small, "capacity {capacity}");
        }
        let s = S3Fifo::new(25).unwrap();
        // main_cap = 25 − 2.
        assert_eq!((s.small_cap(), s.main_cap()), (2, 23));
    }

    #[test]
    fn small_cap_below_one_is_an_error() {
        // round(0.5) = 0 (half to even) and round(0.1) = 0.
        for capacity in [1, 5] {
            let err = S3Fifo::new(capacity).unwrap_err();
            assert!(
                matches!(err, ReplayError::SmallQueueTooSmall { small_cap: 0, .. }),
                "{err:?}"
            );
            assert!(err.to_string().contains("s3fifo"));
        }
        assert!(matches!(S3Fifo::new(0), Err(ReplayError::ZeroCapacity)));
        assert!(S3Fifo::new(6).is_ok());
    }

    #[test]
    fn promotion_keeps_freq_and_ghost_readmits_with_freq_zero() {
        // capacity 6: S holds 1, M holds 5, G holds 5.
        let mut s = S3Fifo::new(6).unwrap();
        assert_eq!(s.request(&[1]), 0); // S=[1:0]
        assert_eq!(s.request(&[1]), 1); // hit: S=[1:1]
        assert_eq!(s.request(&[2]), 0); // S full: 1 has freq 1 → M=[1:1]; S=[2:0]
        assert_eq!(s.queues(), (vec![(2, 0)], vec![(1, 1)], vec![]));
        assert_eq!(s.request(&[3]), 0); // 2 has freq 0 → G=[2]; S=[3:0]
        assert_eq!(s.queues(), (vec![(3, 0)], vec![(1, 1)], vec![2]));
        // A ghost is not resident, so no prefix hit; 2 goes straight to M at 0.
        assert_eq!(s.request(&[2]), 0);
        assert_eq!(s.queues(), (vec![(3, 0)], vec![(1, 1), (2, 0)], vec![]));
        assert_eq!(s.request(&[2, 1, 3]), 3);
        assert_eq!(s.resident_blocks(), 3);
        s.validate();
    }

    #[test]
    fn main_gives_second_chance_and_freq_saturates_at_3() {
        let mut s = S3Fifo::new(6).unwrap(); // S 1, M 5, G 5
        for _ in 0..5 {
            s.request(&[10]); // freq 0, 1, 2, 3, then stays 3
        }
        assert_eq!(s.queues().0, [(10, 3)]);
        s.request(&[11]); // 10 (freq 3) promoted: M=[10:3]; S=[11]
                          // Each pair sends the S head to G, then pulls it back into M at 0.
        for (next, back) in [(12, 11), (13, 12), (14, 13), (15, 14)] {
            s.request(&[next]);
            s.request(&[back]);
        }
        assert_eq!(
            s.queues(),
            (
                vec![(15, 0)],
                vec![(10, 3), (11, 0), (12, 0), (13, 0), (14, 0)],
                vec![]
            )
        );
        s.request(&[16]); // 15 → G; S=[16]
                          // 15 returns from G; M is full: head 10 (freq 3) requeued at 2, head
                          // 11 (freq 0) evicted to G; then 15 appended at 0. Unsaturated, 10
                          // would have been requeued at 4.
        s.request(&[15]);
        assert_eq!(
            s.queues(),
            (
                vec![(16, 0)],
                vec![(12, 0), (13, 0), (14, 0), (10, 2), (15, 0)],
                vec![11]
            )
        );
        assert_eq!(s.resident_blocks(), 6);
        s.validate();
    }

    #[test]
    fn ghost_queue_drops_its_oldest_id() {
        let mut s = S3Fifo::new(6).unwrap(); // G holds 5
                                             // Each new id pushes the previous (never hit) one from S to G.
        for id in 0..8 {
            s.request(&[id]);
        }
        // 0..=6 went to G in order; G keeps the newest 5: 2..=6.
        assert_eq!(s.queues(), (vec![(7, 0)], vec![], vec![2, 3, 4, 5, 6]));
        s.validate();
    }

    #[test]
    fn request_longer_than_capacity() {
        let mut s = S3Fifo::new(6).unwrap(); // S 1, M 5, G 5
                                             // 8 cold blocks: each pushes the previous (freq 0) from S to G, so G
                                             // receives 1..=7 and keeps the newest 5; only 8 is resident.
        assert_eq!(s.request(&[1, 2, 3, 4, 5, 6, 7, 8]), 0);
        assert_eq!(s.queues(), (vec![(8, 0)], vec![], vec![3, 4, 5, 6, 7]));
        // Again: 1 is not resident, so k = 0. Each id was dropped from G just
        // before its turn (1, 2 already; 3 when 8 enters G, ...), so every
        // block re-enters S and the state comes back to the same place.
        assert_eq!(s.request(&[1, 2, 3, 4, 5, 6, 7, 8]), 0);
        assert_eq!(s.queues(), (vec![(8, 0)], vec![], vec![3, 4, 5, 6, 7]));
        s.validate();
    }
}
