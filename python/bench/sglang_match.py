"""SGLang 0.5.23's caches against radixd's backend, in one run (medians of
rounds, µs per call). Run in the environment scripts/test-sglang builds:

    target/sglang-venv/bin/python python/bench/sglang_match.py

1. match of a cached 4,096-token prompt, the key a ``RadixKey`` over a Python
   list and over ``array('q')`` (what SGLang's ``Req`` holds): SGLang's
   pure-Python ``RadixCache``, its Rust tree core (``UnifiedRadixCache``,
   ``tree_core_backend="rust"``, FULL only), ``RadixdPrefixCache`` (in-process
   engine) and ``radixd.Engine.match_prefix`` alone; page sizes 1 and 16.
   With ``RADIXD_BIN`` (a release ``radixd``), also through a daemon it starts.
2. a scheduler step through SGLang's own functions (match + lock + alloc +
   checkpoint insert + release) for a 1K-token prompt with a 512-token cached
   prefix: ``RadixCache`` against ``RadixdPrefixCache``.
3. with ``RADIXD_BIN``, the same step for hybrid models through daemons it
   starts, in one run: a full-attention model (``RadixdPrefixCache``), a
   sliding-window one (FULL+SWA, window 512) and a Mamba one (FULL+MAMBA,
   the extra ping-pong buffer at page size 16) on ``RadixdHybridCache``:
   ``Req.init_next_round_input`` (match, Mamba copy-on-write),
   ``lock``, ``alloc_req_slots``, the prefill's allocation, ``release_kv_cache``
   (checkpoint insert, frees, unlock), then the new suffix evicted again.
   Alternated with them, the same three models on SGLang's own caches
   in-process (``RadixCache``, ``UnifiedRadixCache``): what SGLang's own
   hybrid step costs over its full-attention one, the floor of the ratio.
4. the step of 2 with and without EAGLE (bigram keys): ``RadixCache`` and
   ``RadixdPrefixCache`` (through a daemon with ``RADIXD_BIN``), each
   against its own plain step.
5. the step of 2 on SGLang's ``UnifiedRadixCache`` (what streaming sessions
   and ``tlru`` run on): its Python and Rust tree cores in-process, and the
   radixd TreeCore; beside them ``RadixdPrefixCache``, both radixd ones
   through a daemon each with ``RADIXD_BIN`` (in-process engines without).
   Issue 39's goal: the TreeCore within 1.2x of SGLang's own core.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from array import array
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests_sglang"))

import radixd  # noqa: E402
from radixd.sglang import RadixdPrefixCache  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402
from sim import Sim, params, publish_runtime  # noqa: E402

# SGLANG_MATCH_ROUNDS: rounds of every part (7 by default).
ROUNDS, CALLS = int(os.environ.get("SGLANG_MATCH_ROUNDS", "7")), 300


def per_call(f, calls=CALLS) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t) / calls * 1e6


def median_of(fs: dict) -> dict:
    """Each function's median over ROUNDS rounds, the functions alternating."""
    runs = {k: [] for k in fs}
    for _ in range(ROUNDS):
        for k, f in fs.items():
            runs[k].append(per_call(f))
    return {k: statistics.median(v) for k, v in runs.items()}


class Daemon:
    """A ``radixd serve`` of ``RADIXD_BIN`` for the run, or none."""

    def __init__(self, ps: int, pages: int, *args: str):
        self.proc = None
        binary = os.environ.get("RADIXD_BIN")
        if not binary:
            return
        self.name = f"radixd-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.proc = subprocess.Popen(
            [binary, "serve", "--name", self.name, "--page-size", str(ps), "--capacity", str(pages), *args],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(500):
            try:
                self.client = radixd.Client(self.name)
                return
            except radixd.RadixdError:
                time.sleep(0.01)
        raise RuntimeError("the daemon did not come up")

    def stop(self) -> None:
        if self.proc is not None:
            self.client.close()
            self.proc.terminate()
            self.proc.wait()


