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
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_queue::ArrayQueue;

use super::encode::EventEncoder;
use super::{CacheEvent, StoreEvent};

/// vLLM's `END_SEQ`: `(-1).to_bytes(8, "big", signed=True)`.
pub const END_SEQ: [u8; 8] = [0xff; 8];
/// Events per batch at most (a batch per drain of the queue otherwise).
pub const MAX_BATCH_EVENTS: usize = 512;
/// The shortest time between two batches. The thread wakes on data (the
/// daemon unparks it after a push), so an event after a quiet spell leaves
/// at once; while events keep coming it sends at most one batch per gap,
/// the events of the gap together. A batch per push would cost the request
/// path: on 2 cores every wake-up of this thread (and of libzmq's I/O
/// thread and of the subscriber it sends to) competes with the spinning
/// daemon and clients (measured with polling naps: at 200 µs `match` p99
/// went from 3 to 270 µs; the gap, unlike a nap, passes only while events
/// flow). The queue holds what the daemon records meanwhile (about 250
/// events at 500k requests/s, of 65,536 by default).
const GAP: Duration = Duration::from_micros(500);
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
    /// Set by the publisher before it parks; the daemon unparks it when set.
    pub asleep: AtomicBool,
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
            asleep: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            batches: AtomicU64::new(0),
            spares: ArrayQueue::new(crate::engine::SPARE_BUFFERS * 2),
        }
    }

    /// Called by the daemon after pushing: wakes a parked publisher.
    ///
    /// No wake-up is lost. The daemon pushes, then (fence) loads `asleep`;
    /// the publisher, in [`Publisher::idle`], stores `asleep`, then (fence)
    /// looks at the queue. The two SeqCst fences are totally ordered: if
    /// this one comes first, the publisher's look sees the push and it does
    /// not park; if its fence comes first, the load below sees `asleep` set
    /// and unparks, and an unpark that lands before `park_timeout` makes it
    /// return at once (the thread's token). A push the publisher would see
    /// anyway costs at most one spurious unpark, which ends a later park
    /// early. The queue's own atomics (SeqCst in `crossbeam_queue`) are
    /// the "push" and the "look".
    pub fn wake(&self, thread: &thread::Thread) {
        // SeqCst fence: orders the push before the load of `asleep`; pairs
        // with the fence in `Publisher::idle` between its store of `asleep`
        // and its look at the queue (Dekker: one of the two sees the other).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above (pairs with `idle`'s fence).
        if self.asleep.load(Ordering::Relaxed) {
            thread.unpark();
        }
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
    /// Longest park with the queue empty ([`PARK`]; a test makes it
    /// endless to show that data, not a timeout, wakes the thread).
    pub park: Duration,
}

impl Publisher {
    /// The thread's body: until the daemon stops and the queue is empty.
    /// Parks while the queue is empty (a push wakes it: no timer decides
    /// when an event leaves); sends two batches less than [`GAP`] apart
    /// only when behind (queue half full) or past [`MAX_BATCH_EVENTS`].
    pub fn run(mut self) {
        // When the last batch left (long ago: the first goes at once).
        let mut sent = Instant::now().checked_sub(GAP).unwrap_or_else(Instant::now);
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
            // Nothing waiting: park until the daemon pushes (or `park`
            // passes, for replay requests).
            if self.shared.queue.is_empty() && !self.idle() {
                continue;
            }
            // Events are waiting: let the rest of the gap since the last
            // batch gather into the next one.
            if let Some(left) = GAP.checked_sub(sent.elapsed()) {
                thread::sleep(left);
            }
        }
    }

    /// Parks until a push or `park`; whether the queue then holds events.
    fn idle(&self) -> bool {
        // Relaxed: ordered before the look at the queue by the fence below,
        // which pairs with the fence in `Shared::wake`.
        self.shared.asleep.store(true, Ordering::Relaxed);
        // SeqCst fence: pairs with the fence in `Shared::wake` (Dekker: the
        // daemon sees `asleep` and unparks, or this thread sees its push).
        fence(Ordering::SeqCst);
        // Relaxed `stop`: a missed store costs one park of at most `PARK`
        // (`Feed::drop` also unparks); the Acquire load in `run` orders
        // the final drain.
        if self.shared.queue.is_empty() && !self.shared.stop.load(Ordering::Relaxed) {
            thread::park_timeout(self.park);
        }
        // Relaxed: a spurious unpark by a daemon that still sees `true`
        // only shortens the next park.
        self.shared.asleep.store(false, Ordering::Relaxed);
        !self.shared.queue.is_empty()
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

/// Puts the calling thread under `SCHED_BATCH`: the scheduler never lets
/// its wake-ups preempt a running thread, so the publisher runs in the
/// gaps of the request path instead of cutting into it. Threads it starts
/// afterwards inherit the policy (glibc's default `PTHREAD_INHERIT_SCHED`),
/// libzmq's I/O thread among them. Best effort: the thread runs as it is if
/// the call fails.
pub fn batch_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(2) with pid 0 changes only the calling
    // thread's policy and reads `param`, a valid local, during the call.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
}
