//! Room for new values: a free entry and a free slot of the right stride
//! (extents taken and given back as values come and go), eviction of the
//! least recently used committed leaf when there is none, clearing a
//! namespace, and the limbo where evicted entries wait for the readers'
//! grace period before reuse.
//!
//! Apart from the table and from reservations because this is the cache's
//! policy and its memory accounting, which change for reasons of their own.

use std::cmp::Reverse;

use radixd_ipc::sync::Ordering;

use super::super::error::StoreError;
use super::super::layout::COMMITTED;
use super::StoreIndex;

/// How long a reserve waits, advancing the epoch, for values in limbo
/// before it calls the store full (readers are expired well before).
const LIMBO_WAIT: std::time::Duration = std::time::Duration::from_millis(5);

impl StoreIndex {
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

    /// A committed entry's use stamp as readers left it, bounded by the
    /// clock (a hint another process wrote).
    pub(super) fn shared_stamp(&self, index: u32) -> u64 {
        // Relaxed: hints.
        let now = self.view.clock().load(Ordering::Relaxed);
        self.view
            .stamp(index)
            .map_or(0, |s| s.load(Ordering::Relaxed))
            .min(now)
    }

    /// Returns retired entry `index` and its slot to the free lists.
    pub(super) fn release(&mut self, index: u32) {
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
    pub(super) fn room(&mut self, stride: u64) -> Option<(u32, u64)> {
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
}
