//! The client's side of a request: a [`Call`] (a request borrowed from the
//! caller's slices) encoded into an [`EncodedRequest`], the record and the
//! payload pieces to copy into a scratch window, with the reply room its
//! answer needs.

use super::payload::{AnchorWords, EncodedRequest};
use super::record::{opcode, WireRequest, FLAG_HINTS, FLAG_LOCK, FLAG_NS, FREE_BYTES};
use super::record::{STATS_BYTES, STATS_WITH_BYTES};
use super::{store, MAX_ERROR_MESSAGE, MIN_REPLY_WINDOW};
use crate::engine::{Anchor, Handle, InsertHints};
use crate::group::Join;
use crate::op::{Request, StoreRequest};

/// Bytes the successful answer to `request` needs in its reply window, on
/// an engine of `page_size` and `capacity`.
pub fn reply_need(request: &Request, page_size: u32, capacity: u32) -> usize {
    Call::of(request).reply_need(page_size, capacity)
}

/// The two words of `x`, low first.
fn split64(x: u64) -> [u32; 2] {
    [x as u32, (x >> 32) as u32]
}

/// A request as a client sends it: borrowed from the caller's slices, so
/// posting one copies its tokens only once, into the scratch window.
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    Alloc(u64),
    Free(&'a [u32]),
    Insert(&'a [u32], &'a [u32], bool),
    Match(&'a [u32], bool),
    Lock(u64),
    Unlock(u64),
    Evict(u64),
    SessionCommit(&'a str, &'a [u32], &'a [u32]),
    SessionRelease(&'a str),
    SessionStatus(&'a str),
    Stats,
    Reset,
    Validate,
    /// See [`Request::MatchAt`].
    MatchAt {
        anchor: Anchor,
        matched_pages: u32,
        next_hash: Option<u32>,
        lock: bool,
    },
    /// See [`Request::InsertAt`].
    InsertAt {
        anchor: Anchor,
        matched_pages: u32,
        tokens: &'a [u32],
        pages: &'a [u32],
        lock: bool,
    },
    MatchWith(&'a [u32], bool),
    /// See [`Request::InsertWith`].
    InsertWith {
        tokens: &'a [u32],
        pages: &'a [u32],
        lock: bool,
        mamba_state: Option<u32>,
        swa_evicted: u64,
    },
    EvictComponents {
        tokens: u64,
        swa_tokens: u64,
        mamba_states: u64,
    },
    AllocState,
    FreeState(u64),
    FreeSwa(&'a [u32]),
    StatsWith,
    SwaPages(&'a [u32]),
    /// See [`Request::Bind`]: the identity travels where a session id
    /// does.
    Bind(&'a str),
    Store(&'a StoreRequest),
    /// See [`Request::Namespaced`]: the namespace's name and the request.
    Namespaced(&'a str, &'a Request),
    /// See [`Request::Namespace`].
    Namespace(&'a str),
    /// See [`Request::Join`]: the key travels where a session id does,
    /// after the page size's word.
    Join(&'a Join),
    /// See [`Request::Walk`].
    Walk(&'a [u32]),
    /// See [`Request::AllocPaired`].
    AllocPaired(u64),
    /// See [`Request::LockPaired`]: the handle and the pages to pair.
    LockPaired(u64, &'a [u32]),
    /// See [`Request::InsertPaired`].
    InsertPaired {
        tokens: &'a [u32],
        pages: &'a [u32],
        lock: bool,
        mamba_state: Option<u32>,
        swa_evicted: u64,
        tail: u32,
    },
    /// See [`Request::AllocStates`].
    AllocStates(u64),
    /// See [`Request::FreeStates`]: the slots travel as pages.
    FreeStates(&'a [u32]),
    /// See [`Request::EvictLeaf`].
    EvictLeaf,
    /// See [`Request::Counted`]: the request's own encoding, flagged.
    Counted(&'a Request),
    /// See [`Request::Hinted`]: the insert's own encoding, flagged, the
    /// hints after its payload.
    Hinted(InsertHints, &'a Request),
}

impl<'a> Call<'a> {
    /// The borrowed form of `request`.
    pub fn of(request: &'a Request) -> Self {
        match request {
            Request::Alloc { n } => Self::Alloc(*n),
            Request::Free { pages } => Self::Free(pages),
            Request::Insert {
                tokens,
                pages,
                lock,
            } => Self::Insert(tokens, pages, *lock),
            Request::Match { tokens, lock } => Self::Match(tokens, *lock),
            Request::Lock { handle } => Self::Lock(*handle),
            Request::Unlock { handle } => Self::Unlock(*handle),
            Request::Evict { tokens } => Self::Evict(*tokens),
            Request::SessionCommit {
                session,
                tokens,
                pages,
            } => Self::SessionCommit(session, tokens, pages),
            Request::SessionRelease { session } => Self::SessionRelease(session),
            Request::SessionStatus { session } => Self::SessionStatus(session),
            Request::Stats => Self::Stats,
            Request::Reset => Self::Reset,
            Request::Validate => Self::Validate,
            Request::MatchAt {
                anchor,
                matched_pages,
                next_hash,
                lock,
            } => Self::MatchAt {
                anchor: *anchor,
                matched_pages: *matched_pages,
                next_hash: *next_hash,
                lock: *lock,
            },
            Request::InsertAt {
                anchor,
                matched_pages,
                tokens,
                pages,
                lock,
            } => Self::InsertAt {
                anchor: *anchor,
                matched_pages: *matched_pages,
                tokens,
                pages,
                lock: *lock,
            },
            Request::MatchWith { tokens, lock } => Self::MatchWith(tokens, *lock),
            Request::InsertWith {
                tokens,
                pages,
                lock,
                mamba_state,
                swa_evicted,
            } => Self::InsertWith {
                tokens,
                pages,
                lock: *lock,
                mamba_state: *mamba_state,
                swa_evicted: *swa_evicted,
            },
            Request::EvictComponents {
                tokens,
                swa_tokens,
                mamba_states,
            } => Self::EvictComponents {
                tokens: *tokens,
                swa_tokens: *swa_tokens,
                mamba_states: *mamba_states,
            },
            Request::AllocState => Self::AllocState,
            Request::FreeState { state } => Self::FreeState(*state),
            Request::FreeSwa { pages } => Self::FreeSwa(pages),
            Request::StatsWith => Self::StatsWith,
            Request::SwaPages { pages } => Self::SwaPages(pages),
            Request::Bind { pool } => Self::Bind(pool),
            Request::Store(r) => Self::Store(r),
            Request::Namespaced { ns, request } => Self::Namespaced(ns, request),
            Request::Namespace { name } => Self::Namespace(name),
            Request::Join(join) => Self::Join(join),
            Request::Walk { tokens } => Self::Walk(tokens),
            Request::AllocPaired { n } => Self::AllocPaired(*n),
            Request::LockPaired { handle, pages } => Self::LockPaired(*handle, pages),
            Request::InsertPaired {
                tokens,
                pages,
                lock,
                mamba_state,
                swa_evicted,
                tail,
            } => Self::InsertPaired {
                tokens,
                pages,
                lock: *lock,
                mamba_state: *mamba_state,
                swa_evicted: *swa_evicted,
                tail: *tail,
            },
            Request::AllocStates { n } => Self::AllocStates(*n),
            Request::FreeStates { states } => Self::FreeStates(states),
            Request::EvictLeaf => Self::EvictLeaf,
            Request::Counted(request) => Self::Counted(request),
            Request::Hinted { hints, request } => Self::Hinted(*hints, request),
        }
    }

    /// Bytes the successful answer needs in its reply window, on an engine
    /// of `page_size` and `capacity`.
    pub fn reply_need(&self, page_size: u32, capacity: u32) -> usize {
        match self {
            Self::Alloc(n) => (*n).min(u64::from(capacity)) as usize * 4,
            Self::Match(tokens, _) | Self::Walk(tokens) => {
                tokens.len() / page_size.max(1) as usize * 4
            }
            // The pages and the state slot.
            Self::MatchWith(tokens, _) => (tokens.len() / page_size.max(1) as usize + 1) * 4,
            Self::Stats => STATS_BYTES,
            Self::StatsWith => STATS_WITH_BYTES,
            Self::SwaPages(pages) => pages.len() * 4,
            Self::Store(r) => store::reply_need(r),
            Self::Namespaced(_, request) | Self::Hinted(_, request) => {
                Call::of(request).reply_need(page_size, capacity)
            }
            // The pages and their SWA peers.
            Self::AllocPaired(n) => (*n).min(u64::from(capacity)) as usize * 8,
            Self::LockPaired(_, pages) => pages.len() * 4,
            // The pages' count, the key's pages, the tail's peers.
            Self::InsertPaired { tokens, tail, .. } => {
                let pages = tokens.len() / page_size.max(1) as usize;
                (1 + pages + pages.min(*tail as usize)) * 4
            }
            Self::AllocStates(n) => usize::try_from(*n).unwrap_or(usize::MAX).saturating_mul(4),
            Self::Counted(request) => {
                Call::of(request).reply_need(page_size, capacity) + FREE_BYTES
            }
            _ => 0,
        }
    }

    /// The record and payload pieces for an engine of `page_size` and
    /// `capacity` (the record's sequence number and windows are the
    /// sender's to fill in).
    pub fn encode(self, page_size: u32, capacity: u32) -> EncodedRequest<'a> {
        if let Self::Store(r) = self {
            return store::encode(r);
        }
        if let Self::Counted(request) = self {
            return Call::of(request).encode(page_size, capacity).counted();
        }
        if let Self::Hinted(hints, request) = self {
            // The insert's own encoding, the hints after its payload. What
            // takes none the daemon's decoder refuses, never misreads.
            let mut e = Call::of(request).encode(page_size, capacity);
            e.record.flags |= FLAG_HINTS;
            let words = [split64(hints.priority as u64), split64(hints.inserted_len)];
            e.bytes.reserve(super::record::HINTS_BYTES);
            for w in words.iter().flatten() {
                e.bytes.extend_from_slice(&w.to_ne_bytes());
            }
            e.record.payload_len = e.payload_len() as u32;
            return e;
        }
        if let Self::Namespaced(ns, request) = self {
            // The request's own encoding, the name after its payload. A
            // request that takes no namespace (nested ones included) is
            // refused by the daemon's decoder, never misread.
            let mut e = Call::of(request).encode(page_size, capacity);
            e.record.flags |= FLAG_NS;
            e.record.aux[0] = ns.len() as u32;
            e.ns = ns.as_bytes();
            e.record.payload_len = e.payload_len() as u32;
            return e;
        }
        let message_room = match self {
            Self::Bind(_) | Self::Join(_) => MAX_ERROR_MESSAGE,
            _ => MIN_REPLY_WINDOW,
        };
        let reply_need = self.reply_need(page_size, capacity).max(message_room);
        let lock = |lock: bool| if lock { FLAG_LOCK } else { 0 };
        let none: &[u32] = &[];
        // (op, arg, flags, tokens, pages, session)
        let (op, arg, flags, tokens, pages, session) = match self {
            Self::Alloc(n) => (opcode::ALLOC, n, 0, none, none, ""),
            Self::Free(pages) => (opcode::FREE, 0, 0, none, pages, ""),
            Self::Insert(tokens, pages, l) => (opcode::INSERT, 0, lock(l), tokens, pages, ""),
            Self::Match(tokens, l) => (opcode::MATCH, 0, lock(l), tokens, none, ""),
            Self::Lock(handle) => (opcode::LOCK, handle, 0, none, none, ""),
            Self::Unlock(handle) => (opcode::UNLOCK, handle, 0, none, none, ""),
            Self::Evict(tokens) => (opcode::EVICT, tokens, 0, none, none, ""),
            Self::SessionCommit(session, tokens, pages) => {
                (opcode::SESSION_COMMIT, 0, 0, tokens, pages, session)
            }
            Self::SessionRelease(session) => (opcode::SESSION_RELEASE, 0, 0, none, none, session),
            Self::SessionStatus(session) => (opcode::SESSION_STATUS, 0, 0, none, none, session),
            Self::Stats => (opcode::STATS, 0, 0, none, none, ""),
            Self::Reset => (opcode::RESET, 0, 0, none, none, ""),
            Self::Validate => (opcode::VALIDATE, 0, 0, none, none, ""),
            Self::MatchAt { lock: l, .. } => (opcode::MATCH_AT, 0, lock(l), none, none, ""),
            Self::InsertAt {
                tokens,
                pages,
                lock: l,
                ..
            } => (opcode::INSERT_AT, 0, lock(l), tokens, pages, ""),
            Self::MatchWith(tokens, l) => (opcode::MATCH_WITH, 0, lock(l), tokens, none, ""),
            Self::InsertWith {
                tokens,
                pages,
                lock: l,
                swa_evicted,
                ..
            } => (opcode::INSERT_WITH, swa_evicted, lock(l), tokens, pages, ""),
            Self::EvictComponents { tokens, .. } => {
                (opcode::EVICT_COMPONENTS, tokens, 0, none, none, "")
            }
            Self::AllocState => (opcode::ALLOC_STATE, 0, 0, none, none, ""),
            Self::FreeState(state) => (opcode::FREE_STATE, state, 0, none, none, ""),
            Self::FreeSwa(pages) => (opcode::FREE_SWA, 0, 0, none, pages, ""),
            Self::StatsWith => (opcode::STATS_WITH, 0, 0, none, none, ""),
            Self::SwaPages(pages) => (opcode::SWA_PAGES, 0, 0, none, pages, ""),
            Self::Bind(pool) => (opcode::BIND, 0, 0, none, none, pool),
            Self::Store(_) => (0, 0, 0, none, none, ""),
            Self::Namespace(name) => (opcode::NAMESPACE, 0, 0, none, none, name),
            Self::Walk(tokens) => (opcode::WALK, 0, 0, tokens, none, ""),
            Self::AllocPaired(n) => (opcode::ALLOC_PAIRED, n, 0, none, none, ""),
            Self::LockPaired(handle, pages) => (opcode::LOCK_PAIRED, handle, 0, none, pages, ""),
            Self::InsertPaired {
                tokens,
                pages,
                lock: l,
                swa_evicted,
                ..
            } => (
                opcode::INSERT_PAIRED,
                swa_evicted,
                lock(l),
                tokens,
                pages,
                "",
            ),
            Self::AllocStates(n) => (opcode::ALLOC_STATES, n, 0, none, none, ""),
            Self::FreeStates(states) => (opcode::FREE_STATES, 0, 0, none, states, ""),
            Self::EvictLeaf => (opcode::EVICT_LEAF, 0, 0, none, none, ""),
            Self::Join(j) => (
                opcode::JOIN,
                u64::from(j.rank) | u64::from(j.size) << 32,
                0,
                none,
                none,
                j.group.as_str(),
            ),
            // Handled above.
            Self::Namespaced(..) | Self::Counted(_) | Self::Hinted(..) => (0, 0, 0, none, none, ""),
        };
        let mut e = EncodedRequest {
            record: WireRequest {
                op,
                arg,
                flags,
                n_tokens: tokens.len() as u32,
                n_pages: pages.len() as u32,
                ..WireRequest::default()
            },
            reply_need,
            tokens,
            pages,
            anchor_words: AnchorWords::default(),
            session: session.as_bytes(),
            bytes: Vec::new(),
            ns: &[],
        };
        match self {
            Self::MatchAt {
                anchor,
                matched_pages,
                next_hash,
                ..
            } => {
                set_anchor(&mut e.record, &anchor);
                e.anchor_words = AnchorWords {
                    words: [matched_pages, next_hash.unwrap_or(0), 0, 0],
                    len: 1 + usize::from(next_hash.is_some()),
                };
            }
            Self::InsertAt {
                anchor,
                matched_pages,
                ..
            } => {
                set_anchor(&mut e.record, &anchor);
                e.anchor_words = AnchorWords {
                    words: [matched_pages, 0, 0, 0],
                    len: 1,
                };
            }
            Self::InsertWith {
                mamba_state: Some(state),
                ..
            } => {
                e.anchor_words = AnchorWords {
                    words: [state, 0, 0, 0],
                    len: 1,
                };
            }
            Self::InsertPaired {
                tail, mamba_state, ..
            } => {
                e.anchor_words = AnchorWords {
                    words: [tail, mamba_state.unwrap_or(0), 0, 0],
                    len: 1 + usize::from(mamba_state.is_some()),
                };
            }
            Self::Join(j) => {
                e.anchor_words = AnchorWords {
                    words: [j.page_size, 0, 0, 0],
                    len: 1,
                };
            }
            Self::EvictComponents {
                swa_tokens,
                mamba_states,
                ..
            } => {
                let ([s0, s1], [m0, m1]) = (split64(swa_tokens), split64(mamba_states));
                e.anchor_words = AnchorWords {
                    words: [s0, s1, m0, m1],
                    len: 4,
                };
            }
            _ => {}
        }
        e.record.payload_len = e.payload_len() as u32;
        e
    }
}

impl Call<'_> {
    /// Whether the call is a step of a group's rank (see
    /// [`crate::group::is_stepped`], which this mirrors).
    pub fn is_stepped(&self) -> bool {
        !matches!(
            self,
            Self::Join(_) | Self::Bind(_) | Self::Validate | Self::Namespace(_) | Self::Store(_)
        )
    }
}

/// Encodes `request` for an engine of `page_size` and `capacity`.
pub fn encode_request(request: &Request, page_size: u32, capacity: u32) -> EncodedRequest<'_> {
    Call::of(request).encode(page_size, capacity)
}

/// The anchor's node (as a handle), version and pages into the node.
fn set_anchor(r: &mut WireRequest, a: &Anchor) {
    let node = Handle {
        index: a.node,
        generation: a.generation,
    };
    r.arg = node.to_raw();
    r.aux = [a.version, a.pages_into_node];
}
