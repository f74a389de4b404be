//! What radixd keeps in its shared-memory segment, on top of the generic
//! layout of `radixd-ipc`:
//!
//! ```text
//! [ipc header][daemon doorbell][Info][slot table][client blocks: rings + scratch]
//! [user area: reader table | LiveStats | BindingBoard | engine region]
//! ```
//!
//! [`Info`] sits at a fixed offset so a client can learn the configuration
//! (and from it the whole layout and its hash) before it trusts anything
//! else. The daemon fills `Info` and formats the engine, then sets
//! `Info::serving` last.

use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr::NonNull;

use radixd_ipc::sync::{AtomicU64, Ordering};
use std::time::Duration;

use radixd_ipc::{
    Board, EpochClock, LayoutConfig, LayoutError, Offset, ReaderSlot, RegionError, Segment,
    SegmentLayout, ShmSafe, INFO_BYTES,
};

pub use crate::binding::{BindingBoard, BINDING_BYTES};
use crate::engine::layout::ENGINE_VERSION;
use crate::engine::{
    ComponentStats, Components, EngineLayout, MambaConfig, Policy, Recency, Region, Stats,
    SwaConfig, REGION_ALIGN,
};
pub use crate::readers::{SharedGrace, ShmGrace};
use crate::wire::{WireReply, WireRequest};

/// Version of radixd's own structures (`Info`, `LiveStats`, the wire
/// records and the ops they carry, the engine layout); mixed into the
/// layout hash. 3: the anchored ops `MatchAt`/`InsertAt` and `aux`; 4:
/// the component ops and `Info`'s components; 5: the pool binding (`Bind`,
/// `BindingBoard`); 6: groups (`Join`, their boards); 7: the hybrid
/// step's ops (`AllocPaired`, `LockPaired`, `InsertPaired`,
/// `AllocStates`, `FreeStates`), counted requests and
/// `LiveStats::free_holder`; 8: the eviction policy (`Info`'s policy
/// words, an insert's hints, `FLAG_HINTS`); 9: `EvictLeaf`, a step of
/// SGLang's eviction walk (the TreeCore's); 10: an `InsertWith` or
/// `InsertPaired` without a lock answers the key's node, its lock flag off
/// (a client of 9 took any handle in those answers for a lock); 11: a
/// hybrid insert (`InsertWith`, `InsertPaired`) takes an insert's hints
/// (a daemon of 10 refuses them as malformed).
pub const PROTOCOL_VERSION: u32 = 11;
/// Requests (and replies) a client may have in flight.
pub const RING_CAPACITY: u32 = 64;

/// The daemon's configuration, readable by every client.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Info {
    /// 0 until everything else in the segment is in place; then 1.
    pub serving: AtomicU64,
    pub protocol: AtomicU64,
    pub page_size: AtomicU64,
    pub capacity: AtomicU64,
    pub clients: AtomicU64,
    pub scratch_bytes: AtomicU64,
    /// Set when the daemon shuts down cleanly.
    pub stopping: AtomicU64,
    /// The secondary components the engine keeps: [`COMPONENT_SWA`] |
    /// [`COMPONENT_MAMBA`] (0: FULL alone), with their settings below
    /// (zero for a component that is off).
    pub components: AtomicU64,
    pub swa_window: AtomicU64,
    pub swa_capacity: AtomicU64,
    pub mamba_capacity: AtomicU64,
    /// Bytes of the store's data region (`--store`; 0: no store). Its
    /// file is `/dev/shm/<name>.store`, ready before `serving`.
    pub store_bytes: AtomicU64,
    /// What a split counts as a use of (`--recency`): [`RECENCY_EXACT`]
    /// (0, what a daemon that predates the field leaves) or
    /// [`RECENCY_SGLANG`]. Backends that answer as SGLang read it.
    pub recency: AtomicU64,
    /// The eviction policy (`--eviction-policy`, with
    /// `--eviction-policy-config`): [`Policy::to_words`], its index in
    /// [`Policy::NAMES`] then its parameters. All zero (what a daemon
    /// that predates the field leaves) is LRU.
    pub policy: [AtomicU64; 3],
    pub _reserved: [AtomicU64; 16],
}

