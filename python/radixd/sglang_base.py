"""What both SGLang backends build on (:mod:`radixd.sglang` for
full-attention models, :mod:`radixd.sglang_hybrid` for SWA and Mamba ones):
the tokens of SGLang's keys, the token-to-KV allocator that takes its slots
from radixd's pool, and the recency and eviction-policy checks every
factory makes. Both import
it; it imports neither, so the two backends stand in one direction
(``sglang`` may dispatch to ``sglang_hybrid``, never the other way back).

KV slots: SGLang's pools keep slot page 0 as padding, so radixd page ``p`` is
SGLang page ``p + 1``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional

import torch
from sglang.srt.mem_cache.allocator import BaseTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.paged import alloc_decode_naive, alloc_extend_naive
from sglang.srt.utils import get_num_new_pages

import radixd

logger = logging.getLogger(__name__)


def _token_ids(key: Any) -> Any:
    """The tokens of a ``RadixKey`` (honouring its ``limit``), or ``key``
    itself when it is a plain sequence or buffer."""
    tokens = getattr(key, "token_ids", None)
    if tokens is None:
        return key
    limit = key.limit
    if limit is not None and limit < len(tokens):
        return tokens[:limit]
    return tokens


def cache_key(key: Any, is_eagle: bool, tokens: Any = None) -> tuple:
    """radixd's tokens and namespace for SGLang's ``key`` (a ``RadixKey``,
    or a ``Req`` with ``tokens``): one namespace per LoRA adapter
    (``extra_key``) and tenant (``cache_salt``) pair, as SGLang keeps one
    subtree per pair (``radixd.namespace_of``). With EAGLE, or a key that
    is a bigram view already, the bigram mapping (``radixd.bigram_key``); a
    ``RadixKey`` is flipped to its bigram view in place, as
    ``RadixKey.maybe_to_bigram_view`` flips it in ``RadixCache``."""
    bigram = False
    if tokens is None:
        tokens = _token_ids(key)
        bigram = getattr(key, "is_bigram", False)
        if is_eagle and bigram is False and hasattr(key, "token_ids"):
            key.is_bigram = True
    ns = radixd.namespace_of(key)
    if is_eagle or bigram:
        return radixd.bigram_key(tokens, ns)
    return tokens, ns


def _pages_tensor(pages: Any) -> torch.Tensor:
    """radixd pages (``array('I')``) as SGLang page ids (``p + 1``), int64."""
    if len(pages) == 0:
        return torch.empty((0,), dtype=torch.int64)
    return torch.frombuffer(pages, dtype=torch.int32).to(torch.int64) + 1


class RadixdAllocatorMixin:
    """The methods :func:`install_allocator` gives SGLang's token-to-KV
    allocator: KV slots come from radixd's pool, a page at
    a time, through the daemon, so every scheduler sharing the daemon
    allocates from one pool. ``available_size`` is radixd's free pages (the
    scheduler adds ``tree_cache.evictable_size()``, radixd's evictable
    tokens, itself: SGLang's ``PrefillBudget``), read from the client's
    ``free_counts`` (the counts the step's answers carry, no ``stats`` round
    trip while nobody else changed them); an allocation that needs more
    evicts in the daemon."""

    def _radixd_pages(self, n: int) -> Optional[torch.Tensor]:
        """``n`` fresh SGLang page ids, or ``None`` when radixd has not that
        many free or evictable (as SGLang's allocators answer)."""
        if n <= 0:
            return torch.empty((0,), dtype=torch.int64, device=self.device)
        try:
            pages = self.radixd_backend.alloc(n)
        except radixd.InsufficientPagesError:
            return None
        return _pages_tensor(pages).to(self.device)

    def _radixd_free(self, sglang_pages: torch.Tensor) -> None:
        if sglang_pages.numel():
            self.radixd_backend.free((sglang_pages.to("cpu", torch.int64) - 1).numpy())

    # ----- BaseTokenToKVPoolAllocator -----

    def available_size(self) -> int:
        return self.radixd_backend.free_counts()[0] * self.page_size

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        ps = self.page_size
        pages = self._radixd_pages(-(-need_size // ps))
        if pages is None:
            return None
        if ps == 1:
            return pages
        out = (pages[:, None] * ps + torch.arange(ps, device=self.device)).reshape(-1)
        return out[:need_size]

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
        """As ``PagedTokenToKVPoolAllocator.alloc_extend``, with the new pages
        taken from radixd (SGLang's own ``alloc_extend_naive`` lays them out)."""
        if num_new_pages is None:
            num_new_pages = get_num_new_pages(
                seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu
            )
        pages = self._radixd_pages(int(num_new_pages))
        if pages is None:
            return None
        out = torch.empty((extend_num_tokens,), dtype=torch.int64, device=self.device)
        alloc_extend_naive(prefix_lens, seq_lens, last_loc, pages, out, self.page_size, self.device)
        return out

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, **_: Any
    ) -> Optional[torch.Tensor]:
        """As ``PagedTokenToKVPoolAllocator.alloc_decode``, pages from radixd."""
        num_new_pages = get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size, decode=True)
        pages = self._radixd_pages(int(num_new_pages))
        if pages is None:
            return None
        out = torch.empty((len(seq_lens),), dtype=torch.int64, device=self.device)
        alloc_decode_naive(seq_lens, last_loc, pages, out, self.page_size, int(num_new_pages))
        return out

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(free_index.clone())
            return
        self._radixd_free(torch.unique(free_index // self.page_size))

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        # As PagedTokenToKVPoolAllocator.free_segment: a page-aligned start
        # makes free_index[::P] hit each page once.
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(free_index.clone())
            return
        ps = self.page_size
        assert start_pos % ps == 0, f"segment start {start_pos} is not page-aligned"
        self._radixd_free(free_index[::ps] // ps)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        if self.free_group is not None:
            self.free_group.append((page_ids * self.page_size).clone())
            return
        self._radixd_free(page_ids)

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(torch.cat(pending))

    def merge_and_sort_free(self) -> None:
        """Nothing to merge: free pages live in the daemon."""

    def get_all_free_pages(self) -> None:
        # Debug census of the local free list (BaseTokenToKVPoolAllocator):
        # there is none, the daemon has them (`radixd stat`).
        return None

    def clear(self) -> None:
        """SGLang clears its pool on a cache flush, when no request runs; the
        pages this client held went back to radixd with each free, and the
        daemon owns the rest, so there is nothing local to clear."""
        self.free_pages = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.release_pages = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.staged_pages = []
        self.num_staged_pages = 0
        self.free_group = None
        self.free_page_ids_group = []


def install_allocator(allocator: BaseTokenToKVPoolAllocator, backend: Any) -> BaseTokenToKVPoolAllocator:
    """Makes ``allocator`` (SGLang's ``TokenToKVPoolAllocator`` or
    ``PagedTokenToKVPoolAllocator``, already held by the scheduler, its
    batches and the KV pool) allocate from radixd, in place: its class
    becomes a subclass with :class:`RadixdAllocatorMixin`'s methods, and its
    own free list is emptied, so no slot is handed out twice."""
    if getattr(allocator, "radixd_backend", None) is not None:
        allocator.radixd_backend = backend
        return allocator
    cls = type(allocator)
    num_pages = allocator.size // allocator.page_size
    if backend.capacity != num_pages:
        raise ValueError(
            f"--radix-cache-backend radixd: the daemon has {backend.capacity} pages, SGLang's KV pool "
            f"{num_pages} pages of {allocator.page_size} tokens; start it with "
            f"`radixd serve --page-size {allocator.page_size} --capacity {num_pages} {RECENCY_FLAG}` "
            f"(or give SGLang --max-total-tokens {backend.capacity * allocator.page_size})"
        )
    # The class is swapped in place (every holder of the allocator sees it),
    # so the new class must add no base of another layout: the mixin's
    # methods are copied into a direct subclass of the allocator's class.
    methods = {
        k: v for k, v in vars(RadixdAllocatorMixin).items() if k not in ("__dict__", "__weakref__", "__module__")
    }
    allocator.__class__ = type(f"Radixd{cls.__name__}", (cls,), methods)
    allocator.radixd_backend = backend
    allocator.clear()
    return allocator


def note_uncached(cache: Any, ns: Optional[str], why: Exception) -> None:
    """A key left out of ``cache`` because radixd refused to register its
    namespace ``ns``: its table (``MAX_NAMESPACES``, 2^20 names over the
    engine's life) is full, the only refusal possible for the names the
    backends build (1 to 256 bytes each). A match then misses and an insert
    keeps nothing (its pages go back to the pool; a checkpoint leaves the
    request its own row, which its release frees): every answer is a
    correct cache's, never another prefix's KV, only hits are lost. Warned
    once per cache, then counted in ``cache.uncached_keys``."""
    if not getattr(cache, "uncached_keys", 0):
        logger.warning(
            "radixd: namespace %r cannot be registered (%s); keys in namespaces radixd has not "
            "seen yet are not cached from now on (EAGLE takes one per first token and LoRA/tenant "
            "namespace; a restarted daemon has an empty table)", ns, why,
        )
    cache.uncached_keys = getattr(cache, "uncached_keys", 0) + 1


#: The recency rule under which radixd's trees answer as SGLang 0.5.23's
#: (``RadixCache`` and ``UnifiedRadixCache``): a split touches the node's
#: lower half, as SGLang's ``_split_node`` does.
SGLANG_RECENCY = "sglang"

#: The flag every ``radixd serve`` line this backend prints carries.
RECENCY_FLAG = f"--recency {SGLANG_RECENCY}"


def unified_recency(policy: str) -> str:
    """The recency rule under which radixd's tree evicts by ``policy`` as
    SGLang 0.5.23's unified tree core (``UnifiedRadixCache``, the radixd
    TreeCore's controller) does. ``fifo`` and ``filo`` read a node's
    creation: that core's ``_split_node`` gives the upper half the node's
    creation, which radixd does under ``exact`` (under ``sglang`` it makes
    the upper half anew, as ``RadixCache`` does). Their last use only
    breaks ties, and no two leaves share a creation (a split's halves are
    never leaves at once), so ``exact``'s other rule changes no victim.
    Every other policy reads the last use, for which SGLang's rule is
    ``sglang`` (both trees touch a split's lower half)."""
    return "exact" if policy in ("fifo", "filo") else SGLANG_RECENCY


def check_recency(client: Any, name: str, want: str = SGLANG_RECENCY) -> bool:
    """Whether the daemon ``name`` (``client``'s) runs the recency rule
    ``want`` (SGLang's, ``sglang``, unless :func:`unified_recency` says
    otherwise); a warning says what differs and the flag to add when it
    does not.

    A warning, not a refusal: under another rule every answer is still a
    correct cache's (the prefix a match names is cached, its KV is its
    own); only the victims of partial evictions differ from SGLang's, and
    so the hit rate (docs/hybrid.md, "Recency").
    """
    recency = client.recency
    if recency == want:
        return True
    if want != SGLANG_RECENCY:
        logger.warning(
            "radixd: daemon %r runs --recency %s: under --radix-eviction-policy fifo or filo SGLang's "
            "unified tree gives a split's upper half the node's creation, which radixd does under "
            "--recency %s; victims can differ from SGLang's. Restart it with --recency %s",
            name, recency, want, want,
        )
        return False
    logger.warning(
        "radixd: daemon %r runs --recency %s, not SGLang's rule: a match that splits a node leaves "
        "the part below it at its last use, so a partial eviction can take another leaf than "
        "SGLang's tree would and later matches can differ (docs/hybrid.md, \"Recency\"). For "
        "SGLang's answers restart it with %s",
        name, recency, RECENCY_FLAG,
    )
    return False


def eviction_policy(params: Any) -> tuple:
    """The server's ``--radix-eviction-policy`` and its
    ``--radix-eviction-policy-config`` with SGLang's defaults filled in:
    ``(name, {parameter: int})``. The config goes through SGLang's own
    ``get_eviction_strategy`` first, so what SGLang refuses at start-up (an
    unknown policy, a key the policy does not take) is refused here alike."""
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    policy = str(getattr(params, "eviction_policy", "lru") or "lru").lower()
    config = dict(getattr(params, "eviction_policy_config", None) or {})
    strategy = get_eviction_strategy(policy, config)
    full = {k: getattr(strategy, k) for k in POLICY_PARAMETERS.get(policy, ())}
    return policy, full


#: The eviction policies radixd serves for hybrid models (FULL+SWA,
#: FULL+MAMBA) as SGLang's ``UnifiedRadixCache`` evicts by them, each
#: checked by the hybrid twins: those whose keys read a node's creation or
#: last use. The others (``lfu``, ``slru``, ``priority``, ``tlru``) read an
#: insert's hit counts or priorities, on which a hybrid insert's answers
#: part from SGLang's (docs/hybrid.md, "Eviction policies").
HYBRID_POLICIES = ("lru", "fifo", "mru", "filo")

#: The parameters each policy takes, as ``radixd serve
#: --eviction-policy-config`` and SGLang's strategies name them.
POLICY_PARAMETERS = {"tlru": ("threshold", "next_prompt_estimate"), "slru": ("protected_threshold",)}


def policy_flags(policy: str, config: dict) -> str:
    """The ``radixd serve`` flags of ``policy`` with ``config`` (nothing for
    LRU, the daemon's default)."""
    if policy == "lru":
        return ""
    flags = f" --eviction-policy {policy}"
    if config:
        flags += f" --eviction-policy-config '{json.dumps(config, separators=(', ', ': '))}'"
    return flags


_INT64_MAX = (1 << 63) - 1


def insert_hints(priority: Optional[int], inserted_len: Optional[int]) -> dict:
    """What radixd's eviction policy reads of an insert (SGLang's
    ``InsertParams.priority`` and ``inserted_len``), as ``insert`` and
    ``insert_paired`` take them: the priority clamped to 64 bits, a
    negative length as none."""
    p = int(priority or 0)
    return {"priority": max(min(p, _INT64_MAX), -_INT64_MAX - 1), "inserted_len": max(int(inserted_len or 0), 0)}


def check_eviction_policy(client: Any, name: str, policy: str, config: dict, what: Optional[str] = None) -> None:
    """Refuses a daemon whose eviction policy (``radixd serve
    --eviction-policy``, with its parameters) is not the server's
    ``--radix-eviction-policy`` (with ``--radix-eviction-policy-config``):
    its victims would not be SGLang's. The message names both. ``what``
    names the backend where it is not a daemon (an in-process engine)."""
    theirs = client.eviction_policy
    their_config = dict(client.eviction_policy_config)
    if (theirs, their_config) == (policy, config):
        return
    ours = policy + (f" {config}" if config else "")
    daemon = theirs + (f" {their_config}" if their_config else "")
    raise ValueError(
        f"--radix-cache-backend radixd: {what or f'daemon {name!r}'} evicts by --eviction-policy {daemon}, this server by "
        f"--radix-eviction-policy {ours}: its victims would not be SGLang's. Restart the daemon with"
        f"{policy_flags(policy, config) or ' --eviction-policy lru'}, or start the server with the daemon's policy"
    )


__all__ = [
    "note_uncached",
    "RadixdAllocatorMixin",
    "install_allocator",
    "check_recency",
    "unified_recency",
    "check_eviction_policy",
    "insert_hints",
    "HYBRID_POLICIES",
    "eviction_policy",
    "policy_flags",
    "POLICY_PARAMETERS",
    "SGLANG_RECENCY",
    "RECENCY_FLAG",
]


def dfs_weight_order(paths: Any, page_size: int) -> list:
    """SGLang's ``--schedule-policy dfs-weight`` order
    (``base_prefix_cache._dfs_weight_order``) of requests whose last nodes
    end the given paths: ``paths[i]`` is request ``i``'s ``(namespace,
    tokens)`` from the root to its last node (``None`` or empty tokens: the
    root). SGLang walks its tree depth first, a node's children by the
    number of requests in their subtrees, most first, and lists a node's
    own requests after its children's. radixd's tree lives in the daemon,
    but the part of it that orders these requests is fixed by their paths:
    a node of SGLang's tree that holds requests in more than one child
    subtree sits where their paths part, at a page boundary. Children of
    equal weight come in SGLang's tree in the order the tree made them,
    which radixd does not keep; here the one whose first request is first
    in the queue leads (python/README.md, "Supported")."""
    # A path is (namespace,) + tokens: position 0 is the namespace, so a
    # node ``t`` tokens deep has a path of length ``t + 1``; the root's is 0.
    items = []
    for i, path in enumerate(paths):
        ns, tokens = path if path is not None else (None, ())
        tokens = tuple(tokens) if tokens is not None else ()
        items.append(((ns,) + tokens if tokens else (), i))
    order: list = []
    stack: list = [(items, 0, False)]
    while stack:
        group, length, emit = stack.pop()
        if emit:
            order.extend(i for _, i in group)
            continue
        # SGLang's child key: a namespace's first page below the root, the
        # next page below any other node.
        edge_len = page_size + 1 if length == 0 else page_size
        children: dict = {}
        for p, i in group:
            if len(p) > length:
                children.setdefault(p[length : length + edge_len], []).append((p, i))
        ranked = []
        for members in children.values():
            first = members[0][0]
            end = min(len(p) for p, _ in members)
            common = length + edge_len
            while common < end and all(p[common] == first[common] for p, _ in members[1:]):
                common += 1
            # The child ends at a request's node or where the paths part,
            # cut back to a page boundary (a node holds whole pages).
            child = 1 + (common - 1) // page_size * page_size
            ranked.append((-len(members), members[0][1], members, min(child, end)))
        ranked.sort(key=lambda r: (r[0], r[1]))
        # Children first, the heaviest first; this node's own requests last.
        stack.append(([(p, i) for p, i in group if len(p) == length], length, True))
        for _, _, members, child in reversed(ranked):
            stack.append((members, child, False))
    return order
