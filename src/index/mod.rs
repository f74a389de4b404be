//! The cluster router's KV index (`radixd index`, docs/routing.md): which
//! worker of a fleet already caches how many leading blocks of a request.
//!
//! Fed by the vLLM-format KV events every worker publishes (radixd daemons
//! with `--kv-events`, vLLM and SGLang workers), it answers what NVIDIA
//! Dynamo's router answers (`RadixTree::find_matches` in `dynamo-kv-router`
//! 1.6.1): [`OverlapScores`], per worker the number of leading blocks of
//! the request it holds, a worker holding none of them absent.
//!
//! **One tree for the fleet.** Every block is keyed by its chained hash
//! (a block's key names every token before it), computed by the index from
//! the event's tokens with its [`Scheme`]: Dynamo's XXH3 chain or vLLM's
//! sha256-cbor. A worker's own block hashes are only names: each worker
//! has a map from its hashes to keys (as Dynamo keeps a lookup per worker),
//! so workers whose hashes differ (a random `PYTHONHASHSEED`) still share
//! blocks with the same tokens. The blocks themselves live in one
//! open-addressed `table` whose slots hold the key and one membership bit
//! per worker: a query walks the request's keys and intersects bit sets,
//! 64 workers per word, with one probe per block.
//!
//! **Readers never block.** Any number of threads call
//! [`KvIndex::find_matches`] while events are applied: the writer changes
//! membership words in place (atomic stores) and replaces the table or the
//! worker `roster` only by publishing a new one; the old one is freed
//! through crossbeam-epoch once no reader can hold it. Writers (event
//! appliers) take one lock among themselves.
//!
//! **Dynamo's semantics** (see `apply` for the event rules): a store whose
//! parent the worker does not hold is skipped; a duplicate store changes
//! nothing; removing a block the worker does not hold is skipped and
//! reported, the event's other blocks still go; `AllBlocksCleared` empties
//! the worker. Where this index differs: blocks are not compressed into
//! edges, so removing a block in the middle of a worker's chain removes
//! that block only (Dynamo truncates the worker's coverage to the end of
//! the edge); early exit stops as soon as one worker is left (Dynamo
//! finishes the edge it is on, so its early-exit scores depend on how its
//! tree happens to be compressed); a store with too few tokens changes
//! nothing (Dynamo stores the blocks that have tokens); tree sizes are
//! reported per worker as Dynamo's older `OverlapScores::tree_sizes` did.

mod error;
mod roster;
mod table;
mod writer;

#[cfg(all(feature = "cli", feature = "kv-events"))]
pub mod cli;
pub mod protocol;
#[cfg(feature = "kv-events")]
pub mod server;

use std::fmt;
use std::sync::Mutex;

use crossbeam_epoch::{self as epoch, Atomic, Owned};
use radixd_ipc::sync::{AtomicU64, Ordering};

use crate::events::batch::{Batch, KvEvent};
use crate::events::hash::{self, FullHash, Scheme};

pub use error::ApplyError;

use roster::Roster;
use table::{stored, Table, MIN_SLOTS};
use writer::Writer;

/// Blocks of a query whose table words are loaded together before the
/// walk reaches them (a window, so a long request that stops matching
/// early does not load all of its blocks).
const TOUCH_AHEAD: usize = 32;

/// A worker of the fleet: Dynamo's `WorkerWithDpRank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    /// The worker's id.
    pub id: u64,
    /// Its data-parallel rank (0 without data parallelism).
    pub dp_rank: u32,
}

impl Worker {
    /// Worker `id`, rank 0.
    pub fn new(id: u64) -> Self {
        Self { id, dp_rank: 0 }
    }
}

impl fmt::Display for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dp_rank == 0 {
            write!(f, "{}", self.id)
        } else {
            write!(f, "{}:{}", self.id, self.dp_rank)
        }
    }
}

