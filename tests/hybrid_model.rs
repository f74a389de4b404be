//! The hybrid engine against a model: a plain transcription of SGLang
//! 0.5.23's `UnifiedRadixCache` rules (Python tree core) for FULL+SWA and
//! FULL+MAMBA, over a tree of owned nodes, vectors for the LRU lists and
//! SGLang's access times. Random operations (inserts, matches, locks,
//! unlocks, evictions of every component) must get the same answers and
//! leave the same sizes, tombstones included. `python/tests_sglang` runs the
//! same comparison against SGLang itself; this one runs in CI, under both
//! recency rules (SGLang touches the lower half of a split; exact recency,
//! the default, does not).
//!
//! FULL eviction is driven by the model's answer: SGLang frees whole
//! leaves and radixd trims pages, so the engine is asked for exactly what
//! the model freed (the same leaves, whole).

mod common;

use std::collections::BTreeMap;

use common::Rng;
use radixd::engine::{Components, Config, Engine, InsertExtra, MambaConfig, Recency, SwaConfig};

const C: u32 = 1;
/// Access times are scaled so that a match can stamp a path with
/// decreasing times below one tick, as SGLang's `t - k * 1e-5` does.
const TICK: i64 = 1 << 20;

#[derive(Clone, Debug)]
struct MNode {
    parent: usize,
    children: BTreeMap<Vec<u32>, usize>,
    key: Vec<u32>,
    swa: bool,
    state: bool,
    lock_full: u32,
    lock_swa: u32,
    lock_mamba: u32,
    time: i64,
    alive: bool,
}

struct Model {
    p: usize,
    window: Option<usize>,
    mamba: bool,
    nodes: Vec<MNode>,
    /// Most recently used first.
    swa_list: Vec<usize>,
    mamba_list: Vec<usize>,
    clock: i64,
    /// What a split counts as a use of (SGLang's rule by default).
    recency: Recency,
}

const ROOT: usize = 0;

impl Model {
    fn new(p: usize, window: Option<usize>, mamba: bool) -> Self {
        let root = MNode {
            parent: ROOT,
            children: BTreeMap::new(),
            key: Vec::new(),
            swa: false,
            state: false,
            lock_full: 0,
            lock_swa: 0,
            lock_mamba: 0,
            time: 0,
            alive: true,
        };
        Self {
            p,
            window,
            mamba,
            nodes: vec![root],
            swa_list: Vec::new(),
            mamba_list: Vec::new(),
            clock: 0,
            recency: Recency::Sglang,
        }
    }

    fn tick(&mut self) -> i64 {
        self.clock += TICK;
        self.clock
    }

    fn first_page(&self, key: &[u32]) -> Vec<u32> {
        key[..self.p].to_vec()
    }

    fn list_remove(list: &mut Vec<usize>, n: usize) {
        list.retain(|&x| x != n);
    }

    fn list_insert_after(list: &mut Vec<usize>, anchor: usize, n: usize) {
        let at = list.iter().position(|&x| x == anchor).unwrap();
        list.insert(at + 1, n);
    }

    fn leaf_evictable(&self, n: usize) -> bool {
        let x = &self.nodes[n];
        n != ROOT
            && x.alive
            && x.children.is_empty()
            && x.lock_full == 0
            && x.lock_swa == 0
            && x.lock_mamba == 0
    }

    /// `_split_node`: a new upper node takes the first `at` tokens.
    fn split(&mut self, child: usize, at: usize) -> usize {
        let parent = self.nodes[child].parent;
        let c = self.nodes[child].clone();
        let upper = self.nodes.len();
        let mut m = MNode {
            parent,
            children: BTreeMap::new(),
            key: c.key[..at].to_vec(),
            swa: c.swa,
            state: false,
            lock_full: c.lock_full,
            lock_swa: c.lock_swa,
            lock_mamba: 0,
            time: 0,
            alive: true,
        };
        let rest = c.key[at..].to_vec();
        m.children.insert(self.first_page(&rest), child);
        m.time = self.tick();
        self.nodes.push(m);
        let fp = self.first_page(&c.key);
        self.nodes[parent].children.insert(fp, upper);
        self.nodes[child].parent = upper;
        self.nodes[child].key = rest;
        if c.swa {
            Self::list_insert_after(&mut self.swa_list, child, upper);
        }
        // SGLang's `_split_node` touches the lower half; exact recency
        // leaves it at its last use.
        if self.recency == Recency::Sglang {
            self.nodes[child].time = self.tick();
        }
        upper
    }

