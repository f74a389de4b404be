//! Epoch-based reclamation for readers in other processes.
//!
//! One writer (the daemon) changes a linked structure in shared memory that
//! readers in other processes walk without locks. A record the writer
//! unlinks may still be under a reader's feet, so it is *retired* with the
//! epoch of its unlinking and reused only once no reader can still hold it.
//!
//! What is taken from where:
//! - crossbeam-epoch: a global epoch, participants that announce ("pin")
//!   the epoch they entered at, a `SeqCst` fence after the announcement
//!   that pairs with one before the collector's scan, and reuse of what was
//!   retired at epoch `t` once the global epoch reaches `t + 2`;
//! - LMDB's reader table: the participants are fixed slots in the shared
//!   file, one per client, cleared by whoever finds their process dead;
//! - seize (and the "expiry" of hazard eras): a reader that stalls (SIGSTOP)
//!   must not hold reclamation back forever, so the writer may *expire* an
//!   old announcement; the reader learns it when it leaves and throws its
//!   copy away.
//!
//! crossbeam-epoch and seize themselves are process-local (thread-locals,
//! heap pointers); here every shared word is a plain atomic in a
//! `#[repr(C)]` slot, and the writer's policy ([`Reclaimer`]: the true
//! epoch, which readers are in the way and since when) is its private
//! memory. What waits for a grace period is the writer's business: radixd's
//! engine threads it through the retired records themselves.
//!
//! Protocol, `g` the global epoch:
//! - reader `pin`: `e = g`; `slot = e`; `fence(SeqCst)`; then walk.
//! - reader `unpin`: `prev = swap(slot, IDLE)`; the walk counts only if
//!   `prev` was not expired.
//! - writer `try_advance`: `fence(SeqCst)`; if every slot is idle, expired
//!   or at `g`, then `g = g + 1`.
//! - writer reuse: a record retired at `t` once `g >= t + 2`.
//!
//! Why no reader sees a reused record: take a record unlinked while the
//! global epoch was `t`; it is reused at `g = t + 2`, after two advances.
//! The advance to `t + 1` scanned after the unlink. A reader that scan did
//! not see pinned after it in the `SeqCst` order of fences, so its walk
//! sees the unlink and never reaches the record. A reader it did see was at
//! `t`; the advance to `t + 2` then needed that reader idle (its walk is
//! over: the Acquire load of IDLE orders its reads before the reuse), at
//! `t + 1` (a new walk, pinned after the first scan: as before), or expired
//! (it learns so in `unpin`: the writer's compare-exchange and the reader's
//! swap are read-modify-writes of one word, so exactly one comes first).

use std::time::{Duration, Instant};

use crate::sync::{fence, AtomicU64, Ordering};

/// Slot value of a reader that is not reading.
pub const IDLE: u64 = 0;
/// Bit the writer sets in an announcement it expires.
pub const EXPIRED: u64 = 1 << 63;

/// The global epoch, on a cache line of its own. Starts at 1 (0 is
/// [`IDLE`]); only the writer stores it.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct EpochClock {
    global: AtomicU64,
}

/// One reader's announcement, on a cache line of its own: [`IDLE`], or the
/// epoch it pinned at, possibly with [`EXPIRED`] set by the writer.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ReaderSlot {
    epoch: AtomicU64,
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<EpochClock>() == 64 && size_of::<ReaderSlot>() == 64);

// SAFETY: one atomic and padding each; every bit pattern is valid (a
// garbage announcement only delays or is expired; see `Collector`).
#[cfg(not(loom))]
unsafe impl crate::shm::ShmSafe for EpochClock {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl crate::shm::ShmSafe for ReaderSlot {}

impl EpochClock {
    /// A clock at epoch 1.
    pub fn new() -> Self {
        Self {
            global: AtomicU64::new(1),
        }
    }

    /// Sets the clock to epoch 1 (the writer, before any reader exists).
    pub fn reset(&self) {
        self.publish(1);
    }

