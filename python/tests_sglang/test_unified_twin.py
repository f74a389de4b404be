"""radixd's hybrid engine and SGLang 0.5.23's own ``UnifiedRadixCache``
(Python tree core, real pools and allocators) under the same random
operations: inserts with fresh KV (and states), matches, locks and unlocks,
and evictions of every component. Every answer must agree: match lengths,
FULL hit lengths, whether a state was found, insert prefix lengths,
``mamba_exist``, evicted amounts per component, every evictable and
protected size and the free space of every pool.

FULL eviction is driven by SGLang's answer: SGLang frees whole leaves and
radixd trims pages, so radixd is asked for exactly the tokens SGLang freed
(the same leaves, whole), which needs SGLang's recency rule
(``recency="sglang"``: a split touches its lower half)."""

from __future__ import annotations

import os
import random

import pytest

import radixd
import unified_sim as us

OPS = int(os.environ.get("RADIXD_SGLANG_OPS", "3000"))


class Twin:
    def __init__(self, kind: str, page_size: int, seed: int, release: str = "random"):
        self.kind, self.p, self.release = kind, page_size, release
        self.rng = random.Random(seed)
        full, swa_pages, window, slots = 40, 24, 3 * page_size, 6
        if kind == "swa":
            self.s = us.make_swa_cache(page_size, full, swa_pages, window)
            self.r = radixd.Engine(
                page_size, full, components="full,swa", swa_window=window, swa_capacity=swa_pages, recency="sglang"
            )
        else:
            self.s = us.make_mamba_cache(page_size, full, slots)
            self.r = radixd.Engine(page_size, full, components="full,mamba", mamba_capacity=slots, recency="sglang")
        self.locks: list[tuple] = []
        self.evictions = [0, 0, 0]
        self.hits = 0

    def tokens(self) -> list[int]:
        # A small alphabet over few pages: shared prefixes, splits, repeats.
        pages = self.rng.randint(1, 6)
        out = []
        for i in range(pages):
            c = self.rng.choice((1, 2, 3)) * 10 + i % 3
            out.extend(c * 100 + j for j in range(self.p))
        return out

    def evict(self, full=0, swa=0, mamba=0):
        got = us.evict(self.s, full, swa, mamba)
        ours = self.r.evict_components(got[0] if full else 0, swa, mamba)
        assert tuple(ours) == got, f"evict({full}, {swa}, {mamba}): radixd {tuple(ours)}, SGLang {got}"
        for i, n in enumerate(got):
            self.evictions[i] += n

    def compare_sizes(self):
        st, sz = self.r.stats(), us.sizes(self.s)
        assert (st["evictable_tokens"], st["protected_tokens"]) == (sz["full_evictable"], sz["full_protected"])
        assert st["free_pages"] * self.p == us.full_available(self.s)
        if self.kind == "swa":
            assert (st["swa_evictable_tokens"], st["swa_protected_tokens"]) == (sz["swa_evictable"], sz["swa_protected"])
            assert st["swa_free_pages"] * self.p == us.swa_available(self.s)
        else:
            assert (st["mamba_evictable_states"], st["mamba_protected_states"]) == (sz["mamba_evictable"], sz["mamba_protected"])
            assert st["mamba_free_states"] == us.mamba_available(self.s)

    def insert(self):
        t = self.tokens()
        n = len(t)
        short = n - us.full_available(self.s)
        if short > 0:
            self.evict(full=short)
        if us.full_available(self.s) < n:
            return
        if self.kind == "swa":
            short = n - us.swa_available(self.s)
            if short > 0:
                self.evict(swa=short)
            if us.swa_available(self.s) < n:
                return
        state = None
        if self.kind == "mamba":
            if us.mamba_available(self.s) == 0:
                self.evict(mamba=1)
            if us.mamba_available(self.s) == 0:
                return
            state = (us.alloc_mamba(self.s), self.r.alloc_state())
        kv = us.alloc_kv(self.s, n)
        pages = self.r.alloc(n // self.p)
        got = us.insert(self.s, t, kv, mamba_slot=state and state[0])
        ours = self.r.insert(t, pages, mamba_state=state and state[1])
        assert ours.cached == got["prefix_len"], f"insert {t}: radixd {ours.cached}, SGLang {got['prefix_len']}"
        if state is not None:
            assert ours.mamba_exist == got["mamba_exist"]
            if got["mamba_exist"]:
                us.free_mamba(self.s, state[0])
                self.r.free_state(state[1])

    def request(self):
        """A scheduler's request: match and lock the cached prefix, allocate
        the rest, let decode free the SWA pages that slid out of the window
        (SWA), insert the whole prompt with the tree's pages for the prefix
        (SGLang's ``prev_prefix_len``), unlock."""
        t = self.tokens()
        got = us.match(self.s, t)
        ours = self.r.match_prefix(t, lock=True)
        assert ours.len == got["len"], f"request match {t}: radixd {ours.len}, SGLang {got['len']}"
        receipt = us.lock(self.s, got["node"])
        rest = len(t) - got["len"]
        ok = us.full_available(self.s) >= rest and (self.kind != "swa" or us.swa_available(self.s) >= rest)
        if self.kind == "mamba" and us.mamba_available(self.s) == 0:
            ok = False
        if ok and rest:
            kv = us.alloc_kv(self.s, rest)
            fresh = list(self.r.alloc(rest // self.p))
            evicted = 0
            if self.kind == "swa":
                window = 3 * self.p
                evicted = max(0, (len(t) - window - self.p) // self.p * self.p)
                evicted = evicted if evicted > got["len"] else 0
                if evicted:
                    us.free_swa_only(self.s, kv[: evicted - got["len"]])
                    assert self.r.free_swa(fresh[: (evicted - got["len"]) // self.p]) == (evicted - got["len"]) // self.p
            state = None
            if self.kind == "mamba":
                state = (us.alloc_mamba(self.s), self.r.alloc_state())
            g = us.insert(self.s, t, got["value"] + kv, mamba_slot=state and state[0], swa_evicted_seqlen=evicted, prev_prefix_len=got["len"])
            o = self.r.insert(t, list(ours.pages) + fresh, mamba_state=state and state[1], swa_evicted=evicted)
            assert o.cached == g["prefix_len"], f"request insert {t}: radixd {o.cached}, SGLang {g['prefix_len']}"
            if state is not None:
                assert o.mamba_exist == g["mamba_exist"]
                if g["mamba_exist"]:
                    us.free_mamba(self.s, state[0])
                    self.r.free_state(state[1])
        us.unlock(self.s, got["node"], receipt)
        if ours.handle is not None:
            self.r.unlock(ours.handle)

    def match(self, lock: bool):
        t = self.tokens()
        got = us.match(self.s, t)
        ours = self.r.match_prefix(t, lock=lock)
        assert ours.len == got["len"], f"match {t}: radixd {ours.len}, SGLang {got['len']}"
        assert ours.full_kv_hit_length == got["full_kv_hit_length"]
        if self.kind == "mamba":
            assert (ours.mamba_state is not None) == (got["mamba"] is not None)
        self.hits += ours.len > 0
        if lock and ours.handle is not None:
            self.locks.append((got["node"], us.lock(self.s, got["node"]), ours.handle))

    def unlock(self):
        if self.locks:
            at = {"arrival": 0, "reverse": -1}.get(self.release)
            if at is None:
                at = self.rng.randrange(len(self.locks))
            node, receipt, handle = self.locks.pop(at)
            us.unlock(self.s, node, receipt)
            self.r.unlock(handle)

    def step(self):
        op = self.rng.random()
        if op < 0.2:
            self.insert()
        elif op < 0.35:
            self.request()
        elif op < 0.6:
            self.match(lock=False)
        elif op < 0.7:
            self.match(lock=len(self.locks) < 4)
        elif op < 0.8:
            self.unlock()
        elif op < 0.88:
            self.evict(full=self.rng.randint(1, 3) * self.p)
        elif self.kind == "swa":
            self.evict(swa=self.rng.randint(1, 4) * self.p)
        else:
            self.evict(mamba=self.rng.randint(1, 2))
        self.compare_sizes()


@pytest.mark.parametrize("release", ["arrival", "reverse", "random"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["swa", "mamba"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_every_answer_agrees(kind, page_size, seed, release):
    """Locks are released in the order they were taken (requests finishing
    as they came), newest first, or in any order: each must release exactly
    what it took, as SGLang's receipt does."""
    us.publish_runtime(page_size)
    twin = Twin(kind, page_size, seed=seed * 1000 + page_size * 31 + len(kind), release=release)
    for i in range(OPS):
        try:
            twin.step()
        except AssertionError as e:
            raise AssertionError(f"step {i}: {e}") from e
        twin.r.validate()
    assert twin.hits > OPS // 20
    assert twin.evictions[0] > 0 and twin.evictions[1 if kind == "swa" else 2] > 0


@pytest.mark.parametrize("oldest_first", [True, False])
def test_two_locks_across_a_split_release_what_each_took(oldest_first):
    """Issue 29's scenario: FULL+SWA, page size 4, window 10. Lock 1 holds a
    48-token node, a match splits it at 12, lock 2 holds the lower 36: each
    release gives back exactly its own window, in either order."""
    p, window = 4, 10
    us.publish_runtime(p)
    s = us.make_swa_cache(p, 64, 64, window)
    r = radixd.Engine(p, 64, components="full,swa", swa_window=window, swa_capacity=64)
    t = list(range(1000, 1068))
    got = us.insert(s, t, us.alloc_kv(s, len(t)))
    ours = r.insert(t, r.alloc(len(t) // p))
    assert ours.cached == got["prefix_len"] == 0

    def sizes():
        st, sz = r.stats(), us.sizes(s)
        mine = (st["swa_protected_tokens"], st["swa_evictable_tokens"])
        assert mine == (sz["swa_protected"], sz["swa_evictable"])
        return mine

    locks = []
    for n, lock in ((50, True), (15, False), (50, True)):
        key = t[:n]
        g = us.match(s, key)
        o = r.match_prefix(key, lock=lock)
        assert o.len == g["len"]
        if lock:
            locks.append((g["node"], us.lock(s, g["node"]), o.handle))
    assert locks[0][2] != locks[1][2]  # one node, two locks: two handles
    assert sizes() == (48, 20)
    order = locks if oldest_first else locks[::-1]
    node, receipt, handle = order[0]
    us.unlock(s, node, receipt)
    r.unlock(handle)
    assert sizes() == ((36, 32) if oldest_first else (48, 20))
    node, receipt, handle = order[1]
    us.unlock(s, node, receipt)
    r.unlock(handle)
    assert sizes() == (0, 68)
    r.validate()
