//! The daemon's figures: what it counts while it serves ([`Tally`], in its
//! own memory, off every other process's cache lines), the publishing of
//! that and of the engine's figures to the [`LiveStats`] that
//! `radixd stat` reads, and who holds the pools' current free counts
//! ([`FreeHolder`]). Apart from the serving, which only counts.

use radixd_ipc::sync::Ordering;

use crate::engine::{Engine, FreeCounts};
use crate::shared::{LiveStats, FREE_HOLDER_NONE, HISTOGRAM_BUCKETS};

/// Publishes the engine's figures (and its components') for `radixd stat`.
pub(super) fn publish_figures<R: crate::engine::Region>(live: &LiveStats, engine: &Engine<R>) {
    live.set_engine(&engine.stats(), engine.sessions() as u64);
    if let Some(c) = engine.component_stats() {
        live.set_components(&c);
    }
}

/// What the daemon counts while it serves, in its own memory: nothing on
/// the request path writes a line another process reads. Published to
/// [`LiveStats`] between rounds ([`Tally::publish`]).
pub(super) struct Tally {
    pub(super) requests: u64,
    pub(super) rejected: u64,
    /// `alloc`s refused while readers held what they evicted.
    pub(super) held_by_readers: u64,
    pub(super) service_ns: [u64; HISTOGRAM_BUCKETS],
}

impl Tally {
    pub(super) fn new() -> Self {
        Self {
            requests: 0,
            rejected: 0,
            held_by_readers: 0,
            service_ns: [0; HISTOGRAM_BUCKETS],
        }
    }

    /// Stores the totals into the live figures (the daemon is their only
    /// writer, so plain stores suffice).
    pub(super) fn publish(&self, live: &LiveStats) {
        // Relaxed, all: statistics, read as a best-effort snapshot.
        live.requests.store(self.requests, Ordering::Relaxed);
        live.rejected.store(self.rejected, Ordering::Relaxed);
        live.held_by_readers
            .store(self.held_by_readers, Ordering::Relaxed);
        for (slot, &n) in live.service_ns.iter().zip(&self.service_ns) {
            slot.store(n, Ordering::Relaxed);
        }
    }
}

/// Who holds the pools' current free counts ([`LiveStats::free_holder`]):
/// a client whose counted answer carried them, until they change by
/// anything else (another client's request, the daemon's own reclaiming,
/// reaping and sweeping). The line is written only when the holder
/// changes: a daemon serving one scheduler writes it once.
pub(super) struct FreeHolder {
    /// The counts as the holder was last settled.
    seen: FreeCounts,
    holder: u64,
}

impl FreeHolder {
    /// Nobody holds the counts of `engine` yet.
    pub(super) fn new<R: crate::engine::Region>(live: &LiveStats, engine: &Engine<R>) -> Self {
        // Relaxed: no client keeps counts before a counted answer, whose
        // holder is stored with Release (`set`).
        live.free_holder.store(FREE_HOLDER_NONE, Ordering::Relaxed);
        Self {
            seen: engine.free_counts(),
            holder: FREE_HOLDER_NONE,
        }
    }

    /// After a request of client `who` (`slot | generation << 32`), the
    /// counts now `counts`: its counted answer carries them, so it holds
    /// them; any other change leaves them nobody's. Called before the
    /// answer is pushed.
    pub(super) fn answered(
        &mut self,
        live: &LiveStats,
        counts: FreeCounts,
        who: u64,
        counted: bool,
    ) {
        if counted {
            self.seen = counts;
            self.set(live, who);
        } else {
            self.settle(live, counts);
        }
    }

    /// After the daemon's own work: a change leaves the counts nobody's.
    pub(super) fn settle(&mut self, live: &LiveStats, counts: FreeCounts) {
        if counts != self.seen {
            self.seen = counts;
            self.set(live, FREE_HOLDER_NONE);
        }
    }

    fn set(&mut self, live: &LiveStats, who: u64) {
        if self.holder != who {
            self.holder = who;
            // Release: the client Acquire-loads it after its answer's pop,
            // which this store precedes.
            live.free_holder.store(who, Ordering::Release);
        }
    }
}
