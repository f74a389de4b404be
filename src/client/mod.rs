//! `radixd::Client`: a scheduler's connection to a running daemon.
//!
//! A client claims one slot of the segment, which gives it its own pair of
//! SPSC rings and scratch area, so a crashed client disturbs no one else.
//! Requests are posted to the ring (payloads in the first half of the
//! scratch, answers in windows of the second half), the daemon's doorbell is
//! rung, and the client spins briefly, then sleeps on its own doorbell in
//! short timeouts, checking between them that the daemon still lives: no
//! call hangs on a dead daemon.
//!
//! The connection itself is here: claiming a slot, attaching to the
//! segment, what the connection learned there, and giving the slot back on
//! drop. Around it, one file per concern: `error` (why a call failed),
//! `port` (the ring round trip and the wait for an answer), `reader` (the
//! lock-free reads of the shared tree), `anchor` (the anchored path of
//! `match_prefix` and `insert`), `cache` (the cache calls: match, lock,
//! insert, alloc, evict, sessions, stats, and the hybrid step's paired
//! calls), `free` (the pools' free counts kept from the answers that carry
//! them), `deferred` (unlocks posted with the next request), `scope`
//! (namespaces, the pool binding, groups) and `store` (the node-wide KV
//! store).

mod anchor;
mod cache;
mod deferred;
mod error;
mod free;
mod port;
mod reader;
mod scope;
mod store;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use radixd_ipc::sync::Ordering;
use radixd_ipc::{ClaimError, LoadSensor, Offset, OpenError, Segment, INFO_OFFSET};

use crate::engine::{Anchor, Components, Handle, Policy, Recency};
use crate::op::{ErrorKind, Rejection, Reply, Request};
use crate::shared::{
    read_components, read_info, read_policy, read_recency, Info, SharedLayout, PROTOCOL_VERSION,
};

use anchor::Anchoring;
use deferred::Deferred;
pub use error::{ClientError, ProtocolError};
use free::FreeTrack;
use port::{port_of, Returns, Sent};
pub use scope::Rank;

/// How long `connect` waits for a daemon that is still starting.
const READY_WAIT: Duration = Duration::from_secs(2);

/// What a match found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchResult {
    /// Tokens of the longest cached prefix.
    pub len: usize,
    /// Its pages.
    pub pages: Vec<u32>,
    /// The lock taken, when one was asked for and something matched.
    pub handle: Option<Handle>,
}

/// What an insert or commit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InsertResult {
    pub cached: usize,
    pub len: usize,
    /// The lock's handle, when the insert locked.
    pub handle: Option<Handle>,
    /// The node covering the key, when the insert did not lock (a plain
    /// insert's answer names it; `None` for a key of no whole page).
    pub node: Option<Handle>,
}

/// What a paired lock did ([`Client::lock_paired`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockPaired {
    /// The lock's handle (with SWA it names this lock, for
    /// [`Client::unlock`]; else the node's).
    pub lock: Handle,
    /// Protected tokens before minus after (minus what the lock newly
    /// protects: SGLang's `inc_lock_ref` delta).
    pub delta: i64,
    /// The SWA page paired with each page asked, `None` where one has none.
    pub swa_pages: Vec<Option<u32>>,
}

/// What a paired insert did ([`Client::insert_paired`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsertPaired {
    pub result: InsertResult,
    /// The key's node held a state already (see
    /// [`crate::engine::InsertedExtra`]).
    pub mamba_exist: bool,
    /// The key's pages as the tree holds them now.
    pub pages: Vec<u32>,
    /// The SWA page paired with each of the last `tail` of them, `None`
    /// where one has none.
    pub swa_pages: Vec<Option<u32>>,
}

