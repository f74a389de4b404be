//! The readers' grace period end to end, all of it shipped code: the engine
//! (`Engine::evict`, `reclaim`, `alloc`, `insert`, its limbo) with the
//! daemon's `ShmGrace` (`Reclaimer` over the reader table) against a reader
//! that reads as `Client::peek` does (`ReaderSlot::read` around
//! `TreeReader::peek_anchored`).
//!
//! root → X [1] on page 0, the only page. The writer evicts X and, once
//! the grace says page 0 may be reused (it is back in the free pool), hands
//! it to a new prompt [9]. A walk that returns page 0 and is trusted must
//! have been pinned only while page 0 was nobody else's: it reads the
//! writer's stage (SeqCst, outside the protocol) while still pinned, and
//! finds page 0 not yet handed out.
//!
//! - `a_trusted_read_keeps_its_pages_from_reuse`: the reader is never
//!   expired; the writer reuses page 0 only after two advances.
//! - `an_expired_read_is_walked_again`: the writer expires the reader in
//!   its way at first sight; the expired walk's copy is thrown away and
//!   `read` walks again.
//!
//! On the path: the first walk returned page 0 and the writer handed it
//! out in this execution. Mutations tried: docs/modelcheck.md.
#![cfg(loom)]

use std::sync::Arc as StdArc;
use std::time::Duration;

use loom_tests::{explore, explore_bounded};
use radixd::engine::{Engine, EngineLayout, Mirror, MirroredRegion, TreeReader};
use radixd::readers::ShmGrace;
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};
use radixd_ipc::{EpochClock, ReaderSlot};

/// The segment's reader table, for the model's two threads.
struct Table {
    clock: EpochClock,
    readers: [ReaderSlot; 1],
    /// 1 once the writer handed page 0 to [9] (SeqCst witness).
    handed_out: AtomicU32,
}

/// What the reader's first walk returned and the trusted read, if any:
/// (pages, whether page 0 was handed out while that walk was pinned).
type Read = (Vec<u32>, Option<(Vec<u32>, bool)>);

/// The model. `reader_first`: the reader runs on the model's main thread
/// (loom starts it first) and the writer in a spawned one; else the other
/// way round. Each puts its race within fewer preemptions: a reader that
/// pins before the writer's first reclaim is expired after one; one that
/// pins between that reclaim and the eviction (the one the two-epoch rule
/// protects) is reached after two with the writer first.
fn model(expire_after: Duration, reader_first: bool) -> bool {
    let layout = EngineLayout::new(1, 1).expect("layout");
    let (region, mirror) = MirroredRegion::new(layout).expect("region");
    let mut e = Engine::in_region(region, layout).expect("engine");
    let r: TreeReader<StdArc<Mirror>> = TreeReader::over(mirror);
    let table = Arc::new(Table {
        clock: EpochClock::new(),
        readers: [ReaderSlot::new()],
        handed_out: AtomicU32::new(0),
    });
    let pages = e.alloc(1, 1).expect("alloc");
    e.insert(1, &[1], &pages, false).expect("insert");
    // SAFETY: `table` outlives the engine, which the writer hands back and
    // which is dropped before it; one collector.
    let grace = unsafe { ShmGrace::over(&table.clock, &table.readers, expire_after) };
    e.set_grace(Box::new(grace));
    let write = {
        let table = table.clone();
        move || {
            assert_eq!(e.evict(1), 1);
            e.reclaim();
            // Back in the pool only once the grace allowed it.
            if e.stats().free_pages == 1 {
                let pages = e.alloc(1, 1).expect("alloc");
                assert_eq!(pages, [0]);
                table.handed_out.store(1, Ordering::SeqCst);
                e.insert(1, &[9], &pages, false).expect("insert");
            }
            e
        }
    };
    let read = {
        let table = table.clone();
        move || -> Read {
            let mut first = None;
            let read = table.readers[0].read(&table.clock, 2, || {
                let mut pages = Vec::new();
                let found = r.peek_anchored(&[1], &mut pages).is_some();
                // SeqCst: the witness, read while still pinned.
                let handed_out = table.handed_out.load(Ordering::SeqCst) == 1;
                first.get_or_insert(pages.clone());
                found.then_some((pages, handed_out))
            });
            (first.unwrap_or_default(), read.flatten())
        }
    };
    let ((first, trusted), e) = if reader_first {
        let writer = loom::thread::spawn(write);
        let read = read();
        (read, writer.join().unwrap())
    } else {
        let reader = loom::thread::spawn(read);
        let e = write();
        (reader.join().unwrap(), e)
    };
    if let Some((pages, handed_out)) = trusted {
        assert!(
            !(pages == [0] && handed_out),
            "page 0 was handed out while a trusted walk that returned it was pinned"
        );
    }
    let reused = table.handed_out.load(Ordering::SeqCst) == 1;
    drop(e);
    first == [0] && reused
}

#[test]
fn a_trusted_read_keeps_its_pages_from_reuse() {
    explore("a_trusted_read_keeps_its_pages_from_reuse", 400, || {
        model(Duration::MAX, false)
    });
}

/// At most one preemption: the race needs one (the reader stopped inside
/// its first walk while the writer evicts, expires it, reuses page 0 and
/// ends). At CI's bound of two it runs past two minutes on a 2-core VM; at
/// one, 56 thousand executions, and a `read` that ignores `unpin`'s answer
/// fails it.
#[test]
fn an_expired_read_is_walked_again() {
    explore_bounded("an_expired_read_is_walked_again", 600, Some(1), || {
        model(Duration::ZERO, true)
    });
}
