"""SGLang 0.5.23's UnifiedRadixCache and radixd's hybrid backend (built by
SGLang's registry factory through a daemon, or on an in-process engine)
under the same random scheduler steps, FULL+SWA and FULL+MAMBA, page sizes
1 and 16: arrivals (match, Mamba copy-on-write, lock, request slots),
chunked prefill, decode (freeing the SWA slots that slid out of the
window), checkpoints, finishing, aborts and evictions. Every match length,
branching point, copy-on-write source, protected length, evicted amount,
size and pool's free space agrees after every step, and every matched
prefix's KV slots hold its own tokens (FULL; SWA over its window; the
copied state its own prefix's).

Requests finish in arrival order, newest first, or at random (checkpoints
move locks whenever they come): each lock releases exactly the window it
took, as SGLang's receipt does (issue 29). radixd runs with SGLang's recency
rule (``recency="sglang"``, ``radixd serve --recency sglang``): partial FULL
evictions are compared, and SGLang's split touches the node's lower half."""

from __future__ import annotations

import os

import pytest
import torch

import radixd
from hybrid_sim import HybridTwin
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from radixd.sglang_base import HYBRID_POLICIES
from radixd.sglang_hybrid import RadixdHybridCache

OPS = int(os.environ.get("RADIXD_SGLANG_HYBRID_OPS", "1500"))
RELEASE_ORDERS = list(HybridTwin.RELEASES)


def _engine_cache(kind: str, page_size: int):
    def build(p):
        p.tree_components = None
        return RadixdHybridCache(p, HybridTwin.engine(kind, page_size))

    return build


