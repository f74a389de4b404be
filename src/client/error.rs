//! Why a client call failed: [`ClientError`], and [`ProtocolError`], the
//! ways the daemon or the segment can break the protocol. Apart from the
//! connection because every call, and the Python binding, matches on them.

use std::fmt;

use radixd_ipc::{ClaimError, OpenError, RegionError, RingError, ScratchError};

use crate::op::Rejection;
use crate::wire::BadReply;

/// Why a client call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// No segment of that name, or it cannot be opened.
    Open(OpenError),
    /// The segment was made by an incompatible radixd.
    VersionMismatch { expected: u64, found: u64 },
    /// The segment's layout differs from what its configuration implies.
    LayoutMismatch,
    /// The daemon did not finish starting in time.
    NotReady,
    /// Every client slot is taken.
    SegmentFull,
    /// The daemon died (or was replaced); reconnect.
    DaemonGone,
    /// The daemon did not answer in time.
    Timeout,
    /// The daemon refused the request; nothing changed.
    Rejected(Rejection),
    /// The request does not fit this client's scratch area.
    TooLarge { bytes: usize, room: usize },
    /// The daemon (or the segment) broke the protocol.
    Protocol(ProtocolError),
    /// A lock-free read kept colliding with the daemon's writes.
    Contended,
    /// An earlier call left this connection out of step with the daemon
    /// (the protocol violation named); every call fails so until a
    /// reconnect, which releases everything this client held.
    Broken(ProtocolError),
}

/// How the daemon or the segment broke the protocol, as a client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// A part of the segment lies outside the mapping.
    Region(RegionError),
    /// A ring's counters are corrupt.
    Ring(RingError),
    /// The scratch window of an answer lies outside the scratch area.
    Scratch(ScratchError),
    /// Claiming a slot failed in a way the protocol does not foresee.
    Claim(ClaimError),
    /// The engine could not be mapped read-only (`mprotect` failed).
    Protect(std::io::ErrorKind),
    /// An answer arrived out of sequence.
    OutOfSequence { expected: u64, got: u64 },
    /// An answer that does not decode.
    BadReply(BadReply),
    /// An answer of the wrong kind for its request.
    Unexpected(&'static str),
    /// The daemon answered nothing to a posted request.
    NoAnswer,
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Region(e) => write!(f, "segment region: {e}"),
            Self::Ring(e) => write!(f, "ring: {e}"),
            Self::Scratch(e) => write!(f, "answer window: {e}"),
            Self::Claim(e) => write!(f, "slot claim: {e}"),
            Self::Protect(k) => write!(f, "cannot map the engine read-only: {k}"),
            Self::OutOfSequence { expected, got } => {
                write!(f, "answer {got} for request {expected}")
            }
            Self::BadReply(e) => e.fmt(f),
            Self::Unexpected(kind) => write!(f, "unexpected answer {kind}"),
            Self::NoAnswer => f.write_str("no answer"),
        }
    }
}

impl std::error::Error for ProtocolError {}

impl From<ProtocolError> for ClientError {
    fn from(e: ProtocolError) -> Self {
        Self::Protocol(e)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open(e) => write!(f, "cannot open the segment: {e}"),
            Self::VersionMismatch { expected, found } => {
                write!(f, "segment speaks protocol {found}, this client {expected}")
            }
            Self::LayoutMismatch => write!(f, "segment layout does not match its configuration"),
            Self::NotReady => write!(f, "the daemon did not finish starting"),
            Self::SegmentFull => write!(f, "every client slot is taken"),
            Self::DaemonGone => write!(f, "the daemon is gone"),
            Self::Timeout => write!(f, "the daemon did not answer in time"),
            Self::Rejected(r) => r.fmt(f),
            Self::TooLarge { bytes, room } => {
                write!(
                    f,
                    "request needs {bytes} bytes of scratch, {room} available"
                )
            }
            Self::Protocol(m) => write!(f, "protocol error: {m}"),
            Self::Contended => write!(f, "the tree kept changing under the read; try again"),
            Self::Broken(e) => write!(f, "client connection broken ({e}); reconnect"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<Rejection> for ClientError {
    fn from(r: Rejection) -> Self {
        Self::Rejected(r)
    }
}
