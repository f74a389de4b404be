//! Python arguments made into what a request takes: counts (a negative or
//! too large int is a `ValueError`, anything else a `TypeError`, before
//! anything is sent), state slots, pool identities, namespaces, ordering
//! policies, eviction policies and an insert's hints, and the
//! `_lock_delta` batch.
//!
//! Apart because `Client` and `Engine` read their arguments alike, through
//! these and `input` (tokens and pages).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyMapping};

use radixd::binding::{IdentityError, PoolIdentity};
use radixd::engine::{InsertHints, Policy as EvictionPolicy};
use radixd::op::Request;
use radixd::order::{order_matched, Policy};

use crate::errors::rejected;
use crate::input;

/// The batch of `_lock_delta`: `stats`, then lock (`lock=True`) or unlock
/// `handle`, then `stats`.
pub(crate) fn lock_delta_batch(handle: &Bound<'_, PyAny>, lock: bool) -> PyResult<[Request; 3]> {
    let handle = count(handle, "handle")?;
    let middle = if lock {
        Request::Lock { handle }
    } else {
        Request::Unlock { handle }
    };
    Ok([Request::Stats, middle, Request::Stats])
}

/// A non-negative integer argument.
pub(crate) fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    obj.extract::<u64>().map_err(|_| {
        if obj.is_instance_of::<PyInt>() {
            PyValueError::new_err(format!("{what} must be a non-negative integer below 2^64"))
        } else {
            PyTypeError::new_err(format!("{what} must be an int"))
        }
    })
}

/// An optional non-negative integer argument: absent or `None` is 0.
pub(crate) fn opt_count(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<u64> {
    match obj {
        Some(o) if !o.is_none() => count(o, what),
        _ => Ok(0),
    }
}

pub(crate) fn policy(name: &str) -> PyResult<Policy> {
    name.parse()
        .map_err(|e: radixd::order::UnknownPolicy| PyValueError::new_err(e.to_string()))
}

/// Peeks each prompt as soon as it is read, so only one prompt's tokens
/// are held at a time (1,000 prompts of 2K tokens would otherwise be 8 MB
/// of fresh memory), then orders them.
pub(crate) fn order(
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
pub(crate) fn pool_identity(obj: &Bound<'_, PyAny>) -> PyResult<PoolIdentity> {
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

/// An optional state slot argument: a slot is below 2^32.
pub(crate) fn state_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u32>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let slot = count(obj, "mamba_state")?;
    u32::try_from(slot)
        .map(Some)
        .map_err(|_| PyValueError::new_err("mamba_state must be below 2^32"))
}

/// `request` in namespace `ns` (`None`: the default one, the request as
/// it is).
pub(crate) fn in_namespace(ns: Option<String>, request: Request) -> Request {
    match ns {
        Some(ns) => Request::Namespaced {
            ns,
            request: Box::new(request),
        },
        None => request,
    }
}

/// The eviction policy `name` with `config`, SGLang's
/// `--radix-eviction-policy` and `--radix-eviction-policy-config` (a
/// mapping of parameter names to ints; `None`: SGLang's defaults).
pub(crate) fn eviction_policy(
    name: &str,
    config: Option<&Bound<'_, PyAny>>,
) -> PyResult<EvictionPolicy> {
    let mut params: Vec<(String, i64)> = Vec::new();
    if let Some(config) = config.filter(|c| !c.is_none()) {
        let map = config.downcast::<PyMapping>().map_err(|_| {
            PyTypeError::new_err("eviction_policy_config must be a mapping of names to ints")
        })?;
        for item in map.items()?.iter() {
            let (key, value): (String, Bound<'_, PyAny>) = item.extract()?;
            let v = value.extract::<i64>().map_err(|_| {
                PyValueError::new_err(format!(
                    "eviction_policy_config: {key} must be an int, not {value}"
                ))
            })?;
            params.push((key, v));
        }
    }
    let params: Vec<(&str, i64)> = params.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    EvictionPolicy::with_parameters(name, &params).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `policy`'s parameters as SGLang's config spells them (empty for a
/// policy that takes none).
pub(crate) fn eviction_policy_config(
    py: Python<'_>,
    policy: EvictionPolicy,
) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in policy.parameters() {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// An insert's hints for the eviction policy (`priority`, `inserted_len`)
/// around `request`, when they are not the default.
pub(crate) fn hinted(priority: i64, inserted_len: u64, request: Request) -> Request {
    let hints = InsertHints {
        priority,
        inserted_len,
    };
    if hints == InsertHints::default() {
        return request;
    }
    Request::Hinted {
        hints,
        request: Box::new(request),
    }
}
