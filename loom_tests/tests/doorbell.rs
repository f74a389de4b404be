//! Doorbell: no lost wake-up when a post races the sleeper. The loom futex
//! model has no timeout, so a lost wake-up is reported as a deadlock; a
//! sleep may still end without work (a ring meant for an earlier post bumps
//! the word), so the sleepers loop on `TimedOut` as real callers do.
//!
//! Mutations checked (made temporarily in `ipc/src/doorbell.rs`, run at
//! `LOOM_MAX_PREEMPTIONS=2`, then reverted): removing the SeqCst fence in
//! `ring`, or the one in `sleep`, or the re-check of `ready()` after the
//! announcement, deadlocks `no_lost_wakeup` and
//! `two_ringers_and_a_sleeper_that_times_out`. Each model asserts a floor
//! on its explored executions, counted outside `loom::model`.
#![cfg(loom)]

use loom_tests::explore;

use radixd_ipc::sync::{Arc, AtomicU32, Ordering};
use radixd_ipc::{Doorbell, HeapRing, Wake};

#[test]
fn no_lost_wakeup() {
    explore("no_lost_wakeup", 90, || {
        let ring = Arc::new(HeapRing::<u32>::new(2).unwrap());
        let bell = Arc::new(Doorbell::new());
        let (r, b) = (ring.clone(), bell.clone());
        let producer = loom::thread::spawn(move || {
            // SAFETY: this thread is the ring's only producer.
            let p = unsafe { r.producer() };
            for i in 0..2u32 {
                p.push(i).unwrap();
                b.ring();
            }
        });
        // SAFETY: this thread is the ring's only consumer.
        let c = unsafe { ring.consumer() };
        let (mut got, mut slept) = (0, false);
        while got < 2 {
            if let Some(v) = c.pop() {
                assert_eq!(v, got);
                got += 1;
                continue;
            }
            // Without timeouts this returns once rung (or work seen); a
            // wake-up meant for an earlier post may find nothing new.
            slept = true;
            let _: Wake = bell.sleep(|| c.has_work());
        }
        producer.join().unwrap();
        // On the path: the consumer went to sleep at least once.
        slept
    });
}

#[test]
fn two_ringers_and_a_sleeper_that_times_out() {
    explore("two_ringers_and_a_sleeper_that_times_out", 800, || {
        let work = Arc::new(AtomicU32::new(0));
        let bell = Arc::new(Doorbell::new());
        let ringers: Vec<_> = (0..2)
            .map(|_| {
                let (w, b) = (work.clone(), bell.clone());
                loom::thread::spawn(move || {
                    // Release: publishes the work; the sleeper's Acquire
                    // loads pair with it.
                    w.fetch_add(1, Ordering::Release);
                    b.ring();
                })
            })
            .collect();
        // Acquire: pairs with the ringers' Release increments.
        let done = || work.load(Ordering::Acquire) == 2;
        // The first nap times out whatever happens: its announcement and
        // withdrawal race the ringers.
        let _ = bell.sleep_timing_out(done);
        let mut slept = false;
        while !done() {
            slept = true;
            let _: Wake = bell.sleep(done);
        }
        for r in ringers {
            r.join().unwrap();
        }
        // On the path: the work was not all there after the first nap.
        slept
    });
}
