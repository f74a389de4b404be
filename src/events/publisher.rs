//! The publisher thread: pops what the daemon recorded, hashes pages,
//! encodes `KVEventBatch`es and sends them on ZeroMQ, as vLLM's
//! `ZmqEventPublisher` does (`vllm/distributed/kv_events.py`):
//!
//! - PUB socket, each message three frames: topic, sequence number (8
//!   bytes big-endian, from 0, +1 per batch), payload;
//! - ROUTER replay socket: a request `[identity, "", start_seq]` (what a
//!   REQ or DEALER peer sends as `["", start_seq]`) is answered with
//!   `[identity, "", seq, payload]` for every buffered batch from
//!   `start_seq` on, then the end marker `[identity, "", -1 (8 bytes,
//!   big-endian, signed), ""]`.
//!
//! The thread owns both sockets (ZeroMQ sockets are not thread-safe) and
//! the [`EventEncoder`] with its page → hash table, so a `BlockRemoved`
//! names the hashes of the evicted pages and a `BlockStored` the hash of
//! its parent page.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_queue::ArrayQueue;

use super::encode::EventEncoder;
use super::wake::Sleep;
use super::{CacheEvent, StoreEvent};

/// vLLM's `END_SEQ`: `(-1).to_bytes(8, "big", signed=True)`.
pub const END_SEQ: [u8; 8] = [0xff; 8];
/// Events per batch at most (a batch per drain of the queue otherwise).
pub const MAX_BATCH_EVENTS: usize = 512;
/// The shortest time between two batches, and so the longest an event
/// waits for its batch while events flow. After each batch the thread naps
/// for the rest of the gap (awake as far as the daemon knows, so a push
/// needs no wake-up: while events flow the daemon makes no syscall for
/// them), sends what came meanwhile, and parks only after a nap that
/// brought nothing; the daemon's next push wakes it ([`super::wake`]), so
/// an event after a quiet spell leaves at once. One batch per gap at most:
/// each batch wakes libzmq's I/O thread and every subscriber, and on
/// 2 cores each wake-up competes with the spinning daemon and clients
/// (docs/kv-events.md measures both sides). 200 µs: about 50 events at
/// 250k inserts/s (the queue holds 65,536 by default).
pub(crate) const GAP: Duration = Duration::from_micros(200);
/// Timer slack of the publisher thread (see [`event_priority`]).
const SLACK_NS: libc::c_ulong = 10_000;
/// Slice the publisher thread (and libzmq's threads it starts) asks of
/// the scheduler: see [`event_priority`].
const SLICE_NS: u64 = 100_000;
/// Longest park with the queue empty: how long a replay request may wait
/// while no event flows. A push wakes the thread at once.
pub(crate) const PARK: Duration = Duration::from_millis(50);

/// What travels from the daemon to the publisher thread.
pub(crate) enum Msg {
    /// One recorded fact.
    Event(CacheEvent),
    /// One fact of the node store.
    Store(StoreEvent),
    /// Every value of the node store, parents first: announced when
    /// publishing starts and after the engine's `AllBlocksCleared` (a
    /// router clears a worker's every tier then).
    StoreSnapshot(Vec<StoreEvent>),
    /// The queue overflowed: everything now cached, to be sent as
    /// `AllBlocksCleared`, a `BlockStored` per run, then a `BlockStored`
    /// per value of the store.
    Resync(Vec<CacheEvent>, Vec<StoreEvent>),
}

/// State the daemon and the publisher thread share.
pub(crate) struct Shared {
    pub queue: ArrayQueue<Msg>,
    /// Announced by the publisher before it parks; the daemon unparks it
    /// then only.
    pub sleep: Sleep,
    /// Set by the daemon when it shuts down.
    pub stop: AtomicBool,
    /// Batches sent (the next sequence number).
    pub batches: AtomicU64,
    /// Emptied `Stored` buffers on their way back to the engine.
    pub spares: ArrayQueue<Vec<u32>>,
}

impl Shared {
    pub fn new(capacity: usize) -> Self {
        Self {
            queue: ArrayQueue::new(capacity.max(2)),
            sleep: Sleep::new(),
            stop: AtomicBool::new(false),
            batches: AtomicU64::new(0),
            spares: ArrayQueue::new(crate::engine::SPARE_BUFFERS * 2),
        }
    }

