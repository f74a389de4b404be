//! `radixd::Client`: a scheduler's connection to a running daemon.
//!
//! A client claims one slot of the segment, which gives it its own pair of
//! SPSC rings and scratch area, so a crashed client disturbs no one else.
//! Requests are posted to the ring (payloads in the first half of the
//! scratch, answers in windows of the second half), the daemon's doorbell is
//! rung, and the client spins briefly, then sleeps on its own doorbell in
//! short timeouts, checking between them that the daemon still lives: no
//! call hangs on a dead daemon.

mod store;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use radixd_ipc::sync::{spin_loop, yield_now, Ordering};
use radixd_ipc::{
    ClaimError, Consumer, Doorbell, LoadSensor, Offset, OpenError, Producer, RegionError,
    RingError, Scratch, ScratchError, Segment, Spin, INFO_OFFSET,
};

use crate::binding::{BindingBoard, BoardError, PoolBinding, PoolIdentity};
use crate::engine::{
    Anchor, ComponentStats, Components, Evicted, Handle, InsertExtra, InsertedExtra, MatchExtra,
    Peeked, Recency, Stats, TreeReader, Usable,
};
use crate::op::{ErrorKind, Join, Rejection, Reply, Request};
use crate::shared::{
    read_components, read_info, read_recency, Info, LiveStats, SharedLayout, PROTOCOL_VERSION,
    RING_CAPACITY,
};
use crate::wire::{self, BadReply, Call, WireReply, WireRequest};

/// How long a client spins for an answer before it sleeps (when the host
/// has a core to spare; otherwise it yields a few times and sleeps at once,
/// leaving the cores to the daemon and the other clients).
const SPIN_WINDOW: Duration = Duration::from_micros(50);
/// Yields before sleeping on an oversubscribed host.
const YIELDS: u32 = 4;
/// Time between two looks at the host's load.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Longest single sleep before the daemon's liveness is checked again.
const SLEEP: Duration = Duration::from_millis(10);
/// Walks a `peek` starts over after the daemon expired its announcement.
const PEEK_TRIES: u32 = 3;
/// How long `connect` waits for a daemon that is still starting.
const READY_WAIT: Duration = Duration::from_secs(2);

/// Why a client call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// No segment of that name, or it cannot be opened.
    Open(OpenError),
    /// The segment was made by an incompatible radixd.
    VersionMismatch { expected: u64, found: u64 },
    /// The segment's layout differs from what its configuration implies.
    LayoutMismatch,
    /// The daemon did not finish starting in time.
    NotReady,
    /// Every client slot is taken.
    SegmentFull,
    /// The daemon died (or was replaced); reconnect.
    DaemonGone,
    /// The daemon did not answer in time.
    Timeout,
    /// The daemon refused the request; nothing changed.
    Rejected(Rejection),
    /// The request does not fit this client's scratch area.
    TooLarge { bytes: usize, room: usize },
    /// The daemon (or the segment) broke the protocol.
    Protocol(ProtocolError),
    /// A lock-free read kept colliding with the daemon's writes.
    Contended,
    /// An earlier call left this connection out of step with the daemon
    /// (the protocol violation named); every call fails so until a
    /// reconnect, which releases everything this client held.
    Broken(ProtocolError),
}

/// How the daemon or the segment broke the protocol, as a client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// A part of the segment lies outside the mapping.
    Region(RegionError),
    /// A ring's counters are corrupt.
    Ring(RingError),
    /// The scratch window of an answer lies outside the scratch area.
    Scratch(ScratchError),
    /// Claiming a slot failed in a way the protocol does not foresee.
    Claim(ClaimError),
    /// The engine could not be mapped read-only (`mprotect` failed).
    Protect(std::io::ErrorKind),
    /// An answer arrived out of sequence.
    OutOfSequence { expected: u64, got: u64 },
    /// An answer that does not decode.
    BadReply(BadReply),
    /// An answer of the wrong kind for its request.
    Unexpected(&'static str),
    /// The daemon answered nothing to a posted request.
    NoAnswer,
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Region(e) => write!(f, "segment region: {e}"),
            Self::Ring(e) => write!(f, "ring: {e}"),
            Self::Scratch(e) => write!(f, "answer window: {e}"),
            Self::Claim(e) => write!(f, "slot claim: {e}"),
            Self::Protect(k) => write!(f, "cannot map the engine read-only: {k}"),
            Self::OutOfSequence { expected, got } => {
                write!(f, "answer {got} for request {expected}")
            }
            Self::BadReply(e) => e.fmt(f),
            Self::Unexpected(kind) => write!(f, "unexpected answer {kind}"),
            Self::NoAnswer => f.write_str("no answer"),
        }
    }
}

impl std::error::Error for ProtocolError {}

