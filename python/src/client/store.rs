//! The store methods of `radixd.Client` (`store_*`): the calls, with the
//! GIL released around every copy; what Python hands them is made into
//! what the Rust client takes in `crate::store`.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use radixd::op::{check_key, ErrorKind, Rejection};
use radixd::store::{StoreNs, StoreSlot};

use super::Client;
use crate::errors::{closed, guard, rejected};
use crate::store::{
    checked_pieces, failed, namespace_id, pieces, raw, same_len, slices, stats_dict, Buffers, Keys,
    Probe, Span,
};

impl Client {
    /// The namespace of id `ns`: registered through this client, or by
    /// any other on the node (read from the store's table, lock-free).
    fn namespace(&self, py: Python<'_>, ns: &Bound<'_, PyAny>) -> PyResult<StoreNs> {
        let id = namespace_id(ns)?;
        if let Some(ns) = self.store.known(id)? {
            return Ok(ns);
        }
        let found = self
            .hold(py)?
            .as_ref()
            .ok_or_else(closed)?
            .store_namespace_by_id(id)
            .map_err(failed(py))?;
        let ns = found.ok_or_else(|| {
            rejected(
                py,
                Rejection::new(
                    ErrorKind::UnknownNamespace,
                    format!("no namespace has id {id} (ids come from store_namespace)"),
                ),
            )
        })?;
        self.store.add(ns);
        Ok(ns)
    }

    fn probe(&self, py: Python<'_>) -> PyResult<&Probe> {
        self.probe.as_ref().ok_or_else(|| {
            rejected(
                py,
                Rejection::new(ErrorKind::NoStore, "the daemon runs without a store"),
            )
        })
    }

    /// `store_probe`: the leading run of `keys` stored in `ns`, read
    /// without the connection's lock (see [`Probe`]).
    pub(crate) fn store_probe_run(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let probe = self.probe(py)?;
        let reader = probe.reader();
        let id = namespace_id(ns)?;
        let ns = match self.store.known(id)? {
            Some(ns) => ns,
            None => reader.namespace_by_id(id).ok_or_else(|| {
                rejected(
                    py,
                    Rejection::new(
                        ErrorKind::UnknownNamespace,
                        format!("no namespace has id {id} (ids come from store_namespace)"),
                    ),
                )
            })?,
        };
        let keys = Keys::read(keys, "keys")?;
        // SAFETY: `keys` holds every key object (immutable str/bytes) until
        // this call returns.
        let slices = unsafe { slices(&keys.spans) };
        for k in &slices {
            check_key(k).map_err(|e| rejected(py, Rejection::from(e)))?;
        }
        Ok(reader.run(ns, &slices))
    }

    /// `store_find_namespace`: the id of namespace `name` if anyone
    /// registered it, without the connection's lock.
    pub(crate) fn store_find(&self, py: Python<'_>, name: &str) -> PyResult<Option<u32>> {
        let found = self.probe(py)?.reader().namespace(name.as_bytes());
        Ok(found.map(|ns| {
            self.store.add(ns);
            ns.id
        }))
    }

