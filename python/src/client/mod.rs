//! `radixd.Client`: a scheduler's connection to a running daemon (the lean
//! `radixd::Client`), every operation of `radixd exec` plus the lock-free
//! `peek` and the cache-aware `order`. The GIL is released while a call
//! waits for the daemon; a mutex inside the object serialises threads.
//!
//! Apart from `Engine` because only it talks to a daemon: connecting,
//! binding a pool, joining a group, and the store methods (in `client::store`;
//! what they take from Python is made in `crate::store`).

use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use radixd::engine::{Components, Handle, Policy as EvictionPolicy, Recency};
use radixd::op::{Backend, Reply, Request};
use radixd::Client as RustClient;

use crate::args::{
    count, eviction_policy_config, hinted, in_namespace, lock_delta_batch, opt_count, order,
    policy, pool_identity, state_arg,
};
use crate::cache::cache_methods;
use crate::errors::{client_error, closed, guard, poisoned, rejected};
use crate::input;
use crate::reply::{self, insert_like, walked, EvictResult, InsertResult, MatchResult};

mod store;

/// How long `timeout=None` waits for an answer: in effect forever (a dead
/// daemon is still noticed within milliseconds).
const NO_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

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
    pub(crate) inner: Mutex<Option<RustClient>>,
    name: String,
    page_size: u32,
    capacity: u32,
    /// The daemon's components (fixed for its lifetime).
    components: Components,
    /// The daemon's recency rule (fixed for its lifetime).
    recency: Recency,
    /// The daemon's eviction policy (fixed for its lifetime).
    eviction_policy: EvictionPolicy,
    /// The KV buffer this client bound the pool to, canonical.
    pool: Option<String>,
    /// The store namespaces this client registered (`store_namespace`).
    pub(crate) store: crate::store::Namespaces,
    /// The store mapped for reads that never wait for the connection
    /// (`store_probe`); `None` without a store.
    pub(crate) probe: Option<crate::store::Probe>,
}

impl Client {
    /// Runs `f` on the connection, the GIL released (while waiting for the
    /// connection too).
    /// Unlocks held for the next request that the daemon refused when it
    /// came (`unlock_later`) are logged (`logging`, logger `radixd`).
    pub(crate) fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RustClient) -> R + Send,
    ) -> PyResult<R> {
        let (r, refused) = py.allow_threads(|| {
            let mut held = guard(&self.inner)?;
            let c = held.as_mut().ok_or_else(closed)?;
            let r = f(c);
            PyResult::Ok((r, c.take_unlock_failures()))
        })?;
        if !refused.is_empty() {
            log_refused(py, &refused);
        }
        Ok(r)
    }

    /// The connection, for work done holding the GIL (lock-free reads);
    /// the GIL is released only while another thread holds the connection.
    pub(crate) fn hold(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, Option<RustClient>>> {
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

/// Logs each unlock `unlock_later` held that the daemon refused, on the
/// `radixd` logger: never an exception, which would lose the answer of the
/// call it rode with (pages, a lock) after the daemon carried it out.
fn log_refused(py: Python<'_>, refused: &[(Handle, radixd::op::Rejection)]) {
    let logged = (|| -> PyResult<()> {
        let logger = py
            .import("logging")?
            .call_method1("getLogger", ("radixd",))?;
        for (handle, why) in refused {
            let message = format!(
                "the unlock of {:#x} held for the next call was refused: {why}",
                handle.to_raw()
            );
            logger.call_method1("warning", (message,))?;
        }
        Ok(())
    })();
    // Logging itself failed (a broken handler): nothing is left to tell.
    drop(logged);
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
                    py.allow_threads(|| crate::store::Probe::open(&owned, data_bytes, slot))
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
                eviction_policy: client.eviction_policy(),
                inner: Mutex::new(Some(client)),
                name: name.to_owned(),
                pool: pool.map(|p| p.as_str().to_owned()),
                store: crate::store::Namespaces::default(),
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

        /// The daemon's eviction policy (`radixd serve --eviction-policy`):
        /// `"lru"`, `"lfu"`, `"fifo"`, `"mru"`, `"filo"`, `"priority"`,
        /// `"tlru"` or `"slru"`, as SGLang's `--radix-eviction-policy`
        /// names them.
        #[getter]
        fn eviction_policy(&self) -> &'static str {
            self.eviction_policy.name()
        }

        /// The daemon's policy's parameters (`--eviction-policy-config`),
        /// as SGLang's `--radix-eviction-policy-config` spells them, with
        /// SGLang's defaults filled in: `{}` for a policy that takes none.
        #[getter]
        fn eviction_policy_config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            eviction_policy_config(py, self.eviction_policy)
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

        /// `(free_pages, swa_free_pages, mamba_free_states)`: what each of
        /// the daemon's pools has free (0 for a component that is off), as
        /// a scheduler sizes its next allocation by. Answered without a
        /// round trip from the counts the last answer that carried them
        /// said, while they are current (no call of this client, nor any
        /// other client's, nor the daemon's own work, changed them since;
        /// a rank of a group keeps what its steps answered); else asked.
        /// The first call turns the keeping on: from then on every call of
        /// this client that may change them carries them back.
        fn free_counts(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
            let f = self
                .with(py, |c| c.free_counts())?
                .map_err(|e| rejected(py, client_error(e)))?;
            Ok((f.pages, f.swa_pages, f.mamba_states))
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

        /// Drops one of this client's locks with its next call to the
        /// daemon, ahead of it in the same round trip, instead of a round
        /// trip now (SGLang reads nothing of `dec_lock_ref`'s answer). Until
        /// then other clients see the node locked; this client's own calls
        /// all find it unlocked (lock-free reads never look at locks). A
        /// lock the daemon then refuses to drop changed nothing and is
        /// logged (logger `radixd`), not raised as the call's error. At most
        /// 32 are held; a rank of a group unlocks at once.
        fn unlock_later(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
            let handle = Handle::from_raw(count(handle, "handle")?);
            self.with(py, |c| c.unlock_later(handle))?
                .map_err(|e| rejected(py, client_error(e)))
        }

        /// Sends the unlocks `unlock_later` holds now (one round trip), if any.
        fn flush_unlocks(&self, py: Python<'_>) -> PyResult<()> {
            self.with(py, |c| c.flush_unlocks())?
                .map_err(|e| rejected(py, client_error(e)))
        }

        /// How many unlocks `unlock_later` holds for the next call.
        #[getter]
        fn unlocks_held(&self, py: Python<'_>) -> PyResult<usize> {
            Ok(self.hold(py)?.as_ref().ok_or_else(closed)?.unlocks_held())
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
