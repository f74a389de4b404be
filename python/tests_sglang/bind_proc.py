"""A scheduler process of the server at ``127.0.0.1:PORT`` for
test_pool_binding: builds its tree cache with SGLang's registry factory on
the daemon named by RADIXD_NAME (binding the daemon's pool to its KV pool,
or refused at start-up), runs a few requests with its KV slots in the
mapped file KV_FILE (the stand-in for a KV pool on one GPU), and prints the
binding it saw as JSON. Exits non-zero, with the refusal on stderr, when refused."""

from __future__ import annotations

import json
import random
import sys
import warnings

warnings.filterwarnings("ignore")

from sim import Sim, Workload, params, radixd_cache  # noqa: E402


def main(page_size: int, pages: int, port: int, kv_file: str) -> None:
    from sglang.srt import runtime_context
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    runtime_context.publish(
        ServerArgs(model_path="dummy", radix_cache_backend="radixd", port=port), role="scheduler"
    )
    load_plugins()
    p = params(page_size, pages)
    sim = Sim(radixd_cache(p), p, kv_file)
    work = Workload(random.Random(7), page_size)
    hits = 0
    for i in range(20):
        rid = f"b{i}"
        prompt = work.prompt()
        hits += sim.arrive(rid, prompt) > 0
        done = sim.running[rid].kv.kv_committed_len
        if len(prompt) > done and sim.extend(rid, len(prompt) - done):
            sim.checkpoint(rid)
        req = sim.running[rid]
        if req.kv.kv_allocated_len:
            sim.finish(rid)
        else:  # nothing allocated (as scheduler_proc.py releases such a request)
            sim.running.pop(rid)
            sim.cache.unlock(req.lock)
            sim.pool.free(req)
    backend = sim.cache.backend
    print(json.dumps({"pool": backend.pool, "binding": backend.pool_binding(), "hits": hits}))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]), sys.argv[4])
