"""EAGLE / MTP speculative decoding: SGLang's ``RadixCache`` built with
``is_eagle`` (its tree keyed by bigrams, ``RadixKey(is_bigram=True)``)
against radixd's ``RadixdPrefixCache`` built with it, under the same random
scheduler operations (arrivals, chunked prefill, verify steps committing
one to four tokens, finishing, aborting, eviction under pressure): every
match length, ``cache_protected_len``, eviction and size must agree, and
every matched prefix must read back its own tokens' KV. radixd keys raw
tokens ``1..N`` in a namespace of token 0 (``radixd.bigram_key``), composed
with the LoRA / tenant namespaces; then the key semantics one by one, the
namespace table running full, and the hybrid models (``UnifiedRadixCache``
with ``is_eagle`` against ``RadixdHybridCache``)."""

from __future__ import annotations

import os
from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

import radixd
from radixd.sglang import RadixdPrefixCache
from sim import Twin, params

OPS = int(os.environ.get("RADIXD_SGLANG_OPS", "12500"))
PAGES = 48

# As test_twin: LoRA adapters, tenants, both, an empty extra_key, none.
SPACES = [(None, None), ("lora-1", None), ("lora-2", None), (None, "tenant-a"), ("lora-1", "tenant-a"), ("", None)]


def engine_cache(page_size: int):
    return lambda p: RadixdPrefixCache(p, radixd.Engine(page_size, PAGES, recency="sglang"))


def run(twin: Twin, ops: int) -> Twin:
    assert twin.a.cache.is_eagle and twin.b.cache.is_eagle
    for _ in range(ops):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    return twin


@pytest.mark.parametrize("page_size", [1, 16])
def test_eagle_in_process(page_size):
    twin = run(Twin(page_size, PAGES, engine_cache(page_size), seed=400 + page_size, lru=True, eagle=True), OPS)
    assert twin.evictions > OPS // 20 and twin.hits > OPS // 50


