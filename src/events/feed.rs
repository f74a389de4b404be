//! The daemon's end of KV events: starts the publisher thread, and after
//! each round of requests moves what the engine recorded onto the queue,
//! without ever blocking.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};

use super::batch::BatchLayout;
use super::encode::EventEncoder;
use super::hash::{Scheme, SchemeName};
use super::publisher::{batch_priority, Msg, Publisher, Shared};
use super::{CacheEvent, EventsConfig, EventsError};
use crate::engine::{Engine, Region};
use crate::shared::LiveStats;

/// Publishes what an engine caches and evicts (see the module docs of
/// [`crate::events`]). Dropping it flushes the queue and stops the thread.
pub struct Feed {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Facts taken from the engine, reused between rounds.
    taken: Vec<CacheEvent>,
    /// The queue overflowed: what it lost is to be replaced by a resync.
    lost: bool,
    overflows: u64,
}

impl Feed {
    /// Binds the sockets `config` names, starts the publisher thread and
    /// turns on `engine`'s record of what it caches and evicts.
    pub fn start<R: Region>(
        config: &EventsConfig,
        engine: &mut Engine<R>,
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
                // the policy (see `batch_priority`).
                batch_priority();
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
            lost: false,
            overflows: 0,
        })
    }

    /// Moves what `engine` recorded since the last call onto the queue. On
    /// overflow the rest is dropped and counted, and as soon as the queue
    /// has room a resync (everything now cached) takes its place. Never
    /// blocks; refreshes the event figures in `live`.
    pub fn after_requests<R: Region>(&mut self, engine: &mut Engine<R>, live: &LiveStats) {
        // Relaxed: figures for `radixd stat`; a stale one is fine.
        let batches = self.shared.batches.load(Ordering::Relaxed);
        live.events_batches.store(batches, Ordering::Relaxed);
        engine.take_events(&mut self.taken);
        if self.taken.is_empty() && !self.lost {
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
            if queue.len() + 1 >= queue.capacity() {
                return;
            }
            if queue.push(Msg::Resync(engine.cached_runs())).is_ok() {
                self.lost = false;
                pushed = true;
            }
        } else {
            for e in self.taken.drain(..) {
                if queue.push(Msg::Event(e)).is_err() {
                    self.lost = true;
                    break;
                }
                pushed = true;
            }
            if self.lost {
                self.taken.clear();
                self.overflows += 1;
                // Relaxed: a figure for `radixd stat`; the daemon is its
                // only writer.
                live.events_overflows
                    .store(self.overflows, Ordering::Relaxed);
            }
        }
        if pushed {
            if let Some(t) = &self.thread {
                self.shared.wake(t.thread());
            }
        }
    }

    /// Times the queue overflowed (each followed by a resync).
    pub fn overflows(&self) -> u64 {
        self.overflows
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
