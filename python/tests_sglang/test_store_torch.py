"""radixd.Client's store methods with torch CPU tensors (torch has no buffer
protocol: the binding reads ``data_ptr()``), in place, and the tensors it
refuses (GPU-less here: non-contiguous ones, and every other object that is
no buffer)."""

from __future__ import annotations

import pytest
import torch

import radixd

SIZE = 4096


@pytest.fixture
def store(start_daemon):
    return start_daemon("--store", "16MiB")


def page(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (SIZE,), dtype=torch.uint8, generator=g)


def test_tensors_are_read_and_written_in_place(store):
    with store.client() as c:
        ns = c.store_namespace("torch/a", SIZE)
        # Any dtype and shape: the bytes count. bf16 holds NaN bit patterns,
        # so compare bytes.
        vals = [page(1), page(2).view(torch.bfloat16).reshape(8, -1), page(3).view(torch.int32)]
        assert c.store_put_many(ns, ["t0", "t1", "t2"], [None, "t0", "t1"], vals) == [True] * 3
        assert c.store_exists(ns, ["t0", "t1", "t2"]) == 3
        out = torch.zeros(SIZE // 2, dtype=torch.float16)
        assert c.store_get(ns, "t1", out) is True
        assert torch.equal(out.view(torch.uint8), page(2))
        # A contiguous slice of a bigger tensor is written where it lies.
        host = torch.zeros(3, SIZE, dtype=torch.uint8)
        assert c.store_get_many(ns, ["t2", "t0"], [host[1], host[2]]) == [True, True]
        assert torch.equal(host[0], torch.zeros(SIZE, dtype=torch.uint8))
        assert torch.equal(host[1], page(3)) and torch.equal(host[2], page(1))
        # numpy and torch name the same bytes.
        assert c.store_get(ns, "t0", host[0].numpy()) and torch.equal(host[0], page(1))


def test_tensors_that_cannot_be_used_in_place_are_refused(store):
    with store.client() as c:
        ns = c.store_namespace("torch/bad", SIZE)
        strided = torch.zeros(2 * SIZE, dtype=torch.uint8)[::2]
        with pytest.raises(TypeError, match="contiguous"):
            c.store_get(ns, "k", strided)
        with pytest.raises(TypeError, match="contiguous"):
            c.store_put_many(ns, ["k"], [None], [strided])
        with pytest.raises(radixd.RadixdError) as e:
            c.store_get(ns, "k", torch.zeros(SIZE + 1, dtype=torch.uint8))
        assert e.value.kind == "size_mismatch"
        with pytest.raises(TypeError, match="CPU tensor"):
            c.store_get(ns, "k", [0] * SIZE)
        assert c.store_stats()["values"] == 0
