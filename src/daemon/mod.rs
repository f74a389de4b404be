//! `radixd serve`: one engine in a shared-memory segment, serving every
//! client slot's request ring.
//!
//! The loop polls each active slot's ring, answers up to a batch of requests
//! per slot per round (so no client starves another), and between rounds:
//! every [`SWEEP`] it probes slot liveness and reclaims dead clients (their
//! locks, sessions and pages), expires idle sessions and publishes figures.
//! When every ring is empty it spins for [`SPIN_WINDOW`] (yielding when the
//! host is oversubscribed), then sleeps on the daemon doorbell in short
//! timeouts, so an idle daemon costs nothing and a busy one never pays a
//! futex wake per request. `--busy-poll` never sleeps.

mod store;

use std::fmt;
use std::time::{Duration, Instant};

use radixd_ipc::slots::CLAIMED;
use radixd_ipc::sync::{spin_loop, yield_now, AtomicU32, Ordering};
use radixd_ipc::{
    Consumer, CreateError, Doorbell, LoadSensor, Offset, Producer, ReaderSlot, RegionError,
    RingError, Scratch, Segment, SlotLocks, SlotTable, Spin, Tenancy, INFO_OFFSET,
};

use crate::binding::{Binding, BindingBoard, Released};
use crate::engine::{ClientId, Components, ComponentsError, ConfigError, Engine, CORRUPT};
use crate::group::{self, Groups};
use crate::op::{self, ErrorKind, Rejection, Request};
use crate::shared::{
    bucket_of, write_components, write_info, Info, LayoutProblem, LiveStats, SegmentConfig,
    SharedGrace, SharedLayout, ShmGrace, ShmRegion, HISTOGRAM_BUCKETS,
};
use crate::wire::{self, ScratchWindow, WireReply, WireRequest};

/// How often liveness, session TTLs and published figures are refreshed.
pub const SWEEP: Duration = Duration::from_millis(50);
/// How long the daemon keeps spinning after its last request.
pub const SPIN_WINDOW: Duration = Duration::from_millis(2);
/// Longest single sleep on the doorbell.
pub const SLEEP: Duration = Duration::from_millis(50);
/// How long a reader may hold reclamation back (a `peek` takes
/// microseconds; one that takes this long is stopped, stuck or descheduled
/// on a crowded host) before its announcement is expired: it then throws
/// its copy away and reads again. Every reader in the way is expired this
/// long after it was first found there, all together; meanwhile an `alloc`
/// that needs the pages they hold waits, so this stays short.
pub const READER_EXPIRY: Duration = Duration::from_millis(1);

/// Longest a busy daemon keeps its figures to itself.
const PUBLISH: Duration = Duration::from_millis(1);

/// Rounds of the serving loop between two reads of the clock.
const CLOCK_EVERY: u32 = 32;

/// One request in this many has its service time measured.
pub const TIME_EVERY: u64 = 16;

/// Requests answered per slot per round.
const BATCH: usize = 16;

/// How `radixd serve` runs.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Segment name under /dev/shm.
    pub name: String,
    pub page_size: u32,
    pub capacity: u32,
    pub max_clients: u32,
    pub scratch_bytes: u64,
    /// Permission bits of the segment (0o600 by default).
    pub mode: u32,
    /// Never sleep: trade a core for the lowest latency.
    pub busy_poll: bool,
    /// Release sessions idle for longer than this.
    pub session_ttl: Option<Duration>,
    /// Let clients `reset` the whole shared cache (off: `not_permitted`).
    pub allow_reset: bool,
    /// How long a lock-free reader may hold reclamation back before its
    /// announcement is expired ([`READER_EXPIRY`] by default).
    pub reader_expiry: Duration,
    /// Publish KV events (`--kv-events`); `None`: nothing is recorded.
    pub events: Option<crate::events::EventsConfig>,
    /// The components cached beside FULL (`--components`; FULL alone by
    /// default).
    pub components: Components,
    /// What a split counts as a use of (`--recency`; exact by default).
    pub recency: crate::engine::Recency,
    /// Bytes of the node-wide KV store (`--store SIZE`; `None`: no store).
    pub store: Option<u64>,
    /// Discard the store file a previous daemon left (`--store-reset`).
    pub store_reset: bool,
}

impl Default for ServeConfig {
    /// The defaults of `radixd serve`.
    fn default() -> Self {
        Self {
            name: "radixd".to_owned(),
            page_size: 16,
            capacity: 65_536,
            max_clients: 16,
            scratch_bytes: 16 << 20,
            mode: 0o600,
            busy_poll: false,
            session_ttl: None,
            allow_reset: false,
            reader_expiry: READER_EXPIRY,
            events: None,
            components: Components::full(),
            recency: crate::engine::Recency::default(),
            store: None,
            store_reset: false,
        }
    }
}

