"""A scheduler-like driver over SGLang 0.5.23's own objects: ``Req``,
``ReqToTokenPool``, its token-to-KV allocators and the functions its
scheduler calls (``match_kv_cache``, ``alloc_token_slots``,
``alloc_paged_token_slots_extend``, ``BasePrefixCache.checkpoint`` as
``checkpoint_kv_cache`` calls it, ``release_kv_cache``). One ``Sim`` drives
one tree cache; ``Twin`` drives SGLang's ``RadixCache`` and radixd's
``RadixdPrefixCache`` with the same random decisions and compares every
answer."""

from __future__ import annotations

import random
from array import array
from typing import Any, Callable, Optional

import torch
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_extend, alloc_token_slots
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import match_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, get_radix_cache_factory
from sglang.srt.sampling.sampling_params import SamplingParams

MAX_CONTEXT = 512


def publish_runtime() -> None:
    """SGLang's functions read process-wide config (``get_serving()``, ...):
    publish the defaults of a scheduler with ``--radix-cache-backend radixd``."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    runtime_context.publish(ServerArgs(model_path="dummy", radix_cache_backend="radixd"), role="scheduler")


def params(
    page_size: int,
    pages: int,
    rows: int = 64,
    context: int = MAX_CONTEXT,
    eviction_policy: str = "lru",
    eviction_policy_config: Optional[dict] = None,
) -> CacheInitParams:
    """SGLang's pools for one scheduler: ``pages`` KV pages, ``rows`` request
    rows of ``context`` tokens; the server's ``--radix-eviction-policy`` and
    its config."""
    pool = ReqToTokenPool(rows, context, "cpu", False)
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(pages, torch.float16, "cpu", None, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(pages * page_size, page_size, torch.float16, "cpu", None, False)
    return CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        eviction_policy=eviction_policy,
        eviction_policy_config=eviction_policy_config,
    )


def build_context(p: CacheInitParams) -> TreeCacheBuildContext:
    return TreeCacheBuildContext(
        server_args=None,
        params=p,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )


def radixd_cache(p: CacheInitParams) -> Any:
    """``RadixdPrefixCache`` built the way SGLang builds it: the factory
    registered under ``radixd`` in SGLang's registry (by the plugin)."""
    factory = get_radix_cache_factory("radixd")
    assert factory is not None, "the radixd plugin did not register its backend"
    return factory(build_context(p))


