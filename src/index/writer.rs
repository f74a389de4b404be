//! The writer side: events into table bits, per-worker block maps, tree
//! sizes. One writer at a time (`KvIndex::writer`, a mutex only writers
//! take); readers never wait for it.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{MutexGuard, PoisonError};

use crossbeam_epoch as epoch;
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};

use super::roster::{Quarantine, Roster};
use super::table::{stored, Table, MIN_SLOTS};
use super::{publish, xxh3_full, ApplyError, KvIndex, StoredBlock, Worker};
use crate::events::hash::{self, FullHash, Scheme};

/// Hashes `u64` keys that are hashes already (and `Worker`s) with one
/// 128-bit multiply and fold: cheap, and still spreads small integers.
#[derive(Clone, Copy, Default)]
pub(crate) struct Fold;

/// [`Fold`]'s hasher.
pub(crate) struct FoldHasher(u64);

impl BuildHasher for Fold {
    type Hasher = FoldHasher;
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(0)
    }
}

impl Hasher for FoldHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let p = u128::from(x ^ self.0) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// What the writer knows of one worker's blocks.
///
/// A worker that hashes as the index does (a radixd daemon, vLLM with the
/// index's seed) names each block by its key: such blocks are found in
/// the table by their name and need no entry here. Only names that differ
/// from their keys (another seed, another scheme) are kept, as aliases.
#[derive(Default)]
struct Held {
    /// The worker's name → the index's key, where they differ.
    aliases: HashMap<u64, u64, Fold>,
    /// Blocks held (the tree size).
    count: usize,
}

/// The writer's private state.
#[derive(Default)]
pub(crate) struct Writer {
    /// Each worker's roster slot per tier (`true`: its store).
    slot_of: HashMap<(Worker, bool), usize, Fold>,
    /// By roster slot: the worker's blocks.
    held: Vec<Held>,
    quarantine: Quarantine,
    /// Slots of the current table with a key (held or tombstone).
    used: usize,
    /// Slots some worker holds.
    live: usize,
    /// Sum of tree sizes.
    held_total: u64,
    /// sha256-cbor only: each live key's full digest, the next block's
    /// chaining input.
    digests: HashMap<u64, FullHash, Fold>,
    scratch: Vec<u8>,
    keys: Vec<u64>,
    fulls: Vec<FullHash>,
}

/// Whether `hashes` (with `parent`) name a block twice.
fn self_referencing(parent: Option<u64>, hashes: &[u64]) -> bool {
    if hashes.len() <= 16 {
        return hashes
            .iter()
            .enumerate()
            .any(|(i, h)| Some(*h) == parent || hashes[..i].contains(h));
    }
    let mut sorted = hashes.to_vec();
    sorted.extend(parent);
    sorted.sort_unstable();
    sorted.windows(2).any(|w| w[0] == w[1])
}

impl KvIndex {
    fn lock(&self) -> MutexGuard<'_, Writer> {
        // Nothing in the writer panics on input; a poisoned lock (a bug)
        // still holds consistent-enough state to go on serving reads.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current table, for the writer (who holds the writer lock).
    ///
    /// The writer does not pin: it is the only thread that retires a
    /// table, so what it loads stays valid until it publishes a
    /// replacement itself, and no caller uses a table after that (each
    /// loads the current one again). That saves a pin, and its SeqCst
    /// fence, per store.
    fn table_w(&self) -> &Table {
        // SAFETY: `unprotected` is sound here because only the writer
        // (this thread, under the lock) retires tables, as argued above.
        let guard = unsafe { epoch::unprotected() };
        // Acquire: pairs with `publish`'s Release (the previous writer's).
        let t = self.table.load(Ordering::Acquire, guard);
        // SAFETY: never null (set in `new`, replaced only by non-null
        // values); not retired before this writer replaces it.
        unsafe { t.deref() }
    }

    /// The current roster, for the writer: as `table_w`.
    fn roster_w(&self) -> &Roster {
        // SAFETY: as in `table_w`: only the writer retires rosters.
        let guard = unsafe { epoch::unprotected() };
        // Acquire: pairs with `publish`'s Release.
        let r = self.roster.load(Ordering::Acquire, guard);
        // SAFETY: as in `table_w`.
        unsafe { r.deref() }
    }