def rust_core(p):
    try:
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        p.tree_components = (ComponentType.FULL,)
        p.tree_core_backend = "rust"
        return UnifiedRadixCache(p)
    except Exception as e:  # not every build ships the Rust core
        print(f"  (SGLang's Rust tree core unavailable: {type(e).__name__}: {e})")
        return None


def match_bench(ps: int) -> None:
    n = 4096
    pages = n // ps + 8
    tokens = [(i * 7919) % 32000 for i in range(n)]
    caches = {}
    pa = params(ps, pages)
    caches["SGLang RadixCache (Python)"] = RadixCache(pa)
    rc = rust_core(params(ps, pages))
    if rc is not None:
        caches["SGLang Rust tree core"] = rc
    pb = params(ps, pages)
    caches["RadixdPrefixCache (engine)"] = RadixdPrefixCache(pb, radixd.Engine(ps, pages))
    daemon = Daemon(ps, pages)
    if daemon.proc is not None:
        caches["RadixdPrefixCache (daemon)"] = RadixdPrefixCache(params(ps, pages), daemon.client)
    # SGLang's RadixKey compares keys of one type only: a tree for list keys.
    pl = params(ps, pages)
    py_list = RadixCache(pl)
    for name, c in [*caches.items(), ("list", py_list)]:
        kv = c.token_to_kv_pool_allocator.alloc(n)
        key = list(tokens) if c is py_list else array("q", tokens)
        c.insert(InsertParams(key=RadixKey(key), value=kv))
    engine = caches["RadixdPrefixCache (engine)"].backend
    as_list = MatchPrefixParams(key=RadixKey(list(tokens)))
    as_array = MatchPrefixParams(key=RadixKey(array("q", tokens)))
    fs = {}
    for name, c in caches.items():
        if "Rust" not in name:  # the Rust core reads array('q') keys only
            target = py_list if "Python" in name else c
            fs[f"{name}, list"] = lambda c=target: c.match_prefix(as_list)
        fs[f"{name}, array('q')"] = lambda c=c: c.match_prefix(as_array)
    fs["radixd.Engine.match_prefix, list"] = lambda: engine.match_prefix(tokens)
    for name, c in caches.items():
        got = c.match_prefix(as_array).device_prefix_len
        assert got == n, (name, got)
    print(f"match of a cached {n}-token prompt, page size {ps} (median µs per call):")
    for k, v in median_of(fs).items():
        print(f"  {k:52s} {v:8.1f}")
    daemon.stop()


def request_step(sim, rid: str, prompt: list, evict: int) -> None:
    """One request through ``sim``: arrives (match + lock), its new tokens
    allocated, inserted at the end of prefill (checkpoint), released; then
    ``evict`` tokens evicted, so every step sees the same tree."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    sim.arrive(rid, prompt)
    sim.extend(rid, len(prompt) - sim.running[rid].kv.kv_committed_len)
    sim.checkpoint(rid)
    sim.finish(rid)
    sim.cache.evict(EvictParams(evict))


def seed(sim, shared: list) -> None:
    """The cached prefix every step's prompt begins with."""
    sim.arrive("seed", shared)
    sim.extend("seed", len(shared))
    sim.finish("seed")


def step_bench(ps: int) -> None:
    n, cached = 1024, 512
    pages = 4 * n // ps
    shared = list(range(100, 100 + cached))
    sims = {}
    for name in ("SGLang RadixCache", "RadixdPrefixCache (engine)"):
        p = params(ps, pages, context=2 * n)
        cache = RadixCache(p) if name.startswith("SGLang") else RadixdPrefixCache(p, radixd.Engine(ps, pages))
        sims[name] = Sim(cache, p)
    count = [0]

    def step(sim):
        # One request: arrives (match + lock), its 512 new tokens allocated,
        # inserted at the end of prefill (checkpoint), then released; the
        # cached suffix is evicted again so every step sees the same tree.
        count[0] += 1
        rid = f"s{count[0]}"
        prompt = shared + [count[0] % 30000 + 40000 + i for i in range(n - cached)]
        request_step(sim, rid, prompt, n - cached)

    for sim in sims.values():
        seed(sim, shared)  # the cached 512-token prefix
        step(sim)
        assert sim.cache.total_size() == cached, sim.cache.total_size()
    runs = {k: [] for k in sims}
    for _ in range(ROUNDS):
        for k, sim in sims.items():
            runs[k].append(per_call(lambda sim=sim: step(sim), 100))
    print(f"scheduler step, {n}-token prompt, {cached} cached, page size {ps} (median µs per step):")
    for k, v in runs.items():
        print(f"  {k:52s} {statistics.median(v):8.1f}")


