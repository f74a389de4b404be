//! The operations a client asks of a cache, their answers and their errors,
//! independent of how they travel (JSON lines, shared-memory rings).

use std::time::{Duration, Instant};

mod apply;
mod error;
mod store;

pub use apply::{apply, apply_with, Spare};
pub use error::{ErrorKind, Rejection};

pub use store::{
    apply_store, check_key, KeyList, StoreAccess, StoreReply, StoreRequest, WithStore, NO_PARENT,
};

use crate::engine::{
    Anchor, ClientId, ComponentStats, Components, Engine, FreeCounts, InsertHints, Region, Stats,
};

/// A rank's `join`: the group's key (the same for every rank of one server,
/// agreed among them; see the SGLang backend), this rank, the group's size
/// and the rank's page size. A request's payload, so it lives with the
/// requests; `crate::group`, which keeps the groups, re-exports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Join {
    pub group: String,
    pub rank: u32,
    pub size: u32,
    pub page_size: u32,
}

/// One request to the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Alloc {
        n: u64,
    },
    Free {
        pages: Vec<u32>,
    },
    Insert {
        tokens: Vec<u32>,
        pages: Vec<u32>,
        lock: bool,
    },
    Match {
        tokens: Vec<u32>,
        lock: bool,
    },
    Lock {
        handle: u64,
    },
    Unlock {
        handle: u64,
    },
    Evict {
        tokens: u64,
    },
    SessionCommit {
        session: String,
        tokens: Vec<u32>,
        pages: Vec<u32>,
    },
    SessionRelease {
        session: String,
    },
    SessionStatus {
        session: String,
    },
    Stats,
    Reset,
    /// Checks every invariant of the engine (a diagnostic; changes nothing).
    Validate,
    /// `match` of a key whose first `matched_pages` pages the client read
    /// down to `anchor` ([`Engine::match_at`]): no tokens travel. Answers
    /// `Matched` without pages (the client has them from its read), or
    /// [`ErrorKind::Moved`]. Internal to the shared-memory client: `exec`
    /// never parses it.
    MatchAt {
        anchor: Anchor,
        matched_pages: u32,
        /// The reader's `Peeked::next_hash`.
        next_hash: Option<u32>,
        lock: bool,
    },
    /// `insert` of a key whose first `matched_pages` pages the client read
    /// down to `anchor` ([`Engine::insert_at`]): `tokens` is the rest of
    /// the key, `pages` one per whole page of the whole key. Answers
    /// `Inserted`, or [`ErrorKind::Moved`]. Internal, as `MatchAt`.
    InsertAt {
        anchor: Anchor,
        matched_pages: u32,
        tokens: Vec<u32>,
        pages: Vec<u32>,
        lock: bool,
    },
    /// `match` with the hybrid parts of the answer ([`Engine::match_with`]):
    /// answers [`Reply::MatchedWith`].
    MatchWith {
        tokens: Vec<u32>,
        lock: bool,
    },
    /// `insert` with the extras of a hybrid engine ([`Engine::insert_with`]):
    /// a state slot the client owns to checkpoint at the key's end, and the
    /// leading tokens whose SWA pages the client freed (`free_swa`).
    /// Answers [`Reply::InsertedWith`].
    InsertWith {
        tokens: Vec<u32>,
        pages: Vec<u32>,
        lock: bool,
        mamba_state: Option<u32>,
        swa_evicted: u64,
    },
    /// `evict` per component ([`Engine::evict_components`]): answers
    /// [`Reply::EvictedComponents`].
    EvictComponents {
        tokens: u64,
        swa_tokens: u64,
        mamba_states: u64,
    },
    /// `alloc_state`: one MAMBA state slot for the caller ([`Reply::State`]).
    AllocState,
    /// `free_state`: gives back a state slot the caller owns.
    FreeState {
        state: u64,
    },
    /// `free_swa`: frees the SWA pages paired with owned FULL pages
    /// ([`Reply::SwaFreed`]).
    FreeSwa {
        pages: Vec<u32>,
    },
    /// `stats` with the secondary components' figures
    /// ([`Reply::StatsWith`]).
    StatsWith,
    /// `swa_pages`: the SWA page paired with each page
    /// ([`Reply::SwaPages`]; reads only).
    SwaPages {
        pages: Vec<u32>,
    },
    /// Binds this client to the KV buffer `pool` names (a
    /// [`crate::binding::PoolIdentity`], untrusted text): the first binder
    /// binds the daemon's pool, a client of another buffer is refused
    /// ([`ErrorKind::PoolMismatch`]). Answers [`Reply::Bound`]. A daemon's
    /// business: an in-process engine, which has one client, refuses it.
    Bind {
        pool: String,
    },
    /// A store write ([`StoreRequest`]); the daemon routes it to its store.
    Store(StoreRequest),
    /// `request` (a `match`, `insert`, their hybrid forms or a
    /// `session_commit`: see [`Request::takes_namespace`]) in namespace
    /// `ns` ([`crate::engine::Engine::namespace`], registered on first
    /// use). Answers what `request` answers.
    Namespaced {
        ns: String,
        request: Box<Request>,
    },
    /// The id of namespace `name` (registered now if new), for a reader's
    /// `peek` in it ([`Reply::Namespace`]).
    Namespace {
        name: String,
    },
    /// FULL's own walk of `tokens` ([`Engine::peek`]: no lock, no LRU
    /// touch, before SWA or MAMBA cut it back), answered `Matched` without
    /// a handle. What a lock-free `peek` reads, as a request: a rank of a
    /// group reads the tree as its step finds it, not as a rank ahead of
    /// it has left it.
    Walk {
        tokens: Vec<u32>,
    },
    /// Makes this client a rank of a group ([`crate::group`]): the ranks
    /// of one tensor-parallel server share one tree, each step carried out
    /// once. Answers [`Reply::Joined`]. A daemon's business, as `Bind`.
    Join(Join),
    /// `alloc` of `n` pages answering also the SWA page paired with each
    /// ([`Reply::PagesPaired`]): what `alloc` and then `swa_pages` of its
    /// pages answer, in one request (a hybrid scheduler maps the fresh
    /// pages' SWA peers before it writes them).
    AllocPaired {
        n: u64,
    },
    /// `lock` of `handle` answering also the protected tokens it took and
    /// the SWA page paired with each of `pages` ([`Reply::LockedPaired`]):
    /// what `stats`, `lock`, `stats` and `swa_pages` answer in a row (SGLang's
    /// `inc_lock_ref`, and the window's pairing the request reads next).
    /// `pages` are checked before the lock: a bad one changes nothing.
    LockPaired {
        handle: u64,
        pages: Vec<u32>,
    },
    /// `InsertWith` answering also the key's pages as the tree holds them
    /// after (what a `Walk` of `tokens` answers) and the SWA page paired
    /// with each of the last `tail` of them ([`Reply::InsertedPaired`]): a
    /// checkpoint's insert, the node it locked and the window's pairing
    /// (which SWA tombstone recovery may have moved), in one request.
    InsertPaired {
        tokens: Vec<u32>,
        pages: Vec<u32>,
        lock: bool,
        mamba_state: Option<u32>,
        swa_evicted: u64,
        tail: u32,
    },
    /// `n` MAMBA state slots for the caller, all or none
    /// ([`Reply::States`]): what `n` `alloc_state`s hand out.
    AllocStates {
        n: u64,
    },
    /// Gives back state slots the caller owns, all or none ([`Reply::Done`]).
    FreeStates {
        states: Vec<u32>,
    },
    /// Evicts the least recently used unlocked leaf whole
    /// ([`Engine::evict_leaf`]): one step of SGLang's eviction walk, which
    /// checks its stop rule between leaves. Answers
    /// [`Reply::EvictedLeaf`].
    EvictLeaf,
    /// `request` (one that [takes a count](Request::takes_count)) and the
    /// pools' free counts after it ([`Reply::Counted`]): a scheduler that
    /// keeps them from the answers that change them need not ask `stats`
    /// before each allocation.
    Counted(Box<Request>),
    /// `request` (an `insert` or its anchored form: see
    /// [`Request::takes_hints`]) with what the eviction policy reads of it
    /// ([`InsertHints`]: SGLang's `InsertParams.priority` and
    /// `inserted_len`; [`Engine::insert_hinted`]). Answers what `request`
    /// answers. Inside a `Namespaced`, outside nothing but `Counted`.
    Hinted {
        hints: InsertHints,
        request: Box<Request>,
    },
}

