//! The host tier: a second copy of a node's KV in the server's host pool
//! (SGLang's HiCache `host_value`), and the nodes that keep only that copy
//! once eviction took their device pages ("host-only", SGLang's `evicted
//! and backuped`).
//!
//! The shared tree stays the device tree. SGLang's device set is closed
//! under ancestors (a host-only node never has a device descendant), so
//! the host-only nodes form subtrees hanging below device nodes or the
//! root: they live here, in the writer's memory, never in the child table.
//! A lock-free reader therefore sees exactly what it saw before (device
//! pages only), and a demote is, to it, the removal of a leaf: the node's
//! version moves, its pages go to limbo, the table forgets it.
//!
//! A demoted node keeps its slot and generation (`NODE_HOST`), so the
//! handles SGLang holds across a demote and a load-back stay good; a
//! promote (a load-back, or an insert that meets the node) files the same
//! slot again with fresh device pages.
//!
//! Invariants (checked by `validate`):
//! - device set closed under ancestors: a device node's parent is a device
//!   node or the root;
//! - backed set closed under ancestors (write-through): a backed node's
//!   parent is backed or the root, so `backup` takes a chain root first;
//! - a host-only node has host pages, its tokens here, no device pages or
//!   device children, and is filed only in its parent's `kids`;
//! - a node's children, device and host-only, differ in their first page;
//! - the host leaves (host-only, unlocked, no host lock, no host-only
//!   children) are exactly the candidates of host eviction, in the
//!   eviction policy's order (the device tier's stamps and facts: one
//!   clock for both).
//!
//! Host page ids are the server's host pool indices divided by the page
//! size; the tier only records which node holds which, so a page named
//! twice or out of range is refused.
//!
//! `ops`: demote, promote, the walks into host-only nodes and the requests
//! (`backup`, `match_host`, `load_back`, `evict_host`); `lock`: host locks;
//! `prefetch`: page digests and `insert_host` (pages from the L3);
//! `validate`: the invariants above.

use std::collections::HashMap;
use std::fmt;

use super::error::{HandleError, PageError};
use super::heap::Heap;
use super::layout::NIL;
use super::lock_map::PairHash;
use super::policy::Key;

mod lock;
mod ops;
mod prefetch;
mod validate;

pub use ops::HostMatched;
pub use prefetch::HostInserted;
#[cfg(test)]
mod prop_tests;
#[cfg(test)]
mod tests;

/// The host tier's private state.
#[derive(Debug)]
pub(crate) struct HostTier {
    /// Pages of the host pool.
    capacity: u32,
    /// The node whose copy holds each host page; `NIL`: free.
    owner: Vec<u32>,
    /// Host pages held.
    used: u32,
    /// Each node slot's host copy, if it has one.
    parts: Vec<Option<HostPart>>,
    /// The host-only children of each node that has some (node indices are
    /// the arena's, so the lock tables' cheap hash serves).
    kids: HashMap<u32, Vec<u32>, PairHash>,
    /// Host-only nodes.
    host_nodes: u32,
    /// Host eviction's candidates by the eviction policy's key (SGLang
    /// orders host leaves as device leaves: last use under LRU).
    leaves: Heap<Key>,
    /// Each node slot's place in `leaves` plus one; 0: not there.
    slot: Vec<u32>,
    /// Host locks on each node slot (SGLang's `host_lock_ref`): a locked
    /// node's host copy stays while a transfer reads it.
    host_locks: Vec<u32>,
    /// Each host lock's segment, `(node, top)`: the lock counts on `node`
    /// and every ancestor up to `top` (a split above `node` makes the
    /// segment longer, as SGLang's `host_uuid` boundary does).
    receipts: HashMap<u32, (u32, u32), PairHash>,
    /// The last receipt handed out.
    last_receipt: u32,
    /// Each node slot's page digests (SGLang's `hash_value`: the L3's keys,
    /// one per page), when it was hashed.
    digests: Vec<Option<Vec<Digest>>>,
}

/// One page's digest: SGLang's SHA-256 page hash, raw.
pub type Digest = [u8; 32];

/// One node's host copy.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostPart {
    /// Host page ids, one per page of the node's edge.
    pages: Vec<u32>,
    /// A host-only node's tokens (its device pages held them); empty while
    /// the node has device pages.
    tokens: Vec<u32>,
}

