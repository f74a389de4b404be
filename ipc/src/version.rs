//! A version word per record: a sequence lock the size of one `u32`, for
//! one writer and readers in other processes that validate records one at a
//! time (the fence variant of Boehm, "Can Seqlocks Get Along with
//! Programming Language Memory Models?", MSPC'12).
//!
//! The writer makes the word odd before it changes the record and even (one
//! higher) after; the word never goes back, so a reader that validated a
//! record at version `v` and later finds `v` again knows the record did not
//! change in between (modulo 2^31 writes to that one record, which no walk
//! lasts long enough to see). A reader copies a record with
//! [`Version::read`] and may later ask [`Version::still`] whether what it
//! copied is still current, for instance after it has copied a child it
//! found through that record.
//!
//! Nothing here retries: the caller knows which record to retry from.

use crate::sync::{fence, AtomicU32, Ordering};

/// One record's version. All zero is valid (even: no write in progress).
#[repr(C)]
#[derive(Debug, Default)]
pub struct Version {
    word: AtomicU32,
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<Version>() == 4);

// SAFETY: one atomic; every bit pattern is valid.
#[cfg(not(loom))]
unsafe impl crate::shm::ShmSafe for Version {}

impl Version {
    /// A version with no write in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a change of the record. Changes of one record must not nest,
    /// and there is one writer.
    #[inline]
    pub fn begin(&self) {
        // Relaxed: only the writer stores the word.
        let v = self.word.load(Ordering::Relaxed);
        debug_assert!(v % 2 == 0, "nested Version::begin");
        // Relaxed store, then a Release fence: the odd value is ordered
        // before every write to the record that follows; pairs with the
        // Acquire fence in `read` and `still` (a reader that saw any of
        // those writes re-loads an odd or later value).
        self.word.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Ends the change started by [`Version::begin`].
    #[inline]
    pub fn end(&self) {
        // Relaxed: only the writer stores the word.
        let v = self.word.load(Ordering::Relaxed);
        debug_assert!(v % 2 == 1, "Version::end without begin");
        // Release: publishes the record's new contents with the even value;
        // pairs with the Acquire load in `read`.
        self.word.store(v.wrapping_add(1), Ordering::Release);
    }

    /// The current version if no change is in progress.
    #[inline]
    pub fn stable(&self) -> Option<u32> {
        // Acquire: pairs with the Release store in `end`, so the writes of
        // every completed change are visible to what the caller reads next.
        let v = self.word.load(Ordering::Acquire);
        (v % 2 == 0).then_some(v)
    }

    /// Runs `copy` once and returns what it copied with the version it saw,
    /// or `None` when a change was in progress or happened meanwhile.
    /// `copy` must only read (atomic or volatile loads) and must cope with
    /// garbage: it may see a torn record, which is then thrown away.
    #[inline]
    pub fn read<T>(&self, copy: impl FnOnce() -> T) -> Option<(T, u32)> {
        let before = self.stable()?;
        let value = copy();
        self.still(before).then_some((value, before))
    }

    /// Whether the record is still at version `v` (as returned by
    /// [`Version::read`] or [`Version::stable`]): every read the caller made
    /// before this call saw the record as it was at `v`.
    #[inline]
    pub fn still(&self, v: u32) -> bool {
        // Acquire fence: the caller's earlier loads happen before the
        // re-load; pairs with the Release fence in `begin`.
        fence(Ordering::Acquire);
        // Relaxed: ordered by the fence above.
        self.word.load(Ordering::Relaxed) == v
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_change_moves_the_version_and_a_change_in_progress_fails_reads() {
        let v = Version::new();
        let (x, at) = v.read(|| 7).unwrap();
        assert_eq!((x, at), (7, 0));
        v.begin();
        assert_eq!(v.stable(), None);
        assert!(v.read(|| ()).is_none());
        assert!(!v.still(at));
        v.end();
        assert!(!v.still(at), "the version never goes back");
        assert_eq!(v.read(|| ()).map(|r| r.1), Some(2));
    }
}
