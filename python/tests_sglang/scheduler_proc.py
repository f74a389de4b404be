"""One scheduler process for test_two_schedulers: builds its tree cache with
SGLang's registry factory on the daemon named by RADIXD_NAME and runs random
requests through SGLang's scheduler functions; prints its figures as JSON."""

from __future__ import annotations

import json
import random
import sys
import warnings

warnings.filterwarnings("ignore")

from sim import Sim, Workload, params, publish_runtime, radixd_cache  # noqa: E402


def main(page_size: int, pages: int, seed: int, ops: int, kv_file: str) -> None:
    from sglang.srt.plugins import load_plugins

    publish_runtime()
    load_plugins()
    p = params(page_size, pages)
    sim = Sim(radixd_cache(p), p, kv_file)
    rng = random.Random(seed)
    work = Workload(random.Random(7), page_size)  # both processes: the same system prompts
    prompts: dict = {}
    hits = starved = 0
    for i in range(ops):
        roll = rng.random()
        running = sorted(sim.running)
        if roll < 0.25 and len(running) < 6:
            rid = f"p{seed}-{i}"
            prompts[rid] = work.prompt()
            hits += sim.arrive(rid, prompts[rid]) > 0
        elif roll < 0.8 and running:
            rid = rng.choice(running)
            done = sim.running[rid].kv.kv_committed_len
            left = len(prompts[rid]) - done
            n, out = (min(left, rng.randrange(1, 40)), None) if left > 0 else (1, [rng.randrange(8)])
            if done + n >= 500 or not sim.extend(rid, n, out):
                starved += 1
                if sim.running[rid].kv.kv_allocated_len:
                    sim.finish(rid, abort=True)
                    prompts.pop(rid)
                continue
            if out is None:
                sim.checkpoint(rid)
        elif running:
            rid = rng.choice(running)
            if sim.running[rid].kv.kv_allocated_len:
                sim.finish(rid, abort=rng.random() < 0.2)
                prompts.pop(rid)
    for rid in sorted(sim.running):
        req = sim.running[rid]
        if req.kv.kv_allocated_len:
            sim.finish(rid)
        else:
            sim.running.pop(rid)
            sim.cache.unlock(req.lock)
            sim.pool.free(req)
    print(json.dumps({"hits": hits, "starved": starved, "sizes": sim.sizes()}))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]), sys.argv[5])
