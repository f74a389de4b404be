//! The LRU order: when each node was last used, and the nodes eviction may
//! take now (unlocked leaves), ordered by that.
//!
//! Eviction never walks past a node it cannot take. A locked node or an
//! inner node is not among the candidates at all; it rejoins when it becomes
//! an unlocked leaf again (on unlock, or when its last child goes), at the
//! place its last use gives it, which is where SGLang's order (last access)
//! puts it. So eviction costs what it evicts, however many nodes are locked
//! or inner.
//!
//! Last use is a stamp from a counter, so no two nodes tie. A touch stamps
//! the path from the node up to the root, the node first, so the root side
//! is newest (seed 000's root-MRU chains): within a chain the leaf is the
//! oldest, and when its eviction leaves the parent a leaf, the parent is the
//! next victim. Only leaves compete, so among the nodes of one path only
//! the order against other paths matters: a node is as new as the last
//! match or insert that went through it. A split that a match or insert
//! makes is a use of the upper half only ([`Recency::Exact`], the default:
//! the part below the match keeps its last use, so the order is an exact
//! per-block LRU with leaf-first eviction), or, as SGLang's tree does, of
//! both halves, the lower one older ([`Recency::Sglang`]; see
//! `Arena::settle`).
//!
//! Candidates live in two places. Most arrive newest of all (a new leaf, a
//! touched one): they join the end of a list, which stays in stamp order at
//! O(1) a step. The others arrive out of order (unlocked long after their
//! last use, a parent its last child left): they go to a 4-ary min-heap.
//! The oldest candidate is the older of the list's head and the heap's top,
//! so seed 000's resumable scan is the list's head moving on, with the heap
//! for what a list cannot place.
//!
//! Under another eviction policy than LRU (`policy`), the candidates are
//! the same unlocked leaves, in one heap by the policy's key; stamps are
//! kept as under LRU (every policy but FIFO/FILO reads them).
//!
//! The order is the writer's private memory (readers never need it): 20
//! bytes per node slot (stamp, position, list links), committed by the
//! operating system as slots are first used; 40 more under a policy (its
//! facts, of which only those the policy reads are ever written).

use std::fmt;
use std::str::FromStr;

use super::heap::{Entry, Heap};
use super::layout::NIL;
use super::policy::{Keyed, Policy};

/// What a split counts as a use of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Recency {
    /// The matched upper half only: the part below the match keeps its
    /// last use, so eviction is an exact per-block LRU, leaves first.
    #[default]
    Exact,
    /// Both halves, the lower one older: SGLang 0.5.23 touches the node it
    /// splits (`child.last_access_time` in `_split_node`), so its suffix
    /// counts as used; for comparing evictions with SGLang.
    Sglang,
}

impl Recency {
    /// Every rule, by name.
    pub const ALL: [Self; 2] = [Self::Exact, Self::Sglang];

    /// The rule's name as the CLI and Python spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Sglang => "sglang",
        }
    }
}

impl fmt::Display for Recency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A recency rule name that is neither `exact` nor `sglang`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecencyError(pub String);

impl fmt::Display for RecencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown recency {:?}: expected exact or sglang", self.0)
    }
}

impl std::error::Error for RecencyError {}

impl FromStr for Recency {
    type Err = RecencyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|r| r.name() == s.trim())
            .ok_or_else(|| RecencyError(s.to_owned()))
    }
}

/// Last uses and the candidates: a list in stamp order and a heap; under
/// another policy than LRU, a heap by the policy's key instead (`keyed`).
#[derive(Debug)]
pub(crate) struct Lru {
    /// The last stamp handed out.
    clock: u64,
    /// Each node slot's last use.
    stamps: Vec<u64>,
    /// Where each node slot is: [`NOWHERE`], [`LISTED`], or its index in
    /// `heap` (or `keyed`'s) plus one.
    slot: Vec<u32>,
    /// List neighbours `[older, newer]` of each listed node.
    links: Vec<[u32; 2]>,
    /// The list's ends (`NIL` when empty).
    head: u32,
    tail: u32,
    /// Out-of-order candidates by stamp.
    heap: Heap<u64>,
    /// What a split counts as a use of.
    recency: Recency,
    /// Under a policy other than LRU: every candidate, by the policy's
    /// key, and the facts the keys read (the list and `heap` stay empty).
    pub(crate) keyed: Option<Box<Keyed>>,
}

/// `Lru::slot` of a node that is not a candidate.
const NOWHERE: u32 = 0;
/// `Lru::slot` of a node in the list.
const LISTED: u32 = u32::MAX;

impl Lru {
    /// An empty order for `nodes` node slots.
    pub fn new(nodes: u32) -> Self {
        Self {
            clock: 0,
            stamps: vec![0; nodes as usize],
            slot: vec![NOWHERE; nodes as usize],
            links: vec![[NIL; 2]; nodes as usize],
            head: NIL,
            tail: NIL,
            heap: Heap::new(),
            recency: Recency::default(),
            keyed: None,
        }
    }

    /// What a split counts as a use of.
    pub fn recency(&self) -> Recency {
        self.recency
    }

    /// Sets what a split counts as a use of from now on.
    pub fn set_recency(&mut self, recency: Recency) {
        self.recency = recency;
    }

