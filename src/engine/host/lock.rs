//! Host locks (SGLang's `inc_host_lock_ref` / `dec_host_lock_ref`): a
//! transfer reading a node's host copy (a load-back, a backup to the L3)
//! keeps host eviction off it until the transfer ends.
//!
//! A lock is taken on one node and answered as a receipt. SGLang releases
//! it from that node up to the boundary it recorded, so a split above the
//! node while the lock is held (the upper half copies the count) is
//! released too: a receipt keeps its segment `(node, top)`, and a split of
//! `top` moves `top` to the new upper half (`Arena::host_split`).

use super::{HostError, HostTier};
use crate::engine::cache::Engine;
use crate::engine::region::Region;

impl<R: Region> Engine<R> {
    /// Takes a host lock on the node `handle` names and answers its
    /// receipt, or `None` when the node has no host copy (nothing to keep:
    /// SGLang's write-through answers an empty receipt then).
    pub fn host_lock(&mut self, handle: u64) -> Result<Option<u32>, HostError> {
        let node = self.host_resolve(handle)?;
        if !self.arena.backed(node) {
            return Ok(None);
        }
        let Some(t) = self.arena.host.as_deref_mut() else {
            return Err(HostError::NoHostTier);
        };
        t.last_receipt = next_receipt(t);
        let receipt = t.last_receipt;
        t.receipts.insert(receipt, (node, node));
        t.host_locks[node as usize] += 1;
        self.arena.host_refile(node);
        Ok(Some(receipt))
    }

    /// Releases the host lock `receipt` names: from its node up to its
    /// segment's top. A receipt no lock holds changes nothing.
    pub fn host_unlock(&mut self, receipt: u32) -> Result<(), HostError> {
        let Some(t) = self.arena.host.as_deref_mut() else {
            return Err(HostError::NoHostTier);
        };
        let Some((mut node, top)) = t.receipts.remove(&receipt) else {
            return Err(HostError::NotHostLocked(receipt));
        };
        let mut hops = 0;
        loop {
            hops = self.arena.hop(hops);
            if let Some(t) = self.arena.host.as_deref_mut() {
                t.host_locks[node as usize] -= 1;
            }
            self.arena.host_refile(node);
            if node == top {
                return Ok(());
            }
            node = self.arena.nodes()[node as usize].parent;
        }
    }

    /// Releases every host lock held (the host pool went: `drop_cached`).
    pub(crate) fn host_unlock_all(&mut self) {
        let receipts: Vec<u32> = self
            .arena
            .host
            .as_deref()
            .map(|t| t.receipts.keys().copied().collect())
            .unwrap_or_default();
        for receipt in receipts {
            // Cannot fail: each receipt was just read off the table.
            let _ = self.host_unlock(receipt);
        }
    }

    /// Host locks held.
    pub fn host_locks_held(&self) -> usize {
        self.arena.host.as_deref().map_or(0, |t| t.receipts.len())
    }
}

/// The receipt after the last one, skipping any still held (and 0, which
/// the wire reads as "none").
fn next_receipt(t: &HostTier) -> u32 {
    let mut r = t.last_receipt;
    loop {
        r = r.wrapping_add(1);
        if r != 0 && !t.receipts.contains_key(&r) {
            return r;
        }
    }
}
