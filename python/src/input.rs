//! Token and page arrays in and out of Python, without a Python-level loop.
//!
//! In: a `list` or `tuple` of ints (exact ints read by two C calls each, no
//! reference counting; anything else item by item in Rust), any object
//! with the buffer protocol holding integers (`array.array`, numpy arrays of
//! any integer dtype, `bytes`), or any other iterable of ints. Every value
//! must fit a `u32`, else `ValueError`.
//!
//! Out: `array.array('I')`, which numpy (`np.frombuffer`) and torch
//! (`torch.frombuffer`) view without a copy.
//!
//! The buffer protocol (`Py_buffer`) is part of the stable ABI only from
//! CPython 3.11. This module is built for abi3-py39, so pyo3 does not offer
//! it; on 3.11 and later it is called here through its stable-ABI
//! declaration, and on 3.9 and 3.10 a buffer is read through `memoryview`
//! (`format`, `itemsize`, `tobytes()`: one C-level copy, still no loop).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBytes, PyInt, PyList, PyTuple};

/// Whether the running interpreter has `Py_buffer` in its stable ABI
/// (CPython >= 3.11); set once when the module is loaded.
static RAW_BUFFERS: AtomicBool = AtomicBool::new(false);

/// How `int` objects are laid out in the running interpreter, when the
/// start-up self-test (`layout::probe`) confirmed it; `NONE` otherwise.
static INT_LAYOUT: AtomicU8 = AtomicU8::new(layout::NONE);

/// `array.array`, looked up once.
static ARRAY: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// Called once from the module's initialisation.
pub fn init(py: Python<'_>) -> PyResult<()> {
    // Relaxed: a flag set once under the GIL before any call reads it.
    RAW_BUFFERS.store(py.version_info() >= (3, 11), Ordering::Relaxed);
    // Relaxed: set once under the GIL before any call reads it.
    INT_LAYOUT.store(layout::probe(py), Ordering::Relaxed);
    let array = array_type(py)?;
    let itemsize: usize = array.call1(("I",))?.getattr("itemsize")?.extract()?;
    if itemsize != 4 {
        return Err(PyTypeError::new_err(format!(
            "array('I') has {itemsize}-byte items on this platform; radixd needs 4"
        )));
    }
    Ok(())
}

/// Whether buffers are read in place (`Py_buffer`) rather than through
/// `memoryview`.
pub(crate) fn raw_buffers() -> bool {
    // Relaxed: see `init`.
    RAW_BUFFERS.load(Ordering::Relaxed)
}

/// Chooses the buffer path: in place (CPython >= 3.11 only) or through
/// `memoryview` (the 3.9/3.10 path), so tests can drive both.
pub fn use_raw_buffers(py: Python<'_>, on: bool) -> bool {
    let on = on && py.version_info() >= (3, 11);
    // Relaxed: see `init`.
    RAW_BUFFERS.store(on, Ordering::Relaxed);
    on
}

fn array_type(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    ARRAY
        .get_or_try_init(py, || Ok(py.import("array")?.getattr("array")?.unbind()))
        .map(|a| a.bind(py))
}

/// `values` as an `array.array('I')`.
pub fn array_out<'py>(py: Python<'py>, values: &[u32]) -> PyResult<Bound<'py, PyAny>> {
    let bytes = PyBytes::new_with(py, values.len() * 4, |buf| {
        for (dst, v) in buf.chunks_exact_mut(4).zip(values) {
            dst.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    })?;
    array_type(py)?.call1(("I", bytes))
}