    /// Walks `key`; returns the path (root excluded) and the FULL length,
    /// splitting a partially matched node.
    fn walk(&mut self, key: &[u32], touch: bool) -> (Vec<usize>, usize) {
        let (mut node, mut pos, mut path) = (ROOT, 0, Vec::new());
        while pos + self.p <= key.len() {
            let Some(&child) = self.nodes[node].children.get(&key[pos..pos + self.p]) else {
                break;
            };
            // SGLang touches the node before it may split it; exact
            // recency touches only what the key reached (below).
            let sglang = self.recency == Recency::Sglang;
            if touch && sglang {
                self.nodes[child].time = self.tick();
            }
            let ck = &self.nodes[child].key;
            let mut same = 0;
            while same < ck.len()
                && pos + same + self.p <= key.len()
                && ck[same..same + self.p] == key[pos + same..pos + same + self.p]
            {
                same += self.p;
            }
            let child = if same < self.nodes[child].key.len() {
                self.split(child, same)
            } else {
                child
            };
            if touch && !sglang {
                self.nodes[child].time = self.tick();
            }
            path.push(child);
            pos += same;
            node = child;
            if same < self.nodes[child].key.len() {
                break;
            }
        }
        (path, pos)
    }

    fn refresh_swa(&mut self, node: usize) {
        let Some(w) = self.window else { return };
        let (mut cur, mut acc, mut chain) = (node, 0, Vec::new());
        while cur != ROOT && acc < w + self.p {
            if self.nodes[cur].swa {
                chain.push(cur);
            }
            acc += self.nodes[cur].key.len();
            cur = self.nodes[cur].parent;
        }
        for &n in &chain {
            Self::list_remove(&mut self.swa_list, n);
        }
        for (i, &n) in chain.iter().enumerate() {
            self.swa_list.insert(i, n);
        }
    }

    /// `match_prefix`: (usable length, FULL length, state found, node).
    fn match_prefix(&mut self, key: &[u32]) -> (usize, usize, bool, usize) {
        let key = &key[..key.len() / self.p * self.p];
        let (path, full) = self.walk(key, false);
        let (mut since, mut best, mut best_len, mut pos) = (usize::MAX, ROOT, 0, 0);
        for &n in &path {
            pos += self.nodes[n].key.len();
            let mut valid = true;
            if let Some(w) = self.window {
                if self.nodes[n].swa {
                    since = since.saturating_add(self.nodes[n].key.len());
                    valid &= since >= w;
                } else {
                    since = 0;
                    valid = false;
                }
            }
            if self.mamba {
                valid &= self.nodes[n].state;
            }
            if valid {
                best = n;
                best_len = pos;
            }
        }
        self.refresh_swa(best);
        if self.mamba && best != ROOT && self.nodes[best].state {
            Self::list_remove(&mut self.mamba_list, best);
            self.mamba_list.insert(0, best);
        }
        let t = self.tick();
        let (mut cur, mut k) = (best, 0);
        while cur != ROOT {
            self.nodes[cur].time = t - k;
            k += 1;
            cur = self.nodes[cur].parent;
        }
        let state = best != ROOT && self.nodes[best].state;
        (best_len, full, state, best)
    }

    fn publish_swa(&mut self, n: usize) {
        self.nodes[n].swa = true;
        self.swa_list.insert(0, n);
    }

