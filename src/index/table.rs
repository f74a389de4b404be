//! The block table: every block any worker holds, keyed by its chained
//! block hash, with one membership bit per worker slot.
//!
//! Open addressing with linear probing over one array of words; slot `i`
//! is `stride = 1 + words` words: the key, then the membership bits. A key
//! chained from the root names its whole prefix, so this flat table *is*
//! the radix tree of Dynamo's router, with every edge one block long and
//! the parent link implicit in the hash: walking a request's hashes in
//! order walks the tree.
//!
//! One writer (the index's writer lock) and any number of readers. The
//! writer never moves a key: a slot's key, once published, stays for the
//! table's life (a slot whose bits all went to zero is a tombstone that the
//! same key may take again), so a reader never sees a slot change identity.
//! Growing, dropping tombstones or widening the bits builds a new table that
//! the index publishes and retires through crossbeam-epoch.
//!
//! This file depends on nothing but `radixd_ipc::sync` (and `libc` outside
//! loom): `loom_tests/tests/index_table.rs` compiles it as it is and model
//! checks the publication of a slot against a concurrent reader.

use radixd_ipc::sync::{AtomicU64, Ordering};

/// Stands for key 0, which marks an empty slot. A real hash equal to this
/// constant is confused with hash 0 (probability 2^-64 per pair).
const ZERO_KEY: u64 = 0x9e37_79b9_7f4a_7c15;

/// Smallest table, in slots (8 under loom, so models stay small).
#[cfg(not(loom))]
pub(crate) const MIN_SLOTS: usize = 1024;
#[cfg(loom)]
pub(crate) const MIN_SLOTS: usize = 8;

/// The stored form of `key` (never 0).
#[inline]
pub(crate) fn stored(key: u64) -> u64 {
    if key == 0 {
        ZERO_KEY
    } else {
        key
    }
}

#[cfg(not(loom))]
use words::Words;

/// The words of a table under loom: a plain boxed slice (loom's atomics
/// are objects of the model, created and dropped as Rust values).
#[cfg(loom)]
struct Words(Box<[AtomicU64]>);

#[cfg(loom)]
impl Words {
    fn new(n: usize) -> Self {
        Self((0..n).map(|_| AtomicU64::new(0)).collect())
    }
}

#[cfg(loom)]
impl std::ops::Deref for Words {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        &self.0
    }
}

#[cfg(not(loom))]
mod words {
    use super::AtomicU64;

    /// Tables from this size on are mapped on their own, in 2 MiB pages.
    const HUGE: usize = 2 << 20;

    /// A table's zeroed words: from the heap when small; when large, an
    /// anonymous mapping aligned to 2 MiB and advised to use transparent huge
    /// pages, because a query touches one random slot per block: with 4 KiB
    /// pages most of those are TLB misses too, and a growing table would take
    /// a page fault per 4 KiB.
    pub(super) struct Words {
        ptr: std::ptr::NonNull<AtomicU64>,
        len: usize,
        /// Bytes mapped at `ptr`; 0: a heap allocation (a `Box<[AtomicU64]>`).
        mapped: usize,
    }

    // SAFETY: `Words` owns its memory exclusively and hands out only shared
    // references to `AtomicU64`s, which are `Sync`.
    unsafe impl Send for Words {}
    // SAFETY: as above: `&Words` gives `&[AtomicU64]` only.
    unsafe impl Sync for Words {}

    impl std::ops::Deref for Words {
        type Target = [AtomicU64];
        fn deref(&self) -> &[AtomicU64] {
            // SAFETY: `ptr` points to `len` initialised `AtomicU64`s owned by
            // `self` (zeroed at creation), alive until `drop`.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
        }
    }

    impl Drop for Words {
        fn drop(&mut self) {
            if self.mapped == 0 {
                // SAFETY: a heap table came from `Box::into_raw` of a boxed
                // slice of exactly `len` words (`Words::new`).
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                        self.ptr.as_ptr(),
                        self.len,
                    ))
                });
            } else {
                // Never under loom: `Words::new` maps nothing there.
                // SAFETY: `ptr..ptr + mapped` is the mapping `Words::new` made
                // (trimmed to it), used by nothing else now.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
            }
        }
    }

    impl Words {
        /// `n` zero words.
        pub(super) fn new(n: usize) -> Self {
            {
                let bytes = n.saturating_mul(8);
                if bytes >= HUGE {
                    if let Some(w) = Self::mapped(n, bytes) {
                        return w;
                    }
                }
            }
            let boxed: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
            let len = boxed.len();
            let raw = Box::into_raw(boxed).cast::<AtomicU64>();
            Self {
                // A boxed slice's pointer is never null (dangling when empty).
                ptr: std::ptr::NonNull::new(raw).unwrap_or(std::ptr::NonNull::dangling()),
                len,
                mapped: 0,
            }
        }

        /// `n` zero words in a 2 MiB-aligned anonymous mapping; `None` when the
        /// kernel refuses (the heap then serves).
        fn mapped(n: usize, bytes: usize) -> Option<Self> {
            let size = bytes.div_ceil(HUGE) * HUGE;
            let span = size + HUGE;
            // SAFETY: a fresh private anonymous mapping; no existing memory is
            // involved.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    span,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return None;
            }
            let start = base as usize;
            let aligned = start.div_ceil(HUGE) * HUGE;
            let (head, tail) = (aligned - start, start + span - (aligned + size));
            // SAFETY: `head` and `tail` bytes lie inside the mapping just made,
            // outside the part kept; unmapping them touches nothing else. The
            // advice only concerns the part kept; its failure is harmless.
            unsafe {
                if head > 0 {
                    libc::munmap(base, head);
                }
                if tail > 0 {
                    libc::munmap((aligned + size) as *mut libc::c_void, tail);
                }
                libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
            }
            Some(Self {
                // An address from a successful mmap, rounded up inside it.
                ptr: std::ptr::NonNull::new(aligned as *mut AtomicU64)?,
                len: n,
                mapped: size,
            })
        }
    }
}