def hybrid_step_bench(ps: int) -> None:
    """A scheduler step through daemons: full attention, FULL+SWA and
    FULL+MAMBA, alternated in rounds (median µs per step)."""
    import torch
    from hybrid_sim import mamba_params, publish, sglang_cache, swa_params
    from radixd.sglang_hybrid import RadixdHybridCache
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
    from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_extend, alloc_req_slots, alloc_token_slots
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.common import release_kv_cache
    from sglang.srt.sampling.sampling_params import SamplingParams

    if not os.environ.get("RADIXD_BIN"):
        return
    n, cached, window = 1024, 512, 512
    pages = 4 * n // ps
    publish(ps)
    setups = {
        "full attention (RadixdPrefixCache)": (params(ps, pages, rows=8, context=2 * n), ()),
        f"FULL+SWA, window {window} (RadixdHybridCache)": (
            swa_params(ps, pages, pages, window, rows=8, context=2 * n),
            ("--components", "full,swa", "--swa-window", str(window)),
        ),
        "FULL+MAMBA (RadixdHybridCache)": (
            mamba_params(ps, pages, 32, rows=8, context=2 * n),
            ("--components", "full,mamba", "--mamba-capacity", "32"),
        ),
    }
    # SGLang's own caches on the same pools, in-process.
    own = {
        "SGLang RadixCache": (params(ps, pages, rows=8, context=2 * n), None),
        "SGLang UnifiedRadixCache FULL+SWA": (swa_params(ps, pages, pages, window, rows=8, context=2 * n), "swa"),
        "SGLang UnifiedRadixCache FULL+MAMBA": (mamba_params(ps, pages, 32, rows=8, context=2 * n), "mamba"),
    }
    runs, daemons = {}, []
    shared = list(range(100, 100 + cached))
    count = [0]
    for name, (p, args) in [*setups.items(), *own.items()]:
        if name in own:
            cache = RadixCache(p) if args is None else sglang_cache(args, p)
        else:
            d = Daemon(ps, pages, *args)
            daemons.append(d)
            cache = RadixdHybridCache(p, d.client) if args else RadixdPrefixCache(p, d.client)
        pool = p.req_to_token_pool
        mamba = "MAMBA" in name

        def step(prompt, cache=cache, pool=pool, mamba=mamba, evict=True):
            count[0] += 1
            req = Req(f"h{count[0]}", "", array("q", prompt), SamplingParams(max_new_tokens=1))
            req.init_next_round_input(cache)
            req.lock = cache.lock(req.last_node)
            alloc_req_slots(pool, [req], cache)
            start, end = req.prefix_len, len(prompt)
            row = req.kv.req_pool_idx
            if start:
                pool.write((row, slice(0, start)), cache.prefix_device_indices(req))
            req.kv.cache_protected_len = start
            req.extend_end = end
            if ps == 1:
                out = alloc_token_slots(cache, end - start)
            else:
                last = pool.req_to_token[row, start - 1 : start].to(torch.int64) if start else torch.full((1,), -1)
                t = torch.tensor
                out = alloc_paged_token_slots_extend(cache, t([start]), t([start]), t([end]), t([end]), last, end - start)
            pool.write((row, slice(start, end)), out)
            req.kv.kv_committed_len = req.kv.kv_allocated_len = end
            if mamba and p.enable_mamba_extra_buffer:
                # The prefill tracked its last grid-aligned state.
                req.kv.mamba_last_track_idx = req.kv.mamba_next_track_idx
                req.kv.mamba_last_track_seqlen = start + (end - start) // 64 * 64
            req.finished_reason = FINISH_LENGTH(0)
            release_kv_cache(req, cache, checkpoint=True)
            if evict:
                cache.evict(EvictParams(num_tokens=n - cached))

        step(shared, evict=False)  # the cached 512-token prefix
        runs[name] = (step, [])
    for _ in range(ROUNDS):
        for name, (step, times) in runs.items():
            prompts = [shared + [c % 30000 + 40000 + i for i in range(n - cached)] for c in range(count[0], count[0] + 100)]
            it = iter(prompts)
            times.append(per_call(lambda step=step, it=it: step(next(it)), 100))
    print(f"scheduler step through a daemon, {n}-token prompt, {cached} cached, page size {ps} (median µs per step):")
    base = None
    for name, (_, times) in runs.items():
        if name in own:
            continue
        v = statistics.median(times)
        base = base or v
        print(f"  {name:52s} {v:8.1f}  ({v / base:.2f}x)")
    print(f"the same step on SGLang's own caches, in-process, page size {ps} (median µs per step):")
    base = None
    for name, (_, times) in runs.items():
        if name not in own:
            continue
        v = statistics.median(times)
        base = base or v
        print(f"  {name:52s} {v:8.1f}  ({v / base:.2f}x)")
    for d in daemons:
        d.stop()