    /// The slot of `worker`'s device cache, or of its store when `store`,
    /// registering it (and widening the table's bits first when needed) if
    /// it is new. A worker first seen through its store is known (tree
    /// size 0) as any event makes it known.
    fn slot_for(&self, w: &mut Writer, worker: Worker, store: bool) -> usize {
        if let Some(&s) = w.slot_of.get(&(worker, store)) {
            return s;
        }
        if store {
            self.slot_for(w, worker, false);
        }
        let roster = self.roster_w();
        let slot = w.quarantine.take().unwrap_or(roster.workers.len());
        let table = self.table_w();
        if slot >= table.capacity() {
            // Widen before the roster names the slot: a reader that sees
            // the new roster then sees a table this wide (loaded after).
            let words = (slot / 64 + 1).next_power_of_two();
            self.publish_table(w, table.rebuilt(table.slots(), words));
        }
        publish(&self.roster, roster.with(slot, Some(worker), store));
        if w.held.len() <= slot {
            w.held.resize_with(slot + 1, Held::default);
        }
        w.slot_of.insert((worker, store), slot);
        slot
    }

    fn publish_table(&self, w: &mut Writer, table: Table) {
        // Relaxed: a figure.
        self.counters
            .table_bytes
            .store(table.bytes() as u64, Ordering::Relaxed);
        w.used = w.live;
        publish(&self.table, table);
    }

    /// Room for `n` more keys under a 3/4 load factor: a rebuild (which
    /// also drops tombstones) when there is not, to 4 times what is held,
    /// so a table stays between 3/16 and 3/4 full (21 to 85 bytes a
    /// distinct block with one membership word; Dynamo's tree took about
    /// 100 per block held on the Mooncake trace). Linear probing for an
    /// absent key reads about 8.5 slots at 3/4 full, 2.5 at 1/2, but those
    /// slots are adjacent and a query warms a request's lines first:
    /// measured on the Mooncake trace, 3/4 beat 1/2 (smaller tables,
    /// cheaper growth), and growing 4x beat 2x by about 15% (half the
    /// rebuilds and fresh pages).
    fn reserve(&self, w: &mut Writer, n: usize) {
        let table = self.table_w();
        if (w.used + n) * 4 <= table.slots() * 3 {
            return;
        }
        let slots = ((w.live + n) * 4).next_power_of_two().max(MIN_SLOTS);
        self.publish_table(w, table.rebuilt(slots, table.bit_words()));
    }

    /// Records tree size and totals after a change.
    fn settle(&self, w: &Writer, slot: usize) {
        self.roster_w().set_size(slot, w.held[slot].count);
        // Relaxed (both): figures.
        self.counters.blocks.store(w.live as u64, Ordering::Relaxed);
        self.counters.held.store(w.held_total, Ordering::Relaxed);
    }

    /// Drops worker slot `slot`'s membership of `key`; whether it held it.
    fn unset(&self, w: &mut Writer, slot: usize, key: u64) -> bool {
        let table = self.table_w();
        let Some(s) = table.find(stored(key)) else {
            return false;
        };
        match table.clear_bit(s, slot) {
            None => false,
            Some(now_empty) => {
                if now_empty {
                    w.live = w.live.saturating_sub(1);
                    w.digests.remove(&key);
                }
                true
            }
        }
    }

    /// Stores `worker`'s blocks by Dynamo's local hashes (XXH3 indexes
    /// only): `parent` is the worker's hash of the block before the first
    /// (`None`: the root). What `apply` does for a `BlockStored` once
    /// tokens are hashed; the benchmark's path.
    pub fn store(
        &self,
        worker: Worker,
        parent: Option<u64>,
        blocks: &[StoredBlock],
    ) -> Result<(), ApplyError> {
        let mut w = self.lock();
        let slot = self.slot_for(&mut w, worker, false);
        let result = self.store_locked(&mut w, slot, parent, blocks);
        self.count(&result);
        result
    }

    fn count(&self, result: &Result<(), ApplyError>) {
        if let Err(e) = result {
            self.count_error(e);
        }
    }

