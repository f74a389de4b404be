"""A hybrid scheduler over SGLang 0.5.23's own objects: ``Req``, its real
SWA and Mamba pools and allocators, and the functions its scheduler calls
(``Req.init_next_round_input`` with the Mamba copy-on-write,
``BasePrefixCache.lock``, ``alloc_req_slots``, ``alloc_token_slots`` /
``alloc_paged_token_slots_extend`` / ``alloc_paged_token_slots_decode``,
``evict_sliding_windows`` as ``ScheduleBatch.maybe_evict_swa`` calls it in
decode, ``checkpoint``, ``release_kv_cache``). One ``HybridSim`` drives one
tree cache; ``HybridTwin`` drives SGLang's ``UnifiedRadixCache`` (Python
tree core) and radixd's backend with the same random decisions and compares
every answer, size and pool after every step.

The model's part is played by tables: which token each FULL and SWA KV slot
holds (written where the allocator's mapping says the SWA layers write), and
a mark of the prefix each Mamba state slot summarises, written into the real
``MambaPool`` tensors (so SGLang's own state copies carry it). A matched
prefix must read back its own tokens in FULL, its window in SWA, and the
copy-on-write source its own prefix."""

from __future__ import annotations

import hashlib
import random
from array import array
from typing import Any, Callable, Optional

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
from sglang.srt.mem_cache.allocation import (
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_req_slots,
    alloc_token_slots,
)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import release_kv_cache
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, get_radix_cache_factory
from sglang.srt.sampling.sampling_params import SamplingParams

import unified_sim as us

MAX_CONTEXT = us.MAX_CONTEXT


def publish(page_size: int) -> None:
    """The process-wide config a hybrid scheduler publishes (SGLang's pools
    and components read it)."""
    us.publish_runtime(page_size)
    us._server_args(page_size)


def swa_params(
    page_size: int, full_pages: int, swa_pages: int, window: int, rows: int = 16, context: int = MAX_CONTEXT
) -> CacheInitParams:
    """SGLang's pools for a FULL+SWA model: an ``SWAKVPool`` and its
    ``SWATokenToKVPoolAllocator``, sliding window ``window``."""
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pool = ReqToTokenPool(size=rows, max_context_len=context, device="cpu", enable_memory_saver=False)
    kv = SWAKVPool(
        size=full_pages * page_size,
        size_swa=swa_pages * page_size,
        page_size=page_size,
        dtype=us.DTYPE,
        head_num=us.HEAD_NUM,
        head_dim=us.HEAD_DIM,
        swa_attention_layer_ids=us.OTHER_LAYERS,
        full_attention_layer_ids=us.FULL_LAYERS,
        device="cpu",
    )
    alloc = SWATokenToKVPoolAllocator(
        size=full_pages * page_size,
        size_swa=swa_pages * page_size,
        page_size=page_size,
        dtype=us.DTYPE,
        device="cpu",
        kvcache=kv,
        need_sort=False,
    )
    return CacheInitParams(
        disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=page_size, sliding_window_size=window
    )


def mamba_params(page_size: int, full_pages: int, slots: int, rows: int = 8, context: int = MAX_CONTEXT) -> CacheInitParams:
    """SGLang's pools for a FULL+MAMBA model: a ``HybridReqToTokenPool``
    with a ``MambaPool`` of ``slots`` states (the extra ping-pong buffer at
    page sizes above 1, as SGLang requires) and the KV allocator."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool

    extra = page_size > 1
    with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = Mamba2StateShape.create(
            tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=2, head_dim=16, state_size=4, conv_kernel=4
        )
        cache_params = Mamba2CacheParams(shape=shape, layers=us.OTHER_LAYERS)
    pool = HybridReqToTokenPool(
        size=rows,
        mamba_size=slots,
        mamba_spec_state_size=rows,
        max_context_len=context,
        device="cpu",
        enable_memory_saver=False,
        cache_params=cache_params,
        mamba_layer_ids=us.OTHER_LAYERS,
        enable_mamba_extra_buffer=extra,
        speculative_num_draft_tokens=3,
    )
    kv = HybridLinearKVPool(
        size=full_pages * page_size,
        dtype=us.DTYPE,
        page_size=page_size,
        head_num=us.HEAD_NUM,
        head_dim=us.HEAD_DIM,
        full_attention_layer_ids=us.FULL_LAYERS,
        device="cpu",
        enable_memory_saver=False,
        mamba_pool=pool.mamba_pool,
    )
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(full_pages, us.DTYPE, "cpu", kv, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(full_pages * page_size, page_size, us.DTYPE, "cpu", kv, False)
    return CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        enable_mamba_extra_buffer=extra,
    )


def sglang_cache(kind: str, p: CacheInitParams) -> Any:
    """SGLang's own ``UnifiedRadixCache`` for these pools (Python tree core)."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    p.tree_components = (us.FULL, us.SWA if kind == "swa" else us.MAMBA)
    p.tree_core_backend = "python"
    return UnifiedRadixCache(params=p)


