//! How requests and answers travel between a client and the daemon: one
//! fixed 56-byte record per message (with the ring's stamp, one cache line),
//! variable-size data (tokens, pages, session ids, error messages) in the
//! client's scratch areas, except answers of at most [`INLINE_BYTES`]
//! (an `alloc` of one or two pages, as a decode step asks), which travel in
//! the record itself.
//!
//! A request names the window of the request scratch that holds its payload
//! (`tokens ++ pages ++ session id`) and the window of the reply scratch the
//! daemon may write its answer into; the client owns both windows until the
//! answer arrives. Everything the daemon reads is untrusted: [`decode_request`]
//! checks every field of a copied record against the copied payload and
//! answers a typed [`Rejection`], never a panic.
//!
//! Payload words are in the host's byte order: both ends always share a
//! host, and so a prompt travels by plain copies, never word by word.

use std::mem::size_of;

use radixd_ipc::{copy, Scratch, ScratchError};

use crate::binding::MAX_POOL_IDENTITY;
use crate::group::{Join, MAX_GROUP_KEY};
mod store;

pub use store::MAX_BATCH as MAX_STORE_BATCH;

use crate::engine::{Anchor, ComponentStats, Handle, Stats};
use crate::op::{
    check_session_id, check_session_len, ErrorKind, Rejection, Reply, Request, Spare, StoreRequest,
};

/// A request's payload window in a client's scratch area, checked to lie
/// inside it; [`decode_request`] copies each piece out once.
pub struct ScratchWindow<'a> {
    scratch: &'a Scratch<'a>,
    at: u64,
    len: usize,
}

impl<'a> ScratchWindow<'a> {
    /// The `len` bytes at `at`, or why they are not all inside `scratch`.
    pub fn new(scratch: &'a Scratch<'a>, at: u32, len: u32) -> Result<Self, ScratchError> {
        scratch.contains(u64::from(at), u64::from(len))?;
        Ok(Self {
            scratch,
            at: u64::from(at),
            len: len as usize,
        })
    }
}

impl ScratchWindow<'_> {
    /// The scratch offset of `len` bytes at `at` within the window.
    fn piece(&self, at: usize, len: Option<usize>) -> Result<u64, Rejection> {
        match len.and_then(|len| at.checked_add(len)) {
            Some(end) if end <= self.len => Ok(self.at + at as u64),
            _ => Err(malformed("payload piece out of range")),
        }
    }
}

impl Payload for ScratchWindow<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection> {
        let from = self.piece(at, n.checked_mul(4))?;
        self.scratch
            .read_u32s(from, n as u64, out)
            .map_err(|e| malformed(format!("payload window: {e}")))
    }

    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection> {
        let from = self.piece(at, Some(n))?;
        let mut out = Vec::new();
        self.scratch
            .read_bytes(from, n as u64, &mut out)
            .map_err(|e| malformed(format!("payload window: {e}")))?;
        Ok(out)
    }
}

/// Operation codes.
mod opcode {
    pub const ALLOC: u32 = 1;
    pub const FREE: u32 = 2;
    pub const INSERT: u32 = 3;
    pub const MATCH: u32 = 4;
    pub const LOCK: u32 = 5;
    pub const UNLOCK: u32 = 6;
    pub const EVICT: u32 = 7;
    pub const SESSION_COMMIT: u32 = 8;
    pub const SESSION_RELEASE: u32 = 9;
    pub const SESSION_STATUS: u32 = 10;
    pub const STATS: u32 = 11;
    pub const RESET: u32 = 12;
    pub const VALIDATE: u32 = 13;
    pub const MATCH_AT: u32 = 14;
    pub const INSERT_AT: u32 = 15;
    pub const MATCH_WITH: u32 = 16;
    pub const INSERT_WITH: u32 = 17;
    pub const EVICT_COMPONENTS: u32 = 18;
    pub const ALLOC_STATE: u32 = 19;
    pub const FREE_STATE: u32 = 20;
    pub const FREE_SWA: u32 = 21;
    pub const STATS_WITH: u32 = 22;
    pub const SWA_PAGES: u32 = 23;
    pub const BIND: u32 = 24;
    pub const JOIN: u32 = 26;
    pub const WALK: u32 = 27;
    pub const STORE_NAMESPACE: u32 = 40;
    pub const STORE_RESERVE: u32 = 41;
    pub const STORE_COMMIT: u32 = 42;
    pub const STORE_ABORT: u32 = 43;
    pub const STORE_CLEAR: u32 = 44;
    pub const NAMESPACE: u32 = 25;
}

/// Reply kinds.
mod kind {
    pub const PAGES: u32 = 1;
    pub const DONE: u32 = 2;
    pub const INSERTED: u32 = 3;
    pub const MATCHED: u32 = 4;
    pub const EVICTED: u32 = 5;
    pub const SESSION: u32 = 6;
    pub const STATS: u32 = 7;
    pub const MATCHED_WITH: u32 = 8;
    pub const INSERTED_WITH: u32 = 9;
    pub const EVICTED_COMPONENTS: u32 = 10;
    pub const STATE: u32 = 11;
    pub const SWA_FREED: u32 = 12;
    pub const STATS_WITH: u32 = 13;
    pub const SWA_PAGES: u32 = 14;
    pub const BOUND: u32 = 15;
    pub const LOCKED: u32 = 16;
    pub const JOINED: u32 = 18;
    pub const STORE_NAMESPACE: u32 = 40;
    pub const STORE_RESERVED: u32 = 41;
    pub const STORE_DONE: u32 = 42;
    pub const NAMESPACE: u32 = 17;
}