impl From<ProtocolError> for ClientError {
    fn from(e: ProtocolError) -> Self {
        Self::Protocol(e)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open(e) => write!(f, "cannot open the segment: {e}"),
            Self::VersionMismatch { expected, found } => {
                write!(f, "segment speaks protocol {found}, this client {expected}")
            }
            Self::LayoutMismatch => write!(f, "segment layout does not match its configuration"),
            Self::NotReady => write!(f, "the daemon did not finish starting"),
            Self::SegmentFull => write!(f, "every client slot is taken"),
            Self::DaemonGone => write!(f, "the daemon is gone"),
            Self::Timeout => write!(f, "the daemon did not answer in time"),
            Self::Rejected(r) => r.fmt(f),
            Self::TooLarge { bytes, room } => {
                write!(
                    f,
                    "request needs {bytes} bytes of scratch, {room} available"
                )
            }
            Self::Protocol(m) => write!(f, "protocol error: {m}"),
            Self::Contended => write!(f, "the tree kept changing under the read; try again"),
            Self::Broken(e) => write!(f, "client connection broken ({e}); reconnect"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<Rejection> for ClientError {
    fn from(r: Rejection) -> Self {
        Self::Rejected(r)
    }
}

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
    pub handle: Option<Handle>,
}

/// A connection to a running daemon.
pub struct Client {
    segment: Segment,
    layout: SharedLayout,
    /// The components the daemon's engine keeps (from `Info`).
    components: Components,
    /// What a split counts as a use of in the daemon's engine (from `Info`).
    recency: Recency,
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
    /// [`SAMPLE_EVERY`] at most.
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
}

/// Longest a rank other than 0 waits for a step to appear on its group's
/// board before it asks the daemon itself (rank 0 always asks: in
/// lockstep, it leads and the others take its steps off the board).
const STEP_WAIT: Duration = Duration::from_micros(50);

/// A client's place in a group (see [`crate::group`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rank {
    /// The group's key.
    pub group: String,
    pub rank: u32,
    /// Ranks in the group.
    pub size: u32,
}

/// See [`Client::set_anchoring`].
#[derive(Clone, Copy, Debug)]
struct Anchoring {
    on: bool,
    /// Calls answered without sending the key's matched part.
    hits: u64,
    /// Calls that read the tree, then sent the full request after all.
    fallbacks: u64,
}

/// A request on its way whose answer no caller will read.
#[derive(Clone, Copy, Debug)]
struct Sent {
    seq: u64,
    /// Its reply window in the scratch.
    window: u32,
    /// The handle it locks by itself (`lock`).
    locks: Option<u64>,
    /// It asked for a lock (`match`/`insert` with `lock`): only then does
    /// the handle of its answer hold one.
    asks_lock: bool,
}

/// What abandoned answers handed this client.
#[derive(Debug, Default)]
struct Returns {
    pages: Vec<u32>,
    handles: Vec<u64>,
    /// State slots of abandoned `alloc_state`s.
    states: Vec<u64>,
}

impl Returns {
    /// Takes note of what `answer` (to a request that locks `locks` by
    /// itself, or asked for a lock when `asks_lock`) handed over. A match
    /// without a lock names its node too: that handle holds nothing, and
    /// unlocking it would drop a lock this client took elsewhere.
    fn note(&mut self, locks: Option<u64>, asks_lock: bool, answer: &Result<Reply, Rejection>) {
        match answer {
            Ok(Reply::Pages(pages)) => self.pages.extend_from_slice(pages),
            Ok(Reply::Matched {
                handle: Some(h), ..
            })
            | Ok(Reply::MatchedWith {
                handle: Some(h), ..
            }) if asks_lock => self.handles.push(*h),
            Ok(Reply::Inserted {
                handle: Some(h),
                locked: true,
                ..
            })
            | Ok(Reply::InsertedWith {
                handle: Some(h),
                locked: true,
                ..
            }) => self.handles.push(*h),
            Ok(Reply::State { state }) => self.states.push(u64::from(*state)),
            Ok(Reply::Done) => self.handles.extend(locks),
            Ok(Reply::Locked(h)) => self.handles.push(*h),
            _ => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.pages.is_empty() && self.handles.is_empty() && self.states.is_empty()
    }
}

/// This client's rings, doorbells and scratch.
struct Port<'s> {
    requests: Producer<'s, WireRequest>,
    replies: Consumer<'s, WireReply>,
    doorbell: &'s Doorbell,
    daemon: &'s Doorbell,
    scratch: Scratch<'s>,
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

    /// Checks every invariant of the daemon's engine.
    pub fn validate(&mut self) -> Result<(), ClientError> {
        self.done(Call::Validate)
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

    /// The `seq` of the request `n` requests after the next one.
    fn seq(&self, n: usize) -> u64 {
        let low = self.next.wrapping_add(n as u32);
        (u64::from(self.generation) << 32) | u64::from(low)
    }

    /// Fails with [`ClientError::Broken`] once a protocol violation left
    /// the connection out of step; otherwise makes it usable again after a
    /// timed-out or part-failed call: waits (up to the timeout) for the
    /// answers nobody will read, discarding them by sequence number, and
    /// gives back what they handed over (pages freed, locks dropped).
    fn resync(&mut self) -> Result<(), ClientError> {
        if let Some(m) = &self.broken {
            return Err(ClientError::Broken(*m));
        }
        if !self.outstanding.is_empty() {
            let port = port_of(&self.segment, &self.layout, self.slot)?;
            let mut deadline = None;
            let mut buf = Vec::new();
            while let Some(&sent) = self.outstanding.front() {
                let (segment, load) = (&self.segment, &self.load);
                let answer = receive(
                    segment,
                    load,
                    &port,
                    sent,
                    &mut deadline,
                    self.timeout,
                    &mut buf,
                )
                .map_err(|e| break_on(&mut self.broken, e))?;
                self.to_return.note(sent.locks, sent.asks_lock, &answer);
                self.outstanding.pop_front();
            }
        }
        if self.to_return.is_empty() {
            return Ok(());
        }
        let Returns {
            pages,
            handles,
            states,
        } = std::mem::take(&mut self.to_return);
        let mut giving = Vec::with_capacity(handles.len() + states.len() + 1);
        if !pages.is_empty() {
            giving.push(Request::Free { pages });
        }
        giving.extend(handles.into_iter().map(|handle| Request::Unlock { handle }));
        giving.extend(states.into_iter().map(|state| Request::FreeState { state }));
        let (encoded, half) = self.encode(&giving);
        // Answers ignored: a page or lock already gone changes nothing.
        let mut ignored = Vec::new();
        for chunk in encoded.chunks(RING_CAPACITY as usize) {
            self.round_trip(chunk, half, &mut ignored)?;
        }
        Ok(())
    }
}

/// The rings, doorbells and scratch of slot `slot`.
fn port_of<'s>(
    segment: &'s Segment,
    layout: &SharedLayout,
    slot: u32,
) -> Result<Port<'s>, ClientError> {
    let block = segment
        .client_block(&layout.ipc, slot)
        .map_err(ProtocolError::Region)?;
    Ok(Port {
        // SAFETY: this client holds the slot's claim, so it is the only
        // producer of its request ring and the only consumer of its
        // response ring; `&self` views never overlap a `&mut self` call.
        requests: unsafe { Producer::new(block.request_header, block.request_slots) }
            .map_err(ProtocolError::Ring)?,
        // SAFETY: as above.
        replies: unsafe { Consumer::new(block.response_header, block.response_slots) }
            .map_err(ProtocolError::Ring)?,
        doorbell: block.response_doorbell,
        daemon: segment
            .get(layout.ipc.daemon_doorbell)
            .map_err(ProtocolError::Region)?,
        scratch: block.scratch,
    })
}

/// A protocol error leaves the connection out of step: remember it, so
/// every later call says so.
fn break_on(broken: &mut Option<ProtocolError>, e: ClientError) -> ClientError {
    if let ClientError::Protocol(p) | ClientError::Broken(p) = e {
        *broken = Some(p);
    }
    e
}

/// Waits for the answer to `sent`, the oldest request outstanding, and
/// decodes it; an answer out of step is [`ClientError::Broken`].
fn receive(
    segment: &Segment,
    load: &LoadSensor,
    port: &Port<'_>,
    sent: Sent,
    deadline: &mut Option<Instant>,
    timeout: Duration,
    buf: &mut Vec<u8>,
) -> Result<Result<Reply, Rejection>, ClientError> {
    let reply = wait(segment, load, port, deadline, timeout)?;
    read_answer(port, &reply, sent, buf).map_err(ClientError::Broken)
}

