"""What a pool binding covers (docs/protocol.md, "One daemon, one KV pool"):
nothing cached under one binding is matched under another, even while a
client that never bound holds a lock on it (its handle is stale after);
an unbound client of a bound pool reads but does not fill it; and a
``pool_mismatch`` between identities of the SGLang backend's size names
every key that differs, values whole, then what to do."""

from __future__ import annotations

import time

import pytest

import radixd

UUID0 = "GPU-5d1c4f3e-8a9b-2c7d-6e0f-1a2b3c4d5e6f"
UUID1 = "GPU-77aa0b1c-9d8e-4f3a-b2c1-0e9d8c7b6a59"


def sglang_pool(device: str, uuid: str, server: str) -> dict:
    """Keys and values as ``radixd.sglang.pool_identity`` makes them."""
    return {"device": device, "uuid": uuid, "page_size": 4, "pages": 256, "dtype": "bfloat16",
            "layers": 32, "heads": 8, "head_dim": 128, "v_head_dim": 128, "server": server}


def wait_for(client: radixd.Client, want) -> None:
    deadline = time.monotonic() + 5
    while client.pool_binding() != want:
        assert time.monotonic() < deadline, (client.pool_binding(), want)
        time.sleep(0.005)


def test_a_prefix_never_outlives_its_binding(daemon):
    tokens = list(range(100, 132))
    watcher = daemon.client()
    a = daemon.client(pool={"device": "cuda:0", "server": "h:1"})
    pages = a.alloc(8)
    a.insert(tokens, pages)
    with daemon.client() as u:  # never binds
        m = u.match_prefix(tokens, lock=True)
        assert m.len == 32 and list(m.pages) == list(pages)
        with pytest.raises(radixd.NotPermittedError, match="bind"):
            u.alloc(1)
        a.close()
        wait_for(watcher, None)
        s = watcher.stats()
        assert (s["total_tokens"], s["protected_tokens"]) == (0, 0), s
        with daemon.client(pool={"device": "cuda:1", "server": "h:2"}) as b:
            assert b.match_prefix(tokens).len == 0
        with pytest.raises(radixd.StaleHandleError):
            u.unlock(m.handle)
    watcher.close()


def test_a_refusal_of_sglang_sized_identities_names_every_difference_whole(daemon):
    with daemon.client(pool=sglang_pool("cuda:0", UUID0, "10.1.2.3:30000")):
        with pytest.raises(radixd.PoolMismatchError) as refused:
            daemon.client(pool=sglang_pool("cuda:1", UUID1, "10.1.2.3:30001"))
    message = refused.value.message
    for needle in ("device (bound cuda:0, this client cuda:1)",
                   f"uuid (bound {UUID0}, this client {UUID1})",
                   "server (bound 10.1.2.3:30000, this client 10.1.2.3:30001)",
                   "RADIXD_NAME=OTHER"):
        assert needle in message, message
    assert message.endswith("(`radixd serve --store SIZE`)."), message
