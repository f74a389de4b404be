"""Issue 39, phase 2's second half (docs/sglang-parity.md, section 13): FULL+SWA
models on the radixd TreeCore, SGLang 0.5.23's own ``UnifiedRadixCache``
on ``tree_core_backend="radixd"`` against the same controller on SGLang's
Python core.

Twins (``hybrid_sim.HybridTwin``): SGLang's ``Req``, its ``SWAKVPool`` and
``SWATokenToKVPoolAllocator`` (on radixd's paired pools for the radixd
side), the scheduler's functions (arrival with match and lock, chunked
prefill, decode freeing the SWA slots that slid out of the window,
checkpoints, finishing, aborts, evictions of FULL and SWA); every match,
branching point, protected length, evicted amount (FULL and SWA), size
and pool's free space compared after every step, and every matched
prefix's KV read back (FULL, and SWA over its window through the
allocator's mapping)."""

from __future__ import annotations

import os

import pytest
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

import radixd
from hybrid_sim import HybridTwin
from radixd.sglang_base import HYBRID_POLICIES
from radixd.treecore import RadixdTreeCore, unified_radix_cache
from test_treecore import clients_of, streaming_server  # noqa: F401 (a fixture)

OPS = int(os.environ.get("RADIXD_SGLANG_HYBRID_OPS", "1500"))
FULL, SWA = ComponentType.FULL, ComponentType.SWA


def swa_engine(p):
    return HybridTwin.engine("swa", p.page_size)


def swa_core(backend_of):
    """SGLang's UnifiedRadixCache for FULL+SWA on the radixd TreeCore over
    ``backend_of(p)``."""

    def build(p):
        p.tree_components = (FULL, SWA)
        cache = unified_radix_cache(p, backend_of(p))
        assert type(cache) is UnifiedRadixCache and isinstance(cache.tree_core, RadixdTreeCore)
        return cache

    return build


def run(twin: HybridTwin, ops: int = OPS) -> None:
    for _ in range(ops):
        twin.step()
    twin.drain()
    backend = twin.b.cache.tree_core.backend
    backend.validate()
    c = twin.counts
    assert c["hits"] > ops // 100 and c["evictions"] > ops // 50 and c["checkpoints"] > ops // 20, c
    assert c["branch"] > 0, c
    assert backend.stats()["protected_tokens"] == 0


