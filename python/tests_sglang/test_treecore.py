"""Issue 39, phase 1 (docs/sglang-parity.md): the radixd TreeCore under SGLang
0.5.23's own ``UnifiedRadixCache``, against the same controller on SGLang's
own Python core (``tree_core_backend="python"``).

Twins: two ``UnifiedRadixCache``s under the same random scheduler
operations (arrivals, chunked prefill, decode, checkpoints, finishing,
aborting, eviction under pressure and asked for), through SGLang's own
``Req``, ``ReqToTokenPool``, allocators and scheduler functions; one
controller, so any difference is the core's. Every match, allocation,
``cache_protected_len``, eviction and size (evictable, protected, total,
available) is compared after every step, in-process (``radixd.Engine``) and
through a daemon (``radixd.Client``), page sizes 1 and 16, with LoRA and
tenant namespaces.
"""

from __future__ import annotations

import os

import pytest
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

import radixd
from radixd.treecore import RadixdTreeCore, unified_radix_cache
from sim import Twin

OPS = int(os.environ.get("RADIXD_SGLANG_OPS", "12500"))
PAGES = 48
SPACES = [(None, None), ("lora-1", None), (None, "tenant-a"), ("lora-1", "tenant-a")]


def python_core(p):
    """SGLang's UnifiedRadixCache on its own Python TreeCore."""
    p.tree_components = (ComponentType.FULL,)
    p.tree_core_backend = "python"
    cache = UnifiedRadixCache(params=p)
    assert type(cache.tree_core).__name__ == "UnifiedTreeCore"
    return cache


def radixd_core(backend_of):
    """SGLang's UnifiedRadixCache on the radixd TreeCore over ``backend_of(p)``."""

    def build(p):
        p.tree_components = (ComponentType.FULL,)
        cache = unified_radix_cache(p, backend_of(p))
        assert isinstance(cache.tree_core, RadixdTreeCore)
        return cache

    return build


def engine(p):
    pages = p.token_to_kv_pool_allocator.size // p.page_size
    return radixd.Engine(p.page_size, pages, recency="sglang")


def twin(page_size, backend_of, seed, pages=PAGES, **kw):
    return Twin(
        page_size, pages, radixd_core(backend_of), seed=seed, lru=True, reference=python_core, same_evictions=True, **kw
    )


def run(t, ops):
    for _ in range(ops):
        t.step()
    t.drain()
    t.b.cache.tree_core.backend.validate()
    t.b.cache.sanity_check()


@pytest.mark.parametrize("page_size", [1, 16])
def test_in_process(page_size):
    t = twin(page_size, engine, seed=400 + page_size)
    run(t, OPS)
    assert t.evictions > OPS // 20 and t.hits > OPS // 50


