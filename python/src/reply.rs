//! What the daemon's (or the engine's) answers become in Python: the
//! result classes `MatchResult`, `InsertResult`, `EvictResult`, and the
//! conversions shared by `Client` and `Engine` from a `Reply` to them, to
//! dicts and to plain values (an answer of another shape is a
//! `RuntimeError`).
//!
//! Apart because it is the Python face of the answers: it changes when an
//! answer gains a field, whichever class asked.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use radixd::engine::Components;
use radixd::op::{Rejection, Reply};

use crate::errors::rejected;
use crate::input;

/// A handle as Python prints it.
fn py_handle(handle: Option<u64>) -> String {
    handle.map_or_else(|| "None".to_owned(), |h| h.to_string())
}

/// What `match_prefix` found.
#[pyclass(frozen, get_all, module = "radixd")]
pub struct MatchResult {
    /// Tokens of the longest cached (page-aligned) prefix every component
    /// serves.
    len: u64,
    /// Its pages, `array.array('I')`.
    pages: Py<PyAny>,
    /// The node covering exactly those tokens (locked when asked), or
    /// `None` when nothing matched.
    handle: Option<u64>,
    /// Tokens FULL alone matched (SGLang's `full_kv_hit_length`): `len`
    /// unless a secondary component cut the match back.
    full_kv_hit_length: u64,
    /// The MAMBA state slot at the node the match ends at (`None`: MAMBA
    /// off, or no state there).
    mamba_state: Option<u32>,
}

#[pymethods]
impl MatchResult {
    fn __repr__(&self, py: Python<'_>) -> String {
        let pages = self.pages.bind(py).len().unwrap_or(0);
        format!(
            "MatchResult(len={}, pages=<{pages} pages>, handle={})",
            self.len,
            py_handle(self.handle)
        )
    }
}

/// What `insert` or `session_commit` did.
#[pyclass(frozen, get_all, module = "radixd")]
pub struct InsertResult {
    /// Tokens of the key that were cached before.
    cached: u64,
    /// Tokens cached for the key now (its page-aligned length).
    len: u64,
    /// The locked node covering the key (only with `lock=True`).
    handle: Option<u64>,
    /// The node covering the key, named without a lock (a plain insert
    /// without `lock`; `None` with it, for a key of no whole page, and for
    /// `session_commit`).
    node: Option<u64>,
    /// The key's node held a state already, so the `mamba_state` given
    /// stays the caller's, to free or reuse (SGLang's `mamba_exist`;
    /// `False` without one).
    mamba_exist: bool,
}

/// What an eviction per component freed.
#[pyclass(frozen, get_all, module = "radixd")]
pub struct EvictResult {
    /// FULL tokens.
    pub(crate) evicted: u64,
    /// SWA tokens.
    swa_evicted: u64,
    /// MAMBA states.
    mamba_evicted: u64,
}

#[pymethods]
impl EvictResult {
    /// SGLang's `EvictResult.num_tokens_evicted` (`evicted`).
    #[getter]
    fn num_tokens_evicted(&self) -> u64 {
        self.evicted
    }

    /// SGLang's `EvictResult.swa_num_tokens_evicted` (`swa_evicted`).
    #[getter]
    fn swa_num_tokens_evicted(&self) -> u64 {
        self.swa_evicted
    }

    /// SGLang's `EvictResult.mamba_num_evicted` (`mamba_evicted`).
    #[getter]
    fn mamba_num_evicted(&self) -> u64 {
        self.mamba_evicted
    }

    fn __repr__(&self) -> String {
        format!(
            "EvictResult(evicted={}, swa_evicted={}, mamba_evicted={})",
            self.evicted, self.swa_evicted, self.mamba_evicted
        )
    }

    /// `(evicted, swa_evicted, mamba_evicted)`.
    fn __iter__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = (self.evicted, self.swa_evicted, self.mamba_evicted).into_pyobject(py)?;
        Ok(t.try_iter()?.into_any().unbind())
    }
}

#[pymethods]
impl InsertResult {
    /// SGLang's `InsertResult.prefix_len` (`cached`).
    #[getter]
    fn prefix_len(&self) -> u64 {
        self.cached
    }

    fn __repr__(&self) -> String {
        format!(
            "InsertResult(cached={}, len={}, handle={})",
            self.cached,
            self.len,
            py_handle(self.handle)
        )
    }
}

// The conversions shared by `Client` and `Engine`.

pub fn unexpected(reply: Reply) -> PyErr {
    PyRuntimeError::new_err(format!("unexpected answer {reply:?}"))
}

