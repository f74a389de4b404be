//! The node-wide KV store's own code behind the [`Policy`] interface, as
//! an SGLang HiCache backend drives it: `batch_exists` of the request's
//! blocks (the hit is the leading run), `get` of the hits (which stamps
//! their use), then `set` of the rest, each block under the one before it.
//! The store runs on a heap region with one entry per block of capacity
//! (64-byte values), so capacity in blocks is exact.

use super::policy::Policy;
use super::ReplayError;
use crate::store::{HeapStore, StoreConfig, StoreItem, StoreNs};

/// Bytes per replayed value (the smallest slot).
const VALUE: usize = 64;
/// Bytes per extent (1024 slots).
const EXTENT: u64 = 64 << 10;
/// Blocks stored per reserve (a request longer than the store still
/// stores its last blocks).
const CHUNK: usize = 16;

/// See the module docs.
pub struct Store {
    store: HeapStore,
    ns: StoreNs,
    keys: Vec<[u8; 8]>,
    value: Vec<u8>,
    out: Vec<u8>,
    capacity: usize,
}

impl Store {
    /// An empty store of `capacity` blocks.
    pub fn new(capacity: usize) -> Result<Self, ReplayError> {
        let too_large = || ReplayError::CapacityTooLarge {
            capacity,
            max: crate::store::layout::MAX_ENTRIES as usize,
        };
        let entries = u32::try_from(capacity).map_err(|_| too_large())?;
        let slots_per_extent = EXTENT / VALUE as u64;
        let extents = (capacity as u64).div_ceil(slots_per_extent);
        let mut store = HeapStore::new(StoreConfig {
            data_bytes: extents * EXTENT,
            extent_bytes: EXTENT,
            entries,
            clients: 1,
        })
        .map_err(|_| too_large())?;
        let ns = store
            .index
            .namespace(b"replay", VALUE as u64)
            .map_err(|e| ReplayError::Components(e.to_string()))?;
        Ok(Self {
            store,
            ns,
            keys: Vec::new(),
            value: vec![0; VALUE],
            out: vec![0; VALUE],
            capacity,
        })
    }
}

impl Policy for Store {
    fn name(&self) -> &'static str {
        "store"
    }

    fn request(&mut self, blocks: &[u64]) -> usize {
        self.keys.clear();
        self.keys.extend(blocks.iter().map(|b| b.to_le_bytes()));
        let keys: Vec<&[u8]> = self.keys.iter().map(|k| &k[..]).collect();
        let k = self.store.reader.run(self.ns, &keys);
        for key in &keys[..k] {
            self.store.get(self.ns, key, &mut self.out);
        }
        let mut at = k;
        while at < keys.len() {
            let end = (at + CHUNK).min(keys.len());
            let items: Vec<StoreItem<'_>> = (at..end)
                .map(|i| StoreItem {
                    key: keys[i],
                    parent: i.checked_sub(1).map(|p| keys[p]),
                    value: &self.value,
                })
                .collect();
            // A chunk the store cannot hold (longer than its room) is
            // stored in part by the later chunks.
            let _ = self.store.put(self.ns, &items);
            at = end;
        }
        k
    }

    fn resident_blocks(&self) -> usize {
        (self.store.index.figures().values as usize).min(self.capacity)
    }
}
