//! Marker traits and the offset type for data placed in shared memory.

use core::fmt;
use core::marker::PhantomData;

/// A `Copy` type for which every bit pattern is a valid value.
///
/// Messages and payloads read out of shared memory must be `Plain`: a peer
/// can write anything there, so reading a `bool`, an enum or a reference
/// could produce an invalid value (undefined behaviour).
///
/// # Safety
///
/// Implementors must be `#[repr(C)]` (or primitive) with no padding-dependent
/// invariants, no pointers, references, `bool`s, `char`s or enums, and every
/// bit pattern of `size_of::<Self>()` bytes must be a valid value.
pub unsafe trait Plain: Copy + Send + 'static {}

macro_rules! plain {
    ($($t:ty),*) => { $(
        // SAFETY: primitive integers accept every bit pattern.
        unsafe impl Plain for $t {}
    )* };
}
plain!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

// SAFETY: an array of `Plain` values has no padding and accepts every bit
// pattern element-wise.
unsafe impl<T: Plain, const N: usize> Plain for [T; N] {}

/// A type that may be viewed through `&Self` while another process writes the
/// same memory: every field is an atomic or an `UnsafeCell` over `Plain` data,
/// and every bit pattern is valid.
///
/// # Safety
///
/// Implementors must be `#[repr(C)]` (or transparent), contain only atomics,
/// `UnsafeCell<P: Plain>` or padding-free arrays of those, and accept every
/// bit pattern (all zero in particular, which is what a fresh segment holds).
pub unsafe trait ShmSafe {}

#[cfg(not(loom))]
mod impls {
    use super::{Plain, ShmSafe};
    use crate::sync::{AtomicU32, AtomicU64, UnsafeCell};

    // SAFETY: std atomics have the layout of their integer and accept every
    // bit pattern; access is atomic.
    unsafe impl ShmSafe for AtomicU32 {}
    // SAFETY: as above.
    unsafe impl ShmSafe for AtomicU64 {}
    // SAFETY: `UnsafeCell` is `repr(transparent)` over a `Plain` value; all
    // access goes through raw pointers under a protocol (e.g. the ring's).
    unsafe impl<T: Plain> ShmSafe for UnsafeCell<T> {}
}

/// A byte offset from the start of a segment to a `T`.
///
/// Stored inside shared structs instead of a pointer: it means the same in
/// every process. Resolving it (`Segment::get`) checks bounds and alignment,
/// so a garbage offset written by a peer yields an error, not a wild pointer.
#[repr(transparent)]
pub struct Offset<T> {
    raw: u64,
    _type: PhantomData<fn() -> T>,
}

impl<T> Offset<T> {
    /// An offset of `raw` bytes from the segment start.
    pub const fn new(raw: u64) -> Self {
        Self {
            raw,
            _type: PhantomData,
        }
    }

    /// The raw byte offset.
    pub const fn get(self) -> u64 {
        self.raw
    }

    /// The offset of element `index` of an array of `T` starting here, or
    /// `None` on overflow.
    pub fn index(self, index: u64) -> Option<Self> {
        let step = u64::try_from(size_of::<T>()).ok()?;
        let delta = step.checked_mul(index)?;
        Some(Self::new(self.raw.checked_add(delta)?))
    }

    /// The same offset viewed as pointing to a `U`.
    pub const fn cast<U>(self) -> Offset<U> {
        Offset::new(self.raw)
    }
}

impl<T> Clone for Offset<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Offset<T> {}
impl<T> PartialEq for Offset<T> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl<T> Eq for Offset<T> {}
impl<T> fmt::Debug for Offset<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Offset({:#x})", self.raw)
    }
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<Offset<u64>>() == 8);
