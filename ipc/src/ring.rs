//! A lock-free single-producer single-consumer ring of small fixed-size
//! messages, where a message and its "full" mark share one cache line.
//!
//! Each [`Entry`] is one 64-byte line: a `stamp` and the message. The
//! producer writes message `n` into entry `n % capacity` and then stamps it
//! `n + 1` (Release); the consumer, expecting message `n`, polls that
//! entry's stamp (Acquire) and reads the message when it says `n + 1`. So a
//! message crosses between cores as one line, with no separate index line
//! per message: the design of crossbeam's `ArrayQueue` (stamped slots)
//! specialised to one producer and one consumer, with rigtorp's
//! `SPSCQueue` cached indices for the "ring full" check.
//!
//! The consumer still publishes how many messages it has taken (`tail`,
//! on a line of its own) so the producer knows when an entry is free. The
//! producer keeps the last `tail` it saw and reads the shared one only when
//! that says the ring is full: once per lap, not once per message. Each
//! end's cursor lives in its view (and is written through to the header, on
//! a line only that end touches, so a later view resumes where the last
//! one left off).
//!
//! The same code runs over shared memory (std atomics, entries at an offset
//! in the segment) and under loom ([`HeapRing`], loom atomics). The other
//! side may be buggy or hostile: a stamp that is not exactly the one
//! expected is "not yet" (never trusted as a message), and a `tail` that
//! claims more was taken than was pushed makes the producer see a full ring
//! ([`Producer::is_corrupt`] tells the two apart).

use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;

use crossbeam_utils::CachePadded;

use crate::shm::Plain;
#[cfg(not(loom))]
use crate::shm::ShmSafe;
use crate::sync::{AtomicU64, Ordering, UnsafeCell};

/// One message of a ring and its stamp, on one cache line.
///
/// `stamp == n + 1` means "message `n` is here"; anything else means the
/// entry holds no message the consumer is waiting for. All zero is empty.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Entry<T> {
    stamp: AtomicU64,
    msg: UnsafeCell<T>,
}

/// Largest message that still shares its entry's line with the stamp.
pub const MAX_MESSAGE: usize = 64 - size_of::<u64>();

#[cfg(not(loom))]
const _: () = {
    assert!(size_of::<Entry<[u8; MAX_MESSAGE]>>() == 64);
    assert!(core::mem::offset_of!(Entry<u64>, msg) == 8);
};

// SAFETY: a std atomic and an `UnsafeCell` over `Plain` data, `repr(C)`;
// the trailing alignment padding is never read as a value. Every bit
// pattern is valid (all zero: an empty entry).
#[cfg(not(loom))]
unsafe impl<T: Plain> ShmSafe for Entry<T> {}

impl<T: Plain + Default> Entry<T> {
    /// An empty entry.
    pub fn new() -> Self {
        Self {
            stamp: AtomicU64::new(0),
            msg: UnsafeCell::new(T::default()),
        }
    }
}

/// Shared cursors of one ring, each on a line of its own: `head` (messages
/// pushed) and `seen_tail` (the last `tail` the producer read) are the
/// producer's, `tail` (messages taken) is the consumer's. Message `n`
/// lives in entry `n & (capacity - 1)`.
///
/// All zero (with all-zero entries) is a valid empty ring.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingHeader {
    producer: CachePadded<ProducerWords>,
    tail: CachePadded<AtomicU64>,
}

#[repr(C)]
#[derive(Debug, Default)]
struct ProducerWords {
    head: AtomicU64,
    seen_tail: AtomicU64,
}

// `CachePadded` is a single-field `repr(align)` wrapper; pin the layout we
// rely on across processes.
#[cfg(all(not(loom), any(target_arch = "x86_64", target_arch = "aarch64")))]
const _: () = {
    assert!(size_of::<RingHeader>() == 256);
    assert!(core::mem::offset_of!(RingHeader, tail) == 128);
};

// SAFETY: three std atomics at fixed offsets (asserted above); every bit
// pattern is valid.
#[cfg(not(loom))]
unsafe impl ShmSafe for RingHeader {}

