//! Doorbell: no lost wake-up when the producer posts exactly as the consumer
//! goes to sleep. The loom futex model has no timeout, so a lost wake-up is
//! reported as a deadlock.
#![cfg(loom)]

use radixd_ipc::sync::Arc;
use radixd_ipc::{Doorbell, HeapRing, Wake};

#[test]
fn no_lost_wakeup() {
    loom::model(|| {
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
        let mut got = 0;
        while got < 2 {
            if let Some(v) = c.pop().unwrap() {
                assert_eq!(v, got);
                got += 1;
                continue;
            }
            // Without timeouts this only returns once rung (or work seen).
            assert_eq!(bell.sleep(|| c.has_work()), Wake::Ready);
        }
        producer.join().unwrap();
    });
}
