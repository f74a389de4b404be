"""SGLang 0.5.23's TreeCore on radixd: the ``radixd`` tree core under SGLang's
own ``UnifiedRadixCache`` (docs/sglang-parity.md).

:class:`RadixdTreeCore` implements SGLang's ``UnifiedTreeCoreInterface``
(``mem_cache/unified_cache/unified_tree_core_interface.py``) over a
``radixd.Engine`` (in-process) or a ``radixd.Client`` (a daemon's tree,
shared by every scheduler of the node): SGLang's controller, its
``UnifiedRadixCache``, drives it as it drives its own Python core or the
Rust one, so streaming sessions and everything else the controller keeps
work on radixd's tree.

Served (phases 1 to 3): full-attention models (the FULL component only),
every eviction policy SGLang 0.5.23 ships (radixd's engine evicts by the
same one, its parameters too: a backend on another is refused naming both;
inserts carry ``InsertParams.priority`` and ``inserted_len``, which the
policies' keys read), EAGLE's bigram keys (the mapping of
``sglang_base.cache_key``); FULL+SWA models under lru, fifo, mru and filo (radixd's SWA
component keeps the windows, tombstones and page pairing; the scheduler's
``SWATokenToKVPoolAllocator`` hands out radixd's paired pages:
docs/sglang-parity.md, section 13); no HiCache. What is not served is
refused at construction by name, and the methods only it would call raise
``NotImplementedError`` naming the feature, as SGLang's Rust adapter does
(``rust_tree_core/adapter.py``): HiCache and its storage, the MAMBA
component, KV events (the daemon publishes its own: ``radixd serve
--kv-events``), the external cache linker, buffer-only host memory, session
radix caches.

NodeIds are radixd's node handles (index and generation: a handle of an
evicted node is stale, never another node's); the root, which radixd names
by no handle, is :data:`ROOT` (0, no handle's value: a handle's generation
is never 0), the same for every namespace, as in SGLang's one-rooted tree.

KV: the tree's values are SGLang's KV slots of radixd's pages (page ``p``
is SGLang page ``p + 1``: :mod:`radixd.sglang_base`), so the scheduler's
token-to-KV allocator must hand out radixd's pages
(:func:`radixd.sglang_base.install_allocator`; :func:`unified_radix_cache`
installs it). radixd moves pages itself: an insert returns the pages of a
prefix cached meanwhile to the pool, an eviction frees the victim's, so the
core's steps carry no ``FreeDeviceKV`` action and no ``device_frees`` (the
controller would free them twice).

How each step maps (docs/sglang-parity.md, section 6, counts the round
trips):

- ``match_prefix``: radixd's ``match`` (split at the match's end, the path
  touched as SGLang's tree touches it: under ``--recency sglang``, or
  ``exact`` for ``fifo``/``filo``, whose upper half of a split keeps the
  node's creation in SGLang's core: ``sglang_base.unified_recency``; no hit
  counted, as SGLang's core counts hits on inserts only);
- ``begin_insert``: one insert, never suspended (a full-attention insert
  without HiCache emits no barrier action), after a ``peek_full`` of the key
  (no touch) that reads the tree's pages of the prefix the request did not
  own (``prev_prefix_len``: SGLang frees nothing there, so radixd is given
  the tree's own pages there), whose answer names the key's node;
- ``evict_device_next_node``: radixd's ``evict_leaf``, the policy's first
  unlocked leaf, whole (radixd's heap of unlocked leaves keyed by the
  strategy's tuple, as SGLang's walk's heap; the walk evicts whole leaves
  and checks its stop rule between them), answered as the walk's victim;
  ``evict_device_leaf`` reports what that freed;
- under SWA: a match is cut back to where the window holds (radixd's);
  an insert is ``insert_paired`` (tombstones, recovery, duplicates freed
  with their SWA peers; the key's pages answered) and a lock
  ``lock_paired`` (FULL on the path, SWA on the window, named by the lock's
  handle, which the receipt carries), answering the window's pairing into
  the allocator's mapping; the SWA eviction walk is one
  ``evict_components``;
- ``collect_full_device_indices``: the path's slots as the match or insert
  that named the node read them (a node's path never changes while it
  lives; SGLang reads it right after that call, or while it holds the
  node locked).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Optional, Sequence

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    DecLockRefResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import (
    EvictDeviceLeafResult,
    EvictDeviceNextNodeResult,
    InsertStepResult,
    NodeId,
    UnifiedTreeCoreInterface,
)

import radixd

from .sglang_base import (
    HYBRID_POLICIES,
    _pages_tensor,
    cache_key,
    check_eviction_policy,
    dfs_weight_order,
    eviction_policy,
    insert_hints,
    unified_recency,
)

logger = logging.getLogger(__name__)

#: The name the core is registered under (``CacheInitParams.tree_core_backend``).
BACKEND_NAME = "radixd"

#: The root's NodeId: no radixd handle is 0 (a handle's generation never is).
ROOT = 0

FULL = ComponentType.FULL
SWA = ComponentType.SWA

#: Paths kept past the nodes' locks, besides one per page of the pool: the
#: nodes the last calls named (SGLang reads a path right after the call
#: that named its node, or while it holds the node locked).
_RECENT_PATHS = 1024

# Connections for cores being built: SGLang's TreeCore factory gets only
# ``(params, components)``, so the caller files the backend under the very
# ``CacheInitParams`` object it builds the cache with (docs/sglang-parity.md,
# section 2).
_PENDING: dict[int, tuple[Any, Any]] = {}


def _unserved(feature: str, phase: str) -> NotImplementedError:
    return NotImplementedError(
        f"{feature} is not served by the radixd TreeCore yet ({phase} of docs/sglang-parity.md); "
        "SGLang's own tree cores serve it"
    )


def _hicache(method: str) -> NotImplementedError:
    return _unserved(f"{method} (HiCache, --enable-hierarchical-cache)", "phase 4")


def _hybrid(method: str) -> NotImplementedError:
    return _unserved(f"{method} (Mamba models: the MAMBA component)", "phase 2")


class RadixdTreeCore(UnifiedTreeCoreInterface):
    """SGLang 0.5.23's ``UnifiedTreeCoreInterface`` on radixd's tree
    (``backend``: a ``radixd.Engine`` or ``radixd.Client``). Built by SGLang's
    ``create_tree_core`` through the ``radixd`` factory
    (:func:`register`), with the backend filed by :func:`file_backend`."""

    supports_rotation_base = False

    def __init__(self, params: Any, components: dict, backend: Any):
        self.tree_components = tuple(components)
        extra = set(self.tree_components) - {FULL, SWA}
        if extra:
            names = ", ".join(sorted(c.name for c in extra))
            raise _unserved(f"the tree components {names} (Mamba models)", "phase 2")
        # FULL+SWA: radixd's SWA component keeps the window's pages, their
        # pairing and the tombstones (docs/sglang-parity.md, section 13).
        self._swa = SWA in self.tree_components
        if getattr(params, "enable_session_radix_cache", False):
            raise _unserved("--enable-session-radix-cache", "a later phase")
        if getattr(params, "component_registry_override", None):
            raise _unserved("component_registry_override (custom components)", "a later phase")
        # The server's policy and its parameters through SGLang's own check
        # (an unknown policy or parameter is refused as SGLang refuses it);
        # radixd must evict by the same, or the victims are not SGLang's.
        policy, policy_config = eviction_policy(params)
        name = getattr(backend, "name", None)
        check_eviction_policy(
            backend, name, policy, policy_config, what=None if name else "the in-process radixd.Engine"
        )
        if getattr(params, "enable_kv_cache_events", False):
            raise ValueError(
                "the radixd TreeCore reports no KV events: the daemon publishes its own "
                "(radixd serve --kv-events ENDPOINT)"
            )
        if backend.page_size != params.page_size:
            raise ValueError(
                f"the radixd TreeCore: radixd's page size is {backend.page_size}, SGLang's --page-size "
                f"{params.page_size}"
            )
        if self._swa:
            window = params.swa_retain_window
            if backend.components != "full,swa" or backend.swa_window != window:
                raise ValueError(
                    f"the radixd TreeCore: a sliding-window model (window {window}) needs radixd on "
                    f"--components full,swa --swa-window {window}; it runs --components {backend.components}"
                    + (f" --swa-window {backend.swa_window}" if backend.swa_window is not None else "")
                )
            if policy not in HYBRID_POLICIES:
                raise _unserved(f"--radix-eviction-policy {policy} with a sliding-window model", "phase 2")
            allocator = params.token_to_kv_pool_allocator
            if getattr(allocator, "radixd_backend", None) is not backend:
                raise ValueError(
                    "the radixd TreeCore: a sliding-window model's SWATokenToKVPoolAllocator must hand out "
                    "radixd's paired pages (radixd.sglang_hybrid.install_swa_allocator)"
                )
            # Pages of a path's end inside the window, the ones the SWA layers
            # read (RadixdHybridCache._window_len).
            self._window_len = -(-(window + params.page_size) // params.page_size)
            self._allocator = allocator
        elif backend.components != "full":
            raise ValueError(
                f"the radixd TreeCore: radixd runs --components {backend.components}; a full-attention "
                "model's matches must not be cut back by a second component"
            )
        recency = getattr(backend, "recency", "sglang")
        want = unified_recency(policy)
        if recency != want:
            logger.warning(
                "radixd TreeCore: radixd runs --recency %s, not the rule under which it evicts by %s as "
                "SGLang's tree core does (--recency %s): evictions can take other leaves than SGLang's would",
                recency, policy, want,
            )
        self.backend = backend
        self._page_size = params.page_size
        # Every policy but LRU reads what an insert carries (SGLang's
        # InsertParams.priority, and inserted_len for the hit counts).
        self._hinted = policy != "lru"
        # EAGLE / MTP: SGLang's core keys bigrams unless MAMBA is a component
        # (unified_tree_core.py:432; none is here); radixd keys raw tokens
        # 1..N in a namespace of token 0 (sglang_base.cache_key).
        self.is_eagle = bool(getattr(params, "is_eagle", False))
        allocator = params.token_to_kv_pool_allocator
        dev = getattr(allocator, "device", None) if allocator is not None else None
        self.device = torch.device(dev) if isinstance(dev, (str, torch.device)) else torch.device("cpu")
        self.enable_hicache = False
        self.is_host_memory_buffer_only = False
        self.write_through_threshold = 256
        self._enable_storage = False
        self._is_write_back = False
        self._has_swa_host_pool = False
        self._enable_external_cache_linker = False
        self.kv_events = KVCacheEventRecorder(enabled=False, page_size=self._page_size)
        self._arange = torch.arange(self._page_size, dtype=torch.int64)
        self._empty_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._empty_match_result = MatchResult(
            device_prefix_len=0,
            last_device_node=ROOT,
            last_host_node=ROOT,
            best_match_node=ROOT,
            cache_actions=[],
        )
        # Handle -> the SGLang KV slots of the path from the root to it.
        self._paths: OrderedDict[int, torch.Tensor] = OrderedDict()
        # Handle -> its namespace, the key that named it (not copied) and its
        # length in tokens, kept with its path (what ``dfs_weight_order``
        # orders by, cut to the node only then, off every match's path).
        self._keys: dict[int, tuple] = {}
        self._max_paths = int(backend.capacity) + _RECENT_PATHS
        # Handle -> this core's locks on it (their paths are kept).
        self._locks: dict[int, int] = {}
        # The eviction walk: its component and quota, the victim evict_leaf
        # took (handle, FULL tokens, SWA tokens), and under SWA the SWA
        # tokens still evictable before it (what the victim's freed is the
        # difference) and whether the SWA walk ran.
        self._walk: Optional[ComponentType] = None
        self._walk_quota: Optional[int] = None
        self._victim: Optional[tuple[int, int, int]] = None
        self._swa_evictable: Optional[int] = None
        self._swa_walked = False
        # URC.__init__ resets its core: the first reset leaves radixd's tree
        # as it is (a daemon's is shared by every scheduler of the node).
        self._joined = False

    # ==== state the controller reads and sets ====

    @property
    def page_size(self) -> int:
        return self._page_size

    @page_size.setter
    def page_size(self, value: int) -> None:
        if value != self._page_size:
            raise ValueError(f"the radixd TreeCore's page size is radixd's, {self._page_size}, not {value}")

    @property
    def enable_storage(self) -> bool:
        return self._enable_storage

    @enable_storage.setter
    def enable_storage(self, value: bool) -> None:
        if value:
            raise _unserved("HiCache storage (--hicache-storage-backend)", "phase 4")

    @property
    def is_write_back(self) -> bool:
        return self._is_write_back

    @is_write_back.setter
    def is_write_back(self, value: bool) -> None:
        if value:
            raise _hicache("write-back")

    @property
    def has_swa_host_pool(self) -> bool:
        return self._has_swa_host_pool

    @has_swa_host_pool.setter
    def has_swa_host_pool(self, value: bool) -> None:
        if value:
            raise _hicache("an SWA host pool")

    @property
    def enable_external_cache_linker(self) -> bool:
        return self._enable_external_cache_linker

    @enable_external_cache_linker.setter
    def enable_external_cache_linker(self, value: bool) -> None:
        if value:
            raise _unserved("the external cache linker", "a later phase")

    @property
    def root_node(self) -> Any:
        raise NotImplementedError("root_node: radixd's tree has no Python nodes (NodeIds are radixd handles)")

    # ==== tree API ====

    def reset(self) -> None:
        """Empties radixd's tree (through a daemon: one started with
        ``--allow-reset``), except when ``UnifiedRadixCache`` builds the
        core: a new scheduler joins the tree as it stands."""
        if self._joined:
            self.backend.reset()
        self._joined = True
        self._paths.clear()
        self._keys.clear()
        self._locks.clear()
        self._end_walk()

    def node_by_id(self, node_id: NodeId) -> Any:
        raise NotImplementedError("node_by_id: radixd's tree has no Python nodes (NodeIds are radixd handles)")

    def is_root(self, node_id: NodeId) -> bool:
        return node_id == ROOT

    def is_backuped(self, node_id: NodeId) -> bool:
        # No host tier: nothing is backed up.
        return False

    def is_full_device_evicted(self, node_id: NodeId) -> bool:
        # Without a host tier an evicted node leaves the tree: a live node's
        # KV is on the device.
        return False

    def root_node_handle(self, extra_key: Optional[str] = None) -> NodeId:
        return ROOT

    @property
    def empty_match_result(self) -> MatchResult:
        return self._empty_match_result

    def _key(self, key: Any) -> tuple:
        """radixd's tokens (whole pages) and namespace for SGLang's key; with
        EAGLE (or a bigram key) the bigram mapping, the key flipped to its
        bigram view in place as SGLang's core flips it
        (``maybe_to_bigram_view``): radixd token ``j`` is bigram ``j``, so
        lengths, locks and sizes count bigrams (KV slots), as SGLang's do."""
        tokens, ns = cache_key(key, self.is_eagle)
        n = len(tokens) // self._page_size * self._page_size
        return tokens[:n], ns

    def _hints(self, params: InsertParams) -> dict:
        """What the eviction policy reads of an insert, as
        ``RadixdPrefixCache`` sends it (``Request::Hinted``): none under LRU."""
        return insert_hints(params.priority, params.inserted_len) if self._hinted else {}

    def _slots(self, pages: Any) -> torch.Tensor:
        """radixd pages as SGLang's KV slots, one per token."""
        sg = _pages_tensor(pages)
        if self._page_size > 1:
            sg = (sg[:, None] * self._page_size + self._arange).reshape(-1)
        return sg.to(self.device)

    def _remember(self, handle: int, path: torch.Tensor, key: Optional[tuple] = None) -> None:
        """Keeps ``handle``'s path (its KV slots) and ``key`` (its namespace,
        a key through it and the node's length) for the calls that read them
        next."""
        paths = self._paths
        paths[handle] = path
        paths.move_to_end(handle)
        if key is not None:
            self._keys[handle] = key
        while len(paths) > self._max_paths:
            old = next(iter(paths))
            if old in self._locks:
                paths.move_to_end(old)
                if all(h in self._locks for h in paths):
                    break
                continue
            del paths[old]
            self._keys.pop(old, None)

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        tokens, ns = self._key(params.key)
        if len(tokens) == 0:
            return self._empty_match_result
        m = self.backend.match_prefix(tokens, ns=ns)
        # Under SWA radixd cuts the match back to where the window holds
        # (full_kv_hit_length: what FULL alone matched); the branching point
        # is FULL's page-aligned hit past it, as SGLang's SWA component sets
        # it (RadixdHybridCache.match_prefix).
        full = m.full_kv_hit_length if self._swa else m.len
        swa_branch = None
        if self._swa:
            aligned = full // self._page_size * self._page_size
            swa_branch = aligned if aligned > m.len else None
        if m.handle is None:
            return MatchResult(
                device_prefix_len=0,
                last_device_node=ROOT,
                last_host_node=ROOT,
                best_match_node=ROOT,
                swa_branching_seqlen=swa_branch,
                full_kv_hit_length=full,
                cache_actions=[],
            )
        self._remember(m.handle, self._slots(m.pages), (ns, tokens, m.len))
        return MatchResult(
            device_prefix_len=m.len,
            last_device_node=m.handle,
            last_host_node=m.handle,
            best_match_node=m.handle,
            swa_branching_seqlen=swa_branch,
            full_kv_hit_length=full,
            last_visited_node_id=m.handle,
            cache_actions=[],
        )

    def collect_full_device_indices(self, from_node_id: NodeId, until_node_id: NodeId) -> torch.Tensor:
        """The KV slots from ``until_node_id`` (the root, or an ancestor) down
        to ``from_node_id``, as the call that named the node read them."""
        if from_node_id == until_node_id:
            return self._empty_indices
        if from_node_id == ROOT:
            raise ValueError(f"node {until_node_id:#x} is not an ancestor of the root")
        path = self._paths.get(from_node_id)
        if path is None:
            raise KeyError(
                f"radixd TreeCore: node {from_node_id:#x} was neither named by a recent match or insert "
                "nor locked since"
            )
        if until_node_id == ROOT:
            return path
        above = self._paths.get(until_node_id)
        if above is None or len(above) > len(path) or not torch.equal(path[: len(above)], above):
            raise KeyError(f"radixd TreeCore: node {until_node_id:#x} is not a known ancestor of {from_node_id:#x}")
        return path[len(above) :]

    # ==== inserting ====

    def begin_insert(self, params: InsertParams) -> InsertStepResult:
        tokens, ns = self._key(params.key)
        n = len(tokens)
        if n == 0:
            empty = InsertResult(prefix_len=0, mamba_exist=True, last_device_node=ROOT)
            return InsertStepResult(actions=[], result=empty)
        if params.rotation_base is not None:
            raise _unserved("logical-page KV sharding (rotation bases)", "a later phase")
        value = params.value
        if value is None:
            raise ValueError("the radixd TreeCore inserts KV slots the scheduler allocated: params.value is None")
        if len(value) < n:
            raise ValueError(f"{len(value)} KV slots for a key of {n} tokens")
        ps = self._page_size
        own = (value[:n:ps].to("cpu", torch.int64) // ps - 1).numpy()
        # The tree's pages of the key, read without touching anything: SGLang
        # frees no duplicate below prev_prefix_len (those slots are the
        # tree's, the request got them from its match), so radixd is given
        # the tree's own pages there; past it, the request's, whose
        # duplicates radixd returns to the pool as SGLang's FreeDeviceKV.
        cached, tree_pages = self.backend.peek_full(tokens, ns=ns)
        keep = min(cached, max(int(params.prev_prefix_len or 0), 0)) // ps
        pages = own.copy()
        if keep:
            pages[:keep] = tree_pages[:keep]
        if self._swa:
            return self._insert_swa(tokens, ns, pages, params)
        r = self.backend.insert(tokens, pages, ns=ns, **self._hints(params))
        handle = r.node  # the node covering the key, named without a lock
        if r.cached == cached:
            # The tree's pages below ``cached``, the request's own slots past
            # it (radixd cached them): no page list is rebuilt in Python.
            head = self._slots(tree_pages[: cached // ps])
            path = torch.cat((head, value[cached:n].to(self.device, torch.int64)))
        else:  # the tree changed in between (another scheduler): read it again
            _, path_pages = self.backend.peek_full(tokens, ns=ns)
            path = self._slots(path_pages)
        self._remember(handle, path, (ns, tokens, len(path)))
        return InsertStepResult(actions=[], result=InsertResult(prefix_len=r.cached, last_device_node=handle))

    def _insert_swa(self, tokens: Any, ns: Optional[str], pages: Any, params: InsertParams) -> InsertStepResult:
        """A FULL+SWA insert, whole in one request (``insert_paired``):
        radixd frees the duplicates and their SWA peers, makes the leading
        ``swa_evicted`` tokens a tombstone, recovers tombstones the key
        crosses with the request's SWA pages, and answers the key's pages
        (the node's path). SGLang's Python core emits the same as actions
        (``FreeDeviceKV``, ``RecoverEvictedSWA``, ``RecoverSWAWithLockedFull``)
        at barriers; here they are done, so none is returned. The window's
        pairing, which a recovery may have moved onto the tree's FULL pages,
        reaches the allocator's mapping with the lock the controller takes
        on the key's node right after (``checkpoint_into_tree``), before the
        request reads its window again (:meth:`_lock_swa`)."""
        n = len(tokens)
        swa_evicted = min(int(params.get_evicted_seqlen(SWA) or 0), n)
        r, key_pages, _ = self.backend.insert_paired(
            tokens, pages, lock=False, swa_evicted=swa_evicted or None, ns=ns, **self._hints(params)
        )
        handle = r.node
        path = self._slots(key_pages)
        self._remember(handle, path, (ns, tokens, len(path)))
        result = InsertResult(prefix_len=r.cached, total_len=r.len, last_device_node=handle)
        if params.swa_branching_seqlen is not None:
            result.swa_branch_inserted = n >= params.swa_branching_seqlen
        return InsertStepResult(actions=[], result=result)

    def resume_insert(self) -> InsertStepResult:
        # A full-attention insert without HiCache never stops at a barrier.
        raise RuntimeError("no in-flight insert")

    def has_ongoing_insert(self) -> bool:
        return False

    def end_insert(self) -> list:
        return []

    # ==== locks ====

    def inc_lock_ref(self, node_id: NodeId, skip_lock_components: Sequence[ComponentType] = ()) -> IncLockRefResult:
        skipped = tuple(skip_lock_components)
        if node_id == ROOT or FULL in skipped:
            return IncLockRefResult(delta=0, node_id=node_id, skipped_lock_components=skipped)
        if self._swa:
            return self._lock_swa(node_id, skipped)
        # radixd answers the change in protected tokens before minus after.
        delta = -self.backend._lock_delta(node_id, True)
        self._locks[node_id] = self._locks.get(node_id, 0) + 1
        return IncLockRefResult(delta=delta, node_id=node_id, skipped_lock_components=skipped)

    def _lock_swa(self, node_id: NodeId, skipped: tuple) -> IncLockRefResult:
        """Locks FULL on the path and SWA on the window as radixd has it now
        (``lock_paired``). radixd's lock handle names this lock, so its
        release gives back exactly the window it took, whatever the order
        locks go in (SGLang's receipt); the receipt carries it as FULL's lock
        id (the controller reads only SWA's, for
        ``SGLANG_OPT_RELEASE_PREFILL_SWA``, which radixd does not serve). The
        window's pairing comes back with it into the allocator's mapping
        (another insert's tombstone recovery may have moved it)."""
        if skipped:
            names = ", ".join(c.name for c in skipped)
            raise ValueError(f"the radixd TreeCore locks a node's FULL and SWA together; asked to skip {names}")
        path = self._paths.get(node_id)
        if path is None:
            raise KeyError(
                f"radixd TreeCore: node {node_id:#x} was neither named by a recent match or insert nor locked since"
            )
        ps = self._page_size
        pages = (path[::ps].to("cpu", torch.int64) // ps - 1).tolist()
        window = radixd_pages(pages[max(0, len(pages) - self._window_len) :])
        lock, delta, peers = self.backend.lock_paired(node_id, window)
        self._allocator.radixd_set_pairs(window, peers)
        self._locks[node_id] = self._locks.get(node_id, 0) + 1
        result = IncLockRefResult(delta=-delta, node_id=node_id, skipped_lock_components=skipped)
        result.set_lock_uuid(FULL, lock)
        return result

    def dec_lock_ref(self, node_id: NodeId, params: DecLockRefParams, skip_swa: bool = False) -> DecLockRefResult:
        if params.node_id != node_id:
            raise ValueError(f"lock receipt anchored on node {params.node_id} released on node {node_id}")
        if node_id == ROOT or FULL in params.skipped_lock_components:
            return DecLockRefResult()
        if skip_swa:
            raise ValueError(
                "the radixd TreeCore releases a lock's FULL and SWA together (SGLANG_OPT_RELEASE_PREFILL_SWA "
                "is not served)"
            )
        # Under SWA the receipt names the lock (its window); else the node.
        lock = params.component_lock_uuids.get(FULL) if self._swa else None
        # Held for the next request (SGLang reads nothing of the answer):
        # one round trip fewer per release (docs/sglang-parity.md, section 6).
        self.backend.unlock_later(node_id if lock is None else lock)
        held = self._locks.get(node_id, 0) - 1
        if held > 0:
            self._locks[node_id] = held
        else:
            self._locks.pop(node_id, None)
        return DecLockRefResult()

    # ==== device eviction ====

    def evict_device_start(self, component_type: ComponentType, request_cnt: int) -> None:
        if component_type not in (FULL, SWA) or (component_type == SWA and not self._swa):
            raise ValueError(f"the radixd TreeCore has no {component_type.name} component to evict")
        self._walk = component_type
        self._walk_quota = request_cnt
        self._victim = None
        self._swa_walked = False
        self._swa_evictable = self._stats()["swa_evictable_tokens"] if self._swa and component_type == FULL else None

    def evict_device_next_node(
        self, component_type: ComponentType, tracker: dict[ComponentType, int]
    ) -> EvictDeviceNextNodeResult:
        if self._walk_quota is None or component_type != self._walk:
            raise RuntimeError(f"no {component_type.name} eviction walk in progress (evict_device_start)")
        if self._victim is not None:
            raise RuntimeError("evict the walk's victim (evict_device_leaf) before the next one")
        if component_type == SWA:
            return self._evict_swa(tracker)
        result = EvictDeviceNextNodeResult()
        if tracker.get(FULL, 0) >= self._walk_quota:
            return result
        leaf = self.backend.evict_leaf()
        if leaf is None:
            return result
        handle, tokens = leaf
        swa = 0
        if self._swa:
            # The leaf's SWA went with it when it held any (a tombstone holds
            # none): what SWA's evictable count lost, as SGLang's tracker
            # counts it.
            now = self._stats()["swa_evictable_tokens"]
            swa, self._swa_evictable = self._swa_evictable - now, now
        # radixd evicted it whole now, its pages back in the pool: the walk
        # names it, evict_device_leaf reports what went.
        self._victim = (handle, tokens, swa)
        self._paths.pop(handle, None)
        self._keys.pop(handle, None)
        self._locks.pop(handle, None)
        result.node_id = handle
        result.made_progress = True
        return result

    def _evict_swa(self, tracker: dict[ComponentType, int]) -> EvictDeviceNextNodeResult:
        """SGLang's SWA walk (``SWAComponent._evict_device_next_node``), whole
        in one request: radixd's ``evict_components`` walks SWA's list from
        its least recently used end, passing locked nodes, evicting unlocked
        leaves whole and making other nodes tombstones, until the SWA tokens
        the walk still wants went. SGLang's walk stops at the same point:
        its quota, or (``evict_for_alloc``) the SWA pool's free target, which
        every SWA token freed moves by one. Its leaves, which SGLang's walk
        names for ``evict_device_leaf``, are gone in this step; their counts
        come in the tracker."""
        result = EvictDeviceNextNodeResult()
        want = self._walk_quota - tracker.get(SWA, 0)
        if self._swa_walked or want <= 0:
            return result
        self._swa_walked = True
        r = self.backend.evict_components(0, want, 0)
        if r.evicted:
            result.tracker[FULL] = r.evicted
        if r.swa_evicted:
            result.tracker[SWA] = r.swa_evicted
        result.made_progress = bool(result.tracker)
        return result

    def evict_device_leaf(self, node_id: NodeId, is_write_back: bool) -> EvictDeviceLeafResult:
        if is_write_back:
            raise _hicache("write-back eviction")
        if self._victim is None or self._victim[0] != node_id:
            raise KeyError(f"node {node_id:#x} is not the eviction walk's victim")
        _, tokens, swa = self._victim
        self._victim = None
        result = EvictDeviceLeafResult()
        result.tracker[FULL] = tokens
        if swa:
            result.tracker[SWA] = swa
        return result

    def evict_device_end(self, component_type: ComponentType) -> None:
        self._end_walk()

    def _end_walk(self) -> None:
        self._walk = None
        self._walk_quota = None
        self._victim = None
        self._swa_evictable = None
        self._swa_walked = False

    # ==== sizes ====

    def _stats(self) -> dict:
        return self.backend.stats()

    def evictable_size(self) -> int:
        return self._stats()["evictable_tokens"]

    def protected_size(self) -> int:
        return self._stats()["protected_tokens"]

    def full_evictable_size(self) -> int:
        return self.evictable_size()

    def full_protected_size(self) -> int:
        return self.protected_size()

    def component_evictable_size(self, component_type: ComponentType) -> int:
        if component_type == FULL:
            return self.evictable_size()
        return self.swa_evictable_size() if component_type == SWA else 0

    def component_protected_size(self, component_type: ComponentType) -> int:
        if component_type == FULL:
            return self.protected_size()
        return self.swa_protected_size() if component_type == SWA else 0

    def swa_evictable_size(self) -> int:
        return self._stats()["swa_evictable_tokens"] if self._swa else 0

    def swa_protected_size(self) -> int:
        return self._stats()["swa_protected_tokens"] if self._swa else 0

    def mamba_evictable_size(self) -> int:
        return 0

    def mamba_protected_size(self) -> int:
        return 0

    def total_size(self) -> tuple[int, int]:
        """FULL's cached tokens and the other component's: SWA's live ones
        (a tombstone's are gone), as SGLang's core sums its values."""
        s = self._stats()
        aux = s["swa_evictable_tokens"] + s["swa_protected_tokens"] if self._swa else 0
        return s["total_tokens"], aux

    # ==== others ====

    def take_events(self) -> list:
        return []

    def sanity_check(self, ongoing_write_through: list, ongoing_load_back: list) -> None:
        """radixd's own invariant check (``validate``); raises on a broken one."""
        self.backend.validate()

    def pretty_print(self) -> None:
        s = self._stats()
        print(f"#tokens: {s['total_tokens']} ({s['nodes']} nodes, {s['free_pages']} free pages, radixd TreeCore)")

    def dfs_weight_order(self, node_ids: Sequence[NodeId]) -> list[int]:
        """SGLang's ``--schedule-policy dfs-weight`` order, read off the
        nodes' paths (:func:`radixd.sglang_base.dfs_weight_order`): the
        scheduler matches every waiting request just before it orders them,
        so each node's key was kept by that match. A node no longer known
        (named long ago, or evicted since) is ordered as the root's."""
        paths = []
        for h in node_ids:
            key = None if h == ROOT else self._keys.get(h)
            paths.append(None if key is None else (key[0], key[1][: key[2]]))
        return dfs_weight_order(paths, self._page_size)

    def all_values_flatten(self) -> torch.Tensor:
        raise _unserved("all_values_flatten (a census of the tree's slots)", "a later phase")

    def walk_for_kv_canary(self, unlocked_only: bool, swa_resident_only: bool) -> Any:
        raise _unserved("the KV canary (walk_for_kv_canary)", "a later phase")

    def collect_path_info(self, end_node_ids: Sequence[NodeId]) -> tuple:
        raise _unserved("collect_path_info (HiCache and the external cache linker)", "a later phase")

    def adjust_component_size(self, node_id: NodeId, component_type: ComponentType, delta: int) -> None:
        raise _unserved("adjust_component_size (sizes are radixd's, kept by its components)", "a later phase")

    # ==== hybrid components ====
    # FULL+SWA is served with radixd doing SWA's bookkeeping itself (section
    # 13): the core emits no component action, so the controller never
    # calls back the methods that execute them; the SWA methods left are
    # HiCache's or serve options radixd refuses. Mamba waits for phase 2's
    # rest.

    def dec_swa_lock_only(self, node_id: NodeId, params: DecLockRefParams) -> Any:
        raise _unserved(
            "dec_swa_lock_only (SGLANG_OPT_RELEASE_PREFILL_SWA=1: releasing a lock's SWA part alone)", "a later phase"
        )

    def finish_mamba_state_eviction(self, node_id: NodeId) -> Any:
        raise _hybrid("finish_mamba_state_eviction")

    def finish_swa_state_eviction(self, node_id: NodeId) -> Any:
        raise _hicache("finish_swa_state_eviction (an SWA host pool)")

    def evict_excess_path_states(self, tail_node_id, device_frees, host_frees, cache_actions) -> None:
        raise _hybrid("evict_excess_path_states")

    def all_mamba_values_flatten(self) -> torch.Tensor:
        raise _hybrid("all_mamba_values_flatten")

    def swa_tombstone_ranges(self, key, start, end, component_type=ComponentType.SWA) -> list:
        raise _hicache("swa_tombstone_ranges (buffer-only host memory)")

    def attach_swa_window(self, key, window_start, window_end, swa_values, component_type=ComponentType.SWA) -> list:
        raise _hicache("attach_swa_window (buffer-only host memory)")

    def set_component_device_value(self, node_id, component_type, value) -> None:
        raise _unserved(
            "set_component_device_value (radixd keeps the components' values; the core emits no action that "
            "sets one)",
            "a later phase",
        )

    def get_component_device_value(self, node_id, component_type) -> Any:
        raise _hybrid("get_component_device_value")

    def component_has_host_value_only(self, node_id, component_type) -> bool:
        raise _hicache("component_has_host_value_only")

    # ==== HiCache (phase 4) ====

    def set_hicache_enabled(self) -> None:
        raise _hicache("set_hicache_enabled")

    def set_host_memory_buffer_only(self) -> None:
        raise _hicache("set_host_memory_buffer_only (--hicache-host-memory-mode buffer_only)")

    def is_write_through_compatible(self) -> bool:
        raise _hicache("is_write_through_compatible")

    def get_last_hash_value(self, node_id):
        raise _hicache("get_last_hash_value")

    def get_prefix_hash_values(self, node_id):
        raise _hicache("get_prefix_hash_values")

    def get_hash_values(self, node_id):
        raise _hicache("get_hash_values")

    def snapshot_buffer_backup(self, node_id, pass_prefix_keys):
        raise _hicache("snapshot_buffer_backup")

    def validate_buffer_backup(self, node_id, expected_key_length):
        raise _hicache("validate_buffer_backup")

    def backfill_missing_hash_values(self) -> int:
        raise _hicache("backfill_missing_hash_values")

    def match_full_device_prefix(self, key):
        raise _hicache("match_full_device_prefix (buffer-only host memory)")

    def inc_full_pin(self, node_id) -> None:
        raise _hicache("inc_full_pin (buffer-only host memory)")

    def dec_full_pin(self, node_id) -> None:
        raise _hicache("dec_full_pin (buffer-only host memory)")

    def inc_host_lock_ref(self, node_id):
        raise _hicache("inc_host_lock_ref")

    def dec_host_lock_ref(self, node_id, params):
        raise _hicache("dec_host_lock_ref")

    def demote(self, node_id):
        raise _hicache("demote")

    def drop_subtree_no_host(self, node_id):
        raise _hicache("drop_subtree_no_host")

    def drive_host_eviction(self, component_type, num_tokens):
        raise _hicache("drive_host_eviction")

    def insert_host(self, node_id, key, host_value, hash_value):
        raise _hicache("insert_host")

    def build_backup_spec(self, node_id):
        raise _hicache("build_backup_spec")

    def build_storage_backup_spec(self, node_id, pass_prefix_keys):
        raise _hicache("build_storage_backup_spec")

    def build_hicache_transfers(self, component_type, node_id, phase, **kwargs):
        raise _hicache("build_hicache_transfers")

    def build_load_back_spec(self, node_id, req=None):
        raise _hicache("build_load_back_spec")

    def prefetch_anchor_info(self, node_id):
        raise _hicache("prefetch_anchor_info")

    def commit_hicache_transfers(self, node_id, phase, comp_xfers, **kwargs) -> None:
        raise _hicache("commit_hicache_transfers")

    def commit_backup(self, node_id, host_indices, comp_xfers) -> None:
        raise _hicache("commit_backup")

    def commit_load_back(self, node_id, device_indices, kv_xfer, comp_xfers):
        raise _hicache("commit_load_back")

    def finish_load_back(self, anchor_node_id) -> None:
        raise _hicache("finish_load_back")

    def mark_write_through_pending(self, node_ids, ack_id):
        raise _hicache("mark_write_through_pending")

    def finish_write_through(self, node_ids, ack_id) -> None:
        raise _hicache("finish_write_through")

    # ==== external cache linker ====

    def build_external_linker_offload_transfers(self, node_id):
        raise _unserved("the external cache linker", "a later phase")

    def mark_external_cache_stored_path(self, from_node_id, until_node_id) -> None:
        raise _unserved("the external cache linker", "a later phase")

    def mark_external_linker_offload_pending(self, node_id) -> None:
        raise _unserved("the external cache linker", "a later phase")

    def finish_external_linker_offload(self, node_ids, ack_id, success) -> None:
        raise _unserved("the external cache linker", "a later phase")


def radixd_pages(pages: Any) -> Any:
    """``pages`` (a list or an ``array``) as radixd's ``array('I')``."""
    from array import array

    return pages if isinstance(pages, array) else array("I", (int(p) for p in pages))


def file_backend(params: Any, backend: Any) -> None:
    """Files ``backend`` for the core SGLang builds with ``params`` (the very
    object): SGLang's TreeCore factory gets only ``(params, components)``."""
    _PENDING[id(params)] = (params, backend)


def _factory(params: Any, components: dict) -> RadixdTreeCore:
    filed = _PENDING.pop(id(params), None)
    if filed is None or filed[0] is not params:
        raise ValueError(
            "tree_core_backend='radixd' without a radixd connection: build the cache through "
            "--radix-cache-backend radixd (or radixd.treecore.unified_radix_cache)"
        )
    return RadixdTreeCore(params, components, filed[1])


def register() -> None:
    """Registers the ``radixd`` TreeCore with SGLang (once per process)."""
    from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
        get_tree_core_factory,
        register_tree_core_backend,
    )

    if get_tree_core_factory(BACKEND_NAME) is None:
        register_tree_core_backend(BACKEND_NAME, _factory)


def unified_radix_cache(params: Any, backend: Any, install: bool = True) -> Any:
    """SGLang's own ``UnifiedRadixCache`` on radixd's tree: ``params`` (SGLang's
    ``CacheInitParams``) with ``tree_core_backend="radixd"``, the core on
    ``backend`` (a ``radixd.Engine`` or ``radixd.Client``), and (``install``)
    the scheduler's allocator handing out radixd's pages."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from .sglang_base import install_allocator
    from .sglang_hybrid import install_swa_allocator

    register()
    if install and params.token_to_kv_pool_allocator is not None:
        if SWA in (params.tree_components or ()):
            # FULL pages and their SWA peers from radixd's paired pools.
            install_swa_allocator(params.token_to_kv_pool_allocator, backend)
        else:
            install_allocator(params.token_to_kv_pool_allocator, backend)
    params.tree_core_backend = BACKEND_NAME
    file_backend(params, backend)
    try:
        return UnifiedRadixCache(params=params)
    finally:
        _PENDING.pop(id(params), None)


__all__ = ["RadixdTreeCore", "BACKEND_NAME", "ROOT", "register", "file_backend", "unified_radix_cache"]
