"""radixd: a shared-memory prefix (KV) cache server for LLM serving.

- :class:`Client` connects to a running daemon (``radixd serve``);
  :class:`Engine` is the same cache in-process, for tests and simulation.
- :class:`KvIndex` is the cluster router's KV index in-process (fed KV
  event payloads, answering per-worker overlap scores);
  :class:`radixd.index.IndexClient` asks a running ``radixd index serve``.
- :class:`PrefixCache` is SGLang's ``RadixCache`` surface over either;
  :mod:`radixd.sglang` adapts it to SGLang's ``BasePrefixCache``.
- ``Client.store_*`` read and write the node-wide KV store (``radixd serve
  --store``); :mod:`radixd.hicache` is SGLang's HiCache L3 storage on it
  (importing it needs SGLang; ``import radixd`` does not).
- Errors are :class:`RadixdError` subclasses, ``.kind`` the ``radixd exec``
  error kind.
"""

from __future__ import annotations

from . import _errors
from ._errors import ERRORS, RadixdError, error_class
from ._native import NO_PAGE, Client, Engine, EvictResult, InsertResult, KvIndex, MatchResult
from ._native import _error_kinds, _set_error_factory

for _kind in _error_kinds():
    _errors.register(_kind)
_set_error_factory(_errors.make_error)

# One name per kind, e.g. radixd.PageNotOwnedError, radixd.DaemonGoneError.
for _cls in ERRORS.values():
    globals()[_cls.__name__] = _cls
del _kind, _cls

from .index import IndexClient, IndexQueryError  # noqa: E402
from .prefix_cache import PrefixCache, PrefixMatch, TreeNode, bigram_key, bigram_namespace, namespace_of  # noqa: E402

__all__ = [
    "Client",
    "Engine",
    "KvIndex",
    "IndexClient",
    "IndexQueryError",
    "MatchResult",
    "InsertResult",
    "EvictResult",
    "PrefixCache",
    "PrefixMatch",
    "TreeNode",
    "namespace_of",
    "bigram_namespace",
    "bigram_key",
    "RadixdError",
    "ERRORS",
    "error_class",
    "NO_PAGE",
] + [cls.__name__ for cls in ERRORS.values()]

__version__ = "0.1.0"
