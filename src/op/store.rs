//! The store's requests through the rings (reads never travel: clients
//! read the store lock-free), their answers, and how a [`StoreError`]
//! becomes a typed [`Rejection`].

use super::{ErrorKind, Rejection};
use crate::store::{
    HeapStore, StoreError, StoreIndex, StoreItem, StoreNs, StoreSlot, StoreStats, MAX_KEY,
};

/// A store request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreRequest {
    /// Registers (or finds) a namespace with values of `value_size` bytes.
    Namespace { name: Vec<u8>, value_size: u64 },
    /// A slot for each key not stored yet ([`StoreReply::Reserved`]).
    Reserve { ns: u32, keys: KeyList },
    /// Publishes reserved slots the client filled.
    Commit { ns: u32, slots: Vec<StoreSlot> },
    /// Gives back reserved slots.
    Abort { ns: u32, slots: Vec<StoreSlot> },
    /// Drops every committed value of a namespace ([`StoreReply::Done`]:
    /// how many).
    Clear { ns: u32 },
}

/// The answer to a store request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreReply {
    Namespace(StoreNs),
    /// Per key: its slot, or `None` when it was stored or reserved already.
    Reserved(Vec<Option<StoreSlot>>),
    /// Slots committed or aborted, or values cleared.
    Done(u64),
}

/// Keys and their parents, packed as they travel: per key a `u32` key
/// length, a `u32` parent length ([`NO_PARENT`]: none), the key's bytes,
/// then the parent's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyList {
    pub bytes: Vec<u8>,
    pub count: u32,
}

/// Keys and, per key, its parent: a [`KeyList`] split.
pub type SplitKeys<'a> = (Vec<&'a [u8]>, Vec<Option<&'a [u8]>>);

/// Parent length of a key without a parent.
pub const NO_PARENT: u32 = u32::MAX;

impl KeyList {
    /// Appends `key` (after `parent`).
    pub fn push(&mut self, key: &[u8], parent: Option<&[u8]>) {
        self.bytes
            .extend_from_slice(&(key.len() as u32).to_ne_bytes());
        let plen = parent.map_or(NO_PARENT, |p| p.len() as u32);
        self.bytes.extend_from_slice(&plen.to_ne_bytes());
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(parent.unwrap_or_default());
        self.count += 1;
    }

    /// The keys and parents, checked: every length within bounds and the
    /// pieces exactly filling the bytes.
    pub fn split(&self) -> Result<SplitKeys<'_>, Rejection> {
        let mut keys = Vec::with_capacity(self.count as usize);
        let mut parents = Vec::with_capacity(self.count as usize);
        let mut rest = &self.bytes[..];
        let word = |b: &[u8]| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        for _ in 0..self.count {
            if rest.len() < 8 {
                return Err(Rejection::new(ErrorKind::Malformed, "key list cut short"));
            }
            let (klen, plen) = (word(&rest[..4]) as usize, word(&rest[4..8]));
            rest = &rest[8..];
            let plen_bytes = if plen == NO_PARENT { 0 } else { plen as usize };
            for len in [klen]
                .into_iter()
                .chain((plen != NO_PARENT).then_some(plen_bytes))
            {
                if len == 0 || len > MAX_KEY {
                    return Err(StoreError::BadKey { len }.into());
                }
            }
            if rest.len() < klen + plen_bytes {
                return Err(Rejection::new(ErrorKind::Malformed, "key list cut short"));
            }
            keys.push(&rest[..klen]);
            parents.push((plen != NO_PARENT).then(|| &rest[klen..klen + plen_bytes]));
            rest = &rest[klen + plen_bytes..];
        }
        if !rest.is_empty() {
            return Err(Rejection::new(
                ErrorKind::Malformed,
                "bytes after the key list",
            ));
        }
        Ok((keys, parents))
    }
}

impl From<StoreError> for Rejection {
    fn from(e: StoreError) -> Self {
        let kind = match e {
            StoreError::NoStore => ErrorKind::NoStore,
            StoreError::BadKey { .. } => ErrorKind::BadKey,
            StoreError::BadName { .. } => ErrorKind::Malformed,
            StoreError::SizeMismatch { .. } => ErrorKind::SizeMismatch,
            StoreError::ValueTooLarge { .. } => ErrorKind::TooLarge,
            StoreError::UnknownNamespace { .. } => ErrorKind::UnknownNamespace,
            StoreError::TooManyNamespaces | StoreError::StoreFull { .. } => ErrorKind::StoreFull,
            StoreError::NotReserved { .. } => ErrorKind::NotReserved,
        };
        Self::new(kind, e.to_string())
    }
}

