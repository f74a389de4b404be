//! Grace periods for records readers may still be copying: freed nodes and
//! evicted pages wait in a bounded limbo until the readers that could have
//! seen them have moved on.
//!
//! The engine knows nothing of how readers announce themselves: it asks a
//! [`Grace`] (the daemon implements it over the segment's reader epochs,
//! `radixd_ipc::Collector`) for the current epoch, to advance it, and
//! whether a record retired at some epoch may be reused. Without a grace the
//! engine frees at once, exactly as it always did: readers never act on a
//! reused record anyway (its version moved, see
//! [`TreeReader`](super::TreeReader)); what the grace period adds is that a
//! page's KV data is not handed to a new owner while a reader may still be
//! returning that page to its caller.

use radixd_ipc::sync::spin_loop;
use radixd_ipc::Limbo;

use super::arena::Arena;
use super::layout::{NIL, PAGE_RETIRED};
use super::region::Region;

/// When records retired at an epoch may be reused.
pub trait Grace {
    /// The current epoch: the tag of a record unlinked now.
    fn epoch(&self) -> u64;
    /// Advances the epoch if no reader holds it back; whether it moved.
    fn try_advance(&mut self) -> bool;
    /// Whether a record retired at epoch `tag` may be reused now.
    fn reusable(&self, tag: u64) -> bool;
}

/// A record waiting in limbo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retired {
    Page(u32),
    Node(u32),
}

/// The grace period and what waits for it: the writer's private memory.
pub(crate) struct Retirement {
    pub grace: Box<dyn Grace + Send>,
    pub limbo: Limbo<Retired>,
    pub capacity: usize,
    /// Pages in `limbo`.
    pub pages: u32,
    /// Nodes in `limbo`.
    pub nodes: u32,
}

/// Rounds of advance-and-reclaim an `alloc` waits for readers to move on,
/// about a microsecond each, before it gives up.
pub(crate) const WAIT_ROUNDS: u32 = 16;
/// Spin hints per round.
const SPINS_PER_ROUND: u32 = 64;

impl<R: Region> Arena<R> {
    /// An evicted page (already unlinked, inside its node's version) goes
    /// back to the free ring, or to limbo when a grace is set.
    pub(crate) fn release_evicted_page(&mut self, page: u32) {
        if let Some(r) = self.retire.as_mut() {
            let tag = r.grace.epoch();
            if r.limbo.retire(tag, Retired::Page(page)).is_ok() {
                r.pages += 1;
                let p = &mut self.pages_mut()[page as usize];
                p.state = PAGE_RETIRED;
                p.next = NIL;
                p.prev = NIL;
                return;
            }
            // Full: callers check `limbo_room` first, so this is a bug; a
            // page freed early is still never misread (versions), so free it.
            debug_assert!(false, "limbo overflow");
        }
        self.pool_put(page);
    }

    /// Retires the unlinked `node` to limbo when a grace is set; `false`
    /// when it should be freed at once.
    pub(crate) fn retire_node(&mut self, node: u32) -> bool {
        let Some(r) = self.retire.as_mut() else {
            return false;
        };
        let tag = r.grace.epoch();
        if r.limbo.retire(tag, Retired::Node(node)).is_ok() {
            r.nodes += 1;
            return true;
        }
        debug_assert!(false, "limbo overflow");
        false
    }

    /// Records limbo can still take (unbounded without a grace).
    pub(crate) fn limbo_room(&self) -> u64 {
        match &self.retire {
            None => u64::MAX,
            Some(r) => r.capacity.saturating_sub(r.limbo.len()) as u64,
        }
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
        let grace = &r.grace;
        r.limbo.reclaim_when(
            |tag| grace.reusable(tag),
            |item| {
                back += 1;
                match item {
                    Retired::Page(page) => {
                        r.pages -= 1;
                        self.pool_put(page);
                    }
                    Retired::Node(node) => {
                        r.nodes -= 1;
                        self.node_push_free(node);
                    }
                }
            },
        );
        self.retire = Some(r);
        back
    }

    /// [`Self::reclaim`] until at least `free` pages are free or a bounded
    /// wait (about [`WAIT_ROUNDS`] microseconds) is over.
    pub(crate) fn reclaim_until_free(&mut self, free: u32) {
        for round in 0..WAIT_ROUNDS {
            self.reclaim();
            if self.hdr().free_len >= free || self.retire.is_none() {
                return;
            }
            if round + 1 < WAIT_ROUNDS {
                for _ in 0..SPINS_PER_ROUND {
                    spin_loop();
                }
            }
        }
    }

    /// Puts a record taken from a previous limbo into the current one, at
    /// the current epoch (the limbo was sized for it).
    pub(crate) fn retire_again(&mut self, item: Retired) {
        let Some(r) = self.retire.as_mut() else {
            return;
        };
        let tag = r.grace.epoch();
        if r.limbo.retire(tag, item).is_ok() {
            match item {
                Retired::Page(_) => r.pages += 1,
                Retired::Node(_) => r.nodes += 1,
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
            r.limbo = Limbo::new(r.capacity);
            r.pages = 0;
            r.nodes = 0;
        }
    }
}
