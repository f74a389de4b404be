//! `cache_methods!`: the operations every cache answers the same way,
//! spliced into the one `#[pymethods]` block of `Client` and of `Engine`
//! over each class's own `run(&self, py, Request)` and `components()`.
//!
//! Apart because it is shared by both classes; the names it uses
//! (`Request`, `reply`, the argument readers) resolve where it is invoked.

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
            /// `match_prefix`'s. `priority` and `inserted_len`: what the
            /// eviction policy reads of the insert (SGLang's
            /// `InsertParams.priority`, and the tokens of the key this
            /// request inserted before).
            #[pyo3(signature = (tokens, pages, lock = false, mamba_state = None, swa_evicted = None, ns = None, priority = 0, inserted_len = 0))]
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
                priority: i64,
                inserted_len: u64,
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
                    let request = hinted(priority, inserted_len, request);
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

            /// `alloc` of `n` pages answering also the SWA page paired with
            /// each, in one round trip: `(pages, swa_pages)`, both
            /// `array.array('I')` (`swa_pages` empty without SWA).
            fn alloc_paired<'py>(
                &self,
                py: Python<'py>,
                n: &Bound<'py, PyAny>,
            ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
                let n = count(n, "n")?;
                reply::pages_paired(py, self.run(py, Request::AllocPaired { n })?)
            }

            /// `lock` of `handle` answering also what `_lock_receipt` and
            /// `swa_pages(pages)` would, in one round trip: `(lock, delta,
            /// swa_pages)`, the lock's handle, protected tokens before minus
            /// after, and the SWA page paired with each of `pages` as
            /// `array.array('I')` (`NO_PAGE` where one has none). A bad page
            /// raises before anything is locked.
            #[pyo3(signature = (handle, pages = None))]
            fn lock_paired<'py>(
                &self,
                py: Python<'py>,
                handle: &Bound<'py, PyAny>,
                pages: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<(u64, i64, Bound<'py, PyAny>)> {
                let handle = count(handle, "handle")?;
                let pages = match pages {
                    Some(p) if !p.is_none() => input::u32s(p, "pages")?,
                    _ => Vec::new(),
                };
                reply::locked_paired(py, self.run(py, Request::LockPaired { handle, pages })?)
            }

            /// `insert` (with `insert`'s arguments) answering also the key's
            /// pages as the tree holds them now (what `peek_full` reads) and
            /// the SWA page paired with each of the last `tail` of them (none
            /// by default), in one round trip: `(result, pages, swa_pages)`,
            /// the pages `array.array('I')` (`NO_PAGE` where one has none).
            /// `priority` and `inserted_len`: as `insert`'s.
            #[pyo3(signature = (tokens, pages, lock = false, mamba_state = None, swa_evicted = None, tail = None, ns = None, priority = 0, inserted_len = 0))]
            #[allow(clippy::too_many_arguments)]
            fn insert_paired<'py>(
                &self,
                py: Python<'py>,
                tokens: &Bound<'py, PyAny>,
                pages: &Bound<'py, PyAny>,
                lock: bool,
                mamba_state: Option<&Bound<'py, PyAny>>,
                swa_evicted: Option<&Bound<'py, PyAny>>,
                tail: Option<&Bound<'py, PyAny>>,
                ns: Option<String>,
                priority: i64,
                inserted_len: u64,
            ) -> PyResult<(InsertResult, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
                let tail = u32::try_from(opt_count(tail, "tail")?)
                    .map_err(|_| PyValueError::new_err("tail must be below 2^32"))?;
                let request = Request::InsertPaired {
                    tokens: input::u32s(tokens, "tokens")?,
                    pages: input::u32s(pages, "pages")?,
                    lock,
                    mamba_state: state_arg(mamba_state)?,
                    swa_evicted: opt_count(swa_evicted, "swa_evicted")?,
                    tail,
                };
                let request = hinted(priority, inserted_len, request);
                reply::inserted_paired(py, self.run(py, in_namespace(ns, request))?)
            }

            /// `n` MAMBA state slots, all or none, in one round trip (what
            /// `n` calls of `alloc_state` hand out).
            fn alloc_states(&self, py: Python<'_>, n: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
                let n = count(n, "n")?;
                reply::states(self.run(py, Request::AllocStates { n })?)
            }

            /// Returns state slots this client holds to the pool, all or
            /// none, in one round trip.
            fn free_states(&self, py: Python<'_>, states: &Bound<'_, PyAny>) -> PyResult<()> {
                let states = input::u32s(states, "states")?;
                reply::done(self.run(py, Request::FreeStates { states })?)
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

            /// Evicts the least recently used unlocked leaf whole (one step
            /// of SGLang's eviction walk, which checks its stop rule between
            /// leaves): `(handle, tokens)`, the leaf's handle as it was
            /// (stale from now on) and the tokens freed, or `None` when no
            /// leaf is evictable.
            fn evict_leaf(&self, py: Python<'_>) -> PyResult<Option<(u64, u64)>> {
                reply::evicted_leaf(self.run(py, Request::EvictLeaf)?)
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

pub(crate) use cache_methods;