/// `flags` bit: the request asks for a lock.
const FLAG_LOCK: u32 = 1;
/// `flags` bit of a reply: `c` holds a handle.
const FLAG_HANDLE: u32 = 2;
/// `flags` bit of a reply: the payload is the first `payload_len` bytes of
/// `inline`, not in the reply window.
const FLAG_INLINE: u32 = 4;
/// `flags` bit of a reply: the hybrid extra is there (`MatchedWith`: the
/// payload's last word is the state slot; `InsertedWith`: `mamba_exist`;
/// `StatsWith`: the components' figures follow the engine's).
const FLAG_EXTRA: u32 = 8;

/// `flags` bit of a request: the op runs in a namespace whose name is the
/// payload's last `aux[0]` bytes (after everything the op itself carries).
const FLAG_NS: u32 = 16;

/// Largest answer payload carried in the reply record itself.
pub const INLINE_BYTES: usize = 8;

/// Room a client leaves for an error message: every reply window has at
/// least this much, and the daemon's messages for ops other than `bind`
/// and `join` fit it (what to act on first, cut by their maker, never by
/// the wire: see `group::first_difference`, `binding::Binding::admits`).
pub const MIN_REPLY_WINDOW: usize = 512;

/// Longest error message a reply carries, and the reply window of a `bind`
/// or `join`: their refusals (the keys two pool identities differ in, a
/// group key) name what to do, and arrive whole.
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// The handle a request locks by itself (`lock`), whose lock a client
/// must give back if the answer comes too late for its caller; locks taken
/// by `match`/`insert` show in their answers instead.
pub fn handle_locked_by(record: &WireRequest) -> Option<u64> {
    (record.op == opcode::LOCK).then_some(record.arg)
}

/// Whether a request asks for a lock (`match`/`insert` with `lock`): the
/// handle of its answer then holds one.
pub fn asks_lock(record: &WireRequest) -> bool {
    record.flags & FLAG_LOCK != 0
}

/// The page count an `alloc` record asks for (`None`: not an `alloc`).
pub fn alloc_count(record: &WireRequest) -> Option<u64> {
    (record.op == opcode::ALLOC).then_some(record.arg)
}

/// One request record in a ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireRequest {
    /// Chosen by the client, echoed in the reply.
    pub seq: u64,
    pub op: u32,
    pub flags: u32,
    /// `n` of alloc, handle of lock/unlock, tokens of evict (and of
    /// evict_components), `swa_evicted` of insert_with, the slot of
    /// free_state; for the anchored ops the anchor's node as a handle
    /// (index | generation << 32).
    pub arg: u64,
    /// Payload window in the request scratch, in bytes.
    pub payload_off: u32,
    pub payload_len: u32,
    /// The payload is `n_tokens` tokens, `n_pages` pages, then the session
    /// id, or for the anchored ops the anchor's words: matched pages, and
    /// for `MatchAt` the next page's hash when the reader had one; for
    /// `InsertWith` the state slot when there is one; for
    /// `EvictComponents` `swa_tokens` and `mamba_states` (two words each,
    /// low first).
    pub n_tokens: u32,
    pub n_pages: u32,
    /// Window of the reply scratch the answer may use, in bytes.
    pub reply_off: u32,
    pub reply_len: u32,
    /// For the anchored ops: the anchor's version and pages into its node;
    /// zero for every other op.
    pub aux: [u32; 2],
}

/// One reply record in a ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireReply {
    /// The request's `seq`.
    pub seq: u64,
    /// 0 for success, else an [`ErrorKind`] code.
    pub status: u32,
    pub kind: u32,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    /// Bytes of payload: at the start of the request's reply window, or
    /// in `inline` under `FLAG_INLINE`.
    pub payload_len: u32,
    pub flags: u32,
    /// A payload of at most [`INLINE_BYTES`], host byte order.
    pub inline: [u8; INLINE_BYTES],
}

// Each record shares one cache line with its ring stamp.
const _: () = assert!(size_of::<WireRequest>() == radixd_ipc::MAX_MESSAGE);
const _: () = assert!(size_of::<WireReply>() == radixd_ipc::MAX_MESSAGE);

// SAFETY: plain integers and integer arrays, no padding (56 bytes of
// naturally aligned fields, asserted above): every bit pattern is a value.
unsafe impl radixd_ipc::Plain for WireRequest {}
// SAFETY: as for `WireRequest`.
unsafe impl radixd_ipc::Plain for WireReply {}

/// A request record and the pieces of its payload, borrowed from the
/// request, ready to be copied into a scratch window (or a byte stream).
pub struct EncodedRequest<'r> {
    pub record: WireRequest,
    /// Bytes of reply window the answer can need.
    pub reply_need: usize,
    pub tokens: &'r [u32],
    pub pages: &'r [u32],
    /// The words after the pages of the anchored and component ops (see
    /// [`WireRequest`]).
    pub anchor_words: AnchorWords,
    pub session: &'r [u8],
    /// An owned payload after all of the above (store requests).
    pub bytes: Vec<u8>,
    /// The namespace's name of a namespaced request (else empty): last.
    pub ns: &'r [u8],
}

/// Up to four words of a request's payload after its pages (anchored
/// and component ops).
#[derive(Clone, Copy, Debug, Default)]
pub struct AnchorWords {
    words: [u32; 4],
    len: usize,
}

impl AnchorWords {
    /// The words.
    pub fn as_slice(&self) -> &[u32] {
        &self.words[..self.len]
    }
}

