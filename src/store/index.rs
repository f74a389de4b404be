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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

use radixd_ipc::sync::Ordering;

use super::error::{AdoptError, StoreError};
use super::layout::{
    key_hash, key_words, stride, COMMITTED, FREE, LAYOUT_VERSION, MAGIC, MAX_KEY, MAX_NAME,
    NAMESPACES, NIL, RESERVED,
};
use super::view::StoreView;
use super::{StoreNs, StoreSlot};
use crate::engine::Grace;

mod record;
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

/// How long a reserve waits, advancing the epoch, for values in limbo
/// before it calls the store full (readers are expired well before).
const LIMBO_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

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

    /// The entry (any state but free) of `key` in namespace `ns`.
    fn lookup(&self, ns: u32, key: &[u8]) -> Option<u32> {
        let hash = key_hash(ns, key);
        let words = key_words(key);
        // Relaxed, all: the daemon wrote every field it reads here.
        let mut at = self.view.bucket(hash).load(Ordering::Relaxed);
        while at != NIL {
            let e = self.view.entry(at)?;
            let p = self.private.get(at as usize)?;
            if p.state != FREE
                && e.hash.load(Ordering::Relaxed) == hash
                && e.ns.load(Ordering::Relaxed) == ns
                && e.key_len.load(Ordering::Relaxed) as usize == key.len()
                && e.key
                    .iter()
                    .zip(&words[..key.len().div_ceil(8)])
                    .all(|(a, b)| a.load(Ordering::Relaxed) == *b)
            {
                return Some(at);
            }
            at = e.next.load(Ordering::Relaxed);
        }
        None
    }

    /// Whether `key` is committed in `ns` (the daemon's own view).
    pub fn contains(&self, ns: u32, key: &[u8]) -> bool {
        self.lookup(ns, key)
            .is_some_and(|i| self.private[i as usize].state == COMMITTED)
    }

    /// Reserves a slot for each key of `ns` not stored or reserved yet
    /// (`None` for the others) on behalf of `owner` (see [`owner`]); `parents`
    /// (one per key, or empty) name the key stored before each.
    pub fn reserve(
        &mut self,
        owner: u64,
        ns: u32,
        keys: &[&[u8]],
        parents: &[Option<&[u8]>],
    ) -> Result<Vec<Option<StoreSlot>>, StoreError> {
        let space = self.ns(ns)?;
        let stride = stride(space.value_size);
        for key in keys.iter().chain(parents.iter().flatten()) {
            if key.is_empty() || key.len() > MAX_KEY {
                return Err(StoreError::BadKey { len: key.len() });
            }
        }
        if !parents.is_empty() && parents.len() != keys.len() {
            return Err(StoreError::BadKey { len: 0 });
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut made = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if self.lookup(ns, key).is_some() {
                out.push(None);
                continue;
            }
            let Some((index, data)) = self.room(stride) else {
                let needed = keys.len() - i;
                for &slot in &made {
                    self.drop_entry(slot);
                    self.unreserve(owner);
                }
                self.figures.failed_reserves += 1;
                self.publish();
                return Err(StoreError::StoreFull { needed });
            };
            let parent = parents
                .get(i)
                .copied()
                .flatten()
                .and_then(|p| self.lookup(ns, p))
                .map(|p| (p, self.private[p as usize].generation));
            self.link(index, ns, key, data, parent);
            let p = &mut self.private[index as usize];
            p.state = RESERVED;
            p.owner = owner;
            *self.reserved.entry(owner).or_default() += 1;
            made.push(index);
            out.push(Some(StoreSlot {
                index,
                generation: p.generation,
                offset: data,
            }));
        }
        Ok(out)
    }

    /// Writes entry `index` for `key` (reserved) and links it at the head
    /// of its chain.
    fn link(&mut self, index: u32, ns: u32, key: &[u8], data: u64, parent: Option<(u32, u32)>) {
        let hash = key_hash(ns, key);
        let bucket = self.view.bucket(hash);
        let Some(e) = self.view.entry(index) else {
            return;
        };
        let p = &mut self.private[index as usize];
        p.generation = p.generation.wrapping_add(1);
        (p.parent, p.parent_generation) = parent.unwrap_or((NIL, 0));
        e.version.begin();
        // Relaxed, all: published by `version.end()` (Release) and, for a
        // new chain head, the Release store of the bucket below.
        e.state.store(RESERVED, Ordering::Relaxed);
        e.ns.store(ns, Ordering::Relaxed);
        e.key_len.store(key.len() as u32, Ordering::Relaxed);
        // The words the key covers (the last one zero padded); readers
        // compare no further.
        for (w, x) in e.key.iter().zip(&key_words(key)[..key.len().div_ceil(8)]) {
            w.store(*x, Ordering::Relaxed);
        }
        e.hash.store(hash, Ordering::Relaxed);
        e.data.store(data, Ordering::Relaxed);
        e.generation.store(p.generation, Ordering::Relaxed);
        e.parent.store(p.parent, Ordering::Relaxed);
        e.parent_generation
            .store(p.parent_generation, Ordering::Relaxed);
        e.next
            .store(bucket.load(Ordering::Relaxed), Ordering::Relaxed);
        e.version.end();
        // Release: the entry is written before it becomes reachable; pairs
        // with the Acquire load of the head in `StoreReader::find`.
        bucket.store(index, Ordering::Release);
    }

    /// Checks that every slot is reserved by `client` in `ns` (and named
    /// once).
    fn check_held(&self, owner: u64, ns: u32, slots: &[StoreSlot]) -> Result<(), StoreError> {
        self.ns(ns)?;
        let mut seen = HashSet::with_capacity(slots.len());
        for s in slots {
            let ok = self.private.get(s.index as usize).is_some_and(|p| {
                p.state == RESERVED && p.owner == owner && p.generation == s.generation
            }) && self
                .view
                .entry(s.index)
                .is_some_and(|e| e.ns.load(Ordering::Relaxed) == ns)
                && seen.insert(s.index);
            if !ok {
                return Err(StoreError::NotReserved { index: s.index });
            }
        }
        Ok(())
    }

    /// Publishes the values client `client` copied into `slots`; returns
    /// how many.
    pub fn commit(
        &mut self,
        owner: u64,
        ns: u32,
        slots: &[StoreSlot],
    ) -> Result<usize, StoreError> {
        self.check_held(owner, ns, slots)?;
        let value_size = self.ns(ns)?.value_size;
        for s in slots {
            let index = s.index;
            let p = self.private[index as usize];
            // The parent counts only if it is still the value named.
            let parent = (p.parent != NIL
                && self
                    .private
                    .get(p.parent as usize)
                    .is_some_and(|q| q.state == COMMITTED && q.generation == p.parent_generation))
            .then_some(p.parent);
            let Some(e) = self.view.entry(index) else {
                continue;
            };
            e.version.begin();
            // Relaxed: published by `end` (Release), which pairs with the
            // Acquire load in `Version::stable` of a reader: the client's
            // copy into the slot happened before its commit request was
            // popped (the ring's Release/Acquire), so before this.
            e.state.store(COMMITTED, Ordering::Relaxed);
            if parent.is_none() {
                e.parent.store(NIL, Ordering::Relaxed);
            }
            e.version.end();
            let stamp = self.view.clock().fetch_add(1, Ordering::Relaxed);
            if let Some(st) = self.view.stamp(index) {
                // Relaxed: a hint (see `StoreReader::get_raw`).
                st.store(stamp, Ordering::Relaxed);
            }
            let p = &mut self.private[index as usize];
            p.state = COMMITTED;
            p.owner = NO_OWNER;
            if parent.is_none() {
                p.parent = NIL;
            }
            if p.children == 0 {
                p.filed = stamp;
                self.heap.push(Reverse((stamp, index)));
            }
            if let Some(parent) = parent {
                self.private[parent as usize].children += 1;
            }
            self.record_stored(index, parent);
            self.unreserve(owner);
            self.figures.values += 1;
            self.figures.bytes += value_size;
        }
        self.publish();
        Ok(slots.len())
    }

    /// Gives back slots client `client` reserved and will not commit.
    pub fn abort(&mut self, owner: u64, ns: u32, slots: &[StoreSlot]) -> Result<usize, StoreError> {
        self.check_held(owner, ns, slots)?;
        for s in slots {
            self.drop_entry(s.index);
            self.unreserve(owner);
        }
        Ok(slots.len())
    }

    /// Drops every committed value of namespace `ns` (an SGLang server's
    /// `clear()` of its own L3): each goes the way of an evicted one, to
    /// limbo, so a reader mid-copy still gets the old bytes or a miss.
    /// Values reserved but not committed stay their clients'; other
    /// namespaces are untouched. Returns how many values were dropped.
    pub fn clear(&mut self, ns: u32) -> Result<u64, StoreError> {
        let value_size = self.ns(ns)?.value_size;
        let doomed: Vec<u32> = (0..self.private.len() as u32)
            .filter(|&i| {
                self.private[i as usize].state == COMMITTED
                    // Relaxed: the daemon's own field.
                    && self
                        .view
                        .entry(i)
                        .is_some_and(|e| e.ns.load(Ordering::Relaxed) == ns)
            })
            .collect();
        for &i in &doomed {
            self.record_removed(i);
            self.drop_entry(i);
        }
        let n = doomed.len() as u64;
        self.figures.values -= n;
        self.figures.bytes -= n * value_size;
        self.publish();
        Ok(n)
    }

    fn unreserve(&mut self, owner: u64) {
        if let Some(n) = self.reserved.get_mut(&owner) {
            *n -= 1;
            if *n == 0 {
                self.reserved.remove(&owner);
            }
        }
    }

    /// Aborts every reservation whose owner `alive` says is gone (a client
    /// that died or left between reserve and commit); returns how many.
    pub fn release_stale(&mut self, alive: impl Fn(u64) -> bool) -> usize {
        let gone: Vec<u64> = self
            .reserved
            .keys()
            .copied()
            .filter(|&o| !alive(o))
            .collect();
        gone.into_iter().map(|o| self.release_client(o)).sum()
    }

    /// Whether any reservation is held.
    pub fn has_reservations(&self) -> bool {
        !self.reserved.is_empty()
    }

    /// Aborts every reservation of `owner` (it died or left).
    pub fn release_client(&mut self, owner: u64) -> usize {
        if self.reserved.remove(&owner).is_none() {
            return 0;
        }
        let held: Vec<u32> = (0..self.private.len() as u32)
            .filter(|&i| {
                let p = self.private[i as usize];
                p.state == RESERVED && p.owner == owner
            })
            .collect();
        for &i in &held {
            self.drop_entry(i);
        }
        held.len()
    }

    /// Unlinks entry `index` from its chain, marks it free and retires it
    /// with its slot.
    fn drop_entry(&mut self, index: u32) {
        let Some(e) = self.view.entry(index) else {
            return;
        };
        // Relaxed, all: the daemon's own fields.
        let hash = e.hash.load(Ordering::Relaxed);
        let next = e.next.load(Ordering::Relaxed);
        let bucket = self.view.bucket(hash);
        e.version.begin();
        e.state.store(FREE, Ordering::Relaxed);
        e.version.end();
        // Unlink: a reader on the entry follows its `next`, left intact
        // until the entry is reused (after the grace period).
        if bucket.load(Ordering::Relaxed) == index {
            // Release: pairs with the Acquire load of the head in `find`.
            bucket.store(next, Ordering::Release);
        } else {
            let mut at = bucket.load(Ordering::Relaxed);
            while at != NIL {
                let Some(prev) = self.view.entry(at) else {
                    break;
                };
                let after = prev.next.load(Ordering::Relaxed);
                if after == index {
                    // Release: as for the head (the entry after is
                    // written already).
                    prev.next.store(next, Ordering::Release);
                    break;
                }
                at = after;
            }
        }
        let p = &mut self.private[index as usize];
        let was = p.state;
        let (parent, parent_generation) = (p.parent, p.parent_generation);
        *p = Private {
            generation: p.generation,
            ..Private::FREE
        };
        if was == COMMITTED && parent != NIL {
            let stamp = self.shared_stamp(parent);
            if let Some(q) = self.private.get_mut(parent as usize) {
                if q.state == COMMITTED && q.generation == parent_generation && q.children > 0 {
                    q.children -= 1;
                    if q.children == 0 {
                        q.filed = stamp;
                        self.heap.push(Reverse((stamp, parent)));
                    }
                }
            }
        }
        match self.grace.as_ref() {
            Some(g) => {
                let tag = g.epoch();
                match self.limbo.back_mut() {
                    Some((t, batch)) if *t == tag => batch.push(index),
                    _ => self.limbo.push_back((tag, vec![index])),
                }
            }
            None => self.release(index),
        }
    }

    /// A committed entry's use stamp as readers left it, bounded by the
    /// clock (a hint another process wrote).
    fn shared_stamp(&self, index: u32) -> u64 {
        // Relaxed: hints.
        let now = self.view.clock().load(Ordering::Relaxed);
        self.view
            .stamp(index)
            .map_or(0, |s| s.load(Ordering::Relaxed))
            .min(now)
    }

    /// Returns retired entry `index` and its slot to the free lists.
    fn release(&mut self, index: u32) {
        self.free_entries.push(index);
        let Some(e) = self.view.entry(index) else {
            return;
        };
        // Relaxed: the daemon's own field.
        let data = e.data.load(Ordering::Relaxed);
        let extent_bytes = self.view.layout().config.extent_bytes;
        let x = (data / extent_bytes) as usize;
        let Some(ext) = self.extents.get_mut(x) else {
            return;
        };
        if ext.stride == 0 {
            return;
        }
        ext.used -= 1;
        if ext.used == 0 {
            ext.stride = 0;
            ext.free = Vec::new();
            self.free_extents.push(x as u32);
            return;
        }
        ext.free.push(((data % extent_bytes) / ext.stride) as u32);
        if ext.free.len() == 1 {
            self.partial.entry(ext.stride).or_default().push(x as u32);
        }
    }

    /// Advances the grace period as far as readers allow and releases what
    /// it freed; returns how many entries came back.
    pub fn reclaim(&mut self) -> usize {
        let Some(grace) = self.grace.as_mut() else {
            return 0;
        };
        let mut freed = Vec::new();
        for _ in 0..3 {
            while let Some((tag, _)) = self.limbo.front() {
                if !grace.reusable(*tag) {
                    break;
                }
                if let Some((_, batch)) = self.limbo.pop_front() {
                    freed.extend(batch);
                }
            }
            if self.limbo.is_empty() || !grace.try_advance() {
                break;
            }
        }
        let n = freed.len();
        for i in freed {
            self.release(i);
        }
        n
    }

    /// A free entry and a free slot of `stride`, evicting what it must.
    fn room(&mut self, stride: u64) -> Option<(u32, u64)> {
        let mut deadline = None;
        loop {
            if let Some(found) = self.take(stride) {
                return Some(found);
            }
            if !self.limbo.is_empty() && self.reclaim() > 0 {
                continue;
            }
            if self.evict_one() {
                continue;
            }
            if self.limbo.is_empty() {
                return None;
            }
            // Only values readers may still copy stand in the way: wait
            // (briefly) for them to move on or be expired.
            let now = std::time::Instant::now();
            if now >= *deadline.get_or_insert(now + LIMBO_WAIT) {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// A free entry and slot of `stride` without evicting, if there are.
    fn take(&mut self, stride: u64) -> Option<(u32, u64)> {
        let entry = *self.free_entries.last()?;
        let extent_bytes = self.view.layout().config.extent_bytes;
        let x = loop {
            let list = self.partial.entry(stride).or_default();
            match list.last() {
                Some(&x) => {
                    let e = &self.extents[x as usize];
                    if e.stride == stride && !e.free.is_empty() {
                        break x;
                    }
                    list.pop();
                }
                None => {
                    let x = self.free_extents.pop()?;
                    let slots = (extent_bytes / stride) as u32;
                    let e = &mut self.extents[x as usize];
                    e.stride = stride;
                    e.used = 0;
                    e.free = (0..slots).rev().collect();
                    list.push(x);
                    break x;
                }
            }
        };
        let e = &mut self.extents[x as usize];
        let slot = e.free.pop()?;
        e.used += 1;
        self.free_entries.pop();
        Some((
            entry,
            u64::from(x) * extent_bytes + u64::from(slot) * stride,
        ))
    }

    /// Evicts the least recently used committed leaf; whether there was one.
    pub fn evict_one(&mut self) -> bool {
        while let Some(Reverse((filed, index))) = self.heap.pop() {
            let p = self.private[index as usize];
            if p.state != COMMITTED || p.children > 0 || p.filed != filed {
                continue;
            }
            let stamp = self.shared_stamp(index);
            if stamp > filed {
                self.private[index as usize].filed = stamp;
                self.heap.push(Reverse((stamp, index)));
                continue;
            }
            let value_size = self
                .view
                .entry(index)
                .and_then(|e| self.ns(e.ns.load(Ordering::Relaxed)).ok())
                .map_or(0, |n| n.value_size);
            self.record_removed(index);
            self.drop_entry(index);
            self.figures.values -= 1;
            self.figures.bytes -= value_size;
            self.figures.evicted += 1;
            self.publish();
            return true;
        }
        false
    }

    /// Adopts the store a previous daemon left in `view`: checks the
    /// header and every namespace and entry, drops what was reserved or
    /// half written, and rebuilds chains, free lists, extents and the LRU
    /// order from the committed entries. Refuses a store it cannot trust.
    pub fn adopt(view: StoreView) -> Result<Self, AdoptError> {
        let layout = *view.layout();
        let h = view.header();
        // Relaxed, all: no other process writes the index now (a new daemon
        // adopts before it serves).
        if h.magic.load(Ordering::Relaxed) != MAGIC {
            return Err(AdoptError::Magic);
        }
        let version = h.version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(AdoptError::Version { found: version });
        }
        if h.hash.load(Ordering::Relaxed) != layout.hash
            || h.file_bytes.load(Ordering::Relaxed) != layout.file_bytes
        {
            return Err(AdoptError::Header(
                "its layout hash or length contradicts its configuration".into(),
            ));
        }
        let mut index = Self::empty(view);
        let extent_bytes = layout.config.extent_bytes;
        for i in 0..NAMESPACES {
            let Some(n) = view.namespace(i) else { continue };
            match n.state.load(Ordering::Relaxed) {
                0 => continue,
                1 => {}
                _ => {
                    return Err(AdoptError::Namespace {
                        index: i,
                        why: "bad state",
                    })
                }
            }
            let len = n.name_len.load(Ordering::Relaxed) as usize;
            let value_size = n.value_size.load(Ordering::Relaxed);
            if len == 0 || len > MAX_NAME {
                return Err(AdoptError::Namespace {
                    index: i,
                    why: "bad name length",
                });
            }
            if value_size == 0 || stride(value_size) > extent_bytes {
                return Err(AdoptError::Namespace {
                    index: i,
                    why: "value size does not fit an extent",
                });
            }
            let mut name: Vec<u8> = n
                .name
                .iter()
                .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
                .collect();
            name.truncate(len);
            if index.ns.iter().flatten().any(|o| o.name == name) {
                return Err(AdoptError::Namespace {
                    index: i,
                    why: "name registered twice",
                });
            }
            index.ns[i as usize] = Some(Ns {
                name,
                value_size,
                stride: stride(value_size),
            });
        }
        // Pass 1: check every committed entry; drop the rest.
        let entries = layout.config.entries;
        let mut committed = Vec::new();
        let mut keys = HashSet::new();
        for i in 0..entries {
            let Some(e) = view.entry(i) else { continue };
            let bad = |why| AdoptError::Entry { index: i, why };
            let state = e.state.load(Ordering::Relaxed);
            let stable = e.version.stable().is_some();
            match state {
                FREE | RESERVED => continue,
                COMMITTED if !stable => continue,
                COMMITTED => {}
                _ => return Err(bad("bad state")),
            }
            let ns = e.ns.load(Ordering::Relaxed);
            let Some(space) = index.ns.get(ns as usize).and_then(Option::as_ref) else {
                return Err(bad("unknown namespace"));
            };
            let key_len = e.key_len.load(Ordering::Relaxed) as usize;
            if key_len == 0 || key_len > MAX_KEY {
                return Err(bad("bad key length"));
            }
            let mut key: Vec<u8> = e
                .key
                .iter()
                .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
                .collect();
            key.truncate(key_len);
            if e.hash.load(Ordering::Relaxed) != key_hash(ns, &key) {
                return Err(bad("key hash mismatch"));
            }
            if !keys.insert((ns, key)) {
                return Err(bad("key stored twice"));
            }
            let data = e.data.load(Ordering::Relaxed);
            let x = data / extent_bytes;
            let within = data % extent_bytes;
            let slots = extent_bytes / space.stride;
            if x >= u64::from(layout.extents)
                || within % space.stride != 0
                || within / space.stride >= slots
            {
                return Err(bad("data offset off the slot grid"));
            }
            let ext = &mut index.extents[x as usize];
            if ext.stride != 0 && ext.stride != space.stride {
                return Err(bad("extent holds values of two sizes"));
            }
            if ext.stride == 0 {
                ext.stride = space.stride;
                ext.free = Vec::new();
            }
            ext.used += 1;
            ext.free.push((within / space.stride) as u32);
            let parent = e.parent.load(Ordering::Relaxed);
            if parent != NIL && parent >= entries {
                return Err(bad("parent out of range"));
            }
            committed.push(i);
        }
        // No two entries on one slot: `free` holds the used slots for now.
        for ext in &mut index.extents {
            if ext.stride == 0 {
                continue;
            }
            let mut used = std::mem::take(&mut ext.free);
            used.sort_unstable();
            if used.windows(2).any(|w| w[0] == w[1]) {
                return Err(AdoptError::Entry {
                    index: NIL,
                    why: "two entries share a data slot",
                });
            }
            let slots = (extent_bytes / ext.stride) as u32;
            let mut is_used = vec![false; slots as usize];
            for u in used {
                if let Some(x) = is_used.get_mut(u as usize) {
                    *x = true;
                }
            }
            ext.free = (0..slots).rev().filter(|&s| !is_used[s as usize]).collect();
        }
        // Pass 2: the store is trusted; rebuild.
        for b in 0..layout.buckets {
            if let Some(head) = view.bucket_at(b) {
                head.store(NIL, Ordering::Relaxed);
            }
        }
        let is_committed = {
            let mut v = vec![false; entries as usize];
            for &i in &committed {
                v[i as usize] = true;
            }
            v
        };
        let now = view.clock().load(Ordering::Relaxed).max(1);
        for i in 0..entries {
            let Some(e) = view.entry(i) else { continue };
            let generation = e.generation.load(Ordering::Relaxed);
            let p = &mut index.private[i as usize];
            p.generation = generation;
            if !is_committed[i as usize] {
                // An odd version (a change cut short) is made even again:
                // versions only move forward.
                if e.version.stable().is_none() {
                    e.version.end();
                }
                e.version.begin();
                e.state.store(FREE, Ordering::Relaxed);
                e.next.store(NIL, Ordering::Relaxed);
                e.version.end();
                index.free_entries.push(i);
                continue;
            }
            p.state = COMMITTED;
            let hash = e.hash.load(Ordering::Relaxed);
            let head = view.bucket(hash);
            e.version.begin();
            e.next
                .store(head.load(Ordering::Relaxed), Ordering::Relaxed);
            e.version.end();
            head.store(i, Ordering::Relaxed);
        }
        index.free_entries.reverse();
        for &i in &committed {
            let Some(e) = view.entry(i) else { continue };
            let parent = e.parent.load(Ordering::Relaxed);
            let parent_generation = e.parent_generation.load(Ordering::Relaxed);
            let linked = parent != NIL
                && is_committed[parent as usize]
                && index.private[parent as usize].generation == parent_generation
                && parent != i;
            let p = &mut index.private[i as usize];
            if linked {
                (p.parent, p.parent_generation) = (parent, parent_generation);
                index.private[parent as usize].children += 1;
            } else {
                p.parent = NIL;
            }
        }
        // A parent cycle (only a forged or garbled file has one) holds
        // values that are never a leaf, so no eviction reaches them: the
        // link that closes each cycle goes (found by fuzz/store_adopt).
        let mut mark = vec![0u8; entries as usize]; // 1: on this walk, 2: done
        for &start in &committed {
            let mut at = start;
            while mark[at as usize] == 0 {
                mark[at as usize] = 1;
                let parent = index.private[at as usize].parent;
                if parent == NIL {
                    break;
                }
                if mark[parent as usize] == 1 {
                    index.private[at as usize].parent = NIL;
                    index.private[parent as usize].children -= 1;
                    break;
                }
                at = parent;
            }
            // The walk again, marking it done.
            let mut at = start;
            while mark[at as usize] == 1 {
                mark[at as usize] = 2;
                match index.private[at as usize].parent {
                    NIL => break,
                    parent => at = parent,
                }
            }
        }
        for &i in &committed {
            let ns = view.entry(i).map_or(0, |e| e.ns.load(Ordering::Relaxed));
            let value_size = index.ns(ns).map_or(0, |n| n.value_size);
            index.figures.values += 1;
            index.figures.bytes += value_size;
            if index.private[i as usize].children == 0 {
                let stamp = view
                    .stamp(i)
                    .map_or(0, |s| s.load(Ordering::Relaxed))
                    .min(now);
                index.private[i as usize].filed = stamp;
                index.heap.push(Reverse((stamp, i)));
            }
        }
        for (x, ext) in index.extents.iter().enumerate() {
            if ext.stride == 0 {
                index.free_extents.push(x as u32);
            } else if !ext.free.is_empty() {
                index.partial.entry(ext.stride).or_default().push(x as u32);
            }
        }
        index.free_extents.reverse();
        for c in 0..layout.config.clients {
            if let Some(c) = view.counters(c) {
                c.hits.store(0, Ordering::Relaxed);
                c.misses.store(0, Ordering::Relaxed);
            }
        }
        h.retired_hits.store(0, Ordering::Relaxed);
        h.retired_misses.store(0, Ordering::Relaxed);
        index.publish();
        Ok(index)
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
