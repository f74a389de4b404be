//! The tree reader (`TreeReader::peek_anchored`) racing the host tier's
//! demote and promote (`radixd::engine::host`), page size 1.
//!
//! A demote is, to a reader, the removal of a leaf whose slot stays taken:
//! the node leaves the child table and its pages go, inside its version,
//! while its record keeps its generation (the handle SGLang holds). A
//! promote files the same slot again with new pages. Neither may hand a
//! reader a page the prefix never mapped to.
//!
//! - `a_demote_underfoot_answers_the_old_prefix_or_the_shorter_one`: root
//!   → A [1] on page 0 → B [2] on page 1, both backed up. The writer
//!   evicts B: demoted (host-only), page 1 freed. Then it allocates page 1
//!   to a client and caches [7] on it, so a reader that trusted B's old
//!   record would hand out page 1 holding other KV. [1, 2] must read
//!   [0, 1] or [0].
//! - `a_promote_underfoot_answers_the_new_pages_or_the_shorter_prefix`: as
//!   above, B demoted before the race. The writer loads B back onto page 2.
//!   [1, 2] must read [0] or [0, 2], never B's old page 1.
//!
//! - `a_demote_keeps_a_sibling_found`: root → A [1] with children D [d]
//!   and E [e] filed from one home bucket (D first), D backed up. The
//!   writer evicts D: demoted, the backward shift moves E into D's bucket.
//!   [1, e] maps to [0, 2] throughout: only the table's version tells a
//!   probe that missed E in the shift.
//!
//! Each model counts as on its path only the executions whose walk began
//! before the writer's first change and ended after its last (stage
//! witnesses, SeqCst, outside the protocol). Mutations tried: see
//! docs/modelcheck.md.
#![cfg(loom)]

use std::sync::Arc as StdArc;

use loom_tests::explore;
use radixd::engine::{Engine, EngineLayout, Handle, Mirror, MirroredRegion, TreeReader};
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};

type Writer = Engine<MirroredRegion>;
type Reader = TreeReader<StdArc<Mirror>>;

/// An engine of 3 device pages and 2 host pages of one token holding
/// A [1] on page 0 and B [2] on page 1 under it, both backed up; B's
/// handle, and a reader of it.
fn backed_chain() -> (Writer, Reader, Handle) {
    let layout = EngineLayout::with_host(1, 3, 2).expect("layout");
    let (region, mirror) = MirroredRegion::new(layout).expect("region");
    let mut e = Engine::in_region(region, layout).expect("engine");
    let pages = e.alloc(1, 2).expect("alloc");
    assert_eq!(pages, [0, 1]);
    e.insert(1, &[1], &pages[..1], false).expect("insert A");
    let b = e.insert(1, &[1, 2], &pages, false).expect("insert B");
    let b = b.node.expect("B");
    for (i, node) in e
        .backup_chain(b.to_raw())
        .expect("chain")
        .into_iter()
        .enumerate()
    {
        e.backup(node.to_raw(), &[i as u32]).expect("backup");
    }
    (e, TreeReader::over(mirror), b)
}

/// The reader's answer for `key` (`None`: gave up), as a list of pages.
fn peek(r: &Reader, key: &[u32]) -> Option<Vec<u32>> {
    let mut pages = Vec::new();
    let peeked = r.peek_anchored(key, &mut pages)?;
    assert_eq!(peeked.len, pages.len(), "one page per matched token");
    Some(pages)
}

/// Where the writer is: 0 before its first change, 1 after its last.
/// SeqCst: a witness outside the protocol.
struct Stage(AtomicU32);

