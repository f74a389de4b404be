//! The arena's side of the grace period: an evicted page or a freed node
//! goes to limbo (see [`super::grace`] for its batches), and `reclaim`
//! brings back what readers have released; with the engine's requests
//! `set_grace`, `reclaim` and `in_limbo`. Apart from `grace` because the
//! arena holds the limbo (`Retirement`) that these operations work on.

use radixd_ipc::sync::spin_loop;

use super::arena::{corrupt, Arena};
use super::cache::Engine;
use super::grace::{Batch, Chain, Grace, Retirement};
use super::layout::{NIL, PAGE_RETIRED};
use super::region::Region;

/// Rounds of advance-and-reclaim an `alloc` waits for readers to move on,
/// about a microsecond each, before it gives up.
pub(crate) const WAIT_ROUNDS: u32 = 16;
/// Spin hints per round.
const SPINS_PER_ROUND: u32 = 64;

impl<R: Region> Arena<R> {
    /// An evicted page (already unlinked, inside its node's version) goes
    /// back to the free ring, or to limbo when a grace is set.
    pub(crate) fn release_evicted_page(&mut self, page: u32) {
        let Some(r) = self.retire.as_mut() else {
            return self.pool_put(page);
        };
        r.pages += 1;
        let last = r.current().pages.append(page);
        if last != NIL {
            self.pages_mut()[last as usize].next = page;
        }
        let p = &mut self.pages_mut()[page as usize];
        p.state = PAGE_RETIRED;
        p.next = NIL;
        p.prev = NIL;
    }

    /// Retires the unlinked `node` to limbo when a grace is set; `false`
    /// when it should be freed at once.
    pub(crate) fn retire_node(&mut self, node: u32) -> bool {
        let Some(r) = self.retire.as_mut() else {
            return false;
        };
        r.nodes += 1;
        let last = r.current().nodes.append(node);
        if last != NIL {
            self.nodes_mut()[last as usize].link = node;
        }
        self.nodes_mut()[node as usize].link = NIL;
        true
    }

    /// Advances the grace period as far as readers allow (at most the two
    /// steps that make what was just retired reusable) and returns every
    /// reusable record to its free list, oldest first (pages keep FIFO
    /// order). Returns how many records came back.
    pub(crate) fn reclaim(&mut self) -> usize {
        let Some(mut r) = self.retire.take() else {
            return 0;
        };
        for _ in 0..2 {
            if !r.grace.try_advance() {
                break;
            }
        }
        let mut back = 0;
        while let Some(b) = r.batches.front().copied() {
            if !r.grace.reusable(b.tag) {
                break;
            }
            r.batches.pop_front();
            self.walk_chain(b.pages, |a, page| {
                let next = a.pages()[page as usize].next;
                a.pool_put(page);
                next
            });
            self.walk_chain(b.nodes, |a, node| {
                let next = a.nodes()[node as usize].link;
                a.node_push_free(node);
                next
            });
            r.pages -= b.pages.len;
            r.nodes -= b.nodes.len;
            back += (b.pages.len + b.nodes.len) as usize;
        }
        self.retire = Some(r);
        back
    }

    /// Hands each record of `chain` to `free`, which returns the link to
    /// the next (read before it frees). Exactly `chain.len` steps: a link
    /// that ends early or leads out of range is damage to the region.
    fn walk_chain(&mut self, chain: Chain, mut free: impl FnMut(&mut Self, u32) -> u32) {
        let mut at = chain.first;
        for _ in 0..chain.len {
            if at == NIL {
                corrupt("a limbo batch is shorter than its count");
            }
            at = free(self, at);
        }
    }

    /// [`Self::reclaim`] until at least `free` pages are free or a bounded
    /// wait (about [`WAIT_ROUNDS`] microseconds) is over.
    pub(crate) fn reclaim_until_free(&mut self, free: u32) {
        for round in 0..WAIT_ROUNDS {
            self.reclaim();
            if self.hdr().free_len >= free || self.in_limbo().0 == 0 {
                return;
            }
            if round + 1 < WAIT_ROUNDS {
                for _ in 0..SPINS_PER_ROUND {
                    spin_loop();
                }
            }
        }
    }

    /// Sets a new grace period; what waits under the old one waits on as
    /// one batch at the new one's current epoch.
    pub(crate) fn set_grace(&mut self, grace: Box<dyn Grace + Send>) {
        let mut next = Retirement::new(grace);
        let Some(old) = self.retire.take() else {
            self.retire = Some(next);
            return;
        };
        let (pages, nodes) = (old.pages, old.nodes);
        let mut merged = Batch {
            tag: next.grace.epoch(),
            pages: Chain::EMPTY,
            nodes: Chain::EMPTY,
        };
        for b in old.batches {
            merged.pages = self.join(merged.pages, b.pages, |a, last, first| {
                a.pages_mut()[last as usize].next = first;
            });
            merged.nodes = self.join(merged.nodes, b.nodes, |a, last, first| {
                a.nodes_mut()[last as usize].link = first;
            });
        }
        if pages + nodes > 0 {
            next.batches.push_back(merged);
        }
        next.pages = pages;
        next.nodes = nodes;
        self.retire = Some(next);
    }

    /// `a` followed by `b`, linked with `link(last of a, first of b)`.
    fn join(&mut self, a: Chain, b: Chain, link: impl FnOnce(&mut Self, u32, u32)) -> Chain {
        match (a.len, b.len) {
            (_, 0) => a,
            (0, _) => b,
            _ => {
                link(self, a.last, b.first);
                Chain {
                    first: a.first,
                    last: b.last,
                    len: a.len + b.len,
                }
            }
        }
    }

    /// Pages and nodes waiting in limbo.
    pub(crate) fn in_limbo(&self) -> (u32, u32) {
        self.retire.as_ref().map_or((0, 0), |r| (r.pages, r.nodes))
    }

    /// Forgets limbo (`format` just freed everything).
    pub(crate) fn forget_limbo(&mut self) {
        if let Some(r) = self.retire.as_mut() {
            r.batches.clear();
            r.pages = 0;
            r.nodes = 0;
        }
    }
}

impl<R: Region> Engine<R> {
    /// Gives readers of the region a grace period: from now on freed nodes
    /// and evicted pages wait in limbo until `grace` says no reader can
    /// still hold them. Without one (the default) they are reusable at
    /// once. Records already in limbo wait on under the new grace.
    pub fn set_grace(&mut self, grace: Box<dyn Grace + Send>) {
        self.arena.set_grace(grace);
    }

    /// Advances the readers' grace period as far as they allow and returns
    /// what it released to the free lists; the daemon calls it each round.
    /// Returns the records released (0 without a grace).
    pub fn reclaim(&mut self) -> usize {
        self.arena.reclaim()
    }

    /// Pages and nodes waiting in limbo for readers to move on. Limbo pages
    /// are counted neither in `Stats::free_pages` nor as cached.
    pub fn in_limbo(&self) -> (u32, u32) {
        self.arena.in_limbo()
    }
}
