//! The operations a client asks of a cache, their answers and their errors,
//! independent of how they travel (JSON lines, shared-memory rings).

use std::fmt;
use std::time::{Duration, Instant};

mod store;

pub use store::{
    apply_store, check_key, KeyList, StoreAccess, StoreReply, StoreRequest, WithStore, NO_PARENT,
};

use crate::engine::{
    Anchor, AnchorError, ClientId, ComponentError, ComponentStats, Components, Engine, HandleError,
    InsertExtra, Inserted, InsertedExtra, NamespaceError, PageError, Region, SessionError, Stats,
};
pub use crate::group::Join;

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
    /// `insert` and `session_commit` (which never returns a handle).
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
    /// `InsertWith`: `Inserted` and whether the key's node held a state
    /// already, so the one given went back to the pool.
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
        }
    }

    /// The session a request names, if any.
    pub fn session(&self) -> Option<&str> {
        match self {
            Self::SessionCommit { session, .. }
            | Self::SessionRelease { session }
            | Self::SessionStatus { session } => Some(session),
            Self::Namespaced { request, .. } => request.session(),
            _ => None,
        }
    }

    /// Whether the request walks from the root and so can be in a
    /// namespace (`Namespaced` wraps only these).
    pub fn takes_namespace(&self) -> bool {
        matches!(
            self,
            Self::Match { .. }
                | Self::Insert { .. }
                | Self::MatchWith { .. }
                | Self::InsertWith { .. }
                | Self::SessionCommit { .. }
                | Self::Walk { .. }
        )
    }
}

/// What kind of failure a rejected request met; its wire name is what
/// `radixd exec` prints as `"error"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorKind {
    UnknownOp = 1,
    Malformed = 2,
    PageOutOfRange = 3,
    PageNotOwned = 4,
    PageCountMismatch = 5,
    InsufficientPages = 6,
    UnknownHandle = 7,
    StaleHandle = 8,
    NotLocked = 9,
    UnknownSession = 10,
    SessionNotOwned = 11,
    TooLarge = 12,
    /// Client side: the daemon died.
    DaemonGone = 13,
    /// Client side: the daemon did not answer in time.
    Timeout = 14,
    /// Client side: the daemon broke the protocol.
    Protocol = 15,
    /// `validate` found a broken invariant.
    Invariant = 16,
    /// The daemon does not allow this operation (`reset` without
    /// `--allow-reset`).
    NotPermitted = 17,
    /// Internal: the tree moved under the anchor of a `MatchAt` or
    /// `InsertAt` (nothing changed). The client then sends the full
    /// request, so neither `exec` nor a library caller ever sees it.
    Moved = 18,
    /// The request names a component the engine was not started with.
    ComponentOff = 19,
    /// A state slot the client does not own.
    StateNotOwned = 20,
    /// SWA pages that contradict the request's window (`swa_evicted`).
    SwaMismatch = 21,
    /// Every state slot is held by a client or a locked node.
    InsufficientStates = 22,
    /// `Bind` from a client of another KV buffer than the one the daemon's
    /// pool is bound to.
    PoolMismatch = 23,
    /// The daemon runs without `--store`.
    NoStore = 40,
    /// A value of another size than its namespace's.
    SizeMismatch = 41,
    /// No room in the store: everything is reserved or still read.
    StoreFull = 42,
    /// A store key that is empty or too long.
    BadKey = 43,
    /// A commit or abort of a slot the client did not reserve.
    NotReserved = 44,
    /// A store namespace id nobody registered.
    UnknownNamespace = 45,
    /// A namespace name that is empty or too long (or one too many).
    BadNamespace = 24,
    /// A rank of a group sent another operation than the rank that led
    /// the same step (a desynchronised scheduler): it is out of step.
    Desync = 25,
    /// A `join` that disagrees with its group (size, page size) or comes
    /// from a connection that cannot be a rank.
    GroupMismatch = 26,
    /// A `join` of a finished group, or of a rank taken or gone.
    GroupClosed = 27,
    /// A rank ran too far ahead of its group's slowest rank and waited for
    /// it in vain.
    GroupLag = 28,
}

