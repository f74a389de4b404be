//! SPSC ring: no lost, duplicated or torn message across wrap-around, with
//! the message and its stamp in one entry and the producer checking for
//! room against the tail it saw last.
//!
//! Mutations checked (made temporarily in `ipc/src/ring.rs`, run at
//! `LOOM_MAX_PREEMPTIONS=2`, then reverted): the Release store of the stamp
//! in `push`, the Acquire load of the stamp in `pop`, the Release store of
//! `tail` in `pop`, or the Acquire load of `tail` in `push` made Relaxed:
//! each is caught by both models (loom reports the entry's concurrent read
//! and write). Skipping the reload of `tail` when the cached one says full
//! (pushing anyway) is caught as an overwritten message.
#![cfg(loom)]

use loom_tests::explore;

use radixd_ipc::sync::{yield_now, Arc};
use radixd_ipc::HeapRing;

/// Capacity 2, three messages: the third push wraps onto entry 0 and must
/// first see the consumer's `tail` move.
/// Returns whether the producer found the ring full (the wrap raced the
/// consumer): the models' path.
fn three_through_two(producer_views_per_push: bool) -> bool {
    let ring = Arc::new(HeapRing::<[u32; 2]>::new(2).unwrap());
    let producer_ring = ring.clone();
    let producer = loom::thread::spawn(move || {
        let mut full = false;
        // SAFETY: this thread is the ring's only producer; with fresh
        // views, each is dropped before the next is made.
        let mut p = unsafe { producer_ring.producer() };
        for i in 1..=3u32 {
            if producer_views_per_push {
                // As a client does, one view per round trip: the cursors
                // carry over through the header.
                // SAFETY: as above.
                p = unsafe { producer_ring.producer() };
            }
            let mut msg = [i, !i];
            while let Err(back) = p.push(msg) {
                full = true;
                msg = back;
                yield_now();
            }
        }
        full
    });
    // SAFETY: this thread is the ring's only consumer.
    let c = unsafe { ring.consumer() };
    let mut next = 1u32;
    while next <= 3 {
        match c.pop() {
            Some(msg) => {
                assert_eq!(msg, [next, !next], "lost, duplicated or torn message");
                next += 1;
            }
            None => yield_now(),
        }
    }
    let full = producer.join().unwrap();
    assert_eq!(c.pop(), None);
    assert_eq!(ring.counters(), (3, 3));
    full
}

#[test]
fn wraps_without_loss_duplication_or_tearing() {
    explore("wraps_without_loss_duplication_or_tearing", 80, || {
        three_through_two(false)
    });
}

#[test]
fn producer_views_resume_through_the_header() {
    explore("producer_views_resume_through_the_header", 80, || {
        three_through_two(true)
    });
}