/// The answer to a successful request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `alloc`: the pages now owned by the caller.
    Pages(Vec<u32>),
    /// `free`, `lock` (without SWA), `unlock`, `session_release`, `reset`.
    Done,
    /// `lock` with SWA: the handle naming this lock, for `unlock` (see
    /// [`crate::engine::Handle`]).
    Locked(u64),
    /// `insert` and `session_commit` (which never returns a handle):
    /// `handle` names the lock when `locked`, else the node covering the
    /// key (no lock taken; `None` for a key of no whole page).
    Inserted {
        cached: u64,
        len: u64,
        handle: Option<u64>,
        locked: bool,
    },
    /// `match`: the handle covers the matched tokens (`None`: nothing
    /// matched), locked when the request asked. No pages for `MatchAt`.
    Matched {
        len: u64,
        pages: Vec<u32>,
        handle: Option<u64>,
    },
    /// `evict`: tokens evicted.
    Evicted(u64),
    /// `session_status`.
    Session { resident_tokens: u64, idle_ms: u64 },
    /// `stats`.
    Stats { stats: Stats, sessions: u64 },
    /// `MatchWith`: `Matched` and how far FULL alone matched
    /// (`full_len`, SGLang's `full_kv_hit_length`) and the state slot the
    /// match ends at (MAMBA on).
    MatchedWith {
        len: u64,
        pages: Vec<u32>,
        handle: Option<u64>,
        full_len: u64,
        mamba_state: Option<u32>,
    },
    /// `InsertWith`: `Inserted` (without a lock, `handle` names the key's
    /// node) and whether the key's node held a state already, so the one
    /// given went back to the pool.
    InsertedWith {
        cached: u64,
        len: u64,
        handle: Option<u64>,
        locked: bool,
        mamba_exist: bool,
    },
    /// `EvictComponents`: what went, per component.
    EvictedComponents {
        tokens: u64,
        swa_tokens: u64,
        mamba_states: u64,
    },
    /// `alloc_state`: the slot now owned by the caller.
    State { state: u32 },
    /// `free_swa`: SWA pages freed.
    SwaFreed { n: u64 },
    /// `swa_pages`: one SWA page per page asked, `u32::MAX` for none.
    SwaPages(Vec<u32>),
    /// `StatsWith`: `Stats` and the secondary components' figures (`None`
    /// when only FULL is on).
    StatsWith {
        stats: Stats,
        sessions: u64,
        components: Option<ComponentStats>,
    },
    /// `Bind`: clients now holding the pool's binding.
    Bound { holders: u64 },
    /// The answer to a [`Request::Store`].
    Store(StoreReply),
    /// `Namespace`: the namespace's id.
    Namespace { id: u32 },
    /// `Join`: ranks of the group that have joined so far, its size, and
    /// the group's board in the segment (see `crate::group`), if it has
    /// one.
    Joined {
        joined: u32,
        size: u32,
        board: Option<u32>,
    },
    /// `AllocPaired`: the pages now owned by the caller and the SWA page
    /// paired with each (none without SWA).
    PagesPaired {
        pages: Vec<u32>,
        swa_pages: Vec<u32>,
    },
    /// `LockPaired`: the handle naming the lock (with SWA this lock's own,
    /// for `unlock`; else the node's), protected tokens before minus after
    /// (SGLang's `inc_lock_ref` delta, minus what the lock newly
    /// protects), and one SWA page per page asked, `u32::MAX` for none.
    LockedPaired {
        lock: u64,
        delta: i64,
        swa_pages: Vec<u32>,
    },
    /// `InsertPaired`: `InsertedWith`, the key's pages as the tree holds
    /// them, and the SWA page paired with each of the last `tail` of them
    /// (`u32::MAX` for none). `handle` is the lock's when `locked`, else
    /// the key's node's (as [`Reply::Inserted`]'s).
    InsertedPaired {
        cached: u64,
        len: u64,
        handle: Option<u64>,
        locked: bool,
        mamba_exist: bool,
        pages: Vec<u32>,
        swa_pages: Vec<u32>,
    },
    /// `AllocStates`: the slots now owned by the caller.
    States(Vec<u32>),
    /// `EvictLeaf`: the leaf's handle as it was (stale now) and the tokens
    /// freed; `None` and 0 when no leaf was evictable.
    EvictedLeaf { handle: Option<u64>, tokens: u64 },
    /// `Counted`: the request's answer and the pools' free counts after it.
    Counted { reply: Box<Reply>, free: FreeCounts },
}