impl EncodedRequest<'_> {
    /// Payload bytes: `tokens ++ pages ++ anchor words ++ session ++ ns`.
    pub fn payload_len(&self) -> usize {
        (self.tokens.len() + self.pages.len() + self.anchor_words.len) * 4
            + self.session.len()
            + self.bytes.len()
            + self.ns.len()
    }

    /// The payload as one buffer, for transports that need one.
    pub fn payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.payload_len());
        push_u32s(&mut out, self.tokens);
        push_u32s(&mut out, self.pages);
        push_u32s(&mut out, self.anchor_words.as_slice());
        out.extend_from_slice(self.session);
        out.extend_from_slice(&self.bytes);
        out.extend_from_slice(self.ns);
        out
    }
}

/// Where [`decode_request`] reads a payload from: a private buffer, or a
/// window of shared memory. Each piece is read exactly once, after the
/// record (a private copy) has been checked against [`Payload::len`], so a
/// peer writing the window meanwhile can garble values but never lengths.
pub trait Payload {
    /// Bytes in the window.
    fn len(&self) -> usize;
    /// Whether the window is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies out `n` words at byte `at` into `out` (replacing what it
    /// held); `at + 4n <= len()`.
    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection>;
    /// Copies out `n` bytes at byte `at`; `at + n <= len()`.
    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection>;
}

impl Payload for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection> {
        let bytes = n
            .checked_mul(4)
            .and_then(|len| self.get(at..at.checked_add(len)?))
            .ok_or_else(|| malformed("payload piece out of range"))?;
        out.clear();
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        );
        Ok(())
    }

    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection> {
        at.checked_add(n)
            .and_then(|end| self.get(at..end))
            .map(copy::to_vec)
            .ok_or_else(|| malformed("payload piece out of range"))
    }
}

/// Appends `xs` in host byte order, in chunks that stay clear of the slow large
/// copy (see [`radixd_ipc::copy`]).
fn push_u32s(out: &mut Vec<u8>, xs: &[u32]) {
    const WORDS: usize = copy::CHUNK / 4;
    let start = out.len();
    out.resize(start + xs.len() * 4, 0);
    for (bytes, words) in out[start..].chunks_mut(copy::CHUNK).zip(xs.chunks(WORDS)) {
        for (b, x) in bytes.chunks_exact_mut(4).zip(words) {
            b.copy_from_slice(&x.to_ne_bytes());
        }
    }
}

