"""Per-call overhead of the Python package over the Rust client, measured in
one run against one daemon (a benchmark, not a test).

    cargo build --release --bin radixd --example python_baseline
    pip install ./python
    python python/bench/bench.py

Starts `target/release/radixd serve` (page size 16), caches a 1K-token prompt
and 10 system prompts, then measures the medians of:

- `match_prefix` of the cached 1K-token prompt given as a numpy int64 array
  (no lock), Python and Rust;
- `unlock` of a locked handle, Python and Rust;
- `order` of 1,000 waiting 2K-token prompts (numpy int64 arrays, 10 shared
  1K-token system prompts cached), lpm and dfs-weight, Python and Rust.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import radixd

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROUNDS = 5_000
ORDER_ROUNDS = 11


def prompt_1k() -> np.ndarray:
    return (7 * np.arange(1024, dtype=np.int64) + 1)


def waiting() -> list:
    i = np.arange(1024, dtype=np.int64)
    return [
        np.concatenate([1_000_000 + (p % 10) * 10_000 + i, 5_000_000 + p * 2048 + i])
        for p in range(1000)
    ]


def median_ns(samples) -> float:
    return float(statistics.median(samples))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--radixd", default=os.path.join(ROOT, "target", "release", "radixd"))
    ap.add_argument("--rounds", type=int, default=7, help="alternations of Rust and Python")
    ap.add_argument("--baseline", default=os.path.join(ROOT, "target", "release", "examples", "python_baseline"))
    args = ap.parse_args()
    name = f"radixd-pybench-{os.getpid()}"
    daemon = subprocess.Popen([args.radixd, "serve", "--name", name, "--page-size", "16"], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                c = radixd.Client(name)
                break
            except radixd.RadixdError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        tokens = prompt_1k()
        c.insert(tokens, c.alloc(len(tokens) // 16))
        prompts = waiting()
        for p in range(10):  # the system prompts
            c.insert(prompts[p][:1024], c.alloc(64))
        handle = c.match_prefix(tokens).handle

        # The client spins or yields while it waits depending on the host's
        # load, which moves every figure: alternate Rust and Python in short
        # rounds and compare each round's pair.
        clock = time.perf_counter_ns
        rounds = []
        for _ in range(args.rounds):
            out = subprocess.check_output([args.baseline, name, str(ROUNDS)], text=True)
            rust = {k: float(v) for k, v in (kv.split("=") for kv in out.split())}
            match_ns = []
            for _ in range(ROUNDS):
                t = clock()
                c.match_prefix(tokens)
                match_ns.append(clock() - t)
            unlock_ns = []
            for _ in range(ROUNDS):
                c.lock(handle)
                t = clock()
                c.unlock(handle)
                unlock_ns.append(clock() - t)
            order = {}
            for policy in ("lpm", "dfs-weight"):
                samples = []
                for _ in range(ORDER_ROUNDS):
                    t = clock()
                    c.order(prompts, policy)
                    samples.append(clock() - t)
                order[policy] = median_ns(samples)
            rounds.append([
                (median_ns(match_ns), rust["match_1k_ns"]),
                (median_ns(unlock_ns), rust["unlock_ns"]),
                (order["lpm"], rust["order_lpm_ns"]),
                (order["dfs-weight"], rust["order_dfs_ns"]),
            ])
        timer = [clock() - clock() for _ in range(1000)]  # cost of the clock pair
        c.close()
    finally:
        daemon.terminate()
        daemon.wait()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}")
    print(f"(perf_counter_ns pair: {-median_ns(timer):.0f} ns; Rust timed with Instant)")
    names = [
        "match_prefix, cached 1K tokens, numpy int64",
        "unlock",
        "order 1,000 x 2K tokens, lpm",
        "order 1,000 x 2K tokens, dfs-weight",
    ]
    print(f"{len(rounds)} alternating rounds of {ROUNDS} calls (order: {ORDER_ROUNDS});")
    print("per figure the lowest round median of each side (the quiet state: the client")
    print("spins while the host has a core to spare and yields otherwise, and the host")
    print("load moves between rounds), and the median over rounds of Python - Rust")
    print(f"{'median per call':45} {'Python':>12} {'Rust':>12} {'extra':>12} {'extra, median':>14}")
    for i, what in enumerate(names):
        py = min(r[i][0] for r in rounds)
        rs = min(r[i][1] for r in rounds)
        extra = statistics.median(r[i][0] - r[i][1] for r in rounds)
        unit, scale = ("us", 1e3) if rs < 1e6 else ("ms", 1e6)
        print(f"{what:45} {py / scale:9.2f} {unit} {rs / scale:9.2f} {unit} {(py - rs) / scale:9.2f} {unit} {extra / scale:11.2f} {unit}")
    print("rounds (Python/Rust):")
    for r in rounds:
        print("  " + "  ".join(f"{py / 1e3:.2f}/{rs / 1e3:.2f}" for py, rs in r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
