//! The policy interface the replay driver runs, and the factory by name.

use super::lfu::Lfu;
use super::lru::Lru;
use super::radix::Radix;
use super::s3fifo::S3Fifo;
use super::ReplayError;

/// A cache policy replayed one request at a time.
pub trait Policy {
    /// The policy's name as printed in the `policy` output field.
    fn name(&self) -> &'static str;

    /// Handles one request whose prompt is `blocks`: returns the prefix hit
    /// `k` (how many leading blocks were resident on arrival) and updates the
    /// cache state for the whole request.
    fn request(&mut self, blocks: &[u64]) -> usize;

    /// Blocks resident now; never more than the capacity.
    fn resident_blocks(&self) -> usize;
}

/// Policy names [`make_policy`] knows, in the order they are documented.
pub const POLICY_NAMES: [&str; 4] = ["lru", "lfu", "s3fifo", "radix"];

/// The largest capacity accepted: slab nodes are `u32` indices and S3-FIFO
/// holds up to one ghost per resident block.
pub const MAX_CAPACITY: usize = (u32::MAX / 2 - 1) as usize;

/// Builds the policy called `name` with room for `capacity` blocks.
pub fn make_policy(name: &str, capacity: usize) -> Result<Box<dyn Policy>, ReplayError> {
    if capacity == 0 {
        return Err(ReplayError::ZeroCapacity);
    }
    if capacity > MAX_CAPACITY {
        return Err(ReplayError::CapacityTooLarge {
            capacity,
            max: MAX_CAPACITY,
        });
    }
    match name {
        "lru" => Ok(Box::new(Lru::new(capacity))),
        "lfu" => Ok(Box::new(Lfu::new(capacity))),
        "s3fifo" => Ok(Box::new(S3Fifo::new(capacity)?)),
        "radix" => Ok(Box::new(Radix::new(capacity)?)),
        _ => Err(ReplayError::UnknownPolicy {
            name: name.to_owned(),
        }),
    }
}

/// A cache of individual blocks with no notion of prefixes; [`flat_request`]
/// turns one into a [`Policy`].
pub(crate) trait FlatCache {
    /// Whether `id` is resident; changes no state.
    fn contains(&self, id: u64) -> bool;
    /// Touches `id`: a hit updates its state, a miss admits it (and may evict).
    fn access(&mut self, id: u64);
}

/// Prefix scan first (read-only, stops at the first miss), then every block
/// of the request is accessed in order, hit or miss.
pub(crate) fn flat_request<C: FlatCache>(cache: &mut C, blocks: &[u64]) -> usize {
    let k = blocks.iter().take_while(|&&id| cache.contains(id)).count();
    for &id in blocks {
        cache.access(id);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factory_errors() {
        assert!(matches!(
            make_policy("lru", 0),
            Err(ReplayError::ZeroCapacity)
        ));
        assert!(matches!(
            make_policy("arc", 10),
            Err(ReplayError::UnknownPolicy { .. })
        ));
        assert!(matches!(
            make_policy("radix", 1 << 31),
            Err(ReplayError::CapacityTooLarge { .. })
        ));
        assert!(matches!(
            make_policy("lfu", MAX_CAPACITY + 1),
            Err(ReplayError::CapacityTooLarge { .. })
        ));
        for name in POLICY_NAMES {
            assert_eq!(make_policy(name, 10).map(|p| p.name()).ok(), Some(name));
        }
    }
}
