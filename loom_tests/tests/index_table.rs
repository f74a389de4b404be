//! The router index's block table (`radixd::index`'s `table.rs`, compiled
//! here from the shipped file): a slot is published bits first, then its
//! key with Release; a reader loads the key with Acquire, then the bits.
//! A reader that finds a key must see the membership bit stored with it,
//! also when the key sits past its home slot (a collision) and while the
//! writer adds another worker's bit to the first key.
//!
//! Checked by hand (LOOM_MAX_PREEMPTIONS=2 --release, each alone, then
//! reverted); unmutated: 23 executions on stock loom, 165 on the patched
//! one (155 on the path: the reader found the colliding key while the
//! writer ran; the floor counts those).
//!
//! | mutation | result |
//! |---|---|
//! | `claim` stores the key before the bits | caught: key 2 found without its bit |
//! | `claim` stores the key with Relaxed | caught on the patched loom: key 1 found without its bit (stock 0.7.2 missed it, nor with 3 or 4 preemptions: its load-load blind spot, see loom-0.7.2.patch) |
//! | `find` loads the key with Relaxed | caught on the patched loom, likewise (missed by stock 0.7.2) |
//!
//! The orderings rest on the argument in the code (Release key after the
//! bits, Acquire key before them); on x86 both compile to plain moves.
#![cfg(loom)]

#[path = "../../src/index/table.rs"]
#[allow(dead_code)]
mod table;

use loom_tests::explore;
use radixd_ipc::sync::Arc;
use table::{stored, Table, MIN_SLOTS};

/// Two keys with the same home slot in a table of `MIN_SLOTS`.
fn colliding(t: &Table) -> (u64, u64) {
    let k1 = stored(1);
    let k2 = (2..)
        .map(stored)
        .find(|&k| t.home(k) == t.home(k1))
        .expect("a collision among small keys");
    (k1, k2)
}

#[test]
fn a_found_key_comes_with_its_bits() {
    explore("index table publication", 70, || {
        let t = Arc::new(Table::new(MIN_SLOTS, 1));
        let (k1, k2) = colliding(&t);
        let writer = {
            let t = Arc::clone(&t);
            loom::thread::spawn(move || {
                t.claim(k1, 1);
                t.claim(k2, 2);
                let s = t.find(k1).expect("the writer sees its own key");
                t.set_bit(s, 3);
            })
        };
        // The reader: whatever it finds carries the bit claimed with it.
        // It looks three times, yielding in between: loom's exploration
        // does not reorder a lone load before a thread whose first access
        // is a load of its own (the writer's probe), so the yields give
        // the writer its turns.
        let mut found = false;
        for _ in 0..3 {
            if let Some(s) = t.find(k2) {
                found = true;
                assert_ne!(t.bits(s, 0) & 1 << 2, 0, "key 2 found without its bit");
                assert_eq!(t.bits(s, 0) & !(1 << 2), 0, "key 2 with another's bit");
            }
            if let Some(s) = t.find(k1) {
                assert_ne!(t.bits(s, 0) & 1 << 1, 0, "key 1 found without its bit");
            }
            loom::thread::yield_now();
        }
        writer.join().expect("writer");
        let s = t.find(k1).expect("key 1");
        assert_eq!(t.bits(s, 0), 1 << 1 | 1 << 3);
        // On the path: the reader found the colliding key while the writer
        // ran.
        found
    });
}
