"""``--schedule-policy dfs-weight`` on radixd: ``dfs_weight_order`` of
``RadixdPrefixCache`` against SGLang's own on ``RadixCache``, twins under the
same random scheduler operations, every few steps on a queue of the running
requests' last nodes and fresh matches (LoRA and tenant namespaces, page
sizes 1 and 16, EAGLE's bigram keys). SGLang orders children of equal weight
as its tree made them, which radixd does not keep (it takes the one whose
first request queued first): the order is compared with SGLang's own
algorithm run over SGLang's tree with radixd's tie rule, and with SGLang's
own answer whenever no two children tie."""

from __future__ import annotations

import os
from array import array
from typing import Any

import pytest
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

import radixd
from radixd.sglang import RadixdPrefixCache
from radixd.sglang_base import dfs_weight_order
from sim import Twin

OPS = int(os.environ.get("RADIXD_SGLANG_POLICY_OPS", "4000"))
SPACES = [(None, None), ("lora-a", None), (None, "tenant")]


def sglang_order(root, nodes, by_first: bool = True) -> tuple:
    """SGLang's ``_dfs_weight_order`` over its tree, children of equal weight
    taken by their first request in the queue (``by_first``; else in the
    tree's order, SGLang's own rule); and whether any two children with
    requests tied (there the two rules may differ)."""
    at: dict = {}
    for i, n in enumerate(nodes):
        at.setdefault(n, []).append(i)
    weight: dict = {}
    first: dict = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children.values())
            continue
        kids = [c for c in node.children.values() if weight[c]]
        weight[node] = len(at.get(node, ())) + sum(weight[c] for c in kids)
        first[node] = min([*at.get(node, ()), *(first[c] for c in kids)], default=None)
    tied = False
    order: list = []
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.extend(at.get(node, ()))
            continue
        kids = [c for c in node.children.values() if weight[c]]
        kids.sort(key=(lambda c: (-weight[c], first[c])) if by_first else (lambda c: -weight[c]))
        tied |= any(weight[x] == weight[y] for x, y in zip(kids, kids[1:]))
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(kids))
    return order, tied


def compare(twin: Any, root: Any, a_handles: list, a_nodes: list, b_handles: list) -> bool:
    """radixd's order of a queue (``b_handles``) against SGLang's algorithm
    over SGLang's tree (``a_nodes``, the nodes of ``a_handles``) under
    radixd's tie rule; True when nothing tied, and SGLang's own answer was
    compared as well."""
    got = twin.b.cache.dfs_weight_order(b_handles)
    want, tied = sglang_order(root, a_nodes)
    twin.same("dfs-weight order", want, got)
    # The reference is SGLang's algorithm: under SGLang's tie rule it gives
    # SGLang's own answer, which radixd's equals where nothing ties.
    own = twin.a.cache.dfs_weight_order(a_handles)
    assert sglang_order(root, a_nodes, by_first=False)[0] == own
    if not tied:
        twin.same("dfs-weight order, SGLang's own", own, got)
    return not tied


def queue_fresh_matches(twin: Any, a: list, b: list, n: int) -> None:
    """``n`` new prompts matched on both sides, their last nodes queued."""
    for _ in range(n):
        tokens = twin.work.prompt()
        space = twin.rng.choice(twin.spaces)
        for s, queue in ((twin.a, a), (twin.b, b)):
            key = RadixKey(array("q", tokens), extra_key=space[0], cache_salt=space[1])
            queue.append(s.cache.match_prefix(MatchPrefixParams(key=key)).last_device_node)


def check_queue(twin: Twin, extra: int) -> bool:
    """Compares the orders of a queue; True when SGLang's own order was
    compared as well (no ties)."""
    r = twin.rng
    a_nodes = [req.last_node for req in twin.a.running.values()]
    b_nodes = [twin.b.running[rid].last_node for rid in twin.a.running]
    queue_fresh_matches(twin, a_nodes, b_nodes, extra)
    if twin.ps > 1 or r.random() < 0.5:
        # Requests sharing a last node, as a burst of one prompt queues them.
        k = r.randrange(len(a_nodes)) if a_nodes else None
        if k is not None:
            a_nodes.append(a_nodes[k])
            b_nodes.append(b_nodes[k])
    return compare(twin, twin.a.cache.root_node, a_nodes, a_nodes, b_nodes)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("eagle", [False, True])
def test_order_is_sglangs(page_size, eagle):
    engine = radixd.Engine(page_size, 48, recency="sglang")
    twin = Twin(page_size, 48, lambda p: RadixdPrefixCache(p, engine), seed=7 + page_size, lru=True, spaces=SPACES, eagle=eagle)
    queues = exact = deep = 0
    for step in range(OPS):
        twin.step()
        if step % 5 == 0:
            queues += 1
            exact += check_queue(twin, twin.rng.randrange(0, 8))
            deep += sum(n is not twin.a.cache.root_node and n.parent is not twin.a.cache.root_node
                        for n in (req.last_node for req in twin.a.running.values()))
    twin.drain()
    # Not vacuous: SGLang's own order was met exactly too, and queues held
    # nodes below other nodes (the depth-first part).
    assert exact > 0 and deep > queues // 4, (queues, exact, deep)


