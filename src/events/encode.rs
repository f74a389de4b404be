//! From what an engine recorded ([`CacheEvent`]: page ids and tokens) to
//! vLLM's events: each page hashed once, chained from its parent, and the
//! hash remembered until the page is evicted, so a `BlockRemoved` names
//! the hashes of the pages that went. The publisher thread encodes with
//! it; so can a test or a router fed in-process (`radixd::index`).

use std::collections::HashMap;

use super::batch::{BatchLayout, BatchWriter};
use super::hash::{FullHash, Scheme};
use super::CacheEvent;

/// One engine's events, encoded into `KVEventBatch` payloads.
pub struct EventEncoder {
    scheme: Scheme,
    page_size: u32,
    medium: String,
    /// Full hash of every cached page.
    hashes: HashMap<u32, FullHash>,
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
            hashes: HashMap::new(),
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
            } => {
                let p = self.page_size as usize;
                // A parent the table does not know cannot happen while the
                // record is complete; hashing from the root then is the
                // least wrong answer.
                let mut prev = parent.and_then(|pg| self.hashes.get(&pg).copied());
                let parent_ext = prev.as_ref().map(|h| self.scheme.external(h));
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
                self.writer
                    .stored(&ext, parent_ext, toks, self.page_size, &self.medium);
            }
            CacheEvent::Removed { pages } => {
                let ext: Vec<u64> = pages
                    .iter()
                    .filter_map(|pg| self.hashes.remove(pg))
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

    /// The payload of the batch built so far (`[ts, [events...], rank]`);
    /// the next batch starts empty.
    pub fn finish(&mut self, ts: f64, data_parallel_rank: u32) -> Vec<u8> {
        self.writer.finish(ts, data_parallel_rank)
    }
}
