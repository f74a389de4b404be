//! The engine's semantics, rule by rule: keys cut to pages, insert
//! deduplication, match splitting, lock accounting, page-granular eviction,
//! every error path (each must change nothing), and the O(M + K) eviction
//! scan on the adversarial layouts of the SGLang proposal.

use radixd::engine::{Engine, HandleError, PageError, Recency, Stats};

mod common;

use common::{engine, ok, A, B};

fn matched(e: &Engine, tokens: &[u32]) -> (usize, Vec<u32>) {
    let mut pages = Vec::new();
    let len = e.peek(tokens, &mut pages);
    (len, pages)
}

/// Allocates and inserts `tokens`, returning the pages used.
fn put(e: &mut Engine, client: u32, tokens: &[u32]) -> Vec<u32> {
    let n = tokens.len() as u64 / u64::from(e.page_size());
    let pages = e.alloc(client, n).expect("alloc");
    e.insert(client, tokens, &pages, false).expect("insert");
    ok(e);
    pages
}

/// Everything an error must leave as it was.
fn snapshot(e: &Engine) -> (Stats, usize) {
    (e.stats(), e.sessions())
}

#[test]
fn keys_are_cut_to_whole_pages() {
    let mut e = engine(4, 8);
    let pages = e.alloc(A, 2).unwrap();
    // 10 tokens at P=4: 8 are cached, 2 ignored; exactly 2 page ids.
    let r = e
        .insert(A, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &pages, false)
        .unwrap();
    assert_eq!((r.cached, r.len, r.handle), (0, 8, None));
    ok(&e);
    assert_eq!(
        matched(&e, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
        (8, pages.clone())
    );
    assert_eq!(
        matched(&e, &[1, 2, 3, 4, 5, 6, 7]),
        (4, pages[..1].to_vec())
    );
    assert_eq!(matched(&e, &[1, 2, 3]), (0, vec![]));
    // A short key holds no page: nothing to insert, no handle even with lock.
    let r = e.insert(A, &[1, 2, 3], &[], true).unwrap();
    assert_eq!((r.cached, r.len, r.handle), (0, 0, None));
    assert_eq!(e.stats().total_tokens, 8);
    ok(&e);
}

#[test]
fn fresh_pool_hands_out_pages_in_order_and_fifo() {
    let mut e = engine(1, 4);
    assert_eq!(e.alloc(A, 2).unwrap(), vec![0, 1]);
    e.free(A, &[1, 0]).unwrap();
    // 2 and 3 were never handed out and come first; then the freed ones.
    assert_eq!(e.alloc(A, 4).unwrap(), vec![2, 3, 1, 0]);
    ok(&e);
}

#[test]
fn insert_deduplicates_the_cached_prefix() {
    let mut e = engine(2, 16);
    let first = put(&mut e, A, &[1, 2, 3, 4]);
    // Same pages again: nothing changes.
    let r = e.insert(A, &[1, 2, 3, 4], &first, false).unwrap();
    assert_eq!((r.cached, r.len), (4, 4));
    // Different pages for the cached prefix go back to the pool; the new
    // suffix keeps its page.
    let fresh = e.alloc(A, 3).unwrap();
    let before = e.stats();
    let r = e.insert(A, &[1, 2, 3, 4, 5, 6], &fresh, false).unwrap();
    assert_eq!((r.cached, r.len), (4, 6));
    ok(&e);
    let after = e.stats();
    assert_eq!(after.owned_pages, before.owned_pages - 3);
    assert_eq!(after.free_pages, before.free_pages + 2);
    assert_eq!(
        matched(&e, &[1, 2, 3, 4, 5, 6]).1,
        vec![first[0], first[1], fresh[2]]
    );
    // Mixing: the cached id at its own position is fine next to owned ones.
    let more = e.alloc(A, 1).unwrap();
    let r = e
        .insert(
            A,
            &[1, 2, 3, 4, 9, 9],
            &[first[0], first[1], more[0]],
            false,
        )
        .unwrap();
    assert_eq!((r.cached, r.len), (4, 6));
    ok(&e);
}

#[test]
fn match_splits_and_locks_exactly_the_matched_tokens() {
    let mut e = engine(1, 16);
    put(&mut e, A, &[1, 2, 3, 4, 5, 6]);
    assert_eq!(e.stats().nodes, 1);
    let mut pages = Vec::new();
    let m = e.match_prefix(A, &[1, 2, 3, 9], true, &mut pages);
    assert_eq!(m.len, 3);
    assert_eq!(pages.len(), 3);
    assert_eq!(e.stats().nodes, 2, "the edge was split at the match end");
    let s = e.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens), (3, 3));
    ok(&e);
    e.unlock(A, m.handle.unwrap().to_raw()).unwrap();
    let s = e.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens), (0, 6));
    // Nothing matched: no handle even with lock.
    let m = e.match_prefix(A, &[7, 7], true, &mut pages);
    assert_eq!((m.len, m.handle), (0, None));
    assert!(pages.is_empty());
    ok(&e);
}

