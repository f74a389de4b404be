"""SGLang 0.5.23's own HiCache objects for the radixd storage tests: host KV
pools (``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``, built on the CPU
from device-buffer descriptions as SGLang's assembler builds them),
``HiCacheStorageConfig``, the backend as SGLang's
``StorageBackendFactory.create_backend("dynamic", ...)`` builds it, and
page contents derived from the key (so every process knows what a key's
bytes must be)."""

from __future__ import annotations

import ctypes
import hashlib
import warnings
from typing import List, Optional

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MHABufferInfo,
    MLABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

EXTRA = {
    "backend_name": "radixd",
    "module_path": "radixd.hicache",
    "class_name": "RadixdStorage",
    "interface_v1": 1,
}


def mha_pool(layout: str, *, page_size: int = 4, layers: int = 2, heads: int = 2,
             head_dim: int = 32, tokens: int = 256) -> MHATokenToKVPoolHost:
    """SGLang's MHA host pool (bf16) over CPU "device" buffers of ``tokens``
    tokens; the host pool holds twice that."""
    k = tuple(torch.zeros(tokens, heads, head_dim, dtype=torch.bfloat16) for _ in range(layers))
    v = tuple(torch.zeros(tokens, heads, head_dim, dtype=torch.bfloat16) for _ in range(layers))
    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k, v=v,
            k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
            v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
            layout=KVBufferLayout.NHD,
        ),
        page_size=page_size, head_num=heads, head_dim=head_dim, v_head_dim=head_dim,
        dtype=torch.bfloat16, device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=tokens, start_layer=0, end_layer=layers,
    )


def mla_pool(layout: str, *, page_size: int = 4, layers: int = 2, lora: int = 64,
             rope: int = 16, tokens: int = 256) -> MLATokenToKVPoolHost:
    """SGLang's MLA host pool (bf16) over CPU "device" buffers."""
    bufs = tuple(torch.zeros(tokens, 1, lora + rope, dtype=torch.bfloat16) for _ in range(layers))
    info = MLABufferInfo(
        buffers=bufs,
        data_ptrs=torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
        layer_indices=tuple(range(layers)), device_layer_num=layers, page_size=page_size,
        kv_lora_rank=lora, qk_rope_head_dim=rope, kv_cache_dim=lora + rope,
        dtype=torch.bfloat16, device=torch.device("cpu"),
    )
    return MLATokenToKVPoolHost(
        info, 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=tokens, start_layer=0, end_layer=layers, target_layer_num=layers,
    )


def make_pool(kind: str, layout: str, **kw):
    return (mla_pool if kind == "mla" else mha_pool)(layout, **kw)


def storage_config(name: Optional[str], *, mla: bool = False, tp_rank: int = 0, tp_size: int = 1,
                   model: str = "test/tiny-model", extra: Optional[dict] = None,
                   **more) -> HiCacheStorageConfig:
    """The config SGLang's cache controller builds (``_generate_storage_config``)."""
    extra_config = dict(EXTRA)
    if name is not None:
        extra_config["name"] = name
    extra_config.update(extra or {})
    fields = dict(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=True, is_page_first_layout=True,
        model_name=model, extra_config=extra_config,
    )
    fields.update(more)  # e.g. pp_rank/pp_size, attn_cp_rank/attn_cp_size
    return HiCacheStorageConfig(**fields)


def backend(config: HiCacheStorageConfig, pool):
    """What ``HiCacheController.attach_storage_backend`` does: SGLang's factory,
    then ``register_mem_pool_host``."""
    b = StorageBackendFactory.create_backend("dynamic", config, pool)
    b.register_mem_pool_host(pool)
    return b


def page_size_bytes(pool) -> int:
    _, sizes = pool.get_page_buffer_meta(torch.arange(pool.page_size, dtype=torch.int64))
    return int(sum(sizes))


def content(key: str, nbytes: int) -> bytes:
    """The bytes page ``key`` holds: a function of the key alone."""
    seed = int(hashlib.sha256(key.encode()).hexdigest()[:15], 16)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).numpy().tobytes()


def pages_of(pool, n: int) -> torch.Tensor:
    """Host indices of ``n`` fresh pages."""
    idx = pool.alloc(n * pool.page_size)
    assert idx is not None, "host pool full"
    return idx


def write_pages(pool, keys: List[str], indices: torch.Tensor) -> None:
    """Fills each key's host page with its content (through the page's
    zero-copy pieces, in the order the backend stores them)."""
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    per = len(ptrs) // len(keys)
    for i, key in enumerate(keys):
        data = content(key, sum(sizes[i * per:(i + 1) * per]))
        at = 0
        for p, s in zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per]):
            ctypes.memmove(p, data[at:at + s], s)
            at += s


def read_pages(pool, n: int, indices: torch.Tensor) -> List[bytes]:
    """Each host page's bytes, pieces concatenated."""
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    per = len(ptrs) // n
    return [
        b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per]))
        for i in range(n)
    ]


def clobber(pool, indices: torch.Tensor) -> None:
    """Overwrites pages with 0xEE so a get that copies nothing shows."""
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    for p, s in zip(ptrs, sizes):
        ctypes.memset(p, 0xEE, s)


def chain_keys(tag: str, n: int) -> List[str]:
    """``n`` SHA-256 hex keys chained as SGLang's page hashes are."""
    keys, prior = [], tag.encode()
    for i in range(n):
        prior = hashlib.sha256(prior + i.to_bytes(4, "little")).digest()
        keys.append(prior.hex())
    return keys


def set_chain(b, pool, keys: List[str], batch: int = 128) -> List[bool]:
    """Stores ``keys`` as SGLang's backup thread does: batches of at most 128
    pages, ``prefix_keys`` the keys before each batch."""
    out: List[bool] = []
    for start in range(0, len(keys), batch):
        part = keys[start:start + batch]
        idx = pages_of(pool, len(part))
        write_pages(pool, part, idx)
        out += b.batch_set_v1(part, idx, HiCacheStorageExtraInfo(prefix_keys=keys[:start] or None))
        pool.free(idx)
    return out


def get_chain(b, pool, keys: List[str], batch: int = 128):
    """Reads ``keys`` in batches as SGLang's prefetch thread does
    (``batch_exists``, then ``batch_get_v1``, ``prefix_keys`` the keys before
    each batch); returns (the leading run ``batch_exists`` found, per key its
    bytes or None). Every batch is read, past a miss too."""
    run, short, got = 0, False, []
    for start in range(0, len(keys), batch):
        part = keys[start:start + batch]
        info = HiCacheStorageExtraInfo(prefix_keys=keys[:start] or None)
        hit = b.batch_exists(part, info)
        if not short:
            run += hit
            short = hit < len(part)
        idx = pages_of(pool, len(part))
        clobber(pool, idx)
        ok = b.batch_get_v1(part, idx, info)
        data = read_pages(pool, len(part), idx)
        got += [d if o else None for d, o in zip(data, ok)]
        pool.free(idx)
    return run, got
