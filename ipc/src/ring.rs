//! A lock-free single-producer single-consumer ring of fixed-size messages.
//!
//! The ring state is a [`RingHeader`] (two monotonically increasing `u64`
//! counters on separate cache lines) plus a power-of-two slice of message
//! slots. The same protocol code runs over shared memory (std atomics, state
//! at an offset in the segment) and under loom ([`HeapRing`], loom atomics).
//!
//! The other side may be buggy or hostile, so the consumer never trusts the
//! counters: `head - tail > capacity` is reported as [`RingError::Corrupt`].

use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;

use crossbeam_utils::CachePadded;

use crate::shm::Plain;
#[cfg(not(loom))]
use crate::shm::ShmSafe;
use crate::sync::{AtomicU64, Ordering, UnsafeCell};

/// Shared state of one ring: `head` counts messages pushed (written only by
/// the producer), `tail` counts messages popped (written only by the
/// consumer). Slot of message `n` is `n & (capacity - 1)`.
///
/// All zero is a valid empty ring.
#[repr(C)]
#[derive(Debug, Default)]
pub struct RingHeader {
    head: CachePadded<AtomicU64>,
    tail: CachePadded<AtomicU64>,
}

// `CachePadded` is a single-field `repr(align)` wrapper; pin the layout we
// rely on across processes.
#[cfg(all(not(loom), any(target_arch = "x86_64", target_arch = "aarch64")))]
const _: () = {
    assert!(size_of::<RingHeader>() == 256);
    assert!(core::mem::offset_of!(RingHeader, tail) == 128);
};

// SAFETY: two std atomics at fixed offsets (asserted above); every bit
// pattern is valid.
#[cfg(not(loom))]
unsafe impl ShmSafe for RingHeader {}

impl RingHeader {
    /// A fresh, empty ring header.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resets both counters to zero.
    ///
    /// Only call while neither side is using the ring: the daemon does so
    /// when it adopts a new claim, between two of its own pops, before the
    /// claim becomes ACTIVE.
    pub fn reset(&self) {
        // Relaxed: published by the Release CAS to ACTIVE that follows
        // (`SlotTable::activate`); pairs with the client's Acquire in
        // `SlotTable::is_current`.
        self.head.store(0, Ordering::Relaxed);
        self.tail.store(0, Ordering::Relaxed);
    }
}

/// Errors of ring construction and consumption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Capacity is zero, not a power of two, or too large.
    BadCapacity(usize),
    /// The counters are impossible (`head - tail > capacity`): the peer wrote
    /// garbage. The ring should be abandoned and the peer dropped.
    Corrupt {
        /// Head counter as read.
        head: u64,
        /// Tail counter as read.
        tail: u64,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadCapacity(c) => write!(f, "ring capacity {c} is not a non-zero power of two"),
            Self::Corrupt { head, tail } => {
                write!(f, "corrupt ring: head {head}, tail {tail}")
            }
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

/// What either end of a ring holds: the shared header, the slots and the
/// index mask. `Send` but not `Sync`: one thread uses an end at a time.
struct End<'a, T> {
    header: &'a RingHeader,
    slots: &'a [UnsafeCell<T>],
    mask: u64,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the slots are only touched through the SPSC protocol, and the view
// is !Sync, so moving it to another thread keeps a single user of this end.
unsafe impl<T: Send> Send for End<'_, T> {}

impl<'a, T> End<'a, T> {
    fn new(header: &'a RingHeader, slots: &'a [UnsafeCell<T>]) -> Result<Self, RingError> {
        let mask = check_capacity(slots.len())? - 1;
        Ok(Self {
            header,
            slots,
            mask,
            _not_sync: PhantomData,
        })
    }
}

/// The producing end of a ring. `Send` but not `Sync`: exactly one thread
/// pushes at a time.
pub struct Producer<'a, T>(End<'a, T>);

/// The consuming end of a ring. `Send` but not `Sync`.
pub struct Consumer<'a, T>(End<'a, T>);

