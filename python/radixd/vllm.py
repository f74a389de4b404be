"""vLLM 0.33.0's node-wide CPU KV tier on radixd's store: :class:`RadixdTier`.

vLLM loads it with no patch, as a secondary tier under its
``TieringOffloadingSpec`` (``vllm/v1/kv_offload/tiering/``)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"OffloadingConnector",
      "kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec",
      "cpu_bytes_to_use":4294967296,"secondary_tiers":[{"type":"RadixdTier",
      "module_path":"radixd.vllm","store":"radixd"}]}}'

``"store"`` names the daemon (``radixd serve --name NAME --store SIZE``),
else ``$RADIXD_NAME``, else ``radixd``. Each engine keeps its own small
primary CPU tier (vLLM's pinned region, which its GPU workers copy to and
from); this tier sits under it in the engine's scheduler (EngineCore)
process, the only process that calls a tier, with one radixd client
whatever the TP size:

- every chunk an engine offloads is cascaded here by vLLM: one whole
  primary row (``block_size_bytes``, the row stride) is one store value,
  under the hex of vLLM's ``OffloadKey`` (block hash and group), its parent
  the chunk before it in the request (``req_context``'s key positions), so
  the store evicts a prefix's tail before its head;
- a primary miss asks :meth:`RadixdTier.lookup`: the store's lock-free
  exists (no round trip, never waits); a hit makes vLLM promote the chunk:
  :meth:`RadixdTier.submit_load` copies the value into the primary row vLLM
  allocated, and the GPU load follows from there.

vLLM calls every tier method under its manager lock, so nothing here
blocks: stores and loads are queued to a copy thread of the tier's own
(reserve, copy straight from the primary rows, commit; gets straight into
them, the GIL released) and reported by :meth:`RadixdTier.get_finished_jobs`.
A value evicted while it is copied is a failed key (``JobResult.
successful_keys``), never wrong bytes (the store's version re-check).

The namespace is everything the key does not say (see
:func:`namespace_name`): two engines of one model and layout share values,
another model, dtype, KV layout, chunk geometry, parallel layout or hash
seed never reads them. Importing this module needs vLLM; ``import radixd``
does not.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

import radixd

logger = logging.getLogger(__name__)

#: The longest namespace name the store keeps (bytes).
NAMESPACE_MAX = 255

#: Seconds between reconnection attempts after the daemon went away.
RECONNECT_EVERY = 1.0

#: The longest wait for one daemon answer (seconds): a daemon that hangs
#: fails a job within this, one that dies within milliseconds.
ANSWER_TIMEOUT = 5.0

#: Ownership of this tier's KV events.
OWNERSHIP = "radixd"

#: Chunks one lookup probes ahead of the one vLLM asks for.
LOOKAHEAD = 256

#: The `radixd serve` line a start-up error suggests.
SERVE_SIZE = "64GiB"

#: A store's largest extent (a value must fit one): `min(16 MiB, SIZE / 8)`.
MAX_EXTENT = 16 << 20


class RadixdTierError(RuntimeError):
    """A start-up error of the radixd vLLM tier; the message names the fix."""


def daemon_name(store: str | None) -> str:
    """The daemon a tier connects to: its ``"store"`` key, else
    ``$RADIXD_NAME``, else ``radixd``."""
    return str(store) if store else os.environ.get("RADIXD_NAME") or "radixd"


def serve_line(name: str, value_size: int = 0) -> str:
    """The ``radixd serve`` command line that serves ``name`` a store able
    to hold values of ``value_size`` bytes."""
    size = SERVE_SIZE
    if value_size * 8 > (64 << 30):
        size = f"{-(-value_size * 8 // (1 << 30))}GiB"
    return f"radixd serve --name {name} --store {size}"


def none_hash() -> bytes | None:
    """vLLM's ``NONE_HASH`` (the seed of every block hash chain), or ``None``
    before vLLM initialised it (it does after building the scheduler)."""
    from vllm.v1.core import kv_cache_utils

    value = getattr(kv_cache_utils, "NONE_HASH", None)
    return bytes(value) if value is not None else None


def random_seed() -> bool:
    """Whether vLLM seeded ``NONE_HASH`` at random (a non-cryptographic hash
    such as ``xxhash`` without ``PYTHONHASHSEED``): block hashes then differ
    from one process to the next, and no other engine can share them."""
    if os.environ.get("PYTHONHASHSEED") is not None:
        return False
    from vllm.v1.core import kv_cache_utils

    seed = getattr(kv_cache_utils, "_NONE_HASH_SEED", None)
    default = getattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED", None)
    return seed is not None and seed != default


def configured_hash() -> str | None:
    """``--prefix-caching-hash-algo`` of the engine being built, if vLLM has
    its config in context."""
    try:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
    except ImportError:
        return None
    if config is None:
        return None
    return getattr(config.cache_config, "prefix_caching_hash_algo", None)


UNSHARED_HASH_FIX = (
    "set PYTHONHASHSEED to one value for every engine on the node, or use "
    "--prefix-caching-hash-algo sha256_cbor"
)


def namespace_name(config: Any, value_size: int, seed: bytes) -> str:
    """The store namespace of an engine's chunks: everything an
    ``OffloadKey`` does not say.

    ``config`` is the spec's ``OffloadingConfig``: the model's name and KV
    cache dtype (``fp8`` caches included), the KV layout and whether the
    canonical host layout is in use, every KV group's geometry (tokens per
    block, layers, sliding window in chunks), tokens per hash and blocks per
    chunk, the parallel layout (world size, TP, PP, PCP, DCP) unless the
    bytes are parallelism-agnostic (canonical layout certified so), the
    replicated (MLA) layout, ``worker_kv_bytes_per_block``; then the hash
    seed (a digest of ``NONE_HASH``, which differs by algorithm and seed) and
    the value size. Data-parallel ranks of one model share: their rank is
    not part of it.
    """
    model = config.model
    cache = config.cache
    par = config.parallel
    groups = ";".join(
        f"{g.group_id}:{g.tokens_per_block}:{len(g.layer_names)}"
        f":{hashlib.sha256('|'.join(g.layer_names).encode()).hexdigest()[:8]}"
        f":{'' if g.sliding_window_size_in_chunks is None else g.sliding_window_size_in_chunks}"
        for g in config.groups
    )
    agnostic = bool(config.canonical_layout) and bool(par.is_parallelism_agnostic)
    layout = (
        "any"
        if agnostic
        else f"ws{par.world_size},tp{par.tp_size},pp{par.pp_size},pcp{par.pcp_size},dcp{par.dcp_size}"
    )
    name = (
        f"vllm|model={model.name}|dtype={model.dtype}|kv={config.kv_cache_layout}"
        f"|canon={int(bool(config.canonical_layout))}|repl={int(bool(config.replicated_layout))}"
        f"|par={layout}|hash={cache.tokens_per_hash}x{cache.blocks_per_chunk}|groups={groups}"
        f"|kvb={config.worker_kv_bytes_per_block}|seed={hashlib.sha256(seed).hexdigest()[:16]}"
        f"|bytes={value_size}"
    )
    raw = name.encode()
    if len(raw) > NAMESPACE_MAX:
        # A readable head; the whole name decides the identity.
        digest = hashlib.sha256(raw).hexdigest()[:32]
        raw = raw[: NAMESPACE_MAX - len(digest) - 1] + b"~" + digest.encode()
        name = raw.decode(errors="ignore")
    return name


def chain_parents(keys: list[OffloadKey], req_context: ReqContext) -> tuple[list[int], list[bytes | None]]:
    """The order to store ``keys`` in and each one's parent: chunk order by
    ``req_context.get_offload_key_position`` (the end token of each chunk),
    a key's parent the chunk before it in its group (the last 4 bytes of an
    ``OffloadKey``), from this job or earlier in the request; ``None`` for a
    request's first chunk or a key without a position."""
    positions = [req_context.get_offload_key_position(k) for k in keys]
    order = sorted(range(len(keys)), key=lambda i: (positions[i] is None, positions[i] or 0))
    # Every chunk of the request the scheduler placed, by group: the
    # parent of a job's first key usually came earlier.
    known: dict[bytes, tuple[list[int], list[bytes]]] = {}
    table = getattr(req_context, "_offload_key_positions", None)
    items = table.items() if isinstance(table, dict) else zip(keys, positions)
    by_group: dict[bytes, list[tuple[int, bytes]]] = {}
    for k, p in items:
        if p is not None:
            by_group.setdefault(bytes(k[-4:]), []).append((p, bytes(k)))
    for group, pairs in by_group.items():
        pairs.sort()
        known[group] = ([p for p, _ in pairs], [k for _, k in pairs])
    parents: list[bytes | None] = []
    for i in order:
        p = positions[i]
        parent = None
        if p is not None:
            pos_list, key_list = known.get(bytes(keys[i][-4:]), ([], []))
            j = bisect.bisect_left(pos_list, p)
            if j > 0:
                parent = key_list[j - 1]
        parents.append(parent)
    return order, parents


