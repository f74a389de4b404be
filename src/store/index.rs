//! [`StoreIndex`]: the daemon's side of the store, its one writer. It keeps
//! the shared index (buckets, chains, entries) and, in its own memory, what
//! readers need not see: free entries, extents and their free slots, the
//! LRU heap of leaves, the limbo of evicted values readers may still copy,
//! and which client reserved what.
//!
//! - **Writes** go reserve → (the client copies) → commit. A reserved entry
//!   is linked into its chain at once (so a second reserve of the key, by
//!   anyone, is answered "already there") but readers skip it until its
//!   commit makes it [`COMMITTED`] under its version.
//! - **Eviction** (when a reserve needs an entry or a slot): leaves first,
//!   least recently used first, across namespaces. A lazy heap files each
//!   committed leaf under the stamp it had then; the oldest is popped, its
//!   shared stamp (readers stamp what they copy) re-read, and it is
//!   refiled if it was used since, else evicted. A value whose stored
//!   child exists is not a leaf.
//! - **Reuse** waits for the readers' grace period (`engine::Grace`): an
//!   evicted entry and its slot go to limbo tagged with the epoch and come
//!   back once no reader announced then can still copy them.
//! - **Memory moves between sizes**: the data region is cut into extents;
//!   an extent serves one stride while it holds values and returns to the
//!   free extents when its last value goes.
//!
//! Every operation that returns an error has changed nothing (evictions
//! made to find room stay made: they are what a cache does anyway).
//!
//! This file holds the index's state and its namespaces; the rest lies in
//! submodules, each an `impl StoreIndex` of one concern: `table` (finding,
//! linking and unlinking entries in the shared chains), `reservations`
//! (reserve, commit, abort, and what a departed client held), `eviction`
//! (room for a value, LRU eviction, clearing a namespace, limbo and
//! reclaim), `adopt` (a previous daemon's store checked and rebuilt) and
//! `record` (KV events).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use radixd_ipc::sync::Ordering;

use super::error::StoreError;
use super::layout::{
    key_words, stride, COMMITTED, FREE, LAYOUT_VERSION, MAGIC, MAX_NAME, NAMESPACES, NIL,
};
use super::view::StoreView;
use super::StoreNs;
use crate::engine::Grace;

mod adopt;
mod eviction;
mod record;
mod reservations;
mod table;
pub use record::StoreEvent;

/// A namespace as the daemon keeps it.
#[derive(Clone, Debug)]
struct Ns {
    name: Vec<u8>,
    value_size: u64,
    stride: u64,
}

/// What the daemon keeps per entry in its own memory.
#[derive(Clone, Copy, Debug)]
struct Private {
    /// Its state (the shared word's truth).
    state: u32,
    /// The client (claim) that reserved it ([`NO_OWNER`]: none).
    owner: u64,
    /// Committed entries that name it as their parent.
    children: u32,
    /// Its parent entry ([`NIL`]: none) and the parent's generation then.
    parent: u32,
    parent_generation: u32,
    generation: u32,
    /// The stamp of its live heap record (`u64::MAX`: not filed).
    filed: u64,
}

const NOT_FILED: u64 = u64::MAX;
/// [`Private::owner`] of an entry nobody reserved.
const NO_OWNER: u64 = u64::MAX;

impl Private {
    const FREE: Self = Self {
        state: FREE,
        owner: NO_OWNER,
        children: 0,
        parent: NIL,
        parent_generation: 0,
        generation: 0,
        filed: NOT_FILED,
    };
}

/// One extent of the data region.
#[derive(Clone, Debug, Default)]
struct Extent {
    /// The stride it serves (0: free).
    stride: u64,
    /// Slots holding a value, reserved, or in limbo.
    used: u32,
    /// Free slot numbers.
    free: Vec<u32>,
}

/// The store's figures, kept by the daemon and published in the header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub values: u64,
    pub bytes: u64,
    pub evicted: u64,
    pub failed_reserves: u64,
}

/// The daemon's side of the store (see the module docs).
pub struct StoreIndex {
    view: StoreView,
    grace: Option<Box<dyn Grace + Send>>,
    ns: Vec<Option<Ns>>,
    private: Vec<Private>,
    free_entries: Vec<u32>,
    extents: Vec<Extent>,
    free_extents: Vec<u32>,
    /// Per stride, extents that may have a free slot (checked when used).
    partial: HashMap<u64, Vec<u32>>,
    /// Committed leaves by the stamp they were filed under, oldest first.
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    /// Evicted or aborted entries (with their slots) by retirement epoch.
    limbo: VecDeque<(u64, Vec<u32>)>,
    /// Reservations held, per owner (a client's claim: its slot and
    /// generation, see `owner`).
    reserved: HashMap<u64, u32>,
    figures: Figures,
    /// What became readable or went, while KV events are on.
    events: Option<Vec<StoreEvent>>,
}

