//! Lock-free reads of a tree another process is changing: the longest
//! cached prefix of a key, without a round trip and without taking locks.
//!
//! The writer brackets every structural change (split, new leaf, eviction,
//! format) with the region's sequence word ([`SeqLock`]); LRU touches and
//! lock counts are not structural and do not disturb readers. A reader walks
//! the tree with volatile copies of each record, checks every index against
//! the layout before following it, bounds every loop, and keeps the answer
//! only if the sequence did not move. A node or page freed and reused during
//! the walk moved the sequence too, so no reader ever acts on a recycled
//! record, and freed records need no epoch-based reclamation: the segment is
//! never unmapped under a reader, and every byte of it is a valid record.

use std::mem::size_of;
use std::ptr::NonNull;

use radixd_ipc::SeqLock;

use super::arena::same_tokens;
use super::layout::{Bucket, EngineLayout, Node, Page, NIL, NODE_LIVE, PAGE_CACHED, ROOT};
use super::table::child_hash;

/// Reads a region mapped (possibly read-only) from a running engine.
pub struct TreeReader {
    base: NonNull<u8>,
    layout: EngineLayout,
}

/// Tries before a reader that keeps colliding with writes gives up.
const TRIES: u32 = 64;

impl TreeReader {
    /// A reader of the engine region of `layout` at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be aligned to [`REGION_ALIGN`](super::REGION_ALIGN) and
    /// valid for reads of `layout.size()` bytes for as long as the reader
    /// lives (a shared mapping that stays mapped). Other processes may write
    /// it; this reader only ever copies out of it.
    pub unsafe fn new(base: NonNull<u8>, layout: EngineLayout) -> Self {
        Self { base, layout }
    }

    fn seq(&self) -> &SeqLock {
        // SAFETY: offset 0 holds the sequence word (see `layout`), aligned,
        // inside the region (the caller's contract); a shared reference to
        // an atomic is sound while another process writes it.
        unsafe { self.base.cast::<SeqLock>().as_ref() }
    }

    /// A volatile copy of record `index` of the array at `at`, if in range.
    fn get<T: Copy>(&self, at: usize, len: usize, index: u32) -> Option<T> {
        let index = index as usize;
        if index >= len {
            return None;
        }
        // SAFETY: `at + index * size_of::<T>()` lies inside the region (the
        // layout placed `len` records of `T` at `at`, and `index < len`),
        // aligned for `T`; `T` is plain integers, so whatever bits a racing
        // writer left make a valid value, which the seqlock then judges.
        Some(unsafe {
            self.base
                .as_ptr()
                .add(at + index * size_of::<T>())
                .cast::<T>()
                .read_volatile()
        })
    }

    fn node(&self, i: u32) -> Option<Node> {
        self.get(self.layout.nodes_at, self.layout.node_cap as usize, i)
    }

    fn page(&self, i: u32) -> Option<Page> {
        self.get(self.layout.pages_at, self.layout.capacity as usize, i)
    }

    fn bucket(&self, i: u32) -> Option<Bucket> {
        self.get(self.layout.buckets_at, self.layout.buckets as usize, i)
    }

    /// Copies the tokens of `page` into `out`.
    fn tokens(&self, page: u32, out: &mut [u32]) -> Option<()> {
        if page >= self.layout.capacity {
            return None;
        }
        let p = self.layout.page_size as usize;
        let at = self.layout.tokens_at + page as usize * p * 4;
        for (i, t) in out.iter_mut().enumerate() {
            // SAFETY: page < capacity, so the `p` tokens at `at` are inside
            // the token array; u32 takes any bits.
            *t = unsafe {
                self.base
                    .as_ptr()
                    .add(at + i * 4)
                    .cast::<u32>()
                    .read_volatile()
            };
        }
        Some(())
    }

    /// The child of `parent` whose first page holds `page_key`.
    fn find_child(
        &self,
        parent: u32,
        page_key: &[u32],
        scratch: &mut [u32],
    ) -> Option<Option<u32>> {
        let hash = child_hash(parent, page_key);
        let mask = self.layout.buckets - 1;
        let mut i = hash & mask;
        for _ in 0..self.layout.buckets {
            let b = self.bucket(i)?;
            if b.node == NIL {
                return Some(None);
            }
            if b.hash == hash {
                let n = self.node(b.node)?;
                if n.state == NODE_LIVE && n.parent == parent {
                    self.tokens(n.first_page, scratch)?;
                    if same_tokens(scratch, page_key) {
                        return Some(Some(b.node));
                    }
                }
            }
            i = (i + 1) & mask;
        }
        None // a full table: torn
    }

    /// One walk; `None` when it met something no consistent tree holds.
    fn walk(&self, key: &[u32], pages: &mut Vec<u32>) -> Option<usize> {
        let p = self.layout.page_size as usize;
        let mut scratch = vec![0u32; p];
        pages.clear();
        let (mut node, mut pos) = (ROOT, 0);
        while pos + p <= key.len() {
            let Some(child) = self.find_child(node, &key[pos..pos + p], &mut scratch)? else {
                break;
            };
            let n = self.node(child)?;
            let mut page = n.first_page;
            for taken in 0..n.num_pages {
                if taken > 0 {
                    if pos + p > key.len() {
                        return Some(pos);
                    }
                    self.tokens(page, &mut scratch)?;
                    if !same_tokens(&scratch, &key[pos..pos + p]) {
                        return Some(pos);
                    }
                }
                let pg = self.page(page)?;
                if pg.state != PAGE_CACHED {
                    return None;
                }
                pages.push(page);
                pos += p;
                page = pg.next;
            }
            if page != NIL {
                return None;
            }
            node = child;
        }
        Some(pos)
    }

    /// The length of the longest cached page-aligned prefix of `tokens`,
    /// with its pages in `pages`; `None` if writes kept colliding with the
    /// read.
    pub fn peek(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<usize> {
        let p = self.layout.page_size as usize;
        let key = &tokens[..tokens.len() / p * p];
        self.seq().read(TRIES, || self.walk(key, pages)).flatten()
    }
}
