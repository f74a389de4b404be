//! Reader epochs (`radixd_ipc::epoch`): the writer unlinks a record,
//! retires it, advances the epoch as far as readers allow and reuses the
//! record (writes POISON over it) once `reusable` says so; a reader walks
//! from the link to a record between `pin` and `unpin`.
//!
//! - `no_reader_sees_a_reused_record`: a trusted walk never reads POISON.
//!   Fails when the `SeqCst` fence in `ReaderSlot::pin` or the one in
//!   `Collector::try_advance` is removed (the scan misses a reader that
//!   still read the old link), or when `reusable` allows `t + 1`.
//! - `an_expired_reader_distrusts_its_copy`: the writer expires a reader
//!   that blocks it and reuses the record; the reader may read POISON but
//!   then `unpin` says so. Fails when `unpin` ignores the expiry bit, or
//!   when `try_advance` counts an expired reader's old epoch as blocking
//!   (then the model proves nothing: it asserts the reuse happens in some
//!   interleaving).
//! - `a_dead_readers_slot_is_cleared`: a reader that dies pinned holds
//!   the epoch back until its slot is cleared, and not after. Fails when
//!   `Collector::clear` leaves the slot as it was.
//!
//! Checked by hand (LOOM_MAX_PREEMPTIONS=2): removing the fence in `pin`
//! fails the first two models, removing the one in `try_advance` fails the
//! first two, `reusable` at `t + 1` fails the first, and an `unpin` that
//! ignores `EXPIRED` fails the second.
//!
//! Each model asserts a floor on the interleavings loom explored, so one
//! that stops exploring fails instead of passing vacuously.
#![cfg(loom)]

use loom_tests::explore;
use radixd_ipc::epoch::{Collector, EpochClock, ReaderSlot};
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

    /// The writer: unlink record 0 (linking 1), then advance as far as
    /// readers allow (expiring blockers when `expire`), and reuse record 0
    /// if its grace period is over. Returns whether it reused it.
    fn write(&self, expire: bool) -> bool {
        let c = Collector::new(&self.clock, &self.readers);
        // Relaxed: the collector's SeqCst fence orders the unlink before
        // its scan.
        self.link.store(1, Ordering::Relaxed);
        let tag = c.epoch();
        for _ in 0..2 {
            if let Err(blocked) = c.try_advance() {
                if !(expire && c.expire(blocked) && c.try_advance().is_ok()) {
                    break;
                }
            }
        }
        if c.reusable(tag) {
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
        // Relaxed: ordered by the collector's fence.
        s.link.store(1, Ordering::Relaxed);
        let tag = c.epoch();
        let _ = c.try_advance();
        let _ = c.try_advance();
        let (_, walked) = dead.join().unwrap(); // the reader is found dead
        assert_ne!(walked, POISON);
        let held = !c.reusable(tag);
        if held {
            // It pinned before the scans: it holds the epoch back...
            assert!(c.try_advance().is_err() || c.try_advance().is_err());
            // ...until its slot is cleared.
            c.clear(0);
        }
        while !c.reusable(tag) {
            c.try_advance().expect("a cleared slot blocks nothing");
        }
        held
    });
}
