//! Model-based property test of the cache engine.
//!
//! Random operation sequences (3 clients, page sizes 1..=4, capacities
//! 4..=32, a 3-token alphabet so prefixes collide; and a wide variant with
//! P = 1, 48..=96 pages and 24 tokens) run against the engine and
//! against an uncompressed per-page trie that is obviously correct. Every
//! result is predicted exactly: pages handed out by `alloc`, `cached`/`len`
//! of `insert`, length and pages of `match_prefix`, which page eviction takes,
//! the error of every failing op, handle identity and staleness, session
//! residency, and the stats counters. `validate()` runs after every op.
//!
//! How the model predicts eviction: every page carries a unique last-use
//! tick; a touch of a path gives it fresh ticks with deeper pages older; a
//! split leaves the lower half's ticks as they were (`Recency::Exact`, the
//! default: an exact per-page LRU) or, under `Recency::Sglang` (as SGLang's
//! match and insert touch the node they split), first gives the lower half
//! fresh ticks, older than the path's; so a node's
//! pages always occupy one contiguous tick range and the engine's LRU order
//! (a node's last use, root side newest) orders nodes exactly by tick. The
//! engine takes the oldest unlocked leaf node and trims it from its end;
//! page by page that is "the unlocked page with no child and the smallest
//! tick", which is what the model evicts.
//!
//! Node identity (handles) is modelled by a label per page: a new leaf gets a
//! fresh label, a split gives the upper pages a fresh one (the lower half
//! keeps the node and its handles), and a node whose last page is evicted is
//! gone, so its handles are stale.

use std::collections::{BTreeMap, HashMap, VecDeque};

use proptest::prelude::*;
use radixd::engine::{
    Config, Engine, Handle, HandleError, Inserted, Matched, PageError, Recency, SessionError, Stats,
};

const CLIENTS: u32 = 3;
const SESSIONS: [&str; 2] = ["s0", "s1"];
const MAX_KEY: usize = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageState {
    Free,
    Owned(u32),
    Cached,
}

/// One cached page of the model trie.
#[derive(Clone, Copy, Debug)]
struct MPage {
    page: u32,
    tick: u64,
    /// The engine node this page belongs to.
    label: u64,
}

/// The reference: an uncompressed trie keyed by page-aligned path prefixes.
struct Model {
    p: usize,
    cap: u32,
    /// What a split counts as a use of.
    recency: Recency,
    free: VecDeque<u32>,
    state: Vec<PageState>,
    trie: BTreeMap<Vec<u32>, MPage>,
    tick: u64,
    next_label: u64,
    /// `(client, label)` → handle locks held.
    locks: HashMap<(u32, u64), u32>,
    /// Session id → (client, label of its node, None for the root).
    sessions: HashMap<&'static str, (u32, Option<u64>)>,
    /// Handles ever returned, raw → label; kept after they go stale.
    handles: Vec<(u64, u64)>,
    raw_of_label: HashMap<u64, u64>,
    evicted: u64,
    /// Keys recently used, so later keys share prefixes with them.
    recent: Vec<Vec<u32>>,
    session_keys: HashMap<&'static str, Vec<u32>>,
}

impl Model {
    fn new(p: usize, cap: u32, recency: Recency) -> Self {
        Self {
            p,
            cap,
            recency,
            free: (0..cap).collect(),
            state: vec![PageState::Free; cap as usize],
            trie: BTreeMap::new(),
            tick: 0,
            next_label: 0,
            locks: HashMap::new(),
            sessions: HashMap::new(),
            handles: Vec::new(),
            raw_of_label: HashMap::new(),
            evicted: 0,
            recent: Vec::new(),
            session_keys: HashMap::new(),
        }
    }

    fn reset(&mut self) {
        let (handles, recent) = (
            std::mem::take(&mut self.handles),
            std::mem::take(&mut self.recent),
        );
        *self = Self {
            handles,
            recent,
            next_label: self.next_label,
            ..Self::new(self.p, self.cap, self.recency)
        };
    }

    fn label(&mut self) -> u64 {
        self.next_label += 1;
        self.next_label
    }