/// Longest session id, in bytes.
pub const MAX_SESSION_ID: usize = 256;

/// The one rule for session ids, wherever a request comes from: 1 to
/// [`MAX_SESSION_ID`] bytes of UTF-8.
pub fn check_session_id(id: &[u8]) -> Result<&str, Rejection> {
    check_session_len(id.len())?;
    std::str::from_utf8(id)
        .map_err(|_| Rejection::new(ErrorKind::Malformed, "session id is not UTF-8"))
}

/// The length part of [`check_session_id`], for a reader that checks it
/// before copying the id.
pub fn check_session_len(len: usize) -> Result<(), Rejection> {
    if (1..=MAX_SESSION_ID).contains(&len) {
        Ok(())
    } else {
        Err(Rejection::new(
            ErrorKind::Malformed,
            format!("session id must be 1..={MAX_SESSION_ID} bytes, not {len}"),
        ))
    }
}

impl Reply {
    /// The name of this kind of answer.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Pages(_) => "pages",
            Self::Done => "done",
            Self::Locked(_) => "locked",
            Self::Inserted { .. } => "inserted",
            Self::Matched { .. } => "matched",
            Self::Evicted(_) => "evicted",
            Self::Session { .. } => "session",
            Self::Stats { .. } => "stats",
            Self::MatchedWith { .. } => "matched_with",
            Self::InsertedWith { .. } => "inserted_with",
            Self::EvictedComponents { .. } => "evicted_components",
            Self::State { .. } => "state",
            Self::SwaFreed { .. } => "swa_freed",
            Self::SwaPages(_) => "swa_pages",
            Self::StatsWith { .. } => "stats_with",
            Self::Bound { .. } => "bound",
            Self::Store(_) => "store",
            Self::Namespace { .. } => "namespace",
            Self::Joined { .. } => "joined",
            Self::PagesPaired { .. } => "pages_paired",
            Self::LockedPaired { .. } => "locked_paired",
            Self::InsertedPaired { .. } => "inserted_paired",
            Self::States(_) => "states",
            Self::EvictedLeaf { .. } => "evicted_leaf",
            Self::Counted { .. } => "counted",
        }
    }
}

