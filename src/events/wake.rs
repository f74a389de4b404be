//! How the daemon wakes the publisher thread without a syscall per round:
//! the publisher announces that it parks ([`Sleep::park`]); the daemon,
//! after pushing events, unparks it only when it has announced so
//! ([`Sleep::wake`]). A Dekker pair of SeqCst fences makes sure no push is
//! left behind a park: one of the two sides always sees the other.
//!
//! Self-contained (atomics from `radixd_ipc::sync` only, the thread calls
//! passed in), so `loom_tests/tests/events_wake.rs` model-checks this very
//! file, with loom's `park` and `unpark`.

use radixd_ipc::sync::{fence, AtomicU32, Ordering};

/// The publisher's announcement that it parks.
pub struct Sleep {
    /// 1 from just before the publisher's last look at its queue until it
    /// is awake again; 0 otherwise (running, or napping between batches:
    /// a nap ends by itself, so a push then needs no wake-up).
    asleep: AtomicU32,
}

impl Sleep {
    /// Awake.
    pub fn new() -> Self {
        Self {
            asleep: AtomicU32::new(0),
        }
    }

    /// The daemon, after pushing: calls `unpark` if the publisher parks or
    /// is about to; whether it did.
    ///
    /// No push is left behind a park. The daemon pushes, then (fence)
    /// loads `asleep`; the publisher, in [`Sleep::park`], stores `asleep`,
    /// then (fence) looks at the queue. The two SeqCst fences are totally
    /// ordered: if this one comes first, the publisher's look sees the push
    /// and it does not park; if its fence comes first, the load below sees
    /// `asleep` set and unparks, and an unpark that lands before the park
    /// makes it return at once (the thread's token). A push the publisher
    /// would see anyway costs at most one spurious unpark, which ends a
    /// later park early. The push and the look are the queue's own atomic
    /// accesses (crossbeam's `ArrayQueue`); the fences order them whatever
    /// their orderings (the loom model pushes and looks Relaxed).
    #[inline]
    pub fn wake(&self, unpark: impl FnOnce()) -> bool {
        // SeqCst fence: orders the caller's push before the load of
        // `asleep`; pairs with the fence in `park` between its store of
        // `asleep` and its look at the queue (Dekker: one of the two sees
        // the other).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above (pairs with `park`'s fence).
        let asleep = self.asleep.load(Ordering::Relaxed) != 0;
        if asleep {
            unpark();
        }
        asleep
    }

    /// The publisher, its queue found empty: announces the park, looks at
    /// the queue once more (`empty`), and calls `park` (which returns on an
    /// unpark, or earlier: a timeout, a spurious wake-up) only if it is
    /// still empty.
    pub fn park(&self, empty: impl FnOnce() -> bool, park: impl FnOnce()) {
        // Relaxed: ordered before the look at the queue by the fence below,
        // which pairs with the fence in `wake`.
        self.asleep.store(1, Ordering::Relaxed);
        // SeqCst fence: pairs with the fence in `wake` (Dekker: the daemon
        // sees `asleep` and unparks, or this thread sees its push).
        fence(Ordering::SeqCst);
        if empty() {
            park();
        }
        // Relaxed: a daemon that still sees 1 unparks once more, which only
        // ends a later park early.
        self.asleep.store(0, Ordering::Relaxed);
    }

    /// Whether the publisher announced a park (for tests: a relaxed look,
    /// ordering nothing).
    #[cfg(test)]
    pub fn is_parked(&self) -> bool {
        // Relaxed: a lone flag read for a test's wait.
        self.asleep.load(Ordering::Relaxed) != 0
    }
}