#[test]
fn locks_count_every_holder_and_move_tokens_on_transitions() {
    let mut e = engine(1, 16);
    put(&mut e, A, &[1, 2, 3, 4]);
    let cached = matched(&e, &[1, 2, 3, 4]).1;
    let h = e
        .insert(A, &[1, 2, 3, 4], &cached, true)
        .unwrap()
        .handle
        .unwrap()
        .to_raw();
    e.lock(B, h).unwrap();
    let mut pages = Vec::new();
    let shallow = e
        .match_prefix(B, &[1, 2], true, &mut pages)
        .handle
        .unwrap()
        .to_raw();
    ok(&e);
    assert_eq!(e.stats().protected_tokens, 4);
    e.unlock(A, h).unwrap();
    assert_eq!(e.stats().protected_tokens, 4, "B still holds the deep node");
    e.unlock(B, h).unwrap();
    let s = e.stats();
    assert_eq!((s.protected_tokens, s.evictable_tokens), (2, 2));
    e.unlock(B, shallow).unwrap();
    assert_eq!(e.stats().protected_tokens, 0);
    ok(&e);
}

#[test]
fn eviction_is_page_granular_from_the_leaf_end() {
    let mut e = engine(16, 64);
    let tokens: Vec<u32> = (0..16 * 20).collect();
    put(&mut e, A, &tokens); // one leaf of 20 pages
                             // 17 tokens round up to 2 pages, taken from the leaf's end.
    assert_eq!(e.evict(17), 32);
    assert_eq!(matched(&e, &tokens).0, 18 * 16);
    assert_eq!(e.stats().evicted_pages, 2);
    ok(&e);
    // Asking for more than is evictable frees what there is.
    assert_eq!(e.evict(10_000), 18 * 16);
    assert_eq!(e.stats().nodes, 0);
    ok(&e);
}

#[test]
fn eviction_takes_the_least_recently_used_leaf_first() {
    let mut e = engine(1, 16);
    put(&mut e, A, &[1, 1, 1]);
    put(&mut e, A, &[2, 2, 2]);
    put(&mut e, A, &[3, 3, 3]);
    let mut pages = Vec::new();
    e.match_prefix(A, &[1, 1, 1], false, &mut pages); // [2,2,2] is now oldest
    assert_eq!(e.evict(3), 3);
    assert_eq!(matched(&e, &[2, 2, 2]).0, 0);
    assert_eq!(matched(&e, &[1, 1, 1]).0, 3);
    assert_eq!(matched(&e, &[3, 3, 3]).0, 3);
    ok(&e);
}

#[test]
fn an_unlocked_insert_names_its_node() {
    let mut e = engine(2, 8);
    let pages = e.alloc(A, 3).unwrap();
    let r = e.insert(A, &[1, 2, 3, 4], &pages[..2], false).unwrap();
    let node = r.node.expect("a key of whole pages names its node");
    // Named, not locked.
    assert_eq!((r.handle, e.stats().protected_tokens), (None, 0));
    let mut got = Vec::new();
    assert_eq!(
        e.match_prefix(A, &[1, 2, 3, 4], false, &mut got).handle,
        Some(node)
    );
    // A prefix of it splits it: the upper half is a new node, the key's
    // node keeps its handle (the lower half).
    let upper = e.insert(A, &[1, 2], &pages[..1], false).unwrap().node;
    assert!(upper.is_some() && upper != Some(node));
    e.lock(A, node.to_raw())
        .expect("still names the lower half");
    assert_eq!(e.stats().protected_tokens, 4);
    e.unlock(A, node.to_raw()).unwrap();
    // With a lock the lock's handle is answered, as before, and the node too.
    let r = e.insert(A, &[7, 7], &pages[2..], true).unwrap();
    assert_eq!(r.handle, r.node);
    e.unlock(A, r.handle.unwrap().to_raw()).unwrap();
    // A key of no whole page names nothing; a session's node is its own.
    assert_eq!(e.insert(A, &[5], &[], false).unwrap().node, None);
    let c = e.session_commit(A, "s", &[1, 2], &pages[..1]).unwrap();
    assert_eq!((c.handle, c.node), (None, None));
    ok(&e);
}