/// Carries out `request` for `owner` (see [`crate::store::owner`]) on
/// `store` (`None`: the daemon has no store).
pub fn apply_store(
    store: Option<&mut StoreIndex>,
    owner: u64,
    request: StoreRequest,
) -> Result<StoreReply, Rejection> {
    let store = store.ok_or(StoreError::NoStore)?;
    Ok(match request {
        StoreRequest::Namespace { name, value_size } => {
            StoreReply::Namespace(store.namespace(&name, value_size)?)
        }
        StoreRequest::Reserve { ns, keys } => {
            let (keys, parents) = keys.split()?;
            StoreReply::Reserved(store.reserve(owner, ns, &keys, &parents)?)
        }
        StoreRequest::Commit { ns, slots } => {
            StoreReply::Done(store.commit(owner, ns, &slots)? as u64)
        }
        StoreRequest::Abort { ns, slots } => {
            StoreReply::Done(store.abort(owner, ns, &slots)? as u64)
        }
        StoreRequest::Clear { ns } => StoreReply::Done(store.clear(ns)?),
    })
}

/// A store as `radixd exec` (and other callers that do not care where it
/// lives) uses it: in this process ([`crate::store::HeapStore`]) or a
/// daemon's (through `Client`).
pub trait StoreAccess {
    /// Registers (or finds, with the same size) namespace `name`.
    fn namespace(&mut self, name: &[u8], value_size: u64) -> Result<StoreNs, Rejection>;
    /// The registered namespace `name`, if any.
    fn find_namespace(&self, name: &[u8]) -> Result<Option<StoreNs>, Rejection>;
    /// Stores each item not stored yet: `true` stored now, `false` there.
    fn put(&mut self, ns: StoreNs, items: &[StoreItem<'_>]) -> Result<Vec<bool>, Rejection>;
    /// Copies the value of `key` into `out` (its namespace's size).
    fn get(&self, ns: StoreNs, key: &[u8], out: &mut [u8]) -> Result<bool, Rejection>;
    /// How many of `keys`, from the first, are stored.
    fn run(&self, ns: StoreNs, keys: &[&[u8]]) -> Result<usize, Rejection>;
    /// Drops every committed value of `ns`; how many.
    fn clear(&mut self, ns: StoreNs) -> Result<u64, Rejection>;
    /// The store's figures.
    fn stats(&self) -> Result<StoreStats, Rejection>;
}

impl StoreAccess for HeapStore {
    fn namespace(&mut self, name: &[u8], value_size: u64) -> Result<StoreNs, Rejection> {
        Ok(self.index.namespace(name, value_size)?)
    }

    fn find_namespace(&self, name: &[u8]) -> Result<Option<StoreNs>, Rejection> {
        Ok(self.reader.namespace(name))
    }

    fn put(&mut self, ns: StoreNs, items: &[StoreItem<'_>]) -> Result<Vec<bool>, Rejection> {
        Ok(HeapStore::put(self, ns, items)?)
    }

    fn get(&self, ns: StoreNs, key: &[u8], out: &mut [u8]) -> Result<bool, Rejection> {
        check_key(key)?;
        if out.len() as u64 != ns.value_size {
            return Err(StoreError::SizeMismatch {
                expected: ns.value_size,
                got: out.len() as u64,
            }
            .into());
        }
        Ok(HeapStore::get(self, ns, key, out))
    }

    fn run(&self, ns: StoreNs, keys: &[&[u8]]) -> Result<usize, Rejection> {
        for k in keys {
            check_key(k)?;
        }
        Ok(self.reader.run(ns, keys))
    }

    fn clear(&mut self, ns: StoreNs) -> Result<u64, Rejection> {
        Ok(self.index.clear(ns.id)?)
    }

    fn stats(&self) -> Result<StoreStats, Rejection> {
        Ok(self.reader.stats())
    }
}

/// The one key rule: 1 to [`MAX_KEY`] bytes.
pub fn check_key(key: &[u8]) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > MAX_KEY {
        Err(StoreError::BadKey { len: key.len() })
    } else {
        Ok(())
    }
}

/// A backend with a store beside it (`radixd exec --store SIZE`).
pub struct WithStore<B> {
    pub inner: B,
    pub store: HeapStore,
}

impl<B: super::Backend> super::Backend for WithStore<B> {
    fn call(&mut self, request: super::Request) -> Result<super::Reply, Rejection> {
        self.inner.call(request)
    }

    fn components(&self) -> crate::engine::Components {
        self.inner.components()
    }

    fn store(&mut self) -> Option<&mut dyn StoreAccess> {
        Some(&mut self.store)
    }

    fn page_size(&self) -> Option<u32> {
        self.inner.page_size()
    }
}
