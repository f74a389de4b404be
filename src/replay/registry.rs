//! The replay policies by name.

use super::lfu::Lfu;
use super::lru::Lru;
use super::lru_leaf::LruLeaf;
use super::policy::Policy;
use super::radix::Radix;
use super::s3fifo::S3Fifo;
use super::store::Store;
use super::ReplayError;

/// Policy names [`make_policy`] knows, in the order they are documented.
pub const POLICY_NAMES: [&str; 6] = ["lru", "lfu", "s3fifo", "radix", "lru-leaf", "store"];

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
        "lru-leaf" => Ok(Box::new(LruLeaf::new(capacity))),
        "store" => Ok(Box::new(Store::new(capacity)?)),
        _ => Err(ReplayError::UnknownPolicy {
            name: name.to_owned(),
        }),
    }
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
