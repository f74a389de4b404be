"""SGLang adapter: ``RadixdPrefixCache``, a ``BasePrefixCache`` backed by a
radixd daemon (or an in-process ``Engine``), for SGLang 0.5.23.

Importing this module needs ``sglang`` (and so ``torch``); ``import radixd``
alone does not. Shapes checked against sgl-project/sglang's
``python/sglang/srt/mem_cache/base_prefix_cache.py`` (``BasePrefixCache``,
``MatchPrefixParams``, ``InsertParams``, ``EvictParams``, ``EvictResult``,
``MatchResult``, ``IncLockRefResult``/``DecLockRefResult`` where the release
has them) and ``python/sglang/srt/mem_cache/radix_cache.py`` (``RadixCache``:
``cache_finished_req``, ``cache_unfinished_req``, ``inc_lock_ref``,
``dec_lock_ref``). Fields that differ between releases are filled by name
from the classes the installed sglang defines.

KV pages belong to radixd's pool: the token-to-KV allocator the scheduler
uses must hand out indices from ``cache.alloc_indices(n)`` (page ``p`` covers
indices ``p*P .. p*P+P-1``) and free through ``cache.free_indices``; see the
recipe in python/README.md.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from sglang.srt.mem_cache import base_prefix_cache as _base
from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, MatchResult

from .prefix_cache import PrefixCache, TreeNode

_EvictResult = getattr(_base, "EvictResult", None)
_InsertResult = getattr(_base, "InsertResult", None)
_IncLockRefResult = getattr(_base, "IncLockRefResult", None)
_DecLockRefResult = getattr(_base, "DecLockRefResult", None)
_MATCH_FIELDS = set(getattr(MatchResult, "_fields", ()))


def _tensor(indices: Any, device: Any) -> torch.Tensor:
    return torch.as_tensor(indices, dtype=torch.int64, device=device)


def _numpy(indices: Any) -> Any:
    if isinstance(indices, torch.Tensor):
        return indices.detach().to("cpu", torch.int64).numpy()
    return indices


class RadixdPrefixCache(BasePrefixCache):
    """SGLang's prefix cache interface over :class:`radixd.PrefixCache`.

    ``backend`` is a ``radixd.Client`` (one daemon shared by every scheduler
    process on the node) or a ``radixd.Engine``.
    """

    def __init__(
        self,
        backend: Any,
        req_to_token_pool: Any = None,
        token_to_kv_pool_allocator: Any = None,
        disable: bool = False,
        device: Any = "cpu",
    ):
        self.cache = backend if isinstance(backend, PrefixCache) else PrefixCache(backend)
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = self.cache.page_size
        self.disable = disable
        self.cache.disable = disable
        self.device = getattr(token_to_kv_pool_allocator, "device", None) or torch.device(device)
        self.root_node = self.cache.root_node

    # ----- BasePrefixCache -----

    def reset(self) -> None:
        self.cache.reset()

    def match_prefix(self, params: Any) -> MatchResult:
        m = self.cache.match_prefix(params)
        values = {
            "device_indices": _tensor(m.device_indices, self.device),
            "last_device_node": m.last_device_node,
            "last_host_node": m.last_host_node,
            "best_match_node": m.best_match_node,
            "host_hit_length": 0,
            "device_prefix_len": m.device_prefix_len,
        }
        if _MATCH_FIELDS:
            values = {k: v for k, v in values.items() if k in _MATCH_FIELDS}
        return MatchResult(**values)

    def insert(self, params: Any) -> Any:
        prefix_len = self.cache.insert(params.key, _numpy(getattr(params, "value", None)))
        if _InsertResult is not None:
            return _InsertResult(prefix_len=prefix_len)
        return prefix_len

    def evict(self, params: Any) -> Any:
        evicted = self.cache.evict(getattr(params, "num_tokens", params))
        if _EvictResult is not None:
            return _EvictResult(num_tokens_evicted=evicted)
        return evicted

    def inc_lock_ref(self, node: Optional[TreeNode]) -> Any:
        delta = self.cache.inc_lock_ref(node)
        if _IncLockRefResult is not None:
            return _IncLockRefResult(delta=delta)
        return delta

    def dec_lock_ref(self, node: Optional[TreeNode], params: Any = None) -> Any:
        delta = self.cache.dec_lock_ref(node)
        if _DecLockRefResult is not None:
            return _DecLockRefResult(delta=delta)
        return delta

    def evictable_size(self) -> int:
        return self.cache.evictable_size()

    def protected_size(self) -> int:
        return self.cache.protected_size()

    def total_size(self) -> int:
        return self.cache.total_size()

    def is_root(self, node: Any) -> bool:
        return node is None or getattr(node, "handle", None) is None

    # ----- requests, as RadixCache handles them -----

    def _req_kv(self, req: Any, length: int) -> Any:
        return self.req_to_token_pool.req_to_token[req.req_pool_idx, :length]

    def cache_finished_req(self, req: Any, is_insert: bool = True, **kwargs: Any) -> None:
        """As ``RadixCache.cache_finished_req``: cache the request's whole
        pages, free the rest, unlock its last node."""
        if hasattr(req, "pop_committed_kv_cache"):
            committed = req.pop_committed_kv_cache()
        else:
            committed = len(req.origin_input_ids) + len(req.output_ids)
        token_ids = (list(req.origin_input_ids) + list(req.output_ids))[:committed]
        kv = _numpy(self._req_kv(req, len(token_ids)))
        self.cache.cache_finished_req(
            token_ids,
            kv,
            last_node=getattr(req, "last_node", None),
            cache_protected_len=getattr(req, "cache_protected_len", 0) or 0,
            is_insert=is_insert and not self.disable,
        )

    def cache_unfinished_req(self, req: Any, chunked: bool = False, **kwargs: Any) -> None:
        """As ``RadixCache.cache_unfinished_req``: cache what is computed so
        far, move the request's lock to the new last node, and point its
        token table and ``prefix_indices`` at the cached pages."""
        token_ids = list(req.fill_ids)
        kv = self._req_kv(req, len(token_ids))
        old = getattr(req, "cache_protected_len", 0) or 0
        indices, node = self.cache.cache_unfinished_req(token_ids, _numpy(kv), req.last_node)
        indices = _tensor(indices, kv.device if isinstance(kv, torch.Tensor) else self.device)
        cached = node.prefix_len if isinstance(node, TreeNode) else 0
        if cached > old:
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(old, cached)), indices[old:cached]
            )
        req.cache_protected_len = cached
        req.prefix_indices = indices
        req.last_node = node


__all__ = ["RadixdPrefixCache"]
