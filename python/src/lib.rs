//! `radixd._native`: the Rust half of the `radixd` Python package.
//!
//! - `Client`: a scheduler's connection to a running daemon (the lean
//!   `radixd::Client`), every operation of `radixd exec` plus the lock-free
//!   `peek` and the cache-aware `order`. The GIL is released while a call
//!   waits for the daemon; a mutex inside the object serialises threads.
//! - `Engine`: the same operations on an in-process engine.
//! - `MatchResult`, `InsertResult`: what `match_prefix`, `insert` and
//!   `session_commit` answer (with the hybrid fields: `full_kv_hit_length`,
//!   `mamba_state`, `mamba_exist`); `EvictResult`: what `evict` of SWA
//!   tokens or MAMBA states (and `evict_components`) answers.
//! - `KvIndex`: the cluster router's KV index (`radixd::index`), fed KV
//!   event payloads, answering per-worker overlap scores.
//!
//! Errors: a rejected request raises the `radixd.RadixdError` subclass of
//! its `exec` kind (the factory is registered by `radixd/__init__.py`);
//! arguments Python cannot express as the request (a value beyond `u32`, a
//! negative count) raise `ValueError` or `TypeError` before anything is sent.
//!
//! The modules: `client` and `engine` (the two cache classes), `cache`
//! (the operations they share), `reply` (the result classes and the
//! answers' conversions), `args` (arguments as requests take them),
//! `errors` (the exception mapping), `index` (`KvIndex`), `store` (what
//! the store methods of `Client`, in `client::store`, take from Python) and `input` (tokens and buffers read in place).

mod args;
mod cache;
mod client;
mod engine;
mod errors;
mod index;
mod input;
mod reply;
mod store;

use pyo3::prelude::*;

use client::Client;
use engine::Engine;
use errors::{_error_kinds, _set_error_factory};
use reply::{EvictResult, InsertResult, MatchResult};

/// Reads `tokens` as the methods do and returns how many there were (for
/// benchmarks of the input path alone).
#[pyfunction]
fn _read_tokens(tokens: &Bound<'_, PyAny>) -> PyResult<usize> {
    input::u32s(tokens, "tokens").map(|t| t.len())
}

/// Reads buffers in place (`True`, CPython >= 3.11) or through `memoryview`
/// (`False`, the path of 3.9 and 3.10); returns the path now in use.
#[pyfunction]
fn _use_raw_buffers(py: Python<'_>, on: bool) -> bool {
    input::use_raw_buffers(py, on)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    input::init(m.py())?;
    m.add_class::<Client>()?;
    m.add_class::<Engine>()?;
    m.add_class::<MatchResult>()?;
    m.add_class::<InsertResult>()?;
    m.add_class::<EvictResult>()?;
    m.add_class::<index::KvIndex>()?;
    m.add_function(wrap_pyfunction!(_set_error_factory, m)?)?;
    m.add_function(wrap_pyfunction!(_error_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(_read_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(_use_raw_buffers, m)?)?;
    // What a paired call's `swa_pages` hold for a page without an SWA peer.
    m.add("NO_PAGE", u32::MAX)?;
    Ok(())
}