/// What a daemon that has started serves.
#[derive(Clone, Debug)]
pub struct Started {
    /// The segment file.
    pub path: std::path::PathBuf,
    /// Its size in bytes (all of it reserved up front).
    pub bytes: u64,
}

/// Why the daemon could not start or stopped early.
#[derive(Debug)]
pub enum ServeError {
    Layout(LayoutProblem),
    Create {
        path: std::path::PathBuf,
        error: CreateError,
    },
    Region(RegionError),
    Ring(RingError),
    Engine(ConfigError),
    /// The components (`--components` and its companions) are refused.
    Components(ComponentsError),
    /// The engine met shared data it cannot trust (a process wrote the
    /// segment behind the daemon's back): the daemon stopped serving and
    /// removed the segment.
    Corrupted(String),
    Events(crate::events::EventsError),
    /// The store could not be opened (created or adopted).
    Store(String),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Layout(e) => write!(f, "bad configuration: {e}"),
            Self::Create {
                path,
                error: CreateError::AlreadyRunning,
            } => write!(f, "a live daemon already serves {}", path.display()),
            Self::Create { path, error } => {
                write!(f, "cannot create {}: {error}", path.display())
            }
            Self::Region(e) => write!(f, "segment layout broken: {e}"),
            Self::Ring(e) => write!(f, "ring setup failed: {e}"),
            Self::Engine(e) => write!(f, "cannot build the engine: {e}"),
            Self::Components(e) => write!(f, "bad components: {e}"),
            Self::Corrupted(m) => write!(
                f,
                "stopped: {m}; the segment was removed (restart the daemon)"
            ),
            Self::Events(e) => write!(f, "cannot publish KV events: {e}"),
            Self::Store(e) => write!(f, "cannot open the store: {e}"),
        }
    }
}

impl std::error::Error for ServeError {}

/// One client slot as the daemon sees it.
struct Peer<'s> {
    requests: Consumer<'s, WireRequest>,
    replies: Producer<'s, WireReply>,
    doorbell: &'s Doorbell,
    scratch: Scratch<'s>,
    /// Which claim the daemon adopted and serves (see `radixd_ipc::Tenancy`).
    tenancy: Tenancy,
    /// Whether the slot word was the served claim at the last look.
    serving: bool,
    /// Earliest time of the next liveness probe of a slot whose word moved
    /// away from the served claim without a new claim (rate limit).
    next_probe: Instant,
    /// A reply that found the ring full; nothing more is read until it goes.
    pending: Option<WireReply>,
    /// A request waiting (an `alloc` for evicted pages that readers still
    /// hold, a group's rank for its slowest rank), and until when it waits;
    /// nothing more is read until it is answered.
    deferred: Option<Deferred>,
    /// The client has made stepped requests on its own (so it cannot join
    /// a group: see `group::Groups::join`).
    alone: bool,
    /// The ring was found corrupt: ignored until the slot is claimed anew.
    broken: bool,
    /// The engine stopped at corrupt shared data while serving this slot.
    corrupt: Option<String>,
    /// The slot's reader announcement, cleared when its client is gone.
    reader: &'s ReaderSlot,
}

/// A request the daemon answers later (see `Peer::deferred`).
struct Deferred {
    record: WireRequest,
    until: Instant,
    why: Wait,
}

/// What a deferred request waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Pages readers hold (an `alloc`).
    Readers,
    /// The slowest rank of the client's group (see `crate::group`).
    Group,
}

/// Runs the daemon until `stop` becomes non-zero.
pub fn serve(config: &ServeConfig, stop: &AtomicU32) -> Result<(), ServeError> {
    serve_reporting(config, stop, |_| {})
}

