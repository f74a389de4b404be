"""EAGLE / MTP speculative decoding: SGLang's ``RadixCache`` built with
``is_eagle`` (its tree keyed by bigrams, ``RadixKey(is_bigram=True)``)
against radixd's ``RadixdPrefixCache`` built with it, under the same random
scheduler operations (arrivals, chunked prefill, verify steps committing
one to four tokens, finishing, aborting, eviction under pressure): every
match length, ``cache_protected_len``, eviction and size must agree, and
every matched prefix must read back its own tokens' KV. radixd keys raw
tokens ``1..N`` in a namespace of token 0 (``radixd.bigram_key``), composed
with the LoRA / tenant namespaces; then the key semantics one by one, the
namespace table running full, and the refusal that remains."""

from __future__ import annotations

import dataclasses
import os
from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

import radixd
from radixd.sglang import RadixdPrefixCache, radixd_cache_factory
from sim import Twin, build_context, params

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


def test_eagle_with_a_hybrid_model_is_refused():
    for change in (dict(is_hybrid_swa=True), dict(is_hybrid_ssm=True)):
        p = params(16, 8)
        p.is_eagle = True
        with pytest.raises(ValueError, match="EAGLE speculative decoding .* with a hybrid"):
            radixd_cache_factory(dataclasses.replace(build_context(p), **change))
