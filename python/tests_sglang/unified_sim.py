"""A standalone driver over SGLang 0.5.23's own ``UnifiedRadixCache`` (the
pure-Python tree core) for the hybrid layouts radixd must mirror: FULL+SWA
(sliding-window attention) and FULL+MAMBA (recurrent state). Every cache is
built on SGLang's real pools and allocators on the CPU, the way its own unit
kit (``sglang.test.kits.unified_radix_cache.fixtures``) builds them, and every
helper takes and returns plain Python ints so the tests read as a spec."""

from __future__ import annotations

from array import array
from typing import Any, Optional

import torch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

FULL = ComponentType.FULL
SWA = ComponentType.SWA
MAMBA = ComponentType.MAMBA

# Tiny model geometry: 4 layers, layer 3 full attention, the rest SWA/Mamba.
NUM_LAYERS = 4
FULL_LAYERS = [3]
OTHER_LAYERS = [0, 1, 2]
HEAD_NUM = 1
HEAD_DIM = 8
DTYPE = torch.bfloat16
MAX_CONTEXT = 512


def _server_args(page_size: int) -> None:
    """SGLang's pools and components read process-wide server args."""
    from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE as FLA_CHUNK_SIZE
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = ServerArgs(model_path="dummy", page_size=page_size)
    # The dummy config cannot supply the mamba chunk (checkpoint grid).
    args._mamba_cache_chunk_size = max(FLA_CHUNK_SIZE, page_size)
    set_global_server_args_for_scheduler(args)


