//! The map of the engine's lock tables (`Engine::locks`, `Engine::serials`)
//! and its hasher: their `(client, node)` keys are two small integers the
//! engine chose, looked up on every lock and unlock.

/// The lock tables' map: `(client, node)` keys (a `ClientId` and a node
/// index) hashed by [`PairHash`].
pub(super) type LockMap<V> = std::collections::HashMap<(u32, u32), V, PairHash>;

/// Hashes the lock tables' `(client, node)` keys with one multiply per word
/// instead of SipHash, whose rounds were most of an `unlock`'s work (about
/// 400 of 700 instructions, under callgrind). SipHash's defence against
/// chosen keys is not needed here: a node index is the arena's choice, not
/// the client's, and a client slot is one of a few.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PairHash;

impl std::hash::BuildHasher for PairHash {
    type Hasher = PairHasher;

    fn build_hasher(&self) -> PairHasher {
        PairHasher(0)
    }
}

/// The [`PairHash`] state: each word folded in by rotate, xor and an odd
/// multiply (the golden ratio's), the high half folded into the low at the
/// end (the map picks buckets by the low bits and tags by the top ones).
#[derive(Clone, Copy, Debug)]
pub(super) struct PairHasher(u64);

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl PairHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(GOLDEN);
    }
}

impl std::hash::Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::PairHash;

    /// Keys that differ in one word, low or high bits, land in different
    /// buckets (the low bits) and carry different tags (the top 7 bits):
    /// a hash that ignored a word, or left one unmixed, would crowd them.
    #[test]
    fn pair_hashes_spread_over_buckets_and_tags() {
        let mut buckets = std::collections::HashSet::new();
        let mut tags = std::collections::HashSet::new();
        for client in 0..16u32 {
            for node in (0..64u32).chain((1..64).map(|i| i << 20)) {
                let h = PairHash.hash_one((client, node));
                buckets.insert(h & 0xfff);
                tags.insert(h >> 57);
            }
        }
        // 2,032 keys over 4,096 buckets: a good hash fills about 1,600.
        assert!(buckets.len() > 1_400, "{} buckets", buckets.len());
        assert_eq!(tags.len(), 128, "{} tags", tags.len());
    }
}
