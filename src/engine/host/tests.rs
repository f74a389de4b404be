//! Unit tests of the host tier, over engines built on the heap.

use super::*;
use crate::engine::{Config, Engine, Handle, Policy};

pub(super) const P: u32 = 2;

pub(super) fn engine(capacity: u32, host: u32) -> Engine {
    Engine::with_host(
        Config {
            page_size: P,
            capacity,
        },
        host,
    )
    .expect("engine")
}

pub(super) fn engine_under(policy: Policy, capacity: u32, host: u32) -> Engine {
    let mut e = engine(capacity, host);
    e.set_policy(policy);
    e
}

pub(super) fn insert(e: &mut Engine, key: &[u32]) -> Handle {
    let pages = e.alloc(1, key.len() as u64 / u64::from(P)).expect("alloc");
    let ins = e.insert(1, key, &pages, false).expect("insert");
    e.validate().expect("valid after insert");
    ins.node.expect("a node")
}

/// Backs up the chain down to `h` from a host page counter.
pub(super) fn back_up(e: &mut Engine, h: Handle, next: &mut u32) {
    for node in e.backup_chain(h.to_raw()).expect("chain") {
        let n = e.host_node(node.to_raw()).expect("node").device_pages;
        let pages: Vec<u32> = (*next..*next + n).collect();
        *next += n;
        e.backup(node.to_raw(), &pages).expect("backup");
        e.validate().expect("valid after backup");
    }
}

pub(super) fn match_host(e: &mut Engine, key: &[u32]) -> (HostMatched, Vec<u32>, Vec<u32>) {
    let (mut pages, mut host) = (Vec::new(), Vec::new());
    let m = e.match_host(key, &mut pages, &mut host);
    e.validate().expect("valid after match");
    (m, pages, host)
}

#[test]
fn a_demoted_node_keeps_its_handle_and_loads_back() {
    let mut e = engine(8, 16);
    let a = [1, 2, 3, 4, 5, 6];
    let h = insert(&mut e, &a);
    let mut next = 0;
    back_up(&mut e, h, &mut next);
    assert_eq!(e.host_node(h.to_raw()).expect("node").host_pages, [0, 1, 2]);
    assert_eq!(e.evict(6), 6);
    e.validate().expect("valid after demote");
    let mut pages = Vec::new();
    assert_eq!(e.peek(&a, &mut pages), 0, "the device tree lost it");
    let node = e.host_node(h.to_raw()).expect("the handle still names it");
    assert!(node.host_only() && node.backed());
    let (m, device, host) = match_host(&mut e, &a);
    assert_eq!(
        (m.device_len, m.host_len, m.device, m.best),
        (0, 6, None, Some(h))
    );
    assert!(device.is_empty());
    assert_eq!(host, [0, 1, 2]);
    assert_eq!(
        e.load_back_chain(h.to_raw()).expect("chain"),
        [(h, vec![0, 1, 2])]
    );
    let fresh = e.alloc(1, 3).expect("alloc");
    assert_eq!(e.load_back(1, h.to_raw(), &fresh), Ok(6));
    e.validate().expect("valid after load-back");
    assert_eq!(e.peek(&a, &mut pages), 6);
    assert_eq!(pages, fresh);
    let node = e.host_node(h.to_raw()).expect("node");
    assert_eq!((node.device_pages, node.host_pages), (3, vec![0, 1, 2]));
    assert_eq!(
        e.load_back(1, h.to_raw(), &[]),
        Err(HostError::NotHostOnly(h.to_raw()))
    );
}

