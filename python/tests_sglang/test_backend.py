"""The registered backend as SGLang builds it: the plugin's entry point,
the factory's start-up errors and refusals, and the allocator it installs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import radixd
from radixd.sglang import RadixdPrefixCache, radixd_cache_factory
from sim import build_context, params


def test_entry_point_registers_the_backend():
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, registered_radix_cache_backends

    assert "radixd" in registered_radix_cache_backends()
    assert get_radix_cache_factory("radixd") is radixd_cache_factory


def test_missing_daemon_is_a_start_up_error(monkeypatch):
    monkeypatch.setenv("RADIXD_NAME", "radixd-none-such-daemon")
    with pytest.raises(RuntimeError, match="radixd serve --name radixd-none-such-daemon --page-size 16 --capacity 8"):
        radixd_cache_factory(build_context(params(16, 8)))


@pytest.mark.parametrize(
    "change, option",
    [
        (dict(enable_hierarchical_cache=True), "--enable-hierarchical-cache"),
        (dict(is_hybrid_swa=True, is_hybrid_ssm=True), "both sliding-window and Mamba"),
        (dict(tp_size=2), "--tp-size"),
    ],
)
def test_unsupported_options_are_refused(change, option):
    ctx = dataclasses.replace(build_context(params(16, 8)), **change)
    with pytest.raises(ValueError, match=option):
        radixd_cache_factory(ctx)


def test_parallelism_that_is_not_one_lockstep_is_refused(monkeypatch):
    for field, option in (("pp_size", "--pp-size"), ("attn_cp_size", "context parallelism")):
        p = params(16, 8)
        setattr(p, field, 2)
        with pytest.raises(ValueError, match=option):
            radixd_cache_factory(build_context(p))
    # Data-parallel attention: a KV pool per attention-DP rank.
    from sglang.srt.server_args import ServerArgs

    ctx = dataclasses.replace(build_context(params(16, 8)), server_args=ServerArgs(model_path="dummy"))
    monkeypatch.setattr("radixd.sglang._serving_args", lambda ctx: type("S", (), {"enable_dp_attention": True})())
    with pytest.raises(ValueError, match="--enable-dp-attention"):
        radixd_cache_factory(ctx)


def test_tlru_beside_what_the_treecore_does_not_serve_is_refused():
    # EAGLE is served (test_eagle.py);
    # lfu, fifo, mru, filo, priority and slru are served (test_policies.py);
    # tlru, which only a UnifiedRadixCache passes SGLang's create_tree_cache
    # with, on the radixd TreeCore (test_treecore.py): beside it, what the
    # core does not serve is refused naming it, before any daemon is asked.
    p = params(16, 8, eviction_policy="tlru", eviction_policy_config={"threshold": 8, "next_prompt_estimate": 2})
    ctx = build_context(p)
    ctx.is_hybrid_swa = True
    with pytest.raises(ValueError, match="--radix-eviction-policy tlru with a hybrid model"):
        radixd_cache_factory(ctx)
    streaming = dataclasses.replace(build_context(p), tp_size=4)
    with pytest.raises(ValueError, match="--tp-size above 1 without a tensor-parallel process group"):
        radixd_cache_factory(streaming)


def test_pool_sizes_must_agree(start_daemon, monkeypatch):
    d = start_daemon(page_size=16, capacity=32)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    with pytest.raises(ValueError, match="--capacity 8"):
        radixd_cache_factory(build_context(params(16, 8)))


def test_a_hybrid_daemon_is_refused_for_a_full_attention_model(start_daemon, monkeypatch):
    d = start_daemon("--components", "full,swa", "--swa-window", "64", page_size=16, capacity=8)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    with pytest.raises(ValueError, match="--components full,swa"):
        radixd_cache_factory(build_context(params(16, 8)))


def test_allocator_hands_out_radixd_pages(start_daemon, monkeypatch):
    d = start_daemon(page_size=16, capacity=8)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    p = params(16, 8)
    alloc = p.token_to_kv_pool_allocator
    cache = radixd_cache_factory(build_context(p))
    assert isinstance(cache, RadixdPrefixCache) and cache.token_to_kv_pool_allocator is alloc
    assert alloc.available_size() == 8 * 16
    # Another process of the same KV buffer: it binds the scheduler's pool
    # (an unbound client may not fill a bound pool).
    with radixd.Client(d.name, pool=cache.backend.pool) as other:
        taken = other.alloc(3)
        assert alloc.available_size() == 5 * 16  # one pool, shared
        out = alloc.alloc(32)
        # SGLang page = radixd page + 1 (page 0 is SGLang's padding).
        pages = set((out // 16 - 1).tolist())
        assert len(out) == 32 and not pages & set(taken) and 0 not in set((out // 16).tolist())
        assert alloc.alloc(4 * 16) is None  # 3 left
        alloc.free(out)
        assert alloc.available_size() == 5 * 16
        other.free(taken)
    assert alloc.available_size() == 8 * 16
    # A free group releases once, at its end.
    out = alloc.alloc(16)
    alloc.free_group_begin()
    alloc.free(out)
    assert alloc.available_size() == 7 * 16
    alloc.free_group_end()
    assert alloc.available_size() == 8 * 16
    assert torch.equal(cache.path_device_indices(cache.root_node), torch.empty(0, dtype=torch.int64))


def test_namespaced_requests_are_cached_apart():
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sim import Sim

    p = params(4, 16)
    sim = Sim(RadixdPrefixCache(p, radixd.Engine(4, 16)), p)
    sim.arrive("a", list(range(8)))
    sim.extend("a", 8)
    assert sim.checkpoint("a") == 8
    tokens = array("q", range(8))
    assert sim.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).device_prefix_len == 8
    for salted in (RadixKey(tokens, extra_key="lora-1"), RadixKey(tokens, cache_salt="s")):
        assert sim.cache.match_prefix(MatchPrefixParams(key=salted)).device_prefix_len == 0
    sim.finish("a")
    assert sim.cache.total_size() == 8
    # The same tokens under a LoRA adapter are cached in its namespace.
    sim.arrive("b", list(range(8)), ("lora-1", None))
    sim.extend("b", 8)
    assert sim.checkpoint("b") == 8
    sim.finish("b")
    assert sim.cache.total_size() == 16
    lora = RadixKey(tokens, extra_key="lora-1")
    assert sim.cache.match_prefix(MatchPrefixParams(key=lora)).device_prefix_len == 8
    salted = RadixKey(tokens, extra_key="lora-1", cache_salt="s")
    assert sim.cache.match_prefix(MatchPrefixParams(key=salted)).device_prefix_len == 0


def test_a_cache_of_its_own_from_an_engine():
    # The first try: RadixdPrefixCache(radixd.Engine(4, 256)).
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import (
        BasePrefixCache,
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey

    cache = RadixdPrefixCache(radixd.Engine(4, 256))
    assert isinstance(cache, BasePrefixCache)
    assert cache.insert(InsertParams(key=RadixKey(array("q", range(10))))).prefix_len == 0
    assert cache.insert(InsertParams(key=RadixKey(array("q", range(12))))).prefix_len == 8
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(list(range(13)))))
    assert m.device_prefix_len == 12
    assert len(cache.path_device_indices(m.last_device_node)) == 12
    assert cache.inc_lock_ref(m.last_device_node).delta == -12
    assert cache.evict(EvictParams(num_tokens=12)).num_tokens_evicted == 0
    assert cache.dec_lock_ref(m.last_device_node).delta == 12
    assert cache.evict(EvictParams(num_tokens=4)).num_tokens_evicted == 4
    assert cache.total_size() == 8 and cache.evictable_size() == 8
    cache.backend.validate()


def test_older_names_cache_unfinished_and_finished_requests():
    from sim import Sim

    p = params(4, 16)
    sim = Sim(RadixdPrefixCache(p, radixd.Engine(4, 16)), p)
    sim.arrive("a", list(range(10)))
    sim.extend("a", 6)
    req = sim.running["a"]
    sim.cache.cache_unfinished_req(req, chunked=True)
    assert req.kv.cache_protected_len == 4 and sim.cache.total_size() == 4
    sim.extend("a", 4)
    sim.running.pop("a")
    sim.cache.cache_finished_req(req)
    assert sim.cache.total_size() == 8 and sim.cache.protected_size() == 0
    assert sim.alloc.available_size() == 16 * 4 - 8


def test_a_lock_finds_a_prefix_another_scheduler_evicted_and_recached(start_daemon):
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    d = start_daemon(page_size=4, capacity=16)
    cache = RadixdPrefixCache(d.client())
    key = RadixKey(array("q", range(8)))
    cache.insert(InsertParams(key=key))
    node = cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
    before = cache.path_device_indices(node).tolist()
    with d.client() as other:  # another scheduler: evicts, then caches it again elsewhere
        blocker = other.alloc(2)
        assert other.evict(8) == 8
        other.insert(list(range(8)), other.alloc(2))
        other.free(blocker)
    assert cache.inc_lock_ref(node).delta == -8
    after = cache.path_device_indices(node).tolist()
    assert after != before and len(after) == 8
    cache.dec_lock_ref(node)
    node = cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
    with d.client() as other:
        other.evict(8)
    with pytest.raises(RuntimeError, match="evicted 8 tokens of a matched prefix"):
        cache.inc_lock_ref(node)
