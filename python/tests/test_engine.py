"""radixd.Engine: every method, the exec error kinds an in-process engine
can meet, and token/page input of every kind."""

from __future__ import annotations

import array

import numpy as np
import pytest

import radixd

STATS_KEYS = {
    "total_tokens", "evictable_tokens", "protected_tokens", "free_pages",
    "nodes", "evict_scanned", "sessions",
}


@pytest.fixture(params=["in-place", "memoryview"])
def engine(request):
    """An engine, with buffers read in place (CPython >= 3.11) or through
    memoryview (the 3.9/3.10 path)."""
    raw = radixd._native._use_raw_buffers(request.param == "in-place")
    if request.param == "in-place" and not raw:
        pytest.skip("in-place buffers need CPython >= 3.11")
    yield radixd.Engine(page_size=4, capacity=64)
    radixd._native._use_raw_buffers(True)


def test_every_method(engine):
    assert (engine.page_size, engine.capacity) == (4, 64)
    pages = engine.alloc(3)
    assert isinstance(pages, array.array) and pages.typecode == "I" and len(pages) == 3
    # 13 tokens: 3 whole pages, the partial last page ignored
    ins = engine.insert(list(range(13)), pages, lock=True)
    assert isinstance(ins, radixd.InsertResult)
    assert (ins.cached, ins.len) == (0, 12) and isinstance(ins.handle, int)
    m = engine.match_prefix(list(range(10)) + [99])
    assert m.len == 8 and list(m.pages) == list(pages[:2]) and isinstance(m.handle, int)
    miss = engine.match_prefix([99, 98, 97, 96])
    assert (miss.len, list(miss.pages), miss.handle) == (0, [], None)
    s = engine.stats()
    assert set(s) == STATS_KEYS
    assert (s["total_tokens"], s["protected_tokens"], s["evictable_tokens"]) == (12, 12, 0)
    assert engine.evict(100) == 0  # all locked
    engine.unlock(ins.handle)
    assert engine.stats()["evictable_tokens"] == 12
    ml = engine.match_prefix(list(range(8)), lock=True)
    assert ml.len == 8
    assert engine.stats()["protected_tokens"] == 8
    engine.unlock(ml.handle)
    engine.lock(ml.handle)
    engine.unlock(ml.handle)
    assert engine.evict(1) == 4
    assert engine.stats()["total_tokens"] == 8
    engine.validate()
    own = engine.alloc(2)
    engine.free(own)
    sp = engine.alloc(2)
    c = engine.session_commit("chat", list(range(100, 108)), sp)
    assert (c.cached, c.len, c.handle) == (0, 8, None)
    st = engine.session_status("chat")
    assert st["resident_tokens"] == 8 and st["idle_ms"] >= 0 and set(st) == {"resident_tokens", "idle_ms"}
    assert engine.stats()["sessions"] == 1
    engine.session_release("chat")
    assert engine.stats()["sessions"] == 0
    engine.reset()
    assert engine.stats()["total_tokens"] == 0 and engine.stats()["free_pages"] == 64
    engine.validate()
    with radixd.Engine(1, 8) as e2:
        assert e2.stats()["free_pages"] == 8
    assert "Engine" in repr(engine)


def kind_of(excinfo) -> str:
    assert isinstance(excinfo.value, radixd.RadixdError)
    return excinfo.value.kind


@pytest.mark.parametrize(
    "kind,cls_name",
    [("page_out_of_range", "PageOutOfRangeError"), ("page_not_owned", "PageNotOwnedError"),
     ("page_count_mismatch", "PageCountMismatchError"), ("insufficient_pages", "InsufficientPagesError"),
     ("unknown_handle", "UnknownHandleError"), ("stale_handle", "StaleHandleError"),
     ("not_locked", "NotLockedError"), ("unknown_session", "UnknownSessionError")],
)
def test_error_kinds(engine, kind, cls_name):
    pages = engine.alloc(2)
    r = engine.insert(list(range(8)), pages, lock=False)
    h = engine.match_prefix(list(range(8))).handle
    before = engine.stats()
    actions = {
        "page_out_of_range": lambda: engine.free([64]),
        "page_not_owned": lambda: engine.free([63]),
        "page_count_mismatch": lambda: engine.insert(list(range(8)), [5]),
        "insufficient_pages": lambda: engine.alloc(65),
        "unknown_handle": lambda: engine.lock((1 << 32) | 1_000_000),
        "stale_handle": lambda: (engine.evict(100), engine.lock(h)),
        "not_locked": lambda: engine.unlock(h),
        "unknown_session": lambda: engine.session_status("nobody"),
    }
    with pytest.raises(radixd.RadixdError) as e:
        actions[kind]()
    assert kind_of(e) == kind
    assert type(e.value).__name__ == cls_name
    assert isinstance(e.value, getattr(radixd, cls_name))
    assert e.value.message and kind in str(e.value)
    if kind != "stale_handle":
        assert engine.stats() == before  # a rejected request changes nothing
    assert r.cached == 0
    engine.validate()


def test_error_classes_cover_every_exec_kind():
    kinds = radixd._native._error_kinds()
    for kind in kinds + ["not_permitted"]:
        cls = radixd.error_class(kind)
        assert cls is not radixd.RadixdError and cls.kind == kind
        e = radixd._errors.make_error(kind, "why")
        assert isinstance(e, cls) and isinstance(e, radixd.RadixdError)
        assert (e.kind, e.message) == (kind, "why")
    assert {"unknown_op", "malformed", "protocol", "too_large", "daemon_gone", "timeout", "invariant"} <= set(kinds)
    assert "moved" not in kinds  # internal: the client falls back by itself
    assert issubclass(radixd.ERRORS["timeout"], TimeoutError)
    assert issubclass(radixd.ERRORS["daemon_gone"], ConnectionError)
    odd = radixd._errors.make_error("brand_new_kind", "m")
    assert type(odd) is radixd.RadixdError and odd.kind == "brand_new_kind"


