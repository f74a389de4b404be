"""Four Python scheduler processes sharing one radixd cache (the Python twin
of examples/multi_scheduler.rs).

    cargo build --release && pip install ./python
    python examples/python/multi_scheduler.py [--radixd target/release/radixd]

The parent starts `radixd serve` on a segment of its own, then four
scheduler processes. Each serves requests whose prompts share a system prompt
and one of a few few-shot blocks, as a real serving stack would: order the
waiting prompts cache-aware, match and lock the cached prefix, allocate pages
for the rest, insert the prompt, unlock. Each prints its hit rate and
latency per call; the parent sums them up.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import time

import radixd

SCHEDULERS = 4
REQUESTS = 1_000
PAGE = 16
BATCH = 16  # prompts waiting at once, ordered with Client.order


def percentile(values, q):
    values = sorted(values)
    return values[int((len(values) - 1) * q)] / 1e3  # ns -> us


def scheduler(name: str, sid: int, out) -> None:
    import random

    import numpy as np

    rng = random.Random(sid + 1)
    client = radixd.Client(name)
    system = np.arange(512, dtype=np.int64)
    hit = total = 0
    match_ns, insert_ns, unlock_ns, order_ns = [], [], [], []
    for first in range(0, REQUESTS, BATCH):
        waiting = []
        for request in range(first, min(first + BATCH, REQUESTS)):
            shot = rng.randrange(8)
            user = rng.randrange(50) if rng.randrange(4) == 0 else 1_000 + sid * REQUESTS + request
            waiting.append(np.concatenate([
                system,
                10_000 + shot * 1_000 + np.arange(256, dtype=np.int64),
                100_000 + user * 512 + np.arange(256, dtype=np.int64),
            ]))
        t = time.perf_counter_ns()
        order = client.order(waiting, policy="dfs-weight")
        order_ns.append(time.perf_counter_ns() - t)
        for i in order:
            prompt = waiting[i]
            t = time.perf_counter_ns()
            m = client.match_prefix(prompt, lock=True)
            match_ns.append(time.perf_counter_ns() - t)
            rest = (len(prompt) - m.len) // PAGE
            t = time.perf_counter_ns()
            pages = m.pages + client.alloc(rest)  # array('I') + array('I')
            client.insert(prompt, pages)
            insert_ns.append(time.perf_counter_ns() - t)
            if m.handle is not None:
                t = time.perf_counter_ns()
                client.unlock(m.handle)
                unlock_ns.append(time.perf_counter_ns() - t)
            hit += m.len
            total += len(prompt)
    client.close()
    out.put((sid, hit, total, match_ns, insert_ns, unlock_ns, order_ns))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "target", "release", "radixd")
    ap.add_argument("--radixd", default=default if os.path.exists(default) else shutil.which("radixd"))
    args = ap.parse_args()
    if not args.radixd:
        print("no radixd binary: cargo build --release, or pass --radixd", file=sys.stderr)
        return 2
    name = f"radixd-pyexample-{os.getpid()}"
    daemon = subprocess.Popen(
        [args.radixd, "serve", "--name", name, "--page-size", str(PAGE), "--capacity", "16384",
         "--max-clients", "8", "--scratch-bytes", str(1 << 20)],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 5
        while True:
            try:
                radixd.Client(name).close()
                break
            except radixd.RadixdError:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    print("the daemon did not start", file=sys.stderr)
                    return 1
                time.sleep(0.005)
        print(f"daemon up on /dev/shm/{name}; {SCHEDULERS} schedulers x {REQUESTS} requests")
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=scheduler, args=(name, i, out)) for i in range(SCHEDULERS)]
        for p in procs:
            p.start()
        results = sorted(out.get(timeout=300) for _ in procs)
        for p in procs:
            p.join()
        hit = total = 0
        for sid, h, t, match_ns, insert_ns, unlock_ns, order_ns in results:
            hit, total = hit + h, total + t
            print(
                f"scheduler {sid}: hit {h} of {t} tokens ({100 * h / t:.1f}%); "
                f"match+lock p50 {percentile(match_ns, .5):.1f} us p99 {percentile(match_ns, .99):.1f} us; "
                f"alloc+insert p50 {percentile(insert_ns, .5):.1f} us p99 {percentile(insert_ns, .99):.1f} us; "
                f"unlock p50 {percentile(unlock_ns, .5):.1f} us; "
                f"order of {BATCH} p50 {percentile(order_ns, .5):.1f} us"
            )
        with radixd.Client(name) as c:
            s = c.stats()
            c.validate()
        print(
            f"all: hit rate {100 * hit / max(total, 1):.1f}% ({hit} of {total} prompt tokens); "
            f"cache holds {s['total_tokens']} tokens in {s['nodes']} nodes"
        )
        return 0
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    sys.exit(main())
