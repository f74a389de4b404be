"""Issue 37, item 3: the ``radixd serve`` line SGLang's factory prints is the
one under which radixd answers as SGLang's trees (``--recency sglang``:
a match that splits a node touches its lower half, as SGLang's
``_split_node`` does), and the backends log the daemon's rule at start-up,
warning when it is not SGLang's.

Each scenario runs SGLang's own cache and the ``radixd`` backend built by
SGLang's registry factory over a daemon started from exactly the line the
factory printed when no daemon ran."""

from __future__ import annotations

import logging
import os
import shlex
from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

import radixd


def _key(tokens) -> RadixKey:
    return RadixKey(array("q", tokens))


def _printed_line(build, monkeypatch) -> str:
    """The ``radixd serve`` line the factory prints when no daemon runs."""
    missing = f"radixd-recency-missing-{os.getpid()}"
    monkeypatch.setenv("RADIXD_NAME", missing)
    with pytest.raises(RuntimeError, match="Start one first") as e:
        build()
    text = str(e.value)
    line = text[text.index("`radixd serve") + 1 :]
    return line[: line.index("`")]


def _daemon_of(line: str, start_daemon, monkeypatch):
    """A daemon started with ``line``'s flags (under a name of this test)."""
    words = shlex.split(line)
    assert words[:2] == ["radixd", "serve"], line
    flags, sizes, rest = words[2:], {}, []
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag in ("--page-size", "--capacity"):
            sizes[flag[2:].replace("-", "_")] = int(value)
        elif flag != "--name":
            rest += [flag, value]
    d = start_daemon(*rest, **sizes)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    return d


def _mamba_scenario(cache) -> int:
    """FULL+MAMBA, page size 1: insert A (20 tokens) and B (10), each with a
    state at its end; match A[:10]+[999] (splits A at 10: the upper half has
    no state, so the match answers 0); evict 10 tokens; match A+[999].
    SGLang's split touched A's lower half, so B is the least recently used
    leaf and goes: A still answers 20."""
    alloc = cache.token_to_kv_pool_allocator
    slots = cache.req_to_token_pool.mamba_allocator
    a, b = list(range(1000, 1020)), list(range(2000, 2010))
    for tokens in (a, b):
        params = InsertParams(key=_key(tokens), value=alloc.alloc(len(tokens)))
        params.mamba_value = slots.alloc(1)
        assert cache.insert(params).prefix_len == 0
    assert cache.match_prefix(MatchPrefixParams(key=_key(a[:10] + [999]))).device_prefix_len == 0
    assert cache.evict(EvictParams(num_tokens=10)).num_tokens_evicted == 10
    return cache.match_prefix(MatchPrefixParams(key=_key(a + [999]))).device_prefix_len


def test_the_hybrid_factorys_line_answers_as_unified_radix_cache(start_daemon, monkeypatch, caplog):
    from hybrid_sim import HybridTwin, mamba_params, publish, radixd_cache, sglang_cache

    def params():
        publish(1)
        return mamba_params(1, HybridTwin.FULL_PAGES[1], HybridTwin.SLOTS[1])

    line = _printed_line(lambda: radixd_cache("mamba", params()), monkeypatch)
    _daemon_of(line, start_daemon, monkeypatch)
    caplog.set_level(logging.INFO, logger="radixd")
    ours = radixd_cache("mamba", params())
    theirs = sglang_cache("mamba", params())
    assert _mamba_scenario(theirs) == 20
    assert _mamba_scenario(ours) == 20, f"radixd over `{line}`"
    ours.backend.validate()
    assert line.endswith(" --recency sglang") and ours.backend.recency == "sglang", line
    assert any("recency sglang" in r.getMessage() for r in caplog.records), caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_the_full_factorys_line_answers_as_radix_cache(start_daemon, monkeypatch, caplog):
    """The same for full-attention models: SGLang's ``RadixCache`` and the
    ``radixd`` backend over the printed line's daemon evict the same leaf
    after a split (issue 29's scenario)."""
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sim import params, radixd_cache

    line = _printed_line(lambda: radixd_cache(params(1, 16)), monkeypatch)
    _daemon_of(line, start_daemon, monkeypatch)
    caplog.set_level(logging.INFO, logger="radixd")
    found = []
    for cache in (RadixCache(params(1, 16)), radixd_cache(params(1, 16))):
        for tokens in ((1, 2, 3, 4), (9, 9)):
            kv = cache.token_to_kv_pool_allocator.alloc(len(tokens))
            cache.insert(InsertParams(key=_key(tokens), value=kv))
        cache.match_prefix(MatchPrefixParams(key=_key((1, 2))))  # splits [1, 2 | 3, 4]
        cache.evict(EvictParams(num_tokens=2))
        found.append([cache.match_prefix(MatchPrefixParams(key=_key(t))).device_prefix_len for t in ((1, 2, 3, 4), (9, 9))])
    assert found == [[4, 0], [4, 0]], f"radixd over `{line}`"
    assert line.endswith(" --recency sglang"), line
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@pytest.mark.parametrize("kind", ["full", "mamba"])
def test_a_daemon_on_exact_recency_is_logged_and_warned_about(kind, start_daemon, monkeypatch, caplog):
    """A daemon started without ``--recency`` runs ``exact``: the factory
    still builds the cache (every answer is a correct cache's), logs the
    rule and warns, naming the flag for SGLang's answers; the scenario then
    shows what differs."""
    from hybrid_sim import HybridTwin, mamba_params, publish
    from hybrid_sim import radixd_cache as hybrid_cache
    from sim import params, radixd_cache

    if kind == "mamba":
        publish(1)
        p = mamba_params(1, HybridTwin.FULL_PAGES[1], HybridTwin.SLOTS[1])
        d = start_daemon("--components", "full,mamba", "--mamba-capacity", str(HybridTwin.SLOTS[1]),
                         page_size=1, capacity=HybridTwin.FULL_PAGES[1])
    else:
        p = params(1, 16)
        d = start_daemon(page_size=1, capacity=16)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    caplog.set_level(logging.INFO, logger="radixd")
    cache = hybrid_cache("mamba", p) if kind == "mamba" else radixd_cache(p)
    assert cache.backend.recency == "exact"
    assert any("recency exact" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO), caplog.text
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "--recency sglang" in warned[0] and repr(d.name) in warned[0], warned
    if kind == "mamba":
        # radixd's exact rule: A's lower half kept its insert's use, older
        # than B's, so it goes and A's state with it.
        assert _mamba_scenario(cache) == 0
    cache.backend.validate()