    /// Stores `epoch` (the writer, which keeps the true value in its own
    /// memory, so a stray write to this shared word lasts only until the
    /// next publication).
    pub fn publish(&self, epoch: u64) {
        // Relaxed: a reader takes only the value (any recent epoch will do,
        // see `pin`); what the writer did before is ordered for readers by
        // the fences of the next advance, as for the store in
        // `Collector::advance_or_report` (docs/modelcheck.md, "Orderings
        // argued").
        self.global.store(epoch, Ordering::Relaxed);
    }
}

impl Default for EpochClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ReaderSlot {
    /// An idle slot.
    pub fn new() -> Self {
        Self {
            epoch: AtomicU64::new(IDLE),
        }
    }

    /// Announces that this reader is about to walk the structure; returns
    /// the epoch announced. Reads made before the matching [`Self::unpin`]
    /// never see a record reused while they run, unless `unpin` says the
    /// announcement expired. Pins do not nest.
    pub fn pin(&self, clock: &EpochClock) -> u64 {
        // Relaxed: any recent epoch will do; the fence below orders what
        // matters.
        let e = clock.global.load(Ordering::Relaxed).max(1) & !EXPIRED;
        // The store, then the SeqCst fence: the announcement is ordered
        // before every read of the walk; pairs with the SeqCst fence in
        // `Collector::try_advance` (either the writer's scan sees `e`, or
        // this walk sees every unlink made before that scan).
        //
        // Release: the scan may read this announcement instead of the IDLE
        // of the previous walk's `unpin`, and a plain store does not
        // continue that swap's release sequence; so this store carries the
        // previous walk's reads itself, ordered before the scan's Acquire
        // load of `e` (and so before any reuse that load allows). Free on
        // x86, where every store is a release.
        self.epoch.store(e, Ordering::Release);
        fence(Ordering::SeqCst);
        e
    }

    /// Ends the walk begun by [`Self::pin`]: `true` when what it read can be
    /// trusted, `false` when the writer expired the announcement meanwhile
    /// (the copy may hold reused records: throw it away and retry).
    pub fn unpin(&self) -> bool {
        // Release: orders the walk's reads before the writer's Acquire load
        // of IDLE in `try_advance` (so nothing it writes after is seen by
        // them). Nothing to acquire: the EXPIRED bit is all this reads, and
        // a swap reads the word's latest value, the expiring
        // compare-exchange's if that came first, whatever the ordering.
        //
        // Outside loom: a Relaxed swap here passes every model, yet is a
        // real bug on ARM and POWER (load buffering: the walk's loads may
        // be satisfied after the swap is visible, so the writer sees IDLE,
        // reuses a record, and a load of the walk reads the reuse). loom
        // runs each load when its thread reaches it and reads only stores
        // already made, so it never shows load buffering; the Release is
        // chosen on the argument above, not on a model.
        let prev = self.epoch.swap(IDLE, Ordering::Release);
        prev & EXPIRED == 0
    }

    /// Clears the slot of a reader that is gone (the writer, once the
    /// reader's process is provably dead or has left its client slot).
    pub fn clear(&self) {
        // Release: like `unpin` (and, like it, needed on the argument, not
        // on a model: see load buffering there); the gone reader reads
        // nothing more.
        self.epoch.store(IDLE, Ordering::Release);
    }

    /// Whether the writer has expired this reader's announcement (a long
    /// walk may give up early).
    pub fn expired(&self) -> bool {
        // Relaxed: a hint to give up early, nothing read on its strength
        // (`unpin` decides whether the walk counts).
        self.epoch.load(Ordering::Relaxed) & EXPIRED != 0
    }
}

impl Default for ReaderSlot {
    fn default() -> Self {
        Self::new()
    }
}

/// Why the epoch could not advance: a reader still announces an older one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The reader's slot.
    pub slot: usize,
    /// The epoch it announced.
    pub epoch: u64,
}

/// The writer's side: advances the clock and judges what may be reused.
/// Only one collector may exist for a clock.
#[derive(Debug)]
pub struct Collector<'a> {
    clock: &'a EpochClock,
    readers: &'a [ReaderSlot],
}

impl<'a> Collector<'a> {
    /// The collector over `clock` and the readers' slots.
    pub fn new(clock: &'a EpochClock, readers: &'a [ReaderSlot]) -> Self {
        Self { clock, readers }
    }

