//! Client slot table: claim, adoption, release, liveness and reclaim of
//! client slots.
//!
//! Each [`ClientSlot`] holds a state word `(generation << 32) | state`.
//! Protocol, robust to a client dying after any step:
//!
//! * claim (client): (1) take the slot's liveness lock (a kernel lock,
//!   dropped when the process dies; failing means a live process owns the
//!   slot); (2) CAS `(g, FREE) -> (g+1, CLAIMING)`; (3) record the pid;
//!   (4) CAS `(g+1, CLAIMING) -> (g+1, CLAIMED)` (Release: publishes the
//!   pid). A slot found not FREE in (2) belongs to a dead client: unlock and
//!   skip it, the daemon reclaims it (so the daemon always sees, and can
//!   clean up after, every dead client).
//! * adoption (daemon, [`Tenancy::settle`]): on `(g, CLAIMED)` the daemon
//!   releases whatever the slot's previous client held, resets the slot's
//!   rings, and CASes `(g, CLAIMED) -> (g, ACTIVE)` (Release: publishes the
//!   reset rings). The client touches its rings only after it has seen
//!   `(g, ACTIVE)` ([`SlotTable::is_current`], Acquire). Only the daemon,
//!   between two of its own pops, ever resets a ring: no `pop` in flight can
//!   store an old tail over the reset, and nothing the previous holder left
//!   in the rings can reach the new one.
//! * release (client): unlock, then CAS `(g, ACTIVE or CLAIMED) -> (g+1,
//!   FREE)`.
//! * reclaim (daemon): read the word `w`; if not FREE and the lock is not
//!   held, the owner is dead (or releasing): after cleaning up, CAS
//!   `w -> (gen(w)+1, FREE)`. Every transition changes the word, so the CAS
//!   fails if anything happened since `w` was read (no ABA).
//!
//! A live owner always holds the lock from before (2) until its release, so
//! the daemon never reclaims a live client's slot. A claim can only start
//! from FREE, and a slot the daemon serves becomes FREE only by its
//! holder's release (a dead holder's slot is reclaimed by the daemon, which
//! forgets it first), so `CLAIMED` over a served slot is honest only after
//! that release. The release records the generation it ends in the slot
//! (`released`) before it frees the word; the daemon adopts a claim over a
//! served slot only when `released` shows the served claim ended. Any other
//! unexpected word (a stray write of FREE or CLAIMED over a live client's
//! slot, say) proves nothing, and the daemon releases nothing until a probe
//! of the lock finds it free.

use core::fmt;

#[cfg(not(loom))]
use crate::shm::ShmSafe;
use crate::sync::{AtomicU64, Ordering};

/// State of a free slot.
pub const FREE: u32 = 0;
/// State of a slot claimed but not yet published.
pub const CLAIMING: u32 = 1;
/// State of a slot adopted by the daemon: its rings are reset and the
/// client may use them (set by the daemon only).
pub const ACTIVE: u32 = 2;
/// State of a slot whose claim is published (pid recorded) and awaits the
/// daemon's adoption.
pub const CLAIMED: u32 = 3;

const fn pack(generation: u32, state: u32) -> u64 {
    ((generation as u64) << 32) | state as u64
}

const fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// One client slot in shared memory: one cache line. All zero is FREE.
#[repr(C)]
#[derive(Debug, Default)]
pub struct ClientSlot {
    /// `(generation << 32) | state`; generation bumps on claim and on every
    /// return to FREE, so a stale claim never matches.
    word: AtomicU64,
    /// Pid of the claimant (informational: liveness uses the lock).
    pid: AtomicU64,
    /// Generation of the last claim its holder released (see the module
    /// docs: the proof that a claim over a served slot is honest).
    released: AtomicU64,
    _reserved: [u64; 5],
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<ClientSlot>() == 64);

// SAFETY: std atomics and padding; every bit pattern is valid.
#[cfg(not(loom))]
unsafe impl ShmSafe for ClientSlot {}

