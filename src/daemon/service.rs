//! What serving keeps from one request to the next ([`Service`]): the
//! counters, the buffers reused so a warm daemon answers without
//! allocating, and what the daemon holds for every client (the pool's
//! binding, the groups and their boards, the node store). State only: the
//! serving itself is `drain`'s, one request's answer `answer`'s.

use std::time::Duration;

use super::figures::{FreeHolder, Tally};
use crate::binding::Binding;
use crate::group::Groups;
use crate::op;
use crate::shared::LiveStats;

/// What `drain` keeps from one request to the next: the counters and the
/// buffers it reuses, so a warm daemon answers without allocating.
pub(super) struct Service<'s> {
    pub(super) tally: Tally,
    pub(super) spare: op::Spare,
    /// Bytes of the answer being written to a reply window.
    pub(super) out: Vec<u8>,
    pub(super) allow_reset: bool,
    /// Longest an `alloc` waits for pages readers hold (see `drain`).
    pub(super) reader_wait: Duration,
    /// Which KV buffer the pool belongs to (`Request::Bind`).
    pub(super) binding: Binding<'s>,
    /// The ranks of tensor-parallel servers (`Request::Join`).
    pub(super) groups: Groups,
    /// The groups' boards, by group index (see `crate::group`).
    pub(super) boards: Vec<&'s radixd_ipc::Board>,
    /// Bytes of an answer being put on a board.
    pub(super) board_out: Vec<u8>,
    /// The node-wide KV store (`--store`).
    pub(super) store: Option<crate::store::StoreFile>,
    /// The segment's live figures (for [`FreeHolder`]).
    pub(super) live: &'s LiveStats,
    /// Who holds the pools' current free counts.
    pub(super) free: FreeHolder,
}
