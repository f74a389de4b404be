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
//!
//! The loop lives here, with the daemon's configuration and start-up. A
//! slot's life cycle (adoption, liveness, release) is in `peer`, serving
//! one slot's ring (batches, deferral) in `drain`, what serving keeps
//! between requests in `service`, one request's answer in `answer`, the
//! published figures in `figures` and the store's wiring in `store`. Their
//! imports run one way: `drain` → `answer` → `service` → `figures`, and
//! `drain` → `peer` → `store`.

mod answer;
mod drain;
mod figures;
mod peer;
mod service;
mod store;

use std::fmt;
use std::time::{Duration, Instant};

use radixd_ipc::slots::CLAIMED;
use radixd_ipc::sync::{spin_loop, yield_now, AtomicU32, Ordering};
use radixd_ipc::{
    CreateError, Doorbell, LoadSensor, Offset, RegionError, RingError, Segment, Spin, INFO_OFFSET,
};

use crate::binding::{Binding, BindingBoard};
use crate::engine::{Components, ComponentsError, ConfigError, Engine, CORRUPT};
use crate::group::Groups;
use crate::op;
use crate::shared::{
    write_components, write_info, Info, LayoutProblem, LiveStats, SegmentConfig, SharedGrace,
    SharedLayout, ShmGrace, ShmRegion,
};
use answer::catch_up_all;
use drain::drain;
use figures::{publish_figures, FreeHolder, Tally};
use peer::{adopt, peer, sweep, Holds, Peer, Wait};
use service::Service;

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

/// Rounds of a busy serving loop between two looks at the slots it does
/// not serve (new claims): a busy round visits the served slots only.
const SCAN_EVERY: u32 = 16;

/// One request in this many has its service time measured.
pub const TIME_EVERY: u64 = 16;

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
    /// Which unlocked leaf eviction takes first (`--eviction-policy`,
    /// `--eviction-policy-config`; LRU by default).
    pub policy: crate::engine::Policy,
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
            policy: crate::engine::Policy::default(),
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
    if !config.policy.is_lru() {
        engine.set_policy(config.policy);
    }
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
    crate::shared::write_policy(info, engine.policy());
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
    // The daemon slept (or just started) since the last round.
    let mut woke = true;
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
        live,
        free: FreeHolder::new(live, &engine),
    };
    // Relaxed: a plain flag set by the signal handler; nothing to order.
    while stop.load(Ordering::Relaxed) == 0 {
        let mut work = 0;
        // A round visits the slots it serves, and every slot one round in
        // `SCAN_EVERY` (or after the daemon slept): a new claim waits at
        // most that many rounds to be adopted, and a request does not wait
        // for a look at every idle slot of the table. Not "after a round
        // that answered nothing": a lone client's next request always
        // arrives in such a round (the daemon answers faster than the
        // client reads and asks again), which made every round a full scan.
        let scan = woke || rounds % SCAN_EVERY == 0;
        woke = false;
        for (index, peer) in peers.iter_mut().enumerate() {
            if !scan && !peer.serving {
                continue;
            }
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
            if peer.serving && !peer.broken {
                work += drain(&mut engine, &mut service, peer, index, |i| {
                    slots.word(i).ok()
                });
            }
            if let Some(damage) = peer.corrupt.take() {
                return Err(ServeError::Corrupted(damage));
            }
        }
        if engine.in_limbo() != (0, 0) {
            guarded(|| engine.reclaim()).map_err(ServeError::Corrupted)?;
        }
        store::tidy(service.store.as_mut(), |slot| owner(&peers, slot), false);
        let kv_index = service.store.as_mut().map(|s| &mut s.index);
        events.after_requests(&mut engine, kv_index, live);
        // What the round changed besides requests (reclaimed limbo, a
        // slot's adoption) leaves the free counts nobody's.
        service.free.settle(live, engine.free_counts());
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
            store::tidy(service.store.as_mut(), |slot| owner(&peers, slot), true);
            if let Some(damage) = peers.iter_mut().find_map(|p| p.corrupt.take()) {
                return Err(ServeError::Corrupted(damage));
            }
            if let Some(ttl) = config.session_ttl {
                guarded(|| engine.expire_sessions(ttl, now)).map_err(ServeError::Corrupted)?;
            }
            service.free.settle(live, engine.free_counts());
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
            woke = true;
        }
    }
    // Relaxed: informational; clients notice the dead daemon by its lock.
    info.stopping.store(1, Ordering::Relaxed);
    Ok(())
}

/// The claim generation that slot `slot`'s client holds, as the daemon
/// serves it (`None` for a slot nobody holds).
fn owner(peers: &[Peer<'_>], slot: usize) -> Option<u32> {
    peers.get(slot).and_then(|p| p.tenancy.owner())
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
