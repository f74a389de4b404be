"""Issue 37, item 4: one rule for every page call of ``RadixdStorage``. Before
``register_mem_pool_host`` each of ``batch_exists``, ``exists``,
``batch_get_v1``, ``batch_set_v1``, ``get``, ``batch_get``, ``set`` and
``batch_set`` raises ``RadixdStorageError`` naming the fix and stores
nothing; once the pool is registered, every call uses the namespace the pool
names, so a writer and a reader with the same pool geometry meet."""

from __future__ import annotations

import pytest
import torch
from hicache_pools import chain_keys, mha_pool, pages_of, storage_config, write_pages
from sglang.srt.mem_cache.storage import StorageBackendFactory

from radixd.hicache import RadixdStorageError


@pytest.fixture
def store(start_daemon):
    return start_daemon("--store", "16MiB")


@pytest.mark.parametrize("v1", [0, 1])
def test_every_page_call_needs_the_host_pool(store, v1):
    pool = mha_pool("layer_first")
    cfg = storage_config(store.name, extra={"interface_v1": v1})
    # SGLang's factory builds the dynamic backend without the pool, which
    # HiCacheController.attach_storage_backend registers next.
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    keys = chain_keys("no-pool", 2)
    idx = pages_of(pool, 2)
    write_pages(pool, keys, idx)
    page = pool.get_data_page(idx[0])
    raw = (page.data_ptr(), page.numel() * page.element_size())
    calls = {
        "batch_exists": lambda: b.batch_exists(keys),
        "exists": lambda: b.exists(keys[0]),
        "batch_get_v1": lambda: b.batch_get_v1(keys, idx),
        "batch_set_v1": lambda: b.batch_set_v1(keys, idx),
        "get": lambda: b.get(keys[0], torch.empty_like(page)),
        "batch_get": lambda: b.batch_get(keys[:1], [torch.empty_like(page)]),
        "set": lambda: b.set(keys[0], page),
        "batch_set": lambda: b.batch_set(keys[:1], [page]),
        "set (raw)": lambda: b.set(keys[0], None, *raw),
        "batch_set (raw)": lambda: b.batch_set(keys[:1], None, [raw[0]], [raw[1]]),
        "batch_get (raw)": lambda: b.batch_get(keys[:1], [raw[0]], [raw[1]]),
    }
    for what, call in calls.items():
        with pytest.raises(RadixdStorageError, match=r"before register_mem_pool_host.*register_mem_pool_host\(host_pool\) first") as e:
            call()
        assert str(e.value).startswith(f"radixd HiCache storage: {what.split()[0]} before"), e.value
    assert b.store_stats()["values"] == 0 and b.store_stats()["namespaces"] == 0, "nothing was stored"
    # Empty batches too: the rule does not depend on the arguments.
    with pytest.raises(RadixdStorageError, match="batch_exists before register_mem_pool_host"):
        b.batch_exists([])
    with pytest.raises(RadixdStorageError, match="batch_set before register_mem_pool_host"):
        b.batch_set([], [])
    # Registered, the same backend writes where a reader with its pool reads.
    b.register_mem_pool_host(pool)
    reader = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    reader.register_mem_pool_host(mha_pool("layer_first"))
    assert reader.namespace == b.namespace
    if v1:
        assert b.batch_set_v1(keys, idx) == [True, True]
    else:
        assert b.batch_set(keys, [pool.get_data_page(idx[i * pool.page_size]) for i in range(2)]) is True
    assert reader.batch_exists(keys) == 2 and reader.exists(keys[1])
    assert b.store_stats()["values"] == 2
    pool.free(idx)