impl ErrorKind {
    /// Every kind, for decoding.
    pub const ALL: [ErrorKind; 34] = [
        Self::UnknownOp,
        Self::Malformed,
        Self::PageOutOfRange,
        Self::PageNotOwned,
        Self::PageCountMismatch,
        Self::InsufficientPages,
        Self::UnknownHandle,
        Self::StaleHandle,
        Self::NotLocked,
        Self::UnknownSession,
        Self::SessionNotOwned,
        Self::TooLarge,
        Self::DaemonGone,
        Self::Timeout,
        Self::Protocol,
        Self::Invariant,
        Self::NotPermitted,
        Self::Moved,
        Self::ComponentOff,
        Self::StateNotOwned,
        Self::SwaMismatch,
        Self::InsufficientStates,
        Self::PoolMismatch,
        Self::NoStore,
        Self::SizeMismatch,
        Self::StoreFull,
        Self::BadKey,
        Self::NotReserved,
        Self::UnknownNamespace,
        Self::BadNamespace,
        Self::Desync,
        Self::GroupMismatch,
        Self::GroupClosed,
        Self::GroupLag,
    ];

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            Self::UnknownOp => "unknown_op",
            Self::Malformed => "malformed",
            Self::PageOutOfRange => "page_out_of_range",
            Self::PageNotOwned => "page_not_owned",
            Self::PageCountMismatch => "page_count_mismatch",
            Self::InsufficientPages => "insufficient_pages",
            Self::UnknownHandle => "unknown_handle",
            Self::StaleHandle => "stale_handle",
            Self::NotLocked => "not_locked",
            Self::UnknownSession => "unknown_session",
            Self::SessionNotOwned => "session_not_owned",
            Self::TooLarge => "too_large",
            Self::DaemonGone => "daemon_gone",
            Self::Timeout => "timeout",
            Self::Protocol => "protocol",
            Self::Invariant => "invariant",
            Self::NotPermitted => "not_permitted",
            Self::Moved => "moved",
            Self::ComponentOff => "component_off",
            Self::StateNotOwned => "state_not_owned",
            Self::SwaMismatch => "swa_mismatch",
            Self::InsufficientStates => "insufficient_states",
            Self::PoolMismatch => "pool_mismatch",
            Self::NoStore => "no_store",
            Self::SizeMismatch => "size_mismatch",
            Self::StoreFull => "store_full",
            Self::BadKey => "bad_key",
            Self::NotReserved => "not_reserved",
            Self::UnknownNamespace => "unknown_namespace",
            Self::BadNamespace => "bad_namespace",
            Self::Desync => "desync",
            Self::GroupMismatch => "group_mismatch",
            Self::GroupClosed => "group_closed",
            Self::GroupLag => "group_lag",
        }
    }

    /// The kind with wire code `code`.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u32 == code)
    }
}

/// A rejected request: nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub kind: ErrorKind,
    pub message: String,
}

impl Rejection {
    /// A rejection of `kind` explained by `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl std::error::Error for Rejection {}

impl From<PageError> for Rejection {
    fn from(e: PageError) -> Self {
        let kind = match e {
            PageError::OutOfRange { .. } => ErrorKind::PageOutOfRange,
            PageError::NotOwned { .. } => ErrorKind::PageNotOwned,
            PageError::CountMismatch { .. } => ErrorKind::PageCountMismatch,
            // Its own message, the same kind: a client retries either.
            PageError::Insufficient { .. }
            | PageError::HeldByReaders { .. }
            | PageError::SwaInsufficient { .. } => ErrorKind::InsufficientPages,
            PageError::SwaEvicted { .. } | PageError::SwaPairing { .. } => ErrorKind::SwaMismatch,
            PageError::Component(c) => return c.into(),
        };
        Self::new(kind, e.to_string())
    }
}

impl From<ComponentError> for Rejection {
    fn from(e: ComponentError) -> Self {
        let kind = match e {
            ComponentError::NotEnabled(_) => ErrorKind::ComponentOff,
            ComponentError::StateNotOwned { .. } => ErrorKind::StateNotOwned,
            ComponentError::NoFreeState => ErrorKind::InsufficientStates,
        };
        Self::new(kind, e.to_string())
    }
}

impl From<HandleError> for Rejection {
    fn from(e: HandleError) -> Self {
        let kind = match e {
            HandleError::Unknown(_) => ErrorKind::UnknownHandle,
            HandleError::Stale(_) => ErrorKind::StaleHandle,
            HandleError::NotLocked(_) => ErrorKind::NotLocked,
        };
        Self::new(kind, e.to_string())
    }
}

impl From<AnchorError> for Rejection {
    fn from(e: AnchorError) -> Self {
        match e {
            AnchorError::Moved => Self::new(ErrorKind::Moved, e.to_string()),
            AnchorError::Invalid(_) => Self::new(ErrorKind::Malformed, e.to_string()),
            AnchorError::Page(p) => p.into(),
        }
    }
}

impl From<NamespaceError> for Rejection {
    fn from(e: NamespaceError) -> Self {
        Self::new(ErrorKind::BadNamespace, e.to_string())
    }
}

impl From<SessionError> for Rejection {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Unknown(_) => Self::new(ErrorKind::UnknownSession, e.to_string()),
            SessionError::NotOwned(_) => Self::new(ErrorKind::SessionNotOwned, e.to_string()),
            SessionError::Page(p) => p.into(),
        }
    }
}

