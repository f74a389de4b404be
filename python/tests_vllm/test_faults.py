"""Bad input and faults of ``radixd.vllm.RadixdTier`` (issue 40's list): a
wrong-size or foreign value, a key over the limit, rows out of range, a
store full of reservations, the daemon SIGKILLed mid-store, a writer
SIGKILLed between reserve and commit, a value gone before its load. Each
ends in a failed job or a miss, never in wrong bytes, and the engine keeps
scheduling. Driven through a tier built on a real engine's spec over rows
of the test's own (so each job's timing is the test's), and through the
engine where the scheduler's answer matters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import restart
from engines import BLOCK, prompt
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob

import radixd
from radixd.vllm import RadixdTier, RadixdTierError, namespace_name, none_hash


def standalone(name: str, engine, rows: int = 16):
    """A tier on ``engine``'s spec over ``rows`` rows of its own."""
    size = engine.tier.value_size
    arr = np.zeros((rows, size), dtype=np.int8)
    tier = RadixdTier(
        offloading_spec=engine.tier._offloading_spec,
        primary_kv_view=memoryview(arr),
        tier_type="RadixdTier",
        store=name,
    )
    return tier, arr.view(np.uint8)


def keys_of(tag: str, n: int) -> list:
    import hashlib

    return [hashlib.sha256(f"{tag}{i}".encode()).digest() + (0).to_bytes(4, "big") for i in range(n)]


def job(job_id: int, keys, rows, promotion: bool, req: str = "r") -> TransferJob:
    ctx = ReqContext(req_id=req)
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, (i + 1) * BLOCK)
    return TransferJob(job_id=job_id, keys=list(keys), chunk_ids=np.asarray(rows, dtype=np.int64), is_promotion=promotion, req_context=ctx)


def results(tier, n: int, timeout: float = 20.0) -> dict:
    """The next ``n`` job results of ``tier``, by job id."""
    out = {}
    deadline = time.monotonic() + timeout
    while len(out) < n:
        for r in tier.get_finished_jobs():
            out[r.job_id] = r
        assert time.monotonic() < deadline, f"{n - len(out)} jobs never finished"
        time.sleep(0.002)
    return out


def fill(rows: np.ndarray, seed: int) -> None:
    rows[:] = np.random.default_rng(seed).integers(0, 256, rows.shape, dtype=np.uint8)


@pytest.fixture
def engine(store, engines):
    return engines(store.name, engine_id="E")


def test_store_then_load_and_a_partial_load(store, engine):
    tier, rows = standalone(store.name, engine)
    try:
        fill(rows[:8], 1)
        ks = keys_of("a", 8)
        tier.submit_store(job(0, ks[:6], range(6), False))
        assert results(tier, 1)[0].success
        assert all(tier.lookup(k, ReqContext("q")) is LookupResult.HIT for k in ks[:6])
        assert tier.lookup(ks[6], ReqContext("q")) is LookupResult.MISS
        want = rows[:6].copy()
        rows[8:16] = 0
        # Load 6 stored keys and 2 never stored: a partial failure naming
        # the keys that came, each of them byte for byte.
        tier.submit_load(job(1, ks, range(8, 16), True))
        r = results(tier, 1)[1]
        assert not r.success and set(r.successful_keys) == set(ks[:6])
        assert np.array_equal(rows[8:14], want)
        # A key already stored is skipped (one copy per node).
        with store.client() as c:
            before = c.store_stats()["values"]
        tier.submit_store(job(2, ks[:8], range(8), False))
        assert results(tier, 1)[2].success
        with store.client() as c:
            assert c.store_stats()["values"] == before + 2
        tier.drain_jobs()
        assert not tier.has_pending_work()
    finally:
        tier.shutdown()


