//! The facts an eviction policy's keys read (`policy`), kept by the tree's
//! changes as SGLang 0.5.23's `RadixCache` keeps them on its `TreeNode`s:
//! a split's upper half takes the node's hits and priority, a new leaf is
//! made with the insert's priority, an insert counts a hit on each node it
//! passes past what its request inserted before and raises each one's
//! priority to its own. Nothing here runs under LRU (no facts are kept).

use super::arena::Arena;
use super::layout::ROOT;
use super::lru::Recency;
use super::policy::InsertHints;
use super::region::Region;

impl<R: Region> Arena<R> {
    /// A split made `m` the upper `upper` pages of `child`: `m` takes
    /// `child`'s facts (its creation too under [`Recency::Exact`]; under
    /// [`Recency::Sglang`] it is made now, as SGLang's `_split_node` makes
    /// a new `TreeNode`), and `child` starts `upper` pages lower.
    pub(crate) fn facts_split(&mut self, m: u32, child: u32, upper: u32) {
        if self.lru.keyed.is_none() {
            return;
        }
        let now = self.lru.tick();
        let sglang = self.lru.recency() == Recency::Sglang;
        let p = u64::from(self.layout.page_size);
        let Some(k) = self.lru.keyed.as_deref_mut() else {
            return;
        };
        let (m, c) = (m as usize, child as usize);
        k.created[m] = if sglang { now } else { k.created[c] };
        k.hits[m] = k.hits[c];
        k.priority[m] = k.priority[c];
        if k.tlru() {
            k.above[m] = k.above[c];
            k.above[c] += u64::from(upper) * p;
            k.history[m] = k.history[c];
        }
        // T-LRU reads the tokens above a candidate.
        self.lru.rekey(child);
    }

    /// `leaf` was just hung under `parent`: made now, no hits yet, the
    /// lowest priority (the insert that made it raises it to its own), and
    /// under T-LRU its depth and its branch's high-water mark, raised up
    /// the path as SGLang's `_set_tlru_lens_and_raise_history` raises it
    /// (up to the first ancestor already as deep: O(path) at worst, under
    /// T-LRU only).
    pub(crate) fn facts_leaf(&mut self, leaf: u32, parent: u32) {
        if self.lru.keyed.is_none() {
            return;
        }
        let now = self.lru.tick();
        let p = u64::from(self.layout.page_size);
        let parent_pages = self.edge_pages(parent);
        let leaf_pages = self.edge_pages(leaf);
        let Some(k) = self.lru.keyed.as_deref_mut() else {
            return;
        };
        let i = leaf as usize;
        k.created[i] = now;
        k.hits[i] = 0;
        k.priority[i] = i64::MIN;
        if !k.tlru() {
            return;
        }
        let above = if parent == ROOT {
            0
        } else {
            k.above[parent as usize] + parent_pages * p
        };
        let end = above + leaf_pages * p;
        k.above[i] = above;
        k.history[i] = end;
        let mut at = parent;
        let mut hops = 0;
        while at != ROOT {
            hops = self.hop(hops);
            let Some(k) = self.lru.keyed.as_deref_mut() else {
                return;
            };
            if k.history[at as usize] >= end {
                break;
            }
            k.history[at as usize] = end;
            at = self.nodes()[at as usize].parent;
        }
    }

    /// An insert's touch: the path from `node` (whose last page ends `end`
    /// tokens into the key) up to the root marked used, `node` first (as
    /// [`Arena::touch`]), and under a policy each node's hits and priority
    /// updated first, as SGLang's `_insert_helper` updates them.
    pub(crate) fn touch_insert(&mut self, mut node: u32, mut end: u64, hints: InsertHints) {
        if self.lru.keyed.is_none() {
            self.touch(node);
            return;
        }
        let p = u64::from(self.layout.page_size);
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            let n = self.nodes()[node as usize];
            if let Some(k) = self.lru.keyed.as_deref_mut() {
                let i = node as usize;
                k.priority[i] = k.priority[i].max(hints.priority);
                if end > hints.inserted_len {
                    k.hits[i] += 1;
                }
            }
            // Moves a candidate to the place its new facts give it.
            self.lru.stamp(node);
            end = end.saturating_sub(u64::from(n.num_pages) * p);
            node = n.parent;
        }
    }
}