#: A copy-thread task: register the namespace (asked by a lookup).
_RESOLVE = object()


class _Job:
    """A queued transfer: the vLLM job and its direction."""

    __slots__ = ("job", "load")

    def __init__(self, job: TransferJob, load: bool):
        self.job = job
        self.load = load


class RadixdTier(SecondaryTierManager):
    """vLLM's secondary KV tier on a radixd store (see the module docs).

    Built by vLLM's ``SecondaryTierFactory`` as ``RadixdTier(offloading_spec=,
    primary_kv_view=, tier_type=, backpressure_detector=, store=)``; start-up
    errors (no daemon of that name, a daemon without a store, values the
    store cannot hold or that contradict the engine's geometry) raise
    :class:`RadixdTierError` from here, so the engine fails at construction
    with the ``radixd serve`` line to run.
    """

    medium: ClassVar[Medium] = Medium.CPU
    # Every method is thread-agnostic (a lock-free probe, queues, and a
    # deque of results), so vLLM's tier-poll thread may collect finished
    # jobs between steps: promotions complete without waiting for a step.
    tolerates_off_thread_polling: ClassVar[bool] = True

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        store: str | None = None,
    ):
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        self._stopped = True
        try:
            self._start(offloading_spec, primary_kv_view, store)
        except BaseException:
            # Stop what started; vLLM releases the primary view after a
            # failed construction, so hold no export of it.
            self.shutdown()
            raise

    def _start(self, offloading_spec: Any, primary_kv_view: memoryview, store: str | None) -> None:
        self.locality = Locality.LOCAL
        self.name = daemon_name(store)
        self.config = offloading_spec.config
        self.value_size = int(self.block_size_bytes)
        # The primary rows, zero-copy: row `c` starts at base + c * stride.
        self._rows = np.asarray(primary_kv_view)
        if self._rows.ndim != 2 or self._rows.strides[0] != self.value_size:
            raise RadixdTierError(
                f"radixd vLLM tier: the primary KV view is {self._rows.shape} with row "
                f"stride {self._rows.strides[0]}, not the (chunks, row bytes) rows of "
                f"{self.value_size} bytes vLLM 0.33.0 hands a tier"
            )
        self._base = int(self._rows.ctypes.data) if self._rows.size else 0
        self._chunks = int(self._rows.shape[0])
        self._check_geometry()

        self._events: list[OffloadingEvent] | None = (
            [] if getattr(self.config, "enable_kv_cache_events", False) else None
        )
        self._lock = threading.Lock()
        self._done: deque[JobResult] = deque()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._next_connect = 0.0
        self._warned_gone = False
        # The namespace: its name once NONE_HASH is known, its id once
        # registered; `_off` when the hash cannot be shared or the store
        # refused the namespace
        # (nothing is stored or looked up then).
        self._ns_name: str | None = None
        self._ns_id: int | None = None
        self._off = False
        self._resolving = False
        # Per request: (key count, key -> index in chunk order, hex keys);
        # per request, this step: (first index, run, end, key -> index) of
        # its last probe.
        self._requests: dict[str, tuple] = {}
        self._runs: dict[str, tuple] = {}

        hash_algo = configured_hash()
        if hash_algo is not None and hash_algo.startswith("xxhash") and os.environ.get("PYTHONHASHSEED") is None:
            self._warn_unshared(f"--prefix-caching-hash-algo {hash_algo} without PYTHONHASHSEED")

        self._client: radixd.Client | None = self._connect_or_explain()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"radixd-tier-{self.name}", daemon=True)
        self._thread.start()
        # vLLM seeds NONE_HASH after building the scheduler; where it
        # already has (a second engine in one process), a namespace that
        # contradicts this engine shows here.
        if none_hash() is not None:
            self._resolve(register=True, at_start=True)
        logger.info(
            "radixd vLLM tier on daemon %r: values of %d bytes, %d primary rows",
            self.name, self.value_size, self._chunks,
        )

    # ---- start-up ------------------------------------------------------------

    def _check_geometry(self) -> None:
        """A row must hold one chunk of every worker's KV: vLLM's own sizing
        (``CPUOffloadingSpec``), which the namespace records."""
        cfg = self.config
        copies = 1 if cfg.replicated_layout else cfg.parallel.world_size
        chunk = int(cfg.worker_kv_bytes_per_block) * copies * int(cfg.cache.blocks_per_chunk)
        if chunk > self.value_size:
            raise RadixdTierError(
                f"radixd vLLM tier: a primary row is {self.value_size} bytes but one chunk "
                f"of this engine is {chunk} bytes (worker_kv_bytes_per_block "
                f"{cfg.worker_kv_bytes_per_block} x {copies} workers x "
                f"{cfg.cache.blocks_per_chunk} blocks): the namespace and the rows "
                "disagree; this vLLM is not the 0.33.0 this tier was written against"
            )

    def _connect_or_explain(self) -> "radixd.Client":
        serve = serve_line(self.name, self.value_size)
        try:
            client = radixd.Client(self.name, timeout=ANSWER_TIMEOUT)
        except radixd.RadixdError as e:
            raise RadixdTierError(
                f"radixd vLLM tier: no radixd daemon named {self.name!r} answers ({e}). "
                f"Start one with a store (`{serve}`), or name the running one with "
                '"store" in the secondary tier\'s config or RADIXD_NAME.'
            ) from e
        if not client.has_store:
            client.close()
            raise RadixdTierError(
                f"radixd vLLM tier: the radixd daemon {self.name!r} runs without a store. "
                f"Restart it with one: `{serve}` (--store SIZE, any size of at least "
                f"8 x {self.value_size} bytes)."
            )
        limit = client.store_value_max
        if self.value_size > limit:
            client.close()
            if self.value_size > MAX_EXTENT:
                fix = (
                    f"values over {MAX_EXTENT >> 20} MiB never fit: lower block_size "
                    "(tokens per offloaded chunk) in kv_connector_extra_config"
                )
            else:
                fix = f"restart it with a larger store: `{serve}`"
            raise RadixdTierError(
                f"radixd vLLM tier: this engine's chunks are {self.value_size} bytes but the "
                f"store of daemon {self.name!r} holds values of at most {limit} bytes "
                f"(one extent, SIZE / 8 up to 16 MiB); {fix}."
            )
        return client

    def _warn_unshared(self, why: str) -> None:
        if self._off:
            return
        self._off = True
        logger.warning(
            "radixd vLLM tier: block hashes are seeded at random in this process (%s): "
            "no other engine can share this engine's chunks, so the tier stores and "
            "finds nothing. To share them, %s.",
            why, UNSHARED_HASH_FIX,
        )

    # ---- the namespace -----------------------------------------------------

    def _resolve(self, register: bool, at_start: bool = False) -> int | None:
        """The namespace's id, registered through the daemon (which checks
        the value size) on the copy thread or at start-up (``register``);
        a lookup only asks the copy thread to (``None`` until then)."""
        if self._ns_id is not None:
            return self._ns_id
        if self._off:
            return None
        if self._ns_name is None:
            seed = none_hash()
            if seed is None:
                return None
            if random_seed():
                self._warn_unshared("a non-cryptographic prefix-caching hash without PYTHONHASHSEED")
                return None
            self._ns_name = namespace_name(self.config, self.value_size, seed)
        client = self._client
        if client is None or not register:
            return None
        try:
            # Through the daemon, always: it holds the namespace to the
            # value size of its first registration.
            found = client.store_namespace(self._ns_name, self.value_size)
        except radixd.SizeMismatchError as e:
            message = (
                f"radixd vLLM tier: namespace {self._ns_name!r} holds values of another "
                f"size than this engine's {self.value_size}-byte chunks ({e.message})"
            )
            if at_start:
                raise RadixdTierError(message) from e
            logger.error("%s; the tier stays empty", message)
            self._off = True
            return None
        except radixd.TooLargeError as e:
            message = (
                f"radixd vLLM tier: the store of {self.name!r} cannot hold "
                f"{self.value_size}-byte values ({e.message}): `{serve_line(self.name, self.value_size)}`"
            )
            if at_start:
                raise RadixdTierError(message) from e
            logger.error("%s; the tier stays empty", message)
            self._off = True
            return None
        self._ns_id = found
        return found

    @property
    def namespace(self) -> str | None:
        """The namespace's name (once vLLM seeded its block hashes)."""
        return self._ns_name

    # ---- vLLM's calls (under its manager lock: none may block) -------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """HIT when the store holds ``key`` in this engine's namespace: the
        store's lock-free exists, no round trip, no lock shared with the
        copy thread. Never raises, never waits: a daemon gone (or not yet
        reconnected), an unknown namespace or any error is a MISS."""
        try:
            # The step's run of this request answers most calls: no read.
            run = self._runs.get(req_context.req_id)
            if run is not None:
                i = run[3].get(key)
                if i is not None:
                    if run[0] <= i < run[0] + run[1]:
                        return LookupResult.HIT
                    if i == run[0] + run[1] < run[2]:
                        return LookupResult.MISS
            client = self._client
            if client is None:
                return LookupResult.MISS
            ns = self._ns_id
            if ns is None:
                # Not registered yet (vLLM seeds its hashes after the
                # scheduler is built): the copy thread registers it.
                if not self._resolving and not self._off:
                    self._resolving = True
                    self._queue.put(_RESOLVE)
                return LookupResult.MISS
            return self._probe(client, ns, key, req_context)
        except Exception as e:  # noqa: BLE001 - a lookup answers, whatever happens
            logger.debug("radixd vLLM tier: lookup failed: %s", e)
            return LookupResult.MISS

    def _probe(self, client: radixd.Client, ns: int, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """vLLM asks one chunk at a time, from a request's first chunk on;
        the store answers a whole run in one probe. So the first lookup of a
        request in a scheduler step probes its chunks from this one on (in
        chunk order, up to ``LOOKAHEAD``), and the step's later lookups of
        that request are answered from the run: a key inside it was stored
        when probed (a value evicted before vLLM loads it fails that key),
        the key just past it was not. ``on_schedule_end`` forgets the runs."""
        req = self._requests.get(req_context.req_id)
        table = getattr(req_context, "_offload_key_positions", None)
        if not isinstance(table, dict):
            return LookupResult.HIT if client.store_probe(ns, [bytes(key).hex()]) == 1 else LookupResult.MISS
        if req is None or req[0] != len(table):
            order = sorted(table, key=lambda k: (bytes(k[-4:]), table[k]))
            req = (len(table), {k: i for i, k in enumerate(order)}, [bytes(k).hex() for k in order])
            self._requests[req_context.req_id] = req
        i = req[1].get(key)
        if i is None:
            return LookupResult.HIT if client.store_probe(ns, [bytes(key).hex()]) == 1 else LookupResult.MISS
        batch = req[2][i : i + LOOKAHEAD]
        n = client.store_probe(ns, batch)
        self._runs[req_context.req_id] = (i, n, i + len(batch), req[1])
        return LookupResult.HIT if n > 0 else LookupResult.MISS

    def on_schedule_end(self, context: Any) -> None:
        """A new step: runs probed in this one may be stale by the next."""
        self._runs.clear()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._requests.pop(req_context.req_id, None)
        self._runs.pop(req_context.req_id, None)

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(_Job(job_metadata, load=False))

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(_Job(job_metadata, load=True))

    def _submit(self, job: _Job) -> None:
        with self._lock:
            self._pending += 1
        if self._stopped:
            self._finish(JobResult(job_id=job.job.job_id, success=False))
            return
        self._queue.put(job)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        while True:
            try:
                out.append(self._done.popleft())
            except IndexError:
                return out

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def has_pending_work(self) -> bool:
        return self._pending > 0 or bool(self._done)

    def drain_jobs(self) -> None:
        """Waits until every submitted job has finished (its result queued
        for :meth:`get_finished_jobs`): nothing touches the primary rows
        after this returns. A job against a gone daemon fails at once."""
        with self._idle:
            while self._pending > 0:
                self._idle.wait(0.1)

    def take_events(self) -> Iterable[OffloadingEvent]:
        """``BlockStored`` events (medium CPU) for the chunks this engine
        stored into the store, when vLLM's KV events are on. What other
        engines stored, and the store's evictions, are not this engine's to
        report (``radixd serve --kv-events`` publishes the node's)."""
        if not self._events:
            return ()
        with self._lock:
            events, self._events = self._events, []
        return events

    def shutdown(self) -> None:
        """Finishes queued jobs, stops the copy thread, closes the client,
        and lets go of the primary view (vLLM releases it next)."""
        self._stopped = True
        thread = getattr(self, "_thread", None)
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)
            self._thread = None
        client, self._client = getattr(self, "_client", None), None
        if client is not None:
            try:
                client.close()
            except radixd.RadixdError:
                pass
        self._rows = np.empty((0, 0), dtype=np.int8)
        self._base = 0

    def get_stats(self):
        return None

    def store_stats(self) -> dict | None:
        """The store's figures (``radixd.Client.store_stats``), ``None``
        while the daemon is gone. Not for the scheduler thread: it asks."""
        client = self._client
        if client is None:
            return None
        try:
            return client.store_stats()
        except radixd.RadixdError:
            return None

    # ---- the copy thread ---------------------------------------------------

    def _finish(self, result: JobResult) -> None:
        self._done.append(result)
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def _run(self) -> None:
        while True:
            try:
                # Wake now and then while the daemon is gone: reconnect
                # even when no job comes.
                job = self._queue.get(timeout=RECONNECT_EVERY if self._client is None else None)
            except queue.Empty:
                self._reconnect()
                continue
            if job is None:
                # Shutdown: anything queued after the sentinel fails.
                while True:
                    try:
                        left = self._queue.get_nowait()
                    except queue.Empty:
                        return
                    if isinstance(left, _Job):
                        self._finish(JobResult(job_id=left.job.job_id, success=False))
            if job is _RESOLVE:
                try:
                    if self._reconnect() is not None:
                        self._resolve(register=True)
                except Exception as e:  # noqa: BLE001 - a lookup will ask again
                    logger.debug("radixd vLLM tier: namespace not registered: %s", e)
                self._resolving = False
                continue
            try:
                result = self._transfer(job)
            except Exception as e:  # noqa: BLE001 - a job fails, the engine goes on
                logger.warning("radixd vLLM tier: job %d failed: %s", job.job.job_id, e)
                result = JobResult(job_id=job.job.job_id, success=False)
            self._finish(result)

    def _reconnect(self) -> radixd.Client | None:
        """The connection, reconnecting (at most once a second) after the
        daemon went away; ``None`` while it is gone."""
        client = self._client
        if client is not None or self._stopped:
            return client
        now = time.monotonic()
        if now < self._next_connect:
            return None
        self._next_connect = now + RECONNECT_EVERY
        try:
            client = radixd.Client(self.name, timeout=ANSWER_TIMEOUT)
            if not client.has_store or client.store_value_max < self.value_size:
                client.close()
                return None
        except radixd.RadixdError:
            return None
        # A restarted daemon adopts the store file; the id is asked again.
        self._ns_id = None
        self._client = client
        self._warned_gone = False
        logger.info("radixd vLLM tier: reconnected to %r", self.name)
        return client

    def _gone(self, client: radixd.Client, error: Exception) -> None:
        if not self._warned_gone:
            logger.warning("radixd vLLM tier: daemon %r went away (%s); lookups miss until it is back", self.name, error)
            self._warned_gone = True
        if self._client is client:
            self._client = None
            self._ns_id = None
            self._next_connect = time.monotonic() + RECONNECT_EVERY
        try:
            client.close()
        except radixd.RadixdError:
            pass

    def _pieces(self, chunk_ids: Any, order: list[int]) -> list:
        rows = np.asarray(chunk_ids, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self._chunks):
            raise ValueError(f"primary rows {rows.tolist()} outside 0..{self._chunks}")
        base, size = self._base, self.value_size
        return [[(base + int(rows[i]) * size, size)] for i in order]

    def _transfer(self, job: _Job) -> JobResult:
        tj = job.job
        keys = list(tj.keys)
        if len(keys) != len(tj.chunk_ids):
            raise ValueError(f"{len(keys)} keys but {len(tj.chunk_ids)} primary rows")
        client = self._reconnect()
        if client is None or not keys:
            return JobResult(job_id=tj.job_id, success=not keys)
        ns = self._resolve(register=True)
        if ns is None:
            return JobResult(job_id=tj.job_id, success=False)
        start = time.perf_counter()
        try:
            if job.load:
                order = list(range(len(keys)))
                found = client.store_get_many_raw(ns, [bytes(k).hex() for k in keys], self._pieces(tj.chunk_ids, order))
                elapsed = time.perf_counter() - start
                hits = sum(found)
                if hits == len(keys):
                    return JobResult(tj.job_id, True, None, elapsed, hits * self.value_size)
                return JobResult(
                    tj.job_id, False, [k for k, f in zip(keys, found) if f], elapsed, hits * self.value_size
                )
            order, parents = chain_parents(keys, tj.req_context)
            hex_keys = [bytes(keys[i]).hex() for i in order]
            stored = client.store_put_many_raw(
                ns, hex_keys, [p.hex() if p is not None else None for p in parents], self._pieces(tj.chunk_ids, order)
            )
        except radixd.DaemonGoneError as e:
            self._gone(client, e)
            return JobResult(job_id=tj.job_id, success=False)
        except radixd.StoreFullError as e:
            logger.debug("radixd vLLM tier: store full, job %d failed: %s", tj.job_id, e)
            return JobResult(job_id=tj.job_id, success=False)
        elapsed = time.perf_counter() - start
        fresh = [keys[i] for i, now in zip(order, stored) if now]
        if self._events is not None and fresh:
            with self._lock:
                self._events.append(
                    OffloadingEvent(
                        keys=fresh, medium=self.medium, removed=False, locality=self.locality, ownership=OWNERSHIP
                    )
                )
        return JobResult(tj.job_id, True, None, elapsed, len(fresh) * self.value_size)


__all__ = ["RadixdTier", "RadixdTierError", "namespace_name", "daemon_name", "chain_parents"]