/// A connection to a running daemon.
pub struct Client {
    segment: Segment,
    layout: SharedLayout,
    /// The components the daemon's engine keeps (from `Info`).
    components: Components,
    /// What a split counts as a use of in the daemon's engine (from `Info`).
    recency: Recency,
    /// The daemon's eviction policy (from `Info`).
    policy: Policy,
    slot: u32,
    /// Generation of this client's claim: the high half of every `seq`, so
    /// the daemon drops records of another holder of the slot.
    generation: u32,
    /// Low half of the next request's `seq` (wraps within the low half).
    next: u32,
    /// Requests posted whose answers no caller will see (their call timed
    /// out or failed part-way), oldest first: drained before the next post.
    outstanding: VecDeque<Sent>,
    /// Pages and lock handles that late or abandoned answers handed this
    /// client: given back (free, unlock) before the next call.
    to_return: Returns,
    /// Set by a protocol violation: every later call fails with it.
    broken: Option<ProtocolError>,
    /// Longest wait for an answer.
    pub timeout: Duration,
    /// Whether to spin or yield while waiting, sampled every
    /// [`SAMPLE_EVERY`](port::SAMPLE_EVERY) at most.
    load: LoadSensor,
    next_sample: Instant,
    /// Round trips made (wrapping): paces the reads of the clock.
    trips: u32,
    /// Reused from call to call: answers of one round trip, and the bytes
    /// of one answer's window.
    answers: Vec<Result<Reply, Rejection>>,
    buf: Vec<u8>,
    /// Where the last `match_prefix` ended, and the tokens it matched: an
    /// `insert` of the same prompt next goes by that anchor.
    last_match: Option<Anchor>,
    last_key: Vec<u32>,
    /// Whether `match_prefix` and `insert` read the tree first and send
    /// only what the daemon lacks, and how that went.
    anchoring: Anchoring,
    /// The daemon's KV store, mapped (`None`: it has none).
    store: Option<crate::store::StoreMap>,
    /// Namespace ids the daemon gave, by name (ids are never reused).
    namespaces: HashMap<String, u32>,
    /// The group this client is a rank of ([`Client::join`]).
    group: Option<Rank>,
    /// The group's board in the segment, if it has one, this rank's next
    /// step, and the bytes of a step taken off the board.
    board: Option<u32>,
    step: u64,
    board_buf: Vec<u8>,
    /// The pools' free counts as answers carried them (see `free`).
    free: FreeTrack,
    /// Unlocks held for the next request (see `deferred`).
    deferred: Deferred,
}

impl Client {
    /// [`Client::connect`], retrying for at most `wait` while no daemon
    /// serves `name` yet (one that is still starting): for a program that
    /// starts its own daemon. Any other failure is returned at once.
    pub fn connect_waiting(name: &str, wait: Duration) -> Result<Self, ClientError> {
        let deadline = Instant::now() + wait;
        loop {
            match Self::connect(name) {
                Err(
                    ClientError::Open(
                        OpenError::NotFound | OpenError::NotReady | OpenError::DaemonDead,
                    )
                    | ClientError::NotReady,
                ) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                done => return done,
            }
        }
    }

