//! radixd: a prefix (KV) cache server for LLM serving.
//!
//! - [`engine`]: the cache itself (radix tree, page pool, locks, sessions,
//!   LRU eviction) over one contiguous region of plain data; knows nothing of
//!   IPC.
//! - [`op`]: the requests a client makes, their answers and errors.
//! - [`exec`]: the JSON-lines front end (`radixd exec`).
//! - [`wire`]: how requests and answers travel over shared memory.
//! - [`replay`]: trace replay under LRU, LFU, S3-FIFO and the engine.

pub mod engine;
pub mod exec;
pub mod op;
pub mod replay;
pub mod wire;
