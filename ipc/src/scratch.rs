//! Per-client byte region for payloads too large for a ring message
//! (token and page arrays). Every access is bounds- and overflow-checked;
//! reads copy out of shared memory once and never hand out a reference into
//! memory the peer can still write.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::copy::copy_bytes;

/// Errors of scratch access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScratchError {
    /// `offset + len` overflows or exceeds the region.
    OutOfBounds {
        /// Requested byte offset.
        offset: u64,
        /// Requested length in bytes (saturated on overflow).
        len: u64,
        /// Region size.
        size: u64,
    },
}

impl fmt::Display for ScratchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfBounds { offset, len, size } => {
                write!(
                    f,
                    "scratch access {offset}+{len} outside region of {size} bytes"
                )
            }
        }
    }
}

impl std::error::Error for ScratchError {}

/// A bounds-checked view of a byte region (usually in a segment).
#[derive(Clone, Copy, Debug)]
pub struct Scratch<'a> {
    base: NonNull<u8>,
    len: u64,
    _mem: PhantomData<&'a [u8]>,
}

// SAFETY: only raw, bounds-checked copies go through the pointer; the region
// is shared memory that other threads/processes may access concurrently by
// design (the caller's protocol orders those accesses).
unsafe impl Send for Scratch<'_> {}
// SAFETY: as above.
unsafe impl Sync for Scratch<'_> {}

impl<'a> Scratch<'a> {
    /// A view of `len` bytes at `base`.
    ///
    /// # Safety
    ///
    /// `base..base+len` must be valid for reads and writes for `'a`, and may
    /// only be accessed by other parties under a protocol that orders those
    /// accesses with ours (e.g. a ring message published after the write).
    pub unsafe fn from_raw(base: NonNull<u8>, len: u64) -> Self {
        Self {
            base,
            len,
            _mem: PhantomData,
        }
    }

    /// Region size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: u64, bytes: u64) -> Result<usize, ScratchError> {
        let oob = ScratchError::OutOfBounds {
            offset,
            len: bytes,
            size: self.len,
        };
        let end = offset.checked_add(bytes).ok_or(oob)?;
        if end > self.len {
            return Err(oob);
        }
        usize::try_from(offset).map_err(|_| oob)
    }

    /// Whether `len` bytes at `offset` lie inside the region.
    pub fn contains(&self, offset: u64, len: u64) -> Result<(), ScratchError> {
        self.check(offset, len).map(|_| ())
    }

    /// Copies `data` into the region at byte `offset`.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<(), ScratchError> {
        let at = self.check(offset, data.len() as u64)?;
        // SAFETY: `check` proved `offset + data.len() <= len`; source and
        // destination cannot overlap (`data` is private memory).
        unsafe { copy_bytes(data.as_ptr(), self.base.as_ptr().add(at), data.len()) };
        Ok(())
    }

    /// Copies `len` bytes at `offset` out into `out` (replacing its contents).
    pub fn read_bytes(&self, offset: u64, len: u64, out: &mut Vec<u8>) -> Result<(), ScratchError> {
        let at = self.check(offset, len)?;
        let n = usize::try_from(len).map_err(|_| ScratchError::OutOfBounds {
            offset,
            len,
            size: self.len,
        })?;
        out.clear();
        out.reserve(n);
        // SAFETY: source range checked above; `out` has capacity `n` and is
        // private, so no overlap; bytes are valid for any bit pattern.
        unsafe {
            copy_bytes(self.base.as_ptr().add(at), out.as_mut_ptr(), n);
            out.set_len(n);
        }
        Ok(())
    }

    /// Copies `data` (e.g. token ids) into the region at byte `offset`, in
    /// the host's byte order. The offset needs no alignment: words are
    /// copied as bytes.
    pub fn write_u32s(&self, offset: u64, data: &[u32]) -> Result<(), ScratchError> {
        let bytes = (data.len() as u64).saturating_mul(4);
        let at = self.check(offset, bytes)?;
        // SAFETY: range checked above (`bytes` is exactly the slice's size);
        // private source, no overlap.
        unsafe {
            copy_bytes(
                data.as_ptr().cast(),
                self.base.as_ptr().add(at),
                data.len() * 4,
            )
        };
        Ok(())
    }

    /// Copies `count` `u32`s (host byte order) at byte `offset`, aligned or
    /// not, out into `out` (replacing its contents). The caller validates
    /// the copied values afterwards.
    pub fn read_u32s(
        &self,
        offset: u64,
        count: u64,
        out: &mut Vec<u32>,
    ) -> Result<(), ScratchError> {
        let oob = ScratchError::OutOfBounds {
            offset,
            len: count.saturating_mul(4),
            size: self.len,
        };
        let bytes = count.checked_mul(4).ok_or(oob)?;
        let at = self.check(offset, bytes)?;
        let n = usize::try_from(count).map_err(|_| oob)?;
        out.clear();
        out.reserve(n);
        // SAFETY: source range checked above; `out` has capacity for `n`
        // words (`bytes` bytes), private; u32 accepts any bits.
        unsafe {
            copy_bytes(self.base.as_ptr().add(at), out.as_mut_ptr().cast(), n * 4);
            out.set_len(n);
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_unaligned_words() {
        let mut buf = vec![0u64; 16]; // 128 bytes, 8-aligned
        let ptr = NonNull::new(buf.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `buf` outlives `s` and is only used through it.
        let s = unsafe { Scratch::from_raw(ptr, 128) };
        s.write_u32s(8, &[1, 2, 3]).unwrap();
        let mut out = Vec::new();
        s.read_u32s(8, 3, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        // Words at an odd offset read back as written.
        s.write_u32s(33, &[0xdead_beef, 7]).unwrap();
        s.read_u32s(33, 2, &mut out).unwrap();
        assert_eq!(out, [0xdead_beef, 7]);
        assert!(matches!(
            s.read_u32s(124, 2, &mut out),
            Err(ScratchError::OutOfBounds { .. })
        ));
        assert!(matches!(
            s.read_u32s(4, u64::MAX, &mut out),
            Err(ScratchError::OutOfBounds { .. })
        ));
        assert!(matches!(
            s.read_bytes(u64::MAX, 2, &mut Vec::new()),
            Err(ScratchError::OutOfBounds { .. })
        ));
        s.write_bytes(127, &[9]).unwrap();
        assert!(s.write_bytes(127, &[9, 9]).is_err());
        drop(buf);
    }
}
