//! One secondary component's LRU list (SGLang's `UnifiedLRUList`), in the
//! writer's private memory, with the eviction cursor of seed 000's first
//! proposal.
//!
//! The list runs from `HEAD` (most recently used) to `TAIL` (least). Its
//! operations are SGLang's exactly (`insert_mru`, `insert_after`,
//! `reset_node_mru`, the window-chain refresh), so victims come in
//! SGLang's order. What differs is the scan: SGLang restarts at the tail
//! whenever a cascade removes the node its walk stood on; here a removal
//! of the cursor's node moves the cursor to the next node toward the head,
//! so one eviction call visits every node at most once, however many
//! victims it takes and whatever their cascades remove. Behind the cursor
//! only locked nodes remain (a walk evicts every unlocked node it passes),
//! so resuming picks the same victims a restart would.

use crate::engine::layout::NIL;

/// A doubly linked list over node indices plus two sentinels.
pub(crate) struct List {
    prev: Vec<u32>,
    next: Vec<u32>,
    listed: Vec<bool>,
    len: u32,
    /// Next node an eviction walk examines (`NIL` when no walk runs).
    cursor: u32,
}

impl List {
    /// An empty list over `nodes` node slots.
    pub fn new(nodes: u32) -> Self {
        let n = nodes as usize + 2;
        let mut l = Self {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            listed: vec![false; nodes as usize],
            len: 0,
            cursor: NIL,
        };
        l.clear();
        l
    }

    fn head(&self) -> u32 {
        self.listed.len() as u32
    }

    fn tail(&self) -> u32 {
        self.listed.len() as u32 + 1
    }

    /// Empties the list.
    pub fn clear(&mut self) {
        let (h, t) = (self.head(), self.tail());
        self.prev.fill(NIL);
        self.next.fill(NIL);
        self.listed.fill(false);
        self.next[h as usize] = t;
        self.prev[t as usize] = h;
        self.len = 0;
        self.cursor = NIL;
    }

    /// Whether `node` is on the list.
    pub fn contains(&self, node: u32) -> bool {
        self.listed.get(node as usize).copied().unwrap_or(false)
    }

    /// Nodes on the list.
    pub fn len(&self) -> u32 {
        self.len
    }

    fn link_after(&mut self, at: u32, node: u32) {
        let after = self.next[at as usize];
        self.prev[node as usize] = at;
        self.next[node as usize] = after;
        self.prev[after as usize] = node;
        self.next[at as usize] = node;
    }

    fn unlink(&mut self, node: u32) {
        let (p, n) = (self.prev[node as usize], self.next[node as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.prev[node as usize] = NIL;
        self.next[node as usize] = NIL;
    }

    /// Puts `node` (not on the list) at the most recently used end.
    pub fn insert_mru(&mut self, node: u32) {
        debug_assert!(!self.contains(node));
        self.link_after(self.head(), node);
        self.listed[node as usize] = true;
        self.len += 1;
    }

    /// Puts `node` (not on the list) just behind `anchor` (on it): next
    /// older. A split's new upper half goes there, beside its lower half.
    pub fn insert_after(&mut self, anchor: u32, node: u32) {
        debug_assert!(self.contains(anchor) && !self.contains(node));
        self.link_after(anchor, node);
        self.listed[node as usize] = true;
        self.len += 1;
    }

    /// Takes `node` off the list (a no-op when it is not on it). A walk
    /// standing on it moves on toward the head.
    pub fn remove(&mut self, node: u32) {
        if !self.contains(node) {
            return;
        }
        if self.cursor == node {
            self.cursor = self.prev[node as usize];
        }
        self.unlink(node);
        self.listed[node as usize] = false;
        self.len -= 1;
    }

    /// Moves `node` (on the list) to the most recently used end.
    pub fn promote(&mut self, node: u32) {
        self.unlink(node);
        self.link_after(self.head(), node);
    }

    /// Moves the listed nodes of `chain` (a node, then its ancestors) to
    /// the most recently used end in that order: the first is newest, each
    /// next one just behind it (SGLang's `reset_node_and_*_mru`).
    pub fn promote_chain(&mut self, chain: &[u32]) {
        let mut at = self.head();
        for &node in chain {
            if self.contains(node) {
                self.unlink(node);
                self.link_after(at, node);
                at = node;
            }
        }
    }

    /// Starts an eviction walk at the least recently used node.
    pub fn walk_begin(&mut self) {
        self.cursor = self.prev[self.tail() as usize];
    }

    /// The node the walk examines next, if any is left; the walk then
    /// stands on the node before it (toward the head).
    pub fn walk_next(&mut self) -> Option<u32> {
        let node = self.cursor;
        if node == NIL || node == self.head() {
            return None;
        }
        self.cursor = self.prev[node as usize];
        Some(node)
    }

    /// Ends an eviction walk.
    pub fn walk_end(&mut self) {
        self.cursor = NIL;
    }

    /// The listed nodes, most recently used first (for tests and checks).
    pub fn order(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len as usize);
        let mut at = self.next[self.head() as usize];
        while at != self.tail() && out.len() <= self.len as usize {
            out.push(at);
            at = self.next[at as usize];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_as_sglang_and_walks_past_removed_cursors() {
        let mut l = List::new(8);
        for n in [1, 2, 3, 4] {
            l.insert_mru(n);
        }
        assert_eq!(l.order(), [4, 3, 2, 1]);
        l.insert_after(3, 5);
        assert_eq!(l.order(), [4, 3, 5, 2, 1]);
        l.promote_chain(&[2, 7, 1]);
        assert_eq!(l.order(), [2, 1, 4, 3, 5]);
        l.promote(3);
        assert_eq!(l.order(), [3, 2, 1, 4, 5]);
        l.walk_begin();
        assert_eq!(l.walk_next(), Some(5));
        // The walk stands on 4; removing 4 moves it to 1.
        l.remove(4);
        assert_eq!(l.walk_next(), Some(1));
        assert_eq!(l.walk_next(), Some(2));
        assert_eq!(l.walk_next(), Some(3));
        assert_eq!(l.walk_next(), None);
        l.walk_end();
        assert_eq!(l.len(), 4);
    }
}
