//! The LRU list: every non-root node, threaded through `Node::newer` and
//! `Node::older`, most recently used at `lru_newest`.
//!
//! Invariant: every node sits on the newer side of all its descendants. A
//! touch moves a whole root-to-node path to the front with the root-side end
//! newest, a new leaf joins just behind its parent, and a split puts the upper
//! half directly in front of the lower. So a scan from the oldest end meets
//! each chain's leaf before its ancestors, and when a leaf's eviction turns
//! its parent into a leaf, the parent is still ahead of the scan: eviction
//! never has to restart from the tail.

use super::arena::Arena;
use super::layout::{NIL, ROOT};
use super::region::Region;

impl<R: Region> Arena<R> {
    /// Takes `node` out of the list.
    pub fn lru_unlink(&mut self, node: u32) {
        let n = self.nodes()[node as usize];
        match n.newer {
            NIL => self.hdr_mut().lru_newest = n.older,
            newer => self.nodes_mut()[newer as usize].older = n.older,
        }
        match n.older {
            NIL => self.hdr_mut().lru_oldest = n.newer,
            older => self.nodes_mut()[older as usize].newer = n.newer,
        }
        let n = &mut self.nodes_mut()[node as usize];
        n.newer = NIL;
        n.older = NIL;
    }

    /// Puts an unlinked `node` at the newest end.
    pub fn lru_push_newest(&mut self, node: u32) {
        let head = self.hdr().lru_newest;
        {
            let n = &mut self.nodes_mut()[node as usize];
            n.newer = NIL;
            n.older = head;
        }
        match head {
            NIL => self.hdr_mut().lru_oldest = node,
            h => self.nodes_mut()[h as usize].newer = node,
        }
        self.hdr_mut().lru_newest = node;
    }

    /// Puts an unlinked `node` directly on the newer side of `at`.
    pub fn lru_insert_newer_than(&mut self, node: u32, at: u32) {
        let newer = self.nodes()[at as usize].newer;
        {
            let n = &mut self.nodes_mut()[node as usize];
            n.newer = newer;
            n.older = at;
        }
        self.nodes_mut()[at as usize].newer = node;
        match newer {
            NIL => self.hdr_mut().lru_newest = node,
            x => self.nodes_mut()[x as usize].older = node,
        }
    }

    /// Marks the path from the root to `node` as just used: the path moves to
    /// the newest end, root-side first, so `node` is the oldest of it.
    pub fn touch(&mut self, mut node: u32) {
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            self.lru_unlink(node);
            self.lru_push_newest(node);
            node = self.nodes()[node as usize].parent;
        }
    }
}