    fn aligned<'a>(&self, key: &'a [u32]) -> &'a [u32] {
        &key[..key.len() / self.p * self.p]
    }

    /// Pages of the longest cached prefix of `key`.
    fn walk(&self, key: &[u32]) -> Vec<u32> {
        (1..=key.len() / self.p)
            .map_while(|i| self.trie.get(&key[..i * self.p]).map(|m| m.page))
            .collect()
    }

    /// Path of the deepest page of `label` (the node's end).
    fn label_end(&self, label: u64) -> Option<&Vec<u32>> {
        self.trie
            .iter()
            .filter(|(_, m)| m.label == label)
            .map(|(k, _)| k)
            .max_by_key(|k| k.len())
    }

    fn live(&self, label: u64) -> bool {
        self.trie.values().any(|m| m.label == label)
    }

    /// Splits the node holding the page at `key[..d pages]` there when it
    /// goes on deeper, as a walk that stops inside an edge does.
    fn split_at(&mut self, key: &[u32], d: usize) {
        if d == 0 {
            return;
        }
        let at = &key[..d * self.p];
        let l = self.trie[at].label;
        let end = self.label_end(l).unwrap().len();
        if end > at.len() {
            let upper = self.label();
            let (tick, p) = (self.tick, self.p);
            let sglang = self.recency == Recency::Sglang;
            let lower_pages = if sglang {
                ((end - at.len()) / p) as u64
            } else {
                0
            };
            for (k, m) in self.trie.iter_mut() {
                if m.label == l && k.len() <= at.len() {
                    m.label = upper;
                } else if m.label == l && sglang {
                    // The lower half is used too, deeper pages older.
                    m.tick = tick + lower_pages - ((k.len() - at.len()) / p) as u64;
                }
            }
            self.tick += lower_pages;
        }
    }

    /// Marks `key[..d pages]` as just used, deeper pages older.
    fn touch(&mut self, key: &[u32], d: usize) {
        for i in 1..=d {
            self.trie.get_mut(&key[..i * self.p]).unwrap().tick = self.tick + (d - i) as u64;
        }
        self.tick += d as u64;
    }

    /// Ends of the nodes some handle or session lock holds.
    fn locked_ends(&self) -> Vec<Vec<u32>> {
        let labels = self
            .locks
            .keys()
            .map(|&(_, l)| l)
            .chain(self.sessions.values().filter_map(|&(_, l)| l));
        labels.map(|l| self.label_end(l).unwrap().clone()).collect()
    }

    fn protected_pages(&self) -> usize {
        let ends = self.locked_ends();
        self.trie
            .keys()
            .filter(|k| ends.iter().any(|e| e.starts_with(k)))
            .count()
    }

    fn has_child(&self, k: &[u32]) -> bool {
        let mut after = self
            .trie
            .range::<[u32], _>((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded));
        after.next().is_some_and(|(c, _)| c.starts_with(k))
    }

    /// Evicts up to `want` pages: each time the unlocked childless page with
    /// the oldest tick. Returns the pages freed.
    fn evict(&mut self, want: u64) -> u64 {
        let ends = self.locked_ends();
        let mut freed = 0;
        while freed < want {
            let victim = self
                .trie
                .iter()
                .filter(|(k, _)| !self.has_child(k) && !ends.iter().any(|e| e.starts_with(k)))
                .min_by_key(|(_, m)| m.tick)
                .map(|(k, _)| k.clone());
            let Some(k) = victim else { break };
            let m = self.trie.remove(&k).unwrap();
            self.put_free(m.page);
            if !self.live(m.label) {
                self.raw_of_label.remove(&m.label);
            }
            freed += 1;
        }
        self.evicted += freed;
        freed
    }

    fn put_free(&mut self, page: u32) {
        self.state[page as usize] = PageState::Free;
        self.free.push_back(page);
    }

    fn owned_by(&self, client: u32) -> Vec<u32> {
        (0..self.cap)
            .filter(|&p| self.state[p as usize] == PageState::Owned(client))
            .collect()
    }

    fn alloc(&mut self, client: u32, n: u64) -> Result<Vec<u32>, PageError> {
        let free = self.free.len() as u64;
        let available = free + (self.trie.len() - self.protected_pages()) as u64;
        if n > available {
            return Err(PageError::Insufficient {
                requested: n,
                available,
            });
        }
        if n > free {
            self.evict(n - free);
        }
        let pages: Vec<u32> = (0..n).map(|_| self.free.pop_front().unwrap()).collect();
        for &p in &pages {
            self.state[p as usize] = PageState::Owned(client);
        }
        Ok(pages)
    }

    fn check_range(&self, pages: &[u32]) -> Result<(), PageError> {
        match pages.iter().find(|&&p| p >= self.cap) {
            Some(&p) => Err(PageError::OutOfRange {
                page: u64::from(p),
                capacity: self.cap,
            }),
            None => Ok(()),
        }
    }

    /// Every page not excused by `same` must be owned by `client`, once.
    fn check_owned(
        &self,
        client: u32,
        pages: &[u32],
        same: impl Fn(usize, u32) -> bool,
    ) -> Result<(), PageError> {
        let mut seen = Vec::new();
        for (i, &page) in pages.iter().enumerate() {
            if same(i, page) {
                continue;
            }
            if self.state[page as usize] != PageState::Owned(client) || seen.contains(&page) {
                return Err(PageError::NotOwned { page });
            }
            seen.push(page);
        }
        Ok(())
    }

    fn free(&mut self, client: u32, pages: &[u32]) -> Result<(), PageError> {
        self.check_range(pages)?;
        self.check_owned(client, pages, |_, _| false)?;
        for &p in pages {
            self.put_free(p);
        }
        Ok(())
    }

    /// Insert without the lock: the answer and the label of the key's node.
    fn insert(
        &mut self,
        client: u32,
        tokens: &[u32],
        pages: &[u32],
    ) -> Result<(Inserted, Option<u64>), PageError> {
        let key = self.aligned(tokens);
        let expected = key.len() / self.p;
        if pages.len() != expected {
            return Err(PageError::CountMismatch {
                expected,
                got: pages.len(),
            });
        }
        self.check_range(pages)?;
        let path = self.walk(key);
        let cached = path.len();
        self.check_owned(client, pages, |i, p| i < cached && path[i] == p)?;
        for i in 0..cached {
            if pages[i] != path[i] {
                self.put_free(pages[i]);
            }
        }
        self.split_at(key, cached);
        if cached < expected {
            let label = self.label();
            for (i, &page) in pages.iter().enumerate().skip(cached) {
                self.state[page as usize] = PageState::Cached;
                let m = MPage {
                    page,
                    tick: 0,
                    label,
                };
                self.trie.insert(key[..(i + 1) * self.p].to_vec(), m);
            }
        }
        self.touch(key, expected);
        let node = (expected > 0).then(|| self.trie[key].label);
        let ins = Inserted {
            cached: cached * self.p,
            len: key.len(),
            handle: None,
            node: None,
        };
        Ok((ins, node))
    }

    fn match_prefix(&mut self, tokens: &[u32]) -> (usize, Vec<u32>, Option<u64>) {
        let key = self.aligned(tokens);
        let path = self.walk(key);
        let d = path.len();
        self.split_at(key, d);
        self.touch(key, d);
        let node = (d > 0).then(|| self.trie[&key[..d * self.p]].label);
        (d * self.p, path, node)
    }

    /// Records a handle the engine returned for `label`; the same live node
    /// must always come back as the same handle.
    fn note_handle(&mut self, label: u64, h: Handle) {
        let raw = h.to_raw();
        match self.raw_of_label.get(&label) {
            Some(&known) => assert_eq!(known, raw, "one node, two handles"),
            None => {
                assert!(
                    self.handles.iter().all(|&(r, _)| r != raw),
                    "handle {raw:#x} reused for a new node"
                );
                self.raw_of_label.insert(label, raw);
                self.handles.push((raw, label));
            }
        }
    }

    fn lock_label(&mut self, client: u32, label: u64) {
        *self.locks.entry((client, label)).or_insert(0) += 1;
    }

    /// The label a raw handle names now, or the engine's error for it.
    fn resolve(&self, raw: u64) -> Result<u64, HandleError> {
        match self.handles.iter().find(|&&(r, _)| r == raw) {
            None => Err(HandleError::Unknown(raw)),
            Some(&(_, l)) if self.live(l) => Ok(l),
            Some(_) => Err(HandleError::Stale(raw)),
        }
    }

    fn release_client(&mut self, client: u32) {
        self.sessions.retain(|_, s| s.0 != client);
        self.locks.retain(|&(c, _), _| c != client);
        for p in self.owned_by(client) {
            self.put_free(p);
        }
    }

    fn stats(&self) -> (u64, u64, u64, u64, u64, u64, u64) {
        let p = self.p as u64;
        let total = self.trie.len() as u64;
        let protected = self.protected_pages() as u64;
        let owned = self
            .state
            .iter()
            .filter(|s| matches!(s, PageState::Owned(_)))
            .count();
        let mut labels: Vec<u64> = self.trie.values().map(|m| m.label).collect();
        labels.sort_unstable();
        labels.dedup();
        (
            total * p,
            (total - protected) * p,
            protected * p,
            self.free.len() as u64,
            owned as u64,
            labels.len() as u64,
            self.evicted,
        )
    }

    fn remember(&mut self, key: &[u32]) {
        if self.recent.len() == 16 {
            self.recent.remove(0);
        }
        self.recent.push(key.to_vec());
    }

    /// A key built from `base` (a recent key cut at `cut`, or nothing) and
    /// `tail`, so that keys share prefixes often.
    fn key(&self, base: u8, cut: u8, tail: &[u32]) -> Vec<u32> {
        let mut key = match base {
            0..=2 => Vec::new(),
            _ if self.recent.is_empty() => Vec::new(),
            b => {
                let r = &self.recent[b as usize % self.recent.len()];
                r[..cut as usize % (r.len() + 1)].to_vec()
            }
        };
        key.extend_from_slice(tail);
        key.truncate(MAX_KEY);
        key
    }

    /// Page ids for an insert of `key` by `client`: the cached page or one of
    /// the client's own at each position, then maybe one fault by `mode`.
    fn pages_for(&self, client: u32, key: &[u32], sel: &[u8], mode: u8) -> Vec<u32> {
        let n = self.aligned(key).len() / self.p;
        let path = self.walk(key);
        let mut own = self.owned_by(client).into_iter();
        let mut pages: Vec<u32> = (0..n)
            .map(|i| {
                let s = sel[i % sel.len()];
                match path.get(i) {
                    Some(&p) if s % 4 != 0 => p,
                    _ => own.next().unwrap_or(u32::from(s) % (self.cap + 2)),
                }
            })
            .collect();
        self.fault(client, &mut pages, sel, mode);
        pages
    }

    fn fault(&self, client: u32, pages: &mut Vec<u32>, sel: &[u8], mode: u8) {
        let s = sel[0] as usize;
        match mode {
            12 if !pages.is_empty() => {
                pages.pop();
            }
            12 => pages.push(0),
            13 if !pages.is_empty() => {
                let i = s % pages.len();
                pages[i] = s as u32 % (self.cap + 2);
            }
            // A page named twice.
            14 if pages.len() >= 2 => {
                let (i, n) = (s % pages.len(), pages.len());
                pages[(i + 1) % n] = pages[i];
            }
            // Another client's page.
            15 if !pages.is_empty() => {
                if let Some(&p) = self.owned_by((client + 1) % CLIENTS).first() {
                    let i = s % pages.len();
                    pages[i] = p;
                }
            }
            _ => {}
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        client: u32,
        n: u8,
    },
    Free {
        client: u32,
        sel: Vec<u8>,
        mode: u8,
    },
    Insert {
        client: u32,
        base: u8,
        cut: u8,
        tail: Vec<u32>,
        lock: bool,
        prealloc: bool,
        sel: Vec<u8>,
        mode: u8,
    },
    Match {
        client: u32,
        base: u8,
        cut: u8,
        tail: Vec<u32>,
        lock: bool,
    },
    Peek {
        base: u8,
        cut: u8,
        tail: Vec<u32>,
    },
    Lock {
        client: u32,
        which: u8,
    },
    Unlock {
        client: u32,
        which: u8,
    },
    Evict {
        tokens: u8,
    },
    Release {
        client: u32,
    },
    Reset,
    Commit {
        client: u32,
        sid: usize,
        restart: bool,
        tail: Vec<u32>,
        sel: Vec<u8>,
        mode: u8,
    },
    EndSession {
        client: u32,
        sid: usize,
    },
    Status {
        sid: usize,
    },
}

