"""radixd.Engine's host tier (SGLang's HiCache host copies, in-process):
a write-through chain, a demote that keeps the node's handle, a host hit,
a load-back, a prefetch from the L3, host locks and host eviction, and the
errors that change nothing."""

from __future__ import annotations

import pytest

import radixd

P = 2


@pytest.fixture
def engine():
    return radixd.Engine(page_size=P, capacity=8, host_pages=16)


def cache(engine, tokens):
    pages = engine.alloc(len(tokens) // P)
    engine.insert(tokens, pages, lock=False)
    return engine.match_prefix(tokens).handle


def back_up(engine, handle, first=0):
    host = first
    for node in engine.backup_chain(handle):
        n, _ = engine.host_node(node)
        engine.backup(node, list(range(host, host + n)))
        host += n
    return host


def test_a_demoted_node_keeps_its_handle_and_loads_back(engine):
    key = [1, 2, 3, 4, 5, 6]
    h = cache(engine, key)
    assert back_up(engine, h) == 3
    assert engine.host_node(h)[0] == 3 and list(engine.host_node(h)[1]) == [0, 1, 2]
    assert engine.evict(6) == 6
    assert engine.match_prefix(key).len == 0  # the device tree lost it
    device_len, device, host_len, best, pages, host = engine.match_host(key + [7, 8])
    assert (device_len, device, host_len, best) == (0, None, 6, h)
    assert list(pages) == [] and list(host) == [0, 1, 2]
    chain = engine.load_back_chain(h)
    assert [(node, list(hp)) for node, hp in chain] == [(h, [0, 1, 2])]
    fresh = engine.alloc(3)
    assert engine.load_back(h, fresh) == 6
    m = engine.match_prefix(key)
    assert m.len == 6 and list(m.pages) == list(fresh) and m.handle == h
    engine.validate()


def test_insert_host_files_a_prefetch_and_evict_host_frees_it(engine):
    top = cache(engine, [1, 1, 2, 2])
    back_up(engine, top)
    digests = [bytes([i]) * 32 for i in range(3)]
    prefix_len, node, dropped = engine.insert_host(None, [1, 1, 2, 2, 3, 3], [7, 8, 9], digests)
    assert (prefix_len, dropped) == (4, False)  # the caller frees host pages 7 and 8
    assert engine.digests(node) == digests[2:]
    assert engine.host_stats() == {"capacity": 16, "used": 3, "host_only_nodes": 1}
    receipt = engine.host_lock(node)
    assert list(engine.evict_host(1)) == []  # host-locked
    engine.host_unlock(receipt)
    assert list(engine.evict_host(1)) == [9]
    engine.validate()


def test_host_errors_change_nothing(engine):
    h = cache(engine, [1, 1, 2, 2])
    leaf = cache(engine, [1, 1, 2, 2, 3, 3])
    before = engine.host_stats()
    with pytest.raises(radixd.PageCountMismatchError):
        engine.backup(h, [0])
    with pytest.raises(radixd.PageOutOfRangeError):
        engine.backup(h, [0, 16])
    with pytest.raises(radixd.PageNotOwnedError):
        engine.backup(h, [3, 3])
    with pytest.raises(radixd.HostStateError):
        engine.backup(leaf, [0])  # its parent has no copy
    with pytest.raises(radixd.HostStateError):
        engine.host_unlock(12345)
    with pytest.raises(radixd.HostStateError):
        engine.load_back(h, [])  # it holds device pages
    with pytest.raises(radixd.UnknownHandleError):
        engine.host_node((1 << 32) | 1_000)
    with pytest.raises(ValueError):
        engine.set_digests(h, [b"short", b"x" * 32])
    assert engine.host_stats() == before
    engine.validate()
    plain = radixd.Engine(page_size=P, capacity=8)
    assert plain.host_stats() is None
    with pytest.raises(radixd.NoHostTierError):
        plain.backup(cache(plain, [1, 1]), [0])
