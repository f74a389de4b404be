"""One daemon, one KV pool, with real SGLang 0.5.23: a scheduler built by
SGLang's registry factory binds the daemon's pool to its KV pool (device,
geometry, server); a scheduler of another server's pool is refused at
start-up with what to do, and the first keeps working; a scheduler of the
same pool, or one naming the same buffer with RADIXD_POOL, shares it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Optional

import radixd
from sim import Sim, Workload, params, radixd_cache

HERE = Path(__file__).resolve().parent
PS, PAGES = 16, 64


def scheduler(d, port: int, kv: Path, pool: Optional[str] = None) -> subprocess.CompletedProcess:
    """A scheduler process of the server at 127.0.0.1:``port`` whose KV
    slots are the mapped file ``kv`` (naming that buffer ``pool`` with
    RADIXD_POOL)."""
    env = dict(os.environ, RADIXD_NAME=d.name, PYTHONPATH=str(HERE))
    env.pop("RADIXD_POOL", None)
    if pool is not None:
        env["RADIXD_POOL"] = pool
    return subprocess.run(
        [sys.executable, str(HERE / "bind_proc.py"), str(PS), str(PAGES), str(port), str(kv)],
        env=env, capture_output=True, text=True, timeout=300,
    )


def run(sim: Sim, rng: random.Random, work: Workload, n: int) -> int:
    hits = 0
    for i in range(n):
        rid = f"r{rng.random()}"
        prompt = work.prompt()
        hits += sim.arrive(rid, prompt) > 0
        done = sim.running[rid].kv.kv_committed_len
        if len(prompt) > done and sim.extend(rid, len(prompt) - done):
            sim.checkpoint(rid)
        req = sim.running[rid]
        if req.kv.kv_allocated_len:
            sim.finish(rid, abort=rng.random() < 0.1)
        else:  # nothing allocated (as scheduler_proc.py releases such a request)
            sim.running.pop(rid)
            sim.cache.unlock(req.lock)
            sim.pool.free(req)
    return hits


def kv_file(path: Path) -> Path:
    """A KV pool processes map: which token each slot holds (see sim.Sim)."""
    path.write_bytes(b"\xff" * 8 * (PAGES + 1) * PS)
    return path


def test_a_scheduler_of_another_pool_is_refused_at_start_up(start_daemon, monkeypatch, tmp_path):
    d = start_daemon(page_size=PS, capacity=PAGES)
    kv, other_kv = kv_file(tmp_path / "kv"), kv_file(tmp_path / "other-kv")
    monkeypatch.setenv("RADIXD_NAME", d.name)
    monkeypatch.delenv("RADIXD_POOL", raising=False)
    p = params(PS, PAGES)
    first = Sim(radixd_cache(p), p, str(kv))  # the server at 127.0.0.1:30000 (sim's runtime)
    backend = first.cache.backend
    pool = dict(kv.split("=", 1) for kv in backend.pool.split(";"))
    assert pool == {"device": "cpu", "page_size": "16", "pages": "64", "dtype": "float16",
                    "server": "127.0.0.1:30000"}, pool
    assert backend.pool_binding() == (backend.pool, 1)
    rng, work = random.Random(3), Workload(random.Random(7), PS)
    run(first, rng, work, 10)

    # Another server's scheduler on the same daemon: refused at start-up.
    other = scheduler(d, 30001, other_kv)
    assert other.returncode != 0, other.stdout
    for needle in ("PoolMismatchError", "radixd serve --name OTHER", "RADIXD_NAME=OTHER",
                   "radixd serve --store", "server (bound 127.0.0.1:30000, this client 127.0.0.1:30001)"):
        assert needle in other.stderr, other.stderr[-3000:]
    assert backend.pool_binding() == (backend.pool, 1)

    # The first keeps working, on the pool it had.
    assert run(first, rng, work, 40) > 0
    c = radixd.Client(d.name)
    c.validate()
    assert c.stats()["protected_tokens"] == 0

    # A scheduler of the same server's pool (mapping the same buffer) shares
    # it: it hits the prefixes the first cached, and reads their tokens back.
    same = scheduler(d, 30000, kv)
    assert same.returncode == 0, same.stderr[-3000:]
    got = json.loads(same.stdout.strip().splitlines()[-1])
    assert got["pool"] == backend.pool and got["binding"] == [backend.pool, 2] and got["hits"] > 0, got

    # Processes that map one buffer without being one server name it alike
    # (RADIXD_POOL); one that does not is another server's.
    backend.close()  # the last holder: the pool is free again
    monkeypatch.setenv("RADIXD_POOL", "kv-0")
    p2 = params(PS, PAGES)
    named = Sim(radixd_cache(p2), p2, str(other_kv)).cache.backend
    assert "buffer=kv-0" in named.pool and "server=" not in named.pool, named.pool
    alike = scheduler(d, 30001, other_kv, pool="kv-0")
    assert alike.returncode == 0, alike.stderr[-3000:]
    assert json.loads(alike.stdout.strip().splitlines()[-1])["binding"] == [named.pool, 2]
    unnamed = scheduler(d, 30001, kv)
    assert unnamed.returncode != 0 and "buffer (bound kv-0, this client none)" in unnamed.stderr, unnamed.stderr[-3000:]
    named.close()
    c.validate()
    c.close()
