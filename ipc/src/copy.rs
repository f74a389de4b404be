//! Copies that stay fast whatever the addresses.
//!
//! On AVX2 machines glibc copies 4 KiB and more with `rep movsb`, which on
//! some cores (AMD Zen here) slows down about 25× when the destination lies
//! 1 to 63 bytes past the source modulo 4 KiB: a 4 KiB copy then takes
//! 1.4 µs instead of 55 ns. Heap and payload addresses fall into that
//! relation by chance, so a 1K-token prompt would cost a whole round trip
//! extra now and then. Copies below the threshold take glibc's vector loop,
//! which has no such cliff, so these helpers copy in chunks under it.

/// Bytes per chunk: half of glibc's smallest `rep movsb` threshold, so the
/// chunks stay on the vector path under any tuning of it.
pub const CHUNK: usize = 2048;

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
///
/// As for [`core::ptr::copy_nonoverlapping`]: `src` valid for reads and
/// `dst` valid for writes of `len` bytes, and the two ranges disjoint.
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    let mut done = 0;
    while done < len {
        // A variable length keeps the compiler from fusing the loop back
        // into one large `memcpy`.
        let n = (len - done).min(CHUNK);
        // SAFETY: `done + n <= len`, so both ranges stay inside what the
        // caller vouched for.
        unsafe { core::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
        done += n;
    }
}

/// Copies `len` bytes from `src` to `dst` for bulk data (values of
/// kilobytes to megabytes): one `memcpy` when the two addresses lie outside
/// the slow relation (destination 1 to 63 bytes past the source modulo
/// 4 KiB), so glibc's fastest path for the size runs; [`copy_bytes`]'s
/// chunks otherwise.
///
/// # Safety
///
/// As for [`copy_bytes`].
pub unsafe fn copy_bulk(src: *const u8, dst: *mut u8, len: usize) {
    let skew = (dst as usize).wrapping_sub(src as usize) % 4096;
    if (1..64).contains(&skew) {
        // SAFETY: forwarded from the caller.
        unsafe { copy_bytes(src, dst, len) }
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// `src.to_vec()`, chunked.
pub fn to_vec<T: Copy>(src: &[T]) -> Vec<T> {
    let per = (CHUNK / core::mem::size_of::<T>().max(1)).max(1);
    let mut out = Vec::with_capacity(src.len());
    for s in src.chunks(per) {
        out.extend_from_slice(s);
    }
    out
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_around_the_chunk_edges() {
        let src: Vec<u8> = (0..3 * CHUNK + 7).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 7] {
            for skew in [0, 1, 8, 63] {
                let mut dst = vec![0u8; len + skew];
                // SAFETY: `dst[skew..]` has room for `len` bytes; the two
                // vectors are distinct.
                unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr().add(skew), len) };
                assert_eq!(&dst[skew..], &src[..len]);
                assert!(dst[..skew].iter().all(|&b| b == 0), "wrote before dst");
            }
        }
        for skew in [0, 1, 63, 64, 4095] {
            let mut dst = vec![0u8; src.len() + skew];
            // SAFETY: as above.
            unsafe { copy_bulk(src.as_ptr(), dst.as_mut_ptr().add(skew), src.len()) };
            assert_eq!(&dst[skew..], &src[..]);
        }
        let words: Vec<u32> = (0..5000).collect();
        assert_eq!(to_vec(&words), words);
        assert_eq!(to_vec::<()>(&[(); 3]).len(), 3);
    }
}