def test_paths_make_the_tree():
    """The order from paths alone, on a tree written out: a heavier subtree
    first, a node's own requests after its children's, pages never split."""
    ps = 2
    paths = [
        (None, (1, 2, 3, 4)),  # 0: below (1, 2)
        (None, (1, 2)),  # 1: the node (1, 2)
        (None, (5, 6)),  # 2: alone
        (None, (1, 2, 3, 9)),  # 3: parts from 0 inside a page: a sibling of 0 below (1, 2)
        None,  # 4: the root
        ("ns", (1, 2)),  # 5: another namespace's subtree
        (None, (1, 2, 3, 4)),  # 6: 0's node again
    ]
    # (1, 2) weighs 4: its children (1, 2, 3, 4) with 0 and 6 first, then
    # (1, 2, 3, 9), then its own 1; then (5, 6) and ns's (1, 2) tie at one
    # each, the first queued first; the root's own last.
    assert dfs_weight_order(paths, ps) == [0, 6, 3, 1, 2, 5, 4]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
def test_hybrid_order_is_sglangs(kind, page_size):
    """``RadixdHybridCache`` against SGLang's ``UnifiedRadixCache``: matches
    cut back by the window or to a checkpointed state end at SGLang's node."""
    from hybrid_sim import HybridTwin
    from test_hybrid_backend import _engine_cache

    twin = HybridTwin(kind, page_size, _engine_cache(kind, page_size), seed=3 + page_size, spaces=SPACES)
    core = twin.a.cache.tree_core
    queues = exact = deep = 0
    for step in range(OPS // 2):
        twin.step()
        if step % 5:
            continue
        a_ids = [req.last_node for req in twin.a.running.values()]
        b_nodes = [twin.b.running[rid].last_node for rid in twin.a.running]
        a_nodes = [core.node_by_id(i) for i in a_ids]
        if a_ids:
            k = twin.rng.randrange(len(a_ids))
            a_ids.append(a_ids[k])
            a_nodes.append(a_nodes[k])
            b_nodes.append(b_nodes[k])
        exact += compare(twin, core.root_node, a_ids, a_nodes, b_nodes)
        queues += 1
        deep += sum(n is not core.root_node and n.parent is not core.root_node for n in a_nodes)
    twin.drain()
    assert exact > 0 and deep > queues // 4, (queues, exact, deep)


@pytest.mark.parametrize("page_size", [1, 16])
def test_treecore_order_is_sglangs(page_size, start_daemon, monkeypatch):
    """The radixd TreeCore under SGLang's ``UnifiedRadixCache`` against the
    same controller on SGLang's Python core, through a daemon, with LoRA and
    tenant namespaces; and built by SGLang's ``create_tree_cache`` with
    ``--schedule-policy dfs-weight`` beside streaming sessions."""
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache.registry import create_tree_cache
    from sglang.srt.server_args import ServerArgs

    from radixd.treecore import RadixdTreeCore
    from sim import build_context, params, publish_runtime
    from test_treecore import python_core, radixd_core

    d = start_daemon("--recency", "sglang", page_size=page_size, capacity=48)
    clients = []

    def client(p):
        clients.append(radixd.Client(d.name))
        return clients[-1]

    twin = Twin(
        page_size, 48, radixd_core(client), seed=11 + page_size, lru=True, spaces=SPACES,
        reference=python_core, same_evictions=True,
    )
    core = twin.a.cache.tree_core
    queues = exact = deep = 0
    try:
        for step in range(OPS):
            twin.step()
            if step % 5:
                continue
            a_ids = [req.last_node for req in twin.a.running.values()]
            b_ids = [twin.b.running[rid].last_node for rid in twin.a.running]
            queue_fresh_matches(twin, a_ids, b_ids, twin.rng.randrange(0, 8))
            a_nodes = [core.node_by_id(i) for i in a_ids]
            exact += compare(twin, core.root_node, a_ids, a_nodes, b_ids)
            queues += 1
            deep += sum(n is not core.root_node and n.parent is not core.root_node for n in a_nodes)
        twin.drain()
        assert exact > 0 and deep > queues // 4, (queues, exact, deep)

        monkeypatch.setenv("RADIXD_NAME", d.name)
        args = ServerArgs(
            model_path="dummy", radix_cache_backend="radixd", enable_streaming_session=True, schedule_policy="dfs-weight"
        )
        runtime_context.publish(args, role="scheduler")
        cache = create_tree_cache(build_context(params(page_size, 48)))
        assert isinstance(cache.tree_core, RadixdTreeCore)
        clients.append(cache.tree_core.backend)
    finally:
        publish_runtime()
        for c in clients:
            c.close()