/// Bit of [`Info::components`]: SWA is on.
pub const COMPONENT_SWA: u64 = 1;
/// Bit of [`Info::components`]: MAMBA is on.
pub const COMPONENT_MAMBA: u64 = 2;

/// [`Info::recency`] of [`Recency::Exact`].
pub const RECENCY_EXACT: u64 = 0;
/// [`Info::recency`] of [`Recency::Sglang`].
pub const RECENCY_SGLANG: u64 = 1;

const _: () = assert!(size_of::<Info>() as u64 == INFO_BYTES);

// SAFETY: nothing but atomics, valid for every bit pattern.
unsafe impl ShmSafe for Info {}

/// Buckets of the service-time histogram.
pub const HISTOGRAM_BUCKETS: usize = 256;

/// Live figures the daemon publishes for `radixd stat`.
#[repr(C)]
#[derive(Debug)]
pub struct LiveStats {
    /// Requests answered.
    pub requests: AtomicU64,
    /// Requests answered with an error.
    pub rejected: AtomicU64,
    /// Clients connected.
    pub clients: AtomicU64,
    /// Dead clients cleaned up.
    pub reaped: AtomicU64,
    /// `alloc`s refused because readers (stalled `peek`s) still held pages
    /// it had evicted, after waiting for them to be expired.
    pub held_by_readers: AtomicU64,
    /// Engine figures, as [`Stats`] plus sessions, refreshed as they change.
    pub engine: [AtomicU64; Stats::LEN + 1],
    /// 1 when the daemon publishes KV events (`--kv-events`).
    pub events_enabled: AtomicU64,
    /// KV event batches published (the next sequence number).
    pub events_batches: AtomicU64,
    /// Times the KV event queue overflowed, each answered by a resync.
    pub events_overflows: AtomicU64,
    /// Service time of one request in `daemon::TIME_EVERY` (16), log-linear
    /// buckets ([`bucket_of`]).
    pub service_ns: [AtomicU64; HISTOGRAM_BUCKETS],
    /// The secondary components' figures ([`ComponentStats`] in
    /// declaration order), refreshed with `engine`; zero when only FULL is
    /// on.
    pub components: [AtomicU64; COMPONENT_FIGURES],
    /// Tensor-parallel groups (`crate::group`): groups with a connected
    /// rank, ranks connected, steps kept for ranks behind.
    pub groups: [AtomicU64; 3],
    /// The client (`slot | generation << 32`) whose last answer carried
    /// the pools' free counts as they still are ([`FREE_HOLDER_NONE`]:
    /// nobody's). The daemon moves it on a counted answer and when the
    /// counts change otherwise, before the answer is pushed: a client that
    /// reads its own id here after its answer may use the counts it kept
    /// (see [`crate::Client::free_counts`]).
    pub free_holder: AtomicU64,
}

/// [`LiveStats::free_holder`] when no client's kept counts are current.
pub const FREE_HOLDER_NONE: u64 = u64::MAX;

/// Figures of [`ComponentStats`] in [`LiveStats::components`].
pub const COMPONENT_FIGURES: usize = ComponentStats::LEN;

/// Bytes set aside for [`LiveStats`] at the start of the user area.
const LIVE_STATS_BYTES: u64 = 4096;
const _: () = assert!(size_of::<LiveStats>() as u64 <= LIVE_STATS_BYTES);

// SAFETY: nothing but atomics, valid for every bit pattern.
unsafe impl ShmSafe for LiveStats {}

/// Histogram bucket of a duration in nanoseconds: exact below 16 ns, then
/// four buckets per power of two.
pub fn bucket_of(ns: u64) -> usize {
    if ns < 16 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros() as usize;
    let sub = (ns >> (exp - 2)) as usize & 3;
    16 + (exp - 4) * 4 + sub
}

