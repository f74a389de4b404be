"""radixd.KvIndex (in-process) and radixd.IndexClient (a running
``radixd index serve`` following a ``radixd serve --kv-events`` daemon)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid

import msgspec
import pytest

import radixd
from conftest import radixd_bin


def stored(hashes, parent, tokens, block_size, medium="GPU"):
    # vLLM's BlockStored with array_like=True, tag first.
    return ["BlockStored", hashes, parent, tokens, block_size, None, medium, None]


def batch(events, rank=0):
    return msgspec.msgpack.encode([time.time(), events, rank])


def test_scores_follow_stores_and_removals():
    ix = radixd.KvIndex(block_size=2)
    t = [1, 2, 3, 4, 5, 6]
    h = ix.keys_for_tokens(t)
    assert len(h) == 3
    assert ix.apply(0, batch([stored(h, None, t, 2)])) == {"applied": 1, "ignored": 0, "errors": []}
    ix.apply(1, batch([stored(h[:1], None, t[:2], 2)]))
    scores, sizes = ix.find_matches(tokens=t)
    assert scores == {(0, 0): 3, (1, 0): 1}
    assert sizes == {(0, 0): 3, (1, 0): 1}
    assert ix.find_matches(hashes=h)[0] == scores
    # A removal, a clear, AllBlocksCleared: as Dynamo's index.
    ix.apply(0, batch([["BlockRemoved", [h[1]], "GPU"]]))
    assert ix.find_matches(tokens=t)[0] == {(0, 0): 1, (1, 0): 1}
    ix.apply(1, batch([["AllBlocksCleared"]]))
    assert ix.find_matches(tokens=t)[0] == {(0, 0): 1}
    ix.remove_worker(0)
    assert ix.workers() == {(1, 0): 0}
    # Numpy or array input works for tokens too.
    np = pytest.importorskip("numpy")
    assert ix.find_matches(tokens=np.array(t, dtype=np.int64))[0] == {}


def test_dynamo_rules_and_bad_input():
    ix = radixd.KvIndex(block_size=2)
    report = ix.apply(0, batch([stored([5], 99, [1, 2], 2), stored([6], None, [1, 2], 4)]))
    assert report["errors"] == ["parent_not_found", "block_size"]
    # Media other than GPU and CPU are ignored; CPU (a node store's, or a
    # vLLM engine's offloaded blocks) is its own tier, never a device score.
    assert ix.apply(0, batch([stored([8], None, [1, 2], 2, medium="DISK")]))["ignored"] == 1
    assert ix.apply(0, batch([stored([7], None, [1, 2], 2, medium="CPU")]))["ignored"] == 0
    with pytest.raises(ValueError):
        ix.apply(0, b"\xc1garbage")
    with pytest.raises(ValueError):
        ix.remove(0, [12345])
    with pytest.raises(KeyError):
        ix.clear(42)
    with pytest.raises(ValueError):
        ix.find_matches()
    with pytest.raises(ValueError):
        ix.find_matches(tokens=[-1])
    with pytest.raises(ValueError):
        radixd.KvIndex(block_size=0)
    with pytest.raises(ValueError):
        radixd.KvIndex(hash="md5")
    assert ix.find_matches(tokens=[1, 2])[0] == {}
    assert ix.stats()["errors"]["parent_not_found"] == 1


def test_sha256_cbor_matches_vllm_hashes_and_ranks_are_workers():
    ix = radixd.KvIndex(block_size=2, hash="sha256-cbor", hash_seed="0")
    t = [7, 8, 9, 10]
    h = ix.keys_for_tokens(t)
    ix.apply(3, batch([stored(h, None, t, 2)], rank=2))
    assert ix.find_matches(tokens=t)[0] == {(3, 2): 2}


def test_queries_run_while_events_apply():
    ix = radixd.KvIndex(block_size=2)
    base = [1, 2, 3, 4]
    ix.apply(0, batch([stored(ix.keys_for_tokens(base), None, base, 2)]))
    stop = threading.Event()
    bad = []

    def reader():
        while not stop.is_set():
            if ix.find_matches(tokens=base)[0].get((0, 0)) != 2:
                bad.append(1)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for th in threads:
        th.start()
    for i in range(300):
        t = [100 + i, 1, 2, 3]
        ix.apply(1, batch([stored(ix.keys_for_tokens(t), None, t, 2)]))
    stop.set()
    for th in threads:
        th.join()
    assert not bad
    assert ix.workers()[(1, 0)] == 600


def test_index_client_follows_a_daemon(start_daemon, tmp_path):
    base = f"ipc://{tmp_path}/ev"
    d = start_daemon("--kv-events", base + ".pub", "--kv-events-replay", base + ".rep", page_size=4)
    listen = f"ipc://{tmp_path}/q-{uuid.uuid4().hex[:6]}"
    server = subprocess.Popen(
        [radixd_bin(), "index", "serve", "--listen", listen, "--block-size", "4",
         "--subscribe", f"w0={base}.pub@{base}.rep"],
        stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        c = d.client()
        t = list(range(1, 13))
        pages = c.alloc(3)
        c.insert(t, pages)
        with radixd.IndexClient(listen, timeout=2.0) as ix:
            deadline = time.monotonic() + 15
            while True:
                answer = ix.query(tokens=t + [99])
                if answer["scores"] == {"w0": 3} or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert answer == {"ok": True, "scores": {"w0": 3}, "tree_sizes": {"w0": 3}}
            assert ix.query(tokens=[5, 5, 5, 5])["scores"] == {}
            stats = ix.stats()
            assert stats["workers"] == 1 and stats["blocks"] == 3
            with pytest.raises(ValueError):
                ix.query()
        with radixd.IndexClient(f"ipc://{tmp_path}/nobody", timeout=0.2) as nobody:
            with pytest.raises(TimeoutError):
                nobody.query(tokens=[1])
        c.close()
    finally:
        server.terminate()
        server.wait(5)
