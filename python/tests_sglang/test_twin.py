"""SGLang's RadixCache and radixd's RadixdPrefixCache under the same random
scheduler operations (arrivals, chunked prefill, decode, finishing,
aborting, eviction under pressure), through SGLang's own Req,
ReqToTokenPool, allocators and scheduler functions: every match length,
cache_protected_len, eviction and size must agree. radixd runs with
``recency="sglang"`` (``radixd serve --recency sglang``): SGLang touches the
node it splits, so its partial evictions take other leaves than radixd's
exact default would."""

from __future__ import annotations

import os

import pytest

import radixd
from radixd.sglang import RadixdPrefixCache
from sim import Twin

OPS = int(os.environ.get("RADIXD_SGLANG_OPS", "12500"))
PAGES = 48


@pytest.mark.parametrize("page_size", [1, 16])
def test_in_process(page_size):
    twin = Twin(page_size, PAGES, lambda p: RadixdPrefixCache(p, radixd.Engine(page_size, PAGES, recency="sglang")), seed=page_size, lru=True)
    for _ in range(OPS):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.evictions > OPS // 20 and twin.hits > OPS // 50


@pytest.mark.parametrize("page_size", [1, 16])
def test_through_daemon(page_size, start_daemon, monkeypatch):
    from sim import radixd_cache

    d = start_daemon("--recency", "sglang", page_size=page_size, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = Twin(page_size, PAGES, radixd_cache, seed=100 + page_size, lru=True)
    assert type(twin.b.cache) is RadixdPrefixCache
    for _ in range(OPS):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.evictions > OPS // 20 and twin.hits > OPS // 50


def test_partial_evictions_follow_sglang_lru():
    twin = Twin(1, PAGES, lambda p: RadixdPrefixCache(p, radixd.Engine(1, PAGES, recency="sglang")), seed=1, lru=True)
    for _ in range(OPS):
        twin.step()


def test_a_split_touches_its_lower_half_as_sglang_does():
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sim import params

    def key(*t):
        return RadixKey(array("q", t))

    found = []
    caches = (
        RadixCache(params(1, 16)),
        RadixdPrefixCache(params(1, 16), radixd.Engine(1, 16, recency="sglang")),
        RadixdPrefixCache(params(1, 16), radixd.Engine(1, 16)),
    )
    for cache in caches:
        for t in ((1, 2, 3, 4), (9, 9)):
            kv = cache.token_to_kv_pool_allocator.alloc(len(t))
            cache.insert(InsertParams(key=key(*t), value=kv))
        cache.match_prefix(MatchPrefixParams(key=key(1, 2)))  # splits [1, 2 | 3, 4]
        cache.evict(EvictParams(num_tokens=2))
        found.append([cache.match_prefix(MatchPrefixParams(key=key(*t))).device_prefix_len for t in ((1, 2, 3, 4), (9, 9))])
    assert found[0] == [4, 0]  # SGLang: [9, 9] is the least recently used
    assert found[1] == found[0]
    # radixd's default (exact recency): the match used [1, 2] only; [3, 4]
    # is as old as its insert, older than [9, 9].
    assert found[2] == [2, 2]


# LoRA adapters (extra_key), tenants (cache_salt), both, an empty extra_key
# (a namespace of its own in SGLang) and none: SGLang keeps one subtree per
# pair, radixd one namespace; eviction is one LRU over all in both.
SPACES = [(None, None), ("lora-1", None), ("lora-2", None), (None, "tenant-a"), ("lora-1", "tenant-a"), ("", None)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_namespaces_in_process(page_size):
    make = lambda p: RadixdPrefixCache(p, radixd.Engine(page_size, PAGES, recency="sglang"))  # noqa: E731
    twin = Twin(page_size, PAGES, make, seed=200 + page_size, lru=True, spaces=SPACES)
    for _ in range(OPS // 2):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.evictions > OPS // 40 and twin.hits > OPS // 200
    assert twin.hit_spaces == set(SPACES), "every namespace was hit"


def test_namespaces_through_daemon(start_daemon, monkeypatch):
    from sim import radixd_cache

    d = start_daemon("--recency", "sglang", page_size=4, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = Twin(4, PAGES, radixd_cache, seed=300, lru=True, spaces=SPACES)
    for _ in range(OPS // 2):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.evictions > OPS // 40 and twin.hits > OPS // 200
    assert twin.hit_spaces == set(SPACES), "every namespace was hit"
