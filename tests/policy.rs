//! Eviction policies against SGLang 0.5.23's rule, as a property test.
//!
//! The model is SGLang's `RadixCache` written out plainly (a node tree with
//! SGLang's per-node facts: last access, creation, hits, priority, T-LRU's
//! lengths; `_match_prefix_helper`, `_insert_helper`, `_split_node` and
//! `evict` step by step), with a clock that ticks wherever SGLang reads
//! `time.monotonic()`, and the strategy tuples of `evict_policy.py`.
//! Eviction heaps every evictable leaf by its tuple at the call (nothing
//! kept between calls: the straightforward way), pops whole leaves and
//! pushes a parent its victim left an evictable leaf.
//!
//! The engine is asked to evict exactly the tokens the model freed (it
//! trims page by page, SGLang frees whole leaves), then every path the
//! model still caches must be cached whole in the engine and the totals
//! equal: the same victims. Every match and insert answer and every size
//! is compared after every operation, and `validate()` runs (its check of
//! the policy heap's keys included).
//!
//! Under `Recency::Exact` the model follows radixd's documented rule
//! instead of SGLang's one difference: a split does not touch its lower
//! half, and the upper half keeps the node's creation.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use proptest::prelude::*;
use radixd::engine::{Config, Engine, Handle, InsertHints, Policy, Recency};

const C: u32 = 0;

#[derive(Clone, Debug)]
struct MNode {
    key: Vec<u32>,
    parent: usize,
    children: BTreeMap<Vec<u32>, usize>,
    lock: u32,
    last: u64,
    created: u64,
    hits: u64,
    prio: i64,
    /// T-LRU: `_tlru_cached_prefix_len`, `_tlru_history_len`.
    cached: u64,
    history: u64,
    live: bool,
}

struct Model {
    p: usize,
    policy: Policy,
    recency: Recency,
    nodes: Vec<MNode>,
    clock: u64,
}

const ROOT: usize = 0;

/// A strategy's tuple, then the last access (`TreeNode.__lt__`).
type SortKey = (i128, i128, u64);

