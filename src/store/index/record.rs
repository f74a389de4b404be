//! The store's optional record of what becomes readable and what goes, for
//! KV events (`radixd serve --store SIZE --kv-events`, docs/kv-events.md).
//!
//! Like the engine's record (`crate::engine::CacheEvent`), the index only
//! appends plain facts (namespace and key bytes) while recording is on;
//! hashing and encoding happen on the publisher thread. With recording off
//! every hook is one branch on `Option::is_some`.

use std::collections::HashMap;

use radixd_ipc::sync::Ordering;

use super::super::layout::{COMMITTED, NIL};
use super::StoreIndex;

/// A change to the set of values readers can get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// A value was committed under `key` in namespace `ns`; `parent` is the
    /// key of the value it was stored after, when that value was still
    /// committed then (the store's own parent link).
    Stored {
        ns: u32,
        key: Vec<u8>,
        parent: Option<Vec<u8>>,
    },
    /// The value under `key` in namespace `ns` went (evicted or cleared).
    Removed { ns: u32, key: Vec<u8> },
}

impl StoreIndex {
    /// Starts (or stops, dropping what was recorded) recording
    /// [`StoreEvent`]s.
    pub fn record_events(&mut self, on: bool) {
        self.events = on.then(Vec::new);
    }

    /// Whether events are being recorded.
    pub fn recording(&self) -> bool {
        self.events.is_some()
    }

    /// Moves what was recorded since the last call into `out` (appended).
    pub fn take_events(&mut self, out: &mut Vec<StoreEvent>) {
        if let Some(log) = self.events.as_mut() {
            out.append(log);
        }
    }

    /// The key of entry `index` as the daemon wrote it.
    pub(super) fn key_of(&self, index: u32) -> Vec<u8> {
        let Some(e) = self.view.entry(index) else {
            return Vec::new();
        };
        // Relaxed, all: the daemon's own fields.
        let len = (e.key_len.load(Ordering::Relaxed) as usize).min(e.key.len() * 8);
        let mut key: Vec<u8> = e.key[..len.div_ceil(8)]
            .iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
            .collect();
        key.truncate(len);
        key
    }

    /// The namespace of entry `index`.
    fn ns_of(&self, index: u32) -> u32 {
        // Relaxed: the daemon's own field.
        self.view
            .entry(index)
            .map_or(0, |e| e.ns.load(Ordering::Relaxed))
    }

    /// Records that entry `index` was committed (with `parent` linked).
    pub(super) fn record_stored(&mut self, index: u32, parent: Option<u32>) {
        if self.events.is_none() {
            return;
        }
        let e = StoreEvent::Stored {
            ns: self.ns_of(index),
            key: self.key_of(index),
            parent: parent.map(|p| self.key_of(p)),
        };
        if let Some(log) = self.events.as_mut() {
            log.push(e);
        }
    }

    /// Records that committed entry `index` is about to go.
    pub(super) fn record_removed(&mut self, index: u32) {
        if self.events.is_none() {
            return;
        }
        let e = StoreEvent::Removed {
            ns: self.ns_of(index),
            key: self.key_of(index),
        };
        if let Some(log) = self.events.as_mut() {
            log.push(e);
        }
    }

    /// The parent of committed entry `index`, if it is still the value
    /// linked (a `clear` may have dropped a parent under its children).
    fn live_parent(&self, index: u32) -> Option<u32> {
        let p = self.private[index as usize];
        (p.parent != NIL).then_some(p.parent).filter(|&q| {
            self.private
                .get(q as usize)
                .is_some_and(|q| q.state == COMMITTED && q.generation == p.parent_generation)
        })
    }

    /// A `Stored` fact for every committed value, each parent before its
    /// children, so a consumer that applies them in order rebuilds the
    /// store's whole contents (a resynchronisation, or what a daemon
    /// adopting a store announces first).
    pub fn snapshot(&self) -> Vec<StoreEvent> {
        let committed: Vec<u32> = (0..self.private.len() as u32)
            .filter(|&i| self.private[i as usize].state == COMMITTED)
            .collect();
        // Children by parent; the roots (no live parent) start the walk.
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut roots = Vec::new();
        for &i in &committed {
            match self.live_parent(i) {
                None => roots.push(i),
                Some(p) => children.entry(p).or_default().push(i),
            }
        }
        let mut out = Vec::with_capacity(committed.len());
        let mut stack: Vec<u32> = roots.into_iter().rev().collect();
        while let Some(i) = stack.pop() {
            out.push(StoreEvent::Stored {
                ns: self.ns_of(i),
                key: self.key_of(i),
                parent: self.live_parent(i).map(|p| self.key_of(p)),
            });
            if let Some(kids) = children.remove(&i) {
                stack.extend(kids.into_iter().rev());
            }
        }
        out
    }
}
