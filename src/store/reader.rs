//! [`StoreReader`]: the lock-free read of the store from any process: find
//! a committed key, copy its value out, and know the copy is exactly the
//! value committed under that key, or report a miss.
//!
//! The caller runs every read inside its reader announcement (the cache
//! segment's reader epochs, `ReaderSlot::read`): while announced and not
//! expired, the daemon reuses no entry or data slot the read may reach
//! (they wait in the index's limbo). Each entry is validated against its
//! [`Version`](radixd_ipc::Version) before its fields are trusted and
//! again after the value is copied, so even an expired reader (stopped
//! for longer than the expiry) never returns torn bytes or another key's
//! bytes: its version check fails and the read is a miss.

use radixd_ipc::sync::Ordering;

use super::layout::{key_hash, key_words, COMMITTED, MAX_KEY, MAX_NAME, NAMESPACES, NIL};
use super::view::StoreView;
use super::StoreNs;

/// Longest chain walk (the daemon keeps chains short: as many buckets as
/// entries).
pub const MAX_WALK: usize = 256;
/// Walks started over when the daemon changed an entry under the walk
/// (then a miss). Two under loom: each restart's loads multiply the
/// executions, and how many a reader makes only decides when it gives up.
pub const RESTARTS: usize = if cfg!(loom) { 2 } else { 8 };

/// A committed entry found under a key: where, at which version, and where
/// its value lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub index: u32,
    pub version: u32,
    pub data: u64,
}

/// Lock-free reads of a mapped store (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct StoreReader {
    view: StoreView,
    /// The caller's client slot (its hit/miss counters).
    client: u32,
}

impl StoreReader {
    /// A reader over `view` counting into client slot `client`'s counters.
    pub fn new(view: StoreView, client: u32) -> Self {
        Self { view, client }
    }

    /// The view read.
    pub fn view(&self) -> &StoreView {
        &self.view
    }

