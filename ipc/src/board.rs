//! A step board: one writer publishes numbered steps, each a small record
//! (a key and a head of words) with a payload of bytes, into a ring of
//! slots; readers in other processes take step `s` straight from shared
//! memory when it is there and whole, with no round trip; each reader
//! keeps a cursor (the steps it has taken) that the writer reads, and the
//! writer keeps one per reader (the steps it answered the reader itself).
//!
//! Slot `s % SLOTS` holds step `s` until step `s + SLOTS` is published over
//! it. A slot is written under its [`Version`] (a sequence lock), with the
//! step's number inside, so a reader copies the slot, checks the number,
//! and re-checks the version: a slot being rewritten, or rewritten already
//! for a later step, is refused, never half-read. A refused or missing step
//! is the reader's to get another way (from the writer, by request).
//!
//! What a key, a head and a payload mean is the caller's business; nothing
//! here trusts what another process wrote (lengths are clamped, numbers
//! only compared).

use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::Version;

/// Slots of a board: steps kept for readers to take.
#[cfg(not(loom))]
pub const BOARD_SLOTS: usize = 64;
/// Payload bytes a slot holds at most.
#[cfg(not(loom))]
pub const BOARD_DATA: usize = 4096;
/// Readers (cursors) of a board.
#[cfg(not(loom))]
pub const BOARD_READERS: usize = 64;
// Small enough for loom to explore every interleaving.
#[cfg(loom)]
pub const BOARD_SLOTS: usize = 2;
#[cfg(loom)]
pub const BOARD_DATA: usize = 16;
#[cfg(loom)]
pub const BOARD_READERS: usize = 2;

/// Words of a step's head.
pub const HEAD_WORDS: usize = 6;
const DATA_WORDS: usize = BOARD_DATA / 8;
/// The step number of a slot that holds none.
const EMPTY: u64 = u64::MAX;

/// One cursor, alone on its cache line (each has one writer).
#[repr(C, align(64))]
#[derive(Debug)]
struct Cursor {
    next: AtomicU64,
}

/// One step as published, on cache lines of its own (no slot's writes
/// disturb a reader of its neighbour).
#[repr(C, align(64))]
#[derive(Debug)]
struct Slot {
    version: Version,
    /// Payload bytes.
    len: AtomicU32,
    step: AtomicU64,
    key: [AtomicU64; 2],
    head: [AtomicU64; HEAD_WORDS],
    data: [AtomicU64; DATA_WORDS],
}

/// A step board (see the module doc). All zero is a board that has
/// published nothing ([`Board::reset`] makes it so again).
#[repr(C)]
#[derive(Debug)]
pub struct Board {
    /// Steps published: step `s` is on the board once `s < published`
    /// (until its slot is reused).
    published: Cursor,
    /// Per reader: the steps it has taken from the board or been answered
    /// (written by the reader).
    taken: [Cursor; BOARD_READERS],
    /// Per reader: the steps the writer has answered it itself (written by
    /// the writer).
    told: [Cursor; BOARD_READERS],
    slots: [Slot; BOARD_SLOTS],
}

#[cfg(not(loom))]
const _: () =
    assert!(size_of::<Slot>() == (8 + 8 + 16 + 8 * HEAD_WORDS + BOARD_DATA).next_multiple_of(64));
#[cfg(not(loom))]
const _: () =
    assert!(size_of::<Board>() == 64 * (1 + 2 * BOARD_READERS) + BOARD_SLOTS * size_of::<Slot>());

// SAFETY: nothing but atomics (and `Version`, one atomic); every bit
// pattern is valid.
#[cfg(not(loom))]
unsafe impl crate::shm::ShmSafe for Board {}

/// A step copied off a board.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub key: [u64; 2],
    pub head: [u64; HEAD_WORDS],
    /// Payload bytes copied.
    pub len: usize,
}

fn zero() -> AtomicU64 {
    AtomicU64::new(0)
}

impl Cursor {
    fn new() -> Self {
        Self { next: zero() }
    }
}

impl Slot {
    fn new() -> Self {
        Self {
            version: Version::new(),
            len: AtomicU32::new(0),
            step: AtomicU64::new(EMPTY),
            key: [zero(), zero()],
            head: std::array::from_fn(|_| zero()),
            data: std::array::from_fn(|_| zero()),
        }
    }
}

