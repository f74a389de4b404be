//! The tree reader (`radixd::engine::TreeReader::peek_anchored`, the code
//! that ships) racing the real engine writer (`Engine::insert`, `evict`,
//! `alloc`: splits, trims, frees and reuse of the very node the reader
//! stands on), page size 1.
//!
//! The engine runs on a `MirroredRegion`: each of its plain stores becomes
//! a relaxed loom store between the same two version operations as the
//! store itself, and the reader reads through the mirror (see
//! `radixd::engine::mem`), so a missing fence or re-check shows.
//!
//! - `a_reader_notices_the_node_it_stands_on_was_reused`: root → X [1] on
//!   page 0. The writer evicts X (freed at once: no grace here; versions
//!   alone must keep the reader right), then inserts [5] (X's slot again,
//!   page 1) and [5, 2] (a child Y [2] on page 2 under the new X). A reader
//!   of [1, 2] that stood on the old X finds Y under the new X: only the
//!   parent's re-check tells. The answer must be [0] or [] (what [1, 2]
//!   mapped to at some instant), never [0, 2].
//! - `a_walk_survives_a_split_underfoot`: root → C [10, 11]. The writer
//!   inserts [10, 12]: C splits (M [10] takes its place, C [11] and D [12]
//!   below it), filing M and re-filing C in one change of the table. [10,
//!   11] maps to [0, 1] throughout: the longest prefix, never a shorter one.
//! - `a_child_copy_counts_only_once_validated`: root → C [7, 7]. The
//!   writer inserts [7, 8]: C splits, its lower half [7] (page 1) goes
//!   under the upper one. A copy of C mixing its old parent with its new
//!   first page reads [7] on page 1, which [7] never mapped to: only the
//!   re-check of C's version after the copy tells (the walk ends there).
//! - `a_miss_is_trusted_only_under_a_still_table`: root → A [1] with
//!   children D [d] and E [e] filed from one home bucket (D first). The
//!   writer evicts D: the backward shift moves E into D's bucket. A probe
//!   for E that read D's bucket before the shift and E's old one after it
//!   misses; only the table's version tells. [1, e] maps to [0, 2]
//!   throughout.
//!
//! Each model counts as on its path only the executions whose walk began
//! before the writer's first change and ended after its last (stage
//! witnesses, SeqCst, outside the protocol). Mutations tried: see
//! docs/modelcheck.md.
#![cfg(loom)]

use loom_tests::tree::{engine, peek, put, Reader, Stage};
use loom_tests::{explore, explore_bounded};

/// At most one preemption: the race needs one (the reader stopped after
/// copying X, before looking up X's child; the writer then runs to its
/// end), and every load still reads any store loom allows. At CI's bound of
/// two the writer's three operations take 1.09 million executions (109 s on
/// a 2-core VM); at one, 64 thousand, and removing the parent's re-check
/// fails it.
#[test]
fn a_reader_notices_the_node_it_stands_on_was_reused() {
    explore_bounded(
        "a_reader_notices_the_node_it_stands_on_was_reused",
        30_000,
        Some(1),
        || {
            let (mut e, r) = engine(3, 0);
            assert_eq!(put(&mut e, &[1], false), [0]);
            let stage = Stage::new();
            let writer = {
                let stage = stage.clone();
                loom::thread::spawn(move || {
                    assert_eq!(e.evict(1), 1);
                    // X's slot (freed, on top of the free stack) holds [5]
                    // on page 1, then the next slot [2] on page 2 under it.
                    assert_eq!(put(&mut e, &[5], false), [1]);
                    assert_eq!(put(&mut e, &[5, 2], false), [1, 2]);
                    stage.set(1);
                    e
                })
            };
            let before = stage.get();
            let got = peek(&r, &[1, 2]);
            let after = stage.get();
            if let Some(pages) = &got {
                assert!(
                    [&[0][..], &[]].contains(&pages.as_slice()),
                    "{pages:?}: [1, 2] never mapped to that"
                );
            }
            let e = writer.join().unwrap();
            assert_eq!(peek(&r, &[5, 2]), Some(vec![1, 2]));
            assert_eq!(peek(&r, &[1, 2]), Some(vec![]));
            drop(e);
            before == 0 && after == 1
        },
    );
}

#[test]
fn a_walk_survives_a_split_underfoot() {
    explore("a_walk_survives_a_split_underfoot", 6_000, || {
        let (mut e, r) = engine(3, 0);
        assert_eq!(put(&mut e, &[10, 11], false), [0, 1]);
        let stage = Stage::new();
        let writer = {
            let stage = stage.clone();
            loom::thread::spawn(move || {
                assert_eq!(put(&mut e, &[10, 12], false), [0, 2]);
                stage.set(1);
                e
            })
        };
        let before = stage.get();
        let got = peek(&r, &[10, 11]);
        let after = stage.get();
        if let Some(pages) = &got {
            assert_eq!(pages, &[0, 1], "[10, 11] was cached on [0, 1] throughout");
        }
        let e = writer.join().unwrap();
        assert_eq!(peek(&r, &[10, 11]), Some(vec![0, 1]));
        assert_eq!(peek(&r, &[10, 12]), Some(vec![0, 2]));
        drop(e);
        before == 0 && after == 1
    });
}

#[test]
fn a_child_copy_counts_only_once_validated() {
    explore("a_child_copy_counts_only_once_validated", 3_000, || {
        let (mut e, r) = engine(3, 0);
        assert_eq!(put(&mut e, &[7, 7], false), [0, 1]);
        let stage = Stage::new();
        let writer = {
            let stage = stage.clone();
            loom::thread::spawn(move || {
                assert_eq!(put(&mut e, &[7, 8], false), [0, 2]);
                stage.set(1);
                e
            })
        };
        let before = stage.get();
        let got = peek(&r, &[7]);
        let after = stage.get();
        if let Some(pages) = &got {
            assert_eq!(pages, &[0], "[7] was cached on page 0 throughout");
        }
        let e = writer.join().unwrap();
        assert_eq!(peek(&r, &[7, 7]), Some(vec![0, 1]));
        drop(e);
        before == 0 && after == 1
    });
}

/// Two first tokens whose child-table hashes under node 1 (A) share a
/// home bucket of the 8 an engine of capacity 3 has (found by a search
/// with `Peeked::next_hash`; the model checks it).
const D: u32 = 2;
const E: u32 = 6;

#[test]
fn a_miss_is_trusted_only_under_a_still_table() {
    explore("a_miss_is_trusted_only_under_a_still_table", 700, || {
        let (mut e, r) = engine(3, 0);
        assert_eq!(put(&mut e, &[1], false), [0]);
        assert_eq!(home(&r, D), home(&r, E), "D and E share a home bucket");
        assert_eq!(put(&mut e, &[1, D], false), [0, 1]);
        // Locked, E and A stay: the eviction takes D.
        assert_eq!(put(&mut e, &[1, E], true), [0, 2]);
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
        drop(e);
        before == 0 && after == 1
    });
}

/// The home bucket (of 8) a child of A (the node of [1]) whose first token
/// is `t` is filed from, read from the reader's answer while A has no such
/// child.
fn home(r: &Reader, t: u32) -> u32 {
    let mut pages = Vec::new();
    let peeked = r.peek_anchored(&[1, t], &mut pages).expect("peek");
    assert_eq!(peeked.len, 1, "A has no child starting with {t} yet");
    peeked
        .next_hash
        .expect("the hash A's child would be filed under")
        & 7
}