    fn store_locked(
        &self,
        w: &mut Writer,
        slot: usize,
        parent: Option<u64>,
        blocks: &[StoredBlock],
    ) -> Result<(), ApplyError> {
        if !matches!(self.config.scheme, Scheme::Xxh3) {
            return Err(ApplyError::NeedsTokens);
        }
        // As Dynamo's `RadixTree::apply_stored`: a block named like its
        // parent is refused; a name given twice is taken as renaming (the
        // later block keeps it), which keeps the membership consistent.
        if parent.is_some_and(|p| blocks.iter().any(|b| b.hash == p)) {
            return Err(ApplyError::InvalidBlockSequence);
        }
        let mut prev = self.parent_key(w, slot, parent)?;
        let mut keys = std::mem::take(&mut w.keys);
        keys.clear();
        for b in blocks {
            let key = prev.map_or(b.local, |p| hash::xxh3_chain(p, b.local));
            keys.push(key);
            prev = Some(key);
        }
        self.reserve(w, blocks.len());
        // No warm-up here (unlike `commit`): a router stores what it has
        // just queried, whose lines `find_matches` loaded.
        for (b, &key) in blocks.iter().zip(&keys) {
            self.hold(w, slot, b.hash, key, None);
        }
        w.keys = keys;
        self.settle(w, slot);
        Ok(())
    }

    /// The key of the block slot `slot`'s worker names `name`, if it
    /// holds it.
    fn key_of(&self, w: &Writer, slot: usize, name: u64) -> Option<u64> {
        let held = &w.held[slot];
        if !held.aliases.is_empty() {
            if let Some(&k) = held.aliases.get(&name) {
                return Some(k);
            }
        }
        let table = self.table_w();
        let s = table.find(stored(name))?;
        (table.bits(s, slot / 64) & 1 << (slot % 64) != 0).then_some(name)
    }

    /// The key of the parent block, if the worker holds it.
    fn parent_key(
        &self,
        w: &Writer,
        slot: usize,
        parent: Option<u64>,
    ) -> Result<Option<u64>, ApplyError> {
        match parent {
            None => Ok(None),
            Some(p) => self
                .key_of(w, slot, p)
                .map(Some)
                .ok_or(ApplyError::ParentNotFound),
        }
    }

    /// A `BlockStored` of the store's tier without tokens (a radixd
    /// node's store): each block's hash is its key, whatever its parent
    /// (a store value's parent may have gone before it was announced).
    pub(super) fn store_named(&self, worker: Worker, hashes: &[u64]) -> Result<(), ApplyError> {
        let mut w = self.lock();
        let slot = self.slot_for(&mut w, worker, true);
        let result = if self_referencing(None, hashes) {
            Err(ApplyError::InvalidBlockSequence)
        } else {
            self.reserve(&mut w, hashes.len());
            for &h in hashes {
                self.hold(&mut w, slot, h, h, None);
            }
            self.settle(&w, slot);
            Ok(())
        };
        self.count(&result);
        result
    }

    /// A `BlockStored` on the worker's device: the keys are chained from
    /// the tokens.
    #[cfg(test)]
    pub(super) fn store_tokens(
        &self,
        worker: Worker,
        parent: Option<u64>,
        hashes: &[u64],
        tokens: &[u32],
        block_size: u32,
    ) -> Result<(), ApplyError> {
        self.store_tokens_in(worker, false, parent, hashes, tokens, block_size)
    }

