//! From what an engine recorded ([`CacheEvent`]: page ids and tokens) to
//! vLLM's events: each page hashed once, chained from its parent, and the
//! hash remembered until the page is evicted, so a `BlockRemoved` names
//! the hashes of the pages that went. The publisher thread encodes with
//! it; so can a test or a router fed in-process (`radixd::index`).

use std::collections::HashMap;

use super::batch::{BatchLayout, BatchWriter};
use super::hash::{FullHash, Scheme};
use super::store::{store_block, MEDIUM_STORE};
use super::{CacheEvent, StoreEvent};

/// A namespace as events see it.
struct Namespace {
    /// Its first pages chain from this ([`Scheme::namespace_root`]).
    root: FullHash,
    /// vLLM's `lora_id` and `lora_name` (see [`lora_of`]).
    lora: Option<(u64, Option<String>)>,
}

/// The LoRA adapter a namespace stands for: one named `lora:ID` or
/// `lora:ID:NAME` (`ID` a decimal integer, vLLM's `lora_int_id`) carries
/// `lora_id` ID and `lora_name` NAME in its `BlockStored` events; any other
/// name none.
pub fn lora_of(name: &str) -> Option<(u64, Option<String>)> {
    let rest = name.strip_prefix("lora:")?;
    let (id, adapter) = match rest.split_once(':') {
        Some((id, adapter)) => (id, Some(adapter.to_owned())),
        None => (rest, None),
    };
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((id.parse().ok()?, adapter))
}

/// The full hash of every cached page, by page id. An engine's page ids
/// are dense (below its capacity), so a flat table: one line touched per
/// page, where a `HashMap` (SipHash, then a probe missing the cache) took
/// 40% of the publisher thread's time under `radixd bench`.
#[derive(Default)]
struct PageHashes {
    /// By page id; meaningful where `cached` says so.
    hashes: Vec<FullHash>,
    /// One bit per page id: its hash is remembered.
    cached: Vec<u64>,
    len: usize,
}

impl PageHashes {
    fn get(&self, page: u32) -> Option<FullHash> {
        let i = page as usize;
        let bit = self.cached.get(i / 64)? >> (i % 64) & 1;
        (bit == 1).then(|| self.hashes[i])
    }

    fn insert(&mut self, page: u32, hash: FullHash) {
        let i = page as usize;
        if i >= self.hashes.len() {
            // Doubling: a pool's ids are met in any order.
            let n = (i + 1).next_power_of_two();
            self.hashes.resize(n, [0; 32]);
            self.cached.resize(n.div_ceil(64), 0);
        }
        self.hashes[i] = hash;
        let word = &mut self.cached[i / 64];
        self.len += usize::from(*word >> (i % 64) & 1 == 0);
        *word |= 1 << (i % 64);
    }

    fn remove(&mut self, page: u32) -> Option<FullHash> {
        let hash = self.get(page)?;
        let i = page as usize;
        self.cached[i / 64] &= !(1 << (i % 64));
        self.len -= 1;
        Some(hash)
    }