    /// `insert` with fresh pages and optionally a state: (prefix length,
    /// mamba_exist).
    fn insert(&mut self, key: &[u32], state: bool) -> (usize, bool) {
        let key = &key[..key.len() / self.p * self.p];
        let (path, cached) = self.walk(key, true);
        // Tombstone recovery along the path (fresh pages, evicted = 0).
        if self.window.is_some() {
            for &n in &path {
                if !self.nodes[n].swa {
                    self.publish_swa(n);
                }
            }
        }
        let mut target = path.last().copied().unwrap_or(ROOT);
        if cached < key.len() {
            let leaf = self.nodes.len();
            let rest = key[cached..].to_vec();
            let time = self.tick();
            self.nodes.push(MNode {
                parent: target,
                children: BTreeMap::new(),
                key: rest.clone(),
                swa: false,
                state: false,
                lock_full: 0,
                lock_swa: 0,
                lock_mamba: 0,
                time,
                alive: true,
            });
            let fp = self.first_page(&rest);
            self.nodes[target].children.insert(fp, leaf);
            if let Some(w) = self.window {
                let tail = w.div_ceil(self.p) * self.p;
                let mut upper = None;
                if rest.len() > tail {
                    upper = Some(self.split(leaf, rest.len() - tail));
                }
                for n in upper.into_iter().chain([leaf]) {
                    self.publish_swa(n);
                }
            }
            target = leaf;
        }
        let mut exist = false;
        if state {
            if target == ROOT {
                exist = true;
            } else if self.nodes[target].state {
                Self::list_remove(&mut self.mamba_list, target);
                self.mamba_list.insert(0, target);
                exist = true;
            } else {
                self.nodes[target].state = true;
                self.mamba_list.insert(0, target);
            }
        }
        if target != ROOT {
            self.refresh_swa(target);
        }
        (cached, exist)
    }

    /// Takes (`up`) or drops a lock on `node`: FULL on the path, SWA on
    /// the nodes covering the last window (SGLang's segment lock; a drop
    /// walks as far as `reach`, its own lock's receipt), MAMBA at `node`.
    /// Returns the tokens the SWA walk covered (the receipt of a lock).
    fn lock(&mut self, node: usize, up: bool, reach: usize) -> usize {
        let mut cur = node;
        while cur != ROOT {
            if up {
                self.nodes[cur].lock_full += 1;
            } else {
                self.nodes[cur].lock_full -= 1;
            }
            cur = self.nodes[cur].parent;
        }
        if node == ROOT {
            return 0;
        }
        let mut covered = 0;
        if let Some(w) = self.window {
            let reach = if up { w } else { reach };
            let mut cur = node;
            while cur != ROOT && covered < reach {
                if up {
                    self.nodes[cur].lock_swa += 1;
                } else {
                    self.nodes[cur].lock_swa -= 1;
                }
                covered += self.nodes[cur].key.len();
                cur = self.nodes[cur].parent;
            }
        }
        if self.mamba {
            if up {
                self.nodes[node].lock_mamba += 1;
            } else {
                self.nodes[node].lock_mamba -= 1;
            }
        }
        covered
    }

    /// Deletes the evictable leaf `n`: (FULL tokens, SWA tokens, states).
    fn delete(&mut self, n: usize) -> (usize, usize, usize) {
        let x = self.nodes[n].clone();
        let fp = self.first_page(&x.key);
        self.nodes[x.parent].children.remove(&fp);
        self.nodes[n].alive = false;
        Self::list_remove(&mut self.swa_list, n);
        Self::list_remove(&mut self.mamba_list, n);
        let swa = if x.swa { x.key.len() } else { 0 };
        (x.key.len(), swa, usize::from(x.state))
    }

    fn evict(&mut self, full: usize, swa: usize, mamba: usize) -> (usize, usize, usize) {
        let mut t = (0, 0, 0);
        let add = |t: &mut (usize, usize, usize), d: (usize, usize, usize)| {
            t.0 += d.0;
            t.1 += d.1;
            t.2 += d.2;
        };
        while t.0 < full {
            let victim = (1..self.nodes.len())
                .filter(|&n| self.leaf_evictable(n))
                .min_by_key(|&n| self.nodes[n].time);
            let Some(v) = victim else { break };
            let d = self.delete(v);
            add(&mut t, d);
        }
        if self.window.is_some() && t.1 < swa {
            let order: Vec<usize> = self.swa_list.iter().rev().copied().collect();
            for n in order {
                if t.1 >= swa {
                    break;
                }
                if !self.nodes[n].alive || !self.nodes[n].swa || self.nodes[n].lock_swa > 0 {
                    continue;
                }
                if self.leaf_evictable(n) {
                    let d = self.delete(n);
                    add(&mut t, d);
                } else {
                    self.nodes[n].swa = false;
                    Self::list_remove(&mut self.swa_list, n);
                    t.1 += self.nodes[n].key.len();
                }
            }
        }
        if self.mamba && t.2 < mamba {
            let order: Vec<usize> = self.mamba_list.iter().rev().copied().collect();
            for n in order {
                if t.2 >= mamba {
                    break;
                }
                if !self.nodes[n].alive || !self.nodes[n].state || self.nodes[n].lock_mamba > 0 {
                    continue;
                }
                if self.leaf_evictable(n) {
                    let d = self.delete(n);
                    add(&mut t, d);
                } else {
                    self.nodes[n].state = false;
                    Self::list_remove(&mut self.mamba_list, n);
                    t.2 += 1;
                }
            }
        }
        t
    }

