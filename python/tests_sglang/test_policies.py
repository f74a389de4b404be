"""Issue 39, item 4: SGLang 0.5.23's eviction policies on radixd.

- Twins per policy: SGLang's ``RadixCache`` built with
  ``--radix-eviction-policy P`` (its own strategy, ``evict_policy.py``)
  against ``RadixdPrefixCache`` over an engine, and over a daemon built by
  SGLang's registry factory, that evicts by P (``radixd serve
  --eviction-policy P --recency sglang``), under the same random scheduler
  operations (``sim.Twin``: arrivals with random priorities, chunked
  prefill, decode, finishing, aborts, eviction under pressure): every
  match, ``cache_protected_len``, eviction and size compared after every
  step. The evictions are partial (``lru=True``: each frees part of what
  is evictable), so the victims must be SGLang's.
- T-LRU: SGLang's ``create_tree_cache`` takes it only from a
  ``UnifiedRadixCache``, so the factory builds that on the radixd TreeCore
  (its twins per policy: ``test_treecore.py``); here the engine's T-LRU
  is compared with SGLang's own ``UnifiedRadixCache`` (Python tree
  core, FULL only) under random inserts (priorities, ``inserted_len``),
  matches, locks and evictions, as are the other policies but FIFO and
  FILO: SGLang's two trees disagree on a split's creation time
  (``RadixCache`` makes the upper half anew, the unified core gives it the
  node's), and radixd answers as ``RadixCache`` (``--recency sglang``).
- The factory refuses a daemon whose policy (or its parameters) is not
  the server's, naming both; SGLang's own check of
  ``--radix-eviction-policy-config`` runs first; the ``radixd serve`` line
  it prints when no daemon runs carries the policy, and a daemon started
  from it passes.
"""

from __future__ import annotations

import os
import random
import shlex

import pytest

import radixd
from radixd.sglang import RadixdPrefixCache
from sim import Twin

OPS = int(os.environ.get("RADIXD_SGLANG_POLICY_OPS", "4000"))
PAGES = 48
PRIORITIES = [None, -1, 0, 1, 2]

# (policy, config) as a server would pass them.
POLICIES = [
    ("lru", None),
    ("lfu", None),
    ("fifo", None),
    ("mru", None),
    ("filo", None),
    ("priority", None),
    ("slru", None),
    ("slru", {"protected_threshold": 1}),
]


def _engine(page_size: int, policy: str, config) -> radixd.Engine:
    return radixd.Engine(page_size, PAGES, recency="sglang", eviction_policy=policy, eviction_policy_config=config)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("policy,config", POLICIES)
def test_in_process(policy, config, page_size):
    twin = Twin(
        page_size,
        PAGES,
        lambda p: RadixdPrefixCache(p, _engine(page_size, policy, config)),
        seed=page_size * 31 + len(policy),
        lru=True,
        eviction_policy=policy,
        eviction_policy_config=config,
        priorities=PRIORITIES,
    )
    assert twin.b.cache.backend.eviction_policy == policy
    for _ in range(OPS):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.evictions > OPS // 20 and twin.hits > OPS // 50


