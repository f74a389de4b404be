"""radixd.Client against a real daemon: every method, the error kinds only a
daemon produces, threads, processes, and a daemon that dies or stalls."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import radixd

STATS_KEYS = {
    "total_tokens", "evictable_tokens", "protected_tokens", "free_pages",
    "nodes", "evict_scanned", "sessions",
}


def test_every_method(daemon):
    with daemon.client() as c:
        assert (c.page_size, c.capacity, c.name) == (4, 256, daemon.name)
        pages = c.alloc(3)
        ins = c.insert(np.arange(13, dtype=np.int64), pages, lock=True)
        assert (ins.cached, ins.len) == (0, 12) and isinstance(ins.handle, int)
        length, peeked = c.peek(list(range(13)))
        assert length == 12 and list(peeked) == list(pages)
        m = c.match_prefix(list(range(9)))
        assert m.len == 8 and list(m.pages) == list(pages[:2]) and isinstance(m.handle, int)
        assert c.match_prefix([500, 501, 502, 503]).handle is None
        s = c.stats()
        assert set(s) == STATS_KEYS and s["protected_tokens"] == 12
        c.unlock(ins.handle)
        ml = c.match_prefix(list(range(8)), lock=True)
        assert c.stats()["protected_tokens"] == 8
        c.unlock(ml.handle)
        c.lock(ml.handle)
        c.unlock(ml.handle)
        assert c.evict(4) == 4
        c.free(c.alloc(2))
        sp = c.alloc(2)
        r = c.session_commit("s1", list(range(50, 58)), sp)
        assert (r.cached, r.len, r.handle) == (0, 8, None)
        assert c.session_status("s1")["resident_tokens"] == 8
        c.session_release("s1")
        c.validate()
        assert c.order([list(range(8)), [7, 7, 7, 7]], "lpm") == [0, 1]
        assert c.order([[7, 7, 7, 7], list(range(8))], policy="dfs-weight") == [1, 0]
        assert not c.closed
    assert c.closed
    with pytest.raises(ValueError):
        c.stats()
    c.close()  # idempotent


def test_an_unlock_held_rides_with_the_next_call_and_a_refusal_is_logged(daemon, caplog):
    with daemon.client() as a, daemon.client() as b:
        ins = a.insert(list(range(8)), a.alloc(2), lock=True)
        a.unlock_later(ins.handle)
        # Not sent yet: the node stays locked for everyone else.
        assert a.unlocks_held == 1 and b.stats()["protected_tokens"] == 8
        # The next call carries it; its own answer is unchanged.
        assert a.match_prefix(list(range(8))).len == 8
        assert a.unlocks_held == 0 and b.stats()["protected_tokens"] == 0
        # A lock not held: the call it rode with answers, the refusal warns.
        a.unlock_later(ins.handle)
        with caplog.at_level("WARNING", logger="radixd"):
            assert a.stats()["protected_tokens"] == 0
        assert [r.name for r in caplog.records] == ["radixd"]
        assert "was refused" in caplog.records[0].getMessage()
        a.lock(ins.handle)
        a.unlock_later(ins.handle)
        a.flush_unlocks()
        assert a.unlocks_held == 0 and b.stats()["protected_tokens"] == 0
        a.validate()
    # In-process there is nothing to hold: it unlocks at once.
    e = radixd.Engine(4, 16)
    r = e.insert(list(range(8)), e.alloc(2), lock=True)
    e.unlock_later(r.handle)
    assert e.unlocks_held == 0 and e.stats()["protected_tokens"] == 0
    e.flush_unlocks()
    with pytest.raises(radixd.RadixdError):
        e.unlock_later(r.handle)


def test_reset_through_a_daemon(daemon):
    c = daemon.client()
    c.insert(list(range(8)), c.alloc(2))
    try:
        c.reset()
    except radixd.RadixdError as e:  # a daemon may refuse it
        assert e.kind == "not_permitted"
    else:
        assert c.stats()["total_tokens"] == 0


def test_error_kinds_only_a_daemon_meets(start_daemon):
    d = start_daemon("--scratch-bytes", "65536")
    a, b = d.client(), d.client()
    a.session_commit("mine", list(range(8)), a.alloc(2))
    with pytest.raises(radixd.SessionNotOwnedError) as e:
        b.session_release("mine")
    assert e.value.kind == "session_not_owned"
    with pytest.raises(radixd.MalformedError) as e:
        a.session_status("")
    assert e.value.kind == "malformed"
    with pytest.raises(radixd.TooLargeError) as e:
        a.match_prefix(np.zeros(100_000, dtype=np.int64))
    assert e.value.kind == "too_large"
    with pytest.raises(radixd.PageNotOwnedError):
        b.free(a.alloc(1))  # another client's page
    a.validate()


def test_connect_to_nothing_is_daemon_gone():
    with pytest.raises(radixd.DaemonGoneError) as e:
        radixd.Client("radixd-py-no-such-segment")
    assert e.value.kind == "daemon_gone"


def test_daemon_killed_under_a_client_is_daemon_gone_within_a_second(start_daemon):
    d = start_daemon()
    c = d.client()
    c.insert(list(range(8)), c.alloc(2))
    d.signal(signal.SIGKILL)
    d.proc.wait()
    for call in (lambda: c.match_prefix(list(range(8))), c.stats, lambda: c.alloc(1)):
        t0 = time.monotonic()
        with pytest.raises(radixd.RadixdError) as e:
            call()
        assert e.value.kind == "daemon_gone"
        assert isinstance(e.value, ConnectionError)
        assert time.monotonic() - t0 < 1.0


def test_stalled_daemon_times_out_and_the_gil_is_free_meanwhile(start_daemon):
    d = start_daemon()
    c = d.client(timeout=0.5)
    c.stats()
    d.signal(signal.SIGSTOP)
    try:
        ticks = 0
        box = {}

        def call():
            t0 = time.monotonic()
            try:
                c.stats()
            except radixd.RadixdError as e:
                box["error"], box["took"] = e, time.monotonic() - t0

        t = threading.Thread(target=call)
        t.start()
        while t.is_alive():  # runs only if the waiting call released the GIL
            ticks += 1
            time.sleep(0.001)
        t.join()
        assert box["error"].kind == "timeout" and isinstance(box["error"], TimeoutError)
        assert 0.4 < box["took"] < 2.0
        assert ticks > 50
    finally:
        d.signal(signal.SIGCONT)
    # A fresh client is served again once the daemon resumes. (The timed-out
    # client itself may meet the late answer to its abandoned request as a
    # `protocol` error: that is the Rust client's behaviour, src/client/port.rs.)
    assert set(d.client().stats()) == STATS_KEYS


def test_one_client_from_many_threads_serialises(daemon):
    c = daemon.client()
    errors = []

    def work(seed: int):
        try:
            for i in range(100):
                key = [seed, i % 7, 1, 2, 3, 4, 5, 6]
                m = c.match_prefix(key, lock=True)
                if m.len < 8:
                    got = c.alloc(2 - len(m.pages))
                    r = c.insert(key, list(m.pages) + list(got))
                    assert r.len == 8
                if m.handle is not None:
                    c.unlock(m.handle)
                c.peek(key)
        except Exception as e:  # noqa: BLE001 - collected for the assert
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    c.validate()
    assert c.stats()["protected_tokens"] == 0


CHILD = textwrap.dedent(
    """
    import sys, radixd
    c = radixd.Client(sys.argv[1])
    me = int(sys.argv[2])
    shared = list(range(1000, 1016))
    for i in range(200):
        key = shared + [me, i % 5, 0, 0]
        m = c.match_prefix(key, lock=True)
        need = len(key) // c.page_size - len(m.pages)
        if need:
            c.insert(key, list(m.pages) + list(c.alloc(need)))
        if m.handle is not None:
            c.unlock(m.handle)
    print(c.peek(shared)[0])
    """
)


def test_two_processes_share_one_daemon(daemon):
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, daemon.name, str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [o.strip() for o in outs] == ["16", "16"]
    c = daemon.client()
    assert c.peek(list(range(1000, 1016)))[0] == 16
    # both children's keys are cached, the shared prefix once
    assert c.match_prefix(list(range(1000, 1016)) + [0, 1, 0, 0]).len == 20
    assert c.match_prefix(list(range(1000, 1016)) + [1, 4, 0, 0]).len == 20
    c.validate()
    assert c.stats()["protected_tokens"] == 0


def test_order_through_a_daemon_lpm_and_dfs_weight_differ(start_daemon):
    d = start_daemon(page_size=1, capacity=256)
    with d.client() as c:
        for key in ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11], [9, 10, 12], [9, 13]):
            c.insert(key, c.alloc(len(key)))
        prompts = [[9, 13, 50], np.array([1, 2, 3, 4, 5, 6, 7, 8, 60]), [70, 71], [9, 10, 11, 80], (9, 10, 12)]
        before = c.stats()
        assert c.order(prompts, "lpm") == [1, 3, 4, 0, 2]
        assert c.order(prompts, policy="dfs-weight") == [3, 4, 0, 1, 2]
        assert c.stats() == before  # peeks touch nothing
        with pytest.raises(ValueError):
            c.order(prompts, "fcfs")
        with pytest.raises(ValueError):
            c.order([[2**32]], "lpm")
