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

use loom_tests::explore;
use loom_tests::tree::{engine, peek, Reader, Stage, Writer};
use radixd::engine::Handle;

/// An engine of 3 device pages and 2 host pages of one token holding
/// A [1] on page 0 and B [2] on page 1 under it, both backed up; B's
/// handle, and a reader of it.
fn backed_chain() -> (Writer, Reader, Handle) {
    let (mut e, r) = engine(3, 2);
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
    (e, r, b)
}

/// Runs `change` on the writer's own thread against a reader's peek of
/// `key`, whose answer (unless the reader gave up) must be one of
/// `allowed`. Returns the writer and whether the walk began before the
/// change and ended after it.
fn race(
    mut e: Writer,
    r: &Reader,
    key: &[u32],
    allowed: &[&[u32]],
    change: impl FnOnce(&mut Writer) + Send + 'static,
) -> (Writer, bool) {
    let stage = Stage::new();
    let writer = {
        let stage = stage.clone();
        loom::thread::spawn(move || {
            change(&mut e);
            stage.set(1);
            e
        })
    };
    let before = stage.get();
    let got = peek(r, key);
    let after = stage.get();
    if let Some(pages) = &got {
        assert!(
            allowed.contains(&pages.as_slice()),
            "{pages:?}: {key:?} never mapped to that"
        );
    }
    (writer.join().unwrap(), before == 0 && after == 1)
}

#[test]
fn a_demote_underfoot_answers_the_old_prefix_or_the_shorter_one() {
    explore(
        "a_demote_underfoot_answers_the_old_prefix_or_the_shorter_one",
        16_000,
        || {
            let (e, r, b) = backed_chain();
            let (e, on_path) = race(e, &r, &[1, 2], &[&[0, 1], &[0]], |e| {
                assert_eq!(e.evict(1), 1);
                // Page 1 goes to other KV at once (no grace here: versions
                // alone must keep the reader right).
                let pages = e.alloc(1, 2).expect("alloc");
                assert_eq!(pages, [2, 1]);
                e.insert(1, &[7], &pages[1..], false).expect("insert");
            });
            assert_eq!(peek(&r, &[1, 2]), Some(vec![0]));
            let node = e.host_node(b.to_raw()).expect("B's handle stays good");
            assert!(node.host_only());
            on_path
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
            let (_e, on_path) = race(e, &r, &[1, 2], &[&[0, 2], &[0]], move |e| {
                assert_eq!(e.load_back(1, b.to_raw(), &pages), Ok(1));
            });
            assert_eq!(peek(&r, &[1, 2]), Some(vec![0, 2]));
            on_path
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
        let (mut e, r) = engine(3, 2);
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
        let (e, on_path) = race(e, &r, &[1, E], &[&[0, 2]], |e| {
            assert_eq!(e.evict(1), 1);
        });
        assert_eq!(peek(&r, &[1, E]), Some(vec![0, 2]));
        assert_eq!(peek(&r, &[1, D]), Some(vec![0]));
        let d = d.expect("D").to_raw();
        assert!(e.host_node(d).expect("D stays").host_only());
        on_path
    });
}
