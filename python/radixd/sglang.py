"""SGLang 0.5.23 on radixd: ``--radix-cache-backend radixd``.

``pip install ./python`` registers :func:`register` in SGLang's
``sglang.srt.plugins`` entry-point group; SGLang calls it in every process
it starts, and it registers :func:`radixd_cache_factory` with
``sglang.srt.mem_cache.registry.register_radix_cache_backend("radixd", ...)``.
The factory connects to the daemon named by ``RADIXD_NAME`` (default
``radixd``), binds the daemon's pool to this scheduler's KV buffer
(:func:`pool_identity`: a daemon serves one KV pool, and a scheduler of
another is refused at start-up), installs radixd's pool into SGLang's
token-to-KV allocator and returns a :class:`RadixdPrefixCache`; with
``--enable-streaming-session`` or ``--radix-eviction-policy tlru`` (which
SGLang's ``create_tree_cache`` takes only from a ``UnifiedRadixCache``) it
returns SGLang's own ``UnifiedRadixCache`` on the radixd TreeCore instead
(:mod:`radixd.treecore`, docs/sglang-parity.md), under any eviction policy
and with EAGLE.

Recency: radixd answers as SGLang's trees under SGLang's rule, ``radixd
serve --recency sglang`` (a match that splits a node counts as a use of its
lower half too, as SGLang's ``_split_node`` touches it), which every
``radixd serve`` line this backend prints includes. Under the daemon's
default, ``exact``, the lower half keeps its last use: every answer is
still a correct cache's, but a partial eviction can take another leaf than
SGLang's, so later matches can differ. The backend logs the daemon's rule
at start-up and warns when it is not SGLang's (:func:`check_recency`).

Every method follows SGLang 0.5.23's ``RadixCache``
(``python/sglang/srt/mem_cache/radix_cache.py``) and ``BasePrefixCache``
(``base_prefix_cache.py``); where radixd has nothing to do, the method keeps
the upstream base class's no-op meaning (see the comments). Importing this
module needs ``sglang`` (and so ``torch``); ``import radixd`` alone does not.

KV slots: SGLang's pools keep slot page 0 as padding, so radixd page ``p`` is
SGLang page ``p + 1``: token ``j`` of radixd page ``p`` lives at KV index
``(p + 1) * P + j``. radixd's capacity is SGLang's page count.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from array import array
from typing import Any, Optional, Sequence

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    TreeLock,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams

import radixd

from .sglang_base import (
    HYBRID_POLICIES,
    SGLANG_RECENCY,
    RadixdAllocatorMixin,
    _pages_tensor,
    cache_key,
    check_eviction_policy,
    insert_hints,
    check_recency,
    dfs_weight_order,
    eviction_policy,
    install_allocator,
    note_uncached,
    policy_flags,
    unified_recency,
)

logger = logging.getLogger(__name__)

BACKEND_NAME = "radixd"

_EMPTY_PAGES = array("I")



class RadixdNode:
    """What SGLang keeps in ``req.last_node``: radixd's node handle (``None``
    for the root), the tokens from the root to it, and the pages on that
    path as the match read them. Per-token KV indices are built from the
    pages only when SGLang asks for them (``path_device_indices``), once per
    node: a match itself builds none."""

    __slots__ = ("handle", "prefix_len", "pages", "tokens", "ns", "_indices")

    def __init__(
        self,
        handle: Optional[int],
        prefix_len: int,
        pages: Any = _EMPTY_PAGES,
        tokens: Any = None,
        ns: Optional[str] = None,
    ):
        self.handle = handle
        self.prefix_len = prefix_len
        self.pages = pages
        # The key it was matched with (not copied) and its namespace: lets a
        # lock find the same prefix again if another scheduler evicted the
        # node meanwhile.
        self.tokens = tokens
        self.ns = ns
        self._indices: Optional[torch.Tensor] = None

    @property
    def id(self) -> int:
        return 0 if self.handle is None else self.handle

    # SGLang's base dfs_weight_order walks ``children``; radixd's tree is in
    # the daemon, so RadixdPrefixCache overrides it and a node has none.
    children: dict = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RadixdNode) and other.handle == self.handle

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        if self.handle is None:
            return "RadixdNode(root)"
        return f"RadixdNode(handle={self.handle:#x}, prefix_len={self.prefix_len})"


def _ns(key: Any) -> Optional[str]:
    # SGLang keeps keys of different extra_key (LoRA id) or cache_salt in
    # disjoint subtrees; radixd keeps each pair in a namespace of its own.
    return radixd.namespace_of(key)


class _NoNamespace(Exception):
    """radixd refused to register a namespace this cache needs: its table is
    full (``sglang_base.note_uncached``)."""


class RadixdPrefixCache(BasePrefixCache):
    """SGLang 0.5.23's ``BasePrefixCache`` on radixd.

    ``backend`` is a ``radixd.Client`` (the node's daemon, shared by every
    scheduler on it) or a ``radixd.Engine`` (in-process). Built by
    :func:`radixd_cache_factory` from SGLang's ``CacheInitParams``;
    ``install`` makes the allocator hand out radixd's pages (the factory
    always does: SGLang's KV indices must be radixd's pages).
    """

    def __init__(self, params: Any, backend: Any = None, install: bool = True):
        if backend is None and hasattr(params, "match_prefix"):
            # RadixdPrefixCache(radixd.Engine(...)) or (radixd.Client(...)):
            # a cache without SGLang's pools (insert allocates its pages).
            backend = params
            params = CacheInitParams(
                disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None, page_size=backend.page_size
            )
        if backend is None:
            raise TypeError("RadixdPrefixCache(params, backend): backend is a radixd.Client or radixd.Engine")
        self.backend = backend
        # Under a policy other than LRU every insert carries the request's
        # priority and what it inserted before (the policy's keys read
        # them), and a checkpoint re-inserts the prompt as SGLang's does;
        # LRU reads neither, and its inserts stay as they were.
        self._hinted = getattr(backend, "eviction_policy", "lru") != "lru"
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.page_size = params.page_size
        # EAGLE / MTP: SGLang keys the tree by bigrams (RadixKey.is_bigram);
        # radixd keys raw tokens 1..N in a namespace of token 0
        # (radixd.bigram_key).
        self.is_eagle = bool(params.is_eagle)
        #: Keys left uncached because radixd's namespace table was full.
        self.uncached_keys = 0
        self.sliding_window_size = None
        if backend.page_size != self.page_size:
            raise ValueError(
                f"--radix-cache-backend radixd: the daemon's page size is {backend.page_size}, "
                f"SGLang's --page-size {self.page_size}"
            )
        allocator = params.token_to_kv_pool_allocator
        if install and allocator is not None:
            allocator = install_allocator(allocator, backend)
        self.token_to_kv_pool_allocator = allocator
        dev = getattr(allocator, "device", None) if allocator is not None else None
        self.device = torch.device(dev) if isinstance(dev, (str, torch.device)) else torch.device("cpu")
        self._arange = torch.arange(self.page_size, dtype=torch.int64)
        self.root_node = RadixdNode(None, 0)
        self._empty_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._miss = MatchResult(
            device_prefix_len=0,
            last_device_node=self.root_node,
            last_host_node=self.root_node,
            best_match_node=self.root_node,
        )

    # ----- matching -----

    def reset(self) -> None:
        """Empties the cache (through a daemon: one started with
        ``--allow-reset``), as ``RadixCache.reset``."""
        self.backend.reset()

    def _key(self, key: Any, tokens: Any = None) -> tuple:
        """radixd's tokens and namespace for ``key`` (``sglang_base.cache_key``)."""
        return cache_key(key, self.is_eagle, tokens)

    def _match(self, tokens: Any, ns: Optional[str], **kw: Any) -> Any:
        try:
            return self.backend.match_prefix(tokens, ns=ns, **kw)
        except radixd.BadNamespaceError as e:
            raise _NoNamespace(str(e)) from None

    def _insert(self, tokens: Any, pages: Any, ns: Optional[str], **kw: Any) -> Any:
        try:
            return self.backend.insert(tokens, pages, ns=ns, **kw)
        except radixd.BadNamespaceError as e:
            raise _NoNamespace(str(e)) from None

    def _uncached(self, why: _NoNamespace, ns: Optional[str]) -> None:
        # A match misses, an insert keeps nothing: sglang_base.note_uncached.
        note_uncached(self, ns, why)

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """As ``RadixCache.match_prefix``: the longest cached page-aligned
        prefix of ``params.key`` (radixd cuts the key to whole pages), its
        last node (split there, LRU touched), no lock taken. With EAGLE the
        length is in bigrams (KV slots), as ``RadixCache``'s."""
        key = params.key
        if self.disable:
            return self._miss
        tokens, ns = self._key(key)
        try:
            m = self._match(tokens, ns)
        except _NoNamespace as e:
            self._uncached(e, ns)
            return self._miss
        n = m.len
        if n == 0:
            return self._miss
        node = RadixdNode(m.handle, n, m.pages, tokens, ns)
        return MatchResult(n, node, node, node)

    def touch_prefix(self, key: Any) -> None:
        """As ``RadixCache.touch_prefix``: bumps LRU recency along the cached
        path (a match whose answer is dropped)."""
        if not self.disable:
            tokens, ns = self._key(key)
            try:
                self._match(tokens, ns)
            except _NoNamespace as e:
                self._uncached(e, ns)

    def path_device_indices(self, node: RadixdNode) -> torch.Tensor:
        """KV indices from the root to ``node``, built from the pages its
        match read, once per node (SGLang: valid until the next allocation or
        eviction unless the path is locked; the scheduler locks it)."""
        if node.handle is None:
            return self._empty_indices
        ind = node._indices
        if ind is None:
            pages = _pages_tensor(node.pages)
            ps = self.page_size
            ind = pages if ps == 1 else (pages[:, None] * ps + self._arange).reshape(-1)
            ind = ind.to(self.device)
            node._indices = ind
        return ind

    def is_root(self, node: Any) -> bool:
        return node is None or node.handle is None

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list[int]:
        """``BasePrefixCache.dfs_weight_order`` (``--schedule-policy
        dfs-weight``): SGLang's order, read off the nodes' paths
        (:func:`radixd.sglang_base.dfs_weight_order`), since the tree's
        children live in the daemon."""
        return dfs_weight_order(
            [
                None if node is None or node.handle is None else (node.ns, node.tokens[: node.prefix_len])
                for node in node_handles
            ],
            self.page_size,
        )

    # ----- inserting -----

    def insert(self, params: InsertParams) -> InsertResult:
        """As ``RadixCache.insert``: caches ``params.key`` (whole pages) with
        the KV indices ``params.value`` (pages this client allocated from
        radixd); returns the prefix length already cached. radixd returns
        the pages of an already-cached prefix to the pool itself."""
        key = params.key
        if self.disable:
            return InsertResult(prefix_len=0)
        tokens, ns = self._key(key)
        n = len(tokens) // self.page_size * self.page_size
        if n == 0:
            return InsertResult(prefix_len=0)
        value = params.value
        hints = self._hints(params.priority, params.inserted_len)
        try:
            if value is None:
                return self._insert_allocating(tokens[:n], ns, hints)
            # With EAGLE the value is the raw tokens' (one index more than
            # the bigrams): the first n are the bigrams', as RadixCache
            # truncates it.
            pages = self._value_pages(value, n)
            r = self._insert(tokens[:n], pages, ns, **hints)
        except _NoNamespace as e:
            # Not cached: the pages the caller handed the tree go back to
            # the pool, as if cached and evicted at once.
            self._uncached(e, ns)
            if value is not None:
                self.backend.free(pages)
            return InsertResult(prefix_len=0)
        return InsertResult(prefix_len=r.cached, total_len=r.len)

    def _hints(self, priority: Optional[int], inserted_len: int) -> dict:
        """An insert's keywords for the eviction policy (SGLang's
        ``InsertParams.priority`` and ``inserted_len``): none under LRU."""
        return insert_hints(priority, inserted_len) if self._hinted else {}

    def _insert_allocating(self, tokens: Any, ns: Optional[str], hints: dict) -> InsertResult:
        """``insert`` without a value (``RadixCache`` then uses the token ids
        as values, for tests): pages for the uncached part come from radixd,
        the cached prefix locked meanwhile so allocating cannot evict it."""
        m = self._match(tokens, ns, lock=True)
        try:
            pages = list(m.pages)
            need = len(tokens) // self.page_size - len(pages)
            if need > 0:
                pages.extend(self.backend.alloc(need))
            r = self._insert(tokens, pages, ns, **hints)
        finally:
            if m.handle is not None:
                self.backend.unlock(m.handle)
        return InsertResult(prefix_len=r.cached, total_len=r.len)

    def _value_pages(self, value: torch.Tensor, n: int) -> Any:
        ps = self.page_size
        if len(value) < n:
            raise ValueError(f"{len(value)} KV indices for a key of {n} tokens")
        return (value[:n:ps].to("cpu", torch.int64) // ps - 1).numpy()

    def checkpoint(self, req: Any, *, up_to: int, **_: Any) -> None:
        """As ``RadixCache.checkpoint``: inserts the request's whole pages up
        to ``up_to``, points its row at the tree's pages, moves its lock to
        the node the insert ended on and advances ``cache_protected_len``.

        The insert takes the new lock in the same request (``lock=True``),
        before the old one is dropped, so no other scheduler sharing the
        daemon can evict what was just inserted in between. Pages of a prefix
        cached by someone else meanwhile go back to radixd's pool in the
        insert, so the free of ``[cache_protected_len, prefix_len)`` that
        ``RadixCache`` does here is radixd's already. ``RadixCache``'s extra
        insert at the prompt boundary (``split_prompt``, which only changes
        topology) is not needed under LRU: radixd evicts leaves page by page
        from the end, so output pages go before the prompt's anyway. Under
        another policy it is made, after the match (its pages are then the
        tree's), with the request's priority plus one, as ``RadixCache``
        makes it: the prompt's part of the path then outranks the output's
        and is a node of its own."""
        if self.disable:
            return
        kv = req.kv
        # With EAGLE: the bigrams of the tokens (one fewer), whole pages of
        # them, each bigram's KV slot its first token's (RadixCache's
        # _insert_cache with is_bigram).
        tokens, ns = self._key(req, req.full_untruncated_fill_ids[:up_to])
        ps = self.page_size
        n = len(tokens) // ps * ps
        inserted_before = kv.cache_inserted_len
        if n == 0 or n < kv.cache_protected_len:
            # Fewer whole pages than the locked prefix: only with bigram
            # keys, a request that computed nothing past its match (the
            # match's last token is no bigram's first). SGLang's scheduler
            # never checkpoints one (every request extends a token at
            # least); RadixCache would drop cache_protected_len below the
            # locked prefix and its release free slots the tree holds.
            # The prefix stays protected here.
            kv.cache_inserted_len = max(kv.cache_inserted_len, n)
            return
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
        tokens = tokens[:n]
        priority = getattr(req, "priority", None) or 0
        hints = self._hints(priority, inserted_before)
        try:
            r = self._insert(tokens, self._value_pages(row[:n], n), ns, lock=True, **hints)
        except _NoNamespace as e:
            self._uncached(e, ns)  # the row stays the request's own
            return
        kv.cache_inserted_len = max(kv.cache_inserted_len, n)
        m = self.backend.match_prefix(tokens, ns=ns)
        if self._hinted:
            # The prompt's whole pages in the key's units: with EAGLE its
            # bigrams, one fewer than its tokens (RadixCache's prompt_key).
            prompt = max(len(req.origin_input_ids) - self.is_eagle, 0) // ps * ps
            if 0 < prompt < n:
                self.backend.insert(
                    tokens[:prompt], m.pages[: prompt // ps], ns=ns, **self._hints(priority + 1, prompt)
                )
        node = RadixdNode(m.handle, m.len, m.pages, tokens, ns)
        new_indices = self.path_device_indices(node)
        start = kv.cache_protected_len
        if m.len > start:
            self.req_to_token_pool.write((kv.req_pool_idx, slice(start, m.len)), new_indices[start:])
        kv.cache_protected_len = m.len
        self.unlock(req.lock)
        req.lock = TreeLock(RadixdNode(r.handle, r.len), DecLockRefParams())
        req.last_node = node

    # Names of SGLang before ``checkpoint`` (the 0.5.23 scheduler calls
    # neither): the same work through the 0.5.23 paths.
    def cache_unfinished_req(self, req: Any, chunked: bool = False, **_: Any) -> None:
        """Caches what ``req`` has computed so far (chunked prefill): a
        ``checkpoint`` up to its committed KV."""
        self.checkpoint(req, up_to=req.kv.kv_committed_len)

    def cache_finished_req(self, req: Any, is_insert: bool = True, **_: Any) -> None:
        """Caches a finished request (``is_insert``) and releases its row,
        pages and lock: SGLang's ``release_kv_cache``."""
        from sglang.srt.mem_cache.common import release_kv_cache

        release_kv_cache(req, self, checkpoint=is_insert)

    # ----- locks -----

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        """As ``RadixCache.inc_lock_ref``: locks ``node`` and its ancestors;
        ``delta`` is the change in evictable tokens."""
        if self.disable or node is None or node.handle is None:
            return IncLockRefResult(delta=0)
        for _ in range(8):
            try:
                return IncLockRefResult(delta=self.backend._lock_delta(node.handle, True))
            except radixd.StaleHandleError:
                # Another scheduler sharing the daemon evicted the node between
                # SGLang's match and its lock (one scheduler cannot: its own
                # tree changes only under its own calls). Find the prefix
                # again; if it is all still cached, the node becomes that one
                # (the scheduler reads the path's indices only after locking).
                if node.tokens is None:
                    raise
                m = self.backend.match_prefix(node.tokens[: node.prefix_len], ns=node.ns)
                if m.len != node.prefix_len:
                    raise RuntimeError(
                        f"radixd: another scheduler evicted {node.prefix_len - m.len} tokens of a matched "
                        "prefix before this scheduler locked it"
                    ) from None
                node.handle, node.pages, node._indices = m.handle, m.pages, None
        raise RuntimeError("radixd: a matched prefix kept being evicted before it could be locked")

    def dec_lock_ref(self, node: Any, params: Optional[DecLockRefParams] = None) -> DecLockRefResult:
        """As ``RadixCache.dec_lock_ref``: the mirror of ``inc_lock_ref``."""
        if self.disable or node is None or node.handle is None:
            return DecLockRefResult(delta=0)
        return DecLockRefResult(delta=self.backend._lock_delta(node.handle, False))

    # ----- eviction and sizes -----

    def evict(self, params: EvictParams) -> EvictResult:
        """Evicts at least ``params.num_tokens`` tokens, least recently used
        unlocked leaves first. ``RadixCache`` frees whole leaves (possibly
        more than asked); radixd trims them page by page from the end, so
        it frees exactly the pages asked for (fewer only when fewer are
        evictable)."""
        n = params.num_tokens
        if self.disable or n <= 0:
            return EvictResult()
        return EvictResult(num_tokens_evicted=self.backend.evict(n))

    def _stat(self, key: str) -> int:
        return self.backend.stats()[key]

    def evictable_size(self) -> int:
        """radixd's evictable tokens (every scheduler's, through a daemon)."""
        return self._stat("evictable_tokens")

    def protected_size(self) -> int:
        return self._stat("protected_tokens")

    # FULL is radixd's only component: full_* are the same figures.
    def full_evictable_size(self) -> int:
        return self.evictable_size()

    def full_protected_size(self) -> int:
        return self.protected_size()

    def total_size(self) -> int:
        return self._stat("total_tokens")

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def pretty_print(self) -> None:
        """The tree lives in the daemon (``radixd stat`` shows it live): the
        figures, as ``RadixCache.pretty_print``'s last line."""
        s = self.backend.stats()
        print(f"#tokens: {s['total_tokens']} ({s['nodes']} nodes, {s['free_pages']} free pages, radixd)")

    # ``take_events``: BasePrefixCache's (``kv_events`` is None, so none);
    # KV events come from the daemon itself (`radixd serve --kv-events`).
    # ``release_session`` / ``release_radix_session`` / ``claim_kv_row`` /
    # ``maybe_hand_to_session`` / ``on_release``: BasePrefixCache's no-ops
    # (the factory refuses streaming and session-radix caches).
    # ``free_kv_row``: BasePrefixCache's, through the installed allocator.
    # ``evict_for_alloc``: BasePrefixCache's (forwards to ``evict``).
    # ``lock`` / ``unlock``: BasePrefixCache's, over inc/dec_lock_ref.


def _refuse(option: str, why: str) -> None:
    raise ValueError(f"--radix-cache-backend radixd does not support {option}: {why}")


def radixd_cache_factory(ctx: Any) -> Any:
    """SGLang's ``RadixCacheFactory`` for ``--radix-cache-backend radixd``:
    refuses what radixd does not support, connects to the daemon named by
    ``RADIXD_NAME`` (default ``radixd``) and builds the cache on it: a
    :class:`RadixdPrefixCache`, or, when the server turned on something
    only SGLang's ``UnifiedRadixCache`` serves (``--enable-streaming-session``),
    SGLang's own ``create_unified_radix_cache(ctx)`` on the radixd TreeCore
    (:mod:`radixd.treecore`), so ``create_tree_cache``'s checks pass."""
    params = ctx.params
    if ctx.enable_hierarchical_cache:
        _refuse("--enable-hierarchical-cache", "radixd keeps KV on the device only")
    if getattr(ctx, "is_dsa", False):
        _refuse("DSA (sparse-attention) models", "radixd caches full-attention KV only")
    if ctx.disable_radix_cache:
        _refuse("--disable-radix-cache", "drop one of the two options")
    if getattr(params, "enable_session_radix_cache", False):
        _refuse("--enable-session-radix-cache", "radixd keeps no per-session trees")
    policy, policy_config = eviction_policy(params)
    if policy not in HYBRID_POLICIES and (ctx.is_hybrid_swa or ctx.is_hybrid_ssm):
        _refuse(
            f"--radix-eviction-policy {policy} with a hybrid model",
            f"radixd's hybrid backend evicts as UnifiedRadixCache by {', '.join(HYBRID_POLICIES)} only "
            "(its twins check each); the others read hit counts and priorities a hybrid insert counts otherwise",
        )
    if params.enable_kv_cache_events:
        _refuse("--kv-events-config", "the daemon publishes KV events itself: radixd serve --kv-events ENDPOINT")
    if getattr(params, "pp_size", 1) > 1:
        _refuse(
            "--pp-size above 1",
            "pipeline stages schedule micro-batches apart, so their cache calls are not one lockstep sequence",
        )
    if getattr(params, "attn_cp_size", 1) > 1:
        _refuse("context parallelism (--attn-cp-size above 1)", "its ranks hold different tokens of each page")
    serving = _serving_args(ctx)
    if getattr(serving, "enable_dp_attention", False):
        _refuse("--enable-dp-attention", "each attention-DP rank keeps a KV pool of its own; a daemon serves one pool")
    # What only SGLang's own UnifiedRadixCache serves: that controller on
    # the radixd TreeCore (docs/sglang-parity.md, section 2).
    unified = _unified_only(ctx, serving, policy)
    name = os.environ.get("RADIXD_NAME", "radixd")
    # Tensor parallelism: the ranks of this server agree on a group and its
    # pool (collectives over SGLang's tp_cache_group, on every rank alike).
    group = tp_group(ctx)
    pool = pool_identity(ctx, group)
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        # SWA and Mamba models: radixd's components (radixd.sglang_hybrid,
        # imported here: a full-attention server never loads it); with
        # streaming sessions SGLang's own controller on the radixd TreeCore
        # over them (FULL+SWA only: _unified_only refuses Mamba).
        from .sglang_hybrid import connect_hybrid, hybrid_cache_factory

        if not unified:
            return hybrid_cache_factory(ctx, name, pool, group)
        client = connect_hybrid(ctx, name, pool, group)
        try:
            return _unified_radix_cache(ctx, client, unified)
        except BaseException:
            client.close()
            raise
    # The TreeCore answers as SGLang's unified tree, whose fifo/filo keep a
    # split's creation: radixd's --recency exact (sglang_base.unified_recency).
    recency = unified_recency(policy) if unified else SGLANG_RECENCY
    client = _connect(ctx, name, pool, group, policy, policy_config, recency)
    try:
        if unified:
            return _unified_radix_cache(ctx, client, unified)
        return RadixdPrefixCache(params, client)
    except BaseException:
        client.close()  # releases the binding at once
        raise


#: The SGLang whose internal TreeCore interface the radixd TreeCore
#: implements (it changes between releases: docs/sglang-parity.md, "Risks").
TREECORE_SGLANG = "0.5.23"


def _unified_only(ctx: Any, serving: Any, policy: str) -> Optional[str]:
    """The option this server turned on that only SGLang's
    ``UnifiedRadixCache`` serves (``create_tree_cache`` checks the cache's
    class): ``--enable-streaming-session``, or ``--radix-eviction-policy
    tlru`` (T-LRU's bookkeeping lives on the unified tree only); or
    ``None``. With one, the factory returns that cache on the radixd
    TreeCore, which serves every eviction policy and EAGLE. Refuses, by
    name, what the TreeCore does not serve yet beside it."""
    if getattr(serving, "enable_streaming_session", False):
        option = "--enable-streaming-session"
    elif policy == "tlru":
        option = "--radix-eviction-policy tlru"
    else:
        return None
    import sglang

    version = getattr(sglang, "__version__", "unknown")
    if version != TREECORE_SGLANG:
        _refuse(option, f"the radixd TreeCore implements SGLang {TREECORE_SGLANG}'s TreeCore interface, not {version}")
    if ctx.is_hybrid_ssm:
        _refuse(f"{option} with a Mamba model", "the radixd TreeCore serves full-attention and FULL+SWA models only")
    return option


def _unified_radix_cache(ctx: Any, client: Any, option: str) -> Any:
    """SGLang's own ``create_unified_radix_cache(ctx)`` on the radixd TreeCore:
    radixd's pool installed in the allocator, the core registered and
    chosen for this cache only (``params.tree_core_backend``, not the
    process-wide variable), the connection filed under ``ctx.params``."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    from . import treecore

    params = ctx.params
    if ctx.is_hybrid_swa:
        from .sglang_hybrid import install_swa_allocator

        # FULL pages and their SWA peers from radixd's paired pools.
        install_swa_allocator(params.token_to_kv_pool_allocator, client)
    else:
        install_allocator(params.token_to_kv_pool_allocator, client)
    treecore.register()
    params.tree_core_backend = treecore.BACKEND_NAME
    treecore.file_backend(params, client)
    try:
        cache = create_unified_radix_cache(ctx)
    finally:
        treecore._PENDING.pop(id(params), None)
    logger.info("radixd: %s: SGLang's UnifiedRadixCache on the radixd TreeCore", option)
    return cache


def _connect(
    ctx: Any, name: str, pool: dict, group: Any, policy: str, policy_config: dict, recency: str = SGLANG_RECENCY
) -> Any:
    """The daemon ``name``'s client for this scheduler, bound to its pool
    (and a rank of ``group``), checked: full-attention components, the
    server's eviction policy, the recency rule SGLang's answers need
    (``recency``; a warning)."""
    params = ctx.params
    try:
        client = radixd.Client(name, pool=pool, group=group and group.join_args())
    except radixd.PoolMismatchError as e:
        raise radixd.PoolMismatchError(
            f"--radix-cache-backend radixd: daemon {name!r} refused this scheduler's KV pool: {e.message} "
            f"(this scheduler's KV pool: {_canonical(pool)})"
        ) from None
    except radixd.DaemonGoneError as e:
        num_pages = params.token_to_kv_pool_allocator.size // params.page_size
        raise RuntimeError(
            f"--radix-cache-backend radixd: no radixd daemon named {name!r} ({e}). Start one first: "
            f"`radixd serve --name {name} --page-size {params.page_size} --capacity {num_pages} --recency {recency}"
            f"{policy_flags(policy, policy_config)}`, "
            "or set RADIXD_NAME to the name of the running one"
        ) from e
    if client.components != "full":
        client.close()
        _refuse(
            f"a daemon started with --components {client.components}",
            "this model is full-attention only: its matches must not be cut back by a second component",
        )
    try:
        check_eviction_policy(client, name, policy, policy_config)
    except BaseException:
        client.close()
        raise
    logger.info(
        "radixd: connected to %r (page size %d, %d pages, recency %s, eviction policy %s), its pool bound to %s%s",
        name, client.page_size, client.capacity, client.recency, client.eviction_policy, client.pool,
        "" if group is None else f", rank {group.rank} of {group.size} of group {group.key}",
    )
    check_recency(client, name, recency)
    return client


#: Env var naming the KV buffer when processes that are not one server map
#: one buffer (CUDA IPC, a shared file): each sets the same name, and it
#: stands in the identity for the server's address.
POOL_ENV = "RADIXD_POOL"


def _value(v: Any) -> str:
    """``v`` as a pool identity value: printable ASCII without ``;``,
    other characters replaced by ``_``, at most 200 characters."""
    text = "".join(c if " " <= c <= "~" and c != ";" else "_" for c in str(v))[:200]
    return text or "_"


def _canonical(pool: dict) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(pool.items()))


class TpGroup:
    """This scheduler's place among the tensor-parallel ranks of its
    server: ``key`` (the group's, the same on every rank and unique to this
    server's run), ``rank``, ``size``, and ``ranks`` (every rank's device
    keys, in rank order, for the pool identity)."""

    __slots__ = ("key", "rank", "size", "ranks")

    def __init__(self, key: str, rank: int, size: int, ranks: list):
        self.key, self.rank, self.size, self.ranks = key, rank, size, ranks

    def join_args(self) -> tuple:
        return (self.key, self.rank, self.size)

    def __repr__(self) -> str:
        return f"TpGroup({self.key!r}, rank={self.rank}, size={self.size})"


def tp_group(ctx: Any) -> Optional[TpGroup]:
    """The tensor-parallel group of this scheduler, from SGLang's
    ``CacheInitParams.tp_cache_group`` (a ``torch.distributed`` group;
    ``TreeCacheBuildContext.tp_group`` when it is unset): ``None`` for one
    rank. A collective: every rank of the group calls it at the same point
    (SGLang builds its tree cache on every rank alike). Rank 0 draws the
    group's key (the server's address and a random part, so a restarted
    server is a new group) and broadcasts it; every rank's device keys are
    gathered for the group's pool identity."""
    group = getattr(ctx.params, "tp_cache_group", None)
    if group is None:
        group = getattr(ctx, "tp_group", None)
        group = getattr(group, "cpu_group", group)
    import torch.distributed as dist

    if group is None or not dist.is_available() or not dist.is_initialized():
        if getattr(ctx, "tp_size", 1) > 1:
            _refuse("--tp-size above 1 without a tensor-parallel process group", "its ranks cannot agree on a group")
        return None
    size = dist.get_world_size(group)
    if size == 1:
        return None
    rank = dist.get_rank(group)
    serving = _serving_args(ctx)
    key = [f"{getattr(serving, 'host', None)}:{getattr(serving, 'port', None)}/{uuid.uuid4().hex}" if rank == 0 else None]
    dist.broadcast_object_list(key, group=group, group_src=0)
    allocator = ctx.params.token_to_kv_pool_allocator
    mine = _rank_keys(getattr(allocator, "device", "cpu") if allocator is not None else "cpu")
    ranks: list = [None] * size
    dist.all_gather_object(ranks, mine, group=group)
    return TpGroup(str(key[0]), rank, size, ranks)


def pool_identity(ctx: Any, group: Optional[TpGroup] = None) -> dict:
    """Which KV buffer this scheduler's pages index, for the daemon's pool
    binding (docs/protocol.md, "One daemon, one KV pool"):

    - ``device`` (the KV pool's torch device) and, on CUDA, ``uuid`` (the
      GPU's, from ``torch.cuda.get_device_properties``);
    - the pool's geometry: ``page_size``, ``pages``, ``dtype`` and, where
      the allocator has its KV pool, ``layers``, ``heads``, ``head_dim``,
      ``v_head_dim`` (MHA) or ``kv_lora_rank``, ``qk_rope_head_dim`` (MLA);
    - whose buffer it is: ``server`` (the server's ``host:port``, so two
      servers on one node never bind one pool), or ``buffer`` from
      ``RADIXD_POOL`` when it is set: processes that truly map one buffer
      without being one server set the same name in each.

    Two schedulers that map one buffer derive the same identity and share
    the binding; any other pair differs in something and the second is
    refused at start-up. The ranks of one tensor-parallel server (``group``,
    :func:`tp_group`) bind as one server: each rank's pool holds its shard
    of the same page ids, so instead of one rank's device the identity
    names ``tp`` (the group's size) and ``ranks`` (a digest of every rank's
    device keys, in rank order).
    """
    params = ctx.params
    allocator = params.token_to_kv_pool_allocator
    ps = params.page_size
    pool: dict = {"page_size": ps}
    if allocator is not None:
        pool["pages"] = allocator.size // ps
        pool["dtype"] = str(getattr(allocator, "dtype", "unknown")).replace("torch.", "")
        if group is None:
            pool.update(_rank_keys(getattr(allocator, "device", "cpu")))
        else:
            pool["tp"] = group.size
            every = "|".join(_canonical(r) for r in group.ranks)
            pool["ranks"] = hashlib.sha256(every.encode()).hexdigest()[:32]
        kv = allocator.get_kvcache() if hasattr(allocator, "get_kvcache") else None
        for attr, key in (
            ("layer_num", "layers"),
            ("head_num", "heads"),
            ("head_dim", "head_dim"),
            ("v_head_dim", "v_head_dim"),
            ("kv_lora_rank", "kv_lora_rank"),
            ("qk_rope_head_dim", "qk_rope_head_dim"),
        ):
            if isinstance(getattr(kv, attr, None), int):
                pool[key] = getattr(kv, attr)
    named = os.environ.get(POOL_ENV)
    if named:
        pool["buffer"] = named
    else:
        serving = _serving_args(ctx)
        pool["server"] = f"{getattr(serving, 'host', None)}:{getattr(serving, 'port', None)}"
    return {k: _value(v) for k, v in pool.items()}


def _rank_keys(device: Any) -> dict:
    """The keys naming the device this rank's KV pool lives on: the torch
    device and, on CUDA, the GPU's UUID (indices are per process, UUIDs per
    machine). A tensor-parallel rank's are gathered into its group's
    identity (:func:`tp_group`)."""
    dev = torch.device(device) if isinstance(device, (str, torch.device)) else torch.device("cpu")
    keys = {"device": str(dev)}
    if dev.type == "cuda":
        try:
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        except Exception:  # no CUDA runtime to ask: the index must do
            uuid = None
        if uuid is not None:
            keys["uuid"] = str(uuid)
    return keys


def _serving_args(ctx: Any) -> Any:
    try:
        from sglang.srt.runtime_context import get_serving

        return get_serving()
    except Exception:  # no runtime context (tests building the cache by hand)
        return ctx.server_args


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: registers the ``radixd``
    radix-cache backend (once per process; SGLang may load plugins again)."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, radixd_cache_factory)


__all__ = [
    "RadixdPrefixCache",
    "RadixdNode",
    "RadixdAllocatorMixin",
    "install_allocator",
    "pool_identity",
    "tp_group",
    "TpGroup",
    "radixd_cache_factory",
    "check_recency",
    "SGLANG_RECENCY",
    "register",
]
