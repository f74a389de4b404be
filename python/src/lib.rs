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

mod index;
mod input;
mod store;

use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyInt, PyMapping};

use radixd::binding::{IdentityError, PoolIdentity};
use radixd::engine::{Components, Config, Engine as RustEngine, HeapRegion, Recency};
use radixd::op::{apply, Backend, ErrorKind, Local, Rejection, Reply, Request};
use radixd::order::{order_matched, Policy};
use radixd::{Client as RustClient, ClientError};

/// `radixd._errors.make_error(kind, message)`, registered at import.
static MAKE_ERROR: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// How long `timeout=None` waits for an answer: in effect forever (a dead
/// daemon is still noticed within milliseconds).
const NO_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The Python exception for a rejection.
fn rejected(py: Python<'_>, r: Rejection) -> PyErr {
    match MAKE_ERROR.get(py) {
        Some(make) => match make.bind(py).call1((r.kind.name(), r.message.as_str())) {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        },
        None => PyRuntimeError::new_err(r.to_string()),
    }
}

/// A client-side failure as the `exec` error kind it reads as.
fn client_error(e: ClientError) -> Rejection {
    let kind = match &e {
        ClientError::Rejected(r) => return r.clone(),
        ClientError::DaemonGone | ClientError::Open(_) | ClientError::NotReady => {
            ErrorKind::DaemonGone
        }
        ClientError::Timeout | ClientError::Contended => ErrorKind::Timeout,
        ClientError::TooLarge { .. } => ErrorKind::TooLarge,
        _ => ErrorKind::Protocol,
    };
    Rejection::new(kind, e.to_string())
}

fn closed() -> PyErr {
    PyValueError::new_err("I/O on a closed radixd.Client")
}

fn poisoned() -> PyErr {
    PyRuntimeError::new_err("an earlier call panicked while using this object")
}

fn guard<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.lock().map_err(|_| poisoned())
}

/// The batch of `_lock_delta`: `stats`, then lock (`lock=True`) or unlock
/// `handle`, then `stats`.
fn lock_delta_batch(handle: &Bound<'_, PyAny>, lock: bool) -> PyResult<[Request; 3]> {
    let handle = count(handle, "handle")?;
    let middle = if lock {
        Request::Lock { handle }
    } else {
        Request::Unlock { handle }
    };
    Ok([Request::Stats, middle, Request::Stats])
}

/// A non-negative integer argument.
fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    obj.extract::<u64>().map_err(|_| {
        if obj.is_instance_of::<PyInt>() {
            PyValueError::new_err(format!("{what} must be a non-negative integer below 2^64"))
        } else {
            PyTypeError::new_err(format!("{what} must be an int"))
        }
    })
}

/// An optional non-negative integer argument: absent or `None` is 0.
fn opt_count(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<u64> {
    match obj {
        Some(o) if !o.is_none() => count(o, what),
        _ => Ok(0),
    }
}

fn policy(name: &str) -> PyResult<Policy> {
    name.parse()
        .map_err(|e: radixd::order::UnknownPolicy| PyValueError::new_err(e.to_string()))
}

/// Peeks each prompt as soon as it is read, so only one prompt's tokens
/// are held at a time (1,000 prompts of 2K tokens would otherwise be 8 MB
/// of fresh memory), then orders them.
fn order(
    prompts: &Bound<'_, PyAny>,
    policy: Policy,
    mut matched_pages: impl FnMut(&[u32]) -> PyResult<Vec<u32>>,
) -> PyResult<Vec<usize>> {
    let mut matched = Vec::new();
    for (i, p) in prompts.try_iter()?.enumerate() {
        let tokens = input::u32s(&p?, &format!("prompts[{i}]"))?;
        matched.push(matched_pages(&tokens)?);
    }
    Ok(order_matched(&matched, policy))
}

/// A pool identity from Python: a `key=value;...` string, or a mapping
/// whose values are written with `str()`; a bad one raises
/// `radixd.MalformedError`, as the daemon would answer it.
fn pool_identity(obj: &Bound<'_, PyAny>) -> PyResult<PoolIdentity> {
    let py = obj.py();
    let checked = |r: Result<PoolIdentity, IdentityError>| r.map_err(|e| rejected(py, e.into()));
    if let Ok(text) = obj.extract::<String>() {
        return checked(PoolIdentity::parse(&text));
    }
    let Ok(mapping) = obj.downcast::<PyMapping>() else {
        return Err(PyTypeError::new_err(
            "pool must be a 'key=value;...' string or a mapping of keys to values",
        ));
    };
    let mut pairs = Vec::new();
    for item in mapping.items()?.iter() {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        let key = k
            .extract::<String>()
            .map_err(|_| PyTypeError::new_err("pool keys must be str"))?;
        pairs.push((key, v.str()?.to_string()));
    }
    checked(PoolIdentity::new(pairs))
}

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
    /// The key's node held a state already, so the `mamba_state` given
    /// stays the caller's, to free or reuse (SGLang's `mamba_exist`;
    /// `False` without one).
    mamba_exist: bool,
}