TOKENS = list(range(1, 17))


@pytest.mark.parametrize(
    "make",
    [
        lambda t: list(t),
        lambda t: tuple(t),
        lambda t: array.array("I", t),
        lambda t: array.array("q", t),
        lambda t: array.array("l", t),
        lambda t: array.array("i", t),
        lambda t: np.array(t, dtype=np.int32),
        lambda t: np.array(t, dtype=np.int64),
        lambda t: np.array(t, dtype=np.uint32),
        lambda t: np.array(t, dtype=np.uint64),
        lambda t: np.array(t, dtype=np.int64)[::-1][::-1],  # a view
        lambda t: np.repeat(np.array(t, dtype=np.int64), 2)[::2],  # not contiguous
        lambda t: np.array(t, dtype=np.dtype(">i8")),  # big endian
        lambda t: iter(t),
        lambda t: range(t[0], t[-1] + 1),
    ],
    ids=["list", "tuple", "array-I", "array-q", "array-l", "array-i", "np-int32", "np-int64",
         "np-uint32", "np-uint64", "np-view", "np-strided", "np-big-endian", "iterator", "range"],
)
def test_buffer_inputs(engine, make):
    pages = engine.alloc(4)
    assert engine.insert(make(TOKENS), make(list(pages))).len == 16
    assert engine.match_prefix(make(TOKENS)).len == 16
    assert list(engine.match_prefix(make(TOKENS)).pages) == list(pages)


def test_lists_of_every_int_width_read_exactly(engine):
    # Lists are read from CPython's int layout where the start-up probe
    # confirmed it: values of one and two 30-bit digits, bools and int
    # subclasses (the slower path) must all read as their buffer twins.
    class Int(int):
        pass

    wide = [0, 1, 2**30 - 1, 2**30, 2**31 + 5, 2**32 - 1, 12345, 2**29]
    pages = engine.alloc(2)
    engine.insert(array.array("I", wide), pages)
    assert engine.match_prefix(wide).len == 8
    assert engine.match_prefix(tuple(wide)).len == 8
    assert engine.match_prefix(wide[:3] + [Int(2**30)] + wide[4:]).len == 8
    assert engine.match_prefix([False, True] + wide[2:]).len == 8
    for i in range(8):
        off = list(wide)
        off[i] ^= 1 << 30 if off[i] < 2**31 else 1
        assert engine.match_prefix(off).len == i // 4 * 4, i


@pytest.mark.parametrize(
    "bad",
    [
        [2**32],
        [-1],
        [1, 2, 2**40],
        np.array([2**32], dtype=np.int64),
        np.array([-5], dtype=np.int32),
        np.array([2**32 + 1], dtype=np.uint64),
        array.array("q", [-1]),
        [2**70],
    ],
)
def test_values_beyond_u32_raise_value_error(engine, bad):
    with pytest.raises(ValueError):
        engine.match_prefix(bad)
    with pytest.raises(ValueError):
        engine.free(bad)


@pytest.mark.parametrize("bad", [np.array([1.5]), ["a"], [None], 7, np.array([1.0], dtype=np.float32)])
def test_non_integers_raise_type_error(engine, bad):
    with pytest.raises(TypeError):
        engine.match_prefix(bad)


def test_negative_counts_and_bad_arguments(engine):
    with pytest.raises(ValueError):
        engine.alloc(-1)
    with pytest.raises(ValueError):
        engine.lock(-1)
    with pytest.raises(TypeError):
        engine.lock(None)
    with pytest.raises(ValueError):
        radixd.Engine(0, 8)
    with pytest.raises(ValueError):
        engine.order([[1]], policy="fcfs")


def test_pages_out_are_zero_copy_for_numpy(engine):
    pages = engine.alloc(4)
    view = np.frombuffer(pages, dtype=np.uint32)
    assert view.tolist() == list(pages)


def test_order_lpm_and_dfs_weight_differ():
    e = radixd.Engine(1, 256)
    for key in ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11], [9, 10, 12], [9, 13]):
        e.insert(key, e.alloc(len(key)))
    prompts = [[9, 13, 50], [1, 2, 3, 4, 5, 6, 7, 8, 60], [70, 71], [9, 10, 11, 80], np.array([9, 10, 12])]
    assert e.order(prompts, "lpm") == [1, 3, 4, 0, 2]
    assert e.order(prompts, policy="dfs-weight") == [3, 4, 0, 1, 2]
    assert e.order([], "lpm") == []


def test_recency_is_exact_by_default_and_sglang_on_request():
    """A split uses only the matched upper half (exact recency), or both
    halves, as SGLang's tree does (``recency="sglang"``): the older leaf
    partial eviction takes differs."""
    found = {}
    for recency in ("exact", "sglang"):
        e = radixd.Engine(1, 16) if recency == "exact" else radixd.Engine(1, 16, recency=recency)
        assert e.recency == recency
        for t in ([1, 2, 3, 4], [9, 9]):
            e.insert(t, e.alloc(len(t)))
        e.match_prefix([1, 2])  # splits [1, 2 | 3, 4]
        assert e.evict(2) == 2
        found[recency] = (e.match_prefix([1, 2, 3, 4]).len, e.match_prefix([9, 9]).len)
    assert found == {"exact": (2, 2), "sglang": (4, 0)}
    with pytest.raises(ValueError, match="exact or sglang"):
        radixd.Engine(1, 16, recency="lru")
