"""Tensor-parallel ranks of one SGLang server on one radixd tree: N
scheduler processes (N = 2, 4), each building its cache through SGLang's
registry factory with a real ``torch.distributed`` gloo group as
``tp_cache_group``, run the same random scheduler operations in lockstep
through SGLang's own functions (with LoRA ``extra_key``s and
``cache_salt``s among them). Every rank gets the answers one rank alone
gets, each rank's own KV-slot file reads back its tokens for every prefix
it matches (``Sim.check_kv``), and the daemon's tree is the one that rank
alone built: the same figures, and every prompt matches the same length on
the same pages. Then the start-up paths: ranks that disagree on the group's
size are refused, and so is a late rank of a finished group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import radixd

HERE = Path(__file__).resolve().parent
PS, PAGES, OPS = 4, 96, int(os.environ.get("RADIXD_TP_OPS", "700"))


def run_ranks(d, tmp_path: Path, size: int, tag: str, streaming: bool = False) -> list:
    env = dict(os.environ, RADIXD_NAME=d.name, PYTHONPATH=str(HERE), RADIXD_TP_STREAMING="1" if streaming else "0")
    init = tmp_path / f"init-{tag}"
    procs = []
    for rank in range(size):
        kv = tmp_path / f"kv-{tag}-{rank}"
        kv.write_bytes(b"\xff" * 8 * (PAGES + 1) * PS)
        out = tmp_path / f"out-{tag}-{rank}.json"
        args = [str(size), str(rank), str(init), str(PS), str(PAGES), str(OPS), str(kv), str(out)]
        procs.append((subprocess.Popen(
            [sys.executable, str(HERE / "tp_rank_proc.py"), *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ), out))
    results = []
    for p, out in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.read_text()))
    return results


@pytest.mark.parametrize("size", [2, 4])
def test_lockstep_ranks_share_one_tree_built_as_one_rank_alone(start_daemon, tmp_path, size):
    check_ranks_against_one_alone(start_daemon, tmp_path, size, streaming=False)


@pytest.mark.parametrize("size", [2, 4])
def test_treecore_ranks_share_one_tree_built_as_one_rank_alone(start_daemon, tmp_path, size):
    """The same with ``--enable-streaming-session``: every rank runs SGLang's
    own ``UnifiedRadixCache`` on the radixd TreeCore over its group's
    client (evictions one ``evict_leaf`` step each, key reads as steps)."""
    check_ranks_against_one_alone(start_daemon, tmp_path, size, streaming=True)


def check_ranks_against_one_alone(start_daemon, tmp_path: Path, size: int, streaming: bool) -> None:
    # The TreeCore answers as SGLang's tree only under SGLang's recency.
    serve = ("--recency", "sglang") if streaming else ()
    alone_daemon = start_daemon(*serve, page_size=PS, capacity=PAGES)
    (alone,) = run_ranks(alone_daemon, tmp_path, 1, "alone", streaming)
    d = start_daemon(*serve, page_size=PS, capacity=PAGES)
    ranks = run_ranks(d, tmp_path, size, f"tp{size}", streaming)
    assert any(op == "arrive" and n > 0 for op, n in (tuple(t) for t in alone["trace"] if t[0] == "arrive"))
    evicted = [t[1] for t in alone["trace"] if t[0] == "evict"]
    assert sum(n > 0 for n in evicted) > 5, f"evictions: {evicted}"
    for r, got in enumerate(ranks):
        assert got["trace"] == alone["trace"], f"rank {r} of {size} answered otherwise than one rank alone"
        assert got["tree"] == alone["tree"], f"rank {r} of {size}: the daemon's tree is not one rank's"
        assert got["stats"] == alone["stats"]
    # Namespaced prompts were cached and matched on their own.
    assert any(space != [None, None] and n > 0 for _, space, (n, _) in alone["tree"])
    with radixd.Client(d.name) as c:
        c.validate()
        s = c.stats()
    # The ranks are gone: the group's locks and pages went with the last.
    assert s["protected_tokens"] == 0 and s["total_tokens"] // PS + s["free_pages"] == PAGES, s


def _rank_call(size: int, rank: int, init: Path, name: str, group_size: int) -> str:
    """A rank that builds its cache through the factory with a gloo group
    of ``size`` but tells the daemon ``group_size``: the error, or ok."""
    code = f"""
import sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {str(HERE)!r})
import torch.distributed as dist
from sim import build_context, params, publish_runtime
from sglang.srt.plugins import load_plugins
from sglang.srt.mem_cache.registry import get_radix_cache_factory
import radixd, radixd.sglang as rs
publish_runtime(); load_plugins()
dist.init_process_group("gloo", init_method="file://{init}", rank={rank}, world_size={size})
p = params({PS}, {PAGES}); p.tp_cache_group = dist.new_group(list(range({size})), backend="gloo")
ctx = build_context(p); ctx.tp_size, ctx.tp_rank = {size}, {rank}
real = rs.tp_group
class Told(rs.TpGroup):
    __slots__ = ()
    def join_args(self):
        return (self.key, self.rank, {group_size})
def telling(ctx):
    g = real(ctx)
    return Told(g.key, g.rank, g.size, g.ranks)
rs.tp_group = telling
try:
    cache = get_radix_cache_factory("radixd")(ctx)
    print("ok")
except radixd.RadixdError as e:
    print(e.kind, e.message)
dist.barrier()
"""
    return code


def test_ranks_that_disagree_on_the_group_size_are_refused(start_daemon, tmp_path):
    d = start_daemon(page_size=PS, capacity=PAGES)
    env = dict(os.environ, RADIXD_NAME=d.name, PYTHONPATH=str(HERE))
    init = tmp_path / "init"
    procs = [
        subprocess.Popen([sys.executable, "-c", _rank_call(2, r, init, d.name, 2 if r == 0 else 3)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(out.strip().splitlines()[-1])
    # Whichever joined second is refused, naming both sizes; the other
    # is the group's rank.
    assert sorted(o.split()[0] for o in outs) == ["group_mismatch", "ok"], outs
    refused = next(o for o in outs if o != "ok")
    assert "has 2 ranks; rank 1 says 3" in refused or "has 3 ranks; rank 0 says 2" in refused, outs


def test_a_rank_of_a_finished_group_is_refused(start_daemon):
    d = start_daemon(page_size=PS, capacity=PAGES)
    with radixd.Client(d.name, group=("srv/1", 0, 2)) as r0:
        assert r0.rank == ("srv/1", 0, 2)
        with pytest.raises(radixd.GroupClosedError):
            radixd.Client(d.name, group=("srv/1", 0, 2))
    # Rank 0 is gone and rank 1 never came: the group is finished.
    import time

    deadline = time.time() + 5
    while True:
        try:
            radixd.Client(d.name, group=("srv/1", 1, 2))
        except radixd.GroupClosedError as e:
            assert "finished" in e.message or "gone" in e.message
            break
        assert time.time() < deadline, "a late rank joined a finished group"
        time.sleep(0.05)


@pytest.mark.parametrize("kind, streaming", [("swa", False), ("mamba", False), ("swa", True)])
def test_hybrid_ranks_in_lockstep_agree_with_sglang(start_daemon, tmp_path, kind, streaming):
    """Two ranks of a hybrid model (FULL+SWA, FULL+MAMBA) on one group: each
    runs the hybrid twin against SGLang's own ``UnifiedRadixCache``, so every
    answer every rank gets is the one SGLang gives a single scheduler. With
    streaming sessions (FULL+SWA) each rank's cache is that controller on the
    radixd TreeCore over the group's client."""
    from hybrid_sim import HybridTwin

    ps = 16
    d = start_daemon(*HybridTwin.serve_args(kind, ps), page_size=ps, capacity=HybridTwin.FULL_PAGES[ps])
    env = dict(os.environ, RADIXD_NAME=d.name, PYTHONPATH=str(HERE), RADIXD_TP_STREAMING="1" if streaming else "0")
    init = tmp_path / f"init-{kind}"
    ops = int(os.environ.get("RADIXD_SGLANG_HYBRID_OPS", "1500"))
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "hybrid_tp_proc.py"), "2", str(r), str(init), kind, str(ps), str(ops)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-4000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
    assert outs[0]["counts"]["hits"] > 0 and outs[0]["counts"]["evictions"] > 0, outs[0]
    with radixd.Client(d.name) as c:
        c.validate()