/// Smallest duration in `bucket`, in nanoseconds.
pub fn bucket_floor(bucket: usize) -> u64 {
    if bucket < 16 {
        return bucket as u64;
    }
    let exp = (bucket - 16) / 4 + 4;
    let sub = (bucket - 16) % 4;
    (4 + sub as u64) << (exp - 2)
}

impl LiveStats {
    /// Adds `n` to one of these counters. The daemon is their only writer,
    /// so a load and a store do: no locked read-modify-write on the request
    /// path.
    pub fn bump(counter: &AtomicU64, n: i64) {
        // Relaxed: statistics; readers take best-effort snapshots and no
        // other write happens to the counter.
        let v = counter.load(Ordering::Relaxed).wrapping_add_signed(n);
        counter.store(v, Ordering::Relaxed);
    }

    /// Publishes the engine's figures and the number of sessions.
    pub fn set_engine(&self, s: &Stats, sessions: u64) {
        let values = s.to_array().into_iter().chain([sessions]);
        for (slot, v) in self.engine.iter().zip(values) {
            // Relaxed: independent gauges, read as a best-effort snapshot.
            slot.store(v, Ordering::Relaxed);
        }
    }

    /// Publishes the groups' figures.
    pub fn set_groups(&self, g: crate::group::GroupFigures) {
        for (slot, v) in self.groups.iter().zip([g.groups, g.ranks, g.kept_steps]) {
            // Relaxed: independent gauges, read as a best-effort snapshot.
            slot.store(v, Ordering::Relaxed);
        }
    }

    /// Reads the groups' figures back.
    pub fn groups(&self) -> crate::group::GroupFigures {
        // Relaxed: independent gauges, a best-effort snapshot.
        let [groups, ranks, kept_steps] = self.groups.each_ref().map(|a| a.load(Ordering::Relaxed));
        crate::group::GroupFigures {
            groups,
            ranks,
            kept_steps,
        }
    }

    /// Publishes the secondary components' figures.
    pub fn set_components(&self, c: &ComponentStats) {
        for (slot, v) in self.components.iter().zip(c.to_array()) {
            // Relaxed: independent gauges, read as a best-effort snapshot.
            slot.store(v, Ordering::Relaxed);
        }
    }

    /// Reads the secondary components' figures back.
    pub fn components(&self) -> ComponentStats {
        // Relaxed: independent gauges.
        ComponentStats::from_array(std::array::from_fn(|i| {
            self.components[i].load(Ordering::Relaxed)
        }))
    }

    /// Reads the engine's figures back.
    pub fn engine(&self) -> (Stats, u64) {
        let mut figures = [0u64; Stats::LEN];
        for (v, slot) in figures.iter_mut().zip(&self.engine) {
            // Relaxed: independent gauges.
            *v = slot.load(Ordering::Relaxed);
        }
        // Relaxed: as above.
        (
            Stats::from_array(figures),
            self.engine[Stats::LEN].load(Ordering::Relaxed),
        )
    }
}

/// Everything that sizes a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentConfig {
    pub page_size: u32,
    pub capacity: u32,
    pub clients: u32,
    pub scratch_bytes: u64,
}

/// The carved segment: the ipc layout plus where radixd's parts sit.
#[derive(Debug)]
pub struct SharedLayout {
    pub config: SegmentConfig,
    pub ipc: SegmentLayout<WireRequest, WireReply>,
    pub engine: EngineLayout,
    /// Offset of the readers' [`EpochClock`], followed by one
    /// [`ReaderSlot`] per client slot (writable by clients: outside the
    /// read-only part).
    pub readers_at: u64,
    /// Offset of the groups' boards ([`radixd_ipc::Board`], see
    /// `crate::group`; writable by clients, whose cursors are there).
    pub boards_at: u64,
    /// Boards: one per group index below this.
    pub boards: u32,
    /// Offset of [`LiveStats`]; from here to the end clients map read-only.
    pub live_stats: u64,
    /// Offset of the [`BindingBoard`] (what the pool is bound to).
    pub binding: u64,
    /// Offset of the engine region.
    pub engine_at: u64,
}