/// [`serve`], calling `started` once the segment is created and ready (so
/// a caller announces a daemon only once nothing can fail at start-up).
pub fn serve_reporting(
    config: &ServeConfig,
    stop: &AtomicU32,
    started: impl FnOnce(&Started),
) -> Result<(), ServeError> {
    let seg_config = SegmentConfig {
        page_size: config.page_size,
        capacity: config.capacity,
        clients: config.max_clients,
        scratch_bytes: config.scratch_bytes,
    };
    // Checked before the segment exists: a refused configuration leaves
    // nothing behind.
    config.components.check().map_err(ServeError::Components)?;
    let layout = SharedLayout::new(seg_config).map_err(ServeError::Layout)?;
    let segment = Segment::create(
        &config.name,
        layout.ipc.total_size,
        config.mode,
        layout.ipc.hash,
    )
    .map_err(|error| ServeError::Create {
        path: std::path::Path::new(radixd_ipc::segment::SHM_DIR).join(&config.name),
        error,
    })?;
    let info: &Info = segment
        .get(Offset::new(INFO_OFFSET))
        .map_err(ServeError::Region)?;
    let live: &LiveStats = segment
        .get(Offset::new(layout.live_stats))
        .map_err(ServeError::Region)?;
    let board: &BindingBoard = segment
        .get(Offset::new(layout.binding))
        .map_err(ServeError::Region)?;
    // SAFETY: this daemon created the segment and builds its only engine.
    let region = unsafe { ShmRegion::new(&segment, &layout) }.ok_or(ServeError::Region(
        RegionError::OutOfBounds {
            offset: layout.engine_at,
            len: 0,
            size: segment.len(),
        },
    ))?;
    let mut engine = Engine::in_region(region, layout.engine).map_err(ServeError::Engine)?;
    if !config.components.is_full_only() {
        engine
            .set_components(config.components)
            .map_err(ServeError::Components)?;
    }
    engine.set_recency(config.recency);
    // SAFETY: this daemon created the segment and is its only collector;
    // `engine`, which owns the grace, is declared after `segment` and so
    // dropped before it.
    let grace = unsafe { ShmGrace::new(&segment, &layout, config.reader_expiry) }
        .map_err(ServeError::Region)?;
    let grace = SharedGrace::new(grace);
    engine.set_grace(Box::new(grace.clone()));
    let mut kv_store = store::open(config, &grace, info)?;
    let (_, readers) = layout.readers(&segment).map_err(ServeError::Region)?;
    let mut events = crate::events::Events::start(
        config.events.as_ref(),
        &mut engine,
        kv_store.as_mut().map(|s| &mut s.index),
        live,
    )
    .map_err(ServeError::Events)?;
    let mut peers = (0..config.max_clients)
        .map(|i| peer(&segment, &layout, readers, i))
        .collect::<Result<Vec<_>, _>>()?;
    let slots = segment
        .slots(layout.ipc.slots, config.max_clients)
        .map_err(ServeError::Region)?;
    let doorbell: &Doorbell = segment
        .get(layout.ipc.daemon_doorbell)
        .map_err(ServeError::Region)?;
    write_info(info, &seg_config);
    write_components(info, &engine.components());
    crate::shared::write_recency(info, engine.recency());
    publish_figures(live, &engine);
    // Release: publishes the configuration and the formatted engine; pairs
    // with the Acquire load of `ready` in `Client::connect`.
    info.serving.store(1, Ordering::Release);
    started(&Started {
        path: segment.path().to_owned(),
        bytes: segment.len(),
    });

    let mut last_sweep = Instant::now();
    let mut last_work = Instant::now();
    let mut last_publish = Instant::now();
    let mut unpublished = false;
    // Rounds run, and whether one had work since the clock was last read.
    let (mut rounds, mut worked) = (0u32, false);
    let mut load = LoadSensor::new();
    let mut service = Service {
        tally: Tally::new(),
        spare: op::Spare::default(),
        out: Vec::new(),
        allow_reset: config.allow_reset,
        // The reader is expired by then, and its pages come back.
        reader_wait: config.reader_expiry * 2,
        binding: Binding::new(board),
        groups: Groups::new(),
        boards: (0..layout.boards)
            .map(|i| layout.board(&segment, i))
            .collect::<Option<Vec<_>>>()
            .ok_or(ServeError::Region(RegionError::OutOfBounds {
                offset: layout.boards_at,
                len: u64::from(layout.boards),
                size: segment.len(),
            }))?,
        board_out: Vec::new(),
        store: kv_store,
    };
    // Relaxed: a plain flag set by the signal handler; nothing to order.
    while stop.load(Ordering::Relaxed) == 0 {
        let mut work = 0;
        for (index, peer) in peers.iter_mut().enumerate() {
            let index = index as u32;
            let Ok(word) = slots.word(index) else {
                continue;
            };
            let holds = Holds {
                binding: &mut service.binding,
                groups: &mut service.groups,
                store: service.store.as_mut(),
            };
            peer.serving = adopt(&mut engine, peer, &slots, index, word, live, holds);
            if !peer.serving || peer.broken {
                continue;
            }
            work += drain(&mut engine, &mut service, peer, index, |i| {
                slots.word(i).ok()
            });
        }
        if let Some(damage) = peers.iter_mut().find_map(|p| p.corrupt.take()) {
            return Err(ServeError::Corrupted(damage));
        }
        if engine.in_limbo() != (0, 0) {
            guarded(|| engine.reclaim()).map_err(ServeError::Corrupted)?;
        }
        store::tidy(service.store.as_mut(), &peers, false);
        let kv_index = service.store.as_mut().map(|s| &mut s.index);
        events.after_requests(&mut engine, kv_index, live);
        // Relaxed: the daemon wrote this gauge itself (in `adopt`/`forget`).
        let clients = live.clients.load(Ordering::Relaxed);
        load.set_peers(clients.saturating_add(1));
        if work > 0 {
            unpublished = true;
            worked = true;
        }
        // The clock is read every `CLOCK_EVERY` rounds only: what it paces
        // (figures, sweeps, the spin window) is coarse, and a clock read
        // costs as much as a quick request on some hosts.
        rounds = rounds.wrapping_add(1);
        if rounds % CLOCK_EVERY != 0 {
            if work == 0 && load.spin() == Spin::YIELD_ONLY {
                yield_now();
            } else {
                spin_loop();
            }
            continue;
        }
        let now = Instant::now();
        if std::mem::take(&mut worked) {
            last_work = now;
        }
        // Figures go out when the daemon catches up, and at least every
        // `PUBLISH` while it is busy: never per request.
        if unpublished && (work == 0 || now.duration_since(last_publish) >= PUBLISH) {
            last_publish = now;
            unpublished = false;
            service.tally.publish(live);
            catch_up_all(&mut service.groups, &service.boards);
            live.set_groups(service.groups.figures());
            publish_figures(live, &engine);
        }
        if now.duration_since(last_sweep) >= SWEEP {
            last_sweep = now;
            let holds = Holds {
                binding: &mut service.binding,
                groups: &mut service.groups,
                store: service.store.as_mut(),
            };
            sweep(&mut engine, &mut peers, &slots, live, holds);
            store::tidy(service.store.as_mut(), &peers, true);
            if let Some(damage) = peers.iter_mut().find_map(|p| p.corrupt.take()) {
                return Err(ServeError::Corrupted(damage));
            }
            if let Some(ttl) = config.session_ttl {
                guarded(|| engine.expire_sessions(ttl, now)).map_err(ServeError::Corrupted)?;
            }
            publish_figures(live, &engine);
            // An idle daemon has nothing to spin for: no need to look.
            if now.duration_since(last_work) < SWEEP {
                load.sample();
            }
        }
        if work > 0 || config.busy_poll {
            spin_loop();
        } else if now.duration_since(last_work) < SPIN_WINDOW {
            if load.spin() == Spin::YIELD_ONLY {
                yield_now();
            } else {
                spin_loop();
            }
        } else {
            // Only work the daemon can do counts: a served, healthy slot with
            // room for its answer and a request waiting, or a claim to adopt.
            // A stuck client (reply ring full), a broken one (corrupt ring)
            // or one no longer served keeps the daemon asleep: the nap's
            // timeout retries them.
            let pending = || {
                // A rank waiting for its group is woken by the others'
                // requests, which are work.
                peers.iter().any(|p| {
                    p.serving
                        && !p.broken
                        && p.pending.is_none()
                        && p.deferred
                            .as_ref()
                            .map_or_else(|| p.requests.has_work(), |d| d.why == Wait::Readers)
                }) || (0..config.max_clients).any(|i| slots.word(i).is_ok_and(|w| w.1 == CLAIMED))
            };
            doorbell.sleep(pending, Some(SLEEP.min(SWEEP)));
        }
    }
    // Relaxed: informational; clients notice the dead daemon by its lock.
    info.stopping.store(1, Ordering::Relaxed);
    Ok(())
}

