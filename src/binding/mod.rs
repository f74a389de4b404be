//! A daemon's page pool belongs to one KV buffer.
//!
//! radixd hands out page *ids*; the KV bytes they index live in a buffer
//! the schedulers own (a GPU's KV pool). A scheduler of another buffer that
//! matched those ids would read other tokens' KV (or nothing) from its own
//! buffer: wrong attention, no error. So a client may say which buffer it
//! is, a [`PoolIdentity`]; the first to say it binds the daemon's pool
//! ([`Binding`]), a client of another buffer is refused with
//! `pool_mismatch` (the keys that differ first, then what to do), and the
//! binding is released when its last holder is gone (disconnected or dead,
//! as its locks are). [`BindingBoard`] publishes the binding in the
//! segment for `radixd stat` and [`crate::Client::pool_binding`].
//!
//! A binding starts and ends with an empty tree: when a pool becomes bound
//! and when it becomes unbound, the daemon drops every lock and session of
//! every client and evicts every cached prefix (as `evict` evicts, KV
//! events and all; `Engine::drop_cached`), so nothing cached under one
//! buffer, or under none, is ever matched under another. A handle locked
//! before then is `stale` afterwards. While the pool is bound, a client
//! that has not bound it may read, lock, give back and evict, but not fill
//! the pool ([`Binding::admits`], [`fills_pool`]): `not_permitted`, naming
//! `bind`. An unbound pool admits every client, as before bindings.

use std::collections::BTreeSet;
use std::fmt;
use std::mem::size_of;

use radixd_ipc::sync::{AtomicU32, AtomicU64, Ordering};
use radixd_ipc::{ShmSafe, Version};

use crate::op::{ErrorKind, Rejection, Request};
/// Longest identity, in bytes of its canonical form (a limit of the wire's,
/// which refuses a longer `bind` before it gets here).
pub use crate::wire::MAX_POOL_IDENTITY;
/// Longest key of one pair.
pub const MAX_KEY: usize = 64;

/// Which KV buffer a client's pages index: `key=value` pairs, held in
/// canonical form (keys sorted, unique, joined by `;`), so two clients that
/// say the same pairs in any order are one buffer.
///
/// A key is 1 to [`MAX_KEY`] bytes of `a-z`, `0-9`, `_`, `.`, `-`; a value
/// 1 or more bytes of printable ASCII (space to `~`) except `;`; the whole
/// at most [`MAX_POOL_IDENTITY`] bytes. What the keys are is the binder's
/// business; the SGLang backend's are in docs/protocol.md.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolIdentity {
    text: String,
}

/// Why text or pairs are not a [`PoolIdentity`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityError {
    /// No pair at all.
    Empty,
    /// The canonical form would be `len` bytes, over [`MAX_POOL_IDENTITY`].
    TooLong { len: usize },
    /// Piece `index` (0-based, `;`-separated) has no `=`.
    NotAPair { index: usize },
    /// A key that is empty, too long or has a byte outside `a-z0-9_.-`
    /// (shown cut to [`MAX_KEY`] bytes, escaped).
    BadKey { key: String },
    /// The value of `key` is empty or has a byte outside printable ASCII
    /// or a `;`.
    BadValue { key: String },
    /// `key` appears twice.
    Duplicate { key: String },
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("a pool identity needs at least one key=value pair"),
            Self::TooLong { len } => write!(
                f,
                "a pool identity of {len} bytes is over the limit of {MAX_POOL_IDENTITY}"
            ),
            Self::NotAPair { index } => {
                write!(f, "piece {index} of the pool identity is not key=value")
            }
            Self::BadKey { key } => write!(
                f,
                "pool identity key {key:?} is not 1..={MAX_KEY} bytes of a-z, 0-9, '_', '.', '-'"
            ),
            Self::BadValue { key } => write!(
                f,
                "the value of pool identity key {key} is empty or not printable ASCII without ';'"
            ),
            Self::Duplicate { key } => write!(f, "pool identity key {key} appears twice"),
        }
    }
}

impl std::error::Error for IdentityError {}

impl From<IdentityError> for Rejection {
    fn from(e: IdentityError) -> Self {
        Rejection::new(ErrorKind::Malformed, e.to_string())
    }
}

fn key_ok(key: &str) -> bool {
    (1..=MAX_KEY).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

fn value_ok(value: &str) -> bool {
    !value.is_empty()
        && value
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b';')
}

/// `key` as an error shows it: at most [`MAX_KEY`] bytes, escaped.
fn shown(key: &str) -> String {
    key.chars()
        .take(MAX_KEY)
        .collect::<String>()
        .escape_debug()
        .to_string()
}

