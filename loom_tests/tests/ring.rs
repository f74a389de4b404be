//! SPSC ring: no lost, duplicated or torn message across wrap-around.
//!
//! Mutations checked (made temporarily in `ipc/src/ring.rs`, run at
//! `LOOM_MAX_PREEMPTIONS=2`, then reverted): the Release store of `head`
//! in `push`, the Acquire load of `head` in `pop`, or the Release store of
//! `tail` in `pop` made Relaxed: each is caught (loom reports the slot's
//! concurrent read and write).
#![cfg(loom)]

use loom_tests::explore;

use radixd_ipc::sync::{yield_now, Arc};
use radixd_ipc::HeapRing;

#[test]
fn wraps_without_loss_duplication_or_tearing() {
    explore("wraps_without_loss_duplication_or_tearing", 80, || {
        // Capacity 2, three messages: the third push wraps onto slot 0.
        let ring = Arc::new(HeapRing::<[u32; 2]>::new(2).unwrap());
        let producer_ring = ring.clone();
        let producer = loom::thread::spawn(move || {
            // SAFETY: this thread is the ring's only producer.
            let p = unsafe { producer_ring.producer() };
            for i in 1..=3u32 {
                let mut msg = [i, !i];
                while let Err(back) = p.push(msg) {
                    msg = back;
                    yield_now();
                }
            }
        });
        // SAFETY: this thread is the ring's only consumer.
        let c = unsafe { ring.consumer() };
        let mut next = 1u32;
        while next <= 3 {
            match c.pop().unwrap() {
                Some(msg) => {
                    assert_eq!(msg, [next, !next], "lost, duplicated or torn message");
                    next += 1;
                }
                None => yield_now(),
            }
        }
        producer.join().unwrap();
        assert_eq!(c.pop(), Ok(None));
    });
}
