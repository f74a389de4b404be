//! The pools' free counts a client keeps from the answers that carry them
//! ([`Client::free_counts`]): once asked for, every call that may change
//! them goes as a counted request ([`Request::Counted`]), and the counts
//! its answer carries answer the next `free_counts` without a round trip
//! while they are still current. Apart from the calls, which only say what
//! they send: this is the bookkeeping around every one of them.
//!
//! Current means: no call of this client since changed them unseen (a
//! call whose answer carries none forgets them), and, for a client alone,
//! the segment names it as the holder of the current counts
//! ([`LiveStats::free_holder`], which the daemon moves when anyone else
//! changes them). A rank of a group does not look there: its ranks must
//! decide alike, so they keep what their steps answered (the group's own
//! calls are all counted); another client's changes show at its next
//! counted step.

use radixd_ipc::sync::Ordering;
use radixd_ipc::Offset;

use super::{unexpected, Client, ClientError};
use crate::engine::FreeCounts;
use crate::op::{Reply, Request};
use crate::shared::LiveStats;
use crate::wire::Call;

/// What a client knows of the pools' free counts.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FreeTrack {
    /// Calls that change the counts go counted (set by the first
    /// [`Client::free_counts`]).
    on: bool,
    /// The counts the last answer that carried them said, while no call
    /// of this client changed them since.
    kept: Option<FreeCounts>,
}

/// Whether `call` leaves the pools' free counts as they were: reads, locks
/// (a lock keeps cached pages, it frees or takes none) and what is not the
/// pools' (namespace ids, the store).
fn keeps_counts(call: &Call<'_>) -> bool {
    match call {
        Call::Match(..)
        | Call::MatchWith(..)
        | Call::MatchAt { .. }
        | Call::Walk(_)
        | Call::Lock(_)
        | Call::Unlock(_)
        | Call::LockPaired(..)
        | Call::SwaPages(_)
        | Call::Stats
        | Call::StatsWith
        | Call::SessionStatus(_)
        | Call::Validate
        | Call::Namespace(_)
        | Call::Store(_) => true,
        Call::Namespaced(_, request) | Call::Hinted(_, request) => keeps_counts(&Call::of(request)),
        _ => false,
    }
}

/// Whether `call` changes the counts and can go counted (see
/// [`Request::takes_count`]).
fn goes_counted(call: &Call<'_>) -> bool {
    if let Call::Hinted(_, request) = call {
        return goes_counted(&Call::of(request));
    }
    !keeps_counts(call)
        && !matches!(
            call,
            Call::Counted(_) | Call::InsertAt { .. } | Call::Reset | Call::Bind(_) | Call::Join(_)
        )
}

impl Client {
    /// What each of the daemon's pools has free ([`FreeCounts`]), as a
    /// scheduler sizes its next allocation by. Answered from the counts
    /// the last answer that carried them said while they are current (see
    /// the module doc), else asked (one round trip, a counted `stats`).
    ///
    /// The first call turns the keeping on: from then on every call of
    /// this client that may change the counts goes as a counted request,
    /// whose answer carries them. A rank of a group keeps what its steps
    /// answered (as every rank does alike), never looking at the segment.
    pub fn free_counts(&mut self) -> Result<FreeCounts, ClientError> {
        self.free.on = true;
        if let Some(kept) = self.free.kept {
            if self.group.is_some() || self.holds_free_counts() {
                return Ok(kept);
            }
        }
        let stats = Request::Stats;
        match self.send(Call::Counted(&stats))? {
            Reply::Counted { free, .. } => Ok(free),
            other => Err(unexpected(other)),
        }
    }

    /// Whether the segment names this client as the holder of the
    /// current counts.
    fn holds_free_counts(&self) -> bool {
        let me = u64::from(self.slot) | u64::from(self.generation) << 32;
        self.segment
            .get::<LiveStats>(Offset::new(self.layout.live_stats))
            // Acquire: pairs with the daemon's Release store, made before
            // it pushed the answer this client's counts came with.
            .is_ok_and(|live| live.free_holder.load(Ordering::Acquire) == me)
    }

    /// Whether `call` goes counted (see [`Client::free_counts`]).
    pub(super) fn counts(&self, call: &Call<'_>) -> bool {
        self.free.on && goes_counted(call)
    }

    /// Keeps the counts `answer` (to `call`, sent counted when `counted`)
    /// carries, or forgets them if `call` may have changed them unseen;
    /// answers what the caller asked: the answer itself, unwrapped when
    /// the count was this client's own idea.
    pub(super) fn settle(
        &mut self,
        call: &Call<'_>,
        counted: bool,
        answer: Result<Reply, ClientError>,
    ) -> Result<Reply, ClientError> {
        match answer {
            Ok(Reply::Counted { reply, free }) => {
                self.free.kept = Some(free);
                if counted {
                    Ok(*reply)
                } else {
                    Ok(Reply::Counted { reply, free })
                }
            }
            other => {
                if !keeps_counts(call) {
                    self.free.kept = None;
                }
                other
            }
        }
    }

    /// Forgets the kept counts (a batch or a give-back changed them).
    pub(super) fn forget_free_counts(&mut self) {
        self.free.kept = None;
    }

    /// Forgets the kept counts if any of `requests` may change them.
    pub(super) fn settle_batch(&mut self, requests: &[Request]) {
        if !requests.iter().all(|r| keeps_counts(&Call::of(r))) {
            self.forget_free_counts();
        }
    }
}
