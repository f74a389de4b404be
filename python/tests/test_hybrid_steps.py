"""The hybrid step's calls through the Python package, in-process and
through a daemon: ``alloc_paired``, ``lock_paired`` and ``insert_paired``
answer what the separate calls answer in a row, ``alloc_states`` and
``free_states`` what one call per slot does, ``free_counts`` is what
``stats`` says whoever changed it, and bad input raises the typed error
and changes nothing."""

from __future__ import annotations

import pytest

import radixd

KEY = list(range(1, 17))
SWA = ["--components", "full,swa", "--swa-window", "4"]
MAMBA = ["--components", "full,mamba", "--mamba-capacity", "4"]


def engine_kw(args: list) -> dict:
    kw = {"components": args[1]}
    if "--swa-window" in args:
        kw["swa_window"] = int(args[3])
    if "--mamba-capacity" in args:
        kw["mamba_capacity"] = int(args[3])
    return kw


@pytest.fixture(params=["engine", "daemon"])
def make(request, start_daemon):
    """``make(args)``: an in-process engine, or a client of a daemon of its
    own, page size 2 and 24 pages, with the components of ``serve`` args."""

    def build(args: list):
        if request.param == "engine":
            return radixd.Engine(2, 24, **engine_kw(args))
        return start_daemon(*args, page_size=2, capacity=24).client()

    return build


def peers(paired: list) -> list:
    """``swa_pages``' answer as a paired call's (``NO_PAGE`` for none)."""
    return [radixd.NO_PAGE if p is None else p for p in paired]


def counts(cache) -> tuple:
    s = cache.stats()
    return (s["free_pages"], s.get("swa_free_pages", 0), s.get("mamba_free_states", 0))


def refused(cache, kind: str, call) -> None:
    before = cache.stats()
    with pytest.raises(radixd.RadixdError) as e:
        call()
    assert e.value.kind == kind, e.value
    assert cache.stats() == before, f"{kind} changed the cache"


def test_paired_calls_answer_what_the_separate_calls_do(make):
    a, b = make(SWA), make(SWA)
    pages, swa = a.alloc_paired(8)
    assert list(pages) == list(b.alloc(8))
    assert list(swa) == peers(b.swa_pages(pages))
    # The checkpoint: insert, lock, the key's pages, the window's pairing.
    r, kept, window = a.insert_paired(KEY[:12], pages[:6], lock=True, tail=3)
    s = b.insert(KEY[:12], pages[:6], lock=True)
    assert (r.cached, r.len, r.mamba_exist) == (s.cached, s.len, s.mamba_exist)
    length, walked = b.peek_full(KEY[:12])
    assert (length, list(kept)) == (12, list(walked))
    assert list(window) == peers(b.swa_pages(walked[3:]))
    # A longer prompt's request: its out-of-window SWA pages freed, SWA
    # evicted from the tree, then its insert over the cached prefix.
    more, _ = a.alloc_paired(8)
    assert list(more) == list(b.alloc(8))
    for c in (a, b):
        assert c.free_swa(more[:2]) == 2
        c.evict_components(0, swa_tokens=8)
    r2, kept2, window2 = a.insert_paired(KEY, more, swa_evicted=4, tail=9)
    s2 = b.insert(KEY, more, swa_evicted=4)
    assert (r2.cached, r2.len, r2.handle) == (s2.cached, s2.len, None)
    # Without a lock both name the key's node (the TreeCore reads it).
    assert r2.node is not None and r2.node == s2.node
    assert a.match_prefix(KEY).handle == r2.node
    assert list(kept2) == list(b.peek_full(KEY)[1])
    assert list(window2) == peers(b.swa_pages(kept2[-8:]))
    # A lock with the window's pairing and its receipt's delta.
    lock, delta, paired = a.lock_paired(r.handle, pages[3:6])
    assert (lock, delta) == b._lock_receipt(s.handle)
    assert list(paired) == peers(b.swa_pages(pages[3:6]))
    again, delta2, none = a.lock_paired(r.handle)
    assert (delta2, list(none)) == (0, [])  # locked already: nothing new
    for h in (lock, again, r.handle):
        a.unlock(h)
    assert a.stats()["protected_tokens"] == 0
    a.validate()
    b.validate()