pub fn matched(py: Python<'_>, reply: Reply) -> PyResult<MatchResult> {
    match reply {
        Reply::Matched { len, pages, handle } => Ok(MatchResult {
            len,
            pages: input::array_out(py, &pages)?.unbind(),
            handle,
            full_kv_hit_length: len,
            mamba_state: None,
        }),
        Reply::MatchedWith {
            len,
            pages,
            handle,
            full_len,
            mamba_state,
        } => Ok(MatchResult {
            len,
            pages: input::array_out(py, &pages)?.unbind(),
            handle,
            full_kv_hit_length: full_len,
            mamba_state,
        }),
        other => Err(unexpected(other)),
    }
}

pub fn evicted_components(reply: Reply) -> PyResult<EvictResult> {
    match reply {
        Reply::EvictedComponents {
            tokens,
            swa_tokens,
            mamba_states,
        } => Ok(EvictResult {
            evicted: tokens,
            swa_evicted: swa_tokens,
            mamba_evicted: mamba_states,
        }),
        other => Err(unexpected(other)),
    }
}

pub fn state(reply: Reply) -> PyResult<u32> {
    match reply {
        Reply::State { state } => Ok(state),
        other => Err(unexpected(other)),
    }
}

pub fn swa_freed(reply: Reply) -> PyResult<u64> {
    match reply {
        Reply::SwaFreed { n } => Ok(n),
        other => Err(unexpected(other)),
    }
}

pub fn swa_pages(reply: Reply) -> PyResult<Vec<Option<u32>>> {
    match reply {
        Reply::SwaPages(pages) => Ok(pages
            .into_iter()
            .map(|p| (p != u32::MAX).then_some(p))
            .collect()),
        other => Err(unexpected(other)),
    }
}

pub fn inserted(reply: Reply) -> PyResult<InsertResult> {
    match reply {
        Reply::Inserted {
            cached,
            len,
            handle,
            locked,
        } => Ok(InsertResult {
            cached,
            len,
            handle: handle.filter(|_| locked),
            node: handle.filter(|_| !locked),
            mamba_exist: false,
        }),
        Reply::InsertedWith {
            cached,
            len,
            handle,
            locked,
            mamba_exist,
        } => Ok(InsertResult {
            cached,
            len,
            handle: handle.filter(|_| locked),
            node: handle.filter(|_| !locked),
            mamba_exist,
        }),
        other => Err(unexpected(other)),
    }
}

/// `alloc_paired`'s `(pages, swa_pages)`, each `array('I')`.
pub fn pages_paired(
    py: Python<'_>,
    reply: Reply,
) -> PyResult<(Bound<'_, PyAny>, Bound<'_, PyAny>)> {
    match reply {
        Reply::PagesPaired { pages, swa_pages } => Ok((
            input::array_out(py, &pages)?,
            input::array_out(py, &swa_pages)?,
        )),
        other => Err(unexpected(other)),
    }
}

/// `lock_paired`'s `(lock, delta, swa_pages)`, the pages `array('I')`.
pub fn locked_paired(py: Python<'_>, reply: Reply) -> PyResult<(u64, i64, Bound<'_, PyAny>)> {
    match reply {
        Reply::LockedPaired {
            lock,
            delta,
            swa_pages,
        } => Ok((lock, delta, input::array_out(py, &swa_pages)?)),
        other => Err(unexpected(other)),
    }
}

/// `insert_paired`'s `(result, pages, swa_pages)`, the pages `array('I')`.
pub fn inserted_paired(
    py: Python<'_>,
    reply: Reply,
) -> PyResult<(InsertResult, Bound<'_, PyAny>, Bound<'_, PyAny>)> {
    match reply {
        Reply::InsertedPaired {
            cached,
            len,
            handle,
            locked,
            mamba_exist,
            pages,
            swa_pages,
        } => Ok((
            InsertResult {
                cached,
                len,
                handle: handle.filter(|_| locked),
                node: handle.filter(|_| !locked),
                mamba_exist,
            },
            input::array_out(py, &pages)?,
            input::array_out(py, &swa_pages)?,
        )),
        other => Err(unexpected(other)),
    }
}

pub fn states(reply: Reply) -> PyResult<Vec<u32>> {
    match reply {
        Reply::States(states) => Ok(states),
        other => Err(unexpected(other)),
    }
}