#[test]
fn a_chain_loads_back_root_side_first() {
    let mut e = engine(8, 16);
    let top = insert(&mut e, &[1, 1, 2, 2]);
    let leaf = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    let mut next = 10;
    back_up(&mut e, leaf, &mut next);
    assert_eq!(e.host_node(top.to_raw()).expect("top").host_pages, [10, 11]);
    assert_eq!(e.host_node(leaf.to_raw()).expect("leaf").host_pages, [12]);
    assert_eq!(e.evict(100), 6);
    let (m, _, host) = match_host(&mut e, &[1, 1, 2, 2, 3, 3, 4, 4]);
    assert_eq!((m.host_len, m.best), (6, Some(leaf)));
    assert_eq!(host, [10, 11, 12]);
    let chain = e.load_back_chain(leaf.to_raw()).expect("chain");
    assert_eq!(chain, [(top, vec![10, 11]), (leaf, vec![12])]);
    // Too few pages, or pages the client does not own: nothing changes.
    let fresh = e.alloc(1, 3).expect("alloc");
    assert_eq!(
        e.load_back(1, leaf.to_raw(), &fresh[..2]),
        Err(HostError::CountMismatch {
            expected: 3,
            got: 2
        })
    );
    assert_eq!(
        e.load_back(2, leaf.to_raw(), &fresh),
        Err(HostError::Page(PageError::NotOwned { page: fresh[0] }))
    );
    e.validate().expect("unchanged");
    e.load_back(1, leaf.to_raw(), &fresh).expect("load back");
    let mut pages = Vec::new();
    assert_eq!(e.peek(&[1, 1, 2, 2, 3, 3], &mut pages), 6);
    assert_eq!(pages, fresh);
}

#[test]
fn backup_refuses_bad_requests_and_changes_nothing() {
    let mut plain = Engine::new(Config {
        page_size: P,
        capacity: 4,
    })
    .expect("engine");
    let pages = plain.alloc(1, 1).expect("alloc");
    let h = plain
        .insert(1, &[1, 1], &pages, false)
        .expect("insert")
        .node
        .expect("node");
    assert_eq!(plain.backup(h.to_raw(), &[0]), Err(HostError::NoHostTier));

    let mut e = engine(8, 4);
    let top = insert(&mut e, &[1, 1, 2, 2]);
    let leaf = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    let other = insert(&mut e, &[5, 5]);
    let raw = leaf.to_raw();
    assert_eq!(e.backup(raw, &[0]), Err(HostError::ParentNotBacked(raw)));
    let t = top.to_raw();
    assert_eq!(
        e.backup(t, &[0]),
        Err(HostError::CountMismatch {
            expected: 2,
            got: 1
        })
    );
    assert_eq!(
        e.backup(t, &[0, 4]),
        Err(HostError::OutOfRange {
            page: 4,
            capacity: 4
        })
    );
    assert_eq!(e.backup(t, &[1, 1]), Err(HostError::InUse { page: 1 }));
    e.backup(other.to_raw(), &[3]).expect("backup");
    assert_eq!(e.backup(t, &[3, 0]), Err(HostError::InUse { page: 3 }));
    assert_eq!(
        e.backup(other.to_raw(), &[0]),
        Err(HostError::AlreadyBacked(other.to_raw()))
    );
    assert_eq!(
        e.backup(u64::from(u32::MAX), &[0]),
        Err(HostError::Handle(HandleError::Unknown(u64::from(u32::MAX))))
    );
    e.validate().expect("unchanged");
    assert_eq!(
        e.host_stats(),
        Some(HostStats {
            capacity: 4,
            used: 1,
            host_only_nodes: 0
        })
    );
    e.backup(t, &[0, 1]).expect("backup");
    e.backup(raw, &[2]).expect("backup");
    e.validate().expect("valid");
}

#[test]
fn an_insert_over_a_host_only_node_adopts_its_own_pages() {
    let mut e = engine(8, 16);
    let a = [1, 2, 3, 4, 5, 6];
    let h = insert(&mut e, &a);
    back_up(&mut e, h, &mut 0);
    e.evict(6);
    let pages = e.alloc(1, 4).expect("alloc");
    let key = [1, 2, 3, 4, 5, 6, 7, 8];
    let ins = e.insert(1, &key, &pages, false).expect("insert");
    e.validate().expect("valid");
    // SGLang's prefix_len counts the span it un-evicted.
    assert_eq!((ins.cached, ins.len), (6, 8));
    assert_eq!(e.stats().owned_pages, 0, "every page adopted, none freed");
    let mut got = Vec::new();
    assert_eq!(e.peek(&key, &mut got), 8);
    assert_eq!(got, pages);
    let node = e.host_node(h.to_raw()).expect("same node");
    assert_eq!((node.device_pages, node.host_pages), (3, vec![0, 1, 2]));
    assert_eq!(e.host_stats().map(|s| s.host_only_nodes), Some(0));
}