    /// Called by the daemon after pushing: wakes the publisher if it
    /// parks (see [`Sleep::wake`]); whether it did.
    #[inline]
    pub fn wake(&self, thread: &thread::Thread) -> bool {
        self.sleep.wake(|| thread.unpark())
    }
}

/// The sockets and state of the publisher thread.
pub(crate) struct Publisher {
    pub shared: Arc<Shared>,
    pub pub_socket: zmq::Socket,
    pub replay: Option<zmq::Socket>,
    pub topic: Vec<u8>,
    pub buffer_cap: usize,
    /// Recent `(seq, payload)` for replay.
    pub buffer: VecDeque<(u64, Vec<u8>)>,
    /// Hashes pages and builds the batch.
    pub encoder: EventEncoder,
    /// Shortest time between two batches ([`GAP`]; a test makes it long,
    /// to push while the thread naps).
    pub gap: Duration,
    /// Longest park with the queue empty ([`PARK`]; a test makes it
    /// endless to show that data, not a timeout, wakes the thread).
    pub park: Duration,
}

impl Publisher {
    /// The thread's body: until the daemon stops and the queue is empty.
    /// Sends what the queue holds, naps for the rest of [`GAP`] since the
    /// last batch, and parks if that brought nothing (the daemon's next
    /// push wakes it: no timer decides when an event after a quiet spell
    /// leaves); sends two batches less than [`GAP`] apart only when behind
    /// (queue half full) or past [`MAX_BATCH_EVENTS`].
    pub fn run(mut self) {
        // When the last batch left (long ago: the first goes at once).
        let mut sent = Instant::now()
            .checked_sub(self.gap)
            .unwrap_or_else(Instant::now);
        loop {
            self.serve_replay();
            let mut got = false;
            while let Some(msg) = self.shared.queue.pop() {
                got = true;
                self.apply(msg);
                if self.encoder.len() >= MAX_BATCH_EVENTS {
                    self.flush();
                }
            }
            self.flush();
            if got {
                sent = Instant::now();
            }
            // Acquire: pairs with the Release store in `Feed::drop`, after
            // the daemon's last push.
            if self.shared.stop.load(Ordering::Acquire) {
                if self.shared.queue.is_empty() {
                    break;
                }
                continue;
            }
            // Behind: catch up at once.
            if self.shared.queue.len() > self.shared.queue.capacity() / 2 {
                continue;
            }
            // Let the rest of the gap since the last batch gather into the
            // next one, without announcing a park: the daemon's pushes
            // meanwhile cost it no wake-up.
            if let Some(left) = self.gap.checked_sub(sent.elapsed()) {
                thread::sleep(left);
            }
            // Nothing came: park until the daemon pushes (or `park` passes,
            // for replay requests).
            if self.shared.queue.is_empty() {
                self.idle();
            }
        }
    }

    /// Parks until a push, an unpark by `Feed::drop`, or `park`.
    fn idle(&self) {
        let shared = &self.shared;
        // Relaxed `stop`: a missed store costs one park of at most `PARK`
        // (`Feed::drop` also unparks); the Acquire load in `run` orders
        // the final drain.
        let nothing = || shared.queue.is_empty() && !shared.stop.load(Ordering::Relaxed);
        shared
            .sleep
            .park(nothing, || thread::park_timeout(self.park));
    }

    fn apply(&mut self, msg: Msg) {
        match msg {
            Msg::Event(e) => self.event(e),
            Msg::Store(e) => self.store_event(&e),
            Msg::StoreSnapshot(values) => {
                for e in &values {
                    self.store_event(e);
                }
            }
            Msg::Resync(runs, values) => {
                self.event(CacheEvent::Cleared);
                for run in runs {
                    self.event(run);
                }
                for e in &values {
                    self.store_event(e);
                }
            }
        }
    }

    /// A store event, sending the batch when it is full (a snapshot may
    /// hold millions).
    fn store_event(&mut self, e: &StoreEvent) {
        self.encoder.store_event(e);
        if self.encoder.len() >= MAX_BATCH_EVENTS {
            self.flush();
        }
    }