impl Model {
    fn new(p: usize, policy: Policy, recency: Recency) -> Self {
        let root = MNode {
            key: Vec::new(),
            parent: ROOT,
            children: BTreeMap::new(),
            lock: 1,
            last: 0,
            created: 0,
            hits: 0,
            prio: i64::MIN,
            cached: 0,
            history: 0,
            live: true,
        };
        Self {
            p,
            policy,
            recency,
            nodes: vec![root],
            clock: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// SGLang's `TreeNode(priority=...)`: `time.monotonic()` twice.
    fn new_node(&mut self, prio: i64) -> usize {
        let last = self.tick();
        let created = self.tick();
        self.nodes.push(MNode {
            key: Vec::new(),
            parent: ROOT,
            children: BTreeMap::new(),
            lock: 0,
            last,
            created,
            hits: 0,
            prio,
            cached: 0,
            history: 0,
            live: true,
        });
        self.nodes.len() - 1
    }

    fn sglang(&self) -> bool {
        self.recency == Recency::Sglang
    }

    /// Tokens `a` and `b` share, in whole pages.
    fn common(&self, a: &[u32], b: &[u32]) -> usize {
        let pages = a
            .chunks(self.p)
            .zip(b.chunks(self.p))
            .take_while(|(x, y)| x.len() == self.p && x == y)
            .count();
        pages * self.p
    }

    /// `_split_node`: a new upper node over `child`'s first `len` tokens.
    fn split(&mut self, child: usize, len: usize) -> usize {
        let c = self.nodes[child].clone();
        let m = self.new_node(c.prio);
        if !self.sglang() {
            self.nodes[m].created = c.created;
        }
        let (upper, lower) = c.key.split_at(len);
        let parent = c.parent;
        {
            let n = &mut self.nodes[m];
            n.key = upper.to_vec();
            n.parent = parent;
            n.lock = c.lock;
            n.hits = c.hits;
            n.children.insert(lower[..self.p].to_vec(), child);
        }
        self.nodes[child].key = lower.to_vec();
        self.nodes[child].parent = m;
        self.nodes[parent]
            .children
            .insert(upper[..self.p].to_vec(), m);
        // T-LRU's lengths (unified tree core's split).
        self.nodes[m].cached = self.nodes[parent].cached + len as u64;
        self.nodes[m].history = c.history;
        m
    }

    /// `match_prefix`: the matched length and its node.
    fn match_prefix(&mut self, key: &[u32]) -> (usize, usize) {
        let mut key = &key[..key.len() / self.p * self.p];
        if key.is_empty() {
            return (0, ROOT);
        }
        let access = self.tick();
        self.nodes[ROOT].last = access;
        let (mut node, mut len) = (ROOT, 0);
        while !key.is_empty() {
            let Some(&child) = self.nodes[node].children.get(&key[..self.p]) else {
                break;
            };
            let plen = self.common(&self.nodes[child].key, key);
            if plen < self.nodes[child].key.len() {
                if self.sglang() {
                    self.nodes[child].last = access;
                }
                node = self.split(child, plen);
                len += plen;
                break;
            }
            self.nodes[child].last = access;
            node = child;
            len += plen;
            key = &key[plen..];
        }
        (len, node)
    }

    /// `insert` with `InsertParams.priority` and `inserted_len`: the
    /// tokens cached before.
    fn insert(&mut self, key: &[u32], prio: i64, inserted_len: u64) -> usize {
        let mut key = &key[..key.len() / self.p * self.p];
        if key.is_empty() {
            return 0;
        }
        let access = self.tick();
        self.nodes[ROOT].last = access;
        self.nodes[ROOT].prio = self.nodes[ROOT].prio.max(prio);
        let (mut node, mut total) = (ROOT, 0usize);
        while !key.is_empty() {
            let Some(&child) = self.nodes[node].children.get(&key[..self.p]) else {
                break;
            };
            node = child;
            let plen = self.common(&self.nodes[node].key, key);
            if self.sglang() || plen == self.nodes[node].key.len() {
                self.nodes[node].last = access;
            }
            total += plen;
            key = &key[plen..];
            if plen < self.nodes[node].key.len() {
                node = self.split(node, plen);
            }
            self.nodes[node].prio = self.nodes[node].prio.max(prio);
            if total as u64 > inserted_len {
                self.nodes[node].hits += 1;
            }
        }
        if !key.is_empty() {
            let leaf = self.new_node(prio);
            if (total + key.len()) as u64 > inserted_len {
                self.nodes[leaf].hits += 1;
            }
            self.nodes[leaf].key = key.to_vec();
            self.nodes[leaf].parent = node;
            self.nodes[node]
                .children
                .insert(key[..self.p].to_vec(), leaf);
            // `_set_tlru_lens_and_raise_history`.
            let end = self.nodes[node].cached + key.len() as u64;
            self.nodes[leaf].cached = end;
            self.nodes[leaf].history = end;
            let mut at = node;
            while self.nodes[at].history < end {
                self.nodes[at].history = end;
                if at == ROOT {
                    break;
                }
                at = self.nodes[at].parent;
            }
        }
        total
    }

    fn lock(&mut self, mut node: usize, up: bool) {
        while node != ROOT {
            if up {
                self.nodes[node].lock += 1;
            } else {
                self.nodes[node].lock -= 1;
            }
            node = self.nodes[node].parent;
        }
    }

    fn evictable_leaf(&self, i: usize) -> bool {
        let n = &self.nodes[i];
        i != ROOT && n.live && n.lock == 0 && n.children.is_empty()
    }

    /// The strategy's tuple (`evict_policy.py`), then `TreeNode.__lt__`.
    fn key(&self, i: usize) -> SortKey {
        let n = &self.nodes[i];
        let last = i128::from(n.last);
        let (a, b) = match self.policy {
            Policy::Lru => (last, 0),
            Policy::Lfu => (i128::from(n.hits), last),
            Policy::Fifo => (i128::from(n.created), 0),
            Policy::Mru => (-last, 0),
            Policy::Filo => (-i128::from(n.created), 0),
            Policy::Priority => (i128::from(n.prio), last),
            Policy::Tlru {
                threshold,
                next_prompt_estimate,
            } => {
                let budget = (i128::from(n.history) + i128::from(next_prompt_estimate)
                    - i128::from(threshold))
                .max(0);
                let without = i128::from(n.cached) - n.key.len() as i128;
                (if without >= budget { -1 } else { 0 }, last)
            }
            Policy::Slru {
                protected_threshold,
            } => (
                i128::from(i128::from(n.hits) >= i128::from(protected_threshold)),
                last,
            ),
        };
        (a, b, n.last)
    }

    /// `evict`: whole leaves, least key first; the tokens freed.
    fn evict(&mut self, tokens: usize) -> usize {
        let mut heap: BinaryHeap<Reverse<(SortKey, usize)>> = (0..self.nodes.len())
            .filter(|&i| self.evictable_leaf(i))
            .map(|i| Reverse((self.key(i), i)))
            .collect();
        let mut freed = 0;
        while freed < tokens {
            let Some(Reverse((_, x))) = heap.pop() else {
                break;
            };
            freed += self.nodes[x].key.len();
            let parent = self.nodes[x].parent;
            let first = self.nodes[x].key[..self.p].to_vec();
            self.nodes[parent].children.remove(&first);
            self.nodes[x].live = false;
            if parent != ROOT
                && self.nodes[parent].children.is_empty()
                && self.nodes[parent].lock == 0
            {
                heap.push(Reverse((self.key(parent), parent)));
            }
        }
        freed
    }

    fn path(&self, mut i: usize) -> Vec<u32> {
        let mut parts = Vec::new();
        while i != ROOT {
            parts.push(self.nodes[i].key.clone());
            i = self.nodes[i].parent;
        }
        parts.reverse();
        parts.concat()
    }

    /// (total, evictable, protected) tokens.
    fn sizes(&self) -> (u64, u64, u64) {
        let (mut e, mut pr) = (0, 0);
        for (i, n) in self.nodes.iter().enumerate() {
            if i != ROOT && n.live {
                if n.lock == 0 {
                    e += n.key.len() as u64;
                } else {
                    pr += n.key.len() as u64;
                }
            }
        }
        (e + pr, e, pr)
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert {
        key: Vec<u32>,
        prio: i64,
        /// Pages of the key inserted before (`inserted_len`).
        before: usize,
    },
    Match {
        key: Vec<u32>,
        lock: bool,
    },
    Unlock(usize),
    Evict(usize),
}

fn op(p: usize) -> impl Strategy<Value = Op> {
    // Three tokens over few pages: shared prefixes, splits, repeats.
    let key = proptest::collection::vec(0u32..3, p..=7 * p);
    prop_oneof![
        4 => (key.clone(), -2i64..3, 0usize..4).prop_map(|(key, prio, before)| Op::Insert { key, prio, before }),
        3 => (key, any::<bool>()).prop_map(|(key, lock)| Op::Match { key, lock }),
        1 => (0usize..8).prop_map(Op::Unlock),
        2 => (1usize..12).prop_map(Op::Evict),
    ]
}

fn policies() -> Vec<Policy> {
    let mut out: Vec<Policy> = Policy::NAMES.iter().map(|n| n.parse().unwrap()).collect();
    out.push(Policy::Tlru {
        threshold: 6,
        next_prompt_estimate: 2,
    });
    out.push(Policy::Slru {
        protected_threshold: 1,
    });
    out
}

struct Twin {
    m: Model,
    e: Engine,
    locks: Vec<(usize, Handle)>,
    p: usize,
}

impl Twin {
    fn new(p: usize, cap: u32, policy: Policy, recency: Recency) -> Self {
        let mut e = Engine::new(Config {
            page_size: p as u32,
            capacity: cap,
        })
        .unwrap();
        e.set_recency(recency);
        e.set_policy(policy);
        assert_eq!(e.policy(), policy);
        Self {
            m: Model::new(p, policy, recency),
            e,
            locks: Vec::new(),
            p,
        }
    }

    fn evict(&mut self, tokens: usize) {
        let freed = self.m.evict(tokens);
        assert_eq!(self.e.evict(freed as u64), freed as u64, "tokens evicted");
        // The same victims: every path the model keeps is cached whole.
        let mut pages = Vec::new();
        for i in 0..self.m.nodes.len() {
            if i != ROOT && self.m.nodes[i].live && self.m.nodes[i].children.is_empty() {
                let path = self.m.path(i);
                assert_eq!(
                    self.e.peek(&path, &mut pages),
                    path.len(),
                    "cached: {path:?}"
                );
            }
        }
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Insert { key, prio, before } => {
                let key = &key[..key.len() / self.p * self.p];
                let mut pages = Vec::new();
                self.e.peek(key, &mut pages);
                let need = key.len() / self.p - pages.len();
                let free = self.e.stats().free_pages as usize;
                if need > free {
                    self.evict((need - free) * self.p);
                    // The eviction may have taken some of the prefix.
                    self.e.peek(key, &mut pages);
                }
                let need = key.len() / self.p - pages.len();
                if need > self.e.stats().free_pages as usize {
                    return;
                }
                pages.extend(self.e.alloc(C, need as u64).unwrap());
                let inserted_len = ((*before * self.p).min(key.len())) as u64;
                let cached = self.m.insert(key, *prio, inserted_len);
                let hints = InsertHints {
                    priority: *prio,
                    inserted_len,
                };
                let got = self.e.insert_hinted(C, key, &pages, false, hints).unwrap();
                assert_eq!(got.cached, cached, "insert's cached prefix");
            }
            Op::Match { key, lock } => {
                let (len, node) = self.m.match_prefix(key);
                let mut pages = Vec::new();
                let got = self.e.match_prefix(C, key, *lock, &mut pages);
                assert_eq!(got.len, len, "match length");
                if let (true, Some(h)) = (*lock, got.handle) {
                    self.m.lock(node, true);
                    self.locks.push((node, h));
                }
            }
            Op::Unlock(i) => {
                if !self.locks.is_empty() {
                    let (node, h) = self.locks.remove(i % self.locks.len());
                    self.m.lock(node, false);
                    self.e.unlock(C, h.to_raw()).unwrap();
                }
            }
            Op::Evict(n) => self.evict(n * self.p),
        }
        let s = self.e.stats();
        assert_eq!(
            (s.total_tokens, s.evictable_tokens, s.protected_tokens),
            self.m.sizes(),
            "(total, evictable, protected) after {op:?}"
        );
        self.e.validate().unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn victims_follow_sglang(
        which in 0usize..10,
        sglang in any::<bool>(),
        cap in 10u32..24,
        ops in (1usize..=2).prop_flat_map(|p| proptest::collection::vec(op(p), 1..160).prop_map(move |o| (p, o))),
    ) {
        let (kp, ops) = ops;
        let policy = policies()[which];
        let recency = if sglang { Recency::Sglang } else { Recency::Exact };
        let mut t = Twin::new(kp, cap, policy, recency);
        for op in &ops {
            t.step(op);
        }
    }
}

/// Every policy, both recency rules, a long fixed run each: many
/// evictions under locks, so every policy's order is exercised.
#[test]
fn long_runs_per_policy() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};
    for (k, policy) in policies().into_iter().enumerate() {
        for recency in Recency::ALL {
            for p in [1usize, 2] {
                let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[k as u8 + 7 * p as u8; 32]);
                let mut runner = TestRunner::new_with_rng(RunnerConfig::default(), rng);
                let ops = proptest::collection::vec(op(p), 1500)
                    .new_tree(&mut runner)
                    .unwrap()
                    .current();
                let mut t = Twin::new(p, 20, policy, recency);
                for op in &ops {
                    t.step(op);
                }
                assert!(
                    t.e.stats().evicted_pages > 100,
                    "{policy}: too few evictions"
                );
            }
        }
    }
}

