//! The client's side of the node-wide KV store: lock-free reads of the
//! mapped store (`store_run`, `store_get*`: no round trip), and writes
//! through the daemon (`store_reserve`, a copy into the reserved slots
//! through this process's mapping, `store_commit`; `store_put*` does all
//! three).

use super::{Client, ClientError, ProtocolError};
use crate::op::{check_key, KeyList, Rejection, StoreReply, StoreRequest};
use crate::store::{
    pieces_fit, StoreError, StoreItem, StoreMap, StoreNs, StoreReader, StoreSlot, StoreStats,
};
use crate::wire::Call;

/// Keys per reserve request (a batch larger is sent in pieces).
const RESERVE_BATCH: usize = 4096;

fn rejected(e: StoreError) -> ClientError {
    ClientError::Rejected(Rejection::from(e))
}

/// Maps the store of daemon `name` when its segment says it has one
/// (`store_bytes` > 0).
pub(super) fn map(name: &str, store_bytes: u64) -> Result<Option<StoreMap>, ClientError> {
    if store_bytes == 0 {
        return Ok(None);
    }
    let map = StoreMap::open(name).map_err(|e| {
        ClientError::Rejected(Rejection::new(
            crate::op::ErrorKind::NoStore,
            format!("cannot map the daemon's store: {e}"),
        ))
    })?;
    if map.view().layout().config.data_bytes != store_bytes {
        return Err(ClientError::LayoutMismatch);
    }
    Ok(Some(map))
}

impl Client {
    /// Whether the daemon keeps a store (`radixd serve --store SIZE`).
    pub fn has_store(&self) -> bool {
        self.store.is_some()
    }

    fn store_reader(&self) -> Result<StoreReader, ClientError> {
        let map = self
            .store
            .as_ref()
            .ok_or_else(|| rejected(StoreError::NoStore))?;
        Ok(StoreReader::new(map.view(), self.slot))
    }

    /// Registers namespace `name` with values of `value_size` bytes (or
    /// finds it, registered with that size by anyone): once per backend.
    pub fn store_namespace(&mut self, name: &str, value_size: u64) -> Result<StoreNs, ClientError> {
        self.store_reader()?;
        let request = StoreRequest::Namespace {
            name: name.as_bytes().to_vec(),
            value_size,
        };
        match self.send(Call::Store(&request))? {
            crate::op::Reply::Store(StoreReply::Namespace(ns)) => Ok(ns),
            other => Err(super::unexpected(other)),
        }
    }

    /// The namespace `name` if anyone registered it (lock-free).
    pub fn store_find_namespace(&self, name: &str) -> Result<Option<StoreNs>, ClientError> {
        Ok(self.store_reader()?.namespace(name.as_bytes()))
    }

    /// The namespace of id `id` if anyone registered it (lock-free): ids
    /// are the node's, so one client may use an id another registered.
    pub fn store_namespace_by_id(&self, id: u32) -> Result<Option<StoreNs>, ClientError> {
        Ok(self.store_reader()?.namespace_by_id(id))
    }

    /// How many of `keys`, from the first, are stored in `ns` (lock-free:
    /// `batch_exists`).
    pub fn store_run(&self, ns: StoreNs, keys: &[&[u8]]) -> Result<usize, ClientError> {
        let reader = self.store_reader()?;
        for k in keys {
            check_key(k).map_err(rejected)?;
        }
        self.announced(|| Some(reader.run(ns, keys)))
    }

    /// Whether `key` is stored in `ns` (lock-free).
    pub fn store_exists(&self, ns: StoreNs, key: &[u8]) -> Result<bool, ClientError> {
        self.store_run(ns, &[key]).map(|n| n == 1)
    }

    /// Copies the value of `key` into `out` (exactly `ns.value_size`
    /// bytes); `false` for a miss (`out` then holds garbage). Lock-free.
    pub fn store_get(&self, ns: StoreNs, key: &[u8], out: &mut [u8]) -> Result<bool, ClientError> {
        let pieces = [(out.as_mut_ptr(), out.len())];
        // SAFETY: `out` is a live, exclusive buffer of the pieces' length.
        unsafe { self.store_get_raw(ns, key, &pieces) }
    }

    /// [`Client::store_get`] into raw pieces of memory that together hold
    /// `ns.value_size` bytes (a zero-copy destination such as a pinned
    /// host buffer).
    ///
    /// # Safety
    ///
    /// Every piece must be valid for writes of its length for the whole
    /// call, and no two pieces may overlap (nor the store's mapping).
    pub unsafe fn store_get_raw(
        &self,
        ns: StoreNs,
        key: &[u8],
        pieces: &[(*mut u8, usize)],
    ) -> Result<bool, ClientError> {
        // SAFETY: forwarded from the caller.
        let hits = unsafe { self.store_get_many_raw(ns, &[key], &[pieces])? };
        Ok(hits.first().copied().unwrap_or(false))
    }