/// `new` and `reset` of one end of a ring, the same for both ends but for
/// the role names in their contracts: `$End` is the end (`$role` in prose),
/// `$Other` the end across the ring (`$other`, whose next `$next` sees a
/// reset).
macro_rules! ring_end {
    ($End:ident, $role:literal, $Other:ident, $other:literal, $next:literal) => {
        impl<'a, T: Plain> $End<'a, T> {
            #[doc = concat!("A ", $role, " view over `header` and `slots` (length = capacity).")]
            ///
            /// # Safety
            ///
            #[doc = concat!("For as long as the view lives, no other ", $role, " for the same ring may")]
            /// exist (in this or any other process), and slots may be touched only by
            #[doc = concat!("this ", $role, " and one matching [`", stringify!($Other), "`].")]
            pub unsafe fn new(
                header: &'a RingHeader,
                slots: &'a [UnsafeCell<T>],
            ) -> Result<Self, RingError> {
                End::new(header, slots).map(Self)
            }

            /// Empties the ring: both counters to zero (see [`RingHeader::reset`]).
            #[doc = concat!("Only while the ", $other, " does not use the ring, and published to it")]
            #[doc = concat!("by a Release the ", $other, " acquires before its next `", $next, "`.")]
            pub fn reset(&self) {
                self.0.header.reset();
            }
        }
    };
}

ring_end!(Producer, "producer", Consumer, "consumer", "pop");
ring_end!(Consumer, "consumer", Producer, "producer", "push");

impl<'a, T: Plain> Producer<'a, T> {
    /// Appends `msg`, or hands it back when the ring is full (or the consumer
    /// wrote an impossible tail; the producer never overwrites unread slots).
    pub fn push(&self, msg: T) -> Result<(), T> {
        // Relaxed: `head` is written only by us.
        let head = self.0.header.head.load(Ordering::Relaxed);
        // Acquire: pairs with the Release store of `tail` in `Consumer::pop`,
        // so the consumer's read of the slot we are about to reuse is done.
        let tail = self.0.header.tail.load(Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        if used > self.0.mask {
            return Err(msg);
        }
        let Some(slot) = usize::try_from(head & self.0.mask)
            .ok()
            .and_then(|i| self.0.slots.get(i))
        else {
            return Err(msg);
        };
        // SAFETY: slot `head & mask` is free (used < capacity) so the consumer
        // does not read it until we publish `head + 1`; we are the only
        // producer (contract of `new`), so no one else writes it.
        slot.with_mut(|p| unsafe { p.write_volatile(msg) });
        // Release: publishes the slot; pairs with Acquire of `head` in `pop`.
        self.0
            .header
            .head
            .store(head.wrapping_add(1), Ordering::Release);
        Ok(())
    }
}

impl<'a, T: Plain> Consumer<'a, T> {
    /// Takes the oldest message, `Ok(None)` when empty, or
    /// [`RingError::Corrupt`] when the counters are impossible.
    pub fn pop(&self) -> Result<Option<T>, RingError> {
        // Relaxed: `tail` is written only by us.
        let tail = self.0.header.tail.load(Ordering::Relaxed);
        // Acquire: pairs with the Release store of `head` in `Producer::push`,
        // so the slot contents written before it are visible.
        let head = self.0.header.head.load(Ordering::Acquire);
        let ready = head.wrapping_sub(tail);
        if ready == 0 {
            return Ok(None);
        }
        if ready > self.0.mask + 1 {
            return Err(RingError::Corrupt { head, tail });
        }
        let slot = usize::try_from(tail & self.0.mask)
            .ok()
            .and_then(|i| self.0.slots.get(i))
            .ok_or(RingError::Corrupt { head, tail })?;
        // SAFETY: the slot was published by the producer (ready > 0) and is
        // not rewritten until we advance `tail`; `T: Plain` accepts whatever
        // bits a hostile producer left there. Copied out once, by value.
        let msg = slot.with(|p| unsafe { p.read_volatile() });
        // Release: frees the slot; pairs with Acquire of `tail` in `push`.
        self.0
            .header
            .tail
            .store(tail.wrapping_add(1), Ordering::Release);
        Ok(Some(msg))
    }

