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
//! The order is the writer's private memory (readers never need it): 20
//! bytes per node slot (stamp, position, list links), committed by the
//! operating system as slots are first used.

use std::fmt;
use std::str::FromStr;

use super::layout::NIL;

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

/// Last uses and the candidates: a list in stamp order and a heap.
#[derive(Debug)]
pub(crate) struct Lru {
    /// The last stamp handed out.
    clock: u64,
    /// Each node slot's last use.
    stamps: Vec<u64>,
    /// Where each node slot is: [`NOWHERE`], [`LISTED`], or its index in
    /// `heap` plus one.
    slot: Vec<u32>,
    /// List neighbours `[older, newer]` of each listed node.
    links: Vec<[u32; 2]>,
    /// The list's ends (`NIL` when empty).
    head: u32,
    tail: u32,
    /// Out-of-order candidates with their stamps, a 4-ary min-heap: oldest
    /// at 0, the children of `i` at `4i + 1 ..= 4i + 4`.
    heap: Vec<Entry>,
    /// What a split counts as a use of.
    recency: Recency,
}

/// A heap entry: a node and its stamp, kept together so that a sift
/// compares neighbouring memory, not stamps scattered by node index.
#[derive(Clone, Copy, Debug)]
struct Entry {
    stamp: u64,
    node: u32,
}

/// Children per heap node.
const ARITY: usize = 4;
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
            heap: Vec::new(),
            recency: Recency::default(),
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

    /// Forgets every candidate (the region was formatted). Stamps stay:
    /// each node is stamped again before it matters.
    pub fn clear(&mut self) {
        while self.head != NIL {
            let node = self.head;
            self.unlist(node);
        }
        for e in &self.heap {
            self.slot[e.node as usize] = NOWHERE;
        }
        self.heap.clear();
    }

    /// Marks `node` as used just now: newer than every node before (a
    /// candidate moves to the list's end).
    pub fn stamp(&mut self, node: u32) {
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

    /// `node`'s last use.
    pub fn stamp_of(&self, node: u32) -> u64 {
        self.stamps[node as usize]
    }

    /// Whether `node` is a candidate.
    pub fn contains(&self, node: u32) -> bool {
        self.slot[node as usize] != NOWHERE
    }

    /// The least recently used candidate.
    pub fn oldest(&self) -> Option<u32> {
        match (self.head, self.heap.first()) {
            (NIL, None) => None,
            (NIL, Some(top)) => Some(top.node),
            (head, Some(top)) if top.stamp < self.stamps[head as usize] => Some(top.node),
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
        self.heap.iter().map(|e| (e.node, e.stamp))
    }

    /// The heap index of the parent of heap index `at` (> 0).
    pub fn parent_of(at: usize) -> usize {
        (at - 1) / ARITY
    }

    /// Adds `node` (not a candidate): to the list if it is newer than all
    /// listed, else to the heap.
    pub fn insert(&mut self, node: u32) {
        debug_assert!(!self.contains(node));
        let stamp = self.stamps[node as usize];
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
        let e = Entry { stamp, node };
        self.heap.push(e);
        let at = self.heap.len() - 1;
        self.sift_up(at, e);
    }

    /// Takes `node` out of the candidates, if it is one.
    pub fn remove(&mut self, node: u32) {
        match self.slot[node as usize] {
            NOWHERE => {}
            LISTED => self.unlist(node),
            at => self.unheap(at as usize - 1),
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

    fn unheap(&mut self, at: usize) {
        let node = self.heap[at].node;
        self.slot[node as usize] = NOWHERE;
        let last = self.heap.pop();
        if let Some(last) = last.filter(|_| at < self.heap.len()) {
            if !self.sift_up(at, last) {
                self.sift_down(at);
            }
        }
    }

    #[inline]
    fn place(&mut self, at: usize, e: Entry) {
        self.heap[at] = e;
        self.slot[e.node as usize] = at as u32 + 1;
    }

    /// Puts `e` at `at` and moves it up while it is older than its parent;
    /// whether it moved.
    fn sift_up(&mut self, mut at: usize, e: Entry) -> bool {
        let start = at;
        while at > 0 {
            let up = Self::parent_of(at);
            let parent = self.heap[up];
            if e.stamp >= parent.stamp {
                break;
            }
            self.place(at, parent);
            at = up;
        }
        self.place(at, e);
        at != start
    }

    /// Moves the entry at `at` down while a child is older.
    fn sift_down(&mut self, mut at: usize) {
        let e = self.heap[at];
        let len = self.heap.len();
        loop {
            let first = ARITY * at + 1;
            if first >= len {
                break;
            }
            let end = (first + ARITY).min(len);
            let mut child = first;
            for c in first + 1..end {
                if self.heap[c].stamp < self.heap[child].stamp {
                    child = c;
                }
            }
            if self.heap[child].stamp >= e.stamp {
                break;
            }
            self.place(at, self.heap[child]);
            at = child;
        }
        self.place(at, e);
    }
}
