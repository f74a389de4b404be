//! The LRU order: when each node was last used, and the nodes eviction may
//! take now (unlocked leaves) in a binary min-heap by that.
//!
//! Eviction never walks past a node it cannot take. A locked node or an
//! inner node is not in the heap at all; it enters when it becomes an
//! unlocked leaf again (on unlock, or when its last child goes), at the
//! place its last use gives it, which is where SGLang's order (last access)
//! puts it. So evicting M leaves costs O(M log L) for L unlocked leaves,
//! however many nodes are locked or inner.
//!
//! Last use is a stamp from a counter. A touch stamps the path from the node
//! up to the root, the node first, so the root side is newest (seed 000's
//! root-MRU chains): within a chain the leaf is the oldest, and when its
//! eviction leaves the parent a leaf, the parent is usually the next victim,
//! which the heap takes in O(1) (`replace_oldest`). A split's upper half
//! takes the stamp of the node it is cut from; equal stamps therefore only
//! ever lie along one path (the ancestor counts as newer), and at most one
//! node of a path is a leaf, so no two nodes in the heap tie.
//!
//! The order is the writer's private memory (readers never need it): 8
//! bytes of stamp and 4 of heap position per node slot, committed by the
//! operating system as slots are first used.

use super::arena::Arena;
use super::layout::{NODE_LIVE, ROOT};
use super::region::Region;

/// Last uses and the heap of unlocked leaves.
#[derive(Debug)]
pub(crate) struct Lru {
    /// The last stamp handed out.
    clock: u64,
    /// Each node slot's last use.
    stamps: Vec<u64>,
    /// Each node slot's index in `heap`, plus one (0: not in the heap).
    slot: Vec<u32>,
    /// Unlocked leaves, oldest at 0.
    heap: Vec<u32>,
}

impl Lru {
    /// An empty order for `nodes` node slots.
    pub fn new(nodes: u32) -> Self {
        Self {
            clock: 0,
            stamps: vec![0; nodes as usize],
            slot: vec![0; nodes as usize],
            heap: Vec::new(),
        }
    }

    /// Forgets every candidate (the region was formatted). Stamps stay:
    /// each node is stamped again before it matters.
    pub fn clear(&mut self) {
        for &node in &self.heap {
            self.slot[node as usize] = 0;
        }
        self.heap.clear();
    }

    /// Marks `node` as used just now: newer than every node before.
    pub fn stamp(&mut self, node: u32) {
        self.clock += 1;
        self.stamps[node as usize] = self.clock;
        if let Some(at) = self.position(node) {
            // Its key only grew.
            self.sift_down(at);
        }
    }

    /// Gives `node` the stamp of `from` (a split's upper half, which is
    /// not a leaf and so not in the heap).
    pub fn copy_stamp(&mut self, node: u32, from: u32) {
        debug_assert!(self.position(node).is_none());
        self.stamps[node as usize] = self.stamps[from as usize];
    }

    /// `node`'s last use.
    pub fn stamp_of(&self, node: u32) -> u64 {
        self.stamps[node as usize]
    }

    fn position(&self, node: u32) -> Option<usize> {
        match self.slot[node as usize] {
            0 => None,
            at => Some(at as usize - 1),
        }
    }

    /// Whether `node` is in the heap.
    pub fn contains(&self, node: u32) -> bool {
        self.slot[node as usize] != 0
    }

    /// The least recently used unlocked leaf.
    pub fn oldest(&self) -> Option<u32> {
        self.heap.first().copied()
    }

    /// The heap, for the invariant checker.
    pub fn candidates(&self) -> &[u32] {
        &self.heap
    }

    /// Adds `node` (not in the heap).
    pub fn insert(&mut self, node: u32) {
        debug_assert!(!self.contains(node));
        self.heap.push(node);
        let at = self.heap.len() - 1;
        self.place(at, node);
        self.sift_up(at);
    }

    /// Takes `node` out of the heap, if it is there.
    pub fn remove(&mut self, node: u32) {
        let Some(at) = self.position(node) else {
            return;
        };
        self.slot[node as usize] = 0;
        let last = self.heap.pop();
        if let Some(last) = last.filter(|_| at < self.heap.len()) {
            self.place(at, last);
            if !self.sift_up(at) {
                self.sift_down(at);
            }
        }
    }

    /// Takes out the oldest node and puts `node` (not in the heap) in its
    /// place: one sift instead of a pop and a push, and none at all when
    /// `node` is the next oldest (a cascade up a root-MRU chain).
    pub fn replace_oldest(&mut self, node: u32) {
        let Some(&old) = self.heap.first() else {
            return self.insert(node);
        };
        self.slot[old as usize] = 0;
        self.place(0, node);
        self.sift_down(0);
    }

    /// Takes out the oldest node.
    pub fn pop_oldest(&mut self) {
        if let Some(&old) = self.heap.first() {
            self.remove(old);
        }
    }

    #[inline]
    fn older(&self, a: u32, b: u32) -> bool {
        self.stamps[a as usize] < self.stamps[b as usize]
    }

    #[inline]
    fn place(&mut self, at: usize, node: u32) {
        self.heap[at] = node;
        self.slot[node as usize] = at as u32 + 1;
    }

    /// Moves the node at `at` up while it is older than its parent; whether
    /// it moved.
    fn sift_up(&mut self, mut at: usize) -> bool {
        let node = self.heap[at];
        let start = at;
        while at > 0 {
            let up = (at - 1) / 2;
            let parent = self.heap[up];
            if !self.older(node, parent) {
                break;
            }
            self.place(at, parent);
            at = up;
        }
        self.place(at, node);
        at != start
    }

    /// Moves the node at `at` down while a child is older.
    fn sift_down(&mut self, mut at: usize) {
        let node = self.heap[at];
        let len = self.heap.len();
        loop {
            let left = 2 * at + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.older(self.heap[right], self.heap[left]) {
                right
            } else {
                left
            };
            if !self.older(self.heap[child], node) {
                break;
            }
            self.place(at, self.heap[child]);
            at = child;
        }
        self.place(at, node);
    }
}

impl<R: Region> Arena<R> {
    /// Marks the path from the root to `node` as just used, `node` first,
    /// so the root side is newest.
    pub fn touch(&mut self, mut node: u32) {
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            self.lru.stamp(node);
            node = self.nodes()[node as usize].parent;
        }
    }

    /// Whether eviction may take `node` now: a live unlocked leaf.
    pub fn evictable(&self, node: u32) -> bool {
        let n = &self.nodes()[node as usize];
        node != ROOT && n.state == NODE_LIVE && n.children == 0 && n.lock_ref == 0
    }

    /// Puts `node` in the heap or takes it out, as [`Self::evictable`]
    /// says, after its children or locks changed.
    pub fn refile(&mut self, node: u32) {
        match (self.evictable(node), self.lru.contains(node)) {
            (true, false) => self.lru.insert(node),
            (false, true) => self.lru.remove(node),
            _ => {}
        }
    }
}
