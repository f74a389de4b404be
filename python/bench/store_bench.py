"""radixd's store from Python, as SGLang 0.5.23's HiCache L3 uses it, against
SGLang's own ``HiCacheFile`` on /dev/shm and a plain copy of the same bytes.

For pages of 64 KiB, 256 KiB and 2 MiB (an MHA ``page_first`` host pool of
SGLang's, bf16, 8 KV heads of 128, 16 tokens a page, 1/4/32 layers):

- ``batch_set``/``batch_get`` of 128 pages: radixd through
  ``RadixdStorage.batch_set_v1``/``batch_get_v1`` (SGLang's zero-copy path,
  ``interface_v1``: straight between the host pool and the store);
  ``HiCacheFile`` through ``batch_set``/``batch_get`` of flat pages (its
  path), files in /dev/shm; the plain copy is one ``memmove`` per page
  between two host buffers (the limit of any store).
- ``batch_exists`` of 128 keys (SGLang's hit query) through each backend,
  and radixd's ``Client.store_exists`` itself.

The store is written over once first through the backend's connection (a
long-running server's store: its pages mapped in that process, sets
evicting). Each figure is the median of ``--repeat`` runs
(fresh keys for every set, so nothing is skipped as stored already; the
files of ``HiCacheFile``'s previous set are removed, untimed). Run from the repository root in
SGLang's environment (``bash scripts/test-sglang`` builds one):

    target/sglang-venv/bin/python python/bench/store_bench.py [--radixd target/release/radixd]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests_sglang"))

import torch  # noqa: E402
from hicache_pools import mha_pool, storage_config  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageExtraInfo  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

import radixd  # noqa: E402

PAGES = 128
PAGE_TOKENS = 16
HEADS = 8
HEAD_DIM = 128
# Page bytes -> layers (K and V of 16 tokens x 8 heads x 128 bf16 = 64 KiB a layer).
SIZES = {64 << 10: 1, 256 << 10: 4, 2 << 20: 32}


def keys(tag: str, n: int = PAGES) -> list:
    return [hashlib.sha256(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def median_s(fn, repeat: int, setup=None) -> float:
    times = []
    for r in range(repeat):
        arg = setup(r) if setup else None
        t = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


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
                raise SystemExit(f"{binary} serve did not come up")
            time.sleep(0.02)


def warm(client: "radixd.Client", store_bytes: int) -> None:
    """Writes the whole store once through ``client`` (values of 2 MiB, later
    evicted), so every page of the store file is mapped in that client's
    mapping, as in a long-running server; the timed sets then pay eviction,
    not first-touch page faults (each process maps the store itself)."""
    page = 2 << 20
    ns = client.store_namespace("bench/warm", page)
    zero = bytes(page)
    for at in range(0, store_bytes // page, 32):
        client.store_put_many(ns, [f"warm-{at + i}" for i in range(32)], [None] * 32, [zero] * 32)


def bench_size(name: str, store_bytes: int, size: int, layers: int, repeat: int, shm_dir: str) -> dict:
    pool = mha_pool("page_first", page_size=PAGE_TOKENS, layers=layers, heads=HEADS,
                    head_dim=HEAD_DIM, tokens=PAGES * PAGE_TOKENS)
    src = pool.alloc(PAGES * PAGE_TOKENS)
    dst = pool.alloc(PAGES * PAGE_TOKENS)
    pool.kv_buffer.view(torch.uint8).random_(0, 256)
    ptrs, sizes = pool.get_page_buffer_meta(src)
    assert sum(sizes) == PAGES * size, (sum(sizes), size)

    b = StorageBackendFactory.create_backend("dynamic", storage_config(name, model=f"bench-{size}"), pool)
    b.register_mem_pool_host(pool)
    warm(b._client, store_bytes)
    info = HiCacheStorageExtraInfo(prefix_keys=None)
    out = {"page_bytes": size}

    def rx_set(r):
        assert all(b.batch_set_v1(r, src, info))

    out["radixd_set_s"] = median_s(rx_set, repeat, lambda r: keys(f"set-{size}-{r}"))
    stored = keys(f"get-{size}")
    assert all(b.batch_set_v1(stored, src, info))

    def rx_get(_):
        assert all(b.batch_get_v1(stored, dst, info))

    rx_get(None)  # the destination pages faulted in once, as a live pool's are
    out["radixd_get_s"] = median_s(rx_get, repeat)
    dptrs, _ = pool.get_page_buffer_meta(dst)
    assert all(ctypes.string_at(p, 64) == ctypes.string_at(q, 64) for p, q in zip(ptrs, dptrs))

    # HiCacheFile on /dev/shm, SGLang's generic path: flat pages.
    f = HiCacheFile(storage_config(None, model=f"bench-{size}", extra={"file_storage_path": shm_dir}),
                    file_path=shm_dir)
    flat = [pool.get_data_page(src[i * PAGE_TOKENS]).contiguous() for i in range(PAGES)]
    targets = [pool.get_dummy_flat_data_page() for _ in range(PAGES)]

    def file_set(r):
        assert f.batch_set(r, flat)

    def fresh_files(r):
        f.clear()  # untimed: keeps /dev/shm to one batch of files
        return keys(f"fset-{size}-{r}")

    out["file_set_s"] = median_s(file_set, repeat, fresh_files)
    fstored = keys(f"fget-{size}")
    f.batch_set(fstored, flat)

    def file_get(_):
        assert all(t is not None for t in f.batch_get(fstored, targets))

    file_get(None)
    out["file_get_s"] = median_s(file_get, repeat)

    # The limit: one memmove per page between two host buffers.
    pairs = list(zip(dptrs, ptrs, sizes))

    def copy(_):
        for d, s, n in pairs:
            ctypes.memmove(d, s, n)

    copy(None)
    out["copy_s"] = median_s(copy, repeat)

    # batch_exists of 128 keys (all present), in microseconds: the median of
    # `repeat` runs of `loops` calls.
    loops = 1000
    for label, fn in (
        ("radixd_exists_us", lambda: b.batch_exists(stored, info)),
        ("client_exists_us", lambda: b._client.store_exists(b._pool_id(), stored)),
        ("file_exists_us", lambda: f.batch_exists(fstored)),
    ):
        n = loops if label != "file_exists_us" else 200
        assert fn() == PAGES

        def calls(_, fn=fn, n=n):
            for _ in range(n):
                fn()

        out[label] = median_s(calls, repeat) / n * 1e6
    b.close()
    f.clear()
    return out


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def table(rows: list) -> str:
    lines = [
        "| page | radixd `batch_get` | `HiCacheFile` `batch_get` | plain copy | radixd `batch_set` "
        "| `HiCacheFile` `batch_set` | `batch_exists` (128 keys): radixd / `HiCacheFile` |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = r["page_bytes"] * PAGES
        label = f"{r['page_bytes'] >> 10} KiB" if r["page_bytes"] < (1 << 20) else f"{r['page_bytes'] >> 20} MiB"
        lines.append(
            f"| {label} | {gbps(n, r['radixd_get_s']):.2f} GB/s ({r['copy_s'] / r['radixd_get_s']:.2f}x copy, "
            f"{r['file_get_s'] / r['radixd_get_s']:.1f}x file) | {gbps(n, r['file_get_s']):.2f} GB/s "
            f"| {gbps(n, r['copy_s']):.2f} GB/s | {gbps(n, r['radixd_set_s']):.2f} GB/s "
            f"({r['copy_s'] / r['radixd_set_s']:.2f}x copy) | {gbps(n, r['file_set_s']):.2f} GB/s "
            f"| {r['radixd_exists_us']:.1f} µs (client {r['client_exists_us']:.1f} µs) / "
            f"{r['file_exists_us']:.0f} µs |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = ROOT / "target" / "release" / "radixd"
    if not default.exists():
        default = ROOT / "target" / "debug" / "radixd"
    ap.add_argument("--radixd", default=str(default), help="the radixd binary (default: release, else debug)")
    ap.add_argument("--store", default="1GiB", help="--store of the daemon it starts")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="page sizes in bytes")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    name, proc = start_daemon(args.radixd, args.store)
    with radixd.Client(name) as c:
        store_bytes = c.store_stats()["capacity_bytes"]
    shm_dir = f"/dev/shm/hicache-bench-{os.getpid()}"
    rows = []
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(bench_size(name, store_bytes, size, SIZES[size], args.repeat, shm_dir))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(shm_dir, ignore_errors=True)
        for path in (f"/dev/shm/{name}", f"/dev/shm/{name}.store"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    print(f"# {platform.node()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"daemon {args.radixd}, --store {args.store}, median of {args.repeat}")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
