"""SGLang 0.5.23's hybrid models on radixd: sliding-window (gpt-oss, Gemma 3,
Mistral with sliding windows) and Mamba (Qwen3-Next, Nemotron-H, Jamba).

SGLang builds a ``UnifiedRadixCache`` with components FULL+SWA or FULL+MAMBA
for these models; ``--radix-cache-backend radixd`` builds a
:class:`RadixdHybridCache` instead, over a daemon started with the same
components (``radixd serve --components full,swa --swa-window W`` or
``--components full,mamba --mamba-capacity N``) and SGLang's recency rule
(``--recency sglang``, under which it answers as ``UnifiedRadixCache``;
``exact``, the daemon's default, picks other victims for partial evictions,
and the factory warns: ``radixd.sglang.check_recency``). The tree, its rules
(matches cut back to where the window holds or a state was checkpointed,
tombstones, per-component LRU and eviction) and every pool live in radixd:

- **FULL and SWA pages**: SGLang's ``SWATokenToKVPoolAllocator`` allocates
  from radixd's paired pools (radixd page ``p`` is SGLang page ``p + 1`` on
  both sides, page 0 being SGLang's padding). Its
  ``full_to_swa_index_mapping`` (what ``translate_loc_from_full_to_swa``
  and so the SWA layers read) is kept to radixd's pairing: fresh pages when
  they are allocated, a locked prefix's pages when it is locked (another
  request's insert may have moved SWA pages onto them: tombstone recovery),
  cleared when pages or their SWA halves are freed.
- **Mamba states**: the ``HybridReqToTokenPool``'s ``MambaSlotAllocator``
  hands out radixd's state slots (state ``s`` is SGLang slot ``s + 1``,
  slot 0 being SGLang's dummy), for the requests' own states, the ping-pong
  track buffers and the tree's checkpoints alike, so one pool serves all.

A step asks the daemon no more than it must: the pairing comes back with
the calls that make or read it (``alloc_paired``, ``lock_paired``,
``insert_paired``), state slots go and come back together
(``alloc_states``, ``free_states``), and the pools' free space, which
SGLang asks before every allocation (FULL's and SWA's apart), is the
client's ``free_counts``: the counts the last answer that changed them
carried, asked again only when something else changed them.

What the request hooks do to a request (which length to insert, which state
to donate, the SWA slots that slid out of the window, the copy-on-write of
a matched state) is SGLang's own code: the ``SWAComponent`` and
``MambaComponent`` of its unified cache run them against this cache, as
``UnifiedRadixCache.checkpoint_into_tree`` and ``match_prefix`` run them.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any, Optional, Sequence

import torch
from sglang.srt.environ import envs
from sglang.srt.mem_cache.allocator.paged import alloc_decode_naive, alloc_extend_naive
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
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.utils import get_num_new_pages

import radixd

from .sglang_base import (
    cache_key,
    check_eviction_policy,
    check_recency,
    dfs_weight_order,
    eviction_policy,
    insert_hints,
    install_allocator,
    note_uncached,
    policy_flags,
    unified_recency,
)


def _ns(key: Any) -> Optional[str]:
    """The radixd namespace of ``key`` (a ``RadixKey`` or a ``Req``): one per
    LoRA adapter (``extra_key``) and tenant (``cache_salt``) pair, as
    SGLang's tree keeps one subtree per pair (``radixd.namespace_of``)."""
    return radixd.namespace_of(key)


logger = logging.getLogger(__name__)

# The node-slot bits of a handle: below the lock bit (``Handle::LOCK``).
_SLOT_MASK = (1 << 31) - 1

FULL = ComponentType.FULL
SWA = ComponentType.SWA
MAMBA = ComponentType.MAMBA


class HybridNode:
    """``req.last_node`` of a hybrid request: radixd's handle of the node
    (``None`` for the root; with SWA, a checkpoint's node is named by the
    handle of the lock its insert took, which names the node too), the
    tokens from the root to it and their namespace, the FULL pages on that path as read, and the
    MAMBA state at it (radixd's slot) when there is one. Two of them are
    equal when they name the same node slot (a node named by a lock lives
    while locked, so its slot is not reused meanwhile)."""

    __slots__ = ("handle", "prefix_len", "pages", "tokens", "mamba_state", "ns", "_indices")

    # SGLang's base dfs_weight_order walks ``children``; the tree is radixd's.
    children: dict = {}

    def __init__(
        self,
        handle: Optional[int],
        prefix_len: int,
        pages: Any = (),
        tokens: Any = None,
        mamba_state=None,
        ns: Optional[str] = None,
    ):
        self.handle = handle
        self.prefix_len = prefix_len
        self.pages = pages
        self.tokens = tokens
        self.mamba_state = mamba_state
        self.ns = ns
        self._indices: Optional[torch.Tensor] = None

    @property
    def id(self) -> int:
        return 0 if self.handle is None else self.handle

    @property
    def slot(self) -> Optional[int]:
        """The node's slot in radixd's arena (a lock's handle marks its
        index with bit 31; the generation or serial is the high half)."""
        return None if self.handle is None else self.handle & _SLOT_MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HybridNode) and other.slot == self.slot

    def __hash__(self) -> int:
        return hash(self.slot)

    def __repr__(self) -> str:
        if self.handle is None:
            return "HybridNode(root)"
        return f"HybridNode(handle={self.handle:#x}, prefix_len={self.prefix_len})"


