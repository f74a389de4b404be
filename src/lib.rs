//! radixd: a prefix (KV) cache server for LLM serving.
//!
//! The [`engine`] is the cache itself (radix tree, page pool, locks, LRU
//! eviction) over one contiguous region of plain data; it knows nothing of
//! IPC.

pub mod engine;
pub mod replay;
