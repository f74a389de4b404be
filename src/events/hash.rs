//! Block hashes: one per page, chained from the root, so a page's hash
//! names every token before it.
//!
//! Two schemes, each as the router that consumes it computes hashes from a
//! prompt:
//!
//! - [`Scheme::Xxh3`], NVIDIA Dynamo's KV router (crates `dynamo-kv-router`
//!   / `dynamo-tokens`, `compute_block_hash_for_seq` and
//!   `compute_seq_hash_for_block` in `lib/kv-router/src/protocols.rs`, and
//!   `lib/llm/src/kv_router/protocols.rs` before it): a page's local hash
//!   is `xxh3_64(seed 1337)` of its tokens as little-endian `u32`s; the first
//!   page's sequence hash is its local hash, each next one is
//!   `xxh3_64(seed 1337)` of the parent's sequence hash then the local hash,
//!   each as 8 little-endian bytes. The sequence hash is what is emitted.
//! - [`Scheme::Sha256Cbor`], vLLM's `sha256_cbor` prefix-cache hashing
//!   (`vllm/utils/hashing.py` `sha256_cbor`, and `hash_block_tokens`,
//!   `init_none_hash`, `maybe_convert_block_hash` in
//!   `vllm/v1/core/kv_cache_utils.py`), which llm-d's KV-cache indexer
//!   recomputes: a page's hash is `sha256(cbor((parent, tuple(tokens),
//!   None)))`, with `parent` the previous page's 32-byte hash, or at the root
//!   `NONE_HASH = sha256(cbor(PYTHONHASHSEED))` (the seed as a text string).
//!   vLLM emits it to external consumers (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`
//!   defaults to 1) as `int.from_bytes(hash, "big") & (2**64 - 1)`: the
//!   last 8 bytes, big-endian.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of Dynamo's XXH3 block hashing (`XXH3_SEED` in `dynamo-kv-router`).
pub const XXH3_SEED: u64 = 1337;

/// A page's full chained hash: the 32-byte SHA-256 digest, or the XXH3
/// sequence hash in the first 8 bytes (little-endian), the rest zero.
pub type FullHash = [u8; 32];

/// How block hashes are computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Dynamo's chained XXH3-64, seed 1337.
    Xxh3,
    /// vLLM's `sha256_cbor`, rooted at `sha256(cbor(seed))`.
    Sha256Cbor {
        /// vLLM's `NONE_HASH` for the configured `PYTHONHASHSEED`.
        none_hash: FullHash,
    },
}

/// A `--kv-events-hash` value that names no scheme.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownScheme(pub String);

impl fmt::Display for UnknownScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown block hash scheme {:?} (expected xxh3 or sha256-cbor)",
            self.0
        )
    }
}

impl std::error::Error for UnknownScheme {}

/// The name of a scheme on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchemeName {
    /// `xxh3` (the default).
    #[default]
    Xxh3,
    /// `sha256-cbor`.
    Sha256Cbor,
}

impl FromStr for SchemeName {
    type Err = UnknownScheme;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "xxh3" => Ok(Self::Xxh3),
            "sha256-cbor" | "sha256_cbor" => Ok(Self::Sha256Cbor),
            other => Err(UnknownScheme(other.into())),
        }
    }
}

impl fmt::Display for SchemeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Xxh3 => "xxh3",
            Self::Sha256Cbor => "sha256-cbor",
        })
    }
}

impl Scheme {
    /// The scheme `name`; `seed` is vLLM's `PYTHONHASHSEED` (sha256-cbor only).
    pub fn new(name: SchemeName, seed: &str) -> Self {
        match name {
            SchemeName::Xxh3 => Self::Xxh3,
            SchemeName::Sha256Cbor => {
                let mut cbor = Vec::with_capacity(seed.len() + 9);
                cbor_head(&mut cbor, 3, seed.len() as u64);
                cbor.extend_from_slice(seed.as_bytes());
                Self::Sha256Cbor {
                    none_hash: Sha256::digest(&cbor).into(),
                }
            }
        }
    }

    /// The full hash of the page holding `tokens` after the page whose full
    /// hash is `parent` (`None`: the first page). `buf` is scratch.
    pub fn block(&self, parent: Option<&FullHash>, tokens: &[u32], buf: &mut Vec<u8>) -> FullHash {
        buf.clear();
        match self {
            Self::Xxh3 => {
                let local = xxh3_local(tokens, buf);
                let seq = match parent {
                    None => local,
                    Some(p) => {
                        let mut eight = [0u8; 8];
                        eight.copy_from_slice(&p[..8]);
                        xxh3_chain(u64::from_le_bytes(eight), local)
                    }
                };
                xxh3_full(seq)
            }
            Self::Sha256Cbor { none_hash } => {
                // cbor2.dumps((parent, tuple(tokens), None), canonical=True):
                // an array of 3, a byte string of 32, an array of unsigned
                // integers (shortest form), null.
                buf.push(0x83);
                cbor_head(buf, 2, 32);
                buf.extend_from_slice(parent.unwrap_or(none_hash));
                cbor_head(buf, 4, tokens.len() as u64);
                for &t in tokens {
                    cbor_head(buf, 0, u64::from(t));
                }
                buf.push(0xf6);
                Sha256::digest(&buf[..]).into()
            }
        }
    }