impl RingHeader {
    /// A fresh, empty ring header.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empties the ring: cursors to zero, every stamp cleared.
    ///
    /// Only call while neither side uses the ring: the daemon does so when
    /// it adopts a new claim, between two of its own pops, before the
    /// claim becomes ACTIVE. Views made before the reset keep their own
    /// cursors: the views' `reset` is what their owner calls.
    pub fn reset<T>(&self, entries: &[Entry<T>]) {
        // Relaxed, all of them: published by the Release CAS to ACTIVE that
        // follows (`SlotTable::activate`); pairs with the client's Acquire
        // in `SlotTable::is_current`, after which it makes its views.
        for entry in entries {
            entry.stamp.store(0, Ordering::Relaxed);
        }
        self.producer.head.store(0, Ordering::Relaxed);
        self.producer.seen_tail.store(0, Ordering::Relaxed);
        self.tail.store(0, Ordering::Relaxed);
    }
}

/// Errors of ring construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Capacity is zero, not a power of two, or too large.
    BadCapacity(usize),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadCapacity(c) => write!(f, "ring capacity {c} is not a non-zero power of two"),
        }
    }
}

impl std::error::Error for RingError {}

fn check_capacity(cap: usize) -> Result<u64, RingError> {
    if cap == 0 || !cap.is_power_of_two() || cap > (1 << 31) {
        return Err(RingError::BadCapacity(cap));
    }
    u64::try_from(cap).map_err(|_| RingError::BadCapacity(cap))
}

/// What either end of a ring holds: the shared header, the entries and the
/// index mask. `Send` but not `Sync`: one thread uses an end at a time.
struct End<'a, T> {
    header: &'a RingHeader,
    entries: &'a [Entry<T>],
    mask: u64,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the entries are only touched through the SPSC protocol, and the
// view is !Sync, so moving it to another thread keeps a single user of
// this end.
unsafe impl<T: Send> Send for End<'_, T> {}

impl<'a, T> End<'a, T> {
    fn new(header: &'a RingHeader, entries: &'a [Entry<T>]) -> Result<Self, RingError> {
        let mask = check_capacity(entries.len())? - 1;
        Ok(Self {
            header,
            entries,
            mask,
            _not_sync: PhantomData,
        })
    }

    fn entry(&self, n: u64) -> &'a Entry<T> {
        // `mask < entries.len()` (checked in `new`), so the index is in range.
        &self.entries[(n & self.mask) as usize]
    }
}

/// The producing end of a ring. `Send` but not `Sync`: exactly one thread
/// pushes at a time.
pub struct Producer<'a, T> {
    end: End<'a, T>,
    /// Messages pushed: the next message's number.
    head: Cell<u64>,
    /// The consumer's `tail` as last read; the ring has room while
    /// `head - seen_tail < capacity`.
    seen_tail: Cell<u64>,
}

/// The consuming end of a ring. `Send` but not `Sync`.
pub struct Consumer<'a, T> {
    end: End<'a, T>,
    /// Messages taken: the number of the message awaited next.
    tail: Cell<u64>,
}

impl<'a, T: Plain> Producer<'a, T> {
    /// A producer view over `header` and `entries` (length = capacity),
    /// resuming at the cursors in `header`.
    ///
    /// # Safety
    ///
    /// For as long as the view lives, no other producer for the same ring
    /// may exist (in this or any other process), and entries may be
    /// touched only by this producer and one matching [`Consumer`].
    pub unsafe fn new(header: &'a RingHeader, entries: &'a [Entry<T>]) -> Result<Self, RingError> {
        let end = End::new(header, entries)?;
        // Relaxed: the producer's own words (a previous view of this
        // producer, or the reset published to it by the slot's activation).
        let head = header.producer.head.load(Ordering::Relaxed);
        let seen_tail = header.producer.seen_tail.load(Ordering::Relaxed);
        Ok(Self {
            end,
            head: Cell::new(head),
            seen_tail: Cell::new(seen_tail),
        })
    }