/// One generation of the table.
pub(crate) struct Table {
    /// `slots * stride` words.
    words: Words,
    /// `slots - 1` (slots is a power of two).
    mask: usize,
    /// `64 - log2(slots)`: Fibonacci hashing takes the top bits.
    shift: u32,
    /// Words per slot: the key and `stride - 1` membership words.
    stride: usize,
}

impl Table {
    /// An empty table of `slots` (a power of two, at least [`MIN_SLOTS`])
    /// with `bit_words` membership words per slot.
    pub(crate) fn new(slots: usize, bit_words: usize) -> Self {
        debug_assert!(slots.is_power_of_two() && slots >= MIN_SLOTS);
        let stride = 1 + bit_words.max(1);
        let words = Words::new(slots * stride);
        Self {
            words,
            mask: slots - 1,
            shift: 64 - slots.trailing_zeros(),
            stride,
        }
    }

    /// Slots in the table.
    pub(crate) fn slots(&self) -> usize {
        self.mask + 1
    }

    /// Membership words per slot.
    pub(crate) fn bit_words(&self) -> usize {
        self.stride - 1
    }

    /// Worker slots this table can hold.
    pub(crate) fn capacity(&self) -> usize {
        self.bit_words() * 64
    }

    /// The slot where probing for `key` starts.
    #[inline]
    pub(crate) fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: hashes chosen by a client (a query by hashes)
        // spread as well as xxh3 output does.
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Loads the home word of every key in `keys`, results unused: the
    /// loads do not depend on one another, so their cache misses overlap
    /// (a request's blocks are scattered over the table), and the walk
    /// that follows, one dependent step at a time, finds them cached.
    #[inline]
    pub(crate) fn touch(&self, keys: &[u64]) {
        let mut sink = 0u64;
        for &k in keys {
            // Relaxed: a warm-up read; `find` reads again with Acquire.
            sink ^= self.words[self.home(stored(k)) * self.stride].load(Ordering::Relaxed);
        }
        std::hint::black_box(sink);
    }