/// Publishes the engine's figures (and its components') for `radixd stat`.
fn publish_figures<R: crate::engine::Region>(live: &LiveStats, engine: &Engine<R>) {
    live.set_engine(&engine.stats(), engine.sessions() as u64);
    if let Some(c) = engine.component_stats() {
        live.set_components(&c);
    }
}

fn peer<'s>(
    segment: &'s Segment,
    layout: &SharedLayout,
    readers: &'s [ReaderSlot],
    index: u32,
) -> Result<Peer<'s>, ServeError> {
    let reader =
        readers
            .get(index as usize)
            .ok_or(ServeError::Region(RegionError::NoSuchClient {
                index,
                clients: readers.len() as u32,
            }))?;
    let block = segment
        .client_block(&layout.ipc, index)
        .map_err(ServeError::Region)?;
    // SAFETY: the daemon is the only consumer of every request ring and the
    // only producer of every response ring, and builds one view of each.
    let requests = unsafe { Consumer::new(block.request_header, block.request_slots) }
        .map_err(ServeError::Ring)?;
    // SAFETY: as above.
    let replies = unsafe { Producer::new(block.response_header, block.response_slots) }
        .map_err(ServeError::Ring)?;
    Ok(Peer {
        requests,
        replies,
        doorbell: block.response_doorbell,
        scratch: block.scratch,
        tenancy: Tenancy::new(),
        serving: false,
        next_probe: Instant::now(),
        pending: None,
        deferred: None,
        alone: false,
        broken: false,
        corrupt: None,
        reader,
    })
}

