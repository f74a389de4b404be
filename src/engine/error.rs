//! Errors of the engine, one enum per operation family.
//!
//! Every operation that returns an error has changed nothing.

use std::fmt;

use super::hybrid::ComponentError;

/// Errors of the page operations: `alloc`, `free`, `insert`, `session_commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageError {
    /// A page id at or beyond the pool's capacity.
    OutOfRange { page: u64, capacity: u32 },
    /// A page the caller does not own: free, another client's, cached by the
    /// tree (except at its own position in an insert), or named twice.
    NotOwned { page: u32 },
    /// `insert` needs exactly one page per whole page of tokens.
    CountMismatch { expected: usize, got: usize },
    /// Free plus evictable pages (plus evicted ones still waiting for
    /// readers) fall short of the request.
    Insufficient { requested: u64, available: u64 },
    /// Enough pages were evicted, but readers (a `peek` in another
    /// process, stalled) still hold `held` of them: they come back when the
    /// readers move on or are expired, and a retry then succeeds without
    /// evicting again.
    HeldByReaders {
        requested: u64,
        free: u64,
        held: u64,
    },
    /// The SWA pool cannot pair `requested` new pages even after evicting
    /// every unlocked SWA page: only `available` are free.
    SwaInsufficient { requested: u64, available: u64 },
    /// An insert's `swa_evicted` is not page-aligned or runs past the key.
    SwaEvicted { tokens: u64, len: u64 },
    /// A page of an insert whose SWA pairing contradicts the window: one
    /// before `swa_evicted` still paired, or one after it unpaired.
    SwaPairing { page: u32, paired: bool },
    /// A component field of the request the engine cannot take.
    Component(ComponentError),
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::OutOfRange { page, capacity } => {
                write!(f, "page {page} is out of range (capacity {capacity})")
            }
            Self::NotOwned { page } => write!(f, "page {page} is not owned by this client"),
            Self::CountMismatch { expected, got } => {
                write!(
                    f,
                    "expected {expected} page ids (one per whole page), got {got}"
                )
            }
            Self::Insufficient {
                requested,
                available,
            } => write!(
                f,
                "cannot allocate {requested} pages: only {available} are free or evictable"
            ),
            Self::HeldByReaders {
                requested,
                free,
                held,
            } => write!(
                f,
                "cannot allocate {requested} pages yet: {free} are free and {held} evicted pages \
                 are still held by readers (they come back when the readers move on or are \
                 expired)"
            ),
            Self::SwaInsufficient {
                requested,
                available,
            } => write!(
                f,
                "cannot pair {requested} pages with SWA pages: only {available} are free or \
                 evictable"
            ),
            Self::SwaEvicted { tokens, len } => write!(
                f,
                "swa_evicted {tokens} must be page-aligned and at most the key's {len} tokens"
            ),
            Self::SwaPairing { page, paired: true } => write!(
                f,
                "page {page} lies before swa_evicted but still holds its SWA page (free_swa it \
                 first)"
            ),
            Self::SwaPairing {
                page,
                paired: false,
            } => write!(
                f,
                "page {page} lies inside the SWA window but its SWA page was freed (pass \
                 swa_evicted)"
            ),
            Self::Component(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PageError {}

/// Errors of `lock` and `unlock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleError {
    /// The handle names no node this engine ever handed out.
    Unknown(u64),
    /// The node was freed (or freed and reused) since the handle was made.
    Stale(u64),
    /// `unlock` of a node this client holds no lock on.
    NotLocked(u64),
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Unknown(h) => write!(f, "handle {h} names no node"),
            Self::Stale(h) => write!(f, "handle {h} is stale: its node was evicted"),
            Self::NotLocked(h) => write!(f, "handle {h} is not locked by this client"),
        }
    }
}

impl std::error::Error for HandleError {}

/// Errors of the anchored operations, `match_at` and `insert_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnchorError {
    /// The tree changed under the anchor since it was read (its node went,
    /// was reused, split, trimmed, or a child that may continue the key
    /// came): nothing changed; ask again with the whole key.
    Moved,
    /// An anchor no reader could have produced from this tree: the root or
    /// a node out of range, an odd version, pages outside the node, or a
    /// page count that is not the node's depth.
    Invalid(&'static str),
    /// The pages of an `insert_at`, refused as `insert` would refuse them.
    Page(PageError),
}

impl fmt::Display for AnchorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Moved => f.write_str("the tree moved under the anchor; send the whole key"),
            Self::Invalid(why) => write!(f, "invalid anchor: {why}"),
            Self::Page(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for AnchorError {}

impl From<PageError> for AnchorError {
    fn from(e: PageError) -> Self {
        Self::Page(e)
    }
}

/// A broken invariant found by [`Engine::validate`](super::Engine::validate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantError(pub String);

impl fmt::Display for InvariantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant broken: {}", self.0)
    }
}

impl std::error::Error for InvariantError {}
