//! Writes, as the index's clients make them: reserve → (the client copies)
//! → commit or abort, each reservation held by an owner (a client's claim,
//! see [`owner`](super::owner)), and the release of what a client that died
//! or left between reserve and commit still held.
//!
//! Apart from the table and from eviction because this is the protocol a
//! client sees: which slots it holds, what a stale or foreign slot gets,
//! and when a value becomes readable.

use std::cmp::Reverse;
use std::collections::HashSet;

use radixd_ipc::sync::Ordering;

use super::super::error::StoreError;
use super::super::layout::{stride, COMMITTED, MAX_KEY, NIL, RESERVED};
use super::super::StoreSlot;
use super::{StoreIndex, NO_OWNER};

impl StoreIndex {
    /// Reserves a slot for each key of `ns` not stored or reserved yet
    /// (`None` for the others) on behalf of `owner` (see
    /// [`owner`](super::owner)); `parents` (one per key, or empty) name the
    /// key stored before each.
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
}
