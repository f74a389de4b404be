//! Anchored match and insert (`Engine::match_at`, `Engine::insert_at`):
//! from a reader's anchor they answer and change exactly what the full
//! request would (checked on a twin engine, LRU order included), and an
//! anchor the tree moved away from, or one no reader could have made,
//! changes nothing.

use radixd::engine::{Anchor, AnchorError, CacheEvent, Engine, Inserted, Matched, PageError};

mod common;

use common::{engine, ok, A, B};

const P: u32 = 2;

/// Two engines that see the same requests; each records its events.
fn twins() -> (Engine, Engine) {
    let (mut a, mut b) = (engine(P, 128), engine(P, 128));
    a.record_events(true);
    b.record_events(true);
    (a, b)
}

fn events(e: &mut Engine) -> Vec<CacheEvent> {
    let mut out = Vec::new();
    e.take_events(&mut out);
    out
}

/// Both engines hold the same tree, figures and LRU order: their recorded
/// events agree so far, and so do the pages evicted one by one, after this
/// (on clones of the state: eviction runs on both, so call it last).
fn drain_alike(a: &mut Engine, b: &mut Engine) {
    ok(a);
    ok(b);
    assert_eq!(events(a), events(b));
    assert_eq!(a.stats(), b.stats());
    assert_eq!(a.cached_runs(), b.cached_runs());
    loop {
        let (x, y) = (a.evict(1), b.evict(1));
        assert_eq!(x, y);
        assert_eq!(events(a), events(b), "LRU order differs");
        if x == 0 {
            break;
        }
    }
}

fn put(e: &mut Engine, client: u32, tokens: &[u32], lock: bool) -> Inserted {
    let pages = e
        .alloc(client, tokens.len() as u64 / u64::from(P))
        .expect("alloc");
    e.insert(client, tokens, &pages, lock).expect("insert")
}

/// Keys over a small alphabet, so that they share prefixes and split.
fn keys(seed: u64, n: usize) -> Vec<Vec<u32>> {
    let mut x = seed;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    (0..n)
        .map(|_| {
            let len = 1 + next() % 12;
            (0..len).map(|_| next() % 3).collect()
        })
        .collect()
}

/// The anchored match of `key` on `e`: `None` when nothing matched (the
/// client answers that itself).
fn match_anchored(e: &mut Engine, key: &[u32], lock: bool) -> Option<(Matched, Vec<u32>)> {
    let mut peeked = Vec::new();
    let p = e.peek_anchored(key, &mut peeked).expect("no writer races");
    let anchor = p.anchor?;
    let mut pages = Vec::new();
    let m = e
        .match_at(
            A,
            &anchor,
            p.len / P as usize,
            p.next_hash,
            lock,
            Some(&mut pages),
        )
        .expect("anchor holds");
    assert_eq!(pages, peeked, "the daemon's pages are the reader's");
    Some((m, pages))
}

#[test]
fn the_anchor_names_where_the_match_ended() {
    let mut e = engine(P, 16);
    put(&mut e, A, &[1, 1, 2, 2, 3, 3], false);
    let mut pages = Vec::new();
    let at = |e: &Engine, key: &[u32], pages: &mut Vec<u32>| e.peek_anchored(key, pages).unwrap();
    // Nothing matched: no anchor.
    let p = at(&e, &[9, 9, 1, 1], &mut pages);
    assert_eq!((p.len, p.anchor, p.next_hash), (0, None, None));
    // Inside the edge, the key ending there or going on: no hash needed.
    for key in [&[1, 1, 2, 2][..], &[1, 1, 2, 2, 9, 9, 9]] {
        let p = at(&e, key, &mut pages);
        let a = p.anchor.unwrap();
        assert_eq!((p.len, a.pages_into_node, p.next_hash), (4, 2, None));
        assert_eq!(a.version % 2, 0);
        assert_eq!(pages.len(), 2);
    }
    // The node whole, the key ending with it: no hash; going on: its hash.
    let p = at(&e, &[1, 1, 2, 2, 3, 3, 4], &mut pages);
    assert_eq!(
        (p.len, p.anchor.unwrap().pages_into_node, p.next_hash),
        (6, 3, None)
    );
    let p = at(&e, &[1, 1, 2, 2, 3, 3, 4, 4], &mut pages);
    assert_eq!((p.len, p.anchor.unwrap().pages_into_node), (6, 3));
    assert!(p.next_hash.is_some());
    // The anchor is the node a full match (without lock) hands out.
    let mut full = Vec::new();
    let m = e.match_prefix(A, &[1, 1, 2, 2, 3, 3], false, &mut full);
    let h = m.handle.unwrap();
    let a = at(&e, &[1, 1, 2, 2, 3, 3], &mut pages).anchor.unwrap();
    assert_eq!((a.node, a.generation), (h.index, h.generation));
    ok(&e);
}

