//! The requests on a key: `insert` caches its whole pages, `match_prefix`
//! finds its longest cached prefix (splitting the edge it ends in), `peek`
//! looks without touching; with the hybrid extras of both.

use super::cache::{ClientId, Engine};
use super::error::PageError;
use super::hybrid::{Component, ComponentError, InsertExtra, InsertedExtra, MatchExtra};
use super::layout::{NIL, PAGE_OWNED, ROOT};
use super::lock::Handle;
use super::policy::InsertHints;
use super::region::Region;
use super::tree::Walk;

/// The answer to an insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inserted {
    /// Page-aligned tokens of the key that were cached before.
    pub cached: usize,
    /// Page-aligned length of the key: tokens cached for it now.
    pub len: usize,
    /// The locked node covering the key, when a lock was asked for and the
    /// key holds at least one page.
    pub handle: Option<Handle>,
    /// The node covering the key (its handle, no lock taken), when the key
    /// holds at least one page: what a caller names the node by without
    /// locking it (the SGLang TreeCore's insert result).
    pub node: Option<Handle>,
}

/// The answer to a match (the pages go to the caller's buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matched {
    /// Tokens of the longest cached page-aligned prefix.
    pub len: usize,
    /// The node covering exactly those tokens (locked when a lock was asked
    /// for); `None` when nothing matched.
    pub handle: Option<Handle>,
}