    /// (FULL evictable, FULL protected, SWA or MAMBA evictable, protected).
    fn sizes(&self) -> (usize, usize, usize, usize) {
        let mut s = (0, 0, 0, 0);
        for (i, n) in self.nodes.iter().enumerate() {
            if i == ROOT || !n.alive {
                continue;
            }
            let t = n.key.len();
            if n.lock_full > 0 {
                s.1 += t;
            } else {
                s.0 += t;
            }
            if n.swa {
                if n.lock_swa > 0 {
                    s.3 += t;
                } else {
                    s.2 += t;
                }
            }
            if n.state {
                if n.lock_mamba > 0 {
                    s.3 += 1;
                } else {
                    s.2 += 1;
                }
            }
        }
        s
    }

    fn cached_tokens(&self) -> usize {
        let (e, p, _, _) = self.sizes();
        e + p
    }
}

/// The order in which held locks are released.
#[derive(Clone, Copy, Debug)]
enum Release {
    /// Oldest first (requests finishing as they came).
    Arrival,
    /// Newest first.
    Reverse,
    /// Any.
    Random,
}

fn run(seed: u64, p: u32, window: Option<u32>, mamba: bool, ops: usize, release: Release) {
    run_with(seed, p, window, mamba, ops, release, Recency::Sglang);
    // Exact recency once per seed (the release order is not its concern).
    if matches!(release, Release::Random) {
        run_with(seed, p, window, mamba, ops, release, Recency::Exact);
    }
}