/// Reads and decodes the answer `reply` to `sent`; a mismatch of sequence
/// numbers or a bad answer is a protocol violation (the message).
fn read_answer(
    port: &Port<'_>,
    reply: &WireReply,
    sent: Sent,
    buf: &mut Vec<u8>,
) -> Result<Result<Reply, Rejection>, ProtocolError> {
    if reply.seq != sent.seq {
        return Err(ProtocolError::OutOfSequence {
            expected: sent.seq,
            got: reply.seq,
        });
    }
    buf.clear();
    if wire::inline_payload(reply)
        .map_err(ProtocolError::BadReply)?
        .is_none()
    {
        port.scratch
            .read_bytes(u64::from(sent.window), u64::from(reply.payload_len), buf)
            .map_err(ProtocolError::Scratch)?;
    }
    wire::decode_reply(reply, buf).map_err(ProtocolError::BadReply)
}

impl Client {
    /// Sends one request and waits for its answer.
    pub fn call(&mut self, request: &Request) -> Result<Reply, ClientError> {
        self.send(Call::of(request))
    }

    /// Sends one request straight from the caller's slices and waits for
    /// its answer; allocates nothing but what the answer hands over (its
    /// page list). A rank's step may be answered off its group's board
    /// instead ([`Client::join`]).
    fn send(&mut self, call: Call<'_>) -> Result<Reply, ClientError> {
        if self.group.is_some() && call.is_stepped() {
            return self.send_step(call);
        }
        self.post(call)
    }

    /// A rank's step `s`: taken off the group's board when the rank that
    /// led it put it there and it is this very request (its digest), else
    /// sent to the daemon, which leads it, answers it as it was led, or
    /// says how it differs. Either way the rank's step count follows.
    fn send_step(&mut self, call: Call<'_>) -> Result<Reply, ClientError> {
        let (Some(rank), Some(index)) = (self.group.as_ref().map(|g| g.rank as usize), self.board)
        else {
            return self.post(call);
        };
        if rank == 0 {
            // Rank 0 leads: its steps go to the daemon, which answers a
            // step another rank led (rank 0 fell behind) as it was led.
            // Reading the board first would cost it a cache miss a step.
            return self.post(call);
        }
        let s = self.step;
        let (page_size, capacity) = (self.page_size(), self.capacity());
        let taken = {
            let buf = &mut self.board_buf;
            let board = self.layout.board(&self.segment, index);
            board.and_then(|b| {
                let key = wire::digest(&call.encode(page_size, capacity));
                let start = Instant::now();
                let mut spins = 0u32;
                loop {
                    if let Some(t) = b.take(s, buf) {
                        // Another request than the step led: the daemon
                        // says how (`desync`).
                        return (t.key == key)
                            .then(|| wire::decode_reply(&wire::reply_of_words(0, t.head), buf).ok())
                            .flatten()
                            .map(|answer| (b, answer));
                    }
                    // Counted but not there (too large, or its slot reused
                    // by then): ask the daemon.
                    if b.published() > s {
                        return None;
                    }
                    spins += 1;
                    if spins % 64 == 0 && start.elapsed() > STEP_WAIT {
                        return None;
                    }
                    spin_loop();
                }
            })
        };
        if let Some((board, answer)) = taken {
            board.set_taken(rank, s + 1);
            self.step = s + 1;
            return answer.map_err(ClientError::Rejected);
        }
        let answer = self.post(call);
        if let Some(b) = self.layout.board(&self.segment, index) {
            // Acquire (in `told`) after the answer's pop: the daemon told
            // before it pushed.
            self.step = self.step.max(b.told(rank));
        }
        if matches!(&answer, Err(ClientError::Rejected(r)) if r.kind == ErrorKind::Desync) {
            // Out of step for good: every later step is the daemon's to
            // refuse, never one to take off the board.
            self.board = None;
        }
        answer
    }

    /// Sends one request to the daemon and waits for its answer (see
    /// [`Client::send`]).
    fn post(&mut self, call: Call<'_>) -> Result<Reply, ClientError> {
        self.resync()?;
        let e = call.encode(self.page_size(), self.capacity());
        let half = self.layout.config.scratch_bytes as usize / 2;
        if e.payload_len() > half || e.reply_need > half {
            return Err(ClientError::TooLarge {
                bytes: e.payload_len().max(e.reply_need),
                room: half,
            });
        }
        let mut answers = std::mem::take(&mut self.answers);
        answers.clear();
        let done = self.round_trip(std::slice::from_ref(&e), half, &mut answers);
        let answer = answers.pop();
        self.answers = answers;
        done?;
        match answer {
            Some(answer) => answer.map_err(ClientError::Rejected),
            None => Err(ProtocolError::NoAnswer.into()),
        }
    }

    /// Posts many requests before waiting, and returns their answers in
    /// order; a rejected request does not stop the others.
    ///
    /// After a [`ClientError::Timeout`] (or a batch that failed part-way)
    /// the client stays usable: the next call first waits for the answers
    /// nobody will read, discards them, and gives back what they handed
    /// over (pages of an `alloc`, locks), including the answers of this
    /// batch that did arrive before the failure.
    pub fn batch(
        &mut self,
        requests: &[Request],
    ) -> Result<Vec<Result<Reply, Rejection>>, ClientError> {
        if self.group.is_some() {
            // A rank's steps go one by one, each perhaps off the board.
            return requests
                .iter()
                .map(|r| match self.send(Call::of(r)) {
                    Ok(reply) => Ok(Ok(reply)),
                    Err(ClientError::Rejected(r)) => Ok(Err(r)),
                    Err(e) => Err(e),
                })
                .collect();
        }
        self.resync()?;
        let (encoded, half) = self.encode(requests);
        if let Some(big) = encoded
            .iter()
            .find(|e| e.payload_len() > half || e.reply_need > half)
        {
            return Err(ClientError::TooLarge {
                bytes: big.payload_len().max(big.reply_need),
                room: half,
            });
        }
        let mut answers = Vec::with_capacity(requests.len());
        let mut rest = &encoded[..];
        while !rest.is_empty() {
            // As many as fit the ring and both halves of the scratch.
            let (mut payload, mut reply, mut n) = (0, 0, 0);
            for e in rest.iter().take(RING_CAPACITY as usize) {
                if payload + e.payload_len() > half || reply + e.reply_need > half {
                    break;
                }
                payload += e.payload_len();
                reply += e.reply_need;
                n += 1;
            }
            let (now, later) = rest.split_at(n);
            if let Err(e) = self.round_trip(now, half, &mut answers) {
                // The caller sees none of this batch's answers: give back
                // what those that arrived handed over.
                for (answer, e) in answers.iter().zip(&encoded) {
                    self.to_return.note(
                        wire::handle_locked_by(&e.record),
                        wire::asks_lock(&e.record),
                        answer,
                    );
                }
                return Err(e);
            }
            rest = later;
        }
        Ok(answers)
    }