    /// Empties the ring (see [`RingHeader::reset`]): only while the
    /// consumer does not use the ring, and published to it by a Release
    /// the consumer acquires before its next `pop`.
    pub fn reset(&self) {
        self.end.header.reset(self.end.entries);
        self.head.set(0);
        self.seen_tail.set(0);
    }

    /// Appends `msg`, or hands it back when the ring is full (or the
    /// consumer wrote an impossible `tail`: see [`Producer::is_corrupt`]).
    /// The producer never overwrites an entry the consumer has not taken.
    pub fn push(&self, msg: T) -> Result<(), T> {
        let head = self.head.get();
        if head.wrapping_sub(self.seen_tail.get()) > self.end.mask {
            // Acquire: pairs with the Release store of `tail` in
            // `Consumer::pop`, so the consumer's read of the entry we are
            // about to reuse is done.
            let tail = self.end.header.tail.load(Ordering::Acquire);
            if head.wrapping_sub(tail) > self.end.mask {
                return Err(msg);
            }
            self.seen_tail.set(tail);
            // Relaxed: the producer's own word, for its next view.
            self.end
                .header
                .producer
                .seen_tail
                .store(tail, Ordering::Relaxed);
        }
        let entry = self.end.entry(head);
        // SAFETY: entry `head & mask` is free (the consumer took message
        // `head - capacity`, or it was never used), so the consumer does
        // not read it until we stamp it; we are the only producer
        // (contract of `new`), so no one else writes it.
        entry.msg.with_mut(|p| unsafe { p.write_volatile(msg) });
        // Release: publishes the message; pairs with the Acquire load of
        // the stamp in `pop`.
        entry.stamp.store(head.wrapping_add(1), Ordering::Release);
        self.head.set(head.wrapping_add(1));
        // Relaxed: the producer's own word, for its next view.
        self.end
            .header
            .producer
            .head
            .store(head.wrapping_add(1), Ordering::Relaxed);
        Ok(())
    }

    /// Whether the consumer's `tail` is impossible (ahead of what was
    /// pushed): the peer wrote garbage, and the ring will look full until
    /// it is reset.
    pub fn is_corrupt(&self) -> bool {
        // Relaxed: a diagnostic read after a failed `push`.
        let tail = self.end.header.tail.load(Ordering::Relaxed);
        self.head.get().wrapping_sub(tail) > self.end.mask + 1
    }
}

impl<'a, T: Plain> Consumer<'a, T> {
    /// A consumer view over `header` and `entries` (length = capacity),
    /// resuming at the cursor in `header`.
    ///
    /// # Safety
    ///
    /// For as long as the view lives, no other consumer for the same ring
    /// may exist (in this or any other process), and entries may be
    /// touched only by this consumer and one matching [`Producer`].
    pub unsafe fn new(header: &'a RingHeader, entries: &'a [Entry<T>]) -> Result<Self, RingError> {
        let end = End::new(header, entries)?;
        // Relaxed: the consumer's own word.
        let tail = header.tail.load(Ordering::Relaxed);
        Ok(Self {
            end,
            tail: Cell::new(tail),
        })
    }

    /// Empties the ring (see [`RingHeader::reset`]): only while the
    /// producer does not use the ring, and published to it by a Release
    /// the producer acquires before its next `push`.
    pub fn reset(&self) {
        self.end.header.reset(self.end.entries);
        self.tail.set(0);
    }

    /// Takes the next message, or `None` when it has not arrived.
    pub fn pop(&self) -> Option<T> {
        let tail = self.tail.get();
        let entry = self.end.entry(tail);
        // Acquire: pairs with the Release store of the stamp in
        // `Producer::push`, so the message written before it is visible.
        if entry.stamp.load(Ordering::Acquire) != tail.wrapping_add(1) {
            return None;
        }
        // SAFETY: the stamp says message `tail` is in this entry, and the
        // producer does not rewrite it until we advance `tail`; `T: Plain`
        // accepts whatever bits a hostile producer left there. Copied out
        // once, by value.
        let msg = entry.msg.with(|p| unsafe { p.read_volatile() });
        self.tail.set(tail.wrapping_add(1));
        // Release: frees the entry; pairs with the Acquire load of `tail`
        // in `push`.
        self.end
            .header
            .tail
            .store(tail.wrapping_add(1), Ordering::Release);
        Some(msg)
    }

