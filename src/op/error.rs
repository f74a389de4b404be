//! Why a request fails: the error kinds (with their wire names and codes),
//! the rejection that carries one with its message, and how each engine
//! error maps to a kind. Apart from the requests: a new failure changes
//! only this file (and the clients that name it).

use std::fmt;

use crate::engine::{
    AnchorError, ComponentError, HandleError, HostError, NamespaceError, PageError, SessionError,
};

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
    /// A host-tier request on a cache without a host tier.
    NoHostTier = 29,
    /// A host-tier request on a node in the wrong state for it: a backup of
    /// a node backed up already or below one that is not, a load-back of a
    /// node that holds device pages, a host lock's receipt not held.
    HostState = 30,
}

impl ErrorKind {
    /// Every kind, for decoding.
    pub const ALL: [ErrorKind; 36] = [
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
        Self::NoHostTier,
        Self::HostState,
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
            Self::NoHostTier => "no_host_tier",
            Self::HostState => "host_state",
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

impl From<HostError> for Rejection {
    fn from(e: HostError) -> Self {
        let kind = match e {
            HostError::NoHostTier => ErrorKind::NoHostTier,
            HostError::Handle(h) => return h.into(),
            HostError::Page(p) => return p.into(),
            HostError::CountMismatch { .. } | HostError::DigestCount { .. } => {
                ErrorKind::PageCountMismatch
            }
            HostError::OutOfRange { .. } => ErrorKind::PageOutOfRange,
            HostError::InUse { .. } => ErrorKind::PageNotOwned,
            HostError::AlreadyBacked(_)
            | HostError::ParentNotBacked(_)
            | HostError::NotHostOnly(_)
            | HostError::NotHostLocked(_) => ErrorKind::HostState,
        };
        Self::new(kind, e.to_string())
    }
}
