//! The daemon's end of KV events: starts the publisher thread, and after
//! each round of requests moves what the engine recorded onto the queue,
//! without ever blocking.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::batch::BatchLayout;
use super::encode::EventEncoder;
use super::hash::{Scheme, SchemeName};
use super::publisher::{event_priority, Msg, Publisher, Shared, GAP, PARK};
use super::{CacheEvent, EventsConfig, EventsError, StoreEvent};
use crate::engine::{Engine, Region};
use crate::shared::LiveStats;
use crate::store::StoreIndex;

/// Publishes what an engine caches and evicts (see the module docs of
/// [`crate::events`]). Dropping it flushes the queue and stops the thread.
pub struct Feed {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Facts taken from the engine, reused between rounds.
    taken: Vec<CacheEvent>,
    /// Facts taken from the store, reused between rounds.
    store_taken: Vec<StoreEvent>,
    /// The queue overflowed: what it lost is to be replaced by a resync.
    lost: bool,
    overflows: u64,
    /// Times the daemon unparked the publisher.
    wakes: u64,
}

impl Feed {
    /// Binds the sockets `config` names, starts the publisher thread and
    /// turns on `engine`'s record of what it caches and evicts, and the
    /// `store`'s of what it commits and lets go (its values are announced
    /// first: a store adopted from a previous daemon is not empty).
    pub fn start<R: Region>(
        config: &EventsConfig,
        engine: &mut Engine<R>,
        store: Option<&mut StoreIndex>,
    ) -> Result<Self, EventsError> {
        let mut feed = Self::start_timed(config, engine, GAP, PARK)?;
        if let Some(store) = store {
            store.record_events(true);
            let values = store.snapshot();
            // The queue is empty: the snapshot (one message) fits.
            if !values.is_empty() && feed.shared.queue.push(Msg::StoreSnapshot(values)).is_err() {
                feed.lost = true;
            }
            if let Some(t) = &feed.thread {
                feed.shared.wake(t.thread());
            }
        }
        Ok(feed)
    }