@pytest.mark.parametrize("policy,config", POLICIES)
def test_through_daemon(policy, config, start_daemon, monkeypatch):
    from radixd.sglang_base import policy_flags
    from sim import radixd_cache

    flags = shlex.split(policy_flags(policy, dict(config or {})))
    d = start_daemon("--recency", "sglang", *flags, page_size=4, capacity=PAGES)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = Twin(
        4,
        PAGES,
        radixd_cache,
        seed=500 + len(policy),
        lru=True,
        eviction_policy=policy,
        eviction_policy_config=config,
        priorities=PRIORITIES,
    )
    assert type(twin.b.cache) is RadixdPrefixCache
    assert twin.b.cache.backend.eviction_policy == policy
    for _ in range(OPS // 2):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.evictions > OPS // 40 and twin.hits > OPS // 100


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["priority", "lfu", "slru"])
def test_eagle_under_a_policy(policy, page_size):
    # EAGLE keys and a policy's hints together: a checkpoint's prompt
    # re-insert (priority + 1) must end at the prompt's last whole page of
    # bigrams, one fewer than its tokens, as RadixCache's prompt_key does;
    # a boundary one token off splits other nodes and evicts other victims.
    twin = Twin(
        page_size,
        PAGES,
        lambda p: RadixdPrefixCache(p, _engine(page_size, policy, None)),
        seed=900 + page_size * 7 + len(policy),
        lru=True,
        eviction_policy=policy,
        priorities=PRIORITIES,
        eagle=True,
    )
    assert twin.a.cache.is_eagle and twin.b.cache.is_eagle
    for _ in range(OPS // 2):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    assert twin.evictions > OPS // 40 and twin.hits > OPS // 100


def test_an_eagle_prompt_node_ends_at_the_prompts_last_bigram():
    # Two finished requests at priority 0, X before Y. RadixCache gives X's
    # prompt (9 bigrams of 10 tokens) a node of its own at priority 1, its
    # output (3 bigrams) a leaf at 0: evicting 3 takes X's output and
    # leaves Y whole. Had radixd split X a bigram late, its leaf would hold
    # 2 and the third bigram would come off Y.
    twin = Twin(
        1,
        PAGES,
        lambda p: RadixdPrefixCache(p, _engine(1, "priority", None)),
        seed=0,
        lru=True,
        eviction_policy="priority",
        eagle=True,
    )
    x, y = list(range(100, 110)), list(range(200, 206))
    for sim in (twin.a, twin.b):
        sim.arrive("x", x, priority=0)
        sim.extend("x", len(x))
        sim.extend("x", 3, [1, 2, 3])
        sim.finish("x")
        sim.arrive("y", y, priority=0)
        sim.extend("y", len(y))
        sim.finish("y")
    twin.same("tokens evicted", twin.a.evict(3), twin.b.evict(3))
    assert twin.a.peek(y) == len(y) - 1
    twin.same("Y after the eviction", twin.a.peek(y), twin.b.peek(y))
    twin.same("X after the eviction", twin.a.peek(x + [1, 2, 3]), twin.b.peek(x + [1, 2, 3]))
    twin.check_sizes("after the eviction")


# ----- the factory's checks -----


def _build(policy: str, config=None):
    from sim import params, radixd_cache

    return radixd_cache(params(1, 16, eviction_policy=policy, eviction_policy_config=config))


@pytest.mark.parametrize(
    "daemon,server,server_config",
    [
        (["--eviction-policy", "lfu"], "lru", None),
        ([], "priority", None),
        (["--eviction-policy", "mru"], "fifo", None),
        (["--eviction-policy", "slru"], "slru", {"protected_threshold": 3}),
        (["--eviction-policy", "slru", "--eviction-policy-config", '{"protected_threshold": 3}'], "slru", None),
    ],
)
def test_a_daemon_on_another_policy_is_refused_naming_both(daemon, server, server_config, start_daemon, monkeypatch):
    d = start_daemon("--recency", "sglang", *daemon, page_size=1, capacity=16)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    theirs = daemon[1] if daemon else "lru"
    with pytest.raises(ValueError) as e:
        _build(server, server_config)
    text = str(e.value)
    assert f"--eviction-policy {theirs}" in text and f"--radix-eviction-policy {server}" in text, text
    if theirs == server:
        assert "protected_threshold" in text, text
    # The refused client left: a scheduler of the right policy binds.
    client = radixd.Client(d.name)
    assert client.stats()["nodes"] == 0
    client.close()


def test_a_bad_config_is_refused_by_name(start_daemon, monkeypatch):
    d = start_daemon("--recency", "sglang", "--eviction-policy", "lfu", page_size=1, capacity=16)
    monkeypatch.setenv("RADIXD_NAME", d.name)
    # T-LRU goes to the TreeCore (test_treecore.py), which checks the
    # daemon's policy alike.
    with pytest.raises(ValueError, match=r"--eviction-policy lfu, this server by --radix-eviction-policy tlru"):
        _build("tlru", {"threshold": 8, "next_prompt_estimate": 2})
    # SGLang's own check of the config: a key the policy does not take.
    with pytest.raises(TypeError, match="LFUStrategy"):
        _build("lfu", {"protected_threshold": 2})
    with pytest.raises(ValueError, match="Unknown eviction policy"):
        _build("arc")
    cache = _build("lfu")
    assert cache.backend.eviction_policy == "lfu" and cache.backend.eviction_policy_config == {}
    cache.backend.close()


@pytest.mark.parametrize("policy,config", [("priority", None), ("slru", {"protected_threshold": 4})])
def test_the_printed_serve_line_carries_the_policy(policy, config, start_daemon, monkeypatch):
    from test_recency import _daemon_of, _printed_line

    line = _printed_line(lambda: _build(policy, config), monkeypatch)
    assert f"--eviction-policy {policy}" in line, line
    _daemon_of(line, start_daemon, monkeypatch)
    cache = _build(policy, config)
    assert cache.backend.eviction_policy == policy
    assert cache.backend.eviction_policy_config == ({"protected_threshold": 4} if config else {})
    cache.backend.close()


def test_priorities_reach_the_daemon():
    """A request's priority outranks recency under ``priority``: of two
    finished requests the newer one, of lower priority, goes first, in
    SGLang's tree and in radixd's alike."""
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sim import Sim, params

    found = []
    for make in (RadixCache, lambda p: RadixdPrefixCache(p, _engine(1, "priority", None))):
        p = params(1, PAGES, eviction_policy="priority")
        s = Sim(make(p), p)
        for rid, prompt, prio in (("hi", [1, 2, 3, 4], 5), ("lo", [7, 8, 9], 0)):
            s.arrive(rid, prompt, priority=prio)
            assert s.extend(rid, len(prompt))
            s.finish(rid)
        s.evict(3)
        found.append((s.peek([1, 2, 3, 4]), s.peek([7, 8, 9])))
    assert found == [(4, 0), (4, 0)], found


# ----- T-LRU (and the others) against SGLang's UnifiedRadixCache -----


def _unified(policy: str, config, pages: int):
    import torch
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from unified_sim import _server_args

    _server_args(1)
    pool = ReqToTokenPool(size=8, max_context_len=512, device="cpu", enable_memory_saver=False)
    alloc = TokenToKVPoolAllocator(pages, torch.bfloat16, "cpu", None, False)
    p = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=alloc,
        page_size=1,
        tree_components=(ComponentType.FULL,),
        tree_core_backend="python",
        eviction_policy=policy,
        eviction_policy_config=config,
    )
    cache = UnifiedRadixCache(params=p)
    assert cache._tree_core_backend == "python"
    return cache