impl HostTier {
    /// An empty tier of `capacity` host pages for `nodes` node slots.
    pub fn new(capacity: u32, nodes: u32) -> Self {
        Self {
            capacity,
            owner: vec![NIL; capacity as usize],
            used: 0,
            parts: vec![None; nodes as usize],
            kids: HashMap::default(),
            host_nodes: 0,
            leaves: Heap::new(),
            slot: vec![0; nodes as usize],
            host_locks: vec![0; nodes as usize],
            receipts: HashMap::default(),
            last_receipt: 0,
            digests: vec![None; nodes as usize],
        }
    }

    /// Forgets every copy (the tree was formatted).
    pub fn clear(&mut self) {
        self.owner.fill(NIL);
        self.used = 0;
        self.parts.fill(None);
        self.kids.clear();
        self.host_nodes = 0;
        self.leaves.clear(&mut self.slot);
        self.host_locks.fill(0);
        self.receipts.clear();
        self.digests.fill(None);
    }

    fn part(&self, node: u32) -> Option<&HostPart> {
        self.parts[node as usize].as_ref()
    }
}

impl HostPart {
    /// A host copy on `pages`; `tokens` for a host-only node.
    fn new(pages: &[u32], tokens: Vec<u32>) -> Self {
        Self {
            pages: pages.to_vec(),
            tokens,
        }
    }
}

/// Where a node's KV lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostNode {
    /// Device pages the node holds (0: host-only).
    pub device_pages: u32,
    /// Its host copy's page ids (empty: not backed up).
    pub host_pages: Vec<u32>,
}

impl HostNode {
    /// SGLang's `backuped`: the node has a host copy.
    pub fn backed(&self) -> bool {
        !self.host_pages.is_empty()
    }

    /// SGLang's `evicted`: the node holds no device pages.
    pub fn host_only(&self) -> bool {
        self.device_pages == 0
    }
}

/// What [`Engine::host_stats`](crate::engine::Engine::host_stats) counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStats {
    /// Pages of the host pool.
    pub capacity: u32,
    /// Host pages holding a copy.
    pub used: u32,
    /// Nodes holding only their host copy.
    pub host_only_nodes: u32,
}

/// Errors of the host tier's operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostError {
    /// The engine was built without a host tier.
    NoHostTier,
    /// The handle names no node, or a node that went.
    Handle(HandleError),
    /// `backup` of a node that has a host copy already.
    AlreadyBacked(u64),
    /// `backup` of a node whose parent has no host copy: a chain is backed
    /// up root side first (write-through keeps the backed set closed under
    /// ancestors).
    ParentNotBacked(u64),
    /// `backup` needs one host page per page of the node; `load_back` one
    /// device page per host page of the chain.
    CountMismatch { expected: usize, got: usize },
    /// A host page id at or beyond the host pool's capacity.
    OutOfRange { page: u32, capacity: u32 },
    /// A host page that holds another copy, or named twice.
    InUse { page: u32 },
    /// A host lock's receipt that names no lock held.
    NotHostLocked(u32),
    /// Digests for a node of another number of pages.
    DigestCount { expected: usize, got: usize },
    /// `load_back` of a node that holds device pages.
    NotHostOnly(u64),
    /// `load_back`'s device pages, refused as an insert's would be.
    Page(PageError),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoHostTier => f.write_str("this engine has no host tier"),
            Self::Handle(e) => e.fmt(f),
            Self::AlreadyBacked(h) => write!(f, "node {h} has a host copy already"),
            Self::ParentNotBacked(h) => write!(
                f,
                "node {h}'s parent has no host copy: back up a chain from the root side"
            ),
            Self::CountMismatch { expected, got } => {
                write!(f, "expected {expected} page ids, got {got}")
            }
            Self::OutOfRange { page, capacity } => write!(
                f,
                "host page {page} is out of range (host capacity {capacity})"
            ),
            Self::InUse { page } => {
                write!(f, "host page {page} holds another copy or is named twice")
            }
            Self::NotHostLocked(r) => write!(f, "host lock {r} is not held"),
            Self::DigestCount { expected, got } => {
                write!(f, "expected {expected} page digests, got {got}")
            }
            Self::NotHostOnly(h) => write!(f, "node {h} holds device pages: nothing to load"),
            Self::Page(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for HostError {}

impl From<HandleError> for HostError {
    fn from(e: HandleError) -> Self {
        Self::Handle(e)
    }
}

/// Takes `node` out of `parent`'s host-only children.
pub(crate) fn unfile(kids: &mut HashMap<u32, Vec<u32>, PairHash>, parent: u32, node: u32) {
    if let Some(list) = kids.get_mut(&parent) {
        list.retain(|&k| k != node);
        if list.is_empty() {
            kids.remove(&parent);
        }
    }
}