/// Why a configuration gives no layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutProblem {
    Engine(crate::engine::ConfigError),
    Ipc(LayoutError),
    /// Fewer than one or more than 1024 clients.
    Clients(u32),
    /// Scratch below 64 KiB or above 1 GiB.
    Scratch(u64),
}

impl std::fmt::Display for LayoutProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Engine(e) => e.fmt(f),
            Self::Ipc(e) => e.fmt(f),
            Self::Clients(n) => write!(f, "{n} clients is outside 1..=1024"),
            Self::Scratch(n) => write!(f, "scratch of {n} bytes is outside 64 KiB..=1 GiB"),
        }
    }
}

impl std::error::Error for LayoutProblem {}

impl SharedLayout {
    /// Carves a segment for `config`.
    pub fn new(config: SegmentConfig) -> Result<Self, LayoutProblem> {
        if !(1..=1024).contains(&config.clients) {
            return Err(LayoutProblem::Clients(config.clients));
        }
        if !(64 << 10..=1 << 30).contains(&config.scratch_bytes) {
            return Err(LayoutProblem::Scratch(config.scratch_bytes));
        }
        let engine =
            EngineLayout::new(config.page_size, config.capacity).map_err(LayoutProblem::Engine)?;
        let ipc = SegmentLayout::new(LayoutConfig {
            clients: config.clients,
            request_capacity: RING_CAPACITY,
            response_capacity: RING_CAPACITY,
            scratch_bytes: config.scratch_bytes,
            user_bytes: readers_bytes(config.clients)
                + boards_bytes(config.clients)
                + LIVE_STATS_BYTES
                + BINDING_BYTES
                + engine.size() as u64,
            // Both versions are hashed, so a client of another protocol or
            // engine layout is refused at connect (`LayoutMismatch`).
            user_version: (PROTOCOL_VERSION << 16) | ENGINE_VERSION,
        })
        .map_err(LayoutProblem::Ipc)?;
        // The user area is page aligned and the reader table a whole
        // number of pages, so the stats page, the binding's page and the
        // engine region after them are too (what `mprotect` in the client and REGION_ALIGN need).
        let readers_at = ipc.user;
        let boards_at = readers_at + readers_bytes(config.clients);
        let live_stats = boards_at + boards_bytes(config.clients);
        let binding = live_stats + LIVE_STATS_BYTES;
        let engine_at = binding + BINDING_BYTES;
        debug_assert_eq!(engine_at % REGION_ALIGN as u64, 0);
        Ok(Self {
            config,
            ipc,
            engine,
            readers_at,
            boards_at,
            boards: boards_for(config.clients),
            live_stats,
            binding,
            engine_at,
        })
    }

    /// The readers' epoch clock and their slots (one per client slot).
    pub fn readers<'s>(
        &self,
        segment: &'s Segment,
    ) -> Result<(&'s EpochClock, &'s [ReaderSlot]), RegionError> {
        let clock = segment.get(Offset::<EpochClock>::new(self.readers_at))?;
        let slots = segment.slice(
            Offset::<ReaderSlot>::new(self.readers_at + size_of::<EpochClock>() as u64),
            u64::from(self.config.clients),
        )?;
        Ok((clock, slots))
    }
}

/// Group boards for `clients` slots: a group of two ranks or more has
/// one, so half as many as slots, and at most 8 (about 2 MiB): a daemon
/// serves one KV pool, which is one server's, so one group at a time is
/// the rule; groups past the boards are served through the daemon alone.
fn boards_for(clients: u32) -> u32 {
    (clients / 2).clamp(1, 8)
}

/// Bytes of the group boards for `clients` slots, in whole pages.
fn boards_bytes(clients: u32) -> u64 {
    let bytes = size_of::<Board>() as u64 * u64::from(boards_for(clients));
    bytes.div_ceil(LIVE_STATS_BYTES) * LIVE_STATS_BYTES
}

