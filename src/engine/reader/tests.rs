//! Unit tests of the tree reader, over engines built on the heap.

use super::*;
use crate::engine::{Config, Engine, Region};

fn engine_with(prompts: &[&[u32]]) -> Engine {
    let mut e = Engine::new(Config {
        page_size: 2,
        capacity: 32,
    })
    .expect("engine");
    for key in prompts {
        let pages = e.alloc(1, key.len() as u64 / 2).expect("alloc");
        e.insert(1, key, &pages, false).expect("insert");
    }
    e
}

fn reader(e: &Engine) -> TreeReader {
    let base = NonNull::new(e.region().as_ptr()).expect("region");
    // SAFETY: the engine's heap region outlives the reader in each test,
    // and the tests change it only between peeks.
    unsafe { TreeReader::new(base, e.layout()) }
}

#[test]
fn a_change_elsewhere_fails_no_read_and_a_change_underfoot_is_waited_out() {
    let (a, b): (&[u32], &[u32]) = (&[1, 2, 3, 4, 5, 6], &[1, 2, 7, 7]);
    let e = engine_with(&[a, b]);
    let r = reader(&e);
    let mut pages = Vec::new();
    let mut want = Vec::new();
    assert_eq!(e.peek(a, &mut want), 6);
    // A writer stopped in the middle of changing the other branch's
    // leaf (or the table, between lookups) disturbs nothing on this path.
    let mut b_pages = Vec::new();
    e.peek(b, &mut b_pages);
    let leaf_b = e
        .arena
        .nodes()
        .iter()
        .position(|n| n.state == NODE_LIVE && n.first_page == b_pages[1]);
    let leaf_b = leaf_b.expect("b's leaf") as u32;
    e.arena.version(leaf_b).begin();
    assert_eq!(r.peek(a, &mut pages), Some(6));
    assert_eq!(pages, want);
    e.arena.version(leaf_b).end();
    // Mid-change of a node on the path: the reader retries that node and
    // gives up only after its budget.
    let leaf_a = e
        .arena
        .nodes()
        .iter()
        .position(|n| n.state == NODE_LIVE && n.first_page == want[1]);
    let leaf_a = leaf_a.expect("a's leaf") as u32;
    e.arena.version(leaf_a).begin();
    assert_eq!(r.peek(a, &mut pages), None);
    // ...while a key that stops above it still reads.
    assert_eq!(r.peek(&[1, 2, 9, 9], &mut pages), Some(2));
    e.arena.version(leaf_a).end();
    assert_eq!(r.peek(a, &mut pages), Some(6));
    assert_eq!(pages, want);
}

/// A writer stopped in the middle of changing the child table: every
/// lookup waits for it and gives up after its budget (a probe of a
/// moving table proves nothing, a miss included); once the change
/// ends, the same reads succeed.
#[test]
fn a_table_mid_change_is_waited_out() {
    let a: &[u32] = &[1, 2, 3, 4];
    let e = engine_with(&[a]);
    let r = reader(&e);
    let mut pages = Vec::new();
    e.arena.table_version().begin();
    assert_eq!(r.peek(a, &mut pages), None);
    assert_eq!(r.peek(&[9, 9], &mut pages), None, "not even a miss");
    e.arena.table_version().end();
    assert_eq!(r.peek(a, &mut pages), Some(4));
    assert_eq!(r.peek(&[9, 9], &mut pages), Some(0));
}

/// `anchor_of` copies the anchor of a live node of that generation
/// (what a match's handle names), and nothing for the root, another
/// generation, or a node that keeps changing.
#[test]
fn anchor_of_names_only_the_live_node_of_that_generation() {
    let a: &[u32] = &[1, 2, 3, 4];
    let e = engine_with(&[a]);
    let r = reader(&e);
    let mut pages = Vec::new();
    let peeked = r.peek_anchored(a, &mut pages).expect("peek");
    let anchor = peeked.anchor.expect("a whole node matched");
    assert_eq!(anchor.pages_into_node, 2);
    assert_eq!(r.anchor_of(anchor.node, anchor.generation), Some(anchor));
    assert_eq!(r.anchor_of(anchor.node, anchor.generation + 1), None);
    assert_eq!(r.anchor_of(ROOT, 0), None);
    e.arena.version(anchor.node).begin();
    assert_eq!(r.anchor_of(anchor.node, anchor.generation), None);
    e.arena.version(anchor.node).end();
    let again = r.anchor_of(anchor.node, anchor.generation).expect("live");
    assert_eq!((again.node, again.pages_into_node), (anchor.node, 2));
    assert_ne!(again.version, anchor.version, "a change moved it");
}

