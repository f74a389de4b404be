"""Time to KV in the host pool through SGLang 0.5.23's own HiCache: a prompt
another server computed, prefetched from the L3 by SGLang's controller
(its storage threads, its page hashes, its host pool), radixd's node store
against SGLang's ``HiCacheFile`` on ``/dev/shm``, alternated in one run.
Run in the environment scripts/test-sglang builds, with a release daemon
(sizes: ``HICACHE_TOKENS``, ``HICACHE_PROMPTS``, ``HICACHE_PAGE``, ``HICACHE_ROUNDS``):

    RADIXD_BIN=target/release/radixd target/sglang-venv/bin/python python/bench/hicache_flow.py

Server A computes ``PROMPTS`` prompts of ``TOKENS`` tokens and HiCache writes
them through to its host pool and on to the L3; server B (its own tree and
pools) then asks for each, and the clock runs from the scheduler's prefetch
to ``check_prefetch_progress`` answering done (a tight loop of scheduler
polls, no sleep). The KV's shape is a 8-layer, 8-head, 128-dim bf16 model
(32 KiB a token); the figures are on the CPU, with SGLang's GPU transfers
copied by torch (python/tests_sglang/hicache_cpu.py), so they measure the
L3 and the controller's path to the host pool, not PCIe.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests_sglang"))

import hicache_cpu as hc  # noqa: E402
import radixd  # noqa: E402
from test_hicache_flow import prefill, request  # noqa: E402

PS = int(os.environ.get("HICACHE_PAGE", "64"))
TOKENS = int(os.environ.get("HICACHE_TOKENS", "1024"))
PROMPTS = int(os.environ.get("HICACHE_PROMPTS", "4"))
ROUNDS = int(os.environ.get("HICACHE_ROUNDS", "3"))
SHAPE = dict(layers=8, heads=8, head_dim=128)
#: The store's size, and whether B's mapping of it is faulted in before the
#: clock runs (``HICACHE_COLD=1``: not, as for a server's first reads).
STORE_BYTES = 1 << 30
WARM = os.environ.get("HICACHE_COLD") != "1"


def daemon() -> tuple:
    binary = os.environ.get("RADIXD_BIN", "target/release/radixd")
    name = f"radixd-hicache-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        [binary, "serve", "--name", name, "--store", "1GiB"], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(500):
        try:
            radixd.Client(name).close()
            return name, proc
        except radixd.RadixdError:
            time.sleep(0.01)
    raise RuntimeError("the daemon did not come up")


#: Seconds spent inside the L3's own calls during B's prefetches, per L3.
IN_L3: dict = {}


def clock_l3() -> None:
    """Times every storage call SGLang's controller makes (to tell the L3's
    share of a prefetch from the controller's)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from radixd.hicache import RadixdStorage

    for cls, tag in ((RadixdStorage, "radixd store"), (HiCacheFile, "HiCacheFile (/dev/shm)")):
        for method in ("batch_get_v1", "batch_get", "batch_exists", "batch_exists_v1"):
            f = cls.__dict__.get(method)
            if f is None:
                continue

            def timed(self, *a, _f=f, _tag=tag, **k):
                start = time.perf_counter()
                try:
                    return _f(self, *a, **k)
                finally:
                    if CLOCK[0]:
                        IN_L3[_tag] = IN_L3.get(_tag, 0.0) + time.perf_counter() - start
                        IN_L3[(_tag, _f.__name__)] = IN_L3.get((_tag, _f.__name__), 0.0) + time.perf_counter() - start

            setattr(cls, method, timed)


CLOCK = [False]


def run(storage: str, extra: dict, salt: int) -> list:
    """Seconds from prefetch to done, per prompt, for one L3."""
    args = hc.server_args(PS, storage, {**extra, "prefetch_threshold": PS})
    pool = TOKENS * PROMPTS + 2 * PS
    a, pa = hc.server(args, PS, pool, context=TOKENS + PS, **SHAPE)
    b, pb = hc.server(args, PS, pool, context=TOKENS + PS, **SHAPE)
    for cache in (a, b):
        # A long-running server's host pool is mapped in already: the timed
        # loads pay the copies, not first-touch page faults.
        cache.cache_controller.mem_pool_host.kv_buffer.zero_()
    if storage == "dynamic" and WARM:
        # And so is its mapping of the store (each process maps it itself;
        # HiCacheFile's reads are read() calls, which map nothing): B writes
        # the whole store once, as store_bench.py's warm-up does.
        from store_bench import warm

        warm(b.cache_controller.storage_backend._client, STORE_BYTES)
    prompts = [[salt + 100_000 * i + t for t in range(TOKENS)] for i in range(PROMPTS)]
    times = []
    try:
        for i, tokens in enumerate(prompts):
            prefill(a, pa, request(f"a{i}", tokens))
        # The storage backups run behind the write-through, on a thread of
        # the controller: give them time (B's loads check they all landed).
        for _ in range(50):
            a.check_hicache_events()
            time.sleep(0.01)
        for i, tokens in enumerate(prompts):
            req = request(f"b{i}", tokens + [1])
            start = time.perf_counter()
            CLOCK[0] = True
            hc.prefetch(b, req)
            while not b.check_prefetch_progress(req.cache_request_handle):
                b.check_hicache_events()
            times.append(time.perf_counter() - start)
            CLOCK[0] = False
            got, _ = b.pop_prefetch_loaded_span(req.cache_request_handle)
            assert got == TOKENS, (storage, got)
    finally:
        a.shutdown()
        b.shutdown()
    return times


def main() -> None:
    hc.install()
    clock_l3()
    name, proc = daemon()
    shm = tempfile.mkdtemp(prefix="hicache-file-", dir="/dev/shm")
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = shm
    runs = {"radixd store": [], "HiCacheFile (/dev/shm)": []}
    try:
        for r in range(ROUNDS):
            for k in runs:
                salt = 1_000_000 * (2 * r + (k != "radixd store")) + 1
                if k == "radixd store":
                    runs[k] += run("dynamic", {**hc.RADIXD_L3, "name": name}, salt)
                else:
                    runs[k] += run("file", {}, salt)
    finally:
        proc.terminate()
        proc.wait()
        # The store outlives its daemon (a restart adopts it): a bench's goes.
        Path(f"/dev/shm/{name}.store").unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", shm], check=False)
    mib = TOKENS * 2 * SHAPE["layers"] * SHAPE["heads"] * SHAPE["head_dim"] * 2 / 2**20
    print(f"L3 -> host pool through SGLang's controller, {TOKENS}-token prompts ({mib:.0f} MiB), page {PS}:")
    medians = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in medians.items():
        share = IN_L3.get(k, 0.0) / sum(runs[k])
        print(f"  {k:28s} median {v * 1e3:8.2f} ms  ({mib / 1024 / v:5.2f} GiB/s), {share:4.0%} of it in the L3's calls")
    print(f"  HiCacheFile / radixd store: {medians['HiCacheFile (/dev/shm)'] / medians['radixd store']:.2f}x")


if __name__ == "__main__":
    main()
