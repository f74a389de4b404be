//! radixd: a prefix (KV) cache server for LLM serving.
//!
//! - [`engine`]: the cache itself (radix tree, page pool, locks, sessions,
//!   LRU eviction) over one contiguous region of plain data; knows nothing of
//!   IPC.
//! - [`op`]: the requests a client makes, their answers and errors.
//! - [`exec`]: the JSON-lines front end (`radixd exec`).
//! - [`wire`]: how requests and answers travel over shared memory.
//! - [`shared`]: what the daemon keeps in shared memory.
//! - [`readers`]: the daemon's grace period over the readers' epochs.
//! - [`daemon`]: `radixd serve`, the engine behind the rings.
//! - [`events`]: KV events in vLLM's wire format for cluster routers.
//! - `index` (feature `index`): the cluster router's KV index over those
//!   events (per-worker overlap scores, as Dynamo's router computes them).
//! - [`binding`]: which KV buffer a daemon's page pool belongs to.
//! - [`group`]: the ranks of one tensor-parallel server on one tree (each
//!   step carried out once, every rank answered the same).
//! - [`client`]: [`Client`], a scheduler's connection to the daemon.
//! - [`order`]: cache-aware scheduling order (LPM, DFS-weight) from
//!   lock-free peeks.
//! - [`replay`]: trace replay under LRU, LFU, S3-FIFO and the engine.
//! - [`bench`](mod@bench): latency under contention, shared memory against a Unix
//!   socket.
//! - [`chart`]: the SVG line charts of `replay --plot` and `bench --plot`.

#[cfg(not(loom))]
pub mod binding;
pub mod engine;
// Under loom (`--cfg loom`, for `loom_tests`) only the engine, the
// readers' grace period and the store's index and reader, which the models
// drive: the rest needs real shared memory.
#[cfg(not(loom))]
pub mod client;
#[cfg(not(loom))]
pub mod daemon;
#[cfg(not(loom))]
pub mod events;
#[cfg(not(loom))]
pub mod group;
#[cfg(all(feature = "index", not(loom)))]
pub mod index;
#[cfg(not(loom))]
pub mod op;
#[cfg(not(loom))]
pub mod order;
pub mod readers;
#[cfg(not(loom))]
pub mod shared;
pub mod store;
#[cfg(not(loom))]
pub mod wire;

// The command-line tools and what only they need (clap, serde_json,
// plotters): a scheduler linking the library builds without them.
#[cfg(feature = "cli")]
pub mod bench;
#[cfg(feature = "cli")]
pub mod chart;
#[cfg(feature = "cli")]
pub mod exec;
#[cfg(feature = "cli")]
pub mod replay;
#[cfg(feature = "cli")]
pub mod signal;
#[cfg(feature = "cli")]
pub mod stat;

#[cfg(not(loom))]
pub use binding::PoolIdentity;
#[cfg(not(loom))]
pub use client::{Client, ClientError};
#[cfg(not(loom))]
pub use order::Policy;