#[test]
fn a_path_deeper_than_the_frame_stack_reads_and_resumes() {
    // A 100-page key with a branch off every page: 100 nodes deep.
    let depth = 100u32;
    let mut e = Engine::new(Config {
        page_size: 1,
        capacity: 2 * depth + 2,
    })
    .expect("engine");
    let key: Vec<u32> = (0..depth).collect();
    let pages = e.alloc(1, u64::from(depth)).expect("alloc");
    e.insert(1, &key, &pages, false).expect("insert");
    for i in 1..depth as usize {
        let mut branch = key[..i].to_vec();
        branch.push(10_000 + i as u32);
        let mut owned = pages[..i].to_vec();
        owned.extend(e.alloc(1, 1).expect("alloc"));
        e.insert(1, &branch, &owned, false).expect("insert");
    }
    assert!(e.stats().nodes > u64::from(depth));
    let r = reader(&e);
    let mut out = Vec::new();
    assert_eq!(r.peek(&key, &mut out), Some(key.len()));
    assert_eq!(out, pages);
    // Every prefix too, ending at each depth.
    for n in [1, 63, 64, 65, 99] {
        assert_eq!(r.peek(&key[..n], &mut out), Some(n));
        assert_eq!(out, pages[..n]);
    }
}

#[test]
fn whole_lanes_and_remainders_compare_every_token() {
    for p in [8u32, 16, 13] {
        let mut e = Engine::new(Config {
            page_size: p,
            capacity: 8,
        })
        .expect("engine");
        let key: Vec<u32> = (0..4 * p).map(|i| i * 3 + 1).collect();
        let pages = e.alloc(1, 4).expect("alloc");
        e.insert(1, &key, &pages, false).expect("insert");
        let r = reader(&e);
        let mut out = Vec::new();
        assert_eq!(r.peek(&key, &mut out), Some(key.len()));
        assert_eq!(out, pages);
        for bad in [p + 1, 2 * p + p - 1, 3 * p + 7] {
            let mut k = key.clone();
            k[bad as usize] ^= 1;
            let page = bad / p;
            assert_eq!(
                r.peek(&k, &mut out),
                Some((page * p) as usize),
                "P={p} token {bad}"
            );
            assert_eq!(out, pages[..page as usize]);
        }
    }
}

/// `namespace_tokens` (what `radixd stat` shows) counts each namespace's
/// cached tokens as the engine does, and a peek walks only its own
/// namespace's keys.
#[test]
fn namespaces_are_counted_and_walked_apart() {
    let mut e = engine_with(&[&[1, 2, 3, 4]]);
    let ns = e.namespace("a").expect("namespace");
    e.with_namespace(ns, |e| {
        let pages = e.alloc(1, 3).expect("alloc");
        e.insert(1, &[1, 2, 3, 4, 5, 6], &pages, false)
            .expect("insert");
    });
    let r = reader(&e);
    assert_eq!(r.namespace_tokens(), vec![(0, 4), (ns, 6)]);
    let sizes = e.namespace_sizes();
    let want: Vec<(u32, u64)> = sizes.iter().map(|s| (s.id, s.tokens)).collect();
    assert_eq!(r.namespace_tokens(), want);
    let mut pages = Vec::new();
    assert_eq!(r.peek_in(ns, &[1, 2, 3, 4, 5, 6], &mut pages), Some(6));
    assert_eq!(r.peek(&[1, 2, 3, 4, 5, 6], &mut pages), Some(4));
}

