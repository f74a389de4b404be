//! Exact LRU with leaf-first eviction: the reference the store's policy is
//! measured against. Every block of a request is used, in order; a block
//! admitted names the block before it in its request as its parent; a full
//! cache evicts the least recently used block that no resident block names
//! as its parent (a leaf), so a stored prefix never has a hole.
//!
//! Memory per resident block: a map entry (id → parent, child count, last
//! use) and, for a leaf, one ordered-set entry.

use std::collections::{BTreeSet, HashMap};

use super::policy::Policy;

#[derive(Clone, Copy, Debug)]
struct Block {
    parent: Option<u64>,
    children: u32,
    used: u64,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct LruLeaf {
    capacity: usize,
    blocks: HashMap<u64, Block>,
    /// Leaves by last use, oldest first.
    leaves: BTreeSet<(u64, u64)>,
    clock: u64,
}

impl LruLeaf {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            blocks: HashMap::new(),
            leaves: BTreeSet::new(),
            clock: 0,
        }
    }

    fn touch(&mut self, id: u64) {
        self.clock += 1;
        let now = self.clock;
        if let Some(b) = self.blocks.get_mut(&id) {
            if b.children == 0 {
                self.leaves.remove(&(b.used, id));
                self.leaves.insert((now, id));
            }
            b.used = now;
        }
    }

    fn evict(&mut self, keep: &[u64]) -> bool {
        let victim = self
            .leaves
            .iter()
            .find(|(_, id)| !keep.contains(id))
            .copied();
        let Some((used, id)) = victim else {
            return false;
        };
        self.leaves.remove(&(used, id));
        if let Some(b) = self.blocks.remove(&id) {
            if let Some(p) = b
                .parent
                .and_then(|p| self.blocks.get_mut(&p).map(|q| (p, q)))
            {
                let (pid, q) = p;
                q.children -= 1;
                if q.children == 0 {
                    self.leaves.insert((q.used, pid));
                }
            }
        }
        true
    }

    fn admit(&mut self, id: u64, parent: Option<u64>, keep: &[u64]) {
        while self.blocks.len() >= self.capacity {
            if !self.evict(keep) {
                return;
            }
        }
        self.clock += 1;
        let parent = parent.filter(|p| self.blocks.contains_key(p));
        if let Some(p) = parent {
            if let Some(q) = self.blocks.get_mut(&p) {
                if q.children == 0 {
                    self.leaves.remove(&(q.used, p));
                }
                q.children += 1;
            }
        }
        self.blocks.insert(
            id,
            Block {
                parent,
                children: 0,
                used: self.clock,
            },
        );
        self.leaves.insert((self.clock, id));
    }
}

impl Policy for LruLeaf {
    fn name(&self) -> &'static str {
        "lru-leaf"
    }

    /// The leading run of resident blocks is the hit; then every block is
    /// used in order (a miss is admitted under the block before it).
    fn request(&mut self, blocks: &[u64]) -> usize {
        let k = blocks
            .iter()
            .take_while(|id| self.blocks.contains_key(id))
            .count();
        for (i, &id) in blocks.iter().enumerate() {
            if self.blocks.contains_key(&id) {
                self.touch(id);
            } else {
                let parent = i.checked_sub(1).map(|p| blocks[p]);
                // The request's own earlier blocks stay (as a scheduler
                // keeps the prefix it is extending).
                self.admit(id, parent, &blocks[..i]);
            }
        }
        k
    }

    fn resident_blocks(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_oldest_leaf_never_a_parent_first() {
        let mut c = LruLeaf::new(3);
        assert_eq!(c.request(&[1, 2]), 0);
        assert_eq!(c.request(&[9]), 0);
        // Full: 1 <- 2, 9. A new block evicts the oldest leaf: 2 (1 is a
        // parent, though older).
        assert_eq!(c.request(&[7]), 0);
        assert!(!c.blocks.contains_key(&2) && c.blocks.contains_key(&1));
        assert_eq!(c.request(&[1]), 1);
        assert_eq!(c.resident_blocks(), 3);
    }
}