class Sim:
    """One scheduler's state around one tree cache."""

    def __init__(self, cache: Any, p: CacheInitParams, kv_file: Optional[str] = None):
        self.cache = cache
        self.pool = p.req_to_token_pool
        self.alloc = cache.token_to_kv_pool_allocator
        self.ps = p.page_size
        self.running: dict[str, Req] = {}
        # Whether an allocation may count on evicting (SGLang's allocation
        # path then evicts through the cache's evict_for_alloc); else the
        # caller makes room first.
        self.alloc_evicts = False
        # What each KV slot holds: the token whose KV a request computed
        # into it. A matched prefix must read back its own tokens, or the
        # cache handed out slots of other tokens (or reused live ones).
        # With ``kv_file`` the table is a file every scheduler process maps
        # (the stand-in for the KV pool they share on one GPU).
        slots = (self.alloc.size // self.ps + 1) * self.ps
        if kv_file is None:
            self.kv = torch.full((slots,), -1, dtype=torch.int64)
        else:
            self.kv = torch.from_file(kv_file, shared=True, size=slots, dtype=torch.int64)

    # ----- what the scheduler does -----

    def arrive(self, rid: str, tokens: array, space: tuple = (None, None), priority: Optional[int] = None) -> int:
        """``space``: the request's ``(extra_key, cache_salt)``; ``priority``:
        its priority (SGLang's ``--enable-priority-scheduling`` sets it)."""
        extra_key, cache_salt = space
        req = Req(
            rid,
            "",
            array("q", tokens),
            SamplingParams(max_new_tokens=64),
            extra_key=extra_key,
            cache_salt=cache_salt,
            priority=priority,
        )
        req.refresh_fill_ids()
        match_kv_cache(req, self.cache)
        req.lock = self.cache.lock(req.last_node)
        if self.pool.alloc([req]) is None:
            raise RuntimeError("no request row")
        n = req.prefix_len
        if n:
            prefix = self.cache.prefix_device_indices(req)
            self.pool.write((req.kv.req_pool_idx, slice(0, n)), prefix)
            self.check_kv(req, n)
        req.kv.cache_protected_len = n
        req.kv.kv_committed_len = req.kv.kv_allocated_len = n
        self.running[rid] = req
        return n

    def demand(self, rid: str, n: int) -> int:
        """Tokens the allocation of ``n`` more tokens evicts for (SGLang's
        conservative count for paged allocation)."""
        return n if self.ps == 1 else n + self.ps

    def extend(self, rid: str, n: int, new_tokens: Optional[list] = None) -> bool:
        """Allocates KV for ``n`` more tokens of ``rid`` (past the prompt:
        ``new_tokens`` are its outputs); False when the pool cannot."""
        req = self.running[rid]
        start = req.kv.kv_committed_len
        end = start + n
        room = self.alloc.available_size()
        if self.alloc_evicts:
            # SGLang's allocation evicts what it lacks (evict_for_alloc).
            room += self.cache.evictable_size()
        if room < self.demand(rid, n):
            return False
        if self.ps == 1:
            out = alloc_token_slots(self.cache, n)
        else:
            row = self.pool.req_to_token[req.kv.req_pool_idx]
            last = row[start - 1 : start].to(torch.int64) if start else torch.full((1,), -1)
            out = alloc_paged_token_slots_extend(
                tree_cache=self.cache,
                prefix_lens=torch.tensor([start]),
                prefix_lens_cpu=torch.tensor([start]),
                seq_lens=torch.tensor([end]),
                seq_lens_cpu=torch.tensor([end]),
                last_loc=last,
                extend_num_tokens=n,
            )
        self.pool.write((req.kv.req_pool_idx, slice(start, end)), out)
        if new_tokens:
            req.output_ids.extend(new_tokens)
            req.refresh_fill_ids()
        self.kv[out] = torch.tensor(req.full_untruncated_fill_ids[start:end], dtype=torch.int64)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = end
        return True

    def checkpoint(self, rid: str) -> int:
        """A chunk ends: as ``checkpoint_kv_cache``."""
        req = self.running[rid]
        self.cache.checkpoint(req, up_to=req.kv.kv_committed_len)
        req.prefix_len = req.kv.kv_committed_len
        self.check_kv(req, req.kv.kv_committed_len)
        return req.kv.cache_protected_len

    def check_kv(self, req: Req, n: int) -> None:
        row = self.pool.req_to_token[req.kv.req_pool_idx, :n].to(torch.int64)
        want = torch.tensor(req.full_untruncated_fill_ids[:n], dtype=torch.int64)
        assert torch.equal(self.kv[row], want), f"{req.rid}: its row's KV slots hold other tokens"

    def finish(self, rid: str, abort: bool = False) -> None:
        req = self.running.pop(rid)
        release_kv_cache(req, self.cache, checkpoint=not abort)

    def evict(self, n: int) -> int:
        return self.cache.evict(EvictParams(num_tokens=n)).num_tokens_evicted

    def peek(self, tokens: array, space: tuple = (None, None)) -> int:
        key = RadixKey(array("q", tokens), extra_key=space[0], cache_salt=space[1])
        return self.cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len

    def sizes(self) -> tuple:
        c = self.cache
        return (c.evictable_size(), c.protected_size(), c.total_size(), self.alloc.available_size())


class Workload:
    """Random prompts sharing prefixes: a few system prompts, cut at random
    points, followed by tokens of a small vocabulary (so suffixes collide)."""

    def __init__(self, rng: random.Random, page_size: int):
        self.rng = rng
        lengths = [rng.randrange(1, 6 * page_size + 8) for _ in range(5)]
        self.systems = [[rng.randrange(1000) for _ in range(n)] for n in lengths]

    def prompt(self) -> list:
        r = self.rng
        base = r.choice(self.systems)
        cut = r.randrange(0, len(base) + 1)
        return base[:cut] + [r.randrange(8) for _ in range(r.randrange(1, 40))]


class Twin:
    """SGLang's ``RadixCache`` (a) and ``RadixdPrefixCache`` (b) under the same
    random operations; every answer is compared (``ops`` counts them).

    ``reference`` builds (a) from its params instead (SGLang's
    ``UnifiedRadixCache`` on its Python core, against the same controller on
    the radixd core as (b)); ``same_evictions``: (b) is asked for the tokens
    (a) was asked for, not for what (a) freed (both evict whole leaves)."""

    def __init__(
        self,
        page_size: int,
        pages: int,
        backend_cache: Any,
        seed: int,
        lru: bool = False,
        spaces: Optional[list] = None,
        eviction_policy: str = "lru",
        eviction_policy_config: Optional[dict] = None,
        priorities: Optional[list] = None,
        eagle: bool = False,
        reference: Optional[Callable[[CacheInitParams], Any]] = None,
        same_evictions: bool = False,
        alloc_evicts: bool = False,
    ):
        # eagle: both caches built with CacheInitParams.is_eagle (EAGLE /
        # MTP: the tree keyed by bigrams), and decoding commits a verify
        # step's accepted tokens, one to four at a time.
        self.eagle = eagle
        # lru: evictions free part of the evictable tokens, so the two
        # caches must agree on which leaves are least recently used; else
        # every eviction frees all that is evictable (order-free).
        self.lru = lru
        # The (extra_key, cache_salt) pairs requests come in (LoRA
        # adapters, tenants): each arrival and match picks one.
        self.spaces = spaces or [(None, None)]
        # The priorities requests come with (None: SGLang's default).
        self.priorities = priorities or [None]
        self.rng = random.Random(seed)
        self.ps = page_size
        policy = dict(eviction_policy=eviction_policy, eviction_policy_config=eviction_policy_config)
        pa = params(page_size, pages, **policy)
        pa.is_eagle = eagle
        self.same_evictions = same_evictions
        self.a = Sim((reference or RadixCache)(pa), pa)
        pb = params(page_size, pages, **policy)
        pb.is_eagle = eagle
        self.b = Sim(backend_cache(pb), pb)
        # alloc_evicts: no room is made before an allocation; SGLang's
        # allocation path evicts what it lacks (evict_for_alloc's walk).
        self.alloc_evicts = alloc_evicts
        self.a.alloc_evicts = self.b.alloc_evicts = alloc_evicts
        self.work = Workload(self.rng, page_size)
        self.prompts: dict[str, list] = {}
        self.next_rid = 0
        self.ops = 0
        self.evictions = 0
        self.hits = 0
        self.hit_spaces: set = set()

    def same(self, what: str, x: Any, y: Any) -> None:
        assert x == y, f"op {self.ops}: {what}: SGLang {x!r}, radixd {y!r}"

    def check_sizes(self, what: str) -> None:
        self.same(f"{what}: (evictable, protected, total, available)", self.a.sizes(), self.b.sizes())

    def make_room(self, need: int) -> bool:
        """Eviction under pressure: SGLang's RadixCache evicts whole leaves
        (possibly more than asked); radixd is asked for exactly what SGLang
        freed, and must free exactly that, in the same LRU order, or the
        next answers differ."""
        short = need - self.a.alloc.available_size()
        if short <= 0:
            return True
        want = short if self.lru else self.a.cache.evictable_size()
        freed = self.a.evict(want)
        self.same("tokens evicted", freed, self.b.evict(want if self.same_evictions else freed))
        self.evictions += 1
        return self.a.alloc.available_size() >= need

    def step(self) -> None:
        r = self.rng
        running = sorted(self.a.running)
        roll = r.random()
        self.ops += 1
        if roll < 0.2 and len(running) < 12:
            rid = f"r{self.next_rid}"
            self.next_rid += 1
            prompt = self.work.prompt()
            self.prompts[rid] = prompt
            space = r.choice(self.spaces)
            # Drawn only when there is a choice: the default twins keep
            # their random sequences.
            priority = r.choice(self.priorities) if len(self.priorities) > 1 else self.priorities[0]
            hit = self.a.arrive(rid, prompt, space, priority)
            self.same(f"match on arrival in {space}", hit, self.b.arrive(rid, prompt, space, priority))
            self.hits += hit > 0
            if hit:
                self.hit_spaces.add(space)
        elif roll < 0.6 and running:
            rid = r.choice(running)
            req = self.a.running[rid]
            done = req.kv.kv_committed_len
            prompt = self.prompts[rid]
            if done < len(prompt):
                n = min(len(prompt) - done, r.randrange(1, 3 * self.ps + 3))
                outputs = None
            else:
                n = r.randrange(1, 5) if self.eagle else 1
                outputs = [r.randrange(8) for _ in range(n)]
            if done + n >= MAX_CONTEXT - 1:
                return
            if not self.alloc_evicts and not self.make_room(self.a.demand(rid, n)):
                return
            ok = self.a.extend(rid, n, outputs)
            self.same("allocation", ok, self.b.extend(rid, n, outputs))
            if ok and (outputs is None or r.random() < 0.3):
                self.same("checkpoint: cache_protected_len", self.a.checkpoint(rid), self.b.checkpoint(rid))
        elif roll < 0.75 and running:
            rid = r.choice(running)
            if self.a.running[rid].kv.kv_allocated_len == 0 or not self.finishable(rid):
                return  # a scheduler releases a request after its first chunk
            self.prompts.pop(rid)
            abort = r.random() < 0.25 or self.unextended(rid)
            self.a.finish(rid, abort)
            self.b.finish(rid, abort)
        elif roll < 0.85:
            n = r.randrange(1, 4 * self.ps + 2)
            want = n if self.lru else self.a.cache.evictable_size()
            freed = self.a.evict(want)
            self.same("tokens evicted", freed, self.b.evict(want if self.same_evictions else freed))
            self.evictions += 1
        else:
            tokens = self.work.prompt()
            space = r.choice(self.spaces)
            self.same(f"match in {space}", self.a.peek(tokens, space), self.b.peek(tokens, space))
        self.check_sizes("after the op")

    def finishable(self, rid: str) -> bool:
        """Whether the plain finish of ``step`` may end ``rid``."""
        return True

    def drain(self) -> None:
        for rid in sorted(self.a.running):
            if self.a.running[rid].kv.kv_allocated_len == 0:
                for s in (self.a, self.b):
                    req = s.running.pop(rid)
                    s.cache.unlock(req.lock)
                    s.pool.free(req)
                continue
            abort = self.unextended(rid)
            self.a.finish(rid, abort)
            self.b.finish(rid, abort)
        self.check_sizes("drained")

    def unextended(self, rid: str) -> bool:
        """With bigram keys: ``rid`` holds fewer bigrams than its matched
        prefix (it computed nothing past the prefix, the last token of
        which is no bigram's first), so it is aborted rather than finished.
        SGLang's scheduler never releases such a request (every request
        extends at least one token: its longest match is its input less
        one); ``RadixCache`` would drop its ``cache_protected_len`` below
        the locked prefix there and free slots its tree still holds, which
        ``RadixdPrefixCache`` declines to do."""
        kv = self.a.running[rid].kv
        return self.eagle and (kv.kv_committed_len - 1) // self.ps * self.ps < kv.cache_protected_len


class SessionSim(Sim):
    """``Sim`` with streaming sessions as SGLang's scheduler runs them on a
    ``UnifiedRadixCache`` (``session/streaming_session.py``): a turn of
    session ``sid`` comes with the session's history (the last finished
    turn's input and output) and new tokens; its match borrows the
    session's KV record when the session holds one; its first row
    allocation hands the record to the session (``maybe_hand_to_session``,
    as ``alloc_for_extend`` does); finishing keeps the record in the session
    (``release_kv_cache`` → ``claim_kv_row``); an abort hands it back and
    frees it; ``release`` closes the session (``SessionController._close``)."""

    def __init__(self, cache: Any, p: CacheInitParams):
        super().__init__(cache, p)
        from sglang.srt.session.session_controller import Session

        self._session_class = Session
        self.sessions: dict[str, Any] = {}

    def open(self, sid: str) -> None:
        self.sessions[sid] = self._session_class(capacity_of_str_len=1 << 20, session_id=sid, streaming=True)

    def history(self, sid: str) -> list:
        """The tokens a new turn of ``sid`` starts with."""
        s = self.sessions[sid]
        if not s.req_nodes:
            return []
        [node] = s.req_nodes.values()
        return list(node.req.origin_input_ids) + list(node.req.output_ids)

    def arrive_turn(self, rid: str, sid: str, tokens: list) -> int:
        session = self.sessions[sid]
        req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=64), session=session)
        session._inflight = True
        req.refresh_fill_ids()
        match_kv_cache(req, self.cache)
        req.lock = self.cache.lock(req.last_node)
        n = req.prefix_len
        if req.kv.holds_kv:
            # The session's record, lent: its row holds the prefix already.
            if self.pool.alloc([req]) is None:
                raise RuntimeError("the lent row was not reused")
            self.check_kv(req, n)
        else:
            if self.pool.alloc([req]) is None:
                raise RuntimeError("no request row")
            if n:
                prefix = self.cache.prefix_device_indices(req)
                self.pool.write((req.kv.req_pool_idx, slice(0, n)), prefix)
                self.check_kv(req, n)
            req.kv.cache_protected_len = n
            req.kv.kv_committed_len = req.kv.kv_allocated_len = n
        self.running[rid] = req
        return n

    def extend(self, rid: str, n: int, new_tokens: Optional[list] = None) -> bool:
        ok = super().extend(rid, n, new_tokens)
        if ok:
            self.cache.maybe_hand_to_session(self.running[rid])
        return ok

    def finish_turn(self, rid: str, abort: bool) -> None:
        """A streaming turn ends: finished (its record stays in the session)
        or aborted (freed, the session's record and lock with it)."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH

        req = self.running.pop(rid)
        if abort:
            # Mid-turn (the scheduler moves to_finish here at its next step).
            req.finished_reason = FINISH_ABORT("aborted by the twin")
        else:
            req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
        release_kv_cache(req, self.cache, checkpoint=not abort)

    def release(self, sid: str) -> None:
        s = self.sessions.pop(sid)
        for node in s.req_nodes.values():
            node.req.session = None
        self.cache.release_radix_session(sid)
        self.cache.release_session(sid)

    def held(self) -> tuple:
        """What the sessions hold: per session, (protected, committed, allocated)."""
        slots = self.cache.session.slots
        return tuple(
            (sid, s.kv.cache_protected_len, s.kv.kv_committed_len, s.kv.kv_allocated_len)
            for sid, s in sorted(slots.items())
        )


class SessionTwin(Twin):
    """``Twin`` with streaming sessions beside plain requests: turns arrive
    (each session one at a time, with its history), extend, checkpoint,
    finish or abort, sessions close; every answer, every session's record
    and every size compared after every step."""

    def __init__(self, page_size: int, pages: int, backend_cache: Any, seed: int, reference: Any, **kw: Any):
        super().__init__(page_size, pages, backend_cache, seed, reference=reference, **kw)
        for s in ("a", "b"):
            old = getattr(self, s)
            setattr(self, s, SessionSim(old.cache, _params_of(old)))
            getattr(self, s).alloc_evicts = self.alloc_evicts
        self.turn_of: dict[str, str] = {}  # running turn -> its session
        self.next_sid = 0
        self.turns = self.turn_hits = self.lent = self.session_aborts = self.released = 0

    def check_sizes(self, what: str) -> None:
        super().check_sizes(what)
        self.same(f"{what}: sessions' records", self.a.held(), self.b.held())

    def finishable(self, rid: str) -> bool:
        return rid not in self.turn_of

    def step(self) -> None:
        r = self.rng
        roll = r.random()
        idle = sorted(sid for sid, s in self.a.sessions.items() if not s._inflight)
        turns = sorted(self.turn_of)
        if roll < 0.05 and len(self.a.sessions) < 4:
            sid = f"s{self.next_sid}"
            self.next_sid += 1
            self.a.open(sid)
            self.b.open(sid)
        elif roll < 0.15 and idle and len(self.a.running) < 12:
            self.ops += 1
            sid = r.choice(idle)
            rid = f"t{self.next_rid}"
            self.next_rid += 1
            new = [r.randrange(8) for _ in range(r.randrange(1, 3 * self.ps + 4))]
            history = self.a.history(sid)
            self.same(f"{sid}'s history", history, self.b.history(sid))
            prompt = history + new
            self.prompts[rid] = prompt
            hit = self.a.arrive_turn(rid, sid, prompt)
            self.same(f"turn of {sid}: match", hit, self.b.arrive_turn(rid, sid, prompt))
            self.same(
                f"turn of {sid}: cache_protected_len",
                self.a.running[rid].kv.cache_protected_len,
                self.b.running[rid].kv.cache_protected_len,
            )
            self.turn_of[rid] = sid
            self.turns += 1
            self.turn_hits += hit > 0
            # On the session's own record (lent), not the tree's.
            self.lent += self.a.cache.session.borrowed_slot(self.a.running[rid]) is not None
            self.check_sizes("after a turn's arrival")
        elif roll < 0.25 and turns:
            self.ops += 1
            rid = r.choice(turns)
            req = self.a.running[rid]
            if self.a.cache.session.borrowed_slot(req) is None:
                return  # a scheduler releases a request after its first chunk
            # A turn that has not computed its prompt cannot finish: abort.
            abort = req.kv.kv_committed_len < len(self.prompts[rid]) or r.random() < 0.2
            sid = self.turn_of.pop(rid)
            self.prompts.pop(rid)
            self.a.finish_turn(rid, abort)
            self.b.finish_turn(rid, abort)
            self.session_aborts += abort
            self.check_sizes(f"after {sid}'s turn {'aborted' if abort else 'finished'}")
        elif roll < 0.28 and idle:
            self.ops += 1
            sid = r.choice(idle)
            self.a.release(sid)
            self.b.release(sid)
            self.released += 1
            self.check_sizes(f"after {sid} closed")
        else:
            # Plain requests, turns' extends and checkpoints, evictions, matches.
            before = set(self.a.running)
            super().step()
            for rid in before - set(self.a.running):
                self.turn_of.pop(rid, None)

    def drain(self) -> None:
        for rid in sorted(self.turn_of):
            req = self.a.running[rid]
            self.turn_of.pop(rid)
            if self.a.cache.session.borrowed_slot(req) is None:
                # Never allocated for: it leaves the waiting queue.
                for s in (self.a, self.b):
                    req = s.running.pop(rid)
                    s.cache.unlock(req.lock)
                    if req.kv.holds_kv:
                        s.pool.free(req)
                    req.session.abort_req()
                continue
            abort = req.kv.kv_committed_len < len(self.prompts[rid])
            self.a.finish_turn(rid, abort)
            self.b.finish_turn(rid, abort)
        for sid in sorted(self.a.sessions):
            self.a.release(sid)
            self.b.release(sid)
        super().drain()
        self.same("sessions left", self.a.held(), ())


def _params_of(s: Sim) -> CacheInitParams:
    """The params a ``Sim`` was built with (its pools)."""
    return CacheInitParams(
        disable=False,
        req_to_token_pool=s.pool,
        token_to_kv_pool_allocator=s.cache.token_to_kv_pool_allocator,
        page_size=s.ps,
    )