fn tokens(alphabet: u32, max: usize) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0..alphabet, 0..=max)
}

fn sel() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 1..4)
}

/// An op whose fresh tokens come from `0..alphabet`.
fn op(alphabet: u32) -> impl Strategy<Value = Op> {
    let client = 0..CLIENTS;
    prop_oneof![
        6 => (client.clone(), 0u8..12).prop_map(|(client, n)| Op::Alloc { client, n }),
        2 => (client.clone(), sel(), 0u8..16)
            .prop_map(|(client, sel, mode)| Op::Free { client, sel, mode }),
        10 => (client.clone(), any::<u8>(), any::<u8>(), tokens(alphabet, MAX_KEY), any::<bool>(),
               prop::bool::weighted(0.8), sel(), 0u8..16)
            .prop_map(|(client, base, cut, tail, lock, prealloc, sel, mode)| Op::Insert {
                client, base, cut, tail, lock, prealloc, sel, mode
            }),
        6 => (client.clone(), any::<u8>(), any::<u8>(), tokens(alphabet, MAX_KEY), any::<bool>())
            .prop_map(|(client, base, cut, tail, lock)| Op::Match { client, base, cut, tail, lock }),
        1 => (any::<u8>(), any::<u8>(), tokens(alphabet, MAX_KEY))
            .prop_map(|(base, cut, tail)| Op::Peek { base, cut, tail }),
        3 => (client.clone(), any::<u8>()).prop_map(|(client, which)| Op::Lock { client, which }),
        4 => (client.clone(), any::<u8>()).prop_map(|(client, which)| Op::Unlock { client, which }),
        3 => (0u8..40).prop_map(|tokens| Op::Evict { tokens }),
        1 => client.clone().prop_map(|client| Op::Release { client }),
        1 => Just(Op::Reset),
        3 => (client.clone(), 0..SESSIONS.len(), prop::bool::weighted(0.2), tokens(alphabet, 6), sel(), 0u8..16)
            .prop_map(|(client, sid, restart, tail, sel, mode)| Op::Commit {
                client, sid, restart, tail, sel, mode
            }),
        1 => (client.clone(), 0..SESSIONS.len())
            .prop_map(|(client, sid)| Op::EndSession { client, sid }),
        1 => (0..SESSIONS.len()).prop_map(|sid| Op::Status { sid }),
    ]
}