/// Reads `obj` as `u32` values (`what` names them in errors).
pub fn u32s(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let each = |items: &mut dyn Iterator<Item = Bound<'_, PyAny>>| {
        items.enumerate().map(|(i, v)| one(&v, what, i)).collect()
    };
    if let Ok(list) = obj.downcast::<PyList>() {
        // Relaxed: see `init`.
        let int_layout = INT_LAYOUT.load(Ordering::Relaxed);
        if int_layout != layout::NONE {
            if let Some(values) = layout::list_u32s(list, int_layout) {
                return Ok(values);
            }
        }
        if let Some(values) = exact_ints(obj, list.len(), ffi::PyList_GetItem) {
            return Ok(values);
        }
        return each(&mut list.iter());
    }
    if let Ok(tuple) = obj.downcast::<PyTuple>() {
        if let Some(values) = exact_ints(obj, tuple.len(), ffi::PyTuple_GetItem) {
            return Ok(values);
        }
        return each(&mut tuple.iter());
    }
    if obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a sequence of ints, not an int"
        )));
    }
    // Relaxed: see `init`.
    if RAW_BUFFERS.load(Ordering::Relaxed) {
        if let Some(values) = raw_buffer(obj, what)? {
            return Ok(values);
        }
    }
    if let Some(values) = memoryview(obj, what)? {
        return Ok(values);
    }
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be a list, a buffer of integers or an iterable of ints, not {}",
            type_name(obj)
        ))
    })?;
    iter.enumerate()
        .map(|(i, v)| v.and_then(|v| one(&v, what, i)))
        .collect()
}

/// The fast path for a list or tuple whose items are all exact `int`s that
/// fit a `u32` (a prompt's token ids): each item is read with two C calls
/// and no reference counting, no per-item error check (the out-of-range
/// flag is folded without a branch). `None` when any item is not an exact
/// `int` (a bool, a subclass, anything else) or does not fit; the caller
/// then reads item by item, which names the culprit.
fn exact_ints(
    obj: &Bound<'_, PyAny>,
    len: usize,
    get: unsafe extern "C" fn(*mut ffi::PyObject, ffi::Py_ssize_t) -> *mut ffi::PyObject,
) -> Option<Vec<u32>> {
    let n = ffi::Py_ssize_t::try_from(len).ok()?;
    // Only the address of CPython's `int` type object is taken.
    let int_type = std::ptr::addr_of_mut!(ffi::PyLong_Type);
    let mut out = Vec::with_capacity(len);
    let mut bad = false;
    for i in 0..n {
        // SAFETY: we hold the GIL and a reference to `obj`, a list or tuple
        // (checked by the caller) of at least `n` items: reading exact ints
        // runs no Python code, so nothing can shrink it under us, and
        // PyList_GetItem/PyTuple_GetItem bound-check `i` anyway (NULL, with
        // an IndexError set, is handled). The item is a borrowed reference,
        // alive as long as the container holds it. PyLong_AsLong on an exact
        // int is a plain read (-1 with OverflowError set when too large,
        // cleared below).
        let v = unsafe {
            let item = get(obj.as_ptr(), i);
            if item.is_null() || ffi::Py_TYPE(item) != int_type {
                bad = true;
                break;
            }
            ffi::PyLong_AsLong(item)
        };
        // Negative values (including the -1 of an error) wrap past u32::MAX.
        bad |= v as u64 > u64::from(u32::MAX);
        out.push(v as u32);
    }
    if bad {
        // Any IndexError/OverflowError set above: the slow path reports it.
        drop(PyErr::take(obj.py()));
        return None;
    }
    Some(out)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// One Python int as a `u32`.
fn one(v: &Bound<'_, PyAny>, what: &str, i: usize) -> PyResult<u32> {
    match v.extract::<i64>() {
        Ok(x) => u32::try_from(x).map_err(|_| too_big(what, i, &x.to_string())),
        Err(_) if v.is_instance_of::<PyInt>() => Err(too_big(what, i, &v.to_string())),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{what}[{i}] must be an int, not {}",
            type_name(v)
        ))),
    }
}

fn too_big(what: &str, i: usize, value: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what}[{i}] = {value} does not fit an unsigned 32-bit integer"
    ))
}