def _pages_of(pages: Any) -> torch.Tensor:
    """radixd page ids (``array('I')`` or a sequence) as int64 SGLang page ids (``p + 1``)."""
    if len(pages) == 0:
        return torch.empty((0,), dtype=torch.int64)
    if hasattr(pages, "typecode"):
        return torch.frombuffer(pages, dtype=torch.int32).to(torch.int64) + 1
    return torch.tensor(list(pages), dtype=torch.int64) + 1


def _peers_of(peers: Any) -> torch.Tensor:
    """SWA peers as a paired call answers them (``array('I')``,
    ``radixd.NO_PAGE`` for none) as int64 radixd page ids, -1 for none."""
    if len(peers) == 0:
        return torch.empty((0,), dtype=torch.int64)
    return torch.frombuffer(peers, dtype=torch.int32).to(torch.int64)


def _tokens_of_pages(pages: torch.Tensor, ps: int) -> torch.Tensor:
    """Per-token KV indices of SGLang pages."""
    if ps == 1:
        return pages
    return (pages[:, None] * ps + torch.arange(ps, dtype=torch.int64, device=pages.device)).reshape(-1)


# ----- the SWA allocator on radixd's paired pools -----


class RadixdSWAAllocatorMixin:
    """The methods :func:`install_swa_allocator` gives SGLang's
    ``SWATokenToKVPoolAllocator``: FULL pages and their SWA peers come from
    radixd (which pairs them), frees go back to it, and
    ``full_to_swa_index_mapping`` follows radixd's pairing."""

    # ----- the mapping -----

    def _radixd_map(self, full_pages: torch.Tensor, swa_pages: torch.Tensor) -> None:
        """Pairs SGLang FULL pages with SGLang SWA pages in the mapping."""
        if full_pages.numel() == 0:
            return
        ps = self.page_size
        mapping = self.full_to_swa_index_mapping
        mapping[_tokens_of_pages(full_pages, ps).to(mapping.device)] = _tokens_of_pages(swa_pages, ps).to(mapping.device)

    def _radixd_unmap(self, full_pages: torch.Tensor) -> None:
        if full_pages.numel():
            idx = _tokens_of_pages(full_pages.to("cpu", torch.int64), self.page_size)
            self.full_to_swa_index_mapping.index_fill_(0, idx.to(self.full_to_swa_index_mapping.device), 0)

    def radixd_sync_pairs(self, radixd_pages: Any) -> None:
        """Writes radixd's current pairing of these (radixd) pages into the
        mapping: paired pages to their SWA peers, unpaired ones to 0."""
        if len(radixd_pages) == 0:
            return
        peers = self.radixd_backend.swa_pages(radixd_pages)
        self.radixd_set_pairs(radixd_pages, array("I", (radixd.NO_PAGE if s is None else s for s in peers)))

    def radixd_set_pairs(self, radixd_pages: Any, peers: Any) -> None:
        """Writes the pairing a paired call answered into the mapping: each
        of these (radixd) pages to its SWA peer in ``peers``
        (``array('I')``, ``radixd.NO_PAGE``: none, mapped to 0). One
        scatter, whatever the mix: a page without a peer is SGLang page 0
        on the SWA side, whose tokens map to 0 as ``_radixd_unmap`` does."""
        if len(radixd_pages) == 0:
            return
        ps = self.page_size
        mapping = self.full_to_swa_index_mapping
        full = _pages_of(radixd_pages)
        swa = _peers_of(peers) + 1
        if ps > 1:
            full = _tokens_of_pages(full, ps)
            swa = _tokens_of_pages(swa, ps) * (swa > 0).repeat_interleave(ps)
        mapping[full.to(mapping.device)] = swa.to(mapping.device)

    # ----- allocation -----

    def _radixd_pages(self, n: int) -> Optional[torch.Tensor]:
        """``n`` fresh SGLang FULL pages, each paired with a fresh SWA page
        (mapped), or ``None`` when radixd has not that many free or
        evictable (the scheduler evicts before it allocates, so radixd's
        own eviction only runs where SGLang's allocation would fail)."""
        if n <= 0:
            return torch.empty((0,), dtype=torch.int64, device=self.device)
        try:
            pages, peers = self.radixd_backend.alloc_paired(n)
        except radixd.InsufficientPagesError:
            return None
        full = _pages_of(pages)
        self._radixd_map(full, _peers_of(peers) + 1)
        return full.to(self.device)

    def _radixd_stats(self) -> dict:
        return self.radixd_backend.stats()

    def available_size(self) -> int:
        free, swa, _ = self.radixd_backend.free_counts()
        return min(free, swa) * self.page_size

    def full_available_size(self) -> int:
        return self.radixd_backend.free_counts()[0] * self.page_size

    def swa_available_size(self) -> int:
        return self.radixd_backend.free_counts()[1] * self.page_size

    def _conserve_full_available_size(self) -> int:
        return self.full_available_size()

    def _conserve_swa_available_size(self) -> int:
        return self.swa_available_size()

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        ps = self.page_size
        pages = self._radixd_pages(-(-need_size // ps))
        if pages is None:
            return None
        return _tokens_of_pages(pages, ps)[:need_size]

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        num_new_pages: Optional[int] = None,
        **_: Any,
    ) -> Optional[torch.Tensor]:
        """As ``SWATokenToKVPoolAllocator.alloc_extend``: new FULL pages from
        radixd laid out by SGLang's ``alloc_extend_naive``; each new page's
        SWA peer is radixd's (a partly filled last page keeps its peer)."""
        if num_new_pages is None:
            num_new_pages = get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu)
        pages = self._radixd_pages(int(num_new_pages))
        if pages is None:
            return None
        out = torch.empty((extend_num_tokens,), dtype=torch.int64, device=self.device)
        alloc_extend_naive(prefix_lens, seq_lens, last_loc, pages, out, self.page_size, self.device)
        return out

    def alloc_decode(self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, **_: Any) -> Optional[torch.Tensor]:
        num_new_pages = get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size, decode=True)
        pages = self._radixd_pages(int(num_new_pages))
        if pages is None:
            return None
        out = torch.empty((len(seq_lens),), dtype=torch.int64, device=self.device)
        alloc_decode_naive(seq_lens, last_loc, pages, out, self.page_size, int(num_new_pages))
        return out

    # ----- frees -----

    def _page_ids(self, free_index: torch.Tensor) -> torch.Tensor:
        return torch.unique(free_index.to("cpu", torch.int64) // self.page_size)

    def _radixd_release(self, op: str, pages: torch.Tensor) -> None:
        """Frees SGLang pages (``op`` ``"kv"``: the page and its SWA peer;
        ``"swa"``: only the peer), or queues it inside a free group."""
        pages = pages[pages > 0]
        if pages.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append((op, pages))
            return
        self._radixd_unmap(pages)
        radixd_pages = (pages - 1).numpy()
        if op == "swa":
            self.radixd_backend.free_swa(radixd_pages)
        else:
            self.radixd_backend.free(radixd_pages)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel():
            self._radixd_release("kv", self._page_ids(free_index))

    def free_full(self, free_index: torch.Tensor) -> None:
        # The page's SWA peer went earlier (free_swa); radixd frees what is left.
        self.free(free_index)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        if free_index.numel() == 0:
            return
        ps = self.page_size
        assert start_pos % ps == 0, f"segment start {start_pos} is not page-aligned"
        self._radixd_release("kv", free_index[::ps].to("cpu", torch.int64) // ps)

    free_full_segment = free_segment

    def free_swa(self, free_index: torch.Tensor) -> None:
        if free_index.numel():
            self._radixd_release("swa", self._page_ids(free_index))

    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        if free_index.numel() == 0:
            return
        ps = self.page_size
        assert start_pos % ps == 0, f"segment start {start_pos} is not page-aligned"
        self._radixd_release("swa", free_index[::ps].to("cpu", torch.int64) // ps)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        self._radixd_release("kv", page_ids.to("cpu", torch.int64))

    def free_group_begin(self) -> None:
        assert self.free_group is None, "free groups cannot be nested"
        self.free_group = []

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if not pending:
            return
        # SWA halves first (as SGLang's group end), then whole pages.
        for op in ("swa", "kv"):
            pages = [p for o, p in pending if o == op]
            if pages:
                self._radixd_release(op, torch.unique(torch.cat(pages)))

    def merge_and_sort_free(self) -> None:
        """Nothing to merge: free pages live in radixd."""

    def get_all_free_pages(self) -> None:
        return None

    def clear(self) -> None:
        """Nothing local to clear: the pages live in radixd. The mapping is
        emptied (its trailing -1 stays, as SGLang's ``clear``)."""
        self.full_to_swa_index_mapping[:-1].fill_(0)
        self.free_group = None
        self.swa_free_group = []
        self.swa_page_ids_group = []
        for sub in (self.full_attn_allocator, self.swa_attn_allocator):
            sub.free_pages = torch.empty((0,), dtype=torch.int64, device=self.device)
            sub.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)


def _swap_class(obj: Any, mixin: type, prefix: str = "Radixd") -> None:
    """Gives ``obj`` the mixin's methods in place (every holder sees them):
    its class becomes a direct subclass with the mixin's methods copied in."""
    cls = type(obj)
    methods = {k: v for k, v in vars(mixin).items() if k not in ("__dict__", "__weakref__", "__module__", "__doc__")}
    obj.__class__ = type(f"{prefix}{cls.__name__}", (cls,), methods)


def install_swa_allocator(allocator: Any, backend: Any) -> Any:
    """Makes SGLang's ``SWATokenToKVPoolAllocator`` allocate FULL pages and
    their SWA peers from radixd, in place."""
    if getattr(allocator, "radixd_backend", None) is None:
        _swap_class(allocator, RadixdSWAAllocatorMixin)
    allocator.radixd_backend = backend
    allocator.clear()
    return allocator


# ----- the Mamba state pool on radixd's state slots -----


class RadixdMambaSlotMixin:
    """The methods :func:`install_mamba_allocator` gives SGLang's
    ``MambaSlotAllocator``: slots are radixd's states (``s + 1``)."""

    def available_size(self) -> int:
        return self.radixd_backend.free_counts()[2]

    def schedulable_available_size(self) -> int:
        return self.available_size()

    def _do_alloc(self, need_size: int) -> Optional[torch.Tensor]:
        # As SGLang's: None when fewer are free (the caller evicts and asks
        # again, holding what it must keep locked meanwhile).
        if need_size <= 0:
            return torch.empty((0,), dtype=torch.int64, device=self.device)
        if need_size > self.available_size():
            return None
        slots = self.radixd_backend.alloc_states(need_size)
        return torch.tensor(slots, dtype=torch.int64, device=self.device) + 1

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        self.radixd_backend.free_states([int(slot) - 1 for slot in free_index.reshape(-1).tolist()])

    def clear(self) -> None:
        """Nothing local to clear: the slots live in radixd."""
        self.free_slots = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._alloc_iter = None


def install_mamba_allocator(allocator: Any, backend: Any) -> Any:
    """Makes SGLang's ``MambaSlotAllocator`` hand out radixd's state slots, in place."""
    if getattr(allocator, "radixd_backend", None) is None:
        _swap_class(allocator, RadixdMambaSlotMixin)
    allocator.radixd_backend = backend
    allocator.clear()
    return allocator


# ----- the cache -----


class _NoMatch:
    """radixd's answer to a match in a namespace it could not register."""

    len = full_kv_hit_length = 0
    handle = mamba_state = None
    pages = ()


_NO_MATCH = _NoMatch()


class _TreeView:
    """What SGLang's components read off ``tree_core`` in the request hooks
    this cache runs: the page size, whether keys are bigrams, and a node's
    state."""

    def __init__(self, cache: "RadixdHybridCache"):
        self.page_size = cache.page_size
        self.is_eagle = cache.is_eagle
        self.root_node = cache.root_node
        self._device = cache.mamba_device

    def get_component_device_value(self, node: Any, component_type: ComponentType) -> Optional[torch.Tensor]:
        if component_type is MAMBA and node is not None and node.mamba_state is not None:
            return torch.tensor([node.mamba_state + 1], dtype=torch.int64, device=self._device)
        return None


class RadixdHybridCache(BasePrefixCache):
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL+SWA or FULL+MAMBA) on
    radixd's components. ``backend`` is a ``radixd.Client`` (the node's
    daemon) or a ``radixd.Engine`` whose components match the model's;
    ``params`` SGLang's ``CacheInitParams`` with ``tree_components``."""

    def __init__(self, params: Any, backend: Any, install: bool = True):
        from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent
        from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent

        self.backend = backend
        # Under a policy other than LRU every insert carries the request's
        # priority and what it inserted before, as UnifiedRadixCache's do
        # (the policy's keys read them).
        self._hinted = getattr(backend, "eviction_policy", "lru") != "lru"
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.page_size = params.page_size
        if params.tree_components is None:
            # Built by the registry factory: SGLang sets them only for its own
            # UnifiedRadixCache (create_unified_radix_cache); the daemon's are
            # the model's (checked at start-up).
            names = backend.components.split(",")
            params.tree_components = (FULL,) + ((SWA,) if "swa" in names else ()) + ((MAMBA,) if "mamba" in names else ())
        self.tree_components = tuple(params.tree_components)
        self.is_swa_enabled = SWA in self.tree_components
        self.is_mamba_enabled = MAMBA in self.tree_components
        # EAGLE / MTP: bigram keys, as UnifiedTreeCore's (never with MAMBA:
        # SGLang keys a Mamba model's tree by tokens whatever the
        # speculative algorithm); radixd keys raw tokens 1..N in a
        # namespace of token 0 (radixd.bigram_key).
        self.is_eagle = bool(params.is_eagle) and not self.is_mamba_enabled
        #: Keys left uncached because radixd's namespace table was full.
        self.uncached_keys = 0
        self.enable_mamba_extra_buffer = bool(params.enable_mamba_extra_buffer) and self.is_mamba_enabled
        self._sliding_window_size = params.swa_retain_window if self.is_swa_enabled else None
        self.decoder_swa_bounded_replay = False
        self.draft_swa_window = params.draft_swa_window
        self.enable_session_radix_cache = False
        allocator = params.token_to_kv_pool_allocator
        if install and allocator is not None:
            if self.is_swa_enabled:
                install_swa_allocator(allocator, backend)
            else:
                install_allocator(allocator, backend)
            if self.is_mamba_enabled:
                install_mamba_allocator(self.req_to_token_pool.mamba_allocator, backend)
        self.token_to_kv_pool_allocator = allocator
        dev = getattr(allocator, "device", None) if allocator is not None else None
        self.device = torch.device(dev) if isinstance(dev, (str, torch.device)) else torch.device("cpu")
        self.mamba_device = self.device
        if self.is_mamba_enabled:
            self.mamba_device = torch.device(self.req_to_token_pool.mamba_allocator.device)
            from sglang.srt.runtime_context import mamba_checkpoint_grid

            self.mamba_checkpoint_grid = mamba_checkpoint_grid(self.page_size)
        self.root_node = HybridNode(None, 0)
        self._empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        # SGLang's own request hooks (what to insert, what to donate, what to
        # free), run against this cache.
        self.components: dict = {}
        if self.is_swa_enabled:
            self.components[SWA] = SWAComponent(self, params)
        if self.is_mamba_enabled:
            self.components[MAMBA] = MambaComponent(self, params)
        view = _TreeView(self)
        for comp in self.components.values():
            comp.tree_core = view
        self._components_tuple = tuple(self.components.values())

    # ----- what SGLang asks of a unified cache -----

    @property
    def sliding_window_size(self) -> Optional[int]:
        return self._sliding_window_size

    def supports_swa(self) -> bool:
        return self.is_swa_enabled

    def supports_mamba(self) -> bool:
        return self.is_mamba_enabled

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def swa_retain_floor(self, req: Any) -> Optional[int]:
        # UnifiedRadixCache's: only a cache with both SWA and Mamba keeps a
        # window behind the last checkpoint; radixd runs one of the two.
        return None

    def is_root(self, node: Any) -> bool:
        return node is None or node.handle is None

    def reset(self) -> None:
        self.backend.reset()

    # ----- matching -----

    def _miss(self, full: int = 0) -> MatchResult:
        root = self.root_node
        return MatchResult(device_prefix_len=0, last_device_node=root, last_host_node=root, best_match_node=root, full_kv_hit_length=full)

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """As ``UnifiedRadixCache.match_prefix``: the deepest cached prefix
        every component serves (radixd's match), the branching points past
        it, and the components' finalizers (Mamba's copy-on-write of the
        matched state into the request's own slot)."""
        key = params.key
        if self.disable:
            return self._miss()
        tokens, ns = self._key(key)
        try:
            m = self.backend.match_prefix(tokens, ns=ns)
        except radixd.BadNamespaceError as e:
            note_uncached(self, ns, e)
            m = _NO_MATCH
        n, full = m.len, m.full_kv_hit_length
        if n == 0:
            node = self.root_node
        else:
            node = HybridNode(m.handle, n, m.pages, tokens, m.mamba_state, ns)
        ps = self.page_size
        swa_branch = mamba_branch = None
        if self.is_swa_enabled:
            aligned = full // ps * ps
            swa_branch = aligned if aligned > n else None
        if self.is_mamba_enabled:
            grid = self.mamba_checkpoint_grid
            aligned = full // grid * grid
            mamba_branch = aligned if aligned > n else None
        result = MatchResult(
            device_prefix_len=n,
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
            swa_branching_seqlen=swa_branch,
            mamba_branching_seqlen=mamba_branch,
            full_kv_hit_length=full,
        )
        for comp in self._components_tuple:
            result = comp.finalize_match_result_in_cache(params, result)
        return result

    def touch_prefix(self, key: Any) -> None:
        if not self.disable:
            tokens, ns = self._key(key)
            try:
                self.backend.match_prefix(tokens, ns=ns)
            except radixd.BadNamespaceError as e:
                note_uncached(self, ns, e)

    def _key(self, key: Any, tokens: Any = None) -> tuple:
        """radixd's tokens and namespace for ``key`` (``sglang_base.cache_key``)."""
        return cache_key(key, self.is_eagle, tokens)

    def path_device_indices(self, node: Any) -> torch.Tensor:
        if node is None or node.handle is None:
            return self._empty
        ind = node._indices
        if ind is None:
            ind = _tokens_of_pages(_pages_of(node.pages), self.page_size).to(self.device)
            node._indices = ind
        return ind

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list[int]:
        """``BasePrefixCache.dfs_weight_order`` (``--schedule-policy
        dfs-weight``): SGLang's order, read off the nodes' paths
        (:func:`radixd.sglang_base.dfs_weight_order`)."""
        return dfs_weight_order(
            [
                None if node is None or node.handle is None else (node.ns, node.tokens[: node.prefix_len])
                for node in node_handles
            ],
            self.page_size,
        )

    # ----- locks -----

    def _window_pages(self, node: Any) -> Any:
        """The pages of ``node``'s path inside the SWA window: the ones the
        SWA layers read, whose peers the mapping must name."""
        keep = self._window_len()
        pages = node.pages
        return pages[max(0, len(pages) - keep) :]

    def inc_lock_ref(self, node: Any, skip_lock_components: Sequence[ComponentType] = ()) -> IncLockRefResult:
        """Locks ``node`` (FULL on the path, SWA on its window, MAMBA at it).
        The receipt's ``node_id`` is the lock's handle: with SWA it names
        this lock, so its release gives back exactly the window it took
        (SGLang's receipt), whatever the order locks go in. Under SWA the
        mapping is brought to radixd's pairing of the window's pages, which
        the request is about to read."""
        if self.disable or node is None or node.handle is None:
            return IncLockRefResult(delta=0)
        if skip_lock_components:
            raise ValueError("radixd locks every component of a node together")
        allocator = self.token_to_kv_pool_allocator
        if self.is_swa_enabled and allocator is not None:
            window = self._window_pages(node)
            lock, delta, peers = self.backend.lock_paired(node.handle, window)
            allocator.radixd_set_pairs(window, peers)
        else:
            lock, delta, _ = self.backend.lock_paired(node.handle)
        return IncLockRefResult(delta=delta, node_id=lock)

    def dec_lock_ref(self, node: Any, params: Optional[DecLockRefParams] = None, skip_swa: bool = False) -> DecLockRefResult:
        """Releases the lock ``params`` is the receipt of (the node's oldest
        lock of this client without one)."""
        if self.disable or node is None or node.handle is None:
            return DecLockRefResult(delta=0)
        handle = node.handle if params is None or params.node_id is None else params.node_id
        return DecLockRefResult(delta=self.backend._lock_delta(handle, False))

    def lock(self, node: Any, skip_lock_components: Sequence[ComponentType] = ()) -> Optional[TreeLock]:
        return TreeLock(node, self.inc_lock_ref(node, skip_lock_components).to_dec_params())

    def unlock(self, lock: Optional[TreeLock]) -> None:
        if lock is not None:
            self.dec_lock_ref(lock.node, lock.receipt)

    # ----- inserting -----

    def insert(self, params: InsertParams) -> InsertResult:
        """As ``UnifiedRadixCache.insert`` with the KV indices of
        ``params.value`` (pages this client holds, the tree's own for the
        prefix it matched), the SWA evicted length and the Mamba state."""
        key = params.key
        if self.disable:
            return InsertResult(prefix_len=0)
        tokens, ns = self._key(key)
        return self._insert(tokens, params, lock=False, ns=ns)[0]

    def _insert(self, tokens: Any, params: InsertParams, lock: bool, ns: Optional[str] = None) -> tuple:
        ps = self.page_size
        n = len(tokens) // ps * ps
        if n == 0:
            return InsertResult(prefix_len=0, last_device_node=self.root_node), None
        pages, extra = self._insert_args(n, params)
        try:
            r = self.backend.insert(tokens[:n], pages, lock=lock, ns=ns, **extra)
        except radixd.BadNamespaceError as e:
            # Not cached: the pages go back to the pool, and a state given
            # is the caller's to free, as when the node had one (mamba_exist).
            note_uncached(self, ns, e)
            self.backend.free(pages)
            return InsertResult(prefix_len=0, last_device_node=self.root_node, mamba_exist="mamba_state" in extra), None
        return self._insert_result(n, r, params), r.handle

    def _insert_args(self, n: int, params: InsertParams) -> tuple:
        """The radixd pages of an insert of ``n`` tokens (one per page of
        ``params.value``) and its hybrid extras (the state to donate, the
        SWA evicted length)."""
        ps = self.page_size
        value = params.value
        if value is None or len(value) < n:
            raise ValueError(f"radixd: an insert of {n} tokens needs {n} KV indices")
        pages = (value[:n:ps].to("cpu", torch.int64) // ps - 1).numpy()
        extra = {}
        if self.is_mamba_enabled and params.mamba_value is not None:
            extra["mamba_state"] = int(params.mamba_value.reshape(-1)[0]) - 1
        swa_evicted = params.get_evicted_seqlen(SWA) if self.is_swa_enabled else 0
        if swa_evicted:
            extra["swa_evicted"] = min(swa_evicted, n)
        if self._hinted:
            extra.update(insert_hints(params.priority, params.inserted_len))
        return pages, extra

    def _insert_result(self, n: int, r: Any, params: InsertParams) -> InsertResult:
        result = InsertResult(prefix_len=r.cached, total_len=r.len, mamba_exist=r.mamba_exist)
        if self.is_swa_enabled and params.swa_branching_seqlen is not None:
            result.swa_branch_inserted = n >= params.swa_branching_seqlen
        return result

    def _window_len(self) -> int:
        """Pages of a path's end inside the SWA window (see ``_window_pages``)."""
        return -(-(self._sliding_window_size + self.page_size) // self.page_size)

    def checkpoint(self, req: Any, *, up_to: int, **_: Any) -> None:
        """As ``UnifiedRadixCache.checkpoint_into_tree``: the components say
        how much to insert (and which state to donate), the insert takes the
        new lock in the same request, the row points at the tree's pages,
        the old lock goes, and the components clean up."""
        is_finished = req.finished()
        token_ids = req.full_untruncated_fill_ids[:up_to]
        comps = self._components_tuple
        if self.disable:
            if is_finished:
                for comp in comps:
                    comp.cleanup_after_caching_req(req, is_finished=True)
            return
        kv = req.kv
        insert_params = InsertParams(
            prev_prefix_len=kv.cache_protected_len,
            inserted_len=kv.cache_inserted_len,
            priority=req.priority or 0,
        )
        effective = len(token_ids)
        for comp in comps:
            cl = comp.prepare_for_caching_req(req=req, insert_params=insert_params, token_ids_len=len(token_ids), is_finished=is_finished)
            if cl is not None:
                effective = min(effective, cl)
        for comp in comps:
            effective = comp.floor_cache_len(effective)
        # The key's length: with bigram keys one fewer than its tokens.
        tokens, ns = self._key(req, token_ids[: max(effective, 0)])
        if not is_finished and envs.SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS.get():
            for comp in comps:
                comp.free_out_of_window_slots(req, len(tokens) - 1, insert_params)
        ps = self.page_size
        aligned = len(tokens) // ps * ps
        if aligned <= 0 or (self.is_eagle and aligned < kv.cache_protected_len):
            # Nothing to key (SGLang's empty insert changes no node): the
            # components release what they prepared. With bigram keys also a
            # request that computed nothing past its match (its last token is
            # no bigram's first): SGLang's scheduler never checkpoints one
            # (every request extends a token at least), and its prefix stays
            # protected here.
            for comp in comps:
                comp.cleanup_after_caching_req(req, is_finished=is_finished, insert_params=insert_params)
            return
        tokens = tokens[:aligned]
        eagle = int(self.is_eagle)
        insert_params.key = RadixKey(token_ids[: aligned + eagle], req.extra_key, is_bigram=bool(eagle), cache_salt=req.cache_salt)
        insert_params.value = self.req_to_token_pool.req_to_token[kv.req_pool_idx, :aligned].to(dtype=torch.int64, copy=True)
        # One request: the insert, the new lock on the key's node, its FULL
        # pages (the tree's walk, not a match, which components may cut
        # back) and, under SWA, the window's pairing after it.
        pages, extra = self._insert_args(aligned, insert_params)
        tail = self._window_len() if self.is_swa_enabled else 0
        try:
            r, key_pages, peers = self.backend.insert_paired(tokens, pages, lock=True, ns=ns, tail=tail, **extra)
        except radixd.BadNamespaceError as e:
            # Not cached: the row stays the request's own (note_uncached),
            # the components release what they prepared.
            note_uncached(self, ns, e)
            for comp in comps:
                comp.cleanup_after_caching_req(req, is_finished=is_finished, insert_params=insert_params)
            return
        result = self._insert_result(aligned, r, insert_params)
        handle = r.handle
        kv.cache_inserted_len = max(kv.cache_inserted_len, aligned)
        got = len(key_pages) * self.page_size
        if got != aligned:
            raise RuntimeError(f"radixd: an insert of {aligned} tokens left {got} cached under its lock")
        node = HybridNode(handle, aligned, key_pages, tokens, ns=ns)
        new_indices = self.path_device_indices(node)
        start = kv.cache_protected_len
        if aligned > start:
            self.req_to_token_pool.write((kv.req_pool_idx, slice(start, aligned)), new_indices[start:])
        if self.is_swa_enabled:
            # Tombstone recovery may have moved this request's SWA pages
            # onto the tree's; the window is what the request reads next.
            self.token_to_kv_pool_allocator.radixd_set_pairs(self._window_pages(node), peers)
        # SGLang releases the old lock and takes one on the key's node, whose
        # window covers the node as it is now: the insert took that one (its
        # handle names it under SWA), and the old one releases its own.
        self.unlock(req.lock)
        req.lock = TreeLock(node, IncLockRefResult(node_id=handle).to_dec_params())
        kv.cache_protected_len = aligned
        req.last_node = node
        result.last_device_node = node
        for comp in comps:
            comp.cleanup_after_caching_req(req, is_finished=is_finished, insert_result=result, insert_params=insert_params)

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        """As ``UnifiedRadixCache.on_release``: a request released without a
        checkpoint (an abort) gives back its component state."""
        if checkpointed:
            return
        for comp in self._components_tuple:
            comp.cleanup_after_caching_req(req, is_finished=True)

    # ----- eviction and sizes -----

    def evict(self, params: EvictParams) -> EvictResult:
        """Evicts FULL tokens, then SWA tokens and MAMBA states, each until
        its own amount went (counting what the earlier ones freed), as
        ``UnifiedRadixCache.evict``."""
        if self.disable:
            return EvictResult()
        full = max(params.num_tokens, 0)
        swa = max(params.swa_num_tokens, 0) if self.is_swa_enabled else 0
        mamba = max(params.mamba_num, 0) if self.is_mamba_enabled else 0
        if full == 0 and swa == 0 and mamba == 0:
            return EvictResult()
        r = self.backend.evict_components(full, swa, mamba)
        return EvictResult(num_tokens_evicted=r.evicted, swa_num_tokens_evicted=r.swa_evicted, mamba_num_evicted=r.mamba_evicted)

    def _stats(self) -> dict:
        return self.backend.stats()

    def evictable_size(self) -> int:
        return self._stats()["evictable_tokens"]

    def protected_size(self) -> int:
        return self._stats()["protected_tokens"]

    full_evictable_size = evictable_size
    full_protected_size = protected_size

    def swa_evictable_size(self) -> int:
        return self._stats().get("swa_evictable_tokens", 0)

    def swa_protected_size(self) -> int:
        return self._stats().get("swa_protected_tokens", 0)

    def mamba_evictable_size(self) -> int:
        return self._stats().get("mamba_evictable_states", 0)

    def mamba_protected_size(self) -> int:
        return self._stats().get("mamba_protected_states", 0)

    def total_size(self) -> int:
        return self._stats()["total_tokens"]

    def available_and_evictable_str(self) -> str:
        s = self._stats()
        ps = self.page_size
        lines = [f"Available full tokens: {(s['free_pages'] * ps) + s['evictable_tokens']} (radixd)"]
        if self.is_swa_enabled:
            lines.append(f"Available SWA tokens: {s['swa_free_pages'] * ps + s['swa_evictable_tokens']} (radixd)")
        if self.is_mamba_enabled:
            lines.append(f"Available mamba states: {s['mamba_free_states'] + s['mamba_evictable_states']} (radixd)")
        return "\n".join(lines) + "\n"

    def pretty_print(self) -> None:
        s = self._stats()
        print(f"#tokens: {s['total_tokens']} ({s['nodes']} nodes, {s['free_pages']} free pages, radixd {s.get('components', 'full')})")


# ----- the factory -----


def _refuse(option: str, why: str) -> None:
    raise ValueError(f"--radix-cache-backend radixd does not support {option}: {why}")


def _serve_line(name: str, params: Any, is_swa: bool) -> str:
    """The ``radixd serve`` line this model's pools need, with the server's
    eviction policy and the recency rule under which radixd evicts by it as
    ``UnifiedRadixCache`` does (``sglang_base.unified_recency``)."""
    alloc = params.token_to_kv_pool_allocator
    ps = params.page_size
    policy, config = eviction_policy(params)
    rules = f"--recency {unified_recency(policy)}{policy_flags(policy, config)}"
    if is_swa:
        return (
            f"radixd serve --name {name} --page-size {ps} --capacity {alloc.size_full // ps} "
            f"--components full,swa --swa-window {params.swa_retain_window} --swa-capacity {alloc.size_swa // ps} "
            f"{rules}"
        )
    slots = params.req_to_token_pool.mamba_allocator.size
    return (
        f"radixd serve --name {name} --page-size {ps} --capacity {alloc.size // ps} "
        f"--components full,mamba --mamba-capacity {slots} {rules}"
    )


def check_hybrid_model(ctx: Any) -> None:
    """Refuses, by name, what SGLang 0.5.23 can combine with a hybrid model
    and this backend does not run."""
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
    from sglang.srt.runtime_context import get_disagg, get_exec

    params = ctx.params
    if ctx.is_hybrid_swa and ctx.is_hybrid_ssm:
        _refuse("models with both sliding-window and Mamba layers", "radixd runs FULL+SWA or FULL+MAMBA, not both")
    if ctx.is_hybrid_swa and ctx.full_tokens_per_layer == 0:
        _refuse("pure sliding-window models (no full-attention layer)", "radixd's FULL component is always on")
    if getattr(get_disagg(), "disaggregation_mode", "null") not in (None, "null"):
        _refuse("--disaggregation-mode with a hybrid model", "its SWA-tail and state transfers are not mapped to radixd")
    if ctx.is_hybrid_swa:
        alloc = params.token_to_kv_pool_allocator
        if type(alloc) is not SWATokenToKVPoolAllocator and not hasattr(alloc, "radixd_backend"):
            _refuse(f"the {type(alloc).__name__} SWA allocator", "radixd pairs pages as SWATokenToKVPoolAllocator does")
        if getattr(alloc, "swa_req_ring", False):
            _refuse("a per-request SWA ring (unified_kv)", "its SWA lives outside the tree")
        if params.draft_swa_window or params.decoder_swa_bounded_replay:
            _refuse("a widened draft SWA window or decoder SWA bounded replay", "radixd's window is the model's")
        if envs.SGLANG_OPT_RELEASE_PREFILL_SWA.get():
            _refuse("SGLANG_OPT_RELEASE_PREFILL_SWA=1", "radixd releases a lock's components together")
    if ctx.is_hybrid_ssm:
        pool = params.req_to_token_pool
        if not isinstance(pool, HybridReqToTokenPool):
            _refuse(f"the {type(pool).__name__} request pool", "Mamba states need SGLang's HybridReqToTokenPool")
        if params.token_to_kv_pool_allocator.mamba_full_cache_donor() is not None:
            _refuse("a Mamba pool sharing bytes with the KV pool", "radixd's state slots are a pool of their own")
        if getattr(pool, "mamba_ckpt_pool", None) is not None:
            _refuse("int8 Mamba checkpoints", "radixd caches the states of the Mamba pool itself")
        if params.enable_mamba_extra_buffer_lazy:
            _refuse("--enable-mamba-extra-buffer-lazy", "it releases a lock's Mamba part alone")
        if envs.SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.get():
            _refuse("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1", "radixd locks a node's components together")
        if get_exec().mamba.mamba_max_states_per_path != -1:
            _refuse("--mamba-max-states-per-path", "radixd keeps every checkpointed state until it is evicted")


def check_daemon(backend: Any, name: str, params: Any, is_swa: bool) -> None:
    """The daemon's components, window and capacities must be the model's;
    otherwise a start-up error prints the ``radixd serve`` line to use."""
    alloc = params.token_to_kv_pool_allocator
    ps = params.page_size
    want = "full,swa" if is_swa else "full,mamba"
    if is_swa:
        sizes = (alloc.size_full // ps, params.swa_retain_window, alloc.size_swa // ps)
        have = (backend.capacity, backend.swa_window, backend.swa_capacity)
    else:
        sizes = (alloc.size // ps, params.req_to_token_pool.mamba_allocator.size)
        have = (backend.capacity, backend.mamba_capacity)
    if backend.page_size != ps or backend.components != want or have != sizes:
        raise ValueError(
            f"--radix-cache-backend radixd: the daemon {name!r} (page size {backend.page_size}, "
            f"{backend.capacity} pages, --components {backend.components}) does not match this model's pools; "
            f"start it with `{_serve_line(name, params, is_swa)}`"
        )


def connect_hybrid(ctx: Any, name: str, pool: Optional[dict] = None, group: Any = None) -> Any:
    """The daemon ``name``'s client for a hybrid model: refuses what radixd
    does not run beside one, connects binding its pool to ``pool`` (the
    scheduler's KV pool, ``radixd.sglang.pool_identity``) and, for a
    tensor-parallel rank, joining its ``group`` (``radixd.sglang.tp_group``),
    and checks its components, window and capacities against the model's
    pools and its eviction policy against the server's."""
    check_hybrid_model(ctx)
    params = ctx.params
    is_swa = bool(ctx.is_hybrid_swa)
    try:
        client = radixd.Client(name, pool=pool, group=None if group is None else group.join_args())
    except radixd.PoolMismatchError as e:
        raise radixd.PoolMismatchError(
            f"--radix-cache-backend radixd: daemon {name!r} refused this scheduler's KV pool: {e.message} "
            f"(this scheduler's KV pool: {pool})"
        ) from None
    except radixd.DaemonGoneError as e:
        raise RuntimeError(
            f"--radix-cache-backend radixd: no radixd daemon named {name!r} ({e}). Start one first: "
            f"`{_serve_line(name, params, is_swa)}`, or set RADIXD_NAME to the name of the running one"
        ) from e
    policy, config = eviction_policy(params)
    try:
        # The daemon must evict by the server's policy, or the victims are
        # not SGLang's: another is refused, naming both.
        check_eviction_policy(client, name, policy, config)
        check_daemon(client, name, params, is_swa)
    except ValueError:
        client.close()
        raise
    logger.info(
        "radixd: connected to %r (%s, page size %d, recency %s, eviction policy %s)",
        name, client.components, client.page_size, client.recency, client.eviction_policy,
    )
    check_recency(client, name, unified_recency(policy))
    return client


def hybrid_cache_factory(ctx: Any, name: str, pool: Optional[dict] = None, group: Any = None) -> RadixdHybridCache:
    """The ``radixd`` backend for a hybrid model: :func:`connect_hybrid`,
    then the cache on the daemon."""
    return RadixdHybridCache(ctx.params, connect_hybrid(ctx, name, pool, group))


__all__ = [
    "RadixdHybridCache",
    "HybridNode",
    "RadixdSWAAllocatorMixin",
    "RadixdMambaSlotMixin",
    "install_swa_allocator",
    "install_mamba_allocator",
    "check_hybrid_model",
    "check_daemon",
    "hybrid_cache_factory",
    "connect_hybrid",
]
