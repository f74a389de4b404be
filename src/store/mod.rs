//! The node-wide KV store: values of a fixed size per namespace (a page's
//! K and V over all layers), keyed by page keys, in one shared-memory file
//! that every process on the node maps and that outlives the daemon
//! (docs/store.md).
//!
//! - [`layout`]: the file's `#[repr(C)]` records and where each lies;
//! - [`view`]: typed access to a mapped store;
//! - [`reader`]: [`StoreReader`], the lock-free `exists`/`run`/`get` any
//!   process runs inside its reader announcement;
//! - [`index`]: [`StoreIndex`], the daemon's writer: reserve, commit,
//!   abort, eviction (least recently used leaves first), limbo, and the
//!   adoption of a file a previous daemon left;
//! - [`mod@file`]: creating, adopting and mapping the file;
//! - [`error`]: [`StoreError`], [`AdoptError`].
//!
//! The store knows nothing of the radix tree, of rings or of the wire: the
//! daemon and the client wire it up.

pub mod error;
// Files and mappings need real shared memory: not under loom, whose models
// run the index and the reader over a `view::LoomStore`.
#[cfg(not(loom))]
pub mod file;
pub mod index;
pub mod layout;
pub mod reader;
pub mod view;

pub use error::{AdoptError, StoreError};
#[cfg(not(loom))]
pub use file::{HeapStore, OpenStoreError, StoreFile, StoreMap};
pub use index::{owner, Figures, StoreEvent, StoreIndex};
pub use layout::{parse_size, StoreConfig, StoreLayout, MAX_KEY};
pub use reader::StoreReader;
#[cfg(loom)]
pub use view::LoomStore;
pub use view::StoreView;

/// A registered namespace: its id and its values' size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoreNs {
    pub id: u32,
    pub value_size: u64,
}

impl StoreNs {
    /// The namespace's id (what `exec` and the Python binding hand out).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Bytes of each of its values.
    pub fn value_size(&self) -> u64 {
        self.value_size
    }
}

/// A reserved slot: the entry that will hold the value (and its
/// generation, so a stale slot is refused) and where the value's bytes go,
/// as an offset into the data region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoreSlot {
    pub index: u32,
    pub generation: u32,
    pub offset: u64,
}

/// One value to store.
#[derive(Clone, Copy, Debug)]
pub struct StoreItem<'a> {
    pub key: &'a [u8],
    /// The key of the value before it (a page's predecessor).
    pub parent: Option<&'a [u8]>,
    pub value: &'a [u8],
}

/// The store's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Values committed.
    pub values: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes of the data region.
    pub capacity_bytes: u64,
    /// Namespaces registered.
    pub namespaces: u64,
    /// Gets that found their key, and that did not (every client's).
    pub hits: u64,
    pub misses: u64,
    /// The calling client's own hits and misses, counted since its claim
    /// of its slot (a client reusing a slot starts from zero).
    pub client_hits: u64,
    pub client_misses: u64,
    /// Values evicted.
    pub evicted: u64,
    /// Reserves refused for want of room.
    pub failed_reserves: u64,
}

/// Checks that `pieces` hold exactly `value_size` bytes.
pub fn pieces_fit(pieces: &[(*mut u8, usize)], value_size: u64) -> bool {
    pieces
        .iter()
        .try_fold(0u64, |acc, &(_, len)| acc.checked_add(len as u64))
        == Some(value_size)
}

#[cfg(test)]
mod tests;