/// The answer to a query: Dynamo's `OverlapScores`, and the same for the
/// workers' stores (events of medium `CPU`: a radixd node's node-wide
/// store, a vLLM engine's CPU tier), counted apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlapScores {
    /// Per worker holding at least the request's first block on its
    /// device (events of medium `GPU` or none), how many leading blocks of
    /// the request it holds there.
    pub scores: Vec<(Worker, u32)>,
    /// Per known worker, how many blocks it holds on its device in all.
    pub tree_sizes: Vec<(Worker, u64)>,
    /// Per worker whose store holds at least the request's first block, how
    /// many leading blocks of the request its store holds (whatever its
    /// device holds: a router weighs a store hit, a copy into the device,
    /// apart from a device hit).
    pub store_scores: Vec<(Worker, u32)>,
    /// Per worker that published store events, how many blocks its store
    /// holds.
    pub store_sizes: Vec<(Worker, u64)>,
}

impl OverlapScores {
    /// `worker`'s score; `None` when it holds not even the first block.
    pub fn score(&self, worker: Worker) -> Option<u32> {
        self.scores
            .iter()
            .find(|(w, _)| *w == worker)
            .map(|&(_, s)| s)
    }

    /// `worker`'s tree size; `None` for a worker the index does not know.
    pub fn tree_size(&self, worker: Worker) -> Option<u64> {
        self.tree_sizes
            .iter()
            .find(|(w, _)| *w == worker)
            .map(|&(_, s)| s)
    }

    /// `worker`'s store score; `None` when its store holds not even the
    /// first block.
    pub fn store_score(&self, worker: Worker) -> Option<u32> {
        self.store_scores
            .iter()
            .find(|(w, _)| *w == worker)
            .map(|&(_, s)| s)
    }

    /// How many blocks `worker`'s store holds; `None` for a worker that
    /// published no store event.
    pub fn store_size(&self, worker: Worker) -> Option<u64> {
        self.store_sizes
            .iter()
            .find(|(w, _)| *w == worker)
            .map(|&(_, s)| s)
    }
}

/// One block of a store by hashes (Dynamo's `KvCacheStoredBlockData`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    /// The worker's hash of the block (its name in the worker's events).
    pub hash: u64,
    /// Dynamo's local hash of the block's tokens
    /// ([`hash::xxh3_local`]).
    pub local: u64,
}

/// What applying one batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Events applied wholly.
    pub applied: usize,
    /// Events skipped for a medium indexed by neither tier (not `GPU`,
    /// `CPU` or none).
    pub ignored: usize,
    /// Events refused, wholly or in part, with why.
    pub errors: Vec<ApplyError>,
}

/// Running totals of an index (for `radixd index`'s figures).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Known workers.
    pub workers: usize,
    /// Distinct blocks held by at least one worker.
    pub blocks: usize,
    /// (worker, block) pairs: the sum of tree sizes.
    pub held: u64,
    /// Events applied (wholly or in part).
    pub events: u64,
    /// Events skipped for their medium (neither `GPU`, `CPU` nor none).
    pub ignored: u64,
    /// Refusals per kind, in [`ApplyError::KINDS`] order.
    pub errors: [u64; 8],
    /// Bytes of the block table.
    pub table_bytes: usize,
}

/// How an index keys blocks.
#[derive(Clone, Debug)]
pub struct IndexConfig {
    /// Tokens per block: events of another block size are refused.
    pub block_size: u32,
    /// How tokens become chained keys.
    pub scheme: Scheme,
}

impl IndexConfig {
    /// Dynamo's XXH3 chain with `block_size` tokens per block.
    pub fn xxh3(block_size: u32) -> Self {
        Self {
            block_size,
            scheme: Scheme::Xxh3,
        }
    }
}

/// Why an index could not be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexConfigError {
    /// A block size of 0.
    ZeroBlockSize,
}

impl fmt::Display for IndexConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroBlockSize => write!(f, "the block size must be at least 1"),
        }
    }
}