    fn event(&mut self, e: CacheEvent) {
        self.encoder.event(&e);
        if let CacheEvent::Stored { pages, tokens, .. } = e {
            // Back to the daemon for the next `Stored` (dropped when the
            // way back is full).
            for buf in [pages, tokens] {
                if buf.capacity() <= crate::engine::SPARE_BUFFER_LEN {
                    let _ = self.shared.spares.push(buf);
                }
            }
        }
    }

    /// Sends the batch being built, if any.
    fn flush(&mut self) {
        if self.encoder.is_empty() {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = self.encoder.finish(ts, 0);
        // Relaxed: only this thread writes it; the daemon reads it for
        // `radixd stat`, where a stale figure is fine.
        let seq = self.shared.batches.load(Ordering::Relaxed);
        let frames: [&[u8]; 3] = [&self.topic, &seq.to_be_bytes(), &payload];
        // PUB never blocks: past the high-water mark a slow subscriber
        // loses messages (and asks for a replay), as with vLLM.
        if let Err(e) = self.pub_socket.send_multipart(frames, zmq::DONTWAIT) {
            if e != zmq::Error::EAGAIN {
                eprintln!("radixd: kv-events: send failed: {e}");
            }
        }
        if self.buffer_cap > 0 {
            if self.buffer.len() == self.buffer_cap {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload));
        }
        self.shared.batches.store(seq + 1, Ordering::Relaxed);
    }

    /// Answers every waiting replay request.
    fn serve_replay(&mut self) {
        let Some(replay) = &self.replay else {
            return;
        };
        while let Ok(frames) = replay.recv_multipart(zmq::DONTWAIT) {
            // vLLM's `_service_replay`: exactly [identity, "", start_seq].
            let [id, _, start] = frames.as_slice() else {
                continue;
            };
            let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
                continue;
            };
            let start = u64::from_be_bytes(start);
            for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
                let frames: [&[u8]; 4] = [id, b"", &seq.to_be_bytes(), payload];
                if replay.send_multipart(frames, zmq::DONTWAIT).is_err() {
                    break;
                }
            }
            let end: [&[u8]; 4] = [id, b"", &END_SEQ, b""];
            let _ = replay.send_multipart(end, zmq::DONTWAIT);
        }
    }
}

/// Gives the calling thread a prompt wake-up and a short run: asks the
/// scheduler for a 100 µs slice, and sets its timer slack to 10 µs (the
/// publisher's nap between batches ends that close to its time, not the
/// default 50 µs). Threads it starts afterwards inherit both (glibc's
/// default `PTHREAD_INHERIT_SCHED`), libzmq's I/O thread among them.
///
/// From Linux 6.12 (EEVDF's custom slices, `sched_setattr(2)`'s
/// `sched_runtime` for `SCHED_OTHER`) a thread asking for a shorter slice
/// than the running one's preempts it on wake-up, and yields after that
/// long; older kernels ignore the request. This replaces `SCHED_BATCH`,
/// under which no wake-up preempts: with the daemon and clients spinning
/// on every core, each of the publisher's and libzmq's wake-ups then
/// waited for the next scheduler tick (4 ms at 250 Hz), and events took
/// milliseconds to leave (docs/kv-events.md). A thread under another
/// policy (a daemon started under `chrt`) keeps it. Best effort: the
/// thread runs as it is if a call fails.
pub fn event_priority() {
    // SAFETY: prctl(2) PR_SET_TIMERSLACK changes only the calling thread's
    // timer slack; no memory is involved.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, SLACK_NS) };
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr(2) for the calling thread (pid 0) writes at
    // most `size` bytes into `attr`, a valid local of that size.
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr, size, 0) };
    if got != 0 || attr.policy != libc::SCHED_OTHER as u32 {
        return;
    }
    attr.size = size;
    attr.runtime = SLICE_NS;
    // SAFETY: sched_setattr(2) for the calling thread (pid 0) reads `attr`,
    // a valid local whose `size` says its length, during the call.
    let _ = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr, 0) };
}

/// `struct sched_attr` of `sched_setattr(2)`, its first version (48
/// bytes), which every kernel since 3.14 takes.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    /// For `SCHED_OTHER` (Linux 6.12 on): the slice asked for, in ns.
    runtime: u64,
    deadline: u64,
    period: u64,
}

const _: () = assert!(std::mem::size_of::<SchedAttr>() == 48);
