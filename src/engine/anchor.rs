//! The requests a client sends from a lock-free read ([`Anchor`]): the match
//! or insert of a key resumed where the reader stopped, after checking that
//! the tree has not moved there; and the engine's own reads through a
//! [`TreeReader`] of its region.

use super::arena;
use super::cache::{ClientId, Engine};
use super::error::AnchorError;
use super::hybrid::InsertExtra;
use super::layout::{NIL, NODE_LIVE, ROOT};
use super::policy::InsertHints;
use super::prefix::{Inserted, Matched};
use super::reader::{Anchor, Peeked, TreeReader, Usable};
use super::region::Region;
use super::tree::Walk;

impl<R: Region> Engine<R> {
    /// Where `anchor` (from a [`TreeReader::peek_anchored`] of a key whose
    /// first `matched_pages` pages it covers) stands in the tree now, as
    /// the walk of those pages would have left it; changes nothing.
    ///
    /// # Why a version check suffices
    ///
    /// The anchor is untrusted: everything is checked against the tree, and
    /// every loop is bounded. What makes a matching version enough is the
    /// reader's guarantee: every change of a node a walk could see moves
    /// its version (creation, split of it, trim of its pages, removal,
    /// freeing and reuse); a split of an ancestor keeps the node's path;
    /// eviction only takes leaves, never an ancestor of a live node. So
    /// while the version stands still, so do the node's path from the root
    /// and its pages: the tokens and pages the reader matched down to the
    /// anchor are still cached there, and a match that stopped inside the
    /// node still stops there (its next page is unchanged). What moves no
    /// version: lock counts, LRU links, and children added under the node
    /// (only the child table's version moves); the first two do not change
    /// what a match finds, and the callers handle the third (`match_at`
    /// probes the key's next page's hash, `insert_at` walks on).
    pub(super) fn anchored_walk(
        &self,
        anchor: &Anchor,
        matched_pages: usize,
    ) -> Result<Walk, AnchorError> {
        let a = &self.arena;
        let node = anchor.node;
        if node == ROOT || node >= a.layout.node_cap {
            return Err(AnchorError::Invalid("node out of range or the root"));
        }
        if anchor.version % 2 != 0 {
            return Err(AnchorError::Invalid(
                "a reader validates only even versions",
            ));
        }
        let n = a.nodes()[node as usize];
        if n.state != NODE_LIVE || n.generation != anchor.generation {
            return Err(AnchorError::Moved);
        }
        // The daemon is the only writer and changes nothing now: the
        // version is even and current.
        if a.version(node).stable() != Some(anchor.version) {
            return Err(AnchorError::Moved);
        }
        let k = anchor.pages_into_node;
        if k == 0 || k > n.num_pages {
            return Err(AnchorError::Invalid(
                "pages into the node outside 1..=its pages",
            ));
        }
        let mut depth = u64::from(k);
        let (mut up, mut hops) = (n.parent, 0);
        while up != ROOT {
            hops = a.hop(hops);
            let u = a.nodes().get(up as usize);
            let u = u.unwrap_or_else(|| arena::corrupt("parent out of range"));
            depth += u64::from(u.num_pages);
            up = u.parent;
        }
        if depth != matched_pages as u64 {
            return Err(AnchorError::Invalid(
                "matched pages are not the anchor's depth",
            ));
        }
        if k == n.num_pages {
            return Ok(Walk {
                node,
                partial: None,
                pages: matched_pages,
                ns: n.ns,
            });
        }
        let at = self.nth_page(n.first_page, k);
        Ok(Walk {
            node: n.parent,
            partial: Some((node, at, k)),
            pages: matched_pages,
            ns: n.ns,
        })
    }

    /// The page `k` links after `page` (bounded: `k` is below the node's
    /// page count, and a shorter list is corrupt).
    fn nth_page(&self, mut page: u32, k: u32) -> u32 {
        let pages = self.arena.pages();
        for _ in 0..k {
            let pg = pages.get(page as usize);
            page = pg.unwrap_or_else(|| arena::corrupt("page list")).next;
        }
        if page == NIL {
            arena::corrupt("page list shorter than its node");
        }
        page
    }

    /// Appends the pages of the path from the root to the first `k` pages
    /// of `node` to `out`, root first (bounded as in `anchored_walk`).
    pub(super) fn path_pages(&self, node: u32, k: u32, out: &mut Vec<u32>) {
        let nodes = self.arena.nodes();
        let node_at = |at: u32| {
            *nodes
                .get(at as usize)
                .unwrap_or_else(|| arena::corrupt("parent link"))
        };
        // Pages on the path, then filled from the node up, each node's
        // pages in order in its range: no list of the path's nodes.
        let (mut total, mut up, mut hops) = (0usize, node, 0);
        while up != ROOT {
            hops = self.arena.hop(hops);
            let n = node_at(up);
            total += if up == node { k } else { n.num_pages } as usize;
            up = n.parent;
        }
        let start = out.len();
        out.resize(start + total, 0);
        let (mut end, mut up, mut hops) = (start + total, node, 0);
        while up != ROOT {
            hops = self.arena.hop(hops);
            let n = node_at(up);
            let count = if up == node { k } else { n.num_pages } as usize;
            let from = end
                .checked_sub(count)
                .unwrap_or_else(|| arena::corrupt("path pages changed while read"));
            let mut page = n.first_page;
            for slot in &mut out[from..end] {
                *slot = page;
                page = self
                    .arena
                    .pages()
                    .get(page as usize)
                    .unwrap_or_else(|| arena::corrupt("page list"))
                    .next;
            }
            end = from;
            up = n.parent;
        }
    }

