//! The Python exceptions of a rejection: each `exec` error kind raised as
//! the `radixd.RadixdError` subclass the factory registered by
//! `radixd/__init__.py` makes, client-side failures read as the kind they
//! amount to, and the few errors of the objects themselves (closed,
//! poisoned).
//!
//! Apart because `Client`, `Engine` and the store methods all raise through
//! it, and the mapping changes only with the error kinds.

use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;

use radixd::op::{ErrorKind, Rejection};
use radixd::ClientError;

/// `radixd._errors.make_error(kind, message)`, registered at import.
static MAKE_ERROR: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// The Python exception for a rejection.
pub(crate) fn rejected(py: Python<'_>, r: Rejection) -> PyErr {
    match MAKE_ERROR.get(py) {
        Some(make) => match make.bind(py).call1((r.kind.name(), r.message.as_str())) {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        },
        None => PyRuntimeError::new_err(r.to_string()),
    }
}

/// A client-side failure as the `exec` error kind it reads as.
pub(crate) fn client_error(e: ClientError) -> Rejection {
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

pub(crate) fn closed() -> PyErr {
    PyValueError::new_err("I/O on a closed radixd.Client")
}

pub(crate) fn poisoned() -> PyErr {
    PyRuntimeError::new_err("an earlier call panicked while using this object")
}

pub(crate) fn guard<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.lock().map_err(|_| poisoned())
}

/// Registers `make(kind, message) -> exception`, used for every rejection.
#[pyfunction]
pub(crate) fn _set_error_factory(py: Python<'_>, make: Py<PyAny>) {
    // Already set (the package imported twice in one process): keep it.
    let _ = MAKE_ERROR.set(py, make);
}

/// The `exec` error kinds this build knows, in wire-code order (without
/// `moved`, which the client handles itself and no caller ever sees).
#[pyfunction]
pub(crate) fn _error_kinds() -> Vec<&'static str> {
    ErrorKind::ALL
        .iter()
        .filter(|&&k| k != ErrorKind::Moved)
        .map(|k| k.name())
        .collect()
}
