//! The two fixed records a ring carries, [`WireRequest`] and [`WireReply`],
//! and the numbers in their fields: op codes, reply kinds, flag bits. This
//! is what both ends agree on byte for byte; the codecs beside it only fill
//! and check these fields.

use std::mem::size_of;

use super::INLINE_BYTES;
use crate::engine::{ComponentStats, Stats};

/// Operation codes.
pub(super) mod opcode {
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
    pub const ALLOC_PAIRED: u32 = 28;
    pub const LOCK_PAIRED: u32 = 29;
    pub const INSERT_PAIRED: u32 = 30;
    pub const ALLOC_STATES: u32 = 31;
    pub const FREE_STATES: u32 = 32;
    pub const EVICT_LEAF: u32 = 33;
    pub const STORE_NAMESPACE: u32 = 40;
    pub const STORE_RESERVE: u32 = 41;
    pub const STORE_COMMIT: u32 = 42;
    pub const STORE_ABORT: u32 = 43;
    pub const STORE_CLEAR: u32 = 44;
    pub const NAMESPACE: u32 = 25;
}

/// Reply kinds.
pub(super) mod kind {
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
    pub const PAGES_PAIRED: u32 = 19;
    pub const LOCKED_PAIRED: u32 = 20;
    pub const INSERTED_PAIRED: u32 = 21;
    pub const STATES: u32 = 22;
    pub const EVICTED_LEAF: u32 = 23;
    pub const STORE_NAMESPACE: u32 = 40;
    pub const STORE_RESERVED: u32 = 41;
    pub const STORE_DONE: u32 = 42;
    pub const NAMESPACE: u32 = 17;
}

/// `flags` bit: the request asks for a lock.
pub(super) const FLAG_LOCK: u32 = 1;
/// `flags` bit of a reply: `c` holds a handle.
pub(super) const FLAG_HANDLE: u32 = 2;
/// `flags` bit of a reply: the payload is the first `payload_len` bytes of
/// `inline`, not in the reply window.
pub(super) const FLAG_INLINE: u32 = 4;
/// `flags` bit of a reply: the hybrid extra is there (`MatchedWith`: the
/// payload's last word is the state slot; `InsertedWith`: `mamba_exist`;
/// `StatsWith`: the components' figures follow the engine's).
pub(super) const FLAG_EXTRA: u32 = 8;

/// `flags` bit of a request: the op runs in a namespace whose name is the
/// payload's last `aux[0]` bytes (after everything the op itself carries).
pub(super) const FLAG_NS: u32 = 16;

/// `flags` bit of a request: answer the pools' free counts after it too
/// (`Request::Counted`); of a reply: they are the payload's last
/// [`FREE_BYTES`], after the answer's own.
pub(super) const FLAG_COUNTED: u32 = 32;

/// `flags` bit of a request: an insert's hints for the eviction policy
/// (`Request::Hinted`) are the last [`HINTS_BYTES`] of its payload, after
/// everything the insert itself carries (and before a namespace's name):
/// the priority and `inserted_len`, two words of 8 each, low word first.
pub(super) const FLAG_HINTS: u32 = 64;

/// Bytes of an insert's hints on the wire.
pub(super) const HINTS_BYTES: usize = 16;

/// Bytes of the free counts a counted reply carries (three words of 8).
pub(super) const FREE_BYTES: usize = 24;

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

/// The page count an `alloc` (or `alloc_paired`) record asks for
/// (`None`: not an `alloc`).
pub fn alloc_count(record: &WireRequest) -> Option<u64> {
    matches!(record.op, opcode::ALLOC | opcode::ALLOC_PAIRED).then_some(record.arg)
}

/// One request record in a ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireRequest {
    /// Chosen by the client, echoed in the reply.
    pub seq: u64,
    pub op: u32,
    pub flags: u32,
    /// `n` of alloc (and of alloc_paired and alloc_states), handle of
    /// lock/unlock (and of lock_paired), tokens of evict (and of
    /// evict_components), `swa_evicted` of insert_with (and of
    /// insert_paired), the slot of free_state; for the anchored ops the
    /// anchor's node as a handle (index | generation << 32).
    pub arg: u64,
    /// Payload window in the request scratch, in bytes.
    pub payload_off: u32,
    pub payload_len: u32,
    /// The payload is `n_tokens` tokens, `n_pages` pages, then the session
    /// id, or for the anchored ops the anchor's words: matched pages, and
    /// for `MatchAt` the next page's hash when the reader had one; for
    /// `InsertWith` the state slot when there is one; for `InsertPaired`
    /// the tail's page count, then the state slot when there is one; for
    /// `EvictComponents` `swa_tokens` and `mamba_states` (two words each,
    /// low first). `LockPaired`'s pages and `FreeStates`'s slots travel
    /// as pages.
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
    /// 0 for success, else an [`ErrorKind`](crate::op::ErrorKind) code.
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

/// Size of the stats answer.
pub(super) const STATS_BYTES: usize = (Stats::LEN + 1) * 8;

/// Size of the stats-with-components answer with the components' figures.
pub(super) const STATS_WITH_BYTES: usize = STATS_BYTES + ComponentStats::LEN * 8;