impl Request {
    /// The op's name, as `radixd exec` spells it (the internal ops by
    /// their own names).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Alloc { .. } => "alloc",
            Self::Free { .. } => "free",
            Self::Insert { .. } | Self::InsertWith { .. } => "insert",
            Self::Match { .. } | Self::MatchWith { .. } => "match",
            Self::Lock { .. } => "lock",
            Self::Unlock { .. } => "unlock",
            Self::Evict { .. } | Self::EvictComponents { .. } => "evict",
            Self::SessionCommit { .. } => "session_commit",
            Self::SessionRelease { .. } => "session_release",
            Self::SessionStatus { .. } => "session_status",
            Self::Stats | Self::StatsWith => "stats",
            Self::Reset => "reset",
            Self::Validate => "validate",
            Self::MatchAt { .. } => "match_at",
            Self::InsertAt { .. } => "insert_at",
            Self::AllocState => "alloc_state",
            Self::FreeState { .. } => "free_state",
            Self::FreeSwa { .. } => "free_swa",
            Self::SwaPages { .. } => "swa_pages",
            Self::Bind { .. } => "bind",
            Self::Store(_) => "store",
            Self::Namespaced { request, .. } => request.name(),
            Self::Namespace { .. } => "namespace",
            Self::Join(_) => "join",
            Self::Walk { .. } => "walk",
            Self::AllocPaired { .. } => "alloc_paired",
            Self::LockPaired { .. } => "lock_paired",
            Self::InsertPaired { .. } => "insert_paired",
            Self::AllocStates { .. } => "alloc_states",
            Self::FreeStates { .. } => "free_states",
            Self::EvictLeaf => "evict_leaf",
            Self::Counted(request) | Self::Hinted { request, .. } => request.name(),
        }
    }

    /// The session a request names, if any.
    pub fn session(&self) -> Option<&str> {
        match self {
            Self::SessionCommit { session, .. }
            | Self::SessionRelease { session }
            | Self::SessionStatus { session } => Some(session),
            Self::Namespaced { request, .. }
            | Self::Counted(request)
            | Self::Hinted { request, .. } => request.session(),
            _ => None,
        }
    }

    /// Whether the request walks from the root and so can be in a
    /// namespace (`Namespaced` wraps only these).
    pub fn takes_namespace(&self) -> bool {
        match self {
            Self::Hinted { request, .. } => request.takes_namespace(),
            _ => matches!(
                self,
                Self::Match { .. }
                    | Self::Insert { .. }
                    | Self::MatchWith { .. }
                    | Self::InsertWith { .. }
                    | Self::InsertPaired { .. }
                    | Self::SessionCommit { .. }
                    | Self::Walk { .. }
            ),
        }
    }

    /// Whether the request can be [`Request::Hinted`]: an `insert`, its
    /// anchored form, or a hybrid engine's (`insert_with`,
    /// `insert_paired`).
    pub fn takes_hints(&self) -> bool {
        matches!(
            self,
            Self::Insert { .. }
                | Self::InsertAt { .. }
                | Self::InsertWith { .. }
                | Self::InsertPaired { .. }
        )
    }

    /// Whether the request can be [`Request::Counted`]: every one the
    /// engine carries out for a scheduler, except the anchored ones
    /// (internal to a reader), `reset` and `validate`, and what is not the
    /// engine's (`bind`, `join`, the store, namespace ids).
    pub fn takes_count(&self) -> bool {
        if let Self::Hinted { request, .. } = self {
            return request.takes_count();
        }
        !matches!(
            self,
            Self::Counted(_)
                | Self::MatchAt { .. }
                | Self::InsertAt { .. }
                | Self::Reset
                | Self::Validate
                | Self::Bind { .. }
                | Self::Join(_)
                | Self::Store(_)
                | Self::Namespace { .. }
        )
    }
}

