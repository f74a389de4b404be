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
use radixd::engine::{Components, Config, Engine as RustEngine, HeapRegion, Recency};
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
        #[pyo3(signature = (page_size, capacity, components = "full", swa_window = None, swa_capacity = None, mamba_capacity = None, recency = "exact", eviction_policy = "lru", eviction_policy_config = None))]
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
            let mut engine = RustEngine::with_components(config, comps).map_err(|e| bad(&e))?;
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
