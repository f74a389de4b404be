//! The step board (`radixd_ipc::Board`): the ranks of a tensor-parallel
//! group take the steps the daemon published without a round trip, so a
//! step they keep must be the one published under that number, whole.
//!
//! - `a_reader_never_keeps_a_torn_or_later_step`: the writer publishes
//!   steps 0, 1 and 2 into a board of two slots (step 2 reuses step 0's
//!   slot) while a reader takes step 0, then step 1; whatever it keeps is
//!   that step's key, head and payload, never part of another's.
//! - `a_counted_step_is_there_whole`: a reader that sees step 0 counted
//!   and the writer done takes it (a publish never leaves a counted step
//!   unreadable).
//!
//! Checked by hand (each mutation made alone, run with
//! LOOM_MAX_PREEMPTIONS=2 --release, then reverted):
//!
//! | mutation                                              | torn or later | counted |
//! |-------------------------------------------------------|---------------|---------|
//! | `take` skips the step number check                    | caught        | passes  |
//! | `take` keeps its copy without the version's re-check  | caught        | passes  |
//! | `Version::begin` without its Release fence            | caught        | passes  |
//! | `published` stored Relaxed in `publish`               | passes        | caught  |
//! | `published` loaded Relaxed in `published()`           | passes        | caught  |
#![cfg(loom)]

use loom_tests::explore;

use radixd_ipc::sync::Arc;
use radixd_ipc::{Board, BOARD_DATA, HEAD_WORDS};

/// What step `s` carries: every word and byte says `s`.
fn publish(b: &Board, s: u64) {
    assert!(b.publish(s, [s, s], [s; HEAD_WORDS], &[s as u8; BOARD_DATA]));
}

/// Takes step `s`; a kept step must be all `s`. Returns whether it was
/// refused although counted (raced a rewrite).
fn take(b: &Board, s: u64) -> bool {
    let counted = s < b.published();
    let mut out = Vec::new();
    match b.take(s, &mut out) {
        Some(t) => {
            assert_eq!(t.key, [s, s], "step {s}: another step's key");
            assert_eq!(t.head, [s; HEAD_WORDS], "step {s}: a torn head");
            assert_eq!(out, vec![s as u8; BOARD_DATA], "step {s}: a torn payload");
            false
        }
        None => counted,
    }
}

#[test]
fn a_reader_never_keeps_a_torn_or_later_step() {
    explore("a_reader_never_keeps_a_torn_or_later_step", 20, || {
        let b = Arc::new(Board::new());
        let writer = {
            let b = b.clone();
            loom::thread::spawn(move || {
                for s in 0..3 {
                    publish(&b, s);
                }
            })
        };
        let raced = take(&b, 0) | take(&b, 1);
        writer.join().unwrap();
        // Step 0's slot holds step 2 now; steps 1 and 2 are there.
        let mut out = Vec::new();
        assert!(b.take(0, &mut out).is_none());
        assert!(b.take(1, &mut out).is_some() && b.take(2, &mut out).is_some());
        raced
    });
}

#[test]
fn a_counted_step_is_there_whole() {
    explore("a_counted_step_is_there_whole", 1, || {
        let b = Arc::new(Board::new());
        let writer = {
            let b = b.clone();
            loom::thread::spawn(move || publish(&b, 0))
        };
        let seen = b.published() > 0;
        if seen {
            // The writer wrote nothing after counting step 0: it must be
            // there, whole.
            let mut out = Vec::new();
            let t = b.take(0, &mut out);
            assert_eq!(
                t.map(|t| t.key),
                Some([0, 0]),
                "a counted step is not there"
            );
        }
        writer.join().unwrap();
        seen
    });
}