/// How a buffer's items are laid out.
#[derive(Clone, Copy)]
struct Items {
    size: usize,
    signed: bool,
    big_endian: bool,
}

/// Parses a struct-module format of one integer item (`"l"`, `"<I"`,
/// `"=q"`, ...); the width is the buffer's `itemsize`, whatever the letter.
fn parse_format(format: &str, itemsize: usize) -> Option<Items> {
    let (big_endian, code) = match format.as_bytes() {
        [b'>' | b'!', c] => (true, *c),
        [b'<' | b'=' | b'@', c] | [c] => (cfg!(target_endian = "big"), *c),
        _ => return None,
    };
    let signed = match code {
        b'b' | b'h' | b'i' | b'l' | b'q' | b'n' => true,
        b'B' | b'H' | b'I' | b'L' | b'Q' | b'N' | b'?' => false,
        _ => return None,
    };
    matches!(itemsize, 1 | 2 | 4 | 8).then_some(Items {
        size: itemsize,
        signed,
        big_endian,
    })
}

/// An integer item type of a buffer.
trait Item: Copy + fmt::Display {
    const WIDTH: usize;
    fn fits(self) -> bool;
    /// `self as u32` (only called once `fits` held).
    fn narrow(self) -> u32;
    fn from_bytes(b: &[u8], big_endian: bool) -> Self;
}

macro_rules! item {
    ($($t:ty),*) => {$(
        impl Item for $t {
            const WIDTH: usize = std::mem::size_of::<$t>();
            #[inline]
            fn fits(self) -> bool {
                u32::try_from(self).is_ok()
            }
            #[inline]
            fn narrow(self) -> u32 {
                self as u32
            }
            #[inline]
            fn from_bytes(b: &[u8], big_endian: bool) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                if big_endian {
                    <$t>::from_be_bytes(a)
                } else {
                    <$t>::from_le_bytes(a)
                }
            }
        }
    )*};
}

item!(i8, u16, i16, u32, i32, u64, i64);

/// Narrows every value in one pass that also notes, without a branch (so
/// it vectorises), whether any did not fit; only then is the culprit found.
fn narrow<T: Item>(values: impl Iterator<Item = T> + Clone, what: &str) -> PyResult<Vec<u32>> {
    let mut bad = false;
    let out = values
        .clone()
        .map(|v| {
            bad |= !v.fits();
            v.narrow()
        })
        .collect();
    if bad {
        let culprit = values.enumerate().find(|&(_, v)| !v.fits());
        let (i, v) = culprit.map_or((0, String::new()), |(i, v)| (i, v.to_string()));
        return Err(too_big(what, i, &v));
    }
    Ok(out)
}

fn decode_as<T: Item>(bytes: &[u8], big_endian: bool, what: &str) -> PyResult<Vec<u32>> {
    // SAFETY: every bit pattern is a valid value of an integer type, and
    // `align_to` hands out only the correctly aligned middle part.
    let (head, mid, tail) = unsafe { bytes.align_to::<T>() };
    if head.is_empty() && tail.is_empty() && big_endian == cfg!(target_endian = "big") {
        // The usual case (numpy and array.array align their data): a slice.
        return narrow(mid.iter().copied(), what);
    }
    let values = bytes
        .chunks_exact(T::WIDTH)
        .map(|c| T::from_bytes(c, big_endian));
    narrow(values, what)
}

/// Converts the raw bytes of a buffer of `items`.
fn decode(bytes: &[u8], items: Items, what: &str) -> PyResult<Vec<u32>> {
    let be = items.big_endian;
    match (items.size, items.signed) {
        (1, false) => Ok(bytes.iter().map(|&b| u32::from(b)).collect()),
        (1, true) => decode_as::<i8>(bytes, be, what),
        (2, false) => decode_as::<u16>(bytes, be, what),
        (2, true) => decode_as::<i16>(bytes, be, what),
        (4, false) => decode_as::<u32>(bytes, be, what),
        (4, true) => decode_as::<i32>(bytes, be, what),
        (8, false) => decode_as::<u64>(bytes, be, what),
        _ => decode_as::<i64>(bytes, be, what),
    }
}

