"""radixd's node store as the L3 of SGLang 0.5.23's own HiCache, end to end:
SGLang's ``UnifiedRadixCache`` with ``init_hicache`` (its controller, host
pool, write-through, storage threads, prefetch and load-back), on the CPU
(:mod:`hicache_cpu`), with ``RadixdStorage`` built by SGLang's ``dynamic``
backend factory over a real daemon's store. Two servers, each its own tree
and pools: what one computed reaches the other's device through the store,
holding the very KV the first wrote; every decision (what was prefetched,
the host hit, what was loaded back) is the one SGLang makes over its own
``HiCacheFile`` L3 for the same requests."""

from __future__ import annotations

from array import array

import pytest
import torch
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_extend, alloc_req_slots, alloc_token_slots
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams
from sglang.srt.mem_cache.common import match_kv_cache, release_kv_cache
from sglang.srt.sampling.sampling_params import SamplingParams

import hicache_cpu as hc


@pytest.fixture(autouse=True)
def cpu_hicache():
    hc.install()
    yield
    from sim import publish_runtime

    publish_runtime()


def request(rid: str, tokens: list) -> Req:
    req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=4))
    req.refresh_fill_ids()
    return req


def prefill(cache, p, req: Req) -> None:
    """Match, lock, the prefill's allocation and the forward's KV writes, and
    the release that caches the prompt (write-through backs it up)."""
    match_kv_cache(req, cache)
    req.lock = cache.lock(req.last_node)
    pool = p.req_to_token_pool
    alloc_req_slots(pool, [req], cache)
    n, end, row = req.prefix_len, len(req.origin_input_ids), req.kv.req_pool_idx
    if n:
        pool.write((row, slice(0, n)), cache.prefix_device_indices(req))
    req.kv.cache_protected_len = n
    if p.page_size == 1:
        out = alloc_token_slots(cache, end - n)
    else:
        last = pool.req_to_token[row, n - 1 : n].to(torch.int64) if n else torch.full((1,), -1)
        t = torch.tensor
        out = alloc_paged_token_slots_extend(cache, t([n]), t([n]), t([end]), t([end]), last, end - n)
    pool.write((row, slice(n, end)), out)
    hc.write_kv(cache, out, torch.tensor(req.origin_input_ids[n:end]))
    req.kv.kv_committed_len = req.kv.kv_allocated_len = end
    req.finished_reason = FINISH_LENGTH(0)
    release_kv_cache(req, cache, checkpoint=True)
    # The write-through and the storage backup run beside the scheduler.
    hc.settle(cache, lambda: not cache.ongoing_write_through and not cache.ongoing_backup)


def fetch(cache, tokens: list, rid: str) -> dict:
    """A request arriving at a server whose device and host lack (part of)
    ``tokens``: the scheduler's prefetch from the L3, then its match and
    load-back. Answers each decision, and the device KV of the prefix."""
    req = request(rid, tokens)
    match_kv_cache(req, cache)
    before = (req.prefix_len, req.host_hit_length)
    hc.prefetch(cache, req)
    hc.settle(cache, lambda: cache.check_prefetch_progress(req.cache_request_handle))
    span = cache.pop_prefetch_loaded_span(req.cache_request_handle)
    match_kv_cache(req, cache)
    hit = (req.prefix_len, req.host_hit_length)
    req.lock = cache.lock(req.last_node)
    loaded, node = cache.init_load_back(
        InitLoadBackParams(best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req)
    )
    cache.ready_to_load_host_cache()
    hc.settle(cache, lambda: not cache.ongoing_load_back)
    cache.unlock(req.lock)
    # A later request's match reads the loaded prefix off the device.
    again = request(rid + "'", tokens)
    match_kv_cache(again, cache)
    slots = cache.prefix_device_indices(again)
    holds = hc.kv_holds(cache, slots, torch.tensor(tokens[: len(slots)]))
    return {
        "before": before,
        "prefetched": span[0],
        "hit": hit,
        "loaded": loaded,
        "device": again.prefix_len,
        "holds": holds,
    }


#: The prompts' pieces come in multiples of 16 tokens: whole pages at page
#: size 16, and above SGLang's load-back threshold (10 tokens) at 1.
UNIT = 16


def two_servers(ps: int, storage: str, extra: dict) -> tuple:
    args = hc.server_args(ps, storage, {**extra, "prefetch_threshold": ps})
    return hc.server(args, ps, 1024), hc.server(args, ps, 1024)


def flow(ps: int, storage: str, extra: dict) -> list:
    """Server A computes a prompt and a second one sharing its first half;
    server B then gets both, each with its own suffix past them, and a third
    whose first half B computed itself (the store serves only the rest,
    keyed from B's own host node)."""
    (a, pa), (b, pb) = two_servers(ps, storage, extra)
    u = UNIT
    base = list(range(1000, 1000 + 8 * u))
    first = base + list(range(2000, 2000 + 8 * u))
    second = base + list(range(3000, 3000 + 4 * u))
    third = list(range(5000, 5000 + 4 * u)) + list(range(6000, 6000 + 4 * u))
    try:
        for i, tokens in enumerate((first, second, third)):
            prefill(a, pa, request(f"a{i}", tokens))
        prefill(b, pb, request("b-own", third[: 4 * u]))
        return [
            fetch(b, first + [7, 7, 7], "b0"),
            fetch(b, second + [8], "b1"),
            fetch(b, third + [9, 9], "b2"),
        ]
    finally:
        # SGLang's shutdown: the storage threads stop, the backends close.
        a.shutdown()
        b.shutdown()


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_prefix_one_server_computed_reaches_another_through_the_store(page_size, start_daemon, tmp_path, monkeypatch):
    d = start_daemon("--store", "64MiB")
    got = flow(page_size, "dynamic", {**hc.RADIXD_L3, "name": d.name})
    u = UNIT
    # What B could not have had but from the store, with A's very KV.
    assert [g["holds"] for g in got] == [True, True, True], got
    assert got[0]["before"] == (0, 0) and got[0]["prefetched"] == got[0]["device"] == 16 * u, got[0]
    assert got[1]["before"] == (8 * u, 0) and got[1]["prefetched"] == 4 * u and got[1]["device"] == 12 * u, got[1]
    assert sum(got[2]["before"]) == 4 * u and got[2]["prefetched"] == 4 * u and got[2]["device"] == 8 * u, got[2]
    # SGLang's own L3 (HiCacheFile) makes every decision the same way.
    monkeypatch.setenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", str(tmp_path / "hicache-file"))
    assert flow(page_size, "file", {}) == got