impl std::error::Error for IndexConfigError {}

/// Counters the writer bumps and anyone reads.
#[derive(Default)]
struct Counters {
    events: AtomicU64,
    ignored: AtomicU64,
    errors: [AtomicU64; 8],
    blocks: AtomicU64,
    held: AtomicU64,
    table_bytes: AtomicU64,
}

/// The fleet's KV index. `Sync`: share it (`Arc`) between the threads
/// that apply events and those that query.
pub struct KvIndex {
    table: Atomic<Table>,
    roster: Atomic<Roster>,
    writer: Mutex<Writer>,
    config: IndexConfig,
    counters: Counters,
}

impl fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvIndex")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl KvIndex {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Result<Self, IndexConfigError> {
        if config.block_size == 0 {
            return Err(IndexConfigError::ZeroBlockSize);
        }
        let table = Table::new(MIN_SLOTS, 1);
        let counters = Counters::default();
        // Relaxed: a figure.
        counters
            .table_bytes
            .store(table.bytes() as u64, Ordering::Relaxed);
        Ok(Self {
            table: Atomic::new(table),
            roster: Atomic::new(Roster::empty()),
            writer: Mutex::new(Writer::default()),
            config,
            counters,
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    /// The chained keys of every whole block of `tokens`: what
    /// [`KvIndex::find_matches`] takes (and, with the same scheme, what
    /// radixd daemons and vLLM publish).
    pub fn keys_for_tokens(&self, tokens: &[u32]) -> Vec<u64> {
        self.config
            .scheme
            .prompt(tokens, self.config.block_size as usize)
    }

    /// [`KvIndex::find_matches`] of the keys of `tokens`.
    pub fn find_matches_for_tokens(&self, tokens: &[u32], early_exit: bool) -> OverlapScores {
        self.find_matches(&self.keys_for_tokens(tokens), early_exit)
    }

    /// Per worker, how many of the leading blocks named by `keys` (chained
    /// hashes from the root, in the index's scheme) it holds; with
    /// `early_exit`, stops as soon as a single worker is left. Never
    /// blocks, whatever the writers do.
    pub fn find_matches(&self, keys: &[u64], early_exit: bool) -> OverlapScores {
        let mut out = OverlapScores::default();
        self.find_matches_into(keys, early_exit, &mut out);
        out
    }

    /// [`KvIndex::find_matches`] into `out` (cleared first), reusing its
    /// buffers: a router's loop allocates nothing per query.
    pub fn find_matches_into(&self, keys: &[u64], early_exit: bool, out: &mut OverlapScores) {
        out.scores.clear();
        out.tree_sizes.clear();
        out.store_scores.clear();
        out.store_sizes.clear();
        let guard = &epoch::pin();
        // Acquire (both): pairs with the writer's Release publication of a
        // roster or table. The roster is loaded first: a table is
        // published before the roster that needs its width, so a reader
        // that sees a roster sees a table at least that wide.
        let roster = self.roster.load(Ordering::Acquire, guard);
        let table = self.table.load(Ordering::Acquire, guard);
        // SAFETY: both pointers are never null (set in `new`, replaced
        // only by `publish_*` with non-null values) and what they point to
        // is retired with `defer_destroy` only after being unlinked, so it
        // lives while `guard` is pinned.
        let (roster, table) = unsafe { (roster.deref(), table.deref()) };
        let words = table.bit_words().min(roster.occupied.len());
        for (s, w) in roster.workers.iter().enumerate() {
            if let Some(w) = *w {
                let sizes = if roster.is_store(s) {
                    &mut out.store_sizes
                } else {
                    &mut out.tree_sizes
                };
                sizes.push((w, roster.size(s)));
            }
        }
        let mut inline = [0u64; 4];
        let mut heap = Vec::new();
        let active: &mut [u64] = if words <= inline.len() {
            &mut inline[..words]
        } else {
            heap.resize(words, 0);
            &mut heap
        };
        table.touch(&keys[..keys.len().min(TOUCH_AHEAD)]);
        let mut matched = 0u32;
        for (depth, &key) in keys.iter().enumerate() {
            if depth % TOUCH_AHEAD == 0 && depth > 0 {
                table.touch(&keys[depth..keys.len().min(depth + TOUCH_AHEAD)]);
            }
            let slot = table.find(stored(key));
            let mut any = 0u64;
            let mut alive = 0u32;
            for (w, a) in active.iter_mut().enumerate() {
                let bits = slot.map_or(0, |s| table.bits(s, w));
                if depth == 0 {
                    *a = bits & roster.occupied[w];
                } else {
                    let mut gone = *a & !bits;
                    while gone != 0 {
                        let b = gone.trailing_zeros() as usize;
                        gone &= gone - 1;
                        credit(out, roster, w * 64 + b, matched);
                    }
                    *a &= bits;
                }
                any |= *a;
                alive += a.count_ones();
            }
            if any == 0 {
                break;
            }
            matched = depth as u32 + 1;
            if early_exit && alive == 1 {
                break;
            }
        }
        for (w, &a) in active.iter().enumerate() {
            let mut left = a;
            while left != 0 {
                let b = left.trailing_zeros() as usize;
                left &= left - 1;
                credit(out, roster, w * 64 + b, matched);
            }
        }
    }

    /// Known workers and their (device) tree sizes.
    pub fn workers(&self) -> Vec<(Worker, u64)> {
        self.tier_sizes(false)
    }

    /// Workers that published store events, and how many blocks each
    /// one's store holds.
    pub fn store_sizes(&self) -> Vec<(Worker, u64)> {
        self.tier_sizes(true)
    }

    fn tier_sizes(&self, store: bool) -> Vec<(Worker, u64)> {
        let guard = &epoch::pin();
        // Acquire: pairs with the writer's Release publication.
        let roster = self.roster.load(Ordering::Acquire, guard);
        // SAFETY: as in `find_matches`: never null, retired only after
        // being unlinked, alive while `guard` is pinned.
        let roster = unsafe { roster.deref() };
        roster
            .workers
            .iter()
            .enumerate()
            .filter(|&(s, _)| roster.is_store(s) == store)
            .filter_map(|(s, w)| w.map(|w| (w, roster.size(s))))
            .collect()
    }

    /// Running totals.
    pub fn stats(&self) -> IndexStats {
        // Relaxed (all): figures, each read on its own.
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut errors = [0u64; 8];
        for (e, a) in errors.iter_mut().zip(&c.errors) {
            *e = load(a);
        }
        IndexStats {
            workers: self.workers().len(),
            blocks: load(&c.blocks) as usize,
            held: load(&c.held),
            events: load(&c.events),
            ignored: load(&c.ignored),
            errors,
            table_bytes: load(&c.table_bytes) as usize,
        }
    }

    /// Counts a refusal that happened outside the index (a frame that did
    /// not decode is counted by whoever received it).
    fn count_error(&self, e: &ApplyError) {
        // Relaxed: a figure.
        self.counters.errors[e.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Applies one decoded `KVEventBatch` from worker `worker_id` (its
    /// `data_parallel_rank` completes the [`Worker`]), event by event.
    pub fn apply(&self, worker_id: u64, batch: &Batch) -> ApplyReport {
        let mut report = ApplyReport::default();
        let rank = match batch.data_parallel_rank {
            None => Some(0),
            Some(r) => u32::try_from(r).ok(),
        };
        let Some(dp_rank) = rank else {
            self.count_error(&ApplyError::BadRank);
            report.errors.push(ApplyError::BadRank);
            return report;
        };
        let worker = Worker {
            id: worker_id,
            dp_rank,
        };
        for event in &batch.events {
            match self.apply_event(worker, event) {
                Ok(true) => report.applied += 1,
                Ok(false) => report.ignored += 1,
                Err(e) => report.errors.push(e),
            }
        }
        report
    }

    /// Applies one event of `worker`: `Ok(false)` when it was skipped for
    /// its medium. Medium `GPU` (or none) is the worker's device cache, as
    /// Dynamo's device tier; medium `CPU` its store, a tier of its own (a
    /// radixd node's node-wide store, a vLLM engine's CPU offload), scored
    /// apart ([`OverlapScores::store_scores`]); any other is skipped.
    /// `AllBlocksCleared` empties both tiers (a radixd daemon announces its
    /// store again right after).
    pub fn apply_event(&self, worker: Worker, event: &KvEvent) -> Result<bool, ApplyError> {
        let medium = match event {
            KvEvent::BlockStored { medium, .. } | KvEvent::BlockRemoved { medium, .. } => {
                medium.as_deref()
            }
            KvEvent::AllBlocksCleared => None,
        };
        let store = match medium {
            None => false,
            Some(m) if m.eq_ignore_ascii_case("GPU") => false,
            Some(m) if m.eq_ignore_ascii_case("CPU") => true,
            Some(_) => {
                // Relaxed: a figure.
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
        };
        let result = match event {
            // The store keeps no tokens: its blocks are named by their
            // hashes, which are their keys (docs/kv-events.md).
            KvEvent::BlockStored {
                block_hashes,
                token_ids,
                ..
            } if store && token_ids.is_empty() => self.store_named(worker, block_hashes),
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                ..
            } => self.store_tokens_in(
                worker,
                store,
                *parent_block_hash,
                block_hashes,
                token_ids,
                *block_size,
            ),
            KvEvent::BlockRemoved { block_hashes, .. } => {
                self.remove_in(worker, store, block_hashes)
            }
            KvEvent::AllBlocksCleared => {
                self.clear_or_add(worker);
                Ok(())
            }
        };
        // Relaxed: a figure.
        self.counters.events.fetch_add(1, Ordering::Relaxed);
        result.map(|()| true)
    }

    /// Whether keys are XXH3 sequence hashes (a key is then its own
    /// chaining input; sha256-cbor needs the digest the writer keeps).
    fn is_xxh3(&self) -> bool {
        matches!(self.config.scheme, Scheme::Xxh3)
    }
}

impl Drop for KvIndex {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader or writer is left; both pointers
        // are non-null and owned by this index (retired ones went to
        // `defer_destroy` when they were replaced).
        unsafe {
            let guard = epoch::unprotected();
            drop(self.table.load(Ordering::Relaxed, guard).into_owned());
            drop(self.roster.load(Ordering::Relaxed, guard).into_owned());
        }
    }
}

/// Credits roster slot `slot`'s worker with `matched` leading blocks, in
/// the tier the slot stands for.
fn credit(out: &mut OverlapScores, roster: &Roster, slot: usize, matched: u32) {
    if let Some(Some(worker)) = roster.workers.get(slot) {
        let scores = if roster.is_store(slot) {
            &mut out.store_scores
        } else {
            &mut out.scores
        };
        scores.push((*worker, matched));
    }
}

/// The XXH3 full hash of a key (the scheme's chaining input).
fn xxh3_full(key: u64) -> FullHash {
    hash::xxh3_full(key)
}

/// Publishes `new` in `slot`, retiring the old value (writer only: the
/// caller must not use the old value afterwards).
fn publish<T: Send + 'static>(slot: &Atomic<T>, new: T) {
    let guard = &epoch::pin();
    // Release: pairs with the Acquire loads of readers (`find_matches`),
    // which then see the value built before.
    let old = slot.swap(Owned::new(new), Ordering::Release, guard);
    // SAFETY: `old` was just unlinked: no later reader can load it, and
    // the readers that did are pinned, which `defer_destroy` waits for.
    unsafe { guard.defer_destroy(old) };
}

#[cfg(test)]
mod tests;