// SAFETY: the view leads into a shared mapping (see `StoreView`); the
// index is used by one thread at a time.
unsafe impl Send for StoreIndex {}

/// The owner of reservations made by the client holding slot `slot` under
/// claim generation `generation`: a later client of the slot is another
/// owner, so what a dead client reserved is never mistaken for its
/// successor's.
pub fn owner(slot: u32, generation: u32) -> u64 {
    (u64::from(slot) << 32) | u64::from(generation)
}

impl StoreIndex {
    /// Formats a fresh store over `view` (memory of a new, zeroed file).
    pub fn format(view: StoreView) -> Self {
        let layout = *view.layout();
        let h = view.header();
        // Relaxed, all: the daemon publishes the store (and the segment
        // that names it) with a Release store before any client maps it.
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.hash.store(layout.hash, Ordering::Relaxed);
        h.data_bytes
            .store(layout.config.data_bytes, Ordering::Relaxed);
        h.extent_bytes
            .store(layout.config.extent_bytes, Ordering::Relaxed);
        h.entries
            .store(u64::from(layout.config.entries), Ordering::Relaxed);
        h.clients
            .store(u64::from(layout.config.clients), Ordering::Relaxed);
        h.file_bytes.store(layout.file_bytes, Ordering::Relaxed);
        for i in 0..layout.buckets {
            if let Some(b) = view.bucket_at(i) {
                b.store(NIL, Ordering::Relaxed);
            }
        }
        for i in 0..NAMESPACES {
            if let Some(n) = view.namespace(i) {
                n.state.store(0, Ordering::Relaxed);
            }
        }
        for i in 0..layout.config.entries {
            if let Some(e) = view.entry(i) {
                e.version.begin();
                e.state.store(FREE, Ordering::Relaxed);
                e.next.store(NIL, Ordering::Relaxed);
                e.version.end();
            }
            if let Some(s) = view.stamp(i) {
                s.store(0, Ordering::Relaxed);
            }
        }
        view.clock().store(1, Ordering::Relaxed);
        let mut index = Self::empty(view);
        index.free_entries = (0..layout.config.entries).rev().collect();
        index.free_extents = (0..layout.extents).rev().collect();
        index.publish();
        index
    }

    fn empty(view: StoreView) -> Self {
        let layout = *view.layout();
        Self {
            view,
            grace: None,
            ns: vec![None; NAMESPACES as usize],
            private: vec![Private::FREE; layout.config.entries as usize],
            free_entries: Vec::new(),
            extents: vec![Extent::default(); layout.extents as usize],
            free_extents: Vec::new(),
            partial: HashMap::new(),
            heap: BinaryHeap::new(),
            limbo: VecDeque::new(),
            reserved: HashMap::new(),
            figures: Figures::default(),
            events: None,
        }
    }

    /// From now on evicted values wait in limbo until `grace` says no
    /// reader can still copy them (without one they are reused at once:
    /// in-process use, where no reader runs beside the writer).
    pub fn set_grace(&mut self, grace: Box<dyn Grace + Send>) {
        self.grace = Some(grace);
    }

    /// The view.
    pub fn view(&self) -> &StoreView {
        &self.view
    }

    /// The figures.
    pub fn figures(&self) -> Figures {
        self.figures
    }

    /// A new claim of client slot `client`: its hit and miss counters start
    /// from zero, what the previous client of the slot counted moving into
    /// the header's retired totals, so the store's totals
    /// ([`StoreReader::stats`](super::StoreReader::stats)) keep every
    /// client's gets while each client's own figures are its own. The
    /// daemon calls it before the client sees its claim served, and the
    /// previous client is gone by then.
    pub fn reset_counters(&mut self, client: u32) {
        let Some(c) = self.view.counters(client) else {
            return;
        };
        // Relaxed, all: figures; nothing else is published with them.
        let (hits, misses) = (
            c.hits.swap(0, Ordering::Relaxed),
            c.misses.swap(0, Ordering::Relaxed),
        );
        let h = self.view.header();
        if hits > 0 {
            h.retired_hits.fetch_add(hits, Ordering::Relaxed);
        }
        if misses > 0 {
            h.retired_misses.fetch_add(misses, Ordering::Relaxed);
        }
    }