    /// [`Client::store_get`] of many keys under one reader announcement.
    pub fn store_get_many(
        &self,
        ns: StoreNs,
        keys: &[&[u8]],
        outs: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, ClientError> {
        let pieces: Vec<[(*mut u8, usize); 1]> = outs
            .iter_mut()
            .map(|o| [(o.as_mut_ptr(), o.len())])
            .collect();
        let refs: Vec<&[(*mut u8, usize)]> = pieces.iter().map(|p| &p[..]).collect();
        // SAFETY: each piece is one of the caller's distinct `&mut`
        // buffers, live for the call.
        unsafe { self.store_get_many_raw(ns, keys, &refs) }
    }

    /// [`Client::store_get_raw`] of many keys under one reader
    /// announcement (one clock stamp per batch, the keys stamped in
    /// order); `pieces[i]` receives the value of `keys[i]`.
    ///
    /// # Safety
    ///
    /// As for [`Client::store_get_raw`], for every key's pieces, and no
    /// piece of one key overlaps a piece of another.
    pub unsafe fn store_get_many_raw(
        &self,
        ns: StoreNs,
        keys: &[&[u8]],
        pieces: &[&[(*mut u8, usize)]],
    ) -> Result<Vec<bool>, ClientError> {
        let reader = self.store_reader()?;
        if keys.len() != pieces.len() {
            return Err(ClientError::Rejected(Rejection::new(
                crate::op::ErrorKind::Malformed,
                format!("{} keys and {} destinations", keys.len(), pieces.len()),
            )));
        }
        for (key, p) in keys.iter().zip(pieces) {
            check_key(key).map_err(rejected)?;
            if !pieces_fit(p, ns.value_size) {
                let got = p.iter().map(|&(_, n)| n as u64).sum();
                return Err(rejected(StoreError::SizeMismatch {
                    expected: ns.value_size,
                    got,
                }));
            }
        }
        let stamp = reader.stamps(keys.len() as u64);
        let mut hits = Vec::with_capacity(keys.len());
        let read = self.announced(|| {
            hits.clear();
            for (i, (key, p)) in keys.iter().zip(pieces).enumerate() {
                // SAFETY: forwarded from the caller; the pieces hold
                // exactly the value's size (checked above).
                hits.push(unsafe { reader.get_raw(ns, key, p, stamp + i as u64) });
            }
            Some(())
        });
        match read {
            Ok(()) => {}
            // Expired on every try (this process kept stalling): what the
            // copies hold cannot be trusted, so every key is a miss.
            Err(ClientError::Contended) => {
                hits.clear();
                hits.resize(keys.len(), false);
            }
            Err(e) => return Err(e),
        }
        let found = hits.iter().filter(|&&h| h).count() as u64;
        reader.count(found, keys.len() as u64 - found);
        Ok(hits)
    }

    /// Reserves a slot in `ns` for each key not stored (or reserved) by
    /// anyone yet: `None` for the others. `parents` is empty or names, per
    /// key, the key stored before it. The caller copies each value into
    /// its slot ([`Client::store_write`]) and then commits or aborts; if
    /// it dies first, the daemon gives the slots back.
    pub fn store_reserve(
        &mut self,
        ns: StoreNs,
        keys: &[&[u8]],
        parents: &[Option<&[u8]>],
    ) -> Result<Vec<Option<StoreSlot>>, ClientError> {
        self.store_reader()?;
        if !parents.is_empty() && parents.len() != keys.len() {
            return Err(ClientError::Rejected(Rejection::new(
                crate::op::ErrorKind::Malformed,
                format!("{} keys and {} parents", keys.len(), parents.len()),
            )));
        }
        for k in keys.iter().chain(parents.iter().flatten()) {
            check_key(k).map_err(rejected)?;
        }
        let mut out = Vec::with_capacity(keys.len());
        for (i, chunk) in keys.chunks(RESERVE_BATCH).enumerate() {
            let mut list = KeyList::default();
            for (j, key) in chunk.iter().enumerate() {
                let parent = parents.get(i * RESERVE_BATCH + j).copied().flatten();
                list.push(key, parent);
            }
            let request = StoreRequest::Reserve {
                ns: ns.id,
                keys: list,
            };
            match self.send(Call::Store(&request)) {
                Ok(crate::op::Reply::Store(StoreReply::Reserved(slots)))
                    if slots.len() == chunk.len() =>
                {
                    out.extend(slots)
                }
                Ok(other) => return Err(super::unexpected(other)),
                Err(e) => {
                    // Earlier chunks stay reserved: give them back.
                    let held: Vec<StoreSlot> = out.iter().flatten().copied().collect();
                    if !held.is_empty() {
                        drop(self.store_abort(ns, &held));
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Where the value of reserved `slot` goes in this process's mapping
    /// (`ns.value_size` writable bytes), for callers that copy themselves.
    pub fn store_slot_ptr(&self, ns: StoreNs, slot: &StoreSlot) -> Result<*mut u8, ClientError> {
        let map = self
            .store
            .as_ref()
            .ok_or_else(|| rejected(StoreError::NoStore))?;
        map.view()
            .data(slot.offset, ns.value_size)
            .ok_or(ClientError::Protocol(ProtocolError::Unexpected(
                "a slot outside the store's data",
            )))
    }

    /// Copies `value` into reserved `slot`.
    pub fn store_write(
        &self,
        ns: StoreNs,
        slot: &StoreSlot,
        value: &[u8],
    ) -> Result<(), ClientError> {
        let pieces = [(value.as_ptr(), value.len())];
        // SAFETY: `value` is a live buffer of the piece's length.
        unsafe { self.store_write_raw(ns, slot, &pieces) }
    }

    /// Copies raw pieces (together `ns.value_size` bytes) into reserved
    /// `slot`.
    ///
    /// # Safety
    ///
    /// Every piece must be valid for reads of its length for the whole
    /// call.
    pub unsafe fn store_write_raw(
        &self,
        ns: StoreNs,
        slot: &StoreSlot,
        pieces: &[(*const u8, usize)],
    ) -> Result<(), ClientError> {
        let total = pieces
            .iter()
            .try_fold(0u64, |a, &(_, n)| a.checked_add(n as u64));
        if total != Some(ns.value_size) {
            return Err(rejected(StoreError::SizeMismatch {
                expected: ns.value_size,
                got: total.unwrap_or(u64::MAX),
            }));
        }
        // Checks that the whole slot lies in the data region.
        self.store_slot_ptr(ns, slot)?;
        let view = self
            .store
            .as_ref()
            .ok_or_else(|| rejected(StoreError::NoStore))?
            .view();
        let mut at = 0u64;
        for &(src, len) in pieces {
            // SAFETY: the slot is reserved for this client and lies in the
            // data region (checked above); the pieces sum to `value_size`;
            // the caller vouches for `src`.
            unsafe { view.copy_in(slot.offset + at, src, len) };
            at += len as u64;
        }
        Ok(())
    }

    /// Publishes reserved slots this client filled; returns how many.
    /// A slot it did not reserve fails the whole call (`not_reserved`),
    /// committing nothing.
    pub fn store_commit(&mut self, ns: StoreNs, slots: &[StoreSlot]) -> Result<usize, ClientError> {
        self.store_done(StoreRequest::Commit {
            ns: ns.id,
            slots: slots.to_vec(),
        })
    }

    /// Gives back reserved slots without publishing them.
    pub fn store_abort(&mut self, ns: StoreNs, slots: &[StoreSlot]) -> Result<usize, ClientError> {
        self.store_done(StoreRequest::Abort {
            ns: ns.id,
            slots: slots.to_vec(),
        })
    }

    fn store_done(&mut self, request: StoreRequest) -> Result<usize, ClientError> {
        self.store_reader()?;
        match self.send(Call::Store(&request))? {
            crate::op::Reply::Store(StoreReply::Done(n)) => Ok(n as usize),
            other => Err(super::unexpected(other)),
        }
    }

    /// Stores each item not stored by anyone yet: `true` stored now,
    /// `false` already there. Reserve, copy, commit.
    pub fn store_put(
        &mut self,
        ns: StoreNs,
        items: &[StoreItem<'_>],
    ) -> Result<Vec<bool>, ClientError> {
        let keys: Vec<&[u8]> = items.iter().map(|i| i.key).collect();
        let parents: Vec<Option<&[u8]>> = items.iter().map(|i| i.parent).collect();
        let pieces: Vec<[(*const u8, usize); 1]> = items
            .iter()
            .map(|i| [(i.value.as_ptr(), i.value.len())])
            .collect();
        let refs: Vec<&[(*const u8, usize)]> = pieces.iter().map(|p| &p[..]).collect();
        // SAFETY: each piece is an item's live value.
        unsafe { self.store_put_raw(ns, &keys, &parents, &refs) }
    }

    /// [`Client::store_put`] from raw pieces: `pieces[i]` (together
    /// `ns.value_size` bytes) is the value of `keys[i]`.
    ///
    /// # Safety
    ///
    /// Every piece must be valid for reads of its length for the whole
    /// call.
    pub unsafe fn store_put_raw(
        &mut self,
        ns: StoreNs,
        keys: &[&[u8]],
        parents: &[Option<&[u8]>],
        pieces: &[&[(*const u8, usize)]],
    ) -> Result<Vec<bool>, ClientError> {
        if keys.len() != pieces.len() {
            return Err(ClientError::Rejected(Rejection::new(
                crate::op::ErrorKind::Malformed,
                format!("{} keys and {} values", keys.len(), pieces.len()),
            )));
        }
        for p in pieces {
            let total = p.iter().map(|&(_, n)| n as u64).sum::<u64>();
            if total != ns.value_size {
                return Err(rejected(StoreError::SizeMismatch {
                    expected: ns.value_size,
                    got: total,
                }));
            }
        }
        let slots = self.store_reserve(ns, keys, parents)?;
        let mut taken = Vec::with_capacity(slots.len());
        for (slot, p) in slots.iter().zip(pieces) {
            let Some(slot) = slot else { continue };
            // SAFETY: forwarded from the caller.
            if let Err(e) = unsafe { self.store_write_raw(ns, slot, p) } {
                let held: Vec<StoreSlot> = slots.iter().flatten().copied().collect();
                drop(self.store_abort(ns, &held));
                return Err(e);
            }
            taken.push(*slot);
        }
        if !taken.is_empty() {
            self.store_commit(ns, &taken)?;
        }
        Ok(slots.iter().map(Option::is_some).collect())
    }

    /// Drops every committed value of `ns` (SGLang's `clear()` of one
    /// server's L3: other namespaces keep theirs); returns how many. A
    /// reader copying one of them meanwhile gets its bytes or a miss;
    /// slots reserved and not yet committed stay their clients'.
    pub fn store_clear(&mut self, ns: StoreNs) -> Result<u64, ClientError> {
        self.store_reader()?;
        match self.send(Call::Store(&StoreRequest::Clear { ns: ns.id }))? {
            crate::op::Reply::Store(StoreReply::Done(n)) => Ok(n),
            other => Err(super::unexpected(other)),
        }
    }

    /// The store's figures, read from shared memory.
    pub fn store_stats(&self) -> Result<StoreStats, ClientError> {
        Ok(self.store_reader()?.stats())
    }
}

impl crate::op::StoreAccess for Client {
    fn namespace(&mut self, name: &[u8], value_size: u64) -> Result<StoreNs, Rejection> {
        let name = std::str::from_utf8(name).map_err(|_| {
            Rejection::new(
                crate::op::ErrorKind::Malformed,
                "namespace name is not UTF-8",
            )
        })?;
        self.store_namespace(name, value_size).map_err(to_rejection)
    }

    fn find_namespace(&self, name: &[u8]) -> Result<Option<StoreNs>, Rejection> {
        Ok(self.store_reader().map_err(to_rejection)?.namespace(name))
    }

    fn put(&mut self, ns: StoreNs, items: &[StoreItem<'_>]) -> Result<Vec<bool>, Rejection> {
        self.store_put(ns, items).map_err(to_rejection)
    }

    fn get(&self, ns: StoreNs, key: &[u8], out: &mut [u8]) -> Result<bool, Rejection> {
        self.store_get(ns, key, out).map_err(to_rejection)
    }

    fn run(&self, ns: StoreNs, keys: &[&[u8]]) -> Result<usize, Rejection> {
        self.store_run(ns, keys).map_err(to_rejection)
    }

    fn clear(&mut self, ns: StoreNs) -> Result<u64, Rejection> {
        self.store_clear(ns).map_err(to_rejection)
    }

    fn stats(&self) -> Result<StoreStats, Rejection> {
        self.store_stats().map_err(to_rejection)
    }
}

fn to_rejection(e: ClientError) -> Rejection {
    match e {
        ClientError::Rejected(r) => r,
        ClientError::DaemonGone => Rejection::new(crate::op::ErrorKind::DaemonGone, e.to_string()),
        ClientError::Timeout => Rejection::new(crate::op::ErrorKind::Timeout, e.to_string()),
        ClientError::TooLarge { .. } => {
            Rejection::new(crate::op::ErrorKind::TooLarge, e.to_string())
        }
        other => Rejection::new(crate::op::ErrorKind::Protocol, other.to_string()),
    }
}
