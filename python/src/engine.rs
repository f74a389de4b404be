//! `radixd.Engine`: the operations of `Client` (less `peek`) on an
//! in-process engine, for tests and simulation, with exactly
//! `radixd exec`'s semantics.
//!
//! Apart from `Client` because it owns its engine: no daemon, no GIL
//! released (engine calls are short).

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use radixd::engine::Policy as EvictionPolicy;
use radixd::engine::{Components, Config, Digest, Engine as RustEngine, HeapRegion, Recency};
use radixd::op::{apply, Backend, Local, Reply, Request};

use crate::args::{
    count, eviction_policy, eviction_policy_config, hinted, in_namespace, lock_delta_batch,
    opt_count, order, policy, state_arg,
};
use crate::cache::cache_methods;
use crate::errors::{guard, rejected};
use crate::input;
use crate::reply::{self, insert_like, walked, EvictResult, InsertResult, MatchResult};

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
        /// SGLang's tree does; `eviction_policy` and
        /// `eviction_policy_config` are `radixd serve`'s
        /// `--eviction-policy` and `--eviction-policy-config`, SGLang's
        /// names and parameters as a mapping).
        #[new]
        #[pyo3(signature = (page_size, capacity, components = "full", swa_window = None, swa_capacity = None, mamba_capacity = None, recency = "exact", eviction_policy = "lru", eviction_policy_config = None, host_pages = 0))]
        #[allow(clippy::too_many_arguments)] // the flags of `radixd exec`, by keyword
        fn new(
            page_size: u32,
            capacity: u32,
            components: &str,
            swa_window: Option<u32>,
            swa_capacity: Option<u32>,
            mamba_capacity: Option<u32>,
            recency: &str,
            eviction_policy: &str,
            eviction_policy_config: Option<&Bound<'_, PyAny>>,
            host_pages: u32,
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
            let policy = self::eviction_policy(eviction_policy, eviction_policy_config)?;
            let mut engine = RustEngine::with_host(config, host_pages).map_err(|e| bad(&e))?;
            engine.set_components(comps).map_err(|e| bad(&e))?;
            engine.set_recency(recency);
            if !policy.is_lru() {
                engine.set_policy(policy);
            }
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

        /// The eviction policy's name, as `Client.eviction_policy`.
        #[getter]
        fn eviction_policy(&self) -> PyResult<&'static str> {
            Ok(guard(&self.inner)?.engine.policy().name())
        }

        /// The eviction policy's parameters, as
        /// `Client.eviction_policy_config`.
        #[getter]
        fn eviction_policy_config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let policy: EvictionPolicy = guard(&self.inner)?.engine.policy();
            eviction_policy_config(py, policy)
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

        /// As `unlock` (in-process there is no round trip to save);
        /// `Client.unlock_later` holds it for the daemon's next call.
        fn unlock_later(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
            self.unlock(py, handle)
        }

        /// Nothing to send in-process: as `Client.flush_unlocks`.
        fn flush_unlocks(&self) {}

        /// Always 0 in-process: as `Client.unlocks_held`.
        #[getter]
        fn unlocks_held(&self) -> usize {
            0
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

        /// As `Client.free_counts`: `(free_pages, swa_free_pages,
        /// mamba_free_states)`, read off the engine.
        fn free_counts(&self) -> PyResult<(u64, u64, u64)> {
            let f = guard(&self.inner)?.engine.free_counts();
            Ok((f.pages, f.swa_pages, f.mamba_states))
        }

        /// The host tier's counts, `{"capacity", "used", "host_only_nodes"}`,
        /// or `None` without one (`host_pages=0`).
        fn host_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
            let Some(s) = guard(&self.inner)?.engine.host_stats() else {
                return Ok(None);
            };
            let d = PyDict::new(py);
            d.set_item("capacity", s.capacity)?;
            d.set_item("used", s.used)?;
            d.set_item("host_only_nodes", s.host_only_nodes)?;
            Ok(Some(d))
        }

        /// SGLang's `commit_backup`: the node `handle` names has a host copy
        /// on `host_pages` (host pool indices divided by the page size),
        /// one per page; its parent must have one or be the root.
        fn backup(&self, py: Python<'_>, handle: &Bound<'_, PyAny>, host_pages: &Bound<'_, PyAny>) -> PyResult<()> {
            let (h, pages) = (count(handle, "handle")?, input::u32s(host_pages, "host_pages")?);
            let r = guard(&self.inner)?.engine.backup(h, &pages);
            r.map_err(|e| rejected(py, e.into()))
        }

        /// The write-through chain of the node `handle` names: it and its
        /// ancestors without a host copy, root side first (handles).
        fn backup_chain(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
            let r = guard(&self.inner)?.engine.backup_chain(count(handle, "handle")?);
            let chain = r.map_err(|e| rejected(py, e.into()))?;
            Ok(chain.into_iter().map(|h| h.to_raw()).collect())
        }

        /// `(device_pages, host_pages)` of the node `handle` names: its
        /// device page count (0: host-only) and its host copy's pages
        /// (empty: not backed up).
        fn host_node<'py>(&self, py: Python<'py>, handle: &Bound<'py, PyAny>) -> PyResult<(u32, Bound<'py, PyAny>)> {
            let r = guard(&self.inner)?.engine.host_node(count(handle, "handle")?);
            let n = r.map_err(|e| rejected(py, e.into()))?;
            Ok((n.device_pages, input::array_out(py, &n.host_pages)?))
        }

        /// SGLang's `match_prefix` with HiCache: `(device_len, device,
        /// host_len, best, pages, host_pages)`, the tokens matched on device
        /// and the deepest device node's handle (`None`: the root), the
        /// tokens matched past it in host-only nodes (`host_hit_length`) and
        /// the deepest node's handle, then both page lists.
        #[allow(clippy::type_complexity)] // one tuple, as the docstring reads
        fn match_host<'py>(
            &self,
            py: Python<'py>,
            tokens: &Bound<'py, PyAny>,
        ) -> PyResult<(usize, Option<u64>, usize, Option<u64>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
            let tokens = input::u32s(tokens, "tokens")?;
            let (mut pages, mut host) = (Vec::new(), Vec::new());
            let m = guard(&self.inner)?.engine.match_host(&tokens, &mut pages, &mut host);
            Ok((
                m.device_len,
                m.device.map(|h| h.to_raw()),
                m.host_len,
                m.best.map(|h| h.to_raw()),
                input::array_out(py, &pages)?,
                input::array_out(py, &host)?,
            ))
        }

        /// SGLang's `build_load_back_spec`: the host-only nodes a load-back
        /// of `handle` fills, root side first, as `(handle, host_pages)`.
        fn load_back_chain<'py>(
            &self,
            py: Python<'py>,
            handle: &Bound<'py, PyAny>,
        ) -> PyResult<Vec<(u64, Bound<'py, PyAny>)>> {
            let r = guard(&self.inner)?.engine.load_back_chain(count(handle, "handle")?);
            let chain = r.map_err(|e| rejected(py, e.into()))?;
            chain
                .into_iter()
                .map(|(h, pages)| Ok((h.to_raw(), input::array_out(py, &pages)?)))
                .collect()
        }

        /// SGLang's `commit_load_back`: `pages` (allocated, one per host page
        /// of the chain, root side first) take the chain's tokens; returns
        /// the tokens loaded.
        fn load_back(&self, py: Python<'_>, handle: &Bound<'_, PyAny>, pages: &Bound<'_, PyAny>) -> PyResult<usize> {
            let (h, pages) = (count(handle, "handle")?, input::u32s(pages, "pages")?);
            let mut local = guard(&self.inner)?;
            let client = local.client;
            local.engine.load_back(client, h, &pages).map_err(|e| rejected(py, e.into()))
        }

        /// SGLang's `drive_host_eviction`: frees at least `pages` host pages,
        /// whole host leaves in the eviction policy's order; returns the
        /// freed host pages in order.
        fn evict_host<'py>(&self, py: Python<'py>, pages: u64) -> PyResult<Bound<'py, PyAny>> {
            let mut freed = Vec::new();
            guard(&self.inner)?.engine.evict_host(pages, &mut freed);
            input::array_out(py, &freed)
        }

        /// SGLang's `inc_host_lock_ref`: a receipt, or `None` when the node
        /// has no host copy.
        fn host_lock(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
            let r = guard(&self.inner)?.engine.host_lock(count(handle, "handle")?);
            r.map_err(|e| rejected(py, e.into()))
        }

        /// SGLang's `dec_host_lock_ref` of a `host_lock` receipt.
        fn host_unlock(&self, py: Python<'_>, receipt: u32) -> PyResult<()> {
            let r = guard(&self.inner)?.engine.host_unlock(receipt);
            r.map_err(|e| rejected(py, e.into()))
        }

        /// SGLang's `insert_host` (write-through): files `tokens`' pages
        /// fetched from the L3 onto `host_pages` below `anchor` (`None`: the
        /// root), with their 32-byte `digests` (or none); returns
        /// `(prefix_len, node, dropped)`.
        #[pyo3(signature = (anchor, tokens, host_pages, digests = None))]
        fn insert_host(
            &self,
            py: Python<'_>,
            anchor: Option<&Bound<'_, PyAny>>,
            tokens: &Bound<'_, PyAny>,
            host_pages: &Bound<'_, PyAny>,
            digests: Option<Vec<Vec<u8>>>,
        ) -> PyResult<(usize, Option<u64>, bool)> {
            let anchor = anchor.map(|a| count(a, "anchor")).transpose()?;
            let tokens = input::u32s(tokens, "tokens")?;
            let host_pages = input::u32s(host_pages, "host_pages")?;
            let digests = self::digests(digests.unwrap_or_default())?;
            let r = guard(&self.inner)?.engine.insert_host(anchor, &tokens, &host_pages, &digests);
            let got = r.map_err(|e| rejected(py, e.into()))?;
            Ok((got.prefix_len, got.node.map(|h| h.to_raw()), got.dropped))
        }

        /// Sets the node's page digests (32 bytes each, one per page).
        fn set_digests(&self, py: Python<'_>, handle: &Bound<'_, PyAny>, digests: Vec<Vec<u8>>) -> PyResult<()> {
            let digests = self::digests(digests)?;
            let r = guard(&self.inner)?.engine.set_digests(count(handle, "handle")?, &digests);
            r.map_err(|e| rejected(py, e.into()))
        }

        /// The node's page digests, or `None` if never hashed
        /// (`hash_value`).
        fn digests(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Vec<u8>>>> {
            let r = guard(&self.inner)?.engine.digests(count(handle, "handle")?);
            let d = r.map_err(|e| rejected(py, e.into()))?;
            Ok(d.map(|d| d.iter().map(|x| x.to_vec()).collect()))
        }

        /// The digests of the node's hashed ancestors, root side first
        /// (`get_prefix_hash_values`).
        fn prefix_digests(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
            let r = guard(&self.inner)?.engine.prefix_digests(count(handle, "handle")?);
            let d = r.map_err(|e| rejected(py, e.into()))?;
            Ok(d.iter().map(|x| x.to_vec()).collect())
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

/// 32-byte digests from Python `bytes`.
fn digests(raw: Vec<Vec<u8>>) -> PyResult<Vec<Digest>> {
    raw.into_iter()
        .map(|d| {
            Digest::try_from(d.as_slice()).map_err(|_| {
                PyValueError::new_err(format!("a digest is 32 bytes, not {}", d.len()))
            })
        })
        .collect()
}
