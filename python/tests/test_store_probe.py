"""The store calls radixd's vLLM tier needs beside the others: ``store_probe``
(exists without the connection's lock, so a scheduler's lookup never waits
for a copy in flight on another thread), ``store_find_namespace``,
``store_value_max``, and the writer's own ``store_reserve`` /
``store_commit`` / ``store_abort`` (a full store, a writer killed between
reserve and commit). No vLLM; ``import radixd`` does not import it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import radixd

SIZE = 64 << 10


@pytest.fixture
def store(start_daemon):
    # 1 MiB: 8 extents of 128 KiB, 16 values of 64 KiB.
    return start_daemon("--store", "1MiB")


def test_import_radixd_does_not_import_vllm():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, radixd; print('vllm' in sys.modules, 'radixd.vllm' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.split() == ["False", "False"]


def test_probe_answers_as_exists(store):
    with store.client() as c:
        ns = c.store_namespace("probe/a", SIZE)
        keys = [f"k{i}" for i in range(4)]
        c.store_put_many(ns, keys, [None, *keys[:-1]], [np.full(SIZE, i, np.uint8) for i in range(4)])
        assert c.store_probe(ns, keys) == 4 == c.store_exists(ns, keys)
        assert c.store_probe(ns, ["k0", "nope", "k2"]) == 1
        assert c.store_probe(ns, []) == 0
        assert c.store_probe(ns, [b"k1"]) == 1  # str and bytes: one key
        # Bad input: typed errors, as store_exists.
        with pytest.raises(radixd.BadKeyError):
            c.store_probe(ns, ["x" * 257])
        with pytest.raises(radixd.BadKeyError):
            c.store_probe(ns, [""])
        with pytest.raises(TypeError):
            c.store_probe(ns, [3])
        with pytest.raises(radixd.UnknownNamespaceError):
            c.store_probe(63, ["k0"])
        # Another client's namespace id works (ids are the node's).
        with store.client() as other:
            assert other.store_probe(ns, keys) == 4


def test_find_namespace_and_value_max(store):
    with store.client() as c:
        assert c.store_find_namespace("probe/b") is None
        ns = c.store_namespace("probe/b", SIZE)
        with store.client() as other:
            assert other.store_find_namespace("probe/b") == ns
        assert c.store_value_max == 128 << 10
        with pytest.raises(radixd.TooLargeError):
            c.store_namespace("probe/big", (128 << 10) + 1)


def test_without_a_store(start_daemon):
    d = start_daemon()
    with d.client() as c:
        with pytest.raises(radixd.NoStoreError):
            c.store_probe(0, ["k"])
        with pytest.raises(radixd.NoStoreError):
            c.store_find_namespace("x")
        with pytest.raises(radixd.NoStoreError):
            c.store_value_max


def test_probe_beside_puts_on_another_thread(store):
    """One client, two threads: puts hold the connection (their copies run
    with the GIL released) while the other thread probes; a probe takes no
    connection lock and answers throughout."""
    with store.client() as c:
        ns = c.store_namespace("probe/c", SIZE)
        c.store_put_many(ns, ["there"], [None], [np.zeros(SIZE, np.uint8)])
        big = np.zeros((8, SIZE), np.uint8)
        t = threading.Thread(
            target=lambda: [
                c.store_put_many(ns, [f"v{r}-{i}" for i in range(8)], [None] * 8, list(big)) for r in range(20)
            ]
        )
        probes = []
        t.start()
        while t.is_alive():
            probes.append(c.store_probe(ns, ["there", "never"]))
        t.join()
        assert probes and set(probes) <= {0, 1}
        assert c.store_probe(ns, ["there"]) in (0, 1)


def test_reserve_commit_abort_and_a_full_store(store):
    with store.client() as c:
        ns = c.store_namespace("probe/d", SIZE)
        keys = [f"r{i}" for i in range(16)]
        slots = c.store_reserve(ns, keys, [None] * 16)
        assert all(s is not None for s in slots)
        # A reserved key reads as absent, and reserving it again is None.
        assert c.store_probe(ns, ["r0"]) == 0
        assert c.store_reserve(ns, ["r0"], [None]) == [None]
        # The store is full of reservations: no room for anyone.
        with store.client() as other:
            with pytest.raises(radixd.StoreFullError):
                other.store_put_many(ns, ["late"], [None], [np.zeros(SIZE, np.uint8)])
            with pytest.raises(radixd.NotReservedError):
                other.store_commit(ns, slots[:1])
        assert c.store_commit(ns, slots[:4]) == 4
        assert c.store_probe(ns, keys) == 4
        assert c.store_abort(ns, slots[4:]) == 12
        assert c.store_probe(ns, keys) == 4
        assert c.store_put_many(ns, ["late"], [None], [np.zeros(SIZE, np.uint8)]) == [True]


def test_a_writer_killed_between_reserve_and_commit_leaks_nothing(store):
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, radixd
            c = radixd.Client({store.name!r})
            ns = c.store_namespace("probe/e", {SIZE})
            slots = c.store_reserve(ns, [f"x{{i}}" for i in range(16)], [None] * 16)
            print(sum(s is not None for s in slots), flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "16"
        with store.client() as c:
            ns = c.store_namespace("probe/e", SIZE)
            with pytest.raises(radixd.StoreFullError):
                c.store_put_many(ns, ["y"], [None], [np.zeros(SIZE, np.uint8)])
            child.kill()
            child.wait()
            # The daemon's sweep gives the dead writer's slots back.
            deadline = time.monotonic() + 5
            while True:
                try:
                    assert c.store_put_many(ns, ["y"], [None], [np.zeros(SIZE, np.uint8)]) == [True]
                    break
                except radixd.StoreFullError:
                    assert time.monotonic() < deadline, "reservations of a dead writer leaked"
                    time.sleep(0.05)
            assert c.store_probe(ns, [f"x{i}" for i in range(16)]) == 0
            # All 16 of its keys can be stored (the 17th evicts "y").
            got = c.store_put_many(ns, [f"x{i}" for i in range(16)], [None] * 16, [np.zeros(SIZE, np.uint8)] * 16)
            assert got == [True] * 16
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