impl PoolIdentity {
    /// The identity of `pairs`, in any order.
    pub fn new<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, IdentityError> {
        let mut sorted: Vec<(String, String)> = Vec::new();
        let mut len = 0usize;
        for (k, v) in pairs {
            let (k, v) = (k.as_ref(), v.as_ref());
            if !key_ok(k) {
                return Err(IdentityError::BadKey { key: shown(k) });
            }
            if !value_ok(v) {
                return Err(IdentityError::BadValue { key: k.to_owned() });
            }
            // Checked as it grows, so a huge input is refused early.
            len += k.len() + v.len() + 2;
            if len > MAX_POOL_IDENTITY + 1 {
                return Err(IdentityError::TooLong { len: len - 1 });
            }
            sorted.push((k.to_owned(), v.to_owned()));
        }
        if sorted.is_empty() {
            return Err(IdentityError::Empty);
        }
        sorted.sort();
        if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(IdentityError::Duplicate {
                key: w[0].0.clone(),
            });
        }
        let text = sorted
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        Ok(Self { text })
    }

    /// The identity written as `key=value;key=value...` (any order).
    pub fn parse(text: &str) -> Result<Self, IdentityError> {
        if text.len() > MAX_POOL_IDENTITY {
            return Err(IdentityError::TooLong { len: text.len() });
        }
        if text.is_empty() {
            return Err(IdentityError::Empty);
        }
        let pairs = text
            .split(';')
            .enumerate()
            .map(|(index, piece)| {
                piece
                    .split_once('=')
                    .ok_or(IdentityError::NotAPair { index })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(pairs)
    }

    /// The canonical form.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The pairs, sorted by key.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.text.split(';').filter_map(|p| p.split_once('='))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The keys whose values differ (or that only one side has): `(key,
    /// self's value, other's value)`, sorted by key.
    pub fn differences<'a>(
        &'a self,
        other: &'a PoolIdentity,
    ) -> Vec<(&'a str, Option<&'a str>, Option<&'a str>)> {
        let keys: BTreeSet<&str> = self.pairs().chain(other.pairs()).map(|(k, _)| k).collect();
        keys.into_iter()
            .map(|k| (k, self.get(k), other.get(k)))
            .filter(|(_, a, b)| a != b)
            .collect()
    }
}

impl fmt::Display for PoolIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for PoolIdentity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// What a pool is bound to, as the segment shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolBinding {
    pub identity: PoolIdentity,
    /// Clients holding the binding.
    pub holders: u64,
}

/// What [`Binding::release`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The client held no binding.
    NotHeld,
    /// The client held it; others still do.
    Held,
    /// The client was the last holder: the pool is unbound now.
    Unbound,
}

/// The daemon's side: which buffer its pool belongs to and which clients
/// hold that binding. Every change is published on its board.
pub struct Binding<'b> {
    identity: Option<PoolIdentity>,
    holders: BTreeSet<u32>,
    board: &'b BindingBoard,
}

/// Bytes of a `pool_mismatch` left for the keys that differ: the rest of
/// [`crate::wire::MAX_ERROR_MESSAGE`] holds the sentences around them.
const DIFFS_ROOM: usize = crate::wire::MAX_ERROR_MESSAGE - 1024;

fn quoted(v: Option<&str>) -> &str {
    v.unwrap_or("none")
}

/// `key (bound X, this client Y)` for each key that differs, values whole,
/// as many as fit [`DIFFS_ROOM`] (sorted by key), then how many more.
fn listed(diffs: &[(&str, Option<&str>, Option<&str>)]) -> String {
    let mut out = String::new();
    for (i, (k, b, a)) in diffs.iter().enumerate() {
        let item = format!("{k} (bound {}, this client {})", quoted(*b), quoted(*a));
        // One item always fits: an identity is at most 1 KiB.
        if i > 0 && out.len() + item.len() + 40 > DIFFS_ROOM {
            out.push_str(&format!(" and {} more key(s)", diffs.len() - i));
            break;
        }
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&item);
    }
    out
}