    /// The full hash a namespace's first pages chain from, in place of
    /// none (radixd's own rule; a namespace is not a vLLM notion): the
    /// XXH3 hash of `"radixd-namespace\0" ++ name` as a sequence hash, or
    /// the SHA-256 of the same bytes in place of `NONE_HASH`. So the same
    /// tokens hash differently in every namespace, and a router given the
    /// same seed computes a namespaced prompt's hashes with
    /// [`Scheme::prompt_from`].
    pub fn namespace_root(&self, name: &str) -> FullHash {
        let mut bytes = b"radixd-namespace\0".to_vec();
        bytes.extend_from_slice(name.as_bytes());
        match self {
            Self::Xxh3 => xxh3_full(xxh3_64_with_seed(&bytes, XXH3_SEED)),
            Self::Sha256Cbor { .. } => Sha256::digest(&bytes).into(),
        }
    }

    /// The hash as it goes out in events: the XXH3 sequence hash, or the
    /// last 8 bytes of the SHA-256 digest read big-endian (vLLM's
    /// `maybe_convert_block_hash`).
    pub fn external(&self, full: &FullHash) -> u64 {
        let mut eight = [0u8; 8];
        match self {
            Self::Xxh3 => {
                eight.copy_from_slice(&full[..8]);
                u64::from_le_bytes(eight)
            }
            Self::Sha256Cbor { .. } => {
                eight.copy_from_slice(&full[24..]);
                u64::from_be_bytes(eight)
            }
        }
    }

    /// External hashes of every whole page of `tokens` (`page_size` each)
    /// from the root: what a router computes from a prompt.
    pub fn prompt(&self, tokens: &[u32], page_size: usize) -> Vec<u64> {
        self.prompt_from(None, tokens, page_size)
    }

    /// [`Scheme::prompt`] from `root` ([`Scheme::namespace_root`] of a
    /// namespace; `None`: the default one).
    pub fn prompt_from(
        &self,
        root: Option<FullHash>,
        tokens: &[u32],
        page_size: usize,
    ) -> Vec<u64> {
        let mut buf = Vec::new();
        let mut parent = root;
        tokens
            .chunks_exact(page_size.max(1))
            .map(|page| {
                let full = self.block(parent.as_ref(), page, &mut buf);
                parent = Some(full);
                self.external(&full)
            })
            .collect()
    }
}

/// Dynamo's local hash of one block (`compute_block_hash_for_seq`):
/// `xxh3_64(seed 1337)` of its tokens as little-endian `u32`s. `buf` is
/// scratch (used on big-endian machines only).
#[inline]
pub fn xxh3_local(tokens: &[u32], buf: &mut Vec<u8>) -> u64 {
    xxh3_64_with_seed(le_bytes(tokens, buf), XXH3_SEED)
}

/// Dynamo's sequence hash of a block after the block whose sequence hash is
/// `parent` (`compute_next_seq_hash`): `xxh3_64(seed 1337)` of both as 8
/// little-endian bytes each.
#[inline]
pub fn xxh3_chain(parent: u64, local: u64) -> u64 {
    let mut both = [0u8; 16];
    both[..8].copy_from_slice(&parent.to_le_bytes());
    both[8..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&both, XXH3_SEED)
}

/// The [`FullHash`] of an XXH3 sequence hash.
#[inline]
pub fn xxh3_full(seq: u64) -> FullHash {
    let mut full = [0u8; 32];
    full[..8].copy_from_slice(&seq.to_le_bytes());
    full
}

/// `tokens` as little-endian bytes: the tokens' own memory on a
/// little-endian machine (as Dynamo hashes them), a copy into `buf`
/// elsewhere.
#[cfg(target_endian = "little")]
fn le_bytes<'a>(tokens: &'a [u32], _buf: &'a mut Vec<u8>) -> &'a [u8] {
    // SAFETY: a `u32` slice is `4 * len` initialised bytes, aligned for
    // `u8`, borrowed for as long as `tokens`; on a little-endian machine
    // they are exactly the tokens' little-endian encodings.
    unsafe {
        std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
    }
}

#[cfg(not(target_endian = "little"))]
fn le_bytes<'a>(tokens: &'a [u32], buf: &'a mut Vec<u8>) -> &'a [u8] {
    buf.clear();
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    buf
}

/// A CBOR head: major type `major`, argument `n`, shortest form (RFC 8949
/// §3; what `cbor2` writes for every integer and length).
fn cbor_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n <= 0xff {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n <= 0xffff {
        out.push(m | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= 0xffff_ffff {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xxh3_chain_matches_its_definition() {
        let s = Scheme::Xxh3;
        let tokens: Vec<u32> = (1..=8).collect();
        let h = s.prompt(&tokens, 4);
        let bytes = |t: &[u32]| t.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let l0 = xxh3_64_with_seed(&bytes(&tokens[..4]), 1337);
        let l1 = xxh3_64_with_seed(&bytes(&tokens[4..]), 1337);
        let mut both = l0.to_le_bytes().to_vec();
        both.extend_from_slice(&l1.to_le_bytes());
        assert_eq!(h, vec![l0, xxh3_64_with_seed(&both, 1337)]);
    }

    #[test]
    fn cbor_heads_are_shortest() {
        let mut v = Vec::new();
        for n in [0u64, 23, 24, 255, 256, 65535, 65536, 1 << 32] {
            cbor_head(&mut v, 0, n);
        }
        assert_eq!(
            v,
            [
                0x00, 0x17, 0x18, 24, 0x18, 255, 0x19, 1, 0, 0x19, 255, 255, 0x1a, 0, 1, 0, 0,
                0x1b, 0, 0, 0, 1, 0, 0, 0, 0
            ]
        );
    }
}
