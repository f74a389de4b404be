//! What an engine region looks like: the `#[repr(C)]` records and where each
//! array starts.
//!
//! ```text
//! [table Version][Header][Node; capacity + 1][Version; capacity + 1][Page; capacity]
//!         [free ring: u32; capacity][Bucket; 2^k >= 2 * (capacity + 1)]
//!         [tokens: u32; capacity * page_size]
//! ```
//!
//! The versions ([`radixd_ipc::Version`]) are atomics, so they live apart
//! from the records they guard: the engine writes nodes through `&mut`
//! slices, which must never alias a word another thread or process updates
//! or reads atomically. Node `i`'s version guards its record, its pages'
//! links and their tokens; the table's version guards the child table.
//!
//! Every array starts on a cache line. Records hold indices, never pointers,
//! bools or enums, so the region means the same thing in every process that
//! maps it.

use std::mem::{align_of, size_of};

use super::config::ConfigError;

/// "No node / no page / end of list".
pub(crate) const NIL: u32 = u32::MAX;
/// The root node's index; the root holds no pages and is never evicted.
pub(crate) const ROOT: u32 = 0;

/// Largest supported page size, in tokens.
pub const MAX_PAGE_SIZE: u32 = 1024;
/// Largest supported pool, in pages (keeps every index and the child table in
/// `u32` range).
pub const MAX_CAPACITY: u32 = 1 << 30;

/// Identifies this layout; bumped whenever a record changes shape.
pub const ENGINE_VERSION: u32 = 7;

/// Alignment every region must have: one cache line.
pub const REGION_ALIGN: usize = 64;

/// Engine-wide scalars at the start of the region.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Header {
    pub layout_version: u32,
    pub page_size: u32,
    pub capacity: u32,
    /// `buckets - 1`; the child table's size is a power of two.
    pub bucket_mask: u32,
    /// Next page to hand out from the FIFO free ring.
    pub free_head: u32,
    /// Pages in the free ring.
    pub free_len: u32,
    /// Head of the free-node stack (linked through `Node::link`).
    pub node_free: u32,
    /// Live nodes, root included.
    pub nodes_live: u32,
    /// The secondary components on (`COMPONENT_SWA`, `COMPONENT_MAMBA`
    /// bits; 0: FULL only), for readers (see `hybrid`).
    pub components: u32,
    /// The SWA window in tokens (0 without SWA).
    pub swa_window: u32,
    /// Pages owned by clients (allocated, not yet inserted or freed).
    pub owned_pages: u32,
    /// Pages in the server's host pool the host tier indexes (0: no host
    /// tier; see `host`).
    pub host_capacity: u32,
    /// Tokens cached in the tree.
    pub total_tokens: u64,
    /// Cached tokens on nodes with `lock_ref == 0`.
    pub evictable_tokens: u64,
    /// Cached tokens on nodes with `lock_ref > 0`.
    pub protected_tokens: u64,
    /// Nodes eviction visited since start (or reset): each victim once.
    pub evict_scanned: u64,
    /// Pages evicted since start (or reset).
    pub evicted_pages: u64,
    pub _reserved: [u64; 1],
}

/// Node state word values.
pub(crate) const NODE_FREE: u32 = 0;
pub(crate) const NODE_LIVE: u32 = 1;
/// A node whose device pages were evicted while its host copy stays
/// (SGLang's "evicted and backuped"): out of the child table, no pages, its
/// handle still good (see `host`). Readers take it as gone.
pub(crate) const NODE_HOST: u32 = 2;

/// One radix-tree node: a compressed edge of whole pages.
///
/// The edge's tokens are the tokens of its pages, in order; the pages form a
/// doubly linked list through [`Page::next`]/[`Page::prev`], so a split or a
/// trim moves links, never tokens.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub parent: u32,
    /// Bumped whenever the slot is allocated or freed, so a handle to a freed
    /// or reused node is recognised as stale.
    pub generation: u32,
    pub state: u32,
    pub first_page: u32,
    pub last_page: u32,
    pub num_pages: u32,
    pub children: u32,
    /// Locks held on this node or any descendant (SGLang's `lock_ref`).
    pub lock_ref: u32,
    /// 1 while the node holds SWA pages (SWA on), else 0: a tombstone.
    /// The rest of the SWA component is the writer's private memory.
    pub swa: u32,
    /// While free: the next node of the free-node stack, or of its limbo
    /// batch while it waits for readers (see `grace`). `NIL` while live.
    pub link: u32,
    /// Child-table hash of `(parent, first page's tokens)`.
    pub hash: u32,
    /// The MAMBA state slot checkpointed at this node, plus one; 0: none.
    pub mamba: u32,
    /// The namespace the node's prefix lives in (0: the default one);
    /// a child's is its parent's, and the root's children are filed
    /// under theirs (see `table`).
    pub ns: u32,
}

impl Node {
    /// A node with no parent, pages, children or locks.
    pub fn empty(generation: u32, state: u32, link: u32) -> Self {
        Self {
            parent: NIL,
            generation,
            state,
            first_page: NIL,
            last_page: NIL,
            num_pages: 0,
            children: 0,
            lock_ref: 0,
            swa: 0,
            link,
            hash: 0,
            mamba: 0,
            ns: 0,
        }
    }
}

/// `Header::components` bits.
pub(crate) const COMPONENT_SWA: u32 = 1;
pub(crate) const COMPONENT_MAMBA: u32 = 2;