/// What an eviction per component freed.
#[pyclass(frozen, get_all, module = "radixd")]
pub struct EvictResult {
    /// FULL tokens.
    evicted: u64,
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

/// An optional state slot argument: a slot is below 2^32.
fn state_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u32>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let slot = count(obj, "mamba_state")?;
    u32::try_from(slot)
        .map(Some)
        .map_err(|_| PyValueError::new_err("mamba_state must be below 2^32"))
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

/// The conversions shared by `Client` and `Engine`.
mod reply {
    use super::*;

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
                mamba_exist,
            }),
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
    pub fn stats<'py>(
        py: Python<'py>,
        reply: Reply,
        c: &Components,
    ) -> PyResult<Bound<'py, PyDict>> {
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
}

/// `request` in namespace `ns` (`None`: the default one, the request as
/// it is).
/// `(len, pages)` of a `Walk`'s answer.
fn walked(py: Python<'_>, reply: Reply) -> PyResult<(usize, Bound<'_, PyAny>)> {
    match reply {
        Reply::Matched { len, pages, .. } => Ok((len as usize, input::array_out(py, &pages)?)),
        other => Err(reply::unexpected(other)),
    }
}

fn in_namespace(ns: Option<String>, request: Request) -> Request {
    match ns {
        Some(ns) => Request::Namespaced {
            ns,
            request: Box::new(request),
        },
        None => request,
    }
}

/// An insert-shaped call (`insert`, `session_commit`): reads `tokens` and
/// `pages`, then `run`s the request built of them.
fn insert_like(
    tokens: &Bound<'_, PyAny>,
    pages: &Bound<'_, PyAny>,
    run: impl FnOnce(Vec<u32>, Vec<u32>) -> PyResult<Reply>,
) -> PyResult<InsertResult> {
    let tokens = input::u32s(tokens, "tokens")?;
    let pages = input::u32s(pages, "pages")?;
    reply::inserted(run(tokens, pages)?)
}

