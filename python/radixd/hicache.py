"""SGLang 0.5.23 HiCache L3 storage on radixd's node-wide KV store.

SGLang loads :class:`RadixdStorage` itself, through its ``dynamic`` storage
backend (``sglang/srt/mem_cache/storage/backend_factory.py``), with no patch::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config \\
      '{"backend_name":"radixd","module_path":"radixd.hicache","class_name":"RadixdStorage","interface_v1":1}'

The daemon is ``"name"`` in that JSON, else ``$RADIXD_NAME``, else
``radixd``; it must run with a store (``radixd serve --store 64GiB``).

What SGLang hands a backend, and what this one does with it:

- ``batch_exists(keys, extra_info)`` (the prefetch thread's hit query, 128
  keys at most): the length of the leading run of stored keys, read
  lock-free from the shared index (no daemon round trip).
- ``batch_get_v1(keys, host_indices, extra_info)`` (``"interface_v1": 1``):
  the host pool's ``get_page_buffer_meta(host_indices)`` gives each page's
  pieces ``(address, bytes)`` (2 for an MHA ``page_first*``/``page_head``
  page, 2 per layer for ``layer_first``, 1 for MLA ``page_first``, 1 per
  layer for MLA ``layer_first``); a page's value is its pieces in that order,
  copied straight from the mapped store into the pool (no intermediate
  buffer, GIL released). Per key: ``True`` (copied) or ``False`` (a miss,
  never torn bytes).
- ``batch_set_v1(keys, host_indices, extra_info)``: reserve, copy the pieces
  in, commit; a key anyone already stored is skipped (``True``: it is
  stored). Each page's parent is the page before it (``prefix_keys[-1]`` for
  the first), so the store evicts leaves first.
- ``get``/``batch_get``/``set``/``batch_set`` (SGLang's generic path, without
  ``interface_v1``): flat CPU tensors (``get_dummy_flat_data_page``,
  ``get_data_page``), or raw ``(address, bytes)`` as Mooncake takes them.
- ``exists``, ``clear`` (drops this server's namespace only), ``get_stats``
  (SGLang's ``StorageMetrics`` when ``--enable-cache-report`` asks), and
  :meth:`RadixdStorage.store_stats` (the store's own figures).

The host pool comes first: every call that reads, writes or asks about
pages (``batch_exists``/``exists``, ``batch_get_v1``/``batch_set_v1``,
``get``/``batch_get``/``set``/``batch_set``) raises
:class:`RadixdStorageError` until ``register_mem_pool_host`` gave the
backend its host pool, as SGLang's ``HiCacheController`` always does before
any page moves. The pool names the namespace (its layout and dtype decide
the bytes of a page), so every call of a backend uses the namespace its pool
gives, and two servers with the same pool geometry always meet; a page
written under a guessed name would be invisible to, or misread by, a
server that has its pool.

Namespaces follow SGLang's own key rules (``HiCacheFile``'s suffixes): model
(with the host pool's ``storage_format_tag``, which SGLang folds into the
model name), TP rank and size (not for MLA, whose KV every TP rank holds
whole: those ranks share one namespace and only ``is_storage_writer`` ranks
write), PP and attention-CP shards, the host pool's layout, dtype, the I/O
form (``v1`` pieces or SGLang's ``flat`` page) and the value size. Another
model, shard or layout on the node never reads foreign bytes.

Refused at start-up, by name: what SGLang 0.5.23 can pass that this backend
does not carry -- HiCache v2 pool transfers (hybrid models' Mamba/SWA/DSA
indexer side pools, a logical KV anchor such as DeepSeek V4's),
heterogeneous-TP head splitting (``tp_lcm_size``), decode context
parallelism (DCP).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

import radixd

logger = logging.getLogger(__name__)

#: The longest namespace name the store keeps (bytes).
NAMESPACE_MAX = 255

#: Seconds between reconnection attempts after the daemon went away.
RECONNECT_EVERY = 1.0

#: The ``extra_config`` keys this backend reads (SGLang's own keys pass by).
EXTRA_KEYS = ("name", "namespace", "timeout")


class RadixdStorageError(RuntimeError):
    """A start-up error of the radixd HiCache backend; the message names the fix."""


def daemon_name(extra_config: Optional[dict]) -> str:
    """The daemon a backend connects to: ``"name"`` in the extra config, else
    ``$RADIXD_NAME``, else ``radixd``."""
    name = (extra_config or {}).get("name")
    return str(name) if name else os.environ.get("RADIXD_NAME") or "radixd"


def shard_of(config: HiCacheStorageConfig) -> str:
    """Which part of a page's KV this rank holds, as SGLang keys it.

    MHA: each TP rank holds its heads (``tp=R/S``); MLA: every TP rank holds
    the whole latent KV, so the TP rank is left out (``mla``). PP stages own
    their layers, attention-CP ranks a slice of every page: both always
    count (as ``HiCacheFile``'s ``shard_suffix`` has them).
    """
    parts = ["mla" if config.is_mla_model else f"tp={config.tp_rank}/{config.tp_size}"]
    if config.pp_size > 1:
        parts.append(f"pp={config.pp_rank}/{config.pp_size}")
    if config.attn_cp_size > 1:
        parts.append(f"cp={config.attn_cp_rank}/{config.attn_cp_size}")
    return ",".join(parts)


def namespace_name(
    config: HiCacheStorageConfig,
    *,
    layout: str,
    dtype: Any,
    io: str,
    value_size: int,
    base: Optional[str] = None,
) -> str:
    """The store namespace of one backend's pages.

    ``base`` (the extra config's ``"namespace"``) replaces the model and
    value size: servers that name one model differently (two paths to the
    same weights) share pages by giving it; the shard, layout, dtype and I/O
    form still apply, and the store then holds the value size to the first
    registration's (a server whose pages differ fails at start-up).
    """
    dtype_name = str(dtype).replace("torch.", "")
    shard = shard_of(config)
    if base is not None:
        name = f"sglang|ns={base}|{shard}|layout={layout}|dtype={dtype_name}|io={io}"
    else:
        model = "-".join((config.model_name or "").split("/"))
        name = (
            f"sglang|model={model}|{shard}|layout={layout}|dtype={dtype_name}"
            f"|io={io}|bytes={value_size}"
        )
    raw = name.encode()
    if len(raw) > NAMESPACE_MAX:
        # Keep a readable head and make the whole name decide the identity.
        digest = hashlib.sha256(raw).hexdigest()[:32]
        raw = raw[: NAMESPACE_MAX - len(digest) - 1] + b"~" + digest.encode()
        name = raw.decode(errors="ignore")
    return name


def refusals(config: HiCacheStorageConfig) -> List[str]:
    """What in ``config`` this backend does not carry, one line each."""
    out = []
    if config.should_split_heads or config.tp_lcm_size:
        out.append(
            "heterogeneous-TP head splitting (tp_lcm_size in "
            "--hicache-storage-backend-extra-config): radixd stores a rank's page "
            "whole; drop tp_lcm_size"
        )
    if config.dcp_size > 1:
        out.append(
            f"decode context parallelism (dcp_size={config.dcp_size}): run without "
            "DCP, or use --hicache-storage-backend file or mooncake"
        )
    return out


def chain_parents(keys: Sequence[str], extra_info: Optional[HiCacheStorageExtraInfo]) -> List[Optional[str]]:
    """Each key's parent: the key before it, the first key's the last of
    ``extra_info.prefix_keys`` (``None`` at a sequence's start)."""
    prefix = extra_info.prefix_keys if extra_info is not None else None
    first = prefix[-1] if prefix else None
    return [first, *keys[:-1]] if keys else []


def _affine_pool_methods() -> tuple:
    """The ``get_page_buffer_meta`` of SGLang's MHA and MLA host pools: each
    piece of a page at host index ``i`` lies at ``base + i * step``."""
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    return (MHATokenToKVPoolHost.get_page_buffer_meta, MLATokenToKVPoolHost.get_page_buffer_meta)


def affine_pieces(pool, sizes: List[int]) -> Optional[Tuple[Any, Any]]:
    """``(base, step)`` (numpy int64, one per piece of a page) when the pool's pieces
    of the page starting at host index ``i`` lie at ``base + i * step``: true
    of SGLang's MHA and MLA host pools (every layout, without DCP), whose
    ``get_page_buffer_meta`` computes exactly that in a Python loop (about
    100 µs for 128 pages of 16 tokens). Checked against that function on
    pages across the pool; any other pool (or a mismatch) gets ``None`` and
    its own ``get_page_buffer_meta`` every batch."""
    if getattr(pool, "dcp_size", 1) != 1 or type(pool).get_page_buffer_meta not in _affine_pool_methods():
        return None
    page = pool.page_size
    pages = pool.size // page
    if pages < 2:
        return None

    def meta(p: int) -> torch.Tensor:
        ptrs, got = pool.get_page_buffer_meta(torch.arange(p * page, (p + 1) * page, dtype=torch.int64))
        if [int(s) for s in got] != sizes:
            raise ValueError
        return torch.tensor([int(x) for x in ptrs], dtype=torch.int64)

    try:
        base = meta(0)
        diff = meta(1) - base
        if bool((diff % page).any()):
            return None
        step = diff // page
        for p in {2 % pages, pages // 3, pages // 2, pages - 1}:
            if not torch.equal(meta(p), base + p * page * step):
                return None
    except (ValueError, TypeError):
        return None
    return base.numpy(), step.numpy()


class RadixdStorage(HiCacheStorage):
    """SGLang's HiCache L3 storage (``HiCacheStorage``) on a radixd store.

    Built by SGLang's ``StorageBackendFactory.create_backend("dynamic", ...)``
    as ``RadixdStorage(storage_config, kwargs)``; the host pool arrives
    through ``register_mem_pool_host`` before any page moves. One rule for
    every page call (``batch_exists``, ``exists``, ``batch_get_v1``,
    ``batch_set_v1``, ``get``, ``batch_get``, ``set``, ``batch_set``): before
    ``register_mem_pool_host`` it raises :class:`RadixdStorageError` and
    touches nothing; after it, it uses the namespace the pool names
    (:func:`namespace_name` of the pool's layout and dtype). ``clear``,
    ``get_stats``, ``store_stats`` and ``close`` need no pool.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        refused = refusals(storage_config)
        if refused:
            raise RadixdStorageError(
                "radixd.hicache.RadixdStorage does not support " + "; ".join(refused)
            )
        self.name = daemon_name(extra)
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        self.namespace_base = extra.get("namespace")
        if self.namespace_base is not None:
            self.namespace_base = str(self.namespace_base)
        timeout = extra.get("timeout", 30.0)
        self.timeout = None if timeout is None else float(timeout)
        self.is_writer = storage_config.is_storage_writer
        self.enable_storage_metrics = storage_config.enable_storage_metrics

        self.mem_pool_host = None
        self._layout = "-"
        self._dtype = None
        # The pool's namespace: (name, value_size) and its id in the store.
        self._pool_ns: Optional[Tuple[str, int]] = None
        self._pieces_per_page = 0
        self._piece_sizes: List[int] = []
        # Where each page's pieces lie, as `affine_pieces` found it (None:
        # ask the pool's get_page_buffer_meta every batch).
        self._affine: Optional[Tuple[Any, Any]] = None
        # Every namespace this backend registered: name -> (size, id).
        self._namespaces: Dict[str, Tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._next_connect = 0.0

        self.prefetch_pgs: List[int] = []
        self.backup_pgs: List[int] = []
        self.prefetch_bandwidth: List[float] = []
        self.backup_bandwidth: List[float] = []

        self._client = self._connect_or_explain()

    # ---- connection ------------------------------------------------------

    def _connect_or_explain(self) -> "radixd.Client":
        serve = f"radixd serve --name {self.name} --store 64GiB"
        try:
            client = radixd.Client(self.name, timeout=self.timeout)
        except radixd.RadixdError as e:
            raise RadixdStorageError(
                f"radixd HiCache storage: no radixd daemon named {self.name!r} answers "
                f"({e}). Start one with a store (`{serve}`), or name the running one "
                'with "name" in --hicache-storage-backend-extra-config or RADIXD_NAME.'
            ) from e
        if not client.has_store:
            client.close()
            raise RadixdStorageError(
                f"radixd HiCache storage: the radixd daemon {self.name!r} runs without a "
                f"store. Restart it with one: `{serve}` (any size; --store SIZE)."
            )
        return client

    def _client_now(self) -> Optional["radixd.Client"]:
        """The connection, reconnecting (at most once a second) after the
        daemon went away; ``None`` while it is gone."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is not None:
                return self._client
            now = time.monotonic()
            if now < self._next_connect:
                return None
            self._next_connect = now + RECONNECT_EVERY
            try:
                client = radixd.Client(self.name, timeout=self.timeout)
                if not client.has_store:
                    client.close()
                    return None
                # A restarted daemon adopts the store file: names keep their
                # sizes; ids are asked again.
                for name, (size, _) in list(self._namespaces.items()):
                    self._namespaces[name] = (size, client.store_namespace(name, size))
            except radixd.RadixdError as e:
                logger.warning("radixd HiCache storage: reconnect to %r failed: %s", self.name, e)
                return None
            logger.info("radixd HiCache storage: reconnected to %r", self.name)
            self._client = client
            return client

    def _gone(self, client: "radixd.Client", error: Exception) -> None:
        logger.warning("radixd HiCache storage: daemon %r went away: %s", self.name, error)
        with self._lock:
            if self._client is client:
                self._client = None
                self._next_connect = time.monotonic() + RECONNECT_EVERY
        try:
            client.close()
        except radixd.RadixdError:
            pass

    def _namespace(self, name: str, size: int) -> int:
        """The id of namespace ``name`` holding ``size``-byte values, registered
        once; a contradicting size raises :class:`RadixdStorageError`."""
        known = self._namespaces.get(name)
        if known is not None and known[0] == size:
            return known[1]
        client = self._client_now()
        if client is None:
            raise radixd.error_class("daemon_gone")(f"radixd daemon {self.name!r} is gone")
        try:
            ns = client.store_namespace(name, size)
        except radixd.RadixdError as e:
            if e.kind == "size_mismatch":
                raise RadixdStorageError(
                    f"radixd HiCache storage: namespace {name!r} holds values of another "
                    f"size than this server's {size}-byte pages ({e.message}). Another "
                    "server registered it with a different page geometry (--page-size, "
                    "layers, heads, dtype): give this server its own \"namespace\" in "
                    "--hicache-storage-backend-extra-config (or drop \"namespace\" to "
                    "derive one), or restart the daemon with --store-reset."
                ) from e
            if e.kind == "too_large":
                raise RadixdStorageError(
                    f"radixd HiCache storage: a {size}-byte page does not fit the store's "
                    f"extents ({e.message}); start the daemon with a larger --store or use "
                    "a smaller --page-size."
                ) from e
            raise
        self._namespaces[name] = (size, ns)
        return ns

    # ---- registration ----------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        if getattr(pool, "kv_buffer", None) is None:
            raise RadixdStorageError(
                f"radixd.hicache.RadixdStorage does not support HiCache v2 pool "
                f"transfers: the host KV pool ({type(pool).__name__}) is a logical "
                "anchor whose pages live in side pools (DeepSeek V4). Use "
                "--hicache-storage-backend mooncake or file for this model."
            )
        self._layout = str(getattr(pool, "layout", "-"))
        self._dtype = pool.dtype
        if self.interface_v1:
            page = torch.arange(pool.page_size, dtype=torch.int64)
            meta = pool.get_page_buffer_meta(page)
            if not meta or not meta[0]:
                raise RadixdStorageError(
                    f"radixd.hicache.RadixdStorage: the host pool {type(pool).__name__} "
                    "describes no page buffers (get_page_buffer_meta); drop interface_v1 "
                    "from --hicache-storage-backend-extra-config."
                )
            ptrs, sizes = meta
            if any(isinstance(p, (list, tuple)) for p in ptrs):
                raise RadixdStorageError(
                    "radixd.hicache.RadixdStorage does not support multi-buffer page "
                    f"metadata of {type(pool).__name__}; drop interface_v1."
                )
            self._pieces_per_page = len(ptrs)
            self._piece_sizes = [int(s) for s in sizes]
            self._affine = affine_pieces(pool, self._piece_sizes)
            size, io = sum(self._piece_sizes), "v1"
        else:
            dummy = pool.get_dummy_flat_data_page()
            size, io = dummy.numel() * dummy.element_size(), "flat"
        name = namespace_name(
            self.storage_config,
            layout=self._layout,
            dtype=self._dtype,
            io=io,
            value_size=size,
            base=self.namespace_base,
        )
        self._namespace(name, size)
        self._pool_ns = (name, size)
        logger.info(
            "radixd HiCache storage on %r: namespace %r, %d-byte pages%s",
            self.name,
            name,
            size,
            "" if self.is_writer else " (reader: another TP rank writes this MLA KV)",
        )

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        if str(host_pool_name) == PoolName.KV.value and (
            self.mem_pool_host is None or host_pool is self.mem_pool_host
        ):
            return
        raise RadixdStorageError(
            "radixd.hicache.RadixdStorage does not support HiCache v2 pool transfers "
            f"(host pool {str(host_pool_name)!r}, {type(host_pool).__name__}, of a hybrid "
            "model: Mamba/SWA/DSA indexer side pools). Use --hicache-storage-backend "
            "mooncake or file for this model."
        )

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None) -> PoolTransferResult:
        raise NotImplementedError(
            "radixd.hicache.RadixdStorage does not support HiCache v2 pool transfers"
        )

    def batch_get_v2(self, transfers: List[PoolTransfer], extra_info=None):
        raise NotImplementedError(
            "radixd.hicache.RadixdStorage does not support HiCache v2 pool transfers"
        )

    def batch_set_v2(self, transfers: List[PoolTransfer], extra_info=None):
        raise NotImplementedError(
            "radixd.hicache.RadixdStorage does not support HiCache v2 pool transfers"
        )

    # ---- zero-copy path (interface_v1) -------------------------------------

    def _require_pool(self, call: str) -> Tuple[str, int]:
        """The host pool's namespace; before ``register_mem_pool_host``,
        :class:`RadixdStorageError` naming ``call`` and the fix (every page
        call alike: see the class's rule)."""
        if self._pool_ns is None:
            raise RadixdStorageError(
                f"radixd HiCache storage: {call} before register_mem_pool_host. Every call "
                "that reads, writes or asks about pages needs the host pool, which names "
                "their namespace (layout, dtype, page size); SGLang's HiCacheController "
                "registers it before any page moves, so call "
                "register_mem_pool_host(host_pool) first."
            )
        return self._pool_ns

    def _pool_id(self, call: str) -> int:
        return self._namespace(*self._require_pool(call))

    def _pieces(self, keys: List[str], host_indices) -> List[List[Tuple[int, int]]]:
        n, k = len(keys), self._pieces_per_page
        if self._affine is not None:
            page = self.mem_pool_host.page_size
            if host_indices.numel() != n * page:
                raise ValueError(
                    f"radixd HiCache storage: {host_indices.numel()} host indices for {n} "
                    f"keys of {page}-token pages"
                )
            base, step = self._affine
            starts = host_indices.cpu().numpy()[::page].astype("int64", copy=False)
            rows = (starts[:, None] * step + base).tolist()
            sizes = self._piece_sizes
            if k == 2:
                s0, s1 = sizes
                return [[(r[0], s0), (r[1], s1)] for r in rows]
            return [list(zip(r, sizes)) for r in rows]
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) != n * k:
            raise ValueError(
                f"radixd HiCache storage: {len(ptrs)} page pieces for {n} keys "
                f"(expected {k} per page)"
            )
        if k == 1:
            return [[(p, s)] for p, s in zip(ptrs, sizes)]
        if k == 2:
            return [
                [(ptrs[i], sizes[i]), (ptrs[i + 1], sizes[i + 1])]
                for i in range(0, 2 * n, 2)
            ]
        pairs = list(zip(ptrs, sizes))
        return [pairs[i : i + k] for i in range(0, n * k, k)]

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        self._require_pool("batch_get_v1")
        if not keys:
            return []
        client = self._client_now()
        if client is None:
            return [False] * len(keys)
        start = time.perf_counter()
        ns = self._pool_id("batch_get_v1")
        return self._read(client, "batch_get_v1", ns, keys, self._pieces(keys, host_indices), start)

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        self._require_pool("batch_set_v1")
        if not keys:
            return []
        if not self.is_writer:
            # MLA: the writer rank stores this page for every rank (SGLang's
            # controller skips backups here too, `backup_skip`).
            return [True] * len(keys)
        client = self._client_now()
        if client is None:
            return [False] * len(keys)
        start = time.perf_counter()
        parents = chain_parents(keys, extra_info)
        ns = self._pool_id("batch_set_v1")
        return self._write(client, "batch_set_v1", ns, keys, parents, self._pieces(keys, host_indices), start)

    # ---- existence -------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        self._require_pool("batch_exists")
        if not keys:
            return 0
        client = self._client_now()
        if client is None:
            return 0
        try:
            return client.store_exists(self._pool_id("batch_exists"), keys)
        except radixd.DaemonGoneError as e:
            self._gone(client, e)
            return 0
        except radixd.RadixdError as e:
            logger.warning("radixd HiCache storage: batch_exists failed: %s", e)
            return 0

    def exists(self, key: str) -> bool:
        self._require_pool("exists")
        return self.batch_exists([key]) == 1

    # ---- generic path (without interface_v1) -------------------------------

    def _flat_id(self, call: str, nbytes: int) -> int:
        """The namespace of SGLang's flat pages (``get_data_page``) of
        ``nbytes`` bytes: the pool's (without ``interface_v1``, pages of its
        size), else the flat one its layout and dtype name for that size."""
        pool_ns = self._require_pool(call)
        if not self.interface_v1 and pool_ns[1] == nbytes:
            return self._namespace(*pool_ns)
        name = namespace_name(
            self.storage_config,
            layout=self._layout,
            dtype=self._dtype,
            io="flat",
            value_size=nbytes,
            base=self.namespace_base,
        )
        return self._namespace(name, nbytes)

    @staticmethod
    def _tensor_piece(t: torch.Tensor) -> Tuple[int, int]:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("radixd HiCache storage copies contiguous CPU tensors only")
        return t.data_ptr(), t.numel() * t.element_size()

    @staticmethod
    def _raw_pieces(location, sizes) -> List[Tuple[int, int]]:
        """Mooncake's raw form: an address and a size, or lists of each."""
        if isinstance(location, (list, tuple)):
            return [(int(p), int(s)) for p, s in zip(location, sizes)]
        return [(int(location), int(sizes))]

    def _get_many(self, call: str, keys: List[str], targets: List[Any], sizes: Optional[List[Any]]) -> List[bool]:
        """Copies each key's value into its target (a tensor, or a raw address
        with ``sizes``); per key whether it was found."""
        self._require_pool(call)
        if not keys:
            return []
        client = self._client_now()
        if client is None:
            return [False] * len(keys)
        if sizes is None:
            pieces = [[self._tensor_piece(t)] for t in targets]
        else:
            pieces = [self._raw_pieces(t, s) for t, s in zip(targets, sizes)]
        nbytes = sum(s for _, s in pieces[0])
        if any(sum(s for _, s in p) != nbytes for p in pieces):
            raise ValueError("radixd HiCache storage: targets of one batch differ in size")
        return self._read(client, call, self._flat_id(call, nbytes), keys, pieces, time.perf_counter())

    def _set_many(self, call: str, keys: List[str], values: List[Any], sizes: Optional[List[Any]]) -> List[bool]:
        self._require_pool(call)
        if not keys:
            return []
        if not self.is_writer:
            return [True] * len(keys)
        client = self._client_now()
        if client is None:
            return [False] * len(keys)
        if sizes is None:
            values = [v.contiguous() if isinstance(v, torch.Tensor) else v for v in values]
            pieces = [[self._tensor_piece(v)] for v in values]
        else:
            pieces = [self._raw_pieces(v, s) for v, s in zip(values, sizes)]
        nbytes = sum(s for _, s in pieces[0])
        if any(sum(s for _, s in p) != nbytes for p in pieces):
            raise ValueError("radixd HiCache storage: values of one batch differ in size")
        ns = self._flat_id(call, nbytes)
        return self._write(client, call, ns, keys, chain_parents(keys, None), pieces, time.perf_counter())

    def _read(self, client, what: str, ns: int, keys: List[str], pieces, start: float) -> List[bool]:
        """``store_get_many_raw`` under the backend's rules: a daemon gone or a
        refused batch is a miss of every key; figures when metrics are on."""
        try:
            found = client.store_get_many_raw(ns, keys, pieces)
        except radixd.DaemonGoneError as e:
            self._gone(client, e)
            return [False] * len(keys)
        except radixd.RadixdError as e:
            logger.warning("radixd HiCache storage: %s of %d pages failed: %s", what, len(keys), e)
            return [False] * len(keys)
        if self.enable_storage_metrics:
            self._record(self.prefetch_pgs, self.prefetch_bandwidth, sum(found), start)
        return found

    def _write(self, client, what: str, ns: int, keys: List[str], parents, pieces, start: float) -> List[bool]:
        """``store_put_many_raw`` under the backend's rules, as :meth:`_read`."""
        try:
            stored = client.store_put_many_raw(ns, keys, parents, pieces)
        except radixd.DaemonGoneError as e:
            self._gone(client, e)
            return [False] * len(keys)
        except radixd.RadixdError as e:
            logger.warning("radixd HiCache storage: %s of %d pages failed: %s", what, len(keys), e)
            return [False] * len(keys)
        if self.enable_storage_metrics:
            self._record(self.backup_pgs, self.backup_bandwidth, sum(stored), start)
        # Stored now or stored before (by anyone): either way it is there.
        return [True] * len(keys)

    def _dummy_page(self) -> torch.Tensor:
        return self.mem_pool_host.get_dummy_flat_data_page()

    def get(
        self,
        key: str,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> torch.Tensor | bool | None:
        """The value of ``key`` copied into ``target_location`` (a flat CPU
        tensor, or a fresh one shaped as the pool's flat page): that tensor,
        or ``None`` on a miss. With ``target_sizes`` (Mooncake's raw form:
        address(es) and size(s)) the answer is ``True``/``False``."""
        self._require_pool("get")
        if target_sizes is not None:
            return self._get_many("get", [key], [target_location], [target_sizes])[0]
        target = target_location if target_location is not None else self._dummy_page()
        return target if self._get_many("get", [key], [target], None)[0] else None

    def batch_get(
        self,
        keys: List[str],
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> List[torch.Tensor | None] | int:
        """Per key its tensor or ``None`` (``HiCacheFile``'s answer); with
        ``target_sizes`` (raw addresses), the number of leading keys found
        (Mooncake's answer)."""
        self._require_pool("batch_get")
        if target_sizes is not None:
            found = self._get_many("batch_get", keys, list(target_locations), list(target_sizes))
            return found.index(False) if False in found else len(found)
        if target_locations is None:
            targets = [self._dummy_page() for _ in keys]
        else:
            targets = list(target_locations)
        found = self._get_many("batch_get", keys, targets, None)
        return [t if ok else None for t, ok in zip(targets, found)]

    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        self._require_pool("set")
        if value is not None:
            return self._set_many("set", [key], [value], None)[0]
        if target_location is None or target_sizes is None:
            return False
        return self._set_many("set", [key], [target_location], [target_sizes])[0]

    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        self._require_pool("batch_set")
        if not keys:
            return False
        if values is not None:
            return all(self._set_many("batch_set", keys, list(values), None))
        if target_locations is None or target_sizes is None:
            return False
        return all(self._set_many("batch_set", keys, list(target_locations), list(target_sizes)))

    # ---- the rest of the surface -------------------------------------------

    def clear(self) -> bool:
        """SGLang's ``clear_hicache_storage_backend``: drops every value of
        this server's namespaces, never another server's (the store is the
        node's). A reader mid-copy gets the old bytes or a miss."""
        client = self._client_now()
        if client is None:
            return False
        try:
            for _, ns in list(self._namespaces.values()):
                client.store_clear(ns)
        except radixd.DaemonGoneError as e:
            self._gone(client, e)
            return False
        except radixd.RadixdError as e:
            logger.warning("radixd HiCache storage: clear failed: %s", e)
            return False
        return True

    def _record(self, pages: List[int], bandwidth: List[float], n: int, start: float) -> None:
        elapsed = time.perf_counter() - start
        pages.append(n)
        if n and elapsed > 0 and self._pool_ns is not None:
            bandwidth.append(n * self._pool_ns[1] / (1 << 30) / elapsed)

    def get_stats(self):
        """SGLang's ``StorageMetrics`` since the last call (pages and GB/s of
        each prefetch and backup), when ``enable_storage_metrics``."""
        if not self.enable_storage_metrics:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics = StorageMetrics()
        for mine, theirs in (
            (self.prefetch_pgs, metrics.prefetch_pgs),
            (self.backup_pgs, metrics.backup_pgs),
            (self.prefetch_bandwidth, metrics.prefetch_bandwidth),
            (self.backup_bandwidth, metrics.backup_bandwidth),
        ):
            theirs.extend(mine)
            mine.clear()
        return metrics

    def store_stats(self) -> Optional[dict]:
        """The store's figures (``radixd.Client.store_stats``), ``None`` while
        the daemon is gone."""
        client = self._client_now()
        if client is None:
            return None
        try:
            return client.store_stats()
        except radixd.DaemonGoneError as e:
            self._gone(client, e)
            return None

    @property
    def namespace(self) -> Optional[str]:
        """The host pool's namespace name (after ``register_mem_pool_host``)."""
        return self._pool_ns[0] if self._pool_ns is not None else None

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._next_connect = float("inf")
        if client is not None:
            client.close()
