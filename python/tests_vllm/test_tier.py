"""radixd as vLLM 0.33.0's secondary KV tier (``radixd.vllm.RadixdTier``),
loaded by vLLM's own ``TieringOffloadingSpec`` from the issue's config, under
real vLLM ``Scheduler``s with different engine ids against real daemons:
bytes written into one engine's primary rows come back byte for byte in
another's promoted rows; another model, dtype or layout never hits;
eviction under two writers; the daemon SIGKILLed and restarted; a full
store; the start-up errors; bad input."""

from __future__ import annotations

import logging
import os
import signal
import time

import numpy as np
import pytest
from conftest import QUICK, restart
from engines import BLOCK, prompt

import radixd
from radixd.vllm import RadixdTier, RadixdTierError

N_BLOCKS = 5  # full blocks in a test prompt (plus a partial tail)


def tokens(seed: int, blocks: int = N_BLOCKS) -> list:
    return prompt(seed, blocks * BLOCK + 3)


def wait_idle(*engines, timeout: float = 20.0) -> None:
    """Steps each engine until its tier has no job in flight (cascades are
    asynchronous)."""
    deadline = time.monotonic() + timeout
    for e in engines:
        while e.manager.has_pending_work():
            assert time.monotonic() < deadline, f"{e.engine_id}: jobs still in flight"
            e.step()
            time.sleep(0.002)


def store_values(d) -> int:
    with d.client() as c:
        return c.store_stats()["values"]


def test_the_tier_is_loaded_by_vllm_from_the_issue_config(store, engines):
    a = engines(store.name, engine_id="A")
    assert type(a.tier) is RadixdTier
    assert a.tier.name == store.name
    assert a.tier.value_size == a.rows.shape[1] == a.tier.block_size_bytes
    # The hash part of the namespace is resolved once vLLM seeded NONE_HASH.
    assert a.tier.namespace is not None and a.tier.namespace.startswith("vllm|model=")


def test_two_engines_share_chunks_byte_for_byte(store, engines):
    a = engines(store.name, engine_id="A")
    b = engines(store.name, engine_id="B")
    p = tokens(1)
    a.add("a1", p)
    a.run(["a1"])
    wait_idle(a)
    assert a.stores_done >= 1
    assert store_values(store) == N_BLOCKS
    # B computed nothing: its primary misses, the tier hits, vLLM promotes
    # the chunks into B's primary rows and loads them to B's "GPU".
    b.add("b1", p)
    b.run(["b1"])
    assert b.loads_checked == N_BLOCKS
    assert b.loads_wrong == []
    # Nothing B loaded was stored twice: one copy per node.
    wait_idle(b)
    assert store_values(store) == N_BLOCKS


def test_three_engines_and_a_longer_prefix(store, engines):
    a = engines(store.name, engine_id="A")
    b = engines(store.name, engine_id="B")
    c = engines(store.name, engine_id="C")
    short = tokens(2, 3)
    long = short[: 3 * BLOCK] + prompt(3, 4 * BLOCK)
    a.add("a", short)
    a.run(["a"])
    wait_idle(a)
    # B gets A's 3 chunks from the store and computes the 4 after them.
    b.add("b", long)
    b.run(["b"])
    wait_idle(b)
    assert b.loads_checked == 3 and b.loads_wrong == []
    assert store_values(store) == 7
    # C gets all 7, written by two engines.
    c.add("c", long + [5])
    c.run(["c"])
    assert c.loads_checked == 7 and c.loads_wrong == []


@pytest.mark.parametrize(
    "other",
    [
        {"layers": 3},  # another model (another directory and geometry)
        {"dtype": "bfloat16"},  # same geometry, another KV dtype
        {"hash_algo": "sha256"},  # another hash algorithm: another NONE_HASH
        {"extra": {"block_size": 2 * BLOCK}},  # another chunk size
    ],
    ids=["model", "dtype", "hash", "chunk"],
)
def test_another_model_or_layout_never_hits(store, engines, other):
    a = engines(store.name, engine_id="A")
    p = tokens(4)
    a.add("a", p)
    a.run(["a"])
    wait_idle(a)
    o = engines(store.name, engine_id="O", **other)
    assert o.tier.namespace != a.tier.namespace
    o.add("o", p)
    o.run(["o"])
    assert o.loads_checked == 0
    # Back to A's configuration: it still hits.
    b = engines(store.name, engine_id="B")
    b.add("b", p)
    b.run(["b"])
    assert b.loads_checked == N_BLOCKS and b.loads_wrong == []