#[test]
fn an_insert_ending_inside_a_host_only_node_splits_it() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    back_up(&mut e, h, &mut 0);
    e.evict(6);
    let pages = e.alloc(1, 3).expect("alloc");
    let ins = e
        .insert(1, &[1, 1, 2, 2, 9, 9], &pages, false)
        .expect("insert");
    e.validate().expect("valid");
    // The first two pages were host-only: adopted; the third is a new leaf.
    assert_eq!(ins.cached, 4);
    let (m, _, _) = match_host(&mut e, &[1, 1, 2, 2]);
    let up = m.device.expect("node");
    let upper = e.host_node(up.to_raw()).expect("upper");
    assert_eq!((upper.device_pages, upper.host_pages), (2, vec![0, 1]));
    let lower = e.host_node(h.to_raw()).expect("lower keeps the handle");
    assert_eq!((lower.device_pages, lower.host_pages), (0, vec![2]));
    let (m, device, host) = match_host(&mut e, &[1, 1, 2, 2, 3, 3]);
    assert_eq!((m.device_len, m.host_len, m.best), (4, 2, Some(h)));
    assert_eq!((device, host), (pages[..2].to_vec(), vec![2]));
}

#[test]
fn a_match_ending_inside_a_host_only_node_splits_it() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    back_up(&mut e, h, &mut 4);
    e.evict(6);
    let (m, _, host) = match_host(&mut e, &[1, 1, 2, 2, 7, 7]);
    assert_eq!((m.device_len, m.host_len), (0, 4));
    assert_eq!(host, [4, 5]);
    let best = m.best.expect("the upper half");
    assert_ne!(best, h);
    assert_eq!(
        e.host_node(best.to_raw()).expect("upper").host_pages,
        [4, 5]
    );
    assert_eq!(e.host_node(h.to_raw()).expect("lower").host_pages, [6]);
    assert_eq!(e.load_back_chain(h.to_raw()).expect("chain").len(), 2);
}

#[test]
fn a_split_of_a_backed_device_node_splits_its_copy() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    back_up(&mut e, h, &mut 0);
    let (m, device, host) = match_host(&mut e, &[1, 1, 2, 2]);
    assert_eq!(
        (m.device_len, m.host_len, device.len(), host.len()),
        (4, 0, 2, 0)
    );
    let up = m.device.expect("upper");
    assert_eq!(e.host_node(up.to_raw()).expect("upper").host_pages, [0, 1]);
    assert_eq!(e.host_node(h.to_raw()).expect("lower").host_pages, [2]);
}

#[test]
fn device_eviction_takes_a_backed_leaf_whole_and_an_unbacked_one_page_by_page() {
    let mut e = engine(8, 16);
    let backed = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    back_up(&mut e, backed, &mut 0);
    let plain = insert(&mut e, &[5, 5, 6, 6]);
    // The backed leaf is older: it goes whole though one page was asked.
    assert_eq!(e.evict(2), 6);
    assert!(e.host_node(backed.to_raw()).expect("node").host_only());
    assert_eq!(e.evict(2), 2);
    assert_eq!(e.host_node(plain.to_raw()).expect("node").device_pages, 1);
    e.validate().expect("valid");
    // An unbacked leaf that goes whole is gone.
    assert_eq!(e.evict(2), 2);
    assert_eq!(
        e.host_node(plain.to_raw()),
        Err(HostError::Handle(HandleError::Stale(plain.to_raw())))
    );
}

#[test]
fn host_eviction_takes_the_least_recently_used_host_leaf_whole() {
    let mut e = engine(8, 16);
    let a = insert(&mut e, &[1, 1, 2, 2]);
    let b = insert(&mut e, &[5, 5]);
    let mut next = 0;
    back_up(&mut e, a, &mut next);
    back_up(&mut e, b, &mut next);
    e.evict(100);
    // `a` is used again: `b` is the older host leaf now.
    match_host(&mut e, &[1, 1, 2, 2]);
    let mut freed = Vec::new();
    e.evict_host(1, &mut freed);
    e.validate().expect("valid");
    assert_eq!(freed, [2]);
    assert_eq!(
        e.host_node(b.to_raw()),
        Err(HostError::Handle(HandleError::Stale(b.to_raw())))
    );
    // A locked host-only node stays; unlocked, it goes whole.
    let lock = e.lock(1, a.to_raw()).expect("lock");
    e.evict_host(1, &mut freed);
    assert_eq!(freed, [2]);
    e.validate().expect("valid while locked");
    e.unlock(1, lock.to_raw()).expect("unlock");
    e.evict_host(1, &mut freed);
    assert_eq!(freed, [2, 0, 1]);
    assert_eq!(
        e.host_stats(),
        Some(HostStats {
            capacity: 16,
            used: 0,
            host_only_nodes: 0
        })
    );
    e.validate().expect("valid");
}