impl Stage {
    fn new() -> Arc<Self> {
        Arc::new(Self(AtomicU32::new(0)))
    }
    fn set(&self, s: u32) {
        self.0.store(s, Ordering::SeqCst);
    }
    fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn a_demote_underfoot_answers_the_old_prefix_or_the_shorter_one() {
    explore(
        "a_demote_underfoot_answers_the_old_prefix_or_the_shorter_one",
        16_000,
        || {
            let (mut e, r, b) = backed_chain();
            let stage = Stage::new();
            let writer = {
                let stage = stage.clone();
                loom::thread::spawn(move || {
                    assert_eq!(e.evict(1), 1);
                    // Page 1 goes to other KV at once (no grace here:
                    // versions alone must keep the reader right).
                    let pages = e.alloc(1, 2).expect("alloc");
                    assert_eq!(pages, [2, 1]);
                    e.insert(1, &[7], &pages[1..], false).expect("insert");
                    stage.set(1);
                    e
                })
            };
            let before = stage.get();
            let got = peek(&r, &[1, 2]);
            let after = stage.get();
            if let Some(pages) = &got {
                assert!(
                    [&[0, 1][..], &[0]].contains(&pages.as_slice()),
                    "{pages:?}: [1, 2] never mapped to that"
                );
            }
            let e = writer.join().unwrap();
            assert_eq!(peek(&r, &[1, 2]), Some(vec![0]));
            let node = e.host_node(b.to_raw()).expect("B's handle stays good");
            assert!(node.host_only());
            drop(e);
            before == 0 && after == 1
        },
    );
}

#[test]
fn a_promote_underfoot_answers_the_new_pages_or_the_shorter_prefix() {
    explore(
        "a_promote_underfoot_answers_the_new_pages_or_the_shorter_prefix",
        300,
        || {
            let (mut e, r, b) = backed_chain();
            assert_eq!(e.evict(1), 1);
            let pages = e.alloc(1, 1).expect("alloc");
            assert_eq!(pages, [2]);
            let stage = Stage::new();
            let writer = {
                let stage = stage.clone();
                loom::thread::spawn(move || {
                    assert_eq!(e.load_back(1, b.to_raw(), &pages), Ok(1));
                    stage.set(1);
                    e
                })
            };
            let before = stage.get();
            let got = peek(&r, &[1, 2]);
            let after = stage.get();
            if let Some(pages) = &got {
                assert!(
                    [&[0, 2][..], &[0]].contains(&pages.as_slice()),
                    "{pages:?}: [1, 2] never mapped to that"
                );
            }
            let e = writer.join().unwrap();
            assert_eq!(peek(&r, &[1, 2]), Some(vec![0, 2]));
            drop(e);
            before == 0 && after == 1
        },
    );
}

/// Two first tokens whose child-table hashes under node 1 (A) share a home
/// bucket of the 8 an engine of 3 device pages has (as in `walk.rs`: the
/// host tier adds node slots, not buckets).
const D: u32 = 2;
const E: u32 = 6;

#[test]
fn a_demote_keeps_a_sibling_found() {
    explore("a_demote_keeps_a_sibling_found", 700, || {
        let layout = EngineLayout::with_host(1, 3, 2).expect("layout");
        let (region, mirror) = MirroredRegion::new(layout).expect("region");
        let mut e = Engine::in_region(region, layout).expect("engine");
        let r = TreeReader::over(mirror);
        let pages = e.alloc(1, 3).expect("alloc");
        let a = e.insert(1, &[1], &pages[..1], false).expect("A").node;
        let d = e.insert(1, &[1, D], &pages[..2], false).expect("D").node;
        // Locked, E and A stay: the eviction takes D.
        e.insert(1, &[1, E], &[pages[0], pages[2]], true)
            .expect("E");
        for (node, host) in [(a, 0), (d, 1)] {
            let node = node.expect("node").to_raw();
            e.backup(node, &[host]).expect("backup");
        }
        let stage = Stage::new();
        let writer = {
            let stage = stage.clone();
            loom::thread::spawn(move || {
                assert_eq!(e.evict(1), 1);
                stage.set(1);
                e
            })
        };
        let before = stage.get();
        let got = peek(&r, &[1, E]);
        let after = stage.get();
        if let Some(pages) = &got {
            assert_eq!(pages, &[0, 2], "[1, E] was cached on [0, 2] throughout");
        }
        let e = writer.join().unwrap();
        assert_eq!(peek(&r, &[1, E]), Some(vec![0, 2]));
        assert_eq!(peek(&r, &[1, D]), Some(vec![0]));
        let d = d.expect("D").to_raw();
        assert!(e.host_node(d).expect("D stays").host_only());
        drop(e);
        before == 0 && after == 1
    });
}