/// Defines the `#[pymethods]` of a class with a `run(&self, py, Request)`:
/// its own methods, then the operations every cache answers the same way.
macro_rules! cache_methods {
    ($(#[$attr:meta])* impl $ty:ident { $($own:tt)* }) => {
        $(#[$attr])*
        impl $ty {
            $($own)*

            /// The longest cached prefix of `tokens`: `.len`, `.pages`, `.handle`
            /// (locked when `lock`; `None` when nothing matched), and
            /// `.full_kv_hit_length` (tokens FULL alone matched) and
            /// `.mamba_state` (the state slot the match ends at) when a
            /// secondary component is on. `ns`: the namespace (a LoRA
            /// adapter's, a tenant's; `None`, the default one), whose
            /// prefixes no other namespace matches.
            #[pyo3(signature = (tokens, lock = false, ns = None))]
            fn match_prefix(
                &self,
                py: Python<'_>,
                tokens: &Bound<'_, PyAny>,
                lock: bool,
                ns: Option<String>,
            ) -> PyResult<MatchResult> {
                let tokens = input::u32s(tokens, "tokens")?;
                let request = if self.components()?.is_full_only() {
                    Request::Match { tokens, lock }
                } else {
                    Request::MatchWith { tokens, lock }
                };
                reply::matched(py, self.run(py, in_namespace(ns, request))?)
            }

            /// Caches `tokens` with `pages` (one owned page per whole page of
            /// tokens): `.cached`, `.len`, `.handle` (only with `lock`),
            /// `.mamba_exist`. `mamba_state`: a state slot from
            /// `alloc_state` to checkpoint at the key's end (the tree takes
            /// it); `swa_evicted`: leading tokens whose SWA pages
            /// `free_swa` freed (page-aligned). `ns`: the namespace, as
            /// `match_prefix`'s.
            #[pyo3(signature = (tokens, pages, lock = false, mamba_state = None, swa_evicted = None, ns = None))]
            #[allow(clippy::too_many_arguments)]
            fn insert(
                &self,
                py: Python<'_>,
                tokens: &Bound<'_, PyAny>,
                pages: &Bound<'_, PyAny>,
                lock: bool,
                mamba_state: Option<&Bound<'_, PyAny>>,
                swa_evicted: Option<&Bound<'_, PyAny>>,
                ns: Option<String>,
            ) -> PyResult<InsertResult> {
                let mamba_state = state_arg(mamba_state)?;
                let swa_evicted = opt_count(swa_evicted, "swa_evicted")?;
                // Without extras an insert is the plain one on any engine
                // (and a client's may go by anchor).
                let plain = mamba_state.is_none() && swa_evicted == 0;
                insert_like(tokens, pages, |tokens, pages| {
                    let request = if plain {
                        Request::Insert { tokens, pages, lock }
                    } else {
                        Request::InsertWith {
                            tokens,
                            pages,
                            lock,
                            mamba_state,
                            swa_evicted,
                        }
                    };
                    self.run(py, in_namespace(ns, request))
                })
            }

            /// Takes a MAMBA state slot (evicting a cached state when none
            /// is free); `ComponentOffError` without MAMBA.
            fn alloc_state(&self, py: Python<'_>) -> PyResult<u32> {
                reply::state(self.run(py, Request::AllocState)?)
            }

            /// Returns a state slot this client holds to the pool.
            fn free_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
                let state = count(state, "state")?;
                reply::done(self.run(py, Request::FreeState { state })?)
            }

            /// Frees the SWA pages paired with these owned pages (tokens
            /// that slid out of the window); returns how many went.
            fn free_swa(&self, py: Python<'_>, pages: &Bound<'_, PyAny>) -> PyResult<u64> {
                let pages = input::u32s(pages, "pages")?;
                reply::swa_freed(self.run(py, Request::FreeSwa { pages })?)
            }

            /// The SWA page paired with each of these pages (where its
            /// sliding-window KV lives; SGLang's
            /// `translate_loc_from_full_to_swa`), `None` where one has none.
            fn swa_pages(&self, py: Python<'_>, pages: &Bound<'_, PyAny>) -> PyResult<Vec<Option<u32>>> {
                let pages = input::u32s(pages, "pages")?;
                reply::swa_pages(self.run(py, Request::SwaPages { pages })?)
            }

            /// Evicts per component: `tokens` FULL tokens, then SWA tokens
            /// and MAMBA states until that many went: `.evicted`,
            /// `.swa_evicted`, `.mamba_evicted`.
            #[pyo3(signature = (tokens, swa_tokens = None, mamba_states = None))]
            fn evict_components(
                &self,
                py: Python<'_>,
                tokens: &Bound<'_, PyAny>,
                swa_tokens: Option<&Bound<'_, PyAny>>,
                mamba_states: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<EvictResult> {
                let request = Request::EvictComponents {
                    tokens: count(tokens, "tokens")?,
                    swa_tokens: opt_count(swa_tokens, "swa_tokens")?,
                    mamba_states: opt_count(mamba_states, "mamba_states")?,
                };
                reply::evicted_components(self.run(py, request)?)
            }

            /// `"full"`, `"full,swa"` or `"full,mamba"`.
            #[getter(components)]
            fn components_name(&self) -> PyResult<&'static str> {
                Ok(self.components()?.names())
            }

            /// The SWA window in tokens (`--swa-window`), `None` without SWA.
            #[getter]
            fn swa_window(&self) -> PyResult<Option<u32>> {
                Ok(self.components()?.swa.map(|s| s.window))
            }

            /// Pages in the SWA pool (`--swa-capacity`), `None` without SWA.
            #[getter]
            fn swa_capacity(&self) -> PyResult<Option<u32>> {
                Ok(self.components()?.swa.map(|s| s.capacity))
            }

            /// State slots in the MAMBA pool (`--mamba-capacity`), `None`
            /// without MAMBA.
            #[getter]
            fn mamba_capacity(&self) -> PyResult<Option<u32>> {
                Ok(self.components()?.mamba.map(|m| m.capacity))
            }

            /// Takes `n` pages from the pool (evicting as needed), as
            /// `array.array('I')`.
            fn alloc<'py>(&self, py: Python<'py>, n: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                let n = count(n, "n")?;
                reply::pages(py, self.run(py, Request::Alloc { n })?)
            }

            /// Returns owned pages to the pool.
            fn free(&self, py: Python<'_>, pages: &Bound<'_, PyAny>) -> PyResult<()> {
                let pages = input::u32s(pages, "pages")?;
                reply::done(self.run(py, Request::Free { pages })?)
            }

            /// Locks a node and its ancestors; returns the lock's handle
            /// (with SWA it names this lock, which `unlock` then releases
            /// exactly; else `handle`).
            fn lock(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<u64> {
                let handle = count(handle, "handle")?;
                reply::locked(handle, self.run(py, Request::Lock { handle })?)
            }

            /// Drops one of this client's locks.
            fn unlock(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
                let handle = count(handle, "handle")?;
                reply::done(self.run(py, Request::Unlock { handle })?)
            }

            /// Evicts at least `tokens` tokens (whole pages, unlocked leaves first);
            /// returns the tokens evicted. With `swa_tokens` or
            /// `mamba_states` (components on) it evicts those too and
            /// returns what `evict_components` does.
            #[pyo3(signature = (tokens, swa_tokens = None, mamba_states = None))]
            fn evict(
                &self,
                py: Python<'_>,
                tokens: &Bound<'_, PyAny>,
                swa_tokens: Option<&Bound<'_, PyAny>>,
                mamba_states: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<Py<PyAny>> {
                let tokens = count(tokens, "tokens")?;
                let swa_tokens = opt_count(swa_tokens, "swa_tokens")?;
                let mamba_states = opt_count(mamba_states, "mamba_states")?;
                if swa_tokens == 0 && mamba_states == 0 {
                    let n = if self.components()?.is_full_only() {
                        reply::evicted(self.run(py, Request::Evict { tokens })?)?
                    } else {
                        let r = Request::EvictComponents { tokens, swa_tokens, mamba_states };
                        reply::evicted_components(self.run(py, r)?)?.evicted
                    };
                    return Ok(n.into_pyobject(py)?.into_any().unbind());
                }
                let r = Request::EvictComponents { tokens, swa_tokens, mamba_states };
                let e = reply::evicted_components(self.run(py, r)?)?;
                Ok(Bound::new(py, e)?.into_any().unbind())
            }

            /// Commits a session's conversation so far: `.cached`, `.len`;
            /// in namespace `ns` when given.
            #[pyo3(signature = (session, tokens, pages, ns = None))]
            fn session_commit(
                &self,
                py: Python<'_>,
                session: String,
                tokens: &Bound<'_, PyAny>,
                pages: &Bound<'_, PyAny>,
                ns: Option<String>,
            ) -> PyResult<InsertResult> {
                insert_like(tokens, pages, |tokens, pages| {
                    let request = Request::SessionCommit { session, tokens, pages };
                    self.run(py, in_namespace(ns, request))
                })
            }

            /// Drops a session's lock and forgets it.
            fn session_release(&self, py: Python<'_>, session: String) -> PyResult<()> {
                reply::done(self.run(py, Request::SessionRelease { session })?)
            }

            /// `{"resident_tokens": R, "idle_ms": T}` of a session.
            fn session_status<'py>(
                &self,
                py: Python<'py>,
                session: String,
            ) -> PyResult<Bound<'py, PyDict>> {
                reply::session(py, self.run(py, Request::SessionStatus { session })?)
            }

            /// The figures of `radixd exec`'s `stats` answer, as a dict
            /// (with the components' figures and `"components"` when one
            /// is on).
            fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let c = self.components()?;
                let request = if c.is_full_only() { Request::Stats } else { Request::StatsWith };
                reply::stats(py, self.run(py, request)?, &c)
            }

            /// Checks every invariant of the daemon's engine (raises
            /// `InvariantError` naming the first broken one).
            fn validate(&self, py: Python<'_>) -> PyResult<()> {
                reply::done(self.run(py, Request::Validate)?)
            }

            /// Empties the cache (a daemon may refuse it).
            fn reset(&self, py: Python<'_>) -> PyResult<()> {
                reply::done(self.run(py, Request::Reset)?)
            }
        }
    };
}