impl ClientSlot {
    /// A free slot.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Per-slot liveness locks (OFD byte locks in production, a model in loom).
pub trait SlotLocks {
    /// Tries to take slot `index`'s lock for this process; `Ok(false)` if a
    /// live process holds it.
    fn try_lock(&self, index: u32) -> Result<bool, LivenessError>;
    /// Drops our lock on slot `index`.
    fn unlock(&self, index: u32) -> Result<(), LivenessError>;
    /// Whether some other (live) party holds slot `index`'s lock.
    fn is_held(&self, index: u32) -> Result<bool, LivenessError>;
}

impl<L: SlotLocks + ?Sized> SlotLocks for &L {
    fn try_lock(&self, index: u32) -> Result<bool, LivenessError> {
        (**self).try_lock(index)
    }
    fn unlock(&self, index: u32) -> Result<(), LivenessError> {
        (**self).unlock(index)
    }
    fn is_held(&self, index: u32) -> Result<bool, LivenessError> {
        (**self).is_held(index)
    }
}

/// Error of a liveness lock operation or probe (the OS error kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LivenessError(pub std::io::ErrorKind);

impl fmt::Display for LivenessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "liveness lock operation failed: {}", self.0)
    }
}

impl std::error::Error for LivenessError {}

impl From<std::io::Error> for LivenessError {
    fn from(e: std::io::Error) -> Self {
        Self(e.kind())
    }
}

/// A successful claim: the slot index and the generation it was claimed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    /// Slot index.
    pub index: u32,
    /// Generation of this claim (stale if the slot's generation differs).
    pub generation: u32,
}

/// A slot table whose `count` slots at `offset` do not fit in the segment
/// (a layout that does not match the segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableOutOfBounds {
    /// Offset of the table in the segment.
    pub offset: u64,
    /// Number of slots.
    pub count: u32,
}

impl fmt::Display for TableOutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { offset, count } = self;
        write!(
            f,
            "client slot table ({count} slots at offset {offset}) lies outside the segment"
        )
    }
}

impl std::error::Error for TableOutOfBounds {}

/// Errors of [`SlotTable::claim`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimError {
    /// Every slot is owned by a live client or awaits reclaim.
    Full,
    /// This handle already holds a claim (one claim per open segment).
    AlreadyClaimed,
    /// The slot table does not lie inside the segment.
    Table(TableOutOfBounds),
    /// A lock operation failed.
    Liveness(LivenessError),
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full => f.write_str("no free client slot (segment full)"),
            Self::AlreadyClaimed => f.write_str("this segment handle already holds a client slot"),
            Self::Table(e) => e.fmt(f),
            Self::Liveness(e) => write!(f, "claiming a slot: {e}"),
        }
    }
}

impl std::error::Error for ClaimError {}

impl From<TableOutOfBounds> for ClaimError {
    fn from(e: TableOutOfBounds) -> Self {
        Self::Table(e)
    }
}

impl From<LivenessError> for ClaimError {
    fn from(e: LivenessError) -> Self {
        Self::Liveness(e)
    }
}

/// Errors of [`SlotTable::release`] and [`SlotTable::reclaim`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotError {
    /// Index out of range.
    BadIndex(u32),
    /// The slot no longer holds this claim (already reclaimed or reused).
    Stale,
    /// The owner is alive (its lock is held): not reclaimable.
    Alive,
    /// The slot table does not lie inside the segment.
    Table(TableOutOfBounds),
    /// A lock operation failed.
    Liveness(LivenessError),
}

impl fmt::Display for SlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadIndex(i) => write!(f, "client slot index {i} out of range"),
            Self::Stale => f.write_str("client slot claim is stale"),
            Self::Alive => f.write_str("client slot owner is alive"),
            Self::Table(e) => e.fmt(f),
            Self::Liveness(e) => write!(f, "client slot: {e}"),
        }
    }
}

impl std::error::Error for SlotError {}

impl From<TableOutOfBounds> for SlotError {
    fn from(e: TableOutOfBounds) -> Self {
        Self::Table(e)
    }
}