    /// Whether the next message has arrived (for doorbell re-checks).
    pub fn has_work(&self) -> bool {
        let tail = self.tail.get();
        // Acquire: pairs with the Release store of the stamp in `push`.
        self.end.entry(tail).stamp.load(Ordering::Acquire) == tail.wrapping_add(1)
    }
}

/// A ring whose state lives on the heap: for in-process use, tests and loom
/// models. Shared-memory rings use [`Producer::new`]/[`Consumer::new`] over
/// segment memory instead; the protocol code is the same.
pub struct HeapRing<T> {
    header: RingHeader,
    entries: Box<[Entry<T>]>,
}

impl<T: Plain + Default> HeapRing<T> {
    /// A ring of `capacity` (a power of two) empty entries.
    pub fn new(capacity: usize) -> Result<Self, RingError> {
        check_capacity(capacity)?;
        let entries = (0..capacity).map(|_| Entry::new()).collect();
        Ok(Self {
            header: RingHeader::new(),
            entries,
        })
    }

    /// The producer view.
    ///
    /// # Safety
    ///
    /// At most one producer view of this ring may be alive at a time.
    pub unsafe fn producer(&self) -> Producer<'_, T> {
        // SAFETY: forwarded to the caller; the capacity was checked in
        // `HeapRing::new`, so this cannot fail.
        unsafe { Producer::new(&self.header, &self.entries) }
            .unwrap_or_else(|_| unreachable!("capacity checked in HeapRing::new"))
    }

    /// The consumer view.
    ///
    /// # Safety
    ///
    /// At most one consumer view of this ring may be alive at a time.
    pub unsafe fn consumer(&self) -> Consumer<'_, T> {
        // SAFETY: as in `producer`.
        unsafe { Consumer::new(&self.header, &self.entries) }
            .unwrap_or_else(|_| unreachable!("capacity checked in HeapRing::new"))
    }

    /// The shared header (e.g. to corrupt it in tests).
    pub fn header(&self) -> &RingHeader {
        &self.header
    }

    /// The entries.
    pub fn entries(&self) -> &[Entry<T>] {
        &self.entries
    }

    /// Reads the shared cursors `(head, tail)` (model checks).
    #[doc(hidden)]
    pub fn counters(&self) -> (u64, u64) {
        // Relaxed: a diagnostic read; callers order it themselves.
        (
            self.header.producer.head.load(Ordering::Relaxed),
            self.header.tail.load(Ordering::Relaxed),
        )
    }

    /// Overwrites the shared cursors (the producer's `head` and last seen
    /// tail, the consumer's `tail`), bypassing the protocol: what a
    /// previous user of the ring left behind (model checks).
    #[doc(hidden)]
    pub fn set_counters(&self, head: u64, tail: u64) {
        // Relaxed: test hook, no data is published.
        self.header.producer.head.store(head, Ordering::Relaxed);
        self.header
            .producer
            .seen_tail
            .store(tail, Ordering::Relaxed);
        self.header.tail.store(tail, Ordering::Relaxed);
    }

    /// Whether every cursor and stamp is zero, as [`RingHeader::reset`]
    /// leaves them (model checks; the caller orders the loads).
    #[doc(hidden)]
    pub fn is_reset(&self) -> bool {
        // Relaxed: a check made after the caller's own synchronisation.
        self.counters() == (0, 0)
            && self.header.producer.seen_tail.load(Ordering::Relaxed) == 0
            && self
                .entries
                .iter()
                .all(|e| e.stamp.load(Ordering::Relaxed) == 0)
    }

    /// Overwrites the consumer's shared `tail`, bypassing the protocol.
    /// Test hook for simulating a hostile consumer.
    #[doc(hidden)]
    pub fn set_tail(&self, tail: u64) {
        // Relaxed: test hook, no data is published.
        self.header.tail.store(tail, Ordering::Relaxed);
    }

    /// Overwrites entry `i`'s stamp, bypassing the protocol. Test hook for
    /// simulating a hostile producer.
    #[doc(hidden)]
    pub fn set_stamp(&self, i: usize, stamp: u64) {
        // Relaxed: test hook, no data is published.
        self.entries[i].stamp.store(stamp, Ordering::Relaxed);
    }
}

