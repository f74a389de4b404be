"""SGLang 0.5.23's own HiCache stack on the CPU: ``UnifiedRadixCache`` with
``init_hicache`` (its ``HybridCacheController``, host pool, L2 transfers and
L3 storage threads, all SGLang's), for tests that have no GPU.

What SGLang needs CUDA for here, and what stands in (issue 39 allows "the
smallest transfer stand-in that copies with torch on the CPU"; the tree's
and the controller's decisions stay SGLang's):

- pinning the host pool (``cudaHostRegister``, pinned staging pages): the
  MHA host pool is built unpinned, plain CPU memory (:func:`install`);
- ``Stream.synchronize`` of the L2 transfer engine: ``torch.cpu.Stream``
  lacks it; CPU copies are synchronous, so it has nothing to wait for;
- the transfer kernels (``sgl_kernel``'s ``transfer_kv_*``): the MHA host
  pool's two entry points, ``backup_from_device_all_layer`` and
  ``load_to_device_per_layer``, as torch index copies (the ``layer_first``
  layout only: :func:`server_args` asks for it);
- the tensor-parallel rank (``get_parallel().tp_rank``), which a real
  scheduler publishes: rank 0 of 1 (``pp_rank`` too).

HiCache's page hashes (the L3 keys) come from SGLang's native extension,
which torch builds on first use: it needs ``ninja`` on ``PATH``
(:func:`install` puts the venv's ``bin`` first).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Optional

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

#: The storage extra config that names radixd's store as the L3
#: (``--hicache-storage-backend dynamic``), without the daemon's name.
RADIXD_L3 = {
    "backend_name": "radixd",
    "module_path": "radixd.hicache",
    "class_name": "RadixdStorage",
    "interface_v1": 1,
}

LAYERS, HEADS, HEAD_DIM = 2, 2, 16


def _backup(self, device_pool, host_indices, device_indices, io_backend) -> None:
    assert self.layout == "layer_first", self.layout
    for layer in range(self.layer_num):
        self.kv_buffer[0, layer, host_indices] = self.device_k_buffers[layer][device_indices]
        self.kv_buffer[1, layer, host_indices] = self.device_v_buffers[layer][device_indices]


def _load(self, device_pool, host_indices, device_indices, layer_id, io_backend, *, is_draft=False) -> None:
    assert self.layout == "layer_first", self.layout
    if not 0 <= layer_id < self.layer_num:
        return
    self.device_k_buffers[layer_id][device_indices] = self.kv_buffer[0, layer_id, host_indices]
    self.device_v_buffers[layer_id][device_indices] = self.kv_buffer[1, layer_id, host_indices]


def install() -> None:
    """The stand-ins above, once per process."""
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.runtime_context import get_parallel

    if not getattr(MHATokenToKVPoolHost, "_radixd_cpu", False):
        build = MHATokenToKVPoolHost.__init__

        def unpinned(self, *args, **kwargs):
            kwargs["pin_memory"] = False
            build(self, *args, **kwargs)

        MHATokenToKVPoolHost.__init__ = unpinned
        MHATokenToKVPoolHost._radixd_cpu = True
    if not hasattr(torch.cpu.Stream, "synchronize"):
        torch.cpu.Stream.synchronize = lambda self: None
    MHATokenToKVPoolHost.backup_from_device_all_layer = _backup
    MHATokenToKVPoolHost.load_to_device_per_layer = _load
    get_parallel().override_permanently(tp_rank=0, pp_rank=0)
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def server_args(
    page_size: int,
    storage: Optional[str] = None,
    extra_config: Optional[dict] = None,
    write_policy: str = "write_through",
    host_ratio: float = 2.0,
    **kw: Any,
) -> Any:
    """A scheduler's ``ServerArgs`` with HiCache on (``storage``: the L3
    backend, ``"dynamic"`` with ``extra_config``, or ``"file"``), published
    as the process's runtime config."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    if storage is not None:
        kw["hicache_storage_backend"] = storage
        # Prefetches run to the end: the tests compare what arrived.
        kw.setdefault("hicache_storage_prefetch_policy", "wait_complete")
    if extra_config is not None:
        kw["hicache_storage_backend_extra_config"] = json.dumps(extra_config)
    args = ServerArgs(
        model_path="dummy",
        enable_hierarchical_cache=True,
        hicache_ratio=host_ratio,
        hicache_write_policy=write_policy,
        hicache_mem_layout="layer_first",
        page_size=page_size,
        **kw,
    )
    runtime_context.publish(args, role="scheduler")
    return args