/// Whether `request` puts something into the page pool or the tree: pages
/// handed out, prefixes cached, a state slot taken. While the pool is
/// bound, only its holders may ([`Binding::admits`]). Every op is named,
/// so a new one must be placed.
pub fn fills_pool(request: &Request) -> bool {
    match request {
        Request::Alloc { .. }
        | Request::Insert { .. }
        | Request::InsertAt { .. }
        | Request::InsertWith { .. }
        | Request::SessionCommit { .. }
        | Request::AllocState
        | Request::AllocPaired { .. }
        | Request::InsertPaired { .. }
        | Request::AllocStates { .. } => true,
        Request::Namespaced { request, .. }
        | Request::Counted(request)
        | Request::Hinted { request, .. } => fills_pool(request),
        // Reads (a lock included: it keeps cached pages, it adds none),
        // what gives back, evictions, and what is not the pool's.
        Request::Free { .. }
        | Request::Match { .. }
        | Request::MatchAt { .. }
        | Request::MatchWith { .. }
        | Request::Walk { .. }
        | Request::Lock { .. }
        | Request::Unlock { .. }
        | Request::Evict { .. }
        | Request::EvictLeaf
        | Request::EvictComponents { .. }
        | Request::SessionRelease { .. }
        | Request::SessionStatus { .. }
        | Request::Stats
        | Request::StatsWith
        | Request::Reset
        | Request::Validate
        | Request::FreeState { .. }
        | Request::FreeSwa { .. }
        | Request::FreeStates { .. }
        | Request::LockPaired { .. }
        | Request::SwaPages { .. }
        | Request::Bind { .. }
        | Request::Store(_)
        | Request::Namespace { .. }
        | Request::Join(_) => false,
    }
}

/// The longest the pool's identity is quoted in a refusal of
/// [`Binding::admits`], so the refusal fits
/// [`crate::wire::MIN_REPLY_WINDOW`] (`radixd stat` shows it whole).
const IDENTITY_SHOWN: usize = 120;

impl<'b> Binding<'b> {
    /// An unbound pool, published on `board`.
    pub fn new(board: &'b BindingBoard) -> Self {
        board.publish(None, 0);
        Self {
            identity: None,
            holders: BTreeSet::new(),
            board,
        }
    }

    /// The identity the pool is bound to.
    pub fn identity(&self) -> Option<&PoolIdentity> {
        self.identity.as_ref()
    }

    /// Clients holding the binding.
    pub fn holders(&self) -> u64 {
        self.holders.len() as u64
    }

    /// Binds `client` to the buffer `text` names (untrusted: checked
    /// here). The first binder sets the pool's binding; a client of the
    /// same buffer joins it; a client of another buffer, or one bound
    /// already to another, is refused (`pool_mismatch`) and nothing
    /// changes. Returns the holders after the call.
    pub fn bind(&mut self, client: u32, text: &str) -> Result<u64, Rejection> {
        let asked = PoolIdentity::parse(text)?;
        match &self.identity {
            Some(bound) if *bound != asked => {
                // What differs first, values whole, then what to do; the
                // whole fits a bind's reply window.
                let diffs = listed(&bound.differences(&asked));
                let held = if self.holders.contains(&client) {
                    " This client bound the pool already, and a connection's binding does not change."
                } else {
                    ""
                };
                return Err(Rejection::new(
                    ErrorKind::PoolMismatch,
                    format!(
                        "this daemon's page pool belongs to another KV buffer; differs in: {diffs}.{held} \
                         Its page ids index the bound buffer's KV ({} client(s) bound). One daemon per KV pool: \
                         start one for this buffer (`radixd serve --name OTHER ...`) and point this server at it \
                         (RADIXD_NAME=OTHER); to share prefixes across servers, use the node-wide store \
                         (`radixd serve --store SIZE`).",
                        self.holders.len(),
                    ),
                ));
            }
            Some(_) => {}
            None => self.identity = Some(asked),
        }
        self.holders.insert(client);
        self.publish();
        Ok(self.holders())
    }

    /// Whether `client` may make `request` now: while the pool is bound, a
    /// client that has not bound it may read the cache (a lock included),
    /// give back what it holds and evict, but not fill the pool
    /// ([`fills_pool`]): the pages it would cache index no buffer it named,
    /// and the binders would match them. Refused with `not_permitted`,
    /// naming `bind`; nothing changes. An unbound pool admits everything.
    pub fn admits(&self, client: u32, request: &Request) -> Result<(), Rejection> {
        let Some(bound) = &self.identity else {
            return Ok(());
        };
        if !fills_pool(request) || self.holders.contains(&client) {
            return Ok(());
        }
        let mut shown = bound.as_str().to_owned();
        if shown.len() > IDENTITY_SHOWN {
            // Canonical identities are ASCII: any byte is a boundary.
            shown.truncate(IDENTITY_SHOWN);
            shown.push_str("...");
        }
        Err(Rejection::new(
            ErrorKind::NotPermitted,
            format!(
                "{} needs a binding: this daemon's page pool is bound to a KV buffer ({} client(s) bound) \
                 and this client has not bound it. Bind it to the buffer its pages index first \
                 (exec `{{\"op\":\"bind\",\"pool\":...}}`, `Client::bind`, Python \
                 `radixd.Client(name, pool=...)`); unbound, a client may only read (match, lock, peek, \
                 stats), give back and evict. Bound to: {shown}",
                request.name(),
                self.holders.len(),
            ),
        ))
    }

