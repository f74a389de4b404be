"""radixd.sglang without sglang: the adapter driven through stand-ins for the
few sglang and torch names it uses (shapes as in sgl-project/sglang
python/sglang/srt/mem_cache/base_prefix_cache.py and radix_cache.py). Where
sglang is installed, test_prefix_cache.py::test_sglang_adapter runs the real
thing instead."""

from __future__ import annotations

import abc
import dataclasses
import importlib
import sys
import types
from typing import Any, NamedTuple, Optional

import numpy as np
import pytest

import radixd


def _real_sglang() -> bool:
    try:
        importlib.import_module("sglang")
        return True
    except ImportError:
        return False


pytestmark = pytest.mark.skipif(_real_sglang(), reason="sglang installed: the real adapter test runs")


class RadixKey:
    def __init__(self, token_ids, extra_key=None, is_bigram=False):
        self.token_ids, self.extra_key, self.is_bigram = token_ids, extra_key, is_bigram

    def __len__(self):
        return len(self.token_ids)


@pytest.fixture
def adapter(monkeypatch):
    torch = types.ModuleType("torch")

    class Tensor:  # no stand-in value is a torch.Tensor: numpy arrays pass through
        pass

    torch.Tensor = Tensor
    torch.int64 = np.int64
    torch.device = lambda d: d
    torch.as_tensor = lambda x, dtype=None, device=None: np.asarray(x, dtype=dtype)

    base = types.ModuleType("sglang.srt.mem_cache.base_prefix_cache")

    @dataclasses.dataclass
    class MatchPrefixParams:
        key: Any

    @dataclasses.dataclass
    class InsertParams:
        key: Any = None
        value: Any = None

    @dataclasses.dataclass
    class EvictParams:
        num_tokens: int = 0

    @dataclasses.dataclass
    class EvictResult:
        num_tokens_evicted: int = 0

    @dataclasses.dataclass
    class InsertResult:
        prefix_len: int

    @dataclasses.dataclass
    class IncLockRefResult:
        delta: Optional[int] = None

    @dataclasses.dataclass
    class DecLockRefResult:
        delta: Optional[int] = None

    class MatchResult(NamedTuple):
        device_indices: Any
        last_device_node: Any
        last_host_node: Any
        best_match_node: Any = None
        host_hit_length: int = 0
        device_prefix_len: int = 0

    class BasePrefixCache(abc.ABC):
        @abc.abstractmethod
        def reset(self): ...

        @abc.abstractmethod
        def match_prefix(self, params): ...

        @abc.abstractmethod
        def cache_finished_req(self, req, is_insert=True, **kwargs): ...

        @abc.abstractmethod
        def cache_unfinished_req(self, req, **kwargs): ...

        @abc.abstractmethod
        def evict(self, params): ...

        @abc.abstractmethod
        def inc_lock_ref(self, node): ...

        @abc.abstractmethod
        def dec_lock_ref(self, node, params=None): ...

    for name, value in list(locals().items()):
        if isinstance(value, type):
            setattr(base, name, value)
    for name in ("sglang", "sglang.srt", "sglang.srt.mem_cache"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.base_prefix_cache", base)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delitem(sys.modules, "radixd.sglang", raising=False)
    module = importlib.import_module("radixd.sglang")
    yield module, base
    monkeypatch.delitem(sys.modules, "radixd.sglang", raising=False)


class Pool:
    def __init__(self):
        self.req_to_token = np.zeros((4, 64), dtype=np.int64)

    def write(self, where, values):
        row, cols = where
        self.req_to_token[row, cols] = values


def test_adapter_match_insert_lock_evict(adapter):
    module, base = adapter
    tree = module.RadixdPrefixCache(radixd.Engine(4, 256))
    assert isinstance(tree, base.BasePrefixCache)
    kv = tree.cache.alloc_indices(8)
    r = tree.insert(base.InsertParams(key=RadixKey(list(range(8))), value=kv))
    assert r.prefix_len == 0
    m = tree.match_prefix(base.MatchPrefixParams(key=RadixKey(list(range(9)))))
    assert isinstance(m, base.MatchResult)
    assert m.device_prefix_len == 8 and list(m.device_indices) == list(kv)
    assert tree.inc_lock_ref(m.last_device_node).delta == -8
    assert tree.protected_size() == 8 and tree.evictable_size() == 0
    assert tree.dec_lock_ref(m.last_device_node).delta == 8
    assert tree.evict(base.EvictParams(num_tokens=4)).num_tokens_evicted == 4
    assert tree.total_size() == 4
    miss = tree.match_prefix(base.MatchPrefixParams(key=RadixKey([99] * 8)))
    assert miss.device_prefix_len == 0 and tree.is_root(miss.last_device_node)
    tree.reset()
    assert tree.total_size() == 0


def test_adapter_request_lifecycle(adapter):
    module, _ = adapter
    engine = radixd.Engine(4, 256)
    pool = Pool()
    tree = module.RadixdPrefixCache(engine, req_to_token_pool=pool)
    free0 = engine.stats()["free_pages"]
    prompt = list(range(200, 210))
    kv = tree.cache.alloc_indices(13)
    pool.req_to_token[0, :13] = kv
    req = types.SimpleNamespace(
        req_pool_idx=0, origin_input_ids=prompt, output_ids=[], fill_ids=prompt,
        last_node=tree.root_node, cache_protected_len=0, extra_key=None,
    )
    tree.cache_unfinished_req(req)
    assert req.cache_protected_len == 8 and req.last_node.prefix_len == 8
    assert len(req.prefix_indices) == 10 and tree.protected_size() == 8
    req.output_ids = [1, 2, 3]
    tree.cache_finished_req(req)
    assert tree.protected_size() == 0 and tree.total_size() == 12
    assert engine.stats()["free_pages"] == free0 - 3  # nothing leaked
    engine.validate()
