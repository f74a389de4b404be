//! `radixd.KvIndex`: the cluster router's KV index (`radixd::index`)
//! in-process, for a Python router: feed it the KV event payloads your
//! ZeroMQ subscriber receives, ask it for per-worker overlap scores.
//! Queries release the GIL and never wait for `apply`, so router threads
//! query in parallel.

use std::sync::Arc;

use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use radixd::events::batch::decode_batch;
use radixd::events::hash::{Scheme, SchemeName};
use radixd::index::{ApplyError, IndexConfig, KvIndex as RustIndex, OverlapScores, Worker};

use crate::input;

fn apply_error(e: ApplyError) -> PyErr {
    match e {
        ApplyError::UnknownWorker => PyKeyError::new_err(e.to_string()),
        _ => PyValueError::new_err(format!("{}: {e}", e.kind())),
    }
}

/// `{(worker_id, dp_rank): n}`.
fn by_worker<'py, T: IntoPyObject<'py> + Copy>(
    py: Python<'py>,
    items: &[(Worker, T)],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (w, n) in items {
        d.set_item((w.id, w.dp_rank), *n)?;
    }
    Ok(d)
}

/// The fleet's KV index: one tree over chained block hashes, each block
/// knowing which workers hold it.
///
/// ``KvIndex(block_size=16, hash="xxh3", hash_seed="0")``: ``hash`` is
/// ``"xxh3"`` (Dynamo's chain, radixd's default) or ``"sha256-cbor"``
/// (vLLM's, rooted at ``hash_seed``, vLLM's ``PYTHONHASHSEED``). Workers
/// are ``(worker_id, dp_rank)`` pairs.
#[pyclass(frozen, module = "radixd")]
pub struct KvIndex {
    inner: Arc<RustIndex>,
}

#[pymethods]
impl KvIndex {
    #[new]
    #[pyo3(signature = (block_size = 16, hash = "xxh3", hash_seed = "0"))]
    fn new(block_size: u32, hash: &str, hash_seed: &str) -> PyResult<Self> {
        let name: SchemeName = hash
            .parse()
            .map_err(|e: radixd::events::hash::UnknownScheme| {
                PyValueError::new_err(e.to_string())
            })?;
        let inner = RustIndex::new(IndexConfig {
            block_size,
            scheme: Scheme::new(name, hash_seed),
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> u32 {
        self.inner.config().block_size
    }

    /// Applies one vLLM ``KVEventBatch`` payload (the third frame of a KV
    /// event message) from worker ``worker_id`` (its
    /// ``data_parallel_rank`` completes the worker). Returns
    /// ``{"applied": n, "ignored": n, "errors": [kind, ...]}``; a payload
    /// that does not decode raises ``ValueError`` and changes nothing.
    fn apply<'py>(
        &self,
        py: Python<'py>,
        worker_id: u64,
        payload: &Bound<'py, PyBytes>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let batch = decode_batch(payload.as_bytes())
            .map_err(|e| PyValueError::new_err(format!("not a KV event batch: {e}")))?;
        let inner = Arc::clone(&self.inner);
        let report = py.allow_threads(move || inner.apply(worker_id, &batch));
        let d = PyDict::new(py);
        d.set_item("applied", report.applied)?;
        d.set_item("ignored", report.ignored)?;
        let kinds: Vec<&str> = report.errors.iter().map(ApplyError::kind).collect();
        d.set_item("errors", kinds)?;
        Ok(d)
    }

    /// Overlap scores of a request given by ``tokens`` (cut into blocks and
    /// hashed here) or by ``hashes`` (chained, in the index's scheme).
    /// Returns ``(scores, tree_sizes)``: ``{(worker_id, dp_rank): blocks}``
    /// each; a worker holding not even the first block is absent from
    /// ``scores`` (as in Dynamo).
    #[pyo3(signature = (tokens = None, hashes = None, early_exit = false))]
    fn find_matches<'py>(
        &self,
        py: Python<'py>,
        tokens: Option<&Bound<'py, PyAny>>,
        hashes: Option<Vec<u64>>,
        early_exit: bool,
    ) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
        let inner = Arc::clone(&self.inner);
        let s: OverlapScores = match (tokens, hashes) {
            (Some(t), None) => {
                let t = input::u32s(t, "tokens")?;
                py.allow_threads(move || inner.find_matches_for_tokens(&t, early_exit))
            }
            (None, Some(h)) => py.allow_threads(move || inner.find_matches(&h, early_exit)),
            _ => return Err(PyValueError::new_err("give either tokens or hashes")),
        };
        Ok((by_worker(py, &s.scores)?, by_worker(py, &s.tree_sizes)?))
    }

    /// The chained block hashes of ``tokens``' whole blocks (what workers
    /// hashing as this index publish, and what ``find_matches`` takes).
    fn keys_for_tokens(&self, tokens: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
        let t = input::u32s(tokens, "tokens")?;
        Ok(self.inner.keys_for_tokens(&t))
    }

    /// Removes blocks of a worker by its hashes; unknown ones raise
    /// ``ValueError`` after the others are removed (Dynamo's rule).
    #[pyo3(signature = (worker_id, hashes, dp_rank = 0))]
    fn remove(&self, worker_id: u64, hashes: Vec<u64>, dp_rank: u32) -> PyResult<()> {
        let w = Worker {
            id: worker_id,
            dp_rank,
        };
        self.inner.remove(w, &hashes).map_err(apply_error)
    }

    /// Drops every block of one worker; it stays known (tree size 0).
    /// ``KeyError`` for a worker the index does not know.
    #[pyo3(signature = (worker_id, dp_rank = 0))]
    fn clear(&self, worker_id: u64, dp_rank: u32) -> PyResult<()> {
        let w = Worker {
            id: worker_id,
            dp_rank,
        };
        self.inner.clear(w).map_err(apply_error)
    }

    /// Forgets every rank of ``worker_id`` and its blocks.
    fn remove_worker(&self, worker_id: u64) {
        self.inner.remove_worker(worker_id);
    }

    /// ``{(worker_id, dp_rank): tree size}`` of every known worker.
    fn workers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        by_worker(py, &self.inner.workers())
    }

    /// Running totals: workers, blocks, held, events, ignored, errors.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("workers", s.workers)?;
        d.set_item("blocks", s.blocks)?;
        d.set_item("held", s.held)?;
        d.set_item("events", s.events)?;
        d.set_item("ignored", s.ignored)?;
        let e = PyDict::new(py);
        for (k, n) in ApplyError::KINDS.iter().zip(s.errors) {
            e.set_item(*k, n)?;
        }
        d.set_item("errors", e)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        format!(
            "KvIndex(block_size={}, workers={}, blocks={})",
            self.inner.config().block_size,
            s.workers,
            s.blocks
        )
    }
}
