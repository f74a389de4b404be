//! The daemon's side of the segment's reader table: [`ShmGrace`], the
//! engine's [`Grace`] over the readers' epochs. Built under loom too
//! (`loom_tests` drives it against the real engine and the real reader);
//! `ShmGrace::new` (in `shared`) finds the table in a segment.

use std::ptr::NonNull;
use std::time::Instant;

use radixd_ipc::{Collector, EpochClock, ReaderSlot, Reclaimer};

use crate::engine::Grace;

/// The readers' grace period over the segment's reader epochs (daemon
/// side): what the engine asks before it reuses a freed node or an evicted
/// page. The policy (the true epoch kept privately, every reader in the way
/// for longer than `expire_after` expired in one pass) is
/// [`radixd_ipc::Reclaimer`]'s; an expired reader learns so when it leaves
/// and throws its copy away (`Client::peek` then reads again).
pub struct ShmGrace {
    table: ReaderTable,
    policy: Reclaimer,
}

/// Where the segment's epoch clock and reader slots are.
struct ReaderTable {
    clock: NonNull<EpochClock>,
    readers: NonNull<ReaderSlot>,
    count: usize,
}

impl ReaderTable {
    fn collector(&self) -> Collector<'_> {
        // SAFETY: both point at memory that outlives the `ShmGrace` holding
        // this (the contract of `ShmGrace::over`); the slots were a slice
        // of `count` elements, and shared references to atomics are sound
        // while other processes write them.
        let (clock, readers) = unsafe {
            (
                self.clock.as_ref(),
                std::slice::from_raw_parts(self.readers.as_ptr(), self.count),
            )
        };
        Collector::new(clock, readers)
    }
}

impl ShmGrace {
    /// The grace period over `clock` and `readers` (reset: epoch 1, every
    /// slot idle), expiring readers that block it for longer than
    /// `expire_after`.
    ///
    /// # Safety
    ///
    /// `clock` and `readers` must outlive the value (they lie in a segment
    /// the daemon unmaps only after dropping its engine, which owns this),
    /// and only one collector may exist for them.
    pub unsafe fn over(
        clock: &EpochClock,
        readers: &[ReaderSlot],
        expire_after: std::time::Duration,
    ) -> Self {
        clock.reset();
        for reader in readers {
            reader.clear();
        }
        Self {
            table: ReaderTable {
                clock: NonNull::from(clock),
                readers: NonNull::from(readers).cast(),
                count: readers.len(),
            },
            policy: Reclaimer::new(readers.len(), expire_after),
        }
    }
}

// SAFETY: the pointers lead into a shared mapping, not into thread-local
// data; the value is moved to, and used by, one thread at a time.
unsafe impl Send for ShmGrace {}

impl Grace for ShmGrace {
    fn epoch(&self) -> u64 {
        self.policy.epoch()
    }

    fn try_advance(&mut self) -> bool {
        self.policy
            .try_advance(&self.table.collector(), Instant::now)
    }

    fn reusable(&self, tag: u64) -> bool {
        self.policy.reusable(tag)
    }
}

/// One grace period shared by the daemon's two writers, the engine and the
/// store: both retire records that the same readers (one announcement per
/// client slot) may copy, and there is one collector per reader table, so
/// they advance and consult one [`ShmGrace`]. Used by one thread (the
/// daemon's), so the lock is never contended.
#[derive(Clone)]
pub struct SharedGrace(std::sync::Arc<std::sync::Mutex<ShmGrace>>);

impl SharedGrace {
    /// Shares `grace`.
    pub fn new(grace: ShmGrace) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(grace)))
    }

    fn with<T>(&self, f: impl FnOnce(&mut ShmGrace) -> T) -> T {
        // A panic while holding the lock left the policy consistent (its
        // methods do not unwind half way through a change), so a poisoned
        // lock is used as is.
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }
}

impl Grace for SharedGrace {
    fn epoch(&self) -> u64 {
        self.with(|g| g.epoch())
    }

    fn try_advance(&mut self) -> bool {
        self.with(|g| g.try_advance())
    }

    fn reusable(&self, tag: u64) -> bool {
        self.with(|g| g.reusable(tag))
    }
}