fn run_with(
    seed: u64,
    p: u32,
    window: Option<u32>,
    mamba: bool,
    ops: usize,
    release: Release,
    recency: Recency,
) {
    let cap = 40u32;
    let comps = Components {
        swa: window.map(|window| SwaConfig {
            window,
            capacity: 4096,
        }),
        mamba: mamba.then_some(MambaConfig { capacity: 4096 }),
    };
    let mut e = Engine::with_components(
        Config {
            page_size: p,
            capacity: cap,
        },
        comps,
    )
    .unwrap();
    e.set_recency(recency);
    let mut m = Model::new(p as usize, window.map(|w| w as usize), mamba);
    m.recency = recency;
    let mut rng = Rng(seed);
    let mut locks: Vec<(usize, usize, u64)> = Vec::new();
    let (mut hits, mut tombstones) = (0, 0);
    for step in 0..ops {
        let pages = 1 + rng.below(6) as usize;
        let key: Vec<u32> = (0..pages)
            .flat_map(|i| {
                let c = (1 + rng.below(3) as u32) * 10 + i as u32 % 3;
                (0..p).map(move |j| c * 100 + j)
            })
            .collect();
        let ctx =
            format!("seed {seed} P{p} W{window:?} mamba {mamba} {release:?} {recency} step {step}");
        match rng.below(10) {
            0..=3 => {
                let free = e.stats().free_pages as usize * p as usize;
                if free < key.len() {
                    let want = key.len() - free;
                    let (f, s, st) = m.evict(want, 0, 0);
                    let ev = e.evict_components(f as u64, 0, 0).unwrap();
                    assert_eq!(
                        (ev.tokens, ev.swa_tokens, ev.mamba_states),
                        (f as u64, s as u64, st as u64),
                        "{ctx}"
                    );
                }
                if (e.stats().free_pages as usize * p as usize) < key.len() {
                    continue;
                }
                let fresh = e.alloc(C, (key.len() / p as usize) as u64).unwrap();
                let state = mamba.then(|| e.alloc_state(C).unwrap());
                let extra = InsertExtra {
                    mamba_state: state,
                    swa_evicted: 0,
                };
                let (ins, ie) = e.insert_with(C, &key, &fresh, false, extra).unwrap();
                let (cached, exist) = m.insert(&key, mamba);
                assert_eq!(
                    (ins.cached, ie.mamba_exist),
                    (cached, exist),
                    "{ctx}: insert"
                );
                if let (true, Some(s)) = (ie.mamba_exist, state) {
                    e.free_state(C, u64::from(s)).unwrap();
                }
            }
            4..=6 => {
                let lock = rng.below(3) == 0 && locks.len() < 4;
                let mut pages = Vec::new();
                let (r, x) = e.match_with(C, &key, lock, &mut pages);
                let (len, full, state, node) = m.match_prefix(&key);
                assert_eq!(
                    (r.len, x.full_len, x.mamba_state.is_some()),
                    (len, full, state),
                    "{ctx}: match"
                );
                hits += usize::from(len > 0);
                if let (true, Some(h)) = (lock, r.handle) {
                    let reach = m.lock(node, true, 0);
                    locks.push((node, reach, h.to_raw()));
                }
            }
            7 => {
                if !locks.is_empty() {
                    let at = match release {
                        Release::Arrival => 0,
                        Release::Reverse => locks.len() - 1,
                        Release::Random => rng.below(locks.len() as u64) as usize,
                    };
                    let (node, reach, h) = locks.remove(at);
                    m.lock(node, false, reach);
                    e.unlock(C, h).unwrap();
                }
            }
            8 => {
                let (f, s, st) = m.evict((1 + rng.below(3) as usize) * p as usize, 0, 0);
                let ev = e.evict_components(f as u64, 0, 0).unwrap();
                assert_eq!(
                    (ev.tokens, ev.swa_tokens, ev.mamba_states),
                    (f as u64, s as u64, st as u64),
                    "{ctx}: evict"
                );
            }
            _ => {
                let (sw, ma) = if mamba {
                    (0, 1 + rng.below(2) as usize)
                } else {
                    ((1 + rng.below(4) as usize) * p as usize, 0)
                };
                let want = (m.evict(0, sw, ma), sw, ma);
                let ev = e.evict_components(0, want.1 as u64, want.2 as u64).unwrap();
                let (f, s, st) = want.0;
                assert_eq!(
                    (ev.tokens, ev.swa_tokens, ev.mamba_states),
                    (f as u64, s as u64, st as u64),
                    "{ctx}: evict secondary"
                );
                tombstones += usize::from(s > 0 || st > 0);
            }
        }
        e.validate().unwrap_or_else(|err| panic!("{ctx}: {err}"));
        let st = e.stats();
        let cs = e.component_stats().unwrap();
        let (fe, fp, se, sp) = m.sizes();
        assert_eq!(
            (st.evictable_tokens, st.protected_tokens),
            (fe as u64, fp as u64),
            "{ctx}: FULL sizes"
        );
        assert_eq!(st.total_tokens, m.cached_tokens() as u64, "{ctx}");
        let secondary = if mamba {
            (cs.mamba_evictable_states, cs.mamba_protected_states)
        } else {
            (cs.swa_evictable_tokens, cs.swa_protected_tokens)
        };
        assert_eq!(secondary, (se as u64, sp as u64), "{ctx}: component sizes");
    }
    assert!(hits > ops / 10, "{hits} hits");
    assert!(tombstones > ops / 50, "{tombstones} secondary evictions");
}

#[test]
fn swa_engine_matches_the_model() {
    for release in [Release::Arrival, Release::Reverse, Release::Random] {
        for seed in 1..=4u64 {
            run(seed * 7919, 1, Some(3), false, 3000, release);
            run(seed * 104_729, 4, Some(12), false, 3000, release);
            run(seed * 31, 2, Some(3), false, 3000, release);
        }
    }
}

#[test]
fn mamba_engine_matches_the_model() {
    for release in [Release::Arrival, Release::Reverse, Release::Random] {
        for seed in 1..=4u64 {
            run(seed * 7919, 1, None, true, 3000, release);
            run(seed * 104_729, 4, None, true, 3000, release);
        }
    }
}