impl<R: Region> Engine<R> {
    /// Caches `tokens` (cut to whole pages) with `pages`, one per whole page.
    ///
    /// Where the prefix is already cached by the same page id nothing
    /// changes; a different page id there is a duplicate the caller owns and
    /// goes back to the free pool. The rest of the key becomes a new leaf.
    /// With `lock`, the node covering the key is locked for `client`.
    pub fn insert(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<Inserted, PageError> {
        self.insert_hinted(client, tokens, pages, lock, InsertHints::default())
    }

    /// [`Engine::insert`] with what the eviction policy reads of an insert
    /// (SGLang's `InsertParams.priority` and `inserted_len`); `insert` is
    /// this with the default hints (priority 0, nothing inserted before).
    pub fn insert_hinted(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        hints: InsertHints,
    ) -> Result<Inserted, PageError> {
        let extra = InsertExtra::default();
        self.insert_with_hinted(client, tokens, pages, lock, extra, hints)
            .map(|(inserted, _)| inserted)
    }

    /// [`Engine::insert`] with the extras of a hybrid engine: a state to
    /// checkpoint at the key's end and the tokens whose SWA pages the
    /// client already freed. Either extra on an engine without its
    /// component fails with [`PageError::Component`], changing nothing.
    pub fn insert_with(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        extra: InsertExtra,
    ) -> Result<(Inserted, InsertedExtra), PageError> {
        self.insert_with_hinted(client, tokens, pages, lock, extra, InsertHints::default())
    }

    /// [`Engine::insert_with`] with what the eviction policy reads of an
    /// insert (see [`Engine::insert_hinted`]): a hybrid model's insert
    /// under a policy other than LRU.
    pub fn insert_with_hinted(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        extra: InsertExtra,
        hints: InsertHints,
    ) -> Result<(Inserted, InsertedExtra), PageError> {
        let (node, mut inserted, ie) = self.insert_node(client, tokens, pages, extra, hints)?;
        if lock && node != ROOT {
            inserted.handle = Some(self.lock_node(client, node));
        }
        Ok((inserted, ie))
    }

    /// `insert` without the lock: returns the node that covers the key.
    pub(super) fn insert_node(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        pages: &[u32],
        extra: InsertExtra,
        hints: InsertHints,
    ) -> Result<(u32, Inserted, InsertedExtra), PageError> {
        let len = self.aligned(tokens.len());
        let key = &tokens[..len];
        self.check_pages(len / self.page_size() as usize, pages)?;
        let mut walked = std::mem::take(&mut self.walked);
        walked.clear();
        let walk = self.arena.walk(key, &mut walked);
        let (node, ie, cached) =
            self.insert_walked(client, walk, walked, key, 0, pages, extra, hints)?;
        Ok((
            node,
            Inserted {
                cached: cached * self.page_size() as usize,
                len,
                handle: None,
                node: (node != ROOT).then(|| self.handle_of(node)),
            },
            ie,
        ))
    }

    /// The count and range checks of an insert of `expected` pages.
    pub(super) fn check_pages(&self, expected: usize, pages: &[u32]) -> Result<(), PageError> {
        if pages.len() != expected {
            return Err(PageError::CountMismatch {
                expected,
                got: pages.len(),
            });
        }
        self.check_range(pages)
    }

    /// The rest of an insert once `walk` has followed the key, whose matched
    /// pages are `walked`: `key` is the key from page `base` on, `pages`
    /// one per page of the whole key (count and range checked). Claims the
    /// pages not already cached at their place, returns duplicates to the
    /// pool, hangs the uncached rest as a new leaf; all or nothing. With a
    /// host tier, the host-only nodes the rest runs into first take the
    /// insert's pages there (see `host`). Returns the node covering the key
    /// and the pages of it cached before (host-only ones included, as
    /// SGLang's `prefix_len` counts them).
    #[allow(clippy::too_many_arguments)] // one call per insert form; a struct would only rename them
    pub(super) fn insert_walked(
        &mut self,
        client: ClientId,
        walk: Walk,
        walked: Vec<u32>,
        key: &[u32],
        base: usize,
        pages: &[u32],
        extra: InsertExtra,
        hints: InsertHints,
    ) -> Result<(u32, InsertedExtra, usize), PageError> {
        let cached = walk.pages;
        let same = |i: usize, page: u32| i < cached && walked[i] == page;
        let hybrid = self.arena.hybrid.is_some() || extra != InsertExtra::default();
        if hybrid {
            if let Err(e) = self.check_extra(client, pages, same, extra) {
                self.walked = walked;
                return Err(e);
            }
        }
        if let Err(e) = self.claim(client, pages, same) {
            self.walked = walked;
            return Err(e);
        }
        let mut node = self.arena.settle(walk);
        if hybrid && self.arena.swa().is_some() {
            self.recover_swa(node, &walked[..cached], pages, extra.swa_evicted);
        }
        for (i, &page) in pages[..cached].iter().enumerate() {
            if walked[i] != page {
                self.arena.pool_release_owned(page);
            }
        }
        self.walked = walked;
        let p = self.page_size() as usize;
        let mut cached = cached;
        if self.arena.host.is_some() && cached < pages.len() {
            (node, cached) = self.host_relink(node, &key[(cached - base) * p..], pages, cached);
        }
        if cached < pages.len() {
            node = self
                .arena
                .add_leaf(node, &key[(cached - base) * p..], &pages[cached..]);
            if hybrid {
                let live_from = (extra.swa_evicted as usize / p).max(cached) - cached;
                self.arena.hy_swa_commit_leaf(node, live_from as u32);
            }
        }
        let end = (pages.len() * p) as u64;
        self.arena.touch_insert(node, end, hints);
        let mut ie = InsertedExtra::default();
        if hybrid {
            if let Some(state) = extra.mamba_state {
                ie.mamba_exist = self.arena.hy_mamba_commit(node, state);
            }
            self.arena.hy_refresh(node, false);
        }
        Ok((node, ie, cached))
    }

    /// The checks of an insert's extras, before anything changes: a state
    /// the client owns, `swa_evicted` page-aligned and within the key, and
    /// the client's pages paired exactly from `swa_evicted` on. Pages the
    /// claim will refuse are left to it.
    fn check_extra(
        &self,
        client: ClientId,
        pages: &[u32],
        same: impl Fn(usize, u32) -> bool,
        extra: InsertExtra,
    ) -> Result<(), PageError> {
        if let Some(state) = extra.mamba_state {
            let Some(m) = self.arena.mamba() else {
                return Err(PageError::Component(ComponentError::NotEnabled(
                    Component::Mamba,
                )));
            };
            if !m.owns(client, u64::from(state)) {
                return Err(PageError::Component(ComponentError::StateNotOwned {
                    state: u64::from(state),
                }));
            }
        }
        let Some(s) = self.arena.swa() else {
            if extra.swa_evicted > 0 {
                return Err(PageError::Component(ComponentError::NotEnabled(
                    Component::Swa,
                )));
            }
            return Ok(());
        };
        let p = u64::from(self.page_size());
        let len = pages.len() as u64 * p;
        if extra.swa_evicted % p != 0 || extra.swa_evicted > len {
            return Err(PageError::SwaEvicted {
                tokens: extra.swa_evicted,
                len,
            });
        }
        for (i, &page) in pages.iter().enumerate() {
            let pg = &self.arena.pages()[page as usize];
            if same(i, page) || pg.state != PAGE_OWNED || pg.owner_or_run != client {
                continue;
            }
            let paired = s.pair[page as usize] != NIL;
            if paired != (i as u64 * p >= extra.swa_evicted) {
                return Err(PageError::SwaPairing { page, paired });
            }
        }
        Ok(())
    }

    /// SGLang's tombstone recovery: each SWA tombstone on the path to
    /// `node` (whose pages are `walked`) inside the window takes the SWA
    /// pages of the client's `pages` at its place, from `swa_evicted` on
    /// (splitting the tombstone there), where every one of them is a
    /// paired duplicate.
    fn recover_swa(&mut self, node: u32, walked: &[u32], pages: &[u32], swa_evicted: u64) {
        if self.arena.path_holds_swa(node) {
            // No tombstone on the path (the usual case): nothing to
            // recover, and no path to collect.
            return;
        }
        let p = u64::from(self.page_size());
        let from = (swa_evicted / p) as usize;
        let path = self.arena.path_up(node);
        let mut end = walked.len();
        let mut spans = Vec::with_capacity(path.len());
        for &n in &path {
            let start = end - self.arena.nodes()[n as usize].num_pages as usize;
            spans.push((n, start, end));
            end = start;
        }
        for (n, start, end) in spans.into_iter().rev() {
            let Some(s) = self.arena.swa() else { return };
            if s.live[n as usize] {
                continue;
            }
            let live = from.max(start);
            let usable =
                (live..end).all(|i| walked[i] != pages[i] && s.pair[pages[i] as usize] != NIL);
            if live >= end || !usable {
                continue;
            }
            if live > start {
                self.arena.split_at(n, (live - start) as u32);
            }
            self.arena.hy_swa_recover(n, &pages[live..end]);
        }
    }

    /// Finds the longest cached page-aligned prefix of `tokens`, writes its
    /// page ids to `pages` (cleared first) and marks the path as just used.
    /// A match that ends inside an edge splits it there, so the handle covers
    /// exactly the matched tokens; with `lock` it is also locked (SGLang's
    /// `match_prefix` then `inc_lock_ref(last_node)` in one step).
    pub fn match_prefix(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        lock: bool,
        pages: &mut Vec<u32>,
    ) -> Matched {
        self.match_with(client, tokens, lock, pages).0
    }

    /// [`Engine::match_prefix`] with the hybrid parts of the answer: the
    /// match is cut back to where every component can serve it (SWA: the
    /// last `window` tokens hold SWA pages; MAMBA: the node holds a
    /// state), and the extras say how far FULL alone reached and which
    /// state the match ends at.
    pub fn match_with(
        &mut self,
        client: ClientId,
        tokens: &[u32],
        lock: bool,
        pages: &mut Vec<u32>,
    ) -> (Matched, MatchExtra) {
        let key = &tokens[..self.aligned(tokens.len())];
        pages.clear();
        let walk = self.arena.walk(key, pages);
        let mut node = self.arena.settle(walk);
        let p = self.page_size() as usize;
        let mut extra = MatchExtra {
            full_len: walk.pages * p,
            mamba_state: None,
        };
        let mut len_pages = walk.pages;
        if self.arena.hybrid.is_some() {
            // As SGLang, only the usable part is marked used: a node below
            // it keeps its last use (older than its parent or not).
            (node, len_pages) = self.arena.hy_match(node);
            pages.truncate(len_pages);
            extra.mamba_state = self
                .arena
                .mamba()
                .map(|m| m.state[node as usize])
                .filter(|&s| s != NIL && node != ROOT);
        }
        self.arena.touch(node);
        let handle = match (node == ROOT, lock) {
            (true, _) => None,
            (false, true) => Some(self.lock_node(client, node)),
            (false, false) => Some(self.handle_of(node)),
        };
        let matched = Matched {
            len: len_pages * p,
            handle,
        };
        (matched, extra)
    }

    /// The longest cached prefix of `tokens`, without touching anything.
    pub fn peek(&self, tokens: &[u32], pages: &mut Vec<u32>) -> usize {
        let key = &tokens[..self.aligned(tokens.len())];
        pages.clear();
        self.arena.walk(key, pages).pages * self.page_size() as usize
    }
}
