//! What Python hands the store methods of `radixd.Client` (issue 30; the
//! methods are in `client::store`), made into what the lean `radixd::Client`
//! store API takes.
//!
//! - Keys: `str` (its UTF-8 bytes) or `bytes`, read in place: the objects
//!   are held (a strong reference each) while the GIL is released, and a
//!   `str`'s UTF-8 form is cached in the object for its lifetime.
//! - Buffers: any C-contiguous buffer (`bytearray`, numpy arrays,
//!   `memoryview`, `bytes` for reading), in place through `Py_buffer` on
//!   CPython >= 3.11; on 3.9 and 3.10 (no `Py_buffer` in the stable ABI) a
//!   writable buffer's address comes from `ctypes` and a read-only one is
//!   copied once into `bytes` first. Contiguous torch CPU tensors (torch
//!   has no buffer protocol) in place through `data_ptr()`.
//! - Raw pieces: per value a list of `(address, nbytes)`, memory the caller
//!   vouches for (a torch tensor's `data_ptr()`, SGLang's host pool pages
//!   from `get_page_buffer_meta`), gathered into a value or scattered out of
//!   one in that order.
//!
//! Namespaces travel as their id (`int`); the value size comes from the
//! registration this client made (`store_namespace`).

use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::Mutex;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use radixd::op::{ErrorKind, Rejection};
use radixd::store::{StoreMap, StoreNs, StoreReader, StoreStats};
use radixd::ClientError;

use crate::errors::{client_error, rejected};
use crate::input;

// `PyUnicode_AsUTF8AndSize`: in every CPython 3, in the stable ABI from 3.10
// (pyo3 declares it for abi3 only from there).
extern "C" {
    fn PyUnicode_AsUTF8AndSize(
        obj: *mut ffi::PyObject,
        size: *mut ffi::Py_ssize_t,
    ) -> *const c_char;
}

/// The namespaces a client used, by id (ids are the node's and stay bound
/// to their namespace for the store file's life).
#[derive(Default)]
pub struct Namespaces(Mutex<HashMap<u32, StoreNs>>);

impl Namespaces {
    pub fn add(&self, ns: StoreNs) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(ns.id, ns);
        }
    }

    /// The namespace of id `id` if this client has used it.
    pub(crate) fn known(&self, id: u32) -> PyResult<Option<StoreNs>> {
        let map = self
            .0
            .lock()
            .map_err(|_| PyValueError::new_err("an earlier call panicked"))?;
        Ok(map.get(&id).copied())
    }
}

/// The store mapped a second time, for the reads that must never wait for
/// the connection (`store_probe`, `store_find_namespace`,
/// `store_value_max`): a thread copying through the client holds its mutex
/// for a whole reserve-copy-commit, and a scheduler's lookup must not wait
/// behind it (vLLM asks its tiers under its manager lock).
///
/// These reads use no reader announcement: the client's one announcement
/// slot belongs to whichever thread holds the connection, and an
/// existence test needs none. Entries lie in a fixed array of the mapping
/// and each is trusted only under a stable version (`StoreReader::find`),
/// so a walk racing the daemon's reuse of an entry restarts or misses; a
/// hit is a key that was committed at that moment. Nothing is copied out
/// of the data region here, which is what the announcement protects.
pub struct Probe {
    map: StoreMap,
    slot: u32,
}

impl Probe {
    /// Maps the store of daemon `name` whose data region is `data_bytes`
    /// (what the connected client's own mapping says).
    pub fn open(name: &str, data_bytes: u64, slot: u32) -> Result<Self, Rejection> {
        let map = StoreMap::open(name).map_err(|e| {
            Rejection::new(
                ErrorKind::NoStore,
                format!("cannot map the daemon's store: {e}"),
            )
        })?;
        let got = map.view().layout().config.data_bytes;
        if got != data_bytes {
            // The daemon was replaced between the two mappings.
            return Err(Rejection::new(
                ErrorKind::DaemonGone,
                format!("the store changed while connecting ({got} bytes, not {data_bytes})"),
            ));
        }
        Ok(Self { map, slot })
    }

    pub(crate) fn reader(&self) -> StoreReader {
        StoreReader::new(self.map.view(), self.slot)
    }

    /// The largest value the store holds: one extent.
    pub fn value_max(&self) -> u64 {
        self.map.view().layout().config.extent_bytes
    }
}

