//! The node store's values as KV events: what block hash a store key
//! stands for (docs/kv-events.md, "The store's events").
//!
//! The store keeps no tokens, only the keys its clients chose, so a value's
//! block hash is derived from its key alone, in the form the key's writer
//! already hashes blocks in:
//!
//! - **vLLM's `OffloadKey` in hex** (72 hex digits: a 32-byte block hash,
//!   then the KV cache group index as 4 big-endian bytes; what
//!   `radixd.vllm.RadixdTier` stores): the block hash as vLLM emits it in
//!   its own events (`maybe_convert_block_hash`:
//!   `int.from_bytes(hash, "big") & (2**64 - 1)`, the hash's last 8 bytes
//!   read big-endian), and the group index as `group_idx`. It names the
//!   chunk's last block, as vLLM's `OffloadingConnector` names it.
//! - **Any other digest in hex** (an even number of hex digits, at least
//!   16: SGLang's HiCache keys are 64-digit SHA-256 hex): the digest's last
//!   8 bytes read big-endian, the same convention.
//! - **Anything else**: XXH3-64 (seed 0) of the key's bytes.
//!
//! A value's parent is the value it was stored after (the store's own
//! parent link), so `parent_block_hash` is its parent key's hash.

use xxhash_rust::xxh3::xxh3_64;

/// vLLM's medium of a CPU tier (`Medium.CPU`): every store event's.
pub const MEDIUM_STORE: &str = "CPU";

/// Hex digits of a vLLM `OffloadKey` in hex: 32 + 4 bytes.
const OFFLOAD_KEY_HEX: usize = 72;

/// What a store key stands for in KV events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreBlock {
    /// The block hash emitted.
    pub hash: u64,
    /// vLLM's KV cache group index, for an `OffloadKey`.
    pub group_idx: Option<u32>,
}

/// The value of one hex digit.
fn nibble(c: u8) -> Option<u64> {
    (c as char).to_digit(16).map(u64::from)
}

/// `hex` (exactly 16 digits) read as a big-endian integer.
fn be_hex(hex: &[u8]) -> Option<u64> {
    hex.iter()
        .try_fold(0u64, |acc, &c| Some(acc << 4 | nibble(c)?))
}

/// The block hash and group of the value stored under `key`.
pub fn store_block(key: &[u8]) -> StoreBlock {
    let digest = key.len() >= 16 && key.len() % 2 == 0 && key.iter().all(|&c| nibble(c).is_some());
    if !digest {
        return StoreBlock {
            hash: xxh3_64(key),
            group_idx: None,
        };
    }
    if key.len() == OFFLOAD_KEY_HEX {
        // Bytes 24..32 of the block hash, then the group's 4 bytes.
        let (hash, group) = (&key[48..64], &key[64..72]);
        if let (Some(hash), Some(group)) = (be_hex(hash), be_hex(group)) {
            return StoreBlock {
                hash,
                group_idx: u32::try_from(group).ok(),
            };
        }
    }
    StoreBlock {
        hash: be_hex(&key[key.len() - 16..]).unwrap_or_else(|| xxh3_64(key)),
        group_idx: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_block_hashes() {
        // vLLM: block hash bytes 0..32 = 0x00..0x1f, group 3.
        let hash: Vec<u8> = (0u8..32).collect();
        let mut key = hash.clone();
        key.extend_from_slice(&3u32.to_be_bytes());
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        let b = store_block(hex.as_bytes());
        assert_eq!(b.hash, u64::from_be_bytes(hash[24..32].try_into().unwrap()));
        assert_eq!(b.group_idx, Some(3));
        // Upper-case hex reads the same.
        assert_eq!(store_block(hex.to_uppercase().as_bytes()), b);
        // SGLang's 64-digit SHA-256 hex: its last 8 bytes.
        let sg: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        let s = store_block(sg.as_bytes());
        assert_eq!(s.hash, b.hash);
        assert_eq!(s.group_idx, None);
        // Anything else: XXH3 of the bytes.
        for other in [
            &b"k1"[..],
            b"0123456789abcde",
            b"0123456789abcdefg",
            b"zz23456789abcdef",
        ] {
            assert_eq!(
                store_block(other),
                StoreBlock {
                    hash: xxh3_64(other),
                    group_idx: None
                },
                "{other:?}"
            );
        }
    }
}
