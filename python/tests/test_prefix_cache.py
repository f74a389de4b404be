"""radixd.PrefixCache: SGLang's RadixCache surface, checked against a
reference port of SGLang's own RadixCache algorithm
(sgl-project/sglang python/sglang/srt/mem_cache/radix_cache.py) on random
operation sequences, with radixd's invariant checker after every step."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

import radixd
from radixd import PrefixCache


class _Node:
    __slots__ = ("children", "parent", "key", "value", "lock_ref")

    def __init__(self):
        self.children = {}
        self.parent = None
        self.key = []
        self.value = []
        self.lock_ref = 0


class RefRadixCache:
    """SGLang's RadixCache (match with split, insert, inc/dec_lock_ref, evict,
    sizes), paged, without torch: the reference PrefixCache must agree with."""

    def __init__(self, page_size: int):
        self.p = page_size
        self.root = _Node()
        self.root.lock_ref = 1
        self.evictable = 0
        self.protected = 0

    def _ck(self, key):
        return tuple(key[: self.p])

    def _match_len(self, a, b):
        i, n = 0, min(len(a), len(b))
        while i < n and a[i : i + self.p] == b[i : i + self.p]:
            i += self.p
        return i

    def _aligned(self, key):
        return list(key[: len(key) // self.p * self.p])

    def _split(self, child, k):
        new = _Node()
        new.parent, new.lock_ref = child.parent, child.lock_ref
        new.key, new.value = child.key[:k], child.value[:k]
        new.children = {self._ck(child.key[k:]): child}
        child.parent, child.key, child.value = new, child.key[k:], child.value[k:]
        new.parent.children[self._ck(new.key)] = new
        return new

    def match_prefix(self, key):
        key = self._aligned(key)
        node, value = self.root, []
        while key and self._ck(key) in node.children:
            child = node.children[self._ck(key)]
            k = self._match_len(child.key, key)
            if k < len(child.key):
                node = self._split(child, k)
                value += node.value
                break
            value += child.value
            node, key = child, key[k:]
        return value, node

    def insert(self, key, value=None):
        key = self._aligned(key)
        value = list(key) if value is None else list(value)
        node, total = self.root, 0
        while key and self._ck(key) in node.children:
            node = node.children[self._ck(key)]
            k = self._match_len(node.key, key)
            total += k
            key, value = key[k:], value[k:]
            if k < len(node.key):
                node = self._split(node, k)
        if key:
            new = _Node()
            new.parent, new.key, new.value = node, key, value
            node.children[self._ck(key)] = new
            self.evictable += len(key)
        return total

    def inc_lock_ref(self, node):
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable -= len(node.key)
                self.protected += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node):
        delta = 0
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable += len(node.key)
                self.protected -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            node = node.parent
        return delta

    def _nodes(self):
        stack, out = [self.root], []
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def evict_all(self):
        leaves = [n for n in self._nodes() if n is not self.root and not n.children and n.lock_ref == 0]
        evicted = 0
        while leaves:
            x = leaves.pop()
            del x.parent.children[self._ck(x.key)]
            evicted += len(x.key)
            self.evictable -= len(x.key)
            p = x.parent
            if p is not self.root and not p.children and p.lock_ref == 0:
                leaves.append(p)
        return evicted

    def total_size(self):
        return sum(len(n.key) for n in self._nodes())


def random_key(rng, page_size):
    # few distinct tokens and shared stems, so prefixes collide and split
    stem = rng.choice([[], [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5] * 12])
    tail = [rng.randrange(3) for _ in range(rng.randrange(0, 3 * page_size + 3))]
    return stem + tail


def run_against_reference(cache: PrefixCache, page_size: int, steps: int, seed: int):
    rng = random.Random(seed)
    ref = RefRadixCache(page_size)
    held = []  # (ours, ref) nodes from matches, unlocked
    locked = []  # (ours, ref) nodes locked once each
    for step in range(steps):
        op = rng.random()
        what = None
        if op < 0.35:
            key = random_key(rng, page_size)
            what = ("insert", key)
            assert cache.insert(key) == ref.insert(key), what
        elif op < 0.6:
            key = random_key(rng, page_size)
            what = ("match", key)
            m = cache.match_prefix(key)
            value, node = ref.match_prefix(key)
            assert m.device_prefix_len == len(value) == len(m.device_indices), what
            held.append((m.last_device_node, node))
        elif op < 0.78 and held:
            what = ("lock",)
            ours, theirs = held.pop(rng.randrange(len(held)))
            assert cache.inc_lock_ref(ours) == ref.inc_lock_ref(theirs), what
            locked.append((ours, theirs))
        elif op < 0.95 and locked:
            what = ("unlock",)
            ours, theirs = locked.pop(rng.randrange(len(locked)))
            assert cache.dec_lock_ref(ours) == ref.dec_lock_ref(theirs), what
            held.append((ours, theirs))
        elif op >= 0.95:
            what = ("evict-all",)
            assert cache.evict(1 << 40) == ref.evict_all(), what
            held.clear()  # their nodes may be gone (handles now stale)
        else:
            continue
        cache.validate()
        assert cache.evictable_size() == ref.evictable, (step, what)
        assert cache.protected_size() == ref.protected, (step, what)
        assert cache.total_size() == ref.total_size(), (step, what)
    while locked:
        ours, theirs = locked.pop()
        assert cache.dec_lock_ref(ours) == ref.dec_lock_ref(theirs)
    assert cache.protected_size() == 0
    cache.validate()


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_prefix_cache_over_engine_agrees_with_sglang_reference(page_size, seed):
    cache = PrefixCache(radixd.Engine(page_size, 1 << 14))
    run_against_reference(cache, page_size, 400, seed)


def test_prefix_cache_over_a_daemon_agrees_with_sglang_reference(start_daemon):
    d = start_daemon(page_size=4, capacity=4096)
    with d.client() as c:
        run_against_reference(PrefixCache(c), 4, 300, 7)


def test_match_result_shape_and_indices_layout():
    e = radixd.Engine(4, 64)
    cache = PrefixCache(e)
    kv = cache.alloc_indices(10)  # 3 pages, 10 indices
    assert len(kv) == 10 and all(kv[i] == kv[0] // 4 * 4 + i for i in range(4))
    assert cache.insert(list(range(10)), kv) == 0
    assert cache.insert(list(range(10)), kv) == 8  # already cached
    m = cache.match_prefix(list(range(10)))
    assert m.device_prefix_len == 8
    assert m.device_indices.dtype == np.int64
    assert m.device_indices.tolist() == list(kv[:8])
    assert m.last_device_node == m.last_host_node == m.best_match_node
    assert m.host_hit_length == 0
    miss = cache.match_prefix([7, 7])
    assert miss.device_prefix_len == 0 and len(miss.device_indices) == 0
    assert miss.last_device_node is cache.root_node
    assert cache.inc_lock_ref(cache.root_node) == 0 and cache.dec_lock_ref(cache.root_node) == 0
    # SGLang's argument shapes: RadixKey (.token_ids), MatchPrefixParams (.key)
    radix_key = SimpleNamespace(token_ids=list(range(10)), extra_key=None)
    assert cache.match_prefix(radix_key).device_prefix_len == 8
    assert cache.match_prefix(SimpleNamespace(key=radix_key)).device_prefix_len == 8
    assert cache.match_prefix(np.arange(10)).device_prefix_len == 8
    # A LoRA adapter's key is in its own namespace: nothing cached there yet.
    lora_key = SimpleNamespace(token_ids=list(range(10)), extra_key="lora-1")
    assert cache.match_prefix(lora_key).device_prefix_len == 0
    assert cache.inc_lock_ref(m.last_device_node) == -8
    assert (cache.protected_size(), cache.evictable_size(), cache.total_size()) == (8, 0, 8)
    assert cache.evict(100) == 0
    assert cache.dec_lock_ref(m.last_device_node) == 8
    assert cache.evict(SimpleNamespace(num_tokens=1)) == 4
    cache.reset()
    assert cache.total_size() == 0
    cache.validate()


def test_request_lifecycle_frees_and_caches_like_sglang():
    e = radixd.Engine(4, 64)
    cache = PrefixCache(e)
    free0 = e.stats()["free_pages"]
    # prefill of a 10-token prompt in two chunks, then decode 3 tokens
    prompt = list(range(100, 110))
    kv = cache.alloc_indices(13)
    indices, node = cache.cache_unfinished_req(prompt[:6], kv[:6], None)
    assert node.prefix_len == 4 and list(indices) == list(kv[:6])
    assert cache.protected_size() == 4
    indices, node2 = cache.cache_unfinished_req(prompt, kv[:10], node)
    assert node2.prefix_len == 8 and cache.protected_size() == 8
    done = prompt + [1, 2, 3]
    assert cache.cache_finished_req(done, kv, last_node=node2, cache_protected_len=8) == 8
    assert cache.protected_size() == 0 and cache.total_size() == 12
    # all 4 pages are cached (3) or free again (none owned)
    assert e.stats()["free_pages"] == free0 - 3
    # a second request with the same prompt reuses the cache, frees its dups
    m = cache.match_prefix(done)
    assert m.device_prefix_len == 12
    cache.inc_lock_ref(m.last_device_node)
    kv2 = np.concatenate([m.device_indices, cache.alloc_indices(2)])
    cache.cache_finished_req(done + [9, 9], kv2, last_node=m.last_device_node, cache_protected_len=12)
    assert e.stats()["free_pages"] == free0 - 3
    # a request not inserted gives back everything past its cached prefix
    kv3 = cache.alloc_indices(8)
    cache.cache_finished_req([50] * 8, kv3, is_insert=False)
    assert e.stats()["free_pages"] == free0 - 3
    e.validate()



def _keys(tokens, extra_key=None, cache_salt=None):
    return SimpleNamespace(token_ids=tokens, extra_key=extra_key, cache_salt=cache_salt)


@pytest.mark.parametrize("backend", ["engine", "client"])
def test_namespaces_keep_lora_adapters_and_salts_apart(backend, request):
    """SGLang keeps one subtree per (extra_key, cache_salt): so do radixd's
    namespaces, through PrefixCache, Engine and Client alike."""
    if backend == "engine":
        b = radixd.Engine(page_size=2, capacity=64)
    else:
        b = request.getfixturevalue("start_daemon")(page_size=2, capacity=64).client()
    cache = PrefixCache(b)
    tokens = list(range(16))
    spaces = [(None, None), ("lora-1", None), ("lora-2", None), (None, "tenant"), ("lora-1", "tenant"), ("", None)]
    names = {radixd.namespace_of(_keys(tokens, e, s)) for e, s in spaces}
    assert len(names) == len(spaces) and None in names
    assert radixd.namespace_of(_keys(tokens, None, "")) is None, "an empty salt is none"
    assert len(radixd.namespace_of(_keys(tokens, "x" * 300)).encode()) <= 256
    for i, (e, s) in enumerate(spaces):
        # Each namespace caches a prefix of its own length: 2, 4, 6... tokens.
        key = _keys(tokens[: 2 * (i + 1)], e, s)
        assert cache.match_prefix(key).device_prefix_len == 0
        assert cache.insert(key) == 0
    for i, (e, s) in enumerate(spaces):
        m = cache.match_prefix(_keys(tokens, e, s))
        assert m.device_prefix_len == 2 * (i + 1), (e, s)
    # Explicit names on plain token lists, and the native calls take ns=.
    assert cache.match_prefix(tokens, ns=radixd.namespace_of(_keys(tokens, "lora-2"))).device_prefix_len == 6
    assert cache.match_prefix(tokens, ns='["lora-2",null]').device_prefix_len == 6, "the documented name"
    assert b.match_prefix(tokens, ns="never-used").len == 0
    pages = b.alloc(2)
    r = b.insert([9, 9, 8, 8], pages, ns="mine")
    assert r.cached == 0
    assert b.match_prefix([9, 9, 8, 8], ns="mine").len == 4
    assert b.match_prefix([9, 9, 8, 8]).len == 0
    if backend == "client":
        assert b.peek([9, 9, 8, 8], ns="mine")[0] == 4
        assert b.peek([9, 9, 8, 8])[0] == 0
    s = b.session_commit("conv", [5, 5], b.alloc(1), ns="mine")
    assert s.cached == 0
    assert b.match_prefix([5, 5], ns="mine").len == 2 and b.match_prefix([5, 5]).len == 0
    before = b.stats()
    for bad in ["", "n" * 257]:
        with pytest.raises(radixd.ERRORS["bad_namespace"]):
            b.match_prefix(tokens, ns=bad)
    assert b.stats() == before
    cache.validate()


# ----- EAGLE's bigram keys (radixd.bigram_key) -----


def test_bigram_namespaces_are_one_per_first_token_and_namespace():
    """One name per (namespace, first token), none of them a name
    ``namespace_of`` gives, every one a name radixd takes."""
    spaces = [None, '["lora-1",null]', '[null,"t"]', "x" * 250, "y" * 256, "sha256:" + "0" * 64]
    names = {(ns, t): radixd.bigram_namespace(ns, t) for ns in spaces for t in (0, 1, 7, 12, 2**32 - 1)}
    assert len(set(names.values())) == len(names)
    plain = {radixd.namespace_of(_keys([1], e, s)) for e, s in [("a", None), (None, "b"), ("x" * 300, None)]}
    assert not plain & set(names.values())
    assert all(0 < len(n.encode()) <= 256 for n in names.values())
    assert radixd.bigram_namespace(None, 5) == "bigram:5"
    assert radixd.bigram_namespace('["a",null]', 5) == 'bigram:5:["a",null]'
    # Token 1 then "2:..." is not token 12 then "...": the first ":" ends the token.
    assert radixd.bigram_namespace("2", 1) != radixd.bigram_namespace(None, 12)


def test_bigram_key_maps_raw_tokens_to_one_fewer():
    assert radixd.bigram_key([4, 5, 6], None) == ([5, 6], "bigram:4")
    assert radixd.bigram_key([4], "ns") == ([], "ns")
    assert radixd.bigram_key([], None) == ([], None)


def _bigram_lcp(a, b):
    """Bigrams two raw token sequences share from the start."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return max(0, min(k - 1, len(a) - 1, len(b) - 1))


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_bigram_keys_match_what_a_bigram_tree_matches(page_size):
    """Random raw keys of a small vocabulary (so first tokens and suffixes
    collide) inserted and matched through the mapping: every match is the
    longest page-aligned bigram prefix any inserted key shares (what
    SGLang's tree of bigram keys answers), in bigrams, on the pages that
    key was inserted with."""
    rng = random.Random(page_size)
    eng = radixd.Engine(page_size=page_size, capacity=4096)
    inserted = []  # (ns, raw tokens cut to whole pages of bigrams, pages)
    hits = 0

    def raw():
        return [rng.randrange(3) for _ in range(rng.randrange(0, 14))]

    def floor(n):
        return n // page_size * page_size

    for _ in range(300):
        ns = rng.choice([None, '["lora",null]'])
        t = raw()
        tokens, name = radixd.bigram_key(t, ns)
        want = max((floor(min(_bigram_lcp(t, u), max(0, len(t) - 1))) for s, u, _ in inserted if s == ns), default=0)
        m = eng.match_prefix(tokens[: floor(len(tokens))], ns=name)
        assert m.len == want, (t, ns)
        hits += want > 0
        if want:
            # The pages are the first ones of a key sharing that prefix.
            assert any(
                s == ns and _bigram_lcp(t, u) >= want and list(m.pages) == list(p[: want // page_size])
                for s, u, p in inserted
            )
        n = floor(len(tokens))
        if n and rng.random() < 0.5:
            pages = list(m.pages) + list(eng.alloc(n // page_size - len(m.pages)))
            eng.insert(tokens[:n], pages, ns=name)
            inserted.append((ns, t[: n + 1], pages))
    assert hits > 40 // page_size
    eng.validate()
