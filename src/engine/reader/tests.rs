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