/// The engine's name for the client in slot `index`. A slot's resources are
/// released before the slot can be claimed again, so the index suffices.
fn client_id(index: u32) -> ClientId {
    index
}

/// Keeps the peer in step with the slot word (the hand-over protocol of
/// `radixd_ipc::slots`, daemon side); returns whether the slot is served.
///
/// A new claim (CLAIMED) is adopted here, between two drains, so no pop is
/// in flight: the previous client's holdings are released, both rings
/// reset, then ACTIVE is published. A word that moved away from the served
/// claim otherwise (released, or a stray write) stops the serving at once,
/// but releases what the client holds only when its liveness lock is free
/// (probed at most every [`SWEEP`]).
fn adopt<R: crate::engine::Region, L: SlotLocks>(
    engine: &mut Engine<R>,
    peer: &mut Peer<'_>,
    slots: &SlotTable<'_, L>,
    index: u32,
    word: (u32, u32),
    live: &LiveStats,
    mut holds: Holds<'_, '_>,
) -> bool {
    if peer.tenancy.serves(word) {
        return true;
    }
    let probe = peer.tenancy.owner().is_some() && {
        let now = Instant::now();
        let due = now >= peer.next_probe;
        if due {
            peer.next_probe = now + SWEEP;
        }
        due
    };
    let Peer {
        tenancy,
        requests,
        replies,
        pending,
        deferred,
        alone,
        broken,
        corrupt,
        reader,
        ..
    } = peer;
    let before = tenancy.owner();
    let mut kv_store = holds.store.take();
    let served = tenancy.settle(
        slots,
        index,
        word,
        probe,
        &mut || {
            reader.clear();
            if let Err(damage) = forget(engine, index, live, &mut holds) {
                *corrupt = Some(damage);
            }
        },
        &mut || {
            // Only this thread pops the request ring and pushes the reply
            // ring, and it is not inside `drain` now; the client does not
            // touch them before it sees ACTIVE.
            requests.reset();
            replies.reset();
            *pending = None;
            *deferred = None;
            *alone = false;
            *broken = false;
            // Before the client sees its claim served: it reads the store
            // only after that.
            store::claimed(kv_store.as_deref_mut(), index);
        },
    );
    if served && tenancy.owner() != before {
        // Counted here, before the client's first request is answered, so
        // `stat` never misses a client that has had an answer.
        LiveStats::bump(&live.clients, 1);
    }
    served
}

/// Drops whatever the client that held slot `index` holds, and stops
/// counting it as connected. Called by `Tenancy` only for a slot it had
/// adopted, once its holder is provably gone. `Err` names corrupt shared
/// data the engine met on the way (see `guarded`).
///
/// The last holder of the pool's binding leaving unbinds it, and the tree
/// is emptied (`Engine::drop_cached`: every client's locks and sessions,
/// then every cached prefix, evicted as `evict` evicts): the KV they index
/// lived in the buffer that went with its last holder.
fn forget<R: crate::engine::Region>(
    engine: &mut Engine<R>,
    index: u32,
    live: &LiveStats,
    holds: &mut Holds<'_, '_>,
) -> Result<(), String> {
    LiveStats::bump(&live.clients, -1);
    guarded(|| engine.release_client(client_id(index)))?;
    // The last connected rank of a group takes the group's holdings with
    // it, as a client's go with it.
    if let Some(group) = holds.groups.leave(client_id(index)) {
        guarded(|| engine.release_client(group))?;
    }
    if holds.binding.release(client_id(index)) == Released::Unbound {
        // Every client's locks and sessions go too: a lock an unbound
        // client took must not keep this buffer's pages cached for the
        // next binder (its handle is `stale` now).
        guarded(|| engine.drop_cached())?;
    }
    Ok(())
}

/// What clients hold beside the engine's pages and locks, released when
/// they go: the pool's binding and their ranks in groups.
struct Holds<'a, 's> {
    binding: &'a mut Binding<'s>,
    groups: &'a mut Groups,
    /// The store, whose per-client counters restart with each claim.
    store: Option<&'a mut crate::store::StoreFile>,
}

/// What the daemon counts while it serves, in its own memory: nothing on
/// the request path writes a line another process reads. Published to
/// [`LiveStats`] between rounds ([`Tally::publish`]).
struct Tally {
    requests: u64,
    rejected: u64,
    /// `alloc`s refused while readers held what they evicted.
    held_by_readers: u64,
    service_ns: [u64; HISTOGRAM_BUCKETS],
}

impl Tally {
    fn new() -> Self {
        Self {
            requests: 0,
            rejected: 0,
            held_by_readers: 0,
            service_ns: [0; HISTOGRAM_BUCKETS],
        }
    }