#[test]
fn host_eviction_orders_host_leaves_by_the_eviction_policy() {
    for (policy, first) in [
        (Policy::Lru, 5),
        (Policy::Fifo, 1),
        (Policy::Filo, 5),
        (Policy::Mru, 1),
    ] {
        let mut e = engine_under(policy, 8, 16);
        let a = insert(&mut e, &[1, 1]);
        let b = insert(&mut e, &[5, 5]);
        let mut next = 0;
        back_up(&mut e, a, &mut next);
        back_up(&mut e, b, &mut next);
        e.evict(100);
        // `a` was made first and used last.
        match_host(&mut e, &[1, 1]);
        let mut freed = Vec::new();
        e.evict_host(1, &mut freed);
        e.validate().expect("valid");
        let gone = if freed == [0] { 1 } else { 5 };
        assert_eq!(gone, first, "{policy:?} evicted the wrong host leaf first");
    }
}

#[test]
fn a_host_leaf_evicted_leaves_its_parent_the_next_host_leaf() {
    let mut e = engine(8, 16);
    let top = insert(&mut e, &[1, 1]);
    let leaf = insert(&mut e, &[1, 1, 2, 2]);
    back_up(&mut e, leaf, &mut 0);
    e.evict(100);
    let mut freed = Vec::new();
    e.evict_host(1, &mut freed);
    assert_eq!(freed, [1]);
    assert!(e.host_node(top.to_raw()).expect("top").host_only());
    e.evict_host(1, &mut freed);
    assert_eq!(freed, [1, 0]);
    e.validate().expect("valid");
}

#[test]
fn the_host_tier_is_full_attention_only_and_drop_cached_clears_it() {
    let mut e = engine(8, 16);
    let refused = e.set_components(
        crate::engine::Components::parse("full,swa", Some(4), None, None, 8).expect("swa"),
    );
    assert!(refused.is_err());
    let h = insert(&mut e, &[1, 1, 2, 2]);
    back_up(&mut e, h, &mut 0);
    e.drop_cached();
    e.validate().expect("valid");
    assert_eq!(
        e.host_stats().map(|s| (s.used, s.host_only_nodes)),
        Some((0, 0))
    );
}

#[test]
fn namespaces_keep_their_host_only_nodes_apart() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1, 2, 2]);
    back_up(&mut e, h, &mut 0);
    e.evict(100);
    let other = e.namespace("tenant-b").expect("namespace");
    e.with_namespace(other, |e| {
        let (m, _, host) = match_host(e, &[1, 1, 2, 2]);
        assert_eq!((m.host_len, m.best), (0, None));
        assert!(host.is_empty());
    });
    let (m, _, _) = match_host(&mut e, &[1, 1, 2, 2]);
    assert_eq!(m.host_len, 4);
}

fn digest(i: u8) -> Digest {
    [i; 32]
}

#[test]
fn a_host_lock_keeps_a_copy_and_its_release_covers_a_split_above() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    assert_eq!(
        e.host_lock(h.to_raw()),
        Ok(None),
        "no copy, nothing to keep"
    );
    back_up(&mut e, h, &mut 0);
    let receipt = e.host_lock(h.to_raw()).expect("lock").expect("a receipt");
    e.evict(100);
    // A match splits the locked node: the upper half is locked too.
    let (m, _, _) = match_host(&mut e, &[1, 1, 9, 9]);
    assert_eq!(m.host_len, 2);
    let mut freed = Vec::new();
    e.evict_host(100, &mut freed);
    assert!(freed.is_empty(), "locked copies stay");
    e.validate().expect("valid");
    e.host_unlock(receipt).expect("unlock");
    assert_eq!(
        e.host_unlock(receipt),
        Err(HostError::NotHostLocked(receipt))
    );
    e.validate().expect("valid");
    e.evict_host(100, &mut freed);
    assert_eq!(freed, [1, 2, 0]);
    assert_eq!(e.host_locks_held(), 0);
}