    /// Whether a message is waiting (for doorbell re-checks). A corrupt ring
    /// counts as "has work" so the caller goes on to `pop` and sees the error.
    pub fn has_work(&self) -> bool {
        // Acquire: pairs with the Release store of `head` in `push`.
        let head = self.0.header.head.load(Ordering::Acquire);
        // Relaxed: `tail` is written only by us.
        let tail = self.0.header.tail.load(Ordering::Relaxed);
        head != tail
    }
}

/// A ring whose state lives on the heap: for in-process use, tests and loom
/// models. Shared-memory rings use [`Producer::new`]/[`Consumer::new`] over
/// segment memory instead; the protocol code is the same.
pub struct HeapRing<T> {
    header: RingHeader,
    slots: Box<[UnsafeCell<T>]>,
}

impl<T: Plain + Default> HeapRing<T> {
    /// A ring of `capacity` (a power of two) default-initialised slots.
    pub fn new(capacity: usize) -> Result<Self, RingError> {
        check_capacity(capacity)?;
        let slots = (0..capacity)
            .map(|_| UnsafeCell::new(T::default()))
            .collect();
        Ok(Self {
            header: RingHeader::new(),
            slots,
        })
    }

    /// The producer view.
    ///
    /// # Safety
    ///
    /// At most one producer view of this ring may be alive at a time.
    pub unsafe fn producer(&self) -> Producer<'_, T> {
        Producer(self.end())
    }

    /// The consumer view.
    ///
    /// # Safety
    ///
    /// At most one consumer view of this ring may be alive at a time.
    pub unsafe fn consumer(&self) -> Consumer<'_, T> {
        Consumer(self.end())
    }

    fn end(&self) -> End<'_, T> {
        End {
            header: &self.header,
            slots: &self.slots,
            // `new` checked the capacity.
            mask: (self.slots.len() as u64) - 1,
            _not_sync: PhantomData,
        }
    }

    /// The shared header (e.g. to corrupt it in tests).
    pub fn header(&self) -> &RingHeader {
        &self.header
    }

    /// Reads the raw counters `(head, tail)` (model checks).
    #[doc(hidden)]
    pub fn counters(&self) -> (u64, u64) {
        // Relaxed: a diagnostic read; callers order it themselves.
        (
            self.header.head.load(Ordering::Relaxed),
            self.header.tail.load(Ordering::Relaxed),
        )
    }

    /// Overwrites the raw counters, bypassing the protocol. Test hook for
    /// simulating a hostile peer.
    #[doc(hidden)]
    pub fn set_counters(&self, head: u64, tail: u64) {
        // Relaxed: test hook, no data is published.
        self.header.head.store(head, Ordering::Relaxed);
        self.header.tail.store(tail, Ordering::Relaxed);
    }
}

// SAFETY: all access to the slots goes through the producer/consumer views,
// whose constructors are `unsafe` and require a single producer and a single
// consumer, which is exactly what the SPSC protocol synchronises.
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
            for i in 0..4 {
                assert_eq!(c.pop(), Ok(Some(round * 10 + i)));
            }
            assert_eq!(c.pop(), Ok(None));
        }
    }

    #[test]
    fn corrupt_counters_are_reported() {
        let ring = HeapRing::<[u32; 4]>::new(4).unwrap();
        // SAFETY: single thread, one view of each kind.
        let (p, c) = unsafe { (ring.producer(), ring.consumer()) };
        ring.set_counters(1000, 3);
        assert_eq!(
            c.pop(),
            Err(RingError::Corrupt {
                head: 1000,
                tail: 3
            })
        );
        assert!(p.push([1; 4]).is_err());
        ring.set_counters(2, 5); // tail ahead of head
        assert_eq!(c.pop(), Err(RingError::Corrupt { head: 2, tail: 5 }));
        ring.set_counters(u64::MAX, u64::MAX - 2); // wrap-around is fine
        assert!(matches!(c.pop(), Ok(Some(_))));
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
                if let Some(v) = c.pop().unwrap() {
                    assert_eq!(v, next);
                    next += 1;
                }
            }
        });
    }
}