/// A namespace argument: an `int` from `store_namespace` (of any client).
pub(crate) fn namespace_id(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    obj.extract()
        .map_err(|_| PyTypeError::new_err("ns must be an int from store_namespace"))
}

/// A span of bytes the GIL-free part of a call reads or writes: an address
/// and a length, `Send` so it can cross `allow_threads`.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub at: usize,
    pub len: usize,
}

impl Span {
    /// The bytes as a slice.
    ///
    /// # Safety
    ///
    /// `len` readable bytes lie at `at` and stay alive and unchanged for
    /// `'a` (their owner is held by the caller).
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(self.at as *const u8, self.len) }
    }

    /// As a raw piece.
    pub fn piece(self) -> (*mut u8, usize) {
        (self.at as *mut u8, self.len)
    }
}

/// Keys read from Python, their objects held.
pub struct Keys<'py> {
    _held: Vec<Bound<'py, PyAny>>,
    pub spans: Vec<Span>,
}

/// `what`, or item `i` of it.
fn named(what: &str, i: Option<usize>) -> String {
    match i {
        Some(i) => format!("{what}[{i}]"),
        None => what.to_owned(),
    }
}

/// One key (`what`, or item `i` of it): a `str`'s UTF-8 bytes or a `bytes`
/// object's, in place.
fn key_span(obj: &Bound<'_, PyAny>, what: &str, i: Option<usize>) -> PyResult<Span> {
    if let Ok(s) = obj.downcast::<PyString>() {
        let mut len: ffi::Py_ssize_t = 0;
        // SAFETY: `s` is a live str (we hold the GIL and a reference); the
        // function returns its cached UTF-8 form (valid while the object
        // lives) or NULL with an exception set (a lone surrogate).
        let at = unsafe { PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut len) };
        if at.is_null() {
            return Err(PyErr::fetch(obj.py()));
        }
        let len = usize::try_from(len).unwrap_or(0);
        return Ok(Span {
            at: at as usize,
            len,
        });
    }
    if let Ok(b) = obj.downcast::<PyBytes>() {
        let bytes = b.as_bytes();
        return Ok(Span {
            at: bytes.as_ptr() as usize,
            len: bytes.len(),
        });
    }
    Err(PyTypeError::new_err(format!(
        "{} must be str or bytes, not {}",
        named(what, i),
        obj.get_type().name()?
    )))
}

impl<'py> Keys<'py> {
    pub fn read(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        let mut held = Vec::new();
        let mut spans = Vec::new();
        for (i, key) in obj.try_iter()?.enumerate() {
            let key = key?;
            spans.push(key_span(&key, what, Some(i))?);
            held.push(key);
        }
        Ok(Self { _held: held, spans })
    }

    /// One key.
    pub fn one(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        let span = key_span(obj, what, None)?;
        Ok(Self {
            _held: vec![obj.clone()],
            spans: vec![span],
        })
    }

    /// The parents: per key a key or `None`.
    pub fn parents(obj: &Bound<'py, PyAny>, n: usize) -> PyResult<(Self, Vec<Option<usize>>)> {
        let mut held = Vec::new();
        let mut spans = Vec::new();
        let mut which = Vec::new();
        for (i, p) in obj.try_iter()?.enumerate() {
            let p = p?;
            if p.is_none() {
                which.push(None);
            } else {
                which.push(Some(spans.len()));
                spans.push(key_span(&p, "parents", Some(i))?);
                held.push(p);
            }
        }
        if which.len() != n {
            return Err(PyValueError::new_err(format!(
                "{n} keys but {} parents",
                which.len()
            )));
        }
        Ok((Self { _held: held, spans }, which))
    }
}

/// What keeps a buffer's bytes alive (and exported) while it is held.
enum Held<'py> {
    View { _view: input::View },
    Object { _object: Bound<'py, PyAny> },
}

/// Buffers read from Python, held while the GIL is released.
pub struct Buffers<'py> {
    _held: Vec<Held<'py>>,
    pub spans: Vec<Span>,
}

