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

mod board;
mod call;
mod payload;
mod record;
mod reply;
mod request;
mod store;

pub use board::{digest, reply_of_words, reply_words};
pub use call::{encode_request, reply_need, Call};
pub use payload::{AnchorWords, EncodedRequest, Payload, ScratchWindow};
pub use record::{alloc_count, asks_lock, handle_locked_by, WireReply, WireRequest};
pub use reply::{decode_reply, encode_reply, inline_payload};
pub use request::decode_request;
pub use store::MAX_BATCH as MAX_STORE_BATCH;

// The records' vocabulary, as `store` names it (`super::opcode`).
use record::{kind, opcode, STATS_BYTES, STATS_WITH_BYTES};

use crate::op::{ErrorKind, Rejection};

// What the unit tests reach through `use super::*`, as when they were
// inline in one file.
#[cfg(test)]
use {
    crate::engine::{Anchor, ComponentStats, Stats},
    crate::group::Join,
    crate::op::{Reply, Request, Spare, StoreRequest},
    radixd_ipc::Scratch,
    record::{FLAG_EXTRA, FLAG_INLINE, FLAG_LOCK},
    reply::utf8_prefix,
};

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

/// Longest pool identity a `bind` carries, in bytes of its canonical form
/// (`crate::binding` checks what the bytes say).
pub const MAX_POOL_IDENTITY: usize = 1024;

/// A [`Rejection`] of kind `Malformed`: how every decoder here refuses.
fn malformed(message: impl Into<String>) -> Rejection {
    Rejection::new(ErrorKind::Malformed, message)
}

#[cfg(test)]
mod hint_tests;
#[cfg(test)]
mod step_tests;
#[cfg(test)]
mod tests;

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