def run_closing(twin_of, clients, ops: int = OPS) -> HybridTwin:
    try:
        twin = twin_of()
        run(twin, ops)
        return twin
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("release", HybridTwin.RELEASES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_swa_in_process(page_size, release):
    seed = 1300 + page_size * 7 + len(release)
    twin = HybridTwin("swa", page_size, swa_core(swa_engine), seed=seed, release=release, same_evictions=True)
    run(twin)


@pytest.mark.parametrize("policy", [p for p in HYBRID_POLICIES if p != "lru"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_swa_policies_in_process(page_size, policy):
    """SGLang's controller on the radixd core under each policy served for
    hybrid models, against its own Python core on the same policy."""
    seed = 1400 + page_size + len(policy)
    engine = lambda p: HybridTwin.engine("swa", p.page_size, policy)  # noqa: E731
    twin = HybridTwin("swa", page_size, swa_core(engine), seed=seed, same_evictions=True, policy=policy)
    run(twin, max(OPS // 2, 200))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("page_size", [1, 16])
def test_swa_through_daemon(page_size, seed, start_daemon):
    d = start_daemon(
        *HybridTwin.serve_args("swa", page_size), page_size=page_size, capacity=HybridTwin.FULL_PAGES[page_size]
    )
    clients = []
    client = clients_of(d.name, clients)
    seed = 1400 + page_size * 7 + seed
    run_closing(lambda: HybridTwin("swa", page_size, swa_core(client), seed=seed, same_evictions=True), clients)


@pytest.mark.parametrize("page_size", [1, 16])
def test_swa_eagle_in_process(page_size):
    """EAGLE / MTP: both caches keyed by bigrams (``CacheInitParams.is_eagle``),
    windows and SWA lengths in bigrams (KV slots)."""
    twin = HybridTwin("swa", page_size, swa_core(swa_engine), seed=1700 + page_size, eagle=True, same_evictions=True)
    assert twin.b.cache.tree_core.is_eagle
    run(twin)


# ----- streaming sessions at the scheduler's level, FULL+SWA -----


def check_sessions(twin) -> None:
    assert twin.turns > OPS // 60 and twin.lent > twin.turns // 6, (twin.turns, twin.lent)
    assert twin.session_aborts > 2 and twin.released > 2, (twin.session_aborts, twin.released)


@pytest.mark.parametrize("page_size", [1, 16])
def test_swa_streaming_sessions_in_process(page_size):
    from hybrid_sim import HybridSessionTwin

    twin = HybridSessionTwin("swa", page_size, swa_core(swa_engine), seed=1500 + page_size, same_evictions=True)
    run(twin)
    check_sessions(twin)


@pytest.mark.parametrize("page_size", [1, 16])
def test_swa_streaming_sessions_through_daemon(page_size, start_daemon):
    from hybrid_sim import HybridSessionTwin

    d = start_daemon(
        *HybridTwin.serve_args("swa", page_size), page_size=page_size, capacity=HybridTwin.FULL_PAGES[page_size]
    )
    clients = []
    client = clients_of(d.name, clients)
    seed = 1600 + page_size
    twin = run_closing(
        lambda: HybridSessionTwin("swa", page_size, swa_core(client), seed=seed, same_evictions=True), clients
    )
    check_sessions(twin)


# ----- the factory: SGLang's own create_tree_cache, a FULL+SWA model, --enable-streaming-session -----


def test_create_tree_cache_takes_a_swa_model_with_streaming_sessions(streaming_server, start_daemon, monkeypatch):
    from sglang.srt.mem_cache.registry import create_tree_cache

    import unified_sim as us
    from hybrid_sim import build_context, swa_params

    ps = 16
    d = start_daemon(*HybridTwin.serve_args("swa", ps), page_size=ps, capacity=HybridTwin.FULL_PAGES[ps])
    monkeypatch.setenv("RADIXD_NAME", d.name)
    us._server_args(ps)
    streaming_server(page_size=ps)
    p = swa_params(ps, HybridTwin.FULL_PAGES[ps], HybridTwin.SWA_PAGES[ps], HybridTwin.window(ps))
    cache = create_tree_cache(build_context("swa", p))
    try:
        assert type(cache) is UnifiedRadixCache and isinstance(cache.tree_core, RadixdTreeCore)
        assert cache.supports_swa() and isinstance(cache.tree_core.backend, radixd.Client)
        # The SWA allocator hands out the daemon's paired pages: each new
        # FULL page maps to the SWA page radixd paired it with.
        alloc = p.token_to_kv_pool_allocator
        out = alloc.alloc(2 * ps)
        pages = (out[::ps] // ps - 1).tolist()
        peers = (alloc.full_to_swa_index_mapping[out[::ps]] // ps - 1).tolist()
        assert peers == cache.tree_core.backend.swa_pages(pages)
        assert alloc.swa_available_size() == (HybridTwin.SWA_PAGES[ps] - 2) * ps
        alloc.free(out)
        assert alloc.full_available_size() == HybridTwin.FULL_PAGES[ps] * ps
    finally:
        cache.tree_core.backend.close()


def test_what_the_core_does_not_serve_beside_a_swa_model_is_refused_by_name():
    from hybrid_sim import publish, swa_params

    ps = 16
    publish(ps)
    p = swa_params(ps, HybridTwin.FULL_PAGES[ps], HybridTwin.SWA_PAGES[ps], HybridTwin.window(ps))
    with pytest.raises(ValueError, match="--components full,swa --swa-window 40; it runs --components full$"):
        swa_core(lambda p: radixd.Engine(ps, HybridTwin.FULL_PAGES[ps], recency="sglang"))(p)
    p = swa_params(ps, HybridTwin.FULL_PAGES[ps], HybridTwin.SWA_PAGES[ps], HybridTwin.window(ps))
    cache = swa_core(swa_engine)(p)
    core = cache.tree_core
    with pytest.raises(NotImplementedError, match="SGLANG_OPT_RELEASE_PREFILL_SWA"):
        core.dec_swa_lock_only(0, None)
    with pytest.raises(NotImplementedError, match="an SWA host pool"):
        core.finish_swa_state_eviction(0)
    with pytest.raises(NotImplementedError, match="emits no action"):
        core.set_component_device_value(0, SWA, None)
