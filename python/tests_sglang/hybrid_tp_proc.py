"""One tensor-parallel rank of a hybrid model for test_tp_group: joins a
gloo group of ``size`` ranks and runs the hybrid twin (SGLang's own
``UnifiedRadixCache`` in this process against radixd's hybrid backend,
built by SGLang's registry factory with ``tp_cache_group`` set) under the
same random scheduler steps on every rank, synchronised every few steps.
The twin compares every answer with SGLang's after every step, so every
rank gets the answers one rank alone gets; prints the twin's counts. With
``RADIXD_TP_STREAMING=1`` the server runs streaming sessions, so the
factory answers SGLang's own ``UnifiedRadixCache`` on the radixd TreeCore
over the group's client (FULL+SWA)."""

from __future__ import annotations

import json
import sys
import warnings

warnings.filterwarnings("ignore")


def main(size: int, rank: int, init: str, kind: str, page_size: int, ops: int) -> None:
    import os

    import torch.distributed as dist
    from sglang.srt.mem_cache.registry import get_radix_cache_factory

    from hybrid_sim import HybridTwin, build_context

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=size)
    group = dist.new_group(list(range(size)), backend="gloo")

    streaming = os.environ.get("RADIXD_TP_STREAMING") == "1"

    def backend(p):
        p.tp_cache_group = group
        ctx = build_context(kind, p)
        ctx.tp_size, ctx.tp_rank = size, rank
        if streaming:
            from sglang.srt import runtime_context
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
            from sglang.srt.server_args import ServerArgs

            args = ServerArgs(
                model_path="dummy", radix_cache_backend="radixd", enable_streaming_session=True, page_size=page_size
            )
            runtime_context.publish(args, role="scheduler")
            cache = get_radix_cache_factory("radixd")(ctx)
            assert type(cache) is UnifiedRadixCache, type(cache)
            return cache
        return get_radix_cache_factory("radixd")(ctx)

    twin = HybridTwin(kind, page_size, backend, seed=31 + page_size, release="random")
    for i in range(ops):
        if i % 16 == 0:
            dist.barrier(group)
        twin.step()
    twin.drain()
    print(json.dumps({"counts": twin.counts, "sizes": str(twin.b.sizes())}))
    dist.barrier(group)
    dist.destroy_process_group()


if __name__ == "__main__":
    a = sys.argv[1:]
    from sglang.srt.plugins import load_plugins

    load_plugins()
    main(int(a[0]), int(a[1]), a[2], a[3], int(a[4]), int(a[5]))