/// A handle for a lock/unlock op: a known one (maybe stale) or a bogus one.
fn pick_handle(m: &Model, which: u8) -> u64 {
    let n = m.handles.len();
    // Mostly recent handles (likely live), some old (likely stale).
    if which < 128 && n > 0 {
        return m.handles[n - 1 - which as usize % n.min(6)].0;
    }
    if which < 200 && n > 0 {
        return m.handles[which as usize % n].0;
    }
    let bogus = match which % 4 {
        0 => Handle {
            index: 0,
            generation: 1,
        },
        1 => Handle {
            index: 1_000_000,
            generation: 1,
        },
        2 => Handle {
            index: 1,
            generation: 0,
        },
        _ => Handle {
            index: 1,
            generation: u32::MAX,
        },
    };
    bogus.to_raw()
}

fn check_stats(e: &Engine, m: &Model) {
    let s: Stats = e.stats();
    let got = (
        s.total_tokens,
        s.evictable_tokens,
        s.protected_tokens,
        s.free_pages,
        s.owned_pages,
        s.nodes,
        s.evicted_pages,
    );
    assert_eq!(
        got,
        m.stats(),
        "(total, evictable, protected, free, owned, nodes, evicted)"
    );
}

/// Runs the model's alloc and the engine's and compares them.
fn alloc_both(e: &mut Engine, m: &mut Model, client: u32, n: u64) {
    assert_eq!(
        e.alloc(client, n),
        m.alloc(client, n),
        "alloc({client}, {n})"
    );
}