impl From<LivenessError> for SlotError {
    fn from(e: LivenessError) -> Self {
        Self::Liveness(e)
    }
}

/// A snapshot of one slot, as seen by [`SlotTable::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotStatus {
    /// Slot index.
    pub index: u32,
    /// Generation part of the word.
    pub generation: u32,
    /// State part of the word (`FREE`, `CLAIMING`, `ACTIVE`, or garbage).
    pub state: u32,
    /// Recorded pid (may be stale or garbage; informational).
    pub pid: u64,
    /// Whether the slot's liveness lock was held when probed.
    pub alive: bool,
    raw: u64,
}

impl SlotStatus {
    /// Not FREE and nobody holds the lock: the owner died (or is releasing)
    /// and the daemon should clean up after it and [`SlotTable::reclaim`].
    pub fn is_dead(&self) -> bool {
        self.state != FREE && !self.alive
    }

    /// Whether this status describes `claim` as currently active.
    pub fn is_claim(&self, claim: Claim) -> bool {
        self.index == claim.index && self.generation == claim.generation && self.state == ACTIVE
    }
}

/// Step after which a client "dies" in [`SlotTable::claim_until`] (model
/// checking hook); `Done` runs the whole claim.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClaimStep {
    /// Stop before doing anything.
    Start,
    /// Stop after taking the lock.
    Locked,
    /// Stop after the FREE -> CLAIMING CAS.
    Claiming,
    /// Stop after recording the pid.
    Pid,
    /// Run to completion (CLAIMED published; the daemon adopts it next).
    Done,
}

/// A view of the slot array plus the liveness locks of this party.
#[derive(Debug)]
pub struct SlotTable<'a, L> {
    slots: &'a [ClientSlot],
    locks: L,
}