/// `generation_of` reads a node's generation as it stands (what a lock's
/// handle is checked against), a reused node's too.
#[test]
fn generation_of_reads_the_nodes_generation_as_it_stands() {
    let a: &[u32] = &[1, 2, 3, 4];
    let mut e = engine_with(&[a]);
    // Evicted and cached again: the node comes back at a later generation.
    assert_eq!(e.evict(4), 4);
    let pages = e.alloc(1, 2).expect("alloc");
    e.insert(1, a, &pages, false).expect("insert");
    let r = reader(&e);
    let mut out = Vec::new();
    let peeked = r.peek_anchored(a, &mut out).expect("peek");
    let anchor = peeked.anchor.expect("a whole node matched");
    let generation = e.arena.nodes()[anchor.node as usize].generation;
    assert!(generation > 1, "generation {generation}");
    assert_eq!(anchor.generation, generation);
    assert_eq!(r.generation_of(anchor.node), Some(generation));
    assert_eq!(r.generation_of(u32::MAX), None, "past the nodes");
}

/// A node whose pages run to the pool's last page is read whole: the
/// bound check of a run admits one that ends exactly at the pool's end,
/// and measures it by its first page plus its length.
#[test]
fn a_run_to_the_last_page_of_the_pool_is_read() {
    let mut e = Engine::new(Config {
        page_size: 2,
        capacity: 8,
    })
    .expect("engine");
    let pages = e.alloc(1, 2).expect("alloc");
    e.insert(1, &[1, 2, 3, 4], &pages, false).expect("insert");
    // Pages 2..8: the node's first page, then a run of five from page 3.
    let key: Vec<u32> = (10..22).collect();
    let pages = e.alloc(1, 6).expect("alloc");
    assert_eq!(pages, (2..8).collect::<Vec<u32>>());
    e.insert(1, &key, &pages, false).expect("insert");
    let r = reader(&e);
    let mut out = Vec::new();
    assert_eq!(r.peek(&key, &mut out), Some(key.len()));
    assert_eq!(out, pages);
}

/// A key shorter than a page (empty included) matches nothing, and says
/// so: the walk's step budget is never zero.
#[test]
fn a_key_shorter_than_a_page_matches_nothing() {
    let e = engine_with(&[&[1, 2, 3, 4]]);
    let r = reader(&e);
    let mut pages = vec![9];
    assert_eq!(r.peek(&[], &mut pages), Some(0));
    assert!(pages.is_empty());
    assert_eq!(r.peek(&[1], &mut pages), Some(0));
    let peeked = r.peek_anchored(&[1], &mut pages).expect("peek");
    assert_eq!(peeked.anchor, None);
}

/// The engine's region as `Mapped` reads it, except that the version of
/// the node at `at` reads as mid-change for `torn` loads after the first
/// `real` ones: a writer that changes that node while the walk is on it
/// (and, with `torn` at `u32::MAX`, never finishes). It also counts the
/// loads of the word at `watch` (none by default).
struct Flaky {
    inner: Mapped,
    at: usize,
    real: std::cell::Cell<u32>,
    torn: std::cell::Cell<u32>,
    busy: Version,
    watch: usize,
    loads: std::cell::Cell<u32>,
}

impl Flaky {
    fn over(e: &Engine, node: u32, real: u32, torn: u32) -> TreeReader<Flaky> {
        let base = NonNull::new(e.region().as_ptr()).expect("region");
        let layout = e.layout();
        let busy = Version::new();
        busy.begin();
        TreeReader::over(Flaky {
            // SAFETY: as `reader`'s.
            inner: unsafe { Mapped::new(base, layout) },
            at: layout.versions_at + node as usize * size_of::<Version>(),
            real: real.into(),
            torn: torn.into(),
            busy,
            watch: usize::MAX,
            loads: 0.into(),
        })
    }
}

// SAFETY: every read goes to `Mapped`'s, at the same offsets, but for the
// stand-in version, which lives as long as `self`.
unsafe impl TreeMem for Flaky {
    fn layout(&self) -> EngineLayout {
        self.inner.layout()
    }
    unsafe fn version(&self, at: usize) -> &Version {
        if at == self.at {
            if self.real.get() > 0 {
                self.real.set(self.real.get() - 1);
            } else if self.torn.get() > 0 {
                if self.torn.get() != u32::MAX {
                    self.torn.set(self.torn.get() - 1);
                }
                return &self.busy;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.version(at) }
    }
    unsafe fn word(&self, at: usize) -> u32 {
        if at == self.watch {
            self.loads.set(self.loads.get() + 1);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.word(at) }
    }
    unsafe fn same(&self, at: usize, key: &[u32]) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.same(at, key) }
    }
}

