"""Two SGLang scheduler processes share one radixd daemon: each builds its
cache through SGLang's registry factory, allocates KV from the daemon's pool
and runs random requests, writing which token each KV slot holds into one
mapped file; every prefix either process matches reads back its own tokens,
and afterwards every page is free or cached, nothing is locked, and the
daemon's invariants hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import radixd

HERE = Path(__file__).resolve().parent


def test_two_scheduler_processes_share_one_pool(start_daemon, tmp_path):
    ps, pages = 16, 64
    d = start_daemon(page_size=ps, capacity=pages)
    # The KV pool both processes map: which token each slot holds. Every
    # prefix a process matches (its own or the other's) must read back its
    # tokens, so no slot is handed out twice or reused while cached.
    kv_file = tmp_path / "kv"
    kv_file.write_bytes(b"\xff" * 8 * (pages + 1) * ps)
    env = dict(os.environ, RADIXD_NAME=d.name, PYTHONPATH=str(HERE))
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "scheduler_proc.py"), str(ps), str(pages), str(seed), "4000", str(kv_file)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    with radixd.Client(d.name) as c:
        c.validate()
        s = c.stats()
    assert s["protected_tokens"] == 0
    assert s["total_tokens"] // ps + s["free_pages"] == pages, s
    # Both processes hit prefixes (the same system prompts, cached by either).
    assert all(r["hits"] > 0 for r in results), results