    /// [`Engine::match_prefix`] of a key whose first `matched_pages` pages a
    /// reader matched down to `anchor`, without the key: the same answer
    /// and the same changes as the full request now (split, LRU touch,
    /// lock), or [`AnchorError::Moved`] when the tree changed under the
    /// anchor, and then nothing changed.
    ///
    /// `next_hash` is the reader's [`Peeked::next_hash`]: when the match
    /// took the anchor's node whole and the key goes on, a child added
    /// since under that hash may continue the match, and the answer would
    /// no longer be the longest: `Moved` (a hash collision only costs a
    /// fallback). A match that stops inside the node needs no such check:
    /// the node's next page is as the reader saw it.
    ///
    /// With `pages`, the matched pages are written there (cleared first);
    /// a client has them from its read already.
    pub fn match_at(
        &mut self,
        client: ClientId,
        anchor: &Anchor,
        matched_pages: usize,
        next_hash: Option<u32>,
        lock: bool,
        pages: Option<&mut Vec<u32>>,
    ) -> Result<Matched, AnchorError> {
        let walk = self.anchored_walk(anchor, matched_pages)?;
        if let (None, Some(hash)) = (walk.partial, next_hash) {
            if self.arena.has_child_hashed(anchor.node, hash) {
                return Err(AnchorError::Moved);
            }
        }
        let mut out = pages;
        if let Some(out) = out.as_deref_mut() {
            out.clear();
            self.path_pages(anchor.node, anchor.pages_into_node, out);
        }
        let mut node = self.arena.settle(walk);
        let mut len_pages = matched_pages;
        if self.arena.hybrid.is_some() {
            (node, len_pages) = self.arena.hy_match(node);
            if let Some(out) = out {
                out.truncate(len_pages);
            }
        }
        self.arena.touch(node);
        let handle = match (node == ROOT, lock) {
            (true, _) => None,
            (false, true) => Some(self.lock_node(client, node)),
            (false, false) => Some(self.handle_of(node)),
        };
        Ok(Matched {
            len: len_pages * self.page_size() as usize,
            handle,
        })
    }

    /// [`Engine::insert`] of a key whose first `matched_pages` pages a
    /// reader matched down to `anchor`, sent as `tokens`, the key after
    /// those pages, and `pages`, one per whole page of the whole key
    /// (`matched_pages` of them for the matched part, compared with the
    /// cached ones exactly as `insert` does). The same answer and changes
    /// as the full request now, or [`AnchorError::Moved`] (nothing
    /// changed). Whatever was cached below the anchor since the read is
    /// found by walking on from it.
    pub fn insert_at(
        &mut self,
        client: ClientId,
        anchor: &Anchor,
        matched_pages: usize,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<Inserted, AnchorError> {
        let hints = InsertHints::default();
        self.insert_at_hinted(client, anchor, matched_pages, tokens, pages, lock, hints)
    }

    /// [`Engine::insert_at`] with the eviction policy's hints (see
    /// [`Engine::insert_hinted`]).
    #[allow(clippy::too_many_arguments)] // insert_at's, and the hints
    pub fn insert_at_hinted(
        &mut self,
        client: ClientId,
        anchor: &Anchor,
        matched_pages: usize,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        hints: InsertHints,
    ) -> Result<Inserted, AnchorError> {
        let start = self.anchored_walk(anchor, matched_pages)?;
        let p = self.page_size() as usize;
        let len = self.aligned(tokens.len());
        let key = &tokens[..len];
        self.check_pages(matched_pages + len / p, pages)?;
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        self.path_pages(anchor.node, anchor.pages_into_node, &mut walked);
        let walk = self.arena.walk_on(start, key, &mut walked);
        let (node, _, cached) = self.insert_walked(
            client,
            walk,
            walked,
            key,
            matched_pages,
            pages,
            InsertExtra::default(),
            hints,
        )?;
        let handle = lock.then(|| self.lock_node(client, node));
        Ok(Inserted {
            cached: cached * p,
            len: matched_pages * p + len,
            handle,
            node: (node != ROOT).then(|| self.handle_of(node)),
        })
    }

    /// [`TreeReader::peek_anchored`] on this engine's own region (what a
    /// client reads through the segment), for tests and tools.
    pub fn peek_anchored(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<Peeked> {
        self.own_reader()?.peek_anchored(tokens, pages)
    }

    /// [`TreeReader::peek_usable`] on this engine's own region: what a
    /// match would answer (cut back by the components), touching nothing.
    pub fn peek_usable(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<Usable> {
        self.own_reader()?
            .peek_usable(tokens, pages)
            .map(|(u, _)| u)
    }

    /// A reader of this engine's own region, for one call of `&self`.
    fn own_reader(&self) -> Option<TreeReader> {
        let base = std::ptr::NonNull::new(self.arena.region().as_ptr())?;
        // SAFETY: the region is REGION_ALIGN-aligned and `layout.size()`
        // bytes long (checked when the engine was built) and outlives the
        // reader, which the callers use only within their `&self` call;
        // that borrow keeps this process's writers out meanwhile, and the
        // reader only copies.
        Some(unsafe { TreeReader::new(base, self.arena.layout) })
    }
}