/// The two-branch tree of `a_change_elsewhere_...`, the key of its deeper
/// branch, that key's pages, and the nodes on its path: `[1, 2]`, then
/// `[3, 4, 5, 6]`.
fn two_branches() -> (Engine, Vec<u32>, Vec<u32>, u32, u32) {
    let a = vec![1, 2, 3, 4, 5, 6];
    let e = engine_with(&[&a, &[1, 2, 7, 7]]);
    let mut want = Vec::new();
    assert_eq!(e.peek(&a, &mut want), 6);
    let node_of = |page: u32| {
        let i = e
            .arena
            .nodes()
            .iter()
            .position(|n| n.state == NODE_LIVE && n.first_page == page);
        i.expect("a node on the path") as u32
    };
    let (upper, leaf) = (node_of(want[0]), node_of(want[1]));
    (e, a, want, upper, leaf)
}

/// A node the walk finds mid-change, whose writer finishes within the
/// walk's budget: the walk retries it and answers in full, the pages of
/// the nodes above it kept.
#[test]
fn a_change_that_ends_during_the_retries_is_read_through() {
    let (e, a, want, _, leaf) = two_branches();
    let r = Flaky::over(&e, leaf, 0, 3);
    let mut pages = Vec::new();
    assert_eq!(r.peek(&a, &mut pages), Some(6));
    assert_eq!(pages, want);
}

/// A node the walk stood on changes after it was copied, for good: the
/// walk steps back to the frame still valid (the root), finds it
/// mid-change from there, and gives up after its budget instead of
/// spinning on the stale frame.
#[test]
fn a_frame_changed_for_good_is_left_and_the_walk_gives_up() {
    let (e, a, _, upper, _) = two_branches();
    // The first load is the copy of `[1, 2]`; every later one sees it
    // mid-change.
    let r = Flaky::over(&e, upper, 1, u32::MAX);
    let mut pages = Vec::new();
    assert_eq!(r.peek(&a, &mut pages), None);
}

/// A key that ends inside a node's run of consecutive pages: the run is
/// compared only as far as the key goes.
#[test]
fn a_key_ending_inside_a_run_reads_its_whole_pages() {
    let mut e = Engine::new(Config {
        page_size: 2,
        capacity: 8,
    })
    .expect("engine");
    let key: Vec<u32> = (1..=10).collect();
    let pages = e.alloc(1, 5).expect("alloc");
    e.insert(1, &key, &pages, false).expect("insert");
    let r = reader(&e);
    let mut out = Vec::new();
    // Three pages and a half of the five: three whole pages match.
    assert_eq!(r.peek(&key[..7], &mut out), Some(6));
    assert_eq!(out, pages[..3]);
}

/// The live node whose first page is `page`.
fn node_of(e: &Engine, page: u32) -> u32 {
    let i = e
        .arena
        .nodes()
        .iter()
        .position(|n| n.state == NODE_LIVE && n.first_page == page);
    i.expect("a node holding the page") as u32
}

/// The engine's region as `Mapped` reads it, but with one more entry in
/// the child table, `(hash, node)`, filed at the head of `hash`'s probe
/// sequence: the entries of its cluster (up to the first empty bucket)
/// each read one bucket further on. A probe for `hash` meets `node`
/// first: a collision of the 32-bit hash, forged.
struct Decoy {
    inner: Mapped,
    hash: u32,
    node: u32,
}

impl Decoy {
    fn over(e: &Engine, hash: u32, node: u32) -> TreeReader<Decoy> {
        let base = NonNull::new(e.region().as_ptr()).expect("region");
        TreeReader::over(Decoy {
            // SAFETY: as `reader`'s.
            inner: unsafe { Mapped::new(base, e.layout()) },
            hash,
            node,
        })
    }

    /// Word `field` of real bucket `i`.
    fn real(&self, i: u32, field: usize) -> u32 {
        let layout = self.inner.layout();
        // SAFETY: `i < buckets` (every caller masks it) and `field` is a
        // word of `Bucket`: inside the child table.
        unsafe {
            self.inner
                .word(layout.buckets_at + i as usize * size_of::<Bucket>() + field)
        }
    }
}