    /// Stores the totals into the live figures (the daemon is their only
    /// writer, so plain stores suffice).
    fn publish(&self, live: &LiveStats) {
        // Relaxed, all: statistics, read as a best-effort snapshot.
        live.requests.store(self.requests, Ordering::Relaxed);
        live.rejected.store(self.rejected, Ordering::Relaxed);
        live.held_by_readers
            .store(self.held_by_readers, Ordering::Relaxed);
        for (slot, &n) in live.service_ns.iter().zip(&self.service_ns) {
            slot.store(n, Ordering::Relaxed);
        }
    }
}

/// What `drain` keeps from one request to the next: the counters and the
/// buffers it reuses, so a warm daemon answers without allocating.
struct Service<'s> {
    tally: Tally,
    spare: op::Spare,
    /// Bytes of the answer being written to a reply window.
    out: Vec<u8>,
    allow_reset: bool,
    /// Longest an `alloc` waits for pages readers hold (see `drain`).
    reader_wait: Duration,
    /// Which KV buffer the pool belongs to (`Request::Bind`).
    binding: Binding<'s>,
    /// The ranks of tensor-parallel servers (`Request::Join`).
    groups: Groups,
    /// The groups' boards, by group index (see `crate::group`).
    boards: Vec<&'s radixd_ipc::Board>,
    /// Bytes of an answer being put on a board.
    board_out: Vec<u8>,
    /// The node-wide KV store (`--store`).
    store: Option<crate::store::StoreFile>,
}

/// Whether an `alloc` of `want` pages falls short only because readers
/// hold pages in limbo: free and held together would do.
fn held_back<R: crate::engine::Region>(engine: &Engine<R>, want: u64) -> bool {
    let free = engine.stats().free_pages;
    let held = u64::from(engine.in_limbo().0);
    free < want && free + held >= want
}

/// Answers up to [`BATCH`] requests of one active slot; returns how many.
fn drain<R: crate::engine::Region>(
    engine: &mut Engine<R>,
    service: &mut Service<'_>,
    peer: &mut Peer<'_>,
    index: u32,
    word: impl Fn(u32) -> Option<(u32, u32)>,
) -> usize {
    if let Some(reply) = peer.pending.take() {
        if let Err(reply) = peer.replies.push(reply) {
            // A client that does not read its answers, or that wrote an
            // impossible cursor: the latter is ignored until claimed anew.
            peer.broken = peer.replies.is_corrupt();
            peer.pending = Some(reply);
            return 0;
        }
        peer.doorbell.ring();
    }
    let (mut answered, mut popped) = (0, 0);
    // Dropped records count too, so a ring refilled with them still yields.
    while answered < BATCH && popped < 2 * BATCH {
        popped += 1;
        let (record, retry) = match peer.deferred.take() {
            Some(d) => {
                let blocked = match d.why {
                    Wait::Readers => held_back(engine, wire::alloc_count(&d.record).unwrap_or(0)),
                    Wait::Group => {
                        catch_up_all(&mut service.groups, &service.boards);
                        service.groups.lagging(client_id(index))
                    }
                };
                if blocked && Instant::now() < d.until {
                    peer.deferred = Some(d);
                    break;
                }
                (d.record, Some((d.why, d.until)))
            }
            None => match peer.requests.pop() {
                Some(record) => (record, None),
                None => break,
            },
        };
        // SYNC POINT: re-read the slot word after the pop (Acquire in
        // `SlotTable::word`, pairing with the client's Release in
        // `release`): a record whose client has released the slot since is
        // dropped unanswered, and so is one stamped with another claim's
        // generation (`seq >> 32`). The ring cannot hold the next holder's
        // records: it is reset, and the claim activated, only in `adopt`,
        // never while a pop is in flight.
        let generation = (record.seq >> 32) as u32;
        match word(index) {
            Some(w) if peer.tenancy.admits(w, generation) => {}
            Some(w) if peer.tenancy.serves(w) => continue,
            _ => break,
        }
        // One request in `TIME_EVERY` is timed: the histogram's shape is
        // the same, and the clock stays off most requests' path.
        let start = (service.tally.requests % TIME_EVERY == 0).then(Instant::now);
        let reply = answer(
            engine,
            service,
            client_id(index),
            &peer.scratch,
            &record,
            &mut peer.corrupt,
            &mut peer.alone,
        );
        // An `alloc` that evicted pages readers still hold waits for them
        // (the grace period, at most until the readers are expired) rather
        // than fail as if the cache were locked full: other slots are
        // served meanwhile, and this one reads nothing more until then.
        let short = reply.status == ErrorKind::InsufficientPages as u32;
        let held = short && wire::alloc_count(&record).is_some_and(|want| held_back(engine, want));
        if held && retry.is_none() {
            peer.deferred = Some(Deferred {
                record,
                until: Instant::now() + service.reader_wait,
                why: Wait::Readers,
            });
            break;
        }
        // A rank too far ahead of its group waits for the slowest rank
        // (nothing changed), up to `group::LAG_WAIT` from its first try.
        if reply.status == ErrorKind::GroupLag as u32 {
            let now = Instant::now();
            let until = match retry {
                Some((Wait::Group, until)) => until,
                _ => now + group::LAG_WAIT,
            };
            if now < until {
                peer.deferred = Some(Deferred {
                    record,
                    until,
                    why: Wait::Group,
                });
                break;
            }
        }
        let tally = &mut service.tally;
        tally.held_by_readers += u64::from(held);
        if let Some(start) = start {
            let ns = start.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
            tally.service_ns[bucket_of(ns)] += 1;
        }
        tally.requests += 1;
        tally.rejected += u64::from(reply.status != 0);
        answered += 1;
        if let Err(reply) = peer.replies.push(reply) {
            peer.broken = peer.replies.is_corrupt();
            peer.pending = Some(reply);
            break;
        }
    }
    if answered > 0 {
        peer.doorbell.ring();
    }
    answered
}