    /// Connects to the daemon serving segment `name`.
    pub fn connect(name: &str) -> Result<Self, ClientError> {
        let segment = Segment::open_unverified(name).map_err(ClientError::Open)?;
        let info: &Info = segment
            .get(Offset::new(INFO_OFFSET))
            .map_err(ProtocolError::Region)?;
        let start = Instant::now();
        // Acquire: pairs with the Release store of `serving` in `serve`, so
        // the configuration and the engine are in place.
        while info.serving.load(Ordering::Acquire) == 0 {
            if start.elapsed() > READY_WAIT || !segment.is_daemon_alive().unwrap_or(false) {
                return Err(ClientError::NotReady);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // Relaxed: ordered by the Acquire above.
        let protocol = info.protocol.load(Ordering::Relaxed);
        if protocol != u64::from(PROTOCOL_VERSION) {
            let expected = u64::from(PROTOCOL_VERSION);
            return Err(ClientError::VersionMismatch {
                expected,
                found: protocol,
            });
        }
        let config = read_info(info).ok_or(ClientError::LayoutMismatch)?;
        let components = read_components(info).ok_or(ClientError::LayoutMismatch)?;
        let recency = read_recency(info).ok_or(ClientError::LayoutMismatch)?;
        let policy = read_policy(info).ok_or(ClientError::LayoutMismatch)?;
        let layout = SharedLayout::new(config).map_err(|_| ClientError::LayoutMismatch)?;
        if layout.ipc.hash != segment.info().layout_hash || layout.ipc.total_size != segment.len() {
            return Err(ClientError::LayoutMismatch);
        }
        protect_engine(&segment, &layout)?;
        // Relaxed: ordered by the Acquire load of `serving` above.
        let kv_store = store::map(name, info.store_bytes.load(Ordering::Relaxed))?;
        // The claim is published (CLAIMED); the daemon adopts it: releases
        // whatever the slot's previous holder held, resets the rings, and
        // marks it ACTIVE. Until then this client touches nothing but the
        // slot word (see `radixd_ipc::slots`).
        let claim = segment.claim_slot(layout.ipc.slots, config.clients);
        let claim = claim.map_err(|e| match e {
            ClaimError::Full => ClientError::SegmentFull,
            ClaimError::Table(_) => ClientError::LayoutMismatch,
            e => ProtocolError::Claim(e).into(),
        })?;
        let client = Self {
            segment,
            layout,
            components,
            recency,
            policy,
            slot: claim.index,
            generation: claim.generation,
            next: 0,
            outstanding: VecDeque::new(),
            to_return: Returns::default(),
            broken: None,
            timeout: Duration::from_secs(30),
            load: LoadSensor::new(),
            next_sample: Instant::now(),
            trips: 0,
            answers: Vec::new(),
            buf: Vec::new(),
            last_match: None,
            last_key: Vec::new(),
            anchoring: Anchoring {
                on: true,
                hits: 0,
                fallbacks: 0,
            },
            store: kv_store,
            namespaces: HashMap::new(),
            group: None,
            board: None,
            step: 0,
            board_buf: Vec::new(),
            free: FreeTrack::default(),
            deferred: Deferred::default(),
        };
        // From here on `Drop` releases the claim on every error path.
        let port = port_of(&client.segment, &client.layout, client.slot)?;
        port.daemon.ring();
        let start = Instant::now();
        let (slots, count) = (client.layout.ipc.slots, client.layout.config.clients);
        // SYNC POINT: `is_adopted` Acquire-loads the word, pairing with the
        // daemon's Release CAS to ACTIVE, which follows its ring reset.
        while !client.segment.is_adopted(slots, count) {
            if !client.segment.is_daemon_alive().unwrap_or(false) {
                return Err(ClientError::DaemonGone);
            }
            if start.elapsed() > READY_WAIT {
                return Err(ClientError::NotReady);
            }
            std::thread::sleep(Duration::from_micros(50));
            port.daemon.ring();
        }
        Ok(client)
    }

    /// The slot this client holds (its engine client id).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The generation of this client's claim: the high half of the `seq`
    /// of every request it posts (the daemon drops records of any other).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Tokens per page of the daemon's engine.
    pub fn page_size(&self) -> u32 {
        self.layout.config.page_size
    }

    /// Pages in the daemon's pool.
    pub fn capacity(&self) -> u32 {
        self.layout.config.capacity
    }

    /// The components the daemon's engine keeps beside FULL.
    pub fn components(&self) -> Components {
        self.components
    }

    /// What a split counts as a use of in the daemon's engine
    /// (`radixd serve --recency`): SGLang's rule answers as SGLang's trees.
    pub fn recency(&self) -> Recency {
        self.recency
    }

    /// The daemon's eviction policy (`radixd serve --eviction-policy`,
    /// with its parameters): a backend that answers as SGLang checks it is
    /// the server's `--radix-eviction-policy`.
    pub fn eviction_policy(&self) -> Policy {
        self.policy
    }
}

/// Maps the user area (live stats and engine) read-only in this process: a
/// client reads them at most, and a stray write of its own should fault
/// here rather than corrupt the cache every client shares.
fn protect_engine(segment: &Segment, layout: &SharedLayout) -> Result<(), ClientError> {
    let len = layout.ipc.total_size - layout.live_stats;
    let start = segment
        .region(layout.live_stats, len)
        .map_err(ProtocolError::Region)?;
    // SAFETY: the range is page aligned (the user area starts on a page and
    // the segment size is a page multiple) and lies inside our mapping;
    // nothing in this process writes it, so dropping write access breaks no
    // reference.
    let rc = unsafe { libc::mprotect(start.as_ptr().cast(), len as usize, libc::PROT_READ) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(ProtocolError::Protect(err.kind()).into());
    }
    // Map every page of the tree into this process now, so a `peek` never
    // takes a first-touch fault on a node the daemon wrote since (a few µs
    // each, the tail of an anchored `match`). Best effort: a kernel before
    // 5.14 refuses the advice, and the pages then fault in as read.
    // SAFETY: the same in-mapping range; the advice only populates page
    // tables (read faults) and changes no data or protection.
    unsafe {
        libc::madvise(
            start.as_ptr().cast(),
            len as usize,
            libc::MADV_POPULATE_READ,
        )
    };
    Ok(())
}

fn inserted(reply: Reply) -> Result<InsertResult, ClientError> {
    match reply {
        Reply::Inserted {
            cached,
            len,
            handle,
            locked,
        } => Ok(InsertResult {
            cached: cached as usize,
            len: len as usize,
            handle: handle.filter(|_| locked).map(Handle::from_raw),
            node: handle.filter(|_| !locked).map(Handle::from_raw),
        }),
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: Reply) -> ClientError {
    ProtocolError::Unexpected(reply.kind()).into()
}

impl Drop for Client {
    fn drop(&mut self) {
        // The daemon releases whatever this client still holds when it sees
        // the slot freed (or, should this fail, its lock dropped).
        let _ = self
            .segment
            .release_slot(self.layout.ipc.slots, self.layout.config.clients);
    }
}

impl crate::op::Backend for Client {
    /// `match` (also with the hybrid extras) and `insert` go by anchor
    /// when anchoring is on (see [`Client::set_anchoring`]), with the same
    /// answers.
    fn call(&mut self, request: Request) -> Result<Reply, Rejection> {
        let answer = match request {
            Request::Match { tokens, lock } if self.anchoring.on => {
                self.match_prefix(&tokens, lock).map(|m| Reply::Matched {
                    len: m.len as u64,
                    pages: m.pages,
                    handle: m.handle.map(Handle::to_raw),
                })
            }
            Request::Insert {
                tokens,
                pages,
                lock,
            } if self.anchoring.on => self.insert(&tokens, &pages, lock).map(|r| Reply::Inserted {
                cached: r.cached as u64,
                len: r.len as u64,
                handle: if lock { r.handle } else { r.node }.map(Handle::to_raw),
                locked: lock,
            }),
            Request::Hinted { hints, request } if self.anchoring.on => match *request {
                Request::Insert {
                    tokens,
                    pages,
                    lock,
                } => self
                    .insert_hinted(&tokens, &pages, lock, hints)
                    .map(|r| Reply::Inserted {
                        cached: r.cached as u64,
                        len: r.len as u64,
                        handle: if lock { r.handle } else { r.node }.map(Handle::to_raw),
                        locked: lock,
                    }),
                request => Client::call(
                    self,
                    &Request::Hinted {
                        hints,
                        request: Box::new(request),
                    },
                ),
            },
            Request::MatchWith { tokens, lock } if self.anchoring.on => self
                .match_with(&tokens, lock)
                .map(|(m, x)| Reply::MatchedWith {
                    len: m.len as u64,
                    pages: m.pages,
                    handle: m.handle.map(Handle::to_raw),
                    full_len: x.full_len as u64,
                    mamba_state: x.mamba_state,
                }),
            Request::Join(join) => self.join_as(&join).map(|joined| Reply::Joined {
                joined,
                size: join.size,
                board: None,
            }),
            request => Client::call(self, &request),
        };
        answer.map_err(|e| match e {
            ClientError::Rejected(r) => r,
            ClientError::DaemonGone => Rejection::new(ErrorKind::DaemonGone, e.to_string()),
            ClientError::Timeout => Rejection::new(ErrorKind::Timeout, e.to_string()),
            ClientError::TooLarge { .. } => Rejection::new(ErrorKind::TooLarge, e.to_string()),
            e => Rejection::new(ErrorKind::Protocol, e.to_string()),
        })
    }

    fn components(&self) -> Components {
        self.components
    }

    fn page_size(&self) -> Option<u32> {
        Some(Client::page_size(self))
    }

    fn store(&mut self) -> Option<&mut dyn crate::op::StoreAccess> {
        self.store
            .is_some()
            .then_some(self as &mut dyn crate::op::StoreAccess)
    }
}