    /// [`Feed::start`] with the publisher sending at most one batch per
    /// `gap` and parking at most `park` while its queue is empty.
    pub(crate) fn start_timed<R: Region>(
        config: &EventsConfig,
        engine: &mut Engine<R>,
        gap: Duration,
        park: Duration,
    ) -> Result<Self, EventsError> {
        let page_size = engine.page_size();
        let name: SchemeName = config
            .hash
            .parse()
            .map_err(|e| EventsError::Config(format!("{e}")))?;
        let layout: BatchLayout = config
            .layout
            .parse()
            .map_err(|e| EventsError::Config(format!("{e}")))?;
        if config.queue < 2 {
            return Err(EventsError::Config(
                "the queue needs room for 2 events".into(),
            ));
        }
        let shared = Arc::new(Shared::new(config.queue));
        let (setup_tx, setup_rx) = mpsc::channel();
        let (config, thread_shared) = (config.clone(), Arc::clone(&shared));
        let thread = thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || {
                // Before the context exists: libzmq's I/O thread inherits
                // the slice and the slack (see `event_priority`).
                event_priority();
                let ctx = zmq::Context::new();
                match sockets(&ctx, &config) {
                    Ok((pub_socket, replay)) => {
                        let _ = setup_tx.send(Ok(()));
                        Publisher {
                            shared: thread_shared,
                            pub_socket,
                            replay,
                            topic: config.topic.as_bytes().to_vec(),
                            buffer_cap: config.replay_buffer,
                            buffer: VecDeque::new(),
                            encoder: EventEncoder::new(
                                Scheme::new(name, &config.hash_seed),
                                page_size,
                                &config.medium,
                                layout,
                            ),
                            gap,
                            park,
                        }
                        .run();
                        // The sockets closed (lingering on unsent batches)
                        // as `run` returned; now the context ends.
                    }
                    Err(e) => {
                        let _ = setup_tx.send(Err(e));
                    }
                }
                drop(ctx);
            })
            .map_err(EventsError::Thread)?;
        let setup = setup_rx.recv().unwrap_or_else(|_| {
            Err(EventsError::Config(
                "the publisher thread ended during setup".into(),
            ))
        });
        if let Err(e) = setup {
            let _ = thread.join();
            return Err(e);
        }
        engine.record_events(true);
        Ok(Self {
            shared,
            thread: Some(thread),
            taken: Vec::new(),
            store_taken: Vec::new(),
            lost: false,
            overflows: 0,
            wakes: 0,
        })
    }

    /// Moves what `engine` and `store` recorded since the last call onto
    /// the queue. On overflow the rest is dropped and counted, and as soon
    /// as the queue has room a resync (everything now cached and stored)
    /// takes its place. After the engine's `Cleared` (which a router
    /// applies to every tier of the node) the store's values are announced
    /// again. Never blocks; refreshes the event figures in `live`.
    pub fn after_requests<R: Region>(
        &mut self,
        engine: &mut Engine<R>,
        mut store: Option<&mut StoreIndex>,
        live: &LiveStats,
    ) {
        // Relaxed: figures for `radixd stat`; a stale one is fine.
        let batches = self.shared.batches.load(Ordering::Relaxed);
        live.events_batches.store(batches, Ordering::Relaxed);
        engine.take_events(&mut self.taken);
        if let Some(s) = store.as_deref_mut() {
            s.take_events(&mut self.store_taken);
        }
        if self.taken.is_empty() && self.store_taken.is_empty() && !self.lost {
            return;
        }
        // Buffers the publisher is done with, for the engine's next copies.
        while engine.spare_event_buffers() < crate::engine::SPARE_BUFFERS / 2 {
            match self.shared.spares.pop() {
                Some(buf) => {
                    engine.recycle_event_buffer(buf);
                }
                None => break,
            }
        }
        let queue = &self.shared.queue;
        let mut pushed = false;
        if self.lost {
            // What was taken is part of the state the resync carries.
            self.taken.clear();
            self.store_taken.clear();
            if queue.len() + 1 >= queue.capacity() {
                return;
            }
            let values = store.map_or_else(Vec::new, |s| s.snapshot());
            if queue
                .push(Msg::Resync(engine.cached_runs(), values))
                .is_ok()
            {
                self.lost = false;
                pushed = true;
            }
        } else {
            let mut cleared = false;
            for e in self.taken.drain(..) {
                cleared |= matches!(e, CacheEvent::Cleared);
                if queue.push(Msg::Event(e)).is_err() {
                    self.lost = true;
                    break;
                }
                pushed = true;
            }
            if cleared && !self.lost {
                // The snapshot holds what the round's store facts did.
                self.store_taken.clear();
                let values = store.map_or_else(Vec::new, |s| s.snapshot());
                if !values.is_empty() {
                    self.lost = queue.push(Msg::StoreSnapshot(values)).is_err();
                    pushed |= !self.lost;
                }
            }
            for e in self.store_taken.drain(..) {
                if self.lost {
                    break;
                }
                if queue.push(Msg::Store(e)).is_err() {
                    self.lost = true;
                    break;
                }
                pushed = true;
            }
            if self.lost {
                self.taken.clear();
                self.store_taken.clear();
                self.overflows += 1;
                // Relaxed: a figure for `radixd stat`; the daemon is its
                // only writer.
                live.events_overflows
                    .store(self.overflows, Ordering::Relaxed);
            }
        }
        if pushed {
            if let Some(t) = &self.thread {
                self.wakes += u64::from(self.shared.wake(t.thread()));
            }
        }
    }

    /// Times the queue overflowed (each followed by a resync).
    pub fn overflows(&self) -> u64 {
        self.overflows
    }

    /// Times the daemon unparked the publisher (a syscall each).
    #[cfg(test)]
    pub(crate) fn wakes(&self) -> u64 {
        self.wakes
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        // Release: every push happens before the publisher sees `stop`;
        // pairs with its Acquire load.
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Creates and binds (or connects) the PUB socket and the optional ROUTER
/// replay socket `config` names.
fn sockets(
    ctx: &zmq::Context,
    config: &EventsConfig,
) -> Result<(zmq::Socket, Option<zmq::Socket>), EventsError> {
    let pub_socket = ctx
        .socket(zmq::PUB)
        .map_err(|e| EventsError::Zmq("create the PUB socket", e))?;
    // vLLM's `hwm` default.
    pub_socket
        .set_sndhwm(100_000)
        .map_err(|e| EventsError::Zmq("set the PUB high-water mark", e))?;
    pub_socket
        .set_linger(500)
        .map_err(|e| EventsError::Zmq("set the PUB linger", e))?;
    if config.connect {
        pub_socket
            .connect(&config.endpoint)
            .map_err(|e| EventsError::Zmq("connect the PUB socket", e))?;
    } else {
        pub_socket
            .bind(&config.endpoint)
            .map_err(|e| EventsError::Zmq("bind the PUB socket", e))?;
    }
    let replay = match &config.replay_endpoint {
        None => None,
        Some(ep) => {
            let s = ctx
                .socket(zmq::ROUTER)
                .map_err(|e| EventsError::Zmq("create the ROUTER socket", e))?;
            // A replay from 0 sends the whole buffer at once: room for it.
            let hwm = i32::try_from(config.replay_buffer.saturating_mul(2))
                .unwrap_or(i32::MAX)
                .max(1000);
            s.set_sndhwm(hwm)
                .map_err(|e| EventsError::Zmq("set the ROUTER high-water mark", e))?;
            s.set_linger(0)
                .map_err(|e| EventsError::Zmq("set the ROUTER linger", e))?;
            s.bind(ep)
                .map_err(|e| EventsError::Zmq("bind the ROUTER replay socket", e))?;
            Some(s)
        }
    };
    Ok((pub_socket, replay))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::atomic::Ordering;
    use std::thread;
    use std::time::{Duration, Instant};

    use super::Feed;
    use crate::engine::{Config, Engine};
    use crate::events::EventsConfig;
    use crate::shared::LiveStats;

    /// Held by every test that starts a feed: `publisher_threads` tells
    /// one test's threads from another's only when they do not overlap
    /// (`cargo test` runs the tests of a binary in threads of one process).
    static ONE_FEED: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// An `ipc://` endpoint's socket file, removed on drop (after the feed,
    /// declared later, has closed it): libzmq unlinks it from its I/O
    /// thread, which may not get to it before the test process exits.
    struct Unlinked(std::path::PathBuf);

    impl Drop for Unlinked {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// The ids of this process's threads named `kv-events`: publishers and
    /// the libzmq threads each starts (they inherit its name). No other
    /// unit test starts a feed while `ONE_FEED` is held.
    fn publisher_threads() -> Vec<String> {
        let tasks = fs::read_dir("/proc/self/task").expect("/proc/self/task");
        tasks
            .filter_map(|task| {
                let task = task.ok()?;
                let comm = fs::read_to_string(task.path().join("comm")).ok()?;
                (comm.trim() == "kv-events").then(|| task.file_name().into_string().ok())?
            })
            .collect()
    }

    /// How many times thread `tid` blocked (parked, slept) so far.
    fn voluntary_switches(tid: &str) -> u64 {
        let status = fs::read_to_string(format!("/proc/self/task/{tid}/status")).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("voluntary_ctxt_switches")
    }

    /// The publisher wakes on data, not on a timer, and sleeps while idle.
    /// Its park is made an hour long, so a publisher that looked at its
    /// queue only when a nap or its park ran out would deliver nothing
    /// within the minute this waits; and a parked publisher blocks once,
    /// not once per nap. Nothing here measures a latency, so a loaded
    /// machine cannot fail it.
    #[test]
    fn the_publisher_wakes_on_data_and_sleeps_while_idle() {
        let _one = ONE_FEED.lock().unwrap_or_else(|e| e.into_inner());
        let socket = Unlinked(
            std::env::temp_dir().join(format!("radixd-feed-wake-{}.sock", std::process::id())),
        );
        let endpoint = format!("ipc://{}", socket.0.display());
        let mut engine = Engine::new(Config {
            page_size: 2,
            capacity: 4096,
        })
        .expect("engine");
        // SAFETY: `LiveStats` is atomics only, valid for every bit pattern
        // (it is `ShmSafe`), zeros included.
        let live: LiveStats = unsafe { std::mem::zeroed() };
        let before = publisher_threads();
        let mut feed = Feed::start_timed(
            &EventsConfig::new(endpoint.clone()),
            &mut engine,
            super::GAP,
            Duration::from_secs(3600),
        )
        .expect("feed");
        let ours: Vec<String> = publisher_threads()
            .into_iter()
            .filter(|t| !before.contains(t))
            .collect();
        assert!(!ours.is_empty(), "no publisher thread");
        let blocks = || ours.iter().map(|t| voluntary_switches(t)).sum::<u64>();
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).expect("SUB");
        sub.set_subscribe(b"").expect("subscribe");
        sub.connect(&endpoint).expect("connect");

        let limit = Instant::now() + Duration::from_secs(60);
        let left_ms = || {
            let left = limit.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "an event waited a minute for the publisher"
            );
            i64::try_from(left.as_millis()).unwrap_or(i64::MAX)
        };
        // A poll of a lone flag (it orders nothing here).
        let parked = |feed: &Feed| feed.shared.sleep.is_parked();
        let mut key = 0u32;
        // One round of the daemon: a page cached, its event pushed (after
        // the publisher parks, when `wait` says so). Returns a sequence
        // number the batch carrying the event has at least.
        let mut round = |feed: &mut Feed, engine: &mut Engine, wait: bool| {
            while wait && !parked(feed) {
                left_ms();
                thread::sleep(Duration::from_millis(1));
            }
            // Relaxed: a lower bound is enough (the event goes in a batch
            // counted after this load).
            let seq = feed.shared.batches.load(Ordering::Relaxed);
            key += 1;
            let pages = engine.alloc(0, 1).expect("alloc");
            engine
                .insert(0, &[key, key], &pages, false)
                .expect("insert");
            feed.after_requests(engine, None, &live);
            seq
        };
        let recv_seq = || {
            let frames = sub.recv_multipart(0).expect("recv");
            u64::from_be_bytes(frames[1].as_slice().try_into().expect("seq"))
        };

        // ZeroMQ's slow joiner: a PUB drops what it sends before the
        // subscription reaches it, so rounds go on until a batch arrives.
        loop {
            round(&mut feed, &mut engine, true);
            if sub.poll(zmq::POLLIN, 100).expect("poll") > 0 {
                break;
            }
            left_ms();
        }
        // Then each round's event arrives: half of them pushed while the
        // publisher is parked, half as soon as the last batch came in.
        for i in 0..20 {
            let want = round(&mut feed, &mut engine, i % 2 == 0);
            loop {
                assert!(sub.poll(zmq::POLLIN, left_ms()).expect("poll") > 0);
                if recv_seq() >= want {
                    break;
                }
            }
        }

        // Idle: parked, the publisher blocks once or twice (once more if
        // the last round's wake-up comes after its park began), and
        // libzmq's threads, with nothing to send, not at all, however long
        // it stays idle; a publisher that napped or polled would block
        // every few milliseconds (every 50 ms with the daemon's own park).
        while !parked(&feed) {
            left_ms();
            thread::sleep(Duration::from_millis(1));
        }
        let blocked = blocks();
        thread::sleep(Duration::from_millis(500));
        let woke = blocks() - blocked;
        assert!(
            woke <= 4,
            "an idle publisher blocked {woke} times in 500 ms"
        );
        drop(feed);
    }

    /// What the daemon pushes while the publisher naps between batches
    /// leaves when the nap ends, and costs the daemon no wake-up. The nap
    /// is made 200 ms long and the park an hour: a publisher that parked
    /// after its nap without looking at its queue once more would deliver
    /// nothing within the minute this waits, and one that announced a park
    /// while napping would be woken every round. Each round pushes 20 ms
    /// after the previous batch arrived, well inside the nap; a round
    /// delayed past it (a loaded machine) is woken as usual, so only half
    /// the rounds must go without. Nothing here measures a latency.
    #[test]
    fn pushes_during_a_nap_leave_after_it_without_a_wake_up() {
        let _one = ONE_FEED.lock().unwrap_or_else(|e| e.into_inner());
        let socket = Unlinked(
            std::env::temp_dir().join(format!("radixd-feed-nap-{}.sock", std::process::id())),
        );
        let endpoint = format!("ipc://{}", socket.0.display());
        let mut engine = Engine::new(Config {
            page_size: 2,
            capacity: 4096,
        })
        .expect("engine");
        // SAFETY: `LiveStats` is atomics only, valid for every bit pattern
        // (it is `ShmSafe`), zeros included.
        let live: LiveStats = unsafe { std::mem::zeroed() };
        let mut feed = Feed::start_timed(
            &EventsConfig::new(endpoint.clone()),
            &mut engine,
            Duration::from_millis(200),
            Duration::from_secs(3600),
        )
        .expect("feed");
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).expect("SUB");
        sub.set_subscribe(b"").expect("subscribe");
        sub.connect(&endpoint).expect("connect");
        let limit = Instant::now() + Duration::from_secs(60);
        let left_ms = || {
            let left = limit.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "an event waited a minute for the publisher"
            );
            i64::try_from(left.as_millis()).unwrap_or(i64::MAX)
        };
        let mut key = 0u32;
        // One round of the daemon: a page cached, its event pushed. Returns
        // a sequence number the batch carrying the event has at least.
        let mut round = |feed: &mut Feed, engine: &mut Engine| {
            // Relaxed: a lower bound is enough (the event goes in a batch
            // counted after this load).
            let seq = feed.shared.batches.load(Ordering::Relaxed);
            key += 1;
            let pages = engine.alloc(0, 1).expect("alloc");
            engine
                .insert(0, &[key, key], &pages, false)
                .expect("insert");
            feed.after_requests(engine, None, &live);
            seq
        };
        let recv_seq = || {
            let frames = sub.recv_multipart(0).expect("recv");
            u64::from_be_bytes(frames[1].as_slice().try_into().expect("seq"))
        };
        // ZeroMQ's slow joiner: rounds until a batch arrives.
        loop {
            round(&mut feed, &mut engine);
            if sub.poll(zmq::POLLIN, 100).expect("poll") > 0 {
                recv_seq();
                break;
            }
            left_ms();
        }
        let (rounds, woken) = (10, feed.wakes());
        for _ in 0..rounds {
            // Into the nap, not before it: the publisher may still be
            // busy with the batch it sent.
            thread::sleep(Duration::from_millis(20));
            let want = round(&mut feed, &mut engine);
            loop {
                assert!(sub.poll(zmq::POLLIN, left_ms()).expect("poll") > 0);
                if recv_seq() >= want {
                    break;
                }
            }
        }
        let wakes = feed.wakes() - woken;
        assert!(
            wakes <= rounds / 2,
            "{wakes} wake-ups for {rounds} rounds pushed while the publisher napped"
        );
        drop(feed);
    }
}