    /// Entries and slots waiting for readers.
    pub fn in_limbo(&self) -> usize {
        self.limbo.iter().map(|(_, v)| v.len()).sum()
    }

    /// Writes the figures into the header.
    fn publish(&self) {
        let h = self.view.header();
        // Relaxed, all: figures.
        h.values.store(self.figures.values, Ordering::Relaxed);
        h.bytes.store(self.figures.bytes, Ordering::Relaxed);
        h.evicted.store(self.figures.evicted, Ordering::Relaxed);
        h.failed_reserves
            .store(self.figures.failed_reserves, Ordering::Relaxed);
        let n = self.ns.iter().flatten().count() as u64;
        h.namespaces.store(n, Ordering::Relaxed);
    }

    /// Registers namespace `name` with values of `value_size` bytes, or
    /// finds it (with the same size).
    pub fn namespace(&mut self, name: &[u8], value_size: u64) -> Result<StoreNs, StoreError> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(StoreError::BadName { len: name.len() });
        }
        let extent = self.view.layout().config.extent_bytes;
        if let Some((id, ns)) = self
            .ns
            .iter()
            .enumerate()
            .find_map(|(i, n)| n.as_ref().filter(|n| n.name == name).map(|n| (i, n)))
        {
            if ns.value_size != value_size {
                return Err(StoreError::SizeMismatch {
                    expected: ns.value_size,
                    got: value_size,
                });
            }
            return Ok(StoreNs {
                id: id as u32,
                value_size,
            });
        }
        if value_size == 0 || stride(value_size) > extent {
            return Err(StoreError::ValueTooLarge { value_size, extent });
        }
        let id = self
            .ns
            .iter()
            .position(Option::is_none)
            .ok_or(StoreError::TooManyNamespaces)?;
        let record = self
            .view
            .namespace(id as u32)
            .ok_or(StoreError::TooManyNamespaces)?;
        // Relaxed: published by the Release store of `state` below.
        record.name_len.store(name.len() as u32, Ordering::Relaxed);
        record.value_size.store(value_size, Ordering::Relaxed);
        for (w, x) in record.name.iter().zip(key_words(name)) {
            w.store(x, Ordering::Relaxed);
        }
        // Release: publishes the fields above; pairs with the Acquire load
        // in `StoreReader::namespace`.
        record.state.store(1, Ordering::Release);
        self.ns[id] = Some(Ns {
            name: name.to_vec(),
            value_size,
            stride: stride(value_size),
        });
        self.publish();
        Ok(StoreNs {
            id: id as u32,
            value_size,
        })
    }

    /// The namespace `id` with its value size.
    pub fn ns(&self, id: u32) -> Result<StoreNs, StoreError> {
        self.ns
            .get(id as usize)
            .and_then(Option::as_ref)
            .map(|n| StoreNs {
                id,
                value_size: n.value_size,
            })
            .ok_or(StoreError::UnknownNamespace { ns: id })
    }

    /// Checks the private state against the shared index (tests).
    pub fn validate(&self) -> Result<(), String> {
        let layout = self.view.layout();
        let mut linked = 0usize;
        for b in 0..layout.buckets {
            let Some(head) = self.view.bucket_at(b) else {
                continue;
            };
            let mut at = head.load(Ordering::Relaxed);
            let mut steps = 0;
            while at != NIL {
                let e = self.view.entry(at).ok_or("chain leaves the entries")?;
                let p = self.private[at as usize];
                if p.state == FREE {
                    return Err(format!("free entry {at} linked"));
                }
                if u64::from(b) != e.hash.load(Ordering::Relaxed) & u64::from(layout.buckets - 1) {
                    return Err(format!("entry {at} in the wrong bucket"));
                }
                linked += 1;
                steps += 1;
                if steps > layout.config.entries {
                    return Err("chain loops".into());
                }
                at = e.next.load(Ordering::Relaxed);
            }
        }
        let live = self.private.iter().filter(|p| p.state != FREE).count();
        if live != linked {
            return Err(format!("{live} live entries, {linked} linked"));
        }
        let in_limbo = self.in_limbo();
        if live + in_limbo + self.free_entries.len() != layout.config.entries as usize {
            return Err("entries leaked".into());
        }
        let used: u64 = self.extents.iter().map(|e| u64::from(e.used)).sum();
        if used != (live + in_limbo) as u64 {
            return Err(format!(
                "{used} slots used, {} entries hold one",
                live + in_limbo
            ));
        }
        let committed = self.private.iter().filter(|p| p.state == COMMITTED).count() as u64;
        if committed != self.figures.values {
            return Err("values figure is off".into());
        }
        Ok(())
    }
}