@pytest.mark.parametrize(
    "policy,config",
    [
        ("tlru", {"threshold": 6, "next_prompt_estimate": 2}),
        ("tlru", {"threshold": 12, "next_prompt_estimate": 0}),
        ("lru", None),
        ("lfu", None),
        ("mru", None),
        ("priority", None),
        ("slru", None),
    ],
)
def test_engine_against_unified_radix_cache(policy, config):
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from unified_sim import key

    pages = 40
    rng = random.Random(sum(map(ord, policy + str(config))))
    s = _unified(policy, config, pages)
    r = radixd.Engine(1, pages, recency="sglang", eviction_policy=policy, eviction_policy_config=config)
    alloc = s.token_to_kv_pool_allocator
    locks = []
    evicted = 0

    def sizes():
        st = r.stats()
        assert (st["evictable_tokens"], st["protected_tokens"]) == (s.evictable_size(), s.protected_size())
        assert st["free_pages"] == alloc.available_size()

    for step in range(3000):
        n = rng.randint(1, 8)
        tokens = [rng.choice((1, 2, 3)) * 10 + i % 4 for i in range(n)]
        roll = rng.random()
        if roll < 0.45:
            m = s.match_prefix(MatchPrefixParams(key=key(tokens)))
            cached = m.device_prefix_len
            ours = r.match_prefix(tokens)
            assert ours.len == cached, f"step {step}: match"
            need = n - cached
            if need > alloc.available_size():
                short = need - alloc.available_size()
                got = s.evict(EvictParams(num_tokens=short)).num_tokens_evicted
                assert r.evict(got) == got, f"step {step}: evict for room"
                evicted += got
                m = s.match_prefix(MatchPrefixParams(key=key(tokens)))
                ours = r.match_prefix(tokens)
                assert ours.len == m.device_prefix_len
                cached = m.device_prefix_len
                need = n - cached
                if need > alloc.available_size():
                    continue
            tc = s.tree_core
            prefix = tc.collect_full_device_indices(m.last_device_node, tc.root_node.id).tolist()
            fresh = alloc.alloc(need).tolist() if need else []
            ours_fresh = list(r.alloc(need)) if need else []
            priority = rng.choice((-1, 0, 1, 2))
            inserted_len = rng.choice((0, 0, rng.randint(0, n)))
            res = s.insert(
                InsertParams(
                    key=key(tokens),
                    value=torch.tensor(prefix + fresh, dtype=torch.int64),
                    priority=priority,
                    inserted_len=inserted_len,
                    # The prefix's slots are the tree's own: not duplicates.
                    prev_prefix_len=cached,
                )
            )
            got = r.insert(
                tokens, list(ours.pages) + ours_fresh, priority=priority, inserted_len=inserted_len
            )
            assert got.cached == res.prefix_len, f"step {step}: insert"
        elif roll < 0.65:
            m = s.match_prefix(MatchPrefixParams(key=key(tokens)))
            ours = r.match_prefix(tokens, lock=True)
            assert ours.len == m.device_prefix_len, f"step {step}: locked match"
            if m.device_prefix_len:
                locks.append((m.last_device_node, s.inc_lock_ref(m.last_device_node), ours.handle))
        elif roll < 0.8 and locks:
            node, receipt, handle = locks.pop(rng.randrange(len(locks)))
            s.dec_lock_ref(node, receipt.to_dec_params())
            r.unlock(handle)
        else:
            want = rng.randint(1, 6)
            got = s.evict(EvictParams(num_tokens=want)).num_tokens_evicted
            assert r.evict(got) == got, f"step {step}: evict"
            evicted += got
        sizes()
    r.validate()
    assert evicted > 300


def test_hybrid_models_refuse_a_policy_not_served_and_a_daemon_on_another_by_name(start_daemon, monkeypatch):
    """The hybrid backend evicts by lru, fifo, mru and filo (the hybrid
    twins check each, test_hybrid_backend.py): a server on another policy
    is refused naming the option, and so is a daemon on another policy
    than the server's."""
    from hybrid_sim import HybridTwin, mamba_params, publish, radixd_cache

    publish(1)
    full, slots = HybridTwin.FULL_PAGES[1], HybridTwin.SLOTS[1]
    p = mamba_params(1, full, slots)
    p.eviction_policy = "lfu"
    with pytest.raises(ValueError, match="--radix-eviction-policy lfu with a hybrid model"):
        radixd_cache("mamba", p)
    d = start_daemon(
        "--components", "full,mamba", "--mamba-capacity", str(slots), "--recency", "sglang",
        "--eviction-policy", "lfu", page_size=1, capacity=full,
    )
    monkeypatch.setenv("RADIXD_NAME", d.name)
    with pytest.raises(ValueError, match="--eviction-policy lfu.*--radix-eviction-policy lru"):
        radixd_cache("mamba", mamba_params(1, full, slots))
