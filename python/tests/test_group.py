"""The ranks of one tensor-parallel server on one tree, from Python:
``Client.join`` (or ``Client(..., group=(key, rank, size))``) makes a
connection a rank; every rank's call at one step is carried out once and
answered alike; a rank that sends something else gets ``DesyncError``
naming the step and both calls; joins that disagree are refused with typed
errors and change nothing."""

from __future__ import annotations

import threading

import pytest

import radixd


def test_ranks_share_one_tree_and_get_the_same_answers(daemon):
    ranks = [radixd.Client(daemon.name, group=("srv/a", r, 3)) for r in range(3)]
    assert [c.rank for c in ranks] == [("srv/a", r, 3) for r in range(3)]
    answers = [[] for _ in ranks]

    def run(r: int) -> None:
        c = ranks[r]
        for i in range(50):
            tokens = [i % 5, 1, 2, 3, 4, 5, 6, 7]
            m = c.match_prefix(tokens, lock=True)
            answers[r].append((m.len, list(m.pages), m.handle))
            ins = c.insert(tokens, c.alloc(2))
            answers[r].append((ins.cached, ins.len))
            if m.handle is not None:
                c.unlock(m.handle)
            answers[r].append(c.stats()["total_tokens"])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers[0] == answers[1] == answers[2]
    with radixd.Client(daemon.name) as watcher:
        s = watcher.stats()
    # Five prompts of two pages, cached once (not three times), and no
    # page left owned.
    assert s["total_tokens"] == 5 * 8, s
    assert s["free_pages"] == 256 - 10, s
    for c in ranks:
        c.close()


def test_a_rank_out_of_step_gets_desync(daemon):
    r0 = radixd.Client(daemon.name)
    assert r0.join("g", 0, 2) == 1
    r1 = radixd.Client(daemon.name, group=("g", 1, 2))
    r0.alloc(1)
    with pytest.raises(radixd.DesyncError) as e:
        r1.evict(4)
    assert "step 0" in e.value.message and "rank 0 sent alloc of 1 pages" in e.value.message
    with pytest.raises(radixd.DesyncError):
        r1.stats()
    r0.stats()


def test_joins_that_disagree_are_refused(daemon):
    r0 = radixd.Client(daemon.name, group=("g", 0, 2))
    with pytest.raises(radixd.GroupMismatchError, match="has 2 ranks"):
        radixd.Client(daemon.name, group=("g", 1, 4))
    with pytest.raises(radixd.GroupClosedError, match="joined already"):
        radixd.Client(daemon.name, group=("g", 0, 2))
    with pytest.raises(radixd.MalformedError):
        radixd.Client(daemon.name, group=("", 0, 1))
    solo = radixd.Client(daemon.name)
    solo.alloc(1)
    with pytest.raises(radixd.GroupMismatchError, match="before any cache operation"):
        solo.join("h", 0, 1)
    assert solo.rank is None
    with pytest.raises(radixd.GroupMismatchError, match="already"):
        r0.join("h", 0, 1)
    assert radixd.Client(daemon.name, group=("g", 1, 2)).rank == ("g", 1, 2)