impl SharedLayout {
    /// Board `index` (a group's: see `crate::group`), if the segment has
    /// one for it.
    pub fn board<'s>(&self, segment: &'s Segment, index: u32) -> Option<&'s Board> {
        if index >= self.boards {
            return None;
        }
        let at = self.boards_at + u64::from(index) * size_of::<Board>() as u64;
        segment.get(Offset::<Board>::new(at)).ok()
    }
}

/// Bytes of the reader table for `clients` slots, in whole pages.
fn readers_bytes(clients: u32) -> u64 {
    let bytes = (size_of::<EpochClock>() + size_of::<ReaderSlot>() * clients as usize) as u64;
    bytes.div_ceil(LIVE_STATS_BYTES) * LIVE_STATS_BYTES
}

impl ShmGrace {
    /// The grace period over `segment`'s reader table, expiring readers
    /// that block it for longer than `expire_after`.
    ///
    /// # Safety
    ///
    /// `segment` must stay mapped for as long as the value lives (the
    /// daemon drops its engine, which owns this, before its segment), and
    /// only one collector may exist for the segment.
    pub unsafe fn new(
        segment: &Segment,
        layout: &SharedLayout,
        expire_after: Duration,
    ) -> Result<Self, RegionError> {
        let (clock, readers) = layout.readers(segment)?;
        // SAFETY: the table lies in the segment, which outlives the value
        // (forwarded from the caller), as does the one-collector rule.
        Ok(unsafe { Self::over(clock, readers, expire_after) })
    }
}

/// Writes `config` into `info` (not `serving`).
pub fn write_info(info: &Info, config: &SegmentConfig) {
    // Relaxed: published by the Release store of `ready`.
    info.protocol
        .store(u64::from(PROTOCOL_VERSION), Ordering::Relaxed);
    info.page_size
        .store(u64::from(config.page_size), Ordering::Relaxed);
    info.capacity
        .store(u64::from(config.capacity), Ordering::Relaxed);
    info.clients
        .store(u64::from(config.clients), Ordering::Relaxed);
    info.scratch_bytes
        .store(config.scratch_bytes, Ordering::Relaxed);
}

/// Reads the configuration from a serving `info`; `None` if a field does not
/// fit its type.
pub fn read_info(info: &Info) -> Option<SegmentConfig> {
    // Relaxed: the caller's Acquire load of `ready` ordered these.
    let get = |x: &AtomicU64| x.load(Ordering::Relaxed);
    Some(SegmentConfig {
        page_size: u32::try_from(get(&info.page_size)).ok()?,
        capacity: u32::try_from(get(&info.capacity)).ok()?,
        clients: u32::try_from(get(&info.clients)).ok()?,
        scratch_bytes: get(&info.scratch_bytes),
    })
}

/// Writes the engine's `components` into `info` (before `serving`).
pub fn write_components(info: &Info, components: &Components) {
    let bits = components.swa.map_or(0, |_| COMPONENT_SWA)
        | components.mamba.map_or(0, |_| COMPONENT_MAMBA);
    let swa = components.swa.unwrap_or(SwaConfig {
        window: 0,
        capacity: 0,
    });
    let mamba = components.mamba.map_or(0, |m| m.capacity);
    // Relaxed: published by the Release store of `serving`.
    info.components.store(bits, Ordering::Relaxed);
    info.swa_window
        .store(u64::from(swa.window), Ordering::Relaxed);
    info.swa_capacity
        .store(u64::from(swa.capacity), Ordering::Relaxed);
    info.mamba_capacity
        .store(u64::from(mamba), Ordering::Relaxed);
}

/// Reads the components from a serving `info`; `None` if they do not
/// make a valid configuration.
pub fn read_components(info: &Info) -> Option<Components> {
    // Relaxed: the caller's Acquire load of `serving` ordered these.
    let get = |x: &AtomicU64| u32::try_from(x.load(Ordering::Relaxed)).ok();
    // Relaxed: as above.
    let bits = info.components.load(Ordering::Relaxed);
    if bits & !(COMPONENT_SWA | COMPONENT_MAMBA) != 0 {
        return None;
    }
    let mut c = Components::full();
    if bits & COMPONENT_SWA != 0 {
        c.swa = Some(SwaConfig {
            window: get(&info.swa_window)?,
            capacity: get(&info.swa_capacity)?,
        });
    }
    if bits & COMPONENT_MAMBA != 0 {
        c.mamba = Some(MambaConfig {
            capacity: get(&info.mamba_capacity)?,
        });
    }
    c.check().ok().map(|()| c)
}