def test_state_slots_go_and_come_back_together(make):
    c = make(MAMBA)
    states = c.alloc_states(3)
    assert len(set(states)) == 3 and counts(c)[2] == 1
    refused(c, "insufficient_states", lambda: c.alloc_states(2))
    refused(c, "state_not_owned", lambda: c.free_states([states[0], states[0]]))
    free = [s for s in range(4) if s not in states]
    refused(c, "state_not_owned", lambda: c.free_states([states[0], free[0]]))
    c.free_states(states)
    assert counts(c)[2] == 4
    assert c.alloc_states(0) == []
    c.free_states([])
    # A state checkpointed, unlocked: evictable, so four can be had again.
    pages = c.alloc(4)
    (s,) = c.alloc_states(1)
    r, kept, _ = c.insert_paired(KEY[:8], pages, lock=True, mamba_state=s)
    assert (r.mamba_exist, list(kept)) == (False, list(pages))
    refused(c, "insufficient_states", lambda: c.alloc_states(4))
    c.unlock(r.handle)
    assert len(c.alloc_states(4)) == 4
    assert c.match_prefix(KEY[:8]).mamba_state is None


def test_free_counts_are_what_stats_says(make):
    c = make(SWA)
    assert c.free_counts() == counts(c) == (24, 24, 0)
    pages, _ = c.alloc_paired(5)
    assert c.free_counts() == counts(c) == (19, 19, 0)
    c.free_swa(pages[:1])
    assert c.free_counts() == counts(c) == (19, 20, 0)
    c.insert_paired(KEY[:10], pages, swa_evicted=2, tail=1)
    assert c.free_counts() == counts(c)
    c.evict(10)
    assert c.free_counts() == counts(c) == (24, 24, 0)


def test_another_client_s_changes_show_in_the_kept_counts(start_daemon):
    d = start_daemon(*SWA, page_size=2, capacity=24)
    a, b = d.client(), d.client()
    assert a.free_counts() == (24, 24, 0)
    a.alloc_paired(2)
    assert a.free_counts() == (22, 22, 0)
    theirs = b.alloc(3)
    assert a.free_counts() == (19, 19, 0)
    b.free(theirs)
    assert a.free_counts() == (22, 22, 0) == counts(b)


def test_bad_paired_calls_raise_and_change_nothing(make):
    c = make(SWA)
    pages = c.alloc(4)
    r, _, _ = c.insert_paired(KEY[:8], pages, lock=True)
    refused(c, "page_out_of_range", lambda: c.lock_paired(r.handle, [pages[0], 999]))
    refused(c, "component_off", lambda: c.alloc_states(1))
    refused(c, "component_off", lambda: c.free_states([0]))
    refused(c, "insufficient_pages", lambda: c.alloc_paired(999))
    with pytest.raises(ValueError):
        c.alloc_paired(-1)
    with pytest.raises(ValueError):
        c.insert_paired(KEY[:8], pages, tail=-1)
    with pytest.raises(TypeError):
        c.lock_paired(r.handle, "pages")
    full = make(["--components", "full"])
    fp = full.alloc(4)
    refused(full, "component_off", lambda: full.insert_paired(KEY[:8], fp, lock=True, tail=1))
    fr, kept, window = full.insert_paired(KEY[:8], fp, lock=True)
    assert (list(kept), list(window)) == (list(fp), [])
    refused(full, "component_off", lambda: full.lock_paired(fr.handle, fp))
    assert full.lock_paired(fr.handle)[1] == 0  # locked already: nothing newly protected
    assert full.free_counts() == (20, 0, 0)