    /// The eviction policy.
    pub fn policy(&self) -> Policy {
        self.keyed.as_deref().map_or(Policy::Lru, |k| k.policy)
    }

    /// Orders candidates by `policy` from now on, forgetting every
    /// candidate: the caller empties the tree (the facts a key reads are
    /// kept only under a policy that reads them).
    pub fn set_policy(&mut self, policy: Policy) {
        self.clear();
        let nodes = self.stamps.len() as u32;
        self.keyed = (!policy.is_lru()).then(|| Box::new(Keyed::new(policy, nodes)));
    }

    /// Forgets every candidate (the region was formatted). Stamps stay:
    /// each node is stamped again before it matters.
    pub fn clear(&mut self) {
        while self.head != NIL {
            let node = self.head;
            self.unlist(node);
        }
        self.heap.clear(&mut self.slot);
        if let Some(k) = self.keyed.as_deref_mut() {
            k.heap.clear(&mut self.slot);
        }
    }

    /// A fresh stamp, newer than every stamp before.
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Marks `node` as used just now: newer than every node before (a
    /// candidate moves to the list's end, or to its key's place).
    pub fn stamp(&mut self, node: u32) {
        if let Some(k) = self.keyed.as_deref_mut() {
            self.clock += 1;
            self.stamps[node as usize] = self.clock;
            match self.slot[node as usize] {
                NOWHERE | LISTED => {}
                at => {
                    let key = k.key(node, self.clock);
                    k.heap.rekey(&mut self.slot, at as usize - 1, key);
                }
            }
            return;
        }
        let candidate = self.contains(node);
        if candidate {
            self.remove(node);
        }
        self.clock += 1;
        self.stamps[node as usize] = self.clock;
        if candidate {
            self.insert(node);
        }
    }

    /// Moves the candidate `node` (if it is one) to its key's place after a
    /// fact its key reads changed; nothing under LRU, whose key is the
    /// stamp.
    pub fn rekey(&mut self, node: u32) {
        let Some(k) = self.keyed.as_deref_mut() else {
            return;
        };
        match self.slot[node as usize] {
            NOWHERE | LISTED => {}
            at => {
                let key = k.key(node, self.stamps[node as usize]);
                k.heap.rekey(&mut self.slot, at as usize - 1, key);
            }
        }
    }

    /// `node`'s last use.
    pub fn stamp_of(&self, node: u32) -> u64 {
        self.stamps[node as usize]
    }

    /// Whether `node` is a candidate.
    pub fn contains(&self, node: u32) -> bool {
        self.slot[node as usize] != NOWHERE
    }

    /// The candidate eviction takes first: the least recently used, or
    /// the least by the policy's key.
    #[inline]
    pub fn oldest(&self) -> Option<u32> {
        if let Some(k) = self.keyed.as_deref() {
            return k.heap.top().map(|e| e.node);
        }
        match (self.head, self.heap.top()) {
            (NIL, None) => None,
            (NIL, Some(top)) => Some(top.node),
            (head, Some(top)) if top.key < self.stamps[head as usize] => Some(top.node),
            (head, _) => Some(head),
        }
    }

    /// The list's nodes, oldest first, for the invariant checker.
    pub fn listed(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = self.head;
        while at != NIL && out.len() < self.links.len() {
            out.push(at);
            at = self.links[at as usize][1];
        }
        out
    }

    /// The heap's nodes and keys in heap order, for the invariant checker.
    pub fn heaped(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.heap.entries().iter().map(|e| (e.node, e.key))
    }

    /// The heap index of the parent of heap index `at` (> 0).
    pub fn parent_of(at: usize) -> usize {
        Heap::<u64>::parent_of(at)
    }

    /// Adds `node` (not a candidate): to the list if it is newer than all
    /// listed, else to the heap; under another policy, to its key's place.
    pub fn insert(&mut self, node: u32) {
        debug_assert!(!self.contains(node));
        let stamp = self.stamps[node as usize];
        if let Some(k) = self.keyed.as_deref_mut() {
            k.push(&mut self.slot, node, stamp);
            return;
        }
        if self.tail == NIL || stamp > self.stamps[self.tail as usize] {
            self.links[node as usize] = [self.tail, NIL];
            match self.tail {
                NIL => self.head = node,
                tail => self.links[tail as usize][1] = node,
            }
            self.tail = node;
            self.slot[node as usize] = LISTED;
            return;
        }
        self.heap.push(&mut self.slot, Entry { key: stamp, node });
    }

    /// Takes `node` out of the candidates, if it is one.
    pub fn remove(&mut self, node: u32) {
        match self.slot[node as usize] {
            NOWHERE => {}
            LISTED => self.unlist(node),
            at => match self.keyed.as_deref_mut() {
                Some(k) => k.heap.remove_at(&mut self.slot, at as usize - 1),
                None => self.heap.remove_at(&mut self.slot, at as usize - 1),
            },
        }
    }

    fn unlist(&mut self, node: u32) {
        let [older, newer] = self.links[node as usize];
        match older {
            NIL => self.head = newer,
            o => self.links[o as usize][1] = newer,
        }
        match newer {
            NIL => self.tail = older,
            n => self.links[n as usize][0] = older,
        }
        self.links[node as usize] = [NIL; 2];
        self.slot[node as usize] = NOWHERE;
    }
}