def build_context(kind: str, p: CacheInitParams) -> TreeCacheBuildContext:
    return TreeCacheBuildContext(
        server_args=None,
        params=p,
        is_hybrid_swa=kind == "swa",
        is_hybrid_ssm=kind == "mamba",
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )


def radixd_cache(kind: str, p: CacheInitParams) -> Any:
    """The ``radixd`` backend as SGLang builds it: the factory its registry
    holds (the plugin registered it), for the daemon ``RADIXD_NAME``."""
    factory = get_radix_cache_factory("radixd")
    assert factory is not None, "the radixd plugin did not register its backend"
    return factory(build_context(kind, p))


def _mark(tokens: Any) -> torch.Tensor:
    digest = hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16).digest()
    return torch.tensor(list(digest), dtype=torch.float32)


class HybridSim:
    """One scheduler's state around one hybrid tree cache."""

    def __init__(self, kind: str, cache: Any, p: CacheInitParams):
        self.kind = kind
        self.name = "radixd" if hasattr(cache, "backend") else "SGLang"
        self.cache = cache
        self.pool = p.req_to_token_pool
        self.alloc = cache.token_to_kv_pool_allocator
        self.ps = p.page_size
        self.window = p.sliding_window_size
        self.running: dict[str, Req] = {}
        slots = (self.alloc.size_full if kind == "swa" else self.alloc.size) // self.ps + 1
        self.kv = torch.full((slots * self.ps,), -1, dtype=torch.int64)
        if kind == "swa":
            self.swa_kv = torch.full(((self.alloc.size_swa // self.ps + 1) * self.ps,), -1, dtype=torch.int64)
        else:
            from sglang.srt.runtime_context import mamba_checkpoint_grid

            self.grid = mamba_checkpoint_grid(self.ps)
            self.extra = p.enable_mamba_extra_buffer

    # ----- the model's part -----

    def _state(self, slot: int) -> torch.Tensor:
        return self.pool.mamba_pool.mamba_cache.temporal[0, slot, 0, :, 0]

    def write_state(self, slot: Any, tokens: Any) -> None:
        self._state(int(slot)).copy_(_mark(tokens))

    def state_holds(self, slot: Any, tokens: Any) -> bool:
        return torch.equal(self._state(int(slot)).float(), _mark(tokens))

    # ----- what the scheduler does -----

    def arrive(self, rid: str, tokens: list, space: tuple = (None, None)) -> dict:
        """``space``: the request's ``(extra_key, cache_salt)``."""
        extra_key, cache_salt = space
        req = Req(
            rid, "", array("q", tokens), SamplingParams(max_new_tokens=64), extra_key=extra_key, cache_salt=cache_salt
        )
        req.init_next_round_input(self.cache)
        req.lock = self.cache.lock(req.last_node)
        alloc_req_slots(self.pool, [req], self.cache)
        n = req.prefix_len
        if n:
            self.pool.write((req.kv.req_pool_idx, slice(0, n)), self.cache.prefix_device_indices(req))
            self.check_kv(req, n)
        req.kv.cache_protected_len = n
        req.kv.kv_committed_len = req.kv.kv_allocated_len = n
        cow = None
        if self.kind == "mamba":
            src = req.kv.mamba_cow_src_index
            cow = src is not None
            if cow:
                # The copy-on-write a forward does: the matched state must be
                # the state of exactly the matched prefix.
                assert self.state_holds(src.reshape(-1)[0], tokens[:n]), f"{self.name} {rid}: the matched state is another prefix's (slot {int(src.reshape(-1)[0])}, prefix {n})"
                self._state(int(req.kv.mamba_pool_idx)).copy_(self._state(int(src.reshape(-1)[0])))
                req.kv.mamba_cow_src_index = None
            else:
                self.write_state(req.kv.mamba_pool_idx, tokens[:n])
        self.running[rid] = req
        return {
            "prefix_len": n,
            "swa_branching_seqlen": req.swa_branching_seqlen,
            "mamba_branching_seqlen": req.mamba_branching_seqlen,
            "cow": cow,
        }

    def demand(self, n: int) -> int:
        return n if self.ps == 1 else n + self.ps

    def extend(self, rid: str, n: int, new_tokens: Optional[list] = None) -> None:
        """KV for ``n`` more tokens of ``rid`` (a prompt chunk, or one decoded
        output ``new_tokens``), written where the allocators put it."""
        req = self.running[rid]
        start = req.kv.kv_committed_len
        end = start + n
        decode = new_tokens is not None
        if decode and self.kind == "swa":
            # ScheduleBatch.maybe_evict_swa in decode: free the SWA slots that
            # slid out of the window.
            self.cache.evict_sliding_windows(req, start)
        # This round extends fill ids [prefix_len, extend_end) (the
        # scheduler's chunk; a decode step is one token).
        req.prefix_len, req.extend_end = start, end
        row = self.pool.req_to_token[req.kv.req_pool_idx]
        if self.ps == 1:
            out = alloc_token_slots(self.cache, n)
        else:
            last = row[start - 1 : start].to(torch.int64) if start else torch.full((1,), -1)
            if decode:
                out = alloc_paged_token_slots_decode(self.cache, torch.tensor([end]), torch.tensor([end]), last)
            else:
                out = alloc_paged_token_slots_extend(
                    tree_cache=self.cache,
                    prefix_lens=torch.tensor([start]),
                    prefix_lens_cpu=torch.tensor([start]),
                    seq_lens=torch.tensor([end]),
                    seq_lens_cpu=torch.tensor([end]),
                    last_loc=last,
                    extend_num_tokens=n,
                )
        self.pool.write((req.kv.req_pool_idx, slice(start, end)), out)
        if new_tokens:
            req.output_ids.extend(new_tokens)
        req.refresh_fill_ids()
        tokens = req.full_untruncated_fill_ids
        self.kv[out] = torch.tensor(tokens[start:end], dtype=torch.int64)
        if self.kind == "swa":
            self.swa_kv[self.alloc.full_to_swa_index_mapping[out]] = torch.tensor(tokens[start:end], dtype=torch.int64)
        else:
            self.write_state(req.kv.mamba_pool_idx, tokens[:end])
            if self.extra and not decode:
                self.track(req, start, n, tokens)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = end

    def track(self, req: Req, prefix: int, n: int, tokens: Any) -> None:
        """The ping-pong tracking of a prefill chunk
        (``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``):
        the state at the last grid-aligned point of the chunk (or at the
        branching point inside it) goes into the next track slot."""
        g = self.grid
        if n < g:
            return
        seqlen = prefix + n // g * g
        branch = req.mamba_branching_seqlen
        if branch is not None and prefix < branch < prefix + n and (branch - prefix) % g == 0:
            seqlen = branch
        idx = req.kv.mamba_next_track_idx
        self.write_state(req.kv.mamba_ping_pong_track_buffer[idx], tokens[:seqlen])
        req.kv.mamba_last_track_idx = idx
        req.kv.mamba_next_track_idx = self.pool.get_mamba_ping_pong_other_idx(idx)
        req.kv.mamba_last_track_seqlen = seqlen

    def checkpoint(self, rid: str) -> int:
        req = self.running[rid]
        self.cache.checkpoint(req, up_to=req.kv.kv_committed_len)
        req.prefix_len = req.kv.kv_committed_len
        self.check_kv(req, req.kv.kv_committed_len)
        return req.kv.cache_protected_len

    def check_kv(self, req: Req, n: int) -> None:
        """The row's FULL slots hold its tokens; under SWA so do the SWA
        slots of its window (where the mapping points)."""
        row = self.pool.req_to_token[req.kv.req_pool_idx, :n].to(torch.int64)
        want = torch.tensor(req.full_untruncated_fill_ids[:n], dtype=torch.int64)
        assert torch.equal(self.kv[row], want), f"{self.name} {req.rid}: its row's KV slots hold other tokens"
        if self.kind == "swa":
            lo = max(0, n - self.window)
            swa = self.alloc.full_to_swa_index_mapping[row[lo:]]
            assert bool((swa > 0).all()), f"{self.name} {req.rid}: a slot of its window has no SWA peer"
            assert torch.equal(self.swa_kv[swa], want[lo:]), f"{self.name} {req.rid}: its window's SWA slots hold other tokens"

    def finish(self, rid: str, abort: bool = False) -> None:
        req = self.running.pop(rid)
        req.finished_reason = FINISH_ABORT() if abort else FINISH_LENGTH(len(req.output_ids))
        release_kv_cache(req, self.cache, checkpoint=not abort)

    def peek(self, tokens: list, space: tuple = (None, None)) -> tuple:
        key = RadixKey(array("q", tokens), extra_key=space[0], cache_salt=space[1])
        r = self.cache.match_prefix(MatchPrefixParams(key=key))
        return (r.device_prefix_len, r.full_kv_hit_length, r.swa_branching_seqlen, r.mamba_branching_seqlen)

    def sizes(self) -> dict:
        c, a = self.cache, self.alloc
        out = {"full": (c.full_evictable_size(), c.full_protected_size())}
        if self.kind == "swa":
            out["swa"] = (c.swa_evictable_size(), c.swa_protected_size())
            out["free"] = (a.full_available_size(), a.swa_available_size())
        else:
            out["mamba"] = (c.mamba_evictable_size(), c.mamba_protected_size())
            out["free"] = (a.available_size(), self.pool.mamba_allocator.available_size())
        return out


class Workload:
    """Prompts sharing prefixes: a few system prompts cut at random points,
    then tokens of a small vocabulary; a third of them repeat a recent
    prompt, whole or cut short (so requests lock the same node, and other
    matches split it between their locks)."""

    def __init__(self, rng: random.Random, page_size: int, longest: int):
        self.rng = rng
        self.systems = [[rng.randrange(1000) for _ in range(rng.randrange(1, longest))] for _ in range(4)]
        self.tail = max(8, longest // 4)
        self.recent: list[list] = []

    def prompt(self) -> list:
        r = self.rng
        roll = r.random()
        if self.recent and roll < 0.3:
            p = list(r.choice(self.recent))
            return p[: r.randrange(1, len(p) + 1)] if roll < 0.1 else p
        base = r.choice(self.systems)
        p = base[: r.randrange(0, len(base) + 1)] + [r.randrange(6) for _ in range(r.randrange(1, self.tail))]
        self.recent = (self.recent + [p])[-8:]
        return p


class HybridTwin:
    """SGLang's ``UnifiedRadixCache`` (a) and radixd's backend (b) under the
    same random scheduler steps. ``release`` says which running request
    finishes next (releasing its lock): the one that arrived first
    (``"arrival"``), last (``"reverse"``) or any (``"random"``); a
    checkpoint moves a request's lock whenever it comes. Each lock must
    release exactly what it took (issue 29), in whatever order."""

    RELEASES = ("arrival", "reverse", "random")
    #: The scheduler each side runs.
    SIM: type = HybridSim

    def __init__(
        self,
        kind: str,
        page_size: int,
        backend_cache: Callable,
        seed: int,
        release: str = "random",
        spaces: Optional[list] = None,
        eagle: bool = False,
        same_evictions: bool = False,
        policy: str = "lru",
    ):
        assert release in self.RELEASES, release
        # policy: both sides' --radix-eviction-policy (radixd's engine or
        # daemon must be built with it: engine(), serve_args()).
        self.policy = policy
        # eagle: both caches built with CacheInitParams.is_eagle (EAGLE /
        # MTP): FULL+SWA trees keyed by bigrams; FULL+MAMBA ones by tokens
        # still, as SGLang's UnifiedTreeCore keys them.
        self.eagle = eagle
        # same_evictions: radixd's side is SGLang's controller too (the radixd
        # TreeCore), whose walks evict whole leaves: both are asked the same,
        # and some evictions ask FULL and SWA in one call (the SWA walk then
        # counts what FULL's freed).
        self.same_evictions = same_evictions
        # The (extra_key, cache_salt) pairs requests come in (LoRA adapters,
        # tenants); with one, no draw is made (the steps stay those of the
        # twins without namespaces).
        self.spaces = spaces or [(None, None)]
        self.hit_spaces: set = set()
        self.kind, self.ps, self.release = kind, page_size, release
        self.rng = random.Random(seed)
        publish(page_size)
        pa, pb = self.make_params(), self.make_params()
        pa.is_eagle = pb.is_eagle = eagle
        self.a = self.SIM(kind, sglang_cache(kind, pa), pa)
        self.b = self.SIM(kind, backend_cache(pb), pb)
        longest = 6 * self.window_or_grid()
        self.work = Workload(self.rng, page_size, longest)
        self.prompts: dict[str, list] = {}
        self.order: list[str] = []
        self.next_rid = 0
        self.ops = 0
        self.counts = {"hits": 0, "evictions": 0, "checkpoints": 0, "cow": 0, "aborts": 0, "branch": 0}

    # The pools: small enough that every component evicts.
    FULL_PAGES = {1: 160, 16: 40}
    SWA_PAGES = {1: 96, 16: 24}
    SLOTS = {1: 10, 16: 14}

    @classmethod
    def window(cls, page_size: int) -> int:
        return 6 if page_size == 1 else 40

    def window_or_grid(self) -> int:
        return self.window(self.ps) * 4 if self.kind == "swa" else 96

    def make_params(self) -> CacheInitParams:
        ps = self.ps
        if self.kind == "swa":
            p = swa_params(ps, self.FULL_PAGES[ps], self.SWA_PAGES[ps], self.window(ps))
        else:
            p = mamba_params(ps, self.FULL_PAGES[ps], self.SLOTS[ps])
        p.eviction_policy = self.policy
        return p

    @classmethod
    def serve_args(cls, kind: str, page_size: int, policy: str = "lru") -> tuple:
        """``radixd serve`` arguments of the daemon these pools need, with
        the recency rule under which radixd evicts by ``policy`` as
        SGLang's unified tree does (the twins compare partial evictions)."""
        from radixd.sglang_base import unified_recency

        sglang = ("--recency", unified_recency(policy), "--eviction-policy", policy)
        if kind == "swa":
            window, pages = str(cls.window(page_size)), str(cls.SWA_PAGES[page_size])
            return ("--components", "full,swa", "--swa-window", window, "--swa-capacity", pages, *sglang)
        return ("--components", "full,mamba", "--mamba-capacity", str(cls.SLOTS[page_size]), *sglang)

    @classmethod
    def engine(cls, kind: str, page_size: int, policy: str = "lru") -> Any:
        """An in-process ``radixd.Engine`` with the pools and rules of the
        daemon :meth:`serve_args` describes."""
        import radixd
        from radixd.sglang_base import unified_recency

        ps = page_size
        rules = {"recency": unified_recency(policy), "eviction_policy": policy}
        if kind == "swa":
            return radixd.Engine(
                ps,
                cls.FULL_PAGES[ps],
                components="full,swa",
                swa_window=cls.window(ps),
                swa_capacity=cls.SWA_PAGES[ps],
                **rules,
            )
        return radixd.Engine(ps, cls.FULL_PAGES[ps], components="full,mamba", mamba_capacity=cls.SLOTS[ps], **rules)

    def same(self, what: str, x: Any, y: Any) -> None:
        assert x == y, f"op {self.ops}: {what}: SGLang {x!r}, radixd {y!r}"

    def check_sizes(self, what: str) -> None:
        self.same(f"{what}: sizes", self.a.sizes(), self.b.sizes())

    def make_room(self, n: int) -> bool:
        """Room for ``n`` tokens in every pool before allocating: SGLang's
        cache evicts (whole leaves for FULL), radixd is asked for the FULL
        tokens SGLang freed and the same SWA shortfall."""
        a = self.a
        need = a.demand(n)
        if self.kind == "swa":
            full_short = need - a.alloc.full_available_size()
            swa_short = need - a.alloc.swa_available_size()
        else:
            full_short, swa_short = need - a.alloc.available_size(), 0
        if full_short > 0:
            self.evict("evicted for allocation", full=full_short)
        if self.kind == "swa":
            swa_short = need - a.alloc.swa_available_size()
            if swa_short > 0:
                self.evict("evicted for allocation", swa=swa_short)
        if self.kind == "swa":
            return a.alloc.full_available_size() >= need and a.alloc.swa_available_size() >= need
        return a.alloc.available_size() >= need

    def evict(self, what: str, full: int = 0, swa: int = 0, mamba: int = 0) -> None:
        """One component's eviction on both caches. FULL: SGLang frees whole
        leaves, radixd is asked for exactly what SGLang freed (the same
        least recently used leaves, page by page). SWA and MAMBA free whole
        nodes on both, with what their leaves' FULL pages cascade."""
        got = self.a.cache.evict(EvictParams(num_tokens=full, swa_num_tokens=swa, mamba_num=mamba))
        asked = full if self.same_evictions else got.num_tokens_evicted if full else 0
        ours = self.b.cache.evict(EvictParams(num_tokens=asked, swa_num_tokens=swa, mamba_num=mamba))
        self.same(
            what,
            (got.num_tokens_evicted, got.swa_num_tokens_evicted, got.mamba_num_evicted),
            (ours.num_tokens_evicted, ours.swa_num_tokens_evicted, ours.mamba_num_evicted),
        )
        self.counts["evictions"] += 1

    def can_checkpoint(self) -> bool:
        # A running request's checkpoint donates its state and takes a new
        # one (SGLang asserts one can be had).
        if self.kind != "mamba":
            return True
        return self.a.pool.mamba_allocator.available_size() + self.a.cache.mamba_evictable_size() >= 1

    def can_admit(self) -> bool:
        if len(self.a.running) >= 6 or self.a.pool.available_size() == 0:
            return False
        if self.kind == "mamba":
            # A request and its ping-pong buffer need states the tree may
            # not be able to give up (every state locked).
            per = 1 + (2 if self.a.extra else 0)
            free = self.a.pool.mamba_allocator.available_size() + self.a.cache.mamba_evictable_size()
            return free >= per + 1
        return True

    def finishing(self) -> Optional[str]:
        """The running request (with KV) that finishes next, by ``release``."""
        running = [r for r in self.order if r in self.a.running and self.a.running[r].kv.kv_allocated_len]
        if not running:
            return None
        if self.release == "arrival":
            return running[0]
        if self.release == "reverse":
            return running[-1]
        return self.rng.choice(running)

    def unextended(self, rid: str) -> bool:
        """With bigram keys, ``rid`` holds fewer whole pages of bigrams than
        its matched prefix (it computed nothing past it): aborted rather
        than finished, as ``sim.Twin.unextended`` says why."""
        kv = self.a.running[rid].kv
        bigram = self.a.cache.tree_core.is_eagle
        return bigram and (kv.kv_committed_len - 1) // self.ps * self.ps < kv.cache_protected_len

    def step(self) -> None:
        r = self.rng
        roll = r.random()
        self.ops += 1
        running = [rid for rid in self.order if rid in self.a.running]
        if roll < 0.2 and self.can_admit():
            rid = f"r{self.next_rid}"
            self.next_rid += 1
            prompt = self.work.prompt()
            self.prompts[rid] = prompt
            self.order.append(rid)
            space = r.choice(self.spaces) if len(self.spaces) > 1 else (None, None)
            got = self.a.arrive(rid, prompt, space)
            self.same(f"arrival in {space}", got, self.b.arrive(rid, prompt, space))
            self.counts["hits"] += got["prefix_len"] > 0
            if got["prefix_len"] > 0:
                self.hit_spaces.add(space)
            self.counts["cow"] += bool(got["cow"])
            self.counts["branch"] += got["swa_branching_seqlen"] is not None or got["mamba_branching_seqlen"] is not None
        elif roll < 0.65 and running:
            rid = r.choice(running)
            req = self.a.running[rid]
            done = req.kv.kv_committed_len
            prompt = self.prompts[rid]
            if done < len(prompt):
                n, outputs = min(len(prompt) - done, r.randrange(1, 5 * self.ps + 8)), None
                if self.kind == "mamba" and self.a.extra:
                    # Chunks of whole checkpoint grids (SGLang's chunked
                    # prefill size is a multiple of it), so a tracked state
                    # ends where a page does.
                    g = self.a.grid
                    n = min(len(prompt) - done, g * r.randrange(1, 3))
            else:
                n, outputs = 1, [r.randrange(6)]
            if done + n >= MAX_CONTEXT - 1 or not self.make_room(n):
                return
            self.a.extend(rid, n, outputs)
            self.b.extend(rid, n, outputs)
            if (outputs is None or r.random() < 0.2) and self.can_checkpoint():
                self.same("checkpoint: cache_protected_len", self.a.checkpoint(rid), self.b.checkpoint(rid))
                self.counts["checkpoints"] += 1
        elif roll < 0.8:
            rid = self.finishing()
            if rid is None:
                return
            self.prompts.pop(rid)
            abort = r.random() < 0.2 or self.unextended(rid)
            self.counts["aborts"] += abort
            self.a.finish(rid, abort)
            self.b.finish(rid, abort)
        elif roll < 0.88:
            n = r.randrange(1, 4) * self.ps
            swa = r.randrange(0, 3) * self.ps if self.kind == "swa" else 0
            mamba = r.randrange(0, 2) if self.kind == "mamba" else 0
            if self.same_evictions and swa and r.random() < 0.5:
                self.evict("evict", full=n, swa=swa)
            else:
                self.evict("evict", full=n)
                if swa or mamba:
                    self.evict("evict", swa=swa, mamba=mamba)
        else:
            tokens = self.work.prompt()
            space = r.choice(self.spaces) if len(self.spaces) > 1 else (None, None)
            self.same(f"match in {space}", self.a.peek(tokens, space), self.b.peek(tokens, space))
        self.check_sizes("after the step")

    def drain(self) -> None:
        while True:
            rid = self.finishing()
            if rid is None:
                break
            abort = self.unextended(rid)
            self.a.finish(rid, abort)
            self.b.finish(rid, abort)
        for rid in list(self.a.running):
            # Admitted without a hit and never extended: nothing to release
            # but the lock, the row and the states.
            for s in (self.a, self.b):
                req = s.running.pop(rid)
                s.cache.unlock(req.lock)
                if s.kind == "mamba":
                    s.pool.free_mamba_cache(req)
                s.pool.free(req)
        self.check_sizes("drained")


class HybridSessionSim(HybridSim):
    """``HybridSim`` with streaming sessions as SGLang's scheduler runs them
    on a ``UnifiedRadixCache`` (``session/streaming_session.py``), as
    ``sim.SessionSim`` does for full attention: a turn comes with its
    session's history (the last finished turn's input and output) and new
    tokens; its match borrows the session's KV record when the session
    holds one; its first allocation hands the record to the session
    (``maybe_hand_to_session``); finishing keeps the record in the session;
    an abort frees it; ``release`` closes the session."""

    def __init__(self, kind: str, cache: Any, p: CacheInitParams):
        super().__init__(kind, cache, p)
        from sglang.srt.session.session_controller import Session

        self._session_class = Session
        self.sessions: dict[str, Any] = {}

    def open(self, sid: str) -> None:
        self.sessions[sid] = self._session_class(capacity_of_str_len=1 << 20, session_id=sid, streaming=True)

    def history(self, sid: str) -> list:
        s = self.sessions[sid]
        if not s.req_nodes:
            return []
        [node] = s.req_nodes.values()
        return list(node.req.origin_input_ids) + list(node.req.output_ids)

    def arrive_turn(self, rid: str, sid: str, tokens: list) -> int:
        session = self.sessions[sid]
        req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=64), session=session)
        session._inflight = True
        req.init_next_round_input(self.cache)
        req.lock = self.cache.lock(req.last_node)
        n = req.prefix_len
        lent = req.kv.holds_kv
        alloc_req_slots(self.pool, [req], self.cache)
        if lent:
            # The session's record: its row holds the prefix already.
            self.check_kv(req, n)
        else:
            if n:
                self.pool.write((req.kv.req_pool_idx, slice(0, n)), self.cache.prefix_device_indices(req))
                self.check_kv(req, n)
            req.kv.cache_protected_len = n
            req.kv.kv_committed_len = req.kv.kv_allocated_len = n
        self.running[rid] = req
        return n

    def extend(self, rid: str, n: int, new_tokens: Optional[list] = None) -> None:
        super().extend(rid, n, new_tokens)
        self.cache.maybe_hand_to_session(self.running[rid])

    def finish_turn(self, rid: str, abort: bool) -> None:
        req = self.running.pop(rid)
        req.finished_reason = FINISH_ABORT("aborted by the twin") if abort else FINISH_LENGTH(len(req.output_ids))
        release_kv_cache(req, self.cache, checkpoint=not abort)

    def release(self, sid: str) -> None:
        s = self.sessions.pop(sid)
        for node in s.req_nodes.values():
            node.req.session = None
        self.cache.release_radix_session(sid)
        self.cache.release_session(sid)

    def held(self) -> tuple:
        """Per session: (protected, committed, allocated) of its record."""
        slots = self.cache.session.slots
        return tuple(
            (sid, s.kv.cache_protected_len, s.kv.kv_committed_len, s.kv.kv_allocated_len)
            for sid, s in sorted(slots.items())
        )


class HybridSessionTwin(HybridTwin):
    """``HybridTwin`` with streaming sessions beside plain requests (as
    ``sim.SessionTwin``): turns arrive (each session one at a time, with its
    history), extend, checkpoint, finish or abort, sessions close; every
    answer, every session's record and every size compared after every
    step."""

    SIM = HybridSessionSim

    def __init__(self, kind: str, page_size: int, backend_cache: Callable, seed: int, **kw: Any):
        super().__init__(kind, page_size, backend_cache, seed, **kw)
        self.turn_of: dict[str, str] = {}
        self.next_sid = 0
        self.turns = self.lent = self.session_aborts = self.released = 0

    def check_sizes(self, what: str) -> None:
        super().check_sizes(what)
        self.same(f"{what}: sessions' records", self.a.held(), self.b.held())

    def finishing(self) -> Optional[str]:
        # Plain requests only: a turn ends through finish_turn.
        running = [
            r
            for r in self.order
            if r in self.a.running and r not in self.turn_of and self.a.running[r].kv.kv_allocated_len
        ]
        if not running:
            return None
        if self.release == "arrival":
            return running[0]
        if self.release == "reverse":
            return running[-1]
        return self.rng.choice(running)

    def step(self) -> None:
        r = self.rng
        roll = r.random()
        idle = sorted(sid for sid, s in self.a.sessions.items() if not s._inflight)
        turns = sorted(self.turn_of)
        if roll < 0.04 and len(self.a.sessions) < 3:
            sid = f"s{self.next_sid}"
            self.next_sid += 1
            self.a.open(sid)
            self.b.open(sid)
        elif roll < 0.16 and idle and self.can_admit():
            self.ops += 1
            sid = r.choice(idle)
            rid = f"t{self.next_rid}"
            self.next_rid += 1
            history = self.a.history(sid)
            self.same(f"{sid}'s history", history, self.b.history(sid))
            if len(history) > MAX_CONTEXT // 2:
                return
            prompt = history + [r.randrange(6) for _ in range(r.randrange(1, 3 * self.ps + 4))]
            self.prompts[rid] = prompt
            self.order.append(rid)
            hit = self.a.arrive_turn(rid, sid, prompt)
            self.same(f"turn of {sid}: match", hit, self.b.arrive_turn(rid, sid, prompt))
            self.same(
                f"turn of {sid}: cache_protected_len",
                self.a.running[rid].kv.cache_protected_len,
                self.b.running[rid].kv.cache_protected_len,
            )
            self.turn_of[rid] = sid
            self.turns += 1
            self.lent += self.a.cache.session.borrowed_slot(self.a.running[rid]) is not None
            self.check_sizes("after a turn's arrival")
        elif roll < 0.26 and turns:
            self.ops += 1
            rid = r.choice(turns)
            req = self.a.running[rid]
            if self.a.cache.session.borrowed_slot(req) is None:
                return  # a scheduler releases a request after its first chunk
            abort = req.kv.kv_committed_len < len(self.prompts[rid]) or r.random() < 0.2
            sid = self.turn_of.pop(rid)
            self.prompts.pop(rid)
            self.a.finish_turn(rid, abort)
            self.b.finish_turn(rid, abort)
            self.session_aborts += abort
            self.check_sizes(f"after {sid}'s turn {'aborted' if abort else 'finished'}")
        elif roll < 0.27 and idle:
            self.ops += 1
            sid = r.choice(idle)
            self.a.release(sid)
            self.b.release(sid)
            self.released += 1
            self.check_sizes(f"after {sid} closed")
        else:
            super().step()

    def drain(self) -> None:
        for rid in sorted(self.turn_of):
            req = self.a.running[rid]
            self.turn_of.pop(rid)
            if self.a.cache.session.borrowed_slot(req) is None:
                # Never allocated for: it leaves the waiting queue.
                for s in (self.a, self.b):
                    req = s.running.pop(rid)
                    s.cache.unlock(req.lock)
                    if req.kv.holds_kv:
                        s.pool.free(req)
                    req.session.abort_req()
                continue
            abort = req.kv.kv_committed_len < len(self.prompts[rid])
            self.a.finish_turn(rid, abort)
            self.b.finish_turn(rid, abort)
        for sid in sorted(self.a.sessions):
            self.a.release(sid)
            self.b.release(sid)
        super().drain()
        self.same("sessions left", self.a.held(), ())