#[test]
fn anchored_match_and_insert_equal_the_full_requests() {
    for seed in 0..20 {
        let (mut a, mut b) = twins();
        for (i, key) in keys(seed, 40).iter().enumerate() {
            let lock = i % 3 == 0;
            if i % 2 == 0 {
                let mut pages = Vec::new();
                let full = b.match_prefix(A, key, lock, &mut pages);
                match match_anchored(&mut a, key, lock) {
                    Some((m, got)) => assert_eq!((m, got), (full, pages), "{key:?}"),
                    None => assert_eq!((full.len, full.handle), (0, None), "{key:?}"),
                }
            } else {
                let n = key.len() as u64 / u64::from(P);
                let pages = a.alloc(A, n).expect("alloc");
                assert_eq!(b.alloc(A, n).expect("alloc"), pages);
                let full = b.insert(A, key, &pages, lock);
                let mut peeked = Vec::new();
                let p = a.peek_anchored(key, &mut peeked).expect("read");
                let got = match p.anchor {
                    None => a.insert(A, key, &pages, lock),
                    Some(anchor) => {
                        let m = p.len / P as usize;
                        a.insert_at(A, &anchor, m, &key[p.len..], &pages, lock)
                            .map_err(|e| match e {
                                AnchorError::Page(e) => e,
                                e => panic!("{e}"),
                            })
                    }
                };
                assert_eq!(got, full, "{key:?}");
            }
            ok(&a);
            assert_eq!(events(&mut a), events(&mut b));
            assert_eq!(a.stats(), b.stats());
        }
        drain_alike(&mut a, &mut b);
    }
}

#[test]
fn insert_at_compares_prefix_pages_like_insert() {
    let (mut a, mut b) = twins();
    let key = [1, 2, 3, 4, 5, 6, 7, 8];
    for e in [&mut a, &mut b] {
        put(e, A, &key, false);
    }
    let longer = [1, 2, 3, 4, 5, 6, 7, 8, 9, 9];
    let mut peeked = Vec::new();
    let p = a.peek_anchored(&longer, &mut peeked).unwrap();
    let anchor = p.anchor.unwrap();
    assert_eq!(p.len, 8);
    // Duplicates for the cached prefix (the caller owns them) go back to
    // the pool; a page the caller does not own is refused, nothing changed.
    for e in [&mut a, &mut b] {
        e.alloc(A, 5).unwrap();
    }
    let dup: Vec<u32> = (4..9).collect();
    let theirs = vec![peeked[0], 100, peeked[2], peeked[3], 8];
    let got = a.insert_at(A, &anchor, 4, &longer[8..], &theirs, false);
    let want = b.insert(A, &longer, &theirs, false);
    assert_eq!(got, Err(AnchorError::Page(want.unwrap_err())));
    assert_eq!(a.stats(), b.stats());
    let got = a.insert_at(A, &anchor, 4, &longer[8..], &[1, 2, 3], false);
    assert_eq!(
        got,
        Err(AnchorError::Page(PageError::CountMismatch {
            expected: 5,
            got: 3
        }))
    );
    let got = a
        .insert_at(A, &anchor, 4, &longer[8..], &dup, true)
        .unwrap();
    assert_eq!(got, b.insert(A, &longer, &dup, true).unwrap());
    assert_eq!((got.cached, got.len), (8, 10));
    drain_alike(&mut a, &mut b);
}

/// Peeks `key` on `e`, lets `change` run, and checks that the stale anchor
/// is refused as `Moved` by both operations with nothing changed.
fn moved_after(setup: &[&[u32]], key: &[u32], change: impl FnOnce(&mut Engine)) {
    let mut e = engine(P, 16);
    e.record_events(true);
    for k in setup {
        put(&mut e, A, k, false);
    }
    let mut peeked = Vec::new();
    let p = e.peek_anchored(key, &mut peeked).unwrap();
    let anchor = p.anchor.expect("something matched");
    change(&mut e);
    ok(&e);
    events(&mut e);
    let before = (e.stats(), e.cached_runs());
    let m = p.len / P as usize;
    let got = e.match_at(A, &anchor, m, p.next_hash, true, None);
    assert_eq!(got, Err(AnchorError::Moved), "match_at {key:?}");
    let pages = e.alloc(B, (key.len() / P as usize) as u64).unwrap();
    let before_insert = (e.stats(), e.cached_runs());
    let got = e.insert_at(B, &anchor, m, &key[p.len..], &pages, true);
    ok(&e);
    if got != Err(AnchorError::Moved) {
        // Insert walks on below an unchanged anchor: then it must have been
        // a child added there, and the answer is the full insert's.
        assert!(p.next_hash.is_some(), "insert_at took {anchor:?}: {got:?}");
        return;
    }
    assert_eq!(before_insert, (e.stats(), e.cached_runs()));
    e.free(B, &pages).unwrap();
    assert_eq!(before, (e.stats(), e.cached_runs()));
    assert_eq!(events(&mut e), vec![]);
    ok(&e);
}