/// Something that carries out requests: an in-process engine or a daemon.
pub trait Backend {
    /// Carries out one request.
    fn call(&mut self, request: Request) -> Result<Reply, Rejection>;

    /// The components the cache keeps beside FULL (what `exec` asks for
    /// and prints depends on them).
    fn components(&self) -> Components {
        Components::full()
    }

    /// The store beside the cache, if any (`exec`'s store ops).
    fn store(&mut self) -> Option<&mut dyn StoreAccess> {
        None
    }

    /// Tokens per page (`None`: not known to this backend).
    fn page_size(&self) -> Option<u32> {
        None
    }
}

/// An in-process engine serving one client.
pub struct Local<R: Region> {
    pub engine: Engine<R>,
    pub client: ClientId,
    /// Sessions idle for longer are released before each request.
    pub session_ttl: Option<Duration>,
}

impl<R: Region> Backend for Local<R> {
    fn call(&mut self, request: Request) -> Result<Reply, Rejection> {
        if let Some(ttl) = self.session_ttl {
            self.engine.expire_sessions(ttl, Instant::now());
        }
        apply(&mut self.engine, self.client, request)
    }

    fn components(&self) -> Components {
        self.engine.components()
    }

    fn page_size(&self) -> Option<u32> {
        Some(self.engine.page_size())
    }
}