def publish_runtime(page_size: int = 1) -> None:
    """What a scheduler publishes before its request hooks run
    (``match_kv_cache``, ``checkpoint``, ``release_kv_cache`` read it)."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    runtime_context.publish(ServerArgs(model_path="dummy", page_size=page_size), role="scheduler")


def _build(params: CacheInitParams) -> UnifiedRadixCache:
    cache = UnifiedRadixCache(params=params)
    assert cache._tree_core_backend == "python", cache._tree_core_backend
    return cache


def make_swa_cache(page_size: int, full_pages: int, swa_pages: int, window: int, rows: int = 16) -> UnifiedRadixCache:
    """FULL+SWA cache: ``full_pages`` full-attention pages, ``swa_pages`` SWA
    pages (``SWATokenToKVPoolAllocator`` over an ``SWAKVPool``), sliding
    window ``window`` tokens."""
    _server_args(page_size)
    pool = ReqToTokenPool(size=rows, max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False)
    kv = SWAKVPool(
        size=full_pages * page_size,
        size_swa=swa_pages * page_size,
        page_size=page_size,
        dtype=DTYPE,
        head_num=HEAD_NUM,
        head_dim=HEAD_DIM,
        swa_attention_layer_ids=OTHER_LAYERS,
        full_attention_layer_ids=FULL_LAYERS,
        device="cpu",
    )
    alloc = SWATokenToKVPoolAllocator(
        size=full_pages * page_size,
        size_swa=swa_pages * page_size,
        page_size=page_size,
        dtype=DTYPE,
        device="cpu",
        kvcache=kv,
        need_sort=False,
    )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        sliding_window_size=window,
        tree_components=(FULL, SWA),
        tree_core_backend="python",
    )
    return _build(params)


def make_mamba_cache(page_size: int, full_pages: int, mamba_slots: int, rows: int = 8) -> UnifiedRadixCache:
    """FULL+MAMBA cache: ``full_pages`` KV pages and a ``MambaPool`` of
    ``mamba_slots`` states (tiny Mamba2 shapes) inside a
    ``HybridReqToTokenPool``. Mamba with page_size > 1 needs SGLang's extra
    (ping-pong) buffer, so it is enabled there, as SGLang requires."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    _server_args(page_size)
    extra_buffer = page_size > 1
    with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=32,
            n_groups=1,
            num_heads=2,
            head_dim=16,
            state_size=4,
            conv_kernel=4,
        )
        cache_params = Mamba2CacheParams(shape=shape, layers=OTHER_LAYERS)
    pool = HybridReqToTokenPool(
        size=rows,
        mamba_size=mamba_slots,
        mamba_spec_state_size=rows,
        max_context_len=MAX_CONTEXT,
        device="cpu",
        enable_memory_saver=False,
        cache_params=cache_params,
        mamba_layer_ids=OTHER_LAYERS,
        enable_mamba_extra_buffer=extra_buffer,
        speculative_num_draft_tokens=3,
    )
    kv = HybridLinearKVPool(
        size=full_pages * page_size,
        dtype=DTYPE,
        page_size=page_size,
        head_num=HEAD_NUM,
        head_dim=HEAD_DIM,
        full_attention_layer_ids=FULL_LAYERS,
        device="cpu",
        enable_memory_saver=False,
        mamba_pool=pool.mamba_pool,
    )
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(full_pages, DTYPE, "cpu", kv, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(full_pages * page_size, page_size, DTYPE, "cpu", kv, False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        tree_components=(FULL, MAMBA),
        enable_mamba_extra_buffer=extra_buffer,
        tree_core_backend="python",
    )
    return _build(params)


# ----- allocation through the real allocators -----


def alloc_kv(cache: UnifiedRadixCache, n: int) -> list[int]:
    """``n`` (a whole number of pages) fresh FULL slots; under SWA each is
    paired with a fresh SWA slot in ``full_to_swa_index_mapping`` (what
    ``SWATokenToKVPoolAllocator.alloc`` / ``alloc_extend`` do)."""
    alloc = cache.token_to_kv_pool_allocator
    ps = cache.page_size
    assert n % ps == 0, "allocate whole pages"
    if isinstance(alloc, SWATokenToKVPoolAllocator) and ps > 1:
        # alloc() asserts page_size == 1 and alloc_extend needs batch
        # tensors; pair whole pages the way alloc_extend does.
        if n > alloc.full_attn_allocator.available_size() or n > alloc.swa_attn_allocator.available_size():
            raise MemoryError("out of KV pages")
        full = alloc.full_attn_allocator.alloc(n)
        swa = alloc.swa_attn_allocator.alloc(n)
        alloc.set_full_to_swa_mapping(full, swa)
        return full.tolist()
    got = alloc.alloc(n)
    if got is None:
        raise MemoryError("out of KV slots")
    return got.tolist()


def swa_of(cache: UnifiedRadixCache, full: list[int]) -> list[int]:
    """The SWA slots paired with FULL slots ``full`` (0: none)."""
    alloc = cache.token_to_kv_pool_allocator
    return alloc.full_to_swa_index_mapping[torch.tensor(full, dtype=torch.int64)].tolist()


def free_kv(cache: UnifiedRadixCache, full: list[int]) -> None:
    """Frees FULL slots and their paired SWA slots (request teardown)."""
    if full:
        cache.token_to_kv_pool_allocator.free(torch.tensor(full, dtype=torch.int64))


def free_swa_only(cache: UnifiedRadixCache, full: list[int]) -> None:
    """Frees only the SWA peers of ``full`` (what decode does with slots that
    slid out of the window: ``free_swa``)."""
    cache.token_to_kv_pool_allocator.free_swa(torch.tensor(full, dtype=torch.int64))


def full_available(cache: UnifiedRadixCache) -> int:
    alloc = cache.token_to_kv_pool_allocator
    if isinstance(alloc, SWATokenToKVPoolAllocator):
        return alloc.full_available_size()
    return alloc.available_size()


def swa_available(cache: UnifiedRadixCache) -> int:
    return cache.token_to_kv_pool_allocator.swa_available_size()


def alloc_mamba(cache: UnifiedRadixCache) -> int:
    """One fresh mamba state slot from the ``MambaPool`` allocator."""
    got = cache.req_to_token_pool.mamba_allocator.alloc(1)
    if got is None:
        raise MemoryError("out of mamba slots")
    return int(got[0])


def free_mamba(cache: UnifiedRadixCache, slot: int) -> None:
    cache.req_to_token_pool.mamba_allocator.free(torch.tensor([slot], dtype=torch.int64))


def mamba_available(cache: UnifiedRadixCache) -> int:
    return cache.req_to_token_pool.mamba_allocator.available_size()


# ----- tree operations -----


def key(tokens: list[int]) -> RadixKey:
    return RadixKey(array("q", tokens))


def insert(
    cache: UnifiedRadixCache,
    tokens: list[int],
    value_indices: list[int],
    mamba_slot: Optional[int] = None,
    swa_evicted_seqlen: int = 0,
    prev_prefix_len: int = 0,
) -> dict:
    """``UnifiedRadixCache.insert``; returns prefix_len, the target node,
    mamba_exist."""
    params = InsertParams(
        key=key(tokens),
        value=torch.tensor(value_indices, dtype=torch.int64),
        prev_prefix_len=prev_prefix_len,
    )
    if mamba_slot is not None:
        params.mamba_value = torch.tensor([mamba_slot], dtype=torch.int64)
    if cache.is_swa_enabled:
        params.set_evicted_seqlen(SWA, swa_evicted_seqlen)
    res = cache.insert(params)
    return {"prefix_len": res.prefix_len, "node": res.last_device_node, "mamba_exist": res.mamba_exist}


def match(cache: UnifiedRadixCache, tokens: list[int], cow_mamba: bool = False, req: Any = None) -> dict:
    """``UnifiedRadixCache.match_prefix``: ``len`` is device_prefix_len,
    ``node`` last_device_node, ``value`` the matched FULL slots."""
    r = cache.match_prefix(MatchPrefixParams(key=key(tokens), cow_mamba=cow_mamba, req=req))
    tc = cache.tree_core
    value = tc.collect_full_device_indices(r.last_device_node, tc.root_node.id).tolist()
    out = {
        "len": r.device_prefix_len,
        "node": r.last_device_node,
        "best": r.best_match_node,
        "value": value,
        "full_kv_hit_length": r.full_kv_hit_length,
        "swa_branching_seqlen": r.swa_branching_seqlen,
        "mamba_branching_seqlen": r.mamba_branching_seqlen,
    }
    if cache.is_mamba_enabled:
        out["mamba"] = mamba_value(cache, r.last_device_node)
    return out


def lock(cache: UnifiedRadixCache, node: int) -> Any:
    """``inc_lock_ref``; returns the receipt ``unlock`` replays."""
    return cache.inc_lock_ref(node)


def unlock(cache: UnifiedRadixCache, node: int, receipt: Any) -> None:
    cache.dec_lock_ref(node, receipt.to_dec_params())


def evict(cache: UnifiedRadixCache, full_tokens: int = 0, swa_tokens: int = 0, mamba_num: int = 0) -> tuple:
    """``UnifiedRadixCache.evict``: (full, swa, mamba) amounts evicted."""
    r = cache.evict(EvictParams(num_tokens=full_tokens, swa_num_tokens=swa_tokens, mamba_num=mamba_num))
    return r.num_tokens_evicted, r.swa_num_tokens_evicted, r.mamba_num_evicted


def sizes(cache: UnifiedRadixCache) -> dict:
    out = {
        "full_evictable": cache.full_evictable_size(),
        "full_protected": cache.full_protected_size(),
    }
    if cache.is_swa_enabled:
        out["swa_evictable"] = cache.swa_evictable_size()
        out["swa_protected"] = cache.swa_protected_size()
    if cache.is_mamba_enabled:
        out["mamba_evictable"] = cache.mamba_evictable_size()
        out["mamba_protected"] = cache.mamba_protected_size()
    return out


# ----- inspection (python tree core internals) -----


def node(cache: UnifiedRadixCache, node_id: int) -> Any:
    return cache.tree_core.node_by_id(node_id)


def _cd(cache: UnifiedRadixCache, node_id: int, ct: ComponentType) -> Any:
    return node(cache, node_id).component_data[ct]


def full_value(cache: UnifiedRadixCache, node_id: int) -> Optional[list[int]]:
    v = _cd(cache, node_id, FULL).value
    return None if v is None else v.tolist()


def swa_value(cache: UnifiedRadixCache, node_id: int) -> Optional[list[int]]:
    v = _cd(cache, node_id, SWA).value
    return None if v is None else v.tolist()


def mamba_value(cache: UnifiedRadixCache, node_id: int) -> Optional[int]:
    if node_id == cache.tree_core.root_node.id:
        return None
    v = _cd(cache, node_id, MAMBA).value
    return None if v is None else int(v[0])


def lock_ref(cache: UnifiedRadixCache, node_id: int, ct: ComponentType) -> int:
    return _cd(cache, node_id, ct).lock_ref


def swa_uuid(cache: UnifiedRadixCache, node_id: int) -> Optional[int]:
    return _cd(cache, node_id, SWA).metadata.get("uuid")


def tokens_of(cache: UnifiedRadixCache, node_id: int) -> list[int]:
    return list(node(cache, node_id).key.token_ids)


def parent(cache: UnifiedRadixCache, node_id: int) -> Optional[int]:
    p = node(cache, node_id).parent
    return None if p is None else p.id


def children(cache: UnifiedRadixCache, node_id: int) -> list[int]:
    return [c.id for c in node(cache, node_id).children.values()]


def exists(cache: UnifiedRadixCache, node_id: int) -> bool:
    """Whether ``node_id`` is still in the tree (the core's node arena)."""
    return node_id in cache.tree_core._node_arena


def lru_order(cache: UnifiedRadixCache, ct: ComponentType) -> list[int]:
    """Node ids in ``ct``'s device LRU list, MRU first (head side)."""
    lru = cache.tree_core.lru_lists[ct]
    pt = lru._pt
    out = []
    x = lru.head.lru_next[pt]
    while x is not lru.tail:
        if x is not lru.mid and x is not lru.cursor:
            out.append(x.id)
        x = x.lru_next[pt]
    return out


def path_nodes(cache: UnifiedRadixCache, node_id: int) -> list[int]:
    """Node ids from the root's child down to ``node_id``."""
    out = []
    n = node(cache, node_id)
    root = cache.tree_core.root_node
    while n is not root:
        out.append(n.id)
        n = n.parent
    return out[::-1]


def check(cache: UnifiedRadixCache) -> None:
    """SGLang's own consistency check of the tree and its counters."""
    cache.sanity_check()


def all_nodes(cache: UnifiedRadixCache) -> list[int]:
    """Ids of every node but the root, oldest first."""
    root = cache.tree_core.root_node.id
    return sorted(i for i in cache.tree_core._node_arena if i != root)