/// Writes the engine's `recency` into `info` (before `serving`).
pub fn write_recency(info: &Info, recency: Recency) {
    let word = match recency {
        Recency::Exact => RECENCY_EXACT,
        Recency::Sglang => RECENCY_SGLANG,
    };
    // Relaxed: published by the Release store of `serving`.
    info.recency.store(word, Ordering::Relaxed);
}

/// Reads the recency from a serving `info`; `None` for a word that names
/// no rule.
pub fn read_recency(info: &Info) -> Option<Recency> {
    // Relaxed: the caller's Acquire load of `serving` ordered it.
    match info.recency.load(Ordering::Relaxed) {
        RECENCY_EXACT => Some(Recency::Exact),
        RECENCY_SGLANG => Some(Recency::Sglang),
        _ => None,
    }
}

/// Writes the engine's eviction `policy` into `info` (before `serving`).
pub fn write_policy(info: &Info, policy: Policy) {
    for (word, value) in info.policy.iter().zip(policy.to_words()) {
        // Relaxed: published by the Release store of `serving`.
        word.store(value, Ordering::Relaxed);
    }
}

/// Reads the eviction policy from a serving `info`; `None` for words that
/// name none.
pub fn read_policy(info: &Info) -> Option<Policy> {
    // Relaxed: the caller's Acquire load of `serving` ordered them.
    let words = info.policy.each_ref().map(|w| w.load(Ordering::Relaxed));
    Policy::from_words(words)
}

/// The engine region inside a mapped segment (daemon side).
pub struct ShmRegion<'s> {
    ptr: NonNull<u8>,
    len: usize,
    _segment: PhantomData<&'s Segment>,
}

impl<'s> ShmRegion<'s> {
    /// The engine region of `layout` in `segment`.
    ///
    /// # Safety
    ///
    /// Only the daemon that created `segment` may call this, once: the region
    /// must have no other writer in any process.
    pub unsafe fn new(segment: &'s Segment, layout: &SharedLayout) -> Option<Self> {
        let len = layout.engine.size();
        let ptr = segment.region(layout.engine_at, len as u64).ok()?;
        Some(Self {
            ptr,
            len,
            _segment: PhantomData,
        })
    }
}

