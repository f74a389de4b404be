"""SGLang 0.5.23's UnifiedRadixCache and radixd's hybrid backend (built by
SGLang's registry factory through a daemon, or on an in-process engine)
under the same random scheduler steps, FULL+SWA and FULL+MAMBA, page sizes
1 and 16: arrivals (match, Mamba copy-on-write, lock, request slots),
chunked prefill, decode (freeing the SWA slots that slid out of the
window), checkpoints, finishing, aborts and evictions. Every match length,
branching point, copy-on-write source, protected length, evicted amount,
size and pool's free space agrees after every step, and every matched
prefix's KV slots hold its own tokens (FULL; SWA over its window; the
copied state its own prefix's).

Locks are released newest first on each node for now (``release="newest"``:
a request finishes, or moves its lock in a checkpoint, only when no running
request locked its node after it): radixd releases a node's newest lock
whatever handle names it (issue 29, being fixed in the engine), so releases
in any order (``release="any"``, which HybridTwin also runs) leave other SWA
pages protected than SGLang does on some runs."""

from __future__ import annotations

import os

import pytest

import radixd
from hybrid_sim import HybridTwin
from radixd.sglang_hybrid import RadixdHybridCache

OPS = int(os.environ.get("RADIXD_SGLANG_HYBRID_OPS", "2500"))
RELEASE_ORDERS = ["newest"]


def _engine_cache(kind: str, page_size: int):
    def build(p):
        ps = page_size
        if kind == "swa":
            engine = radixd.Engine(
                ps,
                HybridTwin.FULL_PAGES[ps],
                components="full,swa",
                swa_window=HybridTwin.window(ps),
                swa_capacity=HybridTwin.SWA_PAGES[ps],
            )
        else:
            engine = radixd.Engine(ps, HybridTwin.FULL_PAGES[ps], components="full,mamba", mamba_capacity=HybridTwin.SLOTS[ps])
        p.tree_components = None
        return RadixdHybridCache(p, engine)

    return build


def _run(twin: HybridTwin, kind: str) -> None:
    for _ in range(OPS):
        twin.step()
    twin.drain()
    twin.b.cache.backend.validate()
    c = twin.counts
    assert c["hits"] > OPS // 100 and c["evictions"] > OPS // 50 and c["checkpoints"] > OPS // 20, c
    assert c["branch"] > 0, c
    if kind == "mamba":
        assert c["cow"] > 0, c
    s = twin.b.cache.backend.stats()
    assert s["protected_tokens"] == 0


@pytest.mark.parametrize("release", RELEASE_ORDERS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_in_process(kind, page_size, release):
    twin = HybridTwin(kind, page_size, _engine_cache(kind, page_size), seed=page_size * 7 + len(kind), release=release)
    _run(twin, kind)


@pytest.mark.parametrize("release", RELEASE_ORDERS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_through_daemon(kind, page_size, release, start_daemon, monkeypatch):
    from hybrid_sim import radixd_cache

    d = start_daemon(*HybridTwin.serve_args(kind, page_size), page_size=page_size, capacity=HybridTwin.FULL_PAGES[page_size])
    monkeypatch.setenv("RADIXD_NAME", d.name)
    twin = HybridTwin(kind, page_size, lambda p: radixd_cache(kind, p), seed=100 + page_size * 7 + len(kind), release=release)
    assert type(twin.b.cache) is RadixdHybridCache
    _run(twin, kind)