/// A connection to a running radixd daemon.
///
/// `Client(name="radixd", timeout=None, pool=None)`: `name` is the
/// segment's name (`radixd serve --name`), `timeout` the longest wait for
/// one answer in seconds (`None`: no limit; a dead daemon is noticed
/// regardless), `pool` the KV buffer this client's pages index (a
/// `key=value;...` string or a mapping, see `radixd::binding`): the first
/// client that names one binds the daemon's pool (starting from an empty
/// tree), a client of another is refused with `radixd.PoolMismatchError`
/// (naming every key that differs); a client that names none may read and
/// lock a bound pool, not fill it (`alloc`, `insert`: `NotPermittedError`);
/// `group` a `(key, rank, size)` to join at once (see `join`).
#[pyclass(module = "radixd")]
pub struct Client {
    inner: Mutex<Option<RustClient>>,
    name: String,
    page_size: u32,
    capacity: u32,
    /// The daemon's components (fixed for its lifetime).
    components: Components,
    /// The daemon's recency rule (fixed for its lifetime).
    recency: Recency,
    /// The KV buffer this client bound the pool to, canonical.
    pool: Option<String>,
    /// The store namespaces this client registered (`store_namespace`).
    store: store::Namespaces,
    /// The store mapped for reads that never wait for the connection
    /// (`store_probe`); `None` without a store.
    probe: Option<store::Probe>,
}

impl Client {
    /// Runs `f` on the connection, the GIL released (while waiting for the
    /// connection too).
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RustClient) -> R + Send,
    ) -> PyResult<R> {
        py.allow_threads(|| guard(&self.inner)?.as_mut().map(f).ok_or_else(closed))
    }

    /// The connection, for work done holding the GIL (lock-free reads);
    /// the GIL is released only while another thread holds the connection.
    fn hold(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, Option<RustClient>>> {
        loop {
            match self.inner.try_lock() {
                Ok(g) => return Ok(g),
                Err(TryLockError::Poisoned(_)) => return Err(poisoned()),
                Err(TryLockError::WouldBlock) => py.allow_threads(std::thread::yield_now),
            }
        }
    }

    /// One request, the GIL released while the daemon works.
    fn run(&self, py: Python<'_>, request: Request) -> PyResult<Reply> {
        self.with(py, |c| Backend::call(c, request))?
            .map_err(|r| rejected(py, r))
    }

    /// The daemon's components.
    fn components(&self) -> PyResult<Components> {
        Ok(self.components)
    }
}