def test_bad_keys_and_rows(store, engine):
    tier, rows = standalone(store.name, engine)
    try:
        ctx = ReqContext("q")
        # Keys over the store's limit (256 bytes) or empty: a miss, no raise.
        assert tier.lookup(b"x" * 200, ctx) is LookupResult.MISS  # 400 hex chars
        assert tier.lookup(b"", ctx) is LookupResult.MISS
        assert tier.lookup(None, ctx) is LookupResult.MISS
        # A job with such a key, rows outside the view, or keys and rows of
        # unequal length: a failed job, nothing stored.
        long = [b"y" * 200]
        tier.submit_store(job(0, long, [0], False))
        tier.submit_store(job(1, keys_of("b", 2), [0, 99], False))
        tier.submit_store(job(2, keys_of("c", 2), [0], False))
        tier.submit_load(job(3, keys_of("d", 1), [-1], True))
        got = results(tier, 4)
        assert not any(r.success for r in got.values())
        with store.client() as c:
            assert c.store_stats()["values"] == 0
        # The tier still works.
        fill(rows[:1], 3)
        tier.submit_store(job(4, keys_of("e", 1), [0], False))
        assert results(tier, 1)[4].success
    finally:
        tier.shutdown()


def test_a_namespace_of_another_value_size_refuses_the_engine(store, start_daemon, engines):
    a = engines(store.name, engine_id="A")
    name = namespace_name(a.tier.config, a.tier.value_size, none_hash())
    assert name == a.tier.namespace
    # On another daemon, someone took this engine's namespace name with
    # another value size first (a foreign writer: names of this tier hold
    # their size, so no engine of another geometry collides): an engine of
    # that namespace refuses to start, naming it.
    other = start_daemon("--store", "64MiB")
    with other.client() as c:
        c.store_namespace(name, a.tier.value_size * 2)
    with pytest.raises(RadixdTierError, match="another size"):
        engines(other.name, engine_id="F")


def test_a_store_full_of_reservations_fails_jobs_and_the_engine_goes_on(store, engines):
    a = engines(store.name, engine_id="A")
    tier, rows = standalone(store.name, a)
    holder = store.client()
    try:
        # Reserve the whole store (64 MiB) in values of one extent.
        ns = holder.store_namespace("filler", holder.store_value_max)
        held = []
        while True:
            try:
                held += holder.store_reserve(ns, [f"f{len(held)}"], [None])
            except radixd.StoreFullError:
                break
        fill(rows[:4], 5)
        start = time.monotonic()
        tier.submit_store(job(0, keys_of("g", 4), range(4), False))
        assert not results(tier, 1)[0].success
        assert time.monotonic() - start < 10
        # The engine schedules on: its cascades fail, its requests finish.
        p = prompt(30, 5 * BLOCK + 3)
        a.add("a", p)
        a.run(["a"])
        holder.store_abort(ns, [s for s in held if s is not None])
        tier.submit_store(job(1, keys_of("g", 4), range(4), False))
        assert results(tier, 1)[1].success
    finally:
        tier.shutdown()
        holder.close()