    /// [`KvIndex::store_tokens`] in the worker's store when `store`.
    pub(super) fn store_tokens_in(
        &self,
        worker: Worker,
        store: bool,
        parent: Option<u64>,
        hashes: &[u64],
        tokens: &[u32],
        block_size: u32,
    ) -> Result<(), ApplyError> {
        let mut w = self.lock();
        let slot = self.slot_for(&mut w, worker, store);
        let result = self.store_tokens_locked(&mut w, slot, parent, hashes, tokens, block_size);
        self.count(&result);
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn store_tokens_locked(
        &self,
        w: &mut Writer,
        slot: usize,
        parent: Option<u64>,
        hashes: &[u64],
        tokens: &[u32],
        block_size: u32,
    ) -> Result<(), ApplyError> {
        let want = self.config.block_size;
        if block_size != want {
            return Err(ApplyError::BlockSize {
                got: block_size,
                want,
            });
        }
        if self_referencing(parent, hashes) {
            return Err(ApplyError::InvalidBlockSequence);
        }
        let bs = block_size as usize;
        if tokens.len() < hashes.len().saturating_mul(bs) {
            return Err(ApplyError::TokensShort);
        }
        let parent_key = self.parent_key(w, slot, parent)?;
        let mut keys = std::mem::take(&mut w.keys);
        let mut fulls = std::mem::take(&mut w.fulls);
        let mut scratch = std::mem::take(&mut w.scratch);
        keys.clear();
        fulls.clear();
        let xxh3 = self.is_xxh3();
        let mut prev: Option<FullHash> = match parent_key {
            None => None,
            Some(k) if xxh3 => Some(xxh3_full(k)),
            // A live key of the sha256 scheme always has its digest.
            Some(k) => w.digests.get(&k).copied(),
        };
        let scheme: &Scheme = &self.config.scheme;
        for page in tokens.chunks_exact(bs).take(hashes.len()) {
            let full = scheme.block(prev.as_ref(), page, &mut scratch);
            keys.push(scheme.external(&full));
            if !xxh3 {
                fulls.push(full);
            }
            prev = Some(full);
        }
        self.commit(w, slot, hashes, &keys, &fulls);
        w.keys = keys;
        w.fulls = fulls;
        w.scratch = scratch;
        Ok(())
    }

    /// Makes slot `slot`'s worker hold `keys` (named `hashes` by it).
    fn commit(
        &self,
        w: &mut Writer,
        slot: usize,
        hashes: &[u64],
        keys: &[u64],
        fulls: &[FullHash],
    ) {
        self.reserve(w, keys.len());
        self.table_w().touch(keys);
        for (i, (&h, &key)) in hashes.iter().zip(keys).enumerate() {
            self.hold(w, slot, h, key, fulls.get(i));
        }
        self.settle(w, slot);
    }

    /// Makes slot `slot`'s worker hold `key`, which it names `name`
    /// (`full`: the key's digest, sha256-cbor only). The caller reserved
    /// room in the table.
    fn hold(&self, w: &mut Writer, slot: usize, name: u64, key: u64, full: Option<&FullHash>) {
        // First forget what the name stood for before, if anything.
        let held = &mut w.held[slot];
        let old = if name == key {
            if held.aliases.is_empty() {
                None
            } else {
                held.aliases.remove(&name)
            }
        } else {
            match held.aliases.insert(name, key) {
                // The name may have been a block's own key until now.
                None => {
                    let table = self.table_w();
                    table
                        .find(stored(name))
                        .filter(|&s| table.bits(s, slot / 64) & 1 << (slot % 64) != 0)
                        .map(|_| name)
                }
                old => old,
            }
        };
        if let Some(old) = old {
            held.count = held.count.saturating_sub(1);
            // The worker named other tokens by this name before.
            if old != key && self.unset(w, slot, old) {
                w.held_total = w.held_total.saturating_sub(1);
            }
        }
        let table = self.table_w();
        let (set, revived) = match table.claim(stored(key), slot) {
            Some((_, true)) => {
                w.used += 1;
                (true, true)
            }
            Some((s, false)) => {
                let set = table.set_bit(s, slot);
                // Revived: this bit is now the slot's only one.
                (set, set && table.only_bit(s, slot))
            }
            // `reserve` leaves free slots: unreachable, and harmless.
            None => (false, false),
        };
        if set {
            w.held_total += 1;
        }
        // The name's new meaning: an alias always counts; a block named by
        // its key counts when its bit was new.
        if name != key || set {
            w.held[slot].count += 1;
        }
        if revived {
            w.live += 1;
            if let Some(full) = full {
                w.digests.insert(key, *full);
            }
        }
    }

    /// Removes `worker`'s blocks named `hashes`; unknown ones are skipped
    /// (the first such is the error), the others removed.
    pub fn remove(&self, worker: Worker, hashes: &[u64]) -> Result<(), ApplyError> {
        self.remove_in(worker, false, hashes)
    }

    /// [`KvIndex::remove`] from `worker`'s store when `store`.
    pub(super) fn remove_in(
        &self,
        worker: Worker,
        store: bool,
        hashes: &[u64],
    ) -> Result<(), ApplyError> {
        let mut w = self.lock();
        let slot = self.slot_for(&mut w, worker, store);
        let mut result = Ok(());
        for &h in hashes {
            let alias = w.held[slot].aliases.remove(&h);
            let key = alias.unwrap_or(h);
            let was = self.unset(&mut w, slot, key);
            if was {
                w.held_total = w.held_total.saturating_sub(1);
            }
            if was || alias.is_some() {
                w.held[slot].count = w.held[slot].count.saturating_sub(1);
            } else {
                result = Err(ApplyError::BlockNotFound);
            }
        }
        self.settle(&w, slot);
        self.count(&result);
        result
    }

    /// Drops every block of slot `slot`'s worker: one pass over the table
    /// (clearing is rare; keeping a list per worker would cost every store).
    fn clear_slot(&self, w: &mut Writer, slot: usize) {
        let table = self.table_w();
        for s in 0..table.slots() {
            if let Some(now_empty) = table.clear_bit(s, slot) {
                w.held_total = w.held_total.saturating_sub(1);
                if now_empty {
                    w.live = w.live.saturating_sub(1);
                    if let Some(key) = table.key(s) {
                        w.digests.remove(&key);
                    }
                }
            }
        }
        w.held[slot] = Held::default();
        self.settle(w, slot);
    }

    /// Drops every block of `worker` (Dynamo's `clear_all_blocks` for one
    /// rank); the worker stays known, with tree size 0.
    /// Its store's blocks go too.
    pub fn clear(&self, worker: Worker) -> Result<(), ApplyError> {
        let mut w = self.lock();
        let Some(&slot) = w.slot_of.get(&(worker, false)) else {
            self.count_error(&ApplyError::UnknownWorker);
            return Err(ApplyError::UnknownWorker);
        };
        self.clear_slot(&mut w, slot);
        if let Some(&store) = w.slot_of.get(&(worker, true)) {
            self.clear_slot(&mut w, store);
        }
        Ok(())
    }

    /// Makes `worker` known (tree size 0) before its first event, so
    /// answers list it.
    pub fn add_worker(&self, worker: Worker) {
        let mut w = self.lock();
        self.slot_for(&mut w, worker, false);
    }

    /// `AllBlocksCleared`: the worker known (as any event makes it, in
    /// Dynamo) and empty, its store too.
    pub(super) fn clear_or_add(&self, worker: Worker) {
        let mut w = self.lock();
        let slot = self.slot_for(&mut w, worker, false);
        self.clear_slot(&mut w, slot);
        if let Some(&store) = w.slot_of.get(&(worker, true)) {
            self.clear_slot(&mut w, store);
        }
    }

    /// Forgets every rank of worker `id` and its blocks (Dynamo's
    /// `remove_worker`); no-op for an unknown worker.
    pub fn remove_worker(&self, id: u64) {
        let mut w = self.lock();
        let mut gone: Vec<((Worker, bool), usize)> = w
            .slot_of
            .iter()
            .filter(|(k, _)| k.0.id == id)
            .map(|(k, s)| (*k, *s))
            .collect();
        gone.sort_unstable();
        for (worker, slot) in gone {
            self.clear_slot(&mut w, slot);
            w.slot_of.remove(&worker);
            publish(&self.roster, self.roster_w().with(slot, None, false));
            let flag = Arc::new(AtomicU32::new(0));
            let raise = Arc::clone(&flag);
            // Runs once every reader pinned now has unpinned: none can
            // still credit the old worker with the slot's bits.
            epoch::pin().defer(move || {
                // Release: pairs with the Acquire load in
                // `Quarantine::take`.
                raise.store(1, Ordering::Release);
            });
            w.quarantine.hold(slot, flag);
        }
        // Relaxed: a figure.
        self.counters.blocks.store(w.live as u64, Ordering::Relaxed);
    }
}
