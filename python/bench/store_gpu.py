"""A prefix from the node-wide store to the GPU: `get` into pinned host memory,
then a copy to the device, against the pinned host-to-device bandwidth alone.

    radixd serve --name gpu-bench --store 4GiB &
    python python/bench/store_gpu.py --name gpu-bench --prefix-mib 1024 --page-kib 2048

The prefix (`--prefix-mib` of pages of `--page-kib`, each naming the one
before it as parent) is stored first. The timed path then moves it the way an
L3 hit reaches the GPU: `--threads` readers (one `radixd.Client` each, the GIL
released while they copy) get a chunk of pages into a pinned buffer, and the
chunk's host-to-device copy runs on a CUDA stream while the readers get the
next chunk. The limit is one pinned-to-device copy of the same bytes. Every
page is checked on the device against the bytes stored. Prints one JSON line.
"""

import argparse
import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

import radixd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default=os.environ.get("RADIXD_NAME", "radixd"))
    ap.add_argument("--prefix-mib", type=int, default=1024)
    ap.add_argument("--page-kib", type=int, default=2048)
    ap.add_argument("--chunk-pages", type=int, default=32)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    page = args.page_kib * 1024
    pages = args.prefix_mib * 1024 * 1024 // page
    total = pages * page
    keys = [f"gpu-bench-{args.page_kib}k-{i}" for i in range(pages)]
    parents = [None] + keys[:-1]

    # Store the prefix: one random pattern per page, kept to check the device.
    rng = np.random.default_rng(7)
    host = rng.integers(0, 256, size=total, dtype=np.uint8)
    writer = radixd.Client(args.name)
    ns = writer.store_namespace(f"gpu-bench-{page}", page)
    values = [host[i * page:(i + 1) * page] for i in range(pages)]
    for at in range(0, pages, 128):
        writer.store_put_many(ns, keys[at:at + 128], parents[at:at + 128], values[at:at + 128])
    assert writer.store_exists(ns, keys) == pages, "the store holds less than the prefix"

    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(total, dtype=torch.uint8, device="cuda")
    base = pinned.data_ptr()
    stream = torch.cuda.Stream()

    # Limit: the pinned buffer to the device, one copy.
    def h2d() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.cuda.stream(stream):
            device.copy_(pinned, non_blocking=True)
        stream.synchronize()
        return time.perf_counter() - t

    local = threading.local()

    def reader() -> "radixd.Client":
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = radixd.Client(args.name)
        return c

    def get_pages(lo: int, hi: int) -> int:
        c = reader()
        ok = c.store_get_many_raw(ns, keys[lo:hi], [[(base + i * page, page)] for i in range(lo, hi)])
        return sum(ok)

    pool = ThreadPoolExecutor(args.threads)

    # The path: readers fill chunk k while chunk k-1 travels to the device.
    def store_to_device() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        got = 0
        for lo in range(0, pages, args.chunk_pages):
            hi = min(lo + args.chunk_pages, pages)
            step = max(1, (hi - lo + args.threads - 1) // args.threads)
            got += sum(pool.map(lambda a: get_pages(a, min(a + step, hi)), range(lo, hi, step)))
            with torch.cuda.stream(stream):
                device[lo * page:hi * page].copy_(pinned[lo * page:hi * page], non_blocking=True)
        stream.synchronize()
        elapsed = time.perf_counter() - t
        assert got == pages, f"{pages - got} pages missed"
        return elapsed

    # Readers alone, into pinned memory (no device copy).
    def store_to_pinned() -> float:
        t = time.perf_counter()
        step = max(1, (pages + args.threads - 1) // args.threads)
        got = sum(pool.map(lambda a: get_pages(a, min(a + step, pages)), range(0, pages, step)))
        elapsed = time.perf_counter() - t
        assert got == pages, f"{pages - got} pages missed"
        return elapsed

    store_to_device()
    h2d()
    rounds = {"h2d": [], "store_to_pinned": [], "store_to_device": []}
    for _ in range(args.rounds):  # alternated, so drift hits each alike
        rounds["h2d"].append(h2d())
        rounds["store_to_pinned"].append(store_to_pinned())
        rounds["store_to_device"].append(store_to_device())

    # The device holds exactly the stored bytes.
    expect = torch.from_numpy(host).to("cuda")
    assert torch.equal(device, expect), "the device does not hold the stored prefix"

    gbps = {k: total / statistics.median(v) / 1e9 for k, v in rounds.items()}
    print(json.dumps({
        "device": torch.cuda.get_device_name(),
        "prefix_bytes": total,
        "page_bytes": page,
        "threads": args.threads,
        "chunk_pages": args.chunk_pages,
        "gb_per_s": {k: round(v, 2) for k, v in gbps.items()},
        "store_to_device_vs_h2d": round(gbps["store_to_device"] / gbps["h2d"], 3),
    }))
    pool.shutdown()


if __name__ == "__main__":
    main()
