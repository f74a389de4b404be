//! KV events: the daemon wakes the publisher thread only when it announced
//! a park (`radixd::events`'s `wake.rs`, compiled here from the shipped
//! file), and no push is left behind a park. The queue is a counter of
//! pushes (pushed and looked at Relaxed: only the two SeqCst fences of
//! `wake.rs` order them, as they must for crossbeam's queue too); loom's
//! `park` has no timeout, so a lost wake-up is reported as a deadlock.
//!
//! Mutations checked (made temporarily in `src/events/wake.rs`, run at
//! `LOOM_MAX_PREEMPTIONS=2 --release`, then reverted): removing the fence
//! in `wake`, or the one in `park`, or storing `asleep` after the look at
//! the queue instead of before, deadlocks `no_push_is_left_behind_a_park`.
//! Unmutated: 134 executions, 120 on the path (the publisher parked at
//! least once; the floor counts those).
#![cfg(loom)]

#[path = "../../src/events/wake.rs"]
#[allow(dead_code)]
mod wake;

use loom_tests::explore;
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};
use wake::Sleep;

/// Pushes the daemon makes.
const PUSHES: u32 = 2;

#[test]
fn no_push_is_left_behind_a_park() {
    explore("events wake", 100, || {
        let queue = Arc::new(AtomicU32::new(0));
        let sleep = Arc::new(Sleep::new());
        // The publisher: takes what was pushed, parks when it finds
        // nothing new, until it has taken every push; whether it parked.
        // (The daemon is this thread, not a spawned one: loom cannot
        // unpark a thread blocked in `join`.)
        let publisher = {
            let (queue, sleep) = (queue.clone(), sleep.clone());
            loom::thread::spawn(move || {
                let (mut taken, mut parked) = (0, false);
                while taken < PUSHES {
                    // Relaxed: the look; `park`'s fence orders it after
                    // the store of `asleep`.
                    let seen = queue.load(Ordering::Relaxed);
                    if seen > taken {
                        taken = seen;
                        continue;
                    }
                    parked = true;
                    // Relaxed: as above.
                    sleep.park(
                        || queue.load(Ordering::Relaxed) == taken,
                        loom::thread::park,
                    );
                }
                parked
            })
        };
        for _ in 0..PUSHES {
            // Relaxed: the push; `wake`'s fence orders it before the look
            // at `asleep`.
            queue.fetch_add(1, Ordering::Relaxed);
            sleep.wake(|| publisher.thread().unpark());
        }
        // On the path: the publisher announced a park at least once.
        publisher.join().unwrap()
    });
}