/// Answers one request record: copy its payload once out of the scratch,
/// check everything, apply it, and write the answer into the reply window
/// (or the record, when it is small).
fn answer<R: crate::engine::Region>(
    engine: &mut Engine<R>,
    service: &mut Service<'_>,
    client: ClientId,
    scratch: &Scratch<'_>,
    record: &WireRequest,
    corrupt: &mut Option<String>,
    alone: &mut bool,
) -> WireReply {
    let Service {
        spare,
        out,
        allow_reset,
        binding,
        groups,
        boards,
        board_out,
        store: kv_store,
        ..
    } = service;
    let window_ok = record
        .reply_off
        .checked_add(record.reply_len)
        .is_some_and(|end| u64::from(end) <= scratch.len());
    let result = if !window_ok {
        Err(Rejection::new(
            ErrorKind::Malformed,
            "reply window lies outside the scratch area",
        ))
    } else {
        ScratchWindow::new(scratch, record.payload_off, record.payload_len)
            .map_err(|e| Rejection::new(ErrorKind::Malformed, format!("payload window: {e}")))
            .and_then(|window| wire::decode_request(record, &window, spare))
            .and_then(|request| {
                let need = wire::reply_need(&request, engine.page_size(), engine.capacity());
                if need > record.reply_len as usize {
                    return Err(Rejection::new(
                        ErrorKind::TooLarge,
                        format!(
                            "the answer needs {need} bytes, the window has {}",
                            record.reply_len
                        ),
                    ));
                }
                if let Request::Bind { pool } = &request {
                    // The daemon's own state, not the engine's.
                    let fresh = binding.identity().is_none();
                    let holders = binding.bind(client, pool)?;
                    if fresh {
                        // A binding starts from an empty tree: what is
                        // cached was cached under no buffer, or under one
                        // gone (see `crate::binding`).
                        if let Err(damage) = guarded(|| engine.drop_cached()) {
                            *corrupt = Some(damage);
                            return Err(Rejection::new(
                                ErrorKind::Protocol,
                                "the daemon found its engine corrupted and is stopping",
                            ));
                        }
                    }
                    return Ok(op::Reply::Bound { holders });
                }
                // A client that has not bound a bound pool may not fill it.
                binding.admits(client, &request)?;
                if let Request::Join(join) = &request {
                    let mut joined = groups.join(client, *alone, join, engine.page_size());
                    if let (Ok(op::Reply::Joined { joined, board, .. }), Some((index, _))) =
                        (&mut joined, groups.position(client))
                    {
                        if let Some(b) = boards.get(index as usize) {
                            // A new group: its board starts empty (nobody
                            // reads it before this answer names it).
                            if *joined == 1 {
                                b.reset();
                            }
                            *board = Some(index);
                        }
                    }
                    return joined;
                }
                if let Request::Store(r) = request {
                    let generation = (record.seq >> 32) as u32;
                    return store::answer(kv_store.as_mut(), client, generation, r);
                }
                if matches!(request, Request::Reset) && !*allow_reset {
                    // One client must not wipe every other scheduler's
                    // pages and locks unless the operator said so.
                    return Err(Rejection::new(
                        ErrorKind::NotPermitted,
                        "reset of the shared cache is off (start the daemon with --allow-reset)",
                    ));
                }
                let page = (engine.page_size(), engine.capacity());
                let mut run = |client, request| {
                    guarded(|| op::apply_with(engine, client, request, spare)).unwrap_or_else(
                        |damage| {
                            *corrupt = Some(damage);
                            Err(Rejection::new(
                                ErrorKind::Protocol,
                                "the daemon found its engine corrupted and is stopping",
                            ))
                        },
                    )
                };
                if !group::is_stepped(&request) {
                    return run(client, request);
                }
                // A rank's step is its group's (see `crate::group`).
                if let Some((index, rank)) = groups.position(client) {
                    let board = boards.get(index as usize).copied();
                    return step(
                        groups, board, index, rank, client, request, run, page, board_out,
                    );
                }
                *alone = true;
                run(client, request)
            })
    };
    let room = if window_ok {
        record.reply_len as usize
    } else {
        0
    };
    let mut reply = wire::encode_reply(record.seq, &result, room, out);
    spare.keep_reply(result);
    if !out.is_empty()
        && scratch
            .write_bytes(u64::from(record.reply_off), out)
            .is_err()
    {
        reply.payload_len = 0;
    }
    reply
}

