"""Hybrid models: the SWA and MAMBA components through the Python package,
in-process (``radixd.Engine(components=...)``) and through a daemon
(``radixd serve --components ...``): the same calls get the same answers,
bad input raises the typed error and changes nothing, and ``PrefixCache``
carries SGLang's hybrid ``MatchResult`` fields."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest

import radixd
from radixd import PrefixCache

KEY = list(range(1, 13))

# SGLang's ``ComponentType`` keys ``InsertParams.component_evicted_seqlens``.
ComponentType = enum.Enum("ComponentType", "FULL SWA MAMBA")

SWA = dict(components="full,swa", swa_window=4)
MAMBA = dict(components="full,mamba", mamba_capacity=3)


def serve_args(kw: dict) -> list:
    args = ["--components", kw.get("components", "full")]
    if "swa_window" in kw:
        args += ["--swa-window", str(kw["swa_window"])]
    if "mamba_capacity" in kw:
        args += ["--mamba-capacity", str(kw["mamba_capacity"])]
    return args


@pytest.fixture(params=["engine", "daemon"])
def make(request, start_daemon):
    """``make(page_size, capacity, **components)``: an in-process engine or
    a client of a daemon of its own with those components."""

    def build(page_size: int, capacity: int, **kw):
        if request.param == "engine":
            return radixd.Engine(page_size, capacity, **kw)
        d = start_daemon(*serve_args(kw), page_size=page_size, capacity=capacity)
        return d.client()

    return build


def kind_of(excinfo) -> str:
    return excinfo.value.kind


def refused(cache, kind: str, call) -> None:
    before = cache.stats()
    with pytest.raises(radixd.RadixdError) as e:
        call()
    assert kind_of(e) == kind, e.value
    assert cache.stats() == before, f"{kind} changed the cache"


def test_swa_calls_answer_as_documented(make):
    c = make(2, 16, **SWA)
    assert c.components == "full,swa"
    pages = list(c.alloc(6))
    assert pages == [0, 1, 2, 3, 4, 5]
    r = c.insert(KEY[:8], pages[:4])
    assert (r.cached, r.len, r.mamba_exist) == (0, 8, False)
    m = c.match_prefix(KEY[:9])
    assert (m.len, list(m.pages), m.full_kv_hit_length, m.mamba_state) == (8, pages[:4], 8, None)
    s = c.stats()
    assert s["components"] == "full,swa"
    assert (s["swa_evictable_tokens"], s["swa_free_pages"]) == (8, 10)
    assert "mamba_free_states" not in s
    assert c.free_swa([pages[4]]) == 1
    assert c.free_swa([pages[4]]) == 0
    paired = c.swa_pages(pages)
    assert paired[4] is None and len({p for p in paired if p is not None}) == 5
    refused(c, "swa_mismatch", lambda: c.insert(KEY, pages, swa_evicted=3))
    refused(c, "swa_mismatch", lambda: c.insert(KEY, pages))
    refused(c, "component_off", lambda: c.insert(KEY, pages, mamba_state=0))
    refused(c, "component_off", c.alloc_state)
    refused(c, "component_off", lambda: c.free_state(0))
    refused(c, "component_off", lambda: c.evict(0, mamba_states=1))
    refused(c, "page_not_owned", lambda: c.free_swa([pages[0]]))
    assert isinstance(radixd.ComponentOffError("x"), radixd.RadixdError)
    r = c.insert(KEY, pages, lock=True, swa_evicted=10)
    assert (r.cached, r.len) == (8, 12) and r.handle is not None
    # The tombstone of page 4 cuts the match back; FULL reaches the end.
    if isinstance(c, radixd.Client):
        # The lock-free read answers what the match will.
        length, read = c.peek(KEY)
        assert (length, list(read)) == (8, pages[:4])
    m = c.match_prefix(KEY)
    assert (m.len, m.full_kv_hit_length) == (8, 12)
    e = c.evict(0, swa_tokens=2)
    assert (e.evicted, e.swa_evicted, e.mamba_evicted) == (0, 4, 0)
    assert tuple(e) == (0, 4, 0)
    assert c.evict(4) == 0  # everything FULL is locked: an int, as before
    assert tuple(c.evict_components(0)) == (0, 0, 0)
    c.unlock(r.handle)
    assert c.evict(100) == 12
    c.validate()


def test_mamba_calls_answer_as_documented(make):
    c = make(2, 8, **MAMBA)
    assert c.components == "full,mamba"
    pages = list(c.alloc(4))
    state = c.alloc_state()
    assert state == 0
    r = c.insert(KEY[:8], pages, mamba_state=state)
    assert (r.cached, r.len, r.mamba_exist) == (0, 8, False)
    m = c.match_prefix(KEY[:9], lock=True)
    assert (m.len, m.full_kv_hit_length, m.mamba_state) == (8, 8, state)
    s = c.stats()
    assert (s["mamba_protected_states"], s["mamba_free_states"], s["components"]) == (1, 2, "full,mamba")
    assert "swa_free_pages" not in s
    refused(c, "state_not_owned", lambda: c.free_state(state))
    refused(c, "state_not_owned", lambda: c.free_state(99))
    refused(c, "state_not_owned", lambda: c.insert(KEY[:8], pages, mamba_state=7))
    refused(c, "component_off", lambda: c.free_swa(pages))
    refused(c, "component_off", lambda: c.insert(KEY[:8], pages, swa_evicted=2))
    with pytest.raises(ValueError):
        c.insert(KEY[:8], pages, mamba_state=1 << 32)
    with pytest.raises(TypeError):
        c.free_state("slot")
    # A second state for the same key stays the caller's, to free.
    again = c.alloc_state()
    assert c.insert(KEY[:8], pages, mamba_state=again).mamba_exist
    c.free_state(again)
    refused(c, "state_not_owned", lambda: c.free_state(again))
    # Locked, the state stays; unlocked, it goes (with its FULL leaf).
    assert tuple(c.evict(0, mamba_states=1)) == (0, 0, 0)
    c.unlock(m.handle)
    e = c.evict(0, mamba_states=1)
    assert (e.evicted, e.mamba_evicted) == (8, 1)
    m = c.match_prefix(KEY[:8])
    assert (m.len, m.full_kv_hit_length, m.mamba_state) == (0, 0, None)
    held = [c.alloc_state() for _ in range(3)]
    refused(c, "insufficient_states", c.alloc_state)
    for slot in held:
        c.free_state(slot)
    c.validate()


def test_a_full_only_cache_answers_as_before_and_refuses_component_calls(make):
    c = make(2, 8)
    assert c.components == "full"
    pages = list(c.alloc(2))
    assert c.insert(KEY[:4], pages, swa_evicted=0, mamba_state=None).len == 4
    m = c.match_prefix(KEY[:4])
    assert (m.len, m.full_kv_hit_length, m.mamba_state) == (4, 4, None)
    assert "components" not in c.stats()
    for call in (c.alloc_state, lambda: c.free_state(0), lambda: c.free_swa([0]),
                 lambda: c.evict(2, swa_tokens=2), lambda: c.insert(KEY[:4], pages, mamba_state=0)):
        refused(c, "component_off", call)
    assert c.evict(2) == 2
    assert tuple(c.evict_components(2)) == (2, 0, 0)


def test_bad_components_raise_value_error():
    for kw in (dict(components="full,bogus"), dict(components="full,swa"),
               dict(components="full,mamba"), dict(swa_window=4),
               dict(components="full,swa", swa_window=0)):
        with pytest.raises(ValueError):
            radixd.Engine(2, 8, **kw)
    e = radixd.Engine(2, 8, components="full,swa", swa_window=4)
    assert e.stats()["swa_free_pages"] == 8  # SWA pool defaults to the FULL capacity
    e = radixd.Engine(2, 8, components="full,swa", swa_window=4, swa_capacity=3)
    assert e.stats()["swa_free_pages"] == 3


def test_prefix_cache_carries_sglang_s_hybrid_match_fields():
    swa = PrefixCache(radixd.Engine(2, 16, **SWA))
    assert swa.components == "full,swa"
    kv = swa.alloc_indices(12)
    assert swa.insert(KEY[:8], kv[:8]) == 0
    m = swa.match_prefix(KEY[:8])
    assert (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen) == (8, 8, None)
    assert (m.swa_host_hit_length, m.mamba_host_hit_length, m.host_hit_length) == (0, 0, 0)
    # Tokens 8..9 slid out of the window: their SWA page is freed.
    assert swa.backend.free_swa([int(kv[8]) // 2]) == 1
    params = SimpleNamespace(key=SimpleNamespace(token_ids=KEY), value=kv,
                             component_evicted_seqlens={ComponentType.SWA: 10})
    assert swa.insert(params) == 8
    m = swa.match_prefix(KEY)
    assert (m.device_prefix_len, m.full_kv_hit_length, m.swa_branching_seqlen) == (8, 12, 12)
    assert m.mamba_branching_seqlen is None
    r = swa.evict(SimpleNamespace(num_tokens=0, swa_num_tokens=2, mamba_num=0))
    assert r.swa_evicted == r.swa_num_tokens_evicted == 2
    assert (r.num_tokens_evicted, r.mamba_num_evicted) == (r.evicted, 0)
    assert swa.swa_evictable_size() + swa.swa_protected_size() == swa.backend.stats()["swa_evictable_tokens"]
    assert (swa.mamba_evictable_size(), swa.full_evictable_size()) == (0, swa.evictable_size())
    swa.validate()

    mamba = PrefixCache(radixd.Engine(2, 8, **MAMBA), mamba_checkpoint_grid=4)
    kv = mamba.alloc_indices(8)
    slot = mamba.backend.alloc_state()
    assert mamba.insert(SimpleNamespace(key=SimpleNamespace(token_ids=KEY[:8]), value=kv,
                                        mamba_value=[slot])) == 0
    m = mamba.match_prefix(KEY[:8])
    assert (m.device_prefix_len, m.mamba_state, m.mamba_branching_seqlen) == (8, slot, None)
    # A match of 6 tokens ends where no state is: nothing is served, and a
    # state could be checkpointed at 4 (the grid) of the 6 FULL tokens.
    m = mamba.match_prefix(KEY[:6])
    assert (m.device_prefix_len, m.full_kv_hit_length, m.mamba_branching_seqlen) == (0, 6, 4)
    assert m.last_device_node is mamba.root_node and m.mamba_state is None
    # A second state for the same key is not cached: the cache frees it,
    # as SGLang's cleanup_after_caching_req does.
    free = mamba.backend.stats()["mamba_free_states"]
    again = mamba.backend.alloc_state()
    assert mamba.insert(KEY[:8], kv, mamba_state=again) == 8
    assert mamba.backend.stats()["mamba_free_states"] == free
    mamba.validate()

    full = PrefixCache(radixd.Engine(2, 8))
    kv = full.alloc_indices(4)
    full.insert(KEY[:4], kv)
    m = full.match_prefix(KEY[:4])
    assert (m.full_kv_hit_length, m.swa_branching_seqlen, m.mamba_branching_seqlen) == (4, None, None)


@pytest.mark.parametrize("oldest_first", [True, False])
def test_each_lock_releases_its_own_window(make, oldest_first):
    """Two locks on one node with a split between them (FULL+SWA, page size
    4, window 10): each handle names its lock, which ``unlock`` releases
    exactly, in either order (SGLang's protected/evictable SWA tokens after
    the first release: 36/32 oldest first, 48/20 newest first)."""
    c = make(4, 64, components="full,swa", swa_window=10)
    t = list(range(1000, 1068))
    c.insert(t, c.alloc(17))
    one = c.match_prefix(t[:50], lock=True)
    assert c.match_prefix(t[:15]).len == 12
    two = c.match_prefix(t[:50], lock=True)
    assert one.len == two.len == 48 and one.handle != two.handle

    def swa():
        s = c.stats()
        return s["swa_protected_tokens"], s["swa_evictable_tokens"]

    first, second = (one, two) if oldest_first else (two, one)
    c.unlock(first.handle)
    assert swa() == ((36, 32) if oldest_first else (48, 20))
    c.unlock(second.handle)
    assert swa() == (0, 68)
    c.validate()