impl Default for Board {
    fn default() -> Self {
        Self::new()
    }
}

impl Board {
    /// An empty board, in this process (tests and loom; in shared memory a
    /// zeroed one is [`Board::reset`]).
    pub fn new() -> Self {
        Self {
            published: Cursor::new(),
            taken: std::array::from_fn(|_| Cursor::new()),
            told: std::array::from_fn(|_| Cursor::new()),
            slots: std::array::from_fn(|_| Slot::new()),
        }
    }

    /// Writer: empties the board for a new use (no step published, every
    /// cursor at 0). Nobody may read it meanwhile (a board is reset before
    /// its readers are told of it).
    pub fn reset(&self) {
        for slot in &self.slots {
            slot.version.begin();
            // Relaxed: inside the version's change.
            slot.step.store(EMPTY, Ordering::Relaxed);
            slot.len.store(0, Ordering::Relaxed);
            slot.version.end();
        }
        for c in self.taken.iter().chain(&self.told) {
            // Relaxed: no reader is told of the board before the writer
            // answers its join, which orders these (the reply ring's
            // Release/Acquire).
            c.next.store(0, Ordering::Relaxed);
        }
        // Relaxed: as above.
        self.published.next.store(0, Ordering::Relaxed);
    }

    /// Writer: publishes step `step` (the next one: `published()`), with
    /// `key`, `head` and `data`. `false` (nothing published, the step
    /// counted published all the same, so readers ask the writer) when
    /// `data` is larger than a slot or `step` is not the next one.
    pub fn publish(&self, step: u64, key: [u64; 2], head: [u64; HEAD_WORDS], data: &[u8]) -> bool {
        self.put(step, Some((key, head, data)))
    }

    /// Writer: counts step `step` (the next one) published without putting
    /// it on the board: readers of it ask the writer.
    pub fn pass(&self, step: u64) {
        self.put(step, None);
    }

    fn put(&self, step: u64, what: Option<([u64; 2], [u64; HEAD_WORDS], &[u8])>) -> bool {
        // Relaxed: only the writer stores it.
        let next = self.published.next.load(Ordering::Relaxed);
        if step != next || step == EMPTY {
            return false;
        }
        let slot = &self.slots[(step % BOARD_SLOTS as u64) as usize];
        let (key, head, data) = what.unwrap_or(([0; 2], [0; HEAD_WORDS], &[]));
        let fits = what.is_some() && data.len() <= BOARD_DATA;
        slot.version.begin();
        // Relaxed, all: ordered by the version's fences (a reader that saw
        // any of these re-checks and refuses the slot).
        slot.step
            .store(if fits { step } else { EMPTY }, Ordering::Relaxed);
        if fits {
            for (w, k) in slot.key.iter().zip(key) {
                w.store(k, Ordering::Relaxed);
            }
            for (w, h) in slot.head.iter().zip(head) {
                w.store(h, Ordering::Relaxed);
            }
            for (w, chunk) in slot.data.iter().zip(data.chunks(8)) {
                let mut bytes = [0u8; 8];
                bytes[..chunk.len()].copy_from_slice(chunk);
                w.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
            }
            slot.len.store(data.len() as u32, Ordering::Relaxed);
        }
        slot.version.end();
        // Release: the slot is whole before a reader sees the step counted;
        // pairs with the Acquire load in `published`.
        self.published.next.store(step + 1, Ordering::Release);
        fits
    }

    /// Steps published so far.
    pub fn published(&self) -> u64 {
        // Acquire: pairs with the Release store in `publish`, so a reader
        // that sees step `s` counted finds its slot written (or rewritten
        // for a later step, which it refuses).
        self.published.next.load(Ordering::Acquire)
    }

