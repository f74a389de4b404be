//! An indexed 4-ary min-heap of nodes by key: the candidates of an
//! eviction order that no list can keep in order (see `lru`).
//!
//! Each node's place is kept in a slot array the owner shares with its
//! other structures (`Lru::slot`: 0 for nowhere, the heap index plus one
//! here), so a node leaves the heap, or moves in it, in O(log n) without a
//! search. Keys are compared with `Ord`: a stamp for LRU, a policy's tuple
//! otherwise (see `policy`).

/// Children per heap node.
const ARITY: usize = 4;

/// A heap entry: a node and its key, kept together so that a sift
/// compares neighbouring memory, not keys scattered by node index.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry<K> {
    pub key: K,
    pub node: u32,
}

/// The entries, least key at 0, the children of `i` at `4i + 1 ..= 4i + 4`.
#[derive(Debug)]
pub(crate) struct Heap<K> {
    entries: Vec<Entry<K>>,
}

impl<K: Copy + Ord> Heap<K> {
    /// An empty heap.
    pub fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// The entry with the least key.
    #[inline]
    pub fn top(&self) -> Option<&Entry<K>> {
        self.entries.first()
    }

    /// Every entry in heap order, for the invariant checker.
    pub fn entries(&self) -> &[Entry<K>] {
        &self.entries
    }

    /// The heap index of the parent of heap index `at` (> 0).
    pub fn parent_of(at: usize) -> usize {
        (at - 1) / ARITY
    }

    /// Empties the heap, marking each node nowhere in `slot`.
    pub fn clear(&mut self, slot: &mut [u32]) {
        for e in &self.entries {
            slot[e.node as usize] = 0;
        }
        self.entries.clear();
    }

    /// Adds `e` (its node not in the heap).
    pub fn push(&mut self, slot: &mut [u32], e: Entry<K>) {
        self.entries.push(e);
        let at = self.entries.len() - 1;
        self.sift_up(slot, at, e);
    }

    /// Takes out the entry at heap index `at`, marking its node nowhere.
    pub fn remove_at(&mut self, slot: &mut [u32], at: usize) {
        let node = self.entries[at].node;
        slot[node as usize] = 0;
        let last = self.entries.pop();
        if let Some(last) = last.filter(|_| at < self.entries.len()) {
            if !self.sift_up(slot, at, last) {
                self.sift_down(slot, at);
            }
        }
    }

    /// Gives the entry at heap index `at` the key `key`, moving it to its
    /// place.
    pub fn rekey(&mut self, slot: &mut [u32], at: usize, key: K) {
        let e = Entry {
            key,
            node: self.entries[at].node,
        };
        if !self.sift_up(slot, at, e) {
            self.sift_down(slot, at);
        }
    }

    #[inline]
    fn place(&mut self, slot: &mut [u32], at: usize, e: Entry<K>) {
        self.entries[at] = e;
        slot[e.node as usize] = at as u32 + 1;
    }

    /// Puts `e` at `at` and moves it up while its key is less than its
    /// parent's; whether it moved.
    fn sift_up(&mut self, slot: &mut [u32], mut at: usize, e: Entry<K>) -> bool {
        let start = at;
        while at > 0 {
            let up = Self::parent_of(at);
            let parent = self.entries[up];
            if e.key >= parent.key {
                break;
            }
            self.place(slot, at, parent);
            at = up;
        }
        self.place(slot, at, e);
        at != start
    }

    /// Moves the entry at `at` down while a child's key is less.
    fn sift_down(&mut self, slot: &mut [u32], mut at: usize) {
        let e = self.entries[at];
        let len = self.entries.len();
        loop {
            let first = ARITY * at + 1;
            if first >= len {
                break;
            }
            let end = (first + ARITY).min(len);
            let mut child = first;
            for c in first + 1..end {
                if self.entries[c].key < self.entries[child].key {
                    child = c;
                }
            }
            if self.entries[child].key >= e.key {
                break;
            }
            self.place(slot, at, self.entries[child]);
            at = child;
        }
        self.place(slot, at, e);
    }
}
