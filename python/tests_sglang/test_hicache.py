"""radixd as SGLang 0.5.23's HiCache L3 storage (``radixd.hicache``), built
by SGLang's own ``StorageBackendFactory.create_backend("dynamic", ...)``
over SGLang's own host pools (MHA and MLA, every layout they construct on a
CPU), against real daemons started with ``--store``: two processes sharing
pages byte for byte, eviction under two writers checked by content, a
daemon SIGKILLed and restarted, the namespaces, the generic (non-v1) path
and the start-up errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hicache_pools import (
    backend,
    chain_keys,
    clobber,
    content,
    get_chain,
    make_pool,
    mha_pool,
    page_size_bytes,
    pages_of,
    read_pages,
    set_chain,
    storage_config,
    write_pages,
)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo, PoolName

import radixd
from radixd.hicache import RadixdStorage, RadixdStorageError, namespace_name

HERE = Path(__file__).resolve().parent

MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def child(args: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE / "hicache_proc.py"), json.dumps(args)],
        cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def answer(proc: subprocess.Popen, timeout: float = 240) -> list:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality (random bf16 bytes hold NaNs, which never compare equal)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def restart(d) -> None:
    """Starts ``d``'s daemon again, the same command line (after a SIGKILL)."""
    d.proc = subprocess.Popen(d.proc.args, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            radixd.Client(d.name).close()
            return
        except radixd.RadixdError:
            if d.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon {d.name} did not come back")
            time.sleep(0.02)


@pytest.fixture
def store(start_daemon):
    return start_daemon("--store", "64MiB")


def test_built_by_sglangs_factory_with_namespaces_by_sglangs_key_rules(store):
    pool = mha_pool("page_first")
    b = backend(storage_config(store.name, tp_rank=1, tp_size=2, model="org/Model-7B"), pool)
    assert type(b) is RadixdStorage and b.name == store.name
    size = page_size_bytes(pool)
    assert b.namespace == (
        f"sglang|model=org-Model-7B|tp=1/2|layout=page_first|dtype=bfloat16|io=v1|bytes={size}"
    )
    mla = backend(storage_config(store.name, mla=True, tp_rank=3, tp_size=4), make_pool("mla", "layer_first"))
    assert "|mla|" in mla.namespace and "tp=" not in mla.namespace and "layout=layer_first" in mla.namespace
    shards = namespace_name(
        storage_config(store.name, pp_rank=1, pp_size=2, attn_cp_rank=0, attn_cp_size=2),
        layout="page_first", dtype=torch.float16, io="v1", value_size=4096,
    )
    assert "|tp=0/1,pp=1/2,cp=0/2|" in shards and "dtype=float16" in shards
    long = namespace_name(
        storage_config(store.name, model="m" * 400), layout="page_first",
        dtype=torch.bfloat16, io="v1", value_size=4096,
    )
    assert len(long.encode()) <= 255 and long != namespace_name(
        storage_config(store.name, model="m" * 399 + "n"), layout="page_first",
        dtype=torch.bfloat16, io="v1", value_size=4096,
    )


@pytest.mark.parametrize("kind,layouts", [("mha", MHA_LAYOUTS), ("mla", MLA_LAYOUTS)])
def test_every_layout_lands_where_sglang_reads_it(store, kind, layouts):
    """One backend stores, another (its own host pool) reads; the page must
    read back as SGLang's own flat page of the writer (``get_data_page``),
    so the pieces went where the layout keeps them."""
    for layout in layouts:
        a_pool, b_pool = make_pool(kind, layout), make_pool(kind, layout)
        a = backend(storage_config(store.name, mla=kind == "mla"), a_pool)
        b = backend(storage_config(store.name, mla=kind == "mla"), b_pool)
        keys = chain_keys(f"{kind}-{layout}", 5)
        src = pages_of(a_pool, 5)
        write_pages(a_pool, keys, src)
        assert a.batch_set_v1(keys, src) == [True] * 5
        dst = pages_of(b_pool, 5)
        clobber(b_pool, dst)
        assert b.batch_exists(keys) == 5
        assert b.batch_get_v1(keys, dst) == [True] * 5
        for i in range(5):
            want = a_pool.get_data_page(src[i * a_pool.page_size])
            assert same(b_pool.get_data_page(dst[i * b_pool.page_size]), want), layout
        assert read_pages(b_pool, 5, dst) == [content(k, page_size_bytes(b_pool)) for k in keys]


@pytest.mark.parametrize("kind,layout", [("mha", "page_first"), ("mha", "layer_first"), ("mla", "page_first")])
def test_two_processes_share_pages_byte_for_byte(store, kind, layout):
    pool = make_pool(kind, layout)
    b = backend(storage_config(store.name, mla=kind == "mla"), pool)
    nbytes = page_size_bytes(pool)
    mine = chain_keys(f"parent-{kind}-{layout}", 300)  # 3 batches, the last partial
    assert set_chain(b, pool, mine) == [True] * 300
    values = b.store_stats()["values"]
    assert set_chain(b, pool, mine) == [True] * 300  # stored already: skipped
    assert b.store_stats()["values"] == values
    proc = child({
        "name": store.name, "kind": kind, "layout": layout,
        "jobs": [
            {"job": "read", "tag": f"parent-{kind}-{layout}", "n": 300},
            {"job": "write", "tag": f"child-{kind}-{layout}", "n": 200},
            {"job": "write", "tag": f"parent-{kind}-{layout}", "n": 300},
        ],
    })
    read, wrote, again = answer(proc)
    assert read == {"run": 300, "found": 300, "bad": 0}
    assert wrote == {"stored": 200} and again == {"stored": 300}
    theirs = chain_keys(f"child-{kind}-{layout}", 200)
    run, got = get_chain(b, pool, theirs)
    assert run == 200 and got == [content(k, nbytes) for k in theirs]
    # The parent's chain was stored once: the child's write found it.
    assert b.store_stats()["values"] == values + 200


def test_batch_exists_is_the_leading_run_and_gets_are_per_key(store):
    pool = mha_pool("page_first")
    b = backend(storage_config(store.name), pool)
    keys = chain_keys("run", 6)
    set_chain(b, pool, keys[:2] + keys[3:])
    assert b.batch_exists(keys) == 2
    assert b.batch_exists(keys[3:]) == 3
    assert b.exists(keys[0]) and not b.exists(keys[2])
    assert b.batch_exists([]) == 0
    idx = pages_of(pool, 6)
    clobber(pool, idx)
    assert b.batch_get_v1(keys, idx) == [True, True, False, True, True, True]
    data = read_pages(pool, 6, idx)
    nbytes = page_size_bytes(pool)
    assert data[2] == b"\xee" * nbytes
    assert [d for i, d in enumerate(data) if i != 2] == [content(k, nbytes) for i, k in enumerate(keys) if i != 2]


def test_namespaces_keep_ranks_models_and_layouts_apart(store):
    keys = chain_keys("ns", 4)

    def make(**kw):
        layout = kw.pop("layout", "page_first")
        kind = "mla" if kw.get("mla") else "mha"
        pool = make_pool(kind, layout)
        return backend(storage_config(store.name, **kw), pool), pool

    tp0, pool0 = make(tp_rank=0, tp_size=2)
    set_chain(tp0, pool0, keys)
    assert tp0.batch_exists(keys) == 4
    tp1, _ = make(tp_rank=1, tp_size=2)
    assert tp1.batch_exists(keys) == 0  # another TP rank's heads
    other, _ = make(tp_rank=0, tp_size=2, model="another/model")
    assert other.batch_exists(keys) == 0
    direct, _ = make(tp_rank=0, tp_size=2, layout="page_first_direct")
    assert direct.batch_exists(keys) == 0  # same size, other byte order
    # MLA: one namespace for every TP rank; only the writer rank writes.
    w, wpool = make(mla=True, tp_rank=0, tp_size=2)
    r, rpool = make(mla=True, tp_rank=1, tp_size=2)
    assert w.is_writer and not r.is_writer
    values = w.store_stats()["values"]
    assert set_chain(r, rpool, keys) == [True] * 4  # a no-op on a reader rank
    assert w.store_stats()["values"] == values and r.batch_exists(keys) == 0
    set_chain(w, wpool, keys)
    run, got = get_chain(r, rpool, keys)
    assert run == 4 and got == [content(k, page_size_bytes(rpool)) for k in keys]


def test_eviction_under_two_writers_serves_committed_bytes_or_a_miss(start_daemon):
    d = start_daemon("--store", "8MiB")
    big = {"layers": 4, "heads": 4, "head_dim": 64}  # 32 KiB pages: ~250 fit
    churn = {"job": "churn", "rounds": 12, "n": 64}
    proc = child({
        "name": d.name, "kind": "mha", "layout": "page_first", "pool": big,
        "jobs": [dict(churn, tag="c", other="p", seed=1)],
    })
    import hicache_proc

    (mine,) = hicache_proc.main({
        "name": d.name, "kind": "mha", "layout": "page_first", "pool": big,
        "jobs": [dict(churn, tag="p", other="c", seed=2)],
    })
    (theirs,) = answer(proc)
    for r in (mine, theirs):
        assert r["bad"] == 0
    assert mine["hits"] + theirs["hits"] > 0
    assert mine["misses"] + theirs["misses"] > 0
    stats = mine["stats"]
    assert stats["evicted"] > 0 and stats["bytes"] <= stats["capacity_bytes"]


def test_daemon_sigkilled_and_restarted_serves_every_committed_page(start_daemon):
    d = start_daemon("--store", "32MiB")
    pool = mha_pool("layer_first")
    b = backend(storage_config(d.name), pool)
    keys = chain_keys("restart", 250)
    assert set_chain(b, pool, keys) == [True] * 250
    assert b.store_stats()["evicted"] == 0
    d.signal(signal.SIGKILL)
    d.proc.wait()
    # While it is gone: misses, not errors.
    assert b.batch_exists(keys) in (0, 250)
    restart(d)
    time.sleep(1.1)  # the backend reconnects at most once a second
    nbytes = page_size_bytes(pool)
    run, got = get_chain(b, pool, keys)
    assert run == 250 and got == [content(k, nbytes) for k in keys]
    (read,) = answer(child({
        "name": d.name, "kind": "mha", "layout": "layer_first",
        "jobs": [{"job": "read", "tag": "restart", "n": 250}],
    }))
    assert read == {"run": 250, "found": 250, "bad": 0}


def test_generic_interface_and_mooncakes_raw_form(store):
    pool = mha_pool("layer_first")
    cfg = storage_config(store.name, extra={"interface_v1": 0})
    a, b = backend(cfg, pool), backend(cfg, mha_pool("layer_first"))
    assert "io=flat" in a.namespace
    keys = chain_keys("flat", 3)
    idx = pages_of(pool, 3)
    write_pages(pool, keys, idx)
    pages = [pool.get_data_page(idx[i * pool.page_size]) for i in range(3)]
    assert a.batch_set(keys, pages) is True
    got = b.batch_get(keys + ["0" * 64])
    assert got[3] is None
    assert all(same(g, p) for g, p in zip(got[:3], pages))
    target = b.mem_pool_host.get_dummy_flat_data_page()
    assert b.get(keys[1], target) is target and same(target, pages[1])
    assert b.get("f" * 64, target) is None
    # Mooncake's raw form: addresses and sizes.
    raw = torch.zeros_like(pages[0])
    assert b.get(keys[0], raw.data_ptr(), raw.numel() * raw.element_size()) is True
    assert same(raw, pages[0])
    src = torch.arange(raw.numel(), dtype=raw.dtype)
    assert a.set("e" * 64, None, src.data_ptr(), src.numel() * src.element_size()) is True
    assert b.batch_get(["e" * 64], [raw.data_ptr()], [raw.numel() * raw.element_size()]) == 1
    assert same(raw, src)


def test_stats_and_clear_of_a_shared_store(store):
    pool = mha_pool("page_first")
    b = backend(storage_config(store.name), pool)
    other = backend(storage_config(store.name, model="someone/else"), mha_pool("page_first"))
    keys = chain_keys("stats", 10)
    set_chain(b, pool, keys)
    set_chain(other, other.mem_pool_host, keys)
    get_chain(b, pool, keys)
    metrics = b.get_stats()
    assert sum(metrics.backup_pgs) == 10 and sum(metrics.prefetch_pgs) == 10
    assert len(metrics.prefetch_bandwidth) > 0
    assert b.get_stats().prefetch_pgs == []  # drained
    s = b.store_stats()
    assert s["values"] == 20 and s["hits"] >= 10
    # clear() drops this server's pages only: the store is the node's.
    assert b.clear() is True
    assert b.batch_exists(keys) == 0
    assert other.batch_exists(keys) == 10
    assert b.store_stats()["values"] == 10
    # And the backend stores again afterwards.
    assert set_chain(b, pool, keys) == [True] * 10 and b.batch_exists(keys) == 10


def test_startup_errors_name_the_fix(start_daemon, monkeypatch):
    pool = mha_pool("page_first")
    missing = f"radixd-missing-{os.getpid()}"
    with pytest.raises(RadixdStorageError, match=f"radixd serve --name {missing} --store"):
        backend(storage_config(missing), pool)
    plain = start_daemon()
    with pytest.raises(RadixdStorageError, match="without a store.*--store"):
        backend(storage_config(plain.name), pool)
    d = start_daemon("--store", "16MiB")
    # RADIXD_NAME when the extra config names no daemon.
    monkeypatch.setenv("RADIXD_NAME", d.name)
    assert backend(storage_config(None), pool).name == d.name
    # One explicit namespace, two page geometries.
    shared = {"namespace": "team-model"}
    backend(storage_config(d.name, extra=shared), mha_pool("page_first", head_dim=32))
    with pytest.raises(RadixdStorageError, match='own "namespace"'):
        backend(storage_config(d.name, extra=shared), mha_pool("page_first", head_dim=64))
    # What 0.5.23 can pass that radixd does not carry: refused by name.
    b = backend(storage_config(d.name), pool)
    b.register_mem_host_pool_v2(pool, PoolName.KV)  # the anchor itself: fine
    with pytest.raises(RadixdStorageError, match="v2 pool transfers.*'mamba'"):
        b.register_mem_host_pool_v2(mha_pool("page_first"), PoolName.MAMBA)
    with pytest.raises(NotImplementedError, match="v2"):
        b.batch_get_v2([])
    from sglang.srt.mem_cache.memory_pool_host import LogicalHostPool

    with pytest.raises(RadixdStorageError, match="v2 pool transfers"):
        backend(storage_config(d.name), LogicalHostPool(64, 4))
    with pytest.raises(RadixdStorageError, match="tp_lcm_size"):
        backend(storage_config(d.name, tp_lcm_size=2, should_split_heads=True), pool)


def test_prefix_keys_make_eviction_take_leaves_first(start_daemon):
    """A page whose successor is stored is not evicted before it: under
    pressure a chain stored in batches (``prefix_keys`` naming the pages
    before each) shrinks from its end, never leaving a hole."""
    d = start_daemon("--store", "8MiB")
    big = {"layers": 4, "heads": 4, "head_dim": 64}
    pool = mha_pool("page_first", **big)
    b = backend(storage_config(d.name), pool)
    nbytes = page_size_bytes(pool)
    chain = chain_keys("leaves", 100)
    set_chain(b, pool, chain, batch=30)
    room = b.store_stats()["capacity_bytes"] // nbytes
    for i in range(0, room - 100 + 30, 50):
        set_chain(b, pool, chain_keys(f"pressure-{i}", 50))
    assert b.store_stats()["evicted"] > 0
    present = [b.exists(k) for k in chain]
    kept = present.index(False) if False in present else len(present)
    assert 0 < kept < 100 and not any(present[kept:])
    assert b.batch_exists(chain) == kept