// SAFETY: every read goes to `Mapped`'s, at offsets inside the region
// (a bucket's word read from another bucket, or not at all).
unsafe impl TreeMem for Decoy {
    fn layout(&self) -> EngineLayout {
        self.inner.layout()
    }
    unsafe fn version(&self, at: usize) -> &Version {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.version(at) }
    }
    unsafe fn word(&self, at: usize) -> u32 {
        let layout = self.inner.layout();
        let size = size_of::<Bucket>();
        let table = layout.buckets_at..layout.buckets_at + layout.buckets as usize * size;
        if !table.contains(&at) {
            // SAFETY: forwarded from the caller.
            return unsafe { self.inner.word(at) };
        }
        let (i, field) = ((at - table.start) / size, (at - table.start) % size);
        let mask = layout.buckets - 1;
        let (home, i) = (self.hash & mask, i as u32);
        if i == home {
            return if field == offset_of!(Bucket, hash) {
                self.hash
            } else {
                self.node
            };
        }
        // Shifted if inside the cluster from `home` on (cyclically), up
        // to and including its first empty bucket.
        let mut j = home;
        while j != i && self.real(j, offset_of!(Bucket, node)) != NIL {
            j = (j + 1) & mask;
        }
        if j == i {
            self.real((i + mask) & mask, field)
        } else {
            self.real(i, field)
        }
    }
    unsafe fn same(&self, at: usize, key: &[u32]) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.same(at, key) }
    }
}

/// A child-table entry whose hash matches but whose node is not the
/// child (a collision) is passed over: a node of another parent holding
/// the same tokens, a child of the root in another namespace, a child of
/// the same parent whose first page differs (its pages a run). The probe
/// goes on to the real child, and the walk reads the whole key.
#[test]
fn a_colliding_entry_that_is_not_the_child_is_passed_over() {
    let mut e = engine_with(&[
        &[1, 2, 3, 4],
        &[1, 2, 9, 9],
        &[5, 6, 3, 4],
        &[5, 6, 8, 8],
        &[7, 7, 8, 8],
    ]);
    let ns = e.namespace("other").expect("namespace");
    e.with_namespace(ns, |e| {
        let pages = e.alloc(1, 2).expect("alloc");
        e.insert(1, &[1, 2, 5, 6], &pages, false).expect("insert");
    });
    let pages_of = |e: &mut Engine, ns: u32, key: &[u32]| {
        let mut pages = Vec::new();
        e.with_namespace(ns, |e| e.peek(key, &mut pages));
        pages
    };
    let key = [1, 2, 3, 4];
    let want = pages_of(&mut e, 0, &key);
    assert_eq!(want.len(), 2);
    let upper = node_of(&e, want[0]);
    let (elsewhere, other_ns, sibling) = (
        pages_of(&mut e, 0, &[5, 6, 3, 4])[1],
        pages_of(&mut e, ns, &[1, 2])[0],
        pages_of(&mut e, 0, &[7, 7])[0],
    );
    let [elsewhere, other_ns, sibling] = [elsewhere, other_ns, sibling].map(|p| node_of(&e, p));
    let first_page = e.arena.nodes()[sibling as usize].first_page;
    assert_eq!(
        e.arena.pages()[first_page as usize].owner_or_run,
        2,
        "a run"
    );
    for (parent, decoy, what) in [
        (upper, elsewhere, "a node of another parent"),
        (ROOT, other_ns, "a node of another namespace"),
        (ROOT, sibling, "a sibling whose first page differs"),
    ] {
        let page = if parent == ROOT { &key[..2] } else { &key[2..] };
        let r = Decoy::over(&e, child_hash(parent, 0, page), decoy);
        let mut pages = Vec::new();
        let peeked = r.peek_anchored(&key, &mut pages);
        assert_eq!(peeked.map(|p| p.len), Some(4), "{what}");
        assert_eq!(pages, want, "{what}");
    }
}

/// A node holding every page of the pool is read whole: a count of
/// exactly `capacity` pages is no torn copy.
#[test]
fn a_key_filling_the_pool_is_read() {
    let mut e = Engine::new(Config {
        page_size: 2,
        capacity: 8,
    })
    .expect("engine");
    let key: Vec<u32> = (1..=16).collect();
    let pages = e.alloc(1, 8).expect("alloc");
    e.insert(1, &key, &pages, false).expect("insert");
    let r = reader(&e);
    let mut out = Vec::new();
    assert_eq!(r.peek(&key, &mut out), Some(16));
    assert_eq!(out, pages);
}