/// Page state word values.
pub(crate) const PAGE_FREE: u32 = 0;
pub(crate) const PAGE_OWNED: u32 = 1;
pub(crate) const PAGE_CACHED: u32 = 2;
/// Transient mark used while validating a request's page list (catches a page
/// named twice); never visible between operations.
pub(crate) const PAGE_CLAIMED: u32 = 3;
/// Evicted, waiting in limbo for readers' grace period (see `grace`).
pub(crate) const PAGE_RETIRED: u32 = 4;

/// One KV page of the pool.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Page {
    pub state: u32,
    /// While `PAGE_OWNED`: the owning client. While `PAGE_CACHED`: the run,
    /// how many pages of its node from this one on have consecutive ids
    /// (at least 1). Set when the leaf is made and never changed after: a
    /// node only loses pages at its end (trim) or is cut in two (split),
    /// so a run read as `min(run, pages left in the node)` stays exact. A
    /// walk compares a run's tokens as one contiguous slice.
    pub owner_or_run: u32,
    /// Next page of the same node while `PAGE_CACHED`; the next page of
    /// its limbo batch while `PAGE_RETIRED` (see `grace`).
    pub next: u32,
    /// Previous page of the same node while `PAGE_CACHED`.
    pub prev: u32,
}

/// One slot of the open-addressed child table.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bucket {
    pub hash: u32,
    /// `NIL` when empty.
    pub node: u32,
}

const _: () = assert!(size_of::<Header>() == 96);
const _: () = assert!(size_of::<Node>() == 52);
const _: () = assert!(size_of::<Page>() == 16);
const _: () = assert!(size_of::<Bucket>() == 8);
const _: () = assert!(align_of::<Header>() <= REGION_ALIGN);

/// Where each array of a region starts, derived from the configuration alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineLayout {
    pub(crate) page_size: u32,
    pub(crate) capacity: u32,
    /// Host pages indexed by the host tier (0: none).
    pub(crate) host_capacity: u32,
    pub(crate) node_cap: u32,
    pub(crate) buckets: u32,
    pub(crate) header_at: usize,
    pub(crate) nodes_at: usize,
    pub(crate) versions_at: usize,
    pub(crate) pages_at: usize,
    pub(crate) free_at: usize,
    pub(crate) buckets_at: usize,
    pub(crate) tokens_at: usize,
    size: usize,
}

fn align_up(x: usize) -> usize {
    x.div_ceil(REGION_ALIGN) * REGION_ALIGN
}

impl EngineLayout {
    /// Computes the layout of an engine with `capacity` pages of `page_size`
    /// tokens.
    pub fn new(page_size: u32, capacity: u32) -> Result<Self, ConfigError> {
        Self::with_host(page_size, capacity, 0)
    }

    /// The layout of an engine whose host tier indexes `host_capacity`
    /// host pages besides its `capacity` device pages: every host page may
    /// hold a host-only node, so the node table grows by as many slots (the
    /// child table does not: host-only nodes are not filed in it).
    pub fn with_host(
        page_size: u32,
        capacity: u32,
        host_capacity: u32,
    ) -> Result<Self, ConfigError> {
        if !(1..=MAX_PAGE_SIZE).contains(&page_size) {
            return Err(ConfigError::PageSize(page_size));
        }
        if !(1..=MAX_CAPACITY).contains(&capacity) {
            return Err(ConfigError::Capacity(capacity));
        }
        if host_capacity > MAX_CAPACITY - capacity {
            return Err(ConfigError::HostCapacity(host_capacity));
        }
        // Every non-root node holds at least one page, device or host.
        let node_cap = capacity + host_capacity + 1;
        // Load factor at most about 1/2 keeps linear probes short; 2^31
        // buckets (what 2^30 pages get) is the most a u32 mask addresses.
        // Only device nodes are filed.
        let buckets = (2 * (u64::from(capacity) + 1))
            .next_power_of_two()
            .min(1 << 31) as u32;
        let (cap, nodes) = (capacity as usize, node_cap as usize);
        // The child table's version has a cache line of its own at offset
        // 0, where `format` (which rewrites the header) never touches it.
        let header_at = REGION_ALIGN;
        let nodes_at = align_up(header_at + size_of::<Header>());
        let versions_at = align_up(nodes_at + nodes * size_of::<Node>());
        let pages_at = align_up(versions_at + nodes * size_of::<u32>());
        let free_at = align_up(pages_at + cap * size_of::<Page>());
        let buckets_at = align_up(free_at + cap * size_of::<u32>());
        let tokens_at = align_up(buckets_at + buckets as usize * size_of::<Bucket>());
        let tokens = cap
            .checked_mul(page_size as usize)
            .and_then(|t| t.checked_mul(size_of::<u32>()));
        let size = tokens
            .and_then(|t| tokens_at.checked_add(t))
            .filter(|s| *s <= isize::MAX as usize - REGION_ALIGN)
            .map(align_up)
            .ok_or(ConfigError::TooLarge {
                page_size,
                capacity,
            })?;
        Ok(Self {
            page_size,
            capacity,
            host_capacity,
            node_cap,
            buckets,
            header_at,
            nodes_at,
            versions_at,
            pages_at,
            free_at,
            buckets_at,
            tokens_at,
            size,
        })
    }

    /// Bytes the region needs.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Tokens per page.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Pages in the pool.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}