#[test]
fn a_tree_that_moved_under_the_anchor_changes_nothing() {
    let abcd: &[u32] = &[1, 1, 2, 2, 3, 3, 4, 4];
    // The node is split (a key diverging inside it).
    moved_after(&[abcd], &[1, 1, 2, 2, 9, 9], |e| {
        put(e, B, &[1, 1, 2, 2, 3, 3, 7, 7], false);
    });
    // ...or split where the match ended.
    moved_after(&[abcd], &[1, 1, 2, 2, 9, 9], |e| {
        let mut pages = Vec::new();
        e.match_prefix(B, &[1, 1, 2, 2], false, &mut pages);
    });
    // It is evicted, in part or whole.
    moved_after(&[abcd], abcd, |e| assert_eq!(e.evict(2), 2));
    moved_after(&[abcd], abcd, |e| assert_eq!(e.evict(8), 8));
    // Its slot is reused by another prompt (same index, new generation).
    moved_after(&[abcd], abcd, |e| {
        e.evict(8);
        put(e, B, &[5, 5, 6, 6, 7, 7, 8, 8], false);
    });
    // A child that continues the key came below the node: its version did
    // not move, but the match would be longer now.
    moved_after(&[abcd], &[1, 1, 2, 2, 3, 3, 4, 4, 5, 5], |e| {
        put(e, B, &[1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6], false);
    });
    // Everything evicted and the cache reset.
    moved_after(&[abcd], abcd, |e| e.reset());
}

#[test]
fn a_child_added_elsewhere_keeps_the_anchor_and_insert_walks_on() {
    let (mut a, mut b) = twins();
    let base: &[u32] = &[1, 1, 2, 2];
    for e in [&mut a, &mut b] {
        put(e, A, base, false);
    }
    let key = [1, 1, 2, 2, 3, 3, 4, 4];
    let mut peeked = Vec::new();
    let p = a.peek_anchored(&key, &mut peeked).unwrap();
    let anchor = p.anchor.unwrap();
    // Siblings (other first pages) and the very continuation arrive.
    for e in [&mut a, &mut b] {
        put(e, B, &[1, 1, 2, 2, 8, 8], false);
        put(e, B, &[1, 1, 2, 2, 3, 3], false);
    }
    events(&mut a);
    events(&mut b);
    let pages = a.alloc(A, 4).unwrap();
    assert_eq!(b.alloc(A, 4).unwrap(), pages);
    let got = a.insert_at(A, &anchor, 2, &key[4..], &pages, true).unwrap();
    let want = b.insert(A, &key, &pages, true).unwrap();
    assert_eq!(got, want);
    assert_eq!(got.cached, 6);
    // A match whose next page is filed under no child still holds.
    let other = [1, 1, 2, 2, 5, 5];
    let p = a.peek_anchored(&other, &mut peeked).unwrap();
    for e in [&mut a, &mut b] {
        put(e, B, &[1, 1, 2, 2, 6, 6], false);
    }
    let m = a.match_at(A, &p.anchor.unwrap(), 2, p.next_hash, false, None);
    let mut pages = Vec::new();
    assert_eq!(m.unwrap(), b.match_prefix(A, &other, false, &mut pages));
    drain_alike(&mut a, &mut b);
}

#[test]
fn garbage_anchors_are_refused_and_change_nothing() {
    let mut e = engine(P, 16);
    put(&mut e, A, &[1, 1, 2, 2, 3, 3], true);
    let mut peeked = Vec::new();
    let key = [1, 1, 2, 2, 3, 3];
    let good = e.peek_anchored(&key, &mut peeked).unwrap().anchor.unwrap();
    assert_eq!(good.pages_into_node, 3);
    let bad = [
        (Anchor { node: 0, ..good }, 3),
        (Anchor { node: 17, ..good }, 3),
        (
            Anchor {
                node: u32::MAX,
                ..good
            },
            3,
        ),
        (
            Anchor {
                version: good.version + 1,
                ..good
            },
            3,
        ),
        (
            Anchor {
                version: good.version + 2,
                ..good
            },
            3,
        ),
        (
            Anchor {
                generation: good.generation + 1,
                ..good
            },
            3,
        ),
        (
            Anchor {
                pages_into_node: 0,
                ..good
            },
            0,
        ),
        (
            Anchor {
                pages_into_node: 4,
                ..good
            },
            4,
        ),
        (
            Anchor {
                pages_into_node: u32::MAX,
                ..good
            },
            3,
        ),
        (good, 2),
        (good, 4),
        (good, usize::MAX),
        // A free slot, generation 0.
        (
            Anchor {
                node: 5,
                generation: 0,
                ..good
            },
            3,
        ),
    ];
    let pages = e.alloc(A, 4).unwrap();
    let before = (e.stats(), e.cached_runs());
    for (anchor, m) in bad {
        let r = e.match_at(A, &anchor, m, Some(7), true, None);
        assert!(r.is_err(), "{anchor:?} {m}: {r:?}");
        let r = e.insert_at(A, &anchor, m, &[9, 9], &pages, true);
        assert!(
            matches!(r, Err(AnchorError::Moved | AnchorError::Invalid(_))),
            "{anchor:?} {m}: {r:?}"
        );
        assert_eq!(before, (e.stats(), e.cached_runs()));
        ok(&e);
    }
    // The good one still works, and locks.
    let m = e.match_at(A, &good, 3, None, true, None).unwrap();
    assert_eq!(m.len, 6);
    assert_eq!(e.stats().protected_tokens, 6);
    ok(&e);
}