/// A rank's stepped request (see `crate::group`): first the steps the rank
/// took off its group's board count as done, then the step runs; a step it
/// led goes on the board for the other ranks to take, and the rank is told
/// where its steps stand.
#[allow(clippy::too_many_arguments)]
fn step(
    groups: &mut Groups,
    board: Option<&radixd_ipc::Board>,
    index: u32,
    rank: u32,
    client: ClientId,
    request: Request,
    run: impl FnOnce(ClientId, Request) -> Result<op::Reply, Rejection>,
    (page_size, capacity): (u32, u32),
    out: &mut Vec<u8>,
) -> Result<op::Reply, Rejection> {
    if let Some(b) = board {
        groups.catch_up(index, rank, b.taken(rank as usize));
    }
    let Some((result, led)) = groups.step_leading(client, request, run) else {
        return Err(Rejection::new(ErrorKind::Protocol, "no group"));
    };
    let Some(b) = board else {
        return result;
    };
    if let Some(s) = led {
        match groups.kept_request(index, s) {
            Some(kept) => {
                let e = wire::encode_request(kept, page_size, capacity);
                let reply = wire::encode_reply(0, &result, e.reply_need, out);
                b.publish(s, wire::digest(&e), wire::reply_words(&reply), out);
            }
            // Nobody else will take it.
            None => b.pass(s),
        }
    }
    if let Some(next) = groups.next_step(index, rank) {
        b.tell(rank as usize, next);
    }
    // Steps the others took off the board are dropped now and then.
    if groups.kept(index) > CATCH_UP_AT {
        groups.catch_up_all(index, |r| b.taken(r as usize));
    }
    result
}

/// Kept steps past which a group's ranks' board cursors are read.
const CATCH_UP_AT: usize = 256;

/// Every group's steps its ranks took off the board count as done.
fn catch_up_all(groups: &mut Groups, boards: &[&radixd_ipc::Board]) {
    if groups.is_empty() {
        return;
    }
    // A board without a group is skipped by `catch_up_all`.
    for (index, b) in boards.iter().enumerate() {
        groups.catch_up_all(index as u32, |r| b.taken(r as usize));
    }
}

/// Runs an engine operation, turning a stop at corrupt shared data (see
/// `engine::CORRUPT`) or any other panic into an error: the daemon then
/// shuts down cleanly instead of dying with its segment in place.
///
/// The engine panics only where its shared data breaks an invariant it
/// relies on (an index out of range, a loop in a list): the model tests
/// check every operation against `validate()` on data the engine wrote
/// itself, so a stop here means someone else wrote the segment.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let what = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        if what.starts_with(CORRUPT) {
            what
        } else {
            format!("{CORRUPT}: {what}")
        }
    })
}

/// Probes every occupied slot and reclaims the dead.
fn sweep<R: crate::engine::Region, L: radixd_ipc::SlotLocks>(
    engine: &mut Engine<R>,
    peers: &mut [Peer<'_>],
    slots: &radixd_ipc::SlotTable<'_, L>,
    live: &LiveStats,
    mut holds: Holds<'_, '_>,
) {
    for status in slots.occupied() {
        let Some(peer) = peers.get_mut(status.index as usize) else {
            continue;
        };
        if status.is_dead() {
            // Only requests of an adopted claim are answered, so a client
            // the daemon never adopted holds nothing to release.
            let Peer {
                tenancy,
                corrupt,
                reader,
                ..
            } = peer;
            tenancy.vacate(&mut || {
                reader.clear();
                if let Err(damage) = forget(engine, status.index, live, &mut holds) {
                    *corrupt = Some(damage);
                }
            });
            if slots.reclaim(status).is_ok() {
                LiveStats::bump(&live.reaped, 1);
            }
        }
    }
}