impl<'py> Buffers<'py> {
    /// Each object of `obj` (an iterable of buffers) as one span, writable
    /// when `writable`.
    pub fn read(obj: &Bound<'py, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        let mut out = Self {
            _held: Vec::new(),
            spans: Vec::new(),
        };
        for (i, b) in obj.try_iter()?.enumerate() {
            out.push(&b?, writable, what, Some(i))?;
        }
        Ok(out)
    }

    pub fn one(obj: &Bound<'py, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        let mut out = Self {
            _held: Vec::new(),
            spans: Vec::new(),
        };
        out.push(obj, writable, what, None)?;
        Ok(out)
    }

    fn push(
        &mut self,
        obj: &Bound<'py, PyAny>,
        writable: bool,
        what: &str,
        i: Option<usize>,
    ) -> PyResult<()> {
        let (held, span) = if let Some(found) = by_tensor(obj, &named(what, i))? {
            found
        } else if input::raw_buffers() {
            let view = input::contiguous_view(obj, writable)
                .ok_or_else(|| not_a_buffer(obj, writable, &named(what, i)))?;
            let (at, len) = view.span();
            (
                Held::View { _view: view },
                Span {
                    at: at as usize,
                    len,
                },
            )
        } else {
            by_memoryview(obj, writable, &named(what, i))?
        };
        self._held.push(held);
        self.spans.push(span);
        Ok(())
    }
}

fn not_a_buffer(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyErr {
    let kind = if writable { "a writable" } else { "a" };
    let name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    PyTypeError::new_err(format!(
        "{what} must be {kind} C-contiguous buffer (bytearray, numpy array, memoryview) \
         or CPU tensor, not {name}"
    ))
}

/// A torch tensor (no buffer protocol): its bytes in place when it is a
/// C-contiguous CPU tensor, else a `TypeError` naming what to pass; `None`
/// for an object that is not a tensor. Held (a strong reference) while the
/// GIL is released; resizing it meanwhile is the caller's fault, as with raw
/// pieces.
fn by_tensor<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Option<(Held<'py>, Span)>> {
    let module: String = obj.get_type().module()?.extract()?;
    if !(module.starts_with("torch") && obj.hasattr("data_ptr")?) {
        return Ok(None);
    }
    let device: String = obj.getattr("device")?.getattr("type")?.extract()?;
    if device != "cpu" {
        return Err(PyTypeError::new_err(format!(
            "{what} is a {device} tensor: pass a CPU tensor (pinned for a GPU copy after)"
        )));
    }
    let contiguous: bool = obj.call_method0("is_contiguous")?.extract()?;
    if !contiguous {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a contiguous tensor (call .contiguous() first)"
        )));
    }
    let numel: usize = obj.call_method0("numel")?.extract()?;
    let item: usize = obj.call_method0("element_size")?.extract()?;
    let len = numel
        .checked_mul(item)
        .ok_or_else(|| PyValueError::new_err(format!("{what}: a tensor of impossible size")))?;
    let at: usize = if len == 0 {
        0
    } else {
        obj.call_method0("data_ptr")?.extract()?
    };
    if at == 0 && len != 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: a tensor without storage"
        )));
    }
    Ok(Some((
        Held::Object {
            _object: obj.clone(),
        },
        Span { at, len },
    )))
}

/// The CPython 3.9/3.10 path: `memoryview` for the checks, `ctypes` for a
/// writable buffer's address (its `from_buffer` object keeps the export
/// alive), one copy into `bytes` for a read-only one.
fn by_memoryview<'py>(
    obj: &Bound<'py, PyAny>,
    writable: bool,
    what: &str,
) -> PyResult<(Held<'py>, Span)> {
    let py = obj.py();
    let view = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((obj,))
        .map_err(|_| not_a_buffer(obj, writable, what))?;
    let contiguous: bool = view.getattr("c_contiguous")?.extract()?;
    let readonly: bool = view.getattr("readonly")?.extract()?;
    if !contiguous || (writable && readonly) {
        return Err(not_a_buffer(obj, writable, what));
    }
    let len: usize = view.getattr("nbytes")?.extract()?;
    if len == 0 {
        return Ok((Held::Object { _object: view }, Span { at: 0, len: 0 }));
    }
    if writable || !readonly {
        let ctypes = py.import("ctypes")?;
        let flat = view.call_method1("cast", ("B",))?;
        let array_type = py
            .import("operator")?
            .getattr("mul")?
            .call1((ctypes.getattr("c_char")?, len))?;
        let array = array_type.call_method1("from_buffer", (flat,))?;
        let at: usize = ctypes.call_method1("addressof", (&array,))?.extract()?;
        return Ok((Held::Object { _object: array }, Span { at, len }));
    }
    let bytes = view.call_method0("tobytes")?;
    let b = bytes.downcast::<PyBytes>()?.as_bytes();
    let span = Span {
        at: b.as_ptr() as usize,
        len: b.len(),
    };
    Ok((Held::Object { _object: bytes }, span))
}