#[test]
fn names_parameters_and_words_round_trip() {
    for name in Policy::NAMES {
        let p: Policy = name.parse().unwrap();
        assert_eq!(p.name(), name);
        assert_eq!(Policy::from_words(p.to_words()), Some(p));
    }
    let t = Policy::with_parameters(
        "TLRU",
        &[("threshold", 4096), ("next_prompt_estimate", 512)],
    )
    .unwrap();
    assert_eq!(
        t,
        Policy::Tlru {
            threshold: 4096,
            next_prompt_estimate: 512
        }
    );
    assert_eq!(
        t.to_string(),
        r#"tlru {"threshold": 4096, "next_prompt_estimate": 512}"#
    );
    assert_eq!(Policy::from_words(t.to_words()), Some(t));
    assert!(t.check().is_ok());
    assert!(Policy::with_parameters("tlru", &[])
        .unwrap()
        .check()
        .is_err());
    assert_eq!(
        "slru".parse::<Policy>().unwrap(),
        Policy::Slru {
            protected_threshold: 2
        }
    );
    let e = Policy::with_parameters("lru", &[("threshold", 1)]).unwrap_err();
    assert!(
        e.to_string().contains("lru") && e.to_string().contains("threshold"),
        "{e}"
    );
    let e = Policy::with_parameters("slru", &[("threshold", 1)]).unwrap_err();
    assert!(e.to_string().contains("protected_threshold"), "{e}");
    assert!("arc".parse::<Policy>().is_err());
    assert_eq!(Policy::from_words([99, 0, 0]), None);
}

/// Seed 000 under every policy: an eviction visits only what it takes,
/// however many locked nodes are older, newer, less or more valued.
#[test]
fn eviction_never_visits_a_locked_node() {
    for policy in policies() {
        let mut e = Engine::new(Config {
            page_size: 1,
            capacity: 4000,
        })
        .unwrap();
        e.set_policy(policy);
        for i in 0..2000u32 {
            let pages = e.alloc(C, 2).unwrap();
            let hints = InsertHints {
                priority: i64::from(i % 3),
                inserted_len: 0,
            };
            // Every other prompt stays locked: older and newer than each
            // victim, of every priority.
            e.insert_hinted(C, &[i, i], &pages, i % 2 == 0, hints)
                .unwrap();
        }
        for _ in 0..10 {
            let before = e.stats().evict_scanned;
            assert_eq!(e.evict(2), 2);
            assert_eq!(e.stats().evict_scanned - before, 1, "{policy}");
        }
        assert_eq!(e.evict(u64::MAX), 2 * 990);
        e.validate().unwrap();
    }
}