    /// The clock this collector advances.
    pub fn clock(&self) -> &'a EpochClock {
        self.clock
    }

    /// The current global epoch: the tag of a record unlinked now.
    pub fn epoch(&self) -> u64 {
        // Relaxed: only this collector stores the clock.
        self.clock.global.load(Ordering::Relaxed)
    }

    /// Advances the global epoch if every reader is idle, expired or
    /// already at the current epoch; returns the new epoch, or the first
    /// reader in the way.
    pub fn try_advance(&self) -> Result<u64, Blocked> {
        self.advance_or_report(|_| {})
    }

    /// [`Self::try_advance`] that also reports every reader in the way to
    /// `in_way`, all of them in one scan (so a writer can expire every
    /// stalled reader at once, not one per call).
    pub fn advance_or_report(&self, mut in_way: impl FnMut(Blocked)) -> Result<u64, Blocked> {
        let g = self.epoch();
        // SeqCst fence: orders every unlink made so far before the scan;
        // pairs with the SeqCst fence in `ReaderSlot::pin`.
        fence(Ordering::SeqCst);
        let mut first = None;
        for (slot, reader) in self.readers.iter().enumerate() {
            // Acquire: pairs with the Release of `unpin`'s swap, so a
            // reader seen idle has finished every read of its walk.
            let e = reader.epoch.load(Ordering::Acquire);
            if e != IDLE && e & EXPIRED == 0 && e != g {
                let blocked = Blocked { slot, epoch: e };
                first.get_or_insert(blocked);
                in_way(blocked);
            }
        }
        if let Some(blocked) = first {
            return Err(blocked);
        }
        // Relaxed: the SeqCst fence above is a release fence too, and a
        // reader that reads `g + 1` in `pin` synchronizes with it through
        // its own SeqCst fence, so all the writer did before the scan
        // happens-before its walk without a Release here. The scan's loads
        // need not stay before this store: one that read what only this
        // store brought about (a pin at `g + 1`) blocks the advance, and an
        // `unpin` of such a pin cannot be read (coherence). The argument in
        // full: docs/modelcheck.md, "Orderings argued".
        self.clock.global.store(g + 1, Ordering::Relaxed);
        Ok(g + 1)
    }

    /// Expires the announcement `blocked` found, if the reader still holds
    /// exactly it: that reader will learn it in `unpin` and distrust its
    /// copy. Returns whether it was expired.
    pub fn expire(&self, blocked: Blocked) -> bool {
        let Some(reader) = self.readers.get(blocked.slot) else {
            return false;
        };
        // Relaxed: an expiry publishes nothing and acquires nothing. The
        // expired reader throws its copy away, and learns of the expiry in
        // `unpin` whatever the ordering (its swap and this compare-exchange
        // are read-modify-writes of one word: the later reads the earlier);
        // a reader that left first makes this fail, and the next scan's
        // Acquire load of IDLE orders its walk (docs/modelcheck.md,
        // "Orderings argued").
        reader
            .epoch
            .compare_exchange(
                blocked.epoch,
                blocked.epoch | EXPIRED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Clears the slot of a reader whose process is dead.
    pub fn clear(&self, slot: usize) {
        if let Some(reader) = self.readers.get(slot) {
            reader.clear();
        }
    }

    /// Whether a record retired at epoch `tag` may be reused now.
    pub fn reusable(&self, tag: u64) -> bool {
        reusable(self.epoch(), tag)
    }
}

/// The grace rule, in its one home: a record retired at epoch `tag` may be
/// reused once the global epoch is `tag + 2` (see the module docs for why
/// one advance is not enough).
pub fn reusable(epoch: u64, tag: u64) -> bool {
    epoch >= tag.saturating_add(2)
}

/// The writer's reclamation policy over a [`Collector`]: it keeps the true
/// epoch in its own memory and republishes it before every advance (the
/// shared clock lies where any reader can write, so a stray write to it
/// neither holds reclamation back nor makes a record reusable early), and
/// it expires every reader that has been in the way for `expire_after`,
/// all in one pass: each reader's clock starts when the writer first finds
/// it in the way, so k stalled readers cost one `expire_after`, not k.
#[derive(Debug)]
pub struct Reclaimer {
    epoch: u64,
    expire_after: Duration,
    /// Per reader slot: the announcement last found in the way, since
    /// when, and in which scan (an entry of an older scan is stale: the
    /// reader was not in the way since).
    in_way: Vec<(u64, Instant, u64)>,
    scans: u64,
    expired: u64,
}

impl Reclaimer {
    /// The policy for a clock at epoch 1 with `readers` slots, expiring a
    /// reader in the way for `expire_after`.
    pub fn new(readers: usize, expire_after: Duration) -> Self {
        let never = Instant::now();
        Self {
            epoch: 1,
            expire_after,
            in_way: vec![(IDLE, never, 0); readers],
            scans: 0,
            expired: 0,
        }
    }

    /// The current epoch: the tag of a record retired now.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Readers expired so far.
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// Whether a record retired at epoch `tag` may be reused now.
    pub fn reusable(&self, tag: u64) -> bool {
        reusable(self.epoch, tag)
    }

    /// Advances the epoch once if the readers allow it, after expiring
    /// every reader that has been in the way for `expire_after` (the clock
    /// `now` is read only when one is in the way); whether it moved.
    pub fn try_advance(&mut self, c: &Collector<'_>, now: impl Fn() -> Instant) -> bool {
        c.clock().publish(self.epoch);
        for attempt in 0..2 {
            self.scans += 1;
            let (scan, expire_after) = (self.scans, self.expire_after);
            let (in_way, expired) = (&mut self.in_way, &mut self.expired);
            let (mut waiting, mut at) = (false, None);
            let advanced = c.advance_or_report(|b| {
                let t = *at.get_or_insert_with(&now);
                let Some(entry) = in_way.get_mut(b.slot) else {
                    return;
                };
                let seen_before = entry.0 == b.epoch && entry.2 + 1 == scan;
                let since = if seen_before { entry.1 } else { t };
                *entry = (b.epoch, since, scan);
                if t.duration_since(since) < expire_after {
                    waiting = true;
                } else if c.expire(b) {
                    *expired += 1;
                }
            });
            if let Ok(e) = advanced {
                self.epoch = e;
                return true;
            }
            // Everyone in the way is expired now (or a reader still counts
            // down): one more scan may advance.
            if waiting || attempt == 1 {
                return false;
            }
        }
        false
    }
}

/// The reader's loop: pin, walk, unpin, retry.
impl ReaderSlot {
    /// Runs `walk` between [`Self::pin`] and [`Self::unpin`], again while
    /// `unpin` says the writer expired the announcement (what that walk
    /// copied may hold reused records), at most `tries` times. Returns what
    /// the first trusted walk returned; `None` when every walk was expired.
    /// This is the whole of a lock-free read (`Client::peek`), and what the
    /// loom models drive.
    pub fn read<T>(
        &self,
        clock: &EpochClock,
        tries: u32,
        mut walk: impl FnMut() -> T,
    ) -> Option<T> {
        for _ in 0..tries {
            self.pin(clock);
            let copied = walk();
            if self.unpin() {
                return Some(copied);
            }
        }
        None
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn slots(n: usize) -> Vec<ReaderSlot> {
        (0..n).map(|_| ReaderSlot::new()).collect()
    }

    #[test]
    fn idle_readers_let_the_epoch_advance() {
        let clock = EpochClock::new();
        let readers = slots(3);
        let c = Collector::new(&clock, &readers);
        assert_eq!(c.epoch(), 1);
        assert_eq!(c.try_advance(), Ok(2));
        assert_eq!(c.try_advance(), Ok(3));
        assert!(c.reusable(1) && !c.reusable(2));
    }

    #[test]
    fn a_pinned_reader_holds_the_epoch_until_it_leaves_or_expires() {
        let clock = EpochClock::new();
        let readers = slots(2);
        let c = Collector::new(&clock, &readers);
        assert_eq!(readers[1].pin(&clock), 1);
        // At the current epoch it does not block the first advance...
        assert_eq!(c.try_advance(), Ok(2));
        // ...but it does the second.
        let blocked = c.try_advance().unwrap_err();
        assert_eq!(blocked, Blocked { slot: 1, epoch: 1 });
        assert!(!c.reusable(1));
        assert!(readers[1].unpin(), "not expired: the walk counts");
        assert_eq!(c.try_advance(), Ok(3));

        readers[0].pin(&clock);
        c.try_advance().unwrap();
        let blocked = c.try_advance().unwrap_err();
        assert!(!readers[0].expired(), "pinned, in the way, not expired yet");
        assert!(c.expire(blocked));
        assert!(readers[0].expired());
        assert_eq!(c.try_advance(), Ok(5), "an expired reader blocks nothing");
        assert!(!readers[0].unpin(), "the expired reader distrusts its copy");
        // Expiring a reader that has moved on does nothing.
        readers[0].pin(&clock);
        assert!(!c.expire(blocked));
        assert!(readers[0].unpin());
    }

    #[test]
    fn a_dead_readers_slot_is_cleared() {
        let clock = EpochClock::new();
        let readers = slots(1);
        let c = Collector::new(&clock, &readers);
        readers[0].pin(&clock);
        c.try_advance().unwrap();
        assert!(c.try_advance().is_err());
        c.clear(0);
        assert!(c.try_advance().is_ok());
    }

    #[test]
    fn garbage_in_a_slot_only_blocks_until_expired() {
        let clock = EpochClock::new();
        let readers = slots(1);
        let c = Collector::new(&clock, &readers);
        readers[0].epoch.store(0x1234_5678, Ordering::Relaxed);
        let blocked = c.try_advance().unwrap_err();
        assert!(c.expire(blocked));
        assert!(c.try_advance().is_ok());
    }

    #[test]
    fn every_reader_in_the_way_is_expired_in_one_pass() {
        let clock = EpochClock::new();
        let readers = slots(6);
        let c = Collector::new(&clock, &readers);
        let mut r = Reclaimer::new(readers.len(), Duration::from_millis(1));
        for reader in &readers {
            reader.pin(&clock);
        }
        let t0 = Instant::now();
        assert!(r.try_advance(&c, || t0), "pinned at the current epoch");
        // All six are found in the way in one scan; their clocks start now.
        assert!(!r.try_advance(&c, || t0));
        let later = t0 + Duration::from_micros(999);
        assert!(!r.try_advance(&c, || later), "not yet past the deadline");
        assert_eq!(r.expired(), 0);
        let past = t0 + Duration::from_millis(1);
        assert!(r.try_advance(&c, || past), "all expired in one call");
        assert_eq!(r.expired(), 6);
        assert!(readers.iter().all(|reader| !reader.unpin()));
        assert!(r.reusable(1) && !r.reusable(2));
    }

    #[test]
    fn a_reader_that_left_the_way_starts_a_new_clock() {
        let clock = EpochClock::new();
        let readers = slots(1);
        let c = Collector::new(&clock, &readers);
        let mut r = Reclaimer::new(1, Duration::from_millis(1));
        readers[0].pin(&clock);
        let t0 = Instant::now();
        assert!(r.try_advance(&c, || t0));
        assert!(!r.try_advance(&c, || t0));
        // It leaves, the epoch moves on, and it pins again (now in the way
        // at a later epoch): the old sighting does not count.
        assert!(readers[0].unpin());
        assert!(r.try_advance(&c, || t0));
        readers[0].pin(&clock);
        assert!(r.try_advance(&c, || t0));
        let late = t0 + Duration::from_millis(5);
        assert!(!r.try_advance(&c, || late), "first seen only now");
        assert_eq!(r.expired(), 0);
    }

    #[test]
    fn a_stray_write_to_the_clock_is_overwritten() {
        let clock = EpochClock::new();
        let readers = slots(1);
        let c = Collector::new(&clock, &readers);
        let mut r = Reclaimer::new(1, Duration::from_millis(1));
        // A client scribbling on the shared word, not `publish`.
        clock.global.store(1_000, Ordering::Relaxed);
        assert!(r.try_advance(&c, Instant::now));
        assert_eq!(r.epoch(), 2);
        assert_eq!(c.epoch(), 2, "republished, then advanced");
        assert!(!r.reusable(1) && r.reusable(0));
        clock.global.store(1_000, Ordering::Relaxed);
        clock.reset();
        assert_eq!(c.epoch(), 1);
    }
}