/// A split leaves the upper half's pages with the runs they had in the
/// whole node (runs are set once, when the leaf is made), reaching into
/// the lower half: the walk reads a run only as far as its node goes, so
/// the match ends in the lower half, as its anchor says.
#[test]
fn a_run_is_read_only_to_the_end_of_its_node() {
    let mut e = Engine::new(Config {
        page_size: 2,
        capacity: 8,
    })
    .expect("engine");
    let key: Vec<u32> = (1..=8).collect();
    let pages = e.alloc(1, 4).expect("alloc");
    e.insert(1, &key, &pages, false).expect("insert");
    let branch = e.alloc(1, 3).expect("alloc");
    e.insert(1, &[1, 2, 3, 4, 9, 9], &branch, false)
        .expect("insert");
    let (upper, lower) = (node_of(&e, pages[0]), node_of(&e, pages[2]));
    assert_eq!(e.arena.nodes()[upper as usize].num_pages, 2, "split");
    assert_eq!(e.arena.pages()[pages[1] as usize].owner_or_run, 3);
    let r = reader(&e);
    let mut out = Vec::new();
    let peeked = r.peek_anchored(&key, &mut out).expect("peek");
    assert_eq!(peeked.len, 8);
    assert_eq!(out, pages);
    let anchor = peeked.anchor.expect("a match");
    assert_eq!((anchor.node, anchor.pages_into_node), (lower, 2));
}

/// A node whose pages are not one run (a page, a run of three, then a
/// page apart): each page is compared with its own tokens, after a run
/// too, and a page that differs past the first ends the match inside the
/// node.
#[test]
fn pages_after_a_run_and_apart_from_it_are_read_in_turn() {
    let mut e = Engine::new(Config {
        page_size: 2,
        capacity: 8,
    })
    .expect("engine");
    let owned = e.alloc(1, 7).expect("alloc");
    let pages = [owned[0], owned[1], owned[2], owned[3], owned[6]];
    let key: Vec<u32> = (1..=10).collect();
    e.insert(1, &key, &pages, false).expect("insert");
    let r = reader(&e);
    let mut out = Vec::new();
    assert_eq!(r.peek(&key, &mut out), Some(10));
    assert_eq!(out, pages);
    let mut other = key.clone();
    other[9] = 99;
    assert_eq!(r.peek(&other, &mut out), Some(8));
    assert_eq!(out, pages[..4]);
}

/// A node the walk stood on changes for good after it was copied, and
/// the probe below it misses: the miss is not trusted (the node may have
/// gained the child since), and the walk gives up after its budget.
#[test]
fn a_miss_below_a_node_that_changed_is_not_trusted() {
    let (e, _, _, upper, _) = two_branches();
    let r = Flaky::over(&e, upper, 1, u32::MAX);
    let mut pages = Vec::new();
    assert_eq!(r.peek(&[1, 2, 9, 9], &mut pages), None);
}

/// A node two levels down changes while the walk stands on it: the walk
/// steps back to its parent, still valid, not to the root (the parent is
/// copied once), drops the pages from there on, and reads the rest of
/// the key again from the parent once the change ends.
#[test]
fn a_walk_resumes_at_the_deepest_frame_still_valid() {
    let key = [1, 2, 3, 4, 5, 6];
    let e = engine_with(&[&key, &[1, 2, 7, 7], &[1, 2, 3, 4, 8, 8]]);
    let mut want = Vec::new();
    assert_eq!(e.peek(&key, &mut want), 6);
    let (upper, middle) = (node_of(&e, want[0]), node_of(&e, want[1]));
    assert_ne!(node_of(&e, want[2]), middle, "three levels");
    // The middle node's first load is its copy; the next two (the check
    // after its child's copy, the resume's) see it mid-change.
    let mut r = Flaky::over(&e, middle, 1, 2);
    r.mem.watch =
        e.layout().nodes_at + upper as usize * size_of::<Node>() + offset_of!(Node, state);
    let mut pages = Vec::new();
    assert_eq!(r.peek(&key, &mut pages), Some(6));
    assert_eq!(pages, want);
    assert_eq!(r.mem.loads.get(), 1, "the upper node copied once");
}
