//! Adopting the store a previous daemon left: every namespace and entry
//! checked, what was reserved or half written dropped, and the chains, free
//! lists, extents, parent links and LRU order rebuilt from the committed
//! entries.
//!
//! Apart because it reads a file it must not trust (fuzzed by
//! `fuzz/store_adopt`) and runs once, before the daemon serves.

use std::cmp::Reverse;
use std::collections::HashSet;

use radixd_ipc::sync::Ordering;

use super::super::error::AdoptError;
use super::super::layout::{
    key_hash, stride, COMMITTED, FREE, LAYOUT_VERSION, MAGIC, MAX_KEY, MAX_NAME, NAMESPACES, NIL,
    RESERVED,
};
use super::super::view::StoreView;
use super::{Ns, StoreIndex};

impl StoreIndex {
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
}