impl<'a, L: SlotLocks> SlotTable<'a, L> {
    /// A table over `slots` using `locks` (this process's lock handle).
    pub fn new(slots: &'a [ClientSlot], locks: L) -> Self {
        Self { slots, locks }
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the table has no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn slot(&self, index: u32) -> Result<&ClientSlot, SlotError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.slots.get(i))
            .ok_or(SlotError::BadIndex(index))
    }

    /// Claims the first free slot for process `pid` and publishes the claim
    /// (CLAIMED). The claim is usable once the daemon has adopted it: wait
    /// for [`SlotTable::is_current`] before touching the slot's rings.
    pub fn claim(&self, pid: u32) -> Result<Claim, ClaimError> {
        for index in 0..u32::try_from(self.slots.len()).unwrap_or(u32::MAX) {
            if let Some(claim) = self.claim_until(index, pid, ClaimStep::Done)? {
                return Ok(claim);
            }
        }
        Err(ClaimError::Full)
    }

    /// Tries to claim slot `index`, stopping after `stop` (to model a client
    /// that dies mid-protocol). `Ok(Some)` only when the claim was published.
    #[doc(hidden)]
    pub fn claim_until(
        &self,
        index: u32,
        pid: u32,
        stop: ClaimStep,
    ) -> Result<Option<Claim>, ClaimError> {
        let Ok(slot) = self.slot(index) else {
            return Ok(None);
        };
        if stop == ClaimStep::Start {
            return Ok(None);
        }
        // Kernel lock first: from here on no other live client can be in
        // this slot's protocol, and the daemon sees us as alive.
        if !self.locks.try_lock(index)? {
            return Ok(None);
        }
        if stop == ClaimStep::Locked {
            return Ok(None);
        }
        // Acquire: pairs with the Release CAS of `release`/`reclaim`, so the
        // previous owner's (and the daemon's cleanup) accesses are done, and
        // its store to `released` precedes ours in that word's order (else
        // the daemon may read the older generation as the latest; loom:
        // `a_claim_orders_the_last_release_before_its_own`).
        let word = slot.word.load(Ordering::Acquire);
        let (generation, state) = unpack(word);
        let claim = Claim {
            index,
            generation: generation.wrapping_add(1),
        };
        // Acquire on success: as above. Relaxed on failure: we give up.
        let won = state == FREE
            && slot
                .word
                .compare_exchange(
                    word,
                    pack(claim.generation, CLAIMING),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok();
        if !won {
            // Not FREE although we hold the lock: a dead client's slot,
            // left for the daemon to clean up and reclaim.
            self.locks.unlock(index)?;
            return Ok(None);
        }
        if stop == ClaimStep::Claiming {
            return Ok(None);
        }
        // Relaxed: published by the Release CAS to CLAIMED below.
        slot.pid.store(u64::from(pid), Ordering::Relaxed);
        if stop == ClaimStep::Pid {
            return Ok(None);
        }
        // SYNC POINT: Release publishes the pid; pairs with the Acquire load
        // of the word in `word`/`status` (daemon), which adopts the claim.
        // The rings are NOT ours yet: the daemon resets them at adoption.
        let published = slot
            .word
            .compare_exchange(
                pack(claim.generation, CLAIMING),
                pack(claim.generation, CLAIMED),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok();
        if !published {
            // The daemon cannot reclaim while we hold the lock, so only
            // garbage written by a hostile peer gets here; back off.
            self.locks.unlock(index)?;
            return Ok(None);
        }
        Ok(Some(claim))
    }

    /// Releases `claim` (adopted or not yet): drops the liveness lock, then
    /// frees the slot. `Err(Stale)` if the daemon had already reclaimed it,
    /// or a stray write moved the word (harmless: the daemon probes the lock
    /// and finds it free).
    pub fn release(&self, claim: Claim) -> Result<(), SlotError> {
        let slot = self.slot(claim.index)?;
        self.locks.unlock(claim.index)?;
        // Relaxed: published by the Release CAS below, and on to the daemon
        // by the next claimant's CASes (read-modify-writes that continue its
        // release sequence) up to the Acquire load in `word` (loom:
        // `a_release_reaches_the_daemon_with_the_next_claim`).
        slot.released
            .store(u64::from(claim.generation), Ordering::Relaxed);
        let free = pack(claim.generation.wrapping_add(1), FREE);
        // Two tries: the daemon may adopt (CLAIMED -> ACTIVE) between them,
        // and nothing else moves a word whose lock we held.
        for state in [ACTIVE, CLAIMED, ACTIVE] {
            // Release: our last accesses to the slot's rings happen-before
            // the daemon's and the next claimant's Acquire of the word.
            // Relaxed on failure: we try the other state.
            let freed = slot.word.compare_exchange(
                pack(claim.generation, state),
                free,
                Ordering::Release,
                Ordering::Relaxed,
            );
            if freed.is_ok() {
                return Ok(());
            }
        }
        Err(SlotError::Stale)
    }

    /// Daemon side: whether the holder of claim `generation` of slot
    /// `index` released it (that claim or a later one was released). Read
    /// after [`Self::word`] found a newer claim: its Acquire load makes the
    /// release's store visible.
    pub fn released(&self, index: u32, generation: u32) -> bool {
        let Ok(slot) = self.slot(index) else {
            return false;
        };
        // Relaxed: ordered by the Acquire load of the word that showed the
        // newer claim (see `release`).
        let released = slot.released.load(Ordering::Relaxed) as u32;
        // Claims of one slot are sequential: any release at or after
        // `generation` ended it (wrapping comparison of generations).
        released.wrapping_sub(generation) < 1 << 31
    }

    /// Daemon side: adopts `(generation, CLAIMED)` of slot `index` as
    /// `(generation, ACTIVE)`. Call after releasing what the slot's previous
    /// client held and resetting the slot's rings. `Err(Stale)` if the word
    /// moved (the claimant released or died first).
    pub fn activate(&self, index: u32, generation: u32) -> Result<(), SlotError> {
        let slot = self.slot(index)?;
        // SYNC POINT: Release publishes the rings reset just before; pairs
        // with the Acquire load in `is_current`, after which the client
        // pushes and pops. Relaxed on failure: nothing was published.
        slot.word
            .compare_exchange(
                pack(generation, CLAIMED),
                pack(generation, ACTIVE),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .map(drop)
            .map_err(|_| SlotError::Stale)
    }

    /// Daemon side: whether some live party holds slot `index`'s liveness
    /// lock (the word alone proves nothing against stray writes).
    pub fn is_held(&self, index: u32) -> Result<bool, SlotError> {
        self.slot(index)?;
        Ok(self.locks.is_held(index)?)
    }

    /// Reads slot `index`'s `(generation, state)` without probing liveness:
    /// cheap enough for every poll of the slot's ring (daemon side).
    pub fn word(&self, index: u32) -> Result<(u32, u32), SlotError> {
        // Acquire: pairs with the Release CASes that change the word, so a
        // claim seen here has its rings prepared.
        Ok(unpack(self.slot(index)?.word.load(Ordering::Acquire)))
    }

    /// Reads slot `index` and probes its owner's liveness (daemon side).
    pub fn status(&self, index: u32) -> Result<SlotStatus, SlotError> {
        let slot = self.slot(index)?;
        // Acquire: pairs with the Release CAS that published CLAIMED, so
        // the claimant's pid is visible.
        let raw = slot.word.load(Ordering::Acquire);
        let (generation, state) = unpack(raw);
        // Relaxed: ordered by the Acquire above.
        let pid = slot.pid.load(Ordering::Relaxed);
        // The probe comes after the word load: a claim we saw was made while
        // its owner held the lock, so "not held" now means dead or released.
        let alive = state != FREE && self.locks.is_held(index)?;
        Ok(SlotStatus {
            index,
            generation,
            state,
            pid,
            alive,
            raw,
        })
    }

    /// Statuses of all non-FREE slots (daemon side), skipping slots whose
    /// probe failed.
    pub fn occupied(&self) -> impl Iterator<Item = SlotStatus> + '_ {
        (0..u32::try_from(self.slots.len()).unwrap_or(u32::MAX))
            .filter_map(|i| self.status(i).ok())
            .filter(|s| s.state != FREE)
    }

    /// Whether `claim` is the slot's current claim and the daemon has
    /// adopted it (its rings are reset and may be used).
    pub fn is_current(&self, claim: Claim) -> bool {
        self.slot(claim.index)
            // SYNC POINT: Acquire pairs with the Release CAS in `activate`,
            // so the daemon's reset of the rings is visible before we use
            // them.
            .map(|s| s.word.load(Ordering::Acquire) == pack(claim.generation, ACTIVE))
            .unwrap_or(false)
    }

    /// Frees the slot described by `dead` (from [`SlotTable::status`]) if it
    /// is still in that exact state and its owner is still not alive. Call
    /// after cleaning up the dead client's resources.
    pub fn reclaim(&self, dead: SlotStatus) -> Result<(), SlotError> {
        let slot = self.slot(dead.index)?;
        if dead.state == FREE {
            return Err(SlotError::Stale);
        }
        // Re-probe: the status may be old.
        if self.locks.is_held(dead.index)? {
            return Err(SlotError::Alive);
        }
        // Release: our cleanup happens-before the next claimant's Acquire.
        // Relaxed on failure: the slot moved on, nothing to reclaim.
        slot.word
            .compare_exchange(
                dead.raw,
                pack(dead.generation.wrapping_add(1), FREE),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .map(drop)
            .map_err(|_| SlotError::Stale)
    }

    /// Raw word of slot `index` (diagnostics, model checks).
    #[doc(hidden)]
    pub fn raw_word(&self, index: u32) -> Option<(u32, u32)> {
        // Acquire: diagnostic read ordered like `status`.
        self.slot(index)
            .ok()
            .map(|s| unpack(s.word.load(Ordering::Acquire)))
    }

    /// Overwrites slot `index`'s word (tests: simulate a hostile peer).
    #[doc(hidden)]
    pub fn poke(&self, index: u32, generation: u32, state: u32) {
        if let Ok(s) = self.slot(index) {
            // Relaxed: test hook.
            s.word.store(pack(generation, state), Ordering::Relaxed);
        }
    }
}

/// The daemon's record of who holds one slot, kept in step with the slot
/// word by [`Tenancy::settle`]: the hand-over protocol's daemon side.
///
/// The daemon serves a slot only while its word is `(g, ACTIVE)` for the
/// generation `g` it adopted itself. Whatever the slot's client holds
/// (locks, pages) is released ("forgotten") only when its holder is
/// provably gone: a new claim (CLAIMED, made under the exclusive lock), a
/// probe that finds the lock free, or a sweep that finds the owner dead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tenancy {
    /// Generation the daemon adopted and whose client still holds whatever
    /// the slot holds; `None` when the slot holds nothing.
    owner: Option<u32>,
}

impl Tenancy {
    /// Nobody adopted yet.
    pub const fn new() -> Self {
        Self { owner: None }
    }

    /// Generation of the client whose resources the slot holds.
    pub fn owner(&self) -> Option<u32> {
        self.owner
    }

    /// Whether `word` (from [`SlotTable::word`]) is the claim the daemon
    /// adopted and serves.
    pub fn serves(&self, word: (u32, u32)) -> bool {
        word.1 == ACTIVE && self.owner == Some(word.0)
    }

    /// Whether a record popped from the slot's request ring, stamped with
    /// `generation` by its client, may run: the slot word (re-read after
    /// the pop) must still be the served claim, and the record must be that
    /// claim's. A record of another generation is dropped unanswered.
    pub fn admits(&self, word: (u32, u32), generation: u32) -> bool {
        self.serves(word) && self.owner == Some(generation)
    }

    /// Brings the tenancy in step with `word` (just read with
    /// [`SlotTable::word`]); returns whether the slot is served.
    ///
    /// * `(g, CLAIMED)` after the served claim's holder released it (or on
    ///   a slot that holds nothing): a new claimant, so the previous holder
    ///   is gone: `forget` what it held, `reset` the rings, then publish
    ///   `(g, ACTIVE)` ([`SlotTable::activate`]).
    /// * any other word but the served one while the slot holds something:
    ///   release it only if `probe` is allowed and the liveness lock is
    ///   free (a stray write of FREE over a live client's word releases
    ///   nothing; the daemon just stops serving it).
    ///
    /// Call from the daemon's single thread, never between a `pop` and the
    /// end of that record's handling (reset must not race a pop).
    pub fn settle<L: SlotLocks>(
        &mut self,
        table: &SlotTable<'_, L>,
        index: u32,
        word: (u32, u32),
        probe: bool,
        forget: &mut dyn FnMut(),
        reset: &mut dyn FnMut(),
    ) -> bool {
        if self.serves(word) {
            return true;
        }
        // A claim over a served slot is honest only if the served claim was
        // released (see the module docs); a forged one is handled below as
        // any other unexpected word.
        let honest = self.owner.is_none_or(|g| table.released(index, g));
        if word.1 == CLAIMED && honest {
            if self.owner.take().is_some() {
                forget();
            }
            reset();
            // SYNC POINT: the Release CAS in `activate` publishes `reset`;
            // the client acquires it in `is_current`.
            if table.activate(index, word.0).is_ok() {
                self.owner = Some(word.0);
                return true;
            }
            return false;
        }
        if self.owner.is_some() && probe && table.is_held(index) == Ok(false) {
            // The lock is free: the holder released or died. (Probe errors
            // prove nothing: keep everything.)
            self.owner = None;
            forget();
        }
        false
    }

    /// The slot's owner was found dead (not FREE, lock free): forget what
    /// it held. Call before [`SlotTable::reclaim`].
    pub fn vacate(&mut self, forget: &mut dyn FnMut()) {
        if self.owner.take().is_some() {
            forget();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