pub fn pages(py: Python<'_>, reply: Reply) -> PyResult<Bound<'_, PyAny>> {
    match reply {
        Reply::Pages(pages) => input::array_out(py, &pages),
        other => Err(unexpected(other)),
    }
}

pub fn done(reply: Reply) -> PyResult<()> {
    match reply {
        Reply::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// `lock`'s answer: the handle naming the lock (SWA), else the node's.
pub fn locked(handle: u64, reply: Reply) -> PyResult<u64> {
    match reply {
        Reply::Done => Ok(handle),
        Reply::Locked(lock) => Ok(lock),
        other => Err(unexpected(other)),
    }
}

pub fn evicted(reply: Reply) -> PyResult<u64> {
    match reply {
        Reply::Evicted(n) => Ok(n),
        other => Err(unexpected(other)),
    }
}

/// `evict_leaf`'s answer: the leaf's handle and tokens, or `None`.
pub fn evicted_leaf(reply: Reply) -> PyResult<Option<(u64, u64)>> {
    match reply {
        Reply::EvictedLeaf { handle, tokens } => Ok(handle.map(|h| (h, tokens))),
        other => Err(unexpected(other)),
    }
}

pub fn session(py: Python<'_>, reply: Reply) -> PyResult<Bound<'_, PyDict>> {
    match reply {
        Reply::Session {
            resident_tokens,
            idle_ms,
        } => {
            let d = PyDict::new(py);
            d.set_item("resident_tokens", resident_tokens)?;
            d.set_item("idle_ms", idle_ms)?;
            Ok(d)
        }
        other => Err(unexpected(other)),
    }
}

/// Exactly the keys of `radixd exec`'s `stats` answer (those of the
/// components on included).
pub fn stats<'py>(py: Python<'py>, reply: Reply, c: &Components) -> PyResult<Bound<'py, PyDict>> {
    match reply {
        Reply::StatsWith {
            stats,
            sessions,
            components,
        } => {
            let d = stats_dict(py, &stats, sessions)?;
            if let Some(f) = components {
                if c.swa.is_some() {
                    d.set_item("swa_evictable_tokens", f.swa_evictable_tokens)?;
                    d.set_item("swa_protected_tokens", f.swa_protected_tokens)?;
                    d.set_item("swa_free_pages", f.swa_free_pages)?;
                    d.set_item("evict_scanned_swa", f.evict_scanned_swa)?;
                }
                if c.mamba.is_some() {
                    d.set_item("mamba_evictable_states", f.mamba_evictable_states)?;
                    d.set_item("mamba_protected_states", f.mamba_protected_states)?;
                    d.set_item("mamba_free_states", f.mamba_free_states)?;
                    d.set_item("evict_scanned_mamba", f.evict_scanned_mamba)?;
                }
                d.set_item("components", c.names())?;
            }
            Ok(d)
        }
        Reply::Stats { stats, sessions } => stats_dict(py, &stats, sessions),
        other => Err(unexpected(other)),
    }
}

fn stats_dict<'py>(
    py: Python<'py>,
    s: &radixd::engine::Stats,
    sessions: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("total_tokens", s.total_tokens)?;
    d.set_item("evictable_tokens", s.evictable_tokens)?;
    d.set_item("protected_tokens", s.protected_tokens)?;
    d.set_item("free_pages", s.free_pages)?;
    d.set_item("nodes", s.nodes)?;
    d.set_item("evict_scanned", s.evict_scanned)?;
    d.set_item("sessions", sessions)?;
    Ok(d)
}

/// Protected tokens before minus after a lock or unlock bracketed by
/// two `stats` requests (SGLang's `inc_lock_ref`/`dec_lock_ref` delta),
/// and the handle a lock answered with SWA (naming that lock).
pub fn lock_delta(
    py: Python<'_>,
    answers: Vec<Result<Reply, Rejection>>,
) -> PyResult<(i64, Option<u64>)> {
    let protected = |r: &Result<Reply, Rejection>| match r {
        Ok(Reply::Stats { stats, .. }) => Ok(stats.protected_tokens as i64),
        Ok(other) => Err(unexpected(other.clone())),
        Err(r) => Err(rejected(py, r.clone())),
    };
    match answers.as_slice() {
        [before, lock, after] => {
            let named = match lock {
                Err(r) => return Err(rejected(py, r.clone())),
                Ok(Reply::Locked(h)) => Some(*h),
                Ok(_) => None,
            };
            Ok((protected(before)? - protected(after)?, named))
        }
        _ => Err(PyRuntimeError::new_err("expected three answers")),
    }
}

/// `(len, pages)` of a `Walk`'s answer.
pub(crate) fn walked(py: Python<'_>, reply: Reply) -> PyResult<(usize, Bound<'_, PyAny>)> {
    match reply {
        Reply::Matched { len, pages, .. } => Ok((len as usize, input::array_out(py, &pages)?)),
        other => Err(unexpected(other)),
    }
}

/// An insert-shaped call (`insert`, `session_commit`): reads `tokens` and
/// `pages`, then `run`s the request built of them.
pub(crate) fn insert_like(
    tokens: &Bound<'_, PyAny>,
    pages: &Bound<'_, PyAny>,
    run: impl FnOnce(Vec<u32>, Vec<u32>) -> PyResult<Reply>,
) -> PyResult<InsertResult> {
    let tokens = input::u32s(tokens, "tokens")?;
    let pages = input::u32s(pages, "pages")?;
    inserted(run(tokens, pages)?)
}
