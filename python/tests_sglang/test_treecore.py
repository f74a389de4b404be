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

import json
import os
import shlex

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


def clients_of(name, clients):
    """A backend factory of clients of the daemon ``name``, each filed in
    ``clients`` for :func:`run_closing` to close."""

    def client(p):
        c = radixd.Client(name)
        clients.append(c)
        return c

    return client


def run_closing(t, ops, clients):
    """:func:`run`, then ``clients`` closed, whatever happened."""
    try:
        run(t, ops)
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("page_size", [1, 16])
def test_in_process(page_size):
    t = twin(page_size, engine, seed=400 + page_size)
    run(t, OPS)
    assert t.evictions > OPS // 20 and t.hits > OPS // 50


@pytest.mark.parametrize("page_size", [1, 16])
def test_through_daemon(page_size, start_daemon):
    d = start_daemon("--recency", "sglang", page_size=page_size, capacity=PAGES)
    clients = []
    client = clients_of(d.name, clients)
    t = twin(page_size, client, seed=500 + page_size)
    assert isinstance(t.b.cache.tree_core.backend, radixd.Client)
    run_closing(t, OPS // 2, clients)
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
    # FULL+SWA is served (test_treecore_hybrid.py); Mamba models are not yet.
    ctx = build_context(params(1, PAGES))
    ctx.is_hybrid_ssm = True
    with pytest.raises(ValueError, match="--enable-streaming-session with a Mamba model"):
        create_tree_cache(ctx)
    # Tensor parallelism is served (test_tp_group.py), with a group only.
    ctx = build_context(params(1, PAGES))
    ctx.tp_size = 2
    with pytest.raises(ValueError, match="--tp-size above 1 without a tensor-parallel process group"):
        create_tree_cache(ctx)
    # T-LRU goes to the core without streaming sessions too: what the core
    # does not serve beside it is refused naming it.
    from sim import publish_runtime

    publish_runtime()
    ctx = build_context(params(1, PAGES, eviction_policy="tlru"))
    ctx.is_hybrid_swa = True
    with pytest.raises(ValueError, match="--radix-eviction-policy tlru with a hybrid model"):
        create_tree_cache(ctx)


def test_namespaces_through_daemon(start_daemon):
    d = start_daemon("--recency", "sglang", page_size=4, capacity=PAGES)
    clients = []
    client = clients_of(d.name, clients)
    t = twin(4, client, seed=650, spaces=SPACES)
    run_closing(t, OPS // 2, clients)
    assert t.evictions > OPS // 40 and t.hit_spaces == set(SPACES), "every namespace was hit"


def test_the_core_refuses_what_this_phase_does_not_serve_by_name():
    from sim import params

    p = params(1, PAGES)
    p.enable_session_radix_cache = True
    with pytest.raises(NotImplementedError, match="--enable-session-radix-cache"):
        radixd_core(engine)(p)
    cache = radixd_core(engine)(params(1, PAGES))
    core = cache.tree_core
    with pytest.raises(NotImplementedError, match="HiCache"):
        core.set_hicache_enabled()
    with pytest.raises(NotImplementedError, match="HiCache"):
        core.inc_host_lock_ref(0)
    with pytest.raises(NotImplementedError, match="SGLANG_OPT_RELEASE_PREFILL_SWA"):
        core.dec_swa_lock_only(0, None)
    with pytest.raises(NotImplementedError, match="Mamba models"):
        core.finish_mamba_state_eviction(0)
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
    client = clients_of(d.name, clients)
    t = session_twin(page_size, client, seed=800 + page_size)
    run_closing(t, OPS // 2, clients)
    assert t.turns > OPS // 60 and t.lent > t.turns // 5, (t.turns, t.lent)
    assert t.session_aborts > 2 and t.released > 2


# ----- phase 3: every eviction policy and EAGLE on the core -----

# (policy, config) as a server would pass them: SGLang 0.5.23's eight.
POLICIES = [
    ("lru", None),
    ("lfu", None),
    ("fifo", None),
    ("mru", None),
    ("filo", None),
    ("priority", None),
    ("tlru", {"threshold": 24, "next_prompt_estimate": 4}),
    ("slru", None),
    ("slru", {"protected_threshold": 1}),
]
PRIORITIES = [None, -1, 0, 1, 2]
POLICY_OPS = int(os.environ.get("RADIXD_SGLANG_POLICY_OPS", "4000"))


def policy_engine(policy, config):
    """An in-process engine evicting by ``policy`` under the recency rule of
    SGLang's unified tree for it (``unified_recency``)."""
    from radixd.sglang_base import unified_recency

    def build(p):
        pages = p.token_to_kv_pool_allocator.size // p.page_size
        return radixd.Engine(
            p.page_size, pages, recency=unified_recency(policy), eviction_policy=policy, eviction_policy_config=config
        )

    return build


def policy_twin(page_size, backend_of, seed, policy, config, **kw):
    return Twin(
        page_size,
        PAGES,
        radixd_core(backend_of),
        seed=seed,
        lru=True,
        reference=python_core,
        same_evictions=True,
        eviction_policy=policy,
        eviction_policy_config=config,
        priorities=PRIORITIES,
        **kw,
    )


def daemon_of(policy, config, start_daemon, page_size, clients):
    from radixd.sglang_base import policy_flags, unified_recency

    flags = shlex.split(policy_flags(policy, dict(config or {})))
    d = start_daemon("--recency", unified_recency(policy), *flags, page_size=page_size, capacity=PAGES)
    return clients_of(d.name, clients)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("policy,config", POLICIES)
def test_policy_in_process(policy, config, page_size):
    # Random priorities reach both cores through InsertParams (the
    # controller's checkpoints re-insert the prompt at priority + 1);
    # partial evictions make every victim count.
    t = policy_twin(page_size, policy_engine(policy, config), 1000 + page_size * 13 + len(policy), policy, config)
    assert t.b.cache.tree_core.backend.eviction_policy == policy
    run(t, POLICY_OPS)
    assert t.evictions > POLICY_OPS // 20 and t.hits > POLICY_OPS // 100, (t.evictions, t.hits)


@pytest.mark.parametrize("policy,config", POLICIES)
def test_policy_through_daemon(policy, config, start_daemon):
    # A daemon started with --eviction-policy P (and its config); page
    # sizes 1 and 16 by turns.
    page_size = 1 if POLICIES.index((policy, config)) % 2 else 16
    clients = []
    t = policy_twin(
        page_size, daemon_of(policy, config, start_daemon, page_size, clients), 1100 + len(policy), policy, config
    )
    assert isinstance(t.b.cache.tree_core.backend, radixd.Client)
    run_closing(t, POLICY_OPS // 2, clients)
    assert t.evictions > POLICY_OPS // 40 and t.hits > POLICY_OPS // 100, (t.evictions, t.hits)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("policy,config", [("priority", None), ("lfu", None), ("tlru", {"threshold": 16})])
def test_streaming_sessions_under_a_policy(policy, config, page_size):
    from sim import SessionTwin

    t = SessionTwin(
        page_size,
        PAGES,
        radixd_core(policy_engine(policy, config)),
        seed=1200 + page_size + len(policy),
        reference=python_core,
        lru=True,
        same_evictions=True,
        eviction_policy=policy,
        eviction_policy_config=config,
        priorities=PRIORITIES,
    )
    run(t, POLICY_OPS)
    assert t.turns > POLICY_OPS // 40 and t.lent > t.turns // 5, (t.turns, t.lent)
    assert t.session_aborts > 2 and t.released > 2 and t.evictions > POLICY_OPS // 40


# EAGLE: SGLang's core keys bigrams (is_eagle, FULL only); radixd keys raw
# tokens 1..N in a namespace of token 0. Decoding commits verify steps of
# one to four tokens.


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("policy,config", [("lru", None), ("priority", None), ("slru", None)])
def test_eagle_in_process(policy, config, page_size):
    t = policy_twin(
        page_size, policy_engine(policy, config), 1300 + page_size + len(policy), policy, config, eagle=True,
        spaces=SPACES,
    )
    assert t.a.cache.tree_core.is_eagle and t.b.cache.tree_core.is_eagle
    run(t, POLICY_OPS)
    # Fewer hits than without EAGLE: a hit needs a page of bigrams, one
    # token more.
    assert t.evictions > POLICY_OPS // 20 and t.hits > POLICY_OPS // 100, (t.evictions, t.hits)
    assert t.hit_spaces == set(SPACES), "every namespace was hit"


@pytest.mark.parametrize("page_size,policy", [(1, "lru"), (16, "lfu")])
def test_eagle_through_daemon(page_size, policy, start_daemon):
    clients = []
    t = policy_twin(
        page_size, daemon_of(policy, None, start_daemon, page_size, clients), 1400 + page_size, policy, None,
        eagle=True,
    )
    run_closing(t, POLICY_OPS // 2, clients)
    assert t.evictions > POLICY_OPS // 40 and t.hits > POLICY_OPS // 100, (t.evictions, t.hits)


@pytest.mark.parametrize("page_size", [1, 4])
def test_eagle_streaming_sessions(page_size):
    from sim import SessionTwin

    t = SessionTwin(
        page_size,
        PAGES,
        radixd_core(engine),
        seed=1500 + page_size,
        reference=python_core,
        lru=True,
        same_evictions=True,
        eagle=True,
    )
    run(t, POLICY_OPS)
    assert t.turns > POLICY_OPS // 40 and t.lent > t.turns // 5, (t.turns, t.lent)


def test_an_engine_on_another_policy_is_refused_naming_both():
    from sim import params

    p = params(1, PAGES, eviction_policy="lfu")
    with pytest.raises(ValueError) as e:
        radixd_core(engine)(p)  # the engine evicts by LRU
    text = str(e.value)
    assert "--eviction-policy lru" in text and "--radix-eviction-policy lfu" in text, text
    # The same policy with other parameters.
    p = params(1, PAGES, eviction_policy="slru", eviction_policy_config={"protected_threshold": 3})
    with pytest.raises(ValueError, match=r"--eviction-policy slru \{'protected_threshold': 2\}.*protected_threshold': 3"):
        radixd_core(policy_engine("slru", None))(p)


def _factory_cache(p, daemon, monkeypatch):
    from sglang.srt.mem_cache.registry import create_tree_cache

    from sim import build_context

    monkeypatch.setenv("RADIXD_NAME", daemon.name)
    cache = create_tree_cache(build_context(p))
    assert type(cache) is UnifiedRadixCache and isinstance(cache.tree_core, RadixdTreeCore)
    return cache


def test_create_tree_cache_takes_tlru_on_the_radixd_core(start_daemon, monkeypatch):
    # SGLang's create_tree_cache takes tlru only from a UnifiedRadixCache:
    # without streaming sessions the factory builds one on the radixd core.
    from radixd.sglang import RadixdPrefixCache
    from sim import params

    config = {"threshold": 8, "next_prompt_estimate": 2}
    d = start_daemon(
        "--recency", "sglang", "--eviction-policy", "tlru", "--eviction-policy-config", json.dumps(config),
        page_size=4, capacity=PAGES,
    )
    cache = _factory_cache(params(4, PAGES, eviction_policy="tlru", eviction_policy_config=config), d, monkeypatch)
    assert cache.tree_core.backend.eviction_policy == "tlru"
    assert cache.tree_core.backend.eviction_policy_config == config
    cache.tree_core.backend.close()
    # Other policies without streaming sessions stay on RadixdPrefixCache.
    d2 = start_daemon("--recency", "sglang", "--eviction-policy", "lfu", page_size=4, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d2.name)
    from sglang.srt.mem_cache.registry import create_tree_cache

    from sim import build_context

    cache = create_tree_cache(build_context(params(4, PAGES, eviction_policy="lfu")))
    assert type(cache) is RadixdPrefixCache
    cache.backend.close()


def test_create_tree_cache_takes_streaming_with_eagle_and_a_policy(streaming_server, start_daemon, monkeypatch):
    from sim import params

    d = start_daemon("--recency", "exact", "--eviction-policy", "fifo", page_size=4, capacity=PAGES)
    p = params(4, PAGES, eviction_policy="fifo")
    p.is_eagle = True
    cache = _factory_cache(p, d, monkeypatch)
    assert cache.tree_core.is_eagle and cache.tree_core.backend.eviction_policy == "fifo"
    cache.tree_core.backend.close()


def test_a_daemon_on_another_policy_is_refused_by_the_factory_naming_both(streaming_server, start_daemon, monkeypatch):
    from sglang.srt.mem_cache.registry import create_tree_cache

    from sim import build_context, params

    d = start_daemon("--recency", "sglang", "--eviction-policy", "lfu", page_size=1, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    with pytest.raises(ValueError) as e:
        create_tree_cache(build_context(params(1, PAGES, eviction_policy="priority")))
    text = str(e.value)
    assert "--eviction-policy lfu" in text and "--radix-eviction-policy priority" in text, text
    # The refused client left: one of the right policy binds.
    c = radixd.Client(d.name)
    assert c.stats()["nodes"] == 0
    c.close()


def test_the_printed_serve_line_carries_the_cores_recency(streaming_server, monkeypatch):
    # No daemon: the line to start one carries the policy and the recency
    # rule under which radixd answers as SGLang's unified tree for it.
    from sglang.srt.mem_cache.registry import create_tree_cache

    from sim import build_context, params

    monkeypatch.setenv("RADIXD_NAME", "radixd-test-nobody-" + str(os.getpid()))
    for policy, recency in (("fifo", "exact"), ("mru", "sglang")):
        with pytest.raises(RuntimeError) as e:
            create_tree_cache(build_context(params(1, PAGES, eviction_policy=policy)))
        text = str(e.value)
        assert f"--recency {recency}" in text and f"--eviction-policy {policy}" in text, text
