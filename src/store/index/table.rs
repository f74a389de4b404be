//! The index's entries in the shared hash table: finding a key's entry
//! along its bucket's chain, writing a reserved entry and linking it at the
//! head of its chain, and unlinking a dropped one and retiring it (to
//! limbo, or straight back to the free lists without a grace period).
//!
//! Apart because these writes change the chains readers walk (with the
//! orderings `StoreReader::find` pairs with), while reservations and
//! eviction decide which entries to link or drop.

use std::cmp::Reverse;

use radixd_ipc::sync::Ordering;

use super::super::layout::{key_hash, key_words, COMMITTED, FREE, NIL, RESERVED};
use super::{Private, StoreIndex};

impl StoreIndex {
    /// The entry (any state but free) of `key` in namespace `ns`.
    pub(super) fn lookup(&self, ns: u32, key: &[u8]) -> Option<u32> {
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

    /// Writes entry `index` for `key` (reserved) and links it at the head
    /// of its chain.
    pub(super) fn link(
        &mut self,
        index: u32,
        ns: u32,
        key: &[u8],
        data: u64,
        parent: Option<(u32, u32)>,
    ) {
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

    /// Unlinks entry `index` from its chain, marks it free and retires it
    /// with its slot.
    pub(super) fn drop_entry(&mut self, index: u32) {
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
}
