//! Sequence lock: a reader never keeps a torn copy of what the writer
//! changes, however the two interleave.
//!
//! Mutations checked (made temporarily in `ipc/src/seqlock.rs`, run at
//! `LOOM_MAX_PREEMPTIONS=2`, then reverted): removing the Release fence in
//! `begin_write`, the Acquire fence in `read`, or the re-check of the
//! sequence after the copy: each is caught ("torn copy kept").
#![cfg(loom)]

use loom_tests::explore;

use radixd_ipc::sync::{Arc, AtomicU32, Ordering};
use radixd_ipc::SeqLock;

struct Shared {
    lock: SeqLock,
    a: AtomicU32,
    b: AtomicU32,
}

#[test]
fn a_reader_keeps_only_consistent_copies() {
    explore("a_reader_keeps_only_consistent_copies", 250, || {
        let shared = Arc::new(Shared {
            lock: SeqLock::new(),
            a: AtomicU32::new(0),
            b: AtomicU32::new(0),
        });
        let writer = {
            let s = shared.clone();
            loom::thread::spawn(move || {
                for v in 1..=2 {
                    s.lock.begin_write();
                    // Relaxed: the seqlock's fences order these.
                    s.a.store(v, Ordering::Relaxed);
                    s.b.store(v, Ordering::Relaxed);
                    s.lock.end_write();
                }
            })
        };
        // Relaxed: the seqlock's fences order these.
        let copy = || {
            (
                shared.a.load(Ordering::Relaxed),
                shared.b.load(Ordering::Relaxed),
            )
        };
        if let Some((a, b)) = shared.lock.read(3, copy) {
            assert_eq!(a, b, "torn copy kept");
        }
        writer.join().unwrap();
        assert_eq!(
            shared.lock.read(1, copy),
            Some((2, 2)),
            "a quiet lock reads at once"
        );
    });
}