/// The words of `bytes` (host byte order) (whose length is a multiple of 4).
fn u32s(bytes: &[u8]) -> Vec<u32> {
    const WORDS: usize = copy::CHUNK / 4;
    let mut out = vec![0; bytes.len() / 4];
    for (words, chunk) in out.chunks_mut(WORDS).zip(bytes.chunks(copy::CHUNK)) {
        for (x, b) in words.iter_mut().zip(chunk.chunks_exact(4)) {
            *x = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    out
}

/// Bytes the successful answer to `request` needs in its reply window, on
/// an engine of `page_size` and `capacity`.
pub fn reply_need(request: &Request, page_size: u32, capacity: u32) -> usize {
    Call::of(request).reply_need(page_size, capacity)
}

/// Size of the stats answer.
const STATS_BYTES: usize = (Stats::LEN + 1) * 8;

/// Size of the stats-with-components answer with the components' figures.
const STATS_WITH_BYTES: usize = STATS_BYTES + ComponentStats::LEN * 8;

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
            Self::Namespaced(_, request) => Call::of(request).reply_need(page_size, capacity),
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
            Self::Join(j) => (
                opcode::JOIN,
                u64::from(j.rank) | u64::from(j.size) << 32,
                0,
                none,
                none,
                j.group.as_str(),
            ),
            // Handled above.
            Self::Namespaced(..) => (0, 0, 0, none, none, ""),
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

/// A 128-bit digest of an encoded request (its record's fields, bar the
/// sequence number and windows, and its payload): what a rank compares a
/// step on its group's board with (`radixd_ipc::Board`). Four lanes of a
/// multiply-rotate hash take every fourth word (so the multiplies run side
/// by side), folded by murmur3's finalizer into two words: two different
/// requests collide with odds of about 2^-128.
pub fn digest(e: &EncodedRequest<'_>) -> [u64; 2] {
    let mut d = Digest::new();
    let r = &e.record;
    d.word(u64::from(r.op) | u64::from(r.flags) << 32);
    d.word(r.arg);
    d.word(u64::from(r.n_tokens) | u64::from(r.n_pages) << 32);
    d.word(u64::from(r.aux[0]) | u64::from(r.aux[1]) << 32);
    d.word(u64::from(r.payload_len));
    d.u32s(e.tokens);
    d.u32s(e.pages);
    d.u32s(e.anchor_words.as_slice());
    for bytes in [e.session, &e.bytes[..], e.ns] {
        d.bytes(bytes);
    }
    d.finish()
}

/// The state of [`digest`].
struct Digest {
    h: [u64; 4],
    /// Words taken so far (which lane takes the next).
    n: usize,
}

impl Digest {
    const K: [u64; 4] = [
        0x9E37_79B9_7F4A_7C15,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
        0xFF51_AFD7_ED55_8CCD,
    ];

    fn new() -> Self {
        Self {
            h: [
                0x243F_6A88_85A3_08D3,
                0x1319_8A2E_0370_7344,
                0xA409_3822_299F_31D0,
                0x082E_FA98_EC4E_6C89,
            ],
            n: 0,
        }
    }

    #[inline(always)]
    fn lane(&mut self, i: usize, w: u64) {
        self.h[i] = (self.h[i].rotate_left(23) ^ w).wrapping_mul(Self::K[i]);
    }

    fn word(&mut self, w: u64) {
        self.lane(self.n % 4, w);
        self.n += 1;
    }

    fn u32s(&mut self, xs: &[u32]) {
        let mut quads = xs.chunks_exact(8);
        // Four independent multiply chains, in registers; the lanes are
        // turned so that the word count decides which lane goes first.
        let turn = self.n % 4;
        let mut h = [0; 4];
        for (i, x) in h.iter_mut().enumerate() {
            *x = self.h[(turn + i) % 4];
        }
        let k: [u64; 4] = std::array::from_fn(|i| Self::K[(turn + i) % 4]);
        for q in &mut quads {
            for i in 0..4 {
                let w = u64::from(q[2 * i]) | u64::from(q[2 * i + 1]) << 32;
                h[i] = (h[i].rotate_left(23) ^ w).wrapping_mul(k[i]);
            }
        }
        for (i, x) in h.into_iter().enumerate() {
            self.h[(turn + i) % 4] = x;
        }
        self.n += 4 * (xs.len() / 8);
        let rest = quads.remainder();
        let mut pairs = rest.chunks_exact(2);
        for p in &mut pairs {
            self.word(u64::from(p[0]) | u64::from(p[1]) << 32);
        }
        if let [x] = pairs.remainder() {
            self.word(u64::from(*x) | 1 << 63);
        }
        self.word(xs.len() as u64);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_ne_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let mut last = [0u8; 8];
        last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.word(u64::from_ne_bytes(last));
        self.word(bytes.len() as u64);
    }

    fn finish(self) -> [u64; 2] {
        // murmur3's 64-bit finalizer.
        let fmix = |mut k: u64| {
            k ^= k >> 33;
            k = k.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
            k ^= k >> 33;
            k = k.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
            k ^ k >> 33
        };
        let [a, b, c, d] = self.h.map(fmix);
        [
            fmix(a ^ b.rotate_left(21) ^ c.rotate_left(42) ^ d.rotate_left(11)),
            fmix(b ^ c.rotate_left(19) ^ d.rotate_left(37) ^ a.rotate_left(53)),
        ]
    }
}

/// A reply record as the six words of a step on a board (its sequence
/// number left out: each rank's is its own).
pub fn reply_words(w: &WireReply) -> [u64; radixd_ipc::HEAD_WORDS] {
    [
        u64::from(w.status) | u64::from(w.kind) << 32,
        w.a,
        w.b,
        w.c,
        u64::from(w.payload_len) | u64::from(w.flags) << 32,
        u64::from_ne_bytes(w.inline),
    ]
}

/// The reply record of [`reply_words`], with sequence number `seq`.
pub fn reply_of_words(seq: u64, words: [u64; radixd_ipc::HEAD_WORDS]) -> WireReply {
    WireReply {
        seq,
        status: words[0] as u32,
        kind: (words[0] >> 32) as u32,
        a: words[1],
        b: words[2],
        c: words[3],
        payload_len: words[4] as u32,
        flags: (words[4] >> 32) as u32,
        inline: words[5].to_ne_bytes(),
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

fn malformed(message: impl Into<String>) -> Rejection {
    Rejection::new(ErrorKind::Malformed, message)
}

/// Decodes a request record (copied out of the ring) and its payload (the
/// scratch window the record names, read piece by piece).
///
/// Token and page lists come from `spare` (see [`Spare`]), so a warm server
/// decodes without allocating.
pub fn decode_request<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    if r.flags & FLAG_NS != 0 {
        return decode_namespaced(r, payload, spare);
    }
    decode_op(r, payload, spare)
}

/// [`decode_request`] of a record without [`FLAG_NS`] (a namespace inside
/// a namespaced request is an unknown flag here).
fn decode_op<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    if r.flags & !FLAG_LOCK != 0 {
        return Err(malformed(format!("unknown request flags {:#x}", r.flags)));
    }
    if payload.len() != r.payload_len as usize {
        return Err(malformed("payload length disagrees with the record"));
    }
    if store::is_store_op(r.op) {
        return store::decode(r, payload).map(Request::Store);
    }
    let tokens_end = (r.n_tokens as usize).checked_mul(4);
    let pages_end = tokens_end
        .zip((r.n_pages as usize).checked_mul(4))
        .map(|(t, p)| t + p);
    let (Some(tokens_end), Some(pages_end)) = (tokens_end, pages_end) else {
        return Err(malformed("token or page count overflows"));
    };
    if pages_end > payload.len() {
        return Err(malformed(format!(
            "{} tokens and {} pages do not fit a {}-byte payload",
            r.n_tokens,
            r.n_pages,
            payload.len()
        )));
    }
    let list = |spare: &mut Spare, at: usize, n: u32| {
        let mut out = spare.list();
        payload.words(at, n as usize, &mut out).map(|()| out)
    };
    let tail = payload.len() - pages_end;
    let lock = r.flags & FLAG_LOCK != 0;
    let session = || -> Result<String, Rejection> {
        check_session_len(tail)?;
        let bytes = payload.bytes(pages_end, tail)?;
        check_session_id(&bytes).map(str::to_owned)
    };
    let exact = |tokens: bool, pages: bool, rest: bool| {
        let ok = (tokens || r.n_tokens == 0) && (pages || r.n_pages == 0) && (rest || tail == 0);
        if ok {
            Ok(())
        } else {
            Err(malformed("payload carries fields this op does not take"))
        }
    };
    let none = || exact(false, false, false);
    // The anchored ops' words after the pages: `words` of them exactly.
    let anchor_words = |spare: &mut Spare, words: &[usize]| -> Result<[u32; 2], Rejection> {
        let Some(&n) = words.iter().find(|&&n| n * 4 == tail) else {
            return Err(malformed(format!(
                "{tail} bytes after the pages, not an anchor's words"
            )));
        };
        let mut got = spare.list();
        let read = payload.words(pages_end, n, &mut got);
        let out = [got.first().copied(), got.get(1).copied()];
        spare.keep(got);
        read?;
        match out {
            [Some(m), h] => Ok([m, h.unwrap_or(0)]),
            _ => Err(malformed("short anchor words")),
        }
    };
    // The component ops' words after the pages: exactly `n` of them.
    let tail_words = |spare: &mut Spare, n: usize| -> Result<[u32; 4], Rejection> {
        if tail != n * 4 {
            return Err(malformed(format!(
                "{tail} bytes after the pages, not {n} words"
            )));
        }
        let mut got = spare.list();
        let read = payload.words(pages_end, n, &mut got);
        let mut out = [0; 4];
        for (o, w) in out.iter_mut().zip(&got) {
            *o = *w;
        }
        let short = got.len() != n;
        spare.keep(got);
        read?;
        if short {
            return Err(malformed("short words after the pages"));
        }
        Ok(out)
    };
    let anchor = || {
        let node = Handle::from_raw(r.arg);
        Anchor {
            node: node.index,
            generation: node.generation,
            version: r.aux[0],
            pages_into_node: r.aux[1],
        }
    };
    let anchored = matches!(r.op, opcode::MATCH_AT | opcode::INSERT_AT);
    if !anchored && r.aux != [0, 0] {
        return Err(malformed("aux words set on an op that takes none"));
    }
    let request = match r.op {
        opcode::ALLOC => none().map(|()| Request::Alloc { n: r.arg })?,
        opcode::FREE => {
            exact(false, true, false)?;
            Request::Free {
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::INSERT => {
            exact(true, true, false)?;
            Request::Insert {
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
                lock,
            }
        }
        opcode::MATCH => {
            exact(true, false, false)?;
            Request::Match {
                tokens: list(spare, 0, r.n_tokens)?,
                lock,
            }
        }
        opcode::LOCK => none().map(|()| Request::Lock { handle: r.arg })?,
        opcode::UNLOCK => none().map(|()| Request::Unlock { handle: r.arg })?,
        opcode::EVICT => none().map(|()| Request::Evict { tokens: r.arg })?,
        opcode::SESSION_COMMIT => {
            exact(true, true, true)?;
            Request::SessionCommit {
                session: session()?,
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::SESSION_RELEASE => {
            exact(false, false, true)?;
            Request::SessionRelease {
                session: session()?,
            }
        }
        opcode::SESSION_STATUS => {
            exact(false, false, true)?;
            Request::SessionStatus {
                session: session()?,
            }
        }
        opcode::STATS => none().map(|()| Request::Stats)?,
        opcode::RESET => none().map(|()| Request::Reset)?,
        opcode::VALIDATE => none().map(|()| Request::Validate)?,
        opcode::MATCH_AT => {
            exact(false, false, true)?;
            let [matched_pages, hash] = anchor_words(spare, &[1, 2])?;
            let next_hash = (tail == 8).then_some(hash);
            Request::MatchAt {
                anchor: anchor(),
                matched_pages,
                next_hash,
                lock,
            }
        }
        opcode::INSERT_AT => {
            exact(true, true, true)?;
            let [matched_pages, _] = anchor_words(spare, &[1])?;
            Request::InsertAt {
                anchor: anchor(),
                matched_pages,
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
                lock,
            }
        }
        opcode::MATCH_WITH => {
            exact(true, false, false)?;
            Request::MatchWith {
                tokens: list(spare, 0, r.n_tokens)?,
                lock,
            }
        }
        opcode::INSERT_WITH => {
            exact(true, true, true)?;
            let mamba_state = match tail {
                0 => None,
                _ => Some(tail_words(spare, 1)?[0]),
            };
            Request::InsertWith {
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
                lock,
                mamba_state,
                swa_evicted: r.arg,
            }
        }
        opcode::EVICT_COMPONENTS => {
            exact(false, false, true)?;
            let [s0, s1, m0, m1] = tail_words(spare, 4)?;
            Request::EvictComponents {
                tokens: r.arg,
                swa_tokens: u64::from(s0) | u64::from(s1) << 32,
                mamba_states: u64::from(m0) | u64::from(m1) << 32,
            }
        }
        opcode::ALLOC_STATE => none().map(|()| Request::AllocState)?,
        opcode::FREE_STATE => none().map(|()| Request::FreeState { state: r.arg })?,
        opcode::FREE_SWA => {
            exact(false, true, false)?;
            Request::FreeSwa {
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::STATS_WITH => none().map(|()| Request::StatsWith)?,
        opcode::SWA_PAGES => {
            exact(false, true, false)?;
            Request::SwaPages {
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::BIND => {
            exact(false, false, true)?;
            // The length is checked before anything is copied; what the
            // bytes say, `binding::Binding::bind` checks.
            if tail > MAX_POOL_IDENTITY {
                return Err(malformed(format!(
                    "a pool identity of {tail} bytes is over the limit of {MAX_POOL_IDENTITY}"
                )));
            }
            let bytes = payload.bytes(pages_end, tail)?;
            let pool =
                String::from_utf8(bytes).map_err(|_| malformed("pool identity is not UTF-8"))?;
            Request::Bind { pool }
        }
        opcode::NAMESPACE => {
            exact(false, false, true)?;
            Request::Namespace {
                name: namespace_name(payload, pages_end, tail)?,
            }
        }
        opcode::WALK => {
            exact(true, false, false)?;
            Request::Walk {
                tokens: list(spare, 0, r.n_tokens)?,
            }
        }
        opcode::JOIN => {
            exact(false, false, true)?;
            // The page size's word, then the key: its length checked
            // before it is copied; what it says, `group::Groups::join`.
            let key_len = tail
                .checked_sub(4)
                .ok_or_else(|| malformed("join without a page size"))?;
            if key_len > MAX_GROUP_KEY {
                return Err(malformed(format!(
                    "a group key of {key_len} bytes is over the limit of {MAX_GROUP_KEY}"
                )));
            }
            let mut word = spare.list();
            let read = payload.words(pages_end, 1, &mut word);
            let page_size = word.first().copied();
            spare.keep(word);
            read?;
            let bytes = payload.bytes(pages_end + 4, key_len)?;
            let group =
                String::from_utf8(bytes).map_err(|_| malformed("group key is not UTF-8"))?;
            Request::Join(Join {
                group,
                rank: r.arg as u32,
                size: (r.arg >> 32) as u32,
                page_size: page_size.ok_or_else(|| malformed("join without a page size"))?,
            })
        }
        op => {
            return Err(Rejection::new(
                ErrorKind::UnknownOp,
                format!("unknown opcode {op}"),
            ))
        }
    };
    let lockable = matches!(
        request,
        Request::Insert { .. }
            | Request::Match { .. }
            | Request::MatchAt { .. }
            | Request::InsertAt { .. }
            | Request::MatchWith { .. }
            | Request::InsertWith { .. }
    );
    if lock && !lockable {
        return Err(malformed("only insert and match take a lock flag"));
    }
    // `arg` only on the ops that take it (see `WireRequest::arg`): a value
    // the op would ignore is refused, never answered as if it were not there.
    let takes_arg = matches!(
        request,
        Request::Alloc { .. }
            | Request::Lock { .. }
            | Request::Unlock { .. }
            | Request::Evict { .. }
            | Request::MatchAt { .. }
            | Request::InsertAt { .. }
            | Request::InsertWith { .. }
            | Request::EvictComponents { .. }
            | Request::FreeState { .. }
            | Request::Join(_)
    );
    if r.arg != 0 && !takes_arg {
        return Err(malformed("arg set on an op that takes none"));
    }
    Ok(request)
}

/// A namespace's name: `len` bytes of UTF-8 at `at`, its length checked
/// before it is copied.
fn namespace_name<P: Payload + ?Sized>(
    payload: &P,
    at: usize,
    len: usize,
) -> Result<String, Rejection> {
    crate::engine::check_namespace_len(len)?;
    let bytes = payload.bytes(at, len)?;
    String::from_utf8(bytes).map_err(|_| malformed("namespace name is not UTF-8"))
}

/// A request with [`FLAG_NS`]: the name off the payload's end, then the
/// request as if it had none.
fn decode_namespaced<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    let len = r.aux[0] as usize;
    if r.aux[1] != 0 || len > payload.len() || payload.len() != r.payload_len as usize {
        return Err(malformed("namespace name outside the payload"));
    }
    let at = payload.len() - len;
    let ns = namespace_name(payload, at, len)?;
    let inner = WireRequest {
        flags: r.flags & !FLAG_NS,
        aux: [0, 0],
        payload_len: at as u32,
        ..*r
    };
    let request = decode_op(&inner, &Prefix { payload, len: at }, spare)?;
    if !request.takes_namespace() {
        return Err(malformed(
            "only match, insert and session_commit take a namespace",
        ));
    }
    Ok(Request::Namespaced {
        ns,
        request: Box::new(request),
    })
}

/// The first `len` bytes of a payload.
struct Prefix<'p, P: ?Sized> {
    payload: &'p P,
    len: usize,
}

impl<P: Payload + ?Sized> Payload for Prefix<'_, P> {
    fn len(&self) -> usize {
        self.len
    }

    fn words(&self, at: usize, n: usize, out: &mut Vec<u32>) -> Result<(), Rejection> {
        match n.checked_mul(4).and_then(|b| b.checked_add(at)) {
            Some(end) if end <= self.len => self.payload.words(at, n, out),
            _ => Err(malformed("payload piece out of range")),
        }
    }

    fn bytes(&self, at: usize, n: usize) -> Result<Vec<u8>, Rejection> {
        match at.checked_add(n) {
            Some(end) if end <= self.len => self.payload.bytes(at, n),
            _ => Err(malformed("payload piece out of range")),
        }
    }
}

/// Encodes an answer into a reply record and `payload` (cleared first),
/// the bytes for its window of `room` bytes; a payload of at most
/// [`INLINE_BYTES`] goes into the record instead, leaving `payload` empty.
/// Only an error message can outgrow a window whose room was checked
/// against [`reply_need`]: it is cut to the room (at most
/// [`MAX_ERROR_MESSAGE`]), never inside a character.
pub fn encode_reply(
    seq: u64,
    result: &Result<Reply, Rejection>,
    room: usize,
    payload: &mut Vec<u8>,
) -> WireReply {
    let mut w = WireReply {
        seq,
        ..WireReply::default()
    };
    payload.clear();
    match result {
        Err(rejection) => {
            w.status = rejection.kind as u32;
            let message = utf8_prefix(&rejection.message, room.min(MAX_ERROR_MESSAGE));
            payload.extend_from_slice(message.as_bytes());
        }
        Ok(Reply::Pages(pages)) => {
            w.kind = kind::PAGES;
            push_u32s(payload, pages);
        }
        Ok(Reply::SwaPages(pages)) => {
            w.kind = kind::SWA_PAGES;
            push_u32s(payload, pages);
        }
        Ok(Reply::Done) => w.kind = kind::DONE,
        Ok(Reply::Locked(handle)) => {
            w.kind = kind::LOCKED;
            w.a = *handle;
        }
        Ok(Reply::Inserted {
            cached,
            len,
            handle,
            locked,
        }) => {
            w.kind = kind::INSERTED;
            (w.a, w.b) = (*cached, *len);
            set_handle(&mut w, *handle, *locked);
        }
        Ok(Reply::Matched { len, pages, handle }) => {
            w.kind = kind::MATCHED;
            w.a = *len;
            set_handle(&mut w, *handle, false);
            push_u32s(payload, pages);
        }
        Ok(Reply::Evicted(tokens)) => {
            w.kind = kind::EVICTED;
            w.a = *tokens;
        }
        Ok(Reply::Session {
            resident_tokens,
            idle_ms,
        }) => {
            w.kind = kind::SESSION;
            (w.a, w.b) = (*resident_tokens, *idle_ms);
        }
        Ok(Reply::Stats { stats: s, sessions }) => {
            w.kind = kind::STATS;
            for x in s.to_array().into_iter().chain([*sessions]) {
                payload.extend_from_slice(&x.to_ne_bytes());
            }
        }
        Ok(Reply::MatchedWith {
            len,
            pages,
            handle,
            full_len,
            mamba_state,
        }) => {
            w.kind = kind::MATCHED_WITH;
            (w.a, w.b) = (*len, *full_len);
            set_handle(&mut w, *handle, false);
            push_u32s(payload, pages);
            if let Some(state) = mamba_state {
                w.flags |= FLAG_EXTRA;
                payload.extend_from_slice(&state.to_ne_bytes());
            }
        }
        Ok(Reply::InsertedWith {
            cached,
            len,
            handle,
            locked,
            mamba_exist,
        }) => {
            w.kind = kind::INSERTED_WITH;
            (w.a, w.b) = (*cached, *len);
            set_handle(&mut w, *handle, *locked);
            if *mamba_exist {
                w.flags |= FLAG_EXTRA;
            }
        }
        Ok(Reply::EvictedComponents {
            tokens,
            swa_tokens,
            mamba_states,
        }) => {
            w.kind = kind::EVICTED_COMPONENTS;
            (w.a, w.b, w.c) = (*tokens, *swa_tokens, *mamba_states);
        }
        Ok(Reply::State { state }) => {
            w.kind = kind::STATE;
            w.a = u64::from(*state);
        }
        Ok(Reply::SwaFreed { n }) => {
            w.kind = kind::SWA_FREED;
            w.a = *n;
        }
        Ok(Reply::Store(r)) => store::encode_reply(&mut w, r, payload),
        Ok(Reply::Namespace { id }) => {
            w.kind = kind::NAMESPACE;
            w.a = u64::from(*id);
        }
        Ok(Reply::StatsWith {
            stats: s,
            sessions,
            components,
        }) => {
            w.kind = kind::STATS_WITH;
            let figures = components.as_ref().map(ComponentStats::to_array);
            if figures.is_some() {
                w.flags |= FLAG_EXTRA;
            }
            let all = s.to_array().into_iter().chain([*sessions]);
            for x in all.chain(figures.into_iter().flatten()) {
                payload.extend_from_slice(&x.to_ne_bytes());
            }
        }
        Ok(Reply::Bound { holders }) => {
            w.kind = kind::BOUND;
            w.a = *holders;
        }
        Ok(Reply::Joined {
            joined,
            size,
            board,
        }) => {
            w.kind = kind::JOINED;
            (w.a, w.b) = (u64::from(*joined), u64::from(*size));
            w.c = board.map_or(u64::MAX, u64::from);
        }
    }
    w.payload_len = payload.len() as u32;
    if payload.len() <= INLINE_BYTES {
        w.flags |= FLAG_INLINE;
        w.inline[..payload.len()].copy_from_slice(payload);
        payload.clear();
    }
    w
}

/// Where a reply's payload is: `Some(bytes)` in the record itself, `None`
/// in the request's reply window (`payload_len` bytes at its start).
pub fn inline_payload(w: &WireReply) -> Result<Option<&[u8]>, BadReply> {
    if w.flags & FLAG_INLINE == 0 {
        return Ok(None);
    }
    w.inline
        .get(..w.payload_len as usize)
        .map(Some)
        .ok_or(BadReply::PayloadLength)
}

/// Bit 0 of `flags`: the request asked for a lock; [`FLAG_HANDLE`]: `c` is
/// the handle.
fn set_handle(w: &mut WireReply, handle: Option<u64>, locked: bool) {
    if locked {
        w.flags |= FLAG_LOCK;
    }
    if let Some(h) = handle {
        w.flags |= FLAG_HANDLE;
        w.c = h;
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
fn utf8_prefix(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A reply the daemon should never have sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadReply {
    /// The record's payload length is not the window's.
    PayloadLength,
    /// An error code no [`ErrorKind`] has.
    UnknownError(u32),
    /// A page list that is not whole `u32`s.
    RaggedPages,
    /// A stats payload of the wrong size.
    StatsSize(usize),
    /// A reply kind this client does not know.
    UnknownKind(u32),
    /// A field out of its range (a state slot beyond 32 bits, a missing
    /// state word).
    BadField(&'static str),
}

impl std::fmt::Display for BadReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("malformed reply from the daemon: ")?;
        match self {
            Self::PayloadLength => f.write_str("payload length disagrees with the record"),
            Self::UnknownError(code) => write!(f, "unknown error code {code}"),
            Self::RaggedPages => f.write_str("page list is not whole u32s"),
            Self::StatsSize(n) => write!(
                f,
                "stats payload of {n} bytes, not {STATS_BYTES} (or {STATS_WITH_BYTES} with components)"
            ),
            Self::UnknownKind(k) => write!(f, "unknown reply kind {k}"),
            Self::BadField(what) => write!(f, "bad {what}"),
        }
    }
}

impl std::error::Error for BadReply {}

/// Decodes a reply record and the bytes of its window (ignored when the
/// payload is inline, see [`inline_payload`]).
pub fn decode_reply(w: &WireReply, window: &[u8]) -> Result<Result<Reply, Rejection>, BadReply> {
    let payload = inline_payload(w)?.unwrap_or(window);
    if payload.len() != w.payload_len as usize {
        return Err(BadReply::PayloadLength);
    }
    if w.status != 0 {
        let kind = ErrorKind::from_code(w.status).ok_or(BadReply::UnknownError(w.status))?;
        return Ok(Err(Rejection::new(kind, String::from_utf8_lossy(payload))));
    }
    let handle = (w.flags & FLAG_HANDLE != 0).then_some(w.c);
    let locked = w.flags & FLAG_LOCK != 0;
    let extra = w.flags & FLAG_EXTRA != 0;
    let words = || {
        if payload.len() % 4 == 0 {
            Ok(u32s(payload))
        } else {
            Err(BadReply::RaggedPages)
        }
    };
    // The engine's figures and the sessions count, from the payload's start.
    let figures = |payload: &[u8]| {
        let mut x = [0u64; Stats::LEN + 1];
        for (v, c) in x.iter_mut().zip(payload.chunks_exact(8)) {
            *v = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        }
        let mut figures = [0u64; Stats::LEN];
        figures.copy_from_slice(&x[..Stats::LEN]);
        (Stats::from_array(figures), x[Stats::LEN])
    };
    Ok(Ok(match w.kind {
        kind::PAGES => Reply::Pages(words()?),
        kind::SWA_PAGES => Reply::SwaPages(words()?),
        kind::DONE => Reply::Done,
        kind::LOCKED => Reply::Locked(w.a),
        kind::INSERTED => Reply::Inserted {
            cached: w.a,
            len: w.b,
            handle,
            locked,
        },
        kind::MATCHED => Reply::Matched {
            len: w.a,
            pages: words()?,
            handle,
        },
        kind::EVICTED => Reply::Evicted(w.a),
        kind::SESSION => Reply::Session {
            resident_tokens: w.a,
            idle_ms: w.b,
        },
        kind::STATS => {
            if payload.len() != STATS_BYTES {
                return Err(BadReply::StatsSize(payload.len()));
            }
            let (stats, sessions) = figures(payload);
            Reply::Stats { stats, sessions }
        }
        kind::MATCHED_WITH => {
            let mut pages = words()?;
            let mamba_state = if extra {
                Some(pages.pop().ok_or(BadReply::BadField("state word"))?)
            } else {
                None
            };
            Reply::MatchedWith {
                len: w.a,
                pages,
                handle,
                full_len: w.b,
                mamba_state,
            }
        }
        kind::INSERTED_WITH => Reply::InsertedWith {
            cached: w.a,
            len: w.b,
            handle,
            locked,
            mamba_exist: extra,
        },
        kind::EVICTED_COMPONENTS => Reply::EvictedComponents {
            tokens: w.a,
            swa_tokens: w.b,
            mamba_states: w.c,
        },
        kind::STATE => Reply::State {
            state: u32::try_from(w.a).map_err(|_| BadReply::BadField("state slot"))?,
        },
        kind::SWA_FREED => Reply::SwaFreed { n: w.a },
        kind::NAMESPACE => Reply::Namespace {
            id: u32::try_from(w.a).map_err(|_| BadReply::BadField("namespace id"))?,
        },
        kind::STATS_WITH => {
            let want = if extra { STATS_WITH_BYTES } else { STATS_BYTES };
            if payload.len() != want {
                return Err(BadReply::StatsSize(payload.len()));
            }
            let (stats, sessions) = figures(payload);
            let components = extra.then(|| {
                let mut c = [0u64; ComponentStats::LEN];
                for (v, b) in c.iter_mut().zip(payload[STATS_BYTES..].chunks_exact(8)) {
                    *v = u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                }
                ComponentStats::from_array(c)
            });
            Reply::StatsWith {
                stats,
                sessions,
                components,
            }
        }
        kind::BOUND => Reply::Bound { holders: w.a },
        kind::JOINED => Reply::Joined {
            joined: u32::try_from(w.a).map_err(|_| BadReply::BadField("ranks joined"))?,
            size: u32::try_from(w.b).map_err(|_| BadReply::BadField("group size"))?,
            board: match w.c {
                u64::MAX => None,
                c => Some(u32::try_from(c).map_err(|_| BadReply::BadField("group board"))?),
            },
        },
        k if store::is_store_kind(k) => Reply::Store(store::decode_reply(w, payload)?),
        k => return Err(BadReply::UnknownKind(k)),
    }))
}

#[cfg(test)]
mod tests;