def server(
    args: Any,
    page_size: int,
    tokens: int,
    rows: int = 16,
    context: int = 1024,
    core: str = "python",
    layers: int = LAYERS,
    heads: int = HEADS,
    head_dim: int = HEAD_DIM,
) -> tuple:
    """One scheduler's ``UnifiedRadixCache`` with HiCache over an MHA KV pool
    of ``tokens`` CPU slots: ``(cache, params)``."""
    kv = MHATokenToKVPool(
        tokens,
        page_size=page_size,
        dtype=torch.bfloat16,
        head_num=heads,
        head_dim=head_dim,
        layer_num=layers,
        device="cpu",
        enable_memory_saver=False,
    )
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(tokens, torch.bfloat16, "cpu", kv, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(tokens, page_size, torch.bfloat16, "cpu", kv, False)
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    p = CacheInitParams(
        disable=False,
        req_to_token_pool=ReqToTokenPool(rows, context, "cpu", False),
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        tree_components=(ComponentType.FULL,),
    )
    p.tree_core_backend = core
    cache = UnifiedRadixCache(p)
    cache.init_hicache(args, p)
    return cache, p


def kv_of(kv: Any, tokens: torch.Tensor, layer: int, which: int) -> torch.Tensor:
    """The KV a model would compute for ``tokens`` (one row per token) in the
    shape of the pool ``kv``: small integers that bf16 holds exactly, the
    same on every server."""
    heads, dim = kv.head_num, kv.head_dim
    t = tokens.to(torch.int64).reshape(-1, 1, 1)
    col = torch.arange(heads * dim, dtype=torch.int64).reshape(1, heads, dim)
    return ((t * 7 + col + 31 * layer + 101 * which) % 251).to(torch.bfloat16)


def write_kv(cache: Any, slots: torch.Tensor, tokens: torch.Tensor) -> None:
    """The forward pass's writes: ``tokens``' KV into the device ``slots``."""
    kv = cache.token_to_kv_pool_allocator.get_kvcache()
    for layer in range(kv.layer_num):
        kv.k_buffer[layer][slots] = kv_of(kv, tokens, layer, 0)
        kv.v_buffer[layer][slots] = kv_of(kv, tokens, layer, 1)


def kv_holds(cache: Any, slots: torch.Tensor, tokens: torch.Tensor) -> bool:
    """Whether the device ``slots`` hold ``tokens``' KV, every layer."""
    kv = cache.token_to_kv_pool_allocator.get_kvcache()
    return all(
        torch.equal(kv.k_buffer[layer][slots], kv_of(kv, tokens, layer, 0))
        and torch.equal(kv.v_buffer[layer][slots], kv_of(kv, tokens, layer, 1))
        for layer in range(kv.layer_num)
    )


def settle(cache: Any, done: Callable[[], bool], timeout: float = 30.0) -> None:
    """Scheduler steps (``check_hicache_events``) until ``done()``: the
    controller's transfers and storage threads run beside the scheduler."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("HiCache did not settle")
        cache.check_hicache_events()
        time.sleep(0.002)


def prefetch(cache: Any, req: Any) -> Optional[bool]:
    """What SGLang's scheduler does for a new request with L3 storage on
    (``Scheduler._prefetch_kvcache``, cache mode, ``scheduler.py``
    3343-3392 in 0.5.23; the scheduler module itself imports what this
    venv leaves out): match, then prefetch what lies past the host hit from
    the storage, keyed from the last host node's hash."""
    req.init_next_round_input(cache, cow_mamba=False)
    last_host_node = req.last_host_node
    matched_len = req.prefix_len + req.host_hit_length
    req.storage_prefetch_last_match_len = matched_len
    if not (cache.is_backuped(last_host_node) or cache.is_root(last_host_node)):
        return None
    match_end = req._compute_max_prefix_len(len(req.full_untruncated_fill_ids))
    prefix_keys = cache.get_prefix_hash_values(last_host_node) if cache.hicache_storage_pass_prefix_keys else None
    return cache.prefetch_from_storage(
        req.cache_request_handle,
        last_host_node,
        req.full_untruncated_fill_ids[matched_len:match_end],
        cache.get_last_hash_value(last_host_node),
        prefix_keys,
        matched_prefix_tokens=req.full_untruncated_fill_ids[:matched_len],
        extra_key=req.extra_key,
        cache_salt=req.cache_salt,
    )