#[test]
fn digests_split_with_their_node_and_chain_from_the_hashed_ancestors() {
    let mut e = engine(8, 16);
    let top = insert(&mut e, &[1, 1, 2, 2]);
    let leaf = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    assert_eq!(e.unhashed(), Ok(vec![top, leaf]), "parents first");
    assert_eq!(
        e.set_digests(top.to_raw(), &[digest(1)]),
        Err(HostError::DigestCount {
            expected: 2,
            got: 1
        })
    );
    e.set_digests(top.to_raw(), &[digest(1), digest(2)])
        .expect("set");
    e.set_digests(leaf.to_raw(), &[digest(3)]).expect("set");
    assert_eq!(
        e.prefix_digests(leaf.to_raw()),
        Ok(vec![digest(1), digest(2)])
    );
    // A match splits `top`: each half keeps its pages' digests.
    let (m, _, _) = match_host(&mut e, &[1, 1, 7, 7]);
    let upper = m.device.expect("upper");
    assert_eq!(e.digests(upper.to_raw()), Ok(Some(vec![digest(1)])));
    assert_eq!(e.digests(top.to_raw()), Ok(Some(vec![digest(2)])));
    assert_eq!(
        e.prefix_digests(leaf.to_raw()),
        Ok(vec![digest(1), digest(2)])
    );
    // An ancestor never hashed ends the chain.
    let pages = e.alloc(1, 1).expect("alloc");
    let other = e
        .insert(1, &[4, 4], &pages, false)
        .expect("insert")
        .node
        .expect("node");
    let pages = e.alloc(1, 2).expect("alloc");
    let below = e.insert(
        1,
        &[4, 4, 5, 5],
        &[other_page(&e, &[4, 4]), pages[0]],
        false,
    );
    e.free(1, &pages[1..]).expect("free");
    let below = below.expect("insert").node.expect("node");
    assert_eq!(e.prefix_digests(below.to_raw()), Ok(vec![]));
    assert_eq!(e.unhashed(), Ok(vec![other, below]));
    e.validate().expect("valid");
}

fn other_page(e: &Engine, key: &[u32]) -> u32 {
    let mut pages = Vec::new();
    e.peek(key, &mut pages);
    pages[0]
}

#[test]
fn insert_host_refills_counts_backed_pages_and_hangs_the_rest() {
    let mut e = engine(8, 16);
    let top = insert(&mut e, &[1, 1, 2, 2]);
    let leaf = insert(&mut e, &[1, 1, 2, 2, 3, 3]);
    // `top` is backed up, `leaf` is not: a prefetch of the whole key from
    // the root counts top's pages, refills leaf, and files the rest.
    e.backup(top.to_raw(), &[0, 1]).expect("backup");
    let key = [1, 1, 2, 2, 3, 3, 4, 4];
    let d: Vec<Digest> = (1..=4).map(digest).collect();
    let got = e
        .insert_host(None, &key, &[10, 11, 12, 13], &d)
        .expect("insert_host");
    e.validate().expect("valid");
    assert_eq!((got.prefix_len, got.dropped), (4, false));
    let new = got.node.expect("a new host-only node");
    assert!(e.host_node(new.to_raw()).expect("new").host_only());
    assert_eq!(e.host_node(leaf.to_raw()).expect("leaf").host_pages, [12]);
    assert_eq!(e.digests(leaf.to_raw()), Ok(Some(vec![digest(3)])));
    assert_eq!(e.digests(new.to_raw()), Ok(Some(vec![digest(4)])));
    // Pages 10 and 11 (top's span) stay free: the caller frees them.
    let (m, device, host) = match_host(&mut e, &key);
    assert_eq!(
        (m.device_len, m.host_len, device.len(), host),
        (6, 2, 3, vec![13])
    );
    // All of it cached with copies: only the prefix counts, nothing new.
    let again = e
        .insert_host(None, &key, &[10, 11, 14, 15], &[])
        .expect("again");
    assert_eq!(
        (again.prefix_len, again.node, again.dropped),
        (8, Some(new), false)
    );
    // A page in use, out of range or named twice changes nothing.
    assert_eq!(
        e.insert_host(None, &[9, 9], &[12], &[]),
        Err(HostError::InUse { page: 12 })
    );
    assert_eq!(
        e.insert_host(None, &[9, 9, 8, 8], &[5, 5], &[]),
        Err(HostError::InUse { page: 5 })
    );
    assert_eq!(
        e.insert_host(None, &[9, 9], &[16], &[]),
        Err(HostError::OutOfRange {
            page: 16,
            capacity: 16
        })
    );
    e.validate().expect("unchanged");
}