@pytest.mark.parametrize("page_size", [1, 16])
def test_eagle_through_daemon(page_size, start_daemon, monkeypatch):
    from sim import radixd_cache

    d = start_daemon("--recency", "sglang", page_size=page_size, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = Twin(page_size, PAGES, radixd_cache, seed=500 + page_size, lru=True, eagle=True)
    assert type(twin.b.cache) is RadixdPrefixCache
    run(twin, OPS)
    assert twin.evictions > OPS // 20 and twin.hits > OPS // 50


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_eagle_namespaces_in_process(page_size):
    twin = Twin(page_size, PAGES, engine_cache(page_size), seed=600 + page_size, lru=True, spaces=SPACES, eagle=True)
    run(twin, OPS // 2)
    # A bigram hit needs one token more than a plain one: fewer hits.
    assert twin.evictions > OPS // 40 and twin.hits > OPS // 400
    assert twin.hit_spaces == set(SPACES), "every namespace was hit"


def test_eagle_namespaces_through_daemon(start_daemon, monkeypatch):
    from sim import radixd_cache

    d = start_daemon("--recency", "sglang", page_size=4, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = run(Twin(4, PAGES, radixd_cache, seed=700, lru=True, spaces=SPACES, eagle=True), OPS // 2)
    # A bigram hit needs one token more than a plain one: fewer hits.
    assert twin.evictions > OPS // 40 and twin.hits > OPS // 400
    assert twin.hit_spaces == set(SPACES), "every namespace was hit"


# ----- the key semantics, one by one -----


def caches(page_size: int, pages: int = 64) -> list:
    out = []
    for make in (RadixCache, lambda p: RadixdPrefixCache(p, radixd.Engine(page_size, pages, recency="sglang"))):
        p = params(page_size, pages)
        p.is_eagle = True
        out.append(make(p))
    return out


def key(*t, extra_key=None, salt=None) -> RadixKey:
    return RadixKey(array("q", t), extra_key=extra_key, cache_salt=salt)


def insert(cache, k: RadixKey) -> int:
    """Inserts ``k`` with fresh KV slots for its bigrams (whole pages of
    them), as a scheduler hands a row; returns the prefix length already
    cached."""
    return cache.insert(InsertParams(key=k, value=slots(cache, len(k.token_ids) - 1))).prefix_len


def slots(cache, n: int) -> torch.Tensor:
    ps = cache.page_size
    return cache.token_to_kv_pool_allocator.alloc(-(-n // ps) * ps)[:n]


def match(cache, k: RadixKey) -> int:
    return cache.match_prefix(MatchPrefixParams(key=k)).device_prefix_len


@pytest.mark.parametrize("page_size", [1, 2])
def test_bigram_keys_one_by_one(page_size):
    answers = []
    for cache in caches(page_size):
        got = [insert(cache, key(1, 2, 3, 4, 5))]
        # N + 1 raw tokens are N bigrams: 4 (page size 2: 4 whole).
        got.append(cache.evictable_size())
        got.append(match(cache, key(1, 2, 3, 4, 5, 6)))
        # The last token of a match is part of its last bigram: (3, 9) is
        # not (3, 4), so only (1, 2), (2, 3) match.
        got.append(match(cache, key(1, 2, 3, 9)))
        # Another first token is another subtree, whatever follows.
        got.append(match(cache, key(7, 2, 3, 4, 5)))
        got.append(insert(cache, key(7, 2, 3, 4, 5)))
        got.append(insert(cache, key(1, 2, 3, 9, 9)))
        # A single raw token is no bigram; two are one.
        got.append(match(cache, key(1)))
        got.append(match(cache, key(1, 2)))
        # LoRA / tenant namespaces compose with the first token.
        got.append(match(cache, key(1, 2, 3, 4, 5, extra_key="a")))
        got.append(insert(cache, key(1, 2, 3, 4, 5, extra_key="a")))
        got.append(match(cache, key(1, 2, 3, 4, 5, extra_key="a", salt="t")))
        got.append(match(cache, key(1, 2, 3, 4, 5, extra_key="a")))
        got.append((cache.evictable_size(), cache.protected_size(), cache.total_size()))
        # A match flips its key to the bigram view, as RadixCache's does.
        k = key(1, 2, 3)
        match(cache, k)
        got.append(k.is_bigram)
        # Locks and eviction count bigrams (KV slots).
        node = cache.match_prefix(MatchPrefixParams(key=key(1, 2, 3, 4, 5))).last_device_node
        got.append(cache.inc_lock_ref(node).delta)
        got.append(cache.evict(EvictParams(num_tokens=100)).num_tokens_evicted)
        got.append(cache.dec_lock_ref(node).delta)
        got.append((cache.evictable_size(), cache.protected_size()))
        answers.append(got)
    assert answers[0] == answers[1], f"SGLang {answers[0]}, radixd {answers[1]}"
    assert answers[0][1] == 4 and answers[0][3] == 2 // page_size * page_size


def test_the_kept_slots_are_the_first_tokens():
    """A bigram's KV slot is its first token's: the slots a match returns
    are the first ``N`` of the row that was inserted, never the last."""
    sglang, ours = caches(1)
    for cache in (sglang, ours):
        kv = torch.tensor([11, 12, 13, 14], dtype=torch.int64)
        if cache is ours:
            kv = cache.token_to_kv_pool_allocator.alloc(4)
        cache.insert(InsertParams(key=key(5, 6, 7, 8), value=kv.clone()))
        got = cache.match_prefix(MatchPrefixParams(key=key(5, 6, 7, 8, 9)))
        assert torch.equal(cache.path_device_indices(got.last_device_node), kv[:3])


def test_a_full_namespace_table_leaves_keys_uncached(caplog):
    """radixd registers at most 2^20 namespaces over an engine's life
    (``MAX_NAMESPACES``); EAGLE takes one per first token and LoRA / tenant
    namespace. Past that, keys in new namespaces are not cached (a match
    misses, an insert's pages go back to the pool, a warning says why)
    while known namespaces go on as before: never another prefix's KV."""
    eng = radixd.Engine(1, 16)
    p = params(1, 16)
    p.is_eagle = True
    cache = RadixdPrefixCache(p, eng)
    assert insert(cache, key(1, 2, 3)) == 0
    kv = slots(cache, 2)
    i = 0
    while True:  # fill the table (half a minute in a debug build)
        try:
            eng.match_prefix([], ns=f"filler-{i}")
        except radixd.BadNamespaceError:
            break
        i += 1
    assert i > 1000
    free = cache.token_to_kv_pool_allocator.available_size()
    assert cache.insert(InsertParams(key=key(9, 2, 3), value=kv)).prefix_len == 0
    assert cache.token_to_kv_pool_allocator.available_size() == free + 2, "the uncached key's pages went back"
    assert match(cache, key(9, 2, 3)) == 0
    assert cache.uncached_keys == 2
    assert "cannot be registered" in caplog.text
    # A namespace registered before is served as ever.
    assert match(cache, key(1, 2, 3)) == 2
    assert insert(cache, key(1, 2, 4)) == 1
    eng.validate()


class _FullTable:
    """An engine whose namespace table is full but for the names ``known``
    (a stand-in for filling it: the hybrid calls refuse as radixd does)."""

    def __init__(self, engine, known):
        self._engine, self._known = engine, set(known)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _call(self, op, tokens, *args, ns=None, **kw):
        if ns is not None and ns not in self._known:
            raise radixd.BadNamespaceError("1048576 namespaces are in use already")
        return getattr(self._engine, op)(tokens, *args, ns=ns, **kw)

    def match_prefix(self, tokens, **kw):
        return self._call("match_prefix", tokens, **kw)

    def insert(self, tokens, pages, **kw):
        return self._call("insert", tokens, pages, **kw)

    def insert_paired(self, tokens, pages, **kw):
        return self._call("insert_paired", tokens, pages, **kw)


def test_a_full_namespace_table_leaves_hybrid_keys_uncached():
    from hybrid_sim import HybridSim, HybridTwin, publish, swa_params
    from radixd.sglang_hybrid import RadixdHybridCache

    ps, full, swa, window = 1, HybridTwin.FULL_PAGES[1], HybridTwin.SWA_PAGES[1], HybridTwin.window(1)
    publish(ps)
    p = swa_params(ps, full, swa, window)
    p.is_eagle, p.tree_components = True, None
    eng = radixd.Engine(ps, full, components="full,swa", swa_window=window, swa_capacity=swa, recency="sglang")
    cache = RadixdHybridCache(p, _FullTable(eng, {"bigram:1"}))
    sim = HybridSim("swa", cache, p)
    free = sim.sizes()["free"]
    prompts = {"a": [1] + list(range(2, 30)), "b": [9] + list(range(2, 30))}
    for rid, prompt in prompts.items():
        sim.arrive(rid, prompt)
        sim.extend(rid, len(prompt))
        sim.checkpoint(rid)
        sim.finish(rid)
    assert sim.peek(prompts["a"])[0] == 28 and sim.peek(prompts["b"])[0] == 0
    assert cache.uncached_keys == 4  # b's arrival, checkpoint, release and match
    cache.evict(EvictParams(num_tokens=10**6))
    assert sim.sizes()["free"] == free, "every page of the uncached key went back"
    eng.validate()


# ----- hybrid models: UnifiedRadixCache with is_eagle -----
# FULL+SWA trees are keyed by bigrams (UnifiedTreeCore.is_eagle), FULL+MAMBA
# ones by tokens whatever the speculative algorithm (SGLang keys no bigrams
# with MAMBA): RadixdHybridCache keys each as SGLang does.


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_eagle_hybrid_in_process(kind, page_size):
    from hybrid_sim import HybridTwin
    from test_hybrid_backend import _engine_cache, _run

    twin = HybridTwin(kind, page_size, _engine_cache(kind, page_size), seed=800 + page_size + len(kind), eagle=True)
    assert twin.a.cache.tree_core.is_eagle == twin.b.cache.is_eagle == (kind == "swa")
    _run(twin, kind)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_eagle_hybrid_through_daemon(kind, page_size, start_daemon, monkeypatch):
    from hybrid_sim import HybridTwin, radixd_cache
    from radixd.sglang_hybrid import RadixdHybridCache
    from test_hybrid_backend import _run

    d = start_daemon(*HybridTwin.serve_args(kind, page_size), page_size=page_size, capacity=HybridTwin.FULL_PAGES[page_size])
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = HybridTwin(kind, page_size, lambda p: radixd_cache(kind, p), seed=900 + page_size + len(kind), eagle=True)
    assert type(twin.b.cache) is RadixdHybridCache and twin.b.cache.is_eagle == (kind == "swa")
    _run(twin, kind)


def test_eagle_hybrid_namespaces(start_daemon, monkeypatch):
    from hybrid_sim import HybridTwin, radixd_cache
    from test_hybrid_backend import OPS as HYBRID_OPS
    from test_hybrid_backend import _run

    spaces = [(None, None), ("sql-lora", None), (None, "tenant-a"), ("sql-lora", "tenant-a")]
    d = start_daemon(*HybridTwin.serve_args("swa", 16), page_size=16, capacity=HybridTwin.FULL_PAGES[16])
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = HybridTwin("swa", 16, lambda p: radixd_cache("swa", p), seed=950, spaces=spaces, eagle=True)
    _run(twin, "swa", hits=HYBRID_OPS // 400)
    assert any(space != (None, None) for space in twin.hit_spaces), twin.hit_spaces


# ----- tensor parallelism -----


def test_eagle_ranks_share_one_tree_built_as_one_rank_alone(start_daemon, tmp_path, monkeypatch):
    """Two tensor-parallel ranks with EAGLE (tp_rank_proc.py, a real gloo
    ``tp_cache_group``, LoRA and tenant requests among them): every answer
    is one rank's alone, and so is the daemon's tree, read back through the
    bigram mapping."""
    from test_tp_group import PAGES as TP_PAGES
    from test_tp_group import PS as TP_PS
    from test_tp_group import run_ranks

    monkeypatch.setenv("RADIXD_TP_EAGLE", "1")
    (alone,) = run_ranks(start_daemon(page_size=TP_PS, capacity=TP_PAGES), tmp_path, 1, "alone")
    ranks = run_ranks(start_daemon(page_size=TP_PS, capacity=TP_PAGES), tmp_path, 2, "tp2")
    assert any(op == "arrive" and n > 0 for op, n in (tuple(t) for t in alone["trace"] if t[0] == "arrive"))
    assert any(space != [None, None] and n > 0 for _, space, (n, _) in alone["tree"])
    for r, got in enumerate(ranks):
        assert got["trace"] == alone["trace"], f"rank {r}: answered otherwise than one rank alone"
        assert got["tree"] == alone["tree"] and got["stats"] == alone["stats"], f"rank {r}: another tree"