    /// Encodes `requests` for this segment, with the room one round trip
    /// has for them: half the scratch for payloads, half for answers.
    fn encode<'r>(&self, requests: &'r [Request]) -> (Vec<wire::EncodedRequest<'r>>, usize) {
        let (page_size, capacity) = (self.page_size(), self.capacity());
        let encoded = requests
            .iter()
            .map(|r| wire::encode_request(r, page_size, capacity))
            .collect();
        (encoded, self.layout.config.scratch_bytes as usize / 2)
    }

    fn round_trip(
        &mut self,
        batch: &[wire::EncodedRequest<'_>],
        half: usize,
        answers: &mut Vec<Result<Reply, Rejection>>,
    ) -> Result<(), ClientError> {
        // The clock is read every 64th round trip only (it costs as much as
        // a quick round trip's share of a cache line on some hosts).
        self.trips = self.trips.wrapping_add(1);
        let now = (self.trips % 64 == 1).then(Instant::now);
        if let Some(now) = now.filter(|&now| now >= self.next_sample) {
            self.next_sample = now + SAMPLE_EVERY;
            // Relaxed: a gauge; any recent value will do.
            let clients = self
                .segment
                .get::<LiveStats>(Offset::new(self.layout.live_stats))
                .map_or(0, |live| live.clients.load(Ordering::Relaxed));
            // The connected clients and the daemon spin on each other.
            self.load.set_peers(clients.saturating_add(1));
            self.load.sample();
        }
        let port = port_of(&self.segment, &self.layout, self.slot)?;
        let (mut payload_at, mut reply_at) = (0usize, half);
        let first = self.outstanding.len();
        let mut posted = Ok(());
        for (i, e) in batch.iter().enumerate() {
            let mut record = e.record;
            record.seq = self.seq(i);
            record.payload_off = payload_at as u32;
            record.reply_off = reply_at as u32;
            record.reply_len = e.reply_need as u32;
            // Straight from the caller's slices into the window: no staging.
            let anchor_words = e.anchor_words.as_slice();
            let words = (e.tokens.len() + e.pages.len()) * 4;
            let at = payload_at as u64;
            let written = port
                .scratch
                .write_u32s(at, e.tokens)
                .and_then(|()| {
                    port.scratch
                        .write_u32s(at + e.tokens.len() as u64 * 4, e.pages)
                })
                .and_then(|()| port.scratch.write_u32s(at + words as u64, anchor_words))
                .and_then(|()| {
                    let at = at + (words + anchor_words.len() * 4) as u64;
                    port.scratch.write_bytes(at, e.session)?;
                    port.scratch
                        .write_bytes(at + e.session.len() as u64, &e.bytes)
                })
                .and_then(|()| {
                    let at = at
                        + (words + anchor_words.len() * 4 + e.session.len() + e.bytes.len()) as u64;
                    port.scratch.write_bytes(at, e.ns)
                });
            if let Err(e) = written {
                posted = Err(ProtocolError::Scratch(e).into());
                break;
            }
            payload_at += e.payload_len();
            reply_at += e.reply_need;
            if port.requests.push(record).is_err() {
                // The ring holds only our own answered requests: a daemon
                // that stopped reading is as good as gone.
                posted = Err(gone_or(&self.segment, ClientError::Timeout));
                break;
            }
            self.outstanding.push_back(Sent {
                seq: record.seq,
                window: record.reply_off,
                locks: wire::handle_locked_by(&record),
                asks_lock: wire::asks_lock(&record),
            });
        }
        let sent = self.outstanding.len() - first;
        self.next = self.next.wrapping_add(sent as u32);
        if sent > 0 {
            port.daemon.ring();
        }
        // A batch that failed part-way: what was posted stays outstanding,
        // for `resync` to drain before anything else is posted.
        posted?;
        let mut deadline = None;
        let mut buf = std::mem::take(&mut self.buf);
        let mut received = Ok(());
        for _ in 0..sent {
            let Some(&front) = self.outstanding.front() else {
                break;
            };
            let (segment, load) = (&self.segment, &self.load);
            match receive(
                segment,
                load,
                &port,
                front,
                &mut deadline,
                self.timeout,
                &mut buf,
            ) {
                Ok(answer) => answers.push(answer),
                Err(e) => {
                    received = Err(break_on(&mut self.broken, e));
                    break;
                }
            }
            self.outstanding.pop_front();
        }
        self.buf = buf;
        received
    }

    /// The longest cached prefix of `tokens` and its pages, read straight
    /// from the shared tree: no round trip, no lock, no LRU touch (for
    /// scoring requests; `match_prefix` is what a scheduler acts on).
    ///
    /// With components on (a hybrid model) the answer is what a match would
    /// serve: cut back to where the SWA window holds or a state was
    /// checkpointed ([`Client::peek_usable`]).
    pub fn peek(&self, tokens: &[u32]) -> Result<(usize, Vec<u32>), ClientError> {
        if !self.components.is_full_only() {
            return self.peek_usable(tokens).map(|(u, pages)| (u.len, pages));
        }
        self.peek_anchored(tokens).map(|(p, pages)| (p.len, pages))
    }

    /// The usable prefix of `tokens` a hybrid engine's match would answer
    /// (its length, the state at its end) and its pages, read straight from
    /// the shared tree as [`Client::peek`] reads; on a FULL-only engine,
    /// the same as `peek`.
    pub fn peek_usable(&self, tokens: &[u32]) -> Result<(Usable, Vec<u32>), ClientError> {
        let reader = self.reader()?;
        let mut pages = Vec::new();
        let usable = self.announced(|| reader.peek_usable(tokens, &mut pages).map(|(u, _)| u))?;
        Ok((usable, pages))
    }

    /// [`Client::peek`], also naming where the match ended in the tree
    /// (see [`TreeReader::peek_anchored`]).
    pub fn peek_anchored(&self, tokens: &[u32]) -> Result<(Peeked, Vec<u32>), ClientError> {
        let mut pages = Vec::new();
        self.peek_into(tokens, &mut pages).map(|p| (p, pages))
    }

    /// A reader of the shared tree through this client's mapping.
    fn reader(&self) -> Result<TreeReader, ClientError> {
        let base = self
            .segment
            .region(self.layout.engine_at, self.layout.engine.size() as u64)
            .map_err(ProtocolError::Region)?;
        // SAFETY: the engine region lies inside our mapping (checked just
        // now), which lives as long as `self` and therefore the reader
        // (only ever used within a `&self` call); it is page aligned (the
        // layout puts it after a page-aligned stats page), and the reader
        // only copies out of it.
        Ok(unsafe { TreeReader::new(base, self.layout.engine) })
    }

    /// [`Client::peek_anchored`] into `pages` (cleared first).
    fn peek_into(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Result<Peeked, ClientError> {
        let reader = self.reader()?;
        self.announced(|| reader.peek_anchored(tokens, pages))
    }

    /// Runs the walk `read` announced to the daemon as a reader (see
    /// `peek_into`), again while its announcement was expired under it.
    fn announced<T>(&self, read: impl FnMut() -> Option<T>) -> Result<T, ClientError> {
        let (clock, slots) = self
            .layout
            .readers(&self.segment)
            .map_err(ProtocolError::Region)?;
        let Some(announce) = slots.get(self.slot as usize) else {
            return Err(ProtocolError::Region(RegionError::NoSuchClient {
                index: self.slot,
                clients: slots.len() as u32,
            })
            .into());
        };
        // Announced, the daemon reuses no node or page a walk may return;
        // an announcement it expired (this process stalled for
        // `daemon::READER_EXPIRY`) makes that walk's copy untrustworthy,
        // and `read` walks again.
        announce
            .read(clock, PEEK_TRIES, read)
            .flatten()
            .ok_or(ClientError::Contended)
    }

    /// Turns anchoring on (the default) or off. On, [`Client::match_prefix`]
    /// and [`Client::insert`] first read the tree lock-free
    /// ([`Client::peek_anchored`]) and send the daemon only where the match
    /// ended (and, for an insert, the tokens after it); the daemon acts
    /// there only if that node is unchanged, else the client sends the
    /// full request. A match of nothing is answered without a round trip.
    /// Answers are those of the full requests either way; off, every call
    /// sends the whole key (for comparison and tests). A rank of a group
    /// ([`Client::join`]) always sends the whole key: its steps must read
    /// the same as its group's other ranks', whatever its view of the tree.
    pub fn set_anchoring(&mut self, on: bool) {
        self.anchoring.on = on && self.group.is_none();
    }

    /// Whether anchoring is on (see [`Client::set_anchoring`]).
    pub fn anchoring(&self) -> bool {
        self.anchoring.on
    }

    /// `match_prefix` and `insert` calls answered by the anchored path
    /// (without sending the matched part of the key) so far.
    pub fn anchored_hits(&self) -> u64 {
        self.anchoring.hits
    }

    /// Anchored calls that fell back to the full request (the tree moved
    /// under the anchor, or the read kept colliding with writes) so far.
    pub fn anchored_fallbacks(&self) -> u64 {
        self.anchoring.fallbacks
    }

    /// The read before an anchored call standing in for a full request
    /// of `payload` bytes whose answer needs `reply` bytes: `None`
    /// (counted as a fallback) when it kept colliding with the daemon's
    /// writes.
    fn read_anchor(
        &mut self,
        tokens: &[u32],
        payload: usize,
        reply: usize,
        pages: &mut Vec<u32>,
    ) -> Result<Option<Peeked>, ClientError> {
        // Abandoned requests first: what they change comes before the read.
        self.resync()?;
        // A full request too large to send fails so (as `batch` checks it)
        // whichever way it goes: the answer must not depend on the path,
        // nor on a fallback.
        let reply = reply.max(wire::MIN_REPLY_WINDOW);
        let half = self.layout.config.scratch_bytes as usize / 2;
        if payload > half || reply > half {
            return Err(ClientError::TooLarge {
                bytes: payload.max(reply),
                room: half,
            });
        }
        match self.peek_into(tokens, pages) {
            Ok(read) => Ok(Some(read)),
            Err(ClientError::Contended) => {
                self.anchoring.fallbacks += 1;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends an anchored request: `None` (counted) when the tree moved
    /// under the anchor and the full request must follow.
    fn call_anchored(&mut self, call: Call<'_>) -> Result<Option<Reply>, ClientError> {
        match self.send(call) {
            Ok(reply) => {
                self.anchoring.hits += 1;
                Ok(Some(reply))
            }
            Err(ClientError::Rejected(r)) if r.kind == ErrorKind::Moved => {
                self.anchoring.fallbacks += 1;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `match_prefix` by anchor, with the tokens FULL alone matched;
    /// `None`: send the full request. `extra_reply`: bytes the full
    /// request's answer needs beyond the pages (so both fail alike when
    /// too large).
    fn match_anchored(
        &mut self,
        tokens: &[u32],
        lock: bool,
        extra_reply: usize,
    ) -> Result<Option<(MatchResult, usize)>, ClientError> {
        // `Match`'s payload is the tokens, its answer the pages.
        let p = self.page_size().max(1) as usize;
        let mut pages = Vec::new();
        let reply = tokens.len() / p * 4 + extra_reply;
        let read = self.read_anchor(tokens, tokens.len() * 4, reply, &mut pages)?;
        let Some(peeked) = read else {
            return Ok(None);
        };
        let Some(anchor) = peeked.anchor else {
            // Nothing cached: the full request would change nothing (the
            // root is never touched or locked) and answer just this.
            self.anchoring.hits += 1;
            let none = MatchResult {
                len: 0,
                pages: Vec::new(),
                handle: None,
            };
            return Ok(Some((none, 0)));
        };
        // The anchor holds only where FULL's walk ends: there.
        let full_len = pages.len() * p;
        let call = Call::MatchAt {
            anchor,
            matched_pages: pages.len() as u32,
            next_hash: peeked.next_hash,
            lock,
        };
        match self.call_anchored(call)? {
            None => Ok(None),
            Some(Reply::Matched { len, handle, .. }) => {
                // A hybrid engine cuts the match back to where every
                // component serves it (SWA window, MAMBA state): the pages
                // read are FULL's, so only those of the answer's length
                // are the match's.
                pages.truncate(len as usize / p);
                let m = MatchResult {
                    len: len as usize,
                    pages,
                    handle: handle.map(Handle::from_raw),
                };
                Ok(Some((m, full_len)))
            }
            Some(other) => Err(unexpected(other)),
        }
    }

    /// `insert` of a prompt whose prefix the last `match_prefix` just
    /// matched, sending only the rest under the node that match ended at;
    /// `None`: send the full request (no such match, or the tree moved).
    fn insert_anchored(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<Option<InsertResult>, ClientError> {
        let Some(anchor) = self.last_match.take() else {
            return Ok(None);
        };
        let len = self.last_key.len();
        let p = self.page_size().max(1) as usize;
        if tokens.get(..len) != Some(&self.last_key[..]) || len % p != 0 {
            return Ok(None);
        }
        // A full request too large to send fails so whichever way it goes.
        let half = self.layout.config.scratch_bytes as usize / 2;
        let payload = (tokens.len() + pages.len()) * 4;
        if payload > half {
            return Err(ClientError::TooLarge {
                bytes: payload,
                room: half,
            });
        }
        let call = Call::InsertAt {
            anchor,
            matched_pages: (len / p) as u32,
            tokens: &tokens[len..],
            pages,
            lock,
        };
        match self.call_anchored(call)? {
            None => Ok(None),
            Some(reply) => inserted(reply).map(Some),
        }
    }

    /// Takes `n` pages from the pool, evicting as needed.
    pub fn alloc(&mut self, n: u64) -> Result<Vec<u32>, ClientError> {
        match self.send(Call::Alloc(n))? {
            Reply::Pages(pages) => Ok(pages),
            other => Err(unexpected(other)),
        }
    }

    /// Returns owned pages to the pool.
    pub fn free(&mut self, pages: &[u32]) -> Result<(), ClientError> {
        self.done(Call::Free(pages))
    }

    /// Caches `tokens` with `pages` (by anchor: see
    /// [`Client::set_anchoring`]).
    pub fn insert(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<InsertResult, ClientError> {
        // A hybrid engine's anchored insert does what the full one does
        // (SWA tombstone recovery and pairing checks walk the same path).
        if self.anchoring.on {
            if let Some(r) = self.insert_anchored(tokens, pages, lock)? {
                return Ok(r);
            }
        }
        inserted(self.send(Call::Insert(tokens, pages, lock))?)
    }

    /// [`Client::insert`] with the extras of a hybrid engine (see
    /// [`crate::engine::Engine::insert_with`]): a state slot this client
    /// owns to checkpoint at the key's end, and the leading tokens whose
    /// SWA pages it freed. Always the full request.
    pub fn insert_with(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        extra: InsertExtra,
    ) -> Result<(InsertResult, InsertedExtra), ClientError> {
        self.last_match = None;
        let call = Call::InsertWith {
            tokens,
            pages,
            lock,
            mamba_state: extra.mamba_state,
            swa_evicted: extra.swa_evicted,
        };
        match self.send(call)? {
            Reply::InsertedWith {
                cached,
                len,
                handle,
                mamba_exist,
                ..
            } => Ok((
                InsertResult {
                    cached: cached as usize,
                    len: len as usize,
                    handle: handle.map(Handle::from_raw),
                },
                InsertedExtra { mamba_exist },
            )),
            other => Err(unexpected(other)),
        }
    }

    /// [`Client::match_prefix`] with the hybrid parts of the answer: how
    /// far FULL alone matched and the state slot the match ends at (see
    /// [`crate::engine::Engine::match_with`]). By anchor (see
    /// [`Client::set_anchoring`]) unless MAMBA is on (the state is the
    /// daemon's to say).
    pub fn match_with(
        &mut self,
        tokens: &[u32],
        lock: bool,
    ) -> Result<(MatchResult, MatchExtra), ClientError> {
        // Without MAMBA the extras are FULL's walk, which the anchored
        // read knows: no state to learn from the daemon.
        if self.anchoring.on && self.components.mamba.is_none() {
            if let Some((m, full_len)) = self.match_anchored(tokens, lock, 4)? {
                self.remember_match(tokens, m.len.min(tokens.len()), m.handle);
                let extra = MatchExtra {
                    full_len,
                    mamba_state: None,
                };
                return Ok((m, extra));
            }
        }
        match self.send(Call::MatchWith(tokens, lock))? {
            Reply::MatchedWith {
                len,
                pages,
                handle,
                full_len,
                mamba_state,
            } => {
                let handle = handle.map(Handle::from_raw);
                self.remember_match(tokens, (len as usize).min(tokens.len()), handle);
                let m = MatchResult {
                    len: len as usize,
                    pages,
                    handle,
                };
                let extra = MatchExtra {
                    full_len: full_len as usize,
                    mamba_state,
                };
                Ok((m, extra))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Evicts per component: `tokens` FULL tokens (leaves, with their SWA
    /// pages and states), then SWA tokens and MAMBA states until the call
    /// freed `swa_tokens` and `mamba_states` (see
    /// [`crate::engine::Engine::evict_components`]).
    pub fn evict_components(
        &mut self,
        tokens: u64,
        swa_tokens: u64,
        mamba_states: u64,
    ) -> Result<Evicted, ClientError> {
        let call = Call::EvictComponents {
            tokens,
            swa_tokens,
            mamba_states,
        };
        match self.send(call)? {
            Reply::EvictedComponents {
                tokens,
                swa_tokens,
                mamba_states,
            } => Ok(Evicted {
                tokens,
                swa_tokens,
                mamba_states,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Takes a MAMBA state slot from the pool (evicting a cached state
    /// when none is free).
    pub fn alloc_state(&mut self) -> Result<u32, ClientError> {
        match self.send(Call::AllocState)? {
            Reply::State { state } => Ok(state),
            other => Err(unexpected(other)),
        }
    }

    /// Returns a state slot this client owns to the pool.
    pub fn free_state(&mut self, state: u64) -> Result<(), ClientError> {
        self.done(Call::FreeState(state))
    }

    /// Frees the SWA pages paired with `pages` (owned FULL pages whose
    /// tokens slid out of the window); returns how many SWA pages went.
    pub fn free_swa(&mut self, pages: &[u32]) -> Result<u64, ClientError> {
        match self.send(Call::FreeSwa(pages))? {
            Reply::SwaFreed { n } => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// The SWA page paired with each of `pages` (where its sliding-window
    /// KV lives; SGLang's `translate_loc_from_full_to_swa`), `None` where a
    /// page has none.
    pub fn swa_pages(&mut self, pages: &[u32]) -> Result<Vec<Option<u32>>, ClientError> {
        match self.send(Call::SwaPages(pages))? {
            Reply::SwaPages(paired) => Ok(paired
                .into_iter()
                .map(|p| (p != u32::MAX).then_some(p))
                .collect()),
            other => Err(unexpected(other)),
        }
    }

    /// The secondary components' figures; `None` when only FULL is on.
    pub fn component_stats(&mut self) -> Result<Option<ComponentStats>, ClientError> {
        match self.send(Call::StatsWith)? {
            Reply::StatsWith { components, .. } => Ok(components),
            other => Err(unexpected(other)),
        }
    }

    /// Remembers where the match of `tokens` that answered `len` tokens
    /// and `handle` ended, for an `insert` of the same prompt next.
    fn remember_match(&mut self, tokens: &[u32], len: usize, handle: Option<Handle>) {
        self.last_match = None;
        let Some(h) = handle.filter(|_| self.anchoring.on) else {
            return;
        };
        // The handle names the node holding exactly the matched tokens
        // (a match splits there): its version and page count now.
        // A lock's handle (SWA) carries the lock's serial, not the node's
        // generation: the lock it names holds that node in place.
        let Some(anchor) = self.reader().ok().and_then(|r| {
            let generation = if h.is_lock() {
                r.generation_of(h.node())?
            } else {
                h.generation
            };
            r.anchor_of(h.node(), generation)
        }) else {
            return;
        };
        self.last_key.clear();
        self.last_key.extend_from_slice(&tokens[..len]);
        self.last_match = Some(anchor);
    }

    /// The longest cached prefix of `tokens`, optionally locked (by
    /// anchor: see [`Client::set_anchoring`]).
    pub fn match_prefix(&mut self, tokens: &[u32], lock: bool) -> Result<MatchResult, ClientError> {
        let anchored = if self.anchoring.on {
            self.match_anchored(tokens, lock, 0)?
        } else {
            None
        };
        let m = match anchored {
            Some((m, _)) => m,
            None => match self.send(Call::Match(tokens, lock))? {
                Reply::Matched {
                    len, pages, handle, ..
                } => MatchResult {
                    len: len as usize,
                    pages,
                    handle: handle.map(Handle::from_raw),
                },
                other => return Err(unexpected(other)),
            },
        };
        self.remember_match(tokens, m.len.min(tokens.len()), m.handle);
        Ok(m)
    }

    /// Locks a node (and its ancestors); answers the lock's handle, which
    /// with SWA names this lock for [`Client::unlock`] (else `handle`).
    pub fn lock(&mut self, handle: Handle) -> Result<Handle, ClientError> {
        match self.send(Call::Lock(handle.to_raw()))? {
            Reply::Done => Ok(handle),
            Reply::Locked(lock) => Ok(Handle::from_raw(lock)),
            other => Err(unexpected(other)),
        }
    }

    /// Drops one of this client's locks.
    pub fn unlock(&mut self, handle: Handle) -> Result<(), ClientError> {
        self.done(Call::Unlock(handle.to_raw()))
    }

    /// Evicts `ceil(tokens / page_size)` pages; returns the tokens evicted.
    pub fn evict(&mut self, tokens: u64) -> Result<u64, ClientError> {
        match self.send(Call::Evict(tokens))? {
            Reply::Evicted(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Commits a session's whole conversation so far.
    pub fn session_commit(
        &mut self,
        session: &str,
        tokens: &[u32],
        pages: &[u32],
    ) -> Result<InsertResult, ClientError> {
        match self.send(Call::SessionCommit(session, tokens, pages))? {
            Reply::Inserted { cached, len, .. } => Ok(InsertResult {
                cached: cached as usize,
                len: len as usize,
                handle: None,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Drops a session's lock and forgets it.
    pub fn session_release(&mut self, session: &str) -> Result<(), ClientError> {
        self.done(Call::SessionRelease(session))
    }

    /// Tokens resident for a session.
    pub fn session_status(&mut self, session: &str) -> Result<u64, ClientError> {
        match self.send(Call::SessionStatus(session))? {
            Reply::Session {
                resident_tokens, ..
            } => Ok(resident_tokens),
            other => Err(unexpected(other)),
        }
    }

    /// The engine's figures and the number of live sessions.
    pub fn stats(&mut self) -> Result<(Stats, u64), ClientError> {
        match self.send(Call::Stats)? {
            Reply::Stats { stats, sessions } => Ok((stats, sessions)),
            other => Err(unexpected(other)),
        }
    }

    fn done(&mut self, call: Call<'_>) -> Result<(), ClientError> {
        match self.send(call)? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// The next answer: spin a little (or, on an oversubscribed host, yield
/// a few times), then sleep in short naps, each followed by a liveness
/// check of the daemon.
///
/// The clock is first read once the answer is late (after 64 tries, or
/// the first yield), never on a quick round trip: `deadline` is set then,
/// to `timeout` from that moment, unless an earlier wait of the same call
/// set it.
fn wait(
    segment: &Segment,
    load: &LoadSensor,
    port: &Port<'_>,
    deadline: &mut Option<Instant>,
    timeout: Duration,
) -> Result<WireReply, ClientError> {
    let oversubscribed = load.spin() == Spin::YIELD_ONLY;
    let mut start = None;
    let mut tries = 0u32;
    loop {
        if let Some(reply) = port.replies.pop() {
            return Ok(reply);
        }
        tries += 1;
        if oversubscribed {
            deadline.get_or_insert_with(|| Instant::now() + timeout);
            if tries <= YIELDS {
                yield_now();
                continue;
            }
        } else if tries % 64 != 0 || {
            let start = *start.get_or_insert_with(Instant::now);
            deadline.get_or_insert(start + timeout);
            start.elapsed() < SPIN_WINDOW
        } {
            spin_loop();
            continue;
        }
        port.doorbell.sleep(|| port.replies.has_work(), Some(SLEEP));
        if port.replies.has_work() {
            continue;
        }
        if !segment.is_daemon_alive().unwrap_or(false) {
            return Err(ClientError::DaemonGone);
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            return Err(ClientError::Timeout);
        }
    }
}

fn gone_or(segment: &Segment, other: ClientError) -> ClientError {
    if segment.is_daemon_alive().unwrap_or(false) {
        other
    } else {
        ClientError::DaemonGone
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
            ..
        } => Ok(InsertResult {
            cached: cached as usize,
            len: len as usize,
            handle: handle.map(Handle::from_raw),
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
                handle: r.handle.map(Handle::to_raw),
                locked: lock,
            }),
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

/// The pool binding (see [`crate::binding`]): which KV buffer the daemon's
/// pages index.
impl Client {
    /// [`Client::connect`], then [`Client::bind`] to `pool`: a client of
    /// another buffer than the one the daemon's pool is bound to gets
    /// [`ClientError::Rejected`] of kind `pool_mismatch` (its message says
    /// what to do) and holds nothing.
    pub fn connect_bound(name: &str, pool: &PoolIdentity) -> Result<Self, ClientError> {
        let mut client = Self::connect(name)?;
        client.bind(pool)?;
        Ok(client)
    }

    /// Binds this connection to the KV buffer `pool`: the first binder
    /// binds the daemon's pool (the tree emptied first, every client's
    /// locks included: nothing cached before is matched under it), a
    /// client of the same buffer joins the binding, one of another is
    /// refused (`pool_mismatch`, naming every key that differs first,
    /// whole; nothing changes). The binding is held until this client
    /// disconnects or dies, when the last holder leaving empties the tree
    /// again; returns how many clients hold it now. While the pool is
    /// bound, a client that has not bound it may read, lock, give back and
    /// evict, not fill it (`not_permitted`: see `crate::binding`).
    pub fn bind(&mut self, pool: &PoolIdentity) -> Result<u64, ClientError> {
        match self.send(Call::Bind(pool.as_str()))? {
            Reply::Bound { holders } => Ok(holders),
            other => Err(unexpected(other)),
        }
    }

    /// What the daemon's pool is bound to (`None`: nothing), read from the
    /// segment without a round trip.
    pub fn pool_binding(&self) -> Result<Option<PoolBinding>, ClientError> {
        let board: &BindingBoard = self
            .segment
            .get(Offset::new(self.layout.binding))
            .map_err(ProtocolError::Region)?;
        board.read().map_err(|e| match e {
            BoardError::Changing => ClientError::Contended,
            BoardError::Garbled => {
                ProtocolError::BadReply(BadReply::BadField("pool binding")).into()
            }
        })
    }
}

/// Groups (see [`crate::group`]): the ranks of one tensor-parallel server
/// share one tree, each step carried out once and every rank answered the
/// same.
impl Client {
    /// Makes this connection rank `rank` of the `size` ranks of group
    /// `group` (a key every rank of the server agrees on, unique to it),
    /// before any cache call: from then on every cache call is a step of
    /// the group, which owns what the calls take (pages, locks, sessions)
    /// until its last rank is gone. Anchoring goes off for good (see
    /// [`Client::set_anchoring`]). Returns how many ranks have joined so
    /// far; a refusal (`group_mismatch`, `group_closed`) changes nothing.
    ///
    /// A rank should wait without a timeout: a call given up on is still a
    /// step, and what its late answer hands over would be given back in
    /// steps the other ranks do not make.
    pub fn join(&mut self, group: &str, rank: u32, size: u32) -> Result<u32, ClientError> {
        self.join_as(&Join {
            group: group.to_owned(),
            rank,
            size,
            page_size: self.page_size(),
        })
    }

    /// [`Client::join`] with the rank's page size given (the daemon
    /// refuses one that is not its own).
    pub fn join_as(&mut self, join: &Join) -> Result<u32, ClientError> {
        match self.send(Call::Join(join))? {
            Reply::Joined { joined, board, .. } => {
                self.anchoring.on = false;
                self.board = board;
                self.step = 0;
                self.group = Some(Rank {
                    group: join.group.clone(),
                    rank: join.rank,
                    size: join.size,
                });
                Ok(joined)
            }
            other => Err(unexpected(other)),
        }
    }

    /// The group this connection is a rank of, if any.
    pub fn rank(&self) -> Option<&Rank> {
        self.group.as_ref()
    }
}

/// Namespaces (see [`crate::engine::Engine::namespace`]): a prefix cached
/// in one never matches in another. Each call names its namespace; the
/// plain calls are in the default one. A namespaced `match` or `insert`
/// sends its whole key (no anchored path).
impl Client {
    /// The id of namespace `name` (the daemon registers it on first use),
    /// asked once per name and client.
    pub fn namespace_id(&mut self, name: &str) -> Result<u32, ClientError> {
        if let Some(&id) = self.namespaces.get(name) {
            return Ok(id);
        }
        match self.send(Call::Namespace(name))? {
            Reply::Namespace { id } => {
                self.namespaces.insert(name.to_owned(), id);
                Ok(id)
            }
            other => Err(unexpected(other)),
        }
    }

    /// [`Client::peek`] in namespace `ns`.
    pub fn peek_in(&mut self, ns: &str, tokens: &[u32]) -> Result<(usize, Vec<u32>), ClientError> {
        let id = self.namespace_id(ns)?;
        let reader = self.reader()?;
        let mut pages = Vec::new();
        let len = if self.components.is_full_only() {
            self.announced(|| {
                reader
                    .peek_anchored_in(id, tokens, &mut pages)
                    .map(|p| p.len)
            })?
        } else {
            self.announced(|| {
                reader
                    .peek_usable_in(id, tokens, &mut pages)
                    .map(|(u, _)| u.len)
            })?
        };
        Ok((len, pages))
    }

    /// [`Client::match_prefix`] in namespace `ns`.
    pub fn match_prefix_in(
        &mut self,
        ns: &str,
        tokens: &[u32],
        lock: bool,
    ) -> Result<MatchResult, ClientError> {
        let request = Request::Namespaced {
            ns: ns.to_owned(),
            request: Box::new(Request::Match {
                tokens: tokens.to_vec(),
                lock,
            }),
        };
        match self.call(&request)? {
            Reply::Matched {
                len, pages, handle, ..
            } => Ok(MatchResult {
                len: len as usize,
                pages,
                handle: handle.map(Handle::from_raw),
            }),
            other => Err(unexpected(other)),
        }
    }

    /// [`Client::insert`] in namespace `ns`.
    pub fn insert_in(
        &mut self,
        ns: &str,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<InsertResult, ClientError> {
        let request = Request::Namespaced {
            ns: ns.to_owned(),
            request: Box::new(Request::Insert {
                tokens: tokens.to_vec(),
                pages: pages.to_vec(),
                lock,
            }),
        };
        inserted(self.call(&request)?)
    }

    /// [`Client::session_commit`] in namespace `ns`.
    pub fn session_commit_in(
        &mut self,
        ns: &str,
        session: &str,
        tokens: &[u32],
        pages: &[u32],
    ) -> Result<InsertResult, ClientError> {
        let request = Request::Namespaced {
            ns: ns.to_owned(),
            request: Box::new(Request::SessionCommit {
                session: session.to_owned(),
                tokens: tokens.to_vec(),
                pages: pages.to_vec(),
            }),
        };
        match self.call(&request)? {
            Reply::Inserted { cached, len, .. } => Ok(InsertResult {
                cached: cached as usize,
                len: len as usize,
                handle: None,
            }),
            other => Err(unexpected(other)),
        }
    }
}