    fn clear(&mut self) {
        self.cached.fill(0);
        self.len = 0;
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// One engine's events, encoded into `KVEventBatch` payloads.
pub struct EventEncoder {
    scheme: Scheme,
    page_size: u32,
    medium: String,
    /// Full hash of every cached page.
    hashes: PageHashes,
    /// What each namespace's runs are hashed from and carry, by id (kept
    /// across a clear: ids are never reused).
    namespaces: HashMap<u32, Namespace>,
    writer: BatchWriter,
    scratch: Vec<u8>,
}

impl EventEncoder {
    /// An encoder for an engine of `page_size` tokens per page, hashing
    /// with `scheme`, writing `layout` with `medium` on every event.
    pub fn new(scheme: Scheme, page_size: u32, medium: &str, layout: BatchLayout) -> Self {
        Self {
            scheme,
            page_size,
            medium: medium.to_string(),
            hashes: PageHashes::default(),
            namespaces: HashMap::new(),
            writer: BatchWriter::with_layout(layout),
            scratch: Vec::new(),
        }
    }

    /// Events in the batch being built.
    pub fn len(&self) -> usize {
        self.writer.len()
    }

    /// Whether the batch being built is empty.
    pub fn is_empty(&self) -> bool {
        self.writer.is_empty()
    }

    /// Pages whose hashes are remembered (those cached now).
    pub fn cached_pages(&self) -> usize {
        self.hashes.len()
    }

    /// Appends `e` to the batch being built.
    pub fn event(&mut self, e: &CacheEvent) {
        match e {
            CacheEvent::Stored {
                parent,
                pages,
                tokens,
                ns,
            } => {
                let p = self.page_size as usize;
                let space = self.namespaces.get(ns);
                // A parent the table does not know cannot happen while the
                // record is complete; hashing from the root then is the
                // least wrong answer.
                let parent_hash = parent.and_then(|pg| self.hashes.get(pg));
                let parent_ext = parent_hash.as_ref().map(|h| self.scheme.external(h));
                // At the root a namespace's run chains from its own root
                // hash (announced to no one: parent_block_hash stays nil,
                // as vLLM's first block's with extra keys).
                let mut prev = parent_hash.or_else(|| space.map(|s| s.root));
                let lora = space.and_then(|s| s.lora.clone());
                let mut ext = Vec::with_capacity(pages.len());
                for (i, &page) in pages.iter().enumerate() {
                    let Some(toks) = tokens.get(i * p..(i + 1) * p) else {
                        break;
                    };
                    let full = self.scheme.block(prev.as_ref(), toks, &mut self.scratch);
                    self.hashes.insert(page, full);
                    ext.push(self.scheme.external(&full));
                    prev = Some(full);
                }
                let toks = &tokens[..(ext.len() * p).min(tokens.len())];
                let lora = lora.as_ref().map(|(id, name)| (*id, name.as_deref()));
                self.writer
                    .stored(&ext, parent_ext, toks, self.page_size, &self.medium, lora);
            }
            CacheEvent::Namespace { id, name } => {
                let space = Namespace {
                    root: self.scheme.namespace_root(name),
                    lora: lora_of(name),
                };
                self.namespaces.insert(*id, space);
            }
            CacheEvent::Removed { pages } => {
                let ext: Vec<u64> = pages
                    .iter()
                    .filter_map(|&pg| self.hashes.remove(pg))
                    .map(|h| self.scheme.external(&h))
                    .collect();
                if !ext.is_empty() {
                    self.writer.removed(&ext, &self.medium);
                }
            }
            CacheEvent::Cleared => {
                self.hashes.clear();
                self.writer.cleared();
            }
        }
    }

    /// Appends the node store's event `e` to the batch being built: one
    /// block, hashed from its key ([`store_block`]), its parent's from the
    /// parent's key, medium `CPU`, no tokens (the store keeps none), the
    /// engine's page size as `block_size`.
    pub fn store_event(&mut self, e: &StoreEvent) {
        match e {
            StoreEvent::Stored { key, parent, .. } => {
                let b = store_block(key);
                let parent = parent.as_deref().map(|p| store_block(p).hash);
                self.writer.stored_in_group(
                    &[b.hash],
                    parent,
                    &[],
                    self.page_size,
                    MEDIUM_STORE,
                    None,
                    b.group_idx,
                );
            }
            StoreEvent::Removed { key, .. } => {
                self.writer.removed(&[store_block(key).hash], MEDIUM_STORE);
            }
        }
    }

    /// The payload of the batch built so far (`[ts, [events...], rank]`);
    /// the next batch starts empty.
    pub fn finish(&mut self, ts: f64, data_parallel_rank: u32) -> Vec<u8> {
        self.writer.finish(ts, data_parallel_rank)
    }
}

#[cfg(test)]
mod tests {
    use super::PageHashes;

    #[test]
    fn page_hashes_remember_each_page_until_removed_or_cleared() {
        let mut t = PageHashes::default();
        assert_eq!(t.get(0), None);
        assert_eq!(t.remove(70), None);
        t.insert(70, [7; 32]);
        t.insert(3, [3; 32]);
        // Again: replaced, not counted twice.
        t.insert(70, [8; 32]);
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t.get(70), t.get(3), t.get(71)),
            (Some([8; 32]), Some([3; 32]), None)
        );
        assert_eq!(t.remove(70), Some([8; 32]));
        assert_eq!((t.remove(70), t.get(70), t.len()), (None, None, 1));
        t.clear();
        assert_eq!((t.get(3), t.len()), (None, 0));
        // Past every id met so far, and far from them.
        t.insert(5000, [5; 32]);
        assert_eq!(
            (t.get(5000), t.get(4999), t.len()),
            (Some([5; 32]), None, 1)
        );
    }
}
