//! Reader epochs (`radixd_ipc::epoch`) as the daemon and the clients run
//! them: the writer unlinks a record, advances with the daemon's policy
//! (`Reclaimer::try_advance`: the true epoch republished, every reader in
//! the way past `expire_after` expired in one pass) and reuses the record
//! (writes POISON over it) once `Reclaimer::reusable` (the two-epoch rule,
//! `epoch::reusable`) says so; the reader reads as `Client::peek` does,
//! through `ReaderSlot::read` (pin, walk, unpin, walk again if expired).
//!
//! - `no_reader_sees_a_reused_record`: a trusted walk never reads POISON.
//! - `an_expired_reader_distrusts_its_copy`: the writer expires the reader
//!   in its way and reuses the record; a walk that may have read POISON is
//!   expired, and `read` walks again.
//! - `a_dead_readers_slot_is_cleared`: a reader that dies pinned holds
//!   the epoch back until its slot is cleared, and not after.
//!
//! Mutations tried (docs/modelcheck.md has the table): the SeqCst fence in
//! `pin` or in `advance_or_report`, `reusable` at `tag + 1`, `read`
//! ignoring `unpin`'s answer, `unpin` ignoring `EXPIRED`, `clear` doing
//! nothing.
//!
//! Each model asserts a floor on the executions that reached its path.
#![cfg(loom)]

use loom_tests::explore;
use std::time::{Duration, Instant};

use radixd_ipc::epoch::{Collector, EpochClock, ReaderSlot, Reclaimer};
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};

const LIVE: u32 = 10;
const NEXT: u32 = 11;
const POISON: u32 = 0xdead;

struct Shared {
    clock: EpochClock,
    readers: [ReaderSlot; 1],
    /// Which record the structure links to.
    link: AtomicU32,
    records: [AtomicU32; 2],
}

impl Shared {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            clock: EpochClock::new(),
            readers: [ReaderSlot::new()],
            link: AtomicU32::new(0),
            records: [AtomicU32::new(LIVE), AtomicU32::new(NEXT)],
        })
    }

    /// The reader's walk: follow the link, copy the record; returns which
    /// record and what it held.
    fn walk(&self) -> (u32, u32) {
        // Relaxed: the epoch protocol's fences order the walk.
        let at = self.link.load(Ordering::Relaxed);
        (at, self.records[at as usize].load(Ordering::Relaxed))
    }

    /// The writer: unlink record 0 (linking 1), then advance as the
    /// engine's reclaim does (`Reclaimer::try_advance`, the daemon's
    /// policy, at most twice), expiring a reader in the way at first sight
    /// when `expire`, never otherwise, and reuse record 0 if
    /// `Reclaimer::reusable` says its grace period is over. Returns whether
    /// it reused it.
    fn write(&self, expire: bool) -> bool {
        let c = Collector::new(&self.clock, &self.readers);
        let expire_after = if expire {
            Duration::ZERO
        } else {
            Duration::MAX
        };
        let mut policy = Reclaimer::new(self.readers.len(), expire_after);
        // Relaxed: the collector's SeqCst fence orders the unlink before
        // its scan.
        self.link.store(1, Ordering::Relaxed);
        let tag = policy.epoch();
        let now = Instant::now();
        for _ in 0..2 {
            if !policy.try_advance(&c, || now) {
                break;
            }
        }
        if policy.reusable(tag) {
            // Relaxed: what orders it against readers is the protocol.
            self.records[0].store(POISON, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// On the path: the reader walked to record 0 (before the unlink) and the
/// writer reused it.
#[test]
fn no_reader_sees_a_reused_record() {
    explore("no_reader_sees_a_reused_record", 8, || {
        let s = Shared::new();
        let w = {
            let s = s.clone();
            loom::thread::spawn(move || s.write(false))
        };
        let (at, v) = s.readers[0]
            .read(&s.clock, 1, || s.walk())
            .expect("nobody expires in this model");
        assert_ne!(v, POISON, "a pinned reader read a reused record");
        w.join().unwrap() && at == 0
    });
}

/// The reader reads as `Client::peek` does (`ReaderSlot::read`, two
/// tries). On the path: its first walk was expired (it walked again) and
/// the writer reused the record.
#[test]
fn an_expired_reader_distrusts_its_copy() {
    explore("an_expired_reader_distrusts_its_copy", 30, move || {
        let s = Shared::new();
        let w = {
            let s = s.clone();
            loom::thread::spawn(move || s.write(true))
        };
        let mut walks = 0;
        let read = s.readers[0].read(&s.clock, 2, || {
            walks += 1;
            s.walk()
        });
        if let Some((_, v)) = read {
            assert_ne!(v, POISON, "a reader kept a copy taken after its expiry");
        }
        w.join().unwrap() && walks == 2
    });
}

/// On the path: the dead reader pinned before the scans, held the epoch
/// back, and only clearing its slot let the record be reused.
#[test]
fn a_dead_readers_slot_is_cleared() {
    explore("a_dead_readers_slot_is_cleared", 10, || {
        let s = Shared::new();
        let dead = {
            let s = s.clone();
            loom::thread::spawn(move || {
                // Pins, reads, and dies without unpinning.
                s.readers[0].pin(&s.clock);
                s.walk()
            })
        };
        let c = Collector::new(&s.clock, &s.readers);
        // The daemon's policy, never expiring: only clearing frees the way.
        let mut policy = Reclaimer::new(s.readers.len(), Duration::MAX);
        let now = Instant::now();
        // Relaxed: ordered by the collector's fence.
        s.link.store(1, Ordering::Relaxed);
        let tag = policy.epoch();
        policy.try_advance(&c, || now);
        policy.try_advance(&c, || now);
        let (_, walked) = dead.join().unwrap(); // the reader is found dead
        assert_ne!(walked, POISON);
        let held = !policy.reusable(tag);
        if held {
            // It pinned before the scans: it holds the epoch back...
            assert!(!policy.try_advance(&c, || now) || !policy.try_advance(&c, || now));
            // ...until its slot is cleared.
            c.clear(0);
        }
        while !policy.reusable(tag) {
            assert!(
                policy.try_advance(&c, || now),
                "a cleared slot blocks nothing"
            );
        }
        held
    });
}
