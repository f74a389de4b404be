//! The ring round trip: posting requests to this client's request ring
//! (payloads in the first half of the scratch, answers in windows of the
//! second half), ringing the daemon, waiting for the answers (spin, yield
//! or sleep, checking the daemon lives), and making the connection usable
//! again after a call that timed out or failed part-way. Apart from the
//! calls, which only say what to send and how to read the answer.

use std::time::{Duration, Instant};

use radixd_ipc::sync::{spin_loop, yield_now, Ordering};
use radixd_ipc::{Consumer, Doorbell, LoadSensor, Offset, Producer, Scratch, Segment, Spin};

use super::{unexpected, Client, ClientError, ProtocolError};
use crate::op::{Rejection, Reply, Request};
use crate::shared::{LiveStats, SharedLayout, RING_CAPACITY};
use crate::wire::{self, Call, WireReply, WireRequest};

/// How long a client spins for an answer before it sleeps (when the host
/// has a core to spare; otherwise it yields a few times and sleeps at once,
/// leaving the cores to the daemon and the other clients).
const SPIN_WINDOW: Duration = Duration::from_micros(50);
/// Yields before sleeping on an oversubscribed host.
const YIELDS: u32 = 4;
/// Time between two looks at the host's load.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Longest single sleep before the daemon's liveness is checked again.
const SLEEP: Duration = Duration::from_millis(10);

/// A request on its way whose answer no caller will read.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sent {
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
pub(super) struct Returns {
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
        if let Ok(reply) = answer {
            self.note_reply(locks, asks_lock, reply);
        }
    }

    /// [`Returns::note`] of a successful answer.
    fn note_reply(&mut self, locks: Option<u64>, asks_lock: bool, reply: &Reply) {
        match reply {
            Reply::Pages(pages) | Reply::PagesPaired { pages, .. } => {
                self.pages.extend_from_slice(pages)
            }
            Reply::Matched {
                handle: Some(h), ..
            }
            | Reply::MatchedWith {
                handle: Some(h), ..
            } if asks_lock => self.handles.push(*h),
            Reply::Inserted {
                handle: Some(h),
                locked: true,
                ..
            }
            | Reply::InsertedWith {
                handle: Some(h),
                locked: true,
                ..
            }
            | Reply::InsertedPaired {
                handle: Some(h),
                locked: true,
                ..
            } => self.handles.push(*h),
            Reply::State { state } => self.states.push(u64::from(*state)),
            Reply::States(states) => self.states.extend(states.iter().map(|&s| u64::from(s))),
            Reply::Done => self.handles.extend(locks),
            Reply::Locked(h) | Reply::LockedPaired { lock: h, .. } => self.handles.push(*h),
            Reply::Counted { reply, .. } => self.note_reply(locks, asks_lock, reply),
            _ => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.pages.is_empty() && self.handles.is_empty() && self.states.is_empty()
    }
}

/// This client's rings, doorbells and scratch.
pub(super) struct Port<'s> {
    requests: Producer<'s, WireRequest>,
    replies: Consumer<'s, WireReply>,
    doorbell: &'s Doorbell,
    pub(super) daemon: &'s Doorbell,
    scratch: Scratch<'s>,
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
    ///
    /// Once [`Client::free_counts`] was asked, a call that may change the
    /// pools' free counts goes counted, and its answer's counts are kept.
    pub(super) fn send(&mut self, call: Call<'_>) -> Result<Reply, ClientError> {
        let counted = self.counts(&call);
        let answer = if self.group.is_some() && call.is_stepped() {
            self.send_step(call, counted)
        } else {
            self.post(call, counted)
        };
        self.settle(&call, counted, answer)
    }

    /// The encoding of `call`, counted when `counted`.
    pub(super) fn encode_call<'c>(
        &self,
        call: Call<'c>,
        counted: bool,
    ) -> wire::EncodedRequest<'c> {
        let e = call.encode(self.page_size(), self.capacity());
        if counted {
            e.counted()
        } else {
            e
        }
    }

    /// Sends one request to the daemon (counted when `counted`) and waits
    /// for its answer (see [`Client::send`]).
    pub(super) fn post(&mut self, call: Call<'_>, counted: bool) -> Result<Reply, ClientError> {
        self.resync()?;
        let e = self.encode_call(call, counted);
        let half = self.layout.config.scratch_bytes as usize / 2;
        if e.payload_len() > half || e.reply_need > half {
            return Err(ClientError::TooLarge {
                bytes: e.payload_len().max(e.reply_need),
                room: half,
            });
        }
        let mut answers = std::mem::take(&mut self.answers);
        answers.clear();
        let done = if self.deferred.is_empty() {
            self.round_trip(std::slice::from_ref(&e), half, &mut answers)
        } else {
            // The unlocks held ride ahead of the request (`deferred`).
            let (held, mut batch) = self.take_unlocks();
            batch.push(e);
            let done = self.round_trip(&batch, half, &mut answers);
            self.settle_unlocks(&held, &mut answers);
            done
        };
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
        self.settle_batch(requests);
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
        let (mut encoded, half) = self.encode(requests);
        if let Some(big) = encoded
            .iter()
            .find(|e| e.payload_len() > half || e.reply_need > half)
        {
            return Err(ClientError::TooLarge {
                bytes: big.payload_len().max(big.reply_need),
                room: half,
            });
        }
        // The unlocks held ride ahead of the batch (`deferred`); taken only
        // once it will be posted, so a refused batch leaves them held.
        let (held, unlocks) = self.take_unlocks();
        encoded.splice(0..0, unlocks);
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
        self.settle_unlocks(&held, &mut answers);
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

    pub(super) fn done(&mut self, call: Call<'_>) -> Result<(), ClientError> {
        match self.send(call)? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
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
    pub(super) fn resync(&mut self) -> Result<(), ClientError> {
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
        self.forget_free_counts();
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
pub(super) fn port_of<'s>(
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