def test_eviction_with_two_writers_every_load_exact_or_missing(start_daemon, engines):
    # 1 MiB of store: 256 values of 4 KiB, far fewer than the chunks.
    d = start_daemon("--store", "1MiB")
    a = engines(d.name, engine_id="A")
    b = engines(d.name, engine_id="B")
    rounds = 6 if QUICK else 16
    for r in range(rounds):
        pa, pb = tokens(100 + r, 24), tokens(200 + r, 24)
        a.add(f"a{r}", pa)
        b.add(f"b{r}", pb)
        a.run([f"a{r}"])
        b.run([f"b{r}"])
        # Each asks for what the other wrote, as the store evicts.
        a.add(f"a{r}x", pb + [1])
        b.add(f"b{r}x", pa + [1])
        a.run([f"a{r}x"])
        b.run([f"b{r}x"])
    wait_idle(a, b)
    with d.client() as c:
        stats = c.store_stats()
    assert stats["evicted"] > 0
    assert a.loads_checked + b.loads_checked > 0
    assert a.loads_wrong == [] and b.loads_wrong == []


def test_daemon_sigkilled_and_restarted_mid_run(store, engines):
    a = engines(store.name, engine_id="A")
    b = engines(store.name, engine_id="B")
    p1 = tokens(10)
    a.add("a1", p1)
    a.run(["a1"])
    wait_idle(a)
    store.signal(signal.SIGKILL)
    store.proc.wait()
    # The engines go on: stores fail, lookups miss or load the old file's
    # exact bytes, nothing hangs.
    p2 = tokens(11)
    a.add("a2", p2)
    start = time.monotonic()
    a.run(["a2"])
    wait_idle(a, timeout=15)
    b.add("b2", p2)
    b.run(["b2"])
    wait_idle(b, timeout=15)
    assert b.loads_wrong == []
    assert time.monotonic() - start < 30
    # Back: it adopts the store file; a new engine gets what A stored
    # before the kill, byte for byte.
    restart(store)
    c = engines(store.name, engine_id="C")
    c.add("c1", p1)
    c.run(["c1"])
    assert c.loads_checked == N_BLOCKS and c.loads_wrong == []
    # A's tier reconnects by itself (within a second or two of its next
    # job): fresh prompts until one is stored again.
    before = store_values(store)
    deadline = time.monotonic() + 20
    for i in range(100):
        p = tokens(300 + i)
        a.add(f"a3-{i}", p)
        a.run([f"a3-{i}"])
        wait_idle(a)
        if store_values(store) > before:
            break
        assert time.monotonic() < deadline, "the tier did not reconnect"
        time.sleep(0.2)
    d = engines(store.name, engine_id="D")
    d.add("d3", p)
    d.run(["d3"])
    assert d.loads_checked == N_BLOCKS and d.loads_wrong == []


def test_start_up_errors_name_the_serve_line(start_daemon, engines):
    with pytest.raises(RadixdTierError, match="radixd serve --name nobody-here --store"):
        engines("nobody-here", engine_id="X")
    plain = start_daemon()
    with pytest.raises(RadixdTierError, match=f"without a store.*radixd serve --name {plain.name} --store"):
        engines(plain.name, engine_id="Y")
    # 128 KiB extents (--store 1MiB) cannot hold this engine's 256 KiB rows.
    small = start_daemon("--store", "1MiB")
    with pytest.raises(RadixdTierError, match=f"radixd serve --name {small.name} --store"):
        engines(small.name, engine_id="Z", kv_heads=8, head_dim=128, layers=4)


def test_store_name_from_environment(store, engines, monkeypatch):
    monkeypatch.setenv("RADIXD_NAME", store.name)
    a = engines(None, engine_id="A")
    assert a.tier.name == store.name


def test_xxhash_without_seed_warns_and_stays_empty(store, engines, monkeypatch, caplog):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with caplog.at_level(logging.WARNING, logger="radixd.vllm"):
        a = engines(store.name, engine_id="A", hash_algo="xxhash")
    assert "PYTHONHASHSEED" in caplog.text and "sha256_cbor" in caplog.text
    p = tokens(20)
    a.add("a", p)
    a.run(["a"])
    wait_idle(a)
    assert store_values(store) == 0
    assert a.tier.namespace is None
