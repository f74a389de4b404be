"""radixd's vLLM tier against vLLM 0.33.0's own ``fs`` secondary tier on
/dev/shm and a plain copy of the same bytes (issue 40, item 5).

For chunks of 64 KiB, 256 KiB and 2 MiB (a Llama-shaped fp16 KV: 8 KV heads
of 128, 16 tokens a block, 1/4/32 layers), both tiers are built on the spec
of one real vLLM engine (``TieringOffloadingSpec``, as vLLM builds them:
``RadixdTier(spec, view, ...)`` and ``FileSystemTierManager(spec, view, ...,
root_dir=/dev/shm/...)``) over one primary buffer, and driven through the
tier API the tiering manager uses: ``submit_store`` of a job of 64 chunks
(fresh keys every run), ``submit_load`` of them into other rows, each timed
from submit until ``get_finished_jobs`` reports it; the plain copy is one
``memmove`` per chunk between the same rows. ``lookup`` of 64 stored keys:
64 calls of ``tier.lookup`` (what the manager makes, one per chunk); the
``fs`` tier answers RETRY until its lookup threads resolve, so its figure is
until every key is answered.

The store (``--store``, 256 MiB by default) is written over once first
through each tier (a long-running engine's: its pages mapped in this
process). Medians of ``--repeat`` runs, all in one process. Run after
``bash scripts/test-vllm`` (its venv) and ``cargo build --release --bin
radixd``::

    target/vllm-venv/bin/python python/bench/vllm_tier.py [--radixd target/release/radixd]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests_vllm"))

import numpy as np  # noqa: E402
from engines import make_engine  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager  # noqa: E402

import radixd  # noqa: E402
from radixd.vllm import RadixdTier  # noqa: E402

CHUNKS = 64
# Chunk bytes -> layers (K and V of 16 tokens x 8 heads x 128 fp16 = 64 KiB a layer).
SIZES = {64 << 10: 1, 256 << 10: 4, 2 << 20: 32}

memmove = ctypes.memmove


def keys(tag: str, n: int = CHUNKS) -> list:
    return [hashlib.sha256(f"{tag}-{i}".encode()).digest() + bytes(4) for i in range(n)]


def job(job_id: int, ks: list, rows, promotion: bool) -> TransferJob:
    ctx = ReqContext(req_id=f"bench-{job_id}")
    for i, k in enumerate(ks):
        ctx.set_offload_key_position(k, (i + 1) * 16)
    return TransferJob(job_id, ks, np.asarray(rows, dtype=np.int64), promotion, ctx)


def wait(tier, job_id: int) -> bool:
    while True:
        for r in tier.get_finished_jobs():
            if r.job_id == job_id:
                return r.success
        time.sleep(0)


def start_daemon(binary: str, store: str) -> tuple:
    name = f"radixd-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        [binary, "serve", "--name", name, "--page-size", "16", "--capacity", "64", "--store", store],
        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            radixd.Client(name).close()
            return name, proc
        except radixd.RadixdError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("daemon did not come up")
            time.sleep(0.02)


class Runner:
    def __init__(self, tier, n_rows: int):
        self.tier = tier
        self.next_id = 0

    def transfer(self, ks, rows, promotion: bool) -> tuple:
        jid = self.next_id
        self.next_id += 1
        t = time.perf_counter()
        if promotion:
            self.tier.submit_load(job(jid, ks, rows, True))
        else:
            self.tier.submit_store(job(jid, ks, rows, False))
        ok = wait(self.tier, jid)
        return time.perf_counter() - t, ok


def lookup_all(tier, ks) -> float:
    """64 lookups as the manager makes them, one per chunk, in chunk order;
    a tier answering RETRY (the ``fs`` tier's asynchronous lookups) is
    asked again after a step end (``on_schedule_end`` posts its batch) until
    every key is answered."""
    ctx = ReqContext(req_id=f"lookup-{ks[0].hex()[:8]}")
    for i, k in enumerate(ks):
        ctx.set_offload_key_position(k, (i + 1) * 16)
    end = ScheduleEndContext((), ())
    t = time.perf_counter()
    left = list(ks)
    while True:
        left = [k for k in left if tier.lookup(k, ctx) is LookupResult.RETRY]
        tier.on_schedule_end(end)
        if not left:
            break
        time.sleep(0)
    elapsed = time.perf_counter() - t
    tier.on_request_finished(ctx)
    return elapsed


def bench_size(size: int, layers: int, name: str, repeat: int, fs_root: str, store_bytes: int) -> dict:
    engine = make_engine(name, kv_heads=8, head_dim=128, layers=layers, cpu_bytes=4 * size)
    assert engine.tier.value_size == size, (engine.tier.value_size, size)
    spec = engine.tier._offloading_spec
    buf = np.zeros((2 * CHUNKS, size), dtype=np.int8)
    buf.view(np.uint8)[:] = np.random.default_rng(size).integers(0, 256, buf.shape, dtype=np.uint8)
    view = memoryview(buf)
    radixd_tier = RadixdTier(offloading_spec=spec, primary_kv_view=view, tier_type="RadixdTier", store=name)
    fs_tier = FileSystemTierManager(
        offloading_spec=spec, primary_kv_view=view, tier_type="fs", root_dir=os.path.join(fs_root, str(size))
    )
    src, dst = list(range(CHUNKS)), list(range(CHUNKS, 2 * CHUNKS))
    out = {}
    try:
        for label, tier in (("radixd", radixd_tier), ("fs", fs_tier)):
            run = Runner(tier, 2 * CHUNKS)
            # Warm-up: the whole store written over once through this
            # tier (a long-running engine's store: its pages mapped in this
            # process; shmem's first touch of a page costs a fault), the
            # fs tier the same number of jobs.
            for w in range(store_bytes // (CHUNKS * size) + 2):
                run.transfer(keys(f"{label}-warm-{w}-{size}"), src, False)
            stores, loads, looks = [], [], []
            for r in range(repeat):
                ks = keys(f"{label}-{r}-{size}")
                dt, ok = run.transfer(ks, src, False)
                assert ok, f"{label} store failed"
                stores.append(dt)
                buf[CHUNKS:] = 0
                dt, ok = run.transfer(ks, dst, True)
                assert ok, f"{label} load failed"
                assert np.array_equal(buf[CHUNKS:], buf[:CHUNKS]), f"{label} loaded other bytes"
                loads.append(dt)
                looks.append(lookup_all(tier, ks))
            out[label] = (statistics.median(stores), statistics.median(loads), statistics.median(looks))
        base = buf.ctypes.data
        copies = []
        for r in range(repeat):
            t = time.perf_counter()
            for i in range(CHUNKS):
                memmove(base + (CHUNKS + i) * size, base + i * size, size)
            copies.append(time.perf_counter() - t)
        out["copy"] = statistics.median(copies)
    finally:
        radixd_tier.shutdown()
        fs_tier.shutdown()
        del view
        engine.close()
    return out


def replay_vllm_tiers(trace: list, engines: int, chunks: int) -> float:
    """Node hit rate of ``engines`` engines taking the trace's requests
    round-robin, each with its own vLLM CPU tier of ``chunks`` chunks:
    vLLM 0.33.0's real ``CPUOffloadingManager`` (its LRU policy) per engine,
    driven as its connector drives it (lookup from the first chunk to the
    first miss, prepare_load/complete_load of the hits, prepare_store and
    complete_store of the request's chunks)."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    tiers = [CPUOffloadingManager(num_chunks=chunks) for _ in range(engines)]
    hit = total = 0
    for n, ids in enumerate(trace):
        tier = tiers[n % engines]
        ctx = ReqContext(req_id=f"r{n}")
        ks = [i.to_bytes(8, "little") + bytes(4) for i in ids]
        for j, k in enumerate(ks):
            ctx.set_offload_key_position(k, (j + 1) * 512)
        tier.on_new_request(ctx)
        h = 0
        while h < len(ks) and tier.lookup(ks[h], ctx) is LookupResult.HIT:
            h += 1
        if h:
            tier.prepare_load(ks[:h], ctx)
            tier.complete_load(ks[:h], ctx)
        out = tier.prepare_store(ks[h:], ctx)
        if out is not None and out.keys_to_store:
            tier.complete_store(out.keys_to_store, ctx)
        tier.on_request_finished(ctx)
        hit += h
        total += len(ks)
    return hit / total


def replay_store(trace: list, engines: int, name: str, value: int) -> float:
    """The same requests through one radixd store (the real daemon and its
    eviction) under every engine: the leading run of stored keys is the
    hit (``store_exists``, the tier's lookup), then each request's chunks
    are stored, each naming the one before it (as the tier does); engines
    round-robin, one client each."""
    clients = [radixd.Client(name) for _ in range(engines)]
    ns = [c.store_namespace("bench-hitrate", value) for c in clients]
    page = np.zeros(value, np.uint8)
    hit = total = 0
    try:
        for n, ids in enumerate(trace):
            c, s = clients[n % engines], ns[n % engines]
            ks = [f"{i:x}" for i in ids]
            h = c.store_exists(s, ks)
            if h:
                # A hit is read (the tier's load): its use stamps the LRU.
                found = c.store_get_many(s, ks[:h], [np.empty(value, np.uint8) for _ in range(h)])
                h = found.index(False) if False in found else h
            c.store_put_many(s, ks, [None, *ks[:-1]], [page] * len(ks))
            hit += h
            total += len(ks)
    finally:
        for c in clients:
            c.close()
    return hit / total


def hit_rates(binary: str, traces: list, chunks_list: list, engines: int = 4) -> None:
    value = 32 << 10  # one index entry per 32 KiB: values of that size fill the store exactly
    print(f"\n# node hit rate, {engines} engines round-robin (blocks of 512 tokens = one chunk)")
    print("| trace | total chunks | per-engine vLLM CPU tiers (4 x 1/4) | one radixd store under all 4 | one engine, whole trace, all of it |")
    print("|---|---|---|---|---|")
    for path in traces:
        trace = [__import__("json").loads(line)["hash_ids"] for line in open(path)]
        for chunks in chunks_list:
            split = replay_vllm_tiers(trace, engines, chunks // engines)
            whole = replay_vllm_tiers(trace, 1, chunks)
            name, proc = start_daemon(binary, f"{chunks * value >> 20}MiB")
            try:
                shared = replay_store(trace, engines, name, value)
            finally:
                proc.terminate()
                proc.wait()
                for p in (f"/dev/shm/{name}", f"/dev/shm/{name}.store"):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass
            print(
                f"| {Path(path).name} | {chunks:,} | {split:.2%} | {shared:.2%} ({shared / split:.2f}x) | {whole:.2%} |",
                flush=True,
            )


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, mult in units.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * mult
    return int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = ROOT / "target" / "release" / "radixd"
    ap.add_argument("--radixd", default=str(default if default.exists() else ROOT / "target" / "debug" / "radixd"))
    ap.add_argument("--store", default="256MiB")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--what", choices=["transfer", "hitrate", "all"], default="all")
    ap.add_argument("--chunks", default="4096,16384", help="total chunks of the hit-rate runs")
    args = ap.parse_args()
    if args.what in ("hitrate", "all"):
        traces = [str(ROOT.parent / "shared" / "traces" / f"{t}_trace.jsonl") for t in ("conversation", "synthetic")]
        traces = [t for t in traces if os.path.exists(t)] or sys.exit("no traces in ../shared/traces")
        hit_rates(args.radixd, traces, [int(c) for c in args.chunks.split(",")])
        if args.what == "hitrate":
            return
    name, proc = start_daemon(args.radixd, args.store)
    fs_root = f"/dev/shm/radixd-bench-fs-{os.getpid()}"
    try:
        print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"daemon {args.radixd}, --store {args.store}, {CHUNKS} chunks a job, medians of {args.repeat}")
        print("| chunk | radixd store | fs store | plain copy | radixd load | fs load | lookup of 64 keys: radixd / fs |")
        print("|---|---|---|---|---|---|---|")
        for size, layers in SIZES.items():
            r = bench_size(size, layers, name, args.repeat, fs_root, parse_size(args.store))
            total = CHUNKS * size
            gb = lambda s: total / s / 1e9  # noqa: E731
            (rs, rl, rk), (fs_s, fs_l, fk), copy = r["radixd"], r["fs"], r["copy"]
            print(
                f"| {size >> 10} KiB | {gb(rs):.2f} GB/s ({rs and copy / rs:.2f}x copy, {fs_s / rs:.1f}x fs) "
                f"| {gb(fs_s):.2f} GB/s | {gb(copy):.2f} GB/s "
                f"| {gb(rl):.2f} GB/s ({copy / rl:.2f}x copy, {fs_l / rl:.1f}x fs) | {gb(fs_l):.2f} GB/s "
                f"| {rk * 1e6:.1f} µs / {fk * 1e6:.0f} µs |",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(fs_root, ignore_errors=True)
        for p in (f"/dev/shm/{name}", f"/dev/shm/{name}.store"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    main()