// SAFETY: all access to the entries goes through the producer/consumer
// views, whose constructors are `unsafe` and require a single producer and
// a single consumer, which is exactly what the SPSC protocol synchronises.
unsafe impl<T: Send> Sync for HeapRing<T> {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bad_capacity() {
        assert_eq!(
            HeapRing::<u64>::new(0).err(),
            Some(RingError::BadCapacity(0))
        );
        assert_eq!(
            HeapRing::<u64>::new(3).err(),
            Some(RingError::BadCapacity(3))
        );
        let e = RingError::BadCapacity(3).to_string();
        assert!(e.contains('3') && e.contains("power of two"), "{e}");
    }

    /// The largest capacity is 2^31 entries: checked without making a ring
    /// of that size.
    #[test]
    fn capacity_bounds() {
        assert_eq!(check_capacity(1), Ok(1));
        assert_eq!(check_capacity(1 << 31), Ok(1 << 31));
        assert_eq!(
            check_capacity(1 << 32),
            Err(RingError::BadCapacity(1 << 32))
        );
    }

    /// `MAX_MESSAGE` is the largest message that shares its entry's cache
    /// line with the stamp: one byte more takes a second line.
    #[test]
    fn max_message_fills_the_stamps_line() {
        assert_eq!(size_of::<Entry<[u8; MAX_MESSAGE]>>(), 64);
        assert_eq!(size_of::<Entry<[u8; MAX_MESSAGE + 1]>>(), 128);
    }

    #[test]
    fn fifo_and_full() {
        let ring = HeapRing::<u64>::new(4).unwrap();
        // SAFETY: single thread, one view of each kind.
        let (p, c) = unsafe { (ring.producer(), ring.consumer()) };
        for round in 0..5u64 {
            for i in 0..4 {
                p.push(round * 10 + i).unwrap();
            }
            assert_eq!(p.push(99), Err(99));
            assert!(!p.is_corrupt());
            for i in 0..4 {
                assert!(c.has_work());
                assert_eq!(c.pop(), Some(round * 10 + i));
            }
            assert_eq!(c.pop(), None);
            assert!(!c.has_work());
        }
    }

    #[test]
    fn views_resume_where_the_last_ones_stopped() {
        let ring = HeapRing::<u64>::new(4).unwrap();
        for i in 0..10u64 {
            // SAFETY: single thread; each view dropped before the next.
            unsafe { ring.producer() }.push(i).unwrap();
            // SAFETY: as above.
            assert_eq!(unsafe { ring.consumer() }.pop(), Some(i));
        }
        assert_eq!(ring.counters(), (10, 10));
    }