// One `#[pymethods]` block per class (without pyo3's `multiple-pymethods`),
// so the methods `Client` and `Engine` share over their own `run` are
// spliced into each by `cache_methods!`.
cache_methods! {
    #[pymethods]
    impl Client {
        #[new]
        #[pyo3(signature = (name = "radixd", timeout = None, pool = None, group = None))]
        fn new(
            py: Python<'_>,
            name: &str,
            timeout: Option<f64>,
            pool: Option<&Bound<'_, PyAny>>,
            group: Option<(String, u32, u32)>,
        ) -> PyResult<Self> {
            let pool = pool.filter(|p| !p.is_none()).map(pool_identity).transpose()?;
            let timeout = match timeout {
                None => NO_TIMEOUT,
                Some(t) => Duration::try_from_secs_f64(t)
                    .map_err(|e| PyValueError::new_err(format!("timeout {t}: {e}")))?,
            };
            let owned = name.to_owned();
            let mut client = py
                .allow_threads(|| match &pool {
                    Some(pool) => RustClient::connect_bound(&owned, pool),
                    None => RustClient::connect(&owned),
                })
                .map_err(|e| rejected(py, client_error(e)))?;
            client.timeout = timeout;
            if let Some((key, rank, size)) = &group {
                py.allow_threads(|| client.join(key, *rank, *size))
                    .map_err(|e| rejected(py, client_error(e)))?;
            }
            let probe = if client.has_store() {
                let data_bytes = client
                    .store_stats()
                    .map_err(|e| rejected(py, client_error(e)))?
                    .capacity_bytes;
                let slot = client.slot();
                Some(
                    py.allow_threads(|| store::Probe::open(&owned, data_bytes, slot))
                        .map_err(|r| rejected(py, r))?,
                )
            } else {
                None
            };
            Ok(Self {
                probe,
                page_size: client.page_size(),
                capacity: client.capacity(),
                components: client.components(),
                recency: client.recency(),
                inner: Mutex::new(Some(client)),
                name: name.to_owned(),
                pool: pool.map(|p| p.as_str().to_owned()),
                store: store::Namespaces::default(),
            })
        }

        /// The KV buffer this client bound the daemon's pool to (canonical
        /// `key=value;...`), or `None`.
        #[getter]
        fn pool(&self) -> Option<&str> {
            self.pool.as_deref()
        }

        /// Makes this connection rank `rank` of the `size` ranks of group
        /// `group`: the ranks of one tensor-parallel server share one tree,
        /// each cache call a step carried out once for the group and
        /// answered alike to every rank (a rank whose call differs gets
        /// `radixd.DesyncError`). Call it before any cache call; the group's
        /// pages, locks and sessions go when its last rank does. Returns
        /// the ranks joined so far. Raises `GroupMismatchError` (size or
        /// page size disagree, or this connection made cache calls
        /// already) or `GroupClosedError` (a finished group, a rank taken
        /// or gone); nothing changes then.
        fn join(&self, py: Python<'_>, group: &str, rank: u32, size: u32) -> PyResult<u32> {
            let group = group.to_owned();
            self.with(py, move |c| c.join(&group, rank, size))?
                .map_err(|e| rejected(py, client_error(e)))
        }

        /// `(group, rank, size)` of the group this connection is a rank of,
        /// or `None`.
        #[getter]
        fn rank(&self, py: Python<'_>) -> PyResult<Option<(String, u32, u32)>> {
            let held = self.hold(py)?;
            let c = held.as_ref().ok_or_else(closed)?;
            Ok(c.rank().map(|r| (r.group.clone(), r.rank, r.size)))
        }

        /// What the daemon's pool is bound to, `(identity, holders)`, or
        /// `None`; read from the segment, no round trip.
        fn pool_binding(&self, py: Python<'_>) -> PyResult<Option<(String, u64)>> {
            let binding = self
                .hold(py)?
                .as_ref()
                .ok_or_else(closed)?
                .pool_binding()
                .map_err(|e| rejected(py, client_error(e)))?;
            Ok(binding.map(|b| (b.identity.as_str().to_owned(), b.holders)))
        }

        /// The segment's name.
        #[getter]
        fn name(&self) -> &str {
            &self.name
        }

        /// Tokens per page of the daemon's engine.
        #[getter]
        fn page_size(&self) -> u32 {
            self.page_size
        }

        /// Pages in the daemon's pool.
        #[getter]
        fn capacity(&self) -> u32 {
            self.capacity
        }

        /// What a split counts as a use of in the daemon's engine
        /// (`radixd serve --recency`): `"exact"` or `"sglang"`.
        #[getter]
        fn recency(&self) -> &'static str {
            self.recency.name()
        }

        /// Whether `close()` was called.
        #[getter]
        fn closed(&self) -> PyResult<bool> {
            Ok(guard(&self.inner)?.is_none())
        }

        /// `(len, pages)` of the longest cached prefix, read straight from the
        /// shared tree: no round trip, no lock, no LRU touch; in namespace
        /// `ns` when given (its id asked of the daemon once).
        #[pyo3(signature = (tokens, ns = None))]
        fn peek<'py>(
            &self,
            py: Python<'py>,
            tokens: &Bound<'py, PyAny>,
            ns: Option<String>,
        ) -> PyResult<(usize, Bound<'py, PyAny>)> {
            let tokens = input::u32s(tokens, "tokens")?;
            let (len, pages) = match ns {
                None => self.hold(py)?.as_ref().ok_or_else(closed)?.peek(&tokens),
                Some(ns) => self.with(py, |c| c.peek_in(&ns, &tokens))?,
            }
            .map_err(|e| rejected(py, client_error(e)))?;
            Ok((len, input::array_out(py, &pages)?))
        }

        /// `(len, pages)` of the longest prefix of `tokens` FULL caches (the
        /// tree's own walk, before SWA or MAMBA cut it back), read straight
        /// from the shared tree: no round trip, no lock, no LRU touch. The
        /// pages a just-inserted (and locked) key lives on. In namespace
        /// `ns`, and for a rank of a group (`join`), it asks the daemon
        /// instead (a rank's, as a step: the shared tree may be ahead of
        /// its steps, where a faster rank left it).
        #[pyo3(signature = (tokens, ns = None))]
        fn peek_full<'py>(
            &self,
            py: Python<'py>,
            tokens: &Bound<'py, PyAny>,
            ns: Option<String>,
        ) -> PyResult<(usize, Bound<'py, PyAny>)> {
            let tokens = input::u32s(tokens, "tokens")?;
            let ranked = self.hold(py)?.as_ref().ok_or_else(closed)?.rank().is_some();
            if ranked || ns.is_some() {
                return walked(py, self.run(py, in_namespace(ns, Request::Walk { tokens }))?);
            }
            let (peeked, pages) = self
                .hold(py)?
                .as_ref()
                .ok_or_else(closed)?
                .peek_anchored(&tokens)
                .map_err(|e| rejected(py, client_error(e)))?;
            Ok((peeked.len, input::array_out(py, &pages)?))
        }

        /// Indices into `prompts` in the order to run them under `policy`
        /// (`"lpm"` or `"dfs-weight"`), from lock-free peeks.
        #[pyo3(signature = (prompts, policy = "lpm"))]
        fn order(
            &self,
            py: Python<'_>,
            prompts: &Bound<'_, PyAny>,
            policy: &str,
        ) -> PyResult<Vec<usize>> {
            let policy = self::policy(policy)?;
            let held = self.hold(py)?;
            let client = held.as_ref().ok_or_else(closed)?;
            self::order(prompts, policy, |tokens| {
                client
                    .matched_pages(tokens)
                    .map_err(|e| rejected(py, client_error(e)))
            })
        }

        /// Locks (`lock=True`) or unlocks `handle` between two `stats`, in one
        /// round trip; returns protected tokens before minus after (SGLang's
        /// `inc_lock_ref`/`dec_lock_ref` answer).
        fn _lock_delta(&self, py: Python<'_>, handle: &Bound<'_, PyAny>, lock: bool) -> PyResult<i64> {
            let requests = lock_delta_batch(handle, lock)?;
            let answers = self
                .with(py, |c| c.batch(&requests))?
                .map_err(|e| rejected(py, client_error(e)))?;
            Ok(reply::lock_delta(py, answers)?.0)
        }

        /// Locks `handle` as `_lock_delta(handle, True)` does; returns
        /// `(lock, delta)`: the lock's handle (with SWA it names this lock,
        /// which `unlock` then releases exactly; else `handle`) and
        /// `_lock_delta`'s answer.
        fn _lock_receipt(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<(u64, i64)> {
            let requests = lock_delta_batch(handle, true)?;
            let answers = self
                .with(py, |c| c.batch(&requests))?
                .map_err(|e| rejected(py, client_error(e)))?;
            let (delta, named) = reply::lock_delta(py, answers)?;
            Ok((named.unwrap_or(count(handle, "handle")?), delta))
        }

        /// Whether the daemon runs with a store (`radixd serve --store`).
        #[getter]
        fn has_store(&self) -> PyResult<bool> {
            self.store_has()
        }

        /// The id of store namespace `name`, whose values are `value_size`
        /// bytes (fixed by its first registration: another size raises
        /// `SizeMismatchError`).
        fn store_namespace(&self, py: Python<'_>, name: &str, value_size: u64) -> PyResult<u32> {
            self.store_register(py, name, value_size)
        }

        /// The length of the leading run of `keys` (str or bytes) stored in
        /// namespace `ns`: a lock-free read, no round trip.
        fn store_exists(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            keys: &Bound<'_, PyAny>,
        ) -> PyResult<usize> {
            self.store_run(py, ns, keys)
        }

        /// `store_exists` that never waits for another thread's call on this
        /// client (a copy holding the connection): the leading run of `keys`
        /// stored in `ns`, read lock-free from a mapping of the store's
        /// index, without the reader announcement (an existence test needs
        /// none; a key changing meanwhile reads as a miss).
        fn store_probe(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            keys: &Bound<'_, PyAny>,
        ) -> PyResult<usize> {
            self.store_probe_run(py, ns, keys)
        }

        /// The id of store namespace `name` if any client registered it, or
        /// `None`; lock-free, never waits for the connection.
        fn store_find_namespace(&self, py: Python<'_>, name: &str) -> PyResult<Option<u32>> {
            self.store_find(py, name)
        }

        /// The largest value the store holds (bytes): one extent of its
        /// data region (`min(16 MiB, SIZE / 8)` for `--store SIZE`).
        #[getter]
        fn store_value_max(&self, py: Python<'_>) -> PyResult<u64> {
            self.store_value_limit(py)
        }

        /// Copies `key`'s value into `out` (a writable C-contiguous buffer or
        /// CPU tensor of the value size), the GIL released: `False` is a miss.
        fn store_get(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            key: &Bound<'_, PyAny>,
            out: &Bound<'_, PyAny>,
        ) -> PyResult<bool> {
            self.store_get_one(py, ns, key, out)
        }

        /// `store_get` of each key into its buffer, under one announcement.
        fn store_get_many(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            keys: &Bound<'_, PyAny>,
            outs: &Bound<'_, PyAny>,
        ) -> PyResult<Vec<bool>> {
            self.store_get_buffers(py, ns, keys, outs)
        }

        /// `store_get_many` into raw memory: per key a list of
        /// `(address, nbytes)` the caller vouches for, filled in order.
        fn store_get_many_raw(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            keys: &Bound<'_, PyAny>,
            pieces: &Bound<'_, PyAny>,
        ) -> PyResult<Vec<bool>> {
            self.store_get_pieces(py, ns, keys, pieces)
        }

        /// Stores each key's value (a buffer or CPU tensor of the value size)
        /// under its parent (a key or `None`): `True` stored now, `False`
        /// stored already.
        fn store_put_many(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            keys: &Bound<'_, PyAny>,
            parents: &Bound<'_, PyAny>,
            values: &Bound<'_, PyAny>,
        ) -> PyResult<Vec<bool>> {
            self.store_put_buffers(py, ns, keys, parents, values)
        }

        /// `store_put_many` from raw memory: per key a list of
        /// `(address, nbytes)` the caller vouches for, gathered in order.
        fn store_put_many_raw(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            keys: &Bound<'_, PyAny>,
            parents: &Bound<'_, PyAny>,
            pieces: &Bound<'_, PyAny>,
        ) -> PyResult<Vec<bool>> {
            self.store_put_pieces(py, ns, keys, parents, pieces)
        }

        /// Reserves a slot for each key no one stored or reserved yet (a
        /// writer copying itself): per key `(index, generation, offset)` or
        /// `None`. The slots are this client's until `store_commit` or
        /// `store_abort`; the daemon gives them back if it disconnects
        /// first. `StoreFullError` when the store has no room for every
        /// key (nothing reserved then).
        fn store_reserve(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            keys: &Bound<'_, PyAny>,
            parents: &Bound<'_, PyAny>,
        ) -> PyResult<Vec<Option<(u32, u32, u64)>>> {
            self.store_take(py, ns, keys, parents)
        }

        /// Publishes slots from `store_reserve` (whatever their bytes hold);
        /// returns how many. A slot this client did not reserve fails the
        /// whole call (`NotReservedError`), committing nothing.
        fn store_commit(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            slots: Vec<(u32, u32, u64)>,
        ) -> PyResult<usize> {
            self.store_finish(py, ns, slots, true)
        }

        /// Gives back slots from `store_reserve` unpublished; returns how many.
        fn store_abort(
            &self,
            py: Python<'_>,
            ns: &Bound<'_, PyAny>,
            slots: Vec<(u32, u32, u64)>,
        ) -> PyResult<usize> {
            self.store_finish(py, ns, slots, false)
        }

        /// Drops every value of namespace `ns` (and no other's), through the
        /// daemon: a reader mid-copy gets the old bytes or a miss; values
        /// reserved and not yet committed stay their writers'. Returns how
        /// many values were dropped.
        fn store_clear(&self, py: Python<'_>, ns: &Bound<'_, PyAny>) -> PyResult<u64> {
            self.store_drop(py, ns)
        }

        /// The store's figures: `values`, `bytes`, `capacity_bytes`, `hits`,
        /// `misses`, `evicted`, `namespaces`, `failed_reserves`.
        fn store_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            self.store_figures(py)
        }

        /// Disconnects; the daemon releases whatever this client still holds
        /// (locks, sessions, owned pages). Idempotent.
        fn close(&self, py: Python<'_>) -> PyResult<()> {
            let client = py.allow_threads(|| guard(&self.inner).map(|mut g| g.take()))?;
            drop(client);
            Ok(())
        }

        fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
            slf
        }

        /// Closes the client; exceptions propagate.
        fn __exit__(
            &self,
            py: Python<'_>,
            _type: &Bound<'_, PyAny>,
            _value: &Bound<'_, PyAny>,
            _traceback: &Bound<'_, PyAny>,
        ) -> PyResult<bool> {
            self.close(py)?;
            Ok(false)
        }

        fn __repr__(&self) -> String {
            format!(
                "radixd.Client(name={:?}, page_size={}, capacity={})",
                self.name, self.page_size, self.capacity
            )
        }
    }
}

