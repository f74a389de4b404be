//! KV events: what a radixd node caches and evicts, published in vLLM's
//! wire format so cluster routers (NVIDIA Dynamo's KV router, llm-d's
//! KV-cache indexer) index the node like a vLLM worker
//! (`docs/kv-events.md`).
//!
//! The engine knows nothing of this module: when recording is on it appends
//! plain facts ([`CacheEvent`]: page ids and tokens) to a `Vec`. The daemon
//! hands them, after each round of requests, to a [`Feed`], which pushes
//! them onto a bounded lock-free queue and never blocks. A publisher thread
//! ([`publisher`]) pops them, hashes the pages ([`hash`]), encodes vLLM's
//! `KVEventBatch` ([`batch`], over a small [`msgpack`] codec) and sends it
//! on a ZeroMQ PUB socket, keeping recent batches for a ROUTER replay
//! socket. [`subscriber`] is the consumer side (`radixd events`, tests).
//!
//! Only [`EventsConfig`] and [`EventsError`] exist without the `kv-events`
//! cargo feature, so a daemon configuration names events either way; the
//! codecs ([`hash`], [`msgpack`], [`batch`]) also come with the `index`
//! feature, which decodes events without ZeroMQ.

use std::fmt;

#[cfg(any(feature = "kv-events", feature = "index"))]
pub mod batch;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(any(feature = "kv-events", feature = "index"))]
pub mod encode;
#[cfg(feature = "kv-events")]
mod feed;
#[cfg(any(feature = "kv-events", feature = "index"))]
pub mod hash;
#[cfg(any(feature = "kv-events", feature = "index"))]
pub mod msgpack;
#[cfg(feature = "kv-events")]
pub mod publisher;
#[cfg(any(feature = "kv-events", feature = "index"))]
pub mod store;
#[cfg(feature = "kv-events")]
pub mod subscriber;
#[cfg(feature = "kv-events")]
mod wake;

#[cfg(feature = "kv-events")]
pub use feed::Feed;

pub use crate::engine::CacheEvent;
pub use crate::store::StoreEvent;

/// How `radixd serve --kv-events` publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventsConfig {
    /// ZeroMQ PUB endpoint (`tcp://*:5557`, `tcp://127.0.0.1:5557`, `ipc://…`).
    pub endpoint: String,
    /// Connect the PUB socket to `endpoint` instead of binding it (for a
    /// consumer that binds, vLLM's rule for endpoints without a wildcard).
    pub connect: bool,
    /// ZeroMQ ROUTER endpoint for replay requests, bound; none: no replay.
    pub replay_endpoint: Option<String>,
    /// Topic frame of every message (vLLM's `topic`, `""` by default).
    pub topic: String,
    /// `xxh3` (Dynamo) or `sha256-cbor` (vLLM, llm-d).
    pub hash: String,
    /// vLLM's `PYTHONHASHSEED`, rooting `sha256-cbor` hashes.
    pub hash_seed: String,
    /// The `medium` field of every event (vLLM's `"GPU"`).
    pub medium: String,
    /// `array` (msgspec `array_like=True`, the default) or `map` (recent
    /// vLLM main): see [`batch::BatchLayout`].
    pub layout: String,
    /// Batches kept for replay (vLLM's `buffer_steps`, 10,000).
    pub replay_buffer: usize,
    /// Events the daemon → publisher queue holds; past that the publisher
    /// has fallen behind and subscribers are resynchronised.
    pub queue: usize,
}

impl EventsConfig {
    /// Publishing on `endpoint` with vLLM's defaults for the rest.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            connect: false,
            replay_endpoint: None,
            topic: String::new(),
            hash: "xxh3".into(),
            hash_seed: "0".into(),
            medium: "GPU".into(),
            layout: "array".into(),
            replay_buffer: 10_000,
            queue: 1 << 16,
        }
    }
}

/// Why events could not be set up or received.
#[derive(Debug)]
pub enum EventsError {
    /// This build has no `kv-events` feature.
    NotBuilt,
    /// A bad `--kv-events*` value.
    Config(String),
    /// A ZeroMQ call failed: what was being done, and why.
    #[cfg(feature = "kv-events")]
    Zmq(&'static str, zmq::Error),
    /// A message that is not what vLLM's format says.
    #[cfg(feature = "kv-events")]
    Malformed(String),
    /// The publisher thread could not be started.
    Thread(std::io::Error),
}

impl fmt::Display for EventsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotBuilt => write!(f, "radixd was built without the kv-events feature"),
            Self::Config(m) => write!(f, "bad KV events configuration: {m}"),
            #[cfg(feature = "kv-events")]
            Self::Zmq(what, e) => write!(f, "ZeroMQ: cannot {what}: {e}"),
            #[cfg(feature = "kv-events")]
            Self::Malformed(m) => write!(f, "malformed KV event message: {m}"),
            Self::Thread(e) => write!(f, "cannot start the publisher thread: {e}"),
        }
    }
}

impl std::error::Error for EventsError {}

/// What the daemon holds for KV events: a running [`Feed`], or nothing.
/// Exists without the `kv-events` feature, so `serve` needs no `cfg`.
pub struct Events {
    #[cfg(feature = "kv-events")]
    feed: Option<Feed>,
}

impl Events {
    /// Starts publishing for `engine` and the node's `store` when `config`
    /// asks for it (turning on their records; the store's values are
    /// announced first), and marks it in `live`.
    pub fn start<R: crate::engine::Region>(
        config: Option<&EventsConfig>,
        engine: &mut crate::engine::Engine<R>,
        store: Option<&mut crate::store::StoreIndex>,
        live: &crate::shared::LiveStats,
    ) -> Result<Self, EventsError> {
        let Some(config) = config else {
            return Ok(Self {
                #[cfg(feature = "kv-events")]
                feed: None,
            });
        };
        #[cfg(feature = "kv-events")]
        {
            let feed = Feed::start(config, engine, store)?;
            // Relaxed: a flag for `radixd stat`.
            live.events_enabled
                .store(1, radixd_ipc::sync::Ordering::Relaxed);
            Ok(Self { feed: Some(feed) })
        }
        #[cfg(not(feature = "kv-events"))]
        {
            let _ = (config, engine, store, live);
            Err(EventsError::NotBuilt)
        }
    }

    /// After a round of requests: hands what the engine and the store
    /// recorded to the publisher. One branch when events are off.
    #[inline]
    pub fn after_requests<R: crate::engine::Region>(
        &mut self,
        engine: &mut crate::engine::Engine<R>,
        store: Option<&mut crate::store::StoreIndex>,
        live: &crate::shared::LiveStats,
    ) {
        #[cfg(feature = "kv-events")]
        if let Some(feed) = self.feed.as_mut() {
            feed.after_requests(engine, store, live);
        }
        #[cfg(not(feature = "kv-events"))]
        let _ = (engine, store, live);
    }
}
