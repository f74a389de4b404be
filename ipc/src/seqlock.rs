//! A sequence lock for one writer and any number of readers in other
//! processes that may only read (Boehm, "Can Seqlocks Get Along with
//! Programming Language Memory Models?", MSPC'12, the fence variant).
//!
//! The writer makes the sequence odd before it touches the data and even
//! again after; a reader copies what it needs between two loads of the
//! sequence and keeps the copy only if both loads saw the same even value.
//! Readers never block the writer; a reader that keeps colliding with writes
//! gives up after a bounded number of tries.

use crate::sync::{fence, spin_loop, AtomicU64, Ordering};

/// The sequence word. All zero is valid (even: no write in progress).
#[repr(C)]
#[derive(Debug, Default)]
pub struct SeqLock {
    seq: AtomicU64,
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<SeqLock>() == 8);

// SAFETY: one atomic; every bit pattern is valid.
#[cfg(not(loom))]
unsafe impl crate::shm::ShmSafe for SeqLock {}

impl SeqLock {
    /// A lock with no write in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a write. Writes must not nest, and there is one writer.
    pub fn begin_write(&self) {
        // Relaxed: only the writer stores the sequence.
        let s = self.seq.load(Ordering::Relaxed);
        // Relaxed store, then a Release fence: the odd value is ordered
        // before every data write that follows; pairs with the Acquire fence
        // in `read` (a reader that saw any of those writes sees `s + 1`).
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Ends the write started by [`SeqLock::begin_write`].
    pub fn end_write(&self) {
        // Relaxed: only the writer stores the sequence.
        let s = self.seq.load(Ordering::Relaxed);
        // Release: publishes the data writes with the even value; pairs with
        // the Acquire load at the start of `read`.
        self.seq.store(s.wrapping_add(1), Ordering::Release);
    }

    /// Runs `copy` until it ran without a write in between, at most `tries`
    /// times; `None` if every try collided with a write. `copy` must only
    /// read (with atomic or volatile loads) and must cope with garbage: it
    /// may see a torn state, which is then thrown away.
    pub fn read<T>(&self, tries: u32, mut copy: impl FnMut() -> T) -> Option<T> {
        for _ in 0..tries {
            // Acquire: pairs with the Release store in `end_write`, so a
            // completed write's data is visible to `copy`.
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                spin_loop();
                continue;
            }
            let value = copy();
            // Acquire fence: `copy`'s loads happen before the re-check;
            // pairs with the Release fence in `begin_write`.
            fence(Ordering::Acquire);
            // Relaxed: ordered by the fence above.
            if self.seq.load(Ordering::Relaxed) == before {
                return Some(value);
            }
            spin_loop();
        }
        None
    }

    /// The current sequence (even when no write is in progress).
    pub fn sequence(&self) -> u64 {
        // Acquire: as the first load in `read`.
        self.seq.load(Ordering::Acquire)
    }
}