    /// Drops `client`'s hold (it disconnected or died); the last one
    /// leaving unbinds the pool.
    pub fn release(&mut self, client: u32) -> Released {
        if !self.holders.remove(&client) {
            return Released::NotHeld;
        }
        let done = if self.holders.is_empty() {
            self.identity = None;
            Released::Unbound
        } else {
            Released::Held
        };
        self.publish();
        done
    }

    fn publish(&self) {
        self.board.publish(
            self.identity.as_ref().map(PoolIdentity::as_str),
            self.holders(),
        );
    }
}

/// Words of [`BindingBoard::text`].
const TEXT_WORDS: usize = MAX_POOL_IDENTITY / 8;

/// The binding as the segment shows it: written by the daemon only (it
/// lies in the part clients map read-only), read by `radixd stat` and
/// clients under its version word.
#[repr(C)]
#[derive(Debug)]
pub struct BindingBoard {
    /// Odd while the daemon rewrites the board.
    version: Version,
    _reserved: AtomicU32,
    /// Clients holding the binding.
    holders: AtomicU64,
    /// Bytes of `text` in use; 0: the pool is not bound.
    len: AtomicU64,
    /// The canonical identity, little-endian bytes packed eight to a word.
    text: [AtomicU64; TEXT_WORDS],
}

/// Bytes set aside for the board in the segment.
pub const BINDING_BYTES: u64 = 4096;
const _: () = assert!(size_of::<BindingBoard>() as u64 <= BINDING_BYTES);
const _: () = assert!(size_of::<BindingBoard>() == 24 + MAX_POOL_IDENTITY);

// SAFETY: nothing but atomics (and `Version`, one atomic), valid for every
// bit pattern; all zero is an unbound board.
unsafe impl ShmSafe for BindingBoard {}

/// Why a board could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoardError {
    /// The daemon kept rewriting it.
    Changing,
    /// What it holds is no identity (someone else wrote the segment).
    Garbled,
}

/// Reads of the board before it counts as [`BoardError::Changing`].
const READ_TRIES: u32 = 1000;

impl Default for BindingBoard {
    fn default() -> Self {
        Self {
            version: Version::new(),
            _reserved: AtomicU32::new(0),
            holders: AtomicU64::new(0),
            len: AtomicU64::new(0),
            text: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl BindingBoard {
    /// Writes `identity` (`None`: unbound) and its holders. One writer.
    pub fn publish(&self, identity: Option<&str>, holders: u64) {
        let bytes = identity.unwrap_or("").as_bytes();
        let bytes = &bytes[..bytes.len().min(MAX_POOL_IDENTITY)];
        self.version.begin();
        // Relaxed, all: ordered by the version's Release fence in `begin`
        // and Release store in `end`, which pair with the Acquire in
        // `Version::read` (the seqlock of `radixd_ipc::version`).
        self.holders.store(holders, Ordering::Relaxed);
        self.len.store(bytes.len() as u64, Ordering::Relaxed);
        let mut chunks = bytes.chunks(8);
        for word in &self.text {
            let mut w = [0u8; 8];
            if let Some(chunk) = chunks.next() {
                w[..chunk.len()].copy_from_slice(chunk);
            }
            word.store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        self.version.end();
    }

    /// The binding shown (`None`: the pool is not bound).
    pub fn read(&self) -> Result<Option<PoolBinding>, BoardError> {
        for _ in 0..READ_TRIES {
            let copied = self.version.read(|| {
                // Relaxed, all: validated by the version (Acquire in
                // `Version::read`, pairing with the Release in `end`).
                let holders = self.holders.load(Ordering::Relaxed);
                let len = self.len.load(Ordering::Relaxed);
                let mut text = [0u8; MAX_POOL_IDENTITY];
                for (chunk, word) in text.chunks_mut(8).zip(&self.text) {
                    chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
                }
                (holders, len, text)
            });
            let Some(((holders, len, text), _)) = copied else {
                radixd_ipc::sync::spin_loop();
                continue;
            };
            if len == 0 {
                return Ok(None);
            }
            let text = usize::try_from(len)
                .ok()
                .and_then(|len| text.get(..len))
                .and_then(|t| std::str::from_utf8(t).ok())
                .ok_or(BoardError::Garbled)?;
            let identity = PoolIdentity::parse(text).map_err(|_| BoardError::Garbled)?;
            return Ok(Some(PoolBinding { identity, holders }));
        }
        Err(BoardError::Changing)
    }
}

#[cfg(test)]
mod tests;
