"""radixd.Client's store methods against a daemon started with --store:
put/get/exists through numpy, bytearray, memoryview and raw addresses, one
value stored once however many put it, the error kinds, the stats, and two
processes sharing values. No torch, no SGLang."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import radixd

SIZE = 4096


@pytest.fixture
def store(start_daemon):
    return start_daemon("--store", "16MiB")


def value(key, size: int = SIZE) -> np.ndarray:
    """The bytes ``key`` (str or bytes: the same key) holds in these tests."""
    raw = key.encode() if isinstance(key, str) else key
    seed = int.from_bytes(raw[:8].ljust(8, b"\0"), "little") ^ len(raw)
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def put_chain(c, ns, keys, size=SIZE):
    parents = [None, *keys[:-1]]
    return c.store_put_many(ns, keys, parents, [value(k, size) for k in keys])


@pytest.fixture(params=["in-place", "memoryview"])
def buffer_path(request):
    """Buffers read and written in place (``Py_buffer``, CPython >= 3.11) or
    through ``memoryview``/``ctypes`` (the 3.9/3.10 path)."""
    raw = radixd._native._use_raw_buffers(request.param == "in-place")
    if request.param == "in-place" and not raw:
        pytest.skip("in-place buffers need CPython >= 3.11")
    yield request.param
    radixd._native._use_raw_buffers(True)


def test_put_get_exists_through_every_buffer(store, buffer_path):
    with store.client() as c:
        assert c.has_store
        ns = c.store_namespace("test/a", SIZE)
        assert isinstance(ns, int)
        assert c.store_namespace("test/a", SIZE) == ns  # registered once
        keys = ["k0", "k1", b"k2"]
        assert put_chain(c, ns, keys) == [True, True, True]
        assert c.store_exists(ns, keys) == 3
        assert c.store_exists(ns, ["k0", "nope", "k2"]) == 1
        assert c.store_exists(ns, []) == 0
        # str and bytes name the same key.
        assert c.store_exists(ns, [b"k0", "k1", "k2"]) == 3
        out = np.zeros(SIZE, np.uint8)
        assert c.store_get(ns, "k1", out) is True
        assert np.array_equal(out, value("k1"))
        ba = bytearray(SIZE)
        assert c.store_get(ns, b"k2", ba) is True and bytes(ba) == value("k2").tobytes()
        mv = memoryview(bytearray(2 * SIZE))[SIZE:]
        assert c.store_get(ns, "k0", mv) is True and mv.tobytes() == value("k0").tobytes()
        as_u32 = np.zeros(SIZE // 4, np.uint32)  # any item type: bytes are bytes
        assert c.store_get(ns, "k0", as_u32) is True
        assert as_u32.tobytes() == value("k0").tobytes()
        assert c.store_get(ns, "missing", out) is False
        # Values from read-only and writable buffers of every kind.
        more = ["b0", "b1", "b2"]
        vals = [value(k) for k in more]
        assert c.store_put_many(
            ns, more, ["k2", "b0", "b1"],
            [vals[0].tobytes(), bytearray(vals[1].tobytes()), memoryview(vals[2].tobytes())],
        ) == [True, True, True]
        assert c.store_exists(ns, more) == 3
        assert c.store_get(ns, "b1", out) and np.array_equal(out, vals[1])
        outs = [np.zeros(SIZE, np.uint8) for _ in range(4)]
        assert c.store_get_many(ns, ["k0", "zz", "k1", "k2"], outs) == [True, False, True, True]
        assert np.array_equal(outs[2], value("k1"))


def test_raw_pieces_gather_and_scatter(store):
    with store.client() as c:
        ns = c.store_namespace("test/raw", SIZE)
        # One value from three pieces of two arrays (as a KV page's K and V).
        src = [value("a"), value("b")]
        k_part, v_part = np.concatenate(src)[:1000].copy(), np.concatenate(src)[1000:].copy()
        pieces = [
            [(k_part.ctypes.data, 1000), (v_part.ctypes.data, SIZE - 1000)],
            [(v_part.ctypes.data + SIZE - 1000, SIZE)],
        ]
        assert c.store_put_many_raw(ns, ["a", "b"], [None, "a"], pieces) == [True, True]
        out = np.zeros(2 * SIZE, np.uint8)
        base = out.ctypes.data
        got = c.store_get_many_raw(
            ns, ["b", "a", "c"],
            [[(base + SIZE, 10), (base + SIZE + 10, SIZE - 10)], [(base, SIZE)], [(base, SIZE)]],
        )
        assert got == [True, True, False]
        assert np.array_equal(out, np.concatenate(src))


def test_a_value_is_stored_once_whoever_puts_it(store):
    with store.client() as a, store.client() as b:
        ns = a.store_namespace("test/dedup", SIZE)
        assert b.store_namespace("test/dedup", SIZE) == ns
        assert put_chain(a, ns, ["x", "y"]) == [True, True]
        assert put_chain(b, ns, ["x", "y", "z"]) == [False, False, True]
        s = a.store_stats()
        assert s["values"] == 3 and s["bytes"] == 3 * SIZE
        # Ids are the node's: a client reads and writes through an id
        # another client registered, without registering it.
        with store.client() as c:
            assert c.store_exists(ns, ["x", "y", "z"]) == 3
            out = np.zeros(SIZE, np.uint8)
            assert c.store_get_many(ns, ["z"], [out]) == [True] and np.array_equal(out, value("z"))
            assert put_chain(c, ns, ["z", "w"]) == [False, True]
            with pytest.raises(radixd.RadixdError) as e:
                c.store_get(ns, "x", np.zeros(SIZE + 1, np.uint8))
            assert e.value.kind == "size_mismatch"  # the size comes with the id
            for unknown in (ns + 1, 10_000):
                with pytest.raises(radixd.RadixdError) as e:
                    c.store_exists(unknown, ["x"])
                assert e.value.kind == "unknown_namespace"
            with pytest.raises(TypeError):
                c.store_exists("test/dedup", ["x"])
        # Another namespace is another value.
        other = a.store_namespace("test/dedup2", SIZE)
        assert other != ns and put_chain(a, other, ["x"]) == [True]
        assert a.store_exists(other, ["y"]) == 0


def test_clear_drops_one_namespace_only(store):
    with store.client() as a, store.client() as b:
        mine = a.store_namespace("test/clear-mine", SIZE)
        theirs = b.store_namespace("test/clear-theirs", SIZE)
        keys = [f"c{i}" for i in range(5)]
        put_chain(a, mine, keys)
        put_chain(b, theirs, keys)
        assert a.store_clear(mine) == 5
        assert a.store_exists(mine, keys) == 0 and b.store_exists(theirs, keys) == 5
        assert a.store_clear(mine) == 0
        assert a.store_stats()["values"] == 5
        # The namespace stays registered: it stores again.
        assert put_chain(a, mine, keys[:2]) == [True, True]
        out = np.zeros(SIZE, np.uint8)
        assert a.store_get(mine, "c1", out) and np.array_equal(out, value("c1"))
        with pytest.raises(radixd.RadixdError) as e:
            a.store_clear(63)  # an id nobody registered
        assert e.value.kind == "unknown_namespace"


def test_errors_are_typed_and_change_nothing(store, start_daemon, buffer_path):
    with store.client() as c:
        ns = c.store_namespace("test/err", SIZE)
        with pytest.raises(radixd.RadixdError) as e:
            c.store_namespace("test/err", SIZE * 2)
        assert e.value.kind == "size_mismatch"
        with pytest.raises(radixd.RadixdError) as e:
            c.store_namespace("test/huge", 64 * 1024 * 1024)  # over an extent
        assert e.value.kind == "too_large"
        with pytest.raises(radixd.RadixdError) as e:
            c.store_put_many(ns, ["short"], [None], [bytes(SIZE - 1)])
        assert e.value.kind == "size_mismatch"
        with pytest.raises(radixd.RadixdError) as e:
            c.store_get(ns, "k", bytearray(SIZE + 1))
        assert e.value.kind == "size_mismatch"
        for bad in ["", "x" * 257]:
            with pytest.raises(radixd.RadixdError) as e:
                c.store_put_many(ns, [bad], [None], [bytes(SIZE)])
            assert e.value.kind == "bad_key"
        with pytest.raises(TypeError):
            c.store_get(ns, "k", bytes(SIZE))  # read-only buffer
        with pytest.raises(TypeError):
            c.store_exists(ns, [1, 2])
        with pytest.raises(ValueError):
            c.store_put_many(ns, ["a", "b"], [None], [bytes(SIZE)] * 2)  # lengths differ
        s = c.store_stats()
        assert s["values"] == 0 and s["bytes"] == 0
    plain = start_daemon()
    with plain.client() as c:
        assert c.has_store is False
        with pytest.raises(radixd.RadixdError) as e:
            c.store_namespace("test/none", SIZE)
        assert e.value.kind == "no_store"


def test_stats_count_hits_misses_and_evictions(start_daemon):
    d = start_daemon("--store", "4MiB")
    with d.client() as c:
        big = 64 * 1024
        ns = c.store_namespace("test/evict", big)
        keys = [f"e{i}" for i in range(200)]  # 12.5 MiB through a 4 MiB store
        for i in range(0, 200, 20):
            part = keys[i:i + 20]
            c.store_put_many(ns, part, [None] * 20, [value(k, big) for k in part])
        s = c.store_stats()
        assert set(s) >= {"values", "bytes", "capacity_bytes", "hits", "misses", "evicted",
                          "namespaces", "failed_reserves"}
        assert s["evicted"] > 0 and s["bytes"] <= s["capacity_bytes"] and s["namespaces"] >= 1
        out = np.zeros(big, np.uint8)
        found = [c.store_get(ns, k, out) and np.array_equal(out, value(k, big)) for k in keys]
        present = [c.store_exists(ns, [k]) == 1 for k in keys]
        assert found == present and any(found) and not all(found)
        t = c.store_stats()
        assert t["hits"] - s["hits"] == sum(found)
        assert t["misses"] - s["misses"] == len(keys) - sum(found)


def test_threads_share_one_client(store):
    with store.client() as c:
        ns = c.store_namespace("test/threads", SIZE)
        keys = [f"t{i}" for i in range(64)]
        put_chain(c, ns, keys)
        bad = []

        def reader():
            out = np.zeros(SIZE, np.uint8)
            for k in keys * 5:
                if not c.store_get(ns, k, out) or not np.array_equal(out, value(k)):
                    bad.append(k)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert bad == []


def test_two_processes_share_values(store):
    script = textwrap.dedent(f"""
        import sys, numpy as np, radixd
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from test_store import value, put_chain
        with radixd.Client({store.name!r}) as c:
            ns = c.store_namespace("test/procs", {SIZE})
            keys = [f"p{{i}}" for i in range(50)]
            out = np.zeros({SIZE}, np.uint8)
            ok = c.store_exists(ns, keys) == 50 and all(
                c.store_get(ns, k, out) and np.array_equal(out, value(k)) for k in keys)
            stored = put_chain(c, ns, [f"q{{i}}" for i in range(20)])
            print(ok, sum(stored))
    """)
    with store.client() as c:
        ns = c.store_namespace("test/procs", SIZE)
        put_chain(c, ns, [f"p{i}" for i in range(50)])
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", "20"]
        assert c.store_exists(ns, [f"q{i}" for i in range(20)]) == 20
        buf = np.zeros(SIZE, np.uint8)
        assert c.store_get(ns, "q7", buf) and np.array_equal(buf, value("q7"))
