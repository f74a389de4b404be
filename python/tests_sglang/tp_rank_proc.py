"""One tensor-parallel rank for test_tp_group: joins a gloo process group
of ``size`` ranks, builds its tree cache with SGLang's registry factory
(``tp_cache_group`` set, as SGLang's scheduler sets it) and runs random
scheduler operations through SGLang's functions, the same on every rank,
synchronised every few operations as a scheduler's batches are. With
``size`` 1 it is one rank alone, without a process group. With
``RADIXD_TP_STREAMING=1`` the server runs streaming sessions, so the
factory answers SGLang's own ``UnifiedRadixCache`` on the radixd TreeCore. Writes its trace
(every answer), and what the daemon's tree answers for every prompt it saw
at the end, as JSON."""

from __future__ import annotations

import json
import os
import random
import sys
import warnings

warnings.filterwarnings("ignore")

from sim import Sim, Workload, build_context, params, publish_runtime  # noqa: E402

SPACES = [(None, None), ("lora-7", None), (None, "tenant-a")]


def main(size: int, rank: int, init: str, page_size: int, pages: int, ops: int, kv_file: str, out: str) -> None:
    import torch.distributed as dist
    from sglang.srt.mem_cache.registry import get_radix_cache_factory
    from sglang.srt.plugins import load_plugins

    # Streaming sessions: the factory answers SGLang's own UnifiedRadixCache
    # on the radixd TreeCore (radixd.treecore) instead of RadixdPrefixCache.
    streaming = os.environ.get("RADIXD_TP_STREAMING") == "1"
    if streaming:
        from sglang.srt import runtime_context
        from sglang.srt.server_args import ServerArgs

        args = ServerArgs(model_path="dummy", radix_cache_backend="radixd", enable_streaming_session=True)
        runtime_context.publish(args, role="scheduler")
    else:
        publish_runtime()
    load_plugins()
    p = params(page_size, pages)
    # EAGLE: the tree keyed by bigrams (radixd.bigram_key's namespaces).
    eagle = os.environ.get("RADIXD_TP_EAGLE") == "1"
    p.is_eagle = eagle
    group = None
    if size > 1:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=size)
        group = dist.new_group(list(range(size)), backend="gloo")
        p.tp_cache_group = group
    ctx = build_context(p)
    ctx.tp_size, ctx.tp_rank = size, rank
    cache = get_radix_cache_factory("radixd")(ctx)
    if streaming:
        from radixd.treecore import RadixdTreeCore
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        assert type(cache) is UnifiedRadixCache and isinstance(cache.tree_core, RadixdTreeCore), type(cache)
        client = cache.tree_core.backend
    else:
        client = cache.backend
    assert client.rank is None if size == 1 else client.rank[1:] == (rank, size), client.rank
    sim = Sim(cache, p, kv_file)
    rng = random.Random(5)
    work = Workload(random.Random(7), page_size)
    prompts: dict = {}
    seen: list = []
    trace: list = []
    for i in range(ops):
        if group is not None and i % 16 == 0:
            dist.barrier(group)  # a scheduler's batch boundary
        roll = rng.random()
        running = sorted(sim.running)
        if roll < 0.25 and len(running) < 6:
            rid = f"r{i}"
            space = rng.choice(SPACES)
            prompts[rid] = work.prompt()
            seen.append((prompts[rid], space))
            trace.append(("arrive", sim.arrive(rid, prompts[rid], space)))
        elif roll < 0.8 and running:
            rid = rng.choice(running)
            done = sim.running[rid].kv.kv_committed_len
            left = len(prompts[rid]) - done
            n, out_ids = (min(left, rng.randrange(1, 40)), None) if left > 0 else (1, [rng.randrange(8)])
            if done + n >= 500 or not sim.extend(rid, n, out_ids):
                trace.append(("starved", rid))
                if sim.running[rid].kv.kv_allocated_len:
                    sim.finish(rid, abort=True)
                    prompts.pop(rid)
                continue
            trace.append(("extend", n))
            if out_ids is None:
                trace.append(("checkpoint", sim.checkpoint(rid)))
        elif roll < 0.9 and running:
            rid = rng.choice(running)
            if sim.running[rid].kv.kv_allocated_len:
                sim.finish(rid, abort=rng.random() < 0.2)
                prompts.pop(rid)
                trace.append(("finish", rid))
        else:
            trace.append(("evict", sim.evict(rng.randrange(1, 3 * page_size))))
        trace.append(("sizes", sim.sizes()))
    for rid in sorted(sim.running):
        req = sim.running[rid]
        if req.kv.kv_allocated_len:
            sim.finish(rid)
        else:
            sim.running.pop(rid)
            sim.cache.unlock(req.lock)
            sim.pool.free(req)
    trace.append(("drained", sim.sizes()))
    if group is not None:
        dist.barrier(group)  # every rank drained: the tree is final
    import radixd

    if eagle:
        tree = [(tokens, space, client.peek(*radixd.bigram_key(tokens, _ns(space)))) for tokens, space in seen]
    else:
        tree = [(tokens, space, client.peek(tokens, ns=_ns(space))) for tokens, space in seen]
    stats = client.stats()
    with open(out, "w") as f:
        json.dump({"trace": trace, "tree": [(t, list(s), [n, list(pg)]) for t, s, (n, pg) in tree], "stats": stats}, f)
    if group is not None:
        dist.barrier(group)  # nobody leaves (and empties the pool) before all have read
        dist.destroy_process_group()


def _ns(space: tuple):
    import radixd
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return radixd.namespace_of(RadixKey([], extra_key=space[0], cache_salt=space[1]))


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), a[2], int(a[3]), int(a[4]), int(a[5]), a[6], a[7])