#[test]
fn insert_host_below_a_node_without_a_copy_is_dropped() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1]);
    let got = e
        .insert_host(Some(h.to_raw()), &[2, 2], &[0], &[])
        .expect("insert_host");
    assert_eq!((got.prefix_len, got.node, got.dropped), (0, None, true));
    assert_eq!(e.host_stats().map(|s| s.used), Some(0));
    // Below a backed node it hangs, and splits a host-only node it meets.
    back_up(&mut e, h, &mut 0);
    let got = e
        .insert_host(Some(h.to_raw()), &[2, 2, 3, 3], &[5, 6], &[])
        .expect("insert_host");
    let lower = got.node.expect("node");
    let got = e
        .insert_host(Some(h.to_raw()), &[2, 2, 7, 7], &[8, 9], &[])
        .expect("insert_host");
    e.validate().expect("valid");
    assert_eq!(got.prefix_len, 2, "the split upper half had a copy");
    assert_eq!(e.host_node(lower.to_raw()).expect("lower").host_pages, [6]);
    let (m, _, host) = match_host(&mut e, &[1, 1, 2, 2, 7, 7]);
    assert_eq!((m.device_len, host), (2, vec![5, 9]));
}

#[test]
fn host_only_root_children_of_two_namespaces_may_share_a_first_page() {
    let mut e = engine(8, 16);
    let a = insert(&mut e, &[1, 1, 2, 2]);
    back_up(&mut e, a, &mut 0);
    let other = e.namespace("tenant-b").expect("namespace");
    let b = e.with_namespace(other, |e| insert(e, &[1, 1, 3, 3]));
    back_up(&mut e, b, &mut 10);
    assert_eq!(e.evict(100), 8);
    e.validate().expect("valid with both host-only");
}

#[test]
fn a_load_back_reports_its_pages_stored_in_the_nodes_namespace() {
    let mut e = engine(8, 16);
    let other = e.namespace("tenant-b").expect("namespace");
    let h = e.with_namespace(other, |e| insert(e, &[1, 1, 2, 2]));
    back_up(&mut e, h, &mut 0);
    e.evict(100);
    e.record_events(true);
    let mut events = Vec::new();
    e.take_events(&mut events);
    let fresh = e.alloc(1, 2).expect("alloc");
    // In the default namespace: the node's own is what counts.
    e.load_back(1, h.to_raw(), &fresh).expect("load back");
    events.clear();
    e.take_events(&mut events);
    let stored: Vec<u32> = events
        .iter()
        .filter_map(|x| match x {
            crate::engine::CacheEvent::Stored { ns, .. } => Some(*ns),
            _ => None,
        })
        .collect();
    assert_eq!(stored, [other]);
}

#[test]
fn insert_host_below_an_anchor_without_a_copy_refills_nothing() {
    let mut e = engine(8, 16);
    let whole = insert(&mut e, &[1, 1, 2, 2]);
    let (m, _, _) = match_host(&mut e, &[1, 1]);
    let upper = m.best.expect("upper");
    assert_ne!(upper, whole);
    let got = e
        .insert_host(Some(upper.to_raw()), &[2, 2], &[0], &[])
        .expect("insert_host");
    e.validate().expect("valid");
    assert_eq!((got.prefix_len, got.node, got.dropped), (0, None, true));
    assert_eq!(e.host_stats().map(|s| s.used), Some(0));
}

#[test]
fn drop_cached_releases_host_locks_and_empties_the_tier() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1, 2, 2]);
    back_up(&mut e, h, &mut 0);
    e.host_lock(h.to_raw()).expect("host lock");
    e.drop_cached();
    e.validate().expect("valid");
    assert_eq!(
        e.host_stats().map(|s| (s.used, s.host_only_nodes)),
        Some((0, 0))
    );
    assert_eq!(e.host_locks_held(), 0);
}

#[test]
fn a_page_by_page_eviction_trims_the_digests_too() {
    let mut e = engine(8, 16);
    let h = insert(&mut e, &[1, 1, 2, 2]);
    e.set_digests(h.to_raw(), &[digest(1), digest(2)])
        .expect("digests");
    assert_eq!(e.evict(2), 2, "one page of the unbacked leaf");
    e.validate().expect("valid");
    assert_eq!(e.digests(h.to_raw()), Ok(Some(vec![digest(1)])));
}