// SAFETY: the pointer comes from a live mapping of at least `len` bytes that
// outlives `'s`, the engine offset is page aligned (so REGION_ALIGN holds),
// and the caller of `new` promised exclusive write access.
unsafe impl Region for ShmRegion<'_> {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_monotonic_and_cover_u64() {
        let mut last = 0;
        for shift in 0..64 {
            for ns in [1u64 << shift, (1u64 << shift) + (1u64 << shift) / 3] {
                let b = bucket_of(ns);
                assert!(b >= last && b < HISTOGRAM_BUCKETS, "{ns} -> {b}");
                assert!(bucket_floor(b) <= ns, "floor of {b} above {ns}");
                last = b;
            }
        }
        assert_eq!(bucket_of(u64::MAX), HISTOGRAM_BUCKETS - 1);
    }

    /// The reader table holds the epoch clock and one slot per client,
    /// rounded up to whole pages, for client counts past a page's worth
    /// too.
    #[test]
    fn the_reader_table_holds_the_clock_and_every_slot() {
        let clock = size_of::<EpochClock>() as u64;
        let slot = size_of::<ReaderSlot>() as u64;
        for clients in [1u32, 4, 63, 64, 65, 1000] {
            let need = clock + slot * u64::from(clients);
            let bytes = readers_bytes(clients);
            assert_eq!(bytes % LIVE_STATS_BYTES, 0, "{clients} clients");
            assert!(
                bytes >= need && bytes - need < LIVE_STATS_BYTES,
                "{clients} clients: {bytes} bytes for {need}"
            );
        }
    }

    #[test]
    fn layouts_differ_by_config_and_align_the_engine() {
        let c = SegmentConfig {
            page_size: 16,
            capacity: 1024,
            clients: 4,
            scratch_bytes: 1 << 20,
        };
        let a = SharedLayout::new(c).unwrap();
        let b = SharedLayout::new(SegmentConfig { clients: 5, ..c }).unwrap();
        assert_ne!(a.ipc.hash, b.ipc.hash);
        assert_eq!(a.engine_at % 4096, 0);
        assert!(SharedLayout::new(SegmentConfig { clients: 0, ..c }).is_err());
        assert!(SharedLayout::new(SegmentConfig { page_size: 0, ..c }).is_err());
    }

    #[test]
    fn components_round_trip_through_info_and_garbage_is_refused() {
        let info = Info::default();
        for c in [
            Components::full(),
            Components {
                swa: Some(SwaConfig {
                    window: 512,
                    capacity: 77,
                }),
                mamba: None,
            },
            Components {
                swa: None,
                mamba: Some(MambaConfig { capacity: 9 }),
            },
        ] {
            write_components(&info, &c);
            assert_eq!(read_components(&info), Some(c));
        }
        // Relaxed, all: one thread writes and reads them.
        info.components.store(4, Ordering::Relaxed);
        assert_eq!(read_components(&info), None);
        info.components.store(COMPONENT_SWA, Ordering::Relaxed);
        info.swa_window.store(0, Ordering::Relaxed);
        assert_eq!(read_components(&info), None);
        info.swa_window.store(1 << 40, Ordering::Relaxed);
        assert_eq!(read_components(&info), None);
    }

    /// Each bucket's floor falls in it and the nanosecond below it in the
    /// bucket before: the buckets tile `u64` with no gap and no overlap.
    #[test]
    fn each_bucket_starts_at_its_floor() {
        for ns in 0..16 {
            assert_eq!(bucket_of(ns), ns as usize, "exact below 16 ns");
        }
        // Four buckets per power of two from 16 ns: 16, 20, 24, 28, 32, ...
        assert_eq!(bucket_of(20), 17);
        assert_eq!(bucket_of(31), 19);
        assert_eq!(bucket_of(32), 20);
        assert_eq!(bucket_of(1000), 39);
        assert_eq!(bucket_floor(17), 20);
        assert_eq!(bucket_floor(39), 896);
        for b in 1..HISTOGRAM_BUCKETS {
            let floor = bucket_floor(b);
            assert_eq!(bucket_of(floor), b, "floor {floor} of bucket {b}");
            assert_eq!(bucket_of(floor - 1), b - 1, "below the floor of {b}");
        }
    }

    fn zeroed_stats() -> LiveStats {
        let zero = || AtomicU64::new(0);
        LiveStats {
            requests: zero(),
            rejected: zero(),
            clients: zero(),
            reaped: zero(),
            held_by_readers: zero(),
            engine: std::array::from_fn(|_| zero()),
            events_enabled: zero(),
            events_batches: zero(),
            events_overflows: zero(),
            service_ns: std::array::from_fn(|_| zero()),
            components: std::array::from_fn(|_| zero()),
            groups: std::array::from_fn(|_| zero()),
            free_holder: zero(),
        }
    }

    /// What the daemon publishes is what `radixd stat` reads back, every
    /// figure in its place (the sessions after the engine's own).
    #[test]
    fn live_figures_read_back_as_published() {
        let live = zeroed_stats();
        LiveStats::bump(&live.requests, 5);
        LiveStats::bump(&live.requests, -2);
        assert_eq!(live.requests.load(Ordering::Relaxed), 3);
        let stats = Stats::from_array(std::array::from_fn(|i| 10 + i as u64));
        live.set_engine(&stats, 7);
        assert_eq!(live.engine(), (stats, 7));
        let groups = crate::group::GroupFigures {
            groups: 1,
            ranks: 4,
            kept_steps: 9,
        };
        live.set_groups(groups);
        assert_eq!(live.groups(), groups);
        let components = ComponentStats::from_array(std::array::from_fn(|i| 20 + i as u64));
        live.set_components(&components);
        assert_eq!(live.components(), components);
    }

    #[test]
    fn layout_problems_say_what_is_out_of_range() {
        assert_eq!(
            LayoutProblem::Clients(0).to_string(),
            "0 clients is outside 1..=1024"
        );
        assert_eq!(
            LayoutProblem::Scratch(5).to_string(),
            "scratch of 5 bytes is outside 64 KiB..=1 GiB"
        );
    }

    /// Half as many boards as client slots, one at least and eight at
    /// most, in whole pages that hold them all.
    #[test]
    fn the_boards_fill_whole_pages_and_no_more() {
        for (clients, boards) in [(1, 1), (2, 1), (5, 2), (16, 8), (1024, 8)] {
            assert_eq!(boards_for(clients), boards, "{clients} clients");
            let need = size_of::<Board>() as u64 * u64::from(boards);
            let bytes = boards_bytes(clients);
            assert_eq!(bytes % LIVE_STATS_BYTES, 0, "{clients} clients");
            assert!(
                bytes >= need && bytes - need < LIVE_STATS_BYTES,
                "{clients} clients: {bytes} bytes for {need}"
            );
        }
    }

    /// In a real segment: the boards lie one after another right after
    /// the reader table, as many as the layout counts, and the engine
    /// region is where the layout puts it, as long as the engine's layout.
    #[test]
    fn boards_and_the_engine_region_lie_where_the_layout_puts_them() {
        let layout = SharedLayout::new(SegmentConfig {
            page_size: 16,
            capacity: 64,
            clients: 4,
            scratch_bytes: 64 << 10,
        })
        .expect("layout");
        let name = format!("radixd-shared-test-{}", std::process::id());
        let segment = Segment::create_in(
            &std::env::temp_dir(),
            &name,
            layout.ipc.total_size,
            0o600,
            layout.ipc.hash,
        )
        .expect("segment");
        let (clock, _) = layout.readers(&segment).expect("reader table");
        let base = std::ptr::from_ref(clock) as usize - layout.readers_at as usize;
        let at = |b: &Board| std::ptr::from_ref(b) as usize - base;
        assert_eq!(layout.boards, 2);
        assert_eq!(layout.boards_at, layout.readers_at + readers_bytes(4));
        let first = layout.board(&segment, 0).expect("board 0");
        let second = layout.board(&segment, 1).expect("board 1");
        assert_eq!(at(first) as u64, layout.boards_at);
        assert_eq!(at(second) - at(first), size_of::<Board>());
        assert!(layout.board(&segment, 2).is_none(), "past the boards");
        // SAFETY: this test created the segment and maps its engine
        // region once.
        let region = unsafe { ShmRegion::new(&segment, &layout) }.expect("region");
        assert_eq!(region.len(), layout.engine.size());
        assert_eq!((region.as_ptr() as usize - base) as u64, layout.engine_at);
    }

    #[test]
    fn the_policy_round_trips_through_info() {
        let info = Info::default();
        for policy in [
            Policy::Lfu,
            Policy::Tlru {
                threshold: 5,
                next_prompt_estimate: 7,
            },
            Policy::Slru {
                protected_threshold: 3,
            },
        ] {
            write_policy(&info, policy);
            assert_eq!(read_policy(&info), Some(policy));
        }
    }

    #[test]
    fn recency_round_trips_through_info_and_garbage_is_refused() {
        let info = Info::default();
        // A daemon that never wrote the word (zeroed) runs exact.
        assert_eq!(read_recency(&info), Some(Recency::Exact));
        for r in Recency::ALL {
            write_recency(&info, r);
            assert_eq!(read_recency(&info), Some(r));
        }
        // Relaxed: one thread writes and reads it.
        info.recency.store(2, Ordering::Relaxed);
        assert_eq!(read_recency(&info), None);
    }
}