    /// Reader: step `step` if it is on the board and whole, its payload
    /// copied into `out` (cleared first).
    pub fn take(&self, step: u64, out: &mut Vec<u8>) -> Option<Taken> {
        if step >= self.published() {
            return None;
        }
        let slot = &self.slots[(step % BOARD_SLOTS as u64) as usize];
        out.clear();
        let (taken, _) = slot.version.read(|| {
            // Relaxed, all: validated by the version (a torn copy is
            // thrown away).
            if slot.step.load(Ordering::Relaxed) != step {
                return None;
            }
            let len = (slot.len.load(Ordering::Relaxed) as usize).min(BOARD_DATA);
            let key = [0, 1].map(|i| slot.key[i].load(Ordering::Relaxed));
            let head = std::array::from_fn(|i| slot.head[i].load(Ordering::Relaxed));
            for w in &slot.data[..len.div_ceil(8)] {
                out.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
            out.truncate(len);
            Some(Taken { key, head, len })
        })?;
        taken
    }

    /// Reader `reader`: every step below `next` is taken.
    pub fn set_taken(&self, reader: usize, next: u64) {
        if let Some(c) = self.taken.get(reader) {
            // Release: publishes nothing but the number; the writer only
            // compares it (pairs with the Acquire load in `taken`, for a
            // cursor read in order).
            c.next.store(next, Ordering::Release);
        }
    }

    /// Writer: reader `reader`'s cursor (0 for a reader past the table).
    /// Untrusted: the caller clamps it.
    pub fn taken(&self, reader: usize) -> u64 {
        // Acquire: pairs with the Release store in `set_taken`.
        self.taken
            .get(reader)
            .map_or(0, |c| c.next.load(Ordering::Acquire))
    }

    /// Writer: reader `reader` has been answered every step below `next`.
    pub fn tell(&self, reader: usize, next: u64) {
        if let Some(c) = self.told.get(reader) {
            // Release: stored before the answer is pushed, which the reader
            // pops with Acquire; pairs with the Acquire load in `told`.
            c.next.store(next, Ordering::Release);
        }
    }

    /// Reader: what the writer told it (see [`Board::tell`]).
    pub fn told(&self, reader: usize) -> u64 {
        // Acquire: pairs with the Release store in `tell`.
        self.told
            .get(reader)
            .map_or(0, |c| c.next.load(Ordering::Acquire))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_taken_whole_until_its_slot_is_reused() {
        let b = Board::new();
        let mut out = Vec::new();
        assert_eq!(b.take(0, &mut out), None);
        assert!(b.publish(0, [1, 2], [3; HEAD_WORDS], b"hello"));
        let t = b.take(0, &mut out).unwrap();
        assert_eq!((t.key, t.head, t.len), ([1, 2], [3; HEAD_WORDS], 5));
        assert_eq!(out, b"hello");
        assert!(
            !b.publish(5, [0; 2], [0; HEAD_WORDS], b""),
            "not the next step"
        );
        assert!(!b.publish(1, [0; 2], [0; HEAD_WORDS], &[0; BOARD_DATA + 1]));
        assert_eq!(b.take(1, &mut out), None, "too large: counted, not there");
        b.pass(2);
        assert_eq!(
            (b.published(), b.take(2, &mut out)),
            (3, None),
            "passed: counted, not there"
        );
        for s in 3..=BOARD_SLOTS as u64 {
            assert!(b.publish(s, [s, s], [s; HEAD_WORDS], &s.to_ne_bytes()));
        }
        assert_eq!(b.take(0, &mut out), None, "its slot holds step 64 now");
        let t = b.take(BOARD_SLOTS as u64, &mut out).unwrap();
        assert_eq!(t.key, [BOARD_SLOTS as u64; 2]);
        assert_eq!(b.take(BOARD_SLOTS as u64 + 1, &mut out), None);
        b.set_taken(3, 9);
        b.tell(3, 7);
        assert_eq!((b.taken(3), b.told(3)), (9, 7));
        b.set_taken(BOARD_READERS, 1);
        assert_eq!(b.taken(BOARD_READERS), 0, "past the table: nothing");
        b.reset();
        assert_eq!((b.published(), b.taken(3), b.told(3)), (0, 0, 0));
        assert_eq!(b.take(BOARD_SLOTS as u64, &mut out), None);
    }

    #[test]
    fn garbage_in_a_slot_is_never_read_past_the_slot() {
        let b = Board::new();
        assert!(b.publish(0, [1, 1], [0; HEAD_WORDS], b"x"));
        // A hostile process writes a huge length.
        b.slots[0].len.store(u32::MAX, Ordering::Relaxed);
        let mut out = Vec::new();
        let t = b.take(0, &mut out).unwrap();
        assert_eq!(t.len, BOARD_DATA);
        assert_eq!(out.len(), BOARD_DATA);
    }
}
