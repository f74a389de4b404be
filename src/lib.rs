//! radixd: a prefix (KV) cache server for LLM serving.
//!
//! - [`engine`]: the cache itself (radix tree, page pool, locks, sessions,
//!   LRU eviction) over one contiguous region of plain data; knows nothing of
//!   IPC.
//! - [`op`]: the requests a client makes, their answers and errors.
//! - [`exec`]: the JSON-lines front end (`radixd exec`).
//! - [`wire`]: how requests and answers travel over shared memory.
//! - [`segment`]: what the daemon keeps in shared memory.
//! - [`daemon`]: `radixd serve`, the engine behind the rings.
//! - [`client`]: [`Client`], a scheduler's connection to the daemon.
//! - [`replay`]: trace replay under LRU, LFU, S3-FIFO and the engine.
//! - [`bench`]: latency under contention, shared memory against a Unix
//!   socket.
//! - [`chart`]: the SVG line charts of `replay --plot` and `bench --plot`.

pub mod bench;
pub mod chart;
pub mod client;
pub mod daemon;
pub mod engine;
pub mod exec;
pub mod op;
pub mod replay;
pub mod segment;
pub mod signal;
pub mod stat;
pub mod wire;

pub use client::{Client, ClientError};