@pytest.mark.parametrize("page_size", [1, 16])
def test_through_daemon(page_size, start_daemon):
    d = start_daemon("--recency", "sglang", page_size=page_size, capacity=PAGES)
    clients = []

    def client(p):
        c = radixd.Client(d.name)
        clients.append(c)
        return c

    t = twin(page_size, client, seed=500 + page_size)
    assert isinstance(t.b.cache.tree_core.backend, radixd.Client)
    try:
        run(t, OPS // 2)
    finally:
        for c in clients:
            c.close()
    assert t.evictions > OPS // 40 and t.hits > OPS // 100


@pytest.mark.parametrize("page_size", [1, 16])
def test_allocations_evict_in_process(page_size):
    # No room made first: SGLang's allocation evicts what it lacks through
    # UnifiedRadixCache.evict_for_alloc, whose walk stops at the allocator's
    # target (radixd's free pages) rather than at a quota.
    # A pool of 48 tokens at page size 1, 192 at 16: allocations run short.
    t = twin(page_size, engine, seed=900 + page_size, pages=48 if page_size == 1 else 12, alloc_evicts=True)
    freed = {"a": [], "b": []}
    for side in ("a", "b"):
        cache = getattr(t, side).cache
        own = cache.evict_for_alloc

        def counted(params, *, _own=own, _side=side, **kw):
            result = _own(params, **kw)
            freed[_side].append(result.num_tokens_evicted)
            return result

        cache.evict_for_alloc = counted
    run(t, OPS // 2)
    assert freed["a"] == freed["b"]
    assert sum(1 for n in freed["a"] if n) > OPS // 100 and t.hits > OPS // 100, (len(freed["a"]), t.hits)


@pytest.mark.parametrize("page_size", [1, 4])
def test_namespaces_in_process(page_size):
    t = twin(page_size, engine, seed=600 + page_size, spaces=SPACES)
    run(t, OPS // 2)
    assert t.evictions > OPS // 40 and t.hit_spaces == set(SPACES), "every namespace was hit"


# ----- the factory: SGLang's own create_tree_cache with --enable-streaming-session -----


@pytest.fixture
def streaming_server():
    """SGLang's runtime config of a server started with
    ``--radix-cache-backend radixd --enable-streaming-session`` (restored
    to the suite's after the test)."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    from sim import publish_runtime

    def publish(**kw):
        args = ServerArgs(model_path="dummy", radix_cache_backend="radixd", enable_streaming_session=True, **kw)
        runtime_context.publish(args, role="scheduler")

    publish()
    yield publish
    publish_runtime()


def test_create_tree_cache_takes_streaming_sessions_on_the_radixd_core(streaming_server, start_daemon, monkeypatch):
    from sglang.srt.mem_cache.registry import create_tree_cache

    from radixd.sglang import RadixdPrefixCache
    from sim import build_context, params

    d = start_daemon("--recency", "sglang", page_size=4, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    p = params(4, PAGES)
    cache = create_tree_cache(build_context(p))
    assert type(cache) is UnifiedRadixCache and isinstance(cache.tree_core, RadixdTreeCore)
    assert isinstance(cache.tree_core.backend, radixd.Client)
    # Its allocator hands out the daemon's pages: what it allocates, the
    # daemon no longer has free.
    free = cache.tree_core.backend.stats()["free_pages"]
    slots = cache.token_to_kv_pool_allocator.alloc(8)
    assert len(slots) == 8 and cache.tree_core.backend.stats()["free_pages"] == free - 2
    cache.token_to_kv_pool_allocator.free(slots)
    assert cache.tree_core.backend.stats()["free_pages"] == free
    cache.tree_core.backend.close()

    # Without streaming sessions the factory keeps building RadixdPrefixCache.
    from sim import publish_runtime

    publish_runtime()
    cache = create_tree_cache(build_context(params(4, PAGES)))
    assert type(cache) is RadixdPrefixCache
    cache.backend.close()


def test_what_the_core_does_not_serve_beside_streaming_is_refused_by_name(streaming_server, start_daemon, monkeypatch):
    from sglang.srt.mem_cache.registry import create_tree_cache

    from sim import build_context, params

    d = start_daemon("--recency", "sglang", page_size=1, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    ctx = build_context(params(1, PAGES))
    ctx.is_hybrid_swa = True
    with pytest.raises(ValueError, match="--enable-streaming-session with a hybrid model"):
        create_tree_cache(ctx)
    with pytest.raises(ValueError, match="--enable-streaming-session with --radix-eviction-policy lfu"):
        create_tree_cache(build_context(params(1, PAGES, eviction_policy="lfu")))
    p = params(1, PAGES)
    p.is_eagle = True
    with pytest.raises(ValueError, match="--enable-streaming-session with EAGLE"):
        create_tree_cache(build_context(p))
    streaming_server(schedule_policy="dfs-weight")
    with pytest.raises(ValueError, match="--schedule-policy dfs-weight"):
        create_tree_cache(build_context(params(1, PAGES)))


def test_namespaces_through_daemon(start_daemon):
    d = start_daemon("--recency", "sglang", page_size=4, capacity=PAGES)
    clients = []

    def client(p):
        c = radixd.Client(d.name)
        clients.append(c)
        return c

    t = twin(4, client, seed=650, spaces=SPACES)
    try:
        run(t, OPS // 2)
    finally:
        for c in clients:
            c.close()
    assert t.evictions > OPS // 40 and t.hit_spaces == set(SPACES), "every namespace was hit"


def test_the_core_refuses_what_this_phase_does_not_serve_by_name():
    from sim import params

    p = params(1, PAGES)
    p.eviction_policy = "lfu"
    with pytest.raises(NotImplementedError, match="--radix-eviction-policy lfu"):
        radixd_core(engine)(p)
    p = params(1, PAGES)
    p.is_eagle = True
    with pytest.raises(NotImplementedError, match="EAGLE"):
        radixd_core(engine)(p)
    cache = radixd_core(engine)(params(1, PAGES))
    core = cache.tree_core
    with pytest.raises(NotImplementedError, match="HiCache"):
        core.set_hicache_enabled()
    with pytest.raises(NotImplementedError, match="HiCache"):
        core.inc_host_lock_ref(0)
    with pytest.raises(NotImplementedError, match="hybrid models"):
        core.dec_swa_lock_only(0, None)
    with pytest.raises(NotImplementedError, match="HiCache storage"):
        core.enable_storage = True
    core.enable_storage = False  # what UnifiedRadixCache's reset sets


# ----- streaming sessions at the scheduler's level -----


def session_twin(page_size, backend_of, seed, **kw):
    from sim import SessionTwin

    return SessionTwin(
        page_size, PAGES, radixd_core(backend_of), seed=seed, reference=python_core, lru=True, same_evictions=True, **kw
    )


@pytest.mark.parametrize("page_size", [1, 16])
def test_streaming_sessions_in_process(page_size):
    t = session_twin(page_size, engine, seed=700 + page_size)
    run(t, OPS)
    assert t.turns > OPS // 30 and t.lent > t.turns // 5, (t.turns, t.lent)
    assert t.session_aborts > 5 and t.released > 5 and t.evictions > OPS // 40


@pytest.mark.parametrize("page_size", [1, 16])
def test_streaming_sessions_through_daemon(page_size, start_daemon):
    d = start_daemon("--recency", "sglang", page_size=page_size, capacity=PAGES)
    clients = []

    def client(p):
        c = radixd.Client(d.name)
        clients.append(c)
        return c

    t = session_twin(page_size, client, seed=800 + page_size)
    try:
        run(t, OPS // 2)
    finally:
        for c in clients:
            c.close()
    assert t.turns > OPS // 60 and t.lent > t.turns // 5, (t.turns, t.lent)
    assert t.session_aborts > 2 and t.released > 2
