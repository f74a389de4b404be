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
"""

from __future__ import annotations

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
    ``device_prefix_len``, the matched length in tokens."""

    device_indices: Any
    last_device_node: TreeNode
    last_host_node: TreeNode
    best_match_node: TreeNode
    host_hit_length: int = 0
    device_prefix_len: int = 0


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
    if getattr(key, "extra_key", None) is not None:
        # SGLang keeps keys of different extra_key (LoRA id, cache salt)
        # apart; one radixd tree has no such namespaces, and sharing KV
        # across them would be wrong, so refuse rather than mix them.
        raise ValueError(f"radixd keeps no extra_key namespaces (got extra_key={key.extra_key!r})")
    return tokens


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

    def __init__(self, backend: Any, page_size: Optional[int] = None, disable: bool = False):
        self.backend = backend
        self.page_size: int = backend.page_size
        if page_size is not None and page_size != self.page_size:
            raise ValueError(f"page_size {page_size} differs from the backend's {self.page_size}")
        self.disable = disable
        self.root_node = TreeNode(None, 0)

    # ----- SGLang's public API -----

    def reset(self) -> None:
        """Empties the cache (through a daemon: one that allows it)."""
        self.backend.reset()

    def match_prefix(self, key: Any, **_: Any) -> PrefixMatch:
        """The longest cached prefix of ``key`` (token ids, a ``RadixKey`` or a
        ``MatchPrefixParams``): ``device_prefix_len``, ``device_indices`` and
        ``last_device_node`` (the root when nothing matched). Takes no lock."""
        tokens = _token_ids(key)
        if self.disable or len(tokens) < self.page_size:
            return self._miss()
        r = self.backend.match_prefix(_aligned(tokens, self.page_size))
        if r.handle is None or r.len == 0:
            return self._miss()
        node = TreeNode(r.handle, r.len)
        return PrefixMatch(
            device_indices=pages_to_indices(r.pages, self.page_size),
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
            device_prefix_len=r.len,
        )

    def _miss(self) -> PrefixMatch:
        root = self.root_node
        return PrefixMatch(_empty_indices(), root, root, root, 0, 0)

    def insert(self, key: Any, value: Any = None, **_: Any) -> int:
        """Caches ``key`` (cut to whole pages) with per-token KV indices
        ``value``; returns the prefix length that was already cached (SGLang's
        ``prefix_len``). With ``value=None`` pages are allocated here."""
        if self.disable:
            return 0
        if value is None and not isinstance(key, (list, tuple, array)):
            value = getattr(key, "value", None)
        tokens = _aligned(_token_ids(key), self.page_size)
        if len(tokens) == 0:
            return 0
        if value is None:
            return self._insert_allocating(tokens)
        pages = indices_to_pages(value, self.page_size, len(tokens))
        return self.backend.insert(tokens, pages).cached

    def _insert_allocating(self, tokens: Any) -> int:
        # Lock what is cached, so allocating cannot evict it under us.
        m = self.backend.match_prefix(tokens, lock=True)
        try:
            need = len(tokens) // self.page_size - len(m.pages)
            pages = list(m.pages)
            if need > 0:
                pages.extend(self.backend.alloc(need))
            return self.backend.insert(tokens, pages).cached
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

    def evict(self, num_tokens: Any) -> int:
        """Evicts at least ``num_tokens`` tokens (or an ``EvictParams``), LRU
        leaves first; returns the tokens evicted."""
        n = getattr(num_tokens, "num_tokens", num_tokens)
        if self.disable or n <= 0:
            return 0
        return self.backend.evict(n)

    def evictable_size(self) -> int:
        return self.backend.stats()["evictable_tokens"]

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
            prefix_len = self.insert(token_ids[:aligned], kv_indices[:aligned])
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
    ) -> Tuple[Any, TreeNode]:
        """A request that goes on (chunked prefill, decode): caches its whole
        pages, locks the new last node before unlocking ``last_node``, and
        returns ``(prefix_indices, new_last_node)``: the cached indices
        followed by the request's own indices past them (its partial page)."""
        n = len(token_ids)
        aligned = n // self.page_size * self.page_size
        if self.disable or aligned == 0:
            return kv_indices[:n], last_node or self.root_node
        self.insert(token_ids[:aligned], kv_indices[:aligned])
        m = self.match_prefix(token_ids[:aligned])
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


__all__ = ["PrefixCache", "PrefixMatch", "TreeNode", "pages_to_indices", "indices_to_pages"]