    /// The registered namespace named `name`.
    pub fn namespace(&self, name: &[u8]) -> Option<StoreNs> {
        if name.is_empty() || name.len() > MAX_NAME {
            return None;
        }
        let want = key_words(name);
        (0..NAMESPACES).find_map(|i| {
            let n = self.view.namespace(i)?;
            // Acquire: pairs with the Release store of `state` in
            // `StoreIndex::namespace`: the record's fields are in place.
            if n.state.load(Ordering::Acquire) != 1
                // Relaxed: ordered by the Acquire above.
                || n.name_len.load(Ordering::Relaxed) as usize != name.len()
                || !n
                    .name
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.load(Ordering::Relaxed) == *b)
            {
                return None;
            }
            Some(StoreNs {
                id: i,
                value_size: n.value_size.load(Ordering::Relaxed),
            })
        })
    }

    /// The registered namespace of id `id` (ids are the node's: a client
    /// may use one another client registered); `None` when out of range or
    /// free.
    pub fn namespace_by_id(&self, id: u32) -> Option<StoreNs> {
        let n = self.view.namespace(id)?;
        // Acquire: pairs with the Release store of `state` in
        // `StoreIndex::namespace`: the record's fields are in place.
        if n.state.load(Ordering::Acquire) != 1 {
            return None;
        }
        Some(StoreNs {
            id,
            // Relaxed: ordered by the Acquire above.
            value_size: n.value_size.load(Ordering::Relaxed),
        })
    }

    /// The committed entry of `key` in `ns`, if any.
    pub fn find(&self, ns: StoreNs, key: &[u8]) -> Option<Found> {
        if key.is_empty() || key.len() > MAX_KEY {
            return None;
        }
        let hash = key_hash(ns.id, key);
        let words = key_words(key);
        'walk: for _ in 0..RESTARTS {
            // Acquire: pairs with the daemon's Release store of the bucket
            // head after it wrote the entry the head names.
            let mut at = self.view.bucket(hash).load(Ordering::Acquire);
            for _ in 0..MAX_WALK {
                if at == NIL {
                    return None;
                }
                let entry = self.view.entry(at)?;
                let Some(v) = entry.version.stable() else {
                    continue 'walk;
                };
                // Relaxed, all: validated by `still(v)` below (the seqlock's
                // Acquire fence).
                let next = entry.next.load(Ordering::Relaxed);
                // Only the words the key covers: equal lengths and equal
                // (zero-padded) words up to it are equal keys.
                let hit = entry.hash.load(Ordering::Relaxed) == hash
                    && entry.state.load(Ordering::Relaxed) == COMMITTED
                    && entry.ns.load(Ordering::Relaxed) == ns.id
                    && entry.key_len.load(Ordering::Relaxed) as usize == key.len()
                    && entry
                        .key
                        .iter()
                        .zip(&words[..key.len().div_ceil(8)])
                        .all(|(a, b)| a.load(Ordering::Relaxed) == *b);
                let data = entry.data.load(Ordering::Relaxed);
                if !entry.version.still(v) {
                    continue 'walk;
                }
                if hit {
                    return Some(Found {
                        index: at,
                        version: v,
                        data,
                    });
                }
                at = next;
            }
            return None;
        }
        None
    }

    /// Whether `key` is stored in `ns`.
    pub fn exists(&self, ns: StoreNs, key: &[u8]) -> bool {
        self.find(ns, key).is_some()
    }

    /// How many of `keys`, from the first, are stored in `ns`.
    pub fn run<K: AsRef<[u8]>>(&self, ns: StoreNs, keys: &[K]) -> usize {
        keys.iter()
            .take_while(|k| self.exists(ns, k.as_ref()))
            .count()
    }

    /// Copies the value of `key` into `pieces` (which together hold
    /// exactly `ns.value_size` bytes) and stamps its use with `stamp`;
    /// `true` when the pieces hold exactly the value committed under
    /// `key`, `false` for a miss (the pieces then hold garbage).
    ///
    /// # Safety
    ///
    /// Every piece must be valid for writes of its length and overlap
    /// neither another piece nor the store's mapping.
    pub unsafe fn get_raw(
        &self,
        ns: StoreNs,
        key: &[u8],
        pieces: &[(*mut u8, usize)],
        stamp: u64,
    ) -> bool {
        for _ in 0..2 {
            let Some(found) = self.find(ns, key) else {
                return false;
            };
            // SAFETY: forwarded from the caller.
            if unsafe { self.copy_found(ns, found, pieces, stamp) } {
                return true;
            }
        }
        false
    }

    /// The second half of [`StoreReader::get_raw`]: copies the value of the
    /// entry `found` into `pieces`, then re-checks the entry's version;
    /// `true` (and the use stamped) only if the entry did not change since
    /// `find` validated it, so the bytes are the ones committed under the
    /// key it matched.
    ///
    /// # Safety
    ///
    /// As for [`StoreReader::get_raw`].
    pub unsafe fn copy_found(
        &self,
        ns: StoreNs,
        found: Found,
        pieces: &[(*mut u8, usize)],
        stamp: u64,
    ) -> bool {
        let mut at = 0usize;
        for &(dst, len) in pieces {
            if at + len > ns.value_size as usize {
                return false;
            }
            // SAFETY: the caller vouches for `dst`; `copy_out` checks the
            // source lies in the data region. Another process may write
            // the source meanwhile (a reused slot of an expired reader):
            // the version check below then throws the copy away.
            if !unsafe { self.view.copy_out(found.data + at as u64, dst, len) } {
                return false;
            }
            at += len;
        }
        let Some(entry) = self.view.entry(found.index) else {
            return false;
        };
        if !entry.version.still(found.version) {
            return false;
        }
        if let Some(s) = self.view.stamp(found.index) {
            // Relaxed: a hint the daemon reads when it picks a victim; no
            // data depends on it.
            s.fetch_max(stamp, Ordering::Relaxed);
        }
        true
    }

    /// Takes `n` use stamps from the store's clock; the first is returned.
    pub fn stamps(&self, n: u64) -> u64 {
        // Relaxed: the clock only orders uses; nothing is published by it.
        self.view.clock().fetch_add(n, Ordering::Relaxed)
    }

    /// Counts hits and misses into this client's counters.
    pub fn count(&self, hits: u64, misses: u64) {
        if let Some(c) = self.view.counters(self.client) {
            // Relaxed: figures.
            if hits > 0 {
                c.hits.fetch_add(hits, Ordering::Relaxed);
            }
            if misses > 0 {
                c.misses.fetch_add(misses, Ordering::Relaxed);
            }
        }
    }

    /// The store's figures (the daemon's and the readers' counters).
    pub fn stats(&self) -> super::StoreStats {
        let h = self.view.header();
        // Relaxed, all: figures, a best-effort snapshot.
        let get = |x: &radixd_ipc::sync::AtomicU64| x.load(Ordering::Relaxed);
        let (mut hits, mut misses) = (get(&h.retired_hits), get(&h.retired_misses));
        for i in 0..self.view.layout().config.clients {
            if let Some(c) = self.view.counters(i) {
                hits = hits.wrapping_add(get(&c.hits));
                misses = misses.wrapping_add(get(&c.misses));
            }
        }
        let layout = self.view.layout();
        let own = self.view.counters(self.client);
        super::StoreStats {
            client_hits: own.map_or(0, |c| get(&c.hits)),
            client_misses: own.map_or(0, |c| get(&c.misses)),
            values: get(&h.values),
            bytes: get(&h.bytes),
            capacity_bytes: layout.config.data_bytes,
            namespaces: get(&h.namespaces),
            hits,
            misses,
            evicted: get(&h.evicted),
            failed_reserves: get(&h.failed_reserves),
        }
    }
}