def eagle_step_bench(ps: int) -> None:
    """The scheduler step of ``step_bench`` with and without EAGLE's bigram
    keys, alternated in rounds: SGLang's ``RadixCache`` in-process and
    ``RadixdPrefixCache`` through a daemon (in-process without
    ``RADIXD_BIN``), median µs per step."""
    n, cached = 1024, 512
    pages = 4 * n // ps
    shared = list(range(100, 100 + cached))
    daemons, sims = [], {}
    for eagle in (False, True):
        tag = "EAGLE" if eagle else "plain"
        p = params(ps, pages, context=2 * n)
        p.is_eagle = eagle
        sims[f"SGLang RadixCache, {tag}"] = (Sim(RadixCache(p), p), eagle)
        p = params(ps, pages, context=2 * n)
        p.is_eagle = eagle
        d = Daemon(ps, pages)
        daemons.append(d)
        where = "daemon" if d.proc is not None else "engine"
        backend = d.client if d.proc is not None else radixd.Engine(ps, pages)
        sims[f"RadixdPrefixCache ({where}), {tag}"] = (Sim(RadixdPrefixCache(p, backend), p), eagle)
    count = [0]

    def aligned(tokens: int, eagle: bool) -> int:
        keyed = tokens - 1 if eagle else tokens  # N + 1 tokens are N bigrams
        return keyed // ps * ps

    def step(sim, eagle):
        count[0] += 1
        rid = f"e{count[0]}"
        prompt = shared + [count[0] % 30000 + 40000 + i for i in range(n - cached)]
        request_step(sim, rid, prompt, aligned(n, eagle) - aligned(cached, eagle))

    for sim, eagle in sims.values():
        seed(sim, shared)
        step(sim, eagle)
        assert sim.cache.total_size() == aligned(cached, eagle), sim.cache.total_size()
    runs = {k: [] for k in sims}
    for _ in range(ROUNDS):
        for k, (sim, eagle) in sims.items():
            runs[k].append(per_call(lambda sim=sim, eagle=eagle: step(sim, eagle), 100))
    print(f"scheduler step with and without EAGLE, {n}-token prompt, {cached} cached, page size {ps} (median µs per step):")
    medians = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in medians.items():
        plain = medians[k.replace("EAGLE", "plain")]
        print(f"  {k:52s} {v:8.1f}  ({v / plain:.2f}x plain)")
    for d in daemons:
        d.stop()