    /// The slot holding `key` (stored form), if any. Bounded by the table
    /// size even if the writer broke its load-factor rule.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        let mut i = self.home(key);
        for _ in 0..=self.mask {
            let base = i * self.stride;
            // Acquire: pairs with the Release store of the key in `claim`,
            // so the slot's bits written before it are visible.
            let k = self.words[base].load(Ordering::Acquire);
            if k == key {
                return Some(i);
            }
            if k == 0 {
                return None;
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Membership word `w` of slot `slot`.
    #[inline]
    pub(crate) fn bits(&self, slot: usize, w: usize) -> u64 {
        // Acquire: pairs with the Release stores of `set_bit`/`clear_bit`
        // (and `claim`'s key), so what the writer stored before is seen
        // with it.
        self.words[slot * self.stride + 1 + w].load(Ordering::Acquire)
    }

    /// Writer only: the slot of `key`, claiming an empty one with the
    /// worker bit `bit` already set when the key is new. Returns the slot
    /// and whether it was claimed. The caller keeps the load factor below
    /// 3/4, so an empty slot exists.
    pub(crate) fn claim(&self, key: u64, bit: usize) -> Option<(usize, bool)> {
        let mut i = self.home(key);
        for _ in 0..=self.mask {
            let base = i * self.stride;
            // Relaxed: only the writer stores keys; this is its own value.
            let k = self.words[base].load(Ordering::Relaxed);
            if k == key {
                return Some((i, false));
            }
            if k == 0 {
                let (w, b) = (bit / 64, bit % 64);
                // Release: the bit before the key; pairs with the Acquire
                // loads in `bits`.
                self.words[base + 1 + w].store(1 << b, Ordering::Release);
                // Release: publishes the slot; pairs with the Acquire load
                // in `find`, which then sees the bit stored above.
                self.words[base].store(key, Ordering::Release);
                return Some((i, true));
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Writer only: the key of `slot` as the index knows it (the stored
    /// form maps back to itself but for hash 0), if it has one.
    pub(crate) fn key(&self, slot: usize) -> Option<u64> {
        // Relaxed: the writer's own stores.
        let k = self.words[slot * self.stride].load(Ordering::Relaxed);
        match k {
            0 => None,
            ZERO_KEY => Some(0),
            k => Some(k),
        }
    }

    /// Writer only: sets worker bit `bit` of `slot`; whether it was clear.
    pub(crate) fn set_bit(&self, slot: usize, bit: usize) -> bool {
        let word = &self.words[slot * self.stride + 1 + bit / 64];
        // Relaxed: the writer reads back its own stores.
        let old = word.load(Ordering::Relaxed);
        let new = old | 1 << (bit % 64);
        if new == old {
            return false;
        }
        // Release: pairs with the Acquire load in `bits`.
        word.store(new, Ordering::Release);
        true
    }

    /// Whether worker bit `bit` is the only one set in `slot`.
    pub(crate) fn only_bit(&self, slot: usize, bit: usize) -> bool {
        (0..self.bit_words()).all(|w| {
            let want = if w == bit / 64 { 1 << (bit % 64) } else { 0 };
            self.bits(slot, w) == want
        })
    }

    /// Writer only: clears worker bit `bit` of `slot`; `Some(now_empty)`
    /// when it was set, `None` when it was not.
    pub(crate) fn clear_bit(&self, slot: usize, bit: usize) -> Option<bool> {
        let word = &self.words[slot * self.stride + 1 + bit / 64];
        // Relaxed: the writer reads back its own stores.
        let old = word.load(Ordering::Relaxed);
        let new = old & !(1 << (bit % 64));
        if new == old {
            return None;
        }
        // Release: pairs with the Acquire load in `bits`.
        word.store(new, Ordering::Release);
        Some(new == 0 && (0..self.bit_words()).all(|w| self.bits(slot, w) == 0))
    }

    /// Writer only: a new table of `slots` slots and `bit_words` words per
    /// slot holding every slot of this one that some worker holds (the
    /// tombstones stay behind). Built before it is published: plain
    /// stores.
    pub(crate) fn rebuilt(&self, slots: usize, bit_words: usize) -> Self {
        let new = Self::new(slots, bit_words.max(self.bit_words()));
        for slot in 0..self.slots() {
            let base = slot * self.stride;
            // Relaxed: the writer's own stores.
            let key = self.words[base].load(Ordering::Relaxed);
            if key == 0 || (0..self.bit_words()).all(|w| self.bits(slot, w) == 0) {
                continue;
            }
            let mut i = new.home(key);
            while new.words[i * new.stride].load(Ordering::Relaxed) != 0 {
                i = (i + 1) & new.mask;
            }
            let nb = i * new.stride;
            for w in 0..self.bit_words() {
                // Relaxed: the new table is private until published (with
                // Release) by the index.
                new.words[nb + 1 + w].store(self.bits(slot, w), Ordering::Relaxed);
            }
            new.words[nb].store(key, Ordering::Relaxed);
        }
        new
    }

    /// Bytes of the table's words.
    pub(crate) fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn claim_find_and_clear() {
        let t = Table::new(MIN_SLOTS, 1);
        assert_eq!(t.find(stored(5)), None);
        assert_eq!(
            t.claim(stored(5), 3),
            Some((t.find(stored(5)).unwrap(), true))
        );
        let s = t.find(stored(5)).unwrap();
        assert_eq!(t.bits(s, 0), 1 << 3);
        assert!(t.set_bit(s, 7));
        assert!(!t.set_bit(s, 7));
        assert_eq!(t.clear_bit(s, 3), Some(false));
        assert_eq!(t.clear_bit(s, 3), None);
        assert_eq!(t.clear_bit(s, 7), Some(true));
        // A tombstone keeps its key: the same key takes it back.
        assert_eq!(t.claim(stored(5), 1), Some((s, false)));
        // Key 0 is stored as a stand-in, never as the empty marker.
        assert!(t.claim(stored(0), 0).is_some());
        assert!(t.find(stored(0)).is_some());
    }

    #[test]
    fn rebuilding_keeps_held_slots_only_and_widens() {
        let t = Table::new(MIN_SLOTS, 1);
        for k in 1..=600u64 {
            t.claim(stored(k), (k % 64) as usize);
        }
        for k in 1..=300u64 {
            let s = t.find(stored(k)).unwrap();
            assert_eq!(t.clear_bit(s, (k % 64) as usize), Some(true));
        }
        let n = t.rebuilt(2048, 3);
        assert_eq!(n.bit_words(), 3);
        for k in 1..=600u64 {
            let found = n.find(stored(k));
            assert_eq!(found.is_some(), k > 300, "key {k}");
            if let Some(s) = found {
                assert_eq!(n.bits(s, 0), 1 << (k % 64));
                assert_eq!(n.bits(s, 2), 0);
            }
        }
    }
}