    pub(crate) fn store_value_limit(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.probe(py)?.value_max())
    }

    pub(crate) fn store_has(&self) -> PyResult<bool> {
        Ok(guard(&self.inner)?.as_ref().ok_or_else(closed)?.has_store())
    }

    pub(crate) fn store_register(
        &self,
        py: Python<'_>,
        name: &str,
        value_size: u64,
    ) -> PyResult<u32> {
        let ns = self
            .with(py, |c| c.store_namespace(name, value_size))?
            .map_err(failed(py))?;
        self.store.add(ns);
        Ok(ns.id)
    }

    pub(crate) fn store_run(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let ns = self.namespace(py, ns)?;
        let keys = Keys::read(keys, "keys")?;
        // SAFETY: `keys` holds every key object (immutable str/bytes) until
        // this call returns.
        let slices = unsafe { slices(&keys.spans) };
        let held = self.hold(py)?;
        held.as_ref()
            .ok_or_else(closed)?
            .store_run(ns, &slices)
            .map_err(failed(py))
    }

    /// Copies values into `pieces` (per key), the GIL released.
    fn store_scatter(
        &self,
        py: Python<'_>,
        ns: StoreNs,
        keys: &Keys<'_>,
        pieces: &[Vec<Span>],
    ) -> PyResult<Vec<bool>> {
        let spans = &keys.spans;
        self.with(py, |c| {
            // SAFETY: the key objects are held by `keys` for this call; the
            // pieces are writable memory of the buffers the caller holds (or
            // that the caller vouched for, raw), each value's summing to the
            // value size (checked).
            let keys = unsafe { slices(spans) };
            let raw = raw(pieces);
            let refs: Vec<&[(*mut u8, usize)]> = raw.iter().map(Vec::as_slice).collect();
            // SAFETY: as above: every piece is writable for its length.
            unsafe { c.store_get_many_raw(ns, &keys, &refs) }
        })?
        .map_err(failed(py))
    }

    pub(crate) fn store_get_one(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let ns = self.namespace(py, ns)?;
        let key = Keys::one(key, "key")?;
        let out = Buffers::one(out, true, "out")?;
        let pieces = vec![vec![out.spans[0]]];
        checked_pieces(py, ns, &pieces, "out")?;
        Ok(self
            .store_scatter(py, ns, &key, &pieces)?
            .first()
            .copied()
            .unwrap_or(false))
    }

    pub(crate) fn store_get_buffers(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        outs: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<bool>> {
        let ns = self.namespace(py, ns)?;
        let keys = Keys::read(keys, "keys")?;
        let outs = Buffers::read(outs, true, "outs")?;
        same_len(keys.spans.len(), outs.spans.len(), "outs")?;
        let pieces: Vec<Vec<Span>> = outs.spans.iter().map(|s| vec![*s]).collect();
        checked_pieces(py, ns, &pieces, "an out buffer")?;
        self.store_scatter(py, ns, &keys, &pieces)
    }

    pub(crate) fn store_get_pieces(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        pieces: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<bool>> {
        let ns = self.namespace(py, ns)?;
        let keys = Keys::read(keys, "keys")?;
        let pieces = self::pieces(pieces, "pieces")?;
        same_len(keys.spans.len(), pieces.len(), "piece lists")?;
        checked_pieces(py, ns, &pieces, "a value's pieces")?;
        self.store_scatter(py, ns, &keys, &pieces)
    }

    /// Stores values gathered from `pieces` (per key), the GIL released.
    fn store_gather(
        &self,
        py: Python<'_>,
        ns: StoreNs,
        keys: &Keys<'_>,
        parents: &Bound<'_, PyAny>,
        pieces: &[Vec<Span>],
    ) -> PyResult<Vec<bool>> {
        let (parent_keys, which) = Keys::parents(parents, keys.spans.len())?;
        let (spans, parent_spans) = (&keys.spans, &parent_keys.spans);
        let which = &which;
        self.with(py, |c| {
            // SAFETY: the key and parent objects are held by `keys` and
            // `parent_keys` for this call; the pieces are readable memory
            // the caller holds or vouched for, each value's summing to the
            // value size (checked).
            let keys = unsafe { slices(spans) };
            // SAFETY: as above, for the parents.
            let parent_slices = unsafe { slices(parent_spans) };
            let parents: Vec<Option<&[u8]>> =
                which.iter().map(|w| w.map(|i| parent_slices[i])).collect();
            let raw: Vec<Vec<(*const u8, usize)>> = pieces
                .iter()
                .map(|p| p.iter().map(|s| (s.at as *const u8, s.len)).collect())
                .collect();
            let refs: Vec<&[(*const u8, usize)]> = raw.iter().map(Vec::as_slice).collect();
            // SAFETY: as above: every piece is readable for its length.
            unsafe { c.store_put_raw(ns, &keys, &parents, &refs) }
        })?
        .map_err(failed(py))
    }

    pub(crate) fn store_put_buffers(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        parents: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<bool>> {
        let ns = self.namespace(py, ns)?;
        let keys = Keys::read(keys, "keys")?;
        let values = Buffers::read(values, false, "values")?;
        same_len(keys.spans.len(), values.spans.len(), "values")?;
        let pieces: Vec<Vec<Span>> = values.spans.iter().map(|s| vec![*s]).collect();
        checked_pieces(py, ns, &pieces, "a value")?;
        self.store_gather(py, ns, &keys, parents, &pieces)
    }

    pub(crate) fn store_put_pieces(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        parents: &Bound<'_, PyAny>,
        pieces: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<bool>> {
        let ns = self.namespace(py, ns)?;
        let keys = Keys::read(keys, "keys")?;
        let pieces = self::pieces(pieces, "pieces")?;
        same_len(keys.spans.len(), pieces.len(), "piece lists")?;
        checked_pieces(py, ns, &pieces, "a value's pieces")?;
        self.store_gather(py, ns, &keys, parents, &pieces)
    }

    /// `store_reserve`: per key a reserved slot `(index, generation,
    /// offset)`, or `None` where anyone stored or reserved the key already.
    pub(crate) fn store_take(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        parents: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<(u32, u32, u64)>>> {
        let ns = self.namespace(py, ns)?;
        let keys = Keys::read(keys, "keys")?;
        let (parent_keys, which) = Keys::parents(parents, keys.spans.len())?;
        let (spans, parent_spans) = (&keys.spans, &parent_keys.spans);
        let which = &which;
        let slots = self
            .with(py, |c| {
                // SAFETY: the key and parent objects are held by `keys` and
                // `parent_keys` for this call.
                let keys = unsafe { slices(spans) };
                // SAFETY: as above, for the parents.
                let parent_slices = unsafe { slices(parent_spans) };
                let parents: Vec<Option<&[u8]>> =
                    which.iter().map(|w| w.map(|i| parent_slices[i])).collect();
                c.store_reserve(ns, &keys, &parents)
            })?
            .map_err(failed(py))?;
        Ok(slots
            .into_iter()
            .map(|s| s.map(|s| (s.index, s.generation, s.offset)))
            .collect())
    }

    /// `store_commit` (`commit`) or `store_abort` of reserved slots.
    pub(crate) fn store_finish(
        &self,
        py: Python<'_>,
        ns: &Bound<'_, PyAny>,
        slots: Vec<(u32, u32, u64)>,
        commit: bool,
    ) -> PyResult<usize> {
        let ns = self.namespace(py, ns)?;
        let slots: Vec<StoreSlot> = slots
            .into_iter()
            .map(|(index, generation, offset)| StoreSlot {
                index,
                generation,
                offset,
            })
            .collect();
        self.with(py, |c| {
            if commit {
                c.store_commit(ns, &slots)
            } else {
                c.store_abort(ns, &slots)
            }
        })?
        .map_err(failed(py))
    }

    pub(crate) fn store_drop(&self, py: Python<'_>, ns: &Bound<'_, PyAny>) -> PyResult<u64> {
        let ns = self.namespace(py, ns)?;
        self.with(py, |c| c.store_clear(ns))?.map_err(failed(py))
    }

    pub(crate) fn store_figures<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.with(py, |c| c.store_stats())?.map_err(failed(py))?;
        stats_dict(py, &stats)
    }
}