/// An in-process radixd engine: the operations of `Client` (less `peek`)
/// for tests and simulation, with exactly `radixd exec`'s semantics.
#[pyclass(module = "radixd")]
pub struct Engine {
    inner: Mutex<Local<HeapRegion>>,
}

impl Engine {
    /// One request (engine calls are short: the GIL stays held).
    fn run(&self, py: Python<'_>, request: Request) -> PyResult<Reply> {
        let mut local = guard(&self.inner)?;
        local.call(request).map_err(|r| rejected(py, r))
    }

    /// The engine's components.
    fn components(&self) -> PyResult<Components> {
        Ok(guard(&self.inner)?.engine.components())
    }
}

cache_methods! {
    #[pymethods]
    impl Engine {
        /// `Engine(page_size, capacity, components="full", swa_window=None,
        /// swa_capacity=None, mamba_capacity=None, recency="exact")`: the
        /// flags of `radixd exec` (`components` is `"full"`, `"full,swa"`
        /// or `"full,mamba"`; `swa_capacity` defaults to `capacity`;
        /// `recency="sglang"` makes a split a use of both halves, as
        /// SGLang's tree does).
        #[new]
        #[pyo3(signature = (page_size, capacity, components = "full", swa_window = None, swa_capacity = None, mamba_capacity = None, recency = "exact"))]
        #[allow(clippy::too_many_arguments)] // the flags of `radixd exec`, by keyword
        fn new(
            page_size: u32,
            capacity: u32,
            components: &str,
            swa_window: Option<u32>,
            swa_capacity: Option<u32>,
            mamba_capacity: Option<u32>,
            recency: &str,
        ) -> PyResult<Self> {
            let config = Config {
                page_size,
                capacity,
            };
            let bad = |e: &dyn std::fmt::Display| PyValueError::new_err(e.to_string());
            let comps =
                Components::parse(components, swa_window, swa_capacity, mamba_capacity, capacity)
                    .map_err(|e| bad(&e))?;
            let recency: Recency = recency.parse().map_err(|e| bad(&e))?;
            let mut engine = RustEngine::with_components(config, comps).map_err(|e| bad(&e))?;
            engine.set_recency(recency);
            Ok(Self {
                inner: Mutex::new(Local {
                    engine,
                    client: 0,
                    session_ttl: None,
                }),
            })
        }

        /// Tokens per page.
        #[getter]
        fn page_size(&self) -> PyResult<u32> {
            Ok(guard(&self.inner)?.engine.page_size())
        }

        /// Pages in the pool.
        #[getter]
        fn capacity(&self) -> PyResult<u32> {
            Ok(guard(&self.inner)?.engine.capacity())
        }

        /// As `Client.peek_full`: FULL's own walk of `tokens` (in
        /// namespace `ns`), touching nothing.
        #[pyo3(signature = (tokens, ns = None))]
        fn peek_full<'py>(
            &self,
            py: Python<'py>,
            tokens: &Bound<'py, PyAny>,
            ns: Option<String>,
        ) -> PyResult<(usize, Bound<'py, PyAny>)> {
            let tokens = input::u32s(tokens, "tokens")?;
            if ns.is_some() {
                return walked(py, self.run(py, in_namespace(ns, Request::Walk { tokens }))?);
            }
            let mut pages = Vec::new();
            let len = guard(&self.inner)?.engine.peek(&tokens, &mut pages);
            Ok((len, input::array_out(py, &pages)?))
        }

        /// What a split counts as a use of: `"exact"` or `"sglang"`.
        #[getter]
        fn recency(&self) -> PyResult<&'static str> {
            Ok(guard(&self.inner)?.engine.recency().name())
        }

        /// As `Client.order`, from the engine's own tree.
        #[pyo3(signature = (prompts, policy = "lpm"))]
        fn order(&self, prompts: &Bound<'_, PyAny>, policy: &str) -> PyResult<Vec<usize>> {
            let policy = self::policy(policy)?;
            let local = guard(&self.inner)?;
            self::order(prompts, policy, |tokens| {
                let mut pages = Vec::new();
                local.engine.peek(tokens, &mut pages);
                Ok(pages)
            })
        }

        /// As `Client._lock_delta`.
        fn _lock_delta(&self, py: Python<'_>, handle: &Bound<'_, PyAny>, lock: bool) -> PyResult<i64> {
            let requests = lock_delta_batch(handle, lock)?;
            let mut local = guard(&self.inner)?;
            let client = local.client;
            let answers = requests
                .into_iter()
                .map(|r| apply(&mut local.engine, client, r))
                .collect();
            Ok(reply::lock_delta(py, answers)?.0)
        }

        /// As `Client._lock_receipt`.
        fn _lock_receipt(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<(u64, i64)> {
            let requests = lock_delta_batch(handle, true)?;
            let mut local = guard(&self.inner)?;
            let client = local.client;
            let answers = requests
                .into_iter()
                .map(|r| apply(&mut local.engine, client, r))
                .collect();
            let (delta, named) = reply::lock_delta(py, answers)?;
            Ok((named.unwrap_or(count(handle, "handle")?), delta))
        }

        /// Nothing to release (symmetry with `Client`).
        fn close(&self) {}

        fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
            slf
        }

        /// Nothing to close; exceptions propagate.
        fn __exit__(
            &self,
            _type: &Bound<'_, PyAny>,
            _value: &Bound<'_, PyAny>,
            _traceback: &Bound<'_, PyAny>,
        ) -> bool {
            false
        }

        fn __repr__(&self) -> String {
            match guard(&self.inner) {
                Ok(l) => format!(
                    "radixd.Engine(page_size={}, capacity={})",
                    l.engine.page_size(),
                    l.engine.capacity()
                ),
                Err(_) => "radixd.Engine(<poisoned>)".to_owned(),
            }
        }
    }
}

/// Registers `make(kind, message) -> exception`, used for every rejection.
#[pyfunction]
fn _set_error_factory(py: Python<'_>, make: Py<PyAny>) {
    // Already set (the package imported twice in one process): keep it.
    let _ = MAKE_ERROR.set(py, make);
}

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

/// The `exec` error kinds this build knows, in wire-code order (without
/// `moved`, which the client handles itself and no caller ever sees).
#[pyfunction]
fn _error_kinds() -> Vec<&'static str> {
    ErrorKind::ALL
        .iter()
        .filter(|&&k| k != ErrorKind::Moved)
        .map(|k| k.name())
        .collect()
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
    Ok(())
}