/// Buffers a server hands from one request to the next: the token and
/// page lists of decoded requests and of answers come from here and go
/// back after each answer, so a warm server serves without allocating.
#[derive(Debug, Default)]
pub struct Spare {
    lists: Vec<Vec<u32>>,
}

impl Spare {
    /// Lists kept at most (a request holds two, its answer one).
    const KEEP: usize = 8;
    /// Longest list kept, in words: a rare huge request does not pin its
    /// memory for the daemon's lifetime.
    const KEEP_WORDS: usize = 1 << 16;

    /// An empty list, with room if one was given back.
    pub fn list(&mut self) -> Vec<u32> {
        self.lists.pop().unwrap_or_default()
    }

    /// Gives `list` back for a later [`Spare::list`].
    pub fn keep(&mut self, mut list: Vec<u32>) {
        if self.lists.len() < Self::KEEP && (1..=Self::KEEP_WORDS).contains(&list.capacity()) {
            list.clear();
            self.lists.push(list);
        }
    }

    /// Gives back the lists of an answer once it has been sent.
    pub fn keep_reply(&mut self, reply: Result<Reply, Rejection>) {
        if let Ok(
            Reply::Pages(pages) | Reply::Matched { pages, .. } | Reply::MatchedWith { pages, .. },
        ) = reply
        {
            self.keep(pages);
        }
    }
}

/// Carries out `request` for `client` on `engine`.
pub fn apply<R: Region>(
    engine: &mut Engine<R>,
    client: ClientId,
    request: Request,
) -> Result<Reply, Rejection> {
    apply_with(engine, client, request, &mut Spare::default())
}