fn not_integers(what: &str, format: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{what} must hold integers; its buffer has items of format {format:?}"
    ))
}

/// `Py_buffer`, as CPython declares it (`Include/pybuffer.h`; in the stable
/// ABI from 3.11, and laid out the same since 3.3).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

// Stable-ABI functions of CPython >= 3.11 (present in every CPython 3).
extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

const PYBUF_WRITABLE: c_int = 0x0001;
const PYBUF_FORMAT: c_int = 0x0004;
const PYBUF_ND: c_int = 0x0008;
const PYBUF_STRIDES: c_int = 0x0010 | PYBUF_ND;
const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | PYBUF_STRIDES;

/// A buffer view, released on drop.
pub(crate) struct View(RawBuffer);

impl View {
    /// The first byte and the length of a C-contiguous view.
    pub(crate) fn span(&self) -> (*mut u8, usize) {
        (self.0.buf.cast(), usize::try_from(self.0.len).unwrap_or(0))
    }
}

/// A C-contiguous view of `obj`'s bytes (writable when `writable`), or
/// `None` when it offers none (the Python error cleared). Call only where
/// `raw_buffers()` holds; release (drop) it with the GIL held.
pub(crate) fn contiguous_view(obj: &Bound<'_, PyAny>, writable: bool) -> Option<View> {
    let mut raw = std::mem::MaybeUninit::<RawBuffer>::zeroed();
    let flags = PYBUF_C_CONTIGUOUS | if writable { PYBUF_WRITABLE } else { 0 };
    // SAFETY: as in `raw_buffer`: a live object, the GIL held, `raw` the
    // size of a Py_buffer and filled only on success.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), raw.as_mut_ptr(), flags) };
    if rc != 0 {
        drop(PyErr::take(obj.py()));
        return None;
    }
    // SAFETY: PyObject_GetBuffer succeeded, so the Py_buffer is initialised.
    Some(View(unsafe { raw.assume_init() }))
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer
        // and is released exactly once, here, with the GIL held: a View is
        // made under the GIL and is not `Send` (raw pointers), so it never
        // enters `allow_threads` and is dropped where it was made.
        unsafe { PyBuffer_Release(&mut self.0) };
    }
}