    #[test]
    fn a_hostile_tail_makes_the_ring_look_full_never_overwritten() {
        let ring = HeapRing::<[u32; 4]>::new(4).unwrap();
        // SAFETY: single thread, one view of each kind.
        let p = unsafe { ring.producer() };
        for i in 0..4 {
            p.push([i; 4]).unwrap();
        }
        ring.set_tail(1000); // "taken" more than was ever pushed
        assert!(p.push([9; 4]).is_err());
        assert!(p.is_corrupt());
        // SAFETY: single thread, one consumer view.
        let c = unsafe { ring.consumer() };
        // The consumer's own view never trusts the shared word for more
        // than where to start; the stamps decide.
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn a_wrong_stamp_is_not_a_message() {
        let ring = HeapRing::<u64>::new(4).unwrap();
        // SAFETY: single thread, one view of each kind.
        let (p, c) = unsafe { (ring.producer(), ring.consumer()) };
        ring.set_stamp(0, 5); // message 4's stamp in message 0's entry
        assert!(!c.has_work());
        assert_eq!(c.pop(), None);
        p.push(7).unwrap();
        assert_eq!(c.pop(), Some(7));
        ring.set_stamp(1, u64::MAX);
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn reset_empties_the_ring_and_clears_stale_stamps() {
        let ring = HeapRing::<u64>::new(2).unwrap();
        // SAFETY: single thread, one view of each kind.
        let (p, c) = unsafe { (ring.producer(), ring.consumer()) };
        p.push(1).unwrap();
        p.push(2).unwrap();
        assert_eq!(c.pop(), Some(1));
        c.reset();
        p.reset();
        // Message 0's old stamp (1) would match the next message 0.
        assert_eq!(c.pop(), None);
        // Both ends start over at message 0.
        p.push(3).unwrap();
        assert_eq!(c.pop(), Some(3));
    }

    /// The hooks the slot models use to leave and check a ring's state.
    #[test]
    fn test_hooks_set_and_see_the_shared_cursors() {
        let ring = HeapRing::<u64>::new(4).unwrap();
        assert_eq!(ring.entries().len(), 4);
        assert!(ring.is_reset());
        ring.set_stamp(2, 9);
        assert!(!ring.is_reset(), "a stale stamp, cursors at zero");
        ring.header().reset(ring.entries());
        assert!(ring.is_reset());
        ring.set_counters(5, 5);
        assert_eq!(ring.counters(), (5, 5));
        assert!(!ring.is_reset());
        ring.header().reset(ring.entries());
        assert!(ring.is_reset());
        // SAFETY: single thread, one view of each kind.
        let (p, c) = unsafe { (ring.producer(), ring.consumer()) };
        p.push(7).unwrap();
        assert!(!ring.is_reset(), "a stamp is set");
        assert_eq!(c.pop(), Some(7));
        ring.header().reset(ring.entries());
        assert!(ring.is_reset());
    }

    /// The producer reads the consumer's `tail` (the consumer's cache
    /// line) only when its cached view says the ring is full, not while
    /// that view still shows a free entry.
    #[test]
    fn the_producer_reads_tail_only_when_its_view_is_full() {
        let ring = HeapRing::<u64>::new(4).unwrap();
        // SAFETY: single thread, one view of each kind.
        let (p, c) = unsafe { (ring.producer(), ring.consumer()) };
        for i in 0..3 {
            p.push(i).unwrap();
        }
        assert_eq!(c.pop(), Some(0));
        // One entry free by the cached view (tail 0): no look at `tail`.
        p.push(3).unwrap();
        assert_eq!(p.seen_tail.get(), 0);
        assert_eq!(ring.header().producer.seen_tail.load(Ordering::Relaxed), 0);
        // Full by the cached view: the look finds the entry message 0 left.
        p.push(4).unwrap();
        assert_eq!(p.seen_tail.get(), 1);
        assert_eq!(ring.header().producer.seen_tail.load(Ordering::Relaxed), 1);
    }

    /// An entry the consumer freed is pushed into at once, even when the
    /// producer's cached view of `tail` says the ring is full.
    #[test]
    fn a_freed_entry_is_reused_at_once() {
        let ring = HeapRing::<u64>::new(4).unwrap();
        // SAFETY: single thread, one view of each kind.
        let (p, c) = unsafe { (ring.producer(), ring.consumer()) };
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(c.pop(), Some(0));
        p.push(4).unwrap();
        assert_eq!(p.push(5), Err(5));
        for i in 1..5 {
            assert_eq!(c.pop(), Some(i));
        }
    }

    #[test]
    fn threads() {
        let ring = HeapRing::<u64>::new(8).unwrap();
        const N: u64 = 100_000;
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: the only producer.
                let p = unsafe { ring.producer() };
                for i in 0..N {
                    let mut m = i;
                    while let Err(back) = p.push(m) {
                        m = back;
                        std::hint::spin_loop();
                    }
                }
            });
            // SAFETY: the only consumer.
            let c = unsafe { ring.consumer() };
            let mut next = 0;
            while next < N {
                if let Some(v) = c.pop() {
                    assert_eq!(v, next);
                    next += 1;
                }
            }
        });
    }
}
