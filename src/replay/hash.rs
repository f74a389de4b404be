//! A fast hasher for `u64` block ids.
//!
//! The map lookups dominate replay time and the keys are not attacker
//! controlled (they come from a trace the operator chose), so SipHash's DoS
//! resistance buys nothing here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// `HashMap` keyed by block id with [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Builds an empty [`IdMap`] sized for `capacity` entries.
pub(crate) fn id_map<V>(capacity: usize) -> IdMap<V> {
    IdMap::with_capacity_and_hasher(capacity, BuildHasherDefault::default())
}

/// Multiply-fold hasher: one 64×64→128 multiply, high and low halves xored.
///
/// Block ids are often small sequential integers; the fold spreads them over
/// both the low bits (bucket index) and the high bits (hashbrown's tag byte).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher {
    state: u64,
}

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-u64 keys; keep it correct, not fast.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        let product = u128::from(self.state ^ n) * u128::from(MULTIPLIER);
        self.state = (product as u64) ^ ((product >> 64) as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_ids_spread_over_high_and_low_bits() {
        let hashes: Vec<u64> = (0..256u64)
            .map(|n| {
                let mut h = IdHasher::default();
                h.write_u64(n);
                h.finish()
            })
            .collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0xff).collect();
        let high: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        // 256 keys into 256 low buckets / 128 tags: a decent mixer fills most.
        assert!(low.len() > 128, "low bits poorly mixed: {}", low.len());
        assert!(high.len() > 64, "high bits poorly mixed: {}", high.len());
    }
}