/// Reads a C-contiguous buffer in place; `None` when `obj` offers none
/// (or only a non-contiguous one: `memoryview` copies that).
fn raw_buffer(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Vec<u32>>> {
    let mut raw = std::mem::MaybeUninit::<RawBuffer>::zeroed();
    // SAFETY: `obj` is a live object (we hold the GIL and a reference);
    // `raw` points to writable memory the size of a Py_buffer, which
    // PyObject_GetBuffer fills on success (returning 0) and leaves
    // unreferenced on failure.
    let rc = unsafe {
        PyObject_GetBuffer(
            obj.as_ptr(),
            raw.as_mut_ptr(),
            PYBUF_C_CONTIGUOUS | PYBUF_FORMAT,
        )
    };
    if rc != 0 {
        // Not a buffer, or not contiguous: clear the BufferError/TypeError.
        drop(PyErr::take(obj.py()));
        return Ok(None);
    }
    // SAFETY: PyObject_GetBuffer succeeded, so the Py_buffer is initialised.
    let view = View(unsafe { raw.assume_init() });
    let format = if view.0.format.is_null() {
        "B" // PEP 3118: a NULL format means unsigned bytes
    } else {
        // SAFETY: a non-NULL format is a NUL-terminated string owned by the
        // exporter, valid until the view is released (after this use).
        unsafe { CStr::from_ptr(view.0.format) }
            .to_str()
            .unwrap_or("?")
    };
    let itemsize = usize::try_from(view.0.itemsize).unwrap_or(0);
    let items = parse_format(format, itemsize).ok_or_else(|| not_integers(what, format))?;
    let len = usize::try_from(view.0.len).unwrap_or(0);
    if len == 0 || view.0.buf.is_null() {
        return Ok(Some(Vec::new()));
    }
    // SAFETY: a C-contiguous view covers `len` readable bytes from `buf`,
    // valid until the view is released; the exporter's object is kept
    // alive by the view, and we hold the GIL, so no Python code mutates it
    // while we read (a buffer shared with another thread is the caller's
    // race, as with every C extension reading buffers).
    let bytes = unsafe { std::slice::from_raw_parts(view.0.buf.cast::<u8>(), len) };
    decode(bytes, items, what).map(Some)
}

/// Reads a buffer through `memoryview` (any layout, any CPython >= 3.9);
/// `None` when `obj` is not a buffer.
fn memoryview(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<Vec<u32>>> {
    let py = obj.py();
    let Ok(view) = py
        .import("builtins")
        .and_then(|b| b.getattr("memoryview"))
        .and_then(|m| m.call1((obj,)))
    else {
        return Ok(None);
    };
    let format: String = view.getattr("format")?.extract()?;
    let itemsize: usize = view.getattr("itemsize")?.extract()?;
    let items = parse_format(&format, itemsize).ok_or_else(|| not_integers(what, &format))?;
    let bytes = view.call_method0("tobytes")?;
    let bytes = bytes.downcast::<PyBytes>()?;
    decode(bytes.as_bytes(), items, what).map(Some)
}

/// Reading a list of exact `int`s straight from CPython's object layout:
/// about 1 ns a token where the stable-ABI calls cost 5 (a 4,096-token
/// prompt as a list: 4 µs instead of 20). The layout is not part of the
/// stable ABI, so it is used only after `probe` checked, at start-up, that
/// the running interpreter lays lists and ints out as read here (and gives
/// the same values as `PyLong_AsLong` on ints of every width we decode);
/// anything else uses the calls.
mod layout {
    use super::*;

    /// No layout confirmed: use the stable-ABI calls.
    pub const NONE: u8 = 0;
    /// CPython <= 3.11: `ob_size` (signed digit count) after the header.
    const SIZED: u8 = 1;
    /// CPython >= 3.12: `lv_tag` (`ndigits << 3 | sign`) after the header.
    const TAGGED: u8 = 2;

    /// Bytes of `PyObject_HEAD` (refcount, type) in a default build; the
    /// next word is `ob_size` (lists, ints <= 3.11) or `lv_tag` (ints >= 3.12).
    const HEAD: usize = 2 * std::mem::size_of::<usize>();
    /// Offset of a list's `ob_item` and of an int's first 30-bit digit.
    const BODY: usize = HEAD + std::mem::size_of::<usize>();

    /// Decodes the exact int at `item` as a `u32`; `None` when negative or
    /// wider than 32 bits.
    ///
    /// # Safety
    ///
    /// `item` points to a live exact `int` of an interpreter whose layout
    /// `probe` confirmed as `kind`, and the GIL is held.
    #[inline]
    unsafe fn decode(item: *const u8, kind: u8) -> Option<u32> {
        // SAFETY: per the contract, `item` is a live int laid out as `kind`:
        // the word at HEAD is its size or tag and its digits follow at BODY;
        // the second digit is read only when the size says it exists.
        unsafe {
            let word = item.add(HEAD).cast::<usize>().read();
            let digits = item.add(BODY).cast::<u32>();
            let n = if kind == SIZED {
                // Negative sizes are negative ints: out of range.
                word as isize
            } else {
                match word & 3 {
                    0 => (word >> 3) as isize,
                    1 => 0,
                    _ => return None,
                }
            };
            match n {
                0 => Some(0),
                1 => Some(digits.read()),
                2 => {
                    let high = digits.add(1).read();
                    (high < 4).then(|| digits.read() | high << 30)
                }
                _ => None,
            }
        }
    }

    /// The items of `list`, all exact ints below 2^32; `None` when one is
    /// not (the caller's other paths then read it and name the culprit).
    pub fn list_u32s(list: &Bound<'_, PyList>, kind: u8) -> Option<Vec<u32>> {
        let int_type = std::ptr::addr_of_mut!(ffi::PyLong_Type)
            .cast::<u8>()
            .cast_const();
        let len = list.len();
        let base = list.as_ptr().cast::<u8>().cast_const();
        // SAFETY: `probe` confirmed the list layout (`ob_item` at BODY),
        // and we hold the GIL and a reference to the list, so its item
        // array (at least `len` items) stays put while we read: decoding
        // ints runs no Python code.
        let items = unsafe { base.add(BODY).cast::<*const u8>().read() };
        let mut out = Vec::with_capacity(len);
        for i in 0..len {
            // SAFETY: `i < len` items of the array read above, each a live
            // object the list holds a reference to; its type is the word
            // after the refcount (every layout of PyObject_HEAD).
            let v = unsafe {
                let item = items.cast::<*const u8>().add(i).read();
                let ty = item
                    .add(std::mem::size_of::<usize>())
                    .cast::<*const u8>()
                    .read();
                if ty != int_type {
                    return None;
                }
                decode(item, kind)?
            };
            out.push(v);
        }
        Some(out)
    }

    /// Which layout the running interpreter has, checked on real objects:
    /// a list of ints of every width `decode` handles (and some it must
    /// refuse) must read back as `PyList_GetItem` and `PyLong_AsLong` say.
    pub fn probe(py: Python<'_>) -> u8 {
        let kind = match py.version_info() {
            v if v >= (3, 12) => TAGGED,
            _ => SIZED,
        };
        let Ok(info) = py.import("sys").and_then(|s| s.getattr("int_info")) else {
            return NONE;
        };
        let digit = |name: &str| info.getattr(name).and_then(|v| v.extract::<usize>()).ok();
        if digit("bits_per_digit") != Some(30) || digit("sizeof_digit") != Some(4) {
            return NONE;
        }
        let samples: [i128; 12] = [
            0,
            1,
            7,
            1 << 29,
            (1 << 30) - 1,
            1 << 30,
            (1 << 31) + 5,
            (1 << 32) - 1,
            1 << 32,
            -1,
            -(1 << 31),
            1 << 62,
        ];
        let Ok(list) = PyList::new(py, samples) else {
            return NONE;
        };
        let int_type = std::ptr::addr_of_mut!(ffi::PyLong_Type)
            .cast::<u8>()
            .cast_const();
        // SAFETY: a list we just made; `ob_item` is read only after the
        // list's size word agrees with its length (the layout read here).
        let items = unsafe {
            let base = list.as_ptr().cast::<u8>().cast_const();
            if base.add(HEAD).cast::<isize>().read() != samples.len() as isize {
                return NONE;
            }
            base.add(BODY).cast::<*const u8>().read()
        };
        for (i, &want) in samples.iter().enumerate() {
            let Ok(expected) = list.get_item(i) else {
                return NONE;
            };
            // SAFETY: `i` is below the length checked above; the item is
            // the list's (alive while `list` is). `decode` is called only
            // on an exact int, and only after the item pointer and type
            // agree with the stable-ABI view of the same object.
            let ok = unsafe {
                let item = items.cast::<*const u8>().add(i).read();
                let ty = item
                    .add(std::mem::size_of::<usize>())
                    .cast::<*const u8>()
                    .read();
                item == expected.as_ptr().cast::<u8>().cast_const()
                    && ty == int_type
                    && decode(item, kind) == u32::try_from(want).ok()
            };
            if !ok {
                return NONE;
            }
        }
        kind
    }
}