/// Raw pieces: per value a list of `(address, nbytes)`.
pub fn pieces(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<Vec<Span>>> {
    let mut out = Vec::new();
    for (i, value) in obj.try_iter()?.enumerate() {
        let value = value?;
        let mut spans = Vec::new();
        for piece in value.try_iter()? {
            let piece = piece?;
            let (at, len) = match piece.downcast::<PyTuple>() {
                Ok(t) if t.len() == 2 => (t.get_item(0)?, t.get_item(1)?),
                _ => {
                    let list = piece.downcast::<PyList>().map_err(|_| {
                        PyTypeError::new_err(format!(
                            "{what}[{i}] must hold (address, nbytes) pairs"
                        ))
                    })?;
                    if list.len() != 2 {
                        return Err(PyTypeError::new_err(format!(
                            "{what}[{i}] must hold (address, nbytes) pairs"
                        )));
                    }
                    (list.get_item(0)?, list.get_item(1)?)
                }
            };
            let at: usize = at.extract().map_err(|_| {
                PyValueError::new_err(format!(
                    "{what}[{i}]: an address must be a non-negative int"
                ))
            })?;
            let len: usize = len.extract().map_err(|_| {
                PyValueError::new_err(format!("{what}[{i}]: nbytes must be a non-negative int"))
            })?;
            if at == 0 && len != 0 {
                return Err(PyValueError::new_err(format!(
                    "{what}[{i}]: a NULL address"
                )));
            }
            spans.push(Span { at, len });
        }
        out.push(spans);
    }
    Ok(out)
}

/// `store_stats()` as a dict.
pub fn stats_dict<'py>(py: Python<'py>, s: &StoreStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("values", s.values)?;
    d.set_item("bytes", s.bytes)?;
    d.set_item("capacity_bytes", s.capacity_bytes)?;
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("evicted", s.evicted)?;
    d.set_item("namespaces", s.namespaces)?;
    d.set_item("failed_reserves", s.failed_reserves)?;
    Ok(d)
}

/// A size that is not the namespace's, as the store words it.
pub(crate) fn size_mismatch(py: Python<'_>, what: &str, expected: u64, got: usize) -> PyErr {
    rejected(
        py,
        Rejection::new(
            ErrorKind::SizeMismatch,
            format!("the namespace's values are {expected} bytes, {what} is {got}"),
        ),
    )
}

pub(crate) fn failed(py: Python<'_>) -> impl Fn(ClientError) -> PyErr + '_ {
    move |e| rejected(py, client_error(e))
}

pub(crate) fn same_len(n: usize, m: usize, what: &str) -> PyResult<()> {
    if n == m {
        Ok(())
    } else {
        Err(PyValueError::new_err(format!("{n} keys but {m} {what}")))
    }
}

/// `pieces` as the raw pieces the Rust client takes, each value's summing to
/// `ns.value_size` (else a `size_mismatch` error).
pub(crate) fn checked_pieces(
    py: Python<'_>,
    ns: StoreNs,
    pieces: &[Vec<Span>],
    what: &str,
) -> PyResult<()> {
    for p in pieces {
        let total: usize = p.iter().map(|s| s.len).sum();
        if total as u64 != ns.value_size {
            return Err(size_mismatch(py, what, ns.value_size, total));
        }
    }
    Ok(())
}

/// The raw pieces of spans.
pub(crate) fn raw(pieces: &[Vec<Span>]) -> Vec<Vec<(*mut u8, usize)>> {
    pieces
        .iter()
        .map(|p| p.iter().map(|s| s.piece()).collect())
        .collect()
}

/// Keys as slices.
///
/// # Safety
///
/// As [`Span::bytes`], for every span.
pub(crate) unsafe fn slices<'a>(spans: &[Span]) -> Vec<&'a [u8]> {
    // SAFETY: per the contract.
    spans.iter().map(|s| unsafe { s.bytes() }).collect()
}