/// [`apply`], taking the answer's lists from `spare` and giving the
/// request's back to it.
pub fn apply_with<R: Region>(
    engine: &mut Engine<R>,
    client: ClientId,
    request: Request,
    spare: &mut Spare,
) -> Result<Reply, Rejection> {
    if let Some(session) = request.session() {
        check_session_id(session.as_bytes())?;
    }
    Ok(match request {
        // An engine alone has no store: the daemon routes store requests
        // to its own (`apply_store`) before they reach here.
        Request::Store(_) => return Err(crate::store::StoreError::NoStore.into()),
        Request::Alloc { n } => {
            let mut pages = spare.list();
            engine.alloc_into(client, n, &mut pages)?;
            Reply::Pages(pages)
        }
        Request::Free { pages } => {
            let freed = engine.free(client, &pages);
            spare.keep(pages);
            freed?;
            Reply::Done
        }
        Request::Insert {
            tokens,
            pages,
            lock,
        } => {
            let r = engine.insert(client, &tokens, &pages, lock);
            spare.keep(tokens);
            spare.keep(pages);
            inserted(r?, lock)
        }
        Request::Match { tokens, lock } => {
            let mut pages = spare.list();
            let r = engine.match_prefix(client, &tokens, lock, &mut pages);
            spare.keep(tokens);
            Reply::Matched {
                len: r.len as u64,
                pages,
                handle: r.handle.map(|h| h.to_raw()),
            }
        }
        Request::Lock { handle } => {
            let lock = engine.lock(client, handle)?;
            if lock.is_lock() {
                Reply::Locked(lock.to_raw())
            } else {
                Reply::Done
            }
        }
        Request::Unlock { handle } => {
            engine.unlock(client, handle)?;
            Reply::Done
        }
        Request::Evict { tokens } => Reply::Evicted(engine.evict(tokens)),
        Request::SessionCommit {
            session,
            tokens,
            pages,
        } => {
            let r = engine.session_commit(client, &session, &tokens, &pages)?;
            // A session's lock is its own, never handed to the caller.
            inserted(Inserted { handle: None, ..r }, false)
        }
        Request::SessionRelease { session } => {
            engine.session_release(client, &session)?;
            Reply::Done
        }
        Request::SessionStatus { session } => {
            let s = engine.session_status(&session)?;
            Reply::Session {
                resident_tokens: s.resident_tokens,
                idle_ms: s.idle_ms,
            }
        }
        Request::Stats => Reply::Stats {
            stats: engine.stats(),
            sessions: engine.sessions() as u64,
        },
        Request::Reset => {
            engine.reset();
            Reply::Done
        }
        Request::Validate => {
            engine
                .validate()
                .map_err(|e| Rejection::new(ErrorKind::Invariant, e.to_string()))?;
            Reply::Done
        }
        Request::MatchAt {
            anchor,
            matched_pages,
            next_hash,
            lock,
        } => {
            let m = matched_pages as usize;
            let r = engine.match_at(client, &anchor, m, next_hash, lock, None)?;
            Reply::Matched {
                len: r.len as u64,
                pages: Vec::new(),
                handle: r.handle.map(|h| h.to_raw()),
            }
        }
        Request::InsertAt {
            anchor,
            matched_pages,
            tokens,
            pages,
            lock,
        } => {
            let m = matched_pages as usize;
            let r = engine.insert_at(client, &anchor, m, &tokens, &pages, lock);
            spare.keep(tokens);
            spare.keep(pages);
            inserted(r?, lock)
        }
        Request::MatchWith { tokens, lock } => {
            let mut pages = spare.list();
            let (r, extra) = engine.match_with(client, &tokens, lock, &mut pages);
            spare.keep(tokens);
            Reply::MatchedWith {
                len: r.len as u64,
                pages,
                handle: r.handle.map(|h| h.to_raw()),
                full_len: extra.full_len as u64,
                mamba_state: extra.mamba_state,
            }
        }
        Request::InsertWith {
            tokens,
            pages,
            lock,
            mamba_state,
            swa_evicted,
        } => {
            let extra = InsertExtra {
                mamba_state,
                swa_evicted,
            };
            let r = engine.insert_with(client, &tokens, &pages, lock, extra);
            spare.keep(tokens);
            spare.keep(pages);
            let (r, ie) = r?;
            inserted_with(r, lock, ie)
        }
        Request::EvictComponents {
            tokens,
            swa_tokens,
            mamba_states,
        } => {
            let e = engine.evict_components(tokens, swa_tokens, mamba_states)?;
            Reply::EvictedComponents {
                tokens: e.tokens,
                swa_tokens: e.swa_tokens,
                mamba_states: e.mamba_states,
            }
        }
        Request::AllocState => Reply::State {
            state: engine.alloc_state(client)?,
        },
        Request::FreeState { state } => {
            engine.free_state(client, state)?;
            Reply::Done
        }
        Request::FreeSwa { pages } => {
            let freed = engine.free_swa(client, &pages);
            spare.keep(pages);
            Reply::SwaFreed { n: freed? }
        }
        Request::SwaPages { pages } => {
            let paired = engine.swa_pages(&pages);
            spare.keep(pages);
            Reply::SwaPages(paired?)
        }
        Request::StatsWith => Reply::StatsWith {
            stats: engine.stats(),
            sessions: engine.sessions() as u64,
            components: engine.component_stats(),
        },
        Request::Bind { .. } => return Err(Rejection::new(
            ErrorKind::NotPermitted,
            "pool bindings are a daemon's: an in-process engine has one client, whose buffer it is",
        )),
        Request::Namespaced { ns, request } => {
            if !request.takes_namespace() {
                return Err(Rejection::new(
                    ErrorKind::Malformed,
                    "only match, insert and session_commit take a namespace",
                ));
            }
            let id = engine.namespace(&ns)?;
            engine.with_namespace(id, |e| apply_with(e, client, *request, spare))?
        }
        Request::Namespace { name } => Reply::Namespace {
            id: engine.namespace(&name)?,
        },
        Request::Walk { tokens } => {
            let mut pages = spare.list();
            let len = engine.peek(&tokens, &mut pages);
            spare.keep(tokens);
            Reply::Matched {
                len: len as u64,
                pages,
                handle: None,
            }
        }
        Request::Join(_) => {
            return Err(Rejection::new(
                ErrorKind::NotPermitted,
                "groups are a daemon's: an in-process engine has one client, which is every rank",
            ))
        }
    })
}

/// The answer to an `InsertWith` that did `r` and `extra`.
fn inserted_with(r: Inserted, locked: bool, extra: InsertedExtra) -> Reply {
    Reply::InsertedWith {
        cached: r.cached as u64,
        len: r.len as u64,
        handle: r.handle.map(|h| h.to_raw()),
        locked,
        mamba_exist: extra.mamba_exist,
    }
}

/// The answer to an insert that did `r` (and locked when `locked`).
fn inserted(r: Inserted, locked: bool) -> Reply {
    Reply::Inserted {
        cached: r.cached as u64,
        len: r.len as u64,
        handle: r.handle.map(|h| h.to_raw()),
        locked,
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