class _UnlockAtOnce:
    """A client whose ``unlock_later`` unlocks at once (a round trip)."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    def unlock_later(self, handle):
        self._client.unlock(handle)


def treecore_step_bench(ps: int) -> None:
    """The scheduler step of ``step_bench`` on SGLang's ``UnifiedRadixCache``
    over its own Python and Rust cores and over the radixd TreeCore, with
    ``RadixdPrefixCache`` beside them, alternated in rounds (median µs per
    step, each over SGLang's Python core)."""
    from radixd.treecore import unified_radix_cache
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    n, cached = 1024, 512
    pages = 4 * n // ps
    shared = list(range(100, 100 + cached))
    daemons, sims = [], {}

    def backend():
        d = Daemon(ps, pages, "--recency", "sglang")
        daemons.append(d)
        return (d.client, "daemon") if d.proc is not None else (radixd.Engine(ps, pages, recency="sglang"), "engine")

    for core in ("python", "rust"):
        p = params(ps, pages, context=2 * n)
        p.tree_components = (ComponentType.FULL,)
        p.tree_core_backend = core
        try:
            sims[f"SGLang UnifiedRadixCache, {core} core"] = Sim(UnifiedRadixCache(p), p)
        except Exception as e:  # not every build ships the Rust core
            print(f"  (SGLang's {core} tree core unavailable: {type(e).__name__}: {e})")
    p = params(ps, pages, context=2 * n)
    p.tree_components = (ComponentType.FULL,)
    b, where = backend()
    sims[f"UnifiedRadixCache, radixd TreeCore ({where})"] = Sim(unified_radix_cache(p, b), p)
    if where == "daemon":
        # The same core unlocking at once, as before unlock_later: what
        # holding unlocks for the next request saves.
        p = params(ps, pages, context=2 * n)
        p.tree_components = (ComponentType.FULL,)
        b, where = backend()
        cache = unified_radix_cache(p, b)
        cache.tree_core.backend = _UnlockAtOnce(b)
        sims["UnifiedRadixCache, radixd TreeCore, unlocks at once"] = Sim(cache, p)
    p = params(ps, pages, context=2 * n)
    b, where = backend()
    sims[f"RadixdPrefixCache ({where})"] = Sim(RadixdPrefixCache(p, b), p)
    count = [0]

    def step(sim):
        count[0] += 1
        rid = f"t{count[0]}"
        prompt = shared + [count[0] % 30000 + 40000 + i for i in range(n - cached)]
        request_step(sim, rid, prompt, n - cached)

    for k, sim in sims.items():
        seed(sim, shared)
        step(sim)
        total = sim.cache.total_size()
        total = total[0] if isinstance(total, tuple) else total  # the unified cache's is per component
        assert total == cached, (k, total)
    runs = {k: [] for k in sims}
    for _ in range(ROUNDS):
        for k, sim in sims.items():
            runs[k].append(per_call(lambda sim=sim: step(sim), 100))
    print(f"scheduler step on UnifiedRadixCache, {n}-token prompt, {cached} cached, page size {ps} (median µs per step):")
    medians = {k: statistics.median(v) for k, v in runs.items()}
    base = next(iter(medians.values()))
    for k, v in medians.items():
        print(f"  {k:52s} {v:8.1f}  ({v / base:.2f}x SGLang's Python core)")
    for d in daemons:
        d.stop()


if __name__ == "__main__":
    # SGLANG_MATCH_PARTS picks parts (scripts/bench-compare runs match,step).
    parts = set(os.environ.get("SGLANG_MATCH_PARTS", "match,step,hybrid,eagle,treecore").split(","))
    publish_runtime()
    # On a host without a core to spare, a daemon spinning after a request
    # slows torch's intra-op threads (docs/benchmarks.md, "The TreeCore's
    # step"): SGLANG_MATCH_TORCH_THREADS sets how many torch uses.
    if os.environ.get("SGLANG_MATCH_TORCH_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["SGLANG_MATCH_TORCH_THREADS"]))
    for part, bench in (
        ("match", match_bench),
        ("step", step_bench),
        ("hybrid", hybrid_step_bench),
        ("eagle", eagle_step_bench),
        ("treecore", treecore_step_bench),
    ):
        if part in parts:
            for ps in (1, 16):
                bench(ps)
