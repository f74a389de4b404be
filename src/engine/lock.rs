//! Locks: the [`Handle`] that names a node (or, with SWA, one lock on it),
//! and `lock` / `unlock` with the per-client counts and serials that let a
//! client's locks go when it does.

use super::cache::{ClientId, Engine};
use super::error::HandleError;
use super::layout::{NODE_HOST, NODE_LIVE, ROOT};
use super::region::Region;

/// Names a tree node: its index and the generation it had when named, so a
/// handle to a node that has since been evicted is detected, never followed.
///
/// In an engine with SWA, the handle a lock answers names that lock (its
/// receipt: two locks on one node may cover different windows, so each must
/// release its own): [`Handle::LOCK`] is set in `index`, whose other bits
/// are the node, and `generation` is the lock's serial on that node. It
/// still names the node (for `lock`) while the node lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    /// Slot in the node arena (with [`Handle::LOCK`] on a lock's handle).
    pub index: u32,
    /// Generation of the slot when the handle was made (a lock's serial on
    /// a lock's handle).
    pub generation: u32,
}

impl Handle {
    /// The bit of `index` that marks a lock's handle (no node slot has it:
    /// there are at most 2^30 + 1).
    pub const LOCK: u32 = 1 << 31;

    /// Whether this handle names a lock (an engine with SWA).
    pub fn is_lock(self) -> bool {
        self.index & Self::LOCK != 0
    }

    /// The node slot the handle names.
    pub fn node(self) -> u32 {
        self.index & !Self::LOCK
    }

    /// The handle as one integer (generation in the high half), as it
    /// travels in JSON and over the wire.
    pub fn to_raw(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    /// The inverse of [`Handle::to_raw`].
    pub fn from_raw(raw: u64) -> Self {
        Self {
            index: raw as u32,
            generation: (raw >> 32) as u32,
        }
    }
}

impl<R: Region> Engine<R> {
    pub(super) fn lock_node(&mut self, client: ClientId, node: u32) -> Handle {
        let serial = self.arena.lock_path(node);
        *self.locks.entry((client, node)).or_insert(0) += 1;
        if self.arena.swa().is_none() {
            return self.handle_of(node);
        }
        self.serials.entry((client, node)).or_default().push(serial);
        Handle {
            index: node | Handle::LOCK,
            generation: serial,
        }
    }

    pub(super) fn handle_of(&self, node: u32) -> Handle {
        Handle {
            index: node,
            generation: self.arena.nodes()[node as usize].generation,
        }
    }

    /// The node `raw` names, and the lock's serial when it is a lock's
    /// handle (SWA on): one taken on the node now in that slot, held or not.
    fn resolve_named(&self, raw: u64) -> Result<(u32, Option<u32>), HandleError> {
        let h = Handle::from_raw(raw);
        if !h.is_lock() || self.arena.swa().is_none() {
            return self.resolve(raw).map(|node| (node, None));
        }
        let node = h.node();
        let live = self
            .arena
            .nodes()
            .get(node as usize)
            .filter(|_| node != ROOT)
            .map(|n| n.state == NODE_LIVE);
        match live {
            None => Err(HandleError::Unknown(raw)),
            Some(true) if self.arena.hy_names(node, h.generation) => Ok((node, Some(h.generation))),
            Some(_) => Err(HandleError::Stale(raw)),
        }
    }

    /// The node `raw` names: a device node, or a host-only one (see
    /// `host`), which a lock may name too (SGLang locks the host-only
    /// segment a load-back fills).
    pub(super) fn resolve(&self, raw: u64) -> Result<u32, HandleError> {
        let h = Handle::from_raw(raw);
        let node = self
            .arena
            .nodes()
            .get(h.index as usize)
            .filter(|_| h.index != ROOT);
        match node {
            None => Err(HandleError::Unknown(raw)),
            Some(n) if h.generation == 0 || h.generation > n.generation => {
                Err(HandleError::Unknown(raw))
            }
            Some(n)
                if !matches!(n.state, NODE_LIVE | NODE_HOST) || n.generation != h.generation =>
            {
                Err(HandleError::Stale(raw))
            }
            Some(_) => Ok(h.index),
        }
    }

    /// Locks the node `handle` names, and its ancestors, for `client`;
    /// answers the lock's handle: with SWA one naming this lock (which
    /// `unlock` then releases exactly), else the node's.
    pub fn lock(&mut self, client: ClientId, handle: u64) -> Result<Handle, HandleError> {
        let (node, _) = self.resolve_named(handle)?;
        Ok(self.lock_node(client, node))
    }

    /// Drops one lock `client` holds on the node `handle` names: with SWA,
    /// the lock a lock's handle names when `client` still holds it (so each
    /// lock releases exactly the window it took, in any order), else the
    /// oldest one (as a node's handle does).
    pub fn unlock(&mut self, client: ClientId, handle: u64) -> Result<(), HandleError> {
        let (node, serial) = self.resolve_named(handle)?;
        let Some(count) = self.locks.get_mut(&(client, node)) else {
            return Err(HandleError::NotLocked(handle));
        };
        *count -= 1;
        if *count == 0 {
            self.locks.remove(&(client, node));
        }
        let serial = self.take_serial(client, node, serial);
        self.arena.unlock_path(node, serial);
        Ok(())
    }

    /// Forgets the serial of one lock `client` holds on `node`: `wanted`
    /// if it holds that one, else its oldest (0 without SWA).
    pub(super) fn take_serial(&mut self, client: ClientId, node: u32, wanted: Option<u32>) -> u32 {
        let Some(held) = self.serials.get_mut(&(client, node)) else {
            return 0;
        };
        let at = wanted
            .and_then(|w| held.iter().position(|&s| s == w))
            .unwrap_or(0);
        let serial = if at < held.len() { held.remove(at) } else { 0 };
        if held.is_empty() {
            self.serials.remove(&(client, node));
        }
        serial
    }
}
