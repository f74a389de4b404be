"""Eviction policies from Python: ``radixd.Engine(eviction_policy=...,
eviction_policy_config=...)``, an insert's ``priority`` and
``inserted_len``, and a daemon's policy as ``Client.eviction_policy`` /
``Client.eviction_policy_config`` read it (``radixd serve
--eviction-policy``)."""

from __future__ import annotations

import pytest

import radixd


def _fill(cache, keys_and_priorities, inserted_len=0):
    for key, priority in keys_and_priorities:
        pages = cache.alloc(len(key))
        cache.insert(key, pages, priority=priority, inserted_len=inserted_len)


def test_priority_outranks_recency_and_lru_ignores_it():
    for policy, survivor in (("priority", [1, 1]), ("lru", [2, 2])):
        e = radixd.Engine(1, 4, eviction_policy=policy)
        assert e.eviction_policy == policy and e.eviction_policy_config == {}
        _fill(e, [([1, 1], 5), ([2, 2], 0)])
        assert e.evict(2) == 2
        assert e.match_prefix(survivor).len == 2, policy
        e.validate()


def test_lfu_counts_inserts_past_inserted_len():
    e = radixd.Engine(1, 6, eviction_policy="lfu")
    _fill(e, [([1, 1], 0), ([2, 2], 0)])
    # [1, 1] again, as a request that inserted none of it: a hit. [2, 2]
    # again by one that inserted it all before: none.
    e.insert([1, 1], e.match_prefix([1, 1]).pages, inserted_len=0)
    e.insert([2, 2], e.match_prefix([2, 2]).pages, inserted_len=2)
    assert e.evict(2) == 2
    assert (e.match_prefix([1, 1]).len, e.match_prefix([2, 2]).len) == (2, 0)


def test_parameters_and_refusals():
    e = radixd.Engine(1, 4, eviction_policy="SLRU", eviction_policy_config={"protected_threshold": 3})
    assert (e.eviction_policy, e.eviction_policy_config) == ("slru", {"protected_threshold": 3})
    t = radixd.Engine(1, 4, eviction_policy="tlru")
    assert t.eviction_policy_config == {"threshold": 0, "next_prompt_estimate": 0}
    with pytest.raises(ValueError, match="unknown eviction policy"):
        radixd.Engine(1, 4, eviction_policy="arc")
    with pytest.raises(ValueError, match="protected_threshold"):
        radixd.Engine(1, 4, eviction_policy="slru", eviction_policy_config={"threshold": 1})
    with pytest.raises(ValueError, match="must be an int"):
        radixd.Engine(1, 4, eviction_policy="slru", eviction_policy_config={"protected_threshold": "x"})
    with pytest.raises(TypeError):
        radixd.Engine(1, 4, eviction_policy="slru", eviction_policy_config=[1])


def _hybrid_priorities(cache):
    """A hybrid engine's inserts carry their hints too (``insert`` with
    its extras, ``insert_paired``): under ``priority`` the one of lower
    priority goes first, whichever came last."""
    if cache.components == "full,mamba":
        cache.insert([1, 1], cache.alloc(2), mamba_state=cache.alloc_state(), priority=5)
        cache.insert_paired([2, 2], cache.alloc(2), mamba_state=cache.alloc_state(), priority=1)
    else:
        pages = cache.alloc(2)
        cache.free_swa(pages[:1])
        cache.insert([1, 1], pages, swa_evicted=1, priority=5)
        cache.insert_paired([2, 2], cache.alloc(2), priority=1)
    assert cache.evict(2) == 2
    assert (cache.match_prefix([1, 1]).len, cache.match_prefix([2, 2]).len) == (2, 0)
    cache.validate()


@pytest.mark.parametrize("components", ["full,mamba", "full,swa"])
def test_a_hybrid_insert_takes_hints(components, start_daemon):
    hybrid = {"mamba_capacity": 4} if components == "full,mamba" else {"swa_window": 1, "swa_capacity": 8}
    _hybrid_priorities(radixd.Engine(1, 8, components=components, eviction_policy="priority", **hybrid))
    flags = ["--mamba-capacity", "4"] if components == "full,mamba" else ["--swa-window", "1", "--swa-capacity", "8"]
    d = start_daemon("--components", components, *flags, "--eviction-policy", "priority", page_size=1, capacity=8)
    with radixd.Client(d.name) as c:
        _hybrid_priorities(c)


def test_a_daemon_publishes_its_policy_and_takes_hints(start_daemon):
    d = start_daemon("--eviction-policy", "priority", page_size=1, capacity=4)
    c = radixd.Client(d.name)
    assert (c.eviction_policy, c.eviction_policy_config) == ("priority", {})
    _fill(c, [([1, 1], 5), ([2, 2], 0)])
    assert c.evict(2) == 2
    assert (c.match_prefix([1, 1]).len, c.match_prefix([2, 2]).len) == (2, 0)
    # In a namespace too.
    _fill(c, [], 0)
    pages = c.alloc(2)
    c.insert([3, 3], pages, ns="lora-1", priority=-1)
    assert c.evict(2) == 2
    assert c.match_prefix([3, 3], ns="lora-1").len == 0
    c.validate()
    c.close()
    plain = start_daemon(page_size=1, capacity=4)
    p = radixd.Client(plain.name)
    assert (p.eviction_policy, p.eviction_policy_config) == ("lru", {})
    p.close()
