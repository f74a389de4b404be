//! Grace periods for records readers may still be copying: freed nodes and
//! evicted pages wait in limbo until the readers that could have seen them
//! have moved on.
//!
//! The engine knows nothing of how readers announce themselves: it asks a
//! [`Grace`] (the daemon implements it over the segment's reader epochs,
//! `radixd_ipc::Reclaimer`) for the current epoch, to advance it, and
//! whether a record retired at some epoch may be reused. Without a grace the
//! engine frees at once, exactly as it always did: readers never act on a
//! reused record anyway (its version moved, see
//! [`TreeReader`](super::TreeReader)); what the grace period adds is that a
//! page's KV data is not handed to a new owner while a reader may still be
//! returning that page to its caller.
//!
//! Limbo has no capacity of its own: records retired at one epoch form a
//! batch, linked through the records themselves (a retired page's
//! `Page::next`, a freed node's `Node::link`), with one tag per batch in
//! the writer's memory. Anything the pool and the node table can hold can
//! wait, so a daemon never evicts less than the in-process engine would
//! because a side table filled up. The epoch moves only in `reclaim`, so at
//! most three batches wait at once (tags `g - 2` and older are reusable at
//! the next reclaim, `g - 1` and `g` wait).

use std::collections::VecDeque;

use super::layout::NIL;

/// When records retired at an epoch may be reused.
pub trait Grace {
    /// The current epoch: the tag of a record unlinked now.
    fn epoch(&self) -> u64;
    /// Advances the epoch if no reader holds it back; whether it moved.
    fn try_advance(&mut self) -> bool;
    /// Whether a record retired at epoch `tag` may be reused now.
    fn reusable(&self, tag: u64) -> bool;
}

/// Records of one kind retired at one epoch, linked through themselves,
/// oldest first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chain {
    pub first: u32,
    pub last: u32,
    pub len: u32,
}

impl Chain {
    pub const EMPTY: Self = Self {
        first: NIL,
        last: NIL,
        len: 0,
    };

    /// Appends `x`; returns the record to link to it (`NIL`: none).
    pub fn append(&mut self, x: u32) -> u32 {
        let last = self.last;
        if self.len == 0 {
            self.first = x;
        }
        self.last = x;
        self.len += 1;
        last
    }
}

/// What was retired at one epoch.
#[derive(Clone, Copy, Debug)]
pub(super) struct Batch {
    pub tag: u64,
    pub pages: Chain,
    pub nodes: Chain,
}

/// The grace period and what waits for it: the writer's private memory.
pub(crate) struct Retirement {
    pub grace: Box<dyn Grace + Send>,
    /// Oldest first; tags strictly increase.
    pub(super) batches: VecDeque<Batch>,
    /// Pages waiting, in all batches.
    pub(super) pages: u32,
    /// Nodes waiting, in all batches.
    pub(super) nodes: u32,
}

impl Retirement {
    pub fn new(grace: Box<dyn Grace + Send>) -> Self {
        Self {
            grace,
            batches: VecDeque::with_capacity(4),
            pages: 0,
            nodes: 0,
        }
    }

    /// The batch of the current epoch (made if there is none yet).
    pub(super) fn current(&mut self) -> &mut Batch {
        let tag = self.grace.epoch();
        if self.batches.back().is_none_or(|b| b.tag != tag) {
            self.batches.push_back(Batch {
                tag,
                pages: Chain::EMPTY,
                nodes: Chain::EMPTY,
            });
        }
        let last = self.batches.len() - 1;
        &mut self.batches[last]
    }
}
