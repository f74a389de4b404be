//! The cache engine: a radix tree of token sequences over a pool of KV pages,
//! with per-client locks and page-granular, leaf-first LRU eviction.
//!
//! Everything a reader of the tree needs lives in one [`Region`] of plain
//! `#[repr(C)]` records addressed by `u32` indices (see [`layout`]), so the
//! same engine runs on the heap ([`HeapRegion`]) and in a shared-memory
//! segment. Per-client bookkeeping (which client holds which lock) lives
//! beside it in ordinary process memory.
//!
//! Semantics follow SGLang's `RadixCache`: keys are cut to whole pages; a
//! match or insert that ends inside an edge splits it there; `lock_ref`
//! counts locks on a node and its descendants, and `evictable_tokens` /
//! `protected_tokens` move on its 0 ↔ 1 transitions.
//!
//! Readers in other processes walk the same region without locks
//! ([`TreeReader`]), validating node by node against per-node versions.
//!
//! Memory: 52 bytes per node plus a 4-byte version (at most `capacity + 1`
//! nodes, and one more per host page with a host tier), 16 bytes + 4 bytes
//! of free ring + 16 bytes of child table per page, plus the tokens.

mod anchor;
mod arena;
mod cache;
mod config;
mod error;
mod event;
mod facts;
mod grace;
mod heap;
mod host;
mod hybrid;
pub mod layout;
mod limbo;
mod lock;
mod lock_map;
mod lru;
mod mem;
mod namespace;
mod policy;
mod pool;
mod prefix;
mod reader;
mod record;
mod region;
mod session;
mod stats;
mod table;
mod tree;
mod validate;

pub use arena::CORRUPT;
pub use cache::{ClientId, Engine};
pub use config::{Config, ConfigError};
pub use error::{AnchorError, HandleError, InvariantError, PageError};
pub use event::CacheEvent;
pub use grace::Grace;
pub use host::{Digest, HostError, HostInserted, HostMatched, HostNode, HostStats};
pub use hybrid::{
    Component, ComponentError, ComponentStats, Components, ComponentsError, Evicted, InsertExtra,
    InsertedExtra, MambaConfig, MatchExtra, SwaConfig, MAX_STATES,
};
pub use layout::{EngineLayout, REGION_ALIGN};
pub use lock::Handle;
pub use lru::{Recency, RecencyError};
#[cfg(loom)]
pub use mem::Mirror;
pub use mem::{Mapped, TreeMem};
pub use namespace::{
    check_namespace, check_namespace_len, NamespaceError, NamespaceSize, MAX_NAMESPACES,
    MAX_NAMESPACE_LEN,
};
pub use policy::{InsertHints, Policy, PolicyError};
pub use pool::EvictedLeaf;
pub use prefix::{Inserted, Matched};
pub use reader::{Anchor, Peeked, TreeReader, Usable};
pub use record::{SPARE_BUFFERS, SPARE_BUFFER_LEN};
#[cfg(loom)]
pub use region::MirroredRegion;
pub use region::{HeapRegion, Region};
pub use session::{SessionError, SessionStatus};
pub use stats::{FreeCounts, Stats};