fn run(p: u32, cap: u32, ops: &[Op], recency: Recency) {
    let mut e = Engine::new(Config {
        page_size: p,
        capacity: cap,
    })
    .unwrap();
    e.set_recency(recency);
    let mut m = Model::new(p as usize, cap, recency);
    let mut buf = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { client, n } => alloc_both(&mut e, &mut m, client, u64::from(n)),
            Op::Free {
                client,
                ref sel,
                mode,
            } => {
                let mut pages: Vec<u32> = m
                    .owned_by(client)
                    .into_iter()
                    .enumerate()
                    .filter(|&(i, _)| sel[i % sel.len()] & (1 << (i % 8)) != 0)
                    .map(|(_, p)| p)
                    .collect();
                m.fault(client, &mut pages, sel, mode);
                assert_eq!(
                    e.free(client, &pages),
                    m.free(client, &pages),
                    "free {pages:?}"
                );
            }
            Op::Insert {
                client,
                base,
                cut,
                ref tail,
                lock,
                prealloc,
                ref sel,
                mode,
            } => {
                let key = m.key(base, cut, tail);
                if prealloc {
                    // As a server would: allocate what the key lacks first
                    // (which may evict part of its own prefix).
                    let need = (key.len() / m.p - m.walk(&key).len()) as u64;
                    alloc_both(&mut e, &mut m, client, need);
                }
                let pages = m.pages_for(client, &key, sel, mode);
                let got = e.insert(client, &key, &pages, lock);
                let want = m.insert(client, &key, &pages);
                match (got, want) {
                    (Ok(g), Ok((w, node))) => {
                        assert_eq!((g.cached, g.len), (w.cached, w.len), "insert {key:?}");
                        match (lock, node) {
                            (true, Some(l)) => {
                                m.note_handle(l, g.handle.expect("locked insert: no handle"));
                                m.lock_label(client, l);
                            }
                            _ => assert_eq!(g.handle, None),
                        }
                        m.remember(&key);
                    }
                    (g, w) => assert_eq!(g, w.map(|(i, _)| i), "insert {key:?} {pages:?}"),
                }
            }
            Op::Match {
                client,
                base,
                cut,
                ref tail,
                lock,
            } => {
                let key = m.key(base, cut, tail);
                let Matched { len, handle } = e.match_prefix(client, &key, lock, &mut buf);
                let (wlen, wpages, node) = m.match_prefix(&key);
                assert_eq!((len, &buf), (wlen, &wpages), "match {key:?}");
                match node {
                    Some(l) => {
                        m.note_handle(l, handle.expect("a match of something has a handle"));
                        if lock {
                            m.lock_label(client, l);
                        }
                    }
                    None => assert_eq!(handle, None),
                }
            }
            Op::Peek {
                base,
                cut,
                ref tail,
            } => {
                let key = m.key(base, cut, tail);
                let want = m.walk(&key);
                assert_eq!(e.peek(&key, &mut buf), want.len() * m.p);
                assert_eq!(buf, want);
            }
            Op::Lock { client, which } => {
                let raw = pick_handle(&m, which);
                let want = m.resolve(raw);
                assert_eq!(
                    e.lock(client, raw).map(|_| ()),
                    want.map(|_| ()),
                    "lock {raw:#x}"
                );
                if let Ok(l) = want {
                    m.lock_label(client, l);
                }
            }
            Op::Unlock { client, which } => {
                let raw = pick_handle(&m, which);
                let want = m
                    .resolve(raw)
                    .and_then(|l| match m.locks.get_mut(&(client, l)) {
                        None => Err(HandleError::NotLocked(raw)),
                        Some(c) => {
                            *c -= 1;
                            if *c == 0 {
                                m.locks.remove(&(client, l));
                            }
                            Ok(())
                        }
                    });
                assert_eq!(e.unlock(client, raw), want, "unlock {raw:#x}");
            }
            Op::Evict { tokens } => {
                let want = m.evict(u64::from(tokens).div_ceil(m.p as u64)) * m.p as u64;
                assert_eq!(e.evict(u64::from(tokens)), want, "evict {tokens}");
            }
            Op::Release { client } => {
                e.release_client(client);
                m.release_client(client);
            }
            Op::Reset => {
                e.reset();
                m.reset();
            }
            Op::Commit {
                client,
                sid,
                restart,
                ref tail,
                ref sel,
                mode,
            } => {
                let id = SESSIONS[sid];
                let mut key = match m.session_keys.get(id) {
                    Some(k) if !restart => k.clone(),
                    _ => Vec::new(),
                };
                key.extend_from_slice(tail);
                key.truncate(MAX_KEY);
                let need = (key.len() / m.p - m.walk(&key).len()) as u64;
                alloc_both(&mut e, &mut m, client, need);
                let pages = m.pages_for(client, &key, sel, mode);
                let got = e.session_commit(client, id, &key, &pages);
                let want = match m.sessions.get(id) {
                    Some(&(c, _)) if c != client => Err(SessionError::NotOwned(id.into())),
                    _ => m.insert(client, &key, &pages).map_err(SessionError::Page),
                };
                match want {
                    Ok((ins, node)) => {
                        // The new lock is taken before the old one goes.
                        m.sessions.insert(id, (client, node));
                        m.session_keys.insert(id, key.clone());
                        m.remember(&key);
                        assert_eq!(got, Ok(ins), "commit {id} {key:?}");
                    }
                    Err(w) => assert_eq!(got, Err(w), "commit {id} {key:?} {pages:?}"),
                }
            }
            Op::EndSession { client, sid } => {
                let id = SESSIONS[sid];
                let want = match m.sessions.get(id) {
                    None => Err(SessionError::Unknown(id.into())),
                    Some(&(c, _)) if c != client => Err(SessionError::NotOwned(id.into())),
                    Some(_) => {
                        m.sessions.remove(id);
                        Ok(())
                    }
                };
                assert_eq!(e.session_release(client, id), want);
            }
            Op::Status { sid } => {
                let id = SESSIONS[sid];
                let want = m
                    .sessions
                    .get(id)
                    .map(|&(_, l)| l.map_or(0, |l| m.label_end(l).unwrap().len() as u64));
                let got = e.session_status(id).map(|s| s.resident_tokens).ok();
                assert_eq!(got, want, "status {id}");
            }
        }
        if let Err(err) = e.validate() {
            panic!("step {step} {op:?}: {err}");
        }
        check_stats(&e, &m);
    }
}

/// `PROPTEST_CASES` overrides the default, for longer soak runs.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(400),
        ..ProptestConfig::default()
    })]

    /// 400 cases × 300 ops = 120k ops against the model.
    #[test]
    fn engine_matches_model(
        p in 1u32..=4,
        cap in 4u32..=32,
        ops in prop::collection::vec(op(3), 300),
        sglang in any::<bool>(),
    ) {
        run(p, cap, &ops, if sglang { Recency::Sglang } else { Recency::Exact });
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(150),
        ..ProptestConfig::default()
    })]

    /// 150 cases × 300 ops = 45k more ops on a wide, shallow tree: many
    /// siblings under one parent churn the child table (backward-shift deletion) and the LRU with many leaves.
    #[test]
    fn wide_tree_matches_model(
        cap in 48u32..=96,
        ops in prop::collection::vec(op(24), 300),
        sglang in any::<bool>(),
    ) {
        run(1, cap, &ops, if sglang { Recency::Sglang } else { Recency::Exact });
    }
}