def test_a_writer_killed_between_reserve_and_commit(store, engine):
    tier, rows = standalone(store.name, engine)
    ks = keys_of("h", 4)
    ns_name = engine.tier.namespace
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time, radixd
            c = radixd.Client({store.name!r})
            ns = c.store_namespace({ns_name!r}, {engine.tier.value_size})
            slots = c.store_reserve(ns, {[k.hex() for k in ks]!r}, [None] * 4)
            print(sum(s is not None for s in slots), flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "4"
        fill(rows[:4], 7)
        # Reserved by the other writer: not there, and this tier's store
        # skips them (someone is storing them).
        assert tier.lookup(ks[0], ReqContext("q")) is LookupResult.MISS
        child.kill()
        child.wait()
        # Its reservations go back (the daemon's sweep): then this tier
        # stores them, and they load byte for byte.
        deadline = time.monotonic() + 10
        jid = 0
        while tier.lookup(ks[0], ReqContext("q")) is not LookupResult.HIT:
            tier.submit_store(job(jid, ks, range(4), False))
            results(tier, 1)
            jid += 1
            assert time.monotonic() < deadline, "the killed writer's reservations leaked"
            time.sleep(0.05)
        want = rows[:4].copy()
        tier.submit_load(job(jid, ks, range(4, 8), True))
        assert results(tier, 1)[jid].success
        assert np.array_equal(rows[4:8], want)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        tier.shutdown()


def test_daemon_sigkilled_mid_store_nothing_torn(store, engines):
    e = engines(store.name, engine_id="E", kv_heads=8, head_dim=128, layers=4)  # 256 KiB rows
    tier, rows = standalone(store.name, e, rows=96)
    try:
        fill(rows[:48], 9)
        ks = keys_of("k", 48)
        tier.submit_store(job(0, ks[:24], range(24), False))
        tier.submit_store(job(1, ks[24:], range(24, 48), False))
        time.sleep(0.001)
        store.signal(signal.SIGKILL)
        store.proc.wait()
        start = time.monotonic()
        tier.drain_jobs()
        assert time.monotonic() - start < 10
        results(tier, 2)
        # While it is down: lookups answer (a miss, or a value the file
        # holds whole), jobs fail fast.
        assert tier.lookup(ks[0], ReqContext("q")) in (LookupResult.HIT, LookupResult.MISS)
        restart(store)
        # Whatever was committed before the kill loads exactly; the rest
        # is a miss (a reservation cut short is dropped on adoption).
        want = rows[:48].copy()
        fresh, rows2 = standalone(store.name, e, rows=48)
        try:
            fresh.submit_load(job(0, ks, range(48), True))
            r = results(fresh, 1)[0]
            ok = ks if r.success else list(r.successful_keys or [])
            for i, k in enumerate(ks):
                if k in ok:
                    assert np.array_equal(rows2[i], want[i]), f"key {i} torn"
        finally:
            fresh.shutdown()
        # The first tier reconnects by itself and stores again.
        deadline = time.monotonic() + 20
        jid = 2
        while True:
            tier.submit_store(job(jid, keys_of(f"n{jid}", 1), [60], False))
            if results(tier, 1)[jid].success:
                break
            jid += 1
            assert time.monotonic() < deadline, "no reconnect"
            time.sleep(0.2)
    finally:
        tier.shutdown()


def test_take_events_report_this_engines_stores(store, engines):
    a = engines(store.name, engine_id="A", kv_events=True)
    tier, rows = standalone(store.name, a)
    try:
        fill(rows[:4], 11)
        ks = keys_of("m", 4)
        tier.submit_store(job(0, ks[:2], range(2), False))
        results(tier, 1)
        tier.submit_store(job(1, ks, range(4), False))
        results(tier, 1)
        events = list(tier.take_events())
        stored = [k for ev in events for k in ev.keys]
        assert sorted(stored) == sorted(ks)  # each once: the second job stored 2
        assert all(ev.medium.value == "CPU" and not ev.removed for ev in events)
        assert list(tier.take_events()) == []
    finally:
        tier.shutdown()


def test_shutdown_fails_queued_jobs_and_releases_the_view(store, engine):
    tier, rows = standalone(store.name, engine)
    tier.shutdown()
    tier.submit_store(job(0, keys_of("s", 1), [0], False))
    assert not results(tier, 1)[0].success
    assert tier.lookup(keys_of("s", 1)[0], ReqContext("q")) is LookupResult.MISS


def test_lookups_of_a_step_answer_from_one_probe(store, engine):
    tier, rows = standalone(store.name, engine)
    try:
        fill(rows[:6], 13)
        ks = keys_of("p", 6)
        store_job = job(0, ks[:3], range(3), False)
        tier.submit_store(store_job)
        assert results(tier, 1)[0].success
        ctx = job(1, ks, range(6), True).req_context  # the request's 6 chunks, in order
        assert [tier.lookup(k, ctx) for k in ks[:4]] == [LookupResult.HIT] * 3 + [LookupResult.MISS]
        # Stored meanwhile: this step's answers stand, the next step sees it.
        tier.submit_store(job(2, ks[3:5], range(3, 5), False))
        assert results(tier, 1)[2].success
        assert tier.lookup(ks[3], ctx) is LookupResult.MISS
        tier.on_schedule_end(None)
        assert [tier.lookup(k, ctx) for k in ks] == [LookupResult.HIT] * 5 + [LookupResult.MISS]
        # A key the request does not know is probed alone.
        assert tier.lookup(keys_of("p", 6)[0], ReqContext("other")) is LookupResult.HIT
        tier.on_request_finished(ctx)
        assert ctx.req_id not in tier._requests
    finally:
        tier.shutdown()
