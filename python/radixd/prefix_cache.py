"""``PrefixCache``: SGLang's ``RadixCache`` surface over a radixd ``Client``
(a shared daemon) or ``Engine`` (in-process), for a scheduler to swap in.

The reference is SGLang 0.5.23's ``python/sglang/srt/mem_cache/radix_cache.py``
(``RadixCache``: ``match_prefix``, ``insert``, ``inc_lock_ref``,
``dec_lock_ref``, ``evict``, ``evictable_size``, ``protected_size``,
``total_size``, ``reset``, ``cache_finished_req``, ``cache_unfinished_req``)
and ``python/sglang/srt/mem_cache/base_prefix_cache.py`` (``MatchResult``,
``MatchPrefixParams``, ``InsertParams``, ``EvictParams``), as checked in
sgl-project/sglang. Where the two differ by design:

- KV indices are per token, as SGLang's paged allocator lays them out: page
  ``p`` covers indices ``p*P .. p*P+P-1``. radixd caches whole pages, so a
  key is cut to a multiple of ``P`` (as SGLang does for ``page_size > 1``)
  and a value gives one page per ``P`` indices (``value[i*P] // P``).
- Pages belong to radixd's pool: a value passed to ``insert`` must hold pages
  this client allocated (``alloc_indices``); with ``value=None`` the cache
  allocates them itself. Pages of an already-cached prefix that ``insert``
  is given again are returned to the pool by radixd at once, so
  ``cache_*_req`` do not free those duplicates as SGLang's do.
- ``inc_lock_ref`` / ``dec_lock_ref`` return SGLang's delta (the change in
  evictable tokens: ``-k`` when ``k`` tokens became protected), measured as
  protected tokens before minus after, in the same round trip as the lock.
  Through a daemon shared by several schedulers it includes what others
  changed in between (rarely anything: the three requests travel together).
- Hybrid models (a backend with ``components`` ``"full,swa"`` or
  ``"full,mamba"``): a match carries SGLang's hybrid ``MatchResult`` fields
  (``full_kv_hit_length``, ``swa_branching_seqlen``,
  ``mamba_branching_seqlen``, computed as ``unified_cache/components``'
  ``finalize_match_result_in_tree_core`` does; the host hit lengths are 0,
  radixd has no host tier) and ``mamba_state``, the state slot the match
  ends at (SGLang copies it into the request's own slot; radixd's caller
  does that with a slot from ``alloc_state``). ``insert`` takes
  ``mamba_state`` and ``swa_evicted`` (or an ``InsertParams``'
  ``mamba_value`` and SWA ``component_evicted_seqlens``).
- Namespaces: a ``RadixKey``'s ``extra_key`` (a LoRA adapter) and
  ``cache_salt`` (a tenant) put it in a radixd namespace
  (:func:`namespace_of`), whose prefixes no other namespace matches, as
  SGLang's tree keeps them apart; a plain token list takes ``ns=``.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from typing import Any, NamedTuple, Optional, Sequence, Tuple

try:  # numpy is optional: indices come out as numpy arrays when it is there
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only without numpy
    _np = None


class TreeNode:
    """A node of the radixd tree as a scheduler holds it (``req.last_node``).

    ``handle`` is radixd's node handle (``None`` for the root, which every
    empty match returns, as SGLang's ``root_node``); ``prefix_len`` the tokens
    from the root to this node.
    """

    __slots__ = ("handle", "prefix_len")

    def __init__(self, handle: Optional[int], prefix_len: int = 0):
        self.handle = handle
        self.prefix_len = prefix_len

    @property
    def id(self) -> int:
        return 0 if self.handle is None else self.handle

    def is_root(self) -> bool:
        return self.handle is None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeNode) and other.handle == self.handle

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        if self.handle is None:
            return "TreeNode(root)"
        return f"TreeNode(handle={self.handle:#x}, prefix_len={self.prefix_len})"


class PrefixMatch(NamedTuple):
    """What ``PrefixCache.match_prefix`` found, shaped as SGLang's
    ``MatchResult`` (``device_indices``, ``last_device_node``,
    ``last_host_node``, ``best_match_node``, ``host_hit_length``) plus
    ``device_prefix_len``, the matched length in tokens, and the hybrid
    fields of SGLang's ``MatchResult`` by name (``full_kv_hit_length``: the
    tokens FULL alone matched, ``device_prefix_len`` on a full-only
    backend) and ``mamba_state``."""

    device_indices: Any
    last_device_node: TreeNode
    last_host_node: TreeNode
    best_match_node: TreeNode
    host_hit_length: int = 0
    device_prefix_len: int = 0
    swa_host_hit_length: int = 0
    swa_branching_seqlen: Optional[int] = None
    mamba_host_hit_length: int = 0
    mamba_branching_seqlen: Optional[int] = None
    full_kv_hit_length: int = 0
    mamba_state: Optional[int] = None


def _token_ids(key: Any) -> Any:
    """Token ids of a list/buffer, a ``RadixKey`` (``.token_ids``) or a
    ``MatchPrefixParams``/``InsertParams`` (``.key``)."""
    if isinstance(key, (list, tuple, array)):
        return key
    inner = getattr(key, "key", None)
    if inner is not None and not callable(inner):
        key = inner
    tokens = getattr(key, "token_ids", None)
    if tokens is None:
        return key
    return tokens


#: Longest namespace name radixd takes, in bytes (UTF-8).
MAX_NAMESPACE_LEN = 256


def namespace_of(key: Any) -> Optional[str]:
    """The radixd namespace of an SGLang key (a ``RadixKey``, a
    ``MatchPrefixParams``/``InsertParams`` or a ``Req``): ``None`` (the
    default namespace) without ``extra_key`` and ``cache_salt``, else one
    name per pair, as SGLang's ``RadixKey.child_key_at`` keeps one disjoint
    subtree per ``(extra_key, cache_salt)``: the JSON
    ``[extra_key, cache_salt]`` (``["sql-lora",null]``), or
    ``sha256:<hex>`` of it where that is longer than radixd's 256 bytes. An
    empty ``cache_salt`` is none (as ``RadixKey`` has it); an empty
    ``extra_key`` is a namespace of its own (as ``child_key_at`` has it)."""
    inner = getattr(key, "key", None)
    if inner is not None and not callable(inner) and hasattr(inner, "token_ids"):
        key = inner
    extra = getattr(key, "extra_key", None)
    salt = getattr(key, "cache_salt", None) or None
    if extra is None and salt is None:
        return None
    name = json.dumps([extra, salt], ensure_ascii=False, separators=(",", ":"), default=repr)
    if len(name.encode()) > MAX_NAMESPACE_LEN:
        name = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    return name


#: How the names of :func:`bigram_namespace` begin. ``namespace_of``'s
#: names begin with ``[`` (JSON) or ``sha256:``, so none is one of these.
BIGRAM_PREFIX = "bigram:"


def bigram_namespace(ns: Optional[str], first: int) -> str:
    """The radixd namespace of EAGLE's bigram keys that begin with raw token
    ``first`` in namespace ``ns`` (``namespace_of``'s, ``None`` the
    default): ``bigram:<first>``, or ``bigram:<first>:<ns>``; ``sha256:``
    of that where it is longer than radixd's 256 bytes. Injective: the
    token is digits up to the first ``:`` after the prefix, the rest is
    ``ns`` whole; a hashed name hashes a preimage that begins with
    ``bigram:``, where ``namespace_of`` hashes one that begins with ``[``."""
    name = f"{BIGRAM_PREFIX}{int(first)}" if ns is None else f"{BIGRAM_PREFIX}{int(first)}:{ns}"
    if len(name.encode()) > MAX_NAMESPACE_LEN:
        name = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    return name


def bigram_key(tokens: Any, ns: Optional[str]) -> Tuple[Any, Optional[str]]:
    """SGLang's bigram key (``RadixKey(is_bigram=True)``: ``N + 1`` raw
    tokens are ``N`` bigrams, bigram ``i`` the pair ``(t[i], t[i+1])`` whose
    KV slot is position ``i``'s) as a radixd key: raw tokens ``1..N`` in
    :func:`bigram_namespace` ``(ns, t[0])``. Returns ``(tokens, namespace)``;
    an empty key (fewer than 2 raw tokens) is ``(tokens[:0], ns)``.

    Exact: radixd token ``j`` stands for bigram ``j`` and so for KV slot
    ``j``; the first ``k`` radixd tokens of two keys agree in one namespace
    exactly when their raw tokens agree in the first ``k + 1`` (token 0 by
    the namespace, tokens ``1..k`` by the key), which is when their first
    ``k`` bigrams agree. So radixd's page-aligned longest match is SGLang's
    (``k`` pages shared exactly when the first ``kP + 1`` raw tokens are),
    and every size counts the same slots."""
    if len(tokens) < 2:
        return tokens[:0], ns
    return tokens[1:], bigram_namespace(ns, tokens[0])


def _ns(key: Any, ns: Optional[str]) -> Optional[str]:
    """``ns`` if given, else the key's own namespace."""
    return ns if ns is not None else namespace_of(key)


def _slot(value: Any) -> Optional[int]:
    """A state slot from an int or a one-element tensor/array (SGLang's
    ``mamba_value``)."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    flat = value.reshape(-1) if hasattr(value, "reshape") else list(value)
    if len(flat) != 1:
        raise ValueError(f"mamba_value must hold one state slot, not {len(flat)}")
    return int(flat[0])


def _swa_evicted_seqlen(params: Any) -> int:
    """The SWA entry of an ``InsertParams``' ``component_evicted_seqlens``
    (keyed by SGLang's ``ComponentType``), 0 without one."""
    seqlens = getattr(params, "component_evicted_seqlens", None) or {}
    for component, n in seqlens.items():
        if str(getattr(component, "name", component)).upper().endswith("SWA"):
            return int(n)
    return 0


def _aligned(tokens: Any, page_size: int) -> Any:
    n = len(tokens) // page_size * page_size
    return tokens if n == len(tokens) else tokens[:n]


def _empty_indices() -> Any:
    if _np is not None:
        return _np.empty(0, dtype=_np.int64)
    return array("q")


def pages_to_indices(pages: Any, page_size: int, length: Optional[int] = None) -> Any:
    """Per-token KV indices of ``pages`` (page ``p`` covers ``p*P .. p*P+P-1``),
    the first ``length`` of them (all by default)."""
    if _np is not None:
        p = _np.frombuffer(pages, dtype=_np.uint32) if isinstance(pages, array) else _np.asarray(pages)
        out = (p.astype(_np.int64)[:, None] * page_size + _np.arange(page_size, dtype=_np.int64)).ravel()
    else:
        out = array("q", (q * page_size + i for q in pages for i in range(page_size)))
    return out if length is None else out[:length]


def indices_to_pages(indices: Any, page_size: int, length: Optional[int] = None) -> Any:
    """The page of each whole page of per-token ``indices`` (``indices[i*P] // P``)."""
    if length is None:
        length = len(indices) // page_size * page_size
    if len(indices) < length:
        raise ValueError(f"{len(indices)} KV indices for a key of {length} tokens")
    if _np is not None:
        v = _np.asarray(indices)
        return (v[:length:page_size] // page_size).astype(_np.int64)
    return [int(v) // page_size for v in list(indices)[:length:page_size]]


class PrefixCache:
    """SGLang's ``RadixCache`` over a radixd ``Client`` or ``Engine``.

    >>> cache = PrefixCache(radixd.Engine(page_size=16, capacity=4096))
    >>> kv = cache.alloc_indices(40)
    >>> cache.insert(list(range(40)), kv)   # 32 tokens cached (2 pages)
    0
    >>> cache.match_prefix(list(range(40))).device_prefix_len
    32
    """

    def __init__(
        self,
        backend: Any,
        page_size: Optional[int] = None,
        disable: bool = False,
        mamba_checkpoint_grid: Optional[int] = None,
    ):
        self.backend = backend
        self.page_size: int = backend.page_size
        if page_size is not None and page_size != self.page_size:
            raise ValueError(f"page_size {page_size} differs from the backend's {self.page_size}")
        self.disable = disable
        self.root_node = TreeNode(None, 0)
        #: ``"full"``, ``"full,swa"`` or ``"full,mamba"``.
        self.components: str = getattr(backend, "components", "full")
        #: Where a new Mamba state may be checkpointed (SGLang's
        #: ``mamba_checkpoint_grid``; a page by default).
        self.mamba_checkpoint_grid: int = mamba_checkpoint_grid or self.page_size
        if self.mamba_checkpoint_grid <= 0:
            raise ValueError("mamba_checkpoint_grid must be positive")

    # ----- SGLang's public API -----

    def reset(self) -> None:
        """Empties the cache (through a daemon: one that allows it)."""
        self.backend.reset()

    def match_prefix(self, key: Any, ns: Optional[str] = None, **_: Any) -> PrefixMatch:
        """The longest cached prefix of ``key`` (token ids, a ``RadixKey`` or a
        ``MatchPrefixParams``): ``device_prefix_len``, ``device_indices`` and
        ``last_device_node`` (the root when nothing matched). Takes no lock.
        In namespace ``ns``, or the key's own (:func:`namespace_of`)."""
        tokens = _token_ids(key)
        if self.disable or len(tokens) < self.page_size:
            return self._miss()
        r = self.backend.match_prefix(_aligned(tokens, self.page_size), ns=_ns(key, ns))
        hybrid = self._hybrid(r)
        if r.handle is None or r.len == 0:
            return self._miss(**hybrid)
        node = TreeNode(r.handle, r.len)
        return PrefixMatch(
            device_indices=pages_to_indices(r.pages, self.page_size),
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
            device_prefix_len=r.len,
            **hybrid,
        )

    def _hybrid(self, r: Any) -> dict:
        """The hybrid fields of a match answered ``r``: the branching points
        are where FULL reaches past what the component serves (SGLang's
        ``finalize_match_result_in_tree_core``)."""
        full = getattr(r, "full_kv_hit_length", r.len)
        out = {"full_kv_hit_length": full, "mamba_state": getattr(r, "mamba_state", None)}
        if "swa" in self.components:
            aligned = full // self.page_size * self.page_size
            out["swa_branching_seqlen"] = aligned if aligned > r.len else None
        if "mamba" in self.components:
            grid = self.mamba_checkpoint_grid
            aligned = full // grid * grid
            out["mamba_branching_seqlen"] = aligned if aligned > r.len else None
        return out

    def _miss(self, **hybrid: Any) -> PrefixMatch:
        root = self.root_node
        return PrefixMatch(_empty_indices(), root, root, root, 0, 0, **hybrid)

    def insert(
        self,
        key: Any,
        value: Any = None,
        mamba_state: Optional[int] = None,
        swa_evicted: int = 0,
        ns: Optional[str] = None,
        **_: Any,
    ) -> int:
        """Caches ``key`` (cut to whole pages) with per-token KV indices
        ``value``; returns the prefix length that was already cached (SGLang's
        ``prefix_len``). With ``value=None`` pages are allocated here.
        Hybrid backends: ``mamba_state`` (a slot from ``alloc_state``) is
        checkpointed at the key's end (freed here when the node has one
        already, as SGLang frees it), ``swa_evicted`` names the leading
        tokens whose SWA pages ``free_swa`` freed; an ``InsertParams`` key
        gives them as ``mamba_value`` and its SWA evicted seqlen. In
        namespace ``ns``, or the key's own (:func:`namespace_of`)."""
        if self.disable:
            return 0
        ns = _ns(key, ns)
        if not isinstance(key, (list, tuple, array)):
            if value is None:
                value = getattr(key, "value", None)
            if mamba_state is None:
                mamba_state = _slot(getattr(key, "mamba_value", None))
            if not swa_evicted:
                swa_evicted = _swa_evicted_seqlen(key)
        tokens = _aligned(_token_ids(key), self.page_size)
        if len(tokens) == 0:
            return 0
        extra: dict = {"ns": ns}
        if mamba_state is not None:
            extra["mamba_state"] = mamba_state
        if swa_evicted:
            extra["swa_evicted"] = swa_evicted
        if value is None:
            return self._insert_allocating(tokens, extra)
        pages = indices_to_pages(value, self.page_size, len(tokens))
        return self._settle(self.backend.insert(tokens, pages, **extra), mamba_state)

    def _settle(self, result: Any, mamba_state: Optional[int]) -> int:
        # The key's node held a state already (SGLang's mamba_exist): the
        # one given is not cached, and is freed as SGLang's
        # cleanup_after_caching_req frees it.
        if mamba_state is not None and getattr(result, "mamba_exist", False):
            self.backend.free_state(mamba_state)
        return result.cached

    def _insert_allocating(self, tokens: Any, extra: Optional[dict] = None) -> int:
        # Lock what is cached, so allocating cannot evict it under us.
        extra = extra or {}
        m = self.backend.match_prefix(tokens, lock=True, ns=extra.get("ns"))
        try:
            need = len(tokens) // self.page_size - len(m.pages)
            pages = list(m.pages)
            if need > 0:
                pages.extend(self.backend.alloc(need))
            return self._settle(self.backend.insert(tokens, pages, **extra), extra.get("mamba_state"))
        finally:
            if m.handle is not None:
                self.backend.unlock(m.handle)

    def inc_lock_ref(self, node: Optional[TreeNode]) -> int:
        """Locks ``node`` and its ancestors; returns the change in evictable
        tokens (``-k`` when ``k`` tokens became protected), as SGLang."""
        if self.disable or node is None or node.handle is None:
            return 0
        return self.backend._lock_delta(node.handle, True)

    def dec_lock_ref(self, node: Optional[TreeNode], *_: Any, **__: Any) -> int:
        """Unlocks ``node``; returns the change in evictable tokens."""
        if self.disable or node is None or node.handle is None:
            return 0
        return self.backend._lock_delta(node.handle, False)

    def evict(self, num_tokens: Any) -> Any:
        """Evicts at least ``num_tokens`` tokens (or an ``EvictParams``), LRU
        leaves first; returns the tokens evicted. An ``EvictParams`` with
        ``swa_num_tokens`` or ``mamba_num`` (a hybrid backend) evicts those
        too and returns the backend's ``EvictResult``
        (``.evicted``, ``.swa_evicted``, ``.mamba_evicted``)."""
        n = getattr(num_tokens, "num_tokens", num_tokens)
        swa = getattr(num_tokens, "swa_num_tokens", 0) or 0
        mamba = getattr(num_tokens, "mamba_num", 0) or 0
        if self.disable or (n <= 0 and swa <= 0 and mamba <= 0):
            return 0
        if swa > 0 or mamba > 0:
            return self.backend.evict(max(n, 0), swa_tokens=swa, mamba_states=mamba)
        return self.backend.evict(n)

    def evictable_size(self) -> int:
        return self.backend.stats()["evictable_tokens"]

    # SGLang's UnifiedRadixCache size accessors, per component (0 for one
    # the backend was not started with).
    def full_evictable_size(self) -> int:
        return self.backend.stats()["evictable_tokens"]

    def full_protected_size(self) -> int:
        return self.backend.stats()["protected_tokens"]

    def swa_evictable_size(self) -> int:
        return self.backend.stats().get("swa_evictable_tokens", 0)

    def swa_protected_size(self) -> int:
        return self.backend.stats().get("swa_protected_tokens", 0)

    def mamba_evictable_size(self) -> int:
        return self.backend.stats().get("mamba_evictable_states", 0)

    def mamba_protected_size(self) -> int:
        return self.backend.stats().get("mamba_protected_states", 0)

    def protected_size(self) -> int:
        return self.backend.stats()["protected_tokens"]

    def total_size(self) -> int:
        return self.backend.stats()["total_tokens"]

    def validate(self) -> None:
        """radixd's invariant checker (raises ``InvariantError``)."""
        self.backend.validate()

    # ----- requests: token ids and KV indices instead of SGLang's Req -----

    def alloc_indices(self, num_tokens: int) -> Any:
        """Per-token KV indices for ``num_tokens`` tokens on fresh pages
        (``ceil(num_tokens / P)`` pages owned by this client)."""
        pages = self.backend.alloc(-(-num_tokens // self.page_size))
        return pages_to_indices(pages, self.page_size, num_tokens)

    def free_indices(self, indices: Any) -> None:
        """Returns the pages of ``indices`` (owned, not cached) to the pool."""
        if len(indices) == 0:
            return
        if _np is not None:
            pages = _np.unique(_np.asarray(indices) // self.page_size)
        else:
            pages = sorted({int(i) // self.page_size for i in indices})
        self.backend.free(pages)

    def cache_finished_req(
        self,
        token_ids: Sequence[int],
        kv_indices: Any,
        last_node: Optional[TreeNode] = None,
        cache_protected_len: int = 0,
        is_insert: bool = True,
        ns: Optional[str] = None,
    ) -> int:
        """A finished request: caches its whole pages (``is_insert``), frees
        the pages not cached (the partial tail page; without ``is_insert``
        everything past ``cache_protected_len``) and unlocks ``last_node``.
        Returns the prefix length that was already cached."""
        n = len(token_ids)
        aligned = n // self.page_size * self.page_size
        prefix_len = 0
        if self.disable:
            self.free_indices(kv_indices[cache_protected_len:n])
        elif is_insert:
            prefix_len = self.insert(token_ids[:aligned], kv_indices[:aligned], ns=ns)
            self.free_indices(kv_indices[aligned:n])
        else:
            self.free_indices(kv_indices[cache_protected_len:n])
        self.dec_lock_ref(last_node)
        return prefix_len

    def cache_unfinished_req(
        self,
        token_ids: Sequence[int],
        kv_indices: Any,
        last_node: Optional[TreeNode] = None,
        ns: Optional[str] = None,
    ) -> Tuple[Any, TreeNode]:
        """A request that goes on (chunked prefill, decode): caches its whole
        pages, locks the new last node before unlocking ``last_node``, and
        returns ``(prefix_indices, new_last_node)``: the cached indices
        followed by the request's own indices past them (its partial page)."""
        n = len(token_ids)
        aligned = n // self.page_size * self.page_size
        if self.disable or aligned == 0:
            return kv_indices[:n], last_node or self.root_node
        self.insert(token_ids[:aligned], kv_indices[:aligned], ns=ns)
        m = self.match_prefix(token_ids[:aligned], ns=ns)
        self.inc_lock_ref(m.last_device_node)
        self.dec_lock_ref(last_node)
        new = m.device_indices
        if len(new) < n:
            tail = kv_indices[len(new):n]
            if _np is not None:
                new = _np.concatenate([new, _np.asarray(tail, dtype=_np.int64)])
            else:
                new = array("q", list(new) + [int(i) for i in tail])
        return new, m.last_device_node

    def pretty_print(self) -> None:
        s = self.backend.stats()
        print(f"#tokens: {s['total_tokens']} ({s['nodes']} nodes)")


__all__ = [
    "PrefixCache",
    "PrefixMatch",
    "TreeNode",
    "pages_to_indices",
    "indices_to_pages",
    "namespace_of",
    "bigram_namespace",
    "bigram_key",
]