#[test]
fn evict_leaf_takes_the_oldest_leaf_whole_then_its_parent() {
    let mut e = engine(4, 16);
    put(&mut e, A, &[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    put(&mut e, A, &[1, 1, 1, 1, 5, 5, 5, 5]); // splits [1] off: leaves [2,3] and [5]
    put(&mut e, A, &[7, 7, 7, 7, 8, 8, 8, 8]);
    let mut pages = Vec::new();
    // Splits [2,3]: [2] is the handle; under exact recency [3] keeps the
    // first insert's stamp, so the oldest leaves are [3], [5], [7,8].
    let leaf = e
        .match_prefix(A, &[1, 1, 1, 1, 2, 2, 2, 2], false, &mut pages)
        .handle
        .expect("matched");
    let first = e.evict_leaf().expect("a leaf");
    assert_eq!(first.tokens, 4);
    assert_eq!(matched(&e, &[1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]).0, 8);
    let second = e.evict_leaf().expect("a leaf");
    assert_eq!(second.tokens, 4);
    assert_eq!(matched(&e, &[1, 1, 1, 1, 5, 5, 5, 5]).0, 4);
    // A leaf of two pages goes whole, never a page of it.
    let before = e.stats().total_tokens;
    let third = e.evict_leaf().expect("a leaf");
    assert_eq!((third.tokens, e.stats().total_tokens), (8, before - 8));
    assert_eq!(matched(&e, &[7, 7, 7, 7]).0, 0);
    // The evicted leaf's handle is stale; the one matched still names [2].
    assert!(matches!(
        e.lock(A, third.handle.to_raw()),
        Err(HandleError::Stale(_))
    ));
    e.lock(A, leaf.to_raw()).expect("live");
    // [2] locked and [1] inner: nothing is evictable.
    assert_eq!(e.evict_leaf(), None);
    ok(&e);
    e.unlock(A, leaf.to_raw()).unwrap();
    assert_eq!(e.evict_leaf().map(|l| l.handle), Some(leaf));
    assert_eq!(e.evict_leaf().map(|l| l.tokens), Some(4));
    assert_eq!(e.evict_leaf(), None);
    assert_eq!(e.stats().nodes, 0);
    ok(&e);
}

#[test]
fn a_split_leaves_its_lower_half_at_its_last_use() {
    // Exact recency (the default): the match [1,2] used only the upper
    // half; the lower half [3,4] is as old as the first insert, older than
    // [9,9], so it goes first.
    let mut e = engine(1, 16);
    assert_eq!(e.recency(), Recency::Exact);
    put(&mut e, A, &[1, 2, 3, 4]);
    put(&mut e, A, &[9, 9]);
    let mut pages = Vec::new();
    e.match_prefix(A, &[1, 2, 7], false, &mut pages);
    assert_eq!(e.evict(2), 2);
    assert_eq!(matched(&e, &[9, 9]).0, 2);
    assert_eq!(matched(&e, &[1, 2, 3, 4]).0, 2);
    // The same through an insert that splits.
    let mut e = engine(1, 16);
    put(&mut e, A, &[5, 6, 7, 8]);
    put(&mut e, A, &[8, 8]);
    put(&mut e, A, &[5, 6, 1]);
    assert_eq!(e.evict(2), 2);
    assert_eq!(matched(&e, &[8, 8]).0, 2);
    assert_eq!(matched(&e, &[5, 6, 7, 8]).0, 2);
    ok(&e);
}

#[test]
fn a_split_uses_its_lower_half_as_sglang_does() {
    // `Recency::Sglang`: SGLang's match touches the node it splits: the
    // lower half [3,4] is as new as the match, so the older prompt [9,9]
    // goes first.
    let sglang = || {
        let mut e = engine(1, 16);
        e.set_recency(Recency::Sglang);
        e
    };
    let mut e = sglang();
    put(&mut e, A, &[1, 2, 3, 4]);
    put(&mut e, A, &[9, 9]);
    let mut pages = Vec::new();
    e.match_prefix(A, &[1, 2, 7], false, &mut pages);
    assert_eq!(e.evict(2), 2);
    assert_eq!(matched(&e, &[9, 9]).0, 0);
    assert_eq!(matched(&e, &[1, 2, 3, 4]).0, 4);
    // The same through an insert that splits.
    let mut e = sglang();
    put(&mut e, A, &[5, 6, 7, 8]);
    put(&mut e, A, &[8, 8]);
    put(&mut e, A, &[5, 6, 1]);
    assert_eq!(e.evict(2), 2);
    assert_eq!(matched(&e, &[8, 8]).0, 0);
    assert_eq!(matched(&e, &[5, 6, 7, 8]).0, 4);
    // A reset keeps the rule.
    e.reset();
    assert_eq!(e.recency(), Recency::Sglang);
    ok(&e);
}

#[test]
fn recency_names_parse_and_print() {
    for r in Recency::ALL {
        assert_eq!(r.name().parse::<Recency>(), Ok(r));
        assert_eq!(r.to_string(), r.name());
    }
    let err = "lru".parse::<Recency>().unwrap_err();
    assert!(err.to_string().contains("exact or sglang"), "{err}");
}

#[test]
fn a_parent_left_childless_is_evicted_after_its_leaf() {
    let mut e = engine(1, 16);
    put(&mut e, A, &[1, 2, 3, 4]);
    put(&mut e, A, &[1, 2, 5, 6]); // splits: [1,2] -> {[3,4], [5,6]}
    assert_eq!(e.stats().nodes, 3);
    // Everything goes in one scan: both leaves, then the parent.
    assert_eq!(e.evict(6), 6);
    assert_eq!(e.stats().nodes, 0);
    assert_eq!(e.stats().evict_scanned, 3);
    ok(&e);
}

#[test]
fn alloc_evicts_exactly_the_shortfall() {
    let mut e = engine(2, 8);
    put(&mut e, A, &[1, 1, 2, 2, 3, 3]); // 3 pages cached, 5 free
    put(&mut e, A, &[4, 4, 5, 5]); // 2 more, 3 free
    let pages = e.alloc(B, 5).unwrap();
    assert_eq!(pages.len(), 5);
    let s = e.stats();
    assert_eq!((s.free_pages, s.evicted_pages, s.total_tokens), (0, 2, 6));
    ok(&e);
}

#[test]
fn alloc_beyond_free_and_evictable_fails_and_changes_nothing() {
    let mut e = engine(1, 8);
    put(&mut e, A, &[1, 2, 3]);
    let mut pages = Vec::new();
    e.match_prefix(A, &[1, 2, 3], true, &mut pages); // all 3 locked
    e.alloc(A, 2).unwrap();
    let before = snapshot(&e);
    assert_eq!(
        e.alloc(B, 4),
        Err(PageError::Insufficient {
            requested: 4,
            available: 3
        })
    );
    assert_eq!(snapshot(&e), before);
    ok(&e);
}

#[test]
fn page_errors_change_nothing() {
    let mut e = engine(2, 8);
    let cached = put(&mut e, A, &[1, 2, 3, 4]);
    let mine = e.alloc(A, 2).unwrap();
    let theirs = e.alloc(B, 1).unwrap();
    let before = snapshot(&e);
    let cases: Vec<(&str, PageError, Result<(), PageError>)> = vec![
        (
            "free out of range",
            PageError::OutOfRange {
                page: 8,
                capacity: 8,
            },
            e.free(A, &[mine[0], 8]),
        ),
        (
            "double free",
            PageError::NotOwned { page: mine[0] },
            e.free(A, &[mine[0], mine[0]]),
        ),
        (
            "free another's page",
            PageError::NotOwned { page: theirs[0] },
            e.free(A, &[theirs[0]]),
        ),
        (
            "free a cached page",
            PageError::NotOwned { page: cached[0] },
            e.free(A, &[cached[0]]),
        ),
        (
            "insert count mismatch",
            PageError::CountMismatch {
                expected: 2,
                got: 1,
            },
            e.insert(A, &[7, 7, 8, 8, 9], &mine[..1], false).map(drop),
        ),
        (
            "insert another's page",
            PageError::NotOwned { page: theirs[0] },
            e.insert(A, &[7, 7, 8, 8], &[mine[0], theirs[0]], false)
                .map(drop),
        ),
        (
            "insert another node's page",
            PageError::NotOwned { page: cached[1] },
            e.insert(A, &[7, 7, 8, 8], &[mine[0], cached[1]], false)
                .map(drop),
        ),
        (
            "insert a cached page at the wrong position",
            PageError::NotOwned { page: cached[1] },
            e.insert(A, &[1, 2, 8, 8], &[cached[1], mine[0]], false)
                .map(drop),
        ),
        (
            "insert a page twice",
            PageError::NotOwned { page: mine[0] },
            e.insert(A, &[7, 7, 8, 8], &[mine[0], mine[0]], false)
                .map(drop),
        ),
        (
            "insert out of range",
            PageError::OutOfRange {
                page: 100,
                capacity: 8,
            },
            e.insert(A, &[7, 7, 8, 8], &[mine[0], 100], false).map(drop),
        ),
    ];
    for (what, want, got) in cases {
        assert_eq!(got, Err(want), "{what}");
        assert_eq!(snapshot(&e), before, "{what} changed the state");
        ok(&e);
    }
    // And the pages involved are still usable afterwards.
    e.free(A, &mine).unwrap();
    e.free(B, &theirs).unwrap();
    ok(&e);
}

#[test]
fn handle_errors_change_nothing() {
    let mut e = engine(1, 8);
    put(&mut e, A, &[1, 2]);
    let mut pages = Vec::new();
    let h = e.match_prefix(A, &[1, 2], true, &mut pages).handle.unwrap();
    let raw = h.to_raw();
    let before = snapshot(&e);
    assert_eq!(e.unlock(B, raw), Err(HandleError::NotLocked(raw)));
    assert_eq!(
        e.lock(A, 0),
        Err(HandleError::Unknown(0)),
        "the root is no handle"
    );
    assert_eq!(
        e.lock(A, 1_000),
        Err(HandleError::Unknown(1_000)),
        "index out of range"
    );
    let future = (u64::from(h.generation) + 5) << 32 | u64::from(h.index);
    assert_eq!(e.lock(A, future), Err(HandleError::Unknown(future)));
    assert_eq!(snapshot(&e), before);
    // Evict the node: the handle goes stale, even once the slot is reused.
    e.unlock(A, raw).unwrap();
    assert_eq!(e.unlock(A, raw), Err(HandleError::NotLocked(raw)));
    e.evict(2);
    assert_eq!(e.lock(A, raw), Err(HandleError::Stale(raw)));
    put(&mut e, A, &[3, 4]);
    assert_eq!(e.lock(A, raw), Err(HandleError::Stale(raw)));
    assert_eq!(e.unlock(A, raw), Err(HandleError::Stale(raw)));
    ok(&e);
    // reset makes every handle stale.
    let h = e
        .match_prefix(A, &[3, 4], true, &mut pages)
        .handle
        .unwrap()
        .to_raw();
    e.reset();
    assert_eq!(e.lock(A, h), Err(HandleError::Stale(h)));
    ok(&e);
}

#[test]
fn a_split_keeps_the_lower_half_s_handle() {
    let mut e = engine(1, 8);
    let pages = e.alloc(A, 4).unwrap();
    let h = e
        .insert(A, &[1, 2, 3, 4], &pages, true)
        .unwrap()
        .handle
        .unwrap()
        .to_raw();
    let mut out = Vec::new();
    e.match_prefix(B, &[1, 2], false, &mut out); // splits [1,2] | [3,4]
    assert_eq!(e.stats().nodes, 2);
    assert_eq!(e.stats().protected_tokens, 4, "both halves stay locked");
    e.unlock(A, h).unwrap();
    assert_eq!(e.stats().protected_tokens, 0);
    ok(&e);
}

#[test]
fn release_client_drops_its_locks_and_pages_only() {
    let mut e = engine(1, 16);
    put(&mut e, A, &[1, 2, 3]);
    let mut pages = Vec::new();
    e.match_prefix(A, &[1, 2, 3], true, &mut pages);
    e.match_prefix(B, &[1, 2], true, &mut pages);
    e.alloc(A, 4).unwrap();
    let b_owned = e.alloc(B, 2).unwrap();
    e.release_client(A);
    ok(&e);
    let s = e.stats();
    assert_eq!((s.protected_tokens, s.owned_pages), (2, 2));
    e.free(B, &b_owned).unwrap();
    ok(&e);
}

/// Builds `m` unlocked leaves and `k` locked ones interleaved in LRU order
/// (a locked one after every `m / k` unlocked), all children of the root.
fn interleaved(m: u32, k: u32) -> Engine {
    let mut e = engine(1, 2 * (m + k));
    let mut out = Vec::new();
    let every = (m / k.max(1)).max(1);
    let (mut placed_m, mut placed_k) = (0, 0);
    while placed_m < m || placed_k < k {
        if placed_m < m {
            put(&mut e, A, &[placed_m, 0]);
            placed_m += 1;
        }
        if placed_k < k && (placed_m % every == 0 || placed_m == m) {
            let key = [1_000_000 + placed_k, 0];
            put(&mut e, A, &key);
            e.match_prefix(A, &key, true, &mut out);
            placed_k += 1;
        }
    }
    e
}

#[test]
fn eviction_past_skip_nodes_visits_each_once() {
    let (m, k) = (2_000, 500);
    let mut e = interleaved(m, k);
    assert_eq!(e.evict(u64::from(2 * m)), u64::from(2 * m));
    let scanned = e.stats().evict_scanned;
    // Every unlocked leaf once, every locked one at most once.
    assert!(
        scanned <= u64::from(m + k),
        "scanned {scanned} list nodes for M={m}, K={k}"
    );
    ok(&e);
}

#[test]
fn page_by_page_eviction_past_skip_nodes_stays_linear() {
    // Evicting one page per call restarts from the tail each call, so the
    // bound is per call; within one call a leaf's pages cost one visit.
    let (m, k) = (100, 400);
    let mut e = interleaved(m, k);
    let before = e.stats().evict_scanned;
    assert_eq!(e.evict(u64::from(2 * m)), u64::from(2 * m));
    assert!(e.stats().evict_scanned - before <= u64::from(m + k));
    ok(&e);
}

#[test]
fn chains_are_evicted_leaf_first_in_one_pass() {
    // N chains of depth D, each level its own node (inserted as growing
    // prefixes), each chain touched after it was built.
    let (n, d) = (200u32, 20u32);
    let mut e = engine(1, n * d + 1);
    for c in 0..n {
        for depth in 1..=d {
            let key: Vec<u32> = (0..depth).map(|i| c * 1000 + i).collect();
            let have = matched(&e, &key).1;
            let mut pages = have.clone();
            pages.extend(e.alloc(A, 1).unwrap());
            e.insert(A, &key, &pages, false).unwrap();
        }
    }
    ok(&e);
    assert_eq!(e.stats().nodes, u64::from(n * d));
    assert_eq!(e.evict(u64::from(n * d)), u64::from(n * d));
    // Each node is met exactly once: leaves before their ancestors.
    assert_eq!(e.stats().evict_scanned, u64::from(n * d));
    ok(&e);
}

#[test]
fn a_tree_reader_sees_what_the_engine_sees() {
    use radixd::engine::{Region, TreeReader};
    let mut e = engine(2, 64);
    put(&mut e, A, &[1, 2, 3, 4, 5, 6]);
    put(&mut e, A, &[1, 2, 3, 4, 9, 9]);
    put(&mut e, A, &[7, 7]);
    let base = std::ptr::NonNull::new(e.region().as_ptr()).unwrap();
    // SAFETY: the engine's own heap region, alive and unchanged while read.
    let reader = unsafe { TreeReader::new(base, e.layout()) };
    for key in [
        &[1, 2, 3, 4, 5, 6, 8][..],
        &[1, 2, 3, 4, 9],
        &[1, 2, 3],
        &[7, 7, 7],
        &[8],
        &[],
    ] {
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        let len = reader.peek(key, &mut theirs);
        assert_eq!(len, Some(e.peek(key, &mut mine)), "{key:?}");
        assert_eq!(theirs, mine, "{key:?}");
    }
}

/// A grace period driven by the test: `pinned` is the epoch a pretend
/// reader announced (crossbeam's rule: it blocks advancing past it + 1).
#[derive(Default)]
struct FakeClock {
    epoch: u64,
    pinned: Option<u64>,
}

#[derive(Clone, Default)]
struct FakeGrace(std::sync::Arc<std::sync::Mutex<FakeClock>>);

impl FakeGrace {
    fn clock(&self) -> std::sync::MutexGuard<'_, FakeClock> {
        self.0.lock().expect("fake clock")
    }
    fn pin(&self) {
        let mut c = self.clock();
        c.pinned = Some(c.epoch);
    }
    fn unpin(&self) {
        self.clock().pinned = None;
    }
    fn epoch_now(&self) -> u64 {
        self.clock().epoch
    }
}

impl radixd::engine::Grace for FakeGrace {
    fn epoch(&self) -> u64 {
        self.clock().epoch
    }
    fn try_advance(&mut self) -> bool {
        let mut c = self.clock();
        if c.pinned.is_some_and(|p| p != c.epoch) {
            return false;
        }
        c.epoch += 1;
        true
    }
    fn reusable(&self, tag: u64) -> bool {
        self.clock().epoch >= tag + 2
    }
}

#[test]
fn evicted_pages_come_back_only_after_the_grace_period() {
    let mut e = engine(2, 8);
    let g = FakeGrace::default();
    e.set_grace(Box::new(g.clone()));
    let first = put(&mut e, A, &[1, 2, 3, 4, 5, 6, 7, 8]);
    put(&mut e, A, &[9, 9, 9, 9, 9, 9, 9, 9]);
    assert_eq!(e.stats().free_pages, 0);
    g.pin();
    // Evicting the older prompt puts its pages and node in limbo.
    assert_eq!(e.evict(8), 8);
    ok(&e);
    assert_eq!(e.in_limbo(), (4, 1));
    assert_eq!(e.stats().free_pages, 0, "limbo pages are not free");
    assert_eq!(e.stats().nodes, 1);
    assert_eq!(e.reclaim(), 0, "the reader still holds them");
    // The pages are still held: an alloc that needs them fails cleanly,
    // saying so, and evicts nothing more (what waits in limbo is on its
    // way back).
    let before = snapshot(&e);
    assert!(matches!(
        e.alloc(B, 2),
        Err(PageError::HeldByReaders {
            requested: 2,
            free: 0,
            held: 4
        })
    ));
    ok(&e);
    assert_eq!(snapshot(&e), before);
    assert_eq!(e.in_limbo(), (4, 1));
    // Needing more than limbo holds evicts only the rest (two pages of the
    // other prompt), which wait like the others.
    assert!(matches!(
        e.alloc(B, 6),
        Err(PageError::HeldByReaders { .. })
    ));
    assert_eq!(e.in_limbo(), (6, 1));
    g.unpin();
    assert_eq!(e.reclaim(), 6 + 1);
    assert_eq!(e.stats().evicted_pages, 6);
    assert_eq!(e.in_limbo(), (0, 0));
    assert_eq!(e.stats().free_pages, 6);
    ok(&e);
    // FIFO as ever: the pages evicted first come back first.
    assert_eq!(e.alloc(B, 4).unwrap(), {
        let mut back = first.clone();
        back.reverse(); // evicted from the leaf's end
        back
    });
    ok(&e);
}

/// Records retired at two epochs wait in two batches: the later one is
/// not reused with the earlier (found by cargo-mutants: `Retirement::current`
/// appending to the batch of an older epoch survived every other test).
#[test]
fn records_retired_at_two_epochs_come_back_one_epoch_apart() {
    let mut e = engine(2, 8);
    let g = FakeGrace::default();
    e.set_grace(Box::new(g.clone()));
    put(&mut e, A, &[1, 2, 3, 4, 5, 6, 7, 8]);
    put(&mut e, A, &[9, 9, 9, 9, 9, 9, 9, 9]);
    // A reader pinned at t: the eviction's reclaim advances to t + 1 and
    // retires the page there.
    let t = g.epoch_now();
    g.pin();
    assert_eq!(e.evict(2), 2);
    assert_eq!(g.epoch_now(), t + 1);
    // Pinned again at t + 1: the next eviction retires its page at t + 2.
    g.unpin();
    g.pin();
    assert_eq!(e.evict(2), 2);
    assert_eq!(g.epoch_now(), t + 2);
    assert_eq!(e.in_limbo().0, 2);
    // Pinned at t + 2: epoch t + 3 makes the first page reusable, not the
    // second.
    g.unpin();
    g.pin();
    assert_eq!(e.reclaim(), 1);
    assert_eq!(g.epoch_now(), t + 3);
    assert_eq!(
        e.in_limbo().0,
        1,
        "the page retired at t + 2 waits for t + 4"
    );
    g.unpin();
    assert_eq!(e.reclaim(), 1);
    assert_eq!(e.in_limbo(), (0, 0));
    ok(&e);
}

#[test]
fn limbo_has_no_capacity_and_a_held_alloc_evicts_its_shortfall_once() {
    let mut e = engine(2, 8);
    let g = FakeGrace::default();
    e.set_grace(Box::new(g.clone()));
    put(&mut e, A, &[1, 2, 3, 4, 5, 6, 7, 8]);
    put(&mut e, A, &[9, 9, 9, 9, 9, 9, 9, 9]);
    g.pin();
    // Two pages of the older prompt go to limbo; the reader holds them.
    assert!(matches!(
        e.alloc(B, 2),
        Err(PageError::HeldByReaders {
            requested: 2,
            free: 0,
            held: 2
        })
    ));
    ok(&e);
    assert_eq!((e.in_limbo(), e.stats().evicted_pages), ((2, 0), 2));
    // Retries (as the daemon's, while it waits for the reader) evict
    // nothing more.
    for _ in 0..3 {
        assert!(e.alloc(B, 2).is_err());
        assert_eq!((e.in_limbo(), e.stats().evicted_pages), ((2, 0), 2));
    }
    g.unpin();
    assert_eq!(e.alloc(B, 2).unwrap().len(), 2);
    assert_eq!(e.stats().evicted_pages, 2);
    ok(&e);
    // With a reader in the way, everything evictable can wait in limbo.
    g.pin();
    assert_eq!(e.evict(100), 12);
    assert_eq!(e.in_limbo(), (6, 2));
    ok(&e);
    g.unpin();
    e.reclaim();
    assert_eq!(e.stats().free_pages, 6);
    ok(&e);
}

#[test]
fn with_no_readers_a_grace_changes_no_answer() {
    // The same random workload on an engine without a grace and one with a
    // grace no reader holds: every answer and figure is identical.
    let mut plain = engine(2, 24);
    let mut graced = engine(2, 24);
    graced.set_grace(Box::new(FakeGrace::default()));
    let mut seed = 0x9e37_79b9_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..3000 {
        let len = 2 * (1 + next(6) as usize);
        let key: Vec<u32> = (0..len).map(|_| next(3) as u32).collect();
        let client = 1 + next(2) as u32;
        match next(4) {
            0 => {
                let n = next(5);
                assert_eq!(plain.evict(n), graced.evict(n), "step {step}");
            }
            1 => {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let ma = plain.match_prefix(client, &key, false, &mut a);
                let mb = graced.match_prefix(client, &key, false, &mut b);
                assert_eq!((ma, a), (mb, b), "step {step}");
            }
            _ => {
                let n = key.len() as u64 / 2;
                let (pa, pb) = (plain.alloc(client, n), graced.alloc(client, n));
                assert_eq!(pa, pb, "step {step}");
                if let Ok(pages) = pa {
                    let ia = plain.insert(client, &key, &pages, false);
                    let ib = graced.insert(client, &key, &pages, false);
                    assert_eq!(ia, ib, "step {step}");
                }
            }
        }
        assert_eq!(plain.stats(), graced.stats(), "step {step}");
        assert_eq!(graced.in_limbo(), (0, 0));
    }
    ok(&plain);
    ok(&graced);
}

#[test]
fn readers_keep_succeeding_while_a_writer_churns_the_tree() {
    use radixd::engine::{Region, TreeReader};
    use radixd_ipc::sync::{AtomicU32, Ordering};

    const PAGE: u32 = 4;
    let mut e = engine(PAGE, 600);
    // The locked prompt: 64 pages.
    let locked: Vec<u32> = (0..64 * PAGE).map(|i| 1_000_000 + i).collect();
    let pages = put(&mut e, A, &locked);
    let (_, handle) = {
        let mut out = Vec::new();
        let m = e.match_prefix(A, &locked, true, &mut out);
        (out, m.handle.expect("matched"))
    };
    let layout = e.layout();
    let base = e.region().as_ptr() as usize;
    let stop = AtomicU32::new(0);
    let (stop, locked, pages) = (&stop, &locked, &pages);
    let readers = 2;
    let (tally, e) = std::thread::scope(|s| {
        let peekers: Vec<_> = (0..readers)
            .map(|_| {
                s.spawn(move || {
                    let base = std::ptr::NonNull::new(base as *mut u8).expect("region");
                    // SAFETY: the engine's heap region stays allocated until
                    // after this scope (the writer hands the engine back, and
                    // it is dropped only once every thread is joined); the
                    // writer changes it only through the engine, whose
                    // versions this reader checks; the reader only copies.
                    let reader = unsafe { TreeReader::new(base, layout) };
                    let (mut ok, mut contended) = (0u64, 0u64);
                    let mut out = Vec::new();
                    // Relaxed: a stop request, nothing to publish.
                    while stop.load(Ordering::Relaxed) == 0 {
                        match reader.peek(locked, &mut out) {
                            Some(len) => {
                                assert_eq!(len, locked.len(), "wrong length");
                                assert_eq!(&out, pages, "wrong pages");
                                ok += 1;
                            }
                            None => contended += 1,
                        }
                    }
                    (ok, contended)
                })
            })
            .collect();
        let writer = s.spawn(move || {
            let mut seed = 0x2545_f491_u64;
            let mut next = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            let mut evicted = 0;
            for _ in 0..20_000 {
                let len = (1 + next(16) as usize) * PAGE as usize;
                // A quarter share a page-aligned prefix of the locked prompt
                // (splitting the nodes readers stand on); the rest are new.
                let key: Vec<u32> = if next(4) == 0 {
                    let shared = (1 + next(63) as usize) * PAGE as usize;
                    let mut k = locked[..shared].to_vec();
                    k.extend((0..len).map(|_| next(1 << 20) as u32));
                    k
                } else {
                    (0..len).map(|_| next(1 << 20) as u32).collect()
                };
                let mut have = Vec::new();
                e.match_prefix(B, &key, false, &mut have);
                let need = key.len() as u64 / u64::from(PAGE) - have.len() as u64;
                let before = e.stats().evicted_pages;
                if let Ok(new) = e.alloc(B, need) {
                    have.extend(new);
                    e.insert(B, &key, &have, false).expect("insert");
                }
                evicted += e.stats().evicted_pages - before;
            }
            // Relaxed: a stop request, nothing to publish.
            stop.store(1, Ordering::Relaxed);
            assert!(evicted > 1000, "the churn evicted");
            e
        });
        let e = writer.join().expect("writer");
        let tally: Vec<(u64, u64)> = peekers
            .into_iter()
            .map(|p| p.join().expect("reader"))
            .collect();
        (tally, e)
    });
    ok(&e);
    e.validate().expect("invariants");
    let _ = handle;
    let (ok_n, contended): (u64, u64) = tally.iter().fold((0, 0), |a, t| (a.0 + t.0, a.1 + t.1));
    let total = ok_n + contended;
    eprintln!("peeks: {ok_n} ok, {contended} contended");
    assert!(total >= 100, "the readers ran: {total} peeks");
    assert!(ok_n * 10 >= total * 9, "{ok_n} of {total} peeks succeeded");
}

/// Pages with consecutive ids are matched as one run (their tokens side by
/// side); a run cut by a split, trimmed by eviction, broken by a page out
/// of order, or ended by a mismatch part-way answers exactly as page by
/// page, in the engine and in a reader of its region alike.
#[test]
fn runs_of_consecutive_pages_match_as_pages_do() {
    let mut e = engine(2, 64);
    let both = |e: &Engine, key: &[u32]| {
        let mut mine = Vec::new();
        let len = e.peek(key, &mut mine);
        let mut read = Vec::new();
        let peeked = e.peek_anchored(key, &mut read).expect("a quiet read");
        assert_eq!(
            (peeked.len, &read),
            (len, &mine),
            "reader and engine on {key:?}"
        );
        (len, mine)
    };
    // Ten pages, ids 0..10 from the fresh pool: one run.
    let key: Vec<u32> = (100..120).collect();
    let pages = put(&mut e, 1, &key);
    assert_eq!(pages, (0..10).collect::<Vec<u32>>());
    assert_eq!(both(&e, &key), (20, pages.clone()));
    // A mismatch inside the run, in its first and its last token.
    for bad in [8, 9, 19] {
        let mut k = key.clone();
        k[bad] = 0;
        assert_eq!(both(&e, &k), (bad / 2 * 2, pages[..bad / 2].to_vec()));
    }
    // Split inside the run (a match that ends at page 6), then both halves.
    let mut m = Vec::new();
    let r = e.match_prefix(1, &key[..12], false, &mut m);
    assert_eq!((r.len, &m), (12, &pages[..6].to_vec()));
    ok(&e);
    assert_eq!(both(&e, &key), (20, pages.clone()));
    assert_eq!(both(&e, &key[..13]), (12, pages[..6].to_vec()));
    // A second leaf whose pages are out of order: runs of one and two.
    let mut other: Vec<u32> = key[..12].to_vec();
    other.extend(200..208);
    let fresh = e.alloc(1, 4).expect("alloc");
    let shuffled = [fresh[1], fresh[0], fresh[2], fresh[3]];
    let mut with = pages[..6].to_vec();
    with.extend(shuffled);
    e.insert(1, &other, &with, false).expect("insert");
    ok(&e);
    assert_eq!(both(&e, &other), (20, with.clone()));
    // Trim the first leaf's end by eviction: its run ends earlier now.
    let lru = e.evict(2 * 2);
    assert_eq!(lru, 4);
    ok(&e);
    // (the first leaf's lower half is the least recently used leaf)
    assert_eq!(both(&e, &key), (16, pages[..8].to_vec()));
    assert_eq!(both(&e, &other), (20, with));
}