def _run(twin: HybridTwin, kind: str, hits: int = OPS // 100) -> None:
    """``hits``: arrivals that must have hit (fewer when the prompts are
    spread over namespaces)."""
    for _ in range(OPS):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    c = twin.counts
    assert c["hits"] > hits and c["evictions"] > OPS // 50 and c["checkpoints"] > OPS // 20, c
    assert c["branch"] > 0, c
    if kind == "mamba":
        assert c["cow"] > 0, c
    s = twin.b.cache.backend.stats()
    assert s["protected_tokens"] == 0


@pytest.mark.parametrize("release", RELEASE_ORDERS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_in_process(kind, page_size, release):
    twin = HybridTwin(kind, page_size, _engine_cache(kind, page_size), seed=page_size * 7 + len(kind), release=release)
    _run(twin, kind)


@pytest.mark.parametrize("release", RELEASE_ORDERS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_through_daemon(kind, page_size, release, start_daemon, monkeypatch):
    from hybrid_sim import radixd_cache

    d = start_daemon(*HybridTwin.serve_args(kind, page_size), page_size=page_size, capacity=HybridTwin.FULL_PAGES[page_size])
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = HybridTwin(kind, page_size, lambda p: radixd_cache(kind, p), seed=100 + page_size * 7 + len(kind), release=release)
    assert type(twin.b.cache) is RadixdHybridCache
    _run(twin, kind)


# The policies other than LRU served for hybrid models (the factory
# refuses the rest, test_policies.py): fewer steps each, every answer
# compared all the same.
POLICY_OPS = max(OPS // 2, 200)


@pytest.mark.parametrize("policy", [p for p in HYBRID_POLICIES if p != "lru"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_policies_in_process(kind, page_size, policy):
    """Each policy's victims are SGLang's (``UnifiedRadixCache`` on
    ``--radix-eviction-policy P``, radixd's engine on the same policy and
    the recency rule ``unified_recency`` names)."""

    def build(p):
        p.tree_components = None
        return RadixdHybridCache(p, HybridTwin.engine(kind, page_size, policy))

    twin = HybridTwin(kind, page_size, build, seed=900 + page_size + len(kind) + len(policy), policy=policy)
    for _ in range(POLICY_OPS):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.counts["evictions"] > POLICY_OPS // 50, twin.counts


@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_a_policy_through_the_factory_and_a_daemon(kind, start_daemon, monkeypatch):
    from hybrid_sim import radixd_cache

    ps, policy = 16, "mru"
    d = start_daemon(*HybridTwin.serve_args(kind, ps, policy), page_size=ps, capacity=HybridTwin.FULL_PAGES[ps])
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = HybridTwin(kind, ps, lambda p: radixd_cache(kind, p), seed=950 + len(kind), policy=policy)
    assert type(twin.b.cache) is RadixdHybridCache and twin.b.cache.backend.eviction_policy == policy
    for _ in range(POLICY_OPS):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()


@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_lora_adapters_and_tenants_are_namespaces(kind, start_daemon, monkeypatch):
    """Requests of LoRA adapters (``extra_key``) and tenants
    (``cache_salt``) match only their own prefixes, in SGLang's
    ``UnifiedRadixCache`` as in radixd's namespaces: the twin agrees on
    every answer, and namespaced requests hit their own prefixes."""
    from hybrid_sim import radixd_cache

    ps = 16
    spaces = [(None, None), ("sql-lora", None), (None, "tenant-a"), ("sql-lora", "tenant-a")]
    d = start_daemon(*HybridTwin.serve_args(kind, ps), page_size=ps, capacity=HybridTwin.FULL_PAGES[ps])
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = HybridTwin(kind, ps, lambda p: radixd_cache(kind, p), seed=500 + len(kind), spaces=spaces)
    _run(twin, kind, hits=OPS // 400)
    assert any(space != (None, None) for space in twin.hit_spaces), twin.hit_spaces


# ----- start-up: the factory, its checks and refusals -----


def _params(kind: str, page_size: int = 16):
    """SGLang's pools of the twin tests' model, for the factory."""
    from hybrid_sim import mamba_params, publish, swa_params

    publish(page_size)
    ps = page_size
    if kind == "swa":
        return swa_params(ps, HybridTwin.FULL_PAGES[ps], HybridTwin.SWA_PAGES[ps], HybridTwin.window(ps))
    return mamba_params(ps, HybridTwin.FULL_PAGES[ps], HybridTwin.SLOTS[ps])


@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_a_missing_daemon_names_the_serve_line(kind, monkeypatch):
    from hybrid_sim import radixd_cache

    monkeypatch.setenv("RADIXD_NAME", "radixd-none-such-hybrid")
    line = "radixd serve --name radixd-none-such-hybrid --page-size 16 --capacity 40 --components " + (
        "full,swa --swa-window 40 --swa-capacity 24" if kind == "swa" else "full,mamba --mamba-capacity 14"
    )
    with pytest.raises(RuntimeError, match=line):
        radixd_cache(kind, _params(kind))


@pytest.mark.parametrize(
    "kind, serve, capacity",
    [
        ("swa", (), 40),  # a full-attention daemon
        ("swa", ("--components", "full,swa", "--swa-window", "64", "--swa-capacity", "24"), 40),  # another window
        ("swa", ("--components", "full,swa", "--swa-window", "40"), 40),  # SWA pool as large as FULL's
        ("swa", ("--components", "full,swa", "--swa-window", "40", "--swa-capacity", "24"), 48),  # FULL pool
        ("mamba", ("--components", "full,swa", "--swa-window", "40"), 40),  # the other component
        ("mamba", ("--components", "full,mamba", "--mamba-capacity", "8"), 40),  # fewer states
    ],
)
def test_a_daemon_of_other_components_is_a_start_up_error(kind, serve, capacity, start_daemon, monkeypatch):
    from hybrid_sim import radixd_cache

    d = start_daemon(*serve, page_size=16, capacity=capacity)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    line = f"radixd serve --name {d.name} --page-size 16 --capacity 40 --components " + (
        "full,swa --swa-window 40 --swa-capacity 24" if kind == "swa" else "full,mamba --mamba-capacity 14"
    )
    with pytest.raises(ValueError, match=line):
        radixd_cache(kind, _params(kind))


@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_the_factory_builds_the_hybrid_cache_on_the_daemon(kind, start_daemon, monkeypatch):
    from hybrid_sim import radixd_cache

    d = start_daemon(*HybridTwin.serve_args(kind, 16), page_size=16, capacity=40)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    p = _params(kind)
    cache = radixd_cache(kind, p)
    assert type(cache) is RadixdHybridCache
    assert cache.supports_swa() == (kind == "swa") and cache.supports_mamba() == (kind == "mamba")
    if kind == "swa":
        alloc = p.token_to_kv_pool_allocator
        assert alloc.full_available_size() == 40 * 16 and alloc.swa_available_size() == 24 * 16
        out = alloc.alloc_extend(*[torch.tensor([x]) for x in (0, 0, 32, 32)], torch.tensor([-1]), 32)
        # Each new FULL page is paired with the SWA page radixd paired it with.
        pages = (out[::16] // 16 - 1).tolist()
        peers = cache.backend.swa_pages(pages)
        got = (alloc.full_to_swa_index_mapping[out[::16]] // 16 - 1).tolist()
        assert got == peers and alloc.swa_available_size() == 22 * 16
        alloc.free_swa(out[:16])
        assert alloc.full_to_swa_index_mapping[out[:16]].eq(0).all() and alloc.swa_available_size() == 23 * 16
        alloc.free(out)
        assert alloc.full_available_size() == 40 * 16 and alloc.swa_available_size() == 24 * 16
    else:
        slots = p.req_to_token_pool.mamba_allocator
        assert slots.available_size() == 14
        got = slots.alloc(3)
        assert len(set(got.tolist())) == 3 and all(1 <= s <= 14 for s in got.tolist())
        assert slots.available_size() == 11 and cache.backend.stats()["mamba_free_states"] == 11
        slots.free(got)
        assert slots.available_size() == 14


def test_what_radixd_does_not_run_is_refused_by_name(start_daemon, monkeypatch):
    import dataclasses

    from hybrid_sim import build_context
    from radixd.sglang import radixd_cache_factory
    from sglang.srt.environ import envs

    monkeypatch.setenv("RADIXD_NAME", "radixd-none-such-hybrid")
    swa, mamba = build_context("swa", _params("swa")), build_context("mamba", _params("mamba"))
    cases = [
        (dataclasses.replace(swa, is_hybrid_ssm=True), "both sliding-window and Mamba"),
        (dataclasses.replace(swa, full_tokens_per_layer=0), "pure sliding-window"),
        (dataclasses.replace(mamba, enable_hierarchical_cache=True), "--enable-hierarchical-cache"),
    ]
    for ctx, what in cases:
        with pytest.raises(ValueError, match=what):
            radixd_cache_factory(ctx)
    with envs.SGLANG_OPT_RELEASE_PREFILL_SWA.override(True), pytest.raises(ValueError, match="SGLANG_OPT_RELEASE_PREFILL_SWA"):
        radixd_cache_factory(swa)
    with envs.SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.override(True), pytest.raises(ValueError, match="SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"):
        radixd_cache_factory(mamba)
    mamba.params.enable_mamba_extra_buffer_lazy = True
    with pytest.raises(ValueError, match="--enable-mamba-extra-buffer-lazy"):
        radixd_cache_factory(mamba)


def test_a_lock_reads_the_pairing_another_scheduler_made(start_daemon, monkeypatch):
    """Scheduler B's insert recovers SWA pages onto the tree's FULL pages of
    a prefix that scheduler A cached (and whose SWA was evicted since): A's
    lock of that prefix brings A's full_to_swa_index_mapping to the new
    pairing, the SWA pages A's SWA layers then read."""
    from array import array

    from hybrid_sim import radixd_cache
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    d = start_daemon(*HybridTwin.serve_args("swa", 16), page_size=16, capacity=40)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    pa, pb = _params("swa"), _params("swa")
    a, b = radixd_cache("swa", pa), radixd_cache("swa", pb)
    tokens = array("q", range(1000, 1064))
    key = RadixKey(tokens)

    def fresh(cache, n):
        z = torch.tensor([0])
        return cache.token_to_kv_pool_allocator.alloc_extend(z, z, torch.tensor([n]), torch.tensor([n]), torch.tensor([-1]), n)

    # A caches T and T + 64 more, and holds a lock on the longer one: its
    # FULL path stays, the SWA of T's nodes (outside the longer key's
    # window) is evicted, leaving tombstones.
    longer = array("q", range(1000, 1128))
    kv = fresh(a, 128)
    a.insert(InsertParams(key=key, value=kv[:64]))
    a.insert(InsertParams(key=RadixKey(longer), value=kv))
    held = a.match_prefix(MatchPrefixParams(key=RadixKey(longer)))
    assert held.device_prefix_len == 128
    a.inc_lock_ref(held.last_device_node)
    stale = a.token_to_kv_pool_allocator.full_to_swa_index_mapping.clone()
    assert a.evict(EvictParams(swa_num_tokens=80)).swa_num_tokens_evicted == 80
    m = b.match_prefix(MatchPrefixParams(key=key))
    assert (m.device_prefix_len, m.full_kv_hit_length) == (0, 64)
    scratch = fresh(b, 64)  # B's next SWA pages are not the ones A's were
    b.insert(InsertParams(key=key, value=fresh(b, 64)))
    m = a.match_prefix(MatchPrefixParams(key=key))
    assert m.device_prefix_len == 64
    a.inc_lock_ref(m.last_device_node)
    full = a.path_device_indices(m.last_device_node)
    pages = (full[::16] // 16 - 1).tolist()
    peers = torch.tensor(a.backend.swa_pages(pages)) + 1
    mapping = a.token_to_kv_pool_allocator.full_to_swa_index_mapping
    window = slice(len(pages) - 3, len(pages))  # the pages of the last 40 tokens and one more
    assert torch.equal(mapping[full[::16]][window] // 16, peers[window])
    assert not torch.equal(stale[full[::16]][window] // 16, peers[window])
    a.dec_lock_ref(m.last_device_node)
    a.dec_lock_ref(held.last_device_node)
    b.token_to_kv_pool_allocator.free(scratch)
    a.backend.validate()


@pytest.mark.parametrize("oldest_first", [True, False])
def test_two_locks_across_a_split_release_what_each_took(oldest_first):
    """Issue 29's scenario through SGLang's own calls (``insert``,
    ``match_prefix``, ``lock``, ``unlock``) on UnifiedRadixCache and on
    RadixdHybridCache: FULL+SWA, page size 4, window 10. Lock 1 holds a
    48-token node, a match splits it at 12, lock 2 holds the same node (now
    36 tokens): each unlock gives back exactly its own window, in either
    order, so the SWA sizes agree after each."""
    from array import array

    from hybrid_sim import publish, sglang_cache, swa_params
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    ps, window = 4, 10
    publish(ps)
    tokens = array("q", range(1000, 1068))

    def run(cache):
        z = torch.tensor([0])
        n = len(tokens)
        kv = cache.token_to_kv_pool_allocator.alloc_extend(z, z, torch.tensor([n]), torch.tensor([n]), torch.tensor([-1]), n)
        params = InsertParams(key=RadixKey(tokens), value=kv)
        params.set_evicted_seqlen(ComponentType.SWA, 0)
        assert cache.insert(params).prefix_len == 0
        locks, seen = [], []
        for n, lock in ((50, True), (15, False), (50, True)):
            m = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[:n])))
            seen.append(m.device_prefix_len)
            if lock:
                locks.append(cache.lock(m.last_device_node))
        sizes = [(cache.swa_protected_size(), cache.swa_evictable_size())]
        for lock in locks if oldest_first else locks[::-1]:
            cache.unlock(lock)
            sizes.append((cache.swa_protected_size(), cache.swa_evictable_size()))
        return seen, sizes

    engine = radixd.Engine(ps, 64, components="full,swa", swa_window=window, swa_capacity=64, recency="sglang")
    ours = run(RadixdHybridCache(swa_params(ps, 64, 64, window), engine))
    assert ours == run(sglang_cache("swa", swa_params(ps, 64, 64, window)))
    assert ours[0] == [48, 12, 48]
    assert ours[1] == [(48, 20), (36, 32) if oldest_first else (48, 20), (0, 68)]
    engine.validate()
