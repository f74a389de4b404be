"""What SGLang 0.5.23's ``UnifiedRadixCache`` (pure-Python tree core) does
for FULL+SWA and FULL+MAMBA, pinned on its real pools on the CPU. Each test
names the rule of UNIFIED_SEMANTICS.md it verifies; radixd's hybrid cache
must give the same answers."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")
pytest.importorskip("torch")

from unified_sim import (  # noqa: E402
    FULL,
    MAMBA,
    SWA,
    all_nodes,
    alloc_kv,
    alloc_mamba,
    check,
    children,
    evict,
    exists,
    free_kv,
    free_swa_only,
    full_available,
    full_value,
    insert,
    lock,
    lock_ref,
    lru_order,
    make_mamba_cache,
    make_swa_cache,
    mamba_available,
    mamba_value,
    match,
    parent,
    path_nodes,
    sizes,
    swa_available,
    swa_of,
    swa_uuid,
    swa_value,
    tokens_of,
    unlock,
)


@pytest.fixture(autouse=True)
def _restore_runtime():
    """The harness publishes its own server args (as a scheduler would);
    put back whatever the session had published, for the other suites."""
    from sglang.srt import runtime_context

    before = getattr(runtime_context._CONTEXT, "server_args", None)
    yield
    if before is not None:
        runtime_context.publish(before, role="scheduler")


def chain16(c):
    """Inserts tokens 0..15 in one go; returns (slots, [upper, leaf]): a
    fresh 16-token leaf is capped at one window (W=4), so the tree holds
    [0..11] -> [12..15]."""
    v = alloc_kv(c, 16)
    leaf = insert(c, list(range(16)), v)["node"]
    return v, path_nodes(c, leaf)


# ----- (a) match under SWA -----


def test_swa_match_cut_back_by_tombstone():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    assert evict(c, swa_tokens=1) == (0, 12, 0)  # upper is the SWA LRU tail
    assert swa_value(c, upper) is None and full_value(c, upper) == v[:12]
    # The 4 live tokens after the tombstone cover W: the whole key matches.
    assert match(c, list(range(16)))["len"] == 16
    # 2 live tokens after it do not; the match falls back to the last valid
    # node (here the root), but the walk still split the leaf at 14.
    m = match(c, list(range(14)))
    assert (m["len"], m["full_kv_hit_length"], m["swa_branching_seqlen"]) == (0, 14, 14)
    mid = parent(c, leaf)
    assert tokens_of(c, mid) == [12, 13] and tokens_of(c, leaf) == [14, 15]
    assert match(c, list(range(12)))["len"] == 0
    # Nodes above a live window are valid again: [12,13]+[14,15] = 4 >= W.
    assert match(c, list(range(16)) + [99])["len"] == 16
    check(c)


def test_swa_match_without_tombstone_needs_no_window():
    c = make_swa_cache(1, 64, 64, 4)
    v = alloc_kv(c, 2)
    n = insert(c, [7, 8], v)["node"]
    m = match(c, [7, 8, 9])
    assert (m["len"], m["node"]) == (2, n)


def test_page4_match_is_page_aligned():
    c = make_swa_cache(4, 32, 32, 6)
    v = alloc_kv(c, 16)
    leaf = insert(c, list(range(16)), v)["node"]
    upper = parent(c, leaf)
    # Cap = ceil(6/4)*4 = 8 tokens.
    assert (tokens_of(c, upper), tokens_of(c, leaf)) == (list(range(8)), list(range(8, 16)))
    assert evict(c, swa_tokens=1) == (0, 8, 0)
    assert match(c, list(range(16)))["len"] == 16  # 8 live >= 6
    assert match(c, list(range(15)))["len"] == 0  # key cut to 12: 4 live < 6
    assert tokens_of(c, leaf) == [12, 13, 14, 15]  # split at the page boundary 12
    check(c)


# ----- (b) SWA eviction -----


def test_swa_evict_internal_tombstones_leaf_deletes():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    before = full_available(c), swa_available(c)
    # Victims from the LRU tail: upper (internal: tombstone, 12 SWA), then
    # leaf (deleted with its FULL: 4 FULL + 4 SWA).
    assert evict(c, swa_tokens=13) == (4, 16, 0)
    assert exists(c, upper) and not exists(c, leaf)
    assert swa_value(c, upper) is None and full_value(c, upper) == v[:12]
    assert (full_available(c), swa_available(c)) == (before[0] + 4, before[1] + 16)
    assert sizes(c) == {"full_evictable": 12, "full_protected": 0, "swa_evictable": 0, "swa_protected": 0}
    # The SWA-tombstoned leaf survives until FULL eviction takes it.
    assert evict(c, full_tokens=1) == (12, 0, 0)
    assert not exists(c, upper)
    check(c)


def test_swa_eviction_skips_locked_nodes():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    r = lock(c, leaf)  # SWA-locks the leaf only (4 tokens cover W)
    assert evict(c, swa_tokens=100) == (0, 12, 0)
    assert swa_value(c, leaf) is not None and swa_value(c, upper) is None
    unlock(c, leaf, r)
    check(c)


# ----- (c) FULL eviction -----


def test_full_evict_leaf_frees_swa_and_parent_becomes_leaf():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    evict(c, swa_tokens=1)  # tombstone upper
    sw = swa_of(c, v)
    assert sw[:12] == [0] * 12 and sw[12:] == v[12:]  # tombstone cleared its mapping
    assert evict(c, full_tokens=1) == (4, 4, 0)  # the leaf, with its SWA
    assert not exists(c, leaf) and children(c, upper) == []
    assert swa_of(c, v[12:]) == [0] * 4
    # upper is now a (tombstoned) D-leaf; the next FULL victim.
    assert evict(c, full_tokens=1) == (12, 0, 0)
    assert all_nodes(c) == []
    assert (full_available(c), swa_available(c)) == (64, 64)
    check(c)


def test_full_eviction_continues_up_the_chain():
    c = make_swa_cache(4, 32, 32, 6)
    v = alloc_kv(c, 20)
    insert(c, list(range(20)), v)
    # Three nodes ([0..11], [12..19] after the cap). Ask for everything.
    assert evict(c, full_tokens=20) == (20, 20, 0)
    assert all_nodes(c) == [] and full_available(c) == 128 and swa_available(c) == 128


def test_full_eviction_order_is_last_access_time():
    c = make_swa_cache(1, 64, 64, 4)
    a = insert(c, [1, 2, 3, 4], alloc_kv(c, 4))["node"]
    b = insert(c, [9, 9, 9, 9], alloc_kv(c, 4))["node"]
    d = insert(c, [5, 5, 5, 5], alloc_kv(c, 4))["node"]
    match(c, [1, 2, 3, 4])  # a is now the most recent
    assert evict(c, full_tokens=1) == (4, 4, 0)
    assert not exists(c, b) and exists(c, a) and exists(c, d)
    assert evict(c, full_tokens=1) == (4, 4, 0)
    assert not exists(c, d) and exists(c, a)


# ----- (d) insert over a tombstone -----


def test_insert_recovers_swa_tombstone():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    evict(c, swa_tokens=1)
    # A second request recomputed all 16 tokens into fresh slots.
    w = alloc_kv(c, 16)
    r = insert(c, list(range(16)), w)
    assert (r["prefix_len"], r["node"]) == (16, leaf)
    # The tombstoned node adopts the new slots (FULL and SWA); its old FULL
    # slots were freed FULL-only; the new slots of the live leaf were
    # duplicates and were freed (FULL+SWA).
    assert full_value(c, upper) == w[:12] and swa_value(c, upper) == swa_of(c, w[:12])
    assert full_value(c, leaf) == v[12:]
    assert swa_of(c, w[12:]) == [0] * 4
    assert (full_available(c), swa_available(c)) == (48, 48)  # 16 cached, nothing leaked
    assert sizes(c)["swa_evictable"] == 16
    check(c)


def test_insert_recovery_respects_swa_evicted_seqlen():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    evict(c, swa_tokens=1)
    w = alloc_kv(c, 16)
    free_swa_only(c, w[:4])  # the request's own SWA for positions < 4 is gone
    insert(c, list(range(16)), w, swa_evicted_seqlen=4)
    # The tombstone splits at 4: below stays a tombstone on the old slots,
    # above is recovered from the request's slots.
    low = parent(c, upper)
    assert tokens_of(c, low) == [0, 1, 2, 3] and full_value(c, low) == v[:4] and swa_value(c, low) is None
    assert tokens_of(c, upper) == list(range(4, 12)) and full_value(c, upper) == w[4:12]
    assert swa_value(c, upper) == swa_of(c, w[4:12])
    # w[:4] (SWA already freed) were freed FULL-only, w[12:] FULL+SWA.
    assert (full_available(c), swa_available(c)) == (48, 52)
    check(c)


def test_insert_recovery_under_locked_full_keeps_full_slots():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    evict(c, swa_tokens=1)
    r = lock(c, leaf)  # FULL-locks upper too; its SWA lock stops at leaf
    w = alloc_kv(c, 16)
    ws = swa_of(c, w)
    assert insert(c, list(range(16)), w)["prefix_len"] == 16
    # The locked FULL slots stay; the incoming SWA slots are re-pointed at
    # them and the incoming FULL slots are freed (FULL-only).
    assert full_value(c, upper) == v[:12] and swa_value(c, upper) == ws[:12]
    assert swa_of(c, v[:12]) == ws[:12] and swa_of(c, w) == [0] * 16
    assert (full_available(c), swa_available(c)) == (48, 48)
    assert sizes(c) == {"full_evictable": 0, "full_protected": 16, "swa_evictable": 12, "swa_protected": 4}
    unlock(c, leaf, r)
    check(c)


def test_insert_frees_duplicates_above_prev_prefix_len():
    c = make_swa_cache(1, 64, 64, 4)
    v = alloc_kv(c, 8)
    insert(c, list(range(8)), v)
    w = alloc_kv(c, 10)
    # prev_prefix_len=3: w[:3] are taken as the tree's own (never freed);
    # w[3:8] duplicate the cached prefix and are freed; w[8:] form the leaf.
    r = insert(c, list(range(10)), w, prev_prefix_len=3)
    assert r["prefix_len"] == 8 and full_value(c, r["node"]) == w[8:]
    assert swa_of(c, w[3:8]) == [0] * 5 and swa_of(c, w[:3]) == w[:3]
    assert full_available(c) == 64 - 8 - 10 + 5
    free_kv(c, w[:3])
    check(c)


# ----- (e) locks -----


def test_swa_lock_is_window_limited():
    c = make_swa_cache(1, 64, 64, 4)
    v, (upper, leaf) = chain16(c)
    w = alloc_kv(c, 2)
    tip = insert(c, list(range(16)) + [50, 51], v + w, prev_prefix_len=16)["node"]
    r1 = lock(c, tip)
    # FULL: the whole path. SWA: tip (2) + leaf (4) reach W=4; uuid on leaf.
    assert [lock_ref(c, n, FULL) for n in (upper, leaf, tip)] == [1, 1, 1]
    assert [lock_ref(c, n, SWA) for n in (upper, leaf, tip)] == [0, 1, 1]
    assert r1.component_lock_uuids[SWA] == swa_uuid(c, leaf) is not None
    assert sizes(c) == {"full_evictable": 0, "full_protected": 18, "swa_evictable": 12, "swa_protected": 6}
    r2 = lock(c, tip)
    assert r2.component_lock_uuids[SWA] == r1.component_lock_uuids[SWA]
    assert [lock_ref(c, n, SWA) for n in (upper, leaf, tip)] == [0, 2, 2]
    unlock(c, tip, r1)
    unlock(c, tip, r2)
    assert [lock_ref(c, n, SWA) for n in (upper, leaf, tip)] == [0, 0, 0]
    assert sizes(c) == {"full_evictable": 18, "full_protected": 0, "swa_evictable": 18, "swa_protected": 0}
    check(c)


def test_swa_lock_counts_tombstones_in_window():
    c = make_swa_cache(1, 64, 64, 4)
    v = alloc_kv(c, 6)
    n1 = insert(c, [0, 1], v[:2])["node"]
    n2 = insert(c, [0, 1, 2, 3], v[:4], prev_prefix_len=2)["node"]
    n3 = insert(c, list(range(6)), v, prev_prefix_len=4)["node"]
    assert evict(c, swa_tokens=3) == (0, 4, 0)  # n1 then n2 tombstoned
    assert swa_value(c, n1) is None and swa_value(c, n2) is None
    r = lock(c, n3)
    # The tombstone n2 counts toward the window (2 + 2 = W) and takes a
    # lock_ref and the uuid, but only valued nodes move to protected.
    assert [lock_ref(c, n, SWA) for n in (n1, n2, n3)] == [0, 1, 1]
    assert r.component_lock_uuids[SWA] == swa_uuid(c, n2) is not None
    assert sizes(c)["swa_protected"] == 2 and sizes(c)["swa_evictable"] == 0
    unlock(c, n3, r)
    assert [lock_ref(c, n, SWA) for n in (n1, n2, n3)] == [0, 0, 0]
    check(c)


# ----- (f) mamba -----


def mamba_pair(c):
    """[0..7] with state s1 -> [8..11] with state s2."""
    v = alloc_kv(c, 12)
    s1, s2 = alloc_mamba(c), alloc_mamba(c)
    a = insert(c, list(range(8)), v[:8], mamba_slot=s1)["node"]
    b = insert(c, list(range(12)), v, mamba_slot=s2, prev_prefix_len=8)["node"]
    return v, (s1, s2), (a, b)


def test_mamba_match_stops_at_deepest_state():
    c = make_mamba_cache(1, 64, 8)
    v, (s1, s2), (a, b) = mamba_pair(c)
    m = match(c, list(range(12)))
    assert (m["len"], m["node"], m["mamba"]) == (12, b, s2)
    m = match(c, list(range(10)))  # splits b at 10; the split-off prefix has no state
    assert (m["len"], m["node"], m["mamba"], m["full_kv_hit_length"]) == (8, a, s1, 10)
    mid = parent(c, b)
    assert tokens_of(c, mid) == [8, 9] and mamba_value(c, mid) is None and mamba_value(c, b) == s2
    assert lock_ref(c, mid, MAMBA) == 0
    m = match(c, list(range(6)))
    assert (m["len"], m["mamba"]) == (0, None)
    assert m["mamba_branching_seqlen"] is None  # grid is 64 tokens here
    check(c)


def test_mamba_cow_match():
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    c = make_mamba_cache(1, 64, 8)
    v, (s1, s2), (a, b) = mamba_pair(c)
    req = Req("r", "", array("q", list(range(12))), SamplingParams(max_new_tokens=4))
    c.req_to_token_pool.alloc([req])  # gives the request its own state slot
    own = int(req.kv.mamba_pool_idx)
    avail = mamba_available(c)
    match(c, list(range(12)), cow_mamba=True, req=req)
    assert int(req.kv.mamba_pool_idx) == own and mamba_available(c) == avail
    assert req.kv.mamba_cow_src_index.tolist() == [s2]


def test_mamba_evict_internal_tombstone_leaf_delete():
    c = make_mamba_cache(1, 64, 8)
    v, (s1, s2), (a, b) = mamba_pair(c)
    assert lru_order(c, MAMBA) == [b, a]
    free_before = mamba_available(c), full_available(c)
    assert evict(c, mamba_num=1) == (0, 0, 1)  # a: internal -> tombstone
    assert exists(c, a) and mamba_value(c, a) is None and full_value(c, a) == v[:8]
    assert mamba_available(c) == free_before[0] + 1 and full_available(c) == free_before[1]
    assert evict(c, mamba_num=1) == (4, 0, 1)  # b: leaf -> deleted with its FULL
    assert not exists(c, b) and exists(c, a)
    assert sizes(c) == {"full_evictable": 8, "full_protected": 0, "mamba_evictable": 0, "mamba_protected": 0}
    assert match(c, list(range(12)))["len"] == 0
    check(c)


def test_mamba_exist_on_reinsert():
    c = make_mamba_cache(1, 64, 8)
    v, (s1, s2), (a, b) = mamba_pair(c)
    s3 = alloc_mamba(c)
    avail = mamba_available(c)
    r = insert(c, list(range(12)), v, mamba_slot=s3, prev_prefix_len=12)
    assert (r["node"], r["mamba_exist"]) == (b, True)
    assert mamba_value(c, b) == s2 and mamba_available(c) == avail  # s3 is still the caller's
    # An existing node without a state takes the passed one.
    match(c, list(range(10)))  # split: [8,9] has no state
    mid = parent(c, b)
    r = insert(c, list(range(10)), v[:10], mamba_slot=s3, prev_prefix_len=10)
    assert (r["node"], r["mamba_exist"], mamba_value(c, mid)) == (mid, False, s3)
    assert lru_order(c, MAMBA)[0] == mid
    assert sizes(c)["mamba_evictable"] == 3
    check(c)


def test_mamba_lock_is_one_node():
    c = make_mamba_cache(1, 64, 8)
    v, (s1, s2), (a, b) = mamba_pair(c)
    r = lock(c, b)
    assert (lock_ref(c, a, MAMBA), lock_ref(c, b, MAMBA)) == (0, 1)
    assert (lock_ref(c, a, FULL), lock_ref(c, b, FULL)) == (1, 1)
    assert sizes(c) == {"full_evictable": 0, "full_protected": 12, "mamba_evictable": 1, "mamba_protected": 1}
    # a's state is still evictable (internal tombstone) even though its KV is locked.
    assert evict(c, mamba_num=2) == (0, 0, 1)
    assert mamba_value(c, a) is None and mamba_value(c, b) == s2
    unlock(c, b, r)
    check(c)


# ----- (g) LRU order -----


def test_swa_lru_window_refresh():
    c = make_swa_cache(1, 64, 64, 4)
    v = alloc_kv(c, 10)
    nodes = []
    for n in range(1, 5):  # a chain of four 2-token nodes
        nodes.append(insert(c, list(range(2 * n)), v[: 2 * n], prev_prefix_len=2 * n - 2)["node"])
    n1, n2, n3, n4 = nodes
    assert lru_order(c, SWA) == [n4, n3, n2, n1]  # insert refreshed n4,n3,n2 (acc 0,2,4 < W+P=5)
    n5 = insert(c, [0, 1, 9, 9], v[:2] + v[8:10], prev_prefix_len=2)["node"]
    assert lru_order(c, SWA) == [n5, n1, n4, n3, n2]
    match(c, list(range(8)))
    assert lru_order(c, SWA) == [n4, n3, n2, n5, n1]
    match(c, [0, 1])
    assert lru_order(c, SWA) == [n1, n4, n3, n2, n5]
    # Victims come from the tail regardless of last_access_time: n5 is a
    # leaf (deleted), then n2 (internal, tombstoned).
    assert evict(c, swa_tokens=3) == (2, 4, 0)
    assert not exists(c, n5) and swa_value(c, n2) is None
    check(c)


def test_page4_swa_window_refresh_spans_w_plus_p():
    c = make_swa_cache(4, 32, 32, 6)
    v = alloc_kv(c, 20)
    ns = [insert(c, list(range(4 * n)), v[: 4 * n], prev_prefix_len=4 * n - 4)["node"] for n in range(1, 6)]
    assert lru_order(c, SWA) == ns[::-1]
    match(c, list(range(4)))
    assert lru_order(c, SWA) == [ns[0], ns[4], ns[3], ns[2], ns[1]]
    match(c, list(range(20)))  # W+P = 10: nodes below 0, 4, 8 tokens deep
    assert lru_order(c, SWA) == [ns[4], ns[3], ns[2], ns[0], ns[1]]


def test_mamba_lru_touches_only_best():
    c = make_mamba_cache(1, 64, 8)
    v, (s1, s2), (a, b) = mamba_pair(c)
    match(c, list(range(8)))
    assert lru_order(c, MAMBA) == [a, b]
    match(c, list(range(12)))  # only b moves; a (ancestor) is not refreshed
    assert lru_order(c, MAMBA) == [b, a]
    insert(c, list(range(12)), v, mamba_slot=alloc_mamba(c), prev_prefix_len=12)
    assert lru_order(c, MAMBA) == [b, a]


def test_page4_mamba_state_only_at_insert_end():
    c = make_mamba_cache(4, 16, 8)
    v = alloc_kv(c, 12)
    s1 = alloc_mamba(c)
    leaf = insert(c, list(range(12)), v, mamba_slot=s1)["node"]
    assert match(c, list(range(12)))["mamba"] == s1
    m = match(c, list(range(10)))  # key cut to 8; split at 8: no state there
    assert (m["len"], m["full_kv_hit_length"]) == (0, 8)
    up = parent(c, leaf)
    assert (tokens_of(c, up), mamba_value(c, up), tokens_of(c, leaf)) == (list(range(8)), None, [8, 9, 10, 11])
    check(c)


# ----- (h) split -----


def test_split_moves_swa_lock_and_uuid():
    c = make_swa_cache(1, 64, 64, 4)
    v = alloc_kv(c, 4)
    leaf = insert(c, [1, 2, 3, 4], v)["node"]
    r = lock(c, leaf)
    uuid = swa_uuid(c, leaf)
    assert uuid is not None
    m = match(c, [1, 2])
    up = m["node"]
    assert parent(c, leaf) == up and m["len"] == 2
    assert (swa_value(c, up), swa_value(c, leaf)) == (swa_of(c, v[:2]), swa_of(c, v[2:]))
    assert (lock_ref(c, up, SWA), lock_ref(c, leaf, SWA)) == (1, 1)
    assert (lock_ref(c, up, FULL), lock_ref(c, leaf, FULL)) == (1, 1)
    assert (swa_uuid(c, up), swa_uuid(c, leaf)) == (uuid, None)
    assert sizes(c)["swa_protected"] == 4
    unlock(c, leaf, r)  # walks leaf -> up (uuid) and stops
    assert (lock_ref(c, up, SWA), lock_ref(c, leaf, SWA)) == (0, 0)
    assert sizes(c) == {"full_evictable": 4, "full_protected": 0, "swa_evictable": 4, "swa_protected": 0}
    check(c)


def test_new_swa_leaf_capped_at_window():
    c = make_swa_cache(1, 64, 64, 4)
    v = alloc_kv(c, 12)
    leaf = insert(c, list(range(12)), v)["node"]
    up = parent(c, leaf)
    assert (tokens_of(c, up), tokens_of(c, leaf)) == (list(range(8)), list(range(8, 12)))
    assert lru_order(c, SWA) == [leaf, up]
    # An insert that only extends an existing node does not cap the old part.
    w = alloc_kv(c, 3)
    tip = insert(c, list(range(15)), v + w, prev_prefix_len=12)["node"]
    assert tokens_of(c, tip) == [12, 13, 14] and parent(c, tip) == leaf


# ----- (i) counts and allocator -----


def test_evict_counts_cascade():
    c = make_swa_cache(1, 64, 64, 4)
    chain16(c)
    # FULL runs first; its leaf victim also frees 4 SWA, which satisfies
    # the SWA request of 4, so SWA evicts nothing more.
    assert evict(c, full_tokens=1, swa_tokens=4) == (4, 4, 0)
    assert sizes(c) == {"full_evictable": 12, "full_protected": 0, "swa_evictable": 12, "swa_protected": 0}
    assert evict(c, full_tokens=1, swa_tokens=13) == (12, 12, 0)


def test_swa_allocator_pairing():
    import torch

    c = make_swa_cache(1, 8, 4, 4)
    a = c.token_to_kv_pool_allocator
    assert (a.full_available_size(), a.swa_available_size(), a.available_size()) == (8, 4, 4)
    v = alloc_kv(c, 3)
    assert swa_of(c, v) == [1, 2, 3]
    free_swa_only(c, v[:2])
    assert swa_of(c, v) == [0, 0, 3] and (a.full_available_size(), a.swa_available_size()) == (5, 3)
    with pytest.raises(MemoryError):
        alloc_kv(c, 4)  # SWA side has 3
    free_kv(c, v[2:])
    a.free_full(torch.tensor(v[:2]))
    assert (a.full_available_size(), a.swa_available_size()) == (8, 4)


# ----- request hooks (checkpoint_into_tree, release_kv_cache) -----


def _request(cache, tokens, max_new=8):
    """A request as the scheduler admits it: matched, locked, given a row
    (and, under Mamba, its own state slot)."""
    from array import array

    import torch
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.common import match_kv_cache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from unified_sim import publish_runtime

    publish_runtime(cache.page_size)
    req = Req("r", "", array("q", tokens), SamplingParams(max_new_tokens=max_new))
    req.refresh_fill_ids()
    match_kv_cache(req, cache)
    req.lock = cache.lock(req.last_node)
    cache.req_to_token_pool.alloc([req])
    n = req.kv.cache_protected_len
    if n:
        cache.req_to_token_pool.write((req.kv.req_pool_idx, slice(0, n)), cache.prefix_device_indices(req))
    v = alloc_kv(cache, len(tokens) - n)
    cache.req_to_token_pool.write((req.kv.req_pool_idx, slice(n, len(tokens))), torch.tensor(v))
    req.kv.kv_committed_len = req.kv.kv_allocated_len = len(tokens)
    return req


def _decode(cache, req, outputs):
    import torch

    for t in outputs:
        n = req.kv.kv_committed_len
        cache.req_to_token_pool.write((req.kv.req_pool_idx, slice(n, n + 1)), torch.tensor(alloc_kv(cache, 1)))
        req.output_ids.append(t)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = n + 1
    req.refresh_fill_ids()


def _finish(cache, req):
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    release_kv_cache(req, cache, checkpoint=True)


def test_swa_unfinished_checkpoint_frees_out_of_window_and_tombstones():
    c = make_swa_cache(1, 64, 64, 4)
    req = _request(c, list(range(12)))
    c.checkpoint(req, up_to=12)
    # pre_len = 11: the request freed its SWA for [0, 11 - 4) before the
    # insert, which then stores [0..6] as a tombstone, [7] and the capped
    # window [8..11] live; the request now locks [8..11].
    assert req.kv.get_evicted_seqlen(SWA) == 7 and req.kv.cache_protected_len == 12
    leaf = req.last_node
    mid = parent(c, leaf)
    low = parent(c, mid)
    assert [tokens_of(c, n) for n in (low, mid, leaf)] == [list(range(7)), [7], [8, 9, 10, 11]]
    assert [swa_value(c, n) is None for n in (low, mid, leaf)] == [True, False, False]
    assert (full_available(c), swa_available(c)) == (52, 59)
    assert sizes(c) == {"full_evictable": 0, "full_protected": 12, "swa_evictable": 1, "swa_protected": 4}
    _decode(c, req, [100, 101, 102, 103])
    c.checkpoint(req, up_to=16)
    # The tree owns [0, 12) now, so the floor jumps to 12 without a free.
    assert req.kv.get_evicted_seqlen(SWA) == 12 and req.kv.cache_protected_len == 16
    assert tokens_of(c, req.last_node) == [100, 101, 102, 103] and parent(c, req.last_node) == leaf
    assert sizes(c) == {"full_evictable": 0, "full_protected": 16, "swa_evictable": 5, "swa_protected": 4}
    _finish(c, req)
    assert sizes(c) == {"full_evictable": 16, "full_protected": 0, "swa_evictable": 9, "swa_protected": 0}
    assert (full_available(c), swa_available(c)) == (48, 55)
    assert match(c, list(range(12)) + [100, 101, 102, 103])["len"] == 16
    check(c)


def test_mamba_finished_request_donates_its_state():
    c = make_mamba_cache(1, 64, 8)
    req = _request(c, list(range(8)))
    slot = int(req.kv.mamba_pool_idx)
    _decode(c, req, [50, 51])
    _finish(c, req)
    (leaf,) = all_nodes(c)
    assert mamba_value(c, leaf) == slot and mamba_available(c) == 7
    # The same sequence again: the tree keeps its state (mamba_exist) and
    # the second request's slot goes back to the pool.
    req = _request(c, list(range(8)))
    assert mamba_available(c) == 6
    _decode(c, req, [50, 51])
    _finish(c, req)
    assert mamba_available(c) == 7 and sizes(c)["mamba_evictable"] == 1
    check(c)


def test_mamba_unfinished_checkpoint_donates_a_copy():
    c = make_mamba_cache(1, 64, 8)
    req = _request(c, list(range(8)))
    own = int(req.kv.mamba_pool_idx)
    c.checkpoint(req, up_to=8)
    # A new slot (holding a copy of the live state) goes to the tree; the
    # request keeps its own and now locks the new node, MAMBA included.
    (a,) = all_nodes(c)
    assert mamba_value(c, a) not in (None, own) and int(req.kv.mamba_pool_idx) == own
    assert lock_ref(c, a, MAMBA) == 1 and mamba_available(c) == 6
    _decode(c, req, [50, 51])
    c.checkpoint(req, up_to=10)
    b = req.last_node
    assert parent(c, b) == a and mamba_value(c, b) is not None
    assert (lock_ref(c, a, MAMBA), lock_ref(c, b, MAMBA)) == (0, 1) and mamba_available(c) == 5
    c.checkpoint(req, up_to=10)  # nothing new: the copy is made, then freed (mamba_exist)
    assert mamba_available(c) == 5
    _finish(c, req)  # the state at 10 exists: the request's own slot is freed
    assert mamba_available(c) == 6
    assert sizes(c) == {"full_evictable": 10, "full_protected": 0, "mamba_evictable": 2, "mamba_protected": 0}
    check(c)
