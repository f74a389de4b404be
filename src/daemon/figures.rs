//! The daemon's figures: what it counts while it serves ([`Tally`], in its
//! own memory, off every other process's cache lines) and the publishing
//! of that and of the engine's figures to the [`LiveStats`] that
//! `radixd stat` reads. Apart from the serving, which only counts.

use radixd_ipc::sync::Ordering;

use crate::engine::Engine;
use crate::shared::{LiveStats, HISTOGRAM_BUCKETS};

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
